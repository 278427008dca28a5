"""Asking whether a client is still there, at a bounded cost.

Each answer from Triton is an IPC round trip from the model's stub to the server: too dear to pay for every
token of every stream at GPU rates (the engine would ask for each sequence at each step).
"""

from __future__ import annotations

import time
from typing import Callable

# A cancelled stream stops within this time.
CANCELLATION_CHECK_PERIOD_S = 0.02


class CancellationPoll:
    """`is_cancelled`, asked at most once per period; False between asks (a cancellation is seen at the next)."""

    def __init__(self, is_cancelled: Callable[[], bool], period_s: float = CANCELLATION_CHECK_PERIOD_S):
        self._is_cancelled = is_cancelled
        self._period_s = period_s
        self._next_check = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + self._period_s
        return self._is_cancelled()
