"""The relay transport's sending: a few threads send the streamed responses of a BLS process, merging what waits.

Stream threads (and the relay connection's reader, which hands on the engine's responses) only queue what they
would send, and return at once; this loop sends. A response that is still waiting when its stream adds the next
one absorbs it (`merge`, defined by whoever knows the outputs: text deltas concatenated, running token counts
replaced), so each stream has at most one streamed response waiting and the client receives the same text in
fewer responses when sending falls behind. While sending keeps up, every response goes out as queued: one per
token. Streams that have sent nothing yet go first, so a new request's first token does not wait for a round of
every running stream. A stream is taken by one thread at a time, so its responses stay in order.

A thread that queues many streams' responses in bursts (the relay connection's reader) sends them itself after
each burst (`send_waiting`): waking a sending thread for each response, and handing it the GIL and back, would
cost more than the sends (docs/benchmarks.md has the measurements).

Cancellation is the relay's word: the connection that claimed the stream calls `cancel()` when the relay says the
client has gone (bls.transports); a send that fails cancels the stream too. The stream's own thread reads the flag
without any call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bls.relay.connection import RelayConnection
from bls.relay.frames import encode_tensors, error_frame, response_frame

Tensors = dict[str, np.ndarray]
# Merges two streamed responses of one stream into one, or None when they must go apart.
Merge = Callable[[Tensors, Tensors], "Tensors | None"]
log = logging.getLogger(__name__)


class Transport(Protocol):
    """Where a stream's responses go (FrameSender: frames to the relay)."""

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None: ...

    def build(self, outputs: Mapping[str, np.ndarray]) -> object:
        """The response send() would hand over, built now; nothing is sent."""

    def send_built(self, response: object, final: bool = False) -> None: ...

    def send_error(self, error: BaseException) -> None: ...


class FrameSender:
    """The responses of a relayed stream, as frames on its process's relay connection (the loop below sends them).
    Cancellation is the relay's word, told to the connection that claimed the stream (bls.transports). What Triton
    must hear from this process, that the child request is complete, is `complete`'s job, after the final frame;
    `error_status` gives an error's code and message (both are bls.triton_io.senders.RelayedSender's, through the
    stub)."""

    def __init__(self, stream: int, connection: RelayConnection, complete: Callable[[], None],
                 error_status: Callable[[BaseException], tuple[int, str]]):
        self._stream = stream
        self._connection = connection
        self._complete = complete
        self._error_status = error_status
        self._ending = threading.Lock()  # _closed is set once, before the final frame
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def build(self, outputs: Mapping[str, np.ndarray]) -> bytes:
        """The outputs encoded (the relay drops those the client did not ask for)."""
        return encode_tensors(outputs)

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        self.send_built(self.build(outputs), final)

    def send_built(self, response: bytes, final: bool = False) -> None:
        """A response built ahead (build()): the loop builds a round's responses before it sends them."""
        self._write(response_frame(self._stream, response, final), final)

    def send_error(self, error: BaseException) -> None:
        code, message = self._error_status(error)
        self._write(error_frame(self._stream, int(code), message), final=True)

    def finish(self) -> None:
        """Close the stream with a final response without outputs (no-op if already closed)."""
        self.send_built(encode_tensors({}), final=True)

    def _write(self, frame: bytes, final: bool) -> None:
        with self._ending:
            if self._closed:
                return
            self._closed = final
        try:
            self._connection.write(frame, now=final)  # the final frame goes before the child completes
        finally:
            if final:  # whatever became of the frame: Triton must see the child end (the relay then ends the stream)
                self._connection.release(self._stream)
                self._complete()


@dataclass
class _Outgoing:
    outputs: Tensors | None  # None: an error response (always final)
    final: bool
    error: BaseException | None = None
    built: object | None = None  # the transport's response, built ahead of the send (send_waiting)


