"""Hugging Face PEFT LoRA adapters read into TensorRT-LLM 1.2.1's LoRA tensor format (embedded_engine.lora), checked
against the base. One reader for both sides: `make repo LORA_DIR=...` converts each adapter for the engines'
prefetch folders (engine_build/lora.py), and the llmapi flow's stand-in LLM loads a LoRARequest's `lora_path` (the
PEFT folder, as TensorRT-LLM's PyTorch flow takes adapters with lora_ckpt_source 'hf') with it at serving time.

The conversion is TensorRT-LLM's examples/hf_lora_convert.py@05316d3 (the converter its docs/lora.md and
tensorrtllm_backend's docs/lora.md use), made strict:
- keys `...layers.<i>.(self_attn|mlp).<module>.lora_(A|B).weight`; PEFT module -> TensorRT-LLM module by
  hf_modules_to_trtllm_modules (gate_proj -> mlp_h_to_4h, up_proj -> mlp_gate, down_proj -> mlp_4h_to_h; the table
  is embedded_engine.lora.LLAMA_MODULES). Upstream prints "no match" and drops any other key (modules_to_save,
  embedding LoRA, DoRA magnitudes): here such an adapter is refused by name, since serving it without them would
  silently serve another adapter.
- one row per (layer, module): flatten(A [r, in]) then flatten(B [out, r] * scale), scale = lora_alpha / r
  (lora_alpha / sqrt(r) with use_rslora), rows zero-padded to the longest, stored as float16 (the Triton contract's
  TYPE_FP16 `lora_weights`, hf_lora_convert's default storage type); `lora_config` rows [module_id, layer, r] int32.
- shapes are checked against the base (hidden size, attention and KV heads, intermediate size, layers): upstream
  guesses orientation from which dimension is larger; an adapter for another base is refused here, by name.
- the engine's rules (lora-1.2.md): targeting any of attn_q/k/v builds all three into the engine (lora_helper.py), and
  the fused gated MLP applies gate/up LoRA only when both mlp_h_to_4h and mlp_gate are built (layers/mlp.py): so both
  pairs are completed (complete_modules), and an adapter's missing partner rows are written as zeros (what
  TensorRT-LLM's Python LoraManager does), which both engines apply as no change.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embedded_engine.lora import LLAMA_MODULES, MODULES_BY_NAME, MODULES_BY_PEFT_NAME, LoraLayout

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# An adapter's name is its folder's; it travels in request tensors and configs, so it is kept to plain characters.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY = re.compile(r"^(?:.*\.)?layers\.([0-9]+)\.(self_attn|mlp)\.([a-z_]+)\.lora_(A|B)\.weight$")
# Modules the engine takes only together (lora-1.2.md section 1).
_TOGETHER = (("attn_q", "attn_k", "attn_v"), ("mlp_h_to_4h", "mlp_gate"))


class AdapterError(ValueError):
    """An adapter that cannot be served on this base; the message names the adapter and the problem."""


@dataclass(frozen=True)
class ConvertedAdapter:
    name: str
    task_id: int
    rank: int
    alpha: float
    use_rslora: bool
    modules: tuple[str, ...]  # TensorRT-LLM names the adapter itself targets
    base_model: str | None  # adapter_config.json's base_model_name_or_path, for the record
    weights: np.ndarray  # float16 [1, N, W]
    config: np.ndarray  # int32 [1, N, 3]


def adapter_dirs(lora_dir: Path) -> list[Path]:
    """The adapters of LORA_DIR, sorted by name (which fixes their task ids)."""
    lora_dir = Path(lora_dir)
    if not lora_dir.is_dir():
        raise AdapterError(f"LORA_DIR {lora_dir} is not a directory")
    folders = sorted(path for path in lora_dir.iterdir() if path.is_dir())
    if not folders:
        raise AdapterError(f"LORA_DIR {lora_dir} holds no adapter folders (one PEFT adapter per subfolder)")
    return folders


def convert_peft_adapter(path: Path, task_id: int, layout: LoraLayout) -> ConvertedAdapter:
    """One PEFT adapter folder in the backend's format, checked against the base `layout` (its dims; modules and max
    rank are what the adapter may not exceed)."""
    path = Path(path)
    name = path.name
    if not ADAPTER_NAME.match(name):
        raise AdapterError(f"adapter {name!r}: a name is 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)")
    settings = _adapter_settings(path)
    rank, alpha = settings["r"], settings["lora_alpha"]
    use_rslora = bool(settings.get("use_rslora", False))
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in _adapter_tensors(path).items():
        match = _KEY.match(key)
        if match is None or match.group(3) not in MODULES_BY_PEFT_NAME:
            raise AdapterError(f"adapter {name!r}: weight {key!r} is not a LoRA A/B of a Llama projection "
                               f"({', '.join(MODULES_BY_PEFT_NAME)}); embedding, lm_head, modules_to_save and DoRA "
                               "weights cannot be served per request")
        layer, module = int(match.group(1)), MODULES_BY_PEFT_NAME[match.group(3)].name
        pairs.setdefault((layer, module), {})[match.group(4)] = value
    rows: dict[tuple[int, str], np.ndarray] = {}
    for (layer, module), pair in sorted(pairs.items()):
        where = f"adapter {name!r} layer {layer} {MODULES_BY_NAME[module].peft_name}"
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{where}: lora_{'B' if 'A' in pair else 'A'} is missing")
        if layer >= layout.num_layers:
            raise AdapterError(f"{where}: the base has {layout.num_layers} layers (an adapter for another base?)")
        fan_in, fan_out = layout.shape(module)
        a, b = pair["A"], pair["B"]
        if a.shape != (rank, fan_in) or b.shape != (fan_out, rank):
            raise AdapterError(f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)}, the base needs "
                               f"[{rank}, {fan_in}] and [{fan_out}, {rank}] (an adapter for another base or "
                               "architecture?)")
        rows[(layer, module)] = np.concatenate([a.reshape(-1), (b * scale).reshape(-1)])
    if not rows:
        raise AdapterError(f"adapter {name!r}: no LoRA weights")
    modules = tuple(m.name for m in LLAMA_MODULES if any(module == m.name for _, module in rows))
    if rank > layout.max_rank:
        raise AdapterError(f"adapter {name!r}: rank {rank} is above max_lora_rank {layout.max_rank} "
                           "(--max-lora-rank)")
    missing = [module for module in complete_modules(modules) if module not in layout.modules]
    if missing:
        raise AdapterError(f"adapter {name!r}: targets {', '.join(missing)}, which the engine is not built for "
                           f"(--lora_target_modules {' '.join(layout.modules)})")
    for layer in sorted({layer for layer, _ in rows}):  # zero rows for the partners the engine applies together
        for group in _TOGETHER:
            if any((layer, module) in rows for module in group):
                for module in group:
                    if (layer, module) not in rows:
                        rows[(layer, module)] = np.zeros(rank * sum(layout.shape(module)), np.float32)
    order = sorted(rows, key=lambda key: (key[0], [m.name for m in LLAMA_MODULES].index(key[1])))
    width = max(row.size for row in rows.values())
    weights = np.zeros((1, len(order), width), np.float16)
    for index, key in enumerate(order):
        weights[0, index, : rows[key].size] = rows[key]
    if not np.isfinite(weights).all():
        raise AdapterError(f"adapter {name!r}: a scaled weight does not fit float16 (inf or NaN)")
    config = np.array([[[MODULES_BY_NAME[module].module_id, layer, rank] for layer, module in order]], np.int32)
    return ConvertedAdapter(name, task_id, rank, float(alpha), use_rslora, modules,
                            settings.get("base_model_name_or_path"), weights, config)


def complete_modules(modules) -> tuple[str, ...]:
    """`modules` with the partners the engine builds and applies together (_TOGETHER), in TensorRT-LLM's order."""
    wanted = set(modules)
    for group in _TOGETHER:
        if wanted & set(group):
            wanted |= set(group)
    return tuple(m.name for m in LLAMA_MODULES if m.name in wanted)


