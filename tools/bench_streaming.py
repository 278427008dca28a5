"""Section "streaming": our BLS and ensemble against the engine-alone floor, side by side, from one run.

The engine is the synthetic embedded engine sending one response per generated token per stream, as
TensorRT-LLM's C++ backend streams (never merged: `merge_streamed_tokens` is off), so the layers above it
are loaded the way a GPU deployment loads them. With --engine python the stand-in runs behind a relay
(tools/engine_relay): its responses then leave tritonserver from C++, a step's back to back, as
the C++ backend sends them; from its Python stub each costs a synchronous send, so a paced step's responses
trickled out over several ms and woke the BLS for every few tokens, which no GPU deployment does (README,
Benchmarks). Each client streams STREAM_TOKENS tokens, ROUNDS times; the floor is what the same clients get
from `tensorrt_llm` directly (the engine hop alone). The figure that matters is the ratio to that floor; CPU µs
per streamed token per process says where time goes.

The clients are threads spread over several client processes (BenchContext.client_processes, one per 4 cores unless
`--client-processes` says otherwise; tools.bench_common.run_clients): one Python process tops out near a core. Every
run's figures stand beside what the clients cost: their cores used together, the busiest client process's share of
a core (target <= CLIENT_PROCESS_TARGET: above it, the client may be what was measured), and their CPU per token.

Unpaced, every client starts at once (a burst of arrivals), and the stand-in generates as fast as the CPU lets
it, faster than its own responses go out, so a new stream's first token waits behind queued responses (the
engine alone's first token p50 is printed beside the BLS's). Time to first token is therefore also measured in
steady traffic: the engine paced like a GPU, one token per stream every PACED_STEP_MS (a decoding step), at a
rate the engine hop carries here, and the clients' starts spread over one stream's duration. Paced, the BLS keeps
up and sends one response per token: its CPU per token there is what a GPU deployment's BLS pays. The paced runs
are at 16, 64 and 256 streams unless `--paced-streams` names others; the first-token targets are at
PACED_CONCURRENCY streams.

The ensemble (Triton's preprocessing -> tensorrt_llm -> postprocessing, through the handoff where the repository
has one) is measured beside the BLS in every run: its tok/s against the BLS's, its first token, and its CPU per
token by process (its two Python steps, tritonserver and of it the handoff's senders, the engine), unpaced and
paced.

Then the same at 64 and 256 streams with the BLS built with a stream interval of 4 (`make repo STREAM_INTERVAL=4`):
what an operator gains by streaming fewer, larger responses. Last, the floor under any Python-backend model that
streams one response per token: the CPU one response costs its stub to send, measured on a model that does nothing
else (tools/bench_models/stub_send), and what the same responses cost sent from a C++ backend
(tools/bench_models/send_cpp).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from bls.contract import BLS_MODEL
from engine_build.repository import relay_include_dir
from testkit.http import HttpSession
from testkit.processes import BENCH_ENGINE_THREAD, ENGINE_RELAY_THREAD, HANDOFF_THREAD, RELAY_THREAD, cpu_seconds
from testkit.stats import percentile
from tools import bench_engine, engine_relay
from tools.bench_common import BenchContext, LoadRun, Row, Target, stream_load
from tools.bench_pipeline import engine_body

STREAM_TOKENS = 256
BENCH_MODELS = Path(__file__).resolve().parent / "bench_models"  # stub_send (Python) and send_cpp (C++)
PROMPT = "Tell me a story about a brave little toaster."
MODELS = ("tensorrt_llm", "ensemble", BLS_MODEL)
PACED_STEP_MS = 40.0  # 64 streams x 25 tokens/s = 1,600 tok/s: about half of what the engine hop carries on 2 cores
PACED_CONCURRENCY = 64
STREAM_INTERVAL = 4  # the interval rows: `make repo STREAM_INTERVAL=4`
INTERVAL_CONCURRENCY = (64, 256)
# Issue 11's targets for this machine: the BLS at >= 0.6x the engine floor at 16 and 64 streams, first
# token p50 <= 100 ms at 64 streams, <= 60 µs of CPU per token in the BLS process.
RATIO_TARGET = {16: Target(">=", 0.6), 64: Target(">=", 0.6)}
TTFT_TARGET = Target("<=", 100)  # at PACED_CONCURRENCY, engine paced
BLS_CPU_TARGET = Target("<=", 60)
# Issue 34's targets for the ensemble (set for a 16-core host): >= 0.6x the BLS's tok/s at 64 and 256 streams,
# first token p50 <= 150 ms at 64 streams paced like a GPU.
ENSEMBLE_RATIO_TARGET = {64: Target(">=", 0.6), 256: Target(">=", 0.6)}
ENSEMBLE_TTFT_TARGET = Target("<=", 150)
# Not the client's figure: the busiest client process's share of a core during a run (one Python interpreter, threads).
CLIENT_PROCESS_TARGET = Target("<=", 0.8)
MODEL_NAMES = {"tensorrt_llm": "engine alone", BLS_MODEL: "BLS", "ensemble": "ensemble"}
# The ensemble's processes, by the prefix of their names in testkit.processes.cpu_seconds.
ENSEMBLE_STEPS = (("preprocessing", "preprocessing_"), ("postprocessing", "postprocessing_"))


def _bodies(ctx_server_url: str) -> dict[str, dict]:
    text = {"text_input": PROMPT, "max_tokens": STREAM_TOKENS, "end_id": -1, "stream": True}
    return {
        "tensorrt_llm": engine_body(HttpSession(ctx_server_url), PROMPT, STREAM_TOKENS) | {"streaming": True},
        "ensemble": text,
        BLS_MODEL: text,
    }


def _tokens_per_s(run: LoadRun) -> float:
    return STREAM_TOKENS * len(run.results) / run.wall_s


def _responses_per_token(run: LoadRun) -> float:
    """Streamed responses the clients received per generated token (1.0: one per token, as the engine sends)."""
    return sum(len(trace.arrivals) for trace in run.results) / (STREAM_TOKENS * len(run.results))


def _cpu_us_per_token(run: LoadRun, prefix: str) -> float:
    seconds = sum(s for name, s in run.server_cpu_s.items() if name.startswith(prefix))
    return seconds / (STREAM_TOKENS * len(run.results)) * 1e6


def _engine_cpu_us_per_token(run: LoadRun) -> float:
    """The stand-in engine's CPU per token: the C++ engine's step thread in tritonserver, or the Python engine's
    processes (tensorrt_llm_* alone, tensorrt_llm_python_* behind its relay) and its relay's thread."""
    return (_cpu_us_per_token(run, BENCH_ENGINE_THREAD) + _cpu_us_per_token(run, "tensorrt_llm_0")
            + _cpu_us_per_token(run, "tensorrt_llm_python") + _cpu_us_per_token(run, ENGINE_RELAY_THREAD))


