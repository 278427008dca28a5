"""Turning the tensors of one Triton request to `tensorrt_llm` into validated generation requests.

A Triton request may carry batch > 1: `input_ids` is [batch, maxlen], right-padded, with the real lengths
in `input_lengths`. Scalar inputs arrive as [batch] (the config reshapes [1] to []), [batch, 1] is accepted
too. Each batch row becomes one `GenerationRequest`; every problem is an `InvalidRequest` naming the input.

Choices (TensorRT-LLM leaves them to the deployment): end_id absent means "never stop on a token";
draft_input_ids needs batch size 1 (a ragged [batch, N] tensor carries no per-row draft lengths).
A guide (guided_decoding_guide_type / guided_decoding_guide) is compiled here, before the request is queued
(embedded_engine.guided says how and where that differs from TensorRT-LLM 1.2.1). So is a LoRA adapter resolved
(lora_task_id, with lora_weights / lora_config the first time: embedded_engine.lora), where the engine takes LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bls.batch import BatchInputs, decode_utf8, refuse_deep_json
from bls.contract import RENAMED_INPUTS
from bls.errors import InvalidRequest
from bls.token_ids import check_token_ids
from bls.word_lists import WordList
from embedded_engine.guided import GUIDE_INPUT, GUIDE_TYPE_INPUT, CompiledGuide, GrammarCache, parse_guide
from embedded_engine.lora import LoraAdapter, LoraCache
from embedded_engine.sampling import SamplingParams
from embedded_engine.stopping import StopCriteria

REQUIRED_INPUTS = ("input_ids", "input_lengths", "request_output_len")

# Inputs the embedded engine honours; any other optional input present in a request is rejected by
# name rather than silently ignored.
SUPPORTED_INPUTS = frozenset(
    {
        "input_ids", "input_lengths", "request_output_len", "num_return_sequences", "draft_input_ids",
        "end_id", "pad_id", "stop_words_list", "bad_words_list", "embedding_bias", "beam_width",
        "temperature", "runtime_top_k", "runtime_top_p", "repetition_penalty", "min_tokens",
        "presence_penalty", "frequency_penalty", "seed", "return_log_probs",
        "return_context_logits", "return_generation_logits", "return_perf_metrics", "return_num_input_tokens",
        "return_num_output_tokens", "exclude_input_in_output", "stop", "streaming",
        GUIDE_TYPE_INPUT, GUIDE_INPUT,
        # Sent by upstream clients and preprocessing for encoder-decoder models; a decoder-only model
        # ignores them, as the tensorrtllm backend does.
        "decoder_input_ids", "decoder_input_lengths",
        # Beam-search knobs that TensorRT-LLM ignores at beam width 1, the only width served here.
        "len_penalty", "early_stopping", "beam_search_diversity_rate",
    }
)
# Honoured where the engine was built for LoRA (EngineSettings.lora_target_modules), refused by name elsewhere.
LORA_INPUTS = frozenset({"lora_task_id", "lora_weights", "lora_config"})
# Why the rest is refused, by the first word of the input's name (the message names the input too).
_UNSUPPORTED_FEATURES = {
    "lora": "LoRA is not supported by the embedded engine of this repository: it was built without adapters "
            "(make repo LORA_DIR=<adapters>)",
    "lookahead": "lookahead decoding is not supported by the embedded engine",
    "retention": "KV-cache retention priorities are not supported by the embedded engine",
    "draft": "draft logits are not supported by the embedded engine (draft_input_ids are)",
    "context": "disaggregated serving (context phase parameters) is not supported by the embedded engine",
    "prompt": "prompt tuning tables are not supported by the embedded engine",
    "runtime": "top-p decay is not supported by the embedded engine",
}
_MULTIMODAL = "multimodal and encoder inputs are not supported by the embedded engine (a text-only Llama)"


# v0.14 names the 1.2.1 backend no longer reads (it ignores them: a seed would do nothing).
_OLD_NAMES = {old: new for old, (_, new) in RENAMED_INPUTS.items() if old != new}


def unsupported_input_problem(name: str) -> str:
    if name in _OLD_NAMES:
        return f"is v0.14's name; TensorRT-LLM 1.2.1's engine reads {_OLD_NAMES[name]!r}, so does the embedded engine"
    return _UNSUPPORTED_FEATURES.get(name.split("_")[0], _MULTIMODAL)


@dataclass(frozen=True)
class EngineLimits:
    vocab_size: int
    max_seq_len: int
    max_draft_len: int = 0


@dataclass(frozen=True, eq=False)
class GenerationRequest:
    request_id: str  # the Triton request id ("" when the client gave none); `stop` requests match on it
    batch_index: int
    batch_size: int  # of the Triton request this row came from
    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    end_id: int | None = None
    pad_id: int | None = None
    stop_words: WordList = WordList()
    draft_tokens: tuple[int, ...] = ()
    streaming: bool = False
    exclude_input_in_output: bool = False
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    arrival_ns: int = 0  # time.time_ns() when the Triton request arrived (perf metrics)
    guide: CompiledGuide | None = None  # guided decoding: the compiled grammar the output must follow
    lora: LoraAdapter | None = None  # the LoRA adapter every forward pass of this request applies

    @property
    def lora_serial(self) -> int | None:
        """Which weights computed this request's KV cache, beyond the base model's (None: the base model's only)."""
        return None if self.lora is None else self.lora.serial

    @property
    def stop_criteria(self) -> StopCriteria:
        return StopCriteria(self.end_id, self.stop_words, self.max_new_tokens)


def is_stop_request(inputs: dict[str, np.ndarray]) -> bool:
    """A request with `stop=true` cancels the running request with the same Triton request id."""
    stop = inputs.get("stop")
    return stop is not None and bool(np.asarray(stop).any())


def parse_generation_requests(
    inputs: dict[str, np.ndarray], request_id: str, limits: EngineLimits, default_exclude_input: bool,
    arrival_ns: int = 0, grammars: GrammarCache | None = None, adapters: LoraCache | None = None,
) -> list[GenerationRequest]:
    """`grammars`: the engine's compiler for guided decoding (None: the engine has no tokenizer info, and a
    guided request is refused, as TensorRT-LLM refuses one when guided decoding is not configured). `adapters`: the
    engine's LoRA cache (None: the engine takes no LoRA, and the LoRA inputs are refused by name)."""
    for name in inputs:
        if name not in SUPPORTED_INPUTS and not (adapters is not None and name in LORA_INPUTS):
            raise InvalidRequest(name, unsupported_input_problem(name))
    for name in REQUIRED_INPUTS:
        if name not in inputs:
            raise InvalidRequest(name, "is required")
    input_ids = np.asarray(inputs["input_ids"])
    if input_ids.ndim != 2:
        raise InvalidRequest("input_ids", f"must have shape [batch, length], got {list(input_ids.shape)}")
    batch_size = input_ids.shape[0]
    if batch_size > 1 and "draft_input_ids" in inputs:
        raise InvalidRequest("draft_input_ids", "needs a request with batch size 1")
    rows = BatchInputs(inputs, batch_size)
    return [
        _parse_row(rows, row, input_ids[row], request_id, limits, default_exclude_input, arrival_ns, grammars,
                   adapters)
        for row in range(batch_size)
    ]


def _parse_row(
    rows: BatchInputs, row: int, padded_ids: np.ndarray, request_id: str, limits: EngineLimits,
    default_exclude_input: bool, arrival_ns: int, grammars: GrammarCache | None, adapters: LoraCache | None,
) -> GenerationRequest:
    vocab = limits.vocab_size
    prompt_len = rows.scalar("input_lengths", row, int)
    if prompt_len <= 0 or padded_ids.shape[0] == 0:
        raise InvalidRequest("input_ids", "the prompt is empty")
    if prompt_len > padded_ids.shape[0]:
        raise InvalidRequest(
            "input_lengths", f"{prompt_len} is longer than the {padded_ids.shape[0]} ids given in input_ids"
        )
    prompt = padded_ids[:prompt_len].astype(np.int64)
    check_token_ids("input_ids", prompt, vocab)

    max_new_tokens = rows.scalar("request_output_len", row, int)
    if max_new_tokens <= 0:
        raise InvalidRequest("request_output_len", f"must be > 0, got {max_new_tokens}")
    if prompt_len + max_new_tokens > limits.max_seq_len:
        raise InvalidRequest(
            "request_output_len",
            f"input length {prompt_len} + request_output_len {max_new_tokens} = {prompt_len + max_new_tokens} "
            f"exceeds the engine's max_seq_len {limits.max_seq_len}",
        )

    beam_width = rows.scalar("beam_width", row, int, 1)
    if beam_width != 1:
        raise InvalidRequest("beam_width", f"only 1 is supported by the embedded engine, got {beam_width}")
    num_return_sequences = rows.scalar("num_return_sequences", row, int, 1)
    if num_return_sequences != 1:
        raise InvalidRequest(
            "num_return_sequences", f"only 1 is supported by the embedded engine, got {num_return_sequences}"
        )

    end_id = rows.scalar("end_id", row, int)
    # -1 is the conventional "no end id" (preprocessing passes it through): run to max tokens.
    end_id = None if end_id == -1 else _optional_token("end_id", end_id, vocab)
    pad_id = _optional_token("pad_id", rows.scalar("pad_id", row, int), vocab)

    draft = rows.item("draft_input_ids", row, 1)
    draft_tokens = () if draft is None else tuple(draft.astype(np.int64).tolist())
    if len(draft_tokens) > limits.max_draft_len:
        raise InvalidRequest(
            "draft_input_ids",
            f"{len(draft_tokens)} draft tokens exceed the engine's max_draft_len {limits.max_draft_len}",
        )
    check_token_ids("draft_input_ids", np.asarray(draft_tokens, np.int64), vocab)

    return GenerationRequest(
        request_id=request_id,
        batch_index=row,
        batch_size=rows.batch_size,
        prompt=tuple(prompt.tolist()),
        max_new_tokens=max_new_tokens,
        sampling=_sampling_params(rows, row, vocab),
        end_id=end_id,
        pad_id=pad_id,
        stop_words=_word_list(rows, "stop_words_list", row, vocab),
        draft_tokens=draft_tokens,
        streaming=rows.scalar("streaming", row, bool, False),
        exclude_input_in_output=rows.scalar("exclude_input_in_output", row, bool, default_exclude_input),
        return_log_probs=rows.scalar("return_log_probs", row, bool, False),
        return_context_logits=rows.scalar("return_context_logits", row, bool, False),
        return_generation_logits=rows.scalar("return_generation_logits", row, bool, False),
        return_perf_metrics=rows.scalar("return_perf_metrics", row, bool, False),
        return_num_input_tokens=rows.scalar("return_num_input_tokens", row, bool, False),
        return_num_output_tokens=rows.scalar("return_num_output_tokens", row, bool, False),
        arrival_ns=arrival_ns,
        guide=_compiled_guide(rows, row, grammars),
        lora=_lora_adapter(rows, row, adapters),
    )


def _lora_adapter(rows: BatchInputs, row: int, adapters: LoraCache | None) -> LoraAdapter | None:
    """The row's adapter: its weights (cached under its task id) or its task id's cached weights; None without."""
    if adapters is None:
        return None
    task_id = rows.scalar("lora_task_id", row, int)
    return adapters.resolve(task_id, rows.item("lora_weights", row, 2), rows.item("lora_config", row, 2))


def _compiled_guide(rows: BatchInputs, row: int, grammars: GrammarCache | None) -> CompiledGuide | None:
    def text(name: str) -> str | None:
        return rows.scalar(name, row, lambda value: decode_utf8(value, name))

    guide = parse_guide(text(GUIDE_TYPE_INPUT), text(GUIDE_INPUT))
    if guide is None:
        return None
    if guide.type == "json_schema":
        refuse_deep_json(guide.text, GUIDE_INPUT)
    if grammars is None:
        raise InvalidRequest(GUIDE_TYPE_INPUT, "guided decoding is not configured for this engine (its "
                             "guided_decoding_backend / xgrammar_tokenizer_info_path parameters are unset)")
    return grammars.compile(guide)


def _sampling_params(rows: BatchInputs, row: int, vocab: int) -> SamplingParams:
    temperature = rows.scalar("temperature", row, float, 1.0)
    if temperature < 0:
        raise InvalidRequest("temperature", f"must be >= 0, got {temperature}")
    top_k = rows.scalar("runtime_top_k", row, int, 0)
    if top_k < 0:
        raise InvalidRequest("runtime_top_k", f"must be >= 0, got {top_k}")
    top_p = rows.scalar("runtime_top_p", row, float, 0.0)
    if not 0.0 <= top_p <= 1.0:
        raise InvalidRequest("runtime_top_p", f"must be in [0, 1], got {top_p}")
    repetition_penalty = rows.scalar("repetition_penalty", row, float, 1.0)
    if repetition_penalty <= 0:
        raise InvalidRequest("repetition_penalty", f"must be > 0, got {repetition_penalty}")
    min_tokens = rows.scalar("min_tokens", row, int, 0)
    if min_tokens < 0:
        raise InvalidRequest("min_tokens", f"must be >= 0, got {min_tokens}")

    bias = rows.item("embedding_bias", row, 1)
    if bias is not None and bias.shape[0] == 0:
        bias = None  # preprocessing sends [batch, 0] when no bias words were given
    if bias is not None and bias.shape[0] != vocab:
        raise InvalidRequest("embedding_bias", f"has {bias.shape[0]} values, the vocabulary has {vocab}")

    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=rows.scalar("presence_penalty", row, float, 0.0),
        frequency_penalty=rows.scalar("frequency_penalty", row, float, 0.0),
        seed=rows.scalar("seed", row, int, 0),
        min_tokens=min_tokens,
        bad_words=_word_list(rows, "bad_words_list", row, vocab),
        embedding_bias=None if bias is None else bias.astype(np.float32),
    )


def _word_list(rows: BatchInputs, name: str, row: int, vocab: int) -> WordList:
    return WordList.from_tensor(name, rows.item(name, row, 2), vocab)


def _optional_token(name: str, value: int | None, vocab: int) -> int | None:
    if value is not None:
        check_token_ids(name, [value], vocab)
    return value
