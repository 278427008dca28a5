"""tensorrt_llm through a real tritonserver: the tensorrtllm backend's contract, greedy == transformers,
streaming, cancellation, `stop`, and clean errors.

Against the embedded engine, greedy output is compared with `transformers` `generate()` on the very
weights the engine serves (the AWQ checkpoint, dequantised by the same loader). With --server-url against
a TensorRT-LLM engine, those comparisons are skipped and the contract tests still run.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate
from testkit.metrics import metric_value, wait_for_value

ENGINE = "tensorrt_llm"
OUTPUTS = ["output_ids", "sequence_length"]


def engine_inputs(prompt, max_tokens, **extra):
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
    }
    for name, value in extra.items():
        inputs[name] = np.array([[value]]) if np.isscalar(value) else np.asarray(value)
    return inputs


def streamed_tokens(result) -> list[int]:
    tokens = []
    for response in result.responses:
        ids, length = response["output_ids"], response["sequence_length"]
        tokens += ids.reshape(-1)[: int(length.reshape(-1)[0])].tolist()
    return tokens


@pytest.fixture(scope="module")
def prompt(bundle):
    return bundle.encode_chat([{"role": "user", "content": "Name three colours."}])


@pytest.fixture(scope="module")
def reference_model(served_checkpoint):
    """The weights the embedded engine serves (its repository's copy), loaded by transformers (its tests are in
    conftest's NEEDS_EMBEDDED_ENGINE)."""
    from embedded_engine.checkpoint import load_checkpoint

    return load_checkpoint(served_checkpoint).model


def transformers_greedy(model, prompt, max_tokens, eos_token_id=None) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=eos_token_id, pad_token_id=0, attention_mask=torch.ones(1, len(prompt)))
    tokens = out[0, len(prompt):].tolist()
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id)]
    return tokens


def test_greedy_equals_transformers_generate(endpoint, prompt, reference_model):
    expected = transformers_greedy(reference_model, prompt, 24)
    http = generate(endpoint.http, ENGINE, {"input_ids": prompt, "input_lengths": [len(prompt)],
                                            "request_output_len": [24], "exclude_input_in_output": True})
    assert http["output_ids"] == expected
    assert http["sequence_length"] == 24
    grpc = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(prompt, 24, streaming=True), OUTPUTS)
    assert grpc.completed and grpc.error is None
    assert streamed_tokens(grpc) == expected
    # One response per step, unless sending fell behind and a response carried several steps.
    assert 2 <= len(grpc.responses) <= 24


def test_end_id_stops_generation_and_is_not_returned(endpoint, prompt, reference_model):
    free_run = transformers_greedy(reference_model, prompt, 16)
    end_id = free_run[5]
    expected = transformers_greedy(reference_model, prompt, 16, eos_token_id=end_id)
    result = generate(endpoint.http, ENGINE, {"input_ids": prompt, "input_lengths": [len(prompt)],
                                              "request_output_len": [16], "end_id": [end_id],
                                              "exclude_input_in_output": True})
    assert result["output_ids"] == expected and end_id not in expected


def test_stop_words_list_stops_after_the_word(endpoint, prompt, reference_model):
    free_run = transformers_greedy(reference_model, prompt, 16)
    word = free_run[3:5]
    stop = np.array([[word, [2, -1]]], dtype=np.int32)
    result = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(prompt, 16, stop_words_list=stop,
                                                              exclude_input_in_output=True), OUTPUTS)
    assert result.error is None
    assert streamed_tokens(result) == free_run[:5]


def test_exclude_input_in_output_per_request(endpoint, prompt):
    body = {"input_ids": prompt, "input_lengths": [len(prompt)], "request_output_len": [4]}
    with_input = generate(endpoint.http, ENGINE, {**body, "exclude_input_in_output": False})
    without = generate(endpoint.http, ENGINE, {**body, "exclude_input_in_output": True})
    assert with_input["output_ids"] == prompt + without["output_ids"]
    assert with_input["sequence_length"] == len(prompt) + 4


def test_log_probs_and_logits_shapes(endpoint, prompt, bundle):
    result = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(
        prompt, 3, return_log_probs=True, return_context_logits=True, return_generation_logits=True,
        exclude_input_in_output=True),
        OUTPUTS + ["cum_log_probs", "output_log_probs", "context_logits", "generation_logits"])
    (response,) = result.responses
    log_probs = response["output_log_probs"].reshape(-1)
    assert log_probs.shape == (3,) and (log_probs <= 0).all()
    assert np.isclose(response["cum_log_probs"].reshape(-1)[0], log_probs.sum(), atol=1e-4)
    assert response["context_logits"].shape[-2:] == (len(prompt), bundle.vocab_size)
    assert response["generation_logits"].shape[-2:] == (3, bundle.vocab_size)


