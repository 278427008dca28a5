"""The `postprocessing` model's logic: output ids -> text (v0.14 contract).

It decodes exactly the ids it is given, up to each beam's sequence length: whether the prompt is part
of the text depends only on what the engine returned (exclude_input_in_output). Streaming text is not
made here by decoding chunks alone (that splits characters); see bls.text.detokenizer.

In the ensemble every engine response is one postprocessing request, almost always one streamed token, and
Triton's dynamic batcher hands a model instance many streams' requests at once: `decode_each` takes them
together (one range check of every id, one token's text looked up once per id and remembered), and a bad
request fails alone.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bls.errors import InvalidRequest
from bls.token_ids import check_token_ids
from bls.text.tokenizer import TokenizerBundle

Tensors = dict[str, np.ndarray]


class Postprocessor:
    """TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH [batch, beam] -> OUTPUT [batch, beam] utf-8 bytes."""

    def __init__(self, bundle: TokenizerBundle, skip_special_tokens: bool = True):
        self.bundle = bundle
        self.skip_special_tokens = skip_special_tokens
        # One token decoded alone, as utf-8 bytes, by id: decoding is a pure function of the ids, so this is
        # exactly what decoding the id again returns (a lone piece of a multi-byte character included: U+FFFD).
        # Bounded by the vocabulary.
        self._token_text: dict[int, bytes] = {}

    def __call__(self, inputs: Tensors) -> Tensors:
        """One request; raises InvalidRequest naming the field."""
        result = self.decode_each([inputs])[0]
        if isinstance(result, InvalidRequest):
            raise result
        return result

    def decode_each(self, requests: Sequence[Tensors]) -> list[Tensors | InvalidRequest]:
        """Each request's OUTPUT, or the InvalidRequest that request alone fails with, in order."""
        results: list[Tensors | InvalidRequest | None] = [None] * len(requests)
        sequences: list[tuple[int, list[np.ndarray]]] = []  # (request index, its sequences batch-major)
        for index, inputs in enumerate(requests):
            try:
                sequences.append((index, self._sequences(inputs)))
            except InvalidRequest as error:
                results[index] = error
        ids = [seq for _, seqs in sequences for seq in seqs]
        if ids and not self._all_in_vocabulary(np.concatenate(ids)):
            valid = []
            for index, seqs in sequences:
                try:
                    for seq in seqs:
                        check_token_ids("TOKENS_BATCH", seq, self.bundle.vocab_size)
                    valid.append((index, seqs))
                except InvalidRequest as error:
                    results[index] = error
            sequences = valid
        for index, seqs in sequences:
            # [batch * beam], 1-D, as upstream's postprocessing returns it (clients read OUTPUT[0] as a string).
            results[index] = {"OUTPUT": np.array([self._text(seq) for seq in seqs], dtype=object)}
        return results  # type: ignore[return-value] - every index was filled above

    def _sequences(self, inputs: Tensors) -> list[np.ndarray]:
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
        return [rows[i, :length] for i, length in enumerate(flat_lengths)]

    def _all_in_vocabulary(self, ids: np.ndarray) -> bool:
        return not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < self.bundle.vocab_size)

    def _text(self, ids: np.ndarray) -> bytes:
        if len(ids) == 1:
            token = int(ids[0])
            text = self._token_text.get(token)
            if text is None:
                text = self._token_text[token] = self.bundle.decode([token], self.skip_special_tokens).encode("utf-8")
            return text
        return self.bundle.decode(ids.tolist(), self.skip_special_tokens).encode("utf-8")
