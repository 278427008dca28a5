"""One Triton request to `tensorrt_llm` (llmapi flow) -> the LLM requests it makes: prompt token ids and the keyword
arguments of TensorRT-LLM 1.2.x's SamplingParams, by their upstream names.

Two request shapes are taken (bls/contract.py TENSORRT_LLM_LLMAPI):
- the C++ backend's contract (input_ids, input_lengths, request_output_len, ...: TENSORRT_LLM), so that the ensemble,
  tensorrt_llm_bls and NVIDIA's clients work unchanged; each batch row is one LLM request;
- NVIDIA's llmapi model's names (text_input, sampling_param_*, return_*_reason, return_cumulative_logprob;
  triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt and 1/helpers.py): one prompt, as text.

SamplingParams, from the C++ contract (sampling_params.py@b35ac1b field names; docs/llmapi.md):
- max_tokens = request_output_len, always set (SamplingParams' own default is 32);
- end_id = end_id; absent or -1, as for the C++ backend's executor, no end token: end_id -1 (the executor's "none";
  `ignore_eos` is not used because the LLM API then drops the stop words too: executor/base_worker.py), pad_id from
  pad_id (else the repository tokenizer's pad);
- stop_words_list / bad_words_list ([2, N] id sequences): one-token words -> stop_token_ids / bad_token_ids; longer
  words are decoded to their text -> stop / bad (SamplingParams takes id lists for one-token words only; the LLM API
  encodes the strings back without special tokens), with include_stop_str_in_output=True: the stop word stays in
  the output, as the C++ executor keeps it;
- temperature, runtime_top_k -> top_k, runtime_top_p -> top_p, runtime_top_p_min / _decay / _reset_ids -> top_p_min /
  top_p_decay / top_p_reset_ids, seed, min_tokens, repetition / presence / frequency_penalty, len_penalty ->
  length_penalty, early_stopping (int), beam_search_diversity_rate;
- embedding_bias -> embedding_bias (a [vocab] fp32 torch tensor; preprocessing's empty [batch, 0] is none);
- return_log_probs -> logprobs=1 (the chosen token's log-prob); return_context_logits, return_generation_logits,
  return_perf_metrics by their names;
- guided_decoding_guide_type / guided_decoding_guide -> guided_decoding=GuidedDecodingParams(json_object | json |
  regex | grammar) (json_schema -> json, ebnf_grammar -> grammar);
- exclude_input_from_output stays True: this model puts the prompt before the output itself where the request asks
  (exclude_input_in_output false, as the C++ backend echoes it unstreamed), so that token_ids_diff is always output.
Refused by name: beam_width > 1 and num_return_sequences > 1 (one sequence per request here), draft tokens and logits
(1.2.x's LLM API takes no per-request drafts: speculation is model.yaml's speculative_config), prompt tables,
multimodal and encoder inputs, KV-cache retention, lookahead, context phase parameters.
LoRA: `lora_task_id` or `lora_name` (both: they must agree; bls/lora_names.py, as preprocessing maps them) select one of
the repository's adapters (model.yaml lora_config.lora_dir: task id i is lora_dir[i - 1]), which the request carries
to generate_async as LoRARequest(lora_name, lora_int_id=task id, lora_path=its PEFT folder), as the PyTorch flow takes
adapters (by path). NVIDIA's lora_weights / lora_config (the engine-format upload of the C++ backend) are refused by
name: the LLM API has no way to take them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bls.batch import BatchInputs, decode_utf8, refuse_deep_json
from bls.errors import InvalidRequest
from bls.lora_names import lora_task_ids
from bls.text.tokenizer import TokenizerBundle
from bls.token_ids import check_token_ids
from bls.word_lists import WordList
from llmapi_engine.model_config import LoraAdapterPath

# NVIDIA's llmapi model: its ten sampling_param_* inputs (helpers.py get_sampling_params_from_request) -> the
# SamplingParams field each sets, and its output switches (get_output_config_from_request).
LLMAPI_SAMPLING_INPUTS = {
    "sampling_param_best_of": "best_of",
    "sampling_param_temperature": "temperature",
    "sampling_param_top_k": "top_k",
    "sampling_param_top_p": "top_p",
    "sampling_param_frequency_penalty": "frequency_penalty",
    "sampling_param_presence_penalty": "presence_penalty",
    "sampling_param_max_tokens": "max_tokens",
    "sampling_param_stop": "stop",
    "sampling_param_seed": "seed",
    "sampling_param_exclude_input_from_output": "exclude_input_from_output",
    "sampling_param_return_perf_metrics": "return_perf_metrics",
}
LLMAPI_OUTPUT_SWITCHES = ("return_finish_reason", "return_stop_reason", "return_cumulative_logprob")
# What NVIDIA's model asks when a request leaves max_tokens out: SamplingParams' default (sampling_params.py).
LLMAPI_DEFAULT_MAX_TOKENS = 32
TEXT_INPUT = "text_input"

# C++ contract inputs -> SamplingParams field, values passed as they are (converted to the field's type).
_SAMPLING_INPUTS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "runtime_top_k": ("top_k", int),
    "runtime_top_p": ("top_p", float),
    "runtime_top_p_min": ("top_p_min", float),
    "runtime_top_p_decay": ("top_p_decay", float),
    "runtime_top_p_reset_ids": ("top_p_reset_ids", int),
    "seed": ("seed", int),
    "min_tokens": ("min_tokens", int),
    "repetition_penalty": ("repetition_penalty", float),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "len_penalty": ("length_penalty", float),
    "early_stopping": ("early_stopping", int),
    "beam_search_diversity_rate": ("beam_search_diversity_rate", float),
}
_RETURN_FLAGS = ("return_context_logits", "return_generation_logits", "return_perf_metrics")
_CONTRACT_TAKEN = frozenset({
    "input_ids", "input_lengths", "request_output_len", "num_return_sequences", "beam_width", "end_id", "pad_id",
    "stop_words_list", "bad_words_list", "embedding_bias", "return_log_probs", "return_num_input_tokens",
    "return_num_output_tokens", "exclude_input_in_output", "streaming", "stop", "guided_decoding_guide_type",
    "guided_decoding_guide", "lora_task_id", "lora_name", *_SAMPLING_INPUTS, *_RETURN_FLAGS,
    # Encoder-decoder inputs upstream clients and preprocessing send; a decoder-only model has no use for them, as
    # the tensorrtllm backend ignores them.
    "decoder_input_ids", "decoder_input_lengths",
})
_LLMAPI_TAKEN = frozenset({TEXT_INPUT, "streaming", "stop", *LLMAPI_SAMPLING_INPUTS, *LLMAPI_OUTPUT_SWITCHES})
_REFUSED = {
    "draft": "1.2.x's LLM API takes no draft tokens or logits per request (speculative decoding is model.yaml's "
             "speculative_config)",
    "prompt": "prompt tuning tables are not served by the llmapi flow's tensorrt_llm",
    "lookahead": "lookahead decoding is not offered by TensorRT-LLM's PyTorch flow",
    "retention": "KV-cache retention priorities are not served by the llmapi flow's tensorrt_llm",
    "context": "disaggregated serving (context phase parameters) is not served by the llmapi flow's tensorrt_llm",
    "lora": "the LLM API takes LoRA adapters by path (model.yaml's lora_config), not as uploaded weights: select one "
            "of the repository's adapters with lora_task_id or lora_name",
}
_MULTIMODAL = "multimodal and encoder inputs are not served by the llmapi flow's tensorrt_llm (a text-only Llama)"
# Our guide types (embedded_engine/guided.py GUIDE_TYPES, the 1.2.1 backend's) -> GuidedDecodingParams' fields.
GUIDE_FIELDS = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}


@dataclass(frozen=True)
class LlmRequest:
    """One generate_async call: its prompt, SamplingParams / GuidedDecodingParams keyword arguments, and how its
    responses are shaped (llmapi_engine.responses)."""

    prompt_token_ids: list[int]
    sampling: dict[str, Any]
    guided: dict[str, Any] | None = None
    streaming: bool = False
    batch_index: int = 0
    batch_size: int = 1
    # The C++ contract's output options.
    exclude_input_in_output: bool = True
    return_log_probs: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    lora: LoraAdapterPath | None = None  # the repository's adapter the request selected
    # NVIDIA's llmapi names: text out (None: the C++ contract's token ids out) and its output switches.
    text_api: bool = False
    output_switches: frozenset[str] = field(default_factory=frozenset)


def is_stop_request(inputs: dict[str, np.ndarray]) -> bool:
    """`stop=true` (both contracts): abort the running request with the same Triton request id."""
    stop = inputs.get("stop")
    return stop is not None and bool(np.asarray(stop).any())


def map_request(inputs: dict[str, np.ndarray], tokenizer: TokenizerBundle, vocab_size: int, max_seq_len: int,
                default_exclude_input: bool, adapters: dict[str, LoraAdapterPath]) -> list[LlmRequest]:
    """The LLM requests of one Triton request; InvalidRequest names the input of any problem. `adapters`: the
    repository's LoRA adapters by name (LlmModelConfig.lora_adapters)."""
    requests = [map_llmapi_request(inputs, tokenizer)] if TEXT_INPUT in inputs else \
        map_contract_request(inputs, tokenizer, vocab_size, default_exclude_input, adapters)
    for request in requests:
        total = len(request.prompt_token_ids) + request.sampling["max_tokens"]
        if total > max_seq_len:
            field = "sampling_param_max_tokens" if request.text_api else "request_output_len"
            raise InvalidRequest(field, f"input length {len(request.prompt_token_ids)} + {field} "
                                        f"{request.sampling['max_tokens']} = {total} exceeds max_seq_len {max_seq_len}")
    return requests


