"""How tensorrt_llm_bls receives requests, sends responses and reaches the engines: one transport per topology
(engine_build/topology.py), chosen once when the model loads (its `transport` parameter, written by `make repo`).

- RelayTransport (streaming repositories): clients call the C++ model tensorrt_llm_bls, which forwards each request
  to this Python model. Requests run on worker threads (bounded admission: bls.relay.admission), their responses go back
  to the relay as frames (bls.response_loop sends them, merging what waits), engine streams go through the relay
  (bls.relay.engine_streams); one-response calls (preprocessing, postprocessing) are in-process `exec`.
  Cancellation, one way: the relay sees the client leave and tells the connection that claimed the stream, which
  cancels the request's sink; the request's engine calls are then cancelled through the relay (Triton's request
  cancellation, which the tensorrtllm backend and the embedded engine both poll).
- InProcessTransport (unary repositories, DECOUPLED=false): this model is tensorrt_llm_bls itself, a plain
  Python-backend model as NVIDIA's BLS is: each request is served to its end on the thread that called `execute`,
  every model call one `exec` with one response, the response one stub send. A unary request is not cancelled
  half-way: its engine call is one response. Concurrency is the instance count, and Triton's queue bounds
  admission (max_queue_size in the model's dynamic_batching).

Neither needs the server's network endpoints.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from bls.contract import ModelContract
from bls.errors import InvalidRequest
from bls.relay.admission import RequestPool
from bls.relay.connection import RelayConnection, RelayConnections
from bls.relay.engine_streams import RelayedEngineStreams
from bls.relay.frames import RelayedRequest
from bls.response_loop import Merge, ResponseLoop
from bls.triton_io.children import InProcessModels
from bls.triton_io.lock import PB_LOCK
from bls.triton_io.requests import read_inputs, request_parameters
from bls.triton_io.senders import RelayedSender, StubSender

Tensors = dict[str, np.ndarray]
log = logging.getLogger(__name__)
# serve(inputs, request_id, sink, arrived): one request to its end; every response, the final one included, goes
# through `sink`. `request_id` is unique per request (child requests are stopped by id); `arrived` is
# time.monotonic() when Triton handed the request over.
Serve = Callable[[Tensors, str, Any, float], None]

# Threads that send what the relay transport's other threads queue (bls.response_loop); the connection's reader
# thread sends what each read of engine responses queued itself.
SENDING_THREADS = 4


def unique_request_id(triton_request_id: str) -> str:
    """The id of a request's engine calls: the client's id, made unique (clients reuse ids)."""
    suffix = uuid.uuid4().hex[:12]
    return f"{triton_request_id}-{suffix}" if triton_request_id else uuid.uuid4().hex


class InProcessTransport:
    """Serves each request to its end on the calling thread: Triton's `execute` thread (see the module docstring)."""

    def __init__(self, model_name: str, contract: ModelContract):
        self._model_name = model_name
        self._contract = contract
        self.models = InProcessModels()
        self.row_pool: Executor | None = None  # a batch's rows one after another, on the execute thread

    def execute(self, requests: list[Any], serve: Serve) -> None:
        arrived = time.monotonic()
        for request in requests:
            sink = UnarySink(StubSender(request, self._model_name))
            try:
                with PB_LOCK:
                    inputs = read_inputs(request, self._contract)
                    request_id = unique_request_id(request.request_id())
                serve(inputs, request_id, sink, arrived)
            except Exception as error:  # noqa: BLE001 - every failure becomes this request's error, never the server's
                sink.send_error(error)
            finally:
                sink.close()

    def close(self, wait_s: float) -> list[str]:
        """Unload: nothing to wait for; every request ended inside `execute`, which Triton never runs beside
        finalize."""
        return []


class UnarySink:
    """A unary request's one response, sent through the stub. Nothing cancels it half-way (module docstring)."""

    def __init__(self, sender: StubSender):
        self._sender = sender

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        self._sender.send(outputs, final)

    def send_error(self, error: BaseException) -> None:
        self._sender.send_error(error)

    def is_cancelled(self) -> bool:
        return self._sender.closed

    def close(self) -> None:
        """The request has ended: the stream ends too if nothing ended it (no-op otherwise)."""
        self._sender.finish()


