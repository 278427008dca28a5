"""Section "speculative": draft-target speculative decoding on the real default repository (tiny AWQ
target and draft, on CPU). tensorrt_llm_bls generate, greedy, a fixed 256 tokens (end_id -1), with
num_draft_tokens 0 and 4 on the same chat prompt: tok/s, the acceptance the BLS reports, and identical text
(greedy speculative decoding must give the target's own greedy output).
"""

from __future__ import annotations

import json
import time

from bls.contract import BLS_MODEL
from testkit.http import HttpSession
from testkit.processes import cpu_seconds
from testkit.stats import median
from tools.bench_common import BenchContext, Row, Target

MODEL = BLS_MODEL
# A chat turn: what an Instruct deployment serves (rendered with the Llama 3 template by preprocessing).
MESSAGES = json.dumps([{"role": "user", "content": "Tell me a story about a land far away."}])
MAX_TOKENS = 256
DRAFT_TOKENS = 4
TARGET_SPEEDUP = Target(">=", 1.5)
TARGET_ACCEPTANCE = Target(">=", 0.70)


def timed_generate(session: HttpSession, num_draft_tokens: int, max_tokens: int) -> tuple[dict, float]:
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "end_id": -1, "num_draft_tokens": num_draft_tokens}
    began = time.perf_counter()
    result = session.generate(MODEL, body)
    return result, time.perf_counter() - began


def run(ctx: BenchContext) -> list[Row]:
    server = ctx.server(ctx.repo)
    session = HttpSession(server.http_url)
    max_tokens = 64 if ctx.quick else MAX_TOKENS
    repetitions = 1 if ctx.quick else 3
    for draft_tokens in (0, DRAFT_TOKENS):  # warm-up: first forwards allocate, and the draft model loads lazily
        timed_generate(session, draft_tokens, 8)
    seconds: dict[int, list[float]] = {0: [], DRAFT_TOKENS: []}
    cpu: dict[int, dict[str, float]] = {0: {}, DRAFT_TOKENS: {}}  # server process -> CPU seconds
    results: dict[int, dict] = {}
    for _ in range(repetitions):
        for draft_tokens in seconds:  # interleaved: load drift hits both alike
            before = cpu_seconds(server.process.pid)
            results[draft_tokens], elapsed = timed_generate(session, draft_tokens, max_tokens)
            for name, total in cpu_seconds(server.process.pid).items():
                cpu[draft_tokens][name] = cpu[draft_tokens].get(name, 0.0) + total - before.get(name, 0.0)
            if results[draft_tokens]["num_output_tokens"] != max_tokens:
                raise RuntimeError(f"num_draft_tokens {draft_tokens}: {results[draft_tokens]['num_output_tokens']} "
                                   f"tokens for max_tokens {max_tokens}")
            seconds[draft_tokens].append(elapsed)
    session.close()
    plain, speculative = (max_tokens / median(seconds[k]) for k in (0, DRAFT_TOKENS))
    # Where the time goes: server CPU per generated token, by process (the engines run on their own threads).
    breakdown = [
        Row(f"num_draft_tokens {draft_tokens}: CPU per token, {name}", total / (max_tokens * repetitions) * 1000, "ms")
        for draft_tokens, by_process in cpu.items()
        for name, total in sorted(by_process.items(), key=lambda item: -item[1]) if total > 0
    ]
    return breakdown + [
        Row(f"num_draft_tokens 0, {max_tokens} tokens: tok/s", plain, "tok/s"),
        Row(f"num_draft_tokens {DRAFT_TOKENS}, {max_tokens} tokens: tok/s", speculative, "tok/s"),
        Row("speedup", speculative / plain, "x", TARGET_SPEEDUP),
        Row("acceptance (reported by the BLS)", float(results[DRAFT_TOKENS]["acceptance_rate"]), "",
            TARGET_ACCEPTANCE),
        Row("identical text with and without drafts",
            results[0]["text_output"] == results[DRAFT_TOKENS]["text_output"], "", Target("==", True)),
    ]
