"""Cancellation of LLM requests: Triton's (a client gone, a cancelled request) and NVIDIA's `stop` request.

As NVIDIA's llmapi model does it (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py@b35ac1b
`cancellation_loop`, `handle_stop_request`): a thread asks Triton every `cancellation_check_period_ms` (model.yaml's
triton_config, 100 by default) whether each running request was cancelled, and aborts those
(RequestOutput.abort()); a request with `stop` true aborts the running requests that carry the same Triton request
id. An aborted request ends as the engine ends it: its last response says finish_reason cancelled (the C++ contract's
semantics, as the embedded engine's; the stop request itself gets an empty final response, as there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Registration:
    """The LLM requests of one Triton request, and how to ask whether its client has gone."""

    triton_request_id: str
    is_cancelled: Callable[[], bool]
    outputs: list[Any] = field(default_factory=list)  # RequestOutput of each row, as they start
    aborted: bool = False

    def abort(self) -> None:
        self.aborted = True
        for output in self.outputs:
            output.abort()


class CancellationWatch:
    def __init__(self, period_ms: int) -> None:
        self._period_s = period_ms / 1000
        self._lock = threading.Lock()
        self._running: set[Registration] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="llmapi-cancellation", daemon=True)
        self._thread.start()

    def register(self, triton_request_id: str, is_cancelled: Callable[[], bool]) -> Registration:
        registration = Registration(triton_request_id, is_cancelled)
        with self._lock:
            self._running.add(registration)
        return registration

    def started(self, registration: Registration, output: Any) -> None:
        """A row's RequestOutput exists: from now on aborting the registration aborts it too."""
        with self._lock:
            registration.outputs.append(output)
            aborted = registration.aborted
        if aborted:
            output.abort()

    def finished(self, registration: Registration) -> None:
        with self._lock:
            self._running.discard(registration)

    def stop(self, triton_request_id: str) -> int:
        """NVIDIA's `stop`: abort the running requests with this Triton request id; returns how many."""
        with self._lock:
            matches = [r for r in self._running if r.triton_request_id == triton_request_id]
            for registration in matches:
                registration.abort()
        return len(matches)

    def shutdown(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stopping.wait(self._period_s):
            with self._lock:
                running = [r for r in self._running if not r.aborted]
            for registration in running:
                try:
                    cancelled = registration.is_cancelled()
                except Exception:  # noqa: BLE001 - a sender that cannot ask has no client left to answer
                    cancelled = True
                if cancelled:
                    with self._lock:
                        registration.abort()
