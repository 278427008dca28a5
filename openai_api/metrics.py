"""The API's Prometheus metrics (GET /metrics), every series labelled by model.

Latencies are seen from this process: from the HTTP request's arrival to the first text of a choice (time to first
token), between a choice's successive responses with text (inter-token latency: one response per token unless
the server merged some), and to a choice's end (end-to-end).

Served by `python -m openai_api`, the values live in prometheus_client's multiprocess files (PROMETHEUS_MULTIPROC_DIR,
set by openai_api.__main__ before prometheus_client is imported), one file set per worker process, and /metrics
sums every worker's: one view whichever worker answers the scrape. An app made in-process (create_app in a test)
keeps them in memory, in its own registry.
"""

from __future__ import annotations

import os
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

# The models' bucket edges (bls/llm_metrics.py, one definition), so that the API's latencies and the models' compare
# bucket for bucket in one dashboard.
from bls.llm_metrics import E2E_REQUEST_LATENCY_BUCKETS, TIME_PER_OUTPUT_TOKEN_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS

MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A stream's inter-token gaps are added to the histogram every this many (and at the stream's end, however it ends):
# what /metrics shows of a running stream lags by at most this many responses.
GAPS_PER_FLUSH = 64


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._multiprocess = MULTIPROCESS_DIR_ENV in os.environ
        r = self.registry
        self.time_to_first_token = Histogram(
            "llama3_api_time_to_first_token_seconds", "Request arrival to the first text of a choice",
            ["model"], buckets=TIME_TO_FIRST_TOKEN_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "llama3_api_inter_token_latency_seconds", "Time between a choice's successive streamed responses",
            ["model"], buckets=TIME_PER_OUTPUT_TOKEN_BUCKETS, registry=r)
        self.request_duration = Histogram(
            "llama3_api_e2e_request_latency_seconds", "Request arrival to a choice's end",
            ["model"], buckets=E2E_REQUEST_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "llama3_api_prompt_tokens", "Prompt tokens of finished choices", ["model"], registry=r)
        self.generation_tokens = Counter(
            "llama3_api_generation_tokens", "Generated tokens of finished choices", ["model"], registry=r)
        self.finished = Counter(
            "llama3_api_request_success", "Finished choices by finish_reason", ["model", "finish_reason"], registry=r)
        self.errors = Counter(
            "llama3_api_request_errors", "Requests answered with an error, by HTTP status", ["model", "status"],
            registry=r)
        self.disconnects = Counter(
            "llama3_api_client_disconnects", "Generations cancelled because the client left", ["model"], registry=r)
        # livesum: the requests in flight in the workers alive now (a worker's file goes at its exit: close()).
        self.in_flight = Gauge("llama3_api_requests_in_flight", "Requests being served", ["model"], registry=r,
                               multiprocess_mode="livesum")

    def exposition(self) -> bytes:
        """The text format of every worker's values together (multiprocess), or of this app's registry."""
        if not self._multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)

    def close(self) -> None:
        """At a worker's exit: its live gauges' file goes (livesum would count its last values on)."""
        if self._multiprocess:
            mark_process_dead(os.getpid())


class GatheredObservations:
    """One histogram series' observations gathered by one stream and added to it together (flush): the same bucket
    counts, count and sum as an observe() each. An observe() in prometheus_client's multiprocess mode is two locked
    writes to an mmap'd file (the sum, a bucket), each with a getpid() check: ~1.6 µs of every streamed response in the
    API (issue 49; docs/benchmarks.md), against ~0.2 µs here. A flush adds to the values observe() adds to (the
    Histogram child's _sum and _buckets, bucket i counting amounts <= _upper_bounds[i], the last +Inf:
    prometheus_client 0.23.1's metrics.py, the version pyproject pins)."""

    def __init__(self, series: Histogram) -> None:
        self._series = series
        self._bounds = series._upper_bounds
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._gathered = 0

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1  # the first bucket whose bound is >= amount
        self._sum += amount
        self._gathered += 1
        if self._gathered == GAPS_PER_FLUSH:
            self.flush()

    def flush(self) -> None:
        if not self._gathered:
            return
        self._series._sum.inc(self._sum)
        for index, count in enumerate(self._counts):
            if count:
                self._series._buckets[index].inc(count)
                self._counts[index] = 0
        self._sum = 0.0
        self._gathered = 0
