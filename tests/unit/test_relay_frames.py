"""The frames the Python BLS and the relay exchange, byte for byte as relay/relay.cc's header comment lays them out
(the relay's reading of them is proven by the integration tests, which all stream through it), and the Python
end of the connection against a socket that plays the relay's end."""

import socket
import struct
import time
import uuid

import numpy as np
import pytest

from bls.relay import RelayDisconnected as Disconnected
from bls.relay import (
    EngineCallError, RelayConnections, RelayedRequest, claim_frame, decode_tensors, encode_tensors, engine_cancel_frame,
    engine_request_frame, error_frame, relay_frames, response_frame,
)


def test_a_response_frame_is_laid_out_as_the_relay_reads_it():
    outputs = {"text_output": np.array(["hé".encode(), b""], dtype=object),
               "num_output_tokens": np.array([[7]], dtype=np.int32)}
    frame = response_frame(42, encode_tensors(outputs), final=True)
    text = struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 0)
    expected_body = (struct.pack("<QBH", 42, 1, 2)
                     + struct.pack("<H11sBBqQ", 11, b"text_output", 13, 1, 2, len(text)) + text
                     + struct.pack("<H17sBBqqQ", 17, b"num_output_tokens", 8, 2, 1, 1, 4) + struct.pack("<i", 7))
    assert frame == struct.pack("<I", len(expected_body)) + expected_body


def test_a_streamed_response_is_not_final_and_strings_are_utf8():
    frame = response_frame(1, encode_tensors({"text_output": np.array(["ü"], dtype=object)}), final=False)
    assert frame[12] == 0  # kind: a response
    assert frame.endswith(struct.pack("<I", 2) + "ü".encode())


def test_an_error_frame_carries_the_code_and_the_message():
    frame = error_frame(9, 3, "max_tokens: is required")
    body = struct.pack("<QBI", 9, 2, 3) + b"max_tokens: is required"
    assert frame == struct.pack("<I", len(body)) + body


def test_every_numeric_output_keeps_its_datatype_and_values():
    for dtype, code in ((np.bool_, 1), (np.int32, 8), (np.int64, 9), (np.float32, 11), (np.float64, 12)):
        array = np.arange(6).reshape(2, 3).astype(dtype)
        encoded = encode_tensors({"x": array})
        assert encoded[5] == code and encoded.endswith(array.tobytes())
    with pytest.raises(TypeError, match="output x: no Triton datatype"):
        encode_tensors({"x": np.array([1 + 2j])})


def test_only_requests_from_the_relay_are_relayed():
    assert RelayedRequest.from_parameters({}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5, "llama3_relay_socket": "s"}) == RelayedRequest("s", 5)


def test_a_claim_and_the_relays_cancelled_frames_are_laid_out_as_the_relay_writes_them():
    assert claim_frame(7) == struct.pack("<IQB", 9, 7, 3)
    cancelled = struct.pack("<IQB", 9, 7, 4) + struct.pack("<IQB", 9, 8, 4)
    frames, rest = relay_frames(cancelled + b"\x09\x00")  # a frame cut short waits
    assert [(stream, kind, bytes(body)) for stream, kind, body in frames] == [(7, 4, b""), (8, 4, b"")]
    assert rest == b"\x09\x00"
    with pytest.raises(ValueError, match="kind 0"):
        relay_frames(struct.pack("<IQB", 9, 7, 0))


class _RelayEnd:
    """The relay's end of a connection: a listening abstract socket, as relay.cc makes it."""

    def __init__(self):
        self.name = f"llama3_relay.test.{uuid.uuid4().hex}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.name)
        self._listener.listen(1)
        self.peer: socket.socket | None = None

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
    connection.claim(1, lambda: None)  # connects
    peer = relay_end.accept()
    assert relay_end.read(13) == claim_frame(1)
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
        connection.claim(stream, lambda s=stream: cancelled.append(s))
    connection.release(3)  # ended: its cancellation no longer matters
    peer = relay_end.accept()
    relay_end.read(3 * 13)
    peer.sendall(struct.pack("<IQB", 9, 2, 4) + struct.pack("<IQB", 9, 99, 4))  # 99: a stream it never claimed
    _wait_for(lambda: cancelled == [2])
    peer.close()  # the relay ends the streams of a connection it drops
    _wait_for(lambda: sorted(cancelled) == [1, 2, 2])
    connections.close()