def _bls_cpu_us_per_token(run: LoadRun) -> float:
    """The BLS's CPU per token: its Python processes (tensorrt_llm_bls_python_* behind the relay) and the relay's
    thread in tritonserver, which sends their responses."""
    return _cpu_us_per_token(run, BLS_MODEL) + _cpu_us_per_token(run, RELAY_THREAD)


# Admission for the largest load: every stream of a run taken on every path (1,024 streams of BLS, ensemble or engine
# alone; the runs are one after another), none refused: the engine holds them all, the BLS serves its default
# max_concurrent_requests per instance and queues the rest.
MAX_STREAMS = 1024


def _repo(ctx: BenchContext, name: str, step_ms: float, stream_interval: int = 1, engine_instances: int | None = None):
    """The variant a run serves: the C++ bench engine (ctx.engine "cpp", in place of the synthetic engine's
    tensorrt_llm), or the synthetic engine behind its relay, `engine_instances` of it (default ctx.engine_instances)."""
    cpp = ctx.engine == "cpp"
    repo = ctx.variant(name, synthetic=True, draft=None, max_seq_len=8192, max_active_requests=MAX_STREAMS,
                       max_queued_requests=MAX_STREAMS, max_queue_size=2 * MAX_STREAMS,
                       bls_max_queued_requests=MAX_STREAMS,
                       merge_streamed_tokens=False, step_ms=step_ms,
                       engine_instance_count=1 if cpp else engine_instances or ctx.engine_instances,
                       stream_interval=stream_interval,
                       **({"bls_instance_count": ctx.bls_instances} if ctx.bls_instances else {}))
    if cpp:
        return bench_engine.install(repo, step_ms=step_ms, max_active_requests=MAX_STREAMS,
                                    max_queued_requests=MAX_STREAMS)
    return engine_relay.install(repo)


