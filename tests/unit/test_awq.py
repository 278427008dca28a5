"""AWQ export (modelopt, CPU) and the TensorRT-LLM checkpoint loader of the embedded engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from embedded_engine.checkpoint import CheckpointError, load_checkpoint
from engine_build import quantize
from engine_build.assets.tiny_models import TinyLlamaShape, tiny_llama_weights, write_hf_checkpoint, write_tiny_models
from engine_build.quantize import QuantizationError, quantize_awq, read_calibration_texts

GROUP = 128
LLAMA31_ROPE_SCALING = {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
# (TensorRT-LLM module, HF module) of every quantized linear but the fused qkv.
LINEARS = [("attention.dense", "self_attn.o_proj"), ("mlp.fc", "mlp.gate_proj"),
           ("mlp.gate", "mlp.up_proj"), ("mlp.proj", "mlp.down_proj")]
CALIB_SAMPLES = 4  # plenty for a random model; keeps the 16-layer calibration to seconds


def reference_dequantize(packed, scales, prequant, group_size: int) -> np.ndarray:
    """Independent numpy float64 dequantization: byte row r holds output rows 2r (low nibble), 2r+1."""
    data = packed.numpy().view(np.uint8).astype(np.int64)
    weight = np.empty((data.shape[0] * 2, data.shape[1]), dtype=np.float64)
    for parity in (0, 1):
        nibble = (data >> (4 * parity)) & 0xF
        weight[parity::2] = np.where(nibble >= 8, nibble - 16, nibble)
    column_group = np.arange(data.shape[1]) // group_size
    weight *= scales.numpy().astype(np.float64)[:, column_group]
    return weight * prequant.float().numpy().astype(np.float64)[None, :]


@pytest.fixture(scope="module")
def awq_target(tmp_path_factory, tokenizer_dir):
    """The tiny target (fp32 HF), its modelopt fake-quant model, and its exported W4A16_AWQ checkpoint."""
    root = tmp_path_factory.mktemp("awq")
    write_tiny_models(root / "hf", root / "draft", tokenizer_dir)
    hf_config = quantize.check_hf_checkpoint(root / "hf", GROUP)
    fake_quant = quantize.awq_calibrated_model(root / "hf", read_calibration_texts()[:CALIB_SAMPLES], GROUP, "cpu")
    quantize.export_trtllm_checkpoint(fake_quant, hf_config, root / "trt", tp_size=1, pp_size=1, dtype="float16")
    return root, fake_quant


@pytest.fixture(scope="module")
def rope_scaled(tmp_path_factory, tokenizer_dir):
    """A 1-layer Llama-3.1-style model (llama3 rope_scaling) through the public quantize_awq."""
    root = tmp_path_factory.mktemp("rope")
    shape = TinyLlamaShape(num_hidden_layers=1, rope_scaling=LLAMA31_ROPE_SCALING, max_position_embeddings=131072)
    write_hf_checkpoint(root / "hf", shape, tiny_llama_weights(shape, seed=3), tokenizer_dir)
    quantize_awq(root / "hf", root / "trt", calib_texts=read_calibration_texts()[:2], device="cpu")
    return root


def _prompt_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a lighthouse at night."}], add_generation_prompt=True
    )


def test_exported_quantization_fields(awq_target):
    root, _ = awq_target
    config = json.loads((root / "trt" / "config.json").read_text())
    assert config["quantization"] == {
        "quant_algo": "W4A16_AWQ",
        "kv_cache_quant_algo": None,
        "group_size": GROUP,
        "has_zero_point": False,
        "pre_quant_scale": True,
        "exclude_modules": ["lm_head"],
    }
    assert config["model_type"] == "llama" and config["architecture"] == "LlamaForCausalLM"
    assert config["rotary_base"] == json.loads((root / "hf" / "config.json").read_text())["rope_theta"] == 500000.0
    assert config["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}


def test_exported_tensor_shapes_and_dtypes(awq_target):
    root, _ = awq_target
    hf = json.loads((root / "hf" / "config.json").read_text())
    tensors = load_file(str(root / "trt" / "rank0.safetensors"))
    hidden, inter = hf["hidden_size"], hf["intermediate_size"]
    qkv_out = (hf["num_attention_heads"] + 2 * hf["num_key_value_heads"]) * hf["head_dim"]
    attn_in = hf["num_attention_heads"] * hf["head_dim"]
    expected = {"attention.qkv": (qkv_out, hidden), "attention.dense": (hidden, attn_in),
                "mlp.fc": (inter, hidden), "mlp.gate": (inter, hidden), "mlp.proj": (hidden, inter)}
    for layer in range(hf["num_hidden_layers"]):
        for module, (out_features, in_features) in expected.items():
            prefix = f"transformer.layers.{layer}.{module}."
            weight = tensors[prefix + "weight"]
            assert (weight.dtype, tuple(weight.shape)) == (torch.int8, (out_features // 2, in_features))
            scales = tensors[prefix + "weights_scaling_factor"]
            assert (scales.dtype, tuple(scales.shape)) == (torch.float32, (out_features, in_features // GROUP))
            prequant = tensors[prefix + "prequant_scaling_factor"]
            assert (prequant.dtype, tuple(prequant.shape)) == (torch.float16, (in_features,))
    assert tensors["lm_head.weight"].dtype == torch.float16  # excluded from quantization
    assert tuple(tensors["transformer.vocab_embedding.weight"].shape) == (hf["vocab_size"], hidden)


def test_loader_matches_reference_dequantization(awq_target):
    root, _ = awq_target
    loaded = load_checkpoint(root / "trt")
    assert (loaded.source_format, loaded.quant_algo) == ("trtllm", "W4A16_AWQ")
    assert loaded.config.rope_theta == 500000.0 and loaded.config.rope_scaling is None
    assert next(loaded.model.parameters()).dtype == torch.float32 and not loaded.model.training
    state = loaded.model.state_dict()
    tensors = load_file(str(root / "trt" / "rank0.safetensors"))

    def reference(src: str, module: str) -> np.ndarray:
        return reference_dequantize(*(tensors[src + module + suffix] for suffix in (
            ".weight", ".weights_scaling_factor", ".prequant_scaling_factor")), GROUP)

    for layer in (0, loaded.config.num_hidden_layers - 1):
        src, dst = f"transformer.layers.{layer}.", f"model.layers.{layer}."
        qkv = np.concatenate([state[dst + f"self_attn.{p}_proj.weight"].numpy() for p in "qkv"])
        np.testing.assert_allclose(qkv, reference(src, "attention.qkv"), rtol=1e-6, atol=1e-9)
        for trt_module, hf_module in LINEARS:
            np.testing.assert_allclose(state[dst + hf_module + ".weight"].numpy(), reference(src, trt_module),
                                       rtol=1e-6, atol=1e-9)


def test_dequantized_weights_approximate_the_original(awq_target):
    """Wrong nibble order or a swapped gate/up mapping would give errors ~1.4, not int4 noise ~0.12."""
    root, _ = awq_target
    original = load_file(str(root / "hf" / "model.safetensors"))
    state = load_checkpoint(root / "trt").model.state_dict()
    for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        key = f"model.layers.3.{name}.weight"
        relative = float((state[key] - original[key]).norm() / original[key].norm())
        assert relative < 0.2, (name, relative)


def test_loader_logits_match_modelopt_fake_quant(awq_target):
    root, fake_quant = awq_target
    loaded = load_checkpoint(root / "trt").model
    ids = torch.tensor([_prompt_ids(root / "hf")])
    with torch.inference_mode():
        ours, theirs = loaded(ids).logits, fake_quant(ids).logits
        unquantized = load_checkpoint(root / "hf").model(ids).logits
    error = float((ours - theirs).norm() / theirs.norm())
    awq_error = float((theirs - unquantized).norm() / unquantized.norm())
    print(f"logit rel. error: loader vs fake-quant {error:.4f}; fake-quant vs fp32 {awq_error:.4f}")
    # The export re-smooths q/k/v and gate/up to one pre-quant scale each and rounds to fp16,
    # so the match is close but not exact; it must be far below the quantization error itself.
    assert error < 0.25 * awq_error
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() > 0.9


def test_greedy_agreement_awq_vs_unquantized(awq_target):
    root, _ = awq_target
    awq, fp32 = load_checkpoint(root / "trt").model, load_checkpoint(root / "hf").model
    ids = _prompt_ids(root / "hf")
    with torch.inference_mode():
        for _ in range(32):  # the fp32 model's greedy continuation
            ids.append(int(fp32(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].argmax()))
        batch = torch.tensor([ids])
        agreement = (awq(batch).logits.argmax(-1) == fp32(batch).logits.argmax(-1)).float().mean().item()
    print(f"teacher-forced greedy agreement AWQ vs fp32: {agreement:.3f}")
    assert agreement > 0.5


def test_rope_scaling_is_carried_through(rope_scaled):
    config = json.loads((rope_scaled / "trt" / "config.json").read_text())
    assert config["rotary_base"] == 500000.0
    assert config["rotary_scaling"] == LLAMA31_ROPE_SCALING
    loaded = load_checkpoint(rope_scaled / "trt")
    assert loaded.config.rope_theta == 500000.0
    assert loaded.config.rope_scaling["rope_type"] == "llama3"
    assert {k: loaded.config.rope_scaling[k] for k in LLAMA31_ROPE_SCALING} == LLAMA31_ROPE_SCALING
    assert loaded.max_position_embeddings == 131072


def test_unquantized_trtllm_checkpoint_loads_exactly(rope_scaled, tmp_path):
    hf = load_checkpoint(rope_scaled / "hf").model
    hf_config = json.loads((rope_scaled / "hf" / "config.json").read_text())
    quantize.export_trtllm_checkpoint(hf, hf_config, tmp_path / "trt", tp_size=1, pp_size=1, dtype="float16")
    loaded = load_checkpoint(tmp_path / "trt")
    assert (loaded.source_format, loaded.quant_algo) == ("trtllm", None)
    with torch.no_grad():  # the checkpoint holds fp16 weights: compare with the fp16-rounded HF model
        for parameter in hf.parameters():
            parameter.copy_(parameter.half().float())
    ids = torch.tensor([[128000, 791, 4062, 14198, 39935]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(ids).logits, hf(ids).logits, rtol=1e-5, atol=1e-5)


# --- clear errors --------------------------------------------------------------------------------


def _hf_config_dir(tmp_path: Path, **overrides) -> Path:
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 512,
              "num_attention_heads": 2, "head_dim": 64, "rope_theta": 500000.0, **overrides}
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    return tmp_path


def test_quantize_missing_checkpoint(tmp_path):
    with pytest.raises(QuantizationError, match="does not exist"):
        quantize_awq(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(QuantizationError, match="no config.json"):
        quantize_awq(tmp_path, tmp_path / "out")


def test_quantize_unsupported_architecture(tmp_path):
    with pytest.raises(QuantizationError, match="unsupported architecture.*MistralForCausalLM"):
        quantize_awq(_hf_config_dir(tmp_path, architectures=["MistralForCausalLM"]), tmp_path / "out")


def test_quantize_dims_not_divisible_by_group(tmp_path):
    with pytest.raises(QuantizationError, match="hidden_size.*192.*group size 128"):
        quantize_awq(_hf_config_dir(tmp_path, hidden_size=192), tmp_path / "out")
    with pytest.raises(QuantizationError, match="intermediate_size.*320"):
        quantize_awq(_hf_config_dir(tmp_path, intermediate_size=320), tmp_path / "out")


def test_quantize_refuses_transformers_5(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "5.2.0")
    with pytest.raises(QuantizationError, match="transformers 5.2.0.*rotary_base"):
        quantize_awq(_hf_config_dir(tmp_path), tmp_path / "out")


def _edited_trtllm_dir(awq_target, tmp_path: Path, edit) -> Path:
    root, _ = awq_target
    config = json.loads((root / "trt" / "config.json").read_text())
    edit(config)
    tmp_path.mkdir()
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    shutil.copy(root / "trt" / "rank0.safetensors", tmp_path / "rank0.safetensors")
    return tmp_path


def test_loader_errors(awq_target, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="rotary_base"):
        load_checkpoint(_edited_trtllm_dir(awq_target, tmp_path / "a", lambda c: c.pop("rotary_base")))
    with pytest.raises(CheckpointError, match="single-rank"):
        load_checkpoint(_edited_trtllm_dir(awq_target, tmp_path / "b", lambda c: c["mapping"].update(tp_size=2)))
    with pytest.raises(CheckpointError, match="FP8"):
        load_checkpoint(_edited_trtllm_dir(awq_target, tmp_path / "c",
                                           lambda c: c["quantization"].update(quant_algo="FP8")))


def test_fp8_kv_cache_is_calibrated_and_exported(tmp_path, tokenizer_dir):
    """KV_CACHE_DTYPE=fp8: modelopt's FP8 KV quantizers, exported as TensorRT-LLM reads them."""
    shape = TinyLlamaShape(num_hidden_layers=1)
    write_hf_checkpoint(tmp_path / "hf", shape, tiny_llama_weights(shape, seed=5), tokenizer_dir)
    quantize_awq(tmp_path / "hf", tmp_path / "trt", calib_texts=read_calibration_texts()[:2], device="cpu",
                 kv_cache_dtype="fp8")
    quantization = json.loads((tmp_path / "trt" / "config.json").read_text())["quantization"]
    assert (quantization["quant_algo"], quantization["kv_cache_quant_algo"]) == ("W4A16_AWQ", "FP8")


