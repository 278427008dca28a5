"""Seeded tiny Llama-3-architecture models: a target and a draft that speculative decoding can use.

The real Llama-3-8B-Instruct is far too big for CPU tests, so `make repo` writes two random models
with the Llama 3 vocabulary, special tokens and RoPE settings. Their text is gibberish, but they
exercise every code path: the same tokenizer, the same HF/TensorRT-LLM checkpoint formats, AWQ.

How the draft is made to agree with the target (random weights alone give ~0% acceptance):
- The embedding of token t is the lm_head row of a fixed successor token succ(t) (a seeded random
  permutation of the vocabulary), so without decoder layers the model is a bigram chain
  t -> succ(t) with a large logit margin. A random permutation has long cycles, so greedy output
  does not collapse onto one repeated token.
- The draft is the target's embeddings, first `DRAFT_LAYERS` layer(s), final norm and lm_head. The
  first layer (shared) mixes in some context through attention (`FIRST_LAYER_GAIN`); the target's
  last layer adds a larger context-dependent push (`LAST_LAYER_GAIN`) that overturns the bigram
  choice now and then, the layers in between barely move the residual stream. So the draft mostly
  proposes what the target picks, and sometimes not, which keeps speculative decoding's rejection
  path exercised. The gains were tuned by measuring greedy acceptance of 4-token proposals.
- Sizes are multiples of 128 because AWQ quantizes in groups of 128 input features.
- Speed: the lm_head GEMV over 128256 rows dominates the draft; the target's 16 wide layers make it
  several times slower per token, which is what speculative decoding needs to pay off.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine_build.assets.tokenizer import BOS_ID, END_OF_TEXT_ID, EOT_ID, GENERATION_CONFIG

LLAMA3_VOCAB_SIZE = 128256
LLAMA3_ROPE_THETA = 500000.0
DRAFT_LAYERS = 1
# Multipliers of the output projections (o_proj, down_proj) of the first and the last layer;
# measured: greedy acceptance of 4-token proposals ~94% fp32, ~91% AWQ (8 chat prompts).
LAST_LAYER_GAIN = 44.0
FIRST_LAYER_GAIN = 5.0
# Embedding rows have an RMS of 2**u, u uniform in [-EMBED_LOG2_SPREAD, EMBED_LOG2_SPREAD].
EMBED_LOG2_SPREAD = 2.0
# HF's default initializer range; the std of every random decoder weight.
WEIGHT_STD = 0.02
# Row std of lm_head: sets the logits' scale (top logit ~ LM_HEAD_STD * hidden_size).
LM_HEAD_STD = 0.16


@dataclass(frozen=True)
class TinyLlamaShape:
    """Sizes of a tiny Llama; the defaults are the shipped target (the draft differs in depth only)."""

    vocab_size: int = LLAMA3_VOCAB_SIZE
    hidden_size: int = 128
    # Wide MLPs make each target layer cost real compute, as in a real model, so the 1-layer draft is
    # ~1/8 of the target's per-token time (the shared 128256-row lm_head is a fixed cost of both).
    intermediate_size: int = 4096
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    num_hidden_layers: int = 16
    max_position_embeddings: int = 4096
    rope_scaling: dict | None = None


def tiny_llama_config(shape: TinyLlamaShape):
    """The LlamaConfig of a tiny model, with Llama 3's special tokens and RoPE base."""
    from transformers import LlamaConfig

    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        hidden_act="silu",
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=LLAMA3_ROPE_THETA,
        rope_scaling=shape.rope_scaling,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS_ID,
        eos_token_id=[END_OF_TEXT_ID, EOT_ID],
        dtype="float32",
    )


