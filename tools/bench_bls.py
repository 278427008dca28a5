"""Section "bls": tensorrt_llm_bls streams over the synthetic engine (only our Python layers and Triton's).

Concurrent clients stream 256 tokens each, and every stream's text is checked against the non-streamed
text of the same request (throughput: section "streaming"). A 4,096-token stream shows whether the
per-token CPU stays flat as the output grows, with incremental deltas and with accumulate_tokens.
"""

from __future__ import annotations

from bls.contract import BLS_MODEL
from testkit.http import HttpSession
from testkit.processes import cpu_seconds
from tools.bench_common import (
    BenchContext,
    LoadRun,
    Row,
    Target,
    stream_load,
)

MODEL = BLS_MODEL
# Different lengths, so that concurrent streams are at different points of the synthetic text.
PROMPTS = ("Tell me a story.", "Write a poem about the sea, please.", "Résume ce texte 🌊", "def main():")
STREAM_TOKENS = 256
LONG_TOKENS = 4096
FLAT = Target("<=", 1.1)


def body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {"text_input": prompt, "max_tokens": max_tokens, "end_id": -1, "stream": stream}


def reference_texts(session: HttpSession, max_tokens: int) -> list[str]:
    return [session.generate(MODEL, body(prompt, max_tokens, False))["text_output"] for prompt in PROMPTS]


def texts_match(run: LoadRun, rounds: int, references: list[str]) -> bool:
    return all(trace.text == references[(j // rounds) % len(PROMPTS)] for j, trace in enumerate(run.results))


def bls_cpu_seconds(server) -> float:
    return sum(seconds for name, seconds in cpu_seconds(server.process.pid).items() if name.startswith(MODEL))


def long_stream_rows(ctx: BenchContext, label: str, tokens: int, accumulate: bool) -> list[Row]:
    """CPU per token of the BLS process in the first and the last quarter of one long stream.

    CPU time rather than arrival gaps: CPU per token is what would grow if the BLS re-did work in proportion
    to the output length. Only the BLS process: the synthetic engine finishes the
    whole stream in a fraction of a second, long before the client has seen the first quarter, so other
    processes' CPU cannot be attributed to quarters of what the client received.
    """
    server = ctx.server(ctx.synthetic_repo(accumulate_tokens=accumulate))
    session = HttpSession(server.http_url)
    reference = session.generate(MODEL, body(PROMPTS[0], tokens, False))["text_output"]
    boundaries = iter((1, tokens // 4, tokens - tokens // 4, tokens))
    next_boundary = next(boundaries)
    samples: list[tuple[int, float]] = []  # (tokens streamed so far, server CPU seconds so far)

    def on_event(event: dict) -> None:
        nonlocal next_boundary
        count = event.get("num_output_tokens")
        if count is not None and next_boundary is not None and count >= next_boundary:
            samples.append((count, bls_cpu_seconds(server)))
            next_boundary = next(boundaries, None)

    # Running counts in every streamed response: how the quarters are found.
    counted = {**body(PROMPTS[0], tokens, True), "return_num_output_tokens": True}
    trace = session.generate_stream(MODEL, counted, on_event=on_event)
    session.close()
    events = trace.events
    # Accumulating: every response carries the whole text so far, the final one included.
    streamed = events[-1]["text_output"] if accumulate else trace.text
    (n0, c0), (n1, c1), (n2, c2), (n3, c3) = samples
    first, last = (c1 - c0) / max(1, n1 - n0) * 1e6, (c3 - c2) / max(1, n3 - n2) * 1e6
    return [
        Row(f"{label}: BLS CPU per token, first quarter", first, "µs/token"),
        Row(f"{label}: BLS CPU per token, last quarter", last, "µs/token"),
        Row(f"{label}: last/first", last / first, "x", None if accumulate else FLAT),
        Row(f"{label}: streamed text == non-streamed",
            streamed == reference and events[-1]["num_output_tokens"] == tokens, "", Target("==", True)),
    ]


def run(ctx: BenchContext) -> list[Row]:
    server = ctx.server(ctx.synthetic_repo())
    session = HttpSession(server.http_url)
    references = reference_texts(session, STREAM_TOKENS)
    session.generate_stream(MODEL, body(PROMPTS[0], STREAM_TOKENS, True))  # warm-up
    session.close()
    rows = []
    all_match = True
    for clients in (1, 16):
        run = stream_load(server, MODEL, clients, 1, lambda i: body(PROMPTS[i % len(PROMPTS)], STREAM_TOKENS, True))
        all_match &= texts_match(run, 1, references)
    rows.append(Row("streamed deltas == non-streamed text, every stream", all_match, "", Target("==", True)))
    tokens = 1024 if ctx.quick else LONG_TOKENS
    rows += long_stream_rows(ctx, f"{tokens}-token stream, per-token time", tokens, accumulate=False)
    rows += long_stream_rows(ctx, f"accumulate_tokens, {tokens}-token stream", tokens, accumulate=True)
    return rows
