"""The Python half of the relay (relay/relay.cc): a request that reached tensorrt_llm_bls through the relay
has its responses sent by the relay, inside tritonserver, and not by this process's stub.

The relay forwards the client's request to the Python model with two request parameters: the stream number
(STREAM_PARAMETER) and the abstract Unix socket it listens on (SOCKET_PARAMETER). The Python model claims the
stream on its connection to that socket, then writes each response of the request as one frame (the layout is
relay.cc's header comment); the last frame is final (a final response or an error), and only then does the
Python model complete the child request itself. A frame costs a few µs to encode and a share of one write; a
response sent through the stub costs 40-70 µs of this process's CPU and as much of tritonserver's (README,
Benchmarks). The relay tells the claiming connection when a stream's client cancels it, so that the model never
asks Triton (a round trip each).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import numpy as np

STREAM_PARAMETER = "llama3_relay_stream"
SOCKET_PARAMETER = "llama3_relay_socket"

# Frame kinds (relay.cc's FrameKind): the Python model writes the first four, the relay the last.
RESPONSE, FINAL_RESPONSE, ERROR, CLAIM, CANCELLED = 0, 1, 2, 3, 4
# TRITONSERVER_DataType by numpy dtype; BYTES (13) for object and bytes arrays.
_DATATYPES = {
    np.dtype(np.bool_): 1, np.dtype(np.uint8): 2, np.dtype(np.uint16): 3, np.dtype(np.uint32): 4,
    np.dtype(np.uint64): 5, np.dtype(np.int8): 6, np.dtype(np.int16): 7, np.dtype(np.int32): 8,
    np.dtype(np.int64): 9, np.dtype(np.float16): 10, np.dtype(np.float32): 11, np.dtype(np.float64): 12,
}
_BYTES = 13
_HEADER = struct.Struct("<IQB")  # the length of the rest, the stream, the kind
_LENGTH = struct.Struct("<I")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayedRequest:
    """Where a relayed request's responses go."""

    socket_name: str
    stream: int

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> "RelayedRequest | None":
        """From the request's parameters; None for a request that did not come through the relay."""
        if STREAM_PARAMETER not in parameters or SOCKET_PARAMETER not in parameters:
            return None
        return cls(str(parameters[SOCKET_PARAMETER]), int(parameters[STREAM_PARAMETER]))


def encode_outputs(outputs: Mapping[str, np.ndarray]) -> bytes:
    """A response's outputs, as a frame carries them."""
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


def claim_frame(stream: int) -> bytes:
    return _HEADER.pack(9, stream, CLAIM)


def cancelled_streams(data: bytes) -> tuple[list[int], bytes]:
    """The streams of the whole "cancelled" frames at the start of `data` (what the relay writes), and the bytes
    after them. ValueError on any other frame: the relay writes no other kind."""
    streams = []
    while len(data) >= _HEADER.size:
        length, stream, kind = _HEADER.unpack_from(data)
        if length != 9 or kind != CANCELLED:
            raise ValueError(f"a frame of kind {kind} and length {length} from the relay")
        streams.append(stream)
        data = data[_HEADER.size:]
    return streams, data


class RelayConnection:
    """This process's connection to one relay; frames from any thread, each written whole, in call order.

    While corked (RelayConnections.corked), frames gather and go out in one write when it ends: the engine reader
    sends a sweep's responses of many streams so, one system call for all (a final frame, and what gathered
    before it, is written at once: the child request may complete only after it). A thread reads what the relay
    writes back: which claimed streams were cancelled."""

    def __init__(self, socket_name: str):
        self._socket_name = socket_name
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._corks = 0
        self._gathered: list[bytes] = []
        self._claims: dict[int, Callable[[], None]] = {}  # stream -> what its cancellation calls

    def claim(self, stream: int, on_cancelled: Callable[[], None]) -> None:
        """Tell the relay that this connection sends `stream`. `on_cancelled()` runs if its client cancels it, or
        if the connection breaks (the relay then ends the streams claimed on it); on the connection's reader
        thread or a writing thread, with the connection's lock held: it must only take note. Raises OSError as
        write() does."""
        with self._lock:
            self._claims[stream] = on_cancelled
        self.write(claim_frame(stream))

    def release(self, stream: int) -> None:
        """The stream has ended: its cancellation no longer matters."""
        with self._lock:
            self._claims.pop(stream, None)

    def write(self, frame: bytes, now: bool = False) -> None:
        """Raises OSError when the relay cannot be reached (it was unloaded, or the server is stopping). `now`:
        written at once even while corked, after what gathered before it."""
        with self._lock:
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
                connection.connect("\0" + self._socket_name)
            except OSError:
                connection.close()
                raise
            self._socket = connection
            threading.Thread(target=self._read_cancellations, args=(connection,), name="relay-cancellations",
                             daemon=True).start()
        try:
            self._socket.sendall(data)
        except OSError:
            self._broken()  # a frame may be cut; the next write opens a new connection
            raise

    def _broken(self) -> None:
        """The connection is gone (with the lock held): the relay ends every stream claimed on it, so they are
        all cancelled here."""
        self._socket.close()
        self._socket = None
        claims, self._claims = self._claims, {}
        for on_cancelled in claims.values():
            on_cancelled()

    def _read_cancellations(self, connection: socket.socket) -> None:
        pending = b""
        while True:
            try:
                data = connection.recv(4096)
            except OSError:
                data = b""
            try:
                streams, pending = cancelled_streams(pending + data)
            except ValueError as error:
                log.error("relay %s: %s; closing the connection", self._socket_name, error)
                data = b""
                streams = []
            with self._lock:
                if not data:  # closed by the relay (unloading, or it dropped a malformed frame), or by us
                    if self._socket is connection:
                        self._broken()
                    return
                for stream in streams:
                    on_cancelled = self._claims.get(stream)
                    if on_cancelled is not None:
                        on_cancelled()

    def _cork(self) -> None:
        with self._lock:
            self._corks += 1

    def _uncork(self) -> None:
        with self._lock:
            self._corks -= 1
            if self._corks or not self._gathered:
                return
            try:
                self._write_gathered()
            except OSError as error:  # their streams were cancelled (_broken): the relay has ended them
                log.warning("relay %s: %d frames could not be written (%s)", self._socket_name, len(self._gathered),
                            error)

    def close(self) -> None:
        with self._lock:
            self._gathered.clear()
            self._claims.clear()
            if self._socket is not None:
                try:
                    self._socket.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
                except OSError:
                    pass
                self._socket.close()
                self._socket = None


class RelayConnections:
    """One connection per relay socket, for the process's lifetime (a model has one relay)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[str, RelayConnection] = {}

    def get(self, socket_name: str) -> RelayConnection:
        with self._lock:
            connection = self._connections.get(socket_name)
            if connection is None:
                connection = self._connections[socket_name] = RelayConnection(socket_name)
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
