"""Engine streams over this server's HTTP `generate_stream` endpoint: the BLS's per-token path.

Why HTTP for the common case: a Python process reading engine streams over gRPC spends 150-215 µs of CPU per
streamed token (grpcio's asyncio API costs the same); reading Triton's server-sent events from a socket costs
55-70 µs with a thread per stream, less with one thread reading them all (GenerateStreams says why; `make bench
--only streaming` measures both transports). The generate endpoint converts JSON to tensors by the
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

import json
import logging
import selectors
import socket
import threading
import time
from typing import Callable, Mapping

import numpy as np

from bls.contract import TENSORRT_LLM

Tensors = dict[str, np.ndarray]

# Outputs this path can give back with their shapes (beam width 1: output_ids [1, 1, len], sequence_length
# [1, 1]); a request that wants any other output goes over gRPC, which keeps every output's shape.
CARRIED_OUTPUTS = frozenset({"output_ids", "sequence_length"})
_INPUT_DIMS = {spec.name: (-1, *spec.dims) for spec in TENSORRT_LLM.inputs}  # with the batch dim
_JSON_KINDS = "biuf"  # bool, int, uint, float (not float16: Triton's JSON has no FP16 or BF16, either way)
_MAX_LINE = 1 << 16
_RECV_BYTES = 1 << 16
log = logging.getLogger(__name__)


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


class MisdeliveredEvent(EventStreamError):
    """An event of another request arrived on this stream's connection.

    Triton's generate endpoint answers with the request's "id" in every event. Never seen (a soak's odd first
    bytes turned out to be a stream's own event sent before its headers: docs/operations.md); a guard, so that a
    stream ends with this error rather than hand someone else's tokens on."""


class EngineSilent(EventStreamError):
    """A stream that had started sent nothing for GenerateStreams.SILENCE_S.

    An engine streams a response per step (milliseconds on a GPU), so a stream silent that long has lost a
    response on the way: Triton's HTTP frontend (2.51 up to 26.07) drops responses when an HTTP thread's queue is
    full (docs/operations.md, "HTTP responses dropped under load"). Its client gets this error, not a hang."""


class Disconnected(ConnectionError):
    """The connection broke or was shut down (by stop()) before the stream's end."""


class GenerateStreams:
    """generate_stream calls to one HTTP endpoint over keep-alive connections, every open stream read by one
    thread (the reader) that runs each stream's `on_event` itself.

    Why one reader: with a blocking reader thread per stream, every engine event woke a thread that then had to
    win the GIL, 60-75 µs of CPU an event in this process; one thread that waits on all the sockets at once and,
    while several streams are sending, reads at most once per SWEEP_S pays one wake-up for every event that
    arrived in the meantime (a minimal reader, 16 streams on 2 cores: 67-85 µs an event woken per event, 43-50 µs
    with 1-2 ms sweeps). The cost: under load an event waits up to SWEEP_S longer (a GPU step is 10-50 ms).
    `after_sweep`, when given, runs on the reader after each sweep that read from a stream: the BLS sends there what
    the sweep's events queued (bls.response_loop.ResponseLoop.send_waiting).
    """

    SWEEP_S = 0.002
    IDLE_S = 2.0  # a kept-alive connection unused this long is closed
    SILENCE_S = 60.0  # a stream that has started and then sends nothing this long ends with EngineSilent
    CHECK_S = 1.0  # how often the reader looks for silent streams

    def __init__(self, host: str, port: int, after_sweep: Callable[[], None] | None = None):
        self.host, self.port = host, port
        self._after_sweep = after_sweep
        self._lock = threading.Lock()
        self._idle: list[tuple[float, socket.socket]] = []  # (since when, connection), newest last
        self._arriving: list[HttpStream] = []  # opened, for the reader to register
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        self._reader = threading.Thread(target=self._read_forever, name="engine-http-reader", daemon=True)
        self._reader.start()

    def open(self, model_name: str, body: bytes, on_event: Callable[[dict], bool],
             on_open: Callable[["HttpStream"], None] | None = None,
             on_end: Callable[[], None] | None = None, request_id: str = "") -> "HttpStream":
        """Send one generate_stream request; its data events go to `on_event(event)` on the reader thread, which
        must not block: returning False ends the stream there (its connection is closed: Triton cancels the
        request). `on_open(stream)` is called once connected, before the request is sent, so that another thread
        can stop() it; `on_end()` once the stream has ended, on the reader thread. `request_id`, the "id" in
        `body`, is checked against every event's (MisdeliveredEvent). Raises Disconnected when the endpoint
        cannot be reached."""
        stream = HttpStream(self, _request_bytes(self.host, self.port, model_name, body), on_event, on_end,
                            request_id)
        sock, reused = self._connection()
        stream._use(sock, reused)
        if on_open is not None:
            on_open(stream)
        try:
            sock.sendall(stream._request)
        except OSError as error:
            if not reused:
                stream._finish(Disconnected(str(error)), reusable=False)
                raise Disconnected(str(error)) from error
            stream._send_again()  # the server closed this idle connection: once more on a new one
        stream._sock.setblocking(False)
        with self._lock:
            self._arriving.append(stream)
        self._wake_writer.send(b"\0")
        return stream

    def _connection(self) -> tuple[socket.socket, bool]:
        """An idle connection (reused: True) or a new one. An idle connection with something to read has been
        closed by the server (or holds bytes nobody asked for) and is dropped."""
        while True:
            with self._lock:
                sock = self._idle.pop()[1] if self._idle else None
            if sock is None:
                return self._new_connection(), False
            try:
                sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return sock, True  # nothing to read: still open
            except OSError:
                pass
            sock.close()

    def _new_connection(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port))
        except OSError as error:
            raise Disconnected(str(error)) from error
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _release(self, sock: socket.socket, reusable: bool) -> None:
        if reusable:
            sock.setblocking(True)
            with self._lock:
                self._idle.append((time.monotonic(), sock))
        else:
            sock.close()

    def _close_idle(self, idle_s: float) -> None:
        """Close connections idle for idle_s or longer (the reader, between sweeps): tritonserver's shutdown waits
        for every open HTTP connection, and would otherwise wait out --exit-timeout-secs for this pool's."""
        deadline = time.monotonic() - idle_s
        with self._lock:
            stale = [sock for since, sock in self._idle if since <= deadline]
            self._idle = [(since, sock) for since, sock in self._idle if since > deadline]
        for sock in stale:
            sock.close()

    # -- the reader thread ---------------------------------------------------------------------------------
    def _read_forever(self) -> None:
        next_check = time.monotonic() + self.CHECK_S
        while True:
            swept = time.monotonic()
            streams = len(self._selector.get_map()) > 1  # besides the wake-up socket
            ready = self._selector.select(self.CHECK_S if streams else self.IDLE_S if self._idle else None)
            if self._idle:
                self._close_idle(self.IDLE_S)
            if streams and time.monotonic() >= next_check:
                next_check = time.monotonic() + self.CHECK_S
                self._end_silent_streams()
            for key, _ in ready:
                stream = key.data
                try:
                    if stream is None:
                        self._register_arrivals()
                    else:
                        stream._read()  # ends its stream on any error of its own
                except Exception:  # noqa: BLE001 - this thread reads every stream of the process: it must go on
                    log.exception("the engine stream reader failed on one stream")
                    if stream is not None:
                        stream._finish(Disconnected("the engine stream reader failed; see the log"), reusable=False)
            if self._after_sweep is not None and any(key.data is not None for key, _ in ready):
                try:
                    self._after_sweep()
                except Exception:  # noqa: BLE001 - as above: the reader must go on
                    log.exception("the engine stream reader's after-sweep call failed")
            # Under load (several streams had something), let the next events gather; a lone stream (a
            # speculative round's engine calls, one request on an idle server) is read at once.
            pause = swept + self.SWEEP_S - time.monotonic()
            if len(ready) > 1 and pause > 0:
                time.sleep(pause)

    def _end_silent_streams(self) -> None:
        now = time.monotonic()
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                key.data._end_if_silent(now, self.SILENCE_S)

    def _register_arrivals(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            arriving, self._arriving = self._arriving, []
        for stream in arriving:
            try:
                stream._register()
            except Exception as error:  # noqa: BLE001 - that stream ends; the others are registered
                stream._finish(Disconnected(f"could not wait for its response: {error}"), reusable=False)

    def _register(self, stream: "HttpStream") -> None:
        self._selector.register(stream._sock, selectors.EVENT_READ, stream)

    def _unregister(self, stream: "HttpStream") -> None:
        try:
            self._selector.unregister(stream._sock)
        except (KeyError, ValueError):
            pass  # not registered yet (it ended before the reader saw it arrive)


class HttpStream:
    """One generate_stream call, read by GenerateStreams' reader thread."""

    def __init__(self, streams: GenerateStreams, request: bytes, on_event: Callable[[dict], bool],
                 on_end: Callable[[], None] | None, request_id: str = ""):
        self._streams = streams
        self._request = request
        self._request_id = request_id
        self._on_event = on_event
        self._on_end = on_end
        self._lock = threading.Lock()  # guards _sock's life against stop() from other threads
        self._sock: socket.socket | None = None
        self._reused = False
        self._received = 0
        self._event_count = 0  # data events handed on
        self._last_data = time.monotonic()  # when bytes last arrived (reader thread)
        self._response = ResponseReader()
        self._done = threading.Event()
        self._ended = False
        self._stopped = False
        self._outcome: BaseException | bool | None = None  # True: read to the end; False: on_event stopped it

    def wait(self) -> bool:
        """Block until the stream ends: True when it was read to its end, False when on_event stopped it. Raises
        EventStreamError (a refusal or an error event), Disconnected, or what on_event raised."""
        self._done.wait()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return bool(self._outcome)

    def stop(self) -> None:
        """Break the stream from any thread: it ends with Disconnected, and Triton cancels the request."""
        with self._lock:
            self._stopped = True
            if not self._ended and self._sock is not None:
                _shut(self._sock)

    def _use(self, sock: socket.socket, reused: bool) -> None:
        with self._lock:
            self._sock, self._reused, self._received = sock, reused, 0
            if self._stopped:
                _shut(sock)

    def _send_again(self) -> None:
        """On a new connection (the server closed the reused one before answering): on the opening thread, or
        rarely on the reader thread, which then waits for a loopback connect."""
        with self._lock:
            old = self._sock
            stopped = self._stopped or self._ended
        old.close()
        if stopped:
            self._finish(Disconnected("stopped before the request was sent"), reusable=False)
            raise Disconnected("stopped before the request was sent")
        try:
            sock = self._streams._new_connection()
            self._use(sock, False)
            sock.sendall(self._request)
        except OSError as error:
            self._finish(Disconnected(str(error)), reusable=False)
            raise Disconnected(str(error)) from error

    def _register(self) -> None:
        with self._lock:
            if self._ended:
                return
        self._streams._register(self)

    def _end_if_silent(self, now: float, silence_s: float) -> None:
        """End with EngineSilent when the stream has started and nothing arrived for silence_s (reader thread)."""
        if not self._event_count or now - self._last_data <= silence_s:
            return
        log.error("engine request %s: no event for %.0f s after %d events; ending the stream with an error",
                  self._request_id, now - self._last_data, self._event_count)
        self._finish(EngineSilent(
            f"no event for {silence_s:g} s after {self._event_count} events (a response lost on the way: "
            "tritonserver's HTTP frontend drops responses when an HTTP thread's queue is full; see "
            "docs/operations.md)"), reusable=False)

    def _read(self) -> None:
        """Read what is there and hand its events on (reader thread)."""
        try:
            data = self._sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError as error:
            data, broken = b"", error
        else:
            broken = None
        try:
            if not data:
                if self._reused and not self._received and broken is None and not self._stopped:
                    # The server closed the reused idle connection without reading the request: send it again.
                    self._streams._unregister(self)
                    self._send_again()
                    self._sock.setblocking(False)
                    self._streams._register(self)
                    return
                self._finish(self._response.at_close(broken), reusable=False)
                return
            self._received += len(data)
            self._last_data = time.monotonic()
            for payload in self._response.feed(data):
                try:
                    event = json.loads(payload)
                except ValueError as error:
                    raise EventStreamError(f"an event that is not JSON ({error}): {payload[:200]!r}") from None
                if "error" in event:
                    raise EventStreamError(str(event["error"]))
                if self._request_id and event.get("id") != self._request_id:
                    log.error("engine request %s: an event of request %r arrived on its connection; the stream "
                              "ends with an error", self._request_id, event.get("id"))
                    raise MisdeliveredEvent(f"an event of request {event.get('id')!r} arrived on the stream of "
                                            f"request {self._request_id!r}")
                self._event_count += 1
                if self._on_event(event) is False:
                    self._finish(False, reusable=False)  # closing the connection cancels the request in Triton
                    return
            if self._response.complete:
                error = self._response.refusal()
                self._finish(error or True, reusable=error is None and self._response.reusable)
        except BaseException as error:  # noqa: BLE001 - it ends this stream, never the reader
            self._finish(error, reusable=False)

    def _finish(self, outcome: BaseException | bool, reusable: bool) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            sock = self._sock
            reusable = reusable and not self._stopped  # stop() may have shut it down as the stream ended
        if sock is not None:
            self._streams._unregister(self)
            self._streams._release(sock, reusable)
        self._outcome = outcome
        self._done.set()
        if self._on_end is not None:
            self._on_end()


class ResponseReader:
    """An HTTP/1.1 response to generate_stream, parsed as its bytes arrive: the data of each server-sent event
    of a chunked 200 response; the body of any other (a refusal). http.client cannot be used: its chunked reading
    ends a body the same way whether the last chunk came or the connection broke."""

    def __init__(self) -> None:
        self._buffer = b""
        self._state = "head"
        self.status = 0
        self._chunked = False
        self._length: int | None = None
        self._chunk_size = 0
        self._pending = b""  # event text not ended by a blank line yet
        self._body = b""  # a refusal's body
        self.complete = False
        self.reusable = True

    def feed(self, data: bytes) -> list[bytes]:
        """The data of the events that `data` completes."""
        self._buffer += data
        events: list[bytes] = []
        while not self.complete:
            if self._state == "head":
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > _MAX_LINE:
                        raise Disconnected("a response head over 64 KiB")
                    break
                self._head(self._buffer[:end].decode("latin-1"))
                self._buffer = self._buffer[end + 4:]
            elif self._state == "size":
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    break
                self._chunk_size = int(self._buffer[:end].split(b";", 1)[0], 16)
                self._buffer = self._buffer[end + 2:]
                self._state = "chunk" if self._chunk_size else "trailer"
            elif self._state == "chunk":
                if len(self._buffer) < self._chunk_size + 2:
                    break
                chunk = self._buffer[:self._chunk_size]
                self._buffer = self._buffer[self._chunk_size + 2:]
                self._state = "size"
                if self.status == 200:
                    events += self._events(chunk)
                else:
                    self._body += chunk
            elif self._state == "trailer":
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    break
                self._buffer = self._buffer[end + 2:]
                self.complete = end == 0  # Triton sends no trailers; any would end with an empty line
            else:  # "length": a body of Content-Length bytes
                self._body += self._buffer
                self._buffer = b""
                self.complete = len(self._body) >= self._length
                break
        if self.complete and self._buffer:
            self.reusable = False  # bytes nobody asked for: not a connection to send anything else on
        return events

    def refusal(self) -> EventStreamError | None:
        """The error of a complete response other than 200."""
        return None if self.status == 200 else EventStreamError(_error_message(self._body))

    def at_close(self, broken: OSError | None) -> BaseException:
        """What the connection's end before `complete` means."""
        if self.status not in (0, 200) and self._length is None and not self._chunked:
            return EventStreamError(_error_message(self._body))  # a refusal whose body ends with the connection
        reason = f" ({broken})" if broken else ""
        return Disconnected(f"the connection closed before the stream's end{reason}")

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise Disconnected(f"not an HTTP response: {status_line[:100]!r}")
        self.status = int(parts[1])
        for line in lines:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "transfer-encoding":
                self._chunked = "chunked" in value
            elif name == "content-length":
                self._length = int(value)
            elif name == "connection" and value == "close":
                self.reusable = False
        if self._chunked:
            self._state = "size"
        elif self.status == 200:
            raise Disconnected("generate_stream answered without chunked transfer encoding")
        elif self._length is not None:
            self._state = "length"
            self.complete = self._length == 0
        else:
            self._state = "length"
            self._length = 1 << 62  # until the connection closes (at_close)
            self.reusable = False

    def _events(self, chunk: bytes) -> list[bytes]:
        *events, self._pending = (self._pending + chunk).split(b"\n\n")
        return [line[5:] for event in events for line in event.split(b"\n") if line.startswith(b"data:")]


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already broken or closed


def _request_bytes(host: str, port: int, model_name: str, body: bytes) -> bytes:
    return (f"POST /v2/models/{model_name}/generate_stream HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def _error_message(payload: bytes) -> str:
    text = payload.decode(errors="replace").strip()
    if text.startswith("data:"):  # a stream whose first response is an error: its status says so, its body is SSE
        text = text[5:]
    try:
        return str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        return text[:500]
