"""The benchmark's stand-in engine behind its relay (tools/engine_relay, what the soak and `make bench --engine
python` serve): tensorrt_llm is the C++ relay and the synthetic embedded engine runs as tensorrt_llm_python.
Clients and the BLS must see tensorrt_llm exactly as without it: one response per token, the same tokens, `stop`,
cancellation reaching the engine, errors naming the field. Otherwise the benchmark's figures would come from
an engine that behaves differently.

Starts its own server (not possible with --server-url); needs a C++ compiler for the relay.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from embedded_engine.synthetic import TEXT_CYCLE
from engine_build.repository import can_compile_relay
from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream
from testkit.metrics import wait_for_value
from tests.integration.conftest import built_repository_server
from tests.integration.test_bls import BLS, PROMPTS, streamed_text
from tests.integration.test_engine import ENGINE, OUTPUTS, engine_inputs, streamed_tokens
from tests.integration.test_text import strings
from tools import engine_relay

ENGINE_PYTHON = "tensorrt_llm_python"
PROMPT = [128000, 9906, 1917]


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("the relay needs a C++ compiler (g++ or CXX)")
    # Paced (5 ms steps, as make bench paces it): unpaced, the stand-in would finish 3,000 tokens before a `stop`.
    with built_repository_server(request, tmp_path_factory, "engine-relay", then=engine_relay.install,
                                 synthetic=True, step_ms=5.0) as server:
        yield server


def test_the_engine_streams_one_response_per_token_with_the_tokens_it_returns_unstreamed(server):
    body = {"input_ids": PROMPT, "input_lengths": [len(PROMPT)], "request_output_len": [24],
            "exclude_input_in_output": True}
    full = generate(server.http_url, ENGINE, body)["output_ids"]
    result = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 24, streaming=True,
                                                                exclude_input_in_output=True), OUTPUTS)
    assert result.error is None and result.completed
    assert len(result.responses) == 24  # never merged: as TensorRT-LLM's C++ backend streams
    assert streamed_tokens(result) == list(full) and set(full) <= set(TEXT_CYCLE)


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_the_bls_streams_exactly_its_non_streamed_text(server, prompt):
    body = {"text_input": prompt, "max_tokens": 40, "end_id": -1}
    full = generate(server.http_url, BLS, body)["text_output"]
    events = generate_stream(server.http_url, BLS, {**body, "stream": True})
    assert full and streamed_text(events) == full
    assert events[-1]["finish_reason"] == "length"


def test_a_stop_request_ends_the_running_request(server):
    request_id = uuid.uuid4().hex
    outcome = {}

    def long_request():
        outcome["result"] = grpc_stream(server.grpc_url, ENGINE, engine_inputs(PROMPT, 3000, streaming=True),
                                        OUTPUTS, request_id=request_id, timeout=120)

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)
    stop = grpc_stream(server.grpc_url, ENGINE, engine_inputs([0], 1, stop=True), OUTPUTS, request_id=request_id)
    assert stop.error is None and stop.completed  # answered through the relay with a final response
    thread.join(60)
    result = outcome["result"]
    assert result.completed and result.error is None
    assert 0 < len(streamed_tokens(result)) < 3000


@pytest.mark.parametrize("model, inputs, outputs", [
    (ENGINE, engine_inputs(PROMPT, 3000, streaming=True), OUTPUTS),
    (BLS, {"text_input": strings("Once upon a time"), "max_tokens": np.array([[3000]], dtype=np.int32),
           "stream": np.array([[True]])}, ["text_output"]),
])
def test_a_cancelled_client_stops_the_engine(server, model, inputs, outputs):
    result = grpc_stream(server.grpc_url, model, inputs, outputs, cancel_after=3)
    assert len(result.responses) == 3 and not result.completed
    assert wait_for_value(server.metrics_url, "embedded_engine_active_sequences", ENGINE_PYTHON, 0), \
        "the engine behind its relay kept generating for a cancelled request"


def test_a_bad_input_is_an_error_naming_the_field_and_the_server_keeps_serving(server):
    with pytest.raises(HttpError) as error:
        generate(server.http_url, ENGINE, {"input_ids": PROMPT, "input_lengths": [3], "request_output_len": [0]})
    assert "request_output_len" in error.value.message and "Traceback" not in error.value.message
    ok = generate(server.http_url, ENGINE, {"input_ids": PROMPT, "input_lengths": [3], "request_output_len": [2],
                                            "exclude_input_in_output": True})
    assert len(ok["output_ids"]) == 2
