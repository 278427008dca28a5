"""Streaming engine requests of the BLS, sent over this server's own HTTP and gRPC endpoints.

Why not `pb_utils.InferenceRequest.exec(decoupled=True)`: Triton's Python backend stub (2.51, and unchanged
in python_backend's main branch up to 2026-07) deadlocks when several threads of one stub use decoupled BLS
at once. Three locks form a cycle: a thread returning from exec(decoupled=True) holds the GIL and waits for
the stub's response-iterator map mutex (Stub::GetResponseIterator); the stub's ParentToStubMQMonitor
thread holds that mutex and waits for one iterator's mutex (ProcessBLSResponseDecoupled ->
ResponseIterator::EnqueueResponse); a thread woken in ResponseIterator::Next holds that iterator's mutex and
waits for the GIL. The 256-client soak hit it within 15 s, and every stream of the process stopped, the
engine's with them (its sends wait for the stuck stub). NVIDIA's BLS serves one request per instance at a
time, which never has two such threads; ours serves hundreds per instance, so its streams go through the
server's own endpoints, whose clients never hold the GIL while they wait. Non-streamed child calls (preprocessing, postprocessing)
stay in-process: exec(decoupled=False) does not touch the iterator map.

Behind the relay (relay/relay.cc) every engine stream goes through it instead, once the process has its connection
(the first relayed request brings it: use_relay): the relay sends the request in-process and writes each response
back on the connection (bls.relay.RelayEngineCall), any inputs and outputs, with Triton's error codes. Without it:

Which endpoint: HTTP `generate_stream` for every request it carries exactly (bls.engine_http: the plain
token stream, about a third of gRPC's CPU per token in this process), gRPC `ModelStreamInfer` for the rest (outputs
such as logits or log probs, FP16 inputs, beam search). Where: the model parameters `engine_http_url` and
`engine_grpc_url` when set, else what the tritonserver process that started this stub was told on its command
line (--http-address/--http-port, --grpc-address/--grpc-port; Triton's defaults 0.0.0.0, 8000 and 8001), so
that a repository needs no setting wherever it is served. A server without HTTP (--allow-http=false) streams
everything over gRPC.
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from bls.contract import TENSORRT_LLM
from bls.engine_http import Disconnected, EventStreamError, GenerateStreams, HttpStream, carries, request_body, tensors
from bls.errors import GenerationCancelled, ModelStepError
from bls.relay import EngineCallError, RelayConnection, RelayEngineCall

Tensors = dict[str, np.ndarray]

_ANY_ADDRESS = ("0.0.0.0", "::", "[::]", "")
# Engine outputs can be large (generation logits): no message size limit on this loopback channel.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
_ENGINE_INPUTS = frozenset(spec.name for spec in TENSORRT_LLM.inputs)
# What an engine's refusal for capacity or unloading says (embedded engine, BLS pool, Triton's own queue).
_UNAVAILABLE_MARKS = ("at capacity", "unloading", "unloaded", "Exceeds maximum queue size", "is not ready",
                      "is not healthy")
# Error kinds by Triton error code (TRITONSERVER_Error_Code), where the code says it; the rest by message.
_KINDS_BY_CODE = {3: "client", 5: "client", 4: "unavailable"}  # INVALID_ARG, UNSUPPORTED, UNAVAILABLE


def endpoints(grpc_url: str, http_url: str, server_pid: int) -> tuple[str, str | None]:
    """(gRPC, HTTP) addresses: the configured ones, else those of tritonserver (process `server_pid`, this
    stub's parent). HTTP is None when that server does not serve it; ValueError when it does not serve gRPC."""
    if grpc_url and http_url:
        return grpc_url, http_url
    argv = Path(f"/proc/{server_pid}/cmdline").read_bytes().decode().split("\0")
    return grpc_url or grpc_url_of(argv), http_url or http_url_of(argv)


def open_files_warning(limits: str, streams: int) -> str | None:
    """A warning when tritonserver's open-file limit (`limits`: the text of /proc/<pid>/limits) leaves less
    than twice `streams` (the BLS streams all its instances may hold at once): each holds an HTTP connection to
    the server, and every client connection takes a file too. Past the limit Triton cannot accept connections."""
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            if soft.isdigit() and int(soft) < 2 * streams:
                return (f"tritonserver may open only {soft} files (ulimit -n), and tensorrt_llm_bls may hold {streams} "
                        f"engine connections at once beside the clients' own: raise the limit (ulimit -n, docker "
                        f"--ulimit nofile=...) or lower max_concurrent_requests")
    return None


def grpc_url_of(argv: list[str]) -> str:
    """Where a tritonserver started with `argv` serves gRPC, as seen from the same host. Raises ValueError
    when it does not serve gRPC at all."""
    url = _endpoint_of(argv, "grpc", "8001")
    if url is None:
        raise ValueError("tritonserver runs with --allow-grpc=false, but tensorrt_llm_bls streams engine requests "
                         "over this server's gRPC endpoint: enable gRPC (it may listen on 127.0.0.1 only)")
    return url


def http_url_of(argv: list[str]) -> str | None:
    """Where a tritonserver started with `argv` serves HTTP, as seen from the same host; None without HTTP."""
    return _endpoint_of(argv, "http", "8000")


def _endpoint_of(argv: list[str], protocol: str, default_port: str) -> str | None:
    options: dict[str, str] = {}
    for index, arg in enumerate(argv):
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            if not equals and index + 1 < len(argv) and not argv[index + 1].startswith("--"):
                value = argv[index + 1]
            options[name] = value
    if options.get(f"allow-{protocol}", "true").lower() in ("false", "0", "no", "off"):
        return None
    address = options.get(f"{protocol}-address", "0.0.0.0")
    host = "127.0.0.1" if address in _ANY_ADDRESS else address
    return f"{host}:{options.get(f'{protocol}-port', default_port)}"


def error_kind(message: str) -> str:
    """The class of an engine error received in a gRPC stream, which carries the message only (Triton's
    stream responses drop the error code): "unavailable" for capacity and unloading refusals, "client"
    when the message names an engine input (how the engines report a bad request), else "internal"."""
    if any(mark in message for mark in _UNAVAILABLE_MARKS):
        return "unavailable"
    if message.split(":", 1)[0].strip() in _ENGINE_INPUTS:
        return "client"
    return "internal"


class EngineStreams:
    """Decoupled requests to the engines, shared by every thread of the process: over HTTP generate_stream
    when it carries the request exactly, else over one gRPC channel."""

    def __init__(self, grpc_url: str, http_url: str | None = None, after_http_sweep: Callable[[], None] | None = None):
        """`after_http_sweep`: see GenerateStreams (what stream_each's on_response queued over HTTP is sent there)."""
        self.grpc_url = grpc_url
        self.http_url = http_url
        self._lock = threading.Lock()
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        host, _, port = (http_url or "").rpartition(":")
        self._http = GenerateStreams(host, int(port), after_http_sweep) if http_url else None
        # Open streams: their request ids and how to break them, for cancel(); keyed by stream, not request
        # id, since a `stop` request reuses its child's id.
        self._open: dict[object, tuple[str, Callable[[], None]]] = {}
        self._cancelled: set[object] = set()
        self._relay: RelayConnection | None = None

    def use_relay(self, connection: RelayConnection) -> None:
        """Send every engine stream through the relay from now on (bls.relay)."""
        self._relay = connection

    def cancel(self, request_id: str) -> None:
        """Cancel, from any thread, the open streams of `request_id` and of its children (ids
        "`request_id`-..."): their readers get GenerationCancelled now, not at the engine's next response,
        and Triton cancels the requests in the engine."""
        with self._lock:
            streams = [(key, stop) for key, (rid, stop) in self._open.items()
                       if rid == request_id or rid.startswith(f"{request_id}-")]
            self._cancelled.update(key for key, _ in streams)
        for _, stop in streams:
            stop()

    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterator[Tensors]:
        """The responses of one request (its last one may be empty), read on the caller's thread. Closing the
        iterator early cancels the request: Triton cancels it in the engine, as it does for any client that goes
        away."""
        wanted = frozenset(outputs)
        if self._relay is not None or (self._http is not None and carries(inputs, wanted)):
            return self._event_stream(model_name, inputs, wanted, request_id)
        return self._grpc_stream(model_name, inputs, wanted, request_id)

    def stream_each(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_response: Callable[[Tensors], bool]) -> bool:
        """Call `on_response` with each response of one request (its last one may be empty) and return when the
        stream ends: True when read to its end, False when on_response returned False, which cancels the request.
        Over HTTP, on_response runs on the one thread that reads every HTTP stream of this process (bls.engine_http:
        one wake-up for many events), so it must not block; over gRPC, on the caller's thread."""
        wanted = frozenset(outputs)
        if self._relay is not None or (self._http is not None and carries(inputs, wanted)):
            with self._call(model_name, inputs, wanted, request_id) as open_stream:
                return open_stream(on_response).wait()
        responses = self._grpc_stream(model_name, inputs, wanted, request_id)
        try:
            for response in responses:
                if not on_response(response):
                    return False
            return True
        finally:
            responses.close()  # cancels the call when on_response stopped it

    def _event_stream(self, model_name: str, inputs: Mapping[str, np.ndarray], wanted: frozenset[str],
                      request_id: str) -> Iterator[Tensors]:
        events: queue.SimpleQueue = queue.SimpleQueue()  # None: the stream has ended
        with self._call(model_name, inputs, wanted, request_id) as open_stream:
            stream = open_stream(lambda response: events.put(response) or True, on_end=lambda: events.put(None))
            while (response := events.get()) is not None:
                yield response
            stream.wait()  # raises how it ended

    @contextmanager
    def _call(self, model_name: str, inputs: Mapping[str, np.ndarray], wanted: frozenset[str], request_id: str):
        """Gives a function that opens one engine stream, through the relay or over HTTP, registered for cancel();
        its responses go to `on_response(tensors)` on the thread that reads them. Maps how the stream ended to our
        errors, and stops it (the engine request is cancelled) when the caller leaves before its end."""
        opened: list[HttpStream | RelayEngineCall] = []
        relay = self._relay

        def register(stream: HttpStream | RelayEngineCall) -> None:
            opened.append(stream)
            with self._lock:
                self._open[stream] = (request_id, stream.stop)

        def open_stream(on_response: Callable[[Tensors], bool],
                        on_end: Callable[[], None] | None = None) -> HttpStream | RelayEngineCall:
            if relay is not None:
                return relay.call_engine(model_name, inputs, wanted, request_id,
                                         lambda found: on_response({k: v for k, v in found.items() if k in wanted}),
                                         on_end, register)
            return self._http.open(model_name, request_body(inputs, request_id),
                                   lambda event: on_response(tensors(event, wanted)), register, on_end, request_id)

        try:
            yield open_stream
        except EngineCallError as error:
            kind = _KINDS_BY_CODE.get(error.code) or error_kind(str(error))
            raise ModelStepError(model_name, str(error), kind=kind) from None
        except EventStreamError as error:
            raise ModelStepError(model_name, str(error), kind=error_kind(str(error))) from None
        except Disconnected as error:
            with self._lock:
                cancelled = any(stream in self._cancelled for stream in opened)
            if cancelled:
                raise GenerationCancelled(request_id) from None
            if relay is not None:
                raise ModelStepError(model_name, f"lost the relay ({error})", kind="unavailable") from None
            raise ModelStepError(model_name, f"lost this server's HTTP endpoint at {self.http_url} ({error}); set "
                                             "the tensorrt_llm_bls parameter engine_http_url to where tritonserver "
                                             "serves HTTP", kind="unavailable") from None
        finally:
            for stream in opened:
                stream.stop()  # no-op once it has ended
                with self._lock:
                    self._open.pop(stream, None)
                    self._cancelled.discard(stream)

    def _grpc_stream(self, model_name: str, inputs: Mapping[str, np.ndarray], wanted: frozenset[str],
                     request_id: str) -> Iterator[Tensors]:
        request = _infer_request(model_name, inputs, sorted(wanted), request_id)
        # One request, then the client half-closes: the call ends after the request's final response.
        call = self._service().ModelStreamInfer(iter([request]))
        with self._lock:
            self._open[call] = (request_id, call.cancel)
        try:
            for response in call:
                if response.error_message:
                    raise ModelStepError(model_name, response.error_message, kind=error_kind(response.error_message))
                yield _tensors(response.infer_response, wanted)
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.CANCELLED:
                if call in self._cancelled:
                    raise GenerationCancelled(request_id) from None
                return
            detail = error.details() or str(code)
            if code == grpc.StatusCode.UNAVAILABLE:
                raise ModelStepError(model_name, f"cannot reach this server's gRPC endpoint at {self.grpc_url} ({detail}); "
                                                 "set the tensorrt_llm_bls parameter engine_grpc_url to where "
                                                 "tritonserver serves gRPC",
                                     kind="unavailable") from None
            raise ModelStepError(model_name, detail, kind=error_kind(detail)) from None
        finally:
            call.cancel()  # no-op once the call has ended; stops the engine when the caller stopped early
            with self._lock:
                del self._open[call]
                self._cancelled.discard(call)

    def _service(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        # Connected at first use: tritonserver opens its gRPC endpoint only after every model has loaded.
        with self._lock:
            if self._stub is None:
                self._stub = service_pb2_grpc.GRPCInferenceServiceStub(
                    grpc.insecure_channel(self.grpc_url, options=_CHANNEL_OPTIONS))
            return self._stub


def _tensors(response: service_pb2.ModelInferResponse, wanted: frozenset[str]) -> Tensors:
    """The outputs named in `wanted`, read straight from the raw contents: this runs once per streamed token,
    and tritonclient's InferResult looks each output up by a scan of the response."""
    tensors = {}
    for output, raw in zip(response.outputs, response.raw_output_contents):
        if output.name in wanted:
            if output.datatype == "BYTES":
                value = deserialize_bytes_tensor(raw)
            else:
                value = np.frombuffer(raw, dtype=triton_to_np_dtype(output.datatype))
            tensors[output.name] = value.reshape(output.shape)
    return tensors


def _infer_request(model_name: str, inputs: Mapping[str, np.ndarray], outputs: list[str],
                   request_id: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    for name, value in inputs.items():
        value = np.ascontiguousarray(value)
        request.inputs.add(name=name, datatype=np_to_triton_dtype(value.dtype), shape=value.shape)
        # serialize_byte_tensor: a 0-d object array holding the length-prefixed bytes (Triton's BYTES layout).
        raw = serialize_byte_tensor(value).item() if value.dtype == np.object_ else value.tobytes()
        request.raw_input_contents.append(raw)
    for name in outputs:
        request.outputs.add(name=name)
    return request
