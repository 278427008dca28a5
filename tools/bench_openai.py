"""Section "openai": streamed chat through the OpenAI-compatible API (openai_api) against the same requests sent
straight to tensorrt_llm_bls over gRPC, from one run on one server.

The engine is section "streaming"'s stand-in (BenchContext.engine: the C++ bench engine, or the synthetic embedded
engine behind its relay; one response per token). The API runs with its default workers (one per 4 cores); its CPU
is its whole process tree's. Both sides are driven from one asyncio loop in this process: the BLS by tritonclient's
asyncio gRPC client (the client the API itself uses), the API by a minimal HTTP/1.1 client reading its server-sent
events, so the clients cost about the same. Each stream is a chat request of STREAM_TOKENS tokens (the stand-in
never ends a turn early) at temperature 0, with the sampling inputs the API sends (top_p 1, a seed) sent to the BLS
too, so the engine does the same work for both: sampling at temperature 1 over the 128,256-token vocabulary costs
the CPU stand-in ~3 ms a token, which would hide everything else. Unpaced (the stand-in as fast as the CPU lets it)
the ratio of the API's tok/s to the BLS's is the API's cost; paced like a GPU (one token per stream every
PACED_STEP_MS, starts spread over a stream's duration) the difference of the first-token p50s is the latency the API
adds.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import psutil
import tritonclient.grpc.aio as grpcclient

from bls.contract import BLS_MODEL
from testkit.openai_api import openai_api
from testkit.stats import percentile
from tools.bench_common import BenchContext, Row, Target
from tools.bench_streaming import PACED_STEP_MS, _repo

STREAM_TOKENS = 256
LEAST_STREAMS = 16  # the throughput runs: BenchContext.streams from here
PACED_CONCURRENCY = 64
MESSAGES = [{"role": "user", "content": "Tell me a story about a brave little toaster."}]
# Issue 39's targets: >= 0.9x the BLS's tok/s at 16, 64 and 256 streams; <= 5 ms added first token p50, paced.
RATIO_TARGET = Target(">=", 0.9)
ADDED_TTFT_TARGET = Target("<=", 5)
# Issue 49's: <= 15 µs of the API's CPU per streamed token (per worker: the sum over workers per token is the same).
API_CPU_TARGET = Target("<=", 15)


@dataclass
class Trace:
    sent: float
    first: float | None = None  # the first response with text
    end: float = 0.0
    tokens: int = 0


@dataclass
class Load:
    traces: list[Trace] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return sum(t.tokens for t in self.traces) / self.wall_s

    @property
    def first_token_p50_ms(self) -> float:
        return percentile([(t.first - t.sent) * 1000 for t in self.traces], 50)


async def _bls_stream(client: grpcclient.InferenceServerClient) -> Trace:
    def tensor(name, value):
        item = grpcclient.InferInput(name, list(value.shape), "BYTES" if value.dtype == object else
                                     {np.int32: "INT32", np.bool_: "BOOL", np.float32: "FP32",
                                      np.uint64: "UINT64"}[value.dtype.type])
        item.set_data_from_numpy(value)
        return item

    inputs = [tensor("messages", np.array([[json.dumps(MESSAGES).encode()]], dtype=object)),
              tensor("max_tokens", np.array([[STREAM_TOKENS]], dtype=np.int32)),
              tensor("stream", np.array([[True]])), tensor("return_num_output_tokens", np.array([[True]])),
              tensor("temperature", np.array([[0.0]], np.float32)), tensor("top_p", np.array([[1.0]], np.float32)),
              tensor("seed", np.array([[7]], np.uint64))]

    async def requests():
        yield {"model_name": BLS_MODEL, "inputs": inputs, "request_id": uuid.uuid4().hex,
               "outputs": [grpcclient.InferRequestedOutput(n) for n in ("text_output", "finish_reason",
                                                                        "num_output_tokens")]}

    trace = Trace(time.perf_counter())
    stream = client.stream_infer(requests())
    try:
        async for result, error in stream:
            if error is not None:
                raise RuntimeError(f"tensorrt_llm_bls: {error}")
            if result.as_numpy("text_output")[0]:
                trace.first = trace.first or time.perf_counter()
            counted = result.as_numpy("num_output_tokens")  # running count (the BLS may merge waiting responses)
            if counted is not None:
                trace.tokens = int(counted.reshape(-1)[0])
            if result.as_numpy("finish_reason") is not None:
                break
    finally:
        stream.cancel()
    trace.end = time.perf_counter()
    return trace


CHAT_BODY = json.dumps({"model": "bench", "messages": MESSAGES, "max_tokens": STREAM_TOKENS, "stream": True,
                        "temperature": 0, "seed": 7, "stream_options": {"include_usage": True}}).encode()


async def api_stream(host: str, port: int, body: bytes = CHAT_BODY) -> Trace:
    """One streamed chat request (`body` must ask for `stream_options.include_usage`: the usage chunk gives the
    token count)."""
    trace = Trace(time.perf_counter())
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"the API answered {status!r}")
        while line := await reader.readline():
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                break
            if trace.first is None and b'"content":"' in line and b'"content":""' not in line:  # not the role chunk
                trace.first = time.perf_counter()
            if b'"choices":[]' in line:  # the usage chunk
                trace.tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    finally:
        writer.close()
    trace.end = time.perf_counter()
    return trace


async def _load(one, clients: int, rounds: int, stagger_s: float) -> Load:
    async def client(index: int) -> list[Trace]:
        await asyncio.sleep(stagger_s * index / clients)
        return [await one() for _ in range(rounds)]

    began = time.perf_counter()
    results = await asyncio.gather(*(client(i) for i in range(clients)))
    load = Load([trace for traces in results for trace in traces], time.perf_counter() - began)
    if any(trace.tokens != STREAM_TOKENS or trace.first is None for trace in load.traces):
        raise RuntimeError(f"a stream ended early: {[t.tokens for t in load.traces]}")
    return load


def _measure(grpc_url: str, api_port: int, clients: int, rounds: int, stagger_s: float,
             repeats: int) -> dict[str, list[Load]]:
    """`repeats` runs of each side, alternating (BLS, API, BLS, ...): other load on the host hits both alike."""
    async def main() -> dict[str, list[Load]]:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            await _bls_stream(client)  # warm-up
            await api_stream("127.0.0.1", api_port)
            runs: dict[str, list[Load]] = {"bls": [], "api": []}
            for _ in range(repeats):
                runs["bls"].append(await _load(lambda: _bls_stream(client), clients, rounds, stagger_s))
                runs["api"].append(await _load(lambda: api_stream("127.0.0.1", api_port), clients, rounds, stagger_s))
            return runs
        finally:
            await client.close()

    return asyncio.run(main())


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children alive now: the API's supervisor and workers."""
    parent = psutil.Process(pid)
    return sum(sum(process.cpu_times()[:2]) for process in (parent, *parent.children(recursive=True)))


