"""Section "ngram": n-gram speculative decoding (prompt lookup; NGramDecodingConfig's max_draft_len /
max_matching_ngram_size, what `SPECULATIVE=ngram` configures) on the embedded engine, in-process, no server.

The served target (the default repository's checkpoint, loaded as the engine loads it) generates greedily, one
sequence at a time, on input-grounded prompts (a chat turn that hands the model a passage to quote or summarise:
the output repeats spans of the prompt, which is where drafts from the sequence itself get accepted), with and
without n-gram drafting. Reported: tok/s each way (wall time, the median of a few rounds with the two taking turns),
the speed-up, the share of drafted tokens the target accepted, and that the output is the same token for token
(greedy speculative decoding must give the target's own output).
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


def run(ctx: BenchContext) -> list[Row]:
    checkpoint = load_checkpoint(Path(ctx.repo / TARGET_MODEL / "1" / CHECKPOINT_DIR))
    bundle = TokenizerBundle.from_dir(repository_tokenizer(ctx.repo))
    prompts = [bundle.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
    tokens, rounds = (32, 1) if ctx.quick else (128, 3)
    limits = EngineLimits(checkpoint.config.vocab_size, 4096)
    engines = {name: Engine(HFModelRunner(checkpoint.model), limits, max_active=1, reuse=None, ngram=ngram)
               for name, ngram in (("plain", None), ("ngram", DRAFTING))}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list[list[int]]] = {name: [] for name in engines}
    drafted = accepted = 0
    try:
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
    finally:
        for engine in engines.values():
            engine.shutdown()
    generated = tokens * len(prompts)
    plain, drafted_speed = (generated / median(seconds[name]) for name in ("plain", "ngram"))
    label = f"max_draft_len {DRAFTING.max_draft_len}, max_matching_ngram_size {DRAFTING.max_matching_ngram_size}"
    return [
        Row(f"no speculation, {len(prompts)} prompts x {tokens} tokens: tok/s", plain, "tok/s"),
        Row(f"n-gram ({label}): tok/s", drafted_speed, "tok/s"),
        Row("speedup", drafted_speed / plain, "x", note="a tiny random model's greedy output repeats itself, which "
            "n-grams from the sequence predict; a real model on input-grounded prompts repeats the prompt's spans"),
        Row("drafted tokens accepted", accepted / drafted if drafted else 0.0, ""),
        Row("identical output with and without drafts", outputs["plain"] == outputs["ngram"], "", Target("==", True)),
    ]
