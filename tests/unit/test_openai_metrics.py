"""The API's gathered histogram observations (openai_api.metrics.GatheredObservations) against observe() each."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from bls.llm_metrics import TIME_PER_OUTPUT_TOKEN_BUCKETS
from openai_api.metrics import GAPS_PER_FLUSH, GatheredObservations


def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(sample.name, sample.labels.get("le", "")): sample.value
            for metric in registry.collect() for sample in metric.samples if not sample.name.endswith("_created")}


def test_gathered_observations_are_the_same_buckets_count_and_sum_as_one_observe_each():
    # Every bucket bound itself (an amount equal to a bound is in that bucket), between them, past the last, 0.
    amounts = [0.0, *TIME_PER_OUTPUT_TOKEN_BUCKETS, *(b * 1.5 for b in TIME_PER_OUTPUT_TOKEN_BUCKETS), 1e6] * 3
    one_each, gathered = CollectorRegistry(), CollectorRegistry()
    expected = Histogram("gaps", "", ["model"], buckets=TIME_PER_OUTPUT_TOKEN_BUCKETS, registry=one_each)
    series = Histogram("gaps", "", ["model"], buckets=TIME_PER_OUTPUT_TOKEN_BUCKETS, registry=gathered)
    observations = GatheredObservations(series.labels("m"))
    assert len(amounts) > GAPS_PER_FLUSH  # a flush on the way and one at the end
    for count, amount in enumerate(amounts, 1):
        expected.labels("m").observe(amount)
        observations.observe(amount)
        if count == GAPS_PER_FLUSH:  # added to the histogram without waiting for the end
            assert samples(gathered)[("gaps_count", "")] == GAPS_PER_FLUSH
    assert samples(gathered)[("gaps_count", "")] == GAPS_PER_FLUSH * (len(amounts) // GAPS_PER_FLUSH)
    observations.flush()
    observations.flush()  # nothing gathered: adds nothing
    want, got = samples(one_each), samples(gathered)
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert got[key] == (pytest.approx(value) if key[0] == "gaps_sum" else value), key
