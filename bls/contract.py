"""The tensor contract of every model in the repository: one place, used by everything.

The engine (`tensorrt_llm`) speaks exactly what TensorRT-LLM 1.2.1's tensorrtllm backend reads (the 26.07
container). The text side (`preprocessing`, `postprocessing`, `ensemble`, `tensorrt_llm_bls`) has the names,
dtypes and dims of NVIDIA's 1.2 models and also accepts v0.14's `random_seed` / `min_length`, so clients of
either generation work unchanged. Our additions are marked `extension=True`; they are all optional.

The config renderer writes the `input [...]` / `output [...]` blocks of each config.pbtxt from these
specs, and the Python models read requests through them (`bls.triton_io`), so a tensor is declared once.
Dims exclude the batch dimension (every model has max_batch_size > 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

# The names of the repository's models, defined here, where every layer can import them: the models themselves
# (bls/ is vendored into each Python model), the OpenAI API, and engine_build/topology.py, which says which
# models a request goes through and re-exports these names to the build.
TARGET_MODEL = "tensorrt_llm"
DRAFT_MODEL = "tensorrt_llm_draft"
BLS_MODEL = "tensorrt_llm_bls"  # what clients call, with or without the relay
BLS_PYTHON_MODEL = "tensorrt_llm_bls_python"  # the Python BLS's name behind the relay (its source: BLS_MODEL's)
HANDOFF_MODEL = "tensorrt_llm_handoff"  # the ensemble's engine step in a streaming repository (relay/handoff.h)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = True
    # `reshape: { shape: [ ] }`: the backend sees [batch] instead of [batch, 1] (upstream does this for
    # the scalar inputs of tensorrt_llm so that its C++ backend reads them as scalars).
    reshape_scalar: bool = False
    allow_ragged_batch: bool = False
    extension: bool = False

    def to_pbtxt(self, is_output: bool = False, reshape: bool = True) -> str:
        fields = [f'name: "{self.name}"', f"data_type: {self.data_type}", f"dims: [ {', '.join(map(str, self.dims))} ]"]
        if is_output:
            return "  {\n    " + "\n    ".join(fields) + "\n  }"
        if self.reshape_scalar and reshape:
            fields.append("reshape: { shape: [ ] }")
        if self.optional:
            fields.append("optional: true")
        if self.allow_ragged_batch:
            fields.append("allow_ragged_batch: true")
        return "  {\n    " + "\n    ".join(fields) + "\n  }"


@dataclass(frozen=True)
class ModelContract:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec:
        return self._by_name(self.inputs, name)

    def output(self, name: str) -> TensorSpec:
        return self._by_name(self.outputs, name)

    @staticmethod
    def _by_name(specs: tuple[TensorSpec, ...], name: str) -> TensorSpec:
        for spec in specs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def to_pbtxt(self, reshape: bool = True) -> str:
        """The config's input and output blocks; reshape=False leaves out the inputs' reshapes (a relay's config:
        it forwards each input in the shape it sees, which its Python model's config then reshapes)."""
        inputs = ",\n".join(s.to_pbtxt(reshape=reshape) for s in self.inputs)
        outputs = ",\n".join(s.to_pbtxt(is_output=True) for s in self.outputs)
        return f"input [\n{inputs}\n]\noutput [\n{outputs}\n]"


def _t(name, data_type, dims, **kw) -> TensorSpec:
    return TensorSpec(name, data_type, tuple(dims), **kw)


def _scalar(name, data_type, **kw) -> TensorSpec:
    return TensorSpec(name, data_type, (1,), **kw)


# Outputs the engine produces and the ensemble / BLS pass on under the same names (1.2.1: the perf metrics,
# token counts and draft acceptance came after v0.14; the engine sends them only when asked).
_GENERATION_DETAILS = (
    _t("cum_log_probs", "TYPE_FP32", [-1]),
    _t("output_log_probs", "TYPE_FP32", [-1, -1]),
    _t("context_logits", "TYPE_FP32", [-1, -1]),  # upstream: ${logits_datatype}; TYPE_FP32 is its default
    _t("generation_logits", "TYPE_FP32", [-1, -1, -1]),
    _scalar("batch_index", "TYPE_INT32"),
    _scalar("sequence_index", "TYPE_INT32"),
    _scalar("kv_cache_alloc_new_blocks", "TYPE_INT32"),
    _scalar("kv_cache_reused_blocks", "TYPE_INT32"),
    _scalar("kv_cache_alloc_total_blocks", "TYPE_INT32"),
    _scalar("arrival_time_ns", "TYPE_INT64"),
    _scalar("first_scheduled_time_ns", "TYPE_INT64"),
    _scalar("first_token_time_ns", "TYPE_INT64"),
    _scalar("last_token_time_ns", "TYPE_INT64"),
    _scalar("acceptance_rate", "TYPE_FP32"),
    _scalar("total_accepted_draft_tokens", "TYPE_INT32"),
    _scalar("total_draft_tokens", "TYPE_INT32"),
    _scalar("num_input_tokens", "TYPE_INT32"),
    _scalar("num_output_tokens", "TYPE_INT32"),
)

# ----------------------------------------------------------------------------------------------------
# tensorrt_llm: the engine, as TensorRT-LLM 1.2.1's tensorrtllm backend declares it
# (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt of the 1.2 line; the
# ${...} dtypes filled with upstream's defaults for a text model: FP16 features and prompt tables, FP32
# logits). The C++ backend reads inputs by name and ignores unknown ones, so a name from another
# version is a silent no-op there: these names are the contract. Our embedded engine declares the same.
# ----------------------------------------------------------------------------------------------------
_ENGINE_SCALAR = dict(reshape_scalar=True)
_RAGGED = dict(allow_ragged_batch=True)

TENSORRT_LLM = ModelContract(
    inputs=(
        _t("input_ids", "TYPE_INT32", [-1], **_RAGGED),  # optional since 1.x (encoder features may replace it)
        _t("encoder_input_features", "TYPE_FP16", [-1, -1], **_RAGGED),
        _scalar("encoder_output_lengths", "TYPE_INT32", **_ENGINE_SCALAR),
        _scalar("input_lengths", "TYPE_INT32", optional=False, **_ENGINE_SCALAR),
        _scalar("request_output_len", "TYPE_INT32", optional=False, **_ENGINE_SCALAR),
        _scalar("num_return_sequences", "TYPE_INT32", **_ENGINE_SCALAR),
        _t("draft_input_ids", "TYPE_INT32", [-1], **_RAGGED),
        _t("decoder_input_ids", "TYPE_INT32", [-1], **_RAGGED),
        _scalar("decoder_input_lengths", "TYPE_INT32", **_ENGINE_SCALAR),
        _t("draft_logits", "TYPE_FP32", [-1, -1], **_RAGGED),
        _scalar("draft_acceptance_threshold", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("end_id", "TYPE_INT32", **_ENGINE_SCALAR),
        _scalar("pad_id", "TYPE_INT32", **_ENGINE_SCALAR),
        _t("stop_words_list", "TYPE_INT32", [2, -1], **_RAGGED),
        _t("bad_words_list", "TYPE_INT32", [2, -1], **_RAGGED),
        _t("embedding_bias", "TYPE_FP32", [-1], **_RAGGED),
        _scalar("beam_width", "TYPE_INT32", **_ENGINE_SCALAR),
        _scalar("temperature", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("runtime_top_k", "TYPE_INT32", **_ENGINE_SCALAR),
        _scalar("runtime_top_p", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("runtime_top_p_min", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("runtime_top_p_decay", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("runtime_top_p_reset_ids", "TYPE_INT32", **_ENGINE_SCALAR),
        _scalar("len_penalty", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("early_stopping", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("repetition_penalty", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("min_tokens", "TYPE_INT32", **_ENGINE_SCALAR),  # v0.14: min_length
        _scalar("beam_search_diversity_rate", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("presence_penalty", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("frequency_penalty", "TYPE_FP32", **_ENGINE_SCALAR),
        _scalar("seed", "TYPE_UINT64", **_ENGINE_SCALAR),  # v0.14: random_seed
        _scalar("return_log_probs", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("return_context_logits", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("return_generation_logits", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("return_perf_metrics", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("return_num_input_tokens", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("return_num_output_tokens", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("exclude_input_in_output", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("stop", "TYPE_BOOL", **_ENGINE_SCALAR),
        _scalar("streaming", "TYPE_BOOL", **_ENGINE_SCALAR),
        _t("prompt_embedding_table", "TYPE_FP16", [-1, -1], **_RAGGED),
        _t("prompt_table_extra_ids", "TYPE_UINT64", [-1], **_RAGGED),
        _scalar("prompt_vocab_size", "TYPE_INT32", **_ENGINE_SCALAR),
        _t("cross_attention_mask", "TYPE_BOOL", [-1, -1], **_RAGGED),
        _t("mrope_rotary_cos_sin", "TYPE_FP32", [-1]),
        _scalar("mrope_position_deltas", "TYPE_INT64"),
        _scalar("lora_task_id", "TYPE_UINT64", **_ENGINE_SCALAR),
        _t("lora_weights", "TYPE_FP16", [-1, -1], **_RAGGED),
        _t("lora_config", "TYPE_INT32", [-1, 3], **_RAGGED),
        _t("context_phase_params", "TYPE_UINT8", [-1], **_RAGGED),
        _scalar("skip_cross_attn_blocks", "TYPE_BOOL", **_RAGGED),
        _t("retention_token_range_starts", "TYPE_INT32", [-1], **_RAGGED),
        _t("retention_token_range_ends", "TYPE_INT32", [-1], **_RAGGED),
        _t("retention_token_range_priorities", "TYPE_INT32", [-1], **_RAGGED),
        _t("retention_token_range_durations_ms", "TYPE_INT32", [-1], **_RAGGED),
        _scalar("retention_decode_priority", "TYPE_INT32", **_RAGGED),
        _scalar("retention_decode_duration_ms", "TYPE_INT32", **_RAGGED),
        _scalar("guided_decoding_guide_type", "TYPE_STRING", **_RAGGED),
        _scalar("guided_decoding_guide", "TYPE_STRING", **_RAGGED),
        _scalar("lookahead_window_size", "TYPE_INT32", **_RAGGED),
        _scalar("lookahead_ngram_size", "TYPE_INT32", **_RAGGED),
        _scalar("lookahead_verification_set_size", "TYPE_INT32", **_RAGGED),
    ),
    outputs=(
        _t("output_ids", "TYPE_INT32", [-1, -1]),
        _t("sequence_length", "TYPE_INT32", [-1]),
        *_GENERATION_DETAILS[:6],
        _t("context_phase_params", "TYPE_UINT8", [-1]),
        *_GENERATION_DETAILS[6:],
    ),
)

# ----------------------------------------------------------------------------------------------------
# tensorrt_llm on the LLM API (the llmapi flow, llmapi_engine): the C++ backend's contract above, so the ensemble, the
# BLS and NVIDIA's clients work unchanged, plus NVIDIA's llmapi model's names (triton_backend/all_models/llmapi/
# tensorrt_llm/config.pbtxt: text_input, sampling_param_*, return_*; outputs text_output, finish_reason, stop_reason,
# cumulative_logprob and its perf outputs, in that config's dtypes), so a request from NVIDIA's README answers. Two
# request shapes in one model: input_lengths and request_output_len are optional to Triton here and required by the
# model for a request with input_ids (llmapi_engine/request_mapping.py); NVIDIA's inputs are [1] per row (its config
# says [-1] with max_batch_size 0; only the first string of text_input is read there, as here).
# ----------------------------------------------------------------------------------------------------
_LLMAPI_SCALAR = dict(reshape_scalar=True)
TENSORRT_LLM_LLMAPI = ModelContract(
    inputs=tuple(replace(spec, optional=True) for spec in TENSORRT_LLM.inputs) + (
        _scalar("text_input", "TYPE_STRING"),
        _scalar("sampling_param_best_of", "TYPE_INT32", **_LLMAPI_SCALAR),
        _scalar("sampling_param_temperature", "TYPE_FP32", **_LLMAPI_SCALAR),
        _scalar("sampling_param_top_k", "TYPE_INT32", **_LLMAPI_SCALAR),
        _scalar("sampling_param_top_p", "TYPE_FP32", **_LLMAPI_SCALAR),
        _scalar("sampling_param_frequency_penalty", "TYPE_FP32", **_LLMAPI_SCALAR),
        _scalar("sampling_param_presence_penalty", "TYPE_FP32", **_LLMAPI_SCALAR),
        _scalar("sampling_param_max_tokens", "TYPE_INT32", **_LLMAPI_SCALAR),
        _t("sampling_param_stop", "TYPE_STRING", [-1]),
        _scalar("sampling_param_seed", "TYPE_UINT64", **_LLMAPI_SCALAR),
        _scalar("sampling_param_exclude_input_from_output", "TYPE_BOOL", **_LLMAPI_SCALAR),
        _scalar("sampling_param_return_perf_metrics", "TYPE_BOOL", **_LLMAPI_SCALAR),
        _scalar("return_finish_reason", "TYPE_BOOL", **_LLMAPI_SCALAR),
        _scalar("return_stop_reason", "TYPE_BOOL", **_LLMAPI_SCALAR),
        _scalar("return_cumulative_logprob", "TYPE_BOOL", **_LLMAPI_SCALAR),
    ),
    outputs=TENSORRT_LLM.outputs + (
        _t("text_output", "TYPE_STRING", [-1]),
        _t("finish_reason", "TYPE_STRING", [-1]),
        _t("stop_reason", "TYPE_STRING", [-1]),
        _t("cumulative_logprob", "TYPE_FP32", [-1]),
        _t("kv_cache_reused_block", "TYPE_INT32", [-1]),
        _t("kv_cache_missed_block", "TYPE_INT32", [-1]),
        _t("kv_cache_hit_rate", "TYPE_FP32", [-1]),
    ),
)

# ----------------------------------------------------------------------------------------------------
# preprocessing (v0.14 / 1.2 tensor names; the seed and minimum-length inputs are ours: the ensemble can
# map only one of its inputs to an engine input, so the v0.14 and 1.2 names meet here and leave as one)
# ----------------------------------------------------------------------------------------------------
PREPROCESSING = ModelContract(
    inputs=(
        # v0.14 marks QUERY required; it is optional here because MESSAGES may replace it. The model
        # checks that exactly one of the two is present.
        _scalar("QUERY", "TYPE_STRING"),
        _scalar("MESSAGES", "TYPE_STRING", extension=True),
        _scalar("DECODER_QUERY", "TYPE_STRING"),
        # Required upstream; optional here so that the ensemble always runs this step (see max_tokens), which then
        # refuses a request without it.
        _scalar("REQUEST_OUTPUT_LEN", "TYPE_INT32"),
        _t("BAD_WORDS_DICT", "TYPE_STRING", [-1]),
        _t("STOP_WORDS_DICT", "TYPE_STRING", [-1]),
        _t("EMBEDDING_BIAS_WORDS", "TYPE_STRING", [-1]),
        _t("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", [-1]),
        _scalar("END_ID", "TYPE_INT32"),
        _scalar("PAD_ID", "TYPE_INT32"),
        _scalar("PROMPT_TABLE_EXTRA_ID", "TYPE_UINT64"),
        _scalar("SEED", "TYPE_UINT64", extension=True),
        _scalar("RANDOM_SEED", "TYPE_UINT64", extension=True),
        _scalar("MIN_TOKENS", "TYPE_INT32", extension=True),
        _scalar("MIN_LENGTH", "TYPE_INT32", extension=True),
        # The adapter: NVIDIA's lora_task_id, or our lora_name looked up in the repository's adapter table (the
        # ensemble can map only one of its inputs to the engine's lora_task_id, so both meet here and leave as one).
        _scalar("LORA_TASK_ID", "TYPE_UINT64", extension=True),
        _scalar("LORA_NAME", "TYPE_STRING", extension=True),
    ),
    outputs=(
        _t("INPUT_ID", "TYPE_INT32", [-1]),
        _scalar("REQUEST_INPUT_LEN", "TYPE_INT32"),
        _t("DECODER_INPUT_ID", "TYPE_INT32", [-1]),
        _scalar("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32"),
        _t("BAD_WORDS_IDS", "TYPE_INT32", [2, -1]),
        _t("STOP_WORDS_IDS", "TYPE_INT32", [2, -1]),
        _t("EMBEDDING_BIAS", "TYPE_FP32", [-1]),
        _t("REQUEST_OUTPUT_LEN", "TYPE_INT32", [-1]),
        _scalar("OUT_END_ID", "TYPE_INT32"),
        _scalar("OUT_PAD_ID", "TYPE_INT32"),
        _t("OUT_PROMPT_TABLE_EXTRA_IDS", "TYPE_UINT64", [-1]),
        _scalar("OUT_SEED", "TYPE_UINT64", extension=True),
        _scalar("OUT_MIN_TOKENS", "TYPE_INT32", extension=True),
        _scalar("OUT_LORA_TASK_ID", "TYPE_UINT64", extension=True),
    ),
)

# The sampling inputs whose name changed between v0.14 and 1.2: text API name -> (preprocessing input,
# the engine input it becomes). A request may send either name, or both with the same value.
RENAMED_INPUTS = {
    "seed": ("SEED", "seed"),
    "random_seed": ("RANDOM_SEED", "seed"),
    "min_tokens": ("MIN_TOKENS", "min_tokens"),
    "min_length": ("MIN_LENGTH", "min_tokens"),
}

# ----------------------------------------------------------------------------------------------------
# postprocessing
# ----------------------------------------------------------------------------------------------------
POSTPROCESSING = ModelContract(
    inputs=(
        _t("TOKENS_BATCH", "TYPE_INT32", [-1, -1], optional=False),
        _t("SEQUENCE_LENGTH", "TYPE_INT32", [-1], optional=False),
        # Exact streamed text (bls.text.postprocessing): the last ids of each sequence before these, then TEXT_END
        # where these end it. The handoff's stream state (HANDOFF_TEXT_STATE); without it each response is decoded
        # alone.
        _t("PRECEDING_IDS", "TYPE_INT32", [-1, -1], extension=True),
    ),
    # One string per sequence, [batch * beam] (1-D, as upstream's postprocessing returns it).
    outputs=(_t("OUTPUT", "TYPE_STRING", [-1]),),
)

# ----------------------------------------------------------------------------------------------------
# ensemble and tensorrt_llm_bls: the text-level API (1.2 names, plus v0.14's random_seed / min_length)
# ----------------------------------------------------------------------------------------------------
_TEXT_API_INPUTS = (
    _scalar("text_input", "TYPE_STRING"),  # upstream: required; optional here because `messages` may replace it
    _scalar("messages", "TYPE_STRING", extension=True),
    _scalar("decoder_text_input", "TYPE_STRING"),
    # Required upstream; optional here, and required by the models themselves (preprocessing's REQUEST_OUTPUT_LEN, the
    # BLS). Triton checks required inputs by count only, so a request with another optional input and no max_tokens
    # got past it; the ensemble then never ran its first step (one of its inputs never came) and, decoupled, answered
    # with no response and no error (core's EnsembleContext::FinishEnsemble; generate: "expects model to produce
    # exactly 1 response", HTTP 200). Optional, a missing max_tokens reaches preprocessing, whose error names it.
    _scalar("max_tokens", "TYPE_INT32"),
    _scalar("num_return_sequences", "TYPE_INT32"),
    _t("bad_words", "TYPE_STRING", [-1]),
    _t("stop_words", "TYPE_STRING", [-1]),
    _scalar("exclude_input_in_output", "TYPE_BOOL"),
    _scalar("end_id", "TYPE_INT32"),
    _scalar("pad_id", "TYPE_INT32"),
    _scalar("top_k", "TYPE_INT32"),
    _scalar("top_p", "TYPE_FP32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("length_penalty", "TYPE_FP32"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("min_tokens", "TYPE_INT32"),
    _scalar("min_length", "TYPE_INT32", extension=True),  # v0.14's name of min_tokens
    _scalar("presence_penalty", "TYPE_FP32"),
    _scalar("frequency_penalty", "TYPE_FP32"),
    _scalar("seed", "TYPE_UINT64"),
    _scalar("random_seed", "TYPE_UINT64", extension=True),  # v0.14's name of seed
    _scalar("return_log_probs", "TYPE_BOOL"),
    _scalar("return_context_logits", "TYPE_BOOL"),
    _scalar("return_generation_logits", "TYPE_BOOL"),
    _scalar("return_perf_metrics", "TYPE_BOOL"),
    _scalar("return_num_input_tokens", "TYPE_BOOL"),
    _scalar("return_num_output_tokens", "TYPE_BOOL"),
    _scalar("beam_width", "TYPE_INT32"),
    _scalar("stream", "TYPE_BOOL"),
    _t("prompt_embedding_table", "TYPE_FP16", [-1, -1]),
    _scalar("prompt_table_extra_id", "TYPE_UINT64"),
    _scalar("prompt_vocab_size", "TYPE_INT32"),
    _t("embedding_bias_words", "TYPE_STRING", [-1]),
    _t("embedding_bias_weights", "TYPE_FP32", [-1]),
    _scalar("lora_task_id", "TYPE_UINT64"),
    _t("lora_weights", "TYPE_FP16", [-1, -1], **_RAGGED),
    _t("lora_config", "TYPE_INT32", [-1, 3], **_RAGGED),
    _scalar("lora_name", "TYPE_STRING", extension=True),  # an adapter of the repository, by name (make repo LORA_DIR)
    _scalar("guided_decoding_guide_type", "TYPE_STRING", **_RAGGED),
    _scalar("guided_decoding_guide", "TYPE_STRING", **_RAGGED),
)

# text_output: one string per sequence, [batch * num_return_sequences] (1-D): NVIDIA's clients read
# `output[0]` as a string.
_TEXT_API_OUTPUTS = (_t("text_output", "TYPE_STRING", [-1]), *_GENERATION_DETAILS)

ENSEMBLE = ModelContract(inputs=_TEXT_API_INPUTS, outputs=_TEXT_API_OUTPUTS)

TENSORRT_LLM_BLS = ModelContract(
    inputs=_TEXT_API_INPUTS
    + (
        _scalar("num_draft_tokens", "TYPE_INT32"),
        _scalar("use_draft_logits", "TYPE_BOOL"),
        # Multimodal inputs of the 1.2 BLS; a Llama 3 text model refuses them by name.
        _t("image_input", "TYPE_FP16", [-1, 3, -1, -1]),
        _t("image_bytes_input", "TYPE_UINT8", [-1, -1, -1, -1]),
        _scalar("image_url_input", "TYPE_STRING"),
        _t("video_bytes_input", "TYPE_UINT8", [-1, -1, -1, -1]),
    ),
    outputs=_TEXT_API_OUTPUTS + (_scalar("finish_reason", "TYPE_STRING", extension=True),),
)

# ----------------------------------------------------------------------------------------------------
# tensorrt_llm_handoff (relay/handoff.h): the engine's tensors, plus its own output, which only a request that asks
# for it gets (the ensemble does): the stream state postprocessing needs for exact streamed text. A stream's responses
# carry it from its first token that is part of a character on (relay/handoff.cc NeedsTextState says why not only
# around split characters); the engine's outputs stay exactly as the engine sent them.
# ----------------------------------------------------------------------------------------------------
# handoff output -> postprocessing input. One tensor, and only where it may be needed (relay/handoff.cc
# NeedsTextState), since every tensor the ensemble carries costs tritonserver CPU at every streamed token; a response
# without it is decoded alone (Triton's ensemble leaves an output a response does not send out of the next step's
# request). [1, beam, n], each row the stream's last ids before this response, followed by TEXT_END when this
# response ends the stream's text (ids are never negative, so the mark is unambiguous; every row of one response is
# the same length). A row of TEXT_END alone: no preceding ids, text complete, i.e. decoded alone.
HANDOFF_TEXT_STATE = {"preceding_ids": "PRECEDING_IDS"}
TEXT_END = -1  # relay/handoff.cc kTextEnd


class TokenTextClass(enum.IntEnum):
    """What one token's bytes are to a UTF-8 stream (bls/text/detokenizer.py token_text_classes). `make repo` writes a
    byte of it per token id to the handoff's TOKEN_TEXT_CLASSES_FILE, from which the handoff tells when a stream's
    text starts to need PRECEDING_IDS: at its first PARTIAL token (relay/handoff.cc NeedsTextState)."""

    WHOLE = 0  # whole characters alone, or no bytes (a special token postprocessing skips): nothing left pending
    PARTIAL = 1  # part of a character (or invalid bytes): may leave bytes pending


# In the handoff's version folder; its length is the vocabulary's (postprocessing's tokenizer).
TOKEN_TEXT_CLASSES_FILE = "token_text_classes.bin"
TENSORRT_LLM_HANDOFF = ModelContract(
    inputs=TENSORRT_LLM.inputs,
    outputs=TENSORRT_LLM.outputs + (_t("preceding_ids", "TYPE_INT32", [-1, -1], extension=True),),
)

CONTRACTS: dict[str, ModelContract] = {
    "tensorrt_llm": TENSORRT_LLM,
    # The llmapi flow's tensorrt_llm, under its template's name (model_repository/tensorrt_llm_llmapi).
    "tensorrt_llm_llmapi": TENSORRT_LLM_LLMAPI,
    HANDOFF_MODEL: TENSORRT_LLM_HANDOFF,
    "preprocessing": PREPROCESSING,
    "postprocessing": POSTPROCESSING,
    "ensemble": ENSEMBLE,
    BLS_MODEL: TENSORRT_LLM_BLS,
}

# ----------------------------------------------------------------------------------------------------
# Wiring between models: the ensemble's steps and the BLS's child requests both come from these maps.
# ----------------------------------------------------------------------------------------------------
# text API input -> preprocessing input
TEXT_TO_PREPROCESSING = {
    "text_input": "QUERY",
    "messages": "MESSAGES",
    "decoder_text_input": "DECODER_QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
    **{text: pre for text, (pre, _) in RENAMED_INPUTS.items()},
    "lora_task_id": "LORA_TASK_ID",
    "lora_name": "LORA_NAME",
}
# preprocessing output -> engine input (Llama is decoder-only: DECODER_INPUT_ID is not passed on)
PREPROCESSING_TO_ENGINE = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "STOP_WORDS_IDS": "stop_words_list",
    "BAD_WORDS_IDS": "bad_words_list",
    "EMBEDDING_BIAS": "embedding_bias",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
    "OUT_PROMPT_TABLE_EXTRA_IDS": "prompt_table_extra_ids",
    "OUT_SEED": "seed",
    "OUT_MIN_TOKENS": "min_tokens",
    "OUT_LORA_TASK_ID": "lora_task_id",
}
# text API input -> engine input, passed through unchanged in value (absent, the engine's parameter decides:
# exclude_input_in_output, as upstream's ensemble maps it)
TEXT_TO_ENGINE = {
    "exclude_input_in_output": "exclude_input_in_output",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "stream": "streaming",
    "prompt_embedding_table": "prompt_embedding_table",
    "prompt_vocab_size": "prompt_vocab_size",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
# engine output -> text API output, passed through
ENGINE_TO_TEXT = {spec.name: spec.name for spec in _GENERATION_DETAILS}


def ensemble_scheduling_pbtxt(engine_model_name: str) -> str:
    """The ensemble's three steps, from the maps above; through the handoff, its stream state goes to postprocessing."""

    def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
        lines = [f'    {{\n      model_name: "{model}"\n      model_version: -1']
        lines += [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
        lines += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
        return "\n".join(lines) + "\n    }"

    internal = {name: f"_{name}" for name in PREPROCESSING_TO_ENGINE}
    engine_inputs = {engine: internal[pre] for pre, engine in PREPROCESSING_TO_ENGINE.items()}
    engine_inputs.update({engine: text for text, engine in TEXT_TO_ENGINE.items()})
    engine_outputs = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH", **ENGINE_TO_TEXT}
    postprocessing_inputs = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
    if engine_model_name == HANDOFF_MODEL:
        engine_outputs.update({out: f"_{post}" for out, post in HANDOFF_TEXT_STATE.items()})
        postprocessing_inputs.update({post: f"_{post}" for post in HANDOFF_TEXT_STATE.values()})
    steps = [
        step("preprocessing", {pre: text for text, pre in TEXT_TO_PREPROCESSING.items()}, internal),
        step(engine_model_name, engine_inputs, engine_outputs),
        step("postprocessing", postprocessing_inputs, {"OUTPUT": "text_output"}),
    ]
    return "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}"
