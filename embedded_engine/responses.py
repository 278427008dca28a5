"""Engine events -> output tensors, shaped as the tensorrtllm backend shapes them (beam width 1).

- output_ids [1, 1, len] int32 and sequence_length [1, 1] int32 in every response.
  Streaming: only the tokens new in this response (the final one may hold none, e.g. when end_id ended the
  sequence, since end_id is not part of the output). Non-streaming: one response, prompt + output unless
  exclude_input_in_output.
- cum_log_probs [1, 1] (running total) and output_log_probs [1, 1, n] when return_log_probs: n = every token
  generated so far, in a streamed response too (not only its new ones), as TensorRT-LLM's C++ backend sends them
  (cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::createResult: `result.logProbs = getLogProbs()`, all of
  them, while outputTokenIds start at getMaxSentTokenPos(); triton_backend/inflight_batcher_llm/src/
  model_instance_state.cc copies result.logProbs whole into output_log_probs [1, beams, n]).
- context_logits [1, prompt_len, vocab] when return_context_logits (with the first response),
  generation_logits [1, 1, len, vocab] when return_generation_logits (one row per output token; streamed: the
  response's new tokens' only, as llmRequest.cpp createResult slices them from the last response on).
- batch_index [1, 1] when the Triton request had batch > 1.

`TritonRequestStream` gathers the rows of one Triton request: each row's responses go out as they come (to the
request's stream of bls.response_loop's loop, in decoupled mode), and the FINAL flag rides on the response that
ends the last row.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np

from bls.response_loop import merge_streamed
from embedded_engine.request import GenerationRequest
from embedded_engine.scheduler import EngineEvent

Tensors = dict[str, np.ndarray]

# How two streamed responses of one request merge when they wait for sending (merge_streamed_tokens): each
# response's sequence_length and num_output_tokens count its own tokens, as TensorRT-LLM's streamed responses do;
# output_log_probs and cum_log_probs are the later's (they cover every token so far).
merge_responses = partial(merge_streamed, running_counts=False)

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
        self._log_probs: list[float] = []  # every generated token's, streaming or not
        # Non-streaming only: what the single final response will hold.
        self._tokens: list[int] = []
        self._generation_logits: list[np.ndarray] = []
        self._context_logits: np.ndarray | None = None
        self._generated = 0
        self._perf = _PerfMetrics(request.arrival_ns)

    def add(self, event: EngineEvent) -> Tensors | None:
        """The tensors of the response this event causes, or None when it causes none."""
        request = self._request
        self._cum_log_prob += float(np.sum(event.log_probs, dtype=np.float64))
        self._log_probs.extend(event.log_probs)
        self._generated += len(event.token_ids)
        self._perf.add(event)
        if request.streaming:
            if not event.token_ids and not event.finished and event.context_logits is None:
                return None
            return self._tensors(event.token_ids, event.context_logits, event.generation_logits, len(event.token_ids))
        self._tokens.extend(event.token_ids)
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
        return self._tensors(tokens, self._context_logits, generation_logits, self._generated)

    def _tensors(
        self,
        tokens: list[int],
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
            outputs["output_log_probs"] = np.asarray(self._log_probs, np.float32).reshape(1, 1, -1)
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
    """The part of `bls.response_loop.QueuedStream` (and `bls.triton_io.senders.StubSender`) the stream uses."""

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
