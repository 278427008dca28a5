"""The frames the Python BLS and the relay exchange, against the golden frames of relay/frames.md
(tests/fixtures/relay_frames/, which the relay's C++ is tested against too: test_relay_cpp.py), the checks
of a request's relay parameters, and the Python end of the connection against a socket that plays the relay's end
(the relay itself: the integration tests, test_relay_fuzz.py)."""

import os
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from bls.relay.connection import EngineCallError, RelayConnections, RelayDisconnected
from bls.relay.frames import (
    CANCELLED,
    ENGINE_ERROR,
    ENGINE_FINAL,
    ENGINE_RESPONSE,
    MAX_FRAME_BYTES,
    RelayedRequest,
    claim_frame,
    decode_tensors,
    encode_tensors,
    engine_cancel_frame,
    engine_request_frame,
    error_frame,
    relay_frames,
    response_frame,
    stream_token,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "relay_frames"
FIXTURE_KEY = bytes(range(32))  # the key 3_claim.hex's token is made with


def golden(name: str) -> bytes:
    """A golden frame: annotated hex ('#' to the end of a line is a comment)."""
    return bytes.fromhex("".join(line.partition("#")[0] for line in (FIXTURES / name).read_text().splitlines()))


def test_every_frame_kind_has_a_golden_frame():
    assert sorted(path.name.split("_")[0] for path in FIXTURES.glob("*.hex")) == [str(kind) for kind in range(10)]


# What this side writes, byte for byte as the golden frames.

def test_a_response_is_written_as_the_golden_frame():
    outputs = {"text_output": np.array(["hé".encode(), b""], dtype=object),
               "num_output_tokens": np.array([[7]], dtype=np.int32)}
    assert response_frame(42, encode_tensors(outputs), final=False) == golden("0_response.hex")


def test_a_final_response_without_outputs_is_written_as_the_golden_frame():
    assert response_frame(42, encode_tensors({}), final=True) == golden("1_final_response.hex")


def test_an_error_is_written_as_the_golden_frame():
    assert error_frame(9, 3, "max_tokens: is required") == golden("2_error.hex")


def test_a_claim_presents_the_streams_token_as_the_golden_frame():
    assert claim_frame(7, stream_token(FIXTURE_KEY, 7)) == golden("3_claim.hex")


def test_an_engine_request_and_its_cancel_are_written_as_the_golden_frames():
    inputs = {"input_ids": np.array([[1, 2]], dtype=np.int32), "streaming": np.array([[True]])}
    assert engine_request_frame(5, "tensorrt_llm", "req-1", ["output_ids"], inputs) == golden("5_engine_request.hex")
    assert engine_cancel_frame(5) == golden("6_engine_cancel.hex")


def test_the_tensors_this_side_writes_decode_as_they_were_encoded():
    frame = golden("0_response.hex")
    decoded = decode_tensors(memoryview(frame)[13:])
    assert decoded["text_output"].tolist() == ["hé".encode(), b""]
    assert decoded["num_output_tokens"].dtype == np.int32 and decoded["num_output_tokens"].tolist() == [[7]]
    request = golden("5_engine_request.hex")
    inputs_at = 13 + 2 + len("tensorrt_llm") + 2 + len("req-1") + 2 + 2 + len("output_ids")
    decoded = decode_tensors(memoryview(request)[inputs_at:])
    assert decoded["input_ids"].tolist() == [[1, 2]] and decoded["streaming"].tolist() == [[True]]


def test_every_numeric_output_keeps_its_datatype_and_values():
    for dtype, code in ((np.bool_, 1), (np.int32, 8), (np.int64, 9), (np.float32, 11), (np.float64, 12)):
        array = np.arange(6).reshape(2, 3).astype(dtype)
        encoded = encode_tensors({"x": array})
        assert encoded[5] == code and encoded.endswith(array.tobytes())
        assert decode_tensors(memoryview(encoded))["x"].tolist() == array.tolist()
    with pytest.raises(TypeError, match="output x: no Triton datatype"):
        encode_tensors({"x": np.array([1 + 2j])})


# What the relay writes, read as the golden frames say.

def test_the_relays_frames_are_read_as_the_golden_frames_say():
    data = b"".join(golden(name) for name in
                    ("4_cancelled.hex", "7_engine_response.hex", "8_engine_final.hex", "9_engine_error.hex"))
    frames, rest = relay_frames(data + data[:5])  # a frame cut short waits for the rest
    assert rest == data[:5]
    assert [(stream, kind) for stream, kind, _ in frames] == [
        (7, CANCELLED), (5, ENGINE_RESPONSE), (5, ENGINE_FINAL), (5, ENGINE_ERROR)]
    assert bytes(frames[0][2]) == b""
    response = decode_tensors(frames[1][2])
    assert response["output_ids"].tolist() == [[[7]]] and response["sequence_length"].tolist() == [[3]]
    final = decode_tensors(frames[2][2])
    assert final["output_ids"].shape == (1, 1, 0) and final["output_ids"].dtype == np.int32
    assert struct.unpack_from("<I", frames[3][2]) == (4,) and bytes(frames[3][2][4:]) == b"tensorrt_llm: queue full"


@pytest.mark.parametrize("frame", [
    golden("0_response.hex"),  # a kind only this side writes
    struct.pack("<IQB", 8, 7, CANCELLED),  # shorter than a header
    struct.pack("<IQB", MAX_FRAME_BYTES + 1, 7, ENGINE_RESPONSE),
])
def test_a_frame_the_relay_cannot_have_written_is_refused(frame):
    with pytest.raises(ValueError, match="from the relay"):
        relay_frames(frame)


# A request's relay parameters: only what the relay wrote is relayed.

_directories: list[str] = []


@pytest.fixture(autouse=True)
def _remove_relay_directories():
    yield
    while _directories:
        shutil.rmtree(_directories.pop(), ignore_errors=True)


def _relay_directory() -> tuple[str, bytes]:
    """A directory as the relay makes it (relay/socket_loop.cc): 0700, its key 0600 beside the socket's path (in
    /tmp, as a socket's path must be short)."""
    directory = tempfile.mkdtemp(prefix="llama3_relay.test.")
    _directories.append(directory)
    key = os.urandom(32)
    with open(os.open(os.path.join(directory, "key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(key)
    return directory, key


def _parameters(directory: str, stream: int, token: bytes) -> dict:
    return {"llama3_relay_socket": os.path.join(directory, "socket"), "llama3_relay_stream": stream,
            "llama3_relay_token": token.hex()}


def test_a_request_is_relayed_only_with_the_token_the_relays_key_gives_its_stream(tmp_path):
    directory, key = _relay_directory()
    assert RelayedRequest.from_parameters({}) is None
    good = _parameters(directory, 5, stream_token(key, 5))
    assert RelayedRequest.from_parameters(good) == RelayedRequest(good["llama3_relay_socket"], 5, stream_token(key, 5))
    # A client calling the Python model directly cannot make up a relayed request: nothing would be claimed.
    assert RelayedRequest.from_parameters({**good, "llama3_relay_stream": 6}) is None  # another stream's token
    assert RelayedRequest.from_parameters({**good, "llama3_relay_token": "00" * 16}) is None
    assert RelayedRequest.from_parameters({**good, "llama3_relay_token": "not hex"}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5}) is None  # only some of them
    for path in ("/run/docker.sock", os.path.join(directory, "key"), str(tmp_path / "llama3_relay.x" / "socket"),
                 "socket"):
        assert RelayedRequest.from_parameters({**good, "llama3_relay_socket": path}) is None


def test_a_relay_directory_others_may_enter_or_a_key_others_may_read_is_not_a_relays():
    directory, key = _relay_directory()
    os.chmod(directory, 0o755)
    assert RelayedRequest.from_parameters(_parameters(directory, 1, stream_token(key, 1))) is None
    directory, key = _relay_directory()
    os.chmod(os.path.join(directory, "key"), 0o644)
    assert RelayedRequest.from_parameters(_parameters(directory, 1, stream_token(key, 1))) is None
    directory, key = _relay_directory()
    os.rename(os.path.join(directory, "key"), os.path.join(directory, "real"))
    os.symlink(os.path.join(directory, "real"), os.path.join(directory, "key"))
    assert RelayedRequest.from_parameters(_parameters(directory, 1, stream_token(key, 1))) is None


# The connection, against a socket that plays the relay.

class _RelayEnd:
    """The relay's end of a connection: its directory, key and listening socket, as relay/socket_loop.cc makes them."""

    def __init__(self):
        self.directory, self.key = _relay_directory()
        self.name = os.path.join(self.directory, "socket")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.name)
        self._listener.listen(1)
        self.peer: socket.socket | None = None

    def relayed(self, stream: int) -> RelayedRequest:
        """A request for `stream` as the relay forwards it."""
        return RelayedRequest.from_parameters(_parameters(self.directory, stream, stream_token(self.key, stream)))

    def claim(self, stream: int) -> bytes:
        return claim_frame(stream, stream_token(self.key, stream))

    def accept(self) -> socket.socket:
        self.peer, _ = self._listener.accept()
        self.peer.settimeout(5)
        return self.peer

    def read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            data += self.peer.recv(size - len(data))
        return data

    def close(self):
        for sock in (self.peer, self._listener):
            if sock is not None:
                sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def relay_end():
    end = _RelayEnd()
    yield end
    end.close()


def _wait_for(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_frames_written_while_corked_go_out_together_in_order_and_a_final_one_at_once(relay_end):
    connections = RelayConnections()
    connection = connections.get(relay_end.name)
    connection.claim(relay_end.relayed(1), lambda: None)  # connects
    peer = relay_end.accept()
    assert relay_end.read(len(relay_end.claim(1))) == relay_end.claim(1)
    frames = [response_frame(1, encode_tensors({"text_output": np.array([f"t{i}"], dtype=object)}), False)
              for i in range(3)]
    with connections.corked():
        for frame in frames[:2]:
            connection.write(frame)
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(1)  # nothing written yet
        peer.settimeout(5)
        connection.write(frames[2], now=True)  # a final frame: everything gathered, then it, now
        assert relay_end.read(sum(map(len, frames))) == b"".join(frames)
        connection.write(frames[0])
    assert relay_end.read(len(frames[0])) == frames[0]  # written when the cork ends
    connections.close()


def test_the_relays_cancellation_reaches_the_claimed_stream_and_a_broken_connection_cancels_every_claim(relay_end):
    connections = RelayConnections()
    connection = connections.get(relay_end.name)
    cancelled = []
    for stream in (1, 2, 3):
        connection.claim(relay_end.relayed(stream), lambda s=stream: cancelled.append(s))
    connection.release(3)  # ended: its cancellation no longer matters
    peer = relay_end.accept()
    relay_end.read(3 * len(relay_end.claim(1)))
    peer.sendall(golden("4_cancelled.hex").replace(struct.pack("<Q", 7), struct.pack("<Q", 2))
                 + struct.pack("<IQB", 9, 99, 4))  # 99: a stream it never claimed
    _wait_for(lambda: cancelled == [2])
    peer.close()  # the relay ends the streams of a connection it drops
    _wait_for(lambda: sorted(cancelled) == [1, 2, 2])
    connections.close()


def test_frames_of_a_stream_not_claimed_on_the_connection_are_never_sent(relay_end):
    """The relay closes a connection that sends frames for a stream it did not claim, ending all its streams: a
    stream whose claim went with a broken connection must not take the next connection down with it."""
    connections = RelayConnections()
    connection = connections.get(relay_end.name)
    connection.claim(relay_end.relayed(1), lambda: None)
    relay_end.accept()
    relay_end.read(len(relay_end.claim(1)))
    relay_end.peer.close()  # the relay dropped the connection: stream 1 has ended there
    _wait_for(lambda: connection._socket is None)
    connection.write(response_frame(1, encode_tensors({}), final=True))  # dropped, opens nothing
    connection.write(error_frame(2, 3, "never claimed"))
    connection.claim(relay_end.relayed(4), lambda: None)  # a new connection, for a new stream
    relay_end.accept()
    final = response_frame(4, encode_tensors({}), final=True)
    connection.write(final)
    assert relay_end.read(len(relay_end.claim(4)) + len(final)) == relay_end.claim(4) + final
    connections.close()


def test_an_engine_call_gets_its_responses_then_ends_and_a_stopped_one_is_cancelled_in_the_relay(relay_end):
    sweeps = []
    connections = RelayConnections(after_sweep=lambda: sweeps.append(1))
    connection = connections.get(relay_end.name)
    received = []
    numbers = [connection.call_engine("tensorrt_llm", {}, [], "unused", lambda tensors: True) for _ in range(4)]
    peer = relay_end.accept()
    for _ in numbers:  # calls 1-4 are taken: the golden frames are call 5's
        relay_end.read(struct.unpack("<I", relay_end.read(4))[0])
    call = connection.call_engine("tensorrt_llm", {"input_ids": np.array([[1, 2]], dtype=np.int32),
                                                   "streaming": np.array([[True]])}, ["output_ids"], "req-1",
                                  lambda tensors: received.append(tensors) or True)
    assert relay_end.read(len(golden("5_engine_request.hex"))) == golden("5_engine_request.hex")
    peer.sendall(golden("7_engine_response.hex") + golden("8_engine_final.hex"))
    assert call.wait() is True
    assert [tensors["output_ids"].shape for tensors in received] == [(1, 1, 1), (1, 1, 0)]
    assert received[0]["sequence_length"].tolist() == [[3]] and sweeps

    stopped = connection.call_engine("tensorrt_llm", {}, [], "s", lambda tensors: True)
    relay_end.read(struct.unpack("<I", relay_end.read(4))[0])
    stopped.stop()
    assert relay_end.read(13) == engine_cancel_frame(6)
    with pytest.raises(RelayDisconnected):
        stopped.wait()
    connections.close()


def test_an_engine_error_keeps_its_code_and_a_broken_connection_ends_every_call(relay_end):
    connections = RelayConnections()
    connection = connections.get(relay_end.name)
    calls = [connection.call_engine("tensorrt_llm", {}, [], str(i), lambda tensors: True) for i in range(6)]
    peer = relay_end.accept()
    peer.sendall(golden("9_engine_error.hex"))  # call 5
    with pytest.raises(EngineCallError, match="tensorrt_llm: queue full") as error:
        calls[4].wait()
    assert error.value.code == 4
    peer.close()
    with pytest.raises(RelayDisconnected):
        calls[5].wait()
    connections.close()
