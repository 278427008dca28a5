"""Engine streams over this server's HTTP `generate_stream` endpoint: the BLS's per-token path.

Why HTTP for the common case: a Python process reading engine streams over gRPC spends 150-215 µs of CPU per
streamed token (grpcio's asyncio API costs the same); reading Triton's server-sent events from a socket costs
55-70 µs (`make bench --only streaming` measures both). The generate endpoint converts JSON to tensors by the
engine's own config (Triton's http_server.cc, GenerateRequestClass::ExactMappingInput): a value's elements
fill the innermost dynamic dim, other dynamic dims are 1, so a request is carried exactly only when every
input has that shape; and it cannot choose outputs: every output is requested, and what the engine sends comes
back, one-element tensors as JSON scalars. The tensorrtllm backend (1.2, model_instance_state.cc
fillTritonResponse) sends a requested output only when the request asked the executor for it (log probs,
logits, token counts, perf metrics), so a plain request still gets output_ids and sequence_length only; the
embedded engine does the same. `carries()` says which requests it carries exactly; the rest go over gRPC
(bls.engine_streams). The request id travels in the body's "id" (Triton 2.49+).

Closing the connection is how an HTTP client cancels: Triton cancels the request, which the tensorrtllm backend
polls (cancellation_check_period_ms) and the embedded engine checks between steps.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import BinaryIO, Callable, Iterator, Mapping

import numpy as np

from bls.contract import TENSORRT_LLM

Tensors = dict[str, np.ndarray]

# Outputs this path can give back with their shapes (beam width 1: output_ids [1, 1, len], sequence_length
# [1, 1]); a request that wants any other output goes over gRPC, which keeps every output's shape.
CARRIED_OUTPUTS = frozenset({"output_ids", "sequence_length"})
_INPUT_DIMS = {spec.name: (-1, *spec.dims) for spec in TENSORRT_LLM.inputs}  # with the batch dim
_JSON_KINDS = "biuf"  # bool, int, uint, float (not float16: Triton's JSON has no FP16 or BF16, either way)
_MAX_LINE = 1 << 16


def carries(inputs: Mapping[str, np.ndarray], outputs: frozenset[str]) -> bool:
    """Whether generate_stream carries this request exactly: every input's shape is the one the endpoint
    derives from its element count, every dtype has a JSON form, and only CARRIED_OUTPUTS are wanted."""
    if not outputs <= CARRIED_OUTPUTS:
        return False
    beam_width = inputs.get("beam_width")
    if beam_width is not None and int(np.asarray(beam_width).reshape(-1)[0]) != 1:
        return False
    for name, value in inputs.items():
        dims = _INPUT_DIMS.get(name)
        if dims is None or value.size == 0 or tuple(value.shape) != _generate_shape(dims, value.size):
            return False
        if value.dtype == np.object_:
            if not all(isinstance(item, bytes) and _is_utf8(item) for item in value.flat):
                return False
        elif value.dtype.kind not in _JSON_KINDS or value.dtype == np.float16:
            return False
        elif value.dtype.kind == "f" and not np.isfinite(value).all():  # JSON has no NaN or infinity
            return False
    return True


def _generate_shape(dims: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """The shape Triton's generate endpoint gives `count` elements of an input with config `dims`."""
    fixed = 1
    for dim in dims:
        if dim != -1:
            fixed *= dim
    if count % fixed:
        return None
    rest = count // fixed
    shape = []
    for dim in reversed(dims):
        if dim == -1:
            shape.append(rest)
            rest = 1
        else:
            shape.append(dim)
    return tuple(reversed(shape)) if rest == 1 else None


def _is_utf8(item: bytes) -> bool:
    try:
        item.decode()
    except UnicodeDecodeError:
        return False
    return True


def request_body(inputs: Mapping[str, np.ndarray], request_id: str) -> bytes:
    body: dict[str, object] = {"id": request_id} if request_id else {}
    for name, value in inputs.items():
        if value.dtype == np.object_:
            body[name] = [item.decode() for item in value.flat]
        else:
            body[name] = value.reshape(-1).tolist()
    return json.dumps(body).encode()


def tensors(event: Mapping[str, object], wanted: frozenset[str]) -> Tensors:
    """The wanted outputs of one event, shaped as the engine sent them (CARRIED_OUTPUTS, beam width 1)."""
    result = {}
    if "output_ids" in wanted and "output_ids" in event:
        result["output_ids"] = np.array(event["output_ids"], np.int32).reshape(1, 1, -1)
    if "sequence_length" in wanted and "sequence_length" in event:
        result["sequence_length"] = np.array(event["sequence_length"], np.int32).reshape(1, 1)
    return result


