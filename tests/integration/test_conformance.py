"""What NVIDIA's clients and Triton's OpenAI frontend see: both generations' input names, the 1.2 outputs,
output shapes, and no input silently dropped. Against the embedded engine (what `make test` serves) or any
server given with --server-url.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream
from tests.integration.test_text import strings

TEXT_MODELS = ["ensemble", "tensorrt_llm_bls"]
SAMPLED = {"text_input": "Once upon a time", "max_tokens": 24, "end_id": -1, "temperature": 1.0, "top_k": 1000}


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_both_seed_names_reproduce_the_same_sampled_text(endpoint, model):
    seeded = generate(endpoint.http, model, {**SAMPLED, "seed": 7})["text_output"]
    assert generate(endpoint.http, model, {**SAMPLED, "random_seed": 7})["text_output"] == seeded
    assert generate(endpoint.http, model, {**SAMPLED, "seed": 7, "random_seed": 7})["text_output"] == seeded
    others = {generate(endpoint.http, model, {**SAMPLED, "seed": seed})["text_output"] for seed in (8, 9, 10)}
    assert others != {seeded}  # the seed is honoured, not ignored


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("new, old", [("seed", "random_seed"), ("min_tokens", "min_length")])
def test_both_names_with_different_values_is_an_error(endpoint, model, new, old):
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, model, {**SAMPLED, new: 3, old: 4})
    assert error.value.status == 400 and old.upper() in error.value.message


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("name", ["min_tokens", "min_length"])
def test_min_tokens_delays_the_end_id(endpoint, model, name, bundle):
    """end_id = the first token greedy decoding would produce: without a minimum nothing is generated."""
    prompt = "Tell me a story"
    reference = generate(endpoint.http, "tensorrt_llm_bls", {"text_input": prompt, "max_tokens": 1, "end_id": -1,
                                                              "exclude_input_in_output": True})
    first = bundle.tokenizer.encode(reference["text_output"], add_special_tokens=False)
    first_id = first[0] if len(first) == 1 else None
    if first_id is None:
        pytest.skip("the first greedy token does not round-trip through text")
    body = {"text_input": prompt, "max_tokens": 12, "end_id": first_id, "return_num_output_tokens": True}
    stopped = generate(endpoint.http, model, body)
    held = generate(endpoint.http, model, {**body, name: 5})
    assert stopped["num_output_tokens"] == 0
    assert held["num_output_tokens"] >= 5


def test_token_counts_and_perf_metrics_when_asked(endpoint):
    body = {"text_input": "Hello", "max_tokens": 6, "end_id": -1}
    plain = generate(endpoint.http, "ensemble", body)
    assert "num_input_tokens" not in plain and "arrival_time_ns" not in plain
    asked = generate(endpoint.http, "ensemble", {**body, "return_num_input_tokens": True,
                                                 "return_num_output_tokens": True, "return_perf_metrics": True})
    assert asked["num_output_tokens"] == 6 and asked["num_input_tokens"] >= 2  # BOS + "Hello"
    assert 0 < asked["arrival_time_ns"] <= asked["first_scheduled_time_ns"] <= asked["first_token_time_ns"]
    assert asked["first_token_time_ns"] <= asked["last_token_time_ns"]
    assert asked["kv_cache_alloc_total_blocks"] >= 1


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("field", ["seeed", "max_new_tokens"])
def test_a_field_that_is_not_an_input_is_refused_by_name(endpoint, model, field):
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, model, {"text_input": "Hi", "max_tokens": 4, field: 1})
    assert error.value.status == 400 and field in error.value.message
    with pytest.raises(HttpError) as error:
        generate_stream(endpoint.http, model, {"text_input": "Hi", "max_tokens": 4, "stream": True, field: 1})
    assert field in error.value.message


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("name, value, problem", [
    ("lora_task_id", np.array([[1]], np.uint64), "LoRA"),
])
def test_what_the_engine_cannot_do_is_refused_by_name(endpoint, model, name, value, problem):
    result = grpc_stream(endpoint.grpc, model, {"text_input": strings("Hi"), "max_tokens": np.array([[4]], np.int32),
                                                name: value}, ["text_output"])
    assert result.error is not None and name in result.error and problem in result.error


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_text_output_is_one_string_per_response(endpoint, model, stream):
    """NVIDIA's end_to_end_grpc_client.py reads output[0].decode(): a 1-D array of strings."""
    result = grpc_stream(endpoint.grpc, model, {"text_input": strings("Hello there"),
                                                "max_tokens": np.array([[6]], np.int32),
                                                "stream": np.array([[stream]])}, ["text_output"])
    assert result.error is None and result.completed and result.responses
    for response in result.responses:
        output = response["text_output"]
        assert output.ndim == 1 and output.shape == (1,) and isinstance(output[0].decode("utf-8"), str)


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_prompt_echo_is_for_unstreamed_answers_only(endpoint, model):
    """What TensorRT-LLM 1.2's end_to_end_grpc_client.py --check-outputs expects: it always sends
    exclude_input_in_output=false, and expects the prompt before the text when not streaming and the text alone
    when streaming (the engine's stream starts at the prompt's end: LlmRequest::createResult)."""
    prompt = "Hello there"
    inputs = {"text_input": strings(prompt), "max_tokens": np.array([[8]], np.int32),
              "exclude_input_in_output": np.array([[False]])}
    texts = {}
    for stream in (False, True):
        result = grpc_stream(endpoint.grpc, model, {**inputs, "stream": np.array([[stream]])}, ["text_output"])
        assert result.error is None and result.completed
        texts[stream] = "".join(r["text_output"][0].decode("utf-8") for r in result.responses)
    assert texts[True] and texts[False] == prompt + texts[True]


