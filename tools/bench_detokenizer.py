"""Section "detokenizer": the per-token cost of streaming detokenization as the output grows.

bls.text.detokenizer.IncrementalDetokenizer against the re-decode-everything baseline (decode all ids at every
token and emit the new suffix: upstream's accumulate_tokens approach). Each token is pushed alone and timed;
every position's time is the minimum over a few repetitions (the machine is shared: the minimum is the
cost, the rest is other processes), then averaged over the first and last quarter of the output.
Two id streams: the tokenization of a realistic English + code + CJK + emoji text, repeated, and ids drawn
uniformly from the whole vocabulary (half characters and invalid UTF-8 everywhere: the detokenizer's
hold-back path at almost every token).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from bls.text.detokenizer import IncrementalDetokenizer
from bls.text.tokenizer import TokenizerBundle
from testkit.stats import quarter_means
from tools.bench_common import BenchContext, Row, Target

LENGTHS = (128, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (128, 1024)
FLAT = Target("<=", 1.1)  # last-quarter µs/token over first-quarter µs/token

REALISTIC_TEXT = """\
The quick brown fox jumps over the lazy dog. Streaming text must look the same as the final answer,
character for character, even when a token ends in the middle of a character.

def fibonacci(n: int) -> list[int]:
    \"\"\"The first n Fibonacci numbers.\"\"\"
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]

机器学习是人工智能的一个分支，它使计算机能够从数据中学习。東京は日本の首都です。한국어도 조금 있습니다.
Emoji too: 🚀🌊🙂 — and accents: naïve café, Ærøskøbing, Привет, мир!
"""


class Detokenizer(Protocol):
    def push(self, new_ids: list[int]) -> str: ...

    def finish(self) -> str: ...


class RedecodeEverything:
    """The baseline: decode every id so far at each token; the new text is the suffix past the old text."""

    def __init__(self, bundle: TokenizerBundle, skip_special_tokens: bool = True):
        self._bundle = bundle
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._text = ""

    def push(self, new_ids: list[int]) -> str:
        self._ids += new_ids
        text = self._bundle.decode(self._ids, self._skip_special_tokens)
        # Text ending in U+FFFD may be half a character: wait, as upstream's streaming has to.
        if text.endswith("\ufffd"):
            return ""
        delta, self._text = text[len(self._text):], text
        return delta

    def finish(self) -> str:
        text = self._bundle.decode(self._ids, self._skip_special_tokens)
        delta, self._text = text[len(self._text):], text
        return delta


def per_token_us(make: Callable[[], Detokenizer], ids: list[int], repetitions: int) -> tuple[list[float], str]:
    """Each position's push time (µs, minimum over repetitions) and the streamed text."""
    best = [float("inf")] * len(ids)
    text = ""
    for _ in range(repetitions):
        detokenizer = make()
        pieces = []
        clock = time.perf_counter_ns
        for position, token in enumerate(ids):
            began = clock()
            pieces.append(detokenizer.push([token]))
            elapsed = clock() - began
            if elapsed < best[position]:
                best[position] = elapsed
        pieces.append(detokenizer.finish())
        text = "".join(pieces)
    return [ns / 1000 for ns in best], text


def id_streams(bundle: TokenizerBundle, length: int) -> dict[str, list[int]]:
    realistic = bundle.encode_text(REALISTIC_TEXT, add_special_tokens=False)
    repeated = (realistic * (length // len(realistic) + 1))[:length]
    random = np.random.default_rng(0).integers(0, bundle.vocab_size, length).tolist()
    return {"realistic": repeated, "random": random}


def run(ctx: BenchContext) -> list[Row]:
    bundle = TokenizerBundle.from_dir(ctx.tokenizer_dir)
    implementations: dict[str, Callable[[], Detokenizer]] = {
        "ours": lambda: IncrementalDetokenizer(bundle),
        "re-decode all": lambda: RedecodeEverything(bundle),
    }
    repetitions = 2 if ctx.quick else 3
    rows = []
    all_match = True
    for length in QUICK_LENGTHS if ctx.quick else LENGTHS:
        for kind, ids in id_streams(bundle, length).items():
            reference = bundle.decode(ids, True)
            for name, make in implementations.items():
                times, text = per_token_us(make, ids, repetitions)
                all_match &= text == reference
                first, last = quarter_means(times)
                label = f"{name}, {kind} ids, {length} tokens"
                rows.append(Row(f"{label}: first quarter", first, "µs/token"))
                rows.append(Row(f"{label}: last quarter", last, "µs/token"))
                rows.append(Row(f"{label}: last/first", last / first, "x", FLAT if name == "ours" else None))
    rows.append(Row("streamed text == full decode, every run", all_match, "", Target("==", True)))
    return rows