def test_an_engine_request_frame_is_laid_out_as_the_relay_reads_it():
    inputs = {"input_ids": np.array([[1, 2]], dtype=np.int32)}
    frame = engine_request_frame(5, "tensorrt_llm", "req-1", ["output_ids"], inputs)
    body = (struct.pack("<QB", 5, 5) + struct.pack("<H12s", 12, b"tensorrt_llm") + struct.pack("<H5s", 5, b"req-1")
            + struct.pack("<HH10s", 1, 10, b"output_ids") + encode_tensors(inputs))
    assert frame == struct.pack("<I", len(body)) + body
    assert engine_cancel_frame(5) == struct.pack("<IQB", 9, 5, 6)


def test_tensors_decode_as_they_were_encoded():
    tensors = {"output_ids": np.arange(6, dtype=np.int32).reshape(1, 2, 3), "flag": np.array([[True]]),
               "text": np.array([b"h\xc3\xa9", b""], dtype=object).reshape(2, 1)}
    decoded = decode_tensors(memoryview(encode_tensors(tensors)))
    assert list(decoded) == list(tensors)
    for name, array in tensors.items():
        assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape
        assert decoded[name].tolist() == array.tolist()


def _engine_frame(call, kind, tensors=None):
    body = encode_tensors(tensors or {})
    return struct.pack("<IQB", 9 + len(body), call, kind) + body


def test_an_engine_call_gets_its_responses_then_ends_and_a_stopped_one_is_cancelled_in_the_relay(relay_end):
    sweeps = []
    connections = RelayConnections(after_sweep=lambda: sweeps.append(1))
    connection = connections.get(relay_end.name)
    received = []
    call = connection.call_engine("tensorrt_llm", {"input_ids": np.array([[1]], dtype=np.int32)}, ["output_ids"],
                                  "r", lambda tensors: received.append(tensors["output_ids"].tolist()) or True)
    peer = relay_end.accept()
    (length,) = struct.unpack("<I", relay_end.read(4))
    assert struct.unpack("<QB", relay_end.read(length)[:9]) == (1, 5)
    peer.sendall(_engine_frame(1, 7, {"output_ids": np.array([[[7]]], dtype=np.int32)})
                 + _engine_frame(1, 8, {"output_ids": np.array([[[8]]], dtype=np.int32)}))
    assert call.wait() is True
    assert received == [[[[7]]], [[[8]]]] and sweeps

    stopped = connection.call_engine("tensorrt_llm", {}, [], "s", lambda tensors: True)
    relay_end.read(struct.unpack("<I", relay_end.read(4))[0])
    stopped.stop()
    assert relay_end.read(13) == engine_cancel_frame(2)
    with pytest.raises(Disconnected):
        stopped.wait()
    connections.close()


def test_an_engine_error_keeps_its_code_and_a_broken_connection_ends_every_call(relay_end):
    connections = RelayConnections()
    connection = connections.get(relay_end.name)
    failing = connection.call_engine("tensorrt_llm", {}, [], "a", lambda tensors: True)
    waiting = connection.call_engine("tensorrt_llm", {}, [], "b", lambda tensors: True)
    peer = relay_end.accept()
    message = b"max_tokens: must be positive"
    peer.sendall(struct.pack("<IQBI", 13 + len(message), 1, 9, 3) + message)
    with pytest.raises(EngineCallError, match="max_tokens: must be positive") as error:
        failing.wait()
    assert error.value.code == 3
    peer.close()
    with pytest.raises(Disconnected):
        waiting.wait()
    connections.close()
