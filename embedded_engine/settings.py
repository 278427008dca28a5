"""The embedded engine's settings (the `tensorrt_llm` model parameters that shape it) and their defaults.

Torch-free, so the repository builder can read the defaults without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sequences generated together (TensorRT-LLM's max_batch_size); more wait in the engine's queue.
DEFAULT_MAX_ACTIVE_REQUESTS = 16


@dataclass(frozen=True)
class EngineSettings:
    """The model parameters of `tensorrt_llm` that shape the engine (parsed by model.py)."""

    checkpoint_dir: str | None = None
    synthetic: bool = False
    max_seq_len: int | None = None  # default: the checkpoint's max_position_embeddings
    max_draft_len: int = 0  # like an engine built without draft support: draft_input_ids are rejected
    max_active_requests: int = DEFAULT_MAX_ACTIVE_REQUESTS
    # > 0: each engine iteration (one token for every active sequence) lasts at least this long, as a GPU
    # decoding step does; with `synthetic`, a stand-in for a GPU engine's pace at any concurrency.
    step_ms: float = 0.0
