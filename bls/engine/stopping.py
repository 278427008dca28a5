"""Word lists (stop words, bad words) and the rules that end a generated sequence.

Word lists arrive in TensorRT-LLM's [2, N] format: row 0 holds the token ids of every word
concatenated, row 1 the end offset of each word, padded with -1 (the ids row is padded with anything,
usually 0). `[[0], [-1]]` and `[2, 0]` both mean "no words".

Stopping follows the TensorRT-LLM executor:
- end_id: the sequence ends and the end token is *not* part of the output;
- stop words: the sequence ends and the stop word's tokens *stay* in the output;
- length: request_output_len tokens were generated.
A stop word is matched against the generated tokens only (not the prompt), so a prompt that happens to end
with part of a stop word never stops generation early; this is our choice, TensorRT-LLM looks back into the
prompt too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bls.errors import InvalidRequest

FINISH_END_ID = "end_id"
FINISH_STOP_WORDS = "stop_words"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"


@dataclass(frozen=True)
class WordList:
    """Token sequences, each of length >= 1."""

    words: tuple[tuple[int, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.words)

    @classmethod
    def from_tensor(cls, field: str, tensor: np.ndarray, vocab_size: int) -> "WordList":
        """Parse one request's [2, N] word list, raising InvalidRequest(field, ...) when malformed."""
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
        for word in words:
            for token in word:
                if not 0 <= token < vocab_size:
                    raise InvalidRequest(field, f"token id {token} is outside the vocabulary [0, {vocab_size})")
        return cls(tuple(words))

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


@dataclass(frozen=True)
class StopCriteria:
    end_id: int | None
    stop_words: WordList
    max_new_tokens: int

    def is_end(self, token: int) -> bool:
        return self.end_id is not None and token == self.end_id

    def reason_after_append(self, tokens: Sequence[int], prompt_len: int) -> str | None:
        """Why the sequence (prompt + generated, the newest token just appended) ends now, or None."""
        if self.stop_words and self.stop_words.ends(tokens, start=prompt_len):
            return FINISH_STOP_WORDS
        if len(tokens) - prompt_len >= self.max_new_tokens:
            return FINISH_LENGTH
        return None