# Triton's OpenAI-compatible frontend (server repo python/openai, r26.07): what
# _create_trtllm_inference_request builds for a TRT-LLM model, names, dtypes and shapes as it sends them.
# The prompt is the tokenizer's chat template rendered by the frontend, BOS included.
def openai_frontend_inputs(prompt: str, stream: bool) -> dict:
    return {
        "text_input": np.array([[prompt.encode()]], dtype=object),
        "stream": np.array([[stream]], dtype=bool),
        "max_tokens": np.array([[8]], dtype=np.int32),
        "stop_words": np.array([[b"<|eot_id|>", b"\n\n\n"]], dtype=object),
        "top_p": np.array([[0.9]], dtype=np.float32),
        "frequency_penalty": np.array([[0.0]], dtype=np.float32),
        "presence_penalty": np.array([[0.0]], dtype=np.float32),
        "temperature": np.array([[0.7]], dtype=np.float32),
        "seed": np.array([[1234]], dtype=np.uint64),
    }


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_frontends_requests_are_served(endpoint, model, stream, bundle):
    # The frontend renders with the tokenizer's own template, as here.
    prompt = bundle.tokenizer.apply_chat_template([{"role": "user", "content": "Hi!"}], tokenize=False,
                                                  add_generation_prompt=True)
    result = grpc_stream(endpoint.grpc, model, openai_frontend_inputs(prompt, stream), ["text_output"])
    assert result.error is None and result.completed
    texts = [r["text_output"] for r in result.responses]
    assert texts and all(t.shape == (1,) for t in texts)  # the frontend requires exactly one string
    if not stream:
        assert len(result.responses) == 1
    # Reproducible: the frontend's seed reaches the engine.
    again = grpc_stream(endpoint.grpc, model, openai_frontend_inputs(prompt, stream), ["text_output"])
    assert b"".join(r["text_output"][0] for r in again.responses) == b"".join(t[0] for t in texts)


# A tool the frontend is asked to call (tool_choice: named, or "required"): it sends the tool's parameters,
# `tool.parameters.model_dump_json()` (pydantic's compact JSON), as the guide. No free-text field: the ensemble streams
# each token's text decoded alone, so a character split across tokens would reach the client as U+FFFD pieces.
WEATHER_TOOL_PARAMETERS = {"type": "object", "properties": {
    "location": {"type": "string", "enum": ["Paris", "Tokyo", "New York"]},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["location", "unit"]}


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_frontends_tool_choice_gets_arguments_that_match_the_tools_schema(endpoint, model, stream, bundle):
    """_create_trtllm_inference_request adds guided_decoding_guide_type [["json_schema"]] and guided_decoding_guide
    [[parameters JSON]] for a named or required tool choice; the text it reads back is the call's arguments."""
    prompt = bundle.tokenizer.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tokenize=False,
                                                  add_generation_prompt=True)
    inputs = {**openai_frontend_inputs(prompt, stream), "max_tokens": np.array([[48]], dtype=np.int32),
              "guided_decoding_guide_type": np.array([[b"json_schema"]], dtype=object),
              "guided_decoding_guide": np.array([[json.dumps(WEATHER_TOOL_PARAMETERS, separators=(",", ":")).encode()]],
                                                dtype=object)}
    result = grpc_stream(endpoint.grpc, model, inputs, ["text_output"])
    assert result.error is None and result.completed
    assert all(r["text_output"].shape == (1,) for r in result.responses)  # exactly one string per response
    arguments = json.loads(b"".join(r["text_output"][0] for r in result.responses))
    jsonschema.validate(arguments, WEATHER_TOOL_PARAMETERS)


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_perf_metrics_are_in_every_response_as_the_1_2_client_reads_them(endpoint, model, stream):
    """TensorRT-LLM 1.2's end_to_end_grpc_client.py --return-perf-metrics reads result.as_numpy(name)[0][0]
    from each response, the final one included."""
    names = ["kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
             "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
             "total_accepted_draft_tokens", "total_draft_tokens"]
    inputs = {"text_input": strings("Hello there"), "max_tokens": np.array([[5]], np.int32),
              "stream": np.array([[stream]]), "return_perf_metrics": np.array([[True]]),
              "exclude_input_in_output": np.array([[False]])}  # the 1.2 client always sends it
    result = grpc_stream(endpoint.grpc, model, inputs, ["text_output", *names])
    assert result.error is None and result.completed and result.responses
    for response in result.responses:
        for name in names:
            assert response[name].shape == (1, 1), name
        assert response["arrival_time_ns"][0][0] > 0