def _client_rows(label: str, runs: dict[str, LoadRun]) -> list[Row]:
    """What the clients cost in each run, beside its figures: every client process's CPU together (cores, and µs
    per streamed token), and the busiest process's share of a core."""
    rows = []
    for model, run in runs.items():
        name = MODEL_NAMES[model]
        rows.append(Row(f"{label}: client CPU, {name} run ({run.client_processes} processes)", run.client_cores,
                        "cores"))
        rows.append(Row(f"{label}: client CPU, {name} run, busiest process", run.busiest_client_cores, "cores",
                        CLIENT_PROCESS_TARGET))
        tokens = STREAM_TOKENS * len(run.results)
        rows.append(Row(f"{label}: client CPU per token, {name} run", run.client_cpu_s / tokens * 1e6, "µs"))
    return rows


def _first_token_p50_ms(run: LoadRun) -> float:
    return percentile([trace.first_event_s * 1000 for trace in run.results], 50)


def _ensemble_cpu_rows(label: str, run: LoadRun) -> list[Row]:
    """Where an ensemble run's CPU goes, per streamed token: its Python steps (every postprocessing call is one
    engine response), tritonserver (the ensemble scheduler, the HTTP frontend, the Python backend's side of each
    step, the engine relay's thread), of it the handoff's senders (where Triton schedules the ensemble's steps for
    each engine response), and the engine stand-in."""
    rows = [Row(f"{label}: CPU per token, ensemble's {step}", _cpu_us_per_token(run, prefix), "µs")
            for step, prefix in ENSEMBLE_STEPS]
    rows.append(Row(f"{label}: CPU per token, tritonserver (ensemble run; incl. the engine relay)",
                    _cpu_us_per_token(run, "tritonserver"), "µs"))
    if HANDOFF_THREAD in run.server_cpu_s:  # a streaming repository (a unary one has no handoff)
        rows.append(Row(f"{label}: CPU per token, of it the handoff's sender threads",
                        _cpu_us_per_token(run, HANDOFF_THREAD), "µs"))
    rows.append(Row(f"{label}: CPU per token, engine (ensemble run)", _engine_cpu_us_per_token(run),
                    "µs"))
    return rows


def run(ctx: BenchContext) -> list[Row]:
    return _unpaced_rows(ctx) + _interval_rows(ctx) + _paced_rows(ctx) + _stub_send_rows(ctx)


