"""The `LLM()` arguments the stand-in takes: exactly TensorRT-LLM 1.2.x's TorchLlmArgs fields, and what it does.

Upstream: `BaseLLM.__init__` refuses any keyword that is not a TorchLlmArgs field (or `_mpi_session` / `backend`) with
`ValueError("LLM got invalid argument: <key>")`, and nested configs are strict (pydantic extra="forbid")
(tensorrt_llm/llmapi/llm.py, llm_args.py; docs/llmapi.md's sources). TORCH_LLM_ARGS is the field list of both
1.2-era llm_args.py read (A ∩ B in /work/shared/reference/llmapi-1.2.md); tests/unit/test_llmapi_stand_in.py holds it to
the recorded one (engine_build/upstream_llm_args.py, which check-repo checks model.yaml against).

The stand-in honours what has a meaning on one CPU process (HONOURED); the rest configure a GPU (CUDA graphs, memory
fractions, kernels, parallelism of 1) and have no effect here, which GPU_ONLY names; a value that would change what a
request gets and that the embedded engine cannot do is refused by name (check_supported).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from embedded_engine.ngram import NGramDrafting

TORCH_LLM_ARGS = frozenset({
    # BaseLlmArgs
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code", "tensor_parallel_size",
    "pipeline_parallel_size", "context_parallel_size", "dtype", "revision", "tokenizer_revision", "gpus_per_node",
    "moe_cluster_parallel_size", "moe_tensor_parallel_size", "moe_expert_parallel_size", "enable_attention_dp",
    "enable_lm_head_tp_in_adp", "cp_config", "load_format", "fail_fast_on_attention_window_too_large", "enable_lora",
    "lora_config", "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend", "batched_logits_processor",
    "iter_stats_max_iterations", "request_stats_max_iterations", "peft_cache_config", "scheduler_config",
    "cache_transceiver_config", "sparse_attention_config", "speculative_config", "max_batch_size", "max_input_len",
    "max_seq_len", "max_beam_width", "max_num_tokens", "gather_generation_logits", "num_postprocess_workers",
    "postprocess_tokenizer_dir", "reasoning_parser", "decoding_config", "backend", "return_perf_metrics",
    "orchestrator_type", "perf_metrics_max_requests",
    # TorchLlmArgs
    "garbage_collection_gen0_threshold", "cuda_graph_config", "attention_dp_config", "disable_overlap_scheduler",
    "moe_config", "attn_backend", "sampler_type", "enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log",
    "batch_wait_timeout_ms", "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio", "torch_compile_config",
    "enable_autotuner", "enable_layerwise_nvtx_marker", "enable_min_latency", "stream_interval",
    "force_dynamic_quantization", "allreduce_strategy", "checkpoint_loader", "checkpoint_format", "kv_connector_config",
    "mm_encoder_only",
})
# The MPI session field (mpi_session, alias `_mpi_session`: what NVIDIA's model passes for a multi-rank world), taken
# beside the fields a model.yaml may hold; `backend` is one of those (popped by _TorchLLM before the check).
EXTRA_KEYWORDS = frozenset({"mpi_session", "_mpi_session"})

HONOURED = frozenset({
    "model", "tokenizer", "max_batch_size", "max_seq_len", "kv_cache_config", "speculative_config",
    "guided_decoding_backend", "enable_iter_perf_stats", "iter_stats_max_iterations", "return_perf_metrics",
    "stream_interval", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_beam_width", "lora_config",
})
GPU_ONLY = TORCH_LLM_ARGS - HONOURED


@dataclass(kw_only=True)
class NGramDecodingConfig:
    """speculative_config `decoding_type: NGram` (llm_args.py NGramDecodingConfig; base fields the stand-in takes)."""

    max_draft_len: int | None = None
    max_matching_ngram_size: int = 0
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True
    decoding_type: str = "NGram"

    def drafting(self) -> NGramDrafting:
        return NGramDrafting(self.max_draft_len or 0, self.max_matching_ngram_size, self.is_use_oldest)


def decoding_config_from_dict(config: dict[str, Any]) -> NGramDecodingConfig:
    """`DecodingBaseConfig.from_dict`: by `decoding_type`; the stand-in has the draft-model-free NGram only."""
    config = dict(config)
    decoding_type = config.pop("decoding_type", None)
    if decoding_type != "NGram":
        raise ValueError(f"speculative_config: decoding_type {decoding_type!r} is not supported by the stand-in "
                         "(the embedded engine drafts by n-grams only: decoding_type NGram)")
    known = {f.name for f in fields(NGramDecodingConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"speculative_config: unknown NGram field(s) {unknown}")
    return NGramDecodingConfig(**config)


@dataclass
class LoraConfig:
    """`lora_config` (tensorrt_llm/lora_helper.py@037d4ba LoraConfig, a dataclass: llmapi-1.2.md section 1.1), with
    upstream's fields and defaults. The stand-in honours lora_target_modules (the modules its engine applies LoRA to;
    empty: those lora_dir's adapters target, or every Llama projection without lora_dir, as upstream's default
    modules) and max_lora_rank; it takes adapters from each request's LoRARequest.lora_path, as the PyTorch flow
    does. max_loras / max_cpu_loras size GPU and host adapter caches: the stand-in's cache is the embedded engine's
    (embedded_engine.lora.LoraCache, bounded in bytes). lora_ckpt_source 'nemo' and a custom
    trtllm_modules_to_hf_modules are refused (check_supported): it reads Hugging Face PEFT folders, Llama's names."""

    lora_dir: list[str] = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = field(default_factory=list)
    trtllm_modules_to_hf_modules: dict[str, str] = field(default_factory=dict)
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    swap_gate_up_proj: bool = True


