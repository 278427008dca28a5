"""The embedded engine's settings (the `tensorrt_llm` model parameters that shape it) and their defaults.

Torch-free, so the repository builder can read the defaults without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedded_engine.ngram import NGramDrafting

# Sequences generated together (TensorRT-LLM's max_batch_size); more wait in the engine's queue.
DEFAULT_MAX_ACTIVE_REQUESTS = 16
# Sequences that may wait for a slot; one more is refused at once with UNAVAILABLE (HTTP 503), so overload
# is an answer the client can act on, not a queue that grows until clients time out.
DEFAULT_MAX_QUEUED_REQUESTS = 64


@dataclass(frozen=True)
class EngineSettings:
    """The model parameters of `tensorrt_llm` that shape the engine (parsed by model.py)."""

    checkpoint_dir: str | None = None
    synthetic: bool = False
    max_seq_len: int | None = None  # default: the checkpoint's max_position_embeddings
    max_draft_len: int = 0  # like an engine built without draft support: draft_input_ids are rejected
    max_active_requests: int = DEFAULT_MAX_ACTIVE_REQUESTS
    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS
    # > 0: each engine iteration (one token for every active sequence) lasts at least this long, as a GPU
    # decoding step does; with `synthetic`, a stand-in for a GPU engine's pace at any concurrency.
    step_ms: float = 0.0
    # LoRA, as a TensorRT-LLM engine is built for it (--lora_target_modules, --max_lora_rank) and its backend caches
    # adapters (lora_cache_host_memory_bytes, lora_prefetch_dir): no target modules, no LoRA (requests that carry
    # LoRA inputs are refused by name, as an engine built without the LoRA plugin refuses them).
    lora_target_modules: tuple[str, ...] = ()
    max_lora_rank: int = 64
    lora_cache_host_memory_bytes: int = 1 << 30
    lora_prefetch_dir: str | None = None
    # KV-cache reuse across requests (embedded_engine.prefix_cache), as TensorRT-LLM's enable_block_reuse.
    kv_cache_reuse: bool = True
    # NGram speculative decoding (embedded_engine.ngram): drafts from the sequence itself at every decode step.
    ngram: NGramDrafting | None = None
