"""The seam between Triton's Python backend and our plain-Python code.

Everything that touches `triton_python_backend_utils` objects (requests, responses, errors) goes
through here, so the logic modules deal only in numpy arrays and dataclasses and are unit-tested
without Triton.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

import triton_python_backend_utils as pb_utils

from bls.artifact import verify_model_files
from bls.contract import ModelContract
from bls.errors import InvalidRequest, ModelStepError, Unavailable
from bls.relay import (
    RELAY_PARAMETERS, RelayConnection, RelayedRequest, encode_tensors, error_frame, response_frame,
)

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]

# Every pb_utils call of the BLS (taking a sender, reading inputs, building and sending responses, child
# requests, metrics) goes through this one lock: the Triton 2.51 stub is not safe against such calls from
# several threads at once (a BLS serving many streams on threads died with "double free or corruption"; with
# a lock per stream instead, so that sends of different streams overlapped, the BLS stub died within 90 s of
# the 256-client soak). Every wait on another model (exec) stays outside it: one stream waiting for its
# engine must not stop the others. The embedded engine's metrics have their own lock (Metrics).
PB_LOCK = threading.RLock()


def read_inputs(request: Any, contract: ModelContract) -> Tensors:
    """All inputs present in `request`, as numpy arrays, with required ones enforced.

    Triton 2.51 stops enforcing required inputs as soon as any optional input is present, so the
    check is repeated here. Dtype and dims were already checked by Triton against the config.
    Request parameters are refused by name (see check_no_parameters).
    """
    check_no_parameters(request_parameters(request))
    tensors: Tensors = {}
    for spec in contract.inputs:
        tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
        if tensor is None:
            if not spec.optional:
                raise InvalidRequest(spec.name, "is required")
            continue
        tensors[spec.name] = tensor.as_numpy()
    return tensors


# Parameters Triton's own clients and frontends attach to requests; they configure Triton, not the model.
_TRITON_PARAMETERS = ("triton_", "sequence_", "priority", "timeout", "headers", "binary_data")
# Parameters that are not misspelt inputs: NVIDIA's inflight_batcher_llm_client.py (v0.14) sends {"Streaming":
# ...} beside the `streaming` input, which is what decides (the tensorrtllm backend ignores it too); the generate
# endpoint makes a body's "id" the request id and also passes it on as a parameter (http_server.cc, 2.49+); the
# relay (bls.relay) says where a relayed request's responses go (it refuses those names from clients).
_NOT_INPUTS = frozenset({"Streaming", "id", *RELAY_PARAMETERS})


def check_shipped_files(version_dir: Path, model_name: str) -> None:
    """At load: the model's files are the ones `make repo` wrote (bls.artifact); logs what was checked."""
    pb_utils.Logger.log_info(f"{model_name}: {verify_model_files(version_dir)}")


def check_no_parameters(parameters: Mapping[str, Any]) -> None:
    """Refuse request parameters: these models take inputs only.

    Triton's `generate` endpoint turns every JSON field that is not an input of the model into a request
    parameter (and an ensemble forwards them to its steps), so a misspelt or unsupported field would
    otherwise be dropped without a word: `{"seed": 1}` sent to a model without a `seed` input.
    """
    for name in parameters:
        if not name.startswith(_TRITON_PARAMETERS) and name not in _NOT_INPUTS:
            raise InvalidRequest(name, "is not an input of this model (Triton's generate endpoint passes fields "
                                       "that are not inputs on as parameters, which these models do not use)")


def model_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """config.pbtxt `parameters` as a plain dict; unfilled `${...}` placeholders count as unset."""
    params = {}
    for key, value in model_config.get("parameters", {}).items():
        text = value.get("string_value", "")
        if text and not text.startswith("${"):
            params[key] = text
    return params


def parse_bool(value: str | None, default: bool, name: str) -> bool:
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in {"true", "1", "yes", "y", "t", "on"}:
        return True
    if lowered in {"false", "0", "no", "n", "f", "off"}:
        return False
    raise ValueError(f"model parameter {name}={value!r} is not a boolean")