def test_modelopts_hf_export_loads_and_matches_the_fake_quant_model(awq_target):
    """The checkpoint TensorRT-LLM's PyTorch flow loads (ModelOpt's Hugging Face export: hf_quant_config.json, packed
    int4 `weight`, `weight_scale`, `pre_quant_scale`), dequantized by the embedded engine's loader (the llmapi stand-in
    serves it), computes what the calibrated fake-quant model does, as its TensorRT-LLM checkpoint export does
    (test_loader_logits_match_modelopt_fake_quant: the same bound)."""
    import copy

    from modelopt.torch.export import export_hf_checkpoint

    root, fake_quant = awq_target
    export_dir = root / "modelopt_hf"
    export_hf_checkpoint(copy.deepcopy(fake_quant), dtype=torch.float16, export_dir=export_dir)
    quant = json.loads((export_dir / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "W4A16_AWQ" and quant["group_size"] == GROUP
    exported = load_file(str(next(export_dir.glob("*.safetensors"))))
    assert exported["model.layers.0.mlp.down_proj.weight"].dtype == torch.uint8
    loaded = load_checkpoint(export_dir)
    assert (loaded.source_format, loaded.quant_algo) == ("modelopt_hf", "W4A16_AWQ")
    state = loaded.model.state_dict()
    # Exactly the independent numpy dequantization: with a pre_quant_scale (o_proj, down_proj) and without one (q/k/v
    # and gate/up: ModelOpt folds theirs into the layernorm before them).
    for module in ("self_attn.o_proj", "mlp.down_proj", "self_attn.q_proj", "mlp.gate_proj"):
        prefix = f"model.layers.1.{module}"
        packed = exported[prefix + ".weight"]
        prequant = exported.get(prefix + ".pre_quant_scale", torch.ones(packed.shape[1]))
        expected = reference_dequantize(packed, exported[prefix + ".weight_scale"], prequant, GROUP)
        np.testing.assert_allclose(state[prefix + ".weight"].numpy(), expected, rtol=1e-6, atol=1e-7)
    ids = torch.tensor([_prompt_ids(root / "hf")])
    with torch.inference_mode():
        ours, theirs = loaded.model(ids).logits, fake_quant(ids).logits
        unquantized = load_checkpoint(root / "hf").model(ids).logits
    error = float((ours - theirs).norm() / theirs.norm())
    awq_error = float((theirs - unquantized).norm() / unquantized.norm())
    print(f"logit rel. error: ModelOpt HF export loader vs fake-quant {error:.4f}; fake-quant vs fp32 {awq_error:.4f}")
    assert error < 0.25 * awq_error
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() > 0.9


def test_a_modelopt_export_of_another_algorithm_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    with pytest.raises(CheckpointError, match="quant_algo 'NVFP4'"):
        load_checkpoint(tmp_path)


def test_an_fp8_modelopt_export_loads_as_its_weights_times_their_scales(tmp_path, tokenizer_dir):
    """ModelOpt's FP8 (per tensor) Hugging Face export, as `make repo ENGINE=llmapi QUANT=fp8` writes it, loaded by the
    embedded engine: each weight is its float8 value times its scale, and the model computes what the fp32 model
    does up to FP8's rounding."""
    from engine_build.quantize import quantize_modelopt_hf

    shape = TinyLlamaShape(num_hidden_layers=1, intermediate_size=256)
    write_hf_checkpoint(tmp_path / "hf", shape, tiny_llama_weights(shape, seed=5), tokenizer_dir)
    out = quantize_modelopt_hf(tmp_path / "hf", tmp_path / "fp8", "fp8", calib_texts=read_calibration_texts()[:2],
                               device="cpu")
    exported = load_file(str(out / "model.safetensors"))
    loaded = load_checkpoint(out)
    assert (loaded.source_format, loaded.quant_algo) == ("modelopt_hf", "FP8")
    down = "model.layers.0.mlp.down_proj"
    assert exported[f"{down}.weight"].dtype == torch.float8_e4m3fn
    torch.testing.assert_close(loaded.model.state_dict()[f"{down}.weight"],
                               exported[f"{down}.weight"].float() * exported[f"{down}.weight_scale"].float())
    ids = torch.tensor([_prompt_ids(tmp_path / "hf")])
    with torch.inference_mode():
        ours, fp32 = loaded.model(ids).logits, load_checkpoint(tmp_path / "hf").model(ids).logits
    assert float((ours - fp32).norm() / fp32.norm()) < 0.1
