import numpy as np
import pytest

from bls.contract import TENSORRT_LLM
from bls.errors import InvalidRequest
from embedded_engine.request import EngineLimits, is_stop_request, parse_generation_requests

LIMITS = EngineLimits(vocab_size=1000, max_seq_len=64, max_draft_len=4)


def base_inputs(**extra):
    inputs = {
        "input_ids": np.array([[11, 12, 13]], np.int32),
        "input_lengths": np.array([3], np.int32),  # [batch], as `reshape: []` delivers it
        "request_output_len": np.array([8], np.int32),
    }
    inputs.update(extra)
    return inputs


def parse(inputs, default_exclude_input=False):
    return parse_generation_requests(inputs, "req-1", LIMITS, default_exclude_input)


def rejects(inputs, field, problem):
    with pytest.raises(InvalidRequest) as error:
        parse(inputs)
    assert error.value.field == field
    assert problem in error.value.problem
    return error.value


def test_minimal_request_defaults():
    (request,) = parse(base_inputs())
    assert request.request_id == "req-1"
    assert request.prompt == (11, 12, 13)
    assert request.max_new_tokens == 8
    assert request.end_id is None  # never stop on a token unless asked
    assert request.sampling.greedy
    assert request.sampling.seed == 0
    assert not request.streaming and not request.exclude_input_in_output
    assert not request.stop_words and not request.sampling.bad_words
    assert request.batch_size == 1 and request.batch_index == 0


def test_batch_rows_with_padding_and_column_scalars():
    inputs = {
        "input_ids": np.array([[11, 12, 13], [21, 22, 0]], np.int32),
        "input_lengths": np.array([[3], [2]], np.int32),  # [batch, 1] is accepted too
        "request_output_len": np.array([[5], [6]], np.int32),
        "end_id": np.array([7, 8], np.int32),
        "temperature": np.array([0.5], np.float32),  # one value for the whole batch
        "runtime_top_k": np.array([[4], [0]], np.int32),
    }
    first, second = parse(inputs)
    assert (first.prompt, second.prompt) == ((11, 12, 13), (21, 22))
    assert (first.max_new_tokens, second.max_new_tokens) == (5, 6)
    assert (first.end_id, second.end_id) == (7, 8)
    assert first.sampling.temperature == second.sampling.temperature == 0.5
    assert not first.sampling.greedy and second.sampling.greedy
    assert (first.batch_index, second.batch_index, second.batch_size) == (0, 1, 2)


def test_all_supported_inputs_are_read():
    bias = np.zeros((1, 1000), np.float32)
    bias[0, 5] = 2.0
    inputs = base_inputs(
        end_id=np.array([2], np.int32),
        pad_id=np.array([2], np.int32),
        stop_words_list=np.array([[[7, 8, 9], [2, 3, -1]]], np.int32),
        bad_words_list=np.array([[[4], [1]]], np.int32),
        embedding_bias=bias,
        temperature=np.array([0.7], np.float32),
        runtime_top_k=np.array([10], np.int32),
        runtime_top_p=np.array([0.9], np.float32),
        repetition_penalty=np.array([1.1], np.float32),
        presence_penalty=np.array([0.5], np.float32),
        frequency_penalty=np.array([0.25], np.float32),
        min_tokens=np.array([3], np.int32),
        seed=np.array([2**64 - 1], np.uint64),
        draft_input_ids=np.array([[1, 2]], np.int32),
        streaming=np.array([True]),
        exclude_input_in_output=np.array([False]),
        return_log_probs=np.array([True]),
        return_context_logits=np.array([True]),
        return_generation_logits=np.array([True]),
        beam_width=np.array([1], np.int32),
        num_return_sequences=np.array([1], np.int32),
        stop=np.array([False]),
    )
    (request,) = parse(inputs, default_exclude_input=True)
    sampling = request.sampling
    assert request.end_id == 2 and request.pad_id == 2
    assert request.stop_words.words == ((7, 8), (9,))
    assert sampling.bad_words.words == ((4,),)
    assert sampling.embedding_bias[5] == 2.0
    assert (sampling.temperature, sampling.top_k) == (pytest.approx(0.7), 10)
    assert sampling.top_p == pytest.approx(0.9)
    assert (sampling.repetition_penalty, sampling.presence_penalty) == (pytest.approx(1.1), 0.5)
    assert (sampling.frequency_penalty, sampling.min_tokens, sampling.seed) == (0.25, 3, 2**64 - 1)
    assert request.draft_tokens == (1, 2)
    assert request.streaming and request.return_log_probs
    assert request.return_context_logits and request.return_generation_logits
    assert not request.exclude_input_in_output  # the request input wins over the parameter
    assert not is_stop_request(inputs)


def test_exclude_input_default_comes_from_the_parameter():
    (request,) = parse(base_inputs(), default_exclude_input=True)
    assert request.exclude_input_in_output


