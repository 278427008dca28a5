"""The ensemble through the handoff (relay/handoff.h), against a server of its own: a repository built with sender
threads, which `make repo` gives hosts of 8 cores or more (on a smaller one, such as CI's, the session server's
ensemble calls the engine directly). Clients must see exactly what the engine sends, in order: text, generation
details, batches, errors.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from engine_build.repository import HANDOFF_MODEL, can_compile_relay
from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream, streamed_texts
from tests.integration.conftest import built_repository_server

ENSEMBLE = "ensemble"
BLS = "tensorrt_llm_bls"
SENDERS = 2
# The engine fails at its third token (tests/integration/test_faults.py says how, with no test hook).
ENGINE_FAILS_AT_THIRD_TOKEN = {"frequency_penalty": -3e38, "top_k": 50, "end_id": -1}
PROMPTS = ("Tell me a story about a brave little toaster.", "Der Käse ist 100 % naturbelassen — 日本語も")


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("no C++ compiler here: the handoff is part of the relay (relay/)")
    with built_repository_server(request, tmp_path_factory, "handoff", relay="on",
                                 handoff_sender_threads=SENDERS) as server:
        yield server


def _model_config(server, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/config", timeout=30) as response:
        return json.loads(response.read())


def _sender_threads(pid: int) -> int:
    return sum(1 for task in Path(f"/proc/{pid}/task").iterdir()
               if (task / "comm").read_text().strip() == "handoff_sender")


def test_the_ensemble_goes_through_the_handoff_and_its_senders(server):
    steps = _model_config(server, ENSEMBLE)["ensemble_scheduling"]["step"]
    assert [step["model_name"] for step in steps] == ["preprocessing", HANDOFF_MODEL, "postprocessing"]
    assert _model_config(server, HANDOFF_MODEL)["parameters"]["handoff_to"]["string_value"] == "tensorrt_llm"
    assert _sender_threads(server.process.pid) == SENDERS


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_text_through_the_handoff_is_the_text_unstreamed_and_the_bls_text(server, prompt):
    body = {"text_input": prompt, "max_tokens": 24, "end_id": -1}
    whole = generate(server.http_url, ENSEMBLE, body)["text_output"]
    events = generate_stream(server.http_url, ENSEMBLE, {**body, "stream": True})
    assert "".join(event["text_output"] for event in events) == whole
    assert generate(server.http_url, BLS, body)["text_output"] == whole
    assert len(events) >= 24  # one response per engine response, in order: nothing merged, nothing lost


def test_concurrent_streams_over_the_senders_each_keep_their_own_text_in_order(server):
    """Streams spread over the senders (one stream on one sender): each stream's events add up to its own text."""
    bodies = [{"text_input": f"{PROMPTS[i % 2]} ({i})", "max_tokens": 10 + i, "end_id": -1} for i in range(12)]
    for body, text in zip(bodies, streamed_texts(server.http_url, ENSEMBLE, bodies), strict=True):
        assert text == generate(server.http_url, ENSEMBLE, body)["text_output"], body


def test_generation_details_pass_through_unchanged(server):
    """Outputs the engine sends only when asked (log probs, perf metrics, token counts) reach the ensemble's client
    as the engine sent them; the ones it was not asked for stay absent."""
    body = {"text_input": PROMPTS[0], "max_tokens": 8, "end_id": -1, "return_log_probs": True,
            "return_perf_metrics": True}
    ensemble = generate(server.http_url, ENSEMBLE, body)
    bls = generate(server.http_url, BLS, body)
    assert ensemble["text_output"] == bls["text_output"]
    assert np.allclose(ensemble["cum_log_probs"], bls["cum_log_probs"], atol=1e-5)
    assert np.allclose(ensemble["output_log_probs"], bls["output_log_probs"], atol=1e-5)
    assert ensemble["kv_cache_alloc_total_blocks"] >= 1 and ensemble["first_token_time_ns"] > 0
    assert "context_logits" not in ensemble and "generation_logits" not in ensemble
    plain = generate(server.http_url, ENSEMBLE, {"text_input": PROMPTS[0], "max_tokens": 8, "end_id": -1})
    assert "cum_log_probs" not in plain and "arrival_time_ns" not in plain


def test_a_batch_of_rows_keeps_each_rows_text(server):
    """Two rows in one gRPC request: each row's streamed responses carry its batch_index and add up to that row's
    text alone."""
    alone = [generate(server.http_url, ENSEMBLE, {"text_input": p, "max_tokens": 12, "end_id": -1})["text_output"]
             for p in PROMPTS]
    inputs = {"text_input": np.array([[p.encode()] for p in PROMPTS], dtype=object),
              "max_tokens": np.array([[12], [12]], np.int32), "end_id": np.array([[-1], [-1]], np.int32),
              "stream": np.array([[True], [True]])}
    result = grpc_stream(server.grpc_url, ENSEMBLE, inputs, ["text_output", "batch_index"], timeout=60)
    assert result.error is None, result.error
    texts = ["", ""]
    for response in result.responses:
        if "text_output" in response:
            row = int(response["batch_index"].reshape(-1)[0])
            texts[row] += b"".join(response["text_output"].reshape(-1)).decode()
    assert texts == alone


@pytest.mark.parametrize("sequence_id", [42, "conversation-7"])
def test_a_correlation_id_of_either_kind_is_carried_to_the_engine(server, sequence_id):
    """The handoff copies the request's correlation id, a number or a string, onto the engine request: neither kind
    fails the request."""
    inputs = {"text_input": np.array([[PROMPTS[0].encode()]], dtype=object), "max_tokens": np.array([[6]], np.int32),
              "end_id": np.array([[-1]], np.int32), "stream": np.array([[True]])}
    result = grpc_stream(server.grpc_url, ENSEMBLE, inputs, ["text_output"], timeout=60, sequence_id=sequence_id)
    assert result.error is None and result.completed, result.error
    text = b"".join(b"".join(r["text_output"].reshape(-1)) for r in result.responses).decode()
    assert text == generate(server.http_url, ENSEMBLE, {"text_input": PROMPTS[0], "max_tokens": 6,
                                                        "end_id": -1})["text_output"]


def test_an_engine_error_mid_generation_reaches_the_ensemble_client(server):
    with pytest.raises(HttpError, match="in ensemble 'ensemble', tensorrt_llm: internal error") as error:
        generate_stream(server.http_url, ENSEMBLE, {"text_input": "hi", "max_tokens": 10, "stream": True,
                                                    **ENGINE_FAILS_AT_THIRD_TOKEN}, timeout=30)
    assert "Traceback" not in error.value.message
    assert generate(server.http_url, ENSEMBLE, {"text_input": "still there?", "max_tokens": 3})["text_output"]


def test_a_bad_input_is_refused_by_name_through_the_handoff(server):
    """The engine's refusal reaches the client as the engine words it, with its code (400)."""
    with pytest.raises(HttpError) as error:
        generate(server.http_url, ENSEMBLE, {"text_input": "hi", "max_tokens": 3, "temperature": math.nan})
    assert error.value.status == 400, error.value
    assert "temperature: " in error.value.message and "must be a finite number" in error.value.message
    assert "Traceback" not in error.value.message
