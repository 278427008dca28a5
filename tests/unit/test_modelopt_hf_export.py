"""ModelOpt's Hugging Face export (ENGINE=llmapi's checkpoint), run on CPU on a 1-layer Llama-3-shaped model: W4A16_AWQ
and FP8, each as TensorRT-LLM's PyTorch flow reads it (hf_quant_config.json's quant_algo, packed weights beside their
scales, the unquantized tensors in 16 bits), with the tokenizer files beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from engine_build import cli
from engine_build.assets.tiny_models import TinyLlamaShape, tiny_llama_weights, write_hf_checkpoint
from engine_build.quantize import QuantizationError, quantize_modelopt_hf, read_calibration_texts


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory, tokenizer_dir) -> Path:
    root = tmp_path_factory.mktemp("modelopt-hf")
    shape = TinyLlamaShape(num_hidden_layers=1, intermediate_size=256)
    write_hf_checkpoint(root / "hf", shape, tiny_llama_weights(shape, seed=5), tokenizer_dir)
    return root / "hf"


def _tensors(folder: Path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {key: (f.get_slice(key).get_dtype(), f.get_slice(key).get_shape()) for key in f.keys()}


@pytest.mark.parametrize("algorithm,quant_algo", [("awq", "W4A16_AWQ"), ("fp8", "FP8")])
def test_the_export_is_what_the_pytorch_flow_loads(one_layer, tmp_path, algorithm, quant_algo):
    out = quantize_modelopt_hf(one_layer, tmp_path / "export", algorithm, calib_texts=read_calibration_texts()[:2],
                               device="cpu")
    quantization = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert quantization["quant_algo"] == quant_algo and quantization["exclude_modules"] == ["lm_head"]
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_algo"] == quant_algo
    assert config["rope_theta"] == 500000.0 and config["dtype"] == "float16"  # the fp32 tiny model, in 16 bits
    tensors = _tensors(out)
    assert tensors["lm_head.weight"] == ("F16", [128256, 128])
    down = "model.layers.0.mlp.down_proj"
    if algorithm == "awq":  # two int4 a byte along the output dim, one scale per 128 inputs, AWQ's input scale
        assert quantization["group_size"] == 128 and not quantization["has_zero_point"]
        assert tensors[f"{down}.weight"] == ("U8", [64, 256])
        assert tensors[f"{down}.weight_scale"][1] == [128, 2]
        assert tensors[f"{down}.pre_quant_scale"] == ("F16", [256])
    else:  # per-tensor FP8 weights with their weight and input scales
        assert tensors[f"{down}.weight"] == ("F8_E4M3", [128, 256])
        assert tensors[f"{down}.weight_scale"][1] == [] and f"{down}.input_scale" in tensors
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()


def test_the_cli_refuses_what_the_formats_do_not_hold(one_layer, tmp_path):
    with pytest.raises(SystemExit, match="--format hf --quantization none"):
        cli.main(["quantize", "--format", "hf", "--quantization", "none", "--hf-model", str(one_layer),
                  "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="--quantization fp8 is for --format hf"):
        cli.main(["quantize", "--quantization", "fp8", "--hf-model", str(one_layer), "--out", str(tmp_path / "x")])
    with pytest.raises(QuantizationError, match="quantization 'int8' is none of"):
        quantize_modelopt_hf(one_layer, tmp_path / "y", "int8")
