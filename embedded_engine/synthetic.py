"""A model runner that runs no model: for benchmarks of the Python layers around the engine.

The token after position p is `TEXT_CYCLE[p % len(TEXT_CYCLE)]`, a sentence of ordinary Llama 3 tokens, so
tokenizers, streaming and clients see real text. Logits come from a precomputed table (one sharp row per
cycle token), so a forward costs almost nothing and the sampler still does its normal work over the
full Llama 3 vocabulary. The rows returned are views of that table: callers must not write into them.
Selected with the `synthetic` model parameter; never the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# " The quick brown fox jumps over the lazy dog." in the Llama 3 tokenizer.
TEXT_CYCLE = (578, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13)
LLAMA3_VOCAB_SIZE = 128256


@dataclass
class _LengthCache:
    length: int = 0


class SyntheticRunner:
    def __init__(self, vocab_size: int = LLAMA3_VOCAB_SIZE, cycle: Sequence[int] = TEXT_CYCLE, peak: float = 30.0):
        self.vocab_size = vocab_size
        self._cycle_len = len(cycle)
        # The cycle twice over, so any window of up to one cycle is a slice (a view, no copy).
        doubled = torch.as_tensor([*cycle, *cycle])
        self._rows = torch.zeros(len(doubled), vocab_size)
        self._rows[torch.arange(len(doubled)), doubled] = peak

    def new_cache(self) -> _LengthCache:
        return _LengthCache()

    def forward(self, cache: _LengthCache, token_ids: Sequence[int], past_length: int, num_logits: int) -> torch.Tensor:
        cache.length = past_length + len(token_ids)
        first = (cache.length - num_logits) % self._cycle_len
        if num_logits <= self._cycle_len:
            return self._rows[first : first + num_logits]
        positions = torch.arange(cache.length - num_logits, cache.length)
        return self._rows[positions % self._cycle_len]

    def crop(self, cache: _LengthCache, length: int) -> None:
        cache.length = min(cache.length, length)
