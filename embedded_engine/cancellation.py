"""The embedded engine's way of seeing Triton's request cancellation: asking whether a client is still there, at a
bounded cost (as the tensorrtllm backend polls TRITONBACKEND_ResponseFactoryIsCancelled every
cancellation_check_period_ms).

Each answer from Triton is an IPC round trip from the model's stub to the server (tens of µs of CPU): too dear
to pay for every token of every stream at GPU rates. Asking every stream once per period is not enough either:
the cost then grows with the number of streams, not with the work (at 256 streams each getting a token every
20-40 ms, one ask per period is one ask per token). So the asks of a process share a rate: each open poll is
asked at most once per max(MIN_PERIOD_S, open polls / MAX_CHECKS_PER_S), and a cancelled stream stops within
that time (100 ms up to 50 streams per process, 128 ms at 64).

MIN_PERIOD_S is the tensorrtllm backend's default cancellation_check_period_ms (100). It was 20 ms: with a stream
getting a token every 20-40 ms (a GPU's pace), that was an ask after nearly every send, a second round trip per
token (16 streams paced at 40 ms on 2 cores: the engine stand-in's CPU a token 144-156 µs at 20 ms, 134-138 µs at
100 ms; docs/benchmarks.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# The shortest time between two asks for one stream.
MIN_PERIOD_S = 0.1
# All the asks of one process, per second, once it has more than MIN_PERIOD_S * MAX_CHECKS_PER_S streams open.
MAX_CHECKS_PER_S = 500.0


class CancellationChecks:
    """The open polls of one process (a model's stub) and the rate they share."""

    def __init__(self, min_period_s: float = MIN_PERIOD_S, max_checks_per_s: float = MAX_CHECKS_PER_S):
        self._min_period_s = min_period_s
        self._max_checks_per_s = max_checks_per_s
        self._lock = threading.Lock()
        self._open = 0

    def poll(self, is_cancelled: Callable[[], bool]) -> CancellationPoll:
        """A poll for one request; `close()` it when the request has ended. It takes its share of the rate from its
        first ask (a request still queued takes none)."""
        return CancellationPoll(is_cancelled, self)

    def period_s(self) -> float:
        """How long a stream waits between asks now."""
        return max(self._min_period_s, self._open / self._max_checks_per_s)  # an int read needs no lock

    def _open_poll(self, poll: CancellationPoll) -> None:
        with self._lock:
            if not poll._counted and not poll._closed:
                poll._counted = True
                self._open += 1

    def _close(self, poll: CancellationPoll) -> None:
        with self._lock:
            poll._closed = True
            if poll._counted:
                poll._counted = False
                self._open -= 1


class CancellationPoll:
    """`is_cancelled`, asked at most once per the checks' period; False between asks (a cancellation is seen at
    the next)."""

    def __init__(self, is_cancelled: Callable[[], bool], checks: CancellationChecks):
        self._is_cancelled = is_cancelled
        self._checks = checks
        self._next_check = 0.0
        # Guarded by the checks' lock:
        self._counted = False  # among the checks' open polls
        self._closed = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next_check:
            return False
        if not self._next_check:
            self._checks._open_poll(self)
        self._next_check = now + self._checks.period_s()
        return self._is_cancelled()

    def close(self) -> None:
        """The request has ended: it no longer takes a share of the rate. Idempotent."""
        self._checks._close(self)


# The polls of this process: every model's stub is a process of its own.
PROCESS_CHECKS = CancellationChecks()
