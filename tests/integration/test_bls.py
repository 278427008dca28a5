"""tensorrt_llm_bls through a real tritonserver: clean streamed deltas, speculative decoding, cancellation,
concurrency and errors.

The default model's random weights emit arbitrary byte-level tokens (half characters, emoji pieces, CJK
fragments): a good adversary for incremental detokenization.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream
from testkit.metrics import metric_sum, metric_value, wait_for_value
from tests.integration.test_text import strings

BLS = "tensorrt_llm_bls"
PROMPTS = [
    "Once upon a time",
    "Écris un poème sur la mer 🌊",
    "用中文写一首诗",
    "def fibonacci(n):",
    "   leading spaces and\ttabs",
    "Привет! Как дела?",
    "<|eot_id|> is just text here",
    "🙂🙃🤖👾",
]


def streamed_text(events) -> str:
    return "".join(event["text_output"] for event in events)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_deltas_add_up_to_the_non_streamed_text(endpoint, prompt):
    body = {"text_input": prompt, "max_tokens": 48, "end_id": -1}
    full = generate(endpoint.http, BLS, body)
    events = generate_stream(endpoint.http, BLS, {**body, "stream": True})
    assert streamed_text(events) == full["text_output"]
    assert full["num_output_tokens"] == 48 and full["finish_reason"] == "length"
    assert events[-1]["finish_reason"] == "length"


def test_streamed_token_counts_come_when_asked(endpoint):
    """Intermediate responses carry a running num_output_tokens only with return_num_output_tokens (as NVIDIA's
    1.2 BLS); the final response always carries both counts."""
    body = {"text_input": "count", "max_tokens": 12, "end_id": -1, "stream": True}
    plain = generate_stream(endpoint.http, BLS, body)
    counted = generate_stream(endpoint.http, BLS, {**body, "return_num_output_tokens": True})
    assert all("num_output_tokens" not in event for event in plain[:-1])
    counts = [event["num_output_tokens"] for event in counted[:-1]]
    assert counts == sorted(counts) and 0 < counts[0] and counts[-1] <= 12
    for events in (plain, counted):
        assert events[-1]["num_output_tokens"] == 12 and events[-1]["num_input_tokens"] > 0


def test_stream_equals_non_stream_over_many_random_outputs(endpoint):
    """Sampled outputs of the random model: many different byte-token sequences."""
    for seed in range(12):
        body = {"text_input": "x", "max_tokens": 40, "end_id": -1, "temperature": 1.0, "top_k": 1000,
                "random_seed": seed}
        full = generate(endpoint.http, BLS, body)["text_output"]
        assert streamed_text(generate_stream(endpoint.http, BLS, {**body, "stream": True})) == full


def test_bls_matches_the_ensemble(endpoint):
    body = {"text_input": "Once upon a time", "max_tokens": 16}
    assert generate(endpoint.http, BLS, body)["text_output"] == generate(endpoint.http, "ensemble", body)["text_output"]


def test_conversation_and_prompt_echo(endpoint):
    messages = json.dumps([{"role": "user", "content": "Hi there"}])
    plain = generate(endpoint.http, BLS, {"messages": messages, "max_tokens": 8})
    echoed = generate(endpoint.http, BLS, {"messages": messages, "max_tokens": 8, "exclude_input_in_output": False})
    assert echoed["text_output"].startswith("user\n\nHi there") and echoed["text_output"].endswith(plain["text_output"])
    # A stream never echoes the prompt, as TensorRT-LLM streams: its first response starts at the prompt's end.
    streamed = generate_stream(endpoint.http, BLS, {"messages": messages, "max_tokens": 8, "stream": True,
                                                    "exclude_input_in_output": False})
    assert streamed_text(streamed) == plain["text_output"]
    assert plain["num_input_tokens"] > 5


def test_finish_reason_stop_at_end_id(endpoint, bundle):
    body = {"text_input": "Once upon a time", "max_tokens": 12, "end_id": -1}
    tokens = bundle.tokenizer.encode(generate(endpoint.http, BLS, body)["text_output"], add_special_tokens=False)
    ids = generate(endpoint.http, "tensorrt_llm", {
        "input_ids": bundle.encode_text("Once upon a time", add_special_tokens=True),
        "input_lengths": [len(bundle.encode_text("Once upon a time", add_special_tokens=True))],
        "request_output_len": [12], "exclude_input_in_output": True})["output_ids"]
    stopped = generate(endpoint.http, BLS, {**body, "end_id": ids[4]})
    assert stopped["finish_reason"] == "stop" and stopped["num_output_tokens"] == ids.index(ids[4])
    assert tokens  # the free run produced text


@pytest.mark.parametrize("num_draft_tokens", [1, 4, 8])
def test_speculative_equals_plain_greedy(endpoint, num_draft_tokens):
    if not endpoint.has_model("tensorrt_llm_draft"):  # the BLS's own config is the relay's behind it
        pytest.skip("no draft model in this repository")
    body = {"text_input": "Once upon a time", "max_tokens": 40, "end_id": -1}
    plain = generate(endpoint.http, BLS, body)
    spec = generate(endpoint.http, BLS, {**body, "num_draft_tokens": num_draft_tokens})
    assert spec["text_output"] == plain["text_output"]
    assert spec["num_output_tokens"] == 40 and spec["finish_reason"] == "length"
    assert spec["total_draft_tokens"] > 0 and 0.0 <= spec["acceptance_rate"] <= 1.0
    streamed = generate_stream(endpoint.http, BLS, {**body, "num_draft_tokens": num_draft_tokens, "stream": True})
    assert streamed_text(streamed) == plain["text_output"]


def test_speculative_with_batch_of_two(endpoint):
    if not endpoint.has_model("tensorrt_llm_draft"):  # the BLS's own config is the relay's behind it
        pytest.skip("no draft model in this repository")
    inputs = {"text_input": strings("Once upon a time", "用中文写一首诗"),
              "max_tokens": np.array([[20], [20]], dtype=np.int32),
              "num_draft_tokens": np.array([[4], [4]], dtype=np.int32)}
    result = grpc_stream(endpoint.grpc, BLS, inputs, ["text_output", "finish_reason"])
    assert result.error is None and result.completed
    texts = [t.decode() for t in result.responses[-1]["text_output"].reshape(-1)]
    for prompt, text in zip(["Once upon a time", "用中文写一首诗"], texts, strict=True):
        assert text == generate(endpoint.http, BLS, {"text_input": prompt, "max_tokens": 20})["text_output"]


def _engine_metric(endpoint, name: str, model: str) -> float:
    return metric_value(endpoint.metrics, name, model)


# A plain request and one asking for per-token outputs (log probs) take the same engine path; both are held to the
# non-streamed text.
ENGINE_HOPS = {"http": {}, "grpc": {"return_log_probs": True}}


@pytest.mark.parametrize("hop", ENGINE_HOPS)
def test_both_engine_hops_stream_the_same_text(endpoint, hop):
    body = {"text_input": "Once upon a time", "max_tokens": 24, "end_id": -1, **ENGINE_HOPS[hop]}
    events = generate_stream(endpoint.http, BLS, {**body, "stream": True})
    assert streamed_text(events) == generate(endpoint.http, BLS, {"text_input": "Once upon a time", "max_tokens": 24,
                                                                  "end_id": -1})["text_output"]
    assert ("output_log_probs" in events[0]) == (hop == "grpc")


def test_a_streamed_response_passes_on_the_engines_log_probs_of_every_token_so_far(endpoint):
    """NVIDIA's tensorrt_llm_bls passes each engine response's output_log_probs on unchanged (tensorrt_llm_bls/1/lib/
    triton_decoder.py _get_response), and the engine's hold every token so far (TensorRT-LLM's llmRequest.cpp
    LlmRequest::createResult: result.logProbs = getLogProbs()): each streamed response's are the non-streamed
    response's first n, n the tokens streamed so far."""
    body = {"text_input": "Once upon a time", "max_tokens": 8, "end_id": -1, "return_log_probs": True}
    expected = np.asarray(generate(endpoint.http, BLS, body)["output_log_probs"], np.float32).reshape(-1)
    events = generate_stream(endpoint.http, BLS, {**body, "stream": True, "return_num_output_tokens": True})
    with_log_probs = [event for event in events if "output_log_probs" in event]
    assert with_log_probs and expected.shape == (8,)
    for event in with_log_probs:
        log_probs = np.asarray(event["output_log_probs"], np.float32).reshape(-1)
        assert log_probs.shape == (event["num_output_tokens"],)
        np.testing.assert_allclose(log_probs, expected[: len(log_probs)], atol=1e-4)
    assert with_log_probs[-1]["num_output_tokens"] == 8


