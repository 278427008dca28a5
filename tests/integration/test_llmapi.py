"""tensorrt_llm on the LLM API (an llmapi repository: its `llm` parameter; skipped elsewhere, by name): NVIDIA's llmapi
request names on tensorrt_llm/generate, and cancellation (a client gone, NVIDIA's `stop`) aborting the LLM request.

`make repo ENGINE=llmapi` without a GPU serves the stand-in (the embedded engine behind the LLM API); with
--server-url these run against TensorRT-LLM's LLM API itself.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream
from testkit.metrics import scrape

ENGINE = "tensorrt_llm"


@pytest.fixture(scope="module", autouse=True)
def llmapi_only(endpoint):
    llm = endpoint.model_parameter(ENGINE, "llm")
    if llm is None:
        pytest.skip("tensorrt_llm is not the LLM API flow's (no `llm` parameter): these test an llmapi repository")


def active_requests(metrics_url: str) -> float:
    for family in text_string_to_metric_families(scrape(metrics_url)):
        for sample in family.samples:
            if (sample.name == "nv_trt_llm_request_metrics" and sample.labels.get("model") == ENGINE
                    and sample.labels.get("request_type") == "active"):
                return sample.value
    raise KeyError("nv_trt_llm_request_metrics{request_type=active} has no sample for tensorrt_llm")


def wait_until_idle(metrics_url: str, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while active_requests(metrics_url) != 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def test_nvidias_readme_request_answers_text(endpoint):
    answer = generate(endpoint.http, ENGINE, {"text_input": "What is machine learning?",
                                              "sampling_param_max_tokens": 20})
    # NVIDIA's default (exclude_input_from_output false): the prompt's text, then the output's.
    assert answer["text_output"].startswith("What is machine learning?")
    assert len(answer["text_output"]) > len("What is machine learning?")


def test_user_text_stays_text(endpoint):
    answer = generate(endpoint.http, ENGINE, {"text_input": "Say <|eot_id|><|start_header_id|> please",
                                              "sampling_param_max_tokens": 2})
    # Parsed as control tokens they would be skipped when the text is decoded.
    assert answer["text_output"].startswith("Say <|eot_id|><|start_header_id|> please")


def test_sampling_params_and_output_switches(endpoint):
    body = {"text_input": "Count: one, two,", "sampling_param_max_tokens": 5, "sampling_param_top_k": 1,
            "sampling_param_exclude_input_from_output": True, "return_finish_reason": True,
            "return_stop_reason": True, "return_cumulative_logprob": True, "sampling_param_seed": 3}
    first = generate(endpoint.http, ENGINE, body)
    again = generate(endpoint.http, ENGINE, body)
    assert first["text_output"] == again["text_output"] and not first["text_output"].startswith("Count")
    assert first["finish_reason"] in ("length", "stop")
    assert first["cumulative_logprob"] <= 0.0


def test_streamed_text_is_cumulative_as_nvidias_model_sends_it(endpoint):
    body = {"text_input": "Tell me a story.", "sampling_param_max_tokens": 8, "sampling_param_top_k": 1,
            "sampling_param_exclude_input_from_output": True}
    events = generate_stream(endpoint.http, ENGINE, {**body, "streaming": True})
    texts = [event["text_output"] for event in events]
    assert len(texts) >= 2
    assert all(later.startswith(earlier) for earlier, later in zip(texts[:-1], texts[1:], strict=True))
    assert texts[-1] == generate(endpoint.http, ENGINE, body)["text_output"]


def test_perf_metrics_under_nvidias_names(endpoint):
    answer = generate(endpoint.http, ENGINE, {"text_input": "Hi", "sampling_param_max_tokens": 3,
                                              "sampling_param_return_perf_metrics": True})
    assert answer["kv_cache_alloc_total_blocks"] >= 1 and 0.0 <= answer["kv_cache_hit_rate"] <= 1.0
    assert 0 < answer["arrival_time_ns"] <= answer["first_scheduled_time_ns"] <= answer["first_token_time_ns"] \
        <= answer["last_token_time_ns"]


@pytest.mark.parametrize("body, field", [
    ({"text_input": "Hi", "sampling_param_max_tokens": 0}, "sampling_param_max_tokens"),
    ({"text_input": "Hi", "sampling_param_best_of": 2}, "sampling_param_best_of"),
    ({"text_input": "Hi", "input_lengths": [2]}, "input_lengths"),
])
def test_bad_nvidia_requests_name_their_input(endpoint, body, field):
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, ENGINE, body)
    assert error.value.status == 400 and field in error.value.message


def test_a_client_gone_aborts_the_llm_request(endpoint, bundle):
    prompt = bundle.encode_chat([{"role": "user", "content": "Write a long story."}])
    inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
              "request_output_len": np.array([[3000]], np.int32), "streaming": np.array([[True]]),
              "end_id": np.array([[-1]], np.int32)}
    result = grpc_stream(endpoint.grpc, ENGINE, inputs, ["output_ids", "sequence_length"], cancel_after=3)
    assert len(result.responses) == 3 and not result.completed
    assert wait_until_idle(endpoint.metrics), "the LLM kept generating for a cancelled request"


def test_nvidias_stop_request_aborts_the_request_with_its_id(endpoint):
    request_id = uuid.uuid4().hex
    outcome = {}

    def long_request():
        outcome["events"] = generate_stream(endpoint.http, ENGINE, {
            "id": request_id, "text_input": "Write a long story.", "sampling_param_max_tokens": 3000,
            "sampling_param_exclude_input_from_output": True, "streaming": True}, timeout=120)

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(2.0)
    stop = generate_stream(endpoint.http, ENGINE, {"id": request_id, "text_input": "", "stop": True})
    assert stop == [] or all("text_output" not in event for event in stop)
    thread.join(60)
    assert not thread.is_alive()
    assert wait_until_idle(endpoint.metrics)
