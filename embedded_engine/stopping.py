"""The rules that end a generated sequence (word lists themselves: bls.word_lists).

Stopping follows the TensorRT-LLM executor:
- end_id: the sequence ends and the end token is *not* part of the output;
- stop words: the sequence ends and the stop word's tokens *stay* in the output;
- length: request_output_len tokens were generated.
A stop word is matched against the generated tokens only (not the prompt), so a prompt that happens to end
with part of a stop word never stops generation early; this is our choice, TensorRT-LLM looks back into the
prompt too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bls.finish_reason import FinishReason
from bls.word_lists import WordList


@dataclass(frozen=True)
class StopCriteria:
    end_id: int | None
    stop_words: WordList
    max_new_tokens: int

    def is_end(self, token: int) -> bool:
        return self.end_id is not None and token == self.end_id

    def reason_after_append(self, tokens: Sequence[int], prompt_len: int) -> FinishReason | None:
        """Why the sequence (prompt + generated, the newest token just appended) ends now, or None."""
        if self.stop_words and self.stop_words.ends(tokens, start=prompt_len):
            return FinishReason.STOP_WORDS
        if len(tokens) - prompt_len >= self.max_new_tokens:
            return FinishReason.LENGTH
        return None
