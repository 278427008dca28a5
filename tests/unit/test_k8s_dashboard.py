"""The Grafana dashboard and the Prometheus rules name only series something exports: our families (bls.llm_metrics,
embedded_engine.metrics, the OpenAI API's registry), Triton's own, and the rules' recordings. A renamed metric
breaks the dashboard silently; here it fails by name (tools/prometheus_check.py then shows every query returning
data against a real server)."""

from __future__ import annotations

import json
import re

import yaml

from bls import llm_metrics
from deploy.render import DASHBOARD, RULES
from embedded_engine import metrics as engine_metrics

# Triton's own families the rules and the dashboard read (docs/operations.md, "Triton's own").
TRITON = {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_queue_duration_us"}
NAME = re.compile(r"\b(llm_[a-z0-9_]+|nv_[a-z0-9_]+|llama3_api_[a-z0-9_]+|llama3:[a-z0-9_:]+)")
SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def _api_families() -> set[str]:
    from openai_api.metrics import ApiMetrics

    return {family.name for family in ApiMetrics().registry.collect()}


def _exported() -> set[str]:
    ours = {llm_metrics.TIME_TO_FIRST_TOKEN, llm_metrics.REQUEST_QUEUE_TIME, llm_metrics.TIME_PER_OUTPUT_TOKEN,
            llm_metrics.E2E_REQUEST_LATENCY,
            llm_metrics.PROMPT_TOKENS, llm_metrics.GENERATION_TOKENS, llm_metrics.REQUESTS}
    engine = {engine_metrics.REQUEST_METRICS, engine_metrics.KV_CACHE_BLOCK_METRICS,
              engine_metrics.INFLIGHT_BATCHER_METRICS, engine_metrics.GENERAL_METRICS,
              engine_metrics.RUNTIME_MEMORY_METRICS, engine_metrics.INPUT_TOKEN_LEN, engine_metrics.OUTPUT_TOKEN_LEN}
    recorded = {rule["record"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
                if "record" in rule}
    return ours | engine | TRITON | _api_families() | recorded


def _family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and not name.startswith("llama3:"):
            return name[: -len(suffix)]
    return name


def _check(exprs: list[str], exported: set[str]) -> list[str]:
    missing = []
    for expr in exprs:
        for name in NAME.findall(expr):
            if name not in exported and _family(name) not in exported:
                missing.append(f"{name} (in {expr[:80]})")
    return missing


def test_every_dashboard_query_reads_exported_series():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    assert len(exprs) >= 10
    assert _check(exprs, _exported()) == []


def test_every_rule_reads_exported_series():
    rules = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert _check(rules, _exported()) == []


def test_a_misspelt_series_is_found():
    assert _check(['rate(llm_time_to_first_token_second_bucket[5m])'], _exported()) == [
        "llm_time_to_first_token_second_bucket (in rate(llm_time_to_first_token_second_bucket[5m]))"]
