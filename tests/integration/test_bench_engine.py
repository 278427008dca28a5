"""The benchmark's C++ engine (tools/bench_engine) serves the tensorrt_llm contract as the benchmark needs it: one
response per token with the text cycle's tokens, request_output_len and end_id honoured, cancellation freeing the
slot, and its queue limit refusing with UNAVAILABLE, which reaches Triton's HTTP clients as 503 before the first
response (through tensorrt_llm_bls and the ensemble too), never a 400. And the BLS and the ensemble run on it.

Starts its own server (not possible with --server-url); needs a C++ compiler.
"""

from __future__ import annotations

import queue
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from embedded_engine.synthetic import TEXT_CYCLE
from engine_build.repository import can_compile_relay
from serving.tritonserver import TritonServer
from testkit.grpc import grpc_stream, tensor
from testkit.http import HttpError, HttpSession, generate, generate_stream
from tests.integration.conftest import assembled_repository
from tests.integration.test_bls import BLS, streamed_text
from tests.integration.test_engine import ENGINE, OUTPUTS, engine_inputs, streamed_tokens
from tools import bench_engine

PROMPT = [128000, 9906, 1917]
MAX_ACTIVE = 2  # and no queue: two held streams fill the engine
LONG = 100_000  # tokens: 500 s at 5 ms a step, so a stream ends early only if cancelled
TEXT_BODY = {"text_input": "Once upon a time", "max_tokens": 24, "end_id": -1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("the bench engine needs a C++ compiler (g++ or CXX)")
    repo = assembled_repository(tmp_path_factory, "bench-engine", synthetic=True)
    bench_engine.install(repo, step_ms=5.0, max_active_requests=MAX_ACTIVE, max_queued_requests=0)
    with TritonServer(repo, log_path=tmp_path_factory.mktemp("log") / "tritonserver.log") as server:
        yield server


def expected_tokens(prompt_length: int, count: int) -> list[int]:
    return [TEXT_CYCLE[(prompt_length + i) % len(TEXT_CYCLE)] for i in range(count)]


def test_one_response_per_token_the_text_cycle_from_the_prompt_length(server):
    streamed = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 24, streaming=True), OUTPUTS)
    assert streamed.error is None and streamed.completed
    assert len(streamed.responses) == 24  # never merged: as TensorRT-LLM's C++ backend streams
    assert streamed_tokens(streamed) == expected_tokens(len(PROMPT), 24)
    whole = generate(server.http_url, ENGINE, {"input_ids": PROMPT, "input_lengths": [len(PROMPT)],
                                               "request_output_len": [24]})
    assert list(whole["output_ids"]) == expected_tokens(len(PROMPT), 24)
    assert np.ravel(whole["sequence_length"]).tolist() == [24]


def test_the_end_id_ends_the_sequence_and_is_not_sent(server):
    end_id = expected_tokens(len(PROMPT), 7)[6]
    streamed = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 50, streaming=True, end_id=np.int32(end_id)),
                           OUTPUTS)
    assert streamed.error is None and streamed.completed
    assert streamed_tokens(streamed) == expected_tokens(len(PROMPT), 6)
    assert streamed.responses[-1]["sequence_length"].reshape(-1).tolist() == [0]  # the end: a response of no token


def test_an_unsupported_flag_is_refused_naming_it(server):
    result = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 4, streaming=True, return_log_probs=True),
                         OUTPUTS)
    assert result.error is not None and "return_log_probs" in result.error


@pytest.mark.parametrize("model", [BLS, "ensemble"])
def test_the_bls_and_the_ensemble_stream_their_non_streamed_text(server, model):
    full = generate(server.http_url, model, TEXT_BODY)["text_output"]
    events = generate_stream(server.http_url, model, {**TEXT_BODY, "stream": True})
    assert full and streamed_text(events) == full


class HeldStream:
    """A long engine stream over gRPC, generating once its first response came; cancel() cancels it."""

    def __init__(self, grpc_url: str):
        self._events: queue.Queue = queue.Queue()
        self._client = grpcclient.InferenceServerClient(grpc_url)
        self._client.start_stream(callback=lambda result, error: self._events.put((result, error)))
        inputs = engine_inputs(PROMPT, LONG, streaming=True)
        self._client.async_stream_infer(ENGINE, [tensor(k, v) for k, v in inputs.items()], request_id=uuid.uuid4().hex,
                                        outputs=[grpcclient.InferRequestedOutput(o) for o in OUTPUTS])
        result, error = self._events.get(timeout=30)
        assert error is None and result.as_numpy("output_ids") is not None

    def cancel(self) -> None:
        self._client.stop_stream(cancel_requests=True)
        self._client.close()


def test_beyond_the_queue_limit_every_path_answers_unavailable_and_cancelling_frees_the_slots(server):
    held = [HeldStream(server.grpc_url) for _ in range(MAX_ACTIVE)]
    try:
        session = HttpSession(server.http_url, timeout_s=30)
        for model, body in ((ENGINE, {"input_ids": PROMPT, "input_lengths": [len(PROMPT)], "request_output_len": [4],
                                      "streaming": True}),
                            (BLS, {**TEXT_BODY, "stream": True}), ("ensemble", {**TEXT_BODY, "stream": True})):
            with pytest.raises(HttpError) as refused:
                session.generate_stream(model, body)
            # The status is not ours to give: Triton's generate endpoints compute it from the first response's error
            # after freeing it (server src/http_server.cc GenerateRequestClass::InferResponseComplete: AddErrorJson
            # deletes `err`, then HttpCodeFromError(err); r24.10 lines 4187/4194, r26.07 4406/4413), so the code
            # read is garbage and falls to 400 (docs/operations.md, "Overload"). The message carries the refusal.
            assert refused.value.status >= 400 and "Exceeds maximum queue size" in refused.value.message, model
            session.close()
            with pytest.raises(HttpError) as refused:
                generate(server.http_url, model, {**body, "stream": False})
            assert refused.value.status >= 400 and "Exceeds maximum queue size" in refused.value.message, model
        over_grpc = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 4, streaming=True), OUTPUTS)
        assert over_grpc.error is not None and "Exceeds maximum queue size" in over_grpc.error
    finally:
        for stream in held:
            stream.cancel()
    # Cancelled, the held streams end at their next step and free their slots (else they would run 500 s more).
    deadline = time.monotonic() + 30
    while True:
        result = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 4, streaming=True), OUTPUTS)
        if result.error is None:
            break
        assert "Exceeds maximum queue size" in result.error and time.monotonic() < deadline, result.error
        time.sleep(0.2)
    assert result.completed and streamed_tokens(result) == expected_tokens(len(PROMPT), 4)
    assert np.array_equal(result.responses[0]["output_ids"].reshape(-1), expected_tokens(len(PROMPT), 1))
