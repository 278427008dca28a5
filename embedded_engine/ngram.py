"""N-gram drafting (prompt lookup): draft tokens proposed from the sequence itself, no draft model.

TensorRT-LLM 1.2.x's PyTorch flow configures it as `speculative_config: {decoding_type: NGram, max_draft_len,
max_matching_ngram_size, is_keep_all, is_use_oldest, is_public_pool}` (tensorrt_llm/llmapi/llm_args.py,
NGramDecodingConfig; docs/llmapi.md's sources); both sizes must be > 0.

Each decode step the engine looks for the sequence's last n tokens (n = max_matching_ngram_size down to 1) earlier in
the sequence (prompt and output) and proposes the up to max_draft_len tokens that followed that occurrence. The
target verifies them in the same forward pass as its own next token (embedded_engine.draft_verification), so the
output is exactly what the target alone produces for greedy requests; drafting only changes how many forward passes
it takes. Input-grounded generation (summaries, code edits, quoting) repeats spans of the prompt and gains most.

Where it differs from TensorRT-LLM's NGramDrafter: the pool of n-grams is each sequence's own (is_public_pool, sharing
n-grams between requests, and is_keep_all have no effect here); is_use_oldest picks the earliest match (true, the
default) or the latest one. Neither changes the output, only how many drafts are accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NGramDrafting:
    max_draft_len: int
    max_matching_ngram_size: int
    is_use_oldest: bool = True

    def __post_init__(self) -> None:
        if self.max_draft_len <= 0:
            raise ValueError(f"NGram max_draft_len must be > 0, got {self.max_draft_len}")
        if self.max_matching_ngram_size <= 0:
            raise ValueError(f"NGram max_matching_ngram_size must be > 0, got {self.max_matching_ngram_size}")

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to min(max_draft_len, limit) tokens that followed an earlier occurrence of the sequence's longest
        matching suffix; [] when none matches."""
        limit = min(limit, self.max_draft_len)
        if limit <= 0:
            return []
        ids = np.asarray(tokens, dtype=np.int64)
        length = len(ids)
        for size in range(min(self.max_matching_ngram_size, length - 1), 0, -1):
            # Windows that start before the suffix itself, so at least one token follows each.
            windows = np.lib.stride_tricks.sliding_window_view(ids[:length - 1], size)
            matches = np.flatnonzero((windows == ids[length - size:]).all(axis=1))
            if matches.size:
                follow = int(matches[0] if self.is_use_oldest else matches[-1]) + size
                return ids[follow:min(follow + limit, length)].tolist()
        return []
