"""Load a Llama checkpoint for the embedded CPU engine: an HF dir, ModelOpt's HF export (what TensorRT-LLM's PyTorch
flow loads: _load_modelopt_hf) or a TensorRT-LLM checkpoint dir.

The TensorRT-LLM checkpoint is what `trtllm-build` consumes (config.json + rank0.safetensors). Loading
it here lets the CPU engine run exactly the weights the GPU engine would be built from, AWQ int4
included: the int4 weights are dequantized to fp32 and the AWQ pre-quant scale is folded in, so a
plain transformers LlamaForCausalLM computes what the quantized GEMMs compute (up to fp32 rounding).

Layout facts, checked against modelopt 0.37's export (see tests/unit/test_awq.py):
- W4A16_AWQ weights are int8 (out/2, in): output row 2r is the low nibble of byte row r, row 2r+1 the
  high nibble, both signed int4. weights_scaling_factor is (out, in/group); no zero point.
- prequant_scaling_factor (in,) multiplies the activations before the quantized GEMM, so it is folded
  into the weight's input columns: x @ (W * s)^T == (x * s) @ W^T.
- mlp.fc is gate_proj (the SiLU branch), mlp.gate is up_proj, mlp.proj is down_proj.
- attention.qkv stacks q, k, v along the output dimension.
Only single-rank checkpoints are loaded (tp_size = pp_size = 1); multi-rank ones raise CheckpointError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURE = "LlamaForCausalLM"
AWQ = "W4A16_AWQ"
FP8 = "FP8"
# ModelOpt's Hugging Face export writes its quantization beside config.json (TensorRT-LLM's PyTorch flow reads it
# first: _torch/model_config.py ModelConfig.from_pretrained; /work/shared/reference/llmapi-1.2.md §5).
MODELOPT_QUANT_CONFIG = "hf_quant_config.json"


class CheckpointError(ValueError):
    """The directory is not a checkpoint this engine can load; the message names the problem."""


@dataclass
class LoadedCheckpoint:
    model: object  # transformers LlamaForCausalLM, eval mode, fp32, CPU
    config: object  # transformers LlamaConfig
    source_format: str  # "hf" | "trtllm" | "modelopt_hf"
    quant_algo: str | None
    max_position_embeddings: int


def is_trtllm_config(config: dict) -> bool:
    """TensorRT-LLM checkpoints name one `architecture` and carry `mapping`; HF configs list `architectures`."""
    return "architecture" in config and "architectures" not in config


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    path = Path(path)
    config_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not config_file.is_file():
        raise CheckpointError(f"{path} has no config.json")
    raw = json.loads(config_file.read_text())
    if is_trtllm_config(raw):
        return _load_trtllm(path, raw)
    if (path / MODELOPT_QUANT_CONFIG).is_file():
        return _load_modelopt_hf(path, raw)
    return _load_hf(path, raw)


def _load_hf(path: Path, raw: dict) -> LoadedCheckpoint:
    from transformers import LlamaForCausalLM

    if raw.get("architectures") != [SUPPORTED_ARCHITECTURE]:
        raise CheckpointError(f"{path}: architecture {raw.get('architectures')} is not {SUPPORTED_ARCHITECTURE}")
    if raw.get("quantization_config"):
        raise CheckpointError(f"{path}: quantized HF checkpoints are not supported; use the TensorRT-LLM checkpoint")
    model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return LoadedCheckpoint(model, model.config, "hf", None, model.config.max_position_embeddings)


def llama_config_from_trtllm(raw: dict):
    """The LlamaConfig equivalent to a TensorRT-LLM Llama checkpoint config; every field read, none assumed."""
    from transformers import LlamaConfig

    def need(key: str):
        if key not in raw:
            raise CheckpointError(f"TensorRT-LLM config has no {key!r}")
        return raw[key]

    if need("architecture") != SUPPORTED_ARCHITECTURE:
        raise CheckpointError(f"architecture {raw['architecture']!r} is not {SUPPORTED_ARCHITECTURE}")
    mapping = raw.get("mapping", {})
    if mapping.get("tp_size", 1) != 1 or mapping.get("pp_size", 1) != 1:
        raise CheckpointError(
            f"tensor/pipeline-parallel checkpoint (mapping {mapping}); the embedded engine loads single-rank "
            "checkpoints only: export with tp_size=1, pp_size=1"
        )
    if raw.get("bias") or raw.get("lm_head_bias") or raw.get("attn_bias") or raw.get("mlp_bias"):
        raise CheckpointError("checkpoints with linear biases are not supported")
    if need("position_embedding_type") != "rope_gpt_neox" or raw.get("rotary_pct", 1.0) != 1.0:
        raise CheckpointError("only full rope_gpt_neox rotary embeddings are supported")
    rope_scaling = raw.get("rotary_scaling")
    if rope_scaling is not None:
        # TensorRT-LLM accepts either key; transformers wants rope_type.
        rope_scaling = dict(rope_scaling)
        rope_scaling.setdefault("rope_type", rope_scaling.pop("type", None))
    num_heads = need("num_attention_heads")
    return LlamaConfig(
        architectures=[SUPPORTED_ARCHITECTURE],
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        intermediate_size=need("intermediate_size"),
        num_hidden_layers=need("num_hidden_layers"),
        num_attention_heads=num_heads,
        num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_size") or need("hidden_size") // num_heads,
        hidden_act=need("hidden_act"),
        max_position_embeddings=need("max_position_embeddings"),
        rms_norm_eps=need("norm_epsilon"),
        rope_theta=float(need("rotary_base")),
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(raw.get("share_embedding_table", False)),
        # The engine takes end/pad ids from each request; the checkpoint does not record them.
        bos_token_id=None,
        eos_token_id=None,
        dtype="float32",
    )


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int8 (out/2, in), two signed int4 per byte along out -> int8 (out, in) in [-8, 7]."""
    low = (packed << 4) >> 4  # arithmetic shifts sign-extend the low nibble
    high = packed >> 4
    return torch.stack([low, high], dim=1).reshape(-1, packed.shape[1])


