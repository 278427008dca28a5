"""One LLM per model instance, on its own asyncio loop thread; Triton requests become generate_async calls.

As NVIDIA's llmapi model runs it (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py@b35ac1b): the LLM is
built in the loop's executor (`LLM(**update_llm_args_with_extra_dict({}, model.yaml))`), `execute` schedules one
coroutine per request and returns at once, each coroutine iterates its RequestOutput (`async for`) and sends a
response per item, and unloading waits for the running requests, then shuts the LLM down. Every call is made by
keyword with 1.2.x's names (tests/unit/test_llmapi_calls.py holds them to the recorded signatures): prompts are token
ids, `streaming` is the request's.

Errors keep Triton's codes (bls/errors.py): what the request asked that the LLM API refuses (a ValueError / TypeError
from SamplingParams or generate_async) is INVALID_ARG naming the call; the engine at capacity is UNAVAILABLE (the
stand-in's Unavailable); anything else INTERNAL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from bls.errors import InvalidRequest, Unavailable
from llmapi_engine.cancellation import CancellationWatch, Registration
from llmapi_engine.llm_api import LlmApi
from llmapi_engine.model_config import LlmModelConfig
from llmapi_engine.request_mapping import LlmRequest
from llmapi_engine.responses import ResponseBuilder

# How long one get_stats_async round waits for stats before the next (upstream's default timeout, 2 s).
STATS_TIMEOUT_S = 2


class ResponseSender(Protocol):
    """The part of bls.triton_io.senders.StubSender the runner uses."""

    def send(self, outputs: dict, final: bool = False) -> None: ...

    def send_error(self, error: BaseException) -> None: ...

    def finish(self) -> None: ...


class _TritonStream:
    """The rows of one Triton request: each row's responses go out as they come; FINAL rides on the response that
    ends the last row; an error ends the whole request."""

    def __init__(self, sender: ResponseSender, rows: int) -> None:
        self._sender = sender
        self._unfinished = rows
        self._lock = threading.Lock()
        self._failed = False

    def send(self, tensors: dict | None, row_finished: bool) -> None:
        with self._lock:
            if self._failed:
                return
            self._unfinished -= row_finished
            final = self._unfinished == 0
        if tensors is not None:
            self._sender.send(tensors, final=final)
        elif final:
            self._sender.finish()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._failed:
                return
            self._failed = True
        self._sender.send_error(error)


class LlmRunner:
    def __init__(self, api: LlmApi, config: LlmModelConfig, tokenizer: Any,
                 on_stats: Callable[[dict], None] | None = None,
                 on_finished: Callable[[int, int], None] | None = None) -> None:
        """`on_stats`: each iteration's stats (when model.yaml enables them); `on_finished(prompt tokens,
        generated tokens)`: each LLM request that ended."""
        self._api = api
        self._tokenizer = tokenizer
        self._on_finished = on_finished
        self._cancellation = CancellationWatch(config.cancellation_check_period_ms)
        self._ongoing = 0
        self._ongoing_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmapi-loop", daemon=True)
        self._thread.start()
        llm_args = api.update_llm_args_with_extra_dict({}, config.llm_args)
        try:
            self._llm = self._call(self._build(llm_args)).result()
        except BaseException:
            self._stop_loop()
            raise
        self._stats_task: Future | None = None
        if on_stats is not None and config.llm_args.get("enable_iter_perf_stats"):
            self._stats_task = asyncio.run_coroutine_threadsafe(self._stats(on_stats), self._loop)

    async def _build(self, llm_args: dict[str, Any]) -> Any:
        return await self._loop.run_in_executor(None, lambda: self._api.LLM(**llm_args))

    def _call(self, coroutine: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # ---- requests ------------------------------------------------------------------------------------------------

    def submit(self, triton_request_id: str, requests: list[LlmRequest], sender: ResponseSender,
               is_cancelled: Callable[[], bool]) -> None:
        """Start the LLM requests of one Triton request; its responses go to `sender`. The SamplingParams are built
        here, so that what they refuse is this request's INVALID_ARG before anything starts."""
        params = [self._sampling_params(request) for request in requests]
        stream = _TritonStream(sender, len(requests))
        registration = self._cancellation.register(triton_request_id, is_cancelled)
        unfinished = [len(requests)]
        lock = threading.Lock()

        def row_done() -> None:
            with lock:
                unfinished[0] -= 1
                last = unfinished[0] == 0
            if last:
                self._cancellation.finished(registration)

        with self._ongoing_lock:
            self._ongoing += len(requests)
        for request, sampling_params in zip(requests, params, strict=True):
            self._call(self._generate(request, sampling_params, stream, registration, row_done))

    def stop(self, triton_request_id: str) -> int:
        return self._cancellation.stop(triton_request_id)

    def _sampling_params(self, request: LlmRequest) -> Any:
        try:
            guided = None if request.guided is None else self._api.GuidedDecodingParams(**request.guided)
            return self._api.SamplingParams(**request.sampling, guided_decoding=guided)
        except (ValueError, TypeError) as error:
            raise InvalidRequest("SamplingParams", str(error)) from None

    def _lora_request(self, request: LlmRequest) -> Any:
        """LoRARequest(lora_name, lora_int_id, lora_path) of the request's adapter (executor/request.py@4ce835a; its
        lora_ckpt_source keeps the default 'hf': the folders are PEFT adapters); None without one."""
        if request.lora is None:
            return None
        return self._api.LoRARequest(lora_name=request.lora.name, lora_int_id=request.lora.task_id,
                                     lora_path=request.lora.path)

    async def _generate(self, request: LlmRequest, sampling_params: Any, stream: _TritonStream,
                        registration: Registration, row_done: Callable[[], None]) -> None:
        builder = ResponseBuilder(request, self._tokenizer)
        generated = 0
        try:
            try:
                output = self._llm.generate_async(request.prompt_token_ids, sampling_params=sampling_params,
                                                  lora_request=self._lora_request(request), streaming=request.streaming)
            except Unavailable:
                raise
            except (ValueError, TypeError) as error:
                raise InvalidRequest("generate_async", str(error)) from None
            self._cancellation.started(registration, output)
            async for state in output:
                generated = len(state.outputs[0].token_ids)
                stream.send(builder.build(state), row_finished=state.finished)
        except Exception as error:  # noqa: BLE001 - every failure ends this Triton request with its error
            stream.fail(error)
        finally:
            row_done()
            with self._ongoing_lock:
                self._ongoing -= 1
            if self._on_finished is not None:
                self._on_finished(len(request.prompt_token_ids), generated)

    async def _stats(self, on_stats: Callable[[dict], None]) -> None:
        while True:
            async for stat in self._llm.get_stats_async(timeout=STATS_TIMEOUT_S):
                on_stats(stat)

    # ---- unloading -----------------------------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the running requests (NVIDIA's model waits for them at unload); True if none
        is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._ongoing_lock:
                if not self._ongoing:
                    return True
            time.sleep(0.05)
        return False

    def shutdown(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
        self._cancellation.shutdown()
        self._call(self._shutdown_llm()).result()
        self._stop_loop()

    async def _shutdown_llm(self) -> None:
        await self._loop.run_in_executor(None, self._llm.shutdown)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
