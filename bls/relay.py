"""The Python half of the relay (relay/): a request that reached tensorrt_llm_bls through the relay has its
responses sent by the relay, inside tritonserver, and not by this process's stub.

The relay forwards the client's request to the Python model with three request parameters: the stream number
(STREAM_PARAMETER), the path of the Unix socket it listens on (SOCKET_PARAMETER, in a directory of its own, 0700)
and the stream's token (TOKEN_PARAMETER). The Python model claims the stream on its connection to that socket,
presenting the token, then writes each response of the request as one frame; the last frame is final (a final
response or an error), and only then does the Python model complete the child request itself. The frames are
laid out in relay/frames.md, the one definition both sides are tested against (tests/fixtures/relay_frames/).
A frame costs a few µs to encode and a share of one write, where a response sent through the stub is a
synchronous round trip to tritonserver (docs/benchmarks.md has both). The relay tells the claiming connection
when a stream's client cancels it, so that the model never asks Triton (a round trip each).

The relay closes a connection that sends anything it may not (relay/frames.md, Rules), which ends every stream
claimed on it. So this side never sends what it cannot vouch for: a request's relay parameters are checked
before anything is claimed (RelayedRequest.from_parameters: the socket is a relay's, in a directory of this
user's that nobody else can enter, and the token is the one the relay's key gives the stream; a client that
calls the Python model directly with made-up parameters is refused there), and frames of a stream that is not
claimed on the current connection are dropped (RelayConnection.write).

The same connection carries the process's engine calls (RelayEngineCall): the relay sends each as an in-process
request to the engine and writes its responses back as frames, which the connection's reader thread hands on, a
burst at a time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

STREAM_PARAMETER = "llama3_relay_stream"
SOCKET_PARAMETER = "llama3_relay_socket"
TOKEN_PARAMETER = "llama3_relay_token"
RELAY_PARAMETERS = (STREAM_PARAMETER, SOCKET_PARAMETER, TOKEN_PARAMETER)

# Frame kinds (relay/frames.md says who writes which).
RESPONSE, FINAL_RESPONSE, ERROR, CLAIM, CANCELLED = 0, 1, 2, 3, 4
ENGINE_REQUEST, ENGINE_CANCEL, ENGINE_RESPONSE, ENGINE_FINAL, ENGINE_ERROR = 5, 6, 7, 8, 9
_STREAM_KINDS = (RESPONSE, FINAL_RESPONSE, ERROR)
MAX_FRAME_BYTES = 1 << 30  # the length field's limit (relay/frames.h kMaxFrameBytes)
TOKEN_BYTES = 16
# The relay's directory: made by mkdtemp with this prefix, holding `socket` and `key` (relay/socket_loop.cc).
_DIRECTORY_PREFIX = "llama3_relay."
_SOCKET_NAME = "socket"
_KEY_NAME = "key"
_KEY_BYTES = 32
# TRITONSERVER_DataType by numpy dtype; BYTES (13) for object and bytes arrays.
_DATATYPES = {
    np.dtype(np.bool_): 1, np.dtype(np.uint8): 2, np.dtype(np.uint16): 3, np.dtype(np.uint32): 4,
    np.dtype(np.uint64): 5, np.dtype(np.int8): 6, np.dtype(np.int16): 7, np.dtype(np.int32): 8,
    np.dtype(np.int64): 9, np.dtype(np.float16): 10, np.dtype(np.float32): 11, np.dtype(np.float64): 12,
}
_BYTES = 13
_NUMPY_TYPES = {code: dtype for dtype, code in _DATATYPES.items()}
_HEADER = struct.Struct("<IQB")  # the length of the rest, the stream, the kind
_LENGTH = struct.Struct("<I")
_RECV_BYTES = 1 << 16
log = logging.getLogger(__name__)
_keys: dict[str, bytes] = {}  # relay directory -> its key, read once


@dataclass(frozen=True)
class RelayedRequest:
    """Where a relayed request's responses go, and the token its claim presents."""

    socket_name: str  # the relay socket's path
    stream: int
    token: bytes

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> RelayedRequest | None:
        """From the request's parameters; None for a request that did not come through the relay, including one
        whose relay parameters the relay did not write (logged): a socket that is not a relay's, or a token that
        is not the stream's."""
        present = [name for name in RELAY_PARAMETERS if name in parameters]
        if not present:
            return None
        try:
            if len(present) != len(RELAY_PARAMETERS):
                raise ValueError(f"only {', '.join(present)} of the relay's parameters")
            path, stream = str(parameters[SOCKET_PARAMETER]), int(parameters[STREAM_PARAMETER])
            token = bytes.fromhex(str(parameters[TOKEN_PARAMETER]))
            if not hmac.compare_digest(token, stream_token(relay_key(path), stream)):
                raise ValueError(f"not the token of stream {stream}")
        except (ValueError, OSError) as error:
            log.warning("a request with relay parameters the relay did not write (%s): not relayed", error)
            return None
        return cls(path, stream, token)


