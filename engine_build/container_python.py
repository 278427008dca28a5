"""What Python the 26.07 TensorRT-LLM container gives a Python-backend model: its interpreter and the top-level
modules it can import, each with the upstream build source that puts it there.

The image is built by triton-inference-server/server build.py (branch r26.07) on the base that tensorrtllm_backend
r26.07's dockerfile/Dockerfile.triton.trt_llm_backend produces; nothing of this project is installed in it (a repository
ships its own packages, `bls/` and `embedded_engine/`, in each model's version folder). `check-repo` reads every import
statement of every Python file a model ships (engine_build/check_repo.py) against this table. Read 2026-11-25; not read
from the image itself, which this project has never run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

DOCKERFILE = "triton-inference-server/tensorrtllm_backend r26.07 (3bc1153) dockerfile/Dockerfile.triton.trt_llm_backend"
SERVER_BUILD = "triton-inference-server/server r26.07 (819ee37) build.py dockerfile_prepare_container_linux"
TRTLLM_REQUIREMENTS = ("tensorrt_llm 1.2.1's package requirements (../shared/reference/conformance-1.2.md: "
                       "transformers==4.57.3, nvidia-modelopt[torch]~=0.37.0, protobuf>=6.33.5, "
                       "torch>=2.9.1,<=2.10.0a0); "
                       "NVIDIA/TensorRT-LLM requirements.txt of the 1.2 line (numpy<2)")

# The container's Python: the Dockerfile installs python3.12 and a venv of it (/opt/venv-tritonserver, first on PATH).
PYTHON_VERSION = (3, 12)
# Standard-library modules this interpreter has that 3.12 removed (PEP 594, PEP 632): not in the container.
REMOVED_BY_3_12 = frozenset({"distutils", "imp", "asynchat", "asyncore", "smtpd"})


@dataclass(frozen=True)
class Shipped:
    module: str  # the top-level import name
    distribution: str
    source: str


SHIPPED: tuple[Shipped, ...] = (
    Shipped("triton_python_backend_utils", "the Python backend itself",
            "python_backend's stub provides it to model.py"),
    Shipped("numpy", "numpy<2",
            f"{SERVER_BUILD} (pip3 install \"numpy<2\" for the python backend); {TRTLLM_REQUIREMENTS}"),
    Shipped("torch", "torch 2.10.0a0+nv25.12", f"{DOCKERFILE} (copied from nvcr.io/nvidia/pytorch:25.12-py3)"),
    Shipped("transformers", "transformers==4.57.3",
            f"{DOCKERFILE} (pip3 install tensorrt_llm==1.2.1); {TRTLLM_REQUIREMENTS}"),
    Shipped("tokenizers", "tokenizers>=0.22.0,<=0.23.0", "transformers 4.57.3's Requires-Dist"),
    Shipped("safetensors", "safetensors>=0.4.3", "transformers 4.57.3's Requires-Dist"),
    Shipped("huggingface_hub", "huggingface-hub>=0.34.0,<1.0", "transformers 4.57.3's Requires-Dist"),
    Shipped("xgrammar", "xgrammar==0.1.32",
            f"{DOCKERFILE} (pip3 install tensorrt_llm==1.2.1): tensorrt_llm 1.2.1's Requires-Dist "
            "(../shared/reference/awq-and-trtllm-build.md, its PKG-INFO); "
            "this project pins 0.2.8 (pyproject.toml says why)"),
    Shipped("jinja2", "jinja2", "torch's Requires-Dist (pip resolves the copied torch's requirements when it installs "
                                "tensorrt_llm, which requires torch)"),
    # Not listed: tensorrt_llm itself, which the LLM API's model imports only inside `except ImportError` (a repository
    # for TensorRT-LLM fails its load naming it where it is missing), so check-repo needs no entry for it.
    Shipped("yaml", "PyYAML", f"{DOCKERFILE} (pip3 install tensorrt_llm==1.2.1): tensorrt_llm/llmapi/llm_args.py "
                              "imports yaml at module level (read at NVIDIA/TensorRT-LLM@0004396); the LLM API's model "
                              "reads model.yaml with it"),
)
SHIPPED_MODULES = {entry.module: entry for entry in SHIPPED}
# House rule (docs/container.md): torch is for the embedded engine only; every other model serves on the
# tokenizer stack alone.
ENGINE_ONLY_MODULES = frozenset({"torch", "safetensors", "xgrammar"})


def standard_library() -> frozenset[str]:
    """The container interpreter's standard library, as far as this interpreter knows it (3.10+)."""
    return frozenset(sys.stdlib_module_names) - REMOVED_BY_3_12


def why_not_importable(module: str, engine_model: bool) -> str | None:
    """None when a model can import top-level `module` in the container; otherwise why not."""
    if module in standard_library():
        return None
    entry = SHIPPED_MODULES.get(module)
    if entry is None:
        return (f"'{module}' is not installed in the 26.07 container (engine_build/container_python.py lists what is, "
                "with the build source of each)")
    if module in ENGINE_ONLY_MODULES and not engine_model:
        return f"'{module}' is for the embedded engine only: this model must serve without it"
    return None
