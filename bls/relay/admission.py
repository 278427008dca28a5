"""The worker threads of a decoupled Python model: bounded admission, and an unload that answers everyone.

Each admitted request runs on a worker thread (Triton 2.51's child-stream iterator blocks the thread that
reads it, so an asyncio loop would serve one stream at a time). At most `workers` run at once and `queued`
more wait; one more is refused at once with Unavailable (HTTP 503): Triton's own queue limit never sees a
decoupled model's requests, they leave it as soon as `execute` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from bls.errors import Unavailable

Fail = Callable[[BaseException], None]


class RequestPool:
    def __init__(self, workers: int, queued: int, name: str):
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._workers = workers
        self._queued = queued
        self._lock = threading.Lock()
        self._in_flight: dict[Future, Fail] = {}
        self._accepting = True

    def submit(self, work: Callable[[], None], fail: Fail) -> None:
        """Run `work` on a worker, or call `fail` at once with why it cannot run (unloading, at capacity)."""
        refusal = None
        with self._lock:
            if not self._accepting:
                refusal = Unavailable("the model is unloading")
            elif len(self._in_flight) >= self._workers + self._queued:
                refusal = Unavailable(
                    f"at capacity: {len(self._in_flight)} requests in flight ({self._workers} running, "
                    f"{self._queued} queued at most)")
            else:
                future = self._executor.submit(work)
                self._in_flight[future] = fail
        if refusal is not None:
            fail(refusal)
            return
        future.add_done_callback(self._forget)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def shutdown(self, wait_s: float, stop_running: Callable[[], None]) -> int:
        """Unload: refuse new requests, answer queued ones with an error at once, give running ones up to
        wait_s to finish, then stop them (`stop_running`) and answer them with an error too. Returns how many
        requests were cut short."""
        with self._lock:
            self._accepting = False
            in_flight = dict(self._in_flight)
        queued = [future for future in in_flight if future.cancel()]
        for future in queued:
            in_flight.pop(future)(Unavailable("the model is unloading"))
        _, still_running = wait(list(in_flight), timeout=wait_s)
        for future in still_running:  # answered first: their threads may still send, a closed stream drops it
            in_flight[future](Unavailable(f"the model unloaded before the request finished (waited {wait_s:.0f} s)"))
        if still_running:
            stop_running()
        self._executor.shutdown(wait=False)
        return len(queued) + len(still_running)

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._in_flight.pop(future, None)
