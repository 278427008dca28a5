"""bls.engine_streams against an in-process gRPC server that speaks Triton's GRPCInferenceService."""

from __future__ import annotations

import os
from pathlib import Path
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor

from bls.engine_streams import EngineStreams, endpoints, error_kind, grpc_url_of, http_url_of, open_files_warning
from bls.errors import GenerationCancelled, ModelStepError


def read_to_the_end(streams: EngineStreams, request_id: str, outcome: list, on_first=lambda: None) -> None:
    """Read one engine stream; record (request_id, "finished" or "cancelled") in `outcome`."""
    try:
        for index, _ in enumerate(streams.stream("tensorrt_llm", {"input_ids": np.ones((1, 1), np.int32)},
                                                 ["output_ids"], request_id)):
            if index == 0:
                on_first()
        outcome.append((request_id, "finished"))
    except GenerationCancelled:
        outcome.append((request_id, "cancelled"))


class _Engine(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Streams `tokens` one response each (the last flagged final), or an error; records what it got."""

    def __init__(self):
        self.tokens = [11, 12, 13]
        self.error = ""
        self.requests: list[service_pb2.ModelInferRequest] = []
        self.cancelled = threading.Event()
        self.release = threading.Event()  # set: stream everything without waiting
        self.release.set()

    def ModelStreamInfer(self, request_iterator, context):
        context.add_callback(lambda: self.cancelled.set() if not context.is_active() else None)
        for request in request_iterator:
            self.requests.append(request)
            if self.error:
                yield service_pb2.ModelStreamInferResponse(error_message=self.error)
                return
            for index, token in enumerate(self.tokens):
                self.release.wait(10)
                response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                response.outputs.add(name="output_ids", datatype="INT32", shape=[1, 1, 1])
                response.raw_output_contents.append(np.array([[[token]]], np.int32).tobytes())
                response.parameters["triton_final_response"].bool_param = index == len(self.tokens) - 1
                yield service_pb2.ModelStreamInferResponse(infer_response=response)


@pytest.fixture
def engine():
    servicer = _Engine()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, EngineStreams(f"127.0.0.1:{port}")
    server.stop(0)


def test_streams_each_response_and_sends_the_request_as_given(engine):
    servicer, streams = engine
    inputs = {"input_ids": np.array([[1, 2, 3]], np.int32), "streaming": np.array([[True]]),
              "bad_words": np.array([[b"x"]], dtype=object)}
    got = [r["output_ids"].item() for r in streams.stream("tensorrt_llm", inputs, ["output_ids"], "req-1")]
    assert got == [11, 12, 13]
    (request,) = servicer.requests
    assert (request.model_name, request.id) == ("tensorrt_llm", "req-1")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("input_ids", "INT32", [1, 3]), ("streaming", "BOOL", [1, 1]), ("bad_words", "BYTES", [1, 1])]
    assert np.frombuffer(request.raw_input_contents[0], np.int32).tolist() == [1, 2, 3]
    assert deserialize_bytes_tensor(request.raw_input_contents[2]).tolist() == [b"x"]
    assert [o.name for o in request.outputs] == ["output_ids"]


def test_an_engine_error_keeps_its_class(engine):
    servicer, streams = engine
    servicer.error = "request_output_len: input length 9 + request_output_len 9 = 18 exceeds the engine's max_seq_len 16"
    with pytest.raises(ModelStepError) as caught:
        list(streams.stream("tensorrt_llm", {"input_ids": np.ones((1, 1), np.int32)}, ["output_ids"]))
    assert caught.value.kind == "client"
    assert str(caught.value).startswith("tensorrt_llm: request_output_len: ")


def test_closing_the_stream_early_cancels_the_engine_request(engine):
    servicer, streams = engine
    servicer.tokens = list(range(100))
    responses = streams.stream("tensorrt_llm", {"input_ids": np.ones((1, 1), np.int32)}, ["output_ids"])
    next(responses)
    servicer.release.clear()  # the engine is still generating
    responses.close()
    assert servicer.cancelled.wait(5)
    servicer.release.set()


def test_cancel_interrupts_a_reader_waiting_for_the_engine(engine):
    """EngineStreams.cancel (the client went away): the reader stops now, not at the engine's next response,
    and the engine request is cancelled; streams of other requests go on."""
    servicer, streams = engine
    servicer.tokens = list(range(100))
    outcome = []
    servicer.release.clear()  # the engine is slow: every reader waits for its next response
    readers = [threading.Thread(target=read_to_the_end, args=(streams, rid, outcome)) for rid in ("req-1-0", "req-10-0")]
    for reader in readers:
        reader.start()
    while len(servicer.requests) < 2:
        threading.Event().wait(0.01)
    streams.cancel("req-1")  # the children of req-1 (ids "req-1-..."), not those of req-10
    readers[0].join(5)
    assert outcome == [("req-1-0", "cancelled")]
    assert servicer.cancelled.wait(5)
    servicer.release.set()
    readers[1].join(10)
    assert outcome[-1] == ("req-10-0", "finished")


def test_an_unreachable_endpoint_names_the_setting_to_fix():
    with socket_port() as port:
        streams = EngineStreams(f"127.0.0.1:{port}")
        with pytest.raises(ModelStepError) as caught:
            list(streams.stream("tensorrt_llm", {"input_ids": np.ones((1, 1), np.int32)}, ["output_ids"]))
    assert caught.value.kind == "unavailable"
    assert "engine_grpc_url" in str(caught.value) and f"127.0.0.1:{port}" in str(caught.value)


@pytest.mark.parametrize("message, kind", [
    ("tensorrt_llm: at capacity: 16 sequences running and 64 waiting (...); retry later", "unavailable"),
    ("tensorrt_llm: the model is unloading", "unavailable"),
    ("end_id: must be a token id below the vocabulary size 128256, got -5", "client"),
    ("tensorrt_llm: internal error (KeyError: 'x'); see the server log", "internal"),
    ("Encountered an error in forwardAsync function: out of memory", "internal"),
])
def test_error_kinds(message, kind):
    assert error_kind(message) == kind


def test_the_address_comes_from_tritonservers_command_line():
    assert grpc_url_of(["tritonserver", "--model-repository=/m"]) == "127.0.0.1:8001"
    assert grpc_url_of(["tritonserver", "--grpc-port=9101", "--grpc-address=0.0.0.0"]) == "127.0.0.1:9101"
    assert grpc_url_of(["tritonserver", "--grpc-port", "9102", "--grpc-address", "10.0.0.7"]) == "10.0.0.7:9102"
    with pytest.raises(ValueError, match="allow-grpc"):
        grpc_url_of(["tritonserver", "--allow-grpc=false"])
    assert http_url_of(["tritonserver", "--model-repository=/m"]) == "127.0.0.1:8000"
    assert http_url_of(["tritonserver", "--http-port", "9100", "--http-address=10.0.0.7"]) == "10.0.0.7:9100"
    assert http_url_of(["tritonserver", "--allow-http=false"]) is None  # then everything goes over gRPC


def test_what_http_cannot_carry_exactly_goes_over_grpc(engine):
    """Logits come back over gRPC with their shapes even when an HTTP endpoint is configured (here nothing
    listens there, so a request sent to it would fail)."""
    servicer, grpc_only = engine
    streams = EngineStreams(grpc_only.grpc_url, "127.0.0.1:1")
    got = list(streams.stream("tensorrt_llm", {"input_ids": np.ones((1, 1), np.int32)},
                              ["output_ids", "generation_logits"], "req-2"))
    assert len(got) == 3 and [r.id for r in servicer.requests] == ["req-2"]


def test_configured_addresses_win():
    assert endpoints("triton:9001", "triton:9000", server_pid=-1) == ("triton:9001", "triton:9000")
    grpc, http = endpoints("", "", server_pid=os.getpid())  # this process: Triton's default ports
    assert (grpc, http) == ("127.0.0.1:8001", "127.0.0.1:8000")


class socket_port:
    """A loopback port that nothing listens on."""

    def __enter__(self) -> int:
        import socket
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self._sock.close()


_LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max processes             127441               127441               processes
Max open files            {soft}                 524288               files
"""


def test_a_low_open_file_limit_is_named_at_load():
    """Each BLS stream holds an HTTP connection to the server: 8 instances x 256 streams need more than 1024."""
    warning = open_files_warning(_LIMITS.format(soft=1024), streams=2048)
    assert warning is not None and "1024" in warning and "ulimit -n" in warning and "2048" in warning
    assert open_files_warning(_LIMITS.format(soft=1048576), streams=2048) is None
    assert open_files_warning(Path("/proc/self/limits").read_text(), streams=1) is None