def _stub_send_rows(ctx: BenchContext) -> list[Row]:
    """What one streamed response costs the Python backend's stub to send, with nothing else running: the floor
    under the BLS's CPU per token whenever it sends one response per token (BLS_CPU_TARGET). Beside it,
    tritonserver's share of the same sends, and the same responses sent by a C++ backend from inside
    tritonserver (send_cpp, compiled here when g++ is on PATH): what one response would cost a C++ BLS."""
    repo = _bench_models_repo(ctx)
    server = ctx.server(repo)
    session = HttpSession(server.http_url)
    count = 5_000 if ctx.quick else 20_000
    models = [("stub_send", "Python backend")]
    if (repo / "send_cpp" / "1" / "libtriton_send_cpp.so").is_file():
        models.append(("send_cpp", "C++ backend"))
    rows = []
    for model, backend in models:
        session.generate_stream(model, {"n": [100], "tensors": [1]})  # warm-up
        for tensors, what in ((1, "one output tensor (text_output)"), (2, "two output tensors (+ num_output_tokens)")):
            before, client_before = cpu_seconds(server.process.pid), time.process_time()
            trace = session.generate_stream(model, {"n": [count], "tensors": [tensors]})
            after, client_cpu_s = cpu_seconds(server.process.pid), time.process_time() - client_before
            if len(trace.arrivals) != count:
                raise RuntimeError(f"{model} sent {count} responses, the client received {len(trace.arrivals)}")
            spent = {name: (after[name] - before.get(name, 0.0)) / count * 1e6 for name in after}
            if model == "stub_send":
                rows.append(Row(f"Python backend stub alone: CPU per streamed response, {what}",
                                spent["stub_send_0_0"], "µs"))
            rows.append(Row(f"{backend}: tritonserver's CPU per streamed response, {what}", spent["tritonserver"],
                            "µs"))
            rows.append(Row(f"{backend}: client CPU per streamed response, {what} (one stream, this process)",
                            client_cpu_s / count * 1e6, "µs"))
    if len(models) == 1:
        print("send_cpp skipped: no g++ on PATH to build tools/bench_models/send_cpp/send_cpp.cc", flush=True)
    session.close()
    return rows


def _bench_models_repo(ctx: BenchContext) -> Path:
    """The bench-only models under the work dir, send_cpp's library compiled into its version folder."""
    repo = ctx.work_dir / "bench_models"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(BENCH_MODELS, repo, ignore=shutil.ignore_patterns("__pycache__", "*.cc"))
    if shutil.which("g++"):
        version = repo / "send_cpp" / "1"
        version.mkdir(parents=True, exist_ok=True)
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", f"-I{relay_include_dir()}", "-o",
                        str(version / "libtriton_send_cpp.so"), str(BENCH_MODELS / "send_cpp" / "send_cpp.cc")],
                       check=True)
    else:
        shutil.rmtree(repo / "send_cpp")
    return repo


