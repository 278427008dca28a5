"""The GPU stages: `trtllm-build` on a W4A16_AWQ (or fp16) TensorRT-LLM checkpoint, and the engine copy.

Pinned to TensorRT-LLM 1.2.1, the last stable release with the TensorRT engine flow (`trtllm-build`
and the Triton `tensorrtllm` C++ backend were removed from later releases). Every flag below exists in
1.2.x's `trtllm-build` parser; the 0.x-era flags that 1.x rejects (`--max_output_len`,
`--use_custom_all_reduce`, `--multi_block_mode`, `--enable_xqa`...) are deliberately absent.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from engine_build.gpu import gpu_available

TRTLLM_VERSION = "1.2.1"
# Triton's release compatibility matrix: the 26.04-26.07 trtllm-python-py3 containers ship TensorRT-LLM 1.2.1
# (25.12-26.02 ship 1.1.0, 26.03 ships 1.2.0); 26.07 is the newest of them.
TRITON_TRTLLM_CONTAINER = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
DRAFT_TOKENS_EXTERNAL = "draft_tokens_external"
# The LoRA plugin's dtype, and so the engine's: Triton's lora_weights are TYPE_FP16 (upstream's config.pbtxt).
LORA_PLUGIN_DTYPE = "float16"


class GpuStageError(RuntimeError):
    """The GPU stage cannot run here (no GPU, no TensorRT-LLM) or the build failed; the message says which."""


def trtllm_build_command(
    checkpoint_dir: Path,
    output_dir: Path,
    *,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_num_tokens: int,
    max_draft_len: int = 0,
    workers: int = 1,
    lora_target_modules: tuple[str, ...] = (),
    max_lora_rank: int = 0,
) -> list[str]:
    """argv of `trtllm-build` for a Llama engine served by Triton's inflight batcher.

    Paged KV cache and paged context FMHA are what KV-cache reuse needs, and draft-target speculative
    decoding needs KV-cache reuse on both engines. max_draft_len > 0 builds a target that accepts
    `draft_input_ids` from an external draft model. `--gemm_plugin auto` covers the unquantized GEMMs
    (lm_head); the AWQ GEMMs use the weight-only groupwise plugin, which the checkpoint selects.
    lora_target_modules (TensorRT-LLM module names, engine_build/lora.py) build the LoRA plugin for serving-time
    adapters: `--lora_plugin float16` (the checkpoint is exported float16 for it: the runtime takes lora_weights only
    in the engine's dtype, and Triton's contract declares them TYPE_FP16, as NVIDIA's LoRA example builds), the
    modules, and `--max_lora_rank`; no `--lora_dir`, which would bake one adapter's configuration into the engine
    (tensorrt_llm/commands/build.py, lora-1.2.md section 1).
    """
    if max_input_len >= max_seq_len:
        raise ValueError(f"max_input_len ({max_input_len}) must be below max_seq_len ({max_seq_len})")
    if max_draft_len < 0:
        raise ValueError(f"max_draft_len must be >= 0, got {max_draft_len}")
    command = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--gemm_plugin", "auto",
        "--gpt_attention_plugin", "auto",
        "--kv_cache_type", "paged",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--remove_input_padding", "enable",
        "--max_beam_width", "1",
        "--max_batch_size", str(max_batch_size),
        "--max_input_len", str(max_input_len),
        "--max_seq_len", str(max_seq_len),
        "--max_num_tokens", str(max_num_tokens),
        "--workers", str(workers),
    ]
    if max_draft_len:
        command += ["--speculative_decoding_mode", DRAFT_TOKENS_EXTERNAL, "--max_draft_len", str(max_draft_len)]
    if lora_target_modules:
        if max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1 with LoRA target modules, got {max_lora_rank}")
        command += ["--lora_plugin", LORA_PLUGIN_DTYPE, "--lora_target_modules", *lora_target_modules,
                    "--max_lora_rank", str(max_lora_rank)]
    return command


def installed_trtllm_version() -> str | None:
    """Installed tensorrt_llm's version, found without importing it (the import needs libcuda)."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def check_gpu_stage_environment() -> None:
    """Raise GpuStageError unless a GPU, `trtllm-build` and TensorRT-LLM 1.2.x are all here."""
    hint = f"run this stage inside {TRITON_TRTLLM_CONTAINER} (TensorRT-LLM {TRTLLM_VERSION}) with --gpus all"
    if not gpu_available():
        raise GpuStageError(f"no NVIDIA GPU found (nvidia-smi / torch.cuda): trtllm-build needs one; {hint}")
    version = installed_trtllm_version()
    if version is None:
        raise GpuStageError(f"tensorrt_llm is not installed; {hint}")
    if shutil.which("trtllm-build") is None:
        raise GpuStageError(f"trtllm-build is not on PATH; {hint}")
    if version != "unknown" and not version.startswith(TRTLLM_VERSION.rsplit(".", 1)[0] + "."):
        raise GpuStageError(
            f"tensorrt_llm {version} is installed; these build flags are for {TRTLLM_VERSION} "
            "(releases after 1.2 have no trtllm-build)"
        )


def run_trtllm_build(checkpoint_dir: Path, output_dir: Path, **build_options) -> Path:
    """Check the environment, run trtllm-build (its output streamed through), return output_dir."""
    check_gpu_stage_environment()
    if not (Path(checkpoint_dir) / "config.json").is_file():
        raise GpuStageError(f"{checkpoint_dir} is not a TensorRT-LLM checkpoint (no config.json)")
    command = trtllm_build_command(checkpoint_dir, output_dir, **build_options)
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            sys.stderr.write(line)
        returncode = process.wait()
    if returncode != 0:
        raise GpuStageError(f"trtllm-build exited with status {returncode} (its output is above)")
    return Path(output_dir)


def copy_engine(engine_dir: Path, dest_dir: Path) -> list[Path]:
    """Copy rank*.engine and config.json (what the tensorrtllm backend loads) into dest_dir."""
    engine_dir, dest_dir = Path(engine_dir), Path(dest_dir)
    engines = sorted(engine_dir.glob("rank*.engine"))
    config = engine_dir / "config.json"
    if not engines or not config.is_file():
        raise GpuStageError(f"{engine_dir} holds no built engine (rank*.engine and config.json expected)")
    dest_dir.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(path, dest_dir / path.name)) for path in [*engines, config]]