def _refuse_unknown(inputs: dict[str, np.ndarray], taken: frozenset[str], other: frozenset[str], shape: str) -> None:
    for name in inputs:
        if name in taken:
            continue
        if name in other:
            raise InvalidRequest(name, f"is not an input of {shape} (it is one of the other request shape's; "
                                       "send text_input with NVIDIA's llmapi names, or input_ids with the C++ "
                                       "backend's)")
        raise InvalidRequest(name, _REFUSED.get(name.split("_")[0], _MULTIMODAL))


# ---- the C++ backend's contract ----------------------------------------------------------------------------------

def map_contract_request(inputs: dict[str, np.ndarray], tokenizer: TokenizerBundle, vocab_size: int,
                         default_exclude_input: bool, adapters: dict[str, LoraAdapterPath]) -> list[LlmRequest]:
    _refuse_unknown(inputs, _CONTRACT_TAKEN, _LLMAPI_TAKEN - {"streaming", "stop"}, "the C++ backend's contract")
    for name in ("input_ids", "input_lengths", "request_output_len"):
        if name not in inputs:
            raise InvalidRequest(name, "is required")
    input_ids = np.asarray(inputs["input_ids"])
    if input_ids.ndim != 2:
        raise InvalidRequest("input_ids", f"must have shape [batch, length], got {list(input_ids.shape)}")
    rows = BatchInputs(inputs, input_ids.shape[0])
    loras = _lora_adapters(rows, adapters)
    return [_contract_row(rows, row, input_ids[row], tokenizer, vocab_size, default_exclude_input, loras[row])
            for row in range(rows.batch_size)]


