"""tensorrt_llm/1/model.yaml of an llmapi repository (ENGINE=llmapi): NVIDIA's shape (triton_backend/all_models/llmapi/
tensorrt_llm/1/model.yaml@c8c6df0), LLM() arguments at the top level (engine_build/upstream_llm_args.py records which)
and the Triton model's own `triton_config` section. Written by `make repo`, read by the tensorrt_llm model and by
`make check-repo`; what else the repository's llmapi files say (which LLM, which quantizations load where) is
defined here too, below the build (engine_build/llmapi_flow.py) and the check (engine_build/check_repo.py) that
both read it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from engine_build.quantize import MODELOPT_ALGORITHMS

# The parameter `llm` of tensorrt_llm's config.pbtxt and repository.json: which LLM class the model runs.
LLM_TENSORRT_LLM = "tensorrt_llm"  # TensorRT-LLM's own LLM (the GPU build); never falls back to the stand-in
LLM_STAND_IN = "stand_in"  # the embedded engine behind the LLM API's surface (the CPU build)
# Which quantizations the PyTorch flow's Llama model loads on which GPUs, by compute capability [low, high):
# NVIDIA/TensorRT-LLM docs/source/features/quantization.md (read at 09d4c79; the same table at f53fb4c) "Hardware
# Support Matrix": W4A16 AWQ on Hopper, Ada Lovelace and Ampere, not on Blackwell (sm100/103, sm120); FP8 per tensor on
# Blackwell sm120 and sm100/103, Hopper and Ada, not on Ampere; FP8 KV cache on all five. Its model matrix gives the
# LLaMA row (LlamaForCausalLM, which Llama 3 checkpoints are) FP8 per tensor and W4A16 AWQ. _torch/modules/linear.py
# @ed53795 get_quant_method has the W4A16_AWQ and FP8 QDQ linear methods (llmapi-1.2.md section 5). Ampere is
# 8.0-8.7, Ada 8.9, Hopper 9.0, Blackwell 10.x and 12.x.
QUANT_SUPPORT: dict[str, tuple[str, tuple[int, int], tuple[int, int] | None, str]] = {
    "awq": (MODELOPT_ALGORITHMS["awq"], (8, 0), (10, 0), "Ampere, Ada and Hopper (not Blackwell: use QUANT=fp8 there)"),
    "fp8": (MODELOPT_ALGORITHMS["fp8"], (8, 9), None, "Ada, Hopper and Blackwell (compute capability 8.9 and up)"),
}
CANCELLATION_CHECK_PERIOD_MS = 100  # NVIDIA's model.py default (triton_config.cancellation_check_period_ms)
VERSION_DIR_NOTE = ("Paths (model, tokenizer, speculative_config.speculative_model_dir, lora_config.lora_dir) are "
                    "relative to this file's folder, tensorrt_llm/1/: the tensorrt_llm model resolves them, so the "
                    "repository can be moved or copied as a whole.")
MODEL_YAML = "model.yaml"
TRITON_CONFIG = "triton_config"
HEADER = """\
# TensorRT-LLM 1.2.x LLM() arguments (the PyTorch backend's TorchLlmArgs) for the tensorrt_llm model, as NVIDIA's
# Triton llmapi model reads them: everything but `triton_config` goes to LLM(**...); an unknown key fails the load.
# Written by `make repo ENGINE=llmapi` (engine_build/llmapi_flow.py); `make check-repo` checks every key and value
# against the recorded 1.2.x fields (engine_build/upstream_llm_args.py).
{paths}
"""


def model_yaml_text(llm_args: dict, triton_config: dict, paths_note: str) -> str:
    document = {**llm_args, TRITON_CONFIG: triton_config}
    paths = "\n".join(f"# {line}" for line in textwrap.wrap(paths_note, 116))
    return HEADER.format(paths=paths) + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def read_model_yaml(version_dir: Path) -> dict:
    """The parsed model.yaml of a tensorrt_llm/1 folder (yaml.safe_load, as NVIDIA's model.py loads it)."""
    return yaml.safe_load((Path(version_dir) / MODEL_YAML).read_text())
