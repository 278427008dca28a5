"""The ensemble's request metrics (relay/request_metrics.h), measured by its handoff, against a server of its own
(so that no other test's request falls inside its counters' deltas): the llm_* families with model="ensemble",
beside the BLS's in the same families, counting the requests sent."""

from __future__ import annotations

import pytest

from engine_build.repository import can_compile_relay
from testkit.http import generate, generate_stream
from tests.integration.conftest import Endpoint, built_repository_server
from tests.integration.test_metrics import delta, scrape, scrape_until

ENSEMBLE = "ensemble"
BLS = "tensorrt_llm_bls"


@pytest.fixture(scope="module")
def endpoint(request, tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("no C++ compiler here: the handoff is part of the relay (relay/)")
    with built_repository_server(request, tmp_path_factory, "metrics_handoff",
                                 handoff_sender_threads=1) as server:
        yield Endpoint(server.http_url, server.grpc_url, server.metrics_url)


def test_the_ensemble_request_metrics_count_the_requests_sent(endpoint):
    """Three streamed ensemble requests to max_tokens and one non-streamed: each is one end-to-end observation, its
    prompt and generated tokens, finish reason length; the streamed ones also a first token and a per-token time."""
    before = scrape(endpoint)
    max_tokens, prompts = 7, ("ensemble metrics", "two ensemble metrics", "three")
    prompt_tokens = 0
    for prompt in prompts:
        events = generate_stream(endpoint.http, ENSEMBLE, {"text_input": prompt, "max_tokens": max_tokens,
                                                           "stream": True, "end_id": -1})
        assert len(events) == max_tokens
        # The prompt's length as the BLS counts it (same preprocessing).
        prompt_tokens += int(generate(endpoint.http, BLS, {"text_input": prompt, "max_tokens": 1})["num_input_tokens"])
    unary = generate(endpoint.http, ENSEMBLE, {"text_input": "once", "max_tokens": max_tokens, "end_id": -1})
    assert unary["text_output"]
    prompt_tokens += int(generate(endpoint.http, BLS, {"text_input": "once", "max_tokens": 1})["num_input_tokens"])
    sent = len(prompts) + 1
    after = scrape_until(endpoint, lambda s: all(
        delta(before, s, "llm_requests_total", model=model, finish_reason="length") >= sent
        for model in (ENSEMBLE, BLS)))
    assert delta(before, after, "llm_requests_total", model=ENSEMBLE, finish_reason="length") == sent
    assert delta(before, after, "llm_requests_total", model=ENSEMBLE, finish_reason="stop") == 0
    assert delta(before, after, "llm_e2e_request_latency_seconds_count", model=ENSEMBLE) == sent
    assert delta(before, after, "llm_e2e_request_latency_seconds_bucket", model=ENSEMBLE, le="+Inf") == sent
    for streamed_only in ("llm_time_to_first_token_seconds", "llm_time_per_output_token_seconds"):
        assert delta(before, after, f"{streamed_only}_count", model=ENSEMBLE) == len(prompts), streamed_only
        assert delta(before, after, f"{streamed_only}_sum", model=ENSEMBLE) > 0, streamed_only
    assert delta(before, after, "llm_generation_tokens_total", model=ENSEMBLE) == sent * max_tokens
    assert delta(before, after, "llm_prompt_tokens_total", model=ENSEMBLE) == prompt_tokens
    # The BLS's requests above are its own series of the same families.
    assert delta(before, after, "llm_requests_total", model=BLS, finish_reason="length") == sent


def test_an_ensemble_stream_that_ends_at_end_id_finishes_with_stop(endpoint):
    before = scrape(endpoint)
    events = generate_stream(endpoint.http, ENSEMBLE, {"text_input": "hi", "max_tokens": 40, "stream": True})
    generated = len(events)
    after = scrape_until(endpoint, lambda s: delta(before, s, "llm_e2e_request_latency_seconds_count",
                                                   model=ENSEMBLE) >= 1)
    reason = "length" if generated >= 40 else "stop"
    assert delta(before, after, "llm_requests_total", model=ENSEMBLE, finish_reason=reason) == 1
    assert delta(before, after, "llm_generation_tokens_total", model=ENSEMBLE) == generated