def _lora_adapters(rows: BatchInputs, adapters: dict[str, LoraAdapterPath]) -> list[LoraAdapterPath | None]:
    """Each row's adapter, from its lora_name or lora_task_id (bls/lora_names.py: an unknown name, or a name and an id
    that disagree, is refused naming them); an id that is none of the repository's adapters is refused too."""
    task_ids = lora_task_ids(rows, {name: adapter.task_id for name, adapter in adapters.items()}, "lora_name",
                             "lora_task_id")
    if task_ids is None:
        return [None] * rows.batch_size
    by_id = {adapter.task_id: adapter for adapter in adapters.values()}
    selected = []
    for task_id in task_ids.reshape(-1).tolist():
        if task_id not in by_id:
            served = ", ".join(f"{a.name}={a.task_id}" for a in adapters.values()) or "none: built without LORA_DIR"
            raise InvalidRequest("lora_task_id", f"LoRA task {task_id} not found: this repository's adapters are "
                                                 f"{served} (the LLM API takes adapters by path, not uploaded)")
        selected.append(by_id[task_id])
    return selected


def _contract_row(rows: BatchInputs, row: int, padded_ids: np.ndarray, tokenizer: TokenizerBundle, vocab_size: int,
                  default_exclude_input: bool, lora: LoraAdapterPath | None) -> LlmRequest:
    prompt_len = rows.scalar("input_lengths", row, int)
    if prompt_len <= 0 or padded_ids.shape[0] == 0:
        raise InvalidRequest("input_ids", "the prompt is empty")
    if prompt_len > padded_ids.shape[0]:
        raise InvalidRequest("input_lengths", f"{prompt_len} is longer than the {padded_ids.shape[0]} ids given")
    prompt = padded_ids[:prompt_len].astype(np.int64)
    check_token_ids("input_ids", prompt, vocab_size)
    max_tokens = rows.scalar("request_output_len", row, int)
    if max_tokens <= 0:
        raise InvalidRequest("request_output_len", f"must be > 0, got {max_tokens}")
    for name in ("beam_width", "num_return_sequences"):
        value = rows.scalar(name, row, int, 1)
        if value != 1:
            raise InvalidRequest(name, f"only 1 is served by the llmapi flow's tensorrt_llm, got {value}")

    sampling: dict[str, Any] = {"max_tokens": max_tokens, "exclude_input_from_output": True}
    end_id = rows.scalar("end_id", row, int, -1)
    if end_id != -1:
        check_token_ids("end_id", [end_id], vocab_size)
    sampling["end_id"] = end_id
    pad_id = rows.scalar("pad_id", row, int, tokenizer.pad_id)
    check_token_ids("pad_id", [pad_id], vocab_size)
    sampling["pad_id"] = pad_id
    for name, (field_name, convert) in _SAMPLING_INPUTS.items():
        value = rows.scalar(name, row, convert)
        if value is not None:
            sampling[field_name] = value
    for name in _RETURN_FLAGS:
        if rows.scalar(name, row, bool, False):
            sampling[name] = True
    return_log_probs = rows.scalar("return_log_probs", row, bool, False)
    if return_log_probs:
        sampling["logprobs"] = 1
    sampling.update(_word_lists(rows, row, tokenizer, vocab_size))
    bias = rows.item("embedding_bias", row, 1)
    if bias is not None and bias.shape[0]:  # preprocessing sends [batch, 0] without bias words
        if bias.shape[0] != vocab_size:
            raise InvalidRequest("embedding_bias", f"has {bias.shape[0]} values, the vocabulary has {vocab_size}")
        import torch

        sampling["embedding_bias"] = torch.from_numpy(np.ascontiguousarray(bias, np.float32))
    return LlmRequest(
        prompt_token_ids=prompt.tolist(),
        sampling=sampling,
        guided=_guide(rows, row),
        streaming=rows.scalar("streaming", row, bool, False),
        batch_index=row,
        batch_size=rows.batch_size,
        exclude_input_in_output=rows.scalar("exclude_input_in_output", row, bool, default_exclude_input),
        return_log_probs=return_log_probs,
        return_num_input_tokens=rows.scalar("return_num_input_tokens", row, bool, False),
        return_num_output_tokens=rows.scalar("return_num_output_tokens", row, bool, False),
        lora=lora,
    )