def parse_positive_int(value: str | None, default: int, name: str) -> int:
    if value is None or not value.strip():
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"model parameter {name}={value!r} is not a whole number of at least 1")
    return number


def respond_to_each(requests: list[Any], contract: ModelContract,
                    handle: Callable[[Tensors], Mapping[str, np.ndarray]], model_name: str) -> list[Any]:
    """One response per request for a non-decoupled model; a bad request fails alone, not its batch."""
    responses = []
    for request in requests:
        try:
            responses.append(make_response(handle(read_inputs(request, contract))))
        except Exception as error:  # noqa: BLE001 - becomes this request's error response
            responses.append(error_response(error, model_name))
    return responses


def make_response(outputs: Mapping[str, np.ndarray]) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, np.ascontiguousarray(array)) for name, array in outputs.items()]
    )


def error_response(error: BaseException, model_name: str) -> Any:
    """A client-facing error: the field and the problem, never a traceback (that goes to the log)."""
    code, message = error_status(error, model_name)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def error_status(error: BaseException, model_name: str) -> tuple[int, str]:
    """The Triton error code and the message a client gets for `error` (unexpected ones are logged whole)."""
    if isinstance(error, InvalidRequest):
        return pb_utils.TritonError.INVALID_ARG, str(error)
    if isinstance(error, Unavailable):
        return pb_utils.TritonError.UNAVAILABLE, f"{model_name}: {error}"
    if isinstance(error, ModelStepError):
        code = {"client": pb_utils.TritonError.INVALID_ARG, "unavailable": pb_utils.TritonError.UNAVAILABLE}.get(
            error.kind, pb_utils.TritonError.INTERNAL)
        return code, str(error)
    # From the exception itself: error_status is also called outside the `except` that caught it.
    details = "".join(traceback.format_exception(error))
    pb_utils.Logger.log_error(f"{model_name}: unexpected error\n{details}")
    return pb_utils.TritonError.INTERNAL, f"{model_name}: internal error ({type(error).__name__}: {error}); see the server log"


def request_parameters(request: Any) -> dict[str, Any]:
    """The request's parameters as a dict (caller holds PB_LOCK)."""
    raw = request.parameters()
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}


