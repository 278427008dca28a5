"""Section "guided": guided decoding (structured output) on the real default repository and in-process.

Server (tensorrt_llm_bls generate_stream, greedy, one request at a time): first-token latency unguided, guided with
a schema never sent before (the engine compiles it when the request arrives) and with the same schema again (the
engine's cache); tok/s unguided and guided over the same number of tokens (a regex no output of that length can
finish, so both run to max_tokens).
In-process, from the repository's own xgrammar tokenizer info file: loading it (once, at engine start), compiling a
schema cold and cached, and the per-token cost of the grammar's mask (filling the bitmask, applying it to a
128,256-logit row) and of the whole sampler step guided vs unguided.
"""

from __future__ import annotations

import json
import time
import uuid

import torch
import xgrammar

from bls.contract import BLS_MODEL
from embedded_engine.guided import GrammarCache, Guide
from embedded_engine.sampling import SamplingParams, TokenSampler
from embedded_engine.stopping import WordList
from testkit.http import HttpSession
from testkit.stats import median
from tools.bench_common import BenchContext, Row

MODEL = BLS_MODEL
PROMPT = "Describe a person as JSON."
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
    "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "email", "address"]}
# Letters only, longer than any output here: a guided run as long as the unguided one (both end at max_tokens).
LONG_REGEX = "[a-z]{4000}"
VOCAB = 128256


def _schema_guide(title: str) -> str:
    return json.dumps({**SCHEMA, "title": title})  # a new title is a new guide: compiled, not found in the cache


def _first_token_s(session: HttpSession, body: dict) -> float:
    return session.generate_stream(MODEL, {**body, "stream": True}).first_event_s


def _tok_per_s(session: HttpSession, body: dict) -> float:
    began = time.perf_counter()
    result = session.generate(MODEL, body)
    if result["finish_reason"] != "length":
        raise RuntimeError(f"a tok/s run ended with {result['finish_reason']}, not at max_tokens")
    return result["num_output_tokens"] / (time.perf_counter() - began)


def _server_rows(ctx: BenchContext) -> list[Row]:
    server = ctx.server(ctx.repo)
    session = HttpSession(server.http_url)
    repetitions = 3 if ctx.quick else 9
    max_tokens = 32 if ctx.quick else 128
    plain = {"text_input": PROMPT, "max_tokens": 16, "end_id": -1}
    _first_token_s(session, plain)  # warm-up
    _first_token_s(session, {**plain, "guided_decoding_guide_type": "json"})
    first: dict[str, list[float]] = {"unguided": [], "cold": [], "cached": []}
    cached_guide = _schema_guide("cached")
    for _ in range(repetitions):  # interleaved: load drift hits all three alike
        first["unguided"].append(_first_token_s(session, plain))
        first["cold"].append(_first_token_s(session, {**plain, "guided_decoding_guide_type": "json_schema",
                                                      "guided_decoding_guide": _schema_guide(uuid.uuid4().hex)}))
        first["cached"].append(_first_token_s(session, {**plain, "guided_decoding_guide_type": "json_schema",
                                                        "guided_decoding_guide": cached_guide}))
    long = {"text_input": PROMPT, "max_tokens": max_tokens, "end_id": -1}
    guided_long = {**long, "guided_decoding_guide_type": "regex", "guided_decoding_guide": LONG_REGEX}
    rates: dict[str, list[float]] = {"unguided": [], "guided": []}
    for _ in range(max(1, repetitions // 3)):
        rates["unguided"].append(_tok_per_s(session, long))
        rates["guided"].append(_tok_per_s(session, guided_long))
    session.close()
    unguided, guided = median(rates["unguided"]), median(rates["guided"])
    return [
        Row("first token, unguided", median(first["unguided"]) * 1000, "ms"),
        Row("first token, guided: a new schema (compiled on arrival)", median(first["cold"]) * 1000, "ms"),
        Row("first token, guided: the same schema again (cached)", median(first["cached"]) * 1000, "ms"),
        Row(f"tok/s unguided, {max_tokens} tokens", unguided, "tok/s"),
        Row(f"tok/s guided (regex), {max_tokens} tokens", guided, "tok/s"),
        Row("guided / unguided tok/s", guided / unguided, "x"),
    ]


def _in_process_rows(ctx: BenchContext) -> list[Row]:
    info_file = ctx.repo / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json"
    began = time.perf_counter()
    cache = GrammarCache(info_file, VOCAB)
    load_s = time.perf_counter() - began
    colds, hits = [], []
    for index in range(3 if ctx.quick else 10):
        guide = Guide("json_schema", _schema_guide(f"schema {index}"))
        began = time.perf_counter()
        compiled = cache.compile(guide)
        colds.append(time.perf_counter() - began)
        began = time.perf_counter()
        for _ in range(1000):
            cache.compile(guide)
        hits.append((time.perf_counter() - began) / 1000)

    # The mask's cost per token along a real document: the sampler's choices under the grammar, random logits.
    steps = 20 if ctx.quick else 60
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randn(VOCAB, generator=generator) for _ in range(steps)]
    costs: dict[str, list[float]] = {"unguided": [], "guided": [], "fill": [], "apply": []}
    for kind in ("unguided", "guided"):
        sampler = TokenSampler(SamplingParams(temperature=0.0), VOCAB, [1], None, WordList(), False,
                               guide=compiled if kind == "guided" else None)
        tokens = [1]
        for logits in rows:
            began = time.perf_counter()
            token = sampler.choose(logits, tokens).token_id
            costs[kind].append(time.perf_counter() - began)
            tokens.append(token)
            if sampler.grammar_ended:
                break
    # The two halves of GrammarConstraint.mask, timed apart.
    matcher = xgrammar.GrammarMatcher(compiled.grammar)
    bitmask = xgrammar.allocate_token_bitmask(1, VOCAB)
    for logits in rows:
        logits = logits.clone()
        began = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        filled = time.perf_counter()
        xgrammar.apply_token_bitmask_inplace(logits.unsqueeze(0), bitmask)
        costs["fill"].append(filled - began)
        costs["apply"].append(time.perf_counter() - filled)
        token = int(logits.argmax())
        if token in compiled.stop_token_ids or not matcher.accept_token(token):
            break
    return [
        Row("xgrammar tokenizer info load (once, at engine start)", load_s * 1000, "ms"),
        Row("compile a json_schema, cold", median(colds) * 1000, "ms"),
        Row("compile the same json_schema again (cache hit)", median(hits) * 1e6, "us"),
        Row("mask per token: fill the bitmask", median(costs["fill"]) * 1e6, "us"),
        Row("mask per token: apply it to the logits", median(costs["apply"]) * 1e6, "us"),
        Row("sampler per token, unguided (greedy)", median(costs["unguided"]) * 1e6, "us"),
        Row("sampler per token, guided (greedy, mask included)", median(costs["guided"]) * 1e6, "us"),
    ]


def run(ctx: BenchContext) -> list[Row]:
    return _in_process_rows(ctx) + _server_rows(ctx)