def _word_lists(rows: BatchInputs, row: int, tokenizer: TokenizerBundle, vocab_size: int) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, ids_field, text_field in (("stop_words_list", "stop_token_ids", "stop"),
                                        ("bad_words_list", "bad_token_ids", "bad")):
        words = WordList.from_tensor(name, rows.item(name, row, 2), vocab_size).words
        single = [word[0] for word in words if len(word) == 1]
        longer = [tokenizer.decode(word, skip_special_tokens=False) for word in words if len(word) > 1]
        if single:
            fields[ids_field] = single
        if longer:
            fields[text_field] = longer
    if "stop_token_ids" in fields or "stop" in fields:
        fields["include_stop_str_in_output"] = True
    return fields


def _guide(rows: BatchInputs, row: int) -> dict[str, Any] | None:
    from embedded_engine.guided import GUIDE_INPUT, GUIDE_TYPE_INPUT, parse_guide

    def text(name: str) -> str | None:
        return rows.scalar(name, row, lambda value: decode_utf8(value, name))

    guide = parse_guide(text(GUIDE_TYPE_INPUT), text(GUIDE_INPUT))
    if guide is None:
        return None
    if guide.type == "json":
        return {"json_object": True}
    if guide.type == "json_schema":
        refuse_deep_json(guide.text, GUIDE_INPUT)
    return {GUIDE_FIELDS[guide.type]: guide.text}


