"""Soak test: many concurrent clients with a realistic request mix against a served repository.

    python -m tools.soak --repo build/model_repository --duration 120 --concurrency 16

Starts its own tritonserver on loopback (or uses --server-url host:http_port[,grpc_port]), runs
`--concurrency` client threads for `--duration` seconds, each drawing requests from MIX: streaming BLS
(HTTP and gRPC), non-streamed and streamed ensemble generate, conversations (`messages`), speculative BLS
(num_draft_tokens 4), clients that disconnect mid-stream (20 %: closed HTTP response, gRPC
stop_stream(cancel_requests=True)) and ~5 % bad inputs, whose errors are expected and counted apart.
The engine is the synthetic one at a GPU-like step (--step-ms), sending one response per token (from C++,
behind the engine relay: tools/engine_relay). Requests
refused for capacity (UNAVAILABLE, HTTP 503) are counted as shed: an answer, not a failure.

Exits non-zero when any request failed unexpectedly or hung past --request-timeout, when the engines
still hold sequences after the load stopped (cancelled work left behind), when the server died, or when
memory grew after warm-up beyond the thresholds (see MemoryLimits).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

from bls.contract import BLS_MODEL
from engine_build.repository import variant_repository
from serving.tritonserver import TritonServer, http_queue_warning, http_thread_queue_capacity, is_ready
from testkit.grpc import grpc_stream
from testkit.http import HttpError, HttpSession, Hung
from testkit.metrics import metric_values
from testkit.processes import find_server_pid, rss_bytes, shm_files, triton_processes
from testkit.stats import percentile
from tools import engine_relay

BLS = BLS_MODEL
ENSEMBLE = "ensemble"
PROMPTS = ("Once upon a time", "Écris un poème sur la mer 🌊", "用中文写一首诗", "def fibonacci(n):",
           "Explain Triton in one line.", "Привет! Как дела?")


@dataclass
class Outcome:
    workload: str
    outcome: str  # ok | cancelled | expected_error | shed | unexpected_error | hung
    error: str | None = None
    ttft_s: float | None = None
    inter_token_s: list[float] = field(default_factory=list)
    started_s: float = 0.0  # seconds into the load when the request began (when failures cluster, one cause)


def shed(message: str) -> bool:
    """A refusal for capacity (UNAVAILABLE / HTTP 503): an answer the client can act on, not a failure."""
    return any(mark in message for mark in ("at capacity", "Exceeds maximum queue size", "UNAVAILABLE"))


def _error(workload: str, message: str) -> Outcome:
    return Outcome(workload, "shed" if shed(message) else "unexpected_error", message)


def _timed(workload: str, started: float, arrivals: list[float]) -> Outcome:
    gaps = [b - a for a, b in pairwise(arrivals)]
    return Outcome(workload, "ok", ttft_s=arrivals[0] - started if arrivals else None, inter_token_s=gaps)


def http_stream(workload: str, body: dict, model: str = BLS, disconnect_after: int | None = None):
    def run(target: Target, timeout: float) -> Outcome:
        started, arrivals = time.perf_counter(), []
        session = HttpSession(target.http, timeout)
        request_id = uuid.uuid4().hex  # Triton answers with it in every event: whose events these are
        events = session.stream_events(model, {**body, "id": request_id})
        received, last = 0, b""
        try:
            for arrival, payload in events:
                received, last = received + 1, payload
                event = json.loads(payload)
                if "error" in event and "id" not in event:  # Triton's error events carry no id
                    return _error(workload, event["error"])
                if event.get("id") != request_id:
                    return Outcome(workload, "unexpected_error", f"cross-talk: an event of request {event.get('id')!r} "
                                                                 "on the connection of another request")
                if "error" in event:
                    return _error(workload, event["error"])
                if event.get("text_output") and "finish_reason" not in event:  # token events, not the summary
                    arrivals.append(arrival)
                if disconnect_after is not None and len(arrivals) >= disconnect_after:
                    return Outcome(workload, "cancelled", ttft_s=arrivals[0] - started)
        except HttpError as error:  # refused before the stream started (HTTP 503 when at capacity)
            return _error(workload, f"HTTP {error.status}: {error.message}")
        except Hung as error:  # where it stopped says whose it is: was the final event (finish_reason) in?
            final = "the final event came, the stream's end did not" if b'"finish_reason"' in last else "no final event"
            raise Hung(f"{error} after {received} events ({final})") from error
        finally:
            events.close()
            session.close()
        if disconnect_after is not None:
            return Outcome(workload, "unexpected_error", "stream ended before the client disconnected")
        return _timed(workload, started, arrivals)

    return run


def grpc_bls_stream(workload: str, text: str, max_tokens: int, cancel_after: int | None = None):
    def run(target: Target, timeout: float) -> Outcome:
        inputs = {"text_input": np.array([[text.encode()]], dtype=object),
                  "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[True]])}
        started = time.monotonic()
        try:
            result = grpc_stream(target.grpc, BLS, inputs, ["text_output"], cancel_after=cancel_after,
                                 timeout=timeout)
        except queue.Empty as error:
            raise Hung(f"no gRPC response within {timeout:.0f} s") from error
        if result.error is not None:
            return _error(workload, result.error)
        if cancel_after is not None:
            return Outcome(workload, "cancelled", ttft_s=result.arrival_times[0] - started)
        # The last response is the summary (held-back tail only); the others carry the tokens.
        return _timed(workload, started, result.arrival_times[:-1] or result.arrival_times)

    return run


def http_generate(workload: str, model: str, body: dict, expected_error_field: str | None = None):
    def run(target: Target, timeout: float) -> Outcome:
        request_id = uuid.uuid4().hex
        request = urllib.request.Request(f"http://{target.http}/v2/models/{model}/generate",
                                         data=json.dumps({**body, "id": request_id}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read())
            if answer.get("id") != request_id:
                return Outcome(workload, "unexpected_error", f"cross-talk: the answer of request {answer.get('id')!r} "
                                                             "on the connection of another request")
        except urllib.error.HTTPError as error:
            message = error.read().decode(errors="replace")
            if expected_error_field and error.code == 400 and expected_error_field in message:
                return Outcome(workload, "expected_error", message)
            return _error(workload, f"HTTP {error.code}: {message}")
        except TimeoutError as error:
            raise Hung(f"no response within {timeout:.0f} s") from error
        if expected_error_field:
            return Outcome(workload, "unexpected_error", f"accepted a bad request ({expected_error_field})")
        return Outcome(workload, "ok")

    return run


# ---- the request mix ---------------------------------------------------------------------------------

BAD_INPUTS = (  # (model, body, the field the error must name)
    (BLS, {"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    (BLS, {"text_input": "hi", "max_tokens": 4, "num_draft_tokens": 1000}, "num_draft_tokens"),
    (BLS, {"messages": "[{\"role\": \"user\"}]", "max_tokens": 4}, "content"),
    (BLS, {"text_input": "hi", "messages": "[]", "max_tokens": 4}, "text_input"),
    (ENSEMBLE, {"text_input": "hi", "max_tokens": 5000}, "max_seq_len"),
)

Workload = Callable[["Target", float], Outcome]


def conversation(rng: random.Random) -> str:
    turns = [{"role": "system", "content": "You are terse."}]
    for index in range(rng.randint(1, 3)):
        turns += [{"role": "user", "content": rng.choice(PROMPTS)},
                  {"role": "assistant", "content": f"Answer {index}."}]
    turns.append({"role": "user", "content": rng.choice(PROMPTS)})
    return json.dumps(turns, ensure_ascii=False)


MIX: tuple[tuple[str, float, Callable[[random.Random], Workload]], ...] = (
    ("bls_stream_http", 0.22, lambda r: http_stream(
        "bls_stream_http", {"text_input": r.choice(PROMPTS), "max_tokens": r.randint(8, 48), "stream": True})),
    ("bls_stream_grpc", 0.12, lambda r: grpc_bls_stream("bls_stream_grpc", r.choice(PROMPTS), r.randint(8, 48))),
    ("ensemble_generate", 0.18, lambda r: http_generate(
        "ensemble_generate", ENSEMBLE, {"text_input": r.choice(PROMPTS), "max_tokens": r.randint(8, 32)})),
    # Streamed through the ensemble (its handoff, where the repository has one). No disconnects here: Triton's
    # ensemble does not pass a client's cancellation to a running step, so the engine finishes such a stream.
    ("ensemble_stream", 0.10, lambda r: http_stream(
        "ensemble_stream", {"text_input": r.choice(PROMPTS), "max_tokens": r.randint(8, 48), "stream": True},
        model=ENSEMBLE)),
    ("conversation", 0.12, lambda r: http_stream(
        "conversation", {"messages": conversation(r), "max_tokens": r.randint(8, 32), "stream": True})),
    ("speculative", 0.14, lambda r: http_stream(
        "speculative", {"text_input": r.choice(PROMPTS), "max_tokens": r.randint(8, 48), "num_draft_tokens": 4,
                        "stream": True})),
    ("disconnect_http", 0.10, lambda r: http_stream(
        "disconnect_http", {"text_input": r.choice(PROMPTS), "max_tokens": 1000, "end_id": -1, "stream": True},
        disconnect_after=r.randint(1, 4))),
    ("disconnect_grpc", 0.10, lambda r: grpc_bls_stream(
        "disconnect_grpc", r.choice(PROMPTS), 1000, cancel_after=r.randint(1, 4))),
    ("bad_input", 0.05, lambda r: http_generate("bad_input", *r.choice(BAD_INPUTS))),
)


def mix_weights(items: list[str]) -> list[float]:
    """MIX's weights with some replaced by `--weight NAME=W` items (0 leaves a workload out)."""
    names = [name for name, _, _ in MIX]
    overrides = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in names:
            raise ValueError(f"--weight: no workload {name!r} (the mix has {', '.join(names)})")
        try:
            overrides[name] = float(value)
        except ValueError:
            raise ValueError(f"--weight: {name}'s weight must be a number, got {value!r}") from None
        if not overrides[name] >= 0:
            raise ValueError(f"--weight: {name}'s weight must be >= 0, got {value}")
    weights = [overrides.get(name, weight) for name, weight, _ in MIX]
    if not any(weights):
        raise ValueError("--weight: every workload's weight is 0")
    return weights


