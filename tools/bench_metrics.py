"""Section `metrics`: what the metrics cost per generated token, measured on a real tritonserver.

The request metrics (bls.llm_metrics: three histogram observations and three counter increments per finished BLS
request) and the engine's (embedded_engine.metrics: two histogram observations per engine request, twenty gauges
set per iteration) are recorded by a bench-only Python model (tools/bench_metrics_models/metrics_cost) through the
production classes on bls.triton_io.metrics.Metrics, which hands them to tritonserver every 0.1 s; the model answers the
CPU its stub spent, and tritonserver's share is read from /proc. Per token: per request / 128 tokens, per
iteration / 16 sequences (one token each). The ensemble's handoff records the same request metrics in C++,
in-process (atomic updates of prometheus-cpp metrics, no round trip): not measured here.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

from testkit.processes import cpu_seconds
from tools.bench_common import BenchContext, Row, Target

MODELS = Path(__file__).resolve().parent / "bench_metrics_models"
TOKENS_PER_REQUEST = 128  # as the bench model records them
SEQUENCES_PER_ITERATION = 16
# Per generated token, both processes: under 5 % of what the BLS itself spends per token on this 2-core host
# (45-64 µs, docs/benchmarks.md).
PER_TOKEN_TARGET_US = 2.0


def _phase(http_url: str, server_pid: int, phase: int, count: int) -> tuple[float, float]:
    """(stub CPU seconds, tritonserver CPU seconds) of one phase of `count` records."""
    body = json.dumps({"inputs": [{"name": "phase", "datatype": "INT32", "shape": [1], "data": [phase]},
                                  {"name": "count", "datatype": "INT32", "shape": [1], "data": [count]}]}).encode()
    before = cpu_seconds(server_pid)
    request = urllib.request.Request(f"http://{http_url}/v2/models/metrics_cost/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        stub_s = float(json.loads(response.read())["outputs"][0]["data"][0])
    after = cpu_seconds(server_pid)
    return stub_s, after["tritonserver"] - before["tritonserver"]


def run(ctx: BenchContext) -> list[Row]:
    repo = ctx.work_dir / "bench_metrics_models"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(MODELS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    server = ctx.server(repo)
    requests = 5_000 if ctx.quick else 20_000
    iterations = 1_000 if ctx.quick else 4_000
    _phase(server.http_url, server.process.pid, 0, 100)  # warm-up
    idle_stub, idle_server = _phase(server.http_url, server.process.pid, 0, 0)  # the sleep alone
    stub, served = _phase(server.http_url, server.process.pid, 0, requests)
    per_request = ((stub - idle_stub) / requests * 1e6, (served - idle_server) / requests * 1e6)
    stub, served = _phase(server.http_url, server.process.pid, 1, iterations)
    idle_stub, idle_server = _phase(server.http_url, server.process.pid, 2, iterations)  # the same time, idle
    per_iteration = ((stub - idle_stub) / iterations * 1e6, (served - idle_server) / iterations * 1e6)
    request_token = sum(per_request) / TOKENS_PER_REQUEST
    iteration_token = sum(per_iteration) / SEQUENCES_PER_ITERATION
    ctx.stop_server()
    return [
        Row("request metrics, per finished request: the stub's CPU (recording, and its share of the flushes)",
            round(per_request[0], 2), "µs"),
        Row("request metrics, per finished request: tritonserver's CPU", round(per_request[1], 2), "µs"),
        Row("engine gauges, per engine iteration: the stub's CPU", round(per_iteration[0], 2), "µs"),
        Row("engine gauges, per engine iteration: tritonserver's CPU", round(per_iteration[1], 2), "µs"),
        Row(f"metrics per generated token ({TOKENS_PER_REQUEST}-token requests, {SEQUENCES_PER_ITERATION} sequences "
            "per iteration), both processes", round(request_token + iteration_token, 3), "µs",
            Target("<=", PER_TOKEN_TARGET_US)),
    ]