def test_a_streamed_response_carries_the_log_probs_of_every_token_so_far(endpoint, prompt):
    """TensorRT-LLM's C++ backend streams output_log_probs cumulatively while output_ids carry the new tokens
    (cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::createResult: `result.logProbs = getLogProbs()`):
    each streamed response's are the non-streamed run's first n, n the tokens streamed so far (greedy, same prompt)."""
    outputs = OUTPUTS + ["cum_log_probs", "output_log_probs"]
    whole = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(
        prompt, 6, return_log_probs=True, exclude_input_in_output=True), outputs)
    (response,) = whole.responses
    expected = response["output_log_probs"].reshape(-1)
    assert expected.shape == (int(response["sequence_length"].reshape(-1)[0]),)
    streamed = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(
        prompt, 6, streaming=True, return_log_probs=True), outputs)
    assert streamed.completed and streamed.error is None
    assert streamed_tokens(streamed) == response["output_ids"].reshape(-1).tolist()
    so_far = 0
    for part in streamed.responses:
        so_far += int(part["sequence_length"].reshape(-1)[0])
        log_probs = part["output_log_probs"].reshape(-1)
        assert log_probs.shape == (so_far,)
        np.testing.assert_allclose(log_probs, expected[:so_far], atol=1e-4)
        assert np.isclose(part["cum_log_probs"].reshape(-1)[0], log_probs.sum(), atol=1e-4)
    assert so_far == len(expected)


def _metric(endpoint, name: str) -> float:
    return metric_value(endpoint.metrics, name, ENGINE)


def test_draft_tokens_are_verified(endpoint, prompt, reference_model):
    """External draft tokens: the agreeing prefix is accepted, the output is still the engine's own."""
    expected = transformers_greedy(reference_model, prompt, 8)
    draft = expected[:3] + [(expected[3] + 1) % 1000]  # three right, then a wrong guess
    accepted_before = _metric(endpoint, "embedded_engine_accepted_draft_tokens_total")
    result = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(
        prompt, 5, draft_input_ids=np.array([draft], dtype=np.int32), exclude_input_in_output=True), OUTPUTS)
    assert streamed_tokens(result) == expected[:5]
    assert wait_for_value(endpoint.metrics, "embedded_engine_accepted_draft_tokens_total", ENGINE, accepted_before + 3,
                          timeout_s=5), "accepted-draft counter did not count the 3 matching tokens"


def test_concurrent_streams_progress_together(endpoint, prompt):
    arrivals: dict[int, list[float]] = {}

    def run(index):
        result = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(prompt, 32, streaming=True), OUTPUTS)
        assert result.completed and len(result.responses) == 32
        arrivals[index] = result.arrival_times

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(arrivals) == 4
    first_finish = min(times[-1] for times in arrivals.values())
    # In-flight batching: every stream got its first token before any stream finished.
    assert all(times[0] < first_finish for times in arrivals.values())


def test_client_cancellation_stops_the_engine(endpoint, prompt, reference_model):
    result = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(prompt, 3000, streaming=True), OUTPUTS, cancel_after=3)
    assert len(result.responses) == 3 and not result.completed
    assert wait_for_value(endpoint.metrics, "embedded_engine_active_sequences", ENGINE, 0), \
        "the engine kept generating for a cancelled request"


def test_stop_request_ends_the_running_request(endpoint, prompt):
    request_id = uuid.uuid4().hex
    outcome = {}

    def long_request():
        outcome["result"] = grpc_stream(endpoint.grpc, ENGINE, engine_inputs(prompt, 3000, streaming=True), OUTPUTS,
                                        request_id=request_id, timeout=120)

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)
    stop = grpc_stream(endpoint.grpc, ENGINE, engine_inputs([0], 1, stop=True), OUTPUTS, request_id=request_id)
    assert stop.error is None and stop.completed
    thread.join(60)
    result = outcome["result"]
    assert result.completed and result.error is None
    assert 0 < len(streamed_tokens(result)) < 3000


@pytest.mark.parametrize("body, field", [
    ({"input_lengths": [3], "request_output_len": [4], "temperature": 1.0}, "input_ids"),
    ({"input_ids": [], "input_lengths": [0], "request_output_len": [4]}, "input"),
    ({"input_ids": [1, 2, 3], "input_lengths": [3], "request_output_len": [0]}, "request_output_len"),
    ({"input_ids": [1, 2, 3], "input_lengths": [3], "request_output_len": [10**6]}, "request_output_len"),
    ({"input_ids": [1, 2, 3], "input_lengths": [3], "request_output_len": [4], "beam_width": 2}, "beam_width"),
    ({"input_ids": [1, 2, 999999], "input_lengths": [3], "request_output_len": [4]}, "input_ids"),
    ({"input_ids": [1, 2, 3], "input_lengths": [3], "request_output_len": [4], "lora_task_id": 1}, "lora_task_id"),
])
def test_bad_input_is_a_clear_error_and_the_server_keeps_serving(endpoint, prompt, body, field):
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, ENGINE, body)
    assert field in error.value.message
    assert "Traceback" not in error.value.message
    ok = generate(endpoint.http, ENGINE, {"input_ids": prompt, "input_lengths": [len(prompt)],
                                          "request_output_len": [2], "exclude_input_in_output": True})
    assert len(ok["output_ids"]) == 2


def test_grpc_error_ends_the_stream(endpoint):
    result = grpc_stream(endpoint.grpc, ENGINE, engine_inputs([1, 2, 3], 4, beam_width=4), OUTPUTS)
    assert result.error is not None and "beam_width" in result.error


def test_wrong_dtype_is_rejected_by_triton(endpoint):
    inputs = engine_inputs([1, 2, 3], 4)
    inputs["input_ids"] = inputs["input_ids"].astype(np.float32)
    result = grpc_stream(endpoint.grpc, ENGINE, inputs, OUTPUTS)
    assert result.error is not None and "input_ids" in result.error
