"""The `postprocessing` model's logic: output ids -> text (v0.14 contract).

It decodes exactly the ids it is given, up to each beam's sequence length: whether the prompt is part
of the text depends only on what the engine returned (exclude_input_in_output). Streaming text is not
made here by decoding chunks alone (that splits characters); see bls.text.detokenizer.
"""

from __future__ import annotations

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

    def __call__(self, inputs: Tensors) -> Tensors:
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
        if lengths.size and (lengths.min() < 0 or lengths.max() > tokens.shape[2]):
            raise InvalidRequest("SEQUENCE_LENGTH", f"values must be within [0, {tokens.shape[2]}]")

        sequences = [tokens[b, k, : lengths[b, k]] for b in range(tokens.shape[0]) for k in range(tokens.shape[1])]
        for ids in sequences:
            check_token_ids("TOKENS_BATCH", ids, self.bundle.vocab_size)
        texts = self.bundle.decode_batch([ids.tolist() for ids in sequences], self.skip_special_tokens)

        # [batch * beam], 1-D, as upstream's postprocessing returns it (clients read OUTPUT[0] as a string).
        return {"OUTPUT": np.array([text.encode("utf-8") for text in texts], dtype=object)}
