"""Section "awq": how close the served AWQ int4 target is to the unquantised model (no server).

The fp32 model (tiny-target-hf) continues ~8 prompts greedily for 64 tokens; both models then read each
prompt + continuation once (teacher forcing on the fp32 continuation), and at every continuation position:
- greedy agreement: the AWQ model's argmax equals the fp32 model's;
- logit error: relative L2 (||awq - fp32|| / ||fp32|| over the position's vocabulary row, averaged over
  positions) and the largest absolute difference anywhere.
The AWQ model is loaded exactly as the engine serves it: embedded_engine.checkpoint.load_checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bls.text.tokenizer import TokenizerBundle
from embedded_engine.checkpoint import load_checkpoint
from engine_build.repository import read_manifest
from tools.bench_common import BenchContext, Row

PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "机器学习是",
    "Write a haiku about the sea.",
    "import numpy as np\n",
    "Les misérables est un roman de",
    "🙂 Emoji and",
)
CONTINUATION_TOKENS = 64


def greedy_continuation(model, prompt_ids: list[int], tokens: int) -> list[int]:
    # Greedy: the checkpoint's sampling defaults (temperature, top_p) do not apply, and need no warning.
    generated = model.generate(torch.tensor([prompt_ids]), max_new_tokens=tokens, min_new_tokens=tokens,
                               do_sample=False, temperature=None, top_p=None, pad_token_id=0)
    return generated[0, len(prompt_ids):].tolist()


def continuation_logits(model, prompt_ids: list[int], continuation: list[int]) -> torch.Tensor:
    """Logits that predict each continuation token: [len(continuation), vocab]."""
    ids = torch.tensor([prompt_ids + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt_ids) - 1: -1]


def run(ctx: BenchContext) -> list[Row]:
    awq_dir = Path(read_manifest(ctx.repo)["target"])
    fp32_dir = awq_dir.parent / "tiny-target-hf"
    fp32, awq = load_checkpoint(fp32_dir).model, load_checkpoint(awq_dir).model
    bundle = TokenizerBundle.from_dir(ctx.tokenizer_dir)
    prompts = PROMPTS[:3] if ctx.quick else PROMPTS
    agree = positions = 0
    relative_l2, max_abs, scale = [], 0.0, 0.0
    for prompt in prompts:
        prompt_ids = bundle.encode_text(prompt, add_special_tokens=True)
        continuation = greedy_continuation(fp32, prompt_ids, CONTINUATION_TOKENS)
        reference = continuation_logits(fp32, prompt_ids, continuation)
        quantised = continuation_logits(awq, prompt_ids, continuation)
        agree += int((reference.argmax(-1) == quantised.argmax(-1)).sum())
        positions += len(continuation)
        relative_l2 += ((quantised - reference).norm(dim=-1) / reference.norm(dim=-1)).tolist()
        max_abs = max(max_abs, float((quantised - reference).abs().max()))
        scale = max(scale, float(reference.abs().max()))
    return [
        Row(f"greedy agreement ({len(prompts)} prompts x {CONTINUATION_TOKENS} tokens)", agree / positions, ""),
        Row("logit relative L2 error (mean over positions)", sum(relative_l2) / len(relative_l2), ""),
        Row("logit max abs error", max_abs, ""),
        Row("fp32 logits, max abs (scale of the error above)", scale, ""),
    ]
