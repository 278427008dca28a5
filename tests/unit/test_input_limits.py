"""Values no model may compute with, refused by name wherever a request is read: NaN and infinities in any
floating-point input (bls.batch.BatchInputs), and JSON nested deeper than bls.batch.MAX_JSON_DEPTH (messages, a
JSON-schema guide)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bls.batch import MAX_JSON_DEPTH, BatchInputs, decode_json, json_nesting_depth
from bls.errors import InvalidRequest
from bls.generation.generator import BlsConfig, TextRequest
from bls.text.chat import parse_chat
from bls.text.preprocessing import Preprocessor
from embedded_engine.request import EngineLimits, parse_generation_requests

NOT_FINITE = [np.nan, np.inf, -np.inf]
CONFIG = BlsConfig(engine_model="engine", preprocessing_model="pre", postprocessing_model="post",
                   draft_model=None, max_draft_len=0, accumulate_tokens=False, skip_special_tokens=True,
                   exclude_input_in_output=True)


def refused(call, field: str, problem: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as error:
        call()
    assert error.value.field == field, error.value
    assert problem in error.value.problem, error.value
    return error.value


def deep_schema(levels: int) -> str:
    """A JSON schema of `levels` nested objects (two JSON levels each)."""
    return '{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}' + "}}" * levels


@pytest.mark.parametrize("value", NOT_FINITE)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_batch_inputs_refuse_non_finite_floats(value, dtype):
    error = refused(lambda: BatchInputs({"temperature": np.array([[value]], dtype)}, 1), "temperature",
                    "must be a finite number")
    assert str(float(value)) in error.problem  # nan / inf / -inf, as the client sent it


def test_the_first_non_finite_value_of_a_list_is_named_with_its_index():
    weights = np.array([[0.5, 1.0, np.inf, np.nan]], np.float32)
    refused(lambda: BatchInputs({"EMBEDDING_BIAS_WEIGHTS": weights}, 1), "EMBEDDING_BIAS_WEIGHTS", "got inf at index 2")


def test_finite_extremes_and_other_dtypes_pass():
    rows = BatchInputs({"frequency_penalty": np.array([[-3e38]], np.float32), "max_tokens": np.array([[4]], np.int32),
                        "text_input": np.array([[b"nan"]], dtype=object)}, 1)
    assert rows.scalar("frequency_penalty", 0, float) == pytest.approx(-3e38)


@pytest.mark.parametrize("name", ["temperature", "top_p", "length_penalty", "repetition_penalty", "presence_penalty",
                                  "frequency_penalty"])
def test_the_bls_refuses_non_finite_sampling_values_by_their_name(name):
    inputs = {"text_input": np.array([[b"hi"]], dtype=object), "max_tokens": np.array([[4]], np.int32),
              name: np.array([[np.nan]], np.float32)}
    refused(lambda: TextRequest.from_inputs(inputs, CONFIG, "r"), name, "must be a finite number, got nan")


@pytest.mark.parametrize("name", ["temperature", "runtime_top_p", "repetition_penalty", "presence_penalty",
                                  "frequency_penalty", "len_penalty", "beam_search_diversity_rate"])
def test_the_engine_refuses_non_finite_sampling_values_by_their_name(name):
    inputs = {"input_ids": np.array([[11, 12]], np.int32), "input_lengths": np.array([2], np.int32),
              "request_output_len": np.array([4], np.int32), name: np.array([np.inf], np.float32)}
    refused(lambda: parse_generation_requests(inputs, "r", EngineLimits(1000, 64), False), name, "got inf")


def test_the_engine_refuses_a_non_finite_embedding_bias():
    bias = np.zeros((1, 1000), np.float32)
    bias[0, 7] = -np.inf
    inputs = {"input_ids": np.array([[11, 12]], np.int32), "input_lengths": np.array([2], np.int32),
              "request_output_len": np.array([4], np.int32), "embedding_bias": bias}
    refused(lambda: parse_generation_requests(inputs, "r", EngineLimits(1000, 64), False), "embedding_bias",
            "got -inf at index 7")


def test_preprocessing_refuses_non_finite_bias_weights(bundle):
    inputs = {"QUERY": np.array([[b"hi"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
              "EMBEDDING_BIAS_WORDS": np.array([[b"hello"]], dtype=object),
              "EMBEDDING_BIAS_WEIGHTS": np.array([[np.nan]], np.float32)}
    refused(lambda: Preprocessor(bundle)(inputs), "EMBEDDING_BIAS_WEIGHTS", "must be a finite number")


def test_preprocessing_without_output_len_names_the_ensembles_max_tokens(bundle):
    inputs = {"QUERY": np.array([[b"hi"]], dtype=object)}
    refused(lambda: Preprocessor(bundle)(inputs), "REQUEST_OUTPUT_LEN", "max_tokens")


@pytest.mark.parametrize("text, depth", [
    ("3", 0), ('"[[["', 0), ("[]", 1), ("{}", 1), ('[{"role": "user", "content": "{[{[{["}]', 2),
    ('[{"a": [1, {"b": "]]]\\"]]"}]}]', 4), ("[" * 1000 + "]" * 1000, 1000),
])
def test_json_nesting_depth_ignores_brackets_in_strings(text, depth):
    assert json_nesting_depth(text) == depth


def test_json_at_the_limit_decodes_and_deeper_is_refused_before_decoding():
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json.dumps(decode_json(at_limit, "x")) == at_limit.replace("][", "], [")
    deeper = "[" * 100_000 + "]" * 100_000  # json.loads would raise RecursionError
    refused(lambda: decode_json(deeper, "messages"), "messages", "nests JSON 100000 levels deep; at most 64")


def test_deeply_nested_messages_are_refused_by_name():
    text = json.dumps([{"role": "user", "content": "hi"}])[:-1] + ", " + "[" * 5000 + "]" * 5000 + "]"
    refused(lambda: parse_chat(text, "MESSAGES"), "MESSAGES", "nests JSON 5001 levels deep")
    refused(lambda: parse_chat('{"role": ', "MESSAGES"), "MESSAGES", "is not valid JSON")


def test_a_deep_json_schema_guide_is_refused_before_it_is_compiled():
    guided = {"guided_decoding_guide_type": np.array([[b"json_schema"]], dtype=object),
              "guided_decoding_guide": np.array([[deep_schema(300).encode()]], dtype=object)}
    engine = {"input_ids": np.array([[11, 12]], np.int32), "input_lengths": np.array([2], np.int32),
              "request_output_len": np.array([4], np.int32), **guided}
    # No grammar compiler given: the depth is refused before the engine would say guided decoding is off.
    refused(lambda: parse_generation_requests(engine, "r", EngineLimits(1000, 64), False), "guided_decoding_guide",
            "nests JSON 601 levels deep")
    text = {"text_input": np.array([[b"hi"]], dtype=object), "max_tokens": np.array([[4]], np.int32), **guided}
    refused(lambda: TextRequest.from_inputs(text, CONFIG, "r"), "guided_decoding_guide", "nests JSON 601 levels deep")
    # A schema within the limit passes the BLS (the engine compiles it).
    text["guided_decoding_guide"] = np.array([[deep_schema(20).encode()]], dtype=object)
    assert TextRequest.from_inputs(text, CONFIG, "r").engine_inputs["guided_decoding_guide"].size == 1


@pytest.mark.parametrize("text, where", [
    ('[{"role": "user", "content": "a\\ud800"}]', "[0].content"),
    ('{"messages": [], "tools": [{"function": {"description": "\\udfff"}}]}', ".tools[0].function.description"),
    ('"\\ud800"', ""),
])
def test_a_lone_surrogate_escape_in_json_is_refused_by_name(text, where):
    """Valid JSON, but no character: refused naming the input and where, never a UnicodeEncodeError later."""
    error = refused(lambda: decode_json(text, "MESSAGES"), "MESSAGES", "lone UTF-16 surrogate escape")
    assert error.problem.endswith(f" at {where}" if where else "not a character)"), error
    assert decode_json('["\\ud83d\\ude00"]', "MESSAGES") == ["\U0001f600"]  # a pair is one character