def test_empty_word_lists_and_bias_from_preprocessing_mean_none():
    inputs = base_inputs(
        stop_words_list=np.array([[[0], [-1]]], np.int32),
        bad_words_list=np.zeros((1, 2, 0), np.int32),
        embedding_bias=np.zeros((1, 0), np.float32),
    )
    (request,) = parse(inputs)
    assert not request.stop_words and not request.sampling.bad_words
    assert request.sampling.embedding_bias is None


def test_stop_request_detection():
    assert is_stop_request({"stop": np.array([True])})
    assert not is_stop_request({"stop": np.array([[False]])})
    assert not is_stop_request(base_inputs())


@pytest.mark.parametrize("missing", ["input_ids", "input_lengths", "request_output_len"])
def test_required_inputs(missing):
    inputs = base_inputs(temperature=np.array([1.0], np.float32))
    del inputs[missing]
    rejects(inputs, missing, "is required")


def test_every_unsupported_contract_input_is_rejected_by_name():
    from embedded_engine.request import SUPPORTED_INPUTS

    unsupported = [s.name for s in TENSORRT_LLM.inputs if s.name not in SUPPORTED_INPUTS]
    assert "lora_task_id" in unsupported
    for name in unsupported:
        rejects(base_inputs(**{name: np.array([1], np.int32)}), name, "not supported by the embedded engine")


@pytest.mark.parametrize(
    "extra, field, problem",
    [
        ({"input_lengths": np.array([0], np.int32)}, "input_ids", "empty"),
        ({"input_ids": np.zeros((1, 0), np.int32)}, "input_ids", "empty"),
        ({"input_lengths": np.array([4], np.int32)}, "input_lengths", "longer than the 3 ids"),
        ({"input_ids": np.array([11, 12, 13], np.int32)}, "input_ids", "shape [batch, length]"),
        ({"input_ids": np.array([[11, 1000, 13]], np.int32)}, "input_ids", "token id 1000 is outside"),
        ({"input_ids": np.array([[11, -1, 13]], np.int32)}, "input_ids", "token id -1 is outside"),
        ({"request_output_len": np.array([0], np.int32)}, "request_output_len", "must be > 0"),
        ({"request_output_len": np.array([62], np.int32)}, "request_output_len", "input length 3 + request_output_len"),
        ({"beam_width": np.array([2], np.int32)}, "beam_width", "only 1"),
        ({"num_return_sequences": np.array([2], np.int32)}, "num_return_sequences", "only 1"),
        ({"end_id": np.array([1000], np.int32)}, "end_id", "outside the vocabulary"),
        ({"pad_id": np.array([-1], np.int32)}, "pad_id", "outside the vocabulary"),
        ({"draft_input_ids": np.array([[1, 2, 3, 4, 5]], np.int32)}, "draft_input_ids", "max_draft_len 4"),
        ({"draft_input_ids": np.array([[1, 5000]], np.int32)}, "draft_input_ids", "outside the vocabulary"),
        ({"stop_words_list": np.array([[[7, 8], [2, 1]]], np.int32)}, "stop_words_list", "strictly increasing"),
        ({"bad_words_list": np.array([[[7, 8], [3, -1]]], np.int32)}, "bad_words_list", "beyond the 2 ids"),
        ({"embedding_bias": np.zeros((1, 999), np.float32)}, "embedding_bias", "the vocabulary has 1000"),
        ({"temperature": np.array([-1.0], np.float32)}, "temperature", ">= 0"),
        ({"runtime_top_p": np.array([1.5], np.float32)}, "runtime_top_p", "[0, 1]"),
        ({"runtime_top_k": np.array([-2], np.int32)}, "runtime_top_k", ">= 0"),
        ({"repetition_penalty": np.array([0.0], np.float32)}, "repetition_penalty", "> 0"),
        ({"min_tokens": np.array([-1], np.int32)}, "min_tokens", ">= 0"),
        ({"temperature": np.array([[1.0, 2.0]], np.float32)}, "temperature", "one value per batch item"),
    ],
)
def test_invalid_requests_name_the_field(extra, field, problem):
    rejects(base_inputs(**extra), field, problem)


def test_max_seq_len_error_says_both_numbers():
    error = rejects(base_inputs(request_output_len=np.array([62], np.int32)), "request_output_len", "max_seq_len 64")
    assert "= 65" in error.problem


def test_batch_mismatch_and_drafts_with_batch_are_rejected():
    inputs = base_inputs(
        input_ids=np.array([[1, 2], [3, 4]], np.int32),
        input_lengths=np.array([2, 2, 2], np.int32),
        request_output_len=np.array([4, 4], np.int32),
    )
    rejects(inputs, "input_lengths", "3 values for a batch of 2")
    inputs["input_lengths"] = np.array([2, 2], np.int32)
    inputs["draft_input_ids"] = np.array([[5], [6]], np.int32)
    rejects(inputs, "draft_input_ids", "batch size 1")
