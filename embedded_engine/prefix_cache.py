"""KV-cache reuse across requests (what TensorRT-LLM calls enable_kv_cache_reuse), for the embedded engine.

When a sequence ends, its KV cache is parked here, keyed by the tokens whose keys and values it holds. A
new request whose prompt starts with (part of) a parked sequence takes that cache and prefills only the
rest of its prompt. This is what makes BLS-driven speculative decoding cheap: every round sends the whole
sequence again, and the previous round's cache already holds all of it but the newest tokens.

A parked cache is taken out while a request uses it (a cache is extended in place, so it can serve only one
sequence), and comes back, longer, when that sequence ends. An entry is taken only when the request reuses
at least half of it: a request that merely shares a short head (a system prompt) with a long parked sequence
would otherwise crop away the cache that the continuation of that sequence (its next speculative round) needs.
The store is bounded in entries and in tokens, evicting the least recently parked. It is used from the engine
thread only, so it takes no lock. Keys and values depend on the weights that computed them: a sequence run with a
LoRA adapter parks its cache under that adapter (`adapter`, the LoraAdapter's serial), and only a request with the
same adapter takes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bls.token_ids import common_prefix_length


@dataclass(frozen=True)
class PrefixCacheLimits:
    max_entries: int = 32
    max_tokens: int = 16384  # sum of the entries' lengths; ~1 GiB of fp32 KV for a Llama 3.2 1B


@dataclass
class _Entry:
    tokens: np.ndarray  # int64, the tokens whose KV `cache` holds, from position 0
    cache: Any
    adapter: int | None  # the serial of the LoRA adapter the cache was computed with (None: the base model)


@dataclass
class CacheHit:
    cache: Any  # holds at least `length` positions; the caller crops it to `length`
    length: int  # leading prompt tokens whose KV can be reused


class PrefixCache:
    def __init__(self, limits: PrefixCacheLimits = PrefixCacheLimits()):
        self.limits = limits
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently parked first
        self._next_key = 0
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def take(self, prompt: Sequence[int], adapter: int | None = None) -> CacheHit | None:
        """Remove and return the entry sharing the longest prefix with `prompt` (if that is at least half of
        the entry). The reusable length leaves the last prompt token out: it must be fed to get the logits of
        the first new token."""
        if not self._entries or len(prompt) < 2:
            return None
        wanted = np.asarray(prompt, dtype=np.int64)[:-1]
        best_key, best_length = None, 0
        for key, entry in reversed(self._entries.items()):  # most recent first: it wins ties
            if entry.adapter != adapter:
                continue
            length = common_prefix_length(entry.tokens, wanted)
            if length > best_length and 2 * length >= len(entry.tokens):
                best_key, best_length = key, length
        if best_key is None:
            return None
        entry = self._entries.pop(best_key)
        self._tokens -= len(entry.tokens)
        return CacheHit(entry.cache, best_length)

    def put(self, tokens: Sequence[int], cache: Any, adapter: int | None = None) -> None:
        """Park `cache`, which holds the KV of exactly `tokens` (from position 0), evicting as needed."""
        if not tokens or len(tokens) > self.limits.max_tokens or self.limits.max_entries == 0:
            return
        self._entries[self._next_key] = _Entry(np.asarray(tokens, dtype=np.int64), cache, adapter)
        self._next_key += 1
        self._tokens += len(tokens)
        while len(self._entries) > self.limits.max_entries or self._tokens > self.limits.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self._tokens -= len(evicted.tokens)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
