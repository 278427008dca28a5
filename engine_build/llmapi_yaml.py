"""tensorrt_llm/1/model.yaml of an llmapi repository (ENGINE=llmapi): NVIDIA's shape (triton_backend/all_models/llmapi/
tensorrt_llm/1/model.yaml@c8c6df0), LLM() arguments at the top level (engine_build/upstream_llm_args.py records which)
and the Triton model's own `triton_config` section. Written by `make repo`, read by the tensorrt_llm model and by
`make check-repo`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

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
