"""Section "aiperf": NVIDIA's AIPerf, unchanged, against the OpenAI-compatible API, beside this section's own
client sending the same load.

The engine is section "streaming"'s stand-in paced like a GPU (one token per stream every PACED_STEP_MS, never
ending a turn early), behind the relay, the BLS and the API (`--model-name bench`), so the figures are the serving
path's at a GPU engine's pace, not the CPU model's. AIPerf (PyPI `aiperf`, pinned by the Makefile in its own venv,
AIPERF_VENV) runs `aiperf profile --endpoint-type chat --streaming` at CONCURRENCY streams for REQUESTS requests of
ISL prompt tokens and OSL output tokens, counting tokens client-side with the repository's own tokenizer (offline:
a local folder). Its figures are read from its JSON export (`profile_export_aiperf.json`), never its console.

The own client (bench_openai's HTTP/1.1 client) sends what AIPerf sends: one user message of ISL tokens,
`max_completion_tokens` OSL, `stream_options.include_usage`, no sampling fields (the API's defaults, temperature
1), CONCURRENCY workers taking REQUESTS requests in turn. Its figures follow AIPerf's definitions: time to first
token from sending to the first chunk with text; inter-token latency per request (end - first token) / (tokens - 1)
with the API's usage as the token count, p50 over requests; output tok/s = tokens / the run's wall time. Its
percentiles are nearest-rank (testkit.stats), AIPerf's interpolated: with REQUESTS = 32 a p99 differs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from testkit.openai_api import openai_api
from testkit.stats import percentile
from tools.bench_common import BenchContext, Row, Target
from tools.bench_openai import Trace, api_stream
from tools.bench_streaming import PACED_STEP_MS, _repo

CONCURRENCY = 4  # 2 cores: AIPerf's own processes, the API and tritonserver share them
REQUESTS = 32
QUICK_REQUESTS = 8
ISL = 64
OSL = 64  # 64 x 40 ms: a 2.6 s stream
MODEL_NAME = "bench"
PROMPT_TEXT = "Write a long story about a lighthouse keeper and the sea. " * 32
AIPERF_TIMEOUT_S = 600
NO_ERRORS = Target("==", 0)


@dataclass(frozen=True)
class ClientFigures:
    requests: int  # completed with OSL tokens
    errors: int
    ttft_ms_p50: float | None  # None: no request completed
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    output_tokens_per_s: float | None


def _prompt(tokenizer_dir: Path) -> str:
    """A user message of ISL tokens by the repository's tokenizer (the template adds its own around it)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False).ids[:ISL]
    return tokenizer.decode(ids)


def own_client(port: int, prompt: str, requests: int) -> ClientFigures:
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
                       "max_completion_tokens": OSL, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()

    async def main() -> tuple[list[Trace], int, float]:
        await api_stream("127.0.0.1", port, body)  # warm-up, as AIPerf's first requests are not special either
        queue = iter(range(requests))
        traces: list[Trace] = []
        errors = 0

        async def worker() -> None:
            nonlocal errors
            for _ in queue:  # the workers share one iterator: each request is taken once
                try:
                    trace = await api_stream("127.0.0.1", port, body)
                except (OSError, RuntimeError, ValueError, KeyError):
                    errors += 1
                    continue
                if trace.first is None or trace.tokens != OSL:
                    errors += 1
                else:
                    traces.append(trace)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return traces, errors, time.perf_counter() - began

    traces, errors, wall_s = asyncio.run(main())
    if not traces:
        return ClientFigures(0, errors, None, None, None, None)
    ttft = [(t.first - t.sent) * 1000 for t in traces]
    itl = [(t.end - t.first) * 1000 / (t.tokens - 1) for t in traces]
    return ClientFigures(len(traces), errors, percentile(ttft, 50), percentile(ttft, 99), percentile(itl, 50),
                         sum(t.tokens for t in traces) / wall_s)


