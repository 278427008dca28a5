"""The relay's frames and request parameters (relay/frames.md, the one definition both sides are tested against,
tests/fixtures/relay_frames/): what a relayed request's parameters say and how its claim is checked
(RelayedRequest), and the frames this side writes and reads.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

STREAM_PARAMETER = "llama3_relay_stream"
SOCKET_PARAMETER = "llama3_relay_socket"
TOKEN_PARAMETER = "llama3_relay_token"
RELAY_PARAMETERS = (STREAM_PARAMETER, SOCKET_PARAMETER, TOKEN_PARAMETER)

# Frame kinds (relay/frames.md says who writes which).
RESPONSE, FINAL_RESPONSE, ERROR, CLAIM, CANCELLED = 0, 1, 2, 3, 4
ENGINE_REQUEST, ENGINE_CANCEL, ENGINE_RESPONSE, ENGINE_FINAL, ENGINE_ERROR = 5, 6, 7, 8, 9
STREAM_KINDS = (RESPONSE, FINAL_RESPONSE, ERROR)
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
HEADER = struct.Struct("<IQB")  # the length of the rest, the stream, the kind
_LENGTH = struct.Struct("<I")
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
    return HEADER.pack(9 + len(encoded_outputs), stream, FINAL_RESPONSE if final else RESPONSE) + encoded_outputs


def error_frame(stream: int, code: int, message: str) -> bytes:
    body = struct.pack("<I", code) + message.encode()
    return HEADER.pack(9 + len(body), stream, ERROR) + body


def claim_frame(stream: int, token: bytes) -> bytes:
    return HEADER.pack(9 + len(token), stream, CLAIM) + token


def engine_request_frame(call: int, model_name: str, request_id: str, outputs: Iterable[str],
                         inputs: Mapping[str, np.ndarray]) -> bytes:
    outputs = list(outputs)
    body = b"".join([_string(model_name), _string(request_id), struct.pack("<H", len(outputs)),
                     *(_string(name) for name in outputs), encode_tensors(inputs)])
    return HEADER.pack(9 + len(body), call, ENGINE_REQUEST) + body


def engine_cancel_frame(call: int) -> bytes:
    return HEADER.pack(9, call, ENGINE_CANCEL)


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack("<H", len(encoded)) + encoded


def relay_frames(data: bytes) -> tuple[list[tuple[int, int, memoryview]], bytes]:
    """The whole frames at the start of `data` (what the relay writes) as (stream, kind, rest of the body), and the
    bytes after them. ValueError on a kind the relay does not write or an impossible length."""
    frames = []
    view = memoryview(data)
    at = 0
    while len(data) - at >= HEADER.size:
        length, stream, kind = HEADER.unpack_from(data, at)
        if kind not in (CANCELLED, ENGINE_RESPONSE, ENGINE_FINAL, ENGINE_ERROR) or not 9 <= length <= MAX_FRAME_BYTES:
            raise ValueError(f"a frame of kind {kind} and length {length} from the relay")
        if len(data) - at - 4 < length:
            break
        frames.append((stream, kind, view[at + HEADER.size:at + 4 + length]))
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