def draw(rng: random.Random, weights: list[float]) -> tuple[str, Workload]:
    name, _, make = rng.choices(MIX, weights=weights)[0]
    return name, make(rng)


# ---- server processes, memory, metrics ------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    http: str  # host:port
    grpc: str
    metrics: str  # URL
    server_pid: int


@dataclass
class MemorySnapshot:
    label: str
    rss_bytes: dict[str, int]  # process name -> RSS
    shm_bytes: int  # /dev/shm space held by files the server's processes map
    dev_shm_used_bytes: int  # all of /dev/shm (other servers on the box included)

    @property
    def total_rss(self) -> int:
        return sum(self.rss_bytes.values())

    @classmethod
    def take(cls, label: str, server_pid: int) -> MemorySnapshot:
        processes = triton_processes(server_pid)
        rss = {}
        for name, process in processes.items():
            rss[name] = rss_bytes(process)  # 0 when the process is gone: reported, and the run fails on it
        shm = 0
        for path in shm_files(list(processes.values())):
            try:
                shm += os.stat(path).st_blocks * 512  # allocated, not apparent, size
            except OSError:
                pass
        fs = os.statvfs("/dev/shm")
        return cls(label, rss, shm, (fs.f_blocks - fs.f_bfree) * fs.f_frsize)