def run_aiperf(aiperf: Path, api_url: str, tokenizer_dir: Path, requests: int, artifacts: Path) -> dict:
    """AIPerf's JSON export of one `aiperf profile` run (its console goes to artifacts/console.txt)."""
    shutil.rmtree(artifacts, ignore_errors=True)  # never read an earlier run's export
    artifacts.mkdir(parents=True)
    command = [str(aiperf), "profile", "--model", MODEL_NAME, "--url", api_url, "--endpoint-type", "chat",
               "--streaming", "--concurrency", str(CONCURRENCY), "--request-count", str(requests),
               "--isl", str(ISL), "--osl", str(OSL), "--tokenizer", str(tokenizer_dir.resolve()),
               "--random-seed", "0", "--ui", "simple", "--artifact-dir", str(artifacts)]
    print("+ " + " ".join(command), flush=True)
    # The tokenizer is a local folder, which AIPerf 0.13.0 loads from disk without asking the Hub, except in HF
    # offline mode: there it looks every name up in the Hub's cache (`_from_pretrained_local`,
    # snapshot_download(local_files_only=True)) and fails on a folder (HFValidationError). So not offline.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    run = subprocess.run(command, env=env, cwd=artifacts, capture_output=True, text=True, timeout=AIPERF_TIMEOUT_S)
    (artifacts / "console.txt").write_text(run.stdout + run.stderr)
    exports = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if run.returncode != 0 or not exports:
        raise RuntimeError(f"aiperf exited {run.returncode} (console: {artifacts / 'console.txt'}):\n"
                           f"{(run.stdout + run.stderr)[-3000:]}")
    return json.loads(exports[0].read_text())


def aiperf_figures(export: dict) -> ClientFigures:
    """From AIPerf's export, where a metric with no value is absent (`error_request_count` when none failed)."""
    def stat(metric: str, key: str) -> float | None:
        return export.get(metric, {}).get(key)

    return ClientFigures(
        requests=int(stat("request_count", "avg") or 0), errors=int(stat("error_request_count", "avg") or 0),
        ttft_ms_p50=stat("time_to_first_token", "p50"), ttft_ms_p99=stat("time_to_first_token", "p99"),
        itl_ms_p50=stat("inter_token_latency", "p50"), output_tokens_per_s=stat("output_token_throughput", "avg"))


def run(ctx: BenchContext) -> list[Row]:
    aiperf = (ctx.aiperf_venv / "bin" / "aiperf").resolve()  # absolute: AIPerf runs in its artifacts folder
    if not aiperf.is_file():
        raise RuntimeError(f"no AIPerf at {aiperf}: `make bench` makes its venv (or make {ctx.aiperf_venv}/.installed)")
    requests = QUICK_REQUESTS if ctx.quick else REQUESTS
    logs = ctx.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    prompt = _prompt(ctx.tokenizer_dir)
    server = ctx.server(_repo(ctx, "streaming-paced", step_ms=PACED_STEP_MS, engine_instances=1))
    with openai_api(server.grpc_url, logs / "openai_api-aiperf.log", "--model-name", MODEL_NAME) as api:
        port = int(api.url.rsplit(":", 1)[1])
        own = own_client(port, prompt, requests)
        export = run_aiperf(aiperf, api.url, ctx.tokenizer_dir, requests, ctx.work_dir / "aiperf")
    nvidia = aiperf_figures(export)
    label = f"{CONCURRENCY} streams, {ISL}->{OSL} tokens"
    rows: list[Row] = []
    for name, own_value, nvidia_value, unit, target in (
        ("completed requests", own.requests, nvidia.requests, "", Target("==", requests)),
        ("errors", own.errors, nvidia.errors, "", NO_ERRORS),
        ("time to first token p50", own.ttft_ms_p50, nvidia.ttft_ms_p50, "ms", None),
        ("time to first token p99", own.ttft_ms_p99, nvidia.ttft_ms_p99, "ms", None),
        ("inter-token latency p50", own.itl_ms_p50, nvidia.itl_ms_p50, "ms", None),
        ("output token throughput", own.output_tokens_per_s, nvidia.output_tokens_per_s, "tok/s", None),
    ):
        rows.append(Row(f"{label}: {name}, own client", own_value, unit, target))
        rows.append(Row(f"{label}: {name}, AIPerf {export.get('aiperf_version', '?')}", nvidia_value, unit, target))
    counted = export.get("total_output_tokens", {}).get("avg")
    usage = export.get("total_usage_completion_tokens", {}).get("avg")
    rows.append(Row("AIPerf: output tokens by its tokenizer / by the API's usage",
                    counted / usage if counted and usage else None, "x",
                    note="AIPerf counts tokens by re-tokenizing the streamed text; 1.0 when the text re-tokenizes "
                         "to the tokens generated"))
    return rows