class QueuedStream:
    """The response sink of one request: sends return at once; the loop sends in order."""

    def __init__(self, loop: ResponseLoop, transport: Transport, merge: Merge):
        self._loop = loop
        self._transport = transport
        self._merge = merge
        # Guarded by the loop's lock:
        self._waiting: list[_Outgoing] = []
        self._queued = False  # in one of the loop's ready queues
        self._final_queued = False
        self._sent_any = False
        # Set once, by the sending thread that has the stream (under the loop's lock); a bool read is atomic.
        self._cancelled = False
        self._on_cancelled: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        return self._final_queued

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        self._loop._enqueue(self, _Outgoing(dict(outputs), final))

    def send_error(self, error: BaseException) -> None:
        """The error ends the stream, after whatever was queued before it."""
        self._loop._enqueue(self, _Outgoing(None, True, error))

    def is_cancelled(self) -> bool:
        """Whether the client has gone (cancel()) or sending failed. Never blocks."""
        return self._cancelled

    def cancel(self) -> None:
        """The client has gone (the relay says so, from a thread that holds the connection's lock: this only takes
        note). What waits is dropped but the final response; the when_cancelled callback runs on a sending thread."""
        self._mark_cancelled(run_callback_here=False)

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Run `callback` as soon as the loop learns that the client has gone (on a sending thread; it must not
        block), or now if it already has. The stream's producer may be waiting for its engine's next response
        and would only see is_cancelled() then: this is how it is interrupted at once."""
        with self._loop._lock:
            if not self._cancelled:
                self._on_cancelled = callback
                return
        callback()

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

    # -- on a sending thread: the loop's, or one in send_waiting (one at a time per stream) ------------------
    def _build(self, items: list[_Outgoing]) -> None:
        """Build the responses of `items` ahead of their sends; one that cannot be built is left to _transmit,
        whose send then fails the way any send does."""
        for item in items:
            if item.outputs is not None and not self._cancelled:
                try:
                    item.built = self._transport.build(item.outputs)
                except Exception:  # noqa: BLE001 - reported by the send that follows
                    pass

    def _transmit(self, items: list[_Outgoing]) -> None:
        for item in items:
            if self._cancelled and not item.final:
                continue  # the client is gone: only the final response (Triton needs it) still goes
            try:
                if item.error is not None:
                    self._transport.send_error(item.error)
                elif item.built is not None:
                    self._transport.send_built(item.built, final=item.final)
                else:
                    self._transport.send(item.outputs, final=item.final)
            except Exception as error:  # noqa: BLE001 - one broken stream must not stop the loop
                log.warning("sending a response failed (%s: %s); the stream stops", type(error).__name__, error)
                self._mark_cancelled()
                if not item.final:
                    self._end_with(error)
                return

    def _mark_cancelled(self, run_callback_here: bool = True) -> None:
        """Once: the stream is cancelled, and its when_cancelled callback runs here (a sending thread) or is handed
        to the loop's threads."""
        with self._loop._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callback, self._on_cancelled = self._on_cancelled, None
            if callback is not None and not run_callback_here:
                self._loop._callbacks.append(callback)
                self._loop._lock.notify()
                return
        if callback is not None:
            _run_callback(callback)

    def _end_with(self, error: BaseException) -> None:
        try:
            self._transport.send_error(error)
        except Exception:
            log.exception("ending a failed stream failed too")


class ResponseLoop:
    """Sends the streamed responses of one process, on its threads and on those that call send_waiting. `open` a
    stream per request; `close` at unload sends what waits."""

    def __init__(self, name: str = "bls-send", threads: int = 1):
        self._lock = threading.Condition()
        self._new: deque[QueuedStream] = deque()  # streams that have sent nothing yet: first tokens go first
        self._running: deque[QueuedStream] = deque()
        self._sending: set[QueuedStream] = set()  # taken by a sending thread now
        self._callbacks: deque[Callable[[], None]] = deque()  # when_cancelled callbacks of cancelled streams
        self._self_sending: set[int] = set()  # threads that send what they queue themselves (send_waiting)
        self._open = True
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def open(self, transport: Transport, merge: Merge) -> QueuedStream:
        return QueuedStream(self, transport, merge)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Send what is queued, then stop the threads. False if they did not finish within timeout_s."""
        with self._lock:
            self._open = False
            self._lock.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def waiting(self) -> int:
        """Responses queued and not yet sent (for tests and logs)."""
        with self._lock:
            return sum(len(stream._waiting) for stream in {*self._new, *self._running, *self._sending})

    def _enqueue(self, stream: QueuedStream, item: _Outgoing) -> None:
        with self._lock:
            if stream._final_queued:
                return  # the stream has ended: a late send or error is dropped, never a second end
            stream._final_queued = item.final
            if stream._absorb(item):
                return
            stream._waiting.append(item)
            if not stream._queued and stream not in self._sending:  # else its sending thread queues it
                stream._queued = True
                (self._running if stream._sent_any else self._new).append(stream)
                if threading.get_ident() not in self._self_sending:
                    self._lock.notify()

    def send_waiting(self) -> None:
        """Send one round of what waits, on the calling thread: each stream queued now, once, new streams first.

        Every response of the round is built before the first is sent: built back to back, they find this
        process's code and data still in the CPU's caches, which a send (a system call) evicts.

        The calling thread is remembered: what it queues from then on wakes none of the loop's threads, so it must
        call this again after queueing (the engine stream reader does after every sweep of its sockets).
        Responses queued by other threads wake the loop's threads as always."""
        with self._lock:
            self._self_sending.add(threading.get_ident())
            rounds = []
            while (taken := self._take()) is not None:
                rounds.append(taken)
        for stream, items in rounds:
            stream._build(items)
        for taken in rounds:
            self._send_taken(*taken)

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._open and not (self._new or self._running or self._callbacks):
                    self._lock.wait()
                callback = self._callbacks.popleft() if self._callbacks else None
                taken = None if callback else self._take()
            if callback is not None:
                _run_callback(callback)
                continue
            if taken is None:
                return
            self._send_taken(*taken)

    def _take(self) -> tuple[QueuedStream, list[_Outgoing]] | None:
        """The next stream to send and what it has waiting (with the lock held), or None when none waits."""
        if not (self._new or self._running):
            return None
        stream = self._new.popleft() if self._new else self._running.popleft()
        items, stream._waiting = stream._waiting, []
        stream._queued = False
        self._sending.add(stream)
        stream._sent_any = True
        return stream, items

    def _send_taken(self, stream: QueuedStream, items: list[_Outgoing]) -> None:
        stream._transmit(items)
        with self._lock:
            self._sending.discard(stream)
            if stream._waiting and not stream._queued:  # what came while this thread sent
                stream._queued = True
                self._running.append(stream)
                self._lock.notify()  # its producer may be a thread that does not send for itself


def _run_callback(callback: Callable[[], None]) -> None:
    """A cancelled stream's when_cancelled callback (it interrupts its generation)."""
    try:
        callback()
    except Exception:
        log.exception("interrupting the generation of a cancelled stream failed")
