"""A schema-driven fuzz of the OpenAI-compatible API (issue 47): schemathesis reads the API's own /openapi.json and
sends what it generates from it (bodies that fit the declared schemas, and bodies that do not) to the real API in
front of the session's tritonserver. Every answer must be no server error (5xx), of a declared status and content
type, and of its declared schema; and the API's log must hold no traceback.

Bounded in time: a fixed number of examples per route, and an output limit of at most 16 tokens a choice (a body's
`max_tokens`, `max_completion_tokens` and `min_tokens` above it are lowered to it: the fuzz is of the API, not of
how long the engine can generate). No example database: each run draws afresh, as on a fresh clone.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from testkit.openai_api import openai_api

MAX_TOKENS = 16
EXAMPLES_PER_ROUTE = 40
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def api(endpoint, repo_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("openai_api_fuzz") / "openai_api.log"
    with openai_api(endpoint.grpc, log, "--repo", str(repo_dir), "--model-name", "llama3-test",
                    "--default-max-tokens", str(MAX_TOKENS)) as api:
        yield api
        assert api.process.poll() is None, f"the API died during the fuzz: {log.read_text()}"
        assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def api_schema(api):
    return schemathesis.openapi.from_url(f"{api.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def bounded(body):
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                body[name] = MAX_TOKENS
    return body


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_every_answer_is_declared_and_no_server_error(case):
    case.body = bounded(case.body)
    case.call_and_validate(checks=CHECKS, timeout=120)


TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What time is it?"}]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "n": 2, "logprobs": True}),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "stream": True, "logprobs": True,
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 32, "tools": [TOOL], "tool_choice": "required"}),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 32, "tools": [TOOL], "tool_choice": "required",
                              "stream": True}),
    ("/v1/completions", {"prompt": ["A", "B"], "max_tokens": 4, "n": 2, "logprobs": 0}),
    ("/v1/completions", {"prompt": "A", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "stream": True, "model": "gpt-4o"}),
], ids=["chat", "chat-streamed", "tool-call", "tool-call-streamed", "completions", "completions-streamed", "404"])
def test_served_answers_have_the_declared_shapes(api_schema, path, body):
    """What the fuzz reaches seldom (a body that is served: most generated ones are refused), checked the same way:
    answers, streamed chunk by chunk, against the schemas /openapi.json declares."""
    operation = api_schema[path]["POST"]
    case = operation.Case(body={"model": "llama3-test", **body}, media_type="application/json")
    response = case.call_and_validate(checks=CHECKS, timeout=120)
    assert response.status_code == (404 if body.get("model") == "gpt-4o" else 200)
