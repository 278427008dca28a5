"""The stand-in's RequestOutput and CompletionOutput: TensorRT-LLM 1.2.x's output objects, fed by the embedded engine.

Upstream (tensorrt_llm/executor/result.py, read at NVIDIA/TensorRT-LLM@005bc84; docs/llmapi.md's sources name
@a678b91): `CompletionOutput.token_ids` is CUMULATIVE (extended by every response); `token_ids_diff` /
`logprobs_diff` are what the latest response added. `logprobs` is one {token id: Logprob} per output token.
`finish_reason` is 'stop' | 'length' | 'timeout' | 'cancelled'; `stop_reason` the stop token id or string that ended
it. A RequestOutput is async-iterable (one item per response; streaming: per engine step, otherwise one, final) and
`aresult()` / `result()` wait for the final one; `abort()` cancels the request (finish_reason 'cancelled').
`request_perf_metrics` (SamplingParams.return_perf_metrics) holds kv_cache_metrics, timing_metrics (timedelta since
the epoch here; NVIDIA's Triton model converts them with pd.Timedelta(...).value, nanoseconds) and
speculative_decoding, as NVIDIA's llmapi model reads them (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass
class TimingMetrics:
    arrival_time: timedelta = timedelta(0)
    first_scheduled_time: timedelta = timedelta(0)
    first_token_time: timedelta = timedelta(0)
    last_token_time: timedelta = timedelta(0)


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class RequestPerfMetrics:
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)
    timing_metrics: TimingMetrics = field(default_factory=TimingMetrics)
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    disaggregated_params: Any = None
    request_perf_metrics: RequestPerfMetrics | None = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self._last_logprobs_len:]


Update = Callable[["RequestOutput"], None]


class RequestOutput:
    """One request's outputs. The engine's thread publishes updates (one per engine step); as upstream handles each
    response when its consumer takes it, an update is applied when the async iteration (or a wait) takes it, so that
    `token_ids_diff` is exactly what one response added. Streaming: one item per update; otherwise one, final."""

    def __init__(self, request_id: int, prompt_token_ids: list[int], streaming: bool,
                 abort: Callable[[], None]) -> None:
        self.request_id = request_id
        self.prompt = None  # token-id prompts have no text
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(0)]
        self.context_logits = None
        self.finished = False
        self._streaming = streaming
        self._abort = abort
        self._aborted = False
        self._lock = threading.Lock()
        self._pending: deque[tuple[Update | None, BaseException | None]] = deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._published_final = threading.Event()

    # ---- the engine's side ---------------------------------------------------------------------------------------

    def _publish(self, update: Update | None, final: bool, error: BaseException | None = None) -> None:
        """An update of `outputs` (applied by its consumer), or the request's error; `final`: the last one."""
        with self._lock:
            self._pending.append((update, error))
            waiters, self._waiters = self._waiters, []
        if final or error is not None:
            self._published_final.set()
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def _take(self) -> bool:
        """Apply the next pending update (lock held); False when none is pending."""
        if not self._pending:
            return False
        update, error = self._pending.popleft()
        if error is not None:
            self.finished = True
            raise error
        for output in self.outputs:
            output._last_token_ids_len = len(output.token_ids)
            output._last_logprobs_len = len(output.logprobs)
            output._last_text_len = len(output.text)
        update(self)
        return True

    # ---- upstream's surface ------------------------------------------------------------------------------------

    def abort(self) -> None:
        self._aborted = True
        self._abort()

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        self._yielded_final = False
        return self

    async def __anext__(self) -> RequestOutput:
        while True:
            with self._lock:
                if self.finished and self._yielded_final:
                    raise StopAsyncIteration
                if self._streaming:
                    if self._take():
                        self._yielded_final = self.finished
                        return self
                else:
                    while self._take():
                        pass
                    if self.finished:
                        self._yielded_final = True
                        return self
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiters.append((loop, future))
            await future

    async def aresult(self) -> RequestOutput:
        async for _ in self:
            pass
        return self

    def result(self, timeout: float | None = None) -> RequestOutput:
        if not self._published_final.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish in {timeout} s")
        with self._lock:
            while self._take():
                pass
        return self


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
