"""Section "ngram": n-gram speculative decoding (prompt lookup; NGramDecodingConfig's max_draft_len /
max_matching_ngram_size, what `SPECULATIVE=ngram` configures) on the embedded engine, in-process, no server.

Greedy generation, one sequence at a time, on input-grounded prompts (a chat turn that hands the model a passage to
quote: the output repeats spans of the prompt, which is where drafts from the sequence itself are accepted), with
and without n-gram drafting, two ways:
- the synthetic engine paced like a GPU (every iteration lasts STEP_MS, however many tokens it verifies, as a GPU
  decoding step at low batch does), whose output is its fixed sentence, which the prompt quotes: the speed-up the
  drafts give where they are accepted;
- the served target (the default repository's checkpoint): the tiny default model is random, its output repeats
  nothing of the prompt, so no draft is accepted: what verifying rejected drafts costs on a CPU, and that the
  output stays the target's own, token for token.
Reported: tok/s each way (wall time, the median of a few rounds with the two taking turns), the speed-up, the share of
drafted tokens accepted, and identical output (greedy speculative decoding must give the target's own output).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from bls.text.tokenizer import TokenizerBundle
from embedded_engine.checkpoint import load_checkpoint
from embedded_engine.ngram import NGramDrafting
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.scheduler import Engine, EngineEvent, HFModelRunner
from embedded_engine.synthetic import LLAMA3_VOCAB_SIZE, TEXT_CYCLE, SyntheticRunner
from engine_build.repository import CHECKPOINT_DIR, TARGET_MODEL, repository_tokenizer
from testkit.stats import median
from tools.bench_common import BenchContext, Row, Target

# NGramDecodingConfig as `make repo ENGINE=llmapi SPECULATIVE=ngram` writes it for the embedded engine's scale.
DRAFTING = NGramDrafting(max_draft_len=4, max_matching_ngram_size=3)
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished "
           "the great lens, and wound the clockwork that turned the light. Ships passing the rocky point saw the "
           "beam sweep across the water every ten seconds, and they knew to keep well clear of the reef.")
PROMPTS = (
    f"Quote the following passage exactly.\n\n{PASSAGE}",
    f"Summarise this passage in your own words, quoting its key sentence.\n\n{PASSAGE}",
)
# The synthetic engine's output is its sentence, over and over; the prompt quotes it.
SYNTHETIC_PROMPT = "Repeat after me, many times:{}"
STEP_MS = 20.0


def generate(engine: Engine, prompt: list[int], tokens: int, limits: EngineLimits) -> tuple[list[int], float, int, int]:
    """(tokens, seconds, drafted, accepted) of one greedy generation of exactly `tokens` tokens."""
    inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
              "request_output_len": np.array([tokens], np.int32), "end_id": np.array([-1], np.int32),
              "runtime_top_k": np.array([1], np.int32)}
    (request,) = parse_generation_requests(inputs, "bench", limits, True)
    events: list[EngineEvent] = []
    done = threading.Event()

    def on_event(event: EngineEvent) -> None:
        events.append(event)
        if event.finished:
            done.set()

    began = time.perf_counter()
    engine.submit(request, on_event)
    done.wait()
    elapsed = time.perf_counter() - began
    if events[-1].error is not None:
        raise events[-1].error
    return ([t for e in events for t in e.token_ids], elapsed, sum(e.drafted_tokens for e in events),
            sum(e.accepted_draft_tokens for e in events))


def compare(engines: dict[str, Engine], prompts: list[list[int]], tokens: int, rounds: int,
            limits: EngineLimits) -> tuple[float, float, float, bool]:
    """(plain tok/s, n-gram tok/s, drafts accepted, identical output) over `prompts`, the engines taking turns."""
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {name: [] for name in engines}
    drafted = accepted = 0
    for engine in engines.values():  # warm-up: first forwards allocate
        generate(engine, prompts[0], 4, limits)
    for round_ in range(rounds):
        names = list(engines) if round_ % 2 == 0 else list(engines)[::-1]  # taking turns: drift hits both
        for name in names:
            total = 0.0
            for prompt in prompts:
                output, elapsed, drafts, accepts = generate(engines[name], prompt, tokens, limits)
                total += elapsed
                if round_ == 0:
                    outputs[name].append(output)
                if name == "ngram":
                    drafted, accepted = drafted + drafts, accepted + accepts
            seconds[name].append(total)
    generated = tokens * len(prompts)
    plain, drafting = (generated / median(seconds[name]) for name in ("plain", "ngram"))
    return plain, drafting, accepted / drafted if drafted else 0.0, outputs["plain"] == outputs["ngram"]


def run(ctx: BenchContext) -> list[Row]:
    bundle = TokenizerBundle.from_dir(repository_tokenizer(ctx.repo))
    tokens, rounds = (32, 1) if ctx.quick else (128, 3)
    label = f"max_draft_len {DRAFTING.max_draft_len}, max_matching_ngram_size {DRAFTING.max_matching_ngram_size}"
    rows = []

    synthetic_limits = EngineLimits(LLAMA3_VOCAB_SIZE, 8192)
    sentence = bundle.decode(TEXT_CYCLE, skip_special_tokens=True)
    prompts = [bundle.encode_chat([{"role": "user", "content": SYNTHETIC_PROMPT.format(sentence)}])]
    engines = {name: Engine(SyntheticRunner(), synthetic_limits, max_active=1, reuse=None, step_s=STEP_MS / 1000,
                            ngram=ngram) for name, ngram in (("plain", None), ("ngram", DRAFTING))}
    try:
        plain, drafting, acceptance, same = compare(engines, prompts, tokens, rounds, synthetic_limits)
    finally:
        for engine in engines.values():
            engine.shutdown()
    where = f"synthetic engine, {STEP_MS:g} ms a step"
    rows += [
        Row(f"{where}, no speculation, {tokens} tokens: tok/s", plain, "tok/s"),
        Row(f"{where}, n-gram ({label}): tok/s", drafting, "tok/s"),
        Row(f"{where}: speedup", drafting / plain, "x", Target(">=", 2.0)),
        Row(f"{where}: drafted tokens accepted", acceptance, "", Target(">=", 0.9)),
        Row(f"{where}: identical output", same, "", Target("==", True)),
    ]

    checkpoint = load_checkpoint(Path(ctx.repo / TARGET_MODEL / "1" / CHECKPOINT_DIR))
    limits = EngineLimits(checkpoint.config.vocab_size, 4096)
    prompts = [bundle.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
    engines = {name: Engine(HFModelRunner(checkpoint.model), limits, max_active=1, reuse=None, ngram=ngram)
               for name, ngram in (("plain", None), ("ngram", DRAFTING))}
    try:
        plain, drafting, acceptance, same = compare(engines, prompts, tokens, rounds, limits)
    finally:
        for engine in engines.values():
            engine.shutdown()
    where = "tiny default model (random weights)"
    rows += [
        Row(f"{where}, no speculation, {len(prompts)} prompts x {tokens} tokens: tok/s", plain, "tok/s"),
        Row(f"{where}, n-gram ({label}): tok/s", drafting, "tok/s"),
        Row(f"{where}: cost of verifying rejected drafts", plain / drafting, "x time"),
        Row(f"{where}: drafted tokens accepted", acceptance, ""),
        Row(f"{where}: identical output", same, "", Target("==", True)),
    ]
    return rows
