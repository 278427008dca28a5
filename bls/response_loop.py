"""One thread sends every streamed response of a BLS process, and merges what waits for it.

Why: a send is a synchronous round trip from the Python backend stub to tritonserver, and it must hold
PB_LOCK (the stub is not safe against pb_utils calls from several threads). With one engine response per
generated token, as TensorRT-LLM's C++ backend streams, and a thread per stream that sent for itself, the
streams queued on that lock and every token paid a send: at 64 streams on 2 cores the BLS delivered under
half the engine's rate and first tokens waited half a second behind other streams' sends.

Here stream threads only queue what they would have sent, and return at once; this loop sends. A response
that is still waiting when its stream adds the next one absorbs it (`merge`, defined by whoever knows the
outputs: text deltas concatenated, running token counts replaced), so each stream has at most one streamed
response waiting and the client receives the same text in fewer responses when sending falls behind. While
sending keeps up, every response goes out as queued: one per token. Streams that have sent nothing yet go
first, so a new request's first token does not wait for a round of every running stream.

Cancellation is asked of Triton here too, right after a stream's send, at most once per period per stream
(bls.cancellation); the stream's own thread reads the answer without any call.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import numpy as np

from bls.cancellation import CANCELLATION_CHECK_PERIOD_S, CancellationPoll

Tensors = dict[str, np.ndarray]
# Merges two streamed responses of one stream into one, or None when they must go apart.
Merge = Callable[[Tensors, Tensors], "Tensors | None"]
log = logging.getLogger(__name__)


class Transport(Protocol):
    """Where a stream's responses go (bls.triton_io.SafeSender)."""

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None: ...

    def send_error(self, error: BaseException) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass
class _Outgoing:
    outputs: Tensors | None  # None: an error response (always final)
    final: bool
    error: BaseException | None = None


class QueuedStream:
    """The response sink of one request: sends return at once; the loop sends in order."""

    def __init__(self, loop: "ResponseLoop", transport: Transport, merge: Merge, cancellation_period_s: float):
        self._loop = loop
        self._transport = transport
        self._merge = merge
        self._cancellation = CancellationPoll(transport.is_cancelled, cancellation_period_s)
        # Guarded by the loop's lock:
        self._waiting: list[_Outgoing] = []
        self._queued = False  # in one of the loop's ready queues
        self._final_queued = False
        self._sent_any = False
        # Written by the loop thread only; a bool read is atomic.
        self._cancelled = False

    @property
    def closed(self) -> bool:
        return self._final_queued

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        self._loop._enqueue(self, _Outgoing(dict(outputs), final))

    def send_error(self, error: BaseException) -> None:
        """The error ends the stream, after whatever was queued before it."""
        self._loop._enqueue(self, _Outgoing(None, True, error))

    def is_cancelled(self) -> bool:
        """What Triton said at the last check (the loop asks), or True when sending failed. Never blocks."""
        return self._cancelled

    def _absorb(self, item: _Outgoing) -> bool:
        """Merge a streamed response into the one still waiting, if any (on the sending stream's thread, with
        the loop's lock). Final responses, errors among them, are never merged."""
        if item.final or not self._waiting:
            return False
        last = self._waiting[-1]
        if last.final:
            return False
        merged = self._merge(last.outputs, item.outputs)
        if merged is None:
            return False
        last.outputs = merged
        return True

    # -- on the loop's thread ---------------------------------------------------------------------------
    def _transmit(self, items: list[_Outgoing]) -> None:
        for item in items:
            if self._cancelled and not item.final:
                continue  # the client is gone: only the final response (Triton needs it) still goes
            try:
                if item.error is not None:
                    self._transport.send_error(item.error)
                else:
                    self._transport.send(item.outputs, final=item.final)
            except Exception as error:  # noqa: BLE001 - one broken stream must not stop the loop
                log.warning("sending a response failed (%s: %s); the stream stops", type(error).__name__, error)
                self._cancelled = True
                if not item.final:
                    self._end_with(error)
                return
        self._cancelled = self._cancelled or self._cancellation()

    def _end_with(self, error: BaseException) -> None:
        try:
            self._transport.send_error(error)
        except Exception:  # noqa: BLE001 - best effort: the transport is already failing
            log.exception("ending a failed stream failed too")


class ResponseLoop:
    """The sending thread of one process. `open` a stream per request; `close` at unload sends what waits."""

    def __init__(self, name: str = "bls-send", cancellation_period_s: float = CANCELLATION_CHECK_PERIOD_S):
        self._cancellation_period_s = cancellation_period_s
        self._lock = threading.Condition()
        self._new: deque[QueuedStream] = deque()  # streams that have sent nothing yet: first tokens go first
        self._running: deque[QueuedStream] = deque()
        self._open = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def open(self, transport: Transport, merge: Merge) -> QueuedStream:
        return QueuedStream(self, transport, merge, self._cancellation_period_s)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Send what is queued, then stop the thread. False if it did not finish within timeout_s."""
        with self._lock:
            self._open = False
            self._lock.notify()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def waiting(self) -> int:
        """Responses queued and not yet sent (for tests and logs)."""
        with self._lock:
            return sum(len(stream._waiting) for stream in (*self._new, *self._running))

    def _enqueue(self, stream: QueuedStream, item: _Outgoing) -> None:
        with self._lock:
            if stream._final_queued:
                return  # the stream has ended: a late send or error is dropped, never a second end
            stream._final_queued = item.final
            if stream._absorb(item):
                return
            stream._waiting.append(item)
            if not stream._queued:
                stream._queued = True
                (self._running if stream._sent_any else self._new).append(stream)
                self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._open and not (self._new or self._running):
                    self._lock.wait()
                if not (self._new or self._running):
                    return
                stream = self._new.popleft() if self._new else self._running.popleft()
                items, stream._waiting = stream._waiting, []
                stream._queued = False
                stream._sent_any = True
            stream._transmit(items)
