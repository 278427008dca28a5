"""The `postprocessing` model's logic: output ids -> text (v0.14 contract).

It decodes exactly the ids it is given, up to each beam's sequence length: whether the prompt is part
of the text depends only on what the engine returned (exclude_input_in_output).

Streamed text: NVIDIA's postprocessing decodes each response's ids alone, which splits a character whose bytes
span two responses into U+FFFD pieces. Our optional input makes it exact without any state here (instances are
shared by every stream): PRECEDING_IDS, the last ids of the same sequence before these, followed by TEXT_END (-1)
where these ids end it (bls/contract.py HANDOFF_TEXT_STATE); the text is then
bls.text.detokenizer.continuation_text, whose pieces join into exactly the text of the whole sequence. The
ensemble's handoff (relay/handoff.h) sends it with a stream's responses from its first split character on; every
other response (a stream of whole characters so far: nothing pending), and every request of NVIDIA's
clients and the BLS, comes without it and is decoded alone.

In the ensemble every engine response is one postprocessing request, almost always one streamed token, and
Triton's dynamic batcher hands a model instance many streams' requests at once: `decode_each` takes them
together (one range check of every id, one token's text looked up once per id and remembered), and a bad
request fails alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bls.contract import TEXT_END
from bls.errors import InvalidRequest
from bls.text.detokenizer import continuation_text
from bls.text.tokenizer import TokenizerBundle
from bls.token_ids import check_token_ids

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class _Sequence:
    ids: np.ndarray
    preceding: np.ndarray | None  # None: decoded alone
    complete: bool  # no ids follow: an incomplete character at the end is U+FFFD, not held


class Postprocessor:
    """TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH [batch, beam] (+ PRECEDING_IDS [batch, beam, n], ours)
    -> OUTPUT [batch * beam] utf-8 bytes."""

    def __init__(self, bundle: TokenizerBundle, skip_special_tokens: bool = True):
        self.bundle = bundle
        self.skip_special_tokens = skip_special_tokens
        # One token decoded alone, as utf-8 bytes, by id: decoding is a pure function of the ids, so this is
        # exactly what decoding the id again returns (a lone piece of a multi-byte character included: U+FFFD).
        # Bounded by the vocabulary.
        self._token_text: dict[int, bytes] = {}
        # A token whose bytes alone are whole UTF-8 (they start a character and end one): its text, else None.
        # Bounded by the vocabulary.
        self._whole_text: dict[int, bytes | None] = {}

    def __call__(self, inputs: Tensors) -> Tensors:
        """One request; raises InvalidRequest naming the field."""
        result = self.decode_each([inputs])[0]
        if isinstance(result, InvalidRequest):
            raise result
        return result

    def decode_each(self, requests: Sequence[Tensors]) -> list[Tensors | InvalidRequest]:
        """Each request's OUTPUT, or the InvalidRequest that request alone fails with, in order."""
        results: list[Tensors | InvalidRequest | None] = [None] * len(requests)
        sequences: list[tuple[int, list[_Sequence]]] = []  # (request index, its sequences batch-major)
        for index, inputs in enumerate(requests):
            try:
                sequences.append((index, self._sequences(inputs)))
            except InvalidRequest as error:
                results[index] = error
        ids = [part for _, seqs in sequences for seq in seqs for part in (seq.ids, seq.preceding) if part is not None]
        if ids and not self._all_in_vocabulary(np.concatenate(ids)):
            valid = []
            for index, seqs in sequences:
                try:
                    for seq in seqs:
                        check_token_ids("TOKENS_BATCH", seq.ids, self.bundle.vocab_size)
                        if seq.preceding is not None:
                            check_token_ids("PRECEDING_IDS", seq.preceding, self.bundle.vocab_size)
                    valid.append((index, seqs))
                except InvalidRequest as error:
                    results[index] = error
            sequences = valid
        for index, seqs in sequences:
            # [batch * beam], 1-D, as upstream's postprocessing returns it (clients read OUTPUT[0] as a string).
            results[index] = {"OUTPUT": np.array([self._sequence_text(seq) for seq in seqs], dtype=object)}
        return results  # type: ignore[return-value] - every index was filled above

    def _sequences(self, inputs: Tensors) -> list[_Sequence]:
        for name in ("TOKENS_BATCH", "SEQUENCE_LENGTH"):
            if name not in inputs:
                raise InvalidRequest(name, "is required")
        tokens = np.asarray(inputs["TOKENS_BATCH"])
        lengths = np.asarray(inputs["SEQUENCE_LENGTH"])
        if tokens.ndim != 3:
            raise InvalidRequest("TOKENS_BATCH", f"must be [batch, beam, len], got shape {list(tokens.shape)}")
        if lengths.shape != tokens.shape[:2]:
            raise InvalidRequest(
                "SEQUENCE_LENGTH", f"shape {list(lengths.shape)} does not match TOKENS_BATCH {list(tokens.shape[:2])}"
            )
        flat_lengths = lengths.reshape(-1).tolist()
        if flat_lengths and (min(flat_lengths) < 0 or max(flat_lengths) > tokens.shape[2]):
            raise InvalidRequest("SEQUENCE_LENGTH", f"values must be within [0, {tokens.shape[2]}]")
        rows = tokens.reshape(tokens.shape[0] * tokens.shape[1], tokens.shape[2])  # -1 cannot size an empty batch
        states = self._stream_state(inputs, tokens.shape)
        return [_Sequence(rows[i, :length], *states[i]) for i, length in enumerate(flat_lengths)]

    def _stream_state(self, inputs: Tensors, shape: tuple[int, ...]) -> list[tuple[np.ndarray | None, bool]]:
        """Each sequence's preceding ids (None: decode alone) and whether its text is complete, batch-major: a row of
        PRECEDING_IDS is the ids, then TEXT_END if complete (a -1 anywhere else is refused as outside the vocabulary).
        """
        batch, beams = shape[0], shape[1]
        alone = [(None, True)] * (batch * beams)
        if "PRECEDING_IDS" not in inputs:  # NVIDIA's contract
            return alone
        preceding = np.asarray(inputs["PRECEDING_IDS"])
        if preceding.ndim != 3 or preceding.shape[:2] != (batch, beams):
            raise InvalidRequest("PRECEDING_IDS", f"shape {list(preceding.shape)} does not match TOKENS_BATCH "
                                 f"{[batch, beams]} (must be [batch, beam, n])")
        return [(row[:-1], True) if row.size and row[-1] == TEXT_END else (row, False)
                for row in preceding.reshape(batch * beams, preceding.shape[2])]

    def _all_in_vocabulary(self, ids: np.ndarray) -> bool:
        return not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < self.bundle.vocab_size)

    def _sequence_text(self, seq: _Sequence) -> bytes:
        if seq.preceding is None:
            return self._text(seq.ids)
        if len(seq.ids) == 1 and (text := self._whole(int(seq.ids[0]))) is not None and (
                not len(seq.preceding) or self._whole(int(seq.preceding[-1])) is not None):
            # The common streamed token of a stream that carries the state (it has met a split character): nothing
            # held before it (the previous token ended a character) and nothing held after (it is whole):
            # continuation_text would return its own text; a cached lookup instead.
            return text
        return continuation_text(self.bundle, seq.preceding.tolist(), seq.ids.tolist(), seq.complete,
                                 self.skip_special_tokens).encode("utf-8")

    def _whole(self, token: int) -> bytes | None:
        """The token's text if its bytes alone are whole UTF-8 (continuation_text then holds nothing around it)."""
        if token in self._whole_text:
            return self._whole_text[token]
        data = self.bundle.token_bytes([token], self.skip_special_tokens)
        try:
            text = data.decode("utf-8").encode("utf-8") if data else None  # a skipped token (b""): look further back
        except UnicodeDecodeError:
            text = None
        self._whole_text[token] = text
        return text

    def _text(self, ids: np.ndarray) -> bytes:
        if len(ids) == 1:
            token = int(ids[0])
            text = self._token_text.get(token)
            if text is None:
                text = self._token_text[token] = self.bundle.decode([token], self.skip_special_tokens).encode("utf-8")
            return text
        return self.bundle.decode(ids.tolist(), self.skip_special_tokens).encode("utf-8")