@dataclass(frozen=True)
class MemoryLimits:
    """Growth allowed from the post-warm-up snapshot to the end of the load (both taken under load).

    RSS: 10 %. After warm-up every code path, torch's CPU allocator caches and glibc's per-thread arenas
    have reached their working size, so what remains is allocator noise (a few %); a per-request leak
    (a kept KV cache, response or thread per request) grows linearly with the thousands of requests of a
    soak and crosses 10 % of a ~1 GB stack within minutes at a few MB/min.
    Shared memory: 32 MiB. Python-backend regions grow to the largest tensor seen and never shrink, and
    warm-up has already sent the largest tensors of the mix, so any further growth is a leak of regions.
    """

    rss_growth_fraction: float = 0.10
    shm_growth_bytes: int = 32 << 20

    def violations(self, warm: MemorySnapshot, end: MemorySnapshot) -> list[str]:
        problems = []
        if end.total_rss > warm.total_rss * (1 + self.rss_growth_fraction):
            problems.append(f"RSS grew {_mb(end.total_rss - warm.total_rss)} after warm-up "
                            f"(limit {self.rss_growth_fraction:.0%} of {_mb(warm.total_rss)})")
        if end.shm_bytes - warm.shm_bytes > self.shm_growth_bytes:
            problems.append(f"/dev/shm regions grew {_mb(end.shm_bytes - warm.shm_bytes)} after warm-up "
                            f"(limit {_mb(self.shm_growth_bytes)})")
        return problems


