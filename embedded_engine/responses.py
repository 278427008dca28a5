"""Engine events -> output tensors, shaped as the tensorrtllm backend shapes them (beam width 1).

- output_ids [1, 1, len] int32 and sequence_length [1, 1] int32 in every response.
  Streaming: only the tokens new in this response (the final one may hold none, e.g. when end_id ended the
  sequence, since end_id is not part of the output). Non-streaming: one response, prompt + output unless
  exclude_input_in_output.
- cum_log_probs [1, 1] (running total) and output_log_probs [1, 1, len] when return_log_probs.
- context_logits [1, prompt_len, vocab] when return_context_logits (with the first response),
  generation_logits [1, 1, len, vocab] when return_generation_logits (one row per output token).
- batch_index [1, 1] when the Triton request had batch > 1.

`TritonRequestStream` gathers the rows of one Triton request: each row's responses go out as they come, and
the FINAL flag rides on the response that ends the last row.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from embedded_engine.request import GenerationRequest
from embedded_engine.scheduler import EngineEvent

Tensors = dict[str, np.ndarray]

# The unit of the kv_cache_*_blocks perf metrics: the embedded engine's cache is not paged, so its use is
# reported in blocks of this many tokens (trtllm-build's default --tokens_per_block is 32 as well).
KV_BLOCK_TOKENS = 32


@dataclass
class _PerfMetrics:
    """What `return_perf_metrics` reports for one sequence, gathered from its events."""

    arrival_ns: int
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    reused_tokens: int = 0
    drafted_tokens: int = 0
    accepted_draft_tokens: int = 0

    def add(self, event: EngineEvent) -> None:
        if event.scheduled_ns is not None:
            self.scheduled_ns, self.reused_tokens = event.scheduled_ns, event.reused_tokens
        if event.token_ids:
            self.first_token_ns = self.first_token_ns or event.time_ns
            self.last_token_ns = event.time_ns
        self.drafted_tokens += event.drafted_tokens
        self.accepted_draft_tokens += event.accepted_draft_tokens

    def tensors(self, request: GenerationRequest, generated: int) -> Tensors:
        total_blocks = -(-(len(request.prompt) + generated) // KV_BLOCK_TOKENS)
        reused_blocks = self.reused_tokens // KV_BLOCK_TOKENS
        drafts = self.drafted_tokens
        values = {
            "kv_cache_alloc_new_blocks": (total_blocks - reused_blocks, np.int32),
            "kv_cache_reused_blocks": (reused_blocks, np.int32),
            "kv_cache_alloc_total_blocks": (total_blocks, np.int32),
            "arrival_time_ns": (self.arrival_ns, np.int64),
            "first_scheduled_time_ns": (self.scheduled_ns, np.int64),
            "first_token_time_ns": (self.first_token_ns, np.int64),
            "last_token_time_ns": (self.last_token_ns, np.int64),
            "acceptance_rate": (self.accepted_draft_tokens / drafts if drafts else 0.0, np.float32),
            "total_accepted_draft_tokens": (self.accepted_draft_tokens, np.int32),
            "total_draft_tokens": (drafts, np.int32),
        }
        return {name: np.array([[value]], dtype) for name, (value, dtype) in values.items()}


class ResponseAssembler:
    """The responses of one generation request (one batch row)."""

    def __init__(self, request: GenerationRequest, vocab_size: int):
        self._request = request
        self._vocab_size = vocab_size
        self._cum_log_prob = 0.0
        # Non-streaming only: what the single final response will hold.
        self._tokens: list[int] = []
        self._log_probs: list[float] = []
        self._generation_logits: list[np.ndarray] = []
        self._context_logits: np.ndarray | None = None
        self._generated = 0
        self._perf = _PerfMetrics(request.arrival_ns)

    def add(self, event: EngineEvent) -> Tensors | None:
        """The tensors of the response this event causes, or None when it causes none."""
        request = self._request
        self._cum_log_prob += float(np.sum(event.log_probs, dtype=np.float64))
        self._generated += len(event.token_ids)
        self._perf.add(event)
        if request.streaming:
            if not event.token_ids and not event.finished and event.context_logits is None:
                return None
            return self._tensors(event.token_ids, event.log_probs, event.context_logits, event.generation_logits,
                                 len(event.token_ids))
        self._tokens.extend(event.token_ids)
        self._log_probs.extend(event.log_probs)
        if event.generation_logits is not None:
            self._generation_logits.append(event.generation_logits)
        if event.context_logits is not None:
            self._context_logits = event.context_logits
        if not event.finished:
            return None
        tokens = self._tokens if request.exclude_input_in_output else [*request.prompt, *self._tokens]
        generation_logits = None
        if request.return_generation_logits:
            generation_logits = np.concatenate(self._generation_logits) if self._generation_logits else None
        return self._tensors(tokens, self._log_probs, self._context_logits, generation_logits, self._generated)

    def _tensors(
        self,
        tokens: list[int],
        log_probs: list[float],
        context_logits: np.ndarray | None,
        generation_logits: np.ndarray | None,
        new_tokens: int,
    ) -> Tensors:
        request = self._request
        outputs: Tensors = {
            "output_ids": np.asarray(tokens, np.int32).reshape(1, 1, -1),
            "sequence_length": np.array([[len(tokens)]], np.int32),
        }
        if request.return_log_probs:
            outputs["cum_log_probs"] = np.array([[self._cum_log_prob]], np.float32)
            outputs["output_log_probs"] = np.asarray(log_probs, np.float32).reshape(1, 1, -1)
        if request.return_context_logits and context_logits is not None:
            outputs["context_logits"] = context_logits.astype(np.float32, copy=False)[np.newaxis]
        if request.return_generation_logits:
            if generation_logits is None:  # no new token: an empty [1, 1, 0, vocab] block
                generation_logits = np.zeros((0, self._vocab_size), np.float32)
            outputs["generation_logits"] = generation_logits.astype(np.float32, copy=False)[np.newaxis, np.newaxis]
        if request.batch_size > 1:
            outputs["batch_index"] = np.array([[request.batch_index]], np.int32)
        if request.return_num_input_tokens:
            outputs["num_input_tokens"] = np.array([[len(request.prompt)]], np.int32)
        if request.return_num_output_tokens:  # the generated tokens this response carries
            outputs["num_output_tokens"] = np.array([[new_tokens]], np.int32)
        if request.return_perf_metrics:
            outputs.update(self._perf.tensors(request, self._generated))
        return outputs


class ResponseSender(Protocol):
    """The part of `bls.triton_io.senders.StubSender` the stream uses."""

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None: ...

    def send_error(self, error: BaseException) -> None: ...

    def finish(self) -> None: ...


class TritonRequestStream:
    """Routes the events of all rows of one Triton request to its sender.

    An error in any row ends the whole Triton request with that error (the sender then reports itself
    closed, which cancels the other rows through their `is_cancelled`).
    """

    def __init__(self, requests: list[GenerationRequest], sender: ResponseSender, vocab_size: int):
        self._sender = sender
        self._assemblers = {request.batch_index: ResponseAssembler(request, vocab_size) for request in requests}
        self._unfinished = len(requests)
        self._lock = threading.Lock()
        self.started = False  # a response went out (the dispatcher serves streams still waiting for one first)

    def on_event(self, event: EngineEvent) -> None:
        if event.error is not None:
            self._sender.send_error(event.error)
            return
        outputs = self._assemblers[event.request.batch_index].add(event)
        with self._lock:
            if event.finished:
                self._unfinished -= 1
            final = event.finished and self._unfinished == 0
        if outputs is not None:
            self.started = True
            self._sender.send(outputs, final=final)
        elif final:
            self._sender.finish()


class CollectingSender:
    """A sender for the non-decoupled mode: keeps the one final response (or error) until it is fetched."""

    def __init__(self) -> None:
        self.outputs: Tensors | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        if not self._done.is_set():
            self.outputs = dict(outputs)
        if final:
            self._done.set()

    def send_error(self, error: BaseException) -> None:
        if not self._done.is_set():
            self.error = error
            self._done.set()

    def finish(self) -> None:
        self._done.set()

    def is_cancelled(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)


def merge_events(events: list[EngineEvent]) -> EngineEvent:
    """Consecutive events of one sequence as one: their tokens in order, the last one's finish."""
    if len(events) == 1:
        return events[0]
    for event in events:
        if event.error is not None:
            return event  # an error ends the stream; nothing after it matters
    generation_logits = [e.generation_logits for e in events if e.generation_logits is not None]
    last = events[-1]
    return EngineEvent(
        request=last.request,
        token_ids=[t for e in events for t in e.token_ids],
        log_probs=[p for e in events for p in e.log_probs],
        context_logits=events[0].context_logits,
        generation_logits=np.concatenate(generation_logits) if generation_logits else None,
        drafted_tokens=sum(e.drafted_tokens for e in events),
        accepted_draft_tokens=sum(e.accepted_draft_tokens for e in events),
        finished=last.finished,
        finish_reason=last.finish_reason,
    )


