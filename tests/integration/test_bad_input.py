"""Bad input probes (issue 33) against the session's server, over HTTP `generate` and gRPC, on tensorrt_llm_bls and
the ensemble: each is refused with an error naming the field (HTTP 400), never a traceback, and the server keeps
serving. Last, what Triton's own HTTP frontend answers before any model sees the request (docs/operations.md, "Bad
input": those errors are Triton's and no model can change them).

The ensemble hands the sampling floats and the guide to tensorrt_llm as they come (NVIDIA's wiring): their checks
there are the embedded engine's (tests that need it say so: conftest.NEEDS_EMBEDDED_ENGINE), TensorRT-LLM's own on
a GPU.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bls.contract import TEXT_TO_ENGINE, TEXT_TO_PREPROCESSING
from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream

MODELS = ("tensorrt_llm_bls", "ensemble")
PROMPT = {"text_input": "hi", "max_tokens": 2}
# One non-finite value per sampling float, so that every kind is sent and every field is named.
SAMPLING_FLOATS = {"temperature": math.nan, "top_p": math.inf, "repetition_penalty": -math.inf,
                   "presence_penalty": math.nan, "frequency_penalty": math.inf, "length_penalty": math.nan}
DEEP_MESSAGES = "[" * 5000 + "]" * 5000
DEEP_SCHEMA = '{"type": "object", "properties": {"a": ' * 300 + '{"type": "string"}' + "}}" * 300  # 601 levels
DEEP_GUIDE = {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": DEEP_SCHEMA}


def tensors(body: dict) -> dict[str, np.ndarray]:
    """A generate body as the [1, ...] tensors a gRPC client sends (int32 counts, float32 floats, BYTES text)."""
    arrays = {}
    for name, value in body.items():
        values = value if isinstance(value, list) else [value]
        if isinstance(values[0], str):
            arrays[name] = np.array([[v.encode() for v in values]], dtype=object)
        elif isinstance(values[0], float):
            arrays[name] = np.array([values], np.float32)
        else:
            arrays[name] = np.array([values], np.int32)
    return arrays


def refusals(endpoint, model: str, body: dict) -> list[str]:
    """The error messages of `body` over HTTP generate (which must answer 400) and over a gRPC stream."""
    with pytest.raises(HttpError) as http:
        generate(endpoint.http, model, body, timeout=60)
    assert http.value.status == 400, http.value
    grpc = grpc_stream(endpoint.grpc, model, tensors(body), ["text_output"], timeout=60)
    assert grpc.error is not None and not grpc.responses, grpc
    messages = [http.value.message, grpc.error]
    for message in messages:
        assert "Traceback" not in message and "internal error" not in message, message
    return messages


def assert_names(messages: list[str], field: str, problem: str) -> None:
    for message in messages:
        assert f"{field}: " in message and problem in message, message


def ensemble_name(text_name: str) -> str:
    """What the ensemble's step that reads a text input calls it."""
    return TEXT_TO_PREPROCESSING.get(text_name) or TEXT_TO_ENGINE[text_name]


@pytest.mark.parametrize("name", SAMPLING_FLOATS)
def test_the_bls_refuses_non_finite_sampling_floats_by_name(endpoint, name):
    value = SAMPLING_FLOATS[name]
    assert_names(refusals(endpoint, "tensorrt_llm_bls", {**PROMPT, name: value}), name,
                 f"must be a finite number, got {value}")


@pytest.mark.parametrize("name", SAMPLING_FLOATS)
def test_the_ensemble_refuses_non_finite_sampling_floats_by_name(endpoint, name):
    value = SAMPLING_FLOATS[name]
    assert_names(refusals(endpoint, "ensemble", {**PROMPT, name: value}), ensemble_name(name),
                 f"must be a finite number, got {value}")


@pytest.mark.parametrize("model", MODELS)
def test_non_finite_bias_weights_are_refused_by_name(endpoint, model):
    body = {**PROMPT, "embedding_bias_words": ["hello", "world"], "embedding_bias_weights": [1.0, math.nan]}
    field = "embedding_bias_weights" if model == "tensorrt_llm_bls" else "EMBEDDING_BIAS_WEIGHTS"
    assert_names(refusals(endpoint, model, body), field, "must be a finite number, got nan at index 1")


@pytest.mark.parametrize("model", MODELS)
def test_deeply_nested_messages_are_refused_by_name(endpoint, model):
    body = {"messages": DEEP_MESSAGES, "max_tokens": 2}
    assert_names(refusals(endpoint, model, body), "MESSAGES", "nests JSON 5000 levels deep; at most 64")


def test_the_bls_refuses_a_deeply_nested_schema_by_name(endpoint):
    assert_names(refusals(endpoint, "tensorrt_llm_bls", {**PROMPT, **DEEP_GUIDE}), "guided_decoding_guide",
                 "nests JSON 601 levels deep")


def test_the_ensemble_refuses_a_deeply_nested_schema_by_name(endpoint):
    assert_names(refusals(endpoint, "ensemble", {**PROMPT, **DEEP_GUIDE}), "guided_decoding_guide",
                 "nests JSON 601 levels deep")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("prompt", [{"text_input": "hi"}, {"messages": '[{"role": "user", "content": "hi"}]'}])
