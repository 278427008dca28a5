"""The request metrics (bls.llm_metrics) and the engine's nv_trt_llm_* families (embedded_engine.metrics), scraped
from a real tritonserver's metrics port and parsed with prometheus_client's parser: the counts must match the
requests this test sends."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.http import generate, generate_stream

BLS = "tensorrt_llm_bls"
ENGINE = "tensorrt_llm"


def scrape(endpoint) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value, every sample of the scrape."""
    samples = {}
    for family in text_string_to_metric_families(endpoint.metrics_text()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before, after, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def scrape_until(endpoint, done, timeout_s: float = 10.0):
    """Scrape until `done(samples)` (model processes hand Triton their metrics every 0.1 s); the last scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(endpoint)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def engine_idle(endpoint) -> dict:
    """A scrape once the engine holds no sequence (a request stopped by an earlier test may still be ending) and
    what it did has been handed to Triton (every 0.1 s)."""
    engine = dict(model=ENGINE, version="1")
    scrape_until(endpoint, lambda s: value(s, "nv_trt_llm_request_metrics", request_type="active", **engine)
                 + value(s, "nv_trt_llm_request_metrics", request_type="waiting", **engine) == 0)
    time.sleep(0.3)
    return scrape(endpoint)


def test_bls_request_metrics_count_the_requests_sent(endpoint):
    """Three streamed and two non-streamed BLS requests, each running to max_tokens: one first-token, one
    per-token and one end-to-end observation each, their prompt and generated tokens, finish reason length."""
    before = engine_idle(endpoint)
    max_tokens, prompt_tokens = 6, 0
    for prompt in ("one metric", "two metrics", "three metrics here"):
        events = generate_stream(endpoint.http, BLS, {"text_input": prompt, "max_tokens": max_tokens, "stream": True,
                                                      "return_num_input_tokens": True})
        prompt_tokens += int(events[-1]["num_input_tokens"])
    for prompt in ("four", "five metrics"):
        prompt_tokens += int(generate(endpoint.http, BLS, {"text_input": prompt, "max_tokens": max_tokens})[
            "num_input_tokens"])
    sent = 5
    after = scrape_until(endpoint, lambda s: delta(before, s, "llm_requests_total", model=BLS,
                                                   finish_reason="length") >= sent)
    for histogram in ("llm_time_to_first_token_seconds", "llm_time_per_output_token_seconds",
                      "llm_e2e_request_latency_seconds"):
        assert delta(before, after, f"{histogram}_count", model=BLS) == sent, histogram
        assert delta(before, after, f"{histogram}_sum", model=BLS) > 0, histogram
        assert delta(before, after, f"{histogram}_bucket", model=BLS, le="+Inf") == sent, histogram
    assert delta(before, after, "llm_requests_total", model=BLS, finish_reason="length") == sent
    assert delta(before, after, "llm_requests_total", model=BLS, finish_reason="stop") == 0
    # One request at a time: each waited (almost) nothing before the BLS served it.
    assert delta(before, after, "llm_request_queue_time_seconds_count", model=BLS) == sent
    assert delta(before, after, "llm_request_queue_time_seconds_bucket", model=BLS, le="0.1") == sent
    assert delta(before, after, "llm_generation_tokens_total", model=BLS) == sent * max_tokens
    assert delta(before, after, "llm_prompt_tokens_total", model=BLS) == prompt_tokens
    # Each request's first token came before its end, on average too.
    ttft = delta(before, after, "llm_time_to_first_token_seconds_sum", model=BLS)
    assert ttft < delta(before, after, "llm_e2e_request_latency_seconds_sum", model=BLS)


def test_bls_counts_a_request_stopped_by_its_client_as_cancelled(endpoint):
    """A client that leaves mid-stream: finish_reason cancelled, never length."""
    before = engine_idle(endpoint)
    host, port = endpoint.http.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", f"/v2/models/{BLS}/generate_stream",
                       json.dumps({"text_input": "go on", "max_tokens": 2000, "stream": True}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.readline()  # the first event: generation is running
    connection.close()
    after = scrape_until(endpoint, lambda s: delta(before, s, "llm_requests_total", model=BLS,
                                                   finish_reason="cancelled") >= 1, timeout_s=30)
    assert delta(before, after, "llm_requests_total", model=BLS, finish_reason="cancelled") == 1
    assert delta(before, after, "llm_requests_total", model=BLS, finish_reason="length") == 0


REQUEST_TYPES = {"active", "max", "scheduled", "context", "waiting"}
KV_CACHE_BLOCK_TYPES = {"max", "free", "used", "tokens_per", "reused", "fraction"}


def _labels_of(samples, name: str, category: str) -> set[str]:
    return {dict(labels)[category] for sample, labels in samples if sample == name and dict(labels)["model"] == ENGINE}


def test_embedded_engine_exports_the_tensorrtllm_backend_families(endpoint):
    """Same family names, label keys and values as TensorRT-LLM 1.2's backend (embedded_engine.metrics); the token
    length histograms count each engine request once with its prompt and generated tokens."""
    before = engine_idle(endpoint)
    input_lengths, max_tokens = [], 5
    for prompt in ("engine metrics", "engine metrics again"):
        events = generate_stream(endpoint.http, BLS, {"text_input": prompt, "max_tokens": max_tokens, "stream": True,
                                                      "return_num_input_tokens": True})
        input_lengths.append(int(events[-1]["num_input_tokens"]))
    input_kind = dict(model=ENGINE, version="1", response_metric_type="total_input_tokens")
    output_kind = dict(model=ENGINE, version="1", response_metric_type="total_output_tokens")
    after = scrape_until(endpoint, lambda s: delta(before, s, "nv_llm_output_token_len_count", **output_kind) >= 2
                         and delta(before, s, "nv_llm_input_token_len_count", **input_kind) >= 2)
    assert delta(before, after, "nv_llm_input_token_len_count", **input_kind) == 2
    assert delta(before, after, "nv_llm_input_token_len_sum", **input_kind) == sum(input_lengths)
    assert delta(before, after, "nv_llm_output_token_len_count", **output_kind) == 2
    assert delta(before, after, "nv_llm_output_token_len_sum", **output_kind) == 2 * max_tokens
    buckets = {dict(labels)["le"] for name, labels in after if name == "nv_llm_input_token_len_bucket"}
    assert buckets == {"10", "50", "100", "500", "1000", "+Inf"}

    assert _labels_of(after, "nv_trt_llm_request_metrics", "request_type") == REQUEST_TYPES
    assert _labels_of(after, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type") == KV_CACHE_BLOCK_TYPES
    assert _labels_of(after, "nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric") == {
        "total_context_tokens", "generation_requests", "paused_requests"}
    assert _labels_of(after, "nv_trt_llm_general_metrics", "general_type") == {"timestamp", "iteration_counter"}
    assert _labels_of(after, "nv_trt_llm_runtime_memory_metrics", "memory_type") == {"cpu", "gpu", "pinned"}

    engine = dict(model=ENGINE, version="1")
    # The engine's capacity: the embedded engine's max_active_requests; on the LLM API (no such parameter), the LLM's
    # max_batch_size, which config.pbtxt's max_batch_size repeats (make repo ENGINE=llmapi; check-repo holds them
    # equal).
    parameter = endpoint.model_parameter(ENGINE, "max_active_requests")
    max_active = int(parameter) if parameter is not None else endpoint.model_config(ENGINE)["max_batch_size"]
    assert value(after, "nv_trt_llm_request_metrics", request_type="max", **engine) == max_active
    assert value(after, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per", **engine) == 32
    assert delta(before, after, "nv_trt_llm_general_metrics", general_type="iteration_counter", **engine) >= max_tokens
    assert value(after, "nv_trt_llm_runtime_memory_metrics", memory_type="cpu", **engine) > 0
    # Idle again: nothing active or waiting, no KV blocks held by a sequence, every block free.
    idle = scrape_until(endpoint, lambda s: value(s, "nv_trt_llm_request_metrics", request_type="active",
                                                  **engine) == 0)
    kv = defaultdict(float, {kind: value(idle, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=kind,
                                         **engine) for kind in KV_CACHE_BLOCK_TYPES})
    assert value(idle, "nv_trt_llm_request_metrics", request_type="waiting", **engine) == 0
    assert kv["used"] == 0 and kv["free"] == kv["max"] > 0 and kv["fraction"] == 0


def test_the_kv_cache_and_request_gauges_follow_a_running_generation(endpoint):
    """While a long generation runs, one sequence is active and holds KV blocks. A scrape is not one snapshot: each
    iteration's stats set the gauges one by one while a scrape reads them family by family (as the C++ backend's and
    Triton's do), so one scrape may hold the active count of an iteration and the KV blocks of the one before (the
    rehearsal's LLM API pass met it under load); the test scrapes until both show the running sequence."""
    engine = dict(model=ENGINE, version="1")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (generate(endpoint.http, BLS, {"text_input": "long", "max_tokens": 300}),
                                              done.set()))
    thread.start()
    try:
        running = scrape_until(endpoint, lambda s: (
            value(s, "nv_trt_llm_request_metrics", request_type="active", **engine) >= 1
            and value(s, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used", **engine) >= 1)
            or done.is_set())
        if done.is_set():
            pytest.fail("the 300-token generation ended before a scrape saw it active, holding KV blocks")
        assert 0 < value(running, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction", **engine) <= 1
    finally:
        thread.join(120)
