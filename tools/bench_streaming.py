"""Section "streaming": our BLS and ensemble against the engine-alone floor, side by side, from one run.

The engine is the synthetic embedded engine sending one response per generated token per stream, as
TensorRT-LLM's C++ backend streams (never merged: `merge_streamed_tokens` is off), so the layers above it
are loaded the way a GPU deployment loads them. Each client streams STREAM_TOKENS tokens, ROUNDS times;
the floor is what the same clients get from `tensorrt_llm` directly (the engine hop alone). The figure
that matters is the ratio to that floor; CPU µs per streamed token per process says where time goes.
"""

from __future__ import annotations

from tools.bench_common import BenchContext, LoadRun, Row, Target, stream_load
from tools.bench_pipeline import engine_body
from testkit.http import HttpSession
from testkit.stats import percentile

STREAM_TOKENS = 256
CONCURRENCY = (1, 16, 64, 256)
PROMPT = "Tell me a story about a brave little toaster."
MODELS = ("tensorrt_llm", "ensemble", "tensorrt_llm_bls")
# Issue 11's targets for this machine: the BLS at >= 0.6x the engine floor at 16 and 64 streams, first
# token p50 <= 100 ms at 64 streams, <= 60 µs of CPU per token in the BLS process.
RATIO_TARGET = {16: Target(">=", 0.6), 64: Target(">=", 0.6)}
TTFT_TARGET = {64: Target("<=", 100)}
BLS_CPU_TARGET = Target("<=", 60)


def _bodies(ctx_server_url: str) -> dict[str, dict]:
    text = {"text_input": PROMPT, "max_tokens": STREAM_TOKENS, "end_id": -1, "stream": True}
    return {
        "tensorrt_llm": engine_body(HttpSession(ctx_server_url), PROMPT, STREAM_TOKENS) | {"streaming": True},
        "ensemble": text,
        "tensorrt_llm_bls": text,
    }


def _tokens_per_s(run: LoadRun) -> float:
    return STREAM_TOKENS * len(run.results) / run.wall_s


def _cpu_us_per_token(run: LoadRun, prefix: str) -> float:
    seconds = sum(s for name, s in run.server_cpu_s.items() if name.startswith(prefix))
    return seconds / (STREAM_TOKENS * len(run.results)) * 1e6


def run(ctx: BenchContext) -> list[Row]:
    # max_queued_requests: 256 streams x (BLS + ensemble + engine) never wait for a slot: the floor is the
    # engine's pace, not its queue. More engine instances (ctx.engine_instances) spread the stand-in over
    # cores, so that on a many-core host the engine is not the bottleneck being measured.
    repo = ctx.variant("streaming", synthetic=True, draft=None, max_seq_len=8192, max_active_requests=512,
                       max_queued_requests=512, merge_streamed_tokens=False,
                       engine_instance_count=ctx.engine_instances,
                       **({"bls_instance_count": ctx.bls_instances} if ctx.bls_instances else {}))
    server = ctx.server(repo)
    bodies = _bodies(server.http_url)
    for model in MODELS:  # warm-up
        stream_load(server, model, 1, 1, lambda _i, m=model: bodies[m])
    rows: list[Row] = []
    for clients in CONCURRENCY:
        # A lone stream runs more rounds: CPU times tick in 10 ms, too coarse for one stream's few thousand tokens.
        rounds = (1 if ctx.quick else 2) * (8 if clients == 1 else 1)
        runs = {model: stream_load(server, model, clients, rounds, lambda _i, m=model: bodies[m]) for model in MODELS}
        floor = _tokens_per_s(runs["tensorrt_llm"])
        rows.append(Row(f"{clients:>3} streams: engine alone (floor)", floor, "tok/s"))
        for model, label in (("tensorrt_llm_bls", "BLS"), ("ensemble", "ensemble")):
            rate = _tokens_per_s(runs[model])
            rows.append(Row(f"{clients:>3} streams: {label}", rate, "tok/s"))
            rows.append(Row(f"{clients:>3} streams: {label} / floor", rate / floor, "x",
                            RATIO_TARGET.get(clients) if model == "tensorrt_llm_bls" else None))
        # The BLS merges text that waits behind other streams' sends (bls.response_loop): how many responses
        # the client received per generated token says how much (1.0: one per token, as the engine sends).
        events = sum(len(trace.arrivals) for trace in runs["tensorrt_llm_bls"].results)
        rows.append(Row(f"{clients:>3} streams: BLS responses per token", events / (STREAM_TOKENS * len(
            runs["tensorrt_llm_bls"].results)), "x"))
        first = [trace.first_event_s * 1000 for trace in runs["tensorrt_llm_bls"].results]
        rows.append(Row(f"{clients:>3} streams: BLS first token p50", percentile(first, 50), "ms",
                        TTFT_TARGET.get(clients)))
        bls = runs["tensorrt_llm_bls"]
        rows.append(Row(f"{clients:>3} streams: CPU per token, BLS processes", _cpu_us_per_token(bls, "tensorrt_llm_bls"),
                        "µs", BLS_CPU_TARGET if clients in (16, 64) else None))
        rows.append(Row(f"{clients:>3} streams: CPU per token, tritonserver (BLS run)",
                        _cpu_us_per_token(bls, "tritonserver"), "µs"))
        rows.append(Row(f"{clients:>3} streams: CPU per token, engine (BLS run)",
                        _cpu_us_per_token(bls, "tensorrt_llm_0"), "µs"))
        rows.append(Row(f"{clients:>3} streams: CPU per token, client (BLS run)",
                        bls.client_cpu_s / (STREAM_TOKENS * len(bls.results)) * 1e6, "µs"))
    return rows
