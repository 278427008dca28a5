"""bls.engine_http and EngineStreams' HTTP path, against an in-process server that answers generate_stream
the way Triton does (HTTP/1.1 keep-alive, chunked server-sent events, in-band error events)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from bls.engine_http import Disconnected, GenerateStreams, ResponseReader, carries, request_body
from bls.engine_streams import EngineStreams
from bls.errors import ModelStepError
from tests.unit.test_engine_streams import read_to_the_end

ONE_TOKEN = {"input_ids": np.ones((1, 1), np.int32)}


class _Engine:
    """What the fake endpoint streams, and what it saw."""

    def __init__(self):
        self.tokens: list[int] = [11, 12, 13]
        self.error = ""  # sent as an in-band error event after the first token
        self.refuse = ""  # sent as the first response, an error: status 400 with an SSE body, as Triton does
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.connections = 0
        self.closed = threading.Semaphore(0)  # released once per connection that ended
        self.disconnected = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.close_after_each = False
        self.drop_second_request = False  # a keep-alive connection closed on its next request, unanswered
        self.break_inside_chunk = False  # the connection breaks halfway through the second event
        self.foreign_id = ""  # the second event carries this id instead of the request's


def _handler(engine: _Engine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            engine.connections += 1

        def finish(self):
            super().finish()
            engine.closed.release()

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.served = getattr(self, "served", 0) + 1
            if engine.drop_second_request and self.served == 2:
                self.close_connection = True
                return
            engine.paths.append(self.path)
            engine.bodies.append(body)
            if engine.refuse:
                payload = f'data: {json.dumps({"error": engine.refuse})}\n\n'.encode()
                self.send_response(400)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            if engine.close_after_each:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                for index, token in enumerate(engine.tokens):
                    if index and not engine.release.wait(10):
                        break
                    event = {"model_name": "tensorrt_llm", "model_version": "1", "output_ids": token,
                             "sequence_length": 1}
                    if "id" in body:  # as Triton's generate endpoint answers: the request's id in every event
                        event["id"] = engine.foreign_id if engine.foreign_id and index == 1 else body["id"]
                    data = f"data: {json.dumps(event)}\n\n".encode()
                    if engine.break_inside_chunk and index == 1:
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data[:10])
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self._chunk(data)
                    if engine.error:
                        self._chunk(f'data: {json.dumps({"error": engine.error})}\n\n'.encode())
                        break
                self._chunk(b"")
            except OSError:
                engine.disconnected.set()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


@pytest.fixture
def http_engine():
    engine = _Engine()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # No gRPC server: a request routed there would fail to connect, so these tests see the HTTP path only.
    yield engine, EngineStreams("127.0.0.1:1", f"127.0.0.1:{server.server_port}")
    engine.release.set()
    server.shutdown()
    server.server_close()


def test_streams_each_event_and_sends_the_request_as_the_generate_endpoint_reads_it(http_engine):
    engine, streams = http_engine
    inputs = {"input_ids": np.array([[1, 2, 3]], np.int32), "streaming": np.array([[True]]),
              "stop_words_list": np.array([[[5, 6], [2, -1]]], np.int32),
              "temperature": np.array([[0.5]], np.float32)}
    responses = list(streams.stream("tensorrt_llm", inputs, ["output_ids", "sequence_length"], "req-1"))
    assert [r["output_ids"].shape for r in responses] == [(1, 1, 1)] * 3
    assert [r["output_ids"].item() for r in responses] == [11, 12, 13]
    assert [r["sequence_length"].tolist() for r in responses] == [[[1]]] * 3
    assert engine.paths == ["/v2/models/tensorrt_llm/generate_stream"]
    assert engine.bodies == [{"id": "req-1", "input_ids": [1, 2, 3], "streaming": [True],
                              "stop_words_list": [5, 6, 2, -1], "temperature": [0.5]}]


def test_a_stream_read_to_its_end_leaves_its_connection_for_the_next(http_engine):
    engine, streams = http_engine
    for _ in range(3):
        assert len(list(streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"]))) == 3
    assert engine.connections == 1


def test_a_connection_the_server_closed_while_idle_is_replaced(http_engine):
    engine, streams = http_engine
    engine.close_after_each = True
    for _ in range(3):
        assert [r["output_ids"].item() for r in streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"])] == [11, 12, 13]
    assert engine.connections == 3


def test_a_kept_alive_connection_left_idle_is_closed(http_engine):
    """tritonserver's shutdown waits for every open HTTP connection: the pool must not keep one for ever."""
    engine, streams = http_engine
    streams._http.IDLE_S = 0.2
    assert len(list(streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"]))) == 3
    assert engine.closed.acquire(timeout=10)
    assert len(list(streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"]))) == 3  # on a new one
    assert engine.connections == 2


def test_a_reused_connection_closed_before_answering_is_replaced(http_engine):
    """The server may close an idle keep-alive connection just as a request goes out on it: the request was never
    read, so it is sent again on a new connection."""
    engine, streams = http_engine
    engine.drop_second_request = True
    for _ in range(2):
        assert [r["output_ids"].item() for r in streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"])] == [11, 12, 13]
    assert engine.connections == 2 and len(engine.bodies) == 2


def test_a_connection_broken_inside_a_chunk_is_an_error_not_an_end(http_engine):
    engine, streams = http_engine
    engine.break_inside_chunk = True
    with pytest.raises(ModelStepError) as caught:
        list(streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"]))
    assert caught.value.kind == "unavailable" and "before the stream's end" in str(caught.value)


def test_stream_each_hands_every_stream_to_one_reader_thread(http_engine):
    """What the BLS does: each response is handled on the thread that reads every engine stream, not the caller's."""
    engine, streams = http_engine
    seen: dict[str, list] = {}

    def read(request_id: str) -> None:
        def on_response(response) -> bool:
            seen[request_id].append((threading.current_thread().name, response["output_ids"].item()))
            return True

        seen[request_id] = []
        assert streams.stream_each("tensorrt_llm", ONE_TOKEN, ["output_ids"], request_id, on_response) is True

    callers = [threading.Thread(target=read, args=(f"r{i}",)) for i in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    assert {rid: [token for _, token in events] for rid, events in seen.items()} == {f"r{i}": [11, 12, 13] for i in range(4)}
    assert {name for events in seen.values() for name, _ in events} == {"engine-http-reader"}


def test_after_each_sweep_the_reader_calls_back_on_its_own_thread_and_survives_a_failing_call(http_engine):
    """The BLS sends what a sweep's events queued there (ResponseLoop.send_waiting)."""
    _, plain = http_engine
    handled, sweeps = [], []

    def after_sweep() -> None:
        sweeps.append((threading.current_thread().name, len(handled)))
        if len(sweeps) == 1:
            raise RuntimeError("a failing callback")

    streams = EngineStreams("127.0.0.1:1", plain.http_url, after_http_sweep=after_sweep)
    for request_id in ("r0", "r1"):
        assert streams.stream_each("tensorrt_llm", ONE_TOKEN, ["output_ids"], request_id,
                                   lambda response: handled.append(response["output_ids"].item()) or True)
    assert handled == [11, 12, 13] * 2, "the reader went on after the callback failed"
    assert {name for name, _ in sweeps} == {"engine-http-reader"}
    assert sweeps[-1][1] == 6, "called after the sweep that handed on the last events"


def test_stream_each_stops_when_told_and_raises_what_the_handler_raised(http_engine):
    engine, streams = http_engine
    engine.tokens = list(range(100))
    engine.release.clear()  # one token, then the engine waits: the stream is open when the handler says stop
    assert streams.stream_each("tensorrt_llm", ONE_TOKEN, ["output_ids"], "r", lambda response: False) is False
    engine.release.set()
    assert engine.disconnected.wait(5)  # the connection was closed: Triton cancels the request

    def broken(response):
        raise ValueError("detokenizing failed")

    engine.disconnected.clear()
    engine.release.clear()
    with pytest.raises(ValueError, match="detokenizing failed"):
        streams.stream_each("tensorrt_llm", ONE_TOKEN, ["output_ids"], "r", broken)
    engine.release.set()
    assert engine.disconnected.wait(5)
    # The reader goes on serving other streams.
    assert streams.stream_each("tensorrt_llm", ONE_TOKEN, ["output_ids"], "r", lambda response: True) is True


_TRITON_STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"17\r\ndata: {\"output_ids\": 1}\r\n"  # an event split over two chunks
                  b"2\r\n\n\n\r\n"
                  b"32\r\ndata: {\"output_ids\": 2}\n\ndata: {\"output_ids\": 3}\n\n\r\n"
                  b"0\r\n\r\n")


@pytest.mark.parametrize("piece", [1, 7, len(_TRITON_STREAM)])
def test_the_response_reader_finds_the_same_events_however_the_bytes_arrive(piece):
    reader = ResponseReader()
    events = []
    for start in range(0, len(_TRITON_STREAM), piece):
        assert not reader.complete
        events += reader.feed(_TRITON_STREAM[start:start + piece])
    assert [json.loads(event) for event in events] == [{"output_ids": 1}, {"output_ids": 2}, {"output_ids": 3}]
    assert reader.complete and reader.reusable and reader.refusal() is None


def test_the_response_reader_reads_a_refusal_and_tells_a_cut_stream_from_a_whole_one():
    refusal = ResponseReader()
    body = b'data: {"error": "input_ids: too long"}\n\n'
    refusal.feed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert refusal.complete and str(refusal.refusal()) == "input_ids: too long"
    cut = ResponseReader()
    cut.feed(_TRITON_STREAM[:-5])
    assert not cut.complete and isinstance(cut.at_close(None), Disconnected)
    with pytest.raises(Disconnected):
        ResponseReader().feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")


_INTERNAL = "tensorrt_llm: internal error (KeyError: 'x'); see the server log"
_TOO_LONG = "request_output_len: input length 9 + request_output_len 9 = 18 exceeds max_seq_len 16"


@pytest.mark.parametrize("how, message, kind, reported", [
    # an error event after a token (status 200), e.g. the engine failing mid-generation
    ("error", _INTERNAL, "internal", _INTERNAL),
    # a refusal as the first response: Triton answers 400 with an SSE body
    ("refuse", _TOO_LONG, "client", f"tensorrt_llm: {_TOO_LONG}"),
])
def test_an_engine_error_keeps_its_message_and_class(http_engine, how, message, kind, reported):
    engine, streams = http_engine
    setattr(engine, how, message)
    with pytest.raises(ModelStepError) as caught:
        list(streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"]))
    assert caught.value.kind == kind
    assert str(caught.value) == reported


def test_an_event_of_another_request_ends_the_stream_with_an_error(http_engine):
    """Someone else's tokens are never handed on: each event must carry the stream's own request id."""
    engine, streams = http_engine
    engine.foreign_id = "someone-else-0"
    received = []
    with pytest.raises(ModelStepError, match="an event of request 'someone-else-0' arrived on the stream of "
                                             "request 'mine-0'") as caught:
        for response in streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"], "mine-0"):
            received.append(response["output_ids"].item())
    assert received == [11]
    assert caught.value.kind == "internal"
    assert engine.closed.acquire(timeout=5)  # that connection is not kept for another stream


def test_a_stream_silent_after_its_start_ends_with_an_error(http_engine, monkeypatch):
    """A response lost on the way (Triton's HTTP frontend drops them when a thread's queue is full) must not
    leave the BLS waiting forever: a started stream silent for SILENCE_S ends with an error."""
    engine, streams = http_engine
    monkeypatch.setattr(GenerateStreams, "SILENCE_S", 0.5)
    monkeypatch.setattr(GenerateStreams, "CHECK_S", 0.1)
    engine.release.clear()  # the first token goes out, then nothing
    received = []
    with pytest.raises(ModelStepError, match="no event for 0.5 s after 1 events") as caught:
        for response in streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"], "slow-0"):
            received.append(response["output_ids"].item())
    assert received == [11] and caught.value.kind == "internal"
    engine.release.set()
    assert engine.disconnected.wait(5)  # its connection was closed: Triton cancels the engine request


def test_closing_the_stream_early_closes_the_connection(http_engine):
    """How an HTTP client cancels: Triton cancels the request when its connection goes."""
    engine, streams = http_engine
    engine.tokens = list(range(100))
    engine.release.clear()  # the engine sends one token, then waits: the stream is still open when we close it
    responses = streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"])
    next(responses)
    responses.close()
    engine.release.set()  # its next writes go to a closed connection
    assert engine.disconnected.wait(5)


def test_cancel_interrupts_a_reader_waiting_for_the_engine(http_engine):
    engine, streams = http_engine
    engine.tokens = list(range(100))
    outcome = []
    first_seen = threading.Barrier(3)
    engine.release.clear()  # the engine is slow: every reader waits for its next response
    readers = [threading.Thread(target=read_to_the_end, args=(streams, rid, outcome, lambda: first_seen.wait(5)))
               for rid in ("req-1-0", "req-10-0")]
    for reader in readers:
        reader.start()
    first_seen.wait(5)
    streams.cancel("req-1")  # the children of req-1 (ids "req-1-..."), not those of req-10
    readers[0].join(5)
    assert outcome == [("req-1-0", "cancelled")]
    engine.release.set()
    readers[1].join(10)
    assert outcome[-1] == ("req-10-0", "finished")


def test_an_unreachable_endpoint_names_the_setting_to_fix():
    streams = EngineStreams("127.0.0.1:1", "127.0.0.1:1")
    with pytest.raises(ModelStepError) as caught:
        list(streams.stream("tensorrt_llm", ONE_TOKEN, ["output_ids"]))
    assert caught.value.kind == "unavailable"
    assert "engine_http_url" in str(caught.value) and "127.0.0.1:1" in str(caught.value)


@pytest.mark.parametrize("inputs, outputs, carried", [
    ({"input_ids": np.ones((1, 5), np.int32), "request_output_len": np.array([[8]], np.int32)},
     {"output_ids", "sequence_length"}, True),
    ({"stop_words_list": np.ones((1, 2, 3), np.int32)}, {"output_ids"}, True),
    ({"guided_decoding_guide": np.array([[b"caf\xc3\xa9"]], dtype=object)}, {"output_ids"}, True),
    # outputs the endpoint would flatten without a way to tell their shape back
    (ONE_TOKEN, {"output_ids", "generation_logits"}, False),
    (ONE_TOKEN, {"output_ids", "cum_log_probs"}, False),
    ({**ONE_TOKEN, "beam_width": np.array([[2]], np.int32)}, {"output_ids"}, False),
    # shapes the endpoint would derive differently from the element count
    ({"input_ids": np.ones((2, 5), np.int32)}, {"output_ids"}, False),
    ({"stop_words_list": np.ones((1, 2, 3, 1), np.int32)}, {"output_ids"}, False),
    ({"input_ids": np.ones((1, 0), np.int32)}, {"output_ids"}, False),
    # dtypes without an exact JSON form
    ({"prompt_embedding_table": np.ones((1, 1, 4), np.float16)}, {"output_ids"}, False),
    ({"guided_decoding_guide": np.array([[b"\xff"]], dtype=object)}, {"output_ids"}, False),
    ({"temperature": np.array([[np.nan]], np.float32)}, {"output_ids"}, False),
    ({"not_an_engine_input": np.ones((1, 1), np.int32)}, {"output_ids"}, False),
])
def test_carries_only_what_the_generate_endpoint_rebuilds_exactly(inputs, outputs, carried):
    assert carries(inputs, frozenset(outputs)) is carried


def test_request_body_flattens_values_and_decodes_strings():
    body = json.loads(request_body({"input_ids": np.array([[7, 8]], np.int32),
                                    "guided_decoding_guide": np.array([[b"x"]], dtype=object)}, ""))
    assert body == {"input_ids": [7, 8], "guided_decoding_guide": ["x"]}