def wait_engines_idle(metrics_url: str, timeout_s: float) -> dict[str, float]:
    """Engine sequences (active + queued) per engine model once zero, or what is left at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        active = metric_values(metrics_url, "embedded_engine_active_sequences")
        queued = metric_values(metrics_url, "embedded_engine_queued_sequences")
        # Every model reporting the embedded engine's gauges: tensorrt_llm and its draft, or the Python models
        # behind their relays (tensorrt_llm_python, ...). A TensorRT-LLM server reports none.
        left = {model: active[model] + queued.get(model, 0) for model in active}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


# ---- the run ---------------------------------------------------------------------------------------------

@dataclass
class Report:
    duration_s: float
    concurrency: int
    outcomes: dict[str, dict[str, int]]  # workload -> outcome -> count
    error_classes: dict[str, dict[str, int]]  # expected | unexpected -> normalised message -> count
    latency_ms: dict[str, float | None]
    memory: list[MemorySnapshot]
    engine_sequences_after_quiesce: dict[str, float]
    server_alive: bool
    failures: list[str]
    incidents: list[str]  # every unexpected error and hung request: when it began, what, which workload
    http_thread_queue: int  # responses one tritonserver HTTP thread may have queued before they are dropped


def error_class(message: str) -> str:
    """The message with ids and numbers blanked, so equal failures group together."""
    return re.sub(r"[0-9a-f]{12,}|\d+", "N", message.strip().splitlines()[0] if message.strip() else "")[:160]


def run_load(target: Target, duration_s: float, concurrency: int, request_timeout_s: float, warmup_s: float,
             seed: int, weights: list[float]) -> tuple[list[Outcome], list[MemorySnapshot]]:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    began = time.monotonic()
    deadline = began + duration_s

    current: dict[int, tuple[str, float]] = {}  # client index -> the workload it runs, since when

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline:
            name, workload = draw(rng, weights)
            started = time.monotonic() - began
            current[index] = (name, started)
            try:
                outcome = workload(target, request_timeout_s)
            except Hung as error:
                outcome = Outcome(name, "hung", str(error))
            except Exception as error:  # noqa: BLE001 - a client-side failure is a finding, not a crash
                outcome = Outcome(name, "unexpected_error", f"{type(error).__name__}: {error}")
            outcome.started_s = started
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    time.sleep(min(warmup_s, duration_s))
    snapshots = [MemorySnapshot.take("after warm-up", target.server_pid)]
    time.sleep(max(0.0, deadline - time.monotonic()))
    snapshots.append(MemorySnapshot.take("end of load", target.server_pid))
    join_deadline = time.monotonic() + request_timeout_s + 10  # one bound for all: requests run in parallel
    for thread in threads:  # each finishes its request in flight, bounded by the request timeout
        thread.join(max(0.0, join_deadline - time.monotonic()))
    for index, thread in enumerate(threads):
        if thread.is_alive():
            name, started = current[index]
            outcomes.append(Outcome(name, "hung", "no end by the request timeout after the load (the client's own "
                                                  "timeout did not fire)", started_s=started))
    return outcomes, snapshots


def summarise(target: Target, args, outcomes: list[Outcome], snapshots: list[MemorySnapshot],
              server_alive: Callable[[], bool]) -> Report:
    by_workload: dict[str, Counter] = {}
    classes: dict[str, Counter] = {"expected": Counter(), "shed": Counter(), "unexpected": Counter()}
    ttft, itl = [], []
    for outcome in outcomes:
        by_workload.setdefault(outcome.workload, Counter())[outcome.outcome] += 1
        if outcome.outcome in ("expected_error", "shed"):
            kind = "expected" if outcome.outcome == "expected_error" else "shed"
            classes[kind][error_class(outcome.error or "")] += 1
        elif outcome.outcome in ("unexpected_error", "hung"):
            classes["unexpected"][f"{outcome.outcome}: {error_class(outcome.error or '')}"] += 1
        if outcome.ttft_s is not None:
            ttft.append(outcome.ttft_s)
        itl += outcome.inter_token_s
    left = wait_engines_idle(target.metrics, timeout_s=30) if server_alive() else {}
    snapshots.append(MemorySnapshot.take("after quiesce", target.server_pid) if server_alive() else snapshots[-1])
    incidents = [f"{o.started_s:7.1f} s  {o.workload}  {o.outcome}: {(o.error or '').strip()[:300]}"
                 for o in sorted(outcomes, key=lambda o: o.started_s) if o.outcome in ("unexpected_error", "hung")]
    failures = []
    if classes["unexpected"]:
        failures.append(f"{sum(classes['unexpected'].values())} unexpected errors or hung requests")
    if any(left.values()):
        failures.append(f"engine sequences left after quiesce: {left}")
    if not server_alive():
        failures.append("tritonserver died")
    failures += MemoryLimits(args.max_rss_growth, args.max_shm_growth_mb << 20).violations(snapshots[1], snapshots[2])
    return Report(
        duration_s=args.duration,
        concurrency=args.concurrency,
        outcomes={name: dict(counts) for name, counts in sorted(by_workload.items())},
        error_classes={kind: dict(counts.most_common()) for kind, counts in classes.items()},
        latency_ms={
            "ttft_p50": _ms(_percentile(ttft, 50)), "ttft_p99": _ms(_percentile(ttft, 99)),
            "itl_p50": _ms(_percentile(itl, 50)), "itl_p99": _ms(_percentile(itl, 99)),
            "ttft_samples": len(ttft), "itl_samples": len(itl),
        },
        memory=snapshots,
        engine_sequences_after_quiesce=left,
        server_alive=server_alive(),
        failures=failures,
        incidents=incidents,
        http_thread_queue=http_thread_queue_capacity(),
    )


def _percentile(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _mb(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


def print_report(report: Report) -> None:
    total = sum(sum(c.values()) for c in report.outcomes.values())
    print(f"\n=== soak: {report.duration_s:.0f} s, concurrency {report.concurrency}, {total} requests ===")
    for workload, counts in report.outcomes.items():
        print(f"  {workload:18s} " + "  ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    for kind, counts in report.error_classes.items():
        print(f"{kind} errors: {sum(counts.values())}")
        for message, count in counts.items():
            print(f"  {count:5d}  {message}")
    lat = report.latency_ms
    print(f"TTFT p50 {lat['ttft_p50']} ms, p99 {lat['ttft_p99']} ms ({lat['ttft_samples']} streams); "
          f"inter-token p50 {lat['itl_p50']} ms, p99 {lat['itl_p99']} ms ({lat['itl_samples']} gaps)")
    names = sorted({name for snap in report.memory for name in snap.rss_bytes})
    rows = [(name, [s.rss_bytes.get(name, 0) for s in report.memory]) for name in names]
    rows += [("total", [s.total_rss for s in report.memory]),
             ("/dev/shm (server)", [s.shm_bytes for s in report.memory]),
             ("/dev/shm (all)", [s.dev_shm_used_bytes for s in report.memory])]
    width = max(len(name) for name, _ in rows) + 2
    print(f"{'RSS (MiB)':{width + 2}s}" + "".join(f"{s.label:>16s}" for s in report.memory))
    for name, values in rows:
        print(f"  {name:{width}s}" + "".join(f"{v / 2**20:16.1f}" for v in values))
    print(f"engine sequences after quiesce: {report.engine_sequences_after_quiesce}")
    print(f"tritonserver HTTP thread queue: {report.http_thread_queue} responses (net.core.wmem_default)")
    if report.incidents:
        print(f"incidents (when each began into the load; first 20 of {len(report.incidents)}):")
        for incident in report.incidents[:20]:
            print(f"  {incident}")
    print("RESULT: " + ("PASS" if not report.failures else "FAIL: " + "; ".join(report.failures)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    parser.add_argument("--server-url", help="host:http_port[,grpc_port] of a running local server (loopback)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=None, help="seconds before the baseline memory "
                        "snapshot (default: a quarter of the duration, at least 10 s)")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="a request silent this long is hung")
    parser.add_argument("--max-rss-growth", type=float, default=MemoryLimits.rss_growth_fraction)
    parser.add_argument("--max-shm-growth-mb", type=int, default=MemoryLimits.shm_growth_bytes >> 20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="the synthetic engine's step (one token for every active stream per step, like a GPU; "
                             "one response per token); 0 serves --repo itself (the real tiny model)")
    parser.add_argument("--report", type=Path, default=Path("build/soak/report.json"))
    parser.add_argument("--server-log", type=Path, default=Path("build/soak/tritonserver.log"))
    parser.add_argument("--weight", action="append", default=[], metavar="WORKLOAD=W",
                        help="replace a workload's share of the mix (0 leaves it out), e.g. disconnect_http=0.4; "
                             "repeatable")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="one more tritonserver argument, e.g. --server-arg=--http-thread-count=32; repeatable")
    args = parser.parse_args(argv)
    try:
        weights = mix_weights(args.weight)
    except ValueError as error:
        parser.error(str(error))
    warmup = args.warmup if args.warmup is not None else max(10.0, args.duration / 4)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    if warning := http_queue_warning():
        print(warning, flush=True)

    def soak(target: Target, server_alive: Callable[[], bool]) -> Report:
        start = MemorySnapshot.take("start", target.server_pid)
        outcomes, snapshots = run_load(target, args.duration, args.concurrency, args.request_timeout, warmup, args.seed,
                                       weights)
        return summarise(target, args, outcomes, [start, *snapshots], server_alive)

    if args.server_url:
        host, _, ports = args.server_url.partition(":")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("--server-url must be a loopback address: process memory is read from /proc")
        http_port, _, grpc_port = (ports or "8000").partition(",")
        http = f"127.0.0.1:{http_port}"
        if not is_ready(http):
            raise SystemExit(f"no ready server at {http}")
        target = Target(http, f"127.0.0.1:{grpc_port or int(http_port) + 1}",
                        f"http://127.0.0.1:{int(http_port) + 2}/metrics", find_server_pid(int(http_port)))
        report = soak(target, lambda: is_ready(http))
    else:
        args.server_log.parent.mkdir(parents=True, exist_ok=True)
        repo = args.repo.resolve()
        if args.step_ms:
            # The engine as a GPU deployment paces it: every active stream gets one token per step, each in
            # its own response; 256 run at once (an engine batch), 64 more may wait, the rest is shed (503).
            # Behind the engine relay: a step's responses leave tritonserver from C++, back to back, as
            # TensorRT-LLM's C++ backend sends them.
            repo = engine_relay.install(variant_repository(
                repo, args.report.parent / "repo", synthetic=True, step_ms=args.step_ms, merge_streamed_tokens=False,
                max_active_requests=256, max_queued_requests=64))
        with TritonServer(repo, log_path=args.server_log, extra_args=tuple(args.server_arg)) as server:
            target = Target(server.http_url, server.grpc_url, server.metrics_url, server.process.pid)
            report = soak(target, server.is_alive)
    args.report.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    print_report(report)
    print(f"report: {args.report}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