def dequantize_awq(
    packed: torch.Tensor, scales: torch.Tensor, prequant: torch.Tensor, group_size: int
) -> torch.Tensor:
    """fp32 (out, in) weight equivalent to the W4A16_AWQ GEMM, the pre-quant scale folded in."""
    ints = unpack_int4(packed).float()
    weight = ints * scales.float().repeat_interleave(group_size, dim=1)
    return weight * prequant.float()[None, :]


def _linear(tensors: dict[str, torch.Tensor], prefix: str, group_size: int | None) -> torch.Tensor:
    weight = tensors[prefix + ".weight"]
    if group_size is None:
        return weight.float()
    return dequantize_awq(
        weight, tensors[prefix + ".weights_scaling_factor"], tensors[prefix + ".prequant_scaling_factor"], group_size
    )


# TensorRT-LLM module -> HF module, per decoder layer (attention.qkv is split separately).
_LAYER_LINEARS = {
    "attention.dense": "self_attn.o_proj",
    "mlp.fc": "mlp.gate_proj",
    "mlp.gate": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
}
_LAYER_NORMS = {"input_layernorm": "input_layernorm", "post_layernorm": "post_attention_layernorm"}


def hf_state_dict_from_trtllm(tensors: dict[str, torch.Tensor], config, group_size: int | None) -> dict:
    """HF LlamaForCausalLM state dict (fp32) from rank0 tensors; group_size None = unquantized."""
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    embedding = tensors["transformer.vocab_embedding.weight"].float()
    state = {
        "model.embed_tokens.weight": embedding,
        "model.norm.weight": tensors["transformer.ln_f.weight"].float(),
        "lm_head.weight": tensors["lm_head.weight"].float() if "lm_head.weight" in tensors else embedding,
    }
    for layer in range(config.num_hidden_layers):
        src, dst = f"transformer.layers.{layer}.", f"model.layers.{layer}."
        q, k, v = _linear(tensors, src + "attention.qkv", group_size).split([q_rows, kv_rows, kv_rows])
        state.update({dst + "self_attn.q_proj.weight": q, dst + "self_attn.k_proj.weight": k,
                      dst + "self_attn.v_proj.weight": v})
        for trt_name, hf_name in _LAYER_LINEARS.items():
            state[dst + hf_name + ".weight"] = _linear(tensors, src + trt_name, group_size)
        for trt_name, hf_name in _LAYER_NORMS.items():
            state[dst + hf_name + ".weight"] = tensors[src + trt_name + ".weight"].float()
    return state