def stream_token(key: bytes, stream: int) -> bytes:
    """A stream's token: HMAC-SHA256(key, stream as u64 little-endian), its first TOKEN_BYTES (relay/token.h)."""
    return hmac.new(key, struct.pack("<Q", stream), hashlib.sha256).digest()[:TOKEN_BYTES]


def relay_key(socket_path: str) -> bytes:
    """The key of the relay listening at `socket_path`, read from its directory once. OSError or ValueError when
    the path is not a relay's socket in a directory that only this user can enter."""
    directory, name = os.path.split(socket_path)
    key = _keys.get(directory)
    if key is not None and name == _SOCKET_NAME:
        return key
    if not os.path.isabs(socket_path) or name != _SOCKET_NAME or \
            not os.path.basename(directory).startswith(_DIRECTORY_PREFIX):
        raise ValueError(f"{socket_path!r} is not a relay's socket")
    _check_private(os.lstat(directory), stat.S_ISDIR, directory)
    descriptor = os.open(os.path.join(directory, _KEY_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_private(os.fstat(descriptor), stat.S_ISREG, os.path.join(directory, _KEY_NAME))
        key = os.read(descriptor, _KEY_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{directory}: the relay's key is {len(key)} bytes, not {_KEY_BYTES}")
    _keys[directory] = key
    return key


def _check_private(status: os.stat_result, is_kind: Callable[[int], bool], path: str) -> None:
    if not is_kind(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & 0o077:
        raise ValueError(f"{path} is not this user's alone (mode {stat.filemode(status.st_mode)}, uid "
                         f"{status.st_uid})")


def encode_tensors(outputs: Mapping[str, np.ndarray]) -> bytes:
    """Tensors (a response's outputs, an engine request's inputs), as a frame carries them."""
    parts = [struct.pack("<H", len(outputs))]
    for name, array in outputs.items():
        array = np.asarray(array)
        if array.dtype == object or array.dtype.kind == "S":
            datatype = _BYTES
            data = b"".join(_LENGTH.pack(len(item)) + item
                            for item in (e.encode() if isinstance(e, str) else bytes(e) for e in array.flat))
        else:
            datatype = _DATATYPES.get(array.dtype)
            if datatype is None:
                raise TypeError(f"output {name}: no Triton datatype for numpy {array.dtype}")
            data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        encoded = name.encode()
        parts.append(struct.pack(f"<H{len(encoded)}sBB{array.ndim}qQ", len(encoded), encoded, datatype, array.ndim,
                                 *array.shape, len(data)))
        parts.append(data)
    return b"".join(parts)


def response_frame(stream: int, encoded_outputs: bytes, final: bool) -> bytes:
    return _HEADER.pack(9 + len(encoded_outputs), stream, FINAL_RESPONSE if final else RESPONSE) + encoded_outputs


def error_frame(stream: int, code: int, message: str) -> bytes:
    body = struct.pack("<I", code) + message.encode()
    return _HEADER.pack(9 + len(body), stream, ERROR) + body


def claim_frame(stream: int, token: bytes) -> bytes:
    return _HEADER.pack(9 + len(token), stream, CLAIM) + token


def engine_request_frame(call: int, model_name: str, request_id: str, outputs: Iterable[str],
                         inputs: Mapping[str, np.ndarray]) -> bytes:
    outputs = list(outputs)
    body = b"".join([_string(model_name), _string(request_id), struct.pack("<H", len(outputs)),
                     *(_string(name) for name in outputs), encode_tensors(inputs)])
    return _HEADER.pack(9 + len(body), call, ENGINE_REQUEST) + body


def engine_cancel_frame(call: int) -> bytes:
    return _HEADER.pack(9, call, ENGINE_CANCEL)


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack("<H", len(encoded)) + encoded


def relay_frames(data: bytes) -> tuple[list[tuple[int, int, memoryview]], bytes]:
    """The whole frames at the start of `data` (what the relay writes) as (stream, kind, rest of the body), and the
    bytes after them. ValueError on a kind the relay does not write or an impossible length."""
    frames = []
    view = memoryview(data)
    at = 0
    while len(data) - at >= _HEADER.size:
        length, stream, kind = _HEADER.unpack_from(data, at)
        if kind not in (CANCELLED, ENGINE_RESPONSE, ENGINE_FINAL, ENGINE_ERROR) or not 9 <= length <= MAX_FRAME_BYTES:
            raise ValueError(f"a frame of kind {kind} and length {length} from the relay")
        if len(data) - at - 4 < length:
            break
        frames.append((stream, kind, view[at + _HEADER.size:at + 4 + length]))
        at += 4 + length
    return frames, data[at:]


def decode_tensors(body: memoryview) -> dict[str, np.ndarray]:
    """The tensors of a frame (encode_tensors' layout; BYTES as object arrays of bytes)."""
    (count,) = struct.unpack_from("<H", body)
    at = 2
    tensors = {}
    for _ in range(count):
        (name_length,) = struct.unpack_from("<H", body, at)
        name = bytes(body[at + 2:at + 2 + name_length]).decode()
        at += 2 + name_length
        datatype, dims = struct.unpack_from("<BB", body, at)
        shape = struct.unpack_from(f"<{dims}q", body, at + 2)
        (length,) = struct.unpack_from("<Q", body, at + 2 + 8 * dims)
        at += 10 + 8 * dims
        data = body[at:at + length]
        at += length
        if datatype == _BYTES:
            items, offset = [], 0
            while offset < length:
                (size,) = _LENGTH.unpack_from(data, offset)
                items.append(bytes(data[offset + 4:offset + 4 + size]))
                offset += 4 + size
            array = np.empty(len(items), dtype=object)
            array[:] = items
        elif datatype in _NUMPY_TYPES:
            array = np.frombuffer(data, _NUMPY_TYPES[datatype]).copy()
        else:
            raise ValueError(f"tensor {name}: Triton datatype {datatype} has no numpy dtype here")
        tensors[name] = array.reshape(shape)
    return tensors


class RelayDisconnected(ConnectionError):
    """The connection to the relay is gone, or an engine call was stopped before its end."""


class EngineCallError(RuntimeError):
    """The engine (or Triton, on its way there) answered an engine call with an error: its code and message."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class RelayEngineCall:
    """One engine request sent through the relay, its responses handed on by the connection's reader thread."""

    def __init__(self, connection: RelayConnection, call: int, on_event: Callable[[dict], bool],
                 on_end: Callable[[], None] | None):
        self._connection = connection
        self._call = call
        self._on_event = on_event
        self._on_end = on_end
        self._done = threading.Event()
        self._outcome: BaseException | bool | None = None  # True: read to the end; False: on_event stopped it

    def wait(self) -> bool:
        """Block until the call ends: True when read to its end, False when on_event stopped it. Raises
        EngineCallError, RelayDisconnected (stop(), or the connection broke), or what on_event raised."""
        self._done.wait()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return bool(self._outcome)

    def stop(self) -> None:
        """Cancel from any thread: the call ends with RelayDisconnected, and the relay cancels the engine request."""
        if self._connection._forget(self._call):
            self._cancel_in_relay()
            self._finish(RelayDisconnected("stopped"))

    def _cancel_in_relay(self) -> None:
        try:
            self._connection.write(engine_cancel_frame(self._call), now=True)
        except OSError:
            pass  # the connection broke: the relay cancels the calls of a connection it loses

    def _handle(self, kind: int, body: memoryview) -> None:
        """One frame of this call (the reader thread; the call has been forgotten if the frame is final)."""
        try:
            if kind == ENGINE_ERROR:
                (code,) = struct.unpack_from("<I", body)
                self._finish(EngineCallError(code, bytes(body[4:]).decode(errors="replace")))
                return
            tensors = decode_tensors(body)
            if kind == ENGINE_FINAL:
                if tensors:
                    self._on_event(tensors)
                self._finish(True)
            elif self._on_event(tensors) is False and self._connection._forget(self._call):
                self._cancel_in_relay()
                self._finish(False)
        except BaseException as error:  # noqa: BLE001 - it ends this call, never the reader
            if self._connection._forget(self._call):
                self._cancel_in_relay()
            self._finish(error)

    def _finish(self, outcome: BaseException | bool) -> None:
        if self._done.is_set():
            return
        self._outcome = outcome
        self._done.set()
        if self._on_end is not None:
            self._on_end()


class RelayConnection:
    """This process's connection to one relay; frames from any thread, each written whole, in call order.

    While corked (RelayConnections.corked), frames gather and go out in one write when it ends: the engine reader
    sends a sweep's responses of many streams so, one system call for all (a final frame, and what gathered
    before it, is written at once: the child request may complete only after it). A thread (`relay-reader`) reads
    what the relay writes back: which claimed streams were cancelled, and the engine calls' responses."""

    # While engine responses keep coming, read at most this often: one wake-up (and one send of what the read
    # queued) for many responses; an engine step of 10-50 ms waits at most this much more.
    SWEEP_S = 0.002

    def __init__(self, socket_name: str, after_sweep: Callable[[], None] | None = None):
        """`after_sweep`: run on the reader thread after each read that brought engine responses (the BLS sends
        there what they queued, all at once)."""
        self._socket_name = socket_name
        self._after_sweep = after_sweep
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._corks = 0
        self._gathered: list[bytes] = []
        self._claims: dict[int, Callable[[], None]] = {}  # stream -> what its cancellation calls
        self._calls: dict[int, RelayEngineCall] = {}  # engine calls not ended
        self._next_call = 1

    def call_engine(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_event: Callable[[dict], bool], on_end: Callable[[], None] | None = None,
                    on_open: Callable[[RelayEngineCall], None] | None = None) -> RelayEngineCall:
        """Send one engine request through the relay. Each response's tensors go to `on_event(tensors)` on the
        reader thread, which must not block: returning False ends the call (the relay cancels the request);
        `on_end()` runs once it has ended, with this connection's lock held when the connection broke: it must
        only take note. `on_open(call)` runs before the request is sent, so that another thread can stop() it (a
        call stopped by then is not sent). Raises RelayDisconnected when the relay cannot be reached."""
        with self._lock:
            number = self._next_call
            self._next_call += 1
            call = self._calls[number] = RelayEngineCall(self, number, on_event, on_end)
        frame = engine_request_frame(number, model_name, request_id, outputs, inputs)
        if on_open is not None:
            on_open(call)
        with self._lock:
            if number not in self._calls:
                return call  # stopped already
            self._gathered.append(frame)
            try:
                self._write_gathered()
            except OSError as error:
                self._calls.pop(number, None)
                raise RelayDisconnected(f"the relay cannot be reached ({error})") from None
        return call

    def _forget(self, call: int) -> bool:
        """Whether the call was still open (it is not any more)."""
        with self._lock:
            return self._calls.pop(call, None) is not None

    def claim(self, relayed: RelayedRequest, on_cancelled: Callable[[], None]) -> None:
        """Tell the relay that this connection sends the stream, presenting its token. `on_cancelled()` runs if its
        client cancels it, or if the connection breaks (the relay then ends the streams claimed on it); on the
        connection's reader thread or a writing thread, with the connection's lock held: it must only take note.
        Raises OSError as write() does."""
        with self._lock:
            self._claims[relayed.stream] = on_cancelled
        self.write(claim_frame(relayed.stream, relayed.token))

    def release(self, stream: int) -> None:
        """The stream has ended: its cancellation no longer matters."""
        with self._lock:
            self._claims.pop(stream, None)

    def write(self, frame: bytes, now: bool = False) -> None:
        """One whole frame. Raises OSError when the relay cannot be reached (it was unloaded, or the server is
        stopping). `now`: written at once even while corked, after what gathered before it. A stream's frame is
        dropped unless the stream is claimed on this connection: its claim went with a connection that broke, and
        the relay, which has ended the stream, would close this one for it."""
        with self._lock:
            if frame[12] in _STREAM_KINDS and _HEADER.unpack_from(frame)[1] not in self._claims:
                return  # its claim went with a connection that broke: the relay has ended the stream
            self._gathered.append(frame)
            if self._corks and not now:
                return
            self._write_gathered()

    def _write_gathered(self) -> None:
        """With the lock held."""
        data, self._gathered = b"".join(self._gathered), []
        if self._socket is None:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(self._socket_name)
            except OSError:
                connection.close()
                raise
            self._socket = connection
            threading.Thread(target=self._read_frames, args=(connection,), name="relay-reader", daemon=True).start()
        try:
            self._socket.sendall(data)
        except OSError:
            self._broken()  # a frame may be cut; the next write opens a new connection
            raise

    def _broken(self) -> None:
        """The connection is gone (with the lock held): the relay ends every stream claimed on it, so they are
        all cancelled here, and cancels its engine calls, which end here with RelayDisconnected."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        except OSError:
            pass
        self._socket.close()
        self._socket = None
        self._gathered.clear()  # frames of the streams and calls that end here: never for the next connection
        claims, self._claims = self._claims, {}
        for on_cancelled in claims.values():
            on_cancelled()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call._finish(RelayDisconnected("the connection to the relay broke"))

    def _read_frames(self, connection: socket.socket) -> None:
        pending = b""
        while True:
            swept = time.monotonic()
            try:
                data = connection.recv(_RECV_BYTES)
            except OSError:
                data = b""
            try:
                frames, pending = relay_frames(pending + data)
            except ValueError as error:
                log.error("relay %s: %s; closing the connection", self._socket_name, error)
                data, frames = b"", []
            if not data:  # closed by the relay (unloading, or it dropped a malformed frame), or by us
                with self._lock:
                    if self._socket is connection:
                        self._broken()
                return
            engine_events = 0
            for stream, kind, body in frames:
                if kind == CANCELLED:
                    with self._lock:
                        on_cancelled = self._claims.get(stream)
                        if on_cancelled is not None:
                            on_cancelled()
                    continue
                engine_events += 1
                with self._lock:
                    call = self._calls.pop(stream, None) if kind != ENGINE_RESPONSE else self._calls.get(stream)
                if call is not None:  # else stopped: the relay has been told
                    call._handle(kind, body)
            if engine_events and self._after_sweep is not None:
                try:
                    self._after_sweep()
                except Exception:
                    log.exception("relay %s: the after-sweep call failed", self._socket_name)
            pause = swept + self.SWEEP_S - time.monotonic()
            if engine_events > 1 and pause > 0:
                time.sleep(pause)  # let the next responses gather: one wake-up for many

    def _cork(self) -> None:
        with self._lock:
            self._corks += 1

    def _uncork(self) -> None:
        with self._lock:
            self._corks -= 1
            if self._corks or not self._gathered:
                return
            frames = len(self._gathered)
            try:
                self._write_gathered()
            except OSError as error:  # their streams were cancelled (_broken): the relay has ended them
                log.warning("relay %s: %d frames could not be written (%s)", self._socket_name, frames, error)

    def close(self) -> None:
        with self._lock:
            self._gathered.clear()
            self._claims.clear()
            if self._socket is not None:
                self._broken()


class RelayConnections:
    """One connection per relay socket, for the process's lifetime (a model has one relay)."""

    def __init__(self, after_sweep: Callable[[], None] | None = None) -> None:
        """`after_sweep`: see RelayConnection."""
        self._after_sweep = after_sweep
        self._lock = threading.Lock()
        self._connections: dict[str, RelayConnection] = {}

    def get(self, socket_name: str) -> RelayConnection:
        with self._lock:
            connection = self._connections.get(socket_name)
            if connection is None:
                connection = self._connections[socket_name] = RelayConnection(socket_name, self._after_sweep)
            return connection

    @contextmanager
    def corked(self) -> Iterator[None]:
        """Frames written meanwhile, by any thread, go out together at the end (RelayConnection)."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection._cork()
        try:
            yield
        finally:
            for connection in connections:
                connection._uncork()

    def close(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()