def adapter_modules(lora_dir: Path, only: Path | None = None) -> tuple[tuple[str, ...], int]:
    """What the engine must be built for: (--lora_target_modules, the largest adapter rank), read from the adapters'
    weights (of `only`, one adapter folder, if given) without checking them against a base (the dry run has no
    checkpoint weights)."""
    modules, largest = set(), 0
    for path in [Path(only)] if only is not None else adapter_dirs(lora_dir):
        settings = _adapter_settings(path)
        largest = max(largest, settings["r"])
        for key in _adapter_tensor_names(path):
            match = _KEY.match(key)
            if match and match.group(3) in MODULES_BY_PEFT_NAME:
                modules.add(MODULES_BY_PEFT_NAME[match.group(3)].name)
    return complete_modules(modules), largest


def _adapter_settings(path: Path) -> dict:
    name = path.name
    config_file = path / ADAPTER_CONFIG
    if not config_file.is_file():
        raise AdapterError(f"adapter {name!r}: {config_file} is missing (not a PEFT adapter folder)")
    settings = json.loads(config_file.read_text())
    if settings.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {name!r}: peft_type {settings.get('peft_type')!r} is not LORA")
    refusals = {
        "use_dora": (bool(settings.get("use_dora")), "DoRA is not supported (TensorRT-LLM's Triton contract has "
                                                     "no is_dora column)"),
        "bias": (settings.get("bias", "none") != "none", "LoRA biases are not in TensorRT-LLM's LoRA format"),
        "fan_in_fan_out": (bool(settings.get("fan_in_fan_out")), "fan_in_fan_out (Conv1D) layers are not Llama's"),
        "modules_to_save": (bool(settings.get("modules_to_save")), "fully trained modules (embed_tokens, lm_head) "
                                                                   "cannot be switched per request"),
        "rank_pattern": (bool(settings.get("rank_pattern")), "per-module ranks are not supported (one r)"),
        "alpha_pattern": (bool(settings.get("alpha_pattern")), "per-module alphas are not supported (one alpha)"),
    }
    for key, (refused, why) in refusals.items():
        if refused:
            raise AdapterError(f"adapter {name!r}: {key} {settings.get(key)!r}: {why}")
    rank = settings.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter {name!r}: r must be a positive integer, got {rank!r}")
    if not isinstance(settings.get("lora_alpha"), (int, float)):
        raise AdapterError(f"adapter {name!r}: lora_alpha must be a number, got {settings.get('lora_alpha')!r}")
    return settings


def _weights_file(path: Path) -> Path:
    for file_name in ADAPTER_WEIGHTS:
        if (path / file_name).is_file():
            return path / file_name
    raise AdapterError(f"adapter {path.name!r}: no {' or '.join(ADAPTER_WEIGHTS)} in {path}")


def _adapter_tensor_names(path: Path) -> list[str]:
    file = _weights_file(path)
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), framework="np") as handle:
            return list(handle.keys())
    return list(_adapter_tensors(path))


def _adapter_tensors(path: Path) -> dict[str, np.ndarray]:
    """The adapter's tensors as float32 (torch reads bfloat16, which numpy cannot)."""
    import torch

    file = _weights_file(path)
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(file))
    else:
        tensors = torch.load(str(file), map_location="cpu", weights_only=True)
    return {key: value.float().numpy() for key, value in tensors.items()}