def _load_modelopt_hf(path: Path, raw: dict) -> LoadedCheckpoint:
    """ModelOpt's Hugging Face export (modelopt.torch.export.export_hf_checkpoint, 0.37): the HF Llama layout, each
    quantized linear's `weight` quantized with its `weight_scale` (and AWQ's `pre_quant_scale`), dequantized here to
    fp32 as the embedded engine's TensorRT-LLM-checkpoint loader does:
    - W4A16_AWQ: `weight` uint8 (out/2, in), two signed int4 per byte along out (modelopt quant_utils
      pack_int4_in_uint8: row 2r the low nibble), `weight_scale` (out, in/group_size), `pre_quant_scale` (in,);
    - FP8 (per tensor): `weight` float8_e4m3fn times its scalar `weight_scale`.
    `input_scale` / `output_scale` and the KV cache's `k_scale` / `v_scale` are activation scales: a fp32 CPU engine
    has no use for them (a quantized KV cache is the GPU's). Other algorithms are refused, by name."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_utils import no_init_weights

    if raw.get("architectures") != [SUPPORTED_ARCHITECTURE]:
        raise CheckpointError(f"{path}: architecture {raw.get('architectures')} is not {SUPPORTED_ARCHITECTURE}")
    quantization = json.loads((path / MODELOPT_QUANT_CONFIG).read_text()).get("quantization") or {}
    quant_algo = quantization.get("quant_algo")
    if quant_algo not in (AWQ, FP8):
        raise CheckpointError(f"{path}/{MODELOPT_QUANT_CONFIG}: quant_algo {quant_algo!r} is not supported "
                              f"({AWQ} or {FP8})")
    if quant_algo == AWQ and quantization.get("has_zero_point"):
        raise CheckpointError(f"{path}: AWQ with zero points is not supported")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} has no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    activation_scales = (".input_scale", ".output_scale", ".k_scale", ".v_scale")
    state = {}
    for name, tensor in tensors.items():
        if name.endswith((".weight_scale", ".pre_quant_scale", *activation_scales)):
            continue
        prefix = name.removesuffix(".weight")
        scale = tensors.get(prefix + ".weight_scale") if name.endswith(".weight") else None
        if scale is None:
            state[name] = tensor.float()
        elif quant_algo == AWQ:
            group_size = int(quantization["group_size"])
            if tensor.shape[1] != scale.shape[1] * group_size or tensor.shape[0] * 2 != scale.shape[0]:
                raise CheckpointError(f"{path}: {name} {list(tensor.shape)} does not match {prefix}.weight_scale "
                                      f"{list(scale.shape)} with group_size {group_size}")
            prequant = tensors.get(prefix + ".pre_quant_scale", torch.ones(tensor.shape[1]))
            state[name] = dequantize_awq(tensor.view(torch.int8), scale, prequant, group_size)
        else:
            state[name] = tensor.float() * scale.float()
    config = LlamaConfig(**{key: value for key, value in raw.items() if key != "quantization_config"})
    with no_init_weights():  # every weight comes from the checkpoint: skip random init
        model = LlamaForCausalLM(config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights missing {sorted(missing)}, not of a Llama {sorted(unexpected)}")
    model.float().eval()
    return LoadedCheckpoint(model, config, "modelopt_hf", quant_algo, config.max_position_embeddings)


def _load_trtllm(path: Path, raw: dict) -> LoadedCheckpoint:
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    from transformers.modeling_utils import no_init_weights

    config = llama_config_from_trtllm(raw)
    quantization = raw.get("quantization") or {}
    quant_algo = quantization.get("quant_algo")
    if quant_algo not in (None, AWQ):
        raise CheckpointError(f"{path}: quant_algo {quant_algo!r} is not supported (only {AWQ} or unquantized)")
    if quantization.get("kv_cache_quant_algo"):
        raise CheckpointError(f"{path}: a quantized KV cache ({quantization['kv_cache_quant_algo']}) is not supported")
    if quant_algo == AWQ and quantization.get("has_zero_point"):
        raise CheckpointError(f"{path}: AWQ with zero points is not supported")
    weights_file = path / "rank0.safetensors"
    if not weights_file.is_file():
        raise CheckpointError(f"{path} has no rank0.safetensors")
    group_size = quantization["group_size"] if quant_algo == AWQ else None
    state = hf_state_dict_from_trtllm(load_file(str(weights_file)), config, group_size)
    with no_init_weights():  # every weight comes from the checkpoint: skip random init
        model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=True)
    model.eval()
    return LoadedCheckpoint(model, config, "trtllm", quant_algo, config.max_position_embeddings)
