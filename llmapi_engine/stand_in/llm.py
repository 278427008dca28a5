"""The stand-in `LLM`: TensorRT-LLM 1.2.x's LLM API surface over the embedded CPU engine. A STAND-IN: it is not
TensorRT-LLM, it runs where no GPU is (make serve ENGINE=llmapi), and a repository names it (`llm: stand_in`).

Signatures as upstream's (tensorrt_llm/llmapi/llm.py: `LLM.__init__` read at NVIDIA/TensorRT-LLM@0096693,
`generate_async` as at @4c05a74 per docs/llmapi.md's sources); tests/unit/test_llmapi_stand_in.py holds them to
tests/unit/upstream_llmapi.py. Every argument is taken by the name upstream gives it; what the embedded engine cannot
do is refused by name (ValueError, as upstream refuses what it does not take), never ignored:
- `LLM(...)`: keywords outside TorchLlmArgs' fields are refused as upstream refuses them; llm_args.py says which ones
  the stand-in honours.
- `generate_async`: a prompt of token ids (list[int] or {"prompt_token_ids": ...}) or text (tokenized with the
  model's tokenizer, special tokens added, as TextPrompt is); SamplingParams fields outside what the embedded engine
  samples with (UNSUPPORTED_SAMPLING) refused when set.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import tempfile
import threading
import time
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from bls.finish_reason import FinishReason
from bls.word_lists import WordList
from embedded_engine.guided import GrammarCache, Guide
from embedded_engine.lora import LLAMA_MODULES, LoraAdapter, adapter_from_tensors
from embedded_engine.peft_lora import adapter_modules, complete_modules, convert_peft_adapter
from embedded_engine.request import EngineLimits, GenerationRequest
from embedded_engine.sampling import SamplingParams as EngineSampling
from embedded_engine.scheduler import TOKENS_PER_KV_BLOCK, EngineEvent, IterationStats, build_engine, kv_blocks
from embedded_engine.settings import DEFAULT_MAX_ACTIVE_REQUESTS, EngineSettings
from llmapi_engine.stand_in.llm_args import (
    EXTRA_KEYWORDS,
    TORCH_LLM_ARGS,
    LoraConfig,
    NGramDecodingConfig,
    check_supported,
    decoding_config_from_dict,
)
from llmapi_engine.stand_in.outputs import (
    CompletionOutput,
    KvCacheMetrics,
    Logprob,
    RequestOutput,
    RequestPerfMetrics,
    SpeculativeDecodingMetrics,
    TimingMetrics,
)
from llmapi_engine.stand_in.request import LoRARequest
from llmapi_engine.stand_in.sampling_params import GuidedDecodingParams, SamplingParams

# SamplingParams fields the embedded engine does not sample with: set to anything but their default, refused.
UNSUPPORTED_SAMPLING = (
    "logits_processor", "apply_batched_logits_processor", "top_p_min", "top_p_reset_ids",
    "top_p_decay", "prompt_ignore_length", "no_repeat_ngram_size", "min_p", "beam_width_array", "prompt_logprobs",
    "return_encoder_output", "additional_model_outputs", "lookahead_config", "truncate_prompt_tokens",
)
# Beam-search knobs: without beam search they change nothing (TensorRT-LLM ignores them at beam width 1, as the
# embedded engine does), so they are taken.
_FINISH_REASONS = {FinishReason.END_ID: "stop", FinishReason.STOP_WORDS: "stop", FinishReason.LENGTH: "length",
                   FinishReason.CANCELLED: "cancelled"}
# Iteration stats kept for get_stats_async when iter_stats_max_iterations is unset (upstream: 1000, max_stats_len).
DEFAULT_STATS_KEPT = 1000


class LLM:
    """One embedded engine behind TensorRT-LLM's LLM API."""

    def __init__(self, model: str | Path, tokenizer: str | Path | None = None, tokenizer_mode: str = "auto",
                 skip_tokenizer_init: bool = False, trust_remote_code: bool = False, tensor_parallel_size: int = 1,
                 dtype: str = "auto", revision: str | None = None, tokenizer_revision: str | None = None,
                 **kwargs: Any) -> None:
        for key in kwargs:
            if key not in TORCH_LLM_ARGS and key not in EXTRA_KEYWORDS:
                raise ValueError(f"LLM got invalid argument: {key}")
        args = {"tensor_parallel_size": tensor_parallel_size, **kwargs}
        if isinstance(args.get("lora_config"), dict):  # upstream's pydantic field validates a dict into LoraConfig
            try:
                args["lora_config"] = LoraConfig(**args["lora_config"])
            except TypeError as error:
                raise ValueError(f"LLM argument lora_config: {error}") from None
        check_supported(args)
        # Every argument is checked before anything loads, as upstream's TorchLlmArgs validates at construction.
        speculative = args.get("speculative_config")
        if isinstance(speculative, dict):
            speculative = decoding_config_from_dict(speculative)
        if speculative is not None and not isinstance(speculative, NGramDecodingConfig):
            raise ValueError(f"LLM argument speculative_config: {type(speculative).__name__} is not supported by the "
                             "stand-in (NGram only)")
        if skip_tokenizer_init:
            raise ValueError("LLM argument skip_tokenizer_init: the stand-in needs the tokenizer (end_id, stops)")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model))
        kv_cache = args.get("kv_cache_config") or {}
        reuse = kv_cache.get("enable_block_reuse", True) if isinstance(kv_cache, dict) else kv_cache.enable_block_reuse
        self._return_perf_metrics = bool(args.get("return_perf_metrics"))
        self._stats: queue.Queue[dict] | None = None
        if args.get("enable_iter_perf_stats"):
            self._stats = queue.Queue(maxsize=int(args.get("iter_stats_max_iterations") or DEFAULT_STATS_KEPT))
        settings = EngineSettings(
            checkpoint_dir=str(model),
            max_seq_len=args.get("max_seq_len"),
            max_active_requests=int(args.get("max_batch_size") or DEFAULT_MAX_ACTIVE_REQUESTS),
            kv_cache_reuse=bool(reuse),
            ngram=None if speculative is None else speculative.drafting(),
            **_lora_settings(args.get("lora_config")),
        )
        self._engine = build_engine(settings, on_iteration=self._on_iteration if self._stats is not None else None)
        self._workspace = tempfile.TemporaryDirectory(suffix="-llm-workspace")
        self._grammars = None
        if args.get("guided_decoding_backend") == "xgrammar":
            from embedded_engine.xgrammar_info import write_xgrammar_tokenizer_info

            info = write_xgrammar_tokenizer_info(Path(tokenizer or model), Path(self._workspace.name) / "xgrammar.json")
            self._grammars = GrammarCache(info, self._engine.limits.vocab_size)
        self._ids = itertools.count(1)
        self._drafting = speculative is not None
        self._lora_lock = threading.Lock()  # one load of an adapter however many requests name it at once

    @property
    def workspace(self) -> Path:
        return Path(self._workspace.name)

    def generate_async(self, inputs: Any, sampling_params: SamplingParams | None = None, lora_request: Any = None,
                       prompt_adapter_request: Any = None, streaming: bool = False,
                       kv_cache_retention_config: Any = None, disaggregated_params: Any = None,
                       _postproc_params: Any = None, scheduling_params: Any = None,
                       cache_salt: str | None = None) -> RequestOutput:
        for name, value in (("prompt_adapter_request", prompt_adapter_request),
                            ("kv_cache_retention_config", kv_cache_retention_config),
                            ("disaggregated_params", disaggregated_params), ("_postproc_params", _postproc_params),
                            ("scheduling_params", scheduling_params), ("cache_salt", cache_salt)):
            if value is not None:
                raise ValueError(f"generate_async: {name} is not supported by the stand-in")
        params = (sampling_params or SamplingParams())._setup(self.tokenizer)
        prompt = self._prompt_token_ids(inputs, params)
        request_id = next(self._ids)
        request = self._engine_request(request_id, prompt, params, streaming,
                                       None if lora_request is None else self._lora_adapter(lora_request))
        output = RequestOutput(request_id, prompt, streaming, abort=lambda: self._engine.cancel(str(request_id)))
        self._engine.submit(request, _OutputFeed(output, params, request, self._return_perf_metrics, self.tokenizer))
        return output

    def get_stats_async(self, timeout: float = 2) -> _IterationResult:
        """Iteration stats (enable_iter_perf_stats) as upstream's JSON dicts; ends after `timeout` s without any."""
        return _IterationResult(self._stats, timeout)

    def shutdown(self) -> None:
        self._engine.shutdown()
        self._workspace.cleanup()

    # ---- requests ------------------------------------------------------------------------------------------------

    def _prompt_token_ids(self, inputs: Any, params: SamplingParams) -> list[int]:
        if isinstance(inputs, str):
            return self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)
        if isinstance(inputs, dict) and "prompt_token_ids" in inputs:
            inputs = inputs["prompt_token_ids"]
        elif isinstance(inputs, dict) and "prompt" in inputs:
            return self.tokenizer.encode(inputs["prompt"], add_special_tokens=params.add_special_tokens)
        if not isinstance(inputs, list | tuple) or not all(isinstance(t, int | np.integer) for t in inputs):
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        return [int(t) for t in inputs]

    def _lora_adapter(self, lora_request: LoRARequest) -> LoraAdapter:
        """The adapter of a LoRARequest: cached by lora_int_id (as upstream's LoRA manager caches by it), else read
        from lora_path, the Hugging Face PEFT folder, and checked against the model and lora_config."""
        adapters = self._engine.adapters
        if adapters is None:
            raise ValueError("generate_async: lora_request needs the LLM's lora_config (this LLM serves no LoRA)")
        if lora_request.lora_ckpt_source != "hf":
            raise ValueError(f"LoRARequest.lora_ckpt_source={lora_request.lora_ckpt_source!r}: the stand-in reads "
                             "Hugging Face PEFT adapters ('hf') only")
        task_id = int(lora_request.lora_int_id)
        with self._lora_lock:
            if task_id in adapters:
                return adapters.get(task_id)
            converted = convert_peft_adapter(Path(lora_request.lora_path), task_id, adapters.layout)
            adapter = adapter_from_tensors(task_id, converted.weights, converted.config, adapters.layout)
            adapters.put(adapter)
            return adapter

    def _engine_request(self, request_id: int, prompt: list[int], params: SamplingParams,
                        streaming: bool, lora: LoraAdapter | None) -> GenerationRequest:
        defaults = SamplingParams()
        for name in UNSUPPORTED_SAMPLING:
            if getattr(params, name) != getattr(defaults, name):
                raise ValueError(f"SamplingParams.{name} is not supported by the stand-in")
        for name, value, served in (("use_beam_search", params.use_beam_search, False), ("n", params.n, 1),
                                    ("best_of", params.best_of, 1)):
            if value != served:
                raise ValueError(f"SamplingParams.{name}={value}: the stand-in generates one sequence, no beam search")
        if params.logprobs not in (None, 0, 1):
            raise ValueError(f"SamplingParams.logprobs={params.logprobs}: the stand-in returns the chosen token's only")
        if not params.exclude_input_from_output:
            raise ValueError("SamplingParams.exclude_input_from_output=False is not supported by the stand-in")
        limits: EngineLimits = self._engine.limits
        if not prompt:
            raise ValueError("The prompt is empty")
        if params.embedding_bias is not None and len(params.embedding_bias) != limits.vocab_size:
            raise ValueError(f"SamplingParams.embedding_bias has {len(params.embedding_bias)} values, the vocabulary "
                             f"{limits.vocab_size}")
        if max(prompt) >= limits.vocab_size or min(prompt) < 0:
            raise ValueError(f"Token ids must be in [0, {limits.vocab_size})")
        if params.max_tokens <= 0:
            raise ValueError(f"SamplingParams.max_tokens must be > 0, got {params.max_tokens}")
        if len(prompt) + params.max_tokens > limits.max_seq_len:
            raise ValueError(f"The prompt length {len(prompt)} plus max_tokens {params.max_tokens} exceeds max_seq_len "
                             f"{limits.max_seq_len}")
        return GenerationRequest(
            request_id=str(request_id), batch_index=0, batch_size=1, prompt=tuple(prompt),
            max_new_tokens=params.max_tokens,
            sampling=EngineSampling(
                temperature=1.0 if params.temperature is None else params.temperature,
                top_k=params.top_k or 0, top_p=params.top_p or 0.0,
                repetition_penalty=1.0 if params.repetition_penalty is None else params.repetition_penalty,
                presence_penalty=params.presence_penalty or 0.0, frequency_penalty=params.frequency_penalty or 0.0,
                seed=params.seed or 0, min_tokens=params.min_tokens or 0,
                bad_words=WordList(tuple(tuple(w) for w in params._get_bad_words())),
                embedding_bias=None if params.embedding_bias is None else np.asarray(params.embedding_bias, np.float32),
            ),
            # -1: no end token (the executor's "none"; ignore_eos makes the executor's end_id -1, base_worker.py).
            end_id=None if params.ignore_eos or params.end_id == -1 else params.end_id,
            pad_id=params.pad_id,
            # ignore_eos drops the stop words too, as upstream's executor request (base_worker.py) does.
            stop_words=WordList(() if params.ignore_eos else tuple(tuple(w) for w in params._get_stop_words())),
            streaming=streaming,
            exclude_input_in_output=True,
            return_log_probs=bool(params.logprobs),
            return_context_logits=params.return_context_logits,
            return_generation_logits=params.return_generation_logits,
            return_perf_metrics=params.return_perf_metrics or self._return_perf_metrics,
            arrival_ns=time.time_ns(),
            guide=self._guide(params.guided_decoding),
            lora=lora,
        )

    def _guide(self, guided: GuidedDecodingParams | None) -> Any:
        if guided is None or not any(getattr(guided, f.name) for f in fields(guided)):
            return None
        if self._grammars is None:
            raise ValueError("SamplingParams.guided_decoding needs the LLM's guided_decoding_backend (xgrammar)")
        if guided.structural_tag:
            raise ValueError("GuidedDecodingParams.structural_tag is not supported by the stand-in")
        if guided.json_object:
            return self._grammars.compile(Guide("json", None))
        if guided.json is not None:
            schema = guided.json
            if hasattr(schema, "model_json_schema"):
                schema = schema.model_json_schema()
            schema = schema if isinstance(schema, str) else json.dumps(schema)
            return self._grammars.compile(Guide("json_schema", schema))
        if guided.regex is not None:
            return self._grammars.compile(Guide("regex", guided.regex))
        return self._grammars.compile(Guide("ebnf_grammar", guided.grammar))

    def _on_iteration(self, stats: IterationStats) -> None:
        """The engine's iteration stats in upstream's JSON keys (IterationStats' camelCase serialisation, as
        trtllm-serve's /metrics returns them); the oldest is dropped when the queue is full."""
        stat = {
            "iter": stats.iteration,
            "numActiveRequests": stats.active,
            "maxNumActiveRequests": stats.max_active,
            "numQueuedRequests": stats.waiting,
            "cpuMemUsage": 0, "gpuMemUsage": 0, "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": stats.kv_blocks_max, "freeNumBlocks": stats.kv_blocks_max - stats.kv_blocks_used,
                "usedNumBlocks": stats.kv_blocks_used, "tokensPerBlock": TOKENS_PER_KV_BLOCK,
                "reusedBlocks": stats.kv_blocks_reused,
            },
            "inflightBatchingStats": {
                "numScheduledRequests": stats.scheduled, "numContextRequests": stats.context,
                "numGenRequests": stats.scheduled - stats.context, "numPausedRequests": 0,
                "numCtxTokens": stats.context_tokens,
            },
        }
        assert self._stats is not None
        while True:
            try:
                self._stats.put_nowait(stat)
                return
            except queue.Full:
                try:
                    self._stats.get_nowait()
                except queue.Empty:
                    pass