class EventStreamError(RuntimeError):
    """The endpoint refused the request or sent an error event; the message is the server's (Triton 2.51 answers
    a model's refusal with 400 whatever its kind, server issue #7804, so the status says nothing more)."""


class Disconnected(ConnectionError):
    """The connection broke or was shut down (by cancel()) before the stream's end."""


class GenerateStreams:
    """Keep-alive connections to one HTTP endpoint, a stream at a time on each (a pool shared by threads)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []

    def events(self, model_name: str, body: bytes,
               on_open: Callable[[http.client.HTTPConnection], None] | None = None) -> Iterator[dict]:
        """The parsed data events of one generate_stream call. `on_open(connection)` is called once the
        connection is up and before the request is sent, so that another thread can shut() it. A stream read to
        its end returns its connection to the pool; one left early (or broken) is closed, which cancels the
        request in Triton."""
        connection, reused = self._connection()
        reusable = False
        try:
            try:
                response = self._post(connection, model_name, body, on_open)
            except (OSError, http.client.HTTPException) as error:
                if not reused:
                    raise Disconnected(str(error)) from error
                # The server closed an idle keep-alive connection: once more on a new one.
                connection.close()
                connection = self._new_connection()
                try:
                    response = self._post(connection, model_name, body, on_open)
                except (OSError, http.client.HTTPException) as error:
                    raise Disconnected(str(error)) from error
            if response.status != 200:
                raise EventStreamError(_error_message(response.read()))
            if not response.chunked:
                raise Disconnected(f"{model_name}: generate_stream answered without chunked transfer encoding")
            for payload in _data_events(response.fp):
                try:
                    event = json.loads(payload)
                except ValueError as error:
                    raise EventStreamError(f"an event that is not JSON ({error}): {payload[:200]!r}") from None
                if "error" in event:
                    raise EventStreamError(str(event["error"]))
                yield event
            response.close()  # leaves the socket open for the next request
            reusable = True
        finally:
            if reusable:
                with self._lock:
                    self._idle.append(connection)
            else:
                connection.close()

    @staticmethod
    def shut(connection: http.client.HTTPConnection) -> None:
        """Break `connection` from another thread: its reader stops at once with Disconnected."""
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    @staticmethod
    def _post(connection: http.client.HTTPConnection, model_name: str, body: bytes,
              on_open: Callable[[http.client.HTTPConnection], None] | None) -> http.client.HTTPResponse:
        if connection.sock is None:
            connection.connect()  # now, so that on_open's caller has a socket to shut down
        if on_open is not None:
            on_open(connection)
        connection.request("POST", f"/v2/models/{model_name}/generate_stream", body,
                           {"Content-Type": "application/json"})
        return connection.getresponse()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (reused: True) or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new_connection(), False

    def _new_connection(self) -> http.client.HTTPConnection:
        # No timeout, as on the gRPC path: a generation may rightly wait long for its next token.
        return http.client.HTTPConnection(self.host, self.port)


def _data_events(body: BinaryIO) -> Iterator[bytes]:
    """The data of each server-sent event of a chunked body, up to its last chunk. http.client's own chunked
    reading cannot be used: it ends a body the same way whether the last chunk came or the connection broke.
    Raises Disconnected when the body stops before its last chunk."""
    pending = b""
    try:
        while True:
            size_line = body.readline(_MAX_LINE)
            if not size_line.endswith(b"\n"):
                raise Disconnected("the connection closed before the stream's end")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                body.readline(_MAX_LINE)  # the CRLF after the last chunk (Triton sends no trailers)
                return
            chunk = body.read(size + 2)  # the chunk and its CRLF
            if len(chunk) != size + 2:
                raise Disconnected("the connection closed inside a chunk")
            pending += chunk[:-2]
            *events, pending = pending.split(b"\n\n")
            for event in events:
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield line[5:]
    except (OSError, ValueError) as error:
        raise Disconnected(str(error)) from error


def _error_message(payload: bytes) -> str:
    text = payload.decode(errors="replace").strip()
    if text.startswith("data:"):  # a stream whose first response is an error: its status says so, its body is SSE
        text = text[5:]
    try:
        return str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        return text[:500]