def _workers(pid: int) -> int:
    """The API's uvicorn workers: its children multiprocessing spawned (not its resource tracker); none: itself."""
    spawned = [child for child in psutil.Process(pid).children() if "spawn_main" in " ".join(child.cmdline())]
    return max(1, len(spawned))


def _median(loads: list[Load], value) -> float:
    return statistics.median(value(load) for load in loads)


def run(ctx: BenchContext) -> list[Row]:
    rows: list[Row] = []
    repeats = 2 if ctx.quick else 3
    logs = ctx.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = ctx.server(_repo(ctx, "streaming", step_ms=ctx.engine_step_ms))
    with openai_api(server.grpc_url, logs / "openai_api.log", "--model-name", "bench") as api:
        port = int(api.url.rsplit(":", 1)[1])
        for clients in (n for n in ctx.streams if n >= LEAST_STREAMS):
            rounds = max(1, 128 // clients)  # >= 32k tokens a run: a run of 16 streams is otherwise ~0.3 s
            before, client_before = _tree_cpu_s(api.process.pid), time.process_time()
            runs = _measure(server.grpc_url, port, clients, rounds, 0.0, repeats)
            spent, client_spent = _tree_cpu_s(api.process.pid) - before, time.process_time() - client_before
            bls = _median(runs["bls"], lambda load: load.tokens_per_s)
            through_api = _median(runs["api"], lambda load: load.tokens_per_s)
            api_tokens = sum(t.tokens for load in runs["api"] for t in load.traces)
            rows.append(Row(f"{clients:>3} streams: BLS over gRPC (median of {repeats})", bls, "tok/s"))
            rows.append(Row(f"{clients:>3} streams: chat through the API (median of {repeats})", through_api, "tok/s"))
            rows.append(Row(f"{clients:>3} streams: API / BLS", through_api / bls, "x", RATIO_TARGET))
            rows.append(Row(f"{clients:>3} streams: API CPU per streamed token (all its processes)",
                            spent / api_tokens * 1e6, "µs", API_CPU_TARGET))
            rows.append(Row(f"{clients:>3} streams: API worker processes", _workers(api.process.pid), ""))
            all_tokens = api_tokens + sum(t.tokens for load in runs["bls"] for t in load.traces)
            rows.append(Row(f"{clients:>3} streams: client CPU per streamed token (this process, both sides)",
                            client_spent / all_tokens * 1e6, "µs"))
    stream_s = STREAM_TOKENS * PACED_STEP_MS / 1000
    server = ctx.server(_repo(ctx, "streaming-paced", step_ms=PACED_STEP_MS, engine_instances=1))
    with openai_api(server.grpc_url, logs / "openai_api-paced.log", "--model-name", "bench") as api:
        port = int(api.url.rsplit(":", 1)[1])
        runs = _measure(server.grpc_url, port, PACED_CONCURRENCY, 1, stream_s, repeats)
        bls = _median(runs["bls"], lambda load: load.first_token_p50_ms)
        through_api = _median(runs["api"], lambda load: load.first_token_p50_ms)
        label = f"{PACED_CONCURRENCY} streams, engine step {PACED_STEP_MS:.0f} ms"
        rows.append(Row(f"{label}: BLS over gRPC first token p50 (median of {repeats})", bls, "ms"))
        rows.append(Row(f"{label}: chat through the API first token p50 (median of {repeats})", through_api, "ms"))
        rows.append(Row(f"{label}: first token p50 the API adds", through_api - bls, "ms", ADDED_TTFT_TARGET))
    return rows