@pytest.mark.parametrize("hop", ENGINE_HOPS)
def test_client_disconnect_stops_the_engine(endpoint, hop):
    inputs = {"text_input": strings("Tell me everything"), "max_tokens": np.array([[3000]], dtype=np.int32),
              "stream": np.array([[True]]), "end_id": np.array([[-1]], dtype=np.int32),
              **{name: np.array([[value]]) for name, value in ENGINE_HOPS[hop].items()}}
    result = grpc_stream(endpoint.grpc, BLS, inputs, ["text_output"], cancel_after=3)
    assert len(result.responses) == 3
    assert wait_for_value(endpoint.metrics, "embedded_engine_active_sequences", "tensorrt_llm", 0), \
        "the engine kept generating after the client left"
    time.sleep(0.5)  # metric updates from the model process arrive asynchronously
    before = _engine_metric(endpoint, "embedded_engine_generated_tokens_total", "tensorrt_llm")
    time.sleep(1.0)  # a still-running generation would add ~75 tokens/s
    assert _engine_metric(endpoint, "embedded_engine_generated_tokens_total", "tensorrt_llm") == before


def test_many_concurrent_streams_complete(endpoint):
    results = {}

    def run(index):
        events = generate_stream(endpoint.http, BLS, {"text_input": f"story {index}", "max_tokens": 24,
                                                      "end_id": -1, "stream": True})
        results[index] = (events[0]["text_output"] is not None, events[-1]["num_output_tokens"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == {i: (True, 24) for i in range(12)}


@pytest.mark.parametrize("body, field", [
    ({"text_input": "hi", "max_tokens": 4, "num_draft_tokens": -1}, "num_draft_tokens"),
    ({"text_input": "hi", "max_tokens": 4, "num_draft_tokens": 1000}, "num_draft_tokens"),
    ({"text_input": "hi", "max_tokens": 4, "stream": True, "beam_width": 2}, "beam_width"),
    ({"messages": "[{\"role\": \"user\"}]", "max_tokens": 4}, "content"),
    ({"text_input": "hi", "messages": "[]", "max_tokens": 4}, "text_input"),
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    ({"text_input": "word " * 5000, "max_tokens": 4}, "QUERY"),
])
def test_bls_errors(endpoint, body, field):
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, BLS, body)
    assert field in error.value.message and "Traceback" not in error.value.message
    assert generate(endpoint.http, BLS, {"text_input": "ok", "max_tokens": 2})["num_output_tokens"] == 2


def test_bls_metrics_are_exported(endpoint):
    generate(endpoint.http, BLS, {"text_input": "count me", "max_tokens": 3})
    text = endpoint.metrics_text()
    assert "llm_time_to_first_token_seconds_count" in text
    assert _engine_metric(endpoint, "llm_generation_tokens_total", BLS) >= 3


def test_triton_counts_the_bls_requests_it_serves(endpoint):
    """Triton's per-model statistics (nv_inference_request_success / _failure, the counters operators watch) count
    tensorrt_llm_bls's requests, with the relay in front or not. Only the relay tells success from failure: the
    Python backend counts a decoupled request a failure only when `execute` raises (python_backend
    pb_metric_reporter.cc, r24.10 to r26.07), and an error sent as the request's response is not that."""
    def counts():
        return (metric_value(endpoint.metrics, "nv_inference_request_success_total", BLS),
                metric_sum(endpoint.metrics, "nv_inference_request_failure_total", BLS))  # one sample per reason

    relayed = endpoint.model_config(BLS)["backend"] == "llama3_relay"
    success, failure = counts()
    generate_stream(endpoint.http, BLS, {"text_input": "count me", "max_tokens": 3, "stream": True})
    with pytest.raises(HttpError, match="max_tokens"):
        generate(endpoint.http, BLS, {"text_input": "count me", "max_tokens": 0})
    expected = (success + 1, failure + 1) if relayed else (success + 2, failure)
    deadline = time.monotonic() + 5
    while counts() != expected:
        assert time.monotonic() < deadline, f"{counts()} after one success and one failure from {(success, failure)}"
        time.sleep(0.1)
