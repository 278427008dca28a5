"""What the OpenAI-compatible API refuses before any request reaches tritonserver, and its stop strings.

The app here has no tritonserver behind it (its gRPC channel connects lazily, and nothing below gets that far); what
is served is tested against a real one in tests/integration/test_openai_api.py.
"""

from __future__ import annotations

import json
import random

import pytest
from fastapi.testclient import TestClient

from openai_api.app import Settings, create_app
from openai_api.stops import StopStrings

MODEL = "llama3-test"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}


@pytest.fixture(scope="module")
def client():
    app = create_app(Settings(triton_grpc="127.0.0.1:1", model_name=MODEL, max_body_bytes=64 * 1024))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def keyed_client():
    app = create_app(Settings(triton_grpc="127.0.0.1:1", model_name=MODEL, api_keys=("k-one", "k-two")))
    with TestClient(app) as client:
        yield client


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize("path, change, param", [
    ("/v1/chat/completions", {"logit_bias": {"1": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"top_logprobs": 2, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 0}, "top_logprobs"),
    ("/v1/chat/completions", {"frobnicate": True}, "frobnicate"),
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/chat/completions", {"n": 17}, "n"),
    ("/v1/chat/completions", {"temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {"top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"seed": -1}, "seed"),
    ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": "abc"}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
    ("/v1/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/chat/completions", {"stop": [""]}, "stop"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
                              "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "returns": 1}}]}, "tools"),
    ("/v1/chat/completions", {"top_k": -1}, "top_k"),
    ("/v1/chat/completions", {"min_tokens": -2}, "min_tokens"),
    ("/v1/chat/completions", {"ignore_eos": "yes please"}, "ignore_eos"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt"),
    ("/v1/completions", {"echo": True, "logprobs": 0}, "echo"),
])
def test_bad_fields_are_refused_by_name(client, path, change, param):
    body = {**(CHAT if path.endswith("chat/completions") else COMPLETION), **change}
    error = error_of(client.post(path, json=body), 400)
    assert error["param"] == param or error["param"].startswith(param), error
    assert error["type"] == "invalid_request_error"


def test_an_unknown_model_is_404(client):
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o"}), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"
    assert error_of(client.get("/v1/models/gpt-4o"), 404)["code"] == "model_not_found"
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL


@pytest.mark.parametrize("raw, problem", [
    (b'{"model": "x", "temperature": NaN}', "NaN"),
    (b'{"model": "x", "temperature": Infinity}', "Infinity"),
    (b"[" * 100 + b"]" * 100, "nests JSON"),
    (b'{"model": ', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
])
def test_malformed_bodies_are_400s(client, raw, problem):
    error = error_of(client.post("/v1/chat/completions", content=raw), 400)
    assert problem in error["message"]


def test_a_body_over_the_limit_is_413(client):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    assert error_of(client.post("/v1/chat/completions", json=big), 413)["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it is read
        yield json.dumps(big).encode()

    assert error_of(client.post("/v1/chat/completions", content=chunks()), 413)["code"] == "request_too_large"


def test_api_keys(keyed_client):
    for headers in ({}, {"Authorization": "Bearer k-on"}, {"Authorization": "Basic k-one"},
                    {"Authorization": "Bearer k-one2"}):
        assert error_of(keyed_client.get("/v1/models", headers=headers), 401)["code"] == "invalid_api_key"
        assert keyed_client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 401
    for key in ("k-one", "k-two"):
        assert keyed_client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    # Probes and metrics are for the platform, not API users: no key (the API listens on loopback by default).
    assert keyed_client.get("/metrics").status_code == 200


def test_unknown_routes_answer_in_openai_shape(client):
    assert error_of(client.get("/v1/embeddings"), 404)["type"] == "not_found"
    assert error_of(client.get("/v1/chat/completions"), 405)


# ---- stop strings -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, stops, expected", [
    ("Hello world. Bye", ["."], "Hello world"),
    ("Hello world. Bye", ["world", "Hello"], ""),
    ("Hello world. Bye", ["xyz"], "Hello world. Bye"),
    ("abcabd", ["abd"], "abc"),
    ("aaab", ["aab"], "a"),
    ("日本語のテキスト", ["の"], "日本語"),
])
def test_stop_strings_cut_streamed_text_as_whole_text(text, stops, expected):
    rng = random.Random(3)
    for _ in range(30):  # any split of the text into deltas gives the same result
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stop = StopStrings(stops)
        out = "".join(stop.push(delta) for delta in deltas) + stop.finish()
        assert out == expected
        assert stop.stopped == (expected != text)


def test_text_that_may_begin_a_stop_string_is_held_back():
    stop = StopStrings(["END"])
    assert stop.push("The E") == "The "
    assert stop.push("N") == ""
    assert stop.push("X") == "ENX"
    assert stop.push(" fin E") == " fin "
    assert stop.finish() == "E"


def test_health_says_not_ready_without_tritonserver(client):
    assert client.get("/health/ready").status_code == 503


@pytest.mark.parametrize("message, status, param", [
    ("tensorrt_llm_bls: at capacity: 256 requests in flight", 503, None),
    ("[StatusCode.UNAVAILABLE] Exceeds maximum queue size", 503, None),
    ("tensorrt_llm_bls: tritonserver is shutting down; retry on another server", 503, None),
    ("tensorrt_llm_bls: tensorrt_llm_bls_python: Server is stopping, scheduler for model has stopped accepting new "
     "inference requests", 503, None),
    ("Request for unknown model: 'tensorrt_llm_bls' is not found", 404, None),
    ("tensorrt_llm_bls: preprocessing: MESSAGES: message 0 has role 'x'", 400, "messages"),
    ("tensorrt_llm: request_output_len: input length 17 + request_output_len 9000 exceeds max_seq_len", 400,
     "max_tokens"),
    ("guided_decoding_guide: does not compile", 400, "response_format"),
    ("tensorrt_llm_bls: internal error (KeyError: 'x'); see the server log", 500, None),
])
def test_triton_errors_map_to_http(message, status, param):
    from openai_api.errors import from_triton

    error = from_triton(message)
    assert (error.status, error.param) == (status, param) and error.message == message
    assert (error.retry_after is not None) == (status == 503)
