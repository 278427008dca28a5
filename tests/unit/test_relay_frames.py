"""The frames the Python BLS and the relay exchange, byte for byte as relay/relay.cc's header comment lays them out
(the relay's reading of them is proven by the integration tests, which all stream through it), and the Python
end of the connection against a socket that plays the relay's end."""

import socket
import struct
import time
import uuid

import numpy as np
import pytest

from bls.relay import (
    RelayConnections, RelayedRequest, cancelled_streams, claim_frame, encode_outputs, error_frame, response_frame,
)


def test_a_response_frame_is_laid_out_as_the_relay_reads_it():
    outputs = {"text_output": np.array(["hé".encode(), b""], dtype=object),
               "num_output_tokens": np.array([[7]], dtype=np.int32)}
    frame = response_frame(42, encode_outputs(outputs), final=True)
    text = struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 0)
    expected_body = (struct.pack("<QBH", 42, 1, 2)
                     + struct.pack("<H11sBBqQ", 11, b"text_output", 13, 1, 2, len(text)) + text
                     + struct.pack("<H17sBBqqQ", 17, b"num_output_tokens", 8, 2, 1, 1, 4) + struct.pack("<i", 7))
    assert frame == struct.pack("<I", len(expected_body)) + expected_body


def test_a_streamed_response_is_not_final_and_strings_are_utf8():
    frame = response_frame(1, encode_outputs({"text_output": np.array(["ü"], dtype=object)}), final=False)
    assert frame[12] == 0  # kind: a response
    assert frame.endswith(struct.pack("<I", 2) + "ü".encode())


def test_an_error_frame_carries_the_code_and_the_message():
    frame = error_frame(9, 3, "max_tokens: is required")
    body = struct.pack("<QBI", 9, 2, 3) + b"max_tokens: is required"
    assert frame == struct.pack("<I", len(body)) + body


def test_every_numeric_output_keeps_its_datatype_and_values():
    for dtype, code in ((np.bool_, 1), (np.int32, 8), (np.int64, 9), (np.float32, 11), (np.float64, 12)):
        array = np.arange(6).reshape(2, 3).astype(dtype)
        encoded = encode_outputs({"x": array})
        assert encoded[5] == code and encoded.endswith(array.tobytes())
    with pytest.raises(TypeError, match="output x: no Triton datatype"):
        encode_outputs({"x": np.array([1 + 2j])})


def test_only_requests_from_the_relay_are_relayed():
    assert RelayedRequest.from_parameters({}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5, "llama3_relay_socket": "s"}) == RelayedRequest("s", 5)


def test_a_claim_and_the_relays_cancelled_frames_are_laid_out_as_the_relay_writes_them():
    assert claim_frame(7) == struct.pack("<IQB", 9, 7, 3)
    cancelled = struct.pack("<IQB", 9, 7, 4) + struct.pack("<IQB", 9, 8, 4)
    assert cancelled_streams(cancelled + b"\x09\x00") == ([7, 8], b"\x09\x00")  # a frame cut short waits
    with pytest.raises(ValueError, match="kind 0"):
        cancelled_streams(struct.pack("<IQB", 9, 7, 0))


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
    frames = [response_frame(1, encode_outputs({"text_output": np.array([f"t{i}"], dtype=object)}), False)
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