# ---- NVIDIA's llmapi names -----------------------------------------------------------------------------------------

def map_llmapi_request(inputs: dict[str, np.ndarray], tokenizer: TokenizerBundle) -> LlmRequest:
    """NVIDIA's request: `text_input` (its first string, as NVIDIA's model takes it) tokenized with the repository's
    tokenizer, BOS added and special-token strings kept as TEXT (user text never becomes a control token; NVIDIA's
    model hands the string to the LLM, whose tokenizer would parse them); sampling_param_* by NVIDIA's mapping, with
    NVIDIA's defaults (max_tokens 32, best_of 1, exclude_input_from_output false: the prompt's text is echoed, as
    the PyTorch flow echoes it when asked). End of turn: the repository's end id (Llama 3 Instruct's <|eot_id|>) and
    its other end-of-sequence ids as stop tokens, as the text models' preprocessing sets them."""
    _refuse_unknown(inputs, _LLMAPI_TAKEN, _CONTRACT_TAKEN - {"streaming", "stop"}, "NVIDIA's llmapi model")
    texts = np.asarray(inputs[TEXT_INPUT]).reshape(-1)
    if texts.size == 0:
        raise InvalidRequest(TEXT_INPUT, "is empty")
    prompt = tokenizer.encode_text(decode_utf8(texts[0], TEXT_INPUT), add_special_tokens=True)
    rows = BatchInputs({k: v for k, v in inputs.items() if k not in (TEXT_INPUT, "sampling_param_stop")}, 1)
    sampling: dict[str, Any] = {"max_tokens": LLMAPI_DEFAULT_MAX_TOKENS, "best_of": 1}
    for name, field_name in LLMAPI_SAMPLING_INPUTS.items():
        if name == "sampling_param_stop":
            if name in inputs:
                words = [decode_utf8(v, name) for v in np.asarray(inputs[name]).reshape(-1)]
                sampling["stop"] = [w for w in words if w]
            continue
        convert = {"temperature": float, "top_p": float, "frequency_penalty": float, "presence_penalty": float,
                   "exclude_input_from_output": bool, "return_perf_metrics": bool}.get(field_name, int)
        value = rows.scalar(name, 0, convert)
        if value is not None:
            sampling[field_name] = value
    if sampling["max_tokens"] <= 0:
        raise InvalidRequest("sampling_param_max_tokens", f"must be > 0, got {sampling['max_tokens']}")
    if sampling["best_of"] != 1:
        raise InvalidRequest("sampling_param_best_of", f"only 1 is served here, got {sampling['best_of']}")
    exclude_input = sampling.pop("exclude_input_from_output", False)
    sampling["exclude_input_from_output"] = True  # the echo is this model's (see the module's docstring)
    sampling["end_id"] = tokenizer.end_id
    sampling["pad_id"] = tokenizer.pad_id
    switches = frozenset(name for name in LLMAPI_OUTPUT_SWITCHES if rows.scalar(name, 0, bool, False))
    if "return_cumulative_logprob" in switches:
        sampling["logprobs"] = 1
    extra_ends = [eos for eos in tokenizer.eos_ids if eos != tokenizer.end_id]
    if extra_ends:
        sampling["stop_token_ids"] = extra_ends
    return LlmRequest(
        prompt_token_ids=prompt,
        sampling=sampling,
        streaming=rows.scalar("streaming", 0, bool, False),
        exclude_input_in_output=exclude_input,
        text_api=True,
        output_switches=switches,
    )
