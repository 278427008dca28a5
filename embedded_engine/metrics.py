"""The nv_trt_llm_* / nv_llm_* metric families of TensorRT-LLM's Triton backend, exported by the embedded engine
under the same names, labels and buckets, so that one dashboard, rule and autoscaling signal serves the CPU
repository and the GPU one.

Source (read 2026-11-26): NVIDIA/TensorRT-LLM, the 1.2 line,
triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc (the C++ backend's
families, their json keys and sub-labels; every metric also has `model` and `version`) and
triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/1/model.py (`create_metrics`, the same families from
the Python backend). The C++ backend updates them from the executor's IterationStats every
`stats_check_period_ms` and observes the token-length histograms per finished request.

Not exported: nv_trt_llm_disaggregated_serving_metrics (no disaggregated serving here) and the inflight batcher's
micro_batch_id (no pipeline parallelism on the CPU). Values that have no CPU meaning are what a GPU engine with
nothing of that kind reports: runtime GPU and pinned memory 0.
"""

from __future__ import annotations

import os
import time
from typing import Any

from embedded_engine.scheduler import TOKENS_PER_KV_BLOCK, IterationStats

REQUEST_METRICS = "nv_trt_llm_request_metrics"  # label request_type
KV_CACHE_BLOCK_METRICS = "nv_trt_llm_kv_cache_block_metrics"  # label kv_cache_block_type
INFLIGHT_BATCHER_METRICS = "nv_trt_llm_inflight_batcher_metrics"  # label inflight_batcher_specific_metric
GENERAL_METRICS = "nv_trt_llm_general_metrics"  # label general_type
RUNTIME_MEMORY_METRICS = "nv_trt_llm_runtime_memory_metrics"  # label memory_type
INPUT_TOKEN_LEN = "nv_llm_input_token_len"  # histogram, label response_metric_type
OUTPUT_TOKEN_LEN = "nv_llm_output_token_len"
TOKEN_LEN_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1000.0)  # custom_metrics_reporter.cc's


class BackendMetrics:
    """The families for one engine model; update() per engine iteration, request_finished() per request.
    `metrics` is a bls.triton_io.metrics.Metrics: it batches the updates and serialises the pb_utils calls.

    An iteration only keeps its stats (one reference swapped); the gauges are set from the latest when Metrics
    hands its values over (every 0.1 s), as the C++ backend sets them every stats_check_period_ms: the engine's
    thread does not pay for twenty gauge sets an iteration (`make bench`, section metrics)."""

    def __init__(self, metrics: Any, model: str, version: str):
        common = {"model": model, "version": version}

        def gauges(family: str, description: str, category: str, values: tuple[str, ...]) -> dict[str, Any]:
            return {value: metrics.gauge(family, description, {**common, category: value}) for value in values}

        self._requests = gauges(REQUEST_METRICS, "TRT LLM request metrics", "request_type",
                                ("active", "max", "scheduled", "context", "waiting"))
        self._kv = gauges(KV_CACHE_BLOCK_METRICS, "TRT LLM KV cache block metrics", "kv_cache_block_type",
                          ("max", "free", "used", "tokens_per", "reused", "fraction"))
        self._batcher = gauges(INFLIGHT_BATCHER_METRICS, "TRT LLM inflight_batcher-specific metrics",
                               "inflight_batcher_specific_metric",
                               ("total_context_tokens", "generation_requests", "paused_requests"))
        self._general = gauges(GENERAL_METRICS, "General TRT LLM metrics", "general_type",
                               ("timestamp", "iteration_counter"))
        self._memory = gauges(RUNTIME_MEMORY_METRICS, "TRT LLM runtime memory metrics", "memory_type",
                              ("cpu", "gpu", "pinned"))
        self._input_len = metrics.histogram(INPUT_TOKEN_LEN, "TRT LLM response metrics",
                                            {**common, "response_metric_type": "total_input_tokens"},
                                            TOKEN_LEN_BUCKETS)
        self._output_len = metrics.histogram(OUTPUT_TOKEN_LEN, "TRT LLM response metrics",
                                             {**common, "response_metric_type": "total_output_tokens"},
                                             TOKEN_LEN_BUCKETS)
        self._next_memory_read = 0.0
        self._kv["tokens_per"].set(TOKENS_PER_KV_BLOCK)
        self._memory["gpu"].set(0)
        self._memory["pinned"].set(0)
        self._latest: IterationStats | None = None
        self._published: IterationStats | None = None
        metrics.before_flush(self._publish)

    def update(self, stats: IterationStats) -> None:
        """One engine iteration (engine thread): its stats are kept for the next hand-over."""
        self._latest = stats

    def _publish(self) -> None:
        """The latest iteration's stats into the gauges (Metrics' flush, its lock held)."""
        stats = self._latest
        if stats is None or stats is self._published:
            return
        self._published = stats
        requests, kv, batcher = self._requests, self._kv, self._batcher
        requests["active"].set(stats.active)
        requests["max"].set(stats.max_active)
        requests["scheduled"].set(stats.scheduled)
        requests["context"].set(stats.context)
        requests["waiting"].set(stats.waiting)
        kv["max"].set(stats.kv_blocks_max)
        kv["used"].set(stats.kv_blocks_used)
        kv["free"].set(stats.kv_blocks_max - stats.kv_blocks_used)
        kv["reused"].set(stats.kv_blocks_reused)
        kv["fraction"].set(stats.kv_blocks_used / stats.kv_blocks_max if stats.kv_blocks_max else 0.0)
        batcher["total_context_tokens"].set(stats.context_tokens)
        batcher["generation_requests"].set(stats.scheduled - stats.context)
        batcher["paused_requests"].set(0)  # the embedded engine never pauses (evicts) a running sequence
        # The C++ backend exports the executor's timestamp in microseconds since the epoch.
        self._general["timestamp"].set(stats.timestamp_ns // 1000)
        self._general["iteration_counter"].set(stats.iteration)
        now = time.monotonic()
        if now >= self._next_memory_read:  # a file read: once a second, not every iteration
            self._next_memory_read = now + 1.0
            self._memory["cpu"].set(_resident_bytes())

    def request_finished(self, prompt_tokens: int, generated_tokens: int) -> None:
        self._input_len.observe(prompt_tokens)
        self._output_len.observe(generated_tokens)


def _resident_bytes() -> int:
    """The engine process's (this stub's) resident memory: what the CPU has for the runtime's CPU memory."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
