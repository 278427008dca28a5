"""What the OpenAI-compatible API refuses before any request reaches tritonserver, and its stop strings.

The app here has no tritonserver behind it (its gRPC channel connects lazily, and nothing below gets that far); what
is served is tested against a real one in tests/integration/test_openai_api.py.
"""

from __future__ import annotations

import json
import random
import threading

import jsonschema
import pytest
from fastapi.testclient import TestClient

import openai_api.app
from bls.errors import Unavailable
from bls.relay.admission import RequestPool
from openai_api.app import Settings, create_app
from openai_api.errors import from_triton
from openai_api.stops import StopStrings
from openai_api.triton import BlsResponse

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
    ("tensorrt_llm_bls: at capacity: 256 requests in flight (255 running, 1 queued at most); retry later", 503, None),
    ("Exceeds maximum queue size", 503, None),
    ("tensorrt_llm: [TensorRT-LLM][ERROR] Maximum queue size of 8 has been reached, please try again later", 503,
     None),
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


def test_our_models_refusals_to_retry_are_503s():
    """Every UNAVAILABLE of our models (bls.errors.Unavailable: the BLS's pool, the embedded engine's queue, an
    unload) is a 503 with Retry-After however its reason is worded: the words that say so are defined once
    (bls.errors)."""
    release = threading.Event()
    pool = RequestPool(workers=1, queued=0, name="t")
    refusals: list[BaseException] = []
    pool.submit(release.wait, refusals.append)
    pool.submit(release.wait, refusals.append)  # over capacity
    release.set()
    pool.shutdown(5, lambda: None)
    pool.submit(release.wait, refusals.append)  # unloading
    assert len(refusals) == 2
    for message in [*(f"tensorrt_llm_bls: {refusal}" for refusal in refusals), str(Unavailable("any reason"))]:
        error = from_triton(message)
        assert (error.status, error.retry_after, error.type) == (503, 1, "server_error"), message


# ---- issue 47: what OpenAI refuses, refused by field ----------------------------------------------------------------
def raw_body(body: dict, **escaped: str) -> str:
    """The body as JSON text with `"@name"` placeholders replaced by raw JSON string text (escapes kept as sent)."""
    text = json.dumps(body)
    for name, value in escaped.items():
        text = text.replace(f'"@{name}"', value)
    return text


def errors_counted(client, status: int) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("llama3_api_request_errors_total{") and f'status="{status}"' in line:
            return float(line.split()[-1])
    return 0.0


SURROGATE = '"a\\ud800b"'  # JSON text "a\ud800b": valid JSON, and no character


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "@s"}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "@s"}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions", {**CHAT, "stop": "@s"}, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": ["x", "@s"]}, "stop[1]"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "description": "@s"}}]},
     "tools[0].function.description"),
    ("/v1/completions", {**COMPLETION, "prompt": "@s"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ["ok", "@s"]}, "prompt[1]"),
])
def test_a_lone_surrogate_escape_is_a_400_naming_the_field(client, path, body, param):
    """A lone surrogate escape is valid JSON but no character (UTF-8 cannot encode it): a 400 in OpenAI's shape
    naming the field, counted, never a plain-text 500."""
    before = errors_counted(client, 400)
    response = client.post(path, content=raw_body(body, s=SURROGATE), headers={"Content-Type": "application/json"})
    error = error_of(response, 400)
    assert error["param"] == param and "surrogate" in error["message"], error
    assert errors_counted(client, 400) == before + 1


def test_a_surrogate_pair_is_a_character(client):
    """A pair (a character beyond the BMP, as JSON escapes it) is text: not refused (the request reaches the server,
    here absent: 503)."""
    body = raw_body({**COMPLETION, "prompt": "@s"}, s='"\\ud83d\\ude00"')
    assert "\\ud83d" in body
    assert client.post("/v1/completions", content=body).status_code == 503


