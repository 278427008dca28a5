"""Prometheus metrics of a running server, parsed with prometheus_client's own text parser."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        return response.read().decode()


def metric_values(metrics_url: str, name: str) -> dict[str, float]:
    """model label -> value of the samples named `name` (a counter's `_total` sample included)."""
    values = {}
    for family in text_string_to_metric_families(scrape(metrics_url)):
        for sample in family.samples:
            if sample.name == name and "model" in sample.labels:
                values[sample.labels["model"]] = sample.value
    return values


def metric_value(metrics_url: str, name: str, model: str) -> float:
    values = metric_values(metrics_url, name)
    if model not in values:
        raise KeyError(f"metric {name} has no sample for model {model!r}")
    return values[model]


def metric_sum(metrics_url: str, name: str, model: str) -> float:
    """The sum of the samples named `name` for `model` over their other labels (Triton's
    nv_inference_request_failure has one sample per `reason`)."""
    return sum(sample.value for family in text_string_to_metric_families(scrape(metrics_url))
               for sample in family.samples if sample.name == name and sample.labels.get("model") == model)


def wait_for_value(metrics_url: str, name: str, model: str, value: float, timeout_s: float = 10.0) -> bool:
    """Whether the sample of `name` for `model` equals `value` within timeout_s (polled every 0.1 s): model
    processes hand Triton their metric updates asynchronously."""
    deadline = time.monotonic() + timeout_s
    while metric_value(metrics_url, name, model) != value:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