def tiny_llama_weights(
    shape: TinyLlamaShape,
    seed: int,
    first_layer_gain: float = FIRST_LAYER_GAIN,
    last_layer_gain: float = LAST_LAYER_GAIN,
) -> dict[str, torch.Tensor]:
    """Seeded fp32 HF state dict of the target (the draft's tensors are a subset of it)."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*size: int, std: float) -> torch.Tensor:
        return torch.randn(*size, generator=gen) * std

    hidden, inter = shape.hidden_size, shape.intermediate_size
    q_out = shape.num_attention_heads * shape.head_dim
    kv_out = shape.num_key_value_heads * shape.head_dim
    lm_head = normal(shape.vocab_size, hidden, std=LM_HEAD_STD)
    successor = torch.randperm(shape.vocab_size, generator=gen)
    # Row t points at lm_head row succ(t). Its norm varies per token (log-uniform, RMS 1/4 to 4):
    # the decoder layers add vectors of a fixed size, so they overturn the bigram choice of the
    # small-norm tokens only, and the last layer's gain sets that fraction.
    log_radius = torch.empty(shape.vocab_size, 1)
    log_radius.uniform_(-EMBED_LOG2_SPREAD, EMBED_LOG2_SPREAD, generator=gen)
    weights = {
        "model.embed_tokens.weight": (lm_head[successor] / LM_HEAD_STD * 2.0**log_radius).contiguous(),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": lm_head,
    }
    for layer in range(shape.num_hidden_layers):
        gain = {0: first_layer_gain, shape.num_hidden_layers - 1: last_layer_gain}.get(layer, 1.0)
        prefix = f"model.layers.{layer}."
        weights.update(
            {
                prefix + "input_layernorm.weight": torch.ones(hidden),
                prefix + "post_attention_layernorm.weight": torch.ones(hidden),
                prefix + "self_attn.q_proj.weight": normal(q_out, hidden, std=WEIGHT_STD),
                prefix + "self_attn.k_proj.weight": normal(kv_out, hidden, std=WEIGHT_STD),
                prefix + "self_attn.v_proj.weight": normal(kv_out, hidden, std=WEIGHT_STD),
                prefix + "self_attn.o_proj.weight": normal(hidden, q_out, std=WEIGHT_STD * gain),
                prefix + "mlp.gate_proj.weight": normal(inter, hidden, std=WEIGHT_STD),
                prefix + "mlp.up_proj.weight": normal(inter, hidden, std=WEIGHT_STD),
                # / sqrt(inter / 512): the MLP's output size does not depend on its width (the gains
                # were tuned at width 512).
                prefix + "mlp.down_proj.weight": normal(hidden, inter, std=WEIGHT_STD * gain * (512 / inter) ** 0.5),
            }
        )
    return weights


def draft_weights(target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The draft: the target without its layers >= DRAFT_LAYERS (tensors shared, not copied)."""
    later = tuple(f"model.layers.{i}." for i in range(DRAFT_LAYERS, _num_layers(target)))
    return {name: t for name, t in target.items() if not name.startswith(later)}


def _num_layers(weights: dict[str, torch.Tensor]) -> int:
    return 1 + max(int(name.split(".")[2]) for name in weights if name.startswith("model.layers."))


def write_hf_checkpoint(
    out_dir: Path, shape: TinyLlamaShape, weights: dict[str, torch.Tensor], tokenizer_dir: Path
) -> None:
    """config.json + model.safetensors + the tokenizer files + generation_config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tiny_llama_config(shape).save_pretrained(str(out_dir))
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for item in sorted(Path(tokenizer_dir).iterdir()):
        if item.is_file() and item.name not in ("config.json", "generation_config.json"):
            shutil.copy2(item, out_dir / item.name)
    (out_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")


def write_tiny_models(target_dir: Path, draft_dir: Path, tokenizer_dir: Path, seed: int = 0) -> None:
    """Write the tiny target and its draft as HF checkpoints (fp32, safetensors), tokenizer included."""
    target_shape = TinyLlamaShape()
    draft_shape = TinyLlamaShape(num_hidden_layers=DRAFT_LAYERS)
    target = tiny_llama_weights(target_shape, seed)
    write_hf_checkpoint(Path(target_dir), target_shape, target, Path(tokenizer_dir))
    write_hf_checkpoint(Path(draft_dir), draft_shape, draft_weights(target), Path(tokenizer_dir))
