"""bls/llm_metrics.py, the one definition of the request metrics, and the C++ handoff's copy of it
(relay/request_metrics.cc): same family names and bucket edges, so the ensemble's and the BLS's series are one
family; RequestTiming's per-token arithmetic."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bls import llm_metrics
from bls.finish_reason import FinishReason
from bls.llm_metrics import GenerationMetrics, RequestTiming

RELAY = Path(__file__).resolve().parents[2] / "relay" / "request_metrics.cc"


def _cpp_buckets(name: str) -> tuple[float, ...]:
    match = re.search(rf"{name} = \{{([^}}]*)\}}", RELAY.read_text())
    assert match, name
    return tuple(float(edge) for edge in match.group(1).split(","))


def test_the_handoff_uses_the_same_names_and_buckets():
    source = RELAY.read_text()
    for name in (llm_metrics.TIME_TO_FIRST_TOKEN, llm_metrics.TIME_PER_OUTPUT_TOKEN, llm_metrics.E2E_REQUEST_LATENCY,
                 llm_metrics.PROMPT_TOKENS, llm_metrics.GENERATION_TOKENS, llm_metrics.REQUESTS):
        assert f'"{name}"' in source, name
        assert f'"{llm_metrics.DESCRIPTIONS[name]}"' in source.replace('"\n                           "', ""), name
    assert _cpp_buckets("kTimeToFirstTokenBuckets") == llm_metrics.TIME_TO_FIRST_TOKEN_BUCKETS
    assert _cpp_buckets("kTimePerOutputTokenBuckets") == llm_metrics.TIME_PER_OUTPUT_TOKEN_BUCKETS
    assert _cpp_buckets("kE2eRequestLatencyBuckets") == llm_metrics.E2E_REQUEST_LATENCY_BUCKETS


@pytest.mark.parametrize("timing, expected", [
    # one token per response: 4 later tokens over 0.4 s
    (RequestTiming(3, 5, FinishReason.LENGTH, 1.0, first_token_s=0.2, last_token_s=0.6, first_response_tokens=1), 0.1),
    # the first response carried 3 tokens (merged): the 2 later ones share the 0.4 s
    (RequestTiming(3, 5, FinishReason.LENGTH, 1.0, first_token_s=0.2, last_token_s=0.6, first_response_tokens=3), 0.2),
    # everything in one response (unary): no per-token figure
    (RequestTiming(3, 5, FinishReason.STOP, 1.0, first_token_s=1.0, last_token_s=1.0, first_response_tokens=5), None),
    (RequestTiming(3, 0, FinishReason.CANCELLED, 0.3), None),  # nothing generated
])
def test_time_per_output_token(timing, expected):
    assert timing.time_per_output_token_s == (pytest.approx(expected) if expected is not None else None)


class _Recorder:
    """Stands in for bls.triton_io.metrics.Metrics: records what each metric was given."""

    def __init__(self):
        self.values: dict[tuple, list] = {}

    def _metric(self, name, labels):
        key = (name, tuple(sorted(labels.items())))
        values = self.values.setdefault(key, [])

        class Metric:
            @staticmethod
            def observe(value):
                values.append(value)

            @staticmethod
            def increment(value=1.0):
                values.append(value)

        return Metric()

    def histogram(self, name, description, labels, buckets):
        return self._metric(name, labels)

    def counter(self, name, description, labels):
        return self._metric(name, labels)


def test_a_finished_request_is_counted_once_under_its_reported_finish_reason():
    recorder = _Recorder()
    metrics = GenerationMetrics(recorder, "tensorrt_llm_bls")
    model = (("model", "tensorrt_llm_bls"),)
    metrics.finished(RequestTiming(7, 4, FinishReason.END_ID, 0.5, first_token_s=0.1, last_token_s=0.4,
                                   first_response_tokens=1))
    assert recorder.values[(llm_metrics.REQUESTS, (("finish_reason", "stop"), *model))] == [1]
    assert recorder.values[(llm_metrics.REQUESTS, (("finish_reason", "length"), *model))] == []
    assert recorder.values[(llm_metrics.PROMPT_TOKENS, model)] == [7]
    assert recorder.values[(llm_metrics.GENERATION_TOKENS, model)] == [4]
    assert recorder.values[(llm_metrics.E2E_REQUEST_LATENCY, model)] == [0.5]
    assert recorder.values[(llm_metrics.TIME_PER_OUTPUT_TOKEN, model)] == [pytest.approx(0.1)]
    assert recorder.values[(llm_metrics.TIME_TO_FIRST_TOKEN, model)] == []  # observed by first_token()


def test_the_openai_api_histograms_use_the_models_bucket_edges():
    """One set of latency buckets (bls/llm_metrics.py) for the models and the API, so one dashboard compares them."""
    from bls import llm_metrics
    from openai_api.metrics import ApiMetrics

    metrics = ApiMetrics()
    for histogram, edges in ((metrics.time_to_first_token, llm_metrics.TIME_TO_FIRST_TOKEN_BUCKETS),
                             (metrics.inter_token_latency, llm_metrics.TIME_PER_OUTPUT_TOKEN_BUCKETS),
                             (metrics.request_duration, llm_metrics.E2E_REQUEST_LATENCY_BUCKETS)):
        assert tuple(histogram._upper_bounds[:-1]) == edges  # prometheus_client adds +Inf
