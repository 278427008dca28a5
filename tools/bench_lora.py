"""Section "lora": what LoRA adapters cost the embedded engine (in-process, no server).

The served target (the default repository's checkpoint, loaded as the engine loads it) generates a batch of
concurrent sequences, all together in the engine's iterations, four ways:
- base: an engine built without LoRA;
- LoRA engine, no adapter: the same batch on an engine built for every projection, no request naming an adapter
  (what building with LORA_DIR costs the requests that use none);
- one adapter: every sequence with the same adapter;
- mixed: the sequences spread over four adapters and none.
Adapters are random, rank 16 on every projection, in the backend's format (lora_weights / lora_config), as requests
send them. Reported: the CPU time each generated token costs the process (the engine's thread and torch's: what other
processes do on the machine counts little, unlike wall time), the best of a few rounds with the four batches taking
turns, and the ratios of the base's cost to each (1.0: as cheap as the base).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from embedded_engine.checkpoint import load_checkpoint
from embedded_engine.lora import LLAMA_MODULES, LoraCache, LoraLayout
from embedded_engine.lora_layers import install_lora
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.scheduler import Engine, HFModelRunner
from engine_build.repository import CHECKPOINT_DIR, TARGET_MODEL
from tools.bench_common import BenchContext, Row, Target

RANK = 16
ADAPTERS = 4


def random_adapter(layout: LoraLayout, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One adapter in the backend's format: a row per (layer, module), flatten(A) then flatten(B), float16."""
    rng = np.random.default_rng(seed)
    rows, config = [], []
    for layer in range(layout.num_layers):
        for module in LLAMA_MODULES:
            fan_in, fan_out = layout.shape(module.name)
            rows.append(rng.normal(0, 0.05, RANK * (fan_in + fan_out)))
            config.append([module.module_id, layer, RANK])
    width = max(row.size for row in rows)
    weights = np.zeros((len(rows), width), np.float16)
    for index, row in enumerate(rows):
        weights[index, : row.size] = row
    return weights, np.array(config, np.int32)


def generate_batch(engine: Engine, prompts: list[list[int]], tokens: int, task_ids: list[int | None],
                   adapters: dict[int, tuple[np.ndarray, np.ndarray]]) -> float:
    """CPU seconds of this process for the batch (all submitted at once, each `tokens` long)."""
    done = threading.Semaphore(0)
    requests = []
    for index, (prompt, task_id) in enumerate(zip(prompts, task_ids, strict=True)):
        inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
                  "request_output_len": np.array([tokens], np.int32), "end_id": np.array([-1], np.int32)}
        if task_id is not None:
            inputs["lora_task_id"] = np.array([task_id], np.uint64)
            inputs["lora_weights"], inputs["lora_config"] = adapters[task_id]
        requests += parse_generation_requests(inputs, f"bench-{index}", engine.limits, True,
                                              adapters=engine.adapters)
    started = time.process_time()
    for request in requests:
        engine.submit(request, lambda event: event.finished and done.release())
    for _ in requests:
        done.acquire()
    return time.process_time() - started


def run(ctx: BenchContext) -> list[Row]:
    checkpoint = ctx.repo / TARGET_MODEL / "1" / CHECKPOINT_DIR
    batch, tokens, rounds = (4, 16, 1) if ctx.quick else (8, 32, 4)
    prompts = [[128000, *range(1000 + 7 * i, 1010 + 7 * i)] for i in range(batch)]

    base_model = load_checkpoint(Path(checkpoint))
    base = Engine(HFModelRunner(base_model.model), EngineLimits(base_model.config.vocab_size, 4096),
                  max_active=batch, reuse=None)
    lora_model = load_checkpoint(Path(checkpoint))
    layout = LoraLayout.from_config(lora_model.config, tuple(m.name for m in LLAMA_MODULES), RANK)
    slot = install_lora(lora_model.model, layout)
    lora = Engine(HFModelRunner(lora_model.model), EngineLimits(lora_model.config.vocab_size, 4096),
                  max_active=batch, reuse=None, adapters=LoraCache(layout), lora_slot=slot)
    adapters = {task_id: random_adapter(layout, task_id) for task_id in range(1, ADAPTERS + 1)}
    try:
        generate_batch(base, prompts[:2], 4, [None, None], adapters)  # warm-up: first calls allocate
        generate_batch(lora, prompts[:2], 4, [1, None], adapters)
        runs = {
            "base engine": (base, [None] * batch),
            "LoRA engine, no adapter": (lora, [None] * batch),
            "LoRA engine, one adapter": (lora, [1] * batch),
            f"LoRA engine, {ADAPTERS} adapters and none mixed": (lora, [(i % (ADAPTERS + 1)) or None
                                                                       for i in range(batch)]),
        }
        cost = dict.fromkeys(runs, float("inf"))  # CPU ms per generated token, the best round's
        names = list(runs)
        for round_ in range(rounds):  # each round starts with another batch: none is always first
            for name in names[round_ % len(names):] + names[: round_ % len(names)]:
                engine, task_ids = runs[name]
                seconds = generate_batch(engine, prompts, tokens, task_ids, adapters)
                cost[name] = min(cost[name], 1000 * seconds / (batch * tokens))
    finally:
        base.shutdown()
        lora.shutdown()
    mixed = f"LoRA engine, {ADAPTERS} adapters and none mixed"
    rows = [Row(f"{name}: {batch} sequences x {tokens} tokens", ms, "CPU ms/token") for name, ms in cost.items()]
    rows += [
        Row("base cost / LoRA engine, no adapter", cost["base engine"] / cost["LoRA engine, no adapter"], "",
            Target(">=", 0.9), "requests without an adapter pay (almost) nothing for LORA_DIR"),
        Row(f"base cost / mixed adapters (rank {RANK}, every projection)", cost["base engine"] / cost[mixed], "",
            Target(">=", 0.5)),
        Row("one adapter's cost / mixed adapters", cost["LoRA engine, one adapter"] / cost[mixed], "",
            Target(">=", 0.9), "per-sequence forwards: mixing costs nothing beyond the adapters' own work"),
    ]
    return rows
