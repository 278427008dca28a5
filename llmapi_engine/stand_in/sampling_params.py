"""The stand-in's SamplingParams and GuidedDecodingParams: TensorRT-LLM 1.2.x's fields, names and defaults.

Upstream: tensorrt_llm/sampling_params.py (1.2.0rc2, NVIDIA/TensorRT-LLM@b35ac1b per docs/llmapi.md's sources; read
here at @000a01de). Both are kw_only dataclasses; `__post_init__` fills pad_id from end_id and best_of from n, and
`_setup(tokenizer)` fills end_id / pad_id from the tokenizer when unset and tokenizes `stop` / `bad` strings (without
special tokens) into the stop / bad word id lists the executor matches. tests/unit/test_llmapi_stand_in.py holds the
field list to the recorded one (tests/unit/upstream_llmapi.py).

What the embedded engine cannot do is refused when the request is made (stand_in/llm.py UNSUPPORTED_SAMPLING), by
the field's name, never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(kw_only=True)
class GuidedDecodingParams:
    json: str | dict | Any | None = None  # a JSON schema (str, dict or pydantic model)
    regex: str | None = None
    grammar: str | None = None  # EBNF
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {guides}.")


@dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    _bad_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    _stop_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    embedding_bias: Any = None  # torch.Tensor [vocab] fp32
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    prompt_ignore_length: int | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list | None = None
    lookahead_config: Any = None
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()

    def _setup(self, tokenizer: Any, add_special_tokens: bool = False) -> SamplingParams:
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id
        if self.bad is not None:
            words = [self.bad] if isinstance(self.bad, str) else self.bad
            self._bad_word_ids = [tokenizer.encode(w, add_special_tokens=add_special_tokens) for w in words]
        if self.stop is not None:
            words = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [tokenizer.encode(w, add_special_tokens=add_special_tokens) for w in words]
        return self

    def _get_bad_words(self) -> list[list[int]]:
        return [[i] for i in self.bad_token_ids or ()] + (self._bad_word_ids or [])

    def _get_stop_words(self) -> list[list[int]]:
        return [[i] for i in self.stop_token_ids or ()] + (self._stop_word_ids or [])

    def _get_stop_reasons_and_words(self) -> list[tuple[int | str, list[int]]]:
        reasons: list[int | str] = list(self.stop_token_ids or ())
        if self.stop is not None:
            reasons += [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return list(zip(reasons, self._get_stop_words(), strict=True))
