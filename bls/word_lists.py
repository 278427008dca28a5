"""Stop and bad words in TensorRT-LLM's `[2, N]` word-list format: encode, stack, parse, match.

Row 0 holds the token ids of every word back to back, row 1 each word's end offset, padded with -1 (the
ids row is padded with 0). `[[0], [-1]]` and `[2, 0]` both mean "no words". A batch is `[batch, 2, N]`,
each row padded to the widest. This module is the only place that knows the format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bls.errors import InvalidRequest
from bls.token_ids import check_token_ids


def encode_word_list(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """Token sequences (each non-empty) as one request's [2, N] int32 word list."""
    flat = [token for sequence in sequences for token in sequence]
    result = np.zeros((2, max(1, len(flat))), np.int32)
    result[1, :] = -1
    result[0, : len(flat)] = flat
    result[1, : len(sequences)] = np.cumsum([len(sequence) for sequence in sequences], dtype=np.int64)
    return result


def stack_word_lists(word_lists: Sequence[np.ndarray]) -> np.ndarray:
    """Per-request [2, N] word lists as one [batch, 2, maxN] int32 array (ids padded 0, offsets -1)."""
    width = max(words.shape[1] for words in word_lists)
    stacked = np.zeros((len(word_lists), 2, width), np.int32)
    stacked[:, 1, :] = -1
    for index, words in enumerate(word_lists):
        stacked[index, :, : words.shape[1]] = words
    return stacked


@dataclass(frozen=True)
class WordList:
    """Token sequences, each of length >= 1."""

    words: tuple[tuple[int, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.words)

    @classmethod
    def from_tensor(cls, field: str, tensor: np.ndarray | None, vocab_size: int | None = None) -> WordList:
        """Parse one request's word list ([2, N], or [1, 2, N]), raising InvalidRequest(field, ...) when
        malformed; ids are range-checked when `vocab_size` is given."""
        if tensor is None or tensor.size == 0:
            return cls()
        if tensor.ndim == 3 and tensor.shape[0] == 1:
            tensor = tensor[0]
        if tensor.ndim != 2 or tensor.shape[0] != 2:
            raise InvalidRequest(field, f"must have shape [2, N] per batch item, got {list(tensor.shape)}")
        ids, offsets = tensor[0].astype(np.int64), tensor[1].astype(np.int64)
        words: list[tuple[int, ...]] = []
        start = 0
        for offset in offsets.tolist():
            if offset < 0:  # padding: the offsets row is padded with -1 after the last word
                break
            if offset <= start:
                raise InvalidRequest(field, f"word end offsets must be strictly increasing, got {offsets.tolist()}")
            if offset > len(ids):
                raise InvalidRequest(field, f"word end offset {offset} is beyond the {len(ids)} ids of the list")
            words.append(tuple(ids[start:offset].tolist()))
            start = offset
        if vocab_size is not None:
            check_token_ids(field, ids[:start], vocab_size)
        return cls(tuple(words))

    @property
    def longest(self) -> int:
        return max((len(word) for word in self.words), default=0)

    def ends(self, tokens: Sequence[int], start: int = 0) -> bool:
        """True when `tokens[start:]` ends with one of the words."""
        available = len(tokens) - start
        for word in self.words:
            n = len(word)
            if n <= available and tuple(tokens[len(tokens) - n :]) == word:
                return True
        return False

    def completing_tokens(self, tokens: Sequence[int]) -> set[int]:
        """The tokens that, appended to `tokens`, would complete a word: a word's last token, when the
        word's other tokens are the current tail (always, for single-token words)."""
        completing = set()
        for word in self.words:
            prefix = word[:-1]
            if not prefix or (len(prefix) <= len(tokens) and tuple(tokens[len(tokens) - len(prefix) :]) == prefix):
                completing.add(word[-1])
        return completing

    def truncate_after_first(self, previous: Sequence[int], new: list[int]) -> tuple[list[int], bool]:
        """Cut `new` right after the first word that ends inside it (a word may start in `previous`)."""
        if not self.words:
            return new, False
        window = list(previous[len(previous) - (self.longest - 1):]) if self.longest > 1 else []
        tokens = window + new
        for end in range(len(window) + 1, len(tokens) + 1):
            if self.ends(tokens[:end]):
                return new[: end - len(window)], True
        return new, False
