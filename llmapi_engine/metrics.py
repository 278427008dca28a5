"""The LLM API's iteration stats -> TensorRT-LLM's nv_trt_llm_* metric families at :8002.

The families, labels and buckets are the C++ backend's (embedded_engine/metrics.py BackendMetrics, which the embedded
engine exports too); the values come from `LLM.get_stats_async` (enable_iter_perf_stats: true in model.yaml; the
PyTorch executor fills its IterationStats only then), whose JSON keys are the executor's IterationStats serialisation
(camelCase: numActiveRequests, kvCacheStats.usedNumBlocks, inflightBatchingStats.numCtxTokens...; read in
trtllm-serve's tests and metrics collector, tensorrt_llm/metrics/collector.py). The token-length histograms
(nv_llm_input/output_token_len) are observed per finished request by the model.

Where BackendMetrics does not read the stats: the general family's timestamp is when this model read them (the
executor's is a formatted string whose format was not read); tokens_per block is TensorRT-LLM's default 32 and paused
requests 0 (BackendMetrics' embedded-engine values; the stats' tokensPerBlock / numPausedRequests are not read);
runtime CPU memory is this process's.
"""

from __future__ import annotations

import json
import time
from typing import Any

from embedded_engine.metrics import BackendMetrics
from embedded_engine.scheduler import IterationStats


def iteration_stats(stat: dict[str, Any] | str) -> IterationStats:
    """One iteration's stats (a dict, or its JSON text) in the embedded engine's IterationStats terms."""
    if isinstance(stat, str):
        stat = json.loads(stat)
    kv = stat.get("kvCacheStats") or {}
    batching = stat.get("inflightBatchingStats") or {}
    return IterationStats(
        iteration=int(stat["iter"]),
        timestamp_ns=time.time_ns(),
        active=int(stat["numActiveRequests"]),
        max_active=int(stat["maxNumActiveRequests"]),
        scheduled=int(batching.get("numScheduledRequests", 0)),
        context=int(batching.get("numContextRequests", 0)),
        waiting=int(stat.get("numQueuedRequests", 0)),
        context_tokens=int(batching.get("numCtxTokens", 0)),
        kv_blocks_used=int(kv.get("usedNumBlocks", 0)),
        kv_blocks_max=int(kv.get("maxNumBlocks", 0)),
        kv_blocks_reused=int(kv.get("reusedBlocks", 0)),
    )


class LlmApiMetrics:
    """The families of one `tensorrt_llm` model, fed by the LLM API's stats."""

    def __init__(self, metrics: Any, model: str, version: str) -> None:
        self._backend = BackendMetrics(metrics, model, version)

    def on_stats(self, stat: dict[str, Any] | str) -> None:
        self._backend.update(iteration_stats(stat))

    def request_finished(self, prompt_tokens: int, generated_tokens: int) -> None:
        self._backend.request_finished(prompt_tokens, generated_tokens)