def test_a_request_without_max_tokens_is_refused_naming_it(endpoint, model, prompt):
    """The ensemble used to end such a request with no response and no error (HTTP 200, "generate expects model to
    produce exactly 1 response"): Triton's count-only check of required inputs let it in, and the ensemble's first
    step never ran (bls/contract.py, max_tokens)."""
    field = "max_tokens" if model == "tensorrt_llm_bls" else "REQUEST_OUTPUT_LEN"
    assert_names(refusals(endpoint, model, prompt), field, "is required")
    if model == "ensemble":
        assert all("max_tokens" in message for message in refusals(endpoint, model, prompt))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("value", [0, -3, 3_000_000_000])  # the last wraps to a negative int32 in Triton's parser
def test_a_max_tokens_below_one_is_refused_naming_it(endpoint, model, value):
    field = "max_tokens" if model == "tensorrt_llm_bls" else "REQUEST_OUTPUT_LEN"
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, model, {**PROMPT, "max_tokens": value}, timeout=60)
    assert error.value.status == 400
    assert f"{field}: must be > 0" in error.value.message


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("field, value", [("max_tokens", "abc"), ("max_tokens", 1.5), ("temperature", "hot"),
                                          ("stream", "yes"), ("text_input", 5)])
def test_values_of_the_wrong_json_type_are_refused_by_tritons_frontend(endpoint, model, field, value):
    """Triton's HTTP frontend converts each JSON field to its input's dtype before any model is called, and answers a
    value it cannot convert with HTTP 500 and its parser's words (not naming the field): Triton's, not ours. If this
    starts failing, Triton changed: update docs/operations.md ("Bad input")."""
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, model, {**PROMPT, field: value}, timeout=60)
    assert error.value.status == 500
    assert error.value.message.startswith(("Unable to parse 'data'", "Unable to parse JSON bytes array")), error.value


@pytest.mark.parametrize("model", MODELS)
def test_stream_true_on_generate_is_answered_by_tritons_frontend_with_status_200(endpoint, model):
    """`generate` takes exactly one response; a streamed request makes several. Triton's frontend has started its
    200 reply by then and puts its error in the body: use generate_stream. Triton's, not ours (see above)."""
    answer = generate(endpoint.http, model, {**PROMPT, "stream": True}, timeout=60)
    assert answer == {"error": "generate expects model to produce exactly 1 response, use generate stream for model "
                               "that generates various number of responses"}


@pytest.mark.parametrize("model", MODELS)
def test_a_wrong_dtype_over_grpc_is_refused_by_triton_naming_the_input(endpoint, model):
    """Over gRPC a client sends typed tensors: Triton checks each dtype against the config and names the input."""
    inputs = {**tensors(PROMPT), "max_tokens": np.array([[1.5]], np.float32)}
    result = grpc_stream(endpoint.grpc, model, inputs, ["text_output"], timeout=60)
    assert result.error is not None and "'max_tokens' data-type is 'FP32'" in result.error, result.error
    assert "expects 'INT32'" in result.error


@pytest.mark.parametrize("model", MODELS)
def test_a_lone_surrogate_escape_in_messages_is_refused_by_name(endpoint, model):
    """`messages` is JSON text inside a string input: a "\\ud800" escape in it decodes to no character (UTF-8 cannot
    encode it). Refused naming the input and where (bls.batch.decode_json), over generate, generate_stream and gRPC;
    before: `internal error (UnicodeEncodeError ...)`."""
    body = {"messages": json.dumps([{"role": "user", "content": "a\ud800"}]), "max_tokens": 2}
    assert "\\ud800" in body["messages"]
    messages = refusals(endpoint, model, body)
    with pytest.raises(HttpError) as streamed:
        generate_stream(endpoint.http, model, body, timeout=60)
    assert_names([*messages, streamed.value.message], "MESSAGES", "lone UTF-16 surrogate escape")
    assert all("surrogate escape (half of a surrogate pair is not a character) at [0].content" in message
               for message in [*messages, streamed.value.message]), messages


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("field", ["text_input", "stop_words"])
def test_a_lone_surrogate_escape_in_the_http_json_is_refused_by_tritons_frontend(endpoint, model, field):
    """The same escape in the HTTP body's own JSON never reaches a model: Triton's frontend (rapidjson) refuses the
    body with HTTP 500 and its parser's words, not naming the field (docs/operations.md, "Bad input"). Over gRPC the
    text's bytes are no UTF-8, and our models refuse them naming the input."""
    body = {**PROMPT, field: "a\ud800" if field == "text_input" else ["a\ud800"]}
    for call in (generate, generate_stream):
        with pytest.raises(HttpError) as error:
            call(endpoint.http, model, body, timeout=60)
        assert error.value.status == 500, error.value
        assert error.value.message.startswith("failed to parse the request JSON buffer: The surrogate pair in string "
                                              "is invalid."), error.value
    surrogate_bytes = np.array([["a\ud800".encode("utf-8", "surrogatepass")]], dtype=object)
    result = grpc_stream(endpoint.grpc, model, {**tensors(PROMPT), "text_input": surrogate_bytes}, ["text_output"],
                         timeout=60)
    assert result.error is not None and "QUERY: is not valid UTF-8" in result.error, result.error


@pytest.mark.parametrize("model", MODELS)
def test_the_server_keeps_serving_after_the_probes(endpoint, model):
    """Runs last in this module (pytest keeps definition order): every probe above left the server whole."""
    assert generate(endpoint.http, model, PROMPT, timeout=60)["text_output"]
    result = grpc_stream(endpoint.grpc, model, tensors(PROMPT), ["text_output"], timeout=60)
    assert result.error is None and result.completed and result.responses
