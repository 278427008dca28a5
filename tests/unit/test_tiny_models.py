"""The seeded tiny target/draft pair: config fields, determinism, shared tensors, draft usefulness."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_build.assets.tiny_models import DRAFT_LAYERS, write_tiny_models

TARGET_LAYERS = 16


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, tokenizer_dir) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    write_tiny_models(root / "target", root / "draft", tokenizer_dir, seed=0)
    return root / "target", root / "draft"


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def _digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


def test_config_is_llama3_shaped(tiny_pair):
    target, draft = tiny_pair
    for model_dir, layers in ((target, TARGET_LAYERS), (draft, DRAFT_LAYERS)):
        config = _config(model_dir)
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert config["model_type"] == "llama"
        assert config["vocab_size"] == 128256
        assert config["rope_theta"] == 500000.0
        assert config["rms_norm_eps"] == 1e-5
        assert config["bos_token_id"] == 128000
        assert config["eos_token_id"] == [128001, 128009]
        assert config["num_hidden_layers"] == layers
        assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
        assert config["head_dim"] == 64
        assert config["max_position_embeddings"] >= 4096
        assert config["dtype"] == "float32"
        # AWQ groups of 128 input features: every in-feature size must divide.
        assert config["hidden_size"] % 128 == 0
        assert config["intermediate_size"] % 128 == 0
        assert (config["num_attention_heads"] * config["head_dim"]) % 128 == 0


def test_tokenizer_and_generation_config_are_copied(tiny_pair, tokenizer_dir):
    from transformers import AutoTokenizer

    for model_dir in tiny_pair:
        generation = json.loads((model_dir / "generation_config.json").read_text())
        assert generation["eos_token_id"] == [128001, 128009]
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        assert tokenizer("hi")["input_ids"][0] == 128000
        assert (model_dir / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()


def test_draft_shares_embeddings_head_norm_and_first_layers(tiny_pair):
    target, draft = (load_file(str(d / "model.safetensors")) for d in tiny_pair)
    assert set(draft) < set(target)
    for name, tensor in draft.items():
        assert torch.equal(tensor, target[name]), name
    assert "model.embed_tokens.weight" in draft and "lm_head.weight" in draft
    assert all(t.dtype == torch.float32 for t in target.values())


def test_deterministic_for_a_seed(tiny_pair, tmp_path, tokenizer_dir):
    write_tiny_models(tmp_path / "t0", tmp_path / "d0", tokenizer_dir, seed=0)
    write_tiny_models(tmp_path / "t1", tmp_path / "d1", tokenizer_dir, seed=1)
    assert _digest(tmp_path / "t0") == _digest(tiny_pair[0])
    assert _digest(tmp_path / "d0") == _digest(tiny_pair[1])
    assert _digest(tmp_path / "t1") != _digest(tiny_pair[0])


def _greedy(model, ids: list[int], count: int) -> list[int]:
    """Positions' greedy picks for the last `count` positions of ids (one full forward)."""
    with torch.inference_mode():
        return model(torch.tensor([ids]), logits_to_keep=count).logits[0].argmax(-1).tolist()


def test_draft_proposals_are_mostly_accepted_and_output_varies(tiny_pair):
    from transformers import AutoTokenizer, LlamaForCausalLM

    target, draft = (LlamaForCausalLM.from_pretrained(str(d)).eval() for d in tiny_pair)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_pair[0]))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers in Europe."}], add_generation_prompt=True
    )
    start, accepted, proposed, k = len(ids), 0, 0, 4
    while len(ids) - start < 32:
        proposal = list(ids)
        for _ in range(k):
            proposal.append(_greedy(draft, proposal, 1)[0])
        verdict = _greedy(target, proposal, k + 1)
        n = 0
        while n < k and verdict[n] == proposal[len(ids) + n]:
            n += 1
        accepted, proposed = accepted + n, proposed + k
        ids = ids + proposal[len(ids) : len(ids) + n] + [verdict[n]]
    generated = ids[start:]
    print(f"greedy acceptance of 4-token draft proposals: {accepted / proposed:.2f}")
    assert accepted / proposed >= 0.6
    assert len(set(generated)) > len(generated) // 2  # not one token repeated