class ResponseDispatcher:
    """Sends responses on its own thread, so the engine does not wait for each send.

    Events wait in a queue and go out in order, one response per engine step, as TensorRT-LLM's C++ backend
    streams (one response per generated token): what every benchmark and soak must load the layers above
    with. When sending falls behind, what waits goes out in rounds of one response per stream (streams still
    waiting for their first response first), the order a GPU engine emits tokens in, so that a stream's
    backlog neither goes out as a burst nor holds back the other streams and new requests. With `merge`, each
    round sends a sequence's waiting events as one response instead, so a CPU box whose sending falls behind
    generation catches up; a figure measured that way must say so.

    A paced engine (step_ms > 0) asks `wait_for_backlog` before each step: it waits while more than
    BACKLOG_STEPS steps of responses are still to be sent. TensorRT-LLM's C++ backend sends as fast as it
    generates; this stand-in, sending from Python on a few cores, cannot, and without the bound it queued
    responses without limit: in the 2-core soak first tokens waited ~2.5 s behind the queue, and generations of
    clients that had gone ran on until their queued tokens came out (twice the tokens per finished request).
    """

    BACKLOG_STEPS = 2

    def __init__(self, merge: bool = False, corked: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        """`corked()`: held while a round is sent (where the sends can be gathered, a round goes in one write)."""
        self._merge = merge
        self._corked = corked
        # Streams with events to send, in the order the next round serves them (after first responses).
        self._pending: dict[int, tuple[TritonRequestStream, deque[EngineEvent]]] = {}
        self._backlog = 0  # events submitted and not yet sent
        self._in_step = 0  # > 0: an engine step is under way (step()): its events wait for its end
        self._engine_waits_for: int | None = None  # the backlog an engine in wait_for_backlog waits for
        self._wakeup = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._run, name="response-dispatcher", daemon=True)
        self._thread.start()

    def submit(self, stream: TritonRequestStream, event: EngineEvent) -> None:
        key = id(event.request)
        with self._wakeup:
            self._backlog += 1
            if key in self._pending:
                self._pending[key][1].append(event)
            else:
                self._pending[key] = (stream, deque([event]))
            if not self._in_step:
                self._wakeup.notify()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Held by a paced engine around each step: the step's events go out together when it ends, as a GPU
        step's tokens do (and as TensorRT-LLM's C++ backend sends them), not one by one while the stand-in computes
        the step's sequences one after another (a few ms on a CPU: the BLS would wake for every few tokens)."""
        with self._wakeup:
            self._in_step += 1
        try:
            yield
        finally:
            with self._wakeup:
                self._in_step -= 1
                if self._pending:
                    self._wakeup.notify()

    def wait_for_backlog(self, events_per_step: int, timeout_s: float = 1.0) -> None:
        """Block (the engine, before a step) while more than BACKLOG_STEPS steps of `events_per_step` responses
        wait to be sent, for at most timeout_s: a send that hangs slows the engine down, never stops it."""
        limit = self.BACKLOG_STEPS * max(events_per_step, 1)
        deadline = time.monotonic() + timeout_s
        with self._wakeup:
            try:
                while self._running and self._backlog > limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._engine_waits_for = limit
                    self._wakeup.wait(remaining)
            finally:
                self._engine_waits_for = None

    def shutdown(self) -> None:
        with self._wakeup:
            self._running = False
            self._wakeup.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while self._running and (not self._pending or self._in_step):
                    self._wakeup.wait()
                if not self._pending:
                    return
                # One round: first responses first (a new request's first token does not wait behind long
                # streams), then one response per stream, as a GPU engine emits them (one token per stream per
                # step); a stream with more waiting goes to the back, behind streams that arrive meanwhile.
                rounds = []
                for key, (stream, events) in sorted(self._pending.items(), key=lambda item: item[1][0].started):
                    if self._merge:
                        taken = list(events)
                        events.clear()
                    else:
                        taken = [events.popleft()]
                    entry = self._pending.pop(key)
                    if events:
                        self._pending[key] = entry
                    rounds.append((stream, taken))
            with self._corked():
                for stream, taken in rounds:
                    stream.on_event(merge_events(taken) if self._merge else taken[0])
                    with self._wakeup:
                        self._backlog -= len(taken)
                        # Woken once the backlog is low enough, not after every stream: each wake-up of the engine
                        # thread costs this one the GIL.
                        if self._engine_waits_for is not None and self._backlog <= self._engine_waits_for:
                            self._wakeup.notify_all()
