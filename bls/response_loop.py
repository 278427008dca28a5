"""The one sending loop of every Python model that streams: the BLS behind the relay (bls.transports) and the
embedded engine (model_repository/tensorrt_llm). Its producers (the BLS's workers and the relay connection's reader,
the engine's step thread) only queue what they would send, and return at once; the loop sends, on its threads.

- A queue per stream (`open` one per request), sent in order: a stream is taken by one thread at a time.
- New streams first: a stream that has sent nothing yet goes before the running ones, so a new request's first
  token does not wait for a round of every running stream.
- What waits is merged: a stream opened with a `merge` (merge_streamed, with the stream's rules) has at most one
  streamed response waiting; a later one is absorbed into it, so the client receives the same tokens in fewer
  responses when sending falls behind. A stream without one sends one response per round: when sending falls
  behind, a round sends one response of every stream, in the order their responses came, as a GPU engine emits
  one token per stream per step; while sending keeps up, every response goes out as queued.
- Rounds, corked: a sending thread takes a round (every stream queued now, once) and sends it inside `corked()`,
  where the sends of a round can go in one write (RelayConnections.corked); `held()` (the paced engine's step)
  keeps the loop from sending until it ends, so a step's responses go out together.
- Backpressure: `wait_for_backlog` (the paced engine, before a step) waits while more than BACKLOG_STEPS steps
  of responses are still to be sent.

A thread that queues many streams' responses in bursts (the relay connection's reader) sends them itself after
each burst (`send_waiting`): waking a sending thread for each response, and handing it the GIL and back, would
cost more than the sends (docs/benchmarks.md has the measurements).

Cancellation: whoever learns that the client has gone calls `cancel()` (the relay connection that claimed the
stream); a send that fails cancels the stream too. The producer reads the flag without any call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Tensors = dict[str, np.ndarray]
# Merges two streamed responses of one stream into one, or None when they must go apart.
Merge = Callable[[Tensors, Tensors], "Tensors | None"]
log = logging.getLogger(__name__)

# Per-token outputs, joined along their token axis when responses are merged (output_ids [1, 1, n],
# generation_logits [1, 1, n, vocab]); a non-streamed BLS response joins them too. A streamed response of
# TensorRT-LLM's C++ backend carries the logits of its new tokens only (LlmRequest::createResult, streaming:
# `slice(getGenerationLogitsHost(), startGenTokenPos, maxNbTokensOut)`, the positions since the last response, as its
# output ids). Not output_log_probs: a
# streamed response of TensorRT-LLM's C++ backend carries the log probs of ALL the tokens generated so far
# (cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::createResult: `result.logProbs = getLogProbs()`, while
# outputTokenIds start at getMaxSentTokenPos()), so the later response's replaces the earlier's, as cum_log_probs.
PER_TOKEN_AXIS = {"output_ids": -1, "generation_logits": 2}
# Token counts: a running total in the BLS's streamed responses, the response's own count in the engine's.
TOKEN_COUNTS = ("sequence_length", "num_output_tokens")


def merge_streamed(earlier: Tensors, later: Tensors, accumulate: bool = False,
                   running_counts: bool = True) -> Tensors | None:
    """Two streamed responses of one stream as one: the text deltas joined (accumulating: the later, whole text),
    per-token outputs joined along their token axis, token counts the later's where they are running totals and
    added up where each response counts its own (`running_counts` False: the engine's), every other output the
    later one's (cumulative values such as cum_log_probs, output_log_probs and the perf metrics are running totals;
    context_logits come with the first response only and stay). None for responses of different batch rows, which
    go apart."""
    earlier_row, later_row = earlier.get("batch_index"), later.get("batch_index")
    if (earlier_row is None) != (later_row is None) or (
        earlier_row is not None and earlier_row.item() != later_row.item()
    ):
        return None
    merged = {**earlier, **later}
    if not accumulate and "text_output" in earlier and "text_output" in later:
        merged["text_output"] = np.array([earlier["text_output"][0] + later["text_output"][0]], dtype=object)
    for name, axis in PER_TOKEN_AXIS.items():
        if name in earlier and name in later:
            merged[name] = np.concatenate([earlier[name], later[name]], axis=axis)
    if not running_counts:
        for name in TOKEN_COUNTS:
            if name in earlier and name in later:
                merged[name] = earlier[name] + later[name]
    return merged


class Transport(Protocol):
    """Where a stream's responses go (bls.relay.sending.FrameSender: frames to the relay; bls.triton_io.senders.
    StubSender: through the stub)."""

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None: ...

    def send_error(self, error: BaseException) -> None: ...

    def finish(self) -> None:
        """End the stream with a final response without outputs."""


class BuildingTransport(Transport, Protocol):
    """A transport whose responses send_waiting builds ahead of their sends."""

    def build(self, outputs: Mapping[str, np.ndarray]) -> object:
        """The response send() would hand over, built now; nothing is sent."""

    def send_built(self, response: object, final: bool = False) -> None: ...


@dataclass
class _Outgoing:
    outputs: Tensors | None  # None: an error response (error set) or the final flag alone (finish)
    final: bool
    error: BaseException | None = None
    built: object | None = None  # the transport's response, built ahead of the send (send_waiting)
    count: int = 1  # the responses queued that this one holds (merged ones): the backlog counts them


class QueuedStream:
    """The response sink of one request: sends return at once; the loop sends in order."""

    def __init__(self, loop: ResponseLoop, transport: Transport, merge: Merge | None, merge_final: bool):
        self._loop = loop
        self._transport = transport
        self._merge = merge
        self._merge_final = merge_final
        # Guarded by the loop's lock:
        self._waiting: list[_Outgoing] = []
        self._queued = False  # in one of the loop's queues
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

    def finish(self) -> None:
        """End the stream with the final flag alone, after whatever was queued before it."""
        self._loop._enqueue(self, _Outgoing(None, True))

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
        """Merge a streamed response into the one still waiting, if any (on the producing thread, with the loop's
        lock). Errors and the final flag alone are never merged; a final response only with merge_final (the
        engine's: all a sequence has waiting in one response)."""
        if self._merge is None or item.outputs is None or (item.final and not self._merge_final) or not self._waiting:
            return False
        last = self._waiting[-1]
        if last.final:
            return False
        merged = self._merge(last.outputs, item.outputs)
        if merged is None:
            return False
        last.outputs, last.final, last.count = merged, item.final, last.count + 1
        return True

    def _take(self) -> list[_Outgoing]:
        """What this round sends of the stream (with the loop's lock): all that waits where it is merged (at most
        one streamed response and what ends the stream), else the oldest response alone."""
        if self._merge is not None:
            items, self._waiting = self._waiting, []
        else:
            items, self._waiting = self._waiting[:1], self._waiting[1:]
        return items

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
                elif item.outputs is None:
                    self._transport.finish()
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


Round = list[tuple[QueuedStream, list[_Outgoing]]]


class ResponseLoop:
    """Sends the streamed responses of one process, on its threads and on those that call send_waiting. `open` a
    stream per request; `close` at unload sends what waits. `corked()` is held while a round is sent."""

    # A paced engine waits (wait_for_backlog) while more than this many steps of responses wait to be sent.
    # TensorRT-LLM's C++ backend sends as fast as it generates; the embedded engine, sending from Python on a few
    # cores, cannot, and without the bound it queued responses without limit: in the 2-core soak first tokens
    # waited ~2.5 s behind the queue, and generations of clients that had gone ran on until their queued tokens
    # came out (twice the tokens per finished request).
    BACKLOG_STEPS = 2

    def __init__(self, name: str = "bls-send", threads: int = 1,
                 corked: Callable[[], AbstractContextManager[None]] = nullcontext):
        self._corked = corked
        self._lock = threading.Condition()
        # Streams with responses waiting, in the order their oldest waiting response came: those that have sent
        # nothing yet (first tokens go first), then the running ones. A stream a thread is sending stays queued
        # when more comes for it, in its place, and waits there until that send is over.
        self._new: deque[QueuedStream] = deque()
        self._running: deque[QueuedStream] = deque()
        self._sending: set[QueuedStream] = set()  # taken by a sending thread now
        self._callbacks: deque[Callable[[], None]] = deque()  # when_cancelled callbacks of cancelled streams
        self._self_sending: set[int] = set()  # threads that send what they queue themselves (send_waiting)
        self._backlog = 0  # responses queued and not yet sent (merged ones counted each)
        self._held = 0  # > 0: held() is in force; nothing is sent until it ends
        self._backlog_limit: int | None = None  # the backlog a producer in wait_for_backlog waits for
        self._open = True
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def open(self, transport: Transport, merge: Merge | None = None, merge_final: bool = False) -> QueuedStream:
        """A stream of `transport`'s; `merge`: how two of its responses become one (none: one response per
        round); `merge_final`: a final response merges into the one waiting too."""
        return QueuedStream(self, transport, merge, merge_final)

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
        """Responses queued and not yet sent, merged ones as one (for tests and logs)."""
        with self._lock:
            return sum(len(stream._waiting) for stream in {*self._new, *self._running, *self._sending})

    @contextmanager
    def held(self) -> Iterator[None]:
        """Nothing is sent while held: what is queued meanwhile goes out together when the last hold ends (a paced
        engine's step: its responses go out when it ends, as a GPU step's tokens do, and as TensorRT-LLM's C++
        backend sends them, not one by one while the engine computes the step's sequences one after another)."""
        with self._lock:
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                if not self._held and (self._new or self._running):
                    self._lock.notify()

    def wait_for_backlog(self, responses_per_step: int, timeout_s: float = 1.0) -> None:
        """Block (a paced engine, before a step) while more than BACKLOG_STEPS steps of `responses_per_step`
        responses wait to be sent, for at most timeout_s: a send that hangs slows the engine down, never stops it."""
        limit = self.BACKLOG_STEPS * max(responses_per_step, 1)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            try:
                while self._open and self._backlog > limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._backlog_limit = limit
                    self._lock.wait(remaining)
            finally:
                self._backlog_limit = None

    def _enqueue(self, stream: QueuedStream, item: _Outgoing) -> None:
        with self._lock:
            if stream._final_queued:
                return  # the stream has ended: a late send or error is dropped, never a second end
            stream._final_queued = item.final
            self._backlog += 1
            if stream._absorb(item):
                return
            stream._waiting.append(item)
            if not stream._queued:
                stream._queued = True
                (self._running if stream._sent_any else self._new).append(stream)
                if threading.get_ident() not in self._self_sending and not self._held:
                    self._lock.notify()

    def send_waiting(self) -> None:
        """Send one round of what waits, on the calling thread.

        Every response of the round is built before the first is sent: built back to back, they find this
        process's code and data still in the CPU's caches, which a send (a system call) evicts. The transports
        are BuildingTransports.

        The calling thread is remembered: what it queues from then on wakes none of the loop's threads, so it must
        call this again after queueing (the engine stream reader does after every sweep of its sockets).
        Responses queued by other threads wake the loop's threads as always."""
        with self._lock:
            self._self_sending.add(threading.get_ident())
            taken = self._take_round(share=False)
        for stream, items in taken:
            stream._build(items)
        self._send_round(taken)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._callbacks and (self._held or not self._takeable()):
                    if not (self._open or self._held or self._new or self._running):
                        return  # closed, and all sent
                    self._lock.wait()
                callback = self._callbacks.popleft() if self._callbacks else None
                taken = [] if callback else self._take_round(share=True)
            if callback is not None:
                _run_callback(callback)
            else:
                self._send_round(taken)

    def _takeable(self) -> bool:
        """Whether a queued stream is not being sent by another thread (with the lock held)."""
        return any(stream not in self._sending for queue in (self._new, self._running) for stream in queue)

    def _take_round(self, share: bool) -> Round:
        """Queued streams that no thread is sending, once, new ones first, and what each sends this round; one with
        more waiting queues again, behind the others (with the lock held). `share`: a loop thread takes its share of
        them (1/threads, at least one) and wakes another for the rest, so that the threads send side by side (the
        BLS's four: docs/benchmarks.md); a caller of send_waiting takes them all."""
        queued = [*self._new, *self._running]
        self._new.clear()
        self._running.clear()
        limit = -(-len(queued) // len(self._threads)) if share and self._threads else len(queued)
        taken: Round = []
        again: list[QueuedStream] = []
        for stream in queued:
            if stream in self._sending or len(taken) >= limit:  # another thread's, or another thread's share
                (self._running if stream._sent_any else self._new).append(stream)
                continue
            items = stream._take()
            self._sending.add(stream)
            stream._sent_any = True
            taken.append((stream, items))
            if stream._waiting:
                again.append(stream)
            else:
                stream._queued = False
        self._running.extend(again)
        if share and len(taken) >= limit and self._takeable():
            self._lock.notify()
        return taken

    def _send_round(self, taken: Round) -> None:
        if not taken:
            return
        with self._corked():
            for stream, items in taken:
                stream._transmit(items)
                with self._lock:
                    self._sending.discard(stream)
                    self._backlog -= sum(item.count for item in items)
                    # Woken once the backlog is low enough, not after every stream: each wake-up of the producer
                    # costs this thread the GIL.
                    if self._backlog_limit is not None and self._backlog <= self._backlog_limit:
                        self._lock.notify_all()
                    if stream._queued:  # what came while this thread sent; its producer may not send for itself
                        self._lock.notify()


def _run_callback(callback: Callable[[], None]) -> None:
    """A cancelled stream's when_cancelled callback (it interrupts its generation)."""
    try:
        callback()
    except Exception:
        log.exception("interrupting the generation of a cancelled stream failed")
