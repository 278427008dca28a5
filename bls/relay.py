"""The Python half of the relay (relay/relay.cc): a request that reached tensorrt_llm_bls through the relay
has its responses sent by the relay, inside tritonserver, and not by this process's stub.

The relay forwards the client's request to the Python model with two request parameters: the stream number
(STREAM_PARAMETER) and the abstract Unix socket it listens on (SOCKET_PARAMETER). Each response of that
request goes to the socket as one frame (the layout is relay.cc's header comment); the last frame is final (a
final response or an error), and only then does the Python model complete the child request itself. A frame
costs a few µs to encode and a share of one write; a response sent through the stub costs 40-70 µs of this
process's CPU and as much of tritonserver's (README, Benchmarks).
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass
from typing import Mapping

import numpy as np

STREAM_PARAMETER = "llama3_relay_stream"
SOCKET_PARAMETER = "llama3_relay_socket"

RESPONSE, FINAL_RESPONSE, ERROR = 0, 1, 2
# TRITONSERVER_DataType by numpy dtype; BYTES (13) for object and bytes arrays.
_DATATYPES = {
    np.dtype(np.bool_): 1, np.dtype(np.uint8): 2, np.dtype(np.uint16): 3, np.dtype(np.uint32): 4,
    np.dtype(np.uint64): 5, np.dtype(np.int8): 6, np.dtype(np.int16): 7, np.dtype(np.int32): 8,
    np.dtype(np.int64): 9, np.dtype(np.float16): 10, np.dtype(np.float32): 11, np.dtype(np.float64): 12,
}
_BYTES = 13
_HEADER = struct.Struct("<IQB")  # the length of the rest, the stream, the kind
_LENGTH = struct.Struct("<I")


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


class RelayConnection:
    """This process's connection to one relay; frames from any thread, each written whole, in call order."""

    def __init__(self, socket_name: str):
        self._socket_name = socket_name
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None

    def write(self, frame: bytes) -> None:
        """Raises OSError when the relay cannot be reached (it was unloaded, or the server is stopping)."""
        with self._lock:
            if self._socket is None:
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    connection.connect("\0" + self._socket_name)
                except OSError:
                    connection.close()
                    raise
                self._socket = connection
            try:
                self._socket.sendall(frame)
            except OSError:
                # A frame may be cut: the relay drops this connection; the next write opens a new one.
                self._socket.close()
                self._socket = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
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

    def close(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()