def _unpaced_rows(ctx: BenchContext) -> list[Row]:
    # max_queued_requests: 256 streams x (BLS + ensemble + engine) never wait for a slot: the floor is the
    # engine's pace, not its queue. More engine instances (ctx.engine_instances) spread the stand-in over
    # cores, so that on a many-core host the engine is not the bottleneck being measured.
    repo = _repo(ctx, "streaming", step_ms=ctx.engine_step_ms)
    server = ctx.server(repo)
    bodies = _bodies(server.http_url)
    for model in MODELS:  # warm-up
        stream_load(server, model, 1, 1, lambda _i, m=model: bodies[m], processes=ctx.client_processes)
    # 0: the stand-in generates as fast as the CPU lets it, ahead of its own sending (responses queue, and a
    # stream's tokens leave in bursts); > 0: it also waits for its sending (embedded_engine/responses.py).
    rows: list[Row] = [Row("throughput runs: engine step (0: unpaced, runs ahead of its sending)",
                           ctx.engine_step_ms, "ms"),
                       Row("engine stand-in: the C++ bench engine (one step thread, as TensorRT-LLM's executor); "
                           "else the Python synthetic engine behind its relay", ctx.engine == "cpp"),
                       Row("client processes at most (the streams split across them)", ctx.client_processes, "")]
    for clients in ctx.streams:
        # A lone stream runs more rounds: CPU times tick in 10 ms, too coarse for one stream's few thousand tokens.
        rounds = (1 if ctx.quick else 2) * (8 if clients == 1 else 1)
        runs = {model: stream_load(server, model, clients, rounds, lambda _i, m=model: bodies[m],
                                   processes=ctx.client_processes)
                for model in MODELS}
        floor = _tokens_per_s(runs["tensorrt_llm"])
        rows.append(Row(f"{clients:>3} streams: engine alone (floor)", floor, "tok/s"))
        for model, label in ((BLS_MODEL, "BLS"), ("ensemble", "ensemble")):
            rate = _tokens_per_s(runs[model])
            rows.append(Row(f"{clients:>3} streams: {label}", rate, "tok/s"))
            rows.append(Row(f"{clients:>3} streams: {label} / floor", rate / floor, "x",
                            RATIO_TARGET.get(clients) if model == BLS_MODEL else None))
        rows.append(Row(f"{clients:>3} streams: ensemble / BLS",
                        _tokens_per_s(runs["ensemble"]) / _tokens_per_s(runs[BLS_MODEL]), "x",
                        ENSEMBLE_RATIO_TARGET.get(clients)))
        # The BLS merges text that waits behind other streams' sends (bls.response_loop): how many responses
        # the client received per generated token says how much (1.0: one per token, as the engine sends).
        rows.append(Row(f"{clients:>3} streams: BLS responses per token",
                        _responses_per_token(runs[BLS_MODEL]), "x"))
        # The handoff merges an ensemble stream's engine responses that wait together for its sender (relay/handoff.h).
        rows.append(Row(f"{clients:>3} streams: ensemble responses per token",
                        _responses_per_token(runs["ensemble"]), "x"))
        rows.append(Row(f"{clients:>3} streams: engine alone first token p50",
                        _first_token_p50_ms(runs["tensorrt_llm"]), "ms"))
        rows.append(Row(f"{clients:>3} streams: BLS first token p50",
                        _first_token_p50_ms(runs[BLS_MODEL]), "ms"))
        rows.append(Row(f"{clients:>3} streams: ensemble first token p50", _first_token_p50_ms(runs["ensemble"]), "ms"))
        bls = runs[BLS_MODEL]
        rows.append(Row(f"{clients:>3} streams: CPU per token, BLS (Python + relay)", _bls_cpu_us_per_token(bls),
                        "µs", BLS_CPU_TARGET if clients in (16, 64) else None))
        rows.append(Row(f"{clients:>3} streams: CPU per token, of it the relay thread",
                        _cpu_us_per_token(bls, RELAY_THREAD), "µs"))
        rows.append(Row(f"{clients:>3} streams: CPU per token, tritonserver (BLS run; incl. both relays)",
                        _cpu_us_per_token(bls, "tritonserver"), "µs"))
        rows.append(Row(f"{clients:>3} streams: CPU per token, engine (BLS run)",
                        _engine_cpu_us_per_token(bls), "µs"))
        rows += _ensemble_cpu_rows(f"{clients:>3} streams", runs["ensemble"])
        rows += _client_rows(f"{clients:>3} streams", runs)
    return rows


def _interval_rows(ctx: BenchContext) -> list[Row]:
    """The BLS built with STREAM_INTERVAL (`make repo STREAM_INTERVAL=4`): fewer, larger streamed responses, the
    operator's trade of smoothness for CPU at many streams. Floor measured again in the same server."""
    server = ctx.server(_repo(ctx, "streaming-interval", step_ms=ctx.engine_step_ms, stream_interval=STREAM_INTERVAL))
    bodies = _bodies(server.http_url)
    for model in ("tensorrt_llm", BLS_MODEL):  # warm-up
        stream_load(server, model, 1, 1, lambda _i, m=model: bodies[m], processes=ctx.client_processes)
    rows: list[Row] = []
    for clients in INTERVAL_CONCURRENCY:
        rounds = 1 if ctx.quick else 2
        runs = {model: stream_load(server, model, clients, rounds, lambda _i, m=model: bodies[m],
                                   processes=ctx.client_processes)
                for model in ("tensorrt_llm", BLS_MODEL)}
        bls = runs[BLS_MODEL]
        label = f"{clients:>3} streams, stream_interval {STREAM_INTERVAL}"
        rows.append(Row(f"{label}: BLS / floor", _tokens_per_s(bls) / _tokens_per_s(runs["tensorrt_llm"]), "x"))
        rows.append(Row(f"{label}: BLS responses per token", _responses_per_token(bls), "x"))
        rows.append(Row(f"{label}: CPU per token, BLS (Python + relay)", _bls_cpu_us_per_token(bls), "µs"))
        rows += _client_rows(label, runs)
    return rows


