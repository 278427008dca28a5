"""Checks and comparisons of token-id sequences, shared by the engine, pre/postprocessing and the BLS."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bls.errors import InvalidRequest


def check_token_ids(field: str, ids: np.ndarray | Sequence[int], vocab_size: int) -> None:
    """InvalidRequest naming `field` and the first id outside [0, vocab_size)."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise InvalidRequest(field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def common_prefix_length(a: np.ndarray | Sequence[int], b: np.ndarray | Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:n] != b[:n])
    return int(mismatches[0]) if mismatches.size else n