@pytest.mark.parametrize("path, change, param", [
    ("/v1/chat/completions", {"stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {"n": "2"}, "n"),
    ("/v1/chat/completions", {"max_tokens": "3"}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 3.0}, "max_tokens"),
    ("/v1/chat/completions", {"logprobs": "true"}, "logprobs"),
    ("/v1/chat/completions", {"parallel_tool_calls": 0}, "parallel_tool_calls"),
    ("/v1/chat/completions", {"seed": True}, "seed"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": 1}, "stream": True}, "stream_options.include_usage"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/completions", {"top_p": True}, "top_p"),
    ("/v1/completions", {"echo": "false"}, "echo"),
    ("/v1/completions", {"logprobs": False}, "logprobs"),
])
def test_wrong_json_types_are_refused_not_coerced(client, path, change, param):
    body = {**(CHAT if path.endswith("chat/completions") else COMPLETION), **change}
    error = error_of(client.post(path, json=body), 400)
    assert error["param"] == param, error


@pytest.mark.parametrize("change", [{"temperature": 1}, {"top_p": 1, "presence_penalty": 0}, {"logit_bias": {}}])
def test_an_integer_is_a_number(client, change):
    """As in JSON Schema and OpenAI's API: `"temperature": 1` is taken (it reaches the server, here absent: 503)."""
    assert client.post("/v1/chat/completions", json={**CHAT, **change}).status_code == 503


NOT_A_SCHEMA = {"type": "object", "properties": {"city": {"type": "strin"}}}


@pytest.mark.parametrize("tool_choice", [None, "auto", "none", "required"])
def test_tools_are_validated_whatever_the_tool_choice(client, tool_choice):
    choice = {} if tool_choice is None else {"tool_choice": tool_choice}
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "tools": [], **choice}), 400)
    assert error["param"] == "tools", error
    tools = [{"type": "function", "function": {"name": "f", "parameters": NOT_A_SCHEMA}}]
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "tools": tools, **choice}), 400)
    assert error["param"] == "tools[0].function.parameters" and "not a valid JSON schema" in error["message"], error
    assert "parameters.properties.city.type" in error["message"], error


@pytest.mark.parametrize("arguments, problem", [
    ('{"city": ', "not valid JSON"), ("[1, 2]", "JSON text of an object"), ("[" * 100 + "]" * 100, "nests JSON"),
])
def test_malformed_history_arguments_name_the_call(client, arguments, problem):
    history = [{"role": "user", "content": "x"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "messages": history, "tools": tools}), 400)
    assert error["param"] == "messages[1].tool_calls[0].function.arguments" and problem in error["message"], error


def test_a_405_says_which_methods_are_allowed_and_route_errors_are_counted(client):
    before = {status: errors_counted(client, status) for status in (404, 405, 413)}
    response = client.get("/v1/chat/completions")
    error_of(response, 405)
    assert response.headers["Allow"] == "POST"
    assert client.delete("/v1/models").headers["Allow"] == "GET"
    error_of(client.get("/v1/nothing"), 404)
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]})
    error_of(client.post("/v1/chat/completions", content=big), 413)  # refused by its Content-Length
    assert {status: errors_counted(client, status) for status in (404, 405, 413)} == \
        {404: before[404] + 1, 405: before[405] + 2, 413: before[413] + 1}


def test_an_unexpected_error_is_a_counted_json_500(monkeypatch):
    """A bug (any exception no route handles) answers OpenAI's shape with status 500, counted, never a traceback."""
    def broken(body):
        raise KeyError("a bug")

    monkeypatch.setattr(openai_api.app, "_chat_prompt", broken)
    app = create_app(Settings(triton_grpc="127.0.0.1:1", model_name=MODEL))
    with TestClient(app, raise_server_exceptions=False) as client:
        error = error_of(client.post("/v1/chat/completions", json=CHAT), 500)
        assert error["type"] == "server_error" and "KeyError" in error["message"] and "a bug" not in error["message"]
        assert errors_counted(client, 500) == 1