def _paced_rows(ctx: BenchContext) -> list[Row]:
    # One engine instance, whatever --engine-instances says: a GPU engine is one in-flight batch whose every step
    # gives each active stream a token at once (stand-in instances stepping apart would wake each BLS process once
    # per instance per step). Paced, one instance carries the load: 256 streams are 6,400 tok/s.
    server = ctx.server(_repo(ctx, "streaming-paced", step_ms=PACED_STEP_MS, engine_instances=1))
    bodies = _bodies(server.http_url)
    stream_s = STREAM_TOKENS * PACED_STEP_MS / 1000
    for model in MODELS:
        stream_load(server, model, 1, 1, lambda _i, m=model: bodies[m], processes=ctx.client_processes)  # warm-up
    rows: list[Row] = []
    for streams in ctx.paced_streams:
        label = f"{streams} streams, engine step {PACED_STEP_MS:.0f} ms"
        runs = {model: stream_load(server, model, streams, 1 if ctx.quick else 2, lambda _i, m=model: bodies[m],
                                   stagger_s=stream_s, processes=ctx.client_processes)
                for model in MODELS}
        bls, ensemble = runs[BLS_MODEL], runs["ensemble"]
        ttft_target = TTFT_TARGET if streams == PACED_CONCURRENCY else None
        rows.append(Row(f"{label}: engine alone first token p50", _first_token_p50_ms(runs["tensorrt_llm"]), "ms"))
        rows.append(Row(f"{label}: BLS first token p50", _first_token_p50_ms(bls), "ms", ttft_target))
        rows.append(Row(f"{label}: ensemble first token p50", _first_token_p50_ms(ensemble), "ms",
                        ENSEMBLE_TTFT_TARGET if streams == PACED_CONCURRENCY else None))
        # Kept up with the engine: the same tok/s as the engine alone (the staggered starts and the pace set it).
        for model, name in (("tensorrt_llm", "engine alone"), (BLS_MODEL, "BLS"), ("ensemble", "ensemble")):
            rows.append(Row(f"{label}: {name}", _tokens_per_s(runs[model]), "tok/s"))
        # Paced like a GPU, the BLS keeps up and sends every token in a response of its own: its CPU per token
        # here is the cost of one response per token, with no merging to lower it (the throughput runs merge).
        rows.append(Row(f"{label}: BLS responses per token", _responses_per_token(bls), "x"))
        rows.append(Row(f"{label}: ensemble responses per token", _responses_per_token(ensemble), "x"))
        rows.append(Row(f"{label}: CPU per token, BLS (Python + relay)", _bls_cpu_us_per_token(bls), "µs",
                        BLS_CPU_TARGET))
        rows.append(Row(f"{label}: CPU per token, tritonserver (BLS run; incl. both relays)",
                        _cpu_us_per_token(bls, "tritonserver"), "µs"))
        rows.append(Row(f"{label}: CPU per token, engine (BLS run)", _engine_cpu_us_per_token(bls),
                        "µs"))
        rows += _ensemble_cpu_rows(label, ensemble)
        rows += _client_rows(label, runs)
    return rows
