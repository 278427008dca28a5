"""The request-level LLM metrics operators watch first, one definition for every model that serves text.

Names, buckets and meaning are defined here once; `tensorrt_llm_bls` reports them through the Python backend
(bls.triton_io.metrics.Metrics), the ensemble's handoff through the same families in C++ (relay/request_metrics.cc,
a copy that tests/unit/test_llm_metrics.py holds to this file). Every family has the label `model` (the model clients
call: `tensorrt_llm_bls`, `ensemble`), so one dashboard shows each path. docs/operations.md ("Metrics") puts each
beside its vLLM and trtllm-serve equivalent.

Observations are per request, never per token: each pb_utils metric call is a round trip to tritonserver, and a
per-token histogram would cost one per generated token. The inter-token latency is therefore each request's mean
time per output token after the first (vLLM's `request_time_per_output_token_seconds`, trtllm-serve's
`time_per_output_token_seconds`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bls.finish_reason import REPORTED_FINISH_REASONS, FinishReason

TIME_TO_FIRST_TOKEN = "llm_time_to_first_token_seconds"
# Where a model queues requests itself: tensorrt_llm_bls's admission (relay: its worker pool; in-process: the
# requests of one execute call served one after another). Not the ensemble's: it queues nothing of its own.
REQUEST_QUEUE_TIME = "llm_request_queue_time_seconds"
TIME_PER_OUTPUT_TOKEN = "llm_time_per_output_token_seconds"
E2E_REQUEST_LATENCY = "llm_e2e_request_latency_seconds"
PROMPT_TOKENS = "llm_prompt_tokens_total"
GENERATION_TOKENS = "llm_generation_tokens_total"
REQUESTS = "llm_requests_total"  # label finish_reason: stop | length | cancelled

# Seconds. First token and end-to-end span a cached short prompt on a GPU (ms) to a long queue (minutes); the
# time per output token spans a fast GPU step (ms) to an overloaded CPU (s). vLLM's bucket edges, trimmed.
TIME_TO_FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_QUEUE_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_REQUEST_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

DESCRIPTIONS = {
    TIME_TO_FIRST_TOKEN: "Time from the request's arrival to its first generated token",
    REQUEST_QUEUE_TIME: "Time from the request's arrival until the model started serving it",
    TIME_PER_OUTPUT_TOKEN: "Mean time per output token after the first, one observation per request",
    E2E_REQUEST_LATENCY: "Time from the request's arrival to its last response",
    PROMPT_TOKENS: "Prompt tokens of finished requests",
    GENERATION_TOKENS: "Generated tokens of finished requests",
    REQUESTS: "Finished generations by finish reason",
}


@dataclass(frozen=True)
class RequestTiming:
    """One finished generation, seen by the model that served it. Times in seconds from the request's arrival."""

    prompt_tokens: int
    generated_tokens: int
    finish_reason: FinishReason
    end_s: float
    first_token_s: float | None = None  # None: no token was generated
    last_token_s: float | None = None
    first_response_tokens: int = 0  # tokens of the response that carried the first one (>1 when merged or unary)

    @property
    def time_per_output_token_s(self) -> float | None:
        """Mean gap per token after the first response; None when every token came in one response."""
        later = self.generated_tokens - self.first_response_tokens
        if later <= 0 or self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / later


class GenerationMetrics:
    """The families above for one model, on a bls.triton_io.metrics.Metrics (which serialises and batches the calls)."""

    def __init__(self, metrics: Any, model: str):
        labels: Mapping[str, str] = {"model": model}
        self._first_token = metrics.histogram(TIME_TO_FIRST_TOKEN, DESCRIPTIONS[TIME_TO_FIRST_TOKEN], labels,
                                              TIME_TO_FIRST_TOKEN_BUCKETS)
        self._queued = metrics.histogram(REQUEST_QUEUE_TIME, DESCRIPTIONS[REQUEST_QUEUE_TIME], labels,
                                         REQUEST_QUEUE_TIME_BUCKETS)
        self._per_token = metrics.histogram(TIME_PER_OUTPUT_TOKEN, DESCRIPTIONS[TIME_PER_OUTPUT_TOKEN], labels,
                                            TIME_PER_OUTPUT_TOKEN_BUCKETS)
        self._e2e = metrics.histogram(E2E_REQUEST_LATENCY, DESCRIPTIONS[E2E_REQUEST_LATENCY], labels,
                                      E2E_REQUEST_LATENCY_BUCKETS)
        self._prompt = metrics.counter(PROMPT_TOKENS, DESCRIPTIONS[PROMPT_TOKENS], labels)
        self._generated = metrics.counter(GENERATION_TOKENS, DESCRIPTIONS[GENERATION_TOKENS], labels)
        self._finished = {reason: metrics.counter(REQUESTS, DESCRIPTIONS[REQUESTS],
                                                  {**labels, "finish_reason": reason.value})
                          for reason in REPORTED_FINISH_REASONS}

    def started(self, queued_seconds: float) -> None:
        """Observed when the model starts serving a request (before its first token)."""
        self._queued.observe(queued_seconds)

    def first_token(self, seconds: float) -> None:
        """Observed when the first token is seen (a dashboard shows a slow first token before the request ends)."""
        self._first_token.observe(seconds)

    def finished(self, timing: RequestTiming) -> None:
        per_token = timing.time_per_output_token_s
        if per_token is not None:
            self._per_token.observe(per_token)
        self._e2e.observe(timing.end_s)
        self._prompt.increment(timing.prompt_tokens)
        self._generated.increment(timing.generated_tokens)
        self._finished[timing.finish_reason.reported].increment()