class RelayTransport:
    """Requests relayed by the C++ model tensorrt_llm_bls, served on worker threads (see the module docstring)."""

    def __init__(self, model_name: str, contract: ModelContract, workers: int, queued: int, merge: Merge):
        self._model_name = model_name
        self._contract = contract
        self._merge = merge
        self.responses = ResponseLoop(threads=SENDING_THREADS)
        # Engine responses read from the relay connection are sent on its reader thread, a read's at once.
        self.relays = RelayConnections(after_sweep=self._send_waiting)
        self._connection: RelayConnection | None = None
        self._connection_lock = threading.Lock()
        self.engine = RelayedEngineStreams(self._relay_connection)
        self.models = RelayModels(InProcessModels(), self.engine)
        self.requests = RequestPool(workers, queued, "bls")
        self.row_pool: Executor | None = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bls-row")

    def execute(self, requests: list[Any], serve: Serve) -> None:
        arrived = time.monotonic()
        for request in requests:
            with PB_LOCK:
                relayed = RelayedRequest.from_parameters(request_parameters(request))
            if relayed is None:
                StubSender(request, self._model_name).send_error(InvalidRequest(
                    "model", f"this model serves only requests relayed by {self._model_name}: call {self._model_name}"))
                continue
            connection = self.relays.get(relayed.socket_name)
            with self._connection_lock:
                self._connection = connection
            sink = self.responses.open(RelayedSender(request, self._model_name, relayed, connection), self._merge)
            try:
                connection.claim(relayed, sink.cancel)  # the relay's word that the client has gone cancels the sink
            except OSError as error:  # nothing this request sends can reach its client: it stops at its first check
                connection.release(relayed.stream)
                log.warning("%s: the relay cannot be reached (%s); request %s stops", self._model_name, error,
                            relayed.stream)
                sink.cancel()
            self.requests.submit(partial(self._serve, request, sink, serve, arrived), sink.send_error)

    def _serve(self, request: Any, sink: Any, serve: Serve, arrived: float) -> None:
        try:
            with PB_LOCK:  # pb_utils calls, on a worker thread
                inputs = read_inputs(request, self._contract)
                request_id = unique_request_id(request.request_id())
            # The client has gone: its engine streams end now, not at the engine's next response.
            sink.when_cancelled(lambda: self.engine.cancel(request_id))
            serve(inputs, request_id, sink, arrived)
        except Exception as error:  # noqa: BLE001 - every failure becomes this request's error, never the server's
            sink.send_error(error)

    def _relay_connection(self) -> RelayConnection:
        with self._connection_lock:
            if self._connection is None:  # engine calls come from requests, which bring the connection
                raise RuntimeError("no relay connection yet")
            return self._connection

    def _send_waiting(self) -> None:
        """What a read of engine responses queued goes out, its frames to the relay in one write (RelayConnection)."""
        with self.relays.corked():
            self.responses.send_waiting()

    def close(self, wait_s: float) -> list[str]:
        """Unload: every queued and running request gets a final response (running ones up to wait_s to finish,
        then their engine calls are cancelled), and what waits to be sent goes. Returns warnings for the log."""
        warnings = []
        cut_short = self.requests.shutdown(wait_s, self.engine.cancel_all)
        self.row_pool.shutdown(wait=False)
        if cut_short:
            warnings.append(f"unloading ended {cut_short} requests with an error")
        if not self.responses.close(wait_s):
            warnings.append("unloading before every response was sent")
        self.relays.close()
        return warnings


class RelayModels:
    """The relay transport's ModelCaller: engine streams through the relay, one-response calls in-process."""

    def __init__(self, in_process: InProcessModels, engine: RelayedEngineStreams):
        self._in_process = in_process
        self._engine = engine

    def infer(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
              request_id: str = "") -> Tensors:
        return self._in_process.infer(model_name, inputs, outputs, request_id)

    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterator[Tensors]:
        return self._engine.stream(model_name, inputs, outputs, request_id)

    def stream_each(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_response: Callable[[Tensors], bool]) -> bool:
        return self._engine.stream_each(model_name, inputs, outputs, request_id, on_response)