def update_llm_args_with_extra_dict(llm_args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """tensorrt_llm.llmapi.llm_utils.update_llm_args_with_extra_dict for the stand-in's nested configs: the
    speculative_config dict becomes its config object (upstream: DecodingBaseConfig.from_dict), lora_config's
    `LoraConfig(**d)` (as upstream's field_mapping); the result is `llm_args | extra` (shallow), as upstream's."""
    extra = dict(extra)
    if isinstance(extra.get("speculative_config"), dict):
        extra["speculative_config"] = decoding_config_from_dict(extra["speculative_config"])
    if isinstance(extra.get("lora_config"), dict):
        extra["lora_config"] = LoraConfig(**extra["lora_config"])
    return llm_args | extra


def check_supported(args: dict[str, Any]) -> None:
    """Values the embedded engine cannot serve as asked, refused by the argument's name."""
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if int(args.get(name) or 1) != 1:
            raise ValueError(f"LLM argument {name}={args[name]}: the stand-in runs on one CPU process (1 only)")
    if int(args.get("max_beam_width") or 1) != 1:
        raise ValueError(f"LLM argument max_beam_width={args['max_beam_width']}: the stand-in has no beam search")
    if args.get("backend") not in (None, "pytorch"):
        raise ValueError(f"LLM argument backend={args['backend']!r}: the stand-in stands in for the PyTorch backend")
    lora = args.get("lora_config")
    if lora is None and args.get("enable_lora"):
        raise ValueError("LLM argument enable_lora: the stand-in takes LoRA from lora_config (its target modules and "
                         "max_lora_rank)")
    if lora is not None:
        if not isinstance(lora, LoraConfig):
            raise ValueError(f"LLM argument lora_config: a LoraConfig or its dict, got {type(lora).__name__}")
        if lora.lora_ckpt_source != "hf":
            raise ValueError(f"LLM argument lora_config.lora_ckpt_source={lora.lora_ckpt_source!r}: the stand-in "
                             "reads Hugging Face PEFT adapters ('hf') only")
        if lora.trtllm_modules_to_hf_modules:
            raise ValueError("LLM argument lora_config.trtllm_modules_to_hf_modules: the stand-in maps Llama's "
                             "projections by upstream's default names only (leave it empty)")
    backend = args.get("guided_decoding_backend")
    if backend not in (None, "xgrammar"):
        raise ValueError(f"LLM argument guided_decoding_backend={backend!r}: the stand-in compiles with xgrammar")
    if int(args.get("stream_interval") or 1) != 1:
        raise ValueError(f"LLM argument stream_interval={args['stream_interval']}: the stand-in streams every step")