class _RefusedAfterOneToken:
    """A stand-in for TritonBls whose generations give one token, then Triton's refusal to retry later."""

    def __init__(self, url: str):
        pass

    async def generate(self, inputs):
        yield BlsResponse("Hi")
        raise from_triton(f"tensorrt_llm_bls: {Unavailable('at capacity: 1 sequences running')}")

    async def close(self):
        pass


def test_a_refusal_after_a_stream_started_is_its_last_event_in_openai_shape(monkeypatch):
    monkeypatch.setattr(openai_api.app, "TritonBls", _RefusedAfterOneToken)
    with TestClient(create_app(Settings(triton_grpc="127.0.0.1:1", model_name=MODEL))) as client:
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status_code == 200
        events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        assert events[-2]["choices"][0]["delta"] == {"content": "Hi"} and "[DONE]" not in response.text
        error = events[-1]["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("server_error", "unavailable") and "retry later" in error["message"]
        refused = client.post("/v1/chat/completions", json=CHAT)  # not streamed: the status and Retry-After
        assert error_of(refused, 503)["code"] == "unavailable" and refused.headers["Retry-After"] == "1"
        assert errors_counted(client, 503) == 2


def test_openapi_declares_the_routes_and_their_shapes(client):
    document = client.get("/openapi.json").json()
    assert set(document["paths"]) == {"/health/ready", "/metrics", "/v1/models", "/v1/models/{model}",
                                      "/v1/chat/completions", "/v1/completions"}
    schemas = document["components"]["schemas"]
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert {"400", "401", "404", "413", "500", "503"} <= set(chat["responses"]) and "422" not in chat["responses"]
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == [MODEL]
    assert schemas["ChatCompletionRequest"]["properties"]["stream"] == {"default": False, "title": "Stream",
                                                                         "type": "boolean"}
    # A real error answer conforms to the declared error schema.
    resolver = {"components": document["components"]}
    error_schema = {**chat["responses"]["400"]["content"]["application/json"]["schema"], **resolver}
    jsonschema.validate(client.post("/v1/chat/completions", json={**CHAT, "n": 0}).json(), error_schema)


def test_a_completion_asking_more_generations_than_a_request_may_start_is_a_400_naming_prompt():
    """n x prompts above MAX_GENERATIONS (the fuzzer's 7 prompts x n=12 filled the engine's 80 places: a 503 that
    retrying never cures) is refused before any engine work; at the bound it is taken."""
    from openai_api.errors import ApiError
    from openai_api.protocol import MAX_GENERATIONS, CompletionRequest

    with pytest.raises(ApiError) as refused:
        CompletionRequest(model=MODEL, prompt=["a"] * 7, n=12).prompts()
    assert refused.value.status == 400 and refused.value.param == "prompt"
    assert "at most 16" in refused.value.message
    assert len(CompletionRequest(model=MODEL, prompt=["a"] * 4, n=MAX_GENERATIONS // 4).prompts()) == 4


@pytest.mark.parametrize(("path", "field"), [("/v1/chat/completions", "max_tokens"),
                                             ("/v1/chat/completions", "max_completion_tokens"),
                                             ("/v1/chat/completions", "top_k"), ("/v1/completions", "min_tokens"),
                                             ("/v1/completions", "max_tokens"), ("/v1/completions", "top_k")])
def test_an_integer_beyond_the_engines_int32_inputs_is_a_400_naming_it(client, path, field):
    """The schema fuzz sent top_k 86019372623284525070286848: an OverflowError (500) making its int32 tensor; numpy
    wraps a value between 2**31 and 2**63 silently instead (max_tokens 2**32 + 5 would have generated 5)."""
    body = CHAT if path == "/v1/chat/completions" else {"model": MODEL, "prompt": "Hello"}
    for value in (2**31, 2**32 + 5, 86019372623284525070286848):
        answer = client.post(path, json={**body, field: value})
        assert answer.status_code == 400, (field, value, answer.text)
        assert answer.json()["error"]["param"] == field
