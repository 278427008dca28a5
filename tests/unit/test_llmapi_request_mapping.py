"""The llmapi flow's request mapping (llmapi_engine/request_mapping.py), case by case: the C++ backend's contract and
NVIDIA's llmapi names -> the keyword arguments of TensorRT-LLM 1.2.x's SamplingParams / GuidedDecodingParams, every
one a recorded field (tests/unit/upstream_llmapi.py); what the flow cannot do is refused by name."""

import numpy as np
import pytest

from bls.contract import TENSORRT_LLM_LLMAPI
from bls.errors import InvalidRequest
from bls.word_lists import encode_word_list
from llmapi_engine.model_config import LlmModelConfig, LoraAdapterPath
from llmapi_engine.request_mapping import LLMAPI_DEFAULT_MAX_TOKENS, map_request
from tests.unit import upstream_llmapi as upstream

VOCAB = 128256
MAX_SEQ_LEN = 4096
SAMPLING_FIELDS = {name for name, _ in upstream.SAMPLING_PARAMS}
GUIDE_FIELDS = {name for name, _ in upstream.GUIDED_DECODING_PARAMS}


def contract(prompt=(9906, 1917), max_tokens=8, **extra):
    inputs = {"input_ids": np.array([list(prompt)], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
              "request_output_len": np.array([max_tokens], np.int32)}
    for name, value in extra.items():
        inputs[name] = np.asarray(value) if not np.isscalar(value) else np.array([value])
    return inputs


def mapped(bundle, inputs, exclude_input=False, adapters=None):
    requests = map_request(inputs, bundle, VOCAB, MAX_SEQ_LEN, exclude_input, adapters or {})
    for request in requests:
        assert set(request.sampling) <= SAMPLING_FIELDS, set(request.sampling) - SAMPLING_FIELDS
        assert request.guided is None or set(request.guided) <= GUIDE_FIELDS
    return requests


def test_the_minimal_request_always_sets_max_tokens_and_no_end_id(bundle):
    (request,) = mapped(bundle, contract())
    assert request.prompt_token_ids == [9906, 1917]
    assert request.sampling == {"max_tokens": 8, "exclude_input_from_output": True, "end_id": -1,
                                "pad_id": bundle.pad_id}
    assert not request.streaming and not request.text_api


@pytest.mark.parametrize("name, value, field, expected", [
    ("temperature", np.float32(0.5), "temperature", 0.5),
    ("runtime_top_k", np.int32(5), "top_k", 5),
    ("runtime_top_p", np.float32(0.25), "top_p", 0.25),
    ("runtime_top_p_min", np.float32(0.5), "top_p_min", 0.5),
    ("runtime_top_p_decay", np.float32(0.5), "top_p_decay", 0.5),
    ("runtime_top_p_reset_ids", np.int32(3), "top_p_reset_ids", 3),
    ("seed", np.uint64(7), "seed", 7),
    ("min_tokens", np.int32(2), "min_tokens", 2),
    ("repetition_penalty", np.float32(1.5), "repetition_penalty", 1.5),
    ("presence_penalty", np.float32(0.5), "presence_penalty", 0.5),
    ("frequency_penalty", np.float32(0.5), "frequency_penalty", 0.5),
    ("len_penalty", np.float32(0.5), "length_penalty", 0.5),
    ("early_stopping", np.bool_(True), "early_stopping", 1),
    ("beam_search_diversity_rate", np.float32(0.5), "beam_search_diversity_rate", 0.5),
    ("end_id", np.int32(128009), "end_id", 128009),
    ("pad_id", np.int32(0), "pad_id", 0),
    ("return_log_probs", np.bool_(True), "logprobs", 1),
    ("return_context_logits", np.bool_(True), "return_context_logits", True),
    ("return_generation_logits", np.bool_(True), "return_generation_logits", True),
    ("return_perf_metrics", np.bool_(True), "return_perf_metrics", True),
])
def test_each_contract_input_sets_its_sampling_field(bundle, name, value, field, expected):
    (request,) = mapped(bundle, contract(**{name: np.array([value])}))
    assert request.sampling[field] == expected
    assert type(request.sampling[field]) is type(expected)


def test_one_token_words_become_ids_and_longer_ones_their_text(bundle):
    hello = bundle.encode_text(" hello there", add_special_tokens=False)
    assert len(hello) > 1
    words = encode_word_list([[128009], hello])[np.newaxis]
    (request,) = mapped(bundle, contract(stop_words_list=words, bad_words_list=encode_word_list([[11]])[np.newaxis]))
    assert request.sampling["stop_token_ids"] == [128009]
    assert request.sampling["stop"] == [" hello there"]
    assert request.sampling["include_stop_str_in_output"] is True  # the C++ executor keeps the stop word
    assert request.sampling["bad_token_ids"] == [11] and "bad" not in request.sampling


def test_preprocessings_empty_embedding_bias_is_no_bias_and_a_full_one_a_tensor(bundle):
    (request,) = mapped(bundle, contract(embedding_bias=np.zeros((1, 0), np.float32)))
    assert "embedding_bias" not in request.sampling
    bias = np.zeros((1, VOCAB), np.float32)
    bias[0, 5] = 2.0
    (request,) = mapped(bundle, contract(embedding_bias=bias))
    assert request.sampling["embedding_bias"].shape == (VOCAB,) and float(request.sampling["embedding_bias"][5]) == 2


@pytest.mark.parametrize("guide_type, guide, expected", [
    ("json", None, {"json_object": True}),
    ("json_schema", '{"type": "object"}', {"json": '{"type": "object"}'}),
    ("regex", "[a-z]+", {"regex": "[a-z]+"}),
    ("ebnf_grammar", 'root ::= "a"', {"grammar": 'root ::= "a"'}),
])
def test_a_guide_becomes_guided_decoding_params(bundle, guide_type, guide, expected):
    extra = {"guided_decoding_guide_type": np.array([[guide_type.encode()]], object)}
    if guide is not None:
        extra["guided_decoding_guide"] = np.array([[guide.encode()]], object)
    (request,) = mapped(bundle, contract(**extra))
    assert request.guided == expected


def test_batch_rows_are_separate_requests(bundle):
    inputs = {"input_ids": np.array([[1, 2, 3], [4, 5, 0]], np.int32), "input_lengths": np.array([3, 2], np.int32),
              "request_output_len": np.array([4, 6], np.int32), "streaming": np.array([True, True])}
    first, second = mapped(bundle, inputs)
    assert (first.prompt_token_ids, second.prompt_token_ids) == ([1, 2, 3], [4, 5])
    assert (first.sampling["max_tokens"], second.sampling["max_tokens"]) == (4, 6)
    assert (first.batch_index, second.batch_index, first.batch_size) == (0, 1, 2)


def test_output_options(bundle):
    (request,) = mapped(bundle, contract(streaming=np.array([True]), return_num_input_tokens=np.array([True]),
                                         return_num_output_tokens=np.array([True])), exclude_input=True)
    assert request.streaming and request.exclude_input_in_output
    assert request.return_num_input_tokens and request.return_num_output_tokens
    (request,) = mapped(bundle, contract(exclude_input_in_output=np.array([False])), exclude_input=True)
    assert not request.exclude_input_in_output


@pytest.mark.parametrize("extra, field", [
    ({"beam_width": np.array([2], np.int32)}, "beam_width"),
    ({"num_return_sequences": np.array([2], np.int32)}, "num_return_sequences"),
    ({"draft_input_ids": np.array([[1, 2]], np.int32)}, "draft_input_ids"),
    ({"lora_task_id": np.array([1], np.uint64)}, "lora_task_id"),
    ({"lora_name": np.array([b"alpha"], object)}, "lora_name"),
    ({"lora_weights": np.zeros((1, 1, 4), np.float16)}, "lora_weights"),
    ({"lora_config": np.zeros((1, 1, 3), np.int32)}, "lora_config"),
    ({"prompt_embedding_table": np.zeros((1, 1, 4), np.float16)}, "prompt_embedding_table"),
    ({"lookahead_window_size": np.array([2], np.int32)}, "lookahead_window_size"),
    ({"encoder_input_features": np.zeros((1, 1, 4), np.float16)}, "encoder_input_features"),
    ({"sampling_param_top_k": np.array([2], np.int32)}, "sampling_param_top_k"),
    ({"end_id": np.array([VOCAB], np.int32)}, "end_id"),
])
def test_what_the_flow_cannot_do_is_refused_by_name(bundle, extra, field):
    with pytest.raises(InvalidRequest) as error:
        mapped(bundle, contract(**extra))
    assert error.value.field == field


@pytest.mark.parametrize("inputs, field", [
    ({"input_lengths": np.array([2], np.int32), "request_output_len": np.array([4], np.int32)}, "input_ids"),
    (contract(max_tokens=0), "request_output_len"),
    (contract(max_tokens=MAX_SEQ_LEN), "request_output_len"),
    (contract(prompt=(1, VOCAB)), "input_ids"),
])
def test_bad_requests_name_their_input(bundle, inputs, field):
    with pytest.raises(InvalidRequest) as error:
        mapped(bundle, inputs)
    assert error.value.field == field


# ---- NVIDIA's llmapi names ------------------------------------------------------------------------------------------

def llmapi(text="Hello <|eot_id|> world", **extra):
    inputs = {"text_input": np.array([[text.encode()]], object)}
    for name, value in extra.items():
        inputs[name] = np.asarray(value)
    return inputs


def test_nvidia_names_map_to_sampling_params_with_nvidias_defaults(bundle):
    (request,) = mapped(bundle, llmapi())
    assert request.text_api and not request.exclude_input_in_output  # NVIDIA's default echoes the prompt
    assert request.sampling["max_tokens"] == LLMAPI_DEFAULT_MAX_TOKENS
    assert request.sampling["end_id"] == bundle.end_id == 128009  # Llama 3 Instruct's turn end, not eos
    # User text is data: "<|eot_id|>" in text_input is text, never the control token.
    assert 128009 not in request.prompt_token_ids and request.prompt_token_ids[0] == 128000


def test_each_nvidia_sampling_input_sets_its_field(bundle):
    (request,) = mapped(bundle, llmapi(
        sampling_param_temperature=np.array([[0.5]], np.float32), sampling_param_top_k=np.array([[3]], np.int32),
        sampling_param_top_p=np.array([[0.9]], np.float32),
        sampling_param_frequency_penalty=np.array([[0.1]], np.float32),
        sampling_param_presence_penalty=np.array([[0.2]], np.float32),
        sampling_param_max_tokens=np.array([[20]], np.int32),
        sampling_param_stop=np.array([[b"end", b"stop"]], object), sampling_param_seed=np.array([[5]], np.uint64),
        sampling_param_exclude_input_from_output=np.array([[True]]),
        sampling_param_return_perf_metrics=np.array([[True]]), sampling_param_best_of=np.array([[1]], np.int32),
        return_finish_reason=np.array([[True]]), return_cumulative_logprob=np.array([[True]]),
        streaming=np.array([[True]])))
    sampling = request.sampling
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (0.5, 3, pytest.approx(0.9))
    assert (sampling["frequency_penalty"], sampling["presence_penalty"]) == (pytest.approx(0.1), pytest.approx(0.2))
    assert (sampling["max_tokens"], sampling["stop"], sampling["seed"]) == (20, ["end", "stop"], 5)
    assert sampling["return_perf_metrics"] is True and sampling["logprobs"] == 1  # cumulative_logprob needs them
    assert request.exclude_input_in_output and request.streaming
    assert request.output_switches == {"return_finish_reason", "return_cumulative_logprob"}


@pytest.mark.parametrize("extra, field", [
    ({"sampling_param_best_of": np.array([[2]], np.int32)}, "sampling_param_best_of"),
    ({"sampling_param_max_tokens": np.array([[0]], np.int32)}, "sampling_param_max_tokens"),
    ({"sampling_param_max_tokens": np.array([[MAX_SEQ_LEN]], np.int32)}, "sampling_param_max_tokens"),
    ({"input_lengths": np.array([[2]], np.int32)}, "input_lengths"),
])
def test_nvidia_requests_are_refused_by_name(bundle, extra, field):
    with pytest.raises(InvalidRequest) as error:
        mapped(bundle, llmapi(**extra))
    assert error.value.field == field


def test_the_contract_declares_nvidias_llmapi_tensors_and_the_cpp_backends():
    from bls.contract import TENSORRT_LLM

    inputs = {(s.name, s.data_type) for s in TENSORRT_LLM_LLMAPI.inputs}
    outputs = {(s.name, s.data_type) for s in TENSORRT_LLM_LLMAPI.outputs}
    assert upstream.LLMAPI_MODEL_INPUTS <= inputs
    assert upstream.LLMAPI_MODEL_OUTPUTS <= outputs
    assert {(s.name, s.data_type) for s in TENSORRT_LLM.inputs} <= inputs
    assert {(s.name, s.data_type, s.dims) for s in TENSORRT_LLM.outputs} <= \
        {(s.name, s.data_type, s.dims) for s in TENSORRT_LLM_LLMAPI.outputs}
    assert all(spec.optional for spec in TENSORRT_LLM_LLMAPI.inputs)  # two request shapes: the model checks


# ---- LoRA: the repository's adapters (model.yaml lora_config.lora_dir) by task id or name -----------------------
LORA_YAML = {"model": "/m", "lora_config": {"lora_dir": ["/r/tensorrt_llm/1/lora/alpha", "/r/tensorrt_llm/1/lora/beta"],
                                            "lora_ckpt_source": "hf", "max_lora_rank": 8}}


def test_the_adapter_table_is_lora_dir_in_task_id_order():
    adapters = LlmModelConfig(LORA_YAML, decoupled=True, cancellation_check_period_ms=100).lora_adapters()
    assert adapters == {"alpha": LoraAdapterPath("alpha", 1, "/r/tensorrt_llm/1/lora/alpha"),
                        "beta": LoraAdapterPath("beta", 2, "/r/tensorrt_llm/1/lora/beta")}
    assert LlmModelConfig({"model": "/m"}, decoupled=True, cancellation_check_period_ms=100).lora_adapters() == {}


def test_lora_task_id_or_lora_name_select_the_same_adapter_per_row(bundle):
    adapters = LlmModelConfig(LORA_YAML, decoupled=True, cancellation_check_period_ms=100).lora_adapters()
    (by_id,) = mapped(bundle, contract(lora_task_id=np.array([2], np.uint64)), adapters=adapters)
    (by_name,) = mapped(bundle, contract(lora_name=np.array([b"beta"], object)), adapters=adapters)
    (both,) = mapped(bundle, contract(lora_name=np.array([b"beta"], object), lora_task_id=np.array([2], np.uint64)),
                     adapters=adapters)
    assert by_id.lora == by_name.lora == both.lora == adapters["beta"]
    (plain,) = mapped(bundle, contract(), adapters=adapters)
    assert plain.lora is None
    inputs = {"input_ids": np.array([[5, 6], [7, 8]], np.int32), "input_lengths": np.array([[2], [2]], np.int32),
              "request_output_len": np.array([[4], [4]], np.int32), "lora_task_id": np.array([[1], [2]], np.uint64)}
    assert [request.lora.name for request in mapped(bundle, inputs, adapters=adapters)] == ["alpha", "beta"]


@pytest.mark.parametrize("extra, field, message", [
    ({"lora_task_id": np.array([3], np.uint64)}, "lora_task_id",
     "LoRA task 3 not found: this repository's adapters are alpha=1, beta=2"),
    ({"lora_name": np.array([b"gamma"], object)}, "lora_name", "unknown LoRA adapter 'gamma'"),
    ({"lora_name": np.array([b"alpha"], object), "lora_task_id": np.array([2], np.uint64)}, "lora_task_id",
     "is not the task id of lora_name 'alpha'"),
    ({"lora_weights": np.zeros((1, 1, 4), np.float16)}, "lora_weights", "takes LoRA adapters by path"),
])
def test_what_selects_no_adapter_of_the_repository_is_refused_by_name(bundle, extra, field, message):
    adapters = LlmModelConfig(LORA_YAML, decoupled=True, cancellation_check_period_ms=100).lora_adapters()
    with pytest.raises(InvalidRequest) as error:
        mapped(bundle, contract(**extra), adapters=adapters)
    assert error.value.field == field and message in str(error.value)