def output_tensor(response: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_output_tensor_by_name(response, name)
    return None if tensor is None else tensor.as_numpy()


def raise_for_error(response: Any, model_name: str) -> None:
    """Turn an error response of a BLS child request into a ModelStepError."""
    if response.has_error():
        message = response.error().message()
        code = response.error().code()
        if code in (pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.UNSUPPORTED):
            kind = "client"
        elif code == pb_utils.TritonError.UNAVAILABLE:
            kind = "unavailable"
        else:
            kind = "internal"
        raise ModelStepError(model_name, message, kind=kind)


class SafeSender:
    """A response sender that always ends the stream once and survives client disconnects.

    Every decoupled model must send the FINAL flag exactly once, also on errors, or the client hangs.
    A model that is not decoupled may use a sender too (Python backend >= 23.10), for exactly one response
    with the FINAL flag (an error is sent that way too). Sends from several threads are serialised (PB_LOCK).
    """

    def __init__(self, request: Any, model_name: str):
        with PB_LOCK:
            self._sender = request.get_response_sender()
            # Triton lists every output here when the client named none.
            self._requested = frozenset(request.requested_output_names())
        self._model_name = model_name
        self._closed = False
        self._cancelled = False

    @property
    def closed(self) -> bool:
        return self._closed

    def is_cancelled(self, wait: bool = False) -> bool:
        """Whether the client has gone (a round trip to Triton).

        wait=False never blocks: while another pb_utils call of this process is in progress, the answer of the
        previous check is returned. The embedded engine polls so (bls.cancellation.CancellationPoll) from
        its scheduler: waiting for a send to finish would tie generation to sending.
        wait=True always asks: the in-process BLS (bls.transports.DirectSink), whose checks the process's rate
        limit keeps rare; answered from an earlier check whenever the lock was busy, a client that had gone would
        be missed check after check.
        """
        if not PB_LOCK.acquire(blocking=wait):
            return self._cancelled
        try:
            self._cancelled = self._closed or self._sender.is_cancelled()
            return self._cancelled
        finally:
            PB_LOCK.release()

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        """Only the outputs the client asked for go into the response. The stub would drop the others itself,
        but inside ResponseSender::Send with the GIL released (python_backend src/response_sender.cc, from
        24.10 up to main of 2026-07, so also in the 26.07 container): a dropped BYTES output frees the numpy
        array the stub serialised it into, a Python deallocation without the GIL, which can corrupt the allocator
        while other threads run Python."""
        with PB_LOCK:
            response = make_response({name: value for name, value in outputs.items() if name in self._requested})
            self._send(lambda: response, final)

    def send_error(self, error: BaseException) -> None:
        """The error, as the stream's final response.

        Not apart from the FINAL flag (an error, then an empty final response), as these models sent it while
        the BLS read engine streams through exec(decoupled=True): Triton 2.51's ensemble then counted the
        request as in flight forever, and every shutdown waited out --exit-timeout-secs (seen after the soak).
        """
        self._send(lambda: error_response(error, self._model_name), final=True)

    def finish(self) -> None:
        """Close the stream with an empty final response (no-op if already closed)."""
        with PB_LOCK:
            if self._closed:
                return
            self._closed = True
            self._sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send(self, build_response: Callable[[], Any], final: bool) -> None:
        with PB_LOCK:
            if self._closed:
                return
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            self._closed = final
            self._sender.send(build_response(), flags=flags)


class RelayedSender(SafeSender):
    """The sender of a request that came through the relay (bls.relay): its responses go to the relay as frames,
    without PB_LOCK or a round trip to tritonserver; Triton hears from this process only that the child request
    is complete, after the final frame. Cancellation is not asked of Triton either: the relay tells the connection
    that claimed the stream."""

    def __init__(self, request: Any, model_name: str, relayed: RelayedRequest, connection: RelayConnection):
        super().__init__(request, model_name)
        self._stream = relayed.stream
        self._connection = connection
        self._ending = threading.Lock()  # _closed is set once, before the final frame
        try:
            connection.claim(relayed, self._on_cancelled)
        except OSError as error:  # nothing this request sends can reach its client: it stops at its first check
            connection.release(self._stream)
            log.warning("%s: the relay cannot be reached (%s); request %s stops", model_name, error, self._stream)
            self._cancelled = True

    def _on_cancelled(self) -> None:
        self._cancelled = True

    def is_cancelled(self, wait: bool = False) -> bool:
        """What the relay said (no round trip to Triton; `wait` does not matter)."""
        return self._closed or self._cancelled

    def build(self, outputs: Mapping[str, np.ndarray]) -> bytes:
        """The outputs encoded (the relay drops those the client did not ask for)."""
        return encode_tensors(outputs)

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        self.send_built(self.build(outputs), final)

    def send_built(self, response: bytes, final: bool = False) -> None:
        """A response built ahead (build()): bls.response_loop builds a round's responses before it sends them."""
        self._write(response_frame(self._stream, response, final), final)

    def send_error(self, error: BaseException) -> None:
        self._write(error_frame(self._stream, *error_status(error, self._model_name)), final=True)

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
                with PB_LOCK:
                    self._sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class Metrics:
    """Custom Prometheus metrics, with every pb_utils metric call behind one process-wide lock.

    Triton 2.51 crashes (SIGSEGV / boost lock_exception) when metric calls come from several threads at
    once. Families are created once per name and each metric keeps its family alive: a metric whose
    family was garbage-collected fails.

    Updates are gathered in the process and handed to Triton every FLUSH_S by one thread: each pb_utils metric
    call is a round trip to tritonserver, and the embedded engine counts every generated token (py-spy: its
    per-token increments were ~11 % of its samples under load); histogram observations too, because the BLS
    observes a request's first token on the thread that reads every engine stream, which must never wait for
    the lock that sends hold.
    """

    FLUSH_S = 0.1

    def __init__(self, lock: threading.Lock | threading.RLock | None = None, flush_thread: bool = True):
        """lock: what serialises the metric calls. By default their own lock (they only need serialising among
        themselves, per the reference experiments): the embedded engine updates metrics every step and must
        not wait for sends. The BLS passes PB_LOCK so that all its pb_utils calls are serialised.
        flush_thread=False: no thread of its own; the owner calls flush_due() on the one thread that makes the
        process's pb_utils calls (the in-process BLS: bls.transports)."""
        self._lock = lock or threading.Lock()
        self._families: dict[str, Any] = {}
        self._metrics: list[_Metric] = []
        self._before_flush: list[Callable[[], None]] = []
        self._closed = threading.Event()
        self._next_flush = time.monotonic() + self.FLUSH_S
        self._flusher = None
        if flush_thread:
            self._flusher = threading.Thread(target=self._flush_every_period, name="metrics-flush", daemon=True)
            self._flusher.start()

    def flush_due(self) -> None:
        """Hand Triton what gathered, if FLUSH_S has passed since the last time (flush_thread=False)."""
        now = time.monotonic()
        if now < self._next_flush or self._closed.is_set():
            return
        self._next_flush = now + self.FLUSH_S
        with self._lock:
            self._flush()

    def flush_now(self) -> None:
        """Hand Triton what gathered now (flush_thread=False: on the one thread that makes the process's pb_utils
        calls, when nothing may come to call flush_due again soon)."""
        if self._closed.is_set():
            return
        self._next_flush = time.monotonic() + self.FLUSH_S
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Hand Triton what is pending, then release every metric and family now (call it from finalize): left
        to the stub's exit, a MetricFamily's destructor writes to shared memory that is gone by then, and the
        stub segfaulted after its model had unloaded (core dumps after two soaks). Later updates are ignored."""
        self._closed.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        with self._lock:
            self._flush()
            for metric in self._metrics:
                metric.release()
            self._metrics.clear()
            self._families.clear()
            self._before_flush.clear()

    def before_flush(self, hook: Callable[[], None]) -> None:
        """Call `hook` before each hand-over (with the lock held; it may set and observe, never block): for values
        that change far more often than they are handed over, set once per flush instead of at each change."""
        self._before_flush.append(hook)

    def _flush(self) -> None:
        for hook in self._before_flush:
            hook()
        for metric in self._metrics:
            metric.flush()

    def counter(self, name: str, description: str, labels: Mapping[str, str]) -> "_Metric":
        return self._metric(name, description, pb_utils.MetricFamily.COUNTER, labels)

    def gauge(self, name: str, description: str, labels: Mapping[str, str]) -> "_Metric":
        return self._metric(name, description, pb_utils.MetricFamily.GAUGE, labels)

    def histogram(self, name: str, description: str, labels: Mapping[str, str], buckets: Iterable[float]) -> "_Metric":
        return self._metric(name, description, pb_utils.MetricFamily.HISTOGRAM, labels, list(buckets))

    def _metric(self, name, description, kind, labels, buckets=None) -> "_Metric":
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            if buckets is None:
                metric = family.Metric(labels=dict(labels))
            else:
                metric = family.Metric(labels=dict(labels), buckets=buckets)
            self._metrics.append(_Metric(metric, family))
            return self._metrics[-1]

    def _flush_every_period(self) -> None:
        while not self._closed.wait(self.FLUSH_S):
            with self._lock:
                self._flush()


class _Metric:
    """One metric's updates since the last flush; only flush() and release() touch Triton (Metrics' lock held)."""

    def __init__(self, metric: Any, family: Any):
        self._metric = metric
        self._family = family  # the family must outlive its metrics
        self._pending = threading.Lock()  # guards the three values below, never held across a pb_utils call
        self._increment = 0.0
        self._value: float | None = None
        self._observations: list[float] = []

    def increment(self, value: float = 1.0) -> None:
        with self._pending:
            self._increment += value

    def set(self, value: float) -> None:
        with self._pending:
            self._value = value

    def observe(self, value: float) -> None:
        with self._pending:
            self._observations.append(value)

    def flush(self) -> None:
        """Hand Triton the increments, the last value and the observations since the previous flush (the caller
        holds the lock)."""
        with self._pending:
            increment, self._increment = self._increment, 0.0
            value, self._value = self._value, None
            observations, self._observations = self._observations, []
        if self._metric is None:
            return
        if increment:
            self._metric.increment(increment)
        if value is not None:
            self._metric.set(value)
        for observation in observations:
            self._metric.observe(observation)

    def release(self) -> None:
        """Drop the metric, then its family (Metrics.close; called with the lock held)."""
        self._metric = None
        self._family = None


class InProcessModels:
    """Calls other models of the repository through the Python backend, in-process (BLS `exec`), on the calling
    thread: the ModelCaller of the in-process transport (bls.transports), and the one-response calls
    (preprocessing, postprocessing) of the relay transport.

    Invariant: streams (exec(decoupled=True)) are only read on one thread, the one that serves requests.
    Triton's Python backend stub (2.51, and python_backend r26.07) deadlocks when one thread returns from
    exec(decoupled=True) while another is woken in a response iterator: the returning thread holds the GIL and
    waits for the stub's iterator-map mutex (Stub::GetResponseIterator), the stub's ParentToStubMQMonitor thread
    holds that mutex and waits for the iterator's own mutex (ProcessBLSResponseDecoupled ->
    ResponseIterator::EnqueueResponse), and the woken thread holds the iterator's mutex while it takes the GIL
    back (ResponseIterator::Next). With one thread no two of these can happen at once. One-response exec does
    not use the iterator map: any thread may call infer().
    """

    # How long a read response iterator is kept before this thread drops it (see _keep_until_cleaned_up).
    ITERATOR_KEEP_S = 30.0

    def __init__(self, decoupled_engines: bool):
        """decoupled_engines: the engines stream (a decoupled repository); otherwise each answers once."""
        self._decoupled_engines = decoupled_engines
        self._streaming_thread: int | None = None
        self._stopped: set[str] = set()  # ids stopped when their stream was left early (see stop())
        self._read_iterators: deque[tuple[float, Any]] = deque()  # (read at, iterator), oldest first

    def infer(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
              request_id: str = "") -> Tensors:
        """One response. The wait (exec) is outside PB_LOCK: a non-decoupled engine takes as long as a whole
        generation, and every other stream of this process would wait behind it for its sends."""
        outputs = list(outputs)
        child = self._request(model_name, inputs, outputs, request_id)
        response = child.exec()
        with PB_LOCK:
            raise_for_error(response, model_name)
            tensors = _copied_outputs(response, outputs)
            del response, child
            return tensors

    def stream_each(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_response: Callable[[Tensors], bool]) -> bool:
        """`on_response` for each response, on this thread; returns when the stream ends: False when on_response
        returned False (the engine request has then been stopped)."""
        responses = self.stream(model_name, inputs, outputs, request_id)
        try:
            for tensors in responses:
                if not on_response(tensors):
                    return False
            return True
        finally:
            responses.close()

    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterator[Tensors]:
        """The responses of an engine request (a non-decoupled engine answers with exactly one). Leaving early
        stops the engine request (a `stop` request: the Python backend of Triton 2.51 cannot cancel a child
        stream), then reads what is left of it: a response iterator dropped unread blocks until its end."""
        outputs = list(outputs)
        if not self._decoupled_engines:
            yield self.infer(model_name, inputs, outputs, request_id)
            return
        self._check_streaming_thread()
        child = self._request(model_name, inputs, outputs, request_id)
        responses = child.exec(decoupled=True)
        ended = False
        try:
            for response in responses:
                with PB_LOCK:
                    if response.has_error():
                        ended = True  # an error response is the stream's last
                    raise_for_error(response, model_name)
                    tensors = _copied_outputs(response, outputs)
                    del response
                if tensors:  # a decoupled model may end with an empty final response
                    yield tensors
            ended = True
        finally:
            if not ended:
                try:
                    self._send_stop(model_name, request_id)
                    self._stopped.add(request_id)
                except ModelStepError as error:  # the reason we left stays the error that surfaces
                    log.warning("could not stop engine request %s: %s", request_id, error)
                for _ in responses:
                    pass
            self._keep_until_cleaned_up(responses)
            del responses, child

    def _keep_until_cleaned_up(self, responses: Any) -> None:
        """Keep a read response iterator for ITERATOR_KEEP_S, then drop it here, on the streaming thread.

        The stub keeps its own reference to every iterator in a map, which its ServiceStubToParentRequests thread
        erases after the last response (Stub::SendCleanupId, python_backend r24.10 to r26.07), without the GIL. If
        that reference is the last one, the iterator dies on that thread, and with it every response it read and
        their numpy arrays: Python frees without the GIL, which corrupts the allocator of the thread running Python
        (256-client soak, in-process BLS: "malloc(): unaligned fastbin chunk detected", a core in pymalloc_alloc
        with that thread just past the erase). Kept here until the erase has long happened, the last reference is
        this thread's, which holds the GIL."""
        now = time.monotonic()
        self._read_iterators.append((now, responses))
        while self._read_iterators and self._read_iterators[0][0] < now - self.ITERATOR_KEEP_S:
            self._read_iterators.popleft()

    def stop(self, model_name: str, request_id: str) -> None:
        """Stop a child generation (a `stop` request for its id, the tensorrtllm backend's documented way), unless
        its stream was left early, which stopped it already."""
        if request_id in self._stopped:
            self._stopped.discard(request_id)
            return
        self._send_stop(model_name, request_id)

    def _send_stop(self, model_name: str, request_id: str) -> None:
        for _ in self.stream(model_name, stop_request_inputs(), ["output_ids"], request_id):
            pass

    def release_read_iterators(self) -> None:
        """Drop every kept iterator now (finalize, on the thread that streams): left to the stub's exit, their
        destruction would reach a server that has already unloaded the model (a tritonserver SIGSEGV in
        libtriton_python at shutdown, seen once in make test)."""
        self._read_iterators.clear()

    def _check_streaming_thread(self) -> None:
        thread = threading.get_ident()
        if self._streaming_thread is None:
            self._streaming_thread = thread
        elif self._streaming_thread != thread:
            raise RuntimeError("engine streams read on a second thread: the stub can deadlock (InProcessModels)")

    @staticmethod
    def _request(model_name: str, inputs: Mapping[str, np.ndarray], outputs: list[str], request_id: str) -> Any:
        with PB_LOCK:
            return pb_utils.InferenceRequest(
                model_name=model_name,
                inputs=[pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()],
                requested_output_names=outputs,
                request_id=request_id,
            )


def stop_request_inputs() -> Tensors:
    """The inputs of a `stop` request (the engine matches it to the running request by request id)."""
    return {
        "input_ids": np.zeros((1, 1), np.int32),
        "input_lengths": np.ones((1, 1), np.int32),
        "request_output_len": np.ones((1, 1), np.int32),
        "stop": np.array([[True]]),
    }


def _copied_outputs(response: Any, names: Iterable[str]) -> Tensors:
    """The named outputs of a child response, copied: no array outlives the response's shared memory outside
    PB_LOCK (the caller holds it)."""
    tensors = {}
    for name in names:
        value = output_tensor(response, name)
        if value is not None:
            tensors[name] = value.copy()
    return tensors