def _lora_settings(lora: LoraConfig | None) -> dict[str, Any]:
    """The embedded engine's LoRA settings from lora_config (none: no LoRA): the modules it applies adapters to
    (lora_target_modules; empty: those lora_dir's adapters target, else every Llama projection: upstream's default
    modules), completed with the partners applied together, and the largest rank."""
    if lora is None:
        return {}
    modules = set(lora.lora_target_modules)
    if not modules:
        for folder in lora.lora_dir:
            modules.update(adapter_modules(Path(folder), only=Path(folder))[0])
    if not modules:
        modules = {module.name for module in LLAMA_MODULES}
    return {"lora_target_modules": complete_modules(modules), "max_lora_rank": lora.max_lora_rank}


class _OutputFeed:
    """The engine's events of one request, as updates of its RequestOutput (applied when its consumer takes them)."""

    def __init__(self, output: RequestOutput, params: SamplingParams, request: GenerationRequest,
                 perf_metrics: bool, tokenizer: Any) -> None:
        self._output = output
        self._tokenizer = tokenizer
        self._params = params
        self._request = request
        self._perf = request.return_perf_metrics or perf_metrics
        self._scheduled_ns = 0
        self._first_token_ns = 0
        self._reused_tokens = 0
        self._drafted = 0
        self._accepted = 0

    def __call__(self, event: EngineEvent) -> None:
        if event.error is not None:
            self._output._publish(None, True, error=event.error)
            return
        if event.scheduled_ns is not None:
            self._scheduled_ns, self._reused_tokens = event.scheduled_ns, event.reused_tokens
        if event.token_ids and not self._first_token_ns:
            self._first_token_ns = event.time_ns
        self._drafted += event.drafted_tokens
        self._accepted += event.accepted_draft_tokens
        perf = self._perf_metrics(event) if self._perf else None
        self._output._publish(lambda output: self._apply(output, event, perf), event.finished)

    def _apply(self, request_output: RequestOutput, event: EngineEvent, perf: RequestPerfMetrics | None) -> None:
        import torch

        output: CompletionOutput = request_output.outputs[0]
        output.token_ids.extend(event.token_ids)
        if self._request.return_log_probs:
            output.logprobs.extend({t: Logprob(p, rank=None)} for t, p in zip(event.token_ids, event.log_probs,
                                                                                 strict=True))
            output.cumulative_logprob = (output.cumulative_logprob or 0.0) + float(sum(event.log_probs))
        if event.context_logits is not None:
            request_output.context_logits = torch.from_numpy(event.context_logits)
        if event.generation_logits is not None:
            rows = torch.from_numpy(event.generation_logits)
            output.generation_logits = rows if output.generation_logits is None else torch.cat(
                [output.generation_logits, rows])
        if perf is not None:
            output.request_perf_metrics = perf
        if event.finished:
            request_output.finished = True
            output.finish_reason = _FINISH_REASONS[event.finish_reason]
            if event.finish_reason == FinishReason.STOP_WORDS:
                self._stop_reason(output)
        if self._params.detokenize:  # `text` is cumulative, as token_ids are
            output.text = self._tokenizer.decode(
                output.token_ids, skip_special_tokens=self._params.skip_special_tokens,
                spaces_between_special_tokens=self._params.spaces_between_special_tokens)

    def _stop_reason(self, output: CompletionOutput) -> None:
        """Which stop word ended it; cut from the output unless include_stop_str_in_output (upstream's
        GenerationResultBase._handle_sequence)."""
        for reason, words in self._params._get_stop_reasons_and_words():
            if output.token_ids[-len(words):] == words:
                output.stop_reason = reason
                if not self._params.include_stop_str_in_output:
                    output.token_ids = output.token_ids[:-len(words)]
                return

    def _perf_metrics(self, event: EngineEvent) -> RequestPerfMetrics:
        request = self._request
        total = kv_blocks(len(request.prompt) + len(self._output.outputs[0].token_ids) + len(event.token_ids))
        reused = self._reused_tokens // TOKENS_PER_KV_BLOCK
        prompt_blocks = kv_blocks(len(request.prompt))

        def since_epoch(ns: int) -> timedelta:
            return timedelta(microseconds=ns / 1000)

        return RequestPerfMetrics(
            kv_cache_metrics=KvCacheMetrics(
                num_total_allocated_blocks=total, num_new_allocated_blocks=total - reused, num_reused_blocks=reused,
                num_missed_blocks=prompt_blocks - reused, kv_cache_hit_rate=reused / prompt_blocks),
            timing_metrics=TimingMetrics(
                arrival_time=since_epoch(request.arrival_ns), first_scheduled_time=since_epoch(self._scheduled_ns),
                first_token_time=since_epoch(self._first_token_ns), last_token_time=since_epoch(event.time_ns)),
            speculative_decoding=SpeculativeDecodingMetrics(
                acceptance_rate=self._accepted / self._drafted if self._drafted else 0.0,
                total_accepted_draft_tokens=self._accepted, total_draft_tokens=self._drafted),
        )


class _IterationResult:
    """get_stats_async's async iterable: the stats kept so far and those that come, until `timeout` s pass without."""

    POLL_S = 0.05

    def __init__(self, stats: queue.Queue[dict] | None, timeout: float) -> None:
        if stats is None:
            raise ValueError("get_stats_async needs the LLM argument enable_iter_perf_stats=True")
        self._stats = stats
        self._timeout = timeout

    def __aiter__(self) -> _IterationResult:
        return self

    async def __anext__(self) -> dict:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                return self._stats.get_nowait()
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise StopAsyncIteration from None
                await asyncio.sleep(self.POLL_S)
