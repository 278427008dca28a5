"""Section "pipeline": preprocessing throughput and what the ensemble adds over the bare engine.
Synthetic engine: only our Python layers (and Triton's) are measured. Streaming: section "streaming".
"""

from __future__ import annotations

import json
import time

from bls.contract import PREPROCESSING_TO_ENGINE
from testkit.http import HttpSession
from testkit.stats import median
from tools.bench_common import BenchContext, Row, run_clients

CHAT = json.dumps([{"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "What is the capital of France?"}])
PROMPT = "Tell me a story about a brave little toaster."
ENSEMBLE_TOKENS = 32


def preprocessing_body(batch: int) -> dict:
    return {"inputs": [
        {"name": "MESSAGES", "shape": [batch, 1], "datatype": "BYTES", "data": [CHAT] * batch},
        {"name": "REQUEST_OUTPUT_LEN", "shape": [batch, 1], "datatype": "INT32", "data": [ENSEMBLE_TOKENS] * batch},
    ]}


def preprocessing_rows(ctx: BenchContext, http_url: str) -> list[Row]:
    rows = []
    for batch, requests in ((1, 40 if ctx.quick else 400), (64, 4 if ctx.quick else 30)):
        body = preprocessing_body(batch)
        clients = 2  # one waits on the network while the other's request runs: the model never idles

        def work(session: HttpSession, index: int, body: dict = body, count: int = requests // clients) -> list[int]:
            for _ in range(count):
                session.post_json("/v2/models/preprocessing/infer", body)
            return [count]

        HttpSession(http_url).post_json("/v2/models/preprocessing/infer", body)  # warm-up
        run = run_clients(http_url, clients, work)
        rate = sum(run.results) / run.wall_s
        rows.append(Row(f"preprocessing, batch {batch}: requests/s", rate, "req/s"))
        if batch > 1:
            rows.append(Row(f"preprocessing, batch {batch}: prompts/s", rate * batch, "prompts/s"))
    return rows


def engine_body(session: HttpSession, text: str, max_tokens: int) -> dict:
    """The tensorrt_llm request the ensemble makes for `text`: preprocessing's outputs under engine names."""
    outputs = session.post_json("/v2/models/preprocessing/infer", {"inputs": [
        {"name": "QUERY", "shape": [1, 1], "datatype": "BYTES", "data": [text]},
        {"name": "REQUEST_OUTPUT_LEN", "shape": [1, 1], "datatype": "INT32", "data": [max_tokens]},
        {"name": "END_ID", "shape": [1, 1], "datatype": "INT32", "data": [-1]},
    ]})["outputs"]
    body = {}
    for output in outputs:
        name = PREPROCESSING_TO_ENGINE.get(output["name"])
        if name is not None and output["data"]:
            body[name] = output["data"] if len(output["shape"]) < 3 else [output["data"][:output["shape"][2]],
                                                                          output["data"][output["shape"][2]:]]
    return body


def ensemble_overhead_rows(ctx: BenchContext, http_url: str) -> list[Row]:
    session = HttpSession(http_url)
    bodies = {
        "ensemble": {"text_input": PROMPT, "max_tokens": ENSEMBLE_TOKENS, "end_id": -1},
        "tensorrt_llm": engine_body(session, PROMPT, ENSEMBLE_TOKENS),
    }
    expected = session.generate("tensorrt_llm", bodies["tensorrt_llm"])["output_ids"]
    session.generate("ensemble", bodies["ensemble"])  # warm-up
    times: dict[str, list[float]] = {model: [] for model in bodies}
    for _ in range(10 if ctx.quick else 60):
        # Interleaved, so that drift in the machine's load hits both sides alike.
        for model, body in bodies.items():
            began = time.perf_counter()
            result = session.generate(model, body)
            times[model].append((time.perf_counter() - began) * 1000)
            if model == "tensorrt_llm" and result["output_ids"] != expected:
                raise RuntimeError("the engine's output changed between identical requests")
    session.close()
    ensemble_ms, engine_ms = median(times["ensemble"]), median(times["tensorrt_llm"])
    return [
        Row(f"ensemble, {ENSEMBLE_TOKENS} tokens non-streamed: median", ensemble_ms, "ms"),
        Row("tensorrt_llm, same input: median", engine_ms, "ms"),
        Row("latency the ensemble adds (difference of medians)", ensemble_ms - engine_ms, "ms"),
    ]


def run(ctx: BenchContext) -> list[Row]:
    server = ctx.server(ctx.synthetic_repo())
    rows = preprocessing_rows(ctx, server.http_url)
    rows += ensemble_overhead_rows(ctx, server.http_url)
    return rows
