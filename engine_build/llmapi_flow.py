"""`make repo ENGINE=llmapi`: Llama 3 on TensorRT-LLM 1.2.x's PyTorch backend through the LLM API, as NVIDIA's Triton
llmapi model serves it (a Python model on `tensorrt_llm.LLM`, configured by `tensorrt_llm/1/model.yaml`).

Two builds, recorded in the repository as the `llm` it runs (config.pbtxt parameter and repository.json):
- `llm: tensorrt_llm` (HF_MODEL=...): the checkpoint is ModelOpt's Hugging Face export of HF_MODEL (W4A16 AWQ by
  default, QUANT=fp8), calibrated by `python -m engine_build quantize --format hf` in its own process (its GPU memory
  is freed before anything else runs, as the engine flow's); model.yaml is sized by the engine flow's GPU profiles
  (engine_build/gpu_plan.py). DRY_RUN=1 plans, renders and checks everything and prints the commands, without a GPU.
- `llm: stand_in` (no HF_MODEL, the CPU default): the tiny default model's ModelOpt export
  (build/assets/tiny-target-modelopt-hf), served by the embedded engine behind the LLM API's surface.

What 1.2.x cannot do is refused here, by name, before any work: a quantization the PyTorch Llama model does not load on
the GPU, and the speculative-decoding combinations its sources exclude.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_build.check_repo import check_repository
from engine_build.gpu_plan import (
    Capacity,
    GiB,
    ModelShape,
    Profile,
    QuantizationMemory,
    fitting_memory,
    gpu_compute_capability,
    planned_gpu_memory,
    profile_with,
)
from engine_build.llmapi_yaml import (
    LLM_STAND_IN,
    LLM_TENSORRT_LLM,
    QUANT_SUPPORT,
)
from engine_build.repository import RepositoryError, RepositorySettings, assemble_repository
from engine_build.settings_args import bls_settings, lora_settings, text_instance_settings
from engine_build.trtllm_flow import PROJECT_ROOT, Command, hf_config

TINY_EXPORT = "tiny-target-modelopt-hf"  # under the assets folder: the stand-in's checkpoint
TARGET_EXPORT = "target-modelopt-hf"  # under the assets folder: HF_MODEL's export

# Quantizations users ask for that this build does not produce, and why (refused by name).
QUANT_REFUSED = {
    "gptq": "1.2.x's PyTorch linear layers have no GPTQ method (_torch/modules/linear.py get_quant_method), and "
            "_torch/model_config.py reads no AutoAWQ/GPTQ quantization_config",
    "int4": "int4 here is AWQ: QUANT=awq (W4A16_AWQ)",
    "nvfp4": "NVFP4 runs on Blackwell only and is not produced by this build; QUANT=fp8 on Blackwell",
    "w4a8_awq": "W4A8 AWQ is not produced by this build (QUANT=awq is W4A16_AWQ)",
    "none": "the mission serves a quantized checkpoint: QUANT=awq (default) or QUANT=fp8",
}
GPU_ARCHITECTURES = {"ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0), "blackwell": (10, 0)}

# Speculative decoding as 1.2.x configures it (llmapi-1.2.md section 1.2): SPECULATIVE= -> decoding_type.
SPECULATIVE_MODES = {"ngram": "NGram", "eagle3": "Eagle", "draft_target": "DraftTarget"}
SPECULATIVE_REFUSED = {
    "lookahead": "LookaheadDecodingConfig.supports_backend excludes the PyTorch backend (llm_args.py, A and B): "
                 "lookahead is the engine flow's (ENGINE=trtllm)",
    "medusa": "MedusaDecodingConfig.supports_backend excludes the PyTorch backend (llm_args.py, A and B)",
    "mtp": "MTP drafts with DeepSeek's own layers (docs features/speculative-decoding.md: DeepSeek only)",
}
# The n-gram drafter's match length: NGramDecodingConfig needs max_matching_ngram_size > 0 (its validator, B); 2 is
# the value NVIDIA's reference page shows as the field's default in later releases (llmapi NGramDecodingConfig docs).
NGRAM_MATCH_SIZE = 2
# EAGLE-3 on 1.2.x: one-model (the drafter a submodule of the target) is EagleDecodingConfig's default
# (eagle3_one_model: Optional[bool] = True, A), written explicitly.
EAGLE3_ONE_MODEL = True


def parse_gpu_arch(value: str) -> tuple[int, int]:
    """GPU_ARCH=ampere|ada|hopper|blackwell or a compute capability such as 8.9."""
    name = value.strip().lower()
    if name in GPU_ARCHITECTURES:
        return GPU_ARCHITECTURES[name]
    major, dot, minor = name.partition(".")
    if major.isdigit() and (not dot or minor.isdigit()):
        return int(major), int(minor or 0)
    raise SystemExit(f"GPU_ARCH={value!r} is neither one of {sorted(GPU_ARCHITECTURES)} nor a compute capability "
                     "such as 8.9")


def arch_name(capability: tuple[int, int]) -> str:
    if capability >= (10, 0):
        return "Blackwell"
    if capability >= (9, 0):
        return "Hopper"
    if capability >= (8, 9):
        return "Ada"
    if capability >= (8, 0):
        return "Ampere"
    return "pre-Ampere"


def check_quantization(quant: str, capability: tuple[int, int] | None) -> str:
    """The quant_algo QUANT= gives, or SystemExit naming why it cannot serve on this GPU (None: not known here)."""
    if quant in QUANT_REFUSED:
        raise SystemExit(f"QUANT={quant} is refused for ENGINE=llmapi: {QUANT_REFUSED[quant]}")
    if quant not in QUANT_SUPPORT:
        raise SystemExit(f"QUANT={quant} is none of {sorted(QUANT_SUPPORT)} (ENGINE=llmapi)")
    algo, low, high, where = QUANT_SUPPORT[quant]
    if capability is not None and (capability < low or (high is not None and capability >= high)):
        major, minor = capability
        raise SystemExit(f"QUANT={quant} ({algo}) does not load on this GPU: compute capability {major}.{minor} "
                         f"({arch_name(capability)}); TensorRT-LLM 1.2.x's PyTorch flow runs {algo} on {where}")
    return algo


@dataclass(frozen=True)
class Speculation:
    """SPECULATIVE= and what it needs: the decoding_type, the draft length and, for EAGLE-3 and draft-target, the
    draft folder (linked into tensorrt_llm/1/draft)."""

    mode: str  # "" (none), ngram, eagle3, draft_target
    max_draft_len: int
    draft_dir: Path | None

    @property
    def drafts_in_executor(self) -> bool:
        """Draft tokens made by the executor beside the target (a draft model, or the n-gram pool: the "two model"
        path of TensorRT-LLM's speculative-decoding docs), which the overlap scheduler does not support; one-model
        EAGLE-3 (EAGLE3_ONE_MODEL) drafts inside the target."""
        return self.mode in ("draft_target", "ngram")


def speculation(args) -> Speculation:
    mode = (args.speculative or "").lower()
    if mode in SPECULATIVE_REFUSED:
        raise SystemExit(f"SPECULATIVE={mode} is refused for ENGINE=llmapi: {SPECULATIVE_REFUSED[mode]}")
    if mode and mode not in SPECULATIVE_MODES:
        raise SystemExit(f"SPECULATIVE={mode} is none of {sorted(SPECULATIVE_MODES)} (ENGINE=llmapi)")
    if args.max_draft_len < 1 and mode:
        raise SystemExit(f"SPECULATIVE={mode} needs MAX_DRAFT_LEN >= 1 (got {args.max_draft_len})")
    draft = None
    if mode == "eagle3":
        if not args.eagle_dir:
            raise SystemExit("SPECULATIVE=eagle3 needs EAGLE_DIR=<an EAGLE-3 draft head for this model> (HF folder "
                             "with config.json)")
        draft = args.eagle_dir
    elif args.eagle_dir:
        raise SystemExit(f"EAGLE_DIR={args.eagle_dir} is given but SPECULATIVE={mode or '(none)'}: say "
                         "SPECULATIVE=eagle3")
    if mode == "draft_target":
        if not args.draft_hf_model:
            raise SystemExit("SPECULATIVE=draft_target needs DRAFT_HF_MODEL=<a small Llama 3 HF checkpoint>")
        draft = args.draft_hf_model
    elif args.draft_hf_model:
        if mode:
            raise SystemExit(f"DRAFT_HF_MODEL is for SPECULATIVE=draft_target, not {mode}")
        mode, draft = "draft_target", args.draft_hf_model  # as ENGINE=trtllm: a draft model means draft-target
    if args.draft_quant != "none" and mode == "draft_target":
        raise SystemExit(f"DRAFT_QUANT={args.draft_quant}: ENGINE=llmapi serves the draft from its own HF folder "
                         "(DraftTargetDecodingConfig.speculative_model_dir); DRAFT_QUANT=none")
    if draft is not None and not (Path(draft) / "config.json").is_file():
        raise SystemExit(f"{'EAGLE_DIR' if mode == 'eagle3' else 'DRAFT_HF_MODEL'}={draft} has no config.json: not "
                         "a Hugging Face model folder")
    return Speculation(mode, args.max_draft_len if mode else 0, Path(draft) if draft else None)


def check_combinations(spec: Speculation, pp: int, lora: bool) -> None:
    """What 1.2.x's PyTorch flow does not combine, refused by name: NVIDIA/TensorRT-LLM docs/source/features/
    feature-combination-matrix.md (read at 01edcea; at 4d942aa, llmapi-1.2.md section 8, EAGLE-3 x pipeline
    parallelism is "No" too): every speculative decoding row x Pipeline Parallelism "No"; LoRA x every speculative
    decoding row "Untested". Guided decoding x speculative decoding is "Yes" in both."""
    if spec.mode and pp > 1:
        raise SystemExit(f"SPECULATIVE={spec.mode} with PP={pp}: speculative decoding does not combine with pipeline "
                         "parallelism (TensorRT-LLM's feature-combination matrix); use TP instead")
    if lora and spec.mode:
        raise SystemExit(f"LORA_DIR with SPECULATIVE={spec.mode}: LoRA x speculative decoding is untested upstream "
                         "(TensorRT-LLM's feature-combination matrix); build one or the other")


def speculative_config(spec: Speculation, draft_path: str | None) -> dict | None:
    """model.yaml's speculative_config (DecodingBaseConfig.from_dict's input), None without speculation."""
    if not spec.mode:
        return None
    config = {"decoding_type": SPECULATIVE_MODES[spec.mode], "max_draft_len": spec.max_draft_len}
    if spec.mode == "ngram":
        # is_keep_all / is_use_oldest / is_public_pool keep NGramDecodingConfig's defaults.
        config["max_matching_ngram_size"] = NGRAM_MATCH_SIZE
    elif spec.mode == "eagle3":
        config["speculative_model_dir"] = draft_path
        config["eagle3_one_model"] = EAGLE3_ONE_MODEL
    else:
        config["speculative_model_dir"] = draft_path
    return config


def lora_config(lora_dir: Path, max_lora_rank: int) -> dict:
    """model.yaml's lora_config for LORA_DIR (LoraConfig, tensorrt_llm/lora_helper.py@037d4ba): every adapter's Hugging
    Face PEFT folder, linked into tensorrt_llm/1/lora/<name>, in task-id order (lora_dir[i - 1] is task id i, the
    order engine_build/lora.py gives them: sorted by name); the modules they target (TensorRT-LLM names, completed as
    the engine flow completes them); room for all of them on the GPU and the host."""
    from embedded_engine.peft_lora import AdapterError, adapter_dirs, adapter_modules

    try:
        modules, largest = adapter_modules(lora_dir)
        names = [path.name for path in adapter_dirs(lora_dir)]
    except AdapterError as error:
        raise SystemExit(f"LORA_DIR: {error}") from None
    if largest > max_lora_rank:
        raise SystemExit(f"LORA_DIR {lora_dir}: an adapter has rank {largest}, above --max-lora-rank {max_lora_rank}")
    return {"lora_dir": [f"{LORA_DIR}/{name}" for name in names], "lora_ckpt_source": "hf",
            "max_lora_rank": max_lora_rank, "lora_target_modules": list(modules), "max_loras": len(names),
            "max_cpu_loras": len(names)}


def llm_arguments(*, profile: Profile, tp: int, pp: int, kv_cache_dtype: str, kv_cache_fraction: float,
                  guided_decoding: str, spec: Speculation, checkpoint: str, draft: str | None,
                  max_batch_size: int | None = None, lora: dict | None = None) -> dict:
    """model.yaml's LLM() arguments (TorchLlmArgs fields, engine_build/upstream_llm_args.py), from the same profile
    as the engine flow: the engine's sizes, the C++ backend's KV-cache, scheduler and chunking parameters under their
    LLM API names. `max_batch_size` overrides the profile's (the stand-in's active requests); `lora`: lora_config."""
    args = {
        "model": checkpoint,
        "backend": "pytorch",  # as NVIDIA's model.yaml writes it
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "max_batch_size": max_batch_size or profile.max_batch_size,
        "max_num_tokens": profile.max_num_tokens,
        "max_input_len": profile.max_input_len,
        "max_seq_len": profile.max_seq_len,
        "max_beam_width": 1,
        "kv_cache_config": {
            "free_gpu_memory_fraction": kv_cache_fraction,
            "enable_block_reuse": profile.enable_kv_cache_reuse,
            "dtype": kv_cache_dtype,
        },
        "enable_chunked_prefill": profile.enable_chunked_context,
        "scheduler_config": {"capacity_scheduler_policy": profile.batch_scheduler_policy.upper()},
        # Iteration stats (get_stats) exist only with it (py_executor gates on it): the metrics read them.
        "enable_iter_perf_stats": True,
        # Every generated token streams at once, as the C++ backend streams (the BLS groups them: STREAM_INTERVAL).
        "stream_interval": 1,
    }
    if guided_decoding == "xgrammar":
        args["guided_decoding_backend"] = "xgrammar"
    config = speculative_config(spec, draft)
    if config is not None:
        args["speculative_config"] = config
    if lora is not None:
        args["lora_config"] = lora
        # LoRA x CUDA graph: "No" in TensorRT-LLM's feature-combination matrix at 4d942aa (llmapi-1.2.md section 8;
        # "Yes" only at the later 01edcea); CUDA graphs are on by default (CudaGraphConfig()), so a LoRA deployment
        # of 1.2.x turns them off.
        args["cuda_graph_config"] = None
    if spec.drafts_in_executor:
        # "Two-model based speculation ... do not support overlap scheduler" (docs features/speculative-decoding.md
        # @35dac55); the docs' NGram and DraftTarget examples pass disable_overlap_scheduler=True (@04c8822) rather
        # than rely on the automatic fallback, and so does this.
        args["disable_overlap_scheduler"] = True
    return args


@dataclass(frozen=True)
class LlmapiPlan:
    profile: Profile
    quant: str
    quant_algo: str
    kv_cache_dtype: str
    tp: int
    pp: int
    capability: tuple[int, int] | None
    capacity: Capacity
    quantization: QuantizationMemory
    target_hf: Path
    target_export: Path
    spec: Speculation

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def build_commands(self) -> list[Command]:
        """The quantize step, its own process (calibration holds the whole 16-bit model on the GPUs)."""
        kv = ["--kv-cache-dtype", self.kv_cache_dtype] if self.kv_cache_dtype != "auto" else []
        return [Command(f"target: ModelOpt {self.quant_algo} Hugging Face export (nvidia-modelopt)",
                        [sys.executable, "-m", "engine_build", "quantize", "--format", "hf", "--quantization",
                         self.quant, "--hf-model", str(self.target_hf), "--out", str(self.target_export), *kv])]

    def commands(self, repo: Path) -> list[Command]:
        from serving.tritonserver import CONTAINER_TRITONSERVER, ServerPorts, exit_timeout_s, server_command

        return [*self.build_commands(), Command(
            "serve (make serve-only)",
            server_command(repo, ServerPorts(),
                           exit_timeout=exit_timeout_s({"engine": "llmapi", "llm": "tensorrt_llm"}),
                           world_size=self.world_size, install=CONTAINER_TRITONSERVER, gpu=True,
                           llm_spawns_ranks=True))]


def _profile(args) -> Profile:
    """The GPU profile (engine_build/gpu_plan.py) with the values given on the command line."""
    return profile_with(
        args.profile, max_batch_size=args.max_batch_size, max_num_tokens=args.max_num_tokens,
        max_input_len=args.max_input_len, max_seq_len=args.max_seq_len,
        kv_cache_free_gpu_mem_fraction=args.kv_cache_fraction, batch_scheduler_policy=args.batch_scheduler_policy,
        enable_chunked_context=args.enable_chunked_context,
    )


def _capability(args) -> tuple[int, int] | None:
    """The GPU's compute capability: nvidia-smi's; GPU_ARCH= where there is no GPU (a dry run); both must agree."""
    here = gpu_compute_capability()
    given = parse_gpu_arch(args.gpu_arch) if args.gpu_arch else None
    if here is not None and given is not None and here != given:
        raise SystemExit(f"GPU_ARCH={args.gpu_arch} ({given[0]}.{given[1]}) but this machine's GPU is "
                         f"{here[0]}.{here[1]}: leave GPU_ARCH out on the GPU host")
    if here is None and given is None:
        raise SystemExit("no NVIDIA GPU here to check the quantization against: give the GPU to plan for, "
                         f"GPU_ARCH={'|'.join(GPU_ARCHITECTURES)} or a compute capability such as 8.9")
    return here or given


def plan(args) -> LlmapiPlan:
    """Everything decided from the configs and the GPU before anything runs; refusals first."""
    quant = args.quant.lower()
    if quant in QUANT_REFUSED or quant not in QUANT_SUPPORT:
        check_quantization(quant, None)
    spec = speculation(args)
    check_combinations(spec, args.pp, args.lora_dir is not None)
    capability = _capability(args)
    algo = check_quantization(quant, capability)
    if args.kv_cache_dtype == "fp8" and capability < (8, 0):
        raise SystemExit("KV_CACHE_DTYPE=fp8 needs an Ampere GPU or newer (TensorRT-LLM's quantization hardware "
                         "matrix: FP8 KV cache on Ampere, Ada, Hopper and Blackwell)")
    profile = _profile(args)
    target = ModelShape.from_hf_config(hf_config(args.hf_model, "HF_MODEL"))
    memory = planned_gpu_memory(args.gpu_mem_gb)
    weights = target.weight_bytes("awq" if quant == "awq" else "none") // (2 if quant == "fp8" else 1)
    if spec.draft_dir is not None:
        weights += ModelShape.from_hf_config(hf_config(spec.draft_dir, "the draft")).weight_bytes("none")
    capacity, quantization = fitting_memory(target, profile, memory, weights, profile.kv_cache_free_gpu_mem_fraction,
                                            args.kv_cache_dtype, args.tp, args.pp)
    return LlmapiPlan(profile=profile, quant=quant, quant_algo=algo, kv_cache_dtype=args.kv_cache_dtype, tp=args.tp,
                      pp=args.pp, capability=capability, capacity=capacity, quantization=quantization,
                      target_hf=args.hf_model, target_export=args.assets / TARGET_EXPORT, spec=spec)


def build_llmapi_repository(args, log) -> Path:
    """HF_MODEL given: the GPU build (llm: tensorrt_llm); else the stand-in on the tiny default model."""
    if not args.hf_model:
        return _build_stand_in(args, log)
    gpu_plan = plan(args)
    log(f"profile {gpu_plan.profile.name}: " + ", ".join(
        f"{key}={value}" for key, value in asdict(gpu_plan.profile).items() if key != "name"))
    log(f"quantization {gpu_plan.quant_algo}" + (f" on compute capability {gpu_plan.capability[0]}."
                                                  f"{gpu_plan.capability[1]} ({arch_name(gpu_plan.capability)})"))
    log(gpu_plan.capacity.report())
    log(gpu_plan.quantization.report())
    commands = gpu_plan.commands(args.repo.resolve())
    if args.dry_run:
        log("DRY_RUN: these are the commands a real run runs, in order:\n\n" + "\n\n".join(map(str, commands)) + "\n")
    else:
        check_llmapi_environment(log)  # before an hour of quantization, not after
        _run(gpu_plan.build_commands(), log)
    return assemble_gpu_repository(args, gpu_plan, log, built=not args.dry_run)


def assemble_gpu_repository(args, gpu_plan: LlmapiPlan, log, *, built: bool) -> Path:
    """The GPU build's repository (`llm: tensorrt_llm`), assembled and checked: its checkpoint is the quantize step's
    export, gpu_plan.target_export (built=False: a dry run's, without one). The container rehearsal assembles one
    here from the tiny model's export (tools/container_rehearsal.py)."""
    profile = gpu_plan.profile
    settings = _settings(
        args, llm=LLM_TENSORRT_LLM, target=gpu_plan.target_export, tokenizer=args.hf_model, profile=profile,
        spec=gpu_plan.spec, built=built,
        llm_args=llm_arguments(profile=profile, tp=args.tp, pp=args.pp, kv_cache_dtype=args.kv_cache_dtype,
                               kv_cache_fraction=profile.kv_cache_free_gpu_mem_fraction,
                               guided_decoding=args.guided_decoding, spec=gpu_plan.spec, checkpoint=CHECKPOINT,
                               draft=DRAFT if gpu_plan.spec.draft_dir else None, lora=_lora(args)),
        plan={"profile": asdict(profile), "quant_algo": gpu_plan.quant_algo, "kv_cache_dtype": args.kv_cache_dtype,
              "tp": args.tp, "pp": args.pp, "compute_capability": list(gpu_plan.capability),
              "capacity": gpu_plan.capacity.as_dict(),
              "quantization": {"model_gib": round(gpu_plan.quantization.model_bytes / GiB, 1),
                               "gpus": gpu_plan.quantization.gpus}})
    return _assemble_and_check(args, settings, log)


def check_llmapi_environment(log) -> None:
    """A GPU and TensorRT-LLM here, or SystemExit naming what is missing (the container: TRITON_TRTLLM_CONTAINER). A
    TensorRT-LLM other than 1.2.x is said, not refused: later containers keep the LLM API, but model.yaml was
    checked against 1.2.x's arguments."""
    from engine_build.gpu import gpu_available
    from engine_build.trtllm import TRITON_TRTLLM_CONTAINER, TRTLLM_VERSION, installed_trtllm_version

    hint = f"run it inside {TRITON_TRTLLM_CONTAINER} (TensorRT-LLM {TRTLLM_VERSION}) with --gpus all"
    if not gpu_available():
        raise SystemExit(f"ENGINE=llmapi HF_MODEL=...: no NVIDIA GPU found (nvidia-smi / torch.cuda); {hint}, or "
                         "plan it anywhere with DRY_RUN=1")
    version = installed_trtllm_version()
    if version is None:
        raise SystemExit(f"ENGINE=llmapi HF_MODEL=...: tensorrt_llm is not installed; {hint}")
    if not version.startswith(TRTLLM_VERSION.rsplit(".", 1)[0] + "."):
        log(f"tensorrt_llm {version} is installed: model.yaml is checked against {TRTLLM_VERSION}'s LLM() arguments "
            "(engine_build/upstream_llm_args.py); check-repo cannot vouch for a key this version renamed")


def _build_stand_in(args, log) -> Path:
    """The CPU build: the tiny default model's ModelOpt export behind the LLM API's surface (the stand-in)."""
    from embedded_engine.settings import DEFAULT_MAX_ACTIVE_REQUESTS
    from engine_build.assets import build_default_assets

    if args.dry_run:
        raise SystemExit("DRY_RUN=1 plans a GPU build: give HF_MODEL=<the Llama 3 checkpoint>")
    if args.quant != "awq":
        raise SystemExit(f"QUANT={args.quant}: the CPU build serves the tiny model's AWQ export (the stand-in "
                         "dequantizes W4A16_AWQ); QUANT=fp8 is for a GPU build (HF_MODEL=...)")
    spec = speculation(args)
    check_combinations(spec, args.pp, args.lora_dir is not None)
    if args.tp * args.pp != 1:
        raise SystemExit(f"TP={args.tp} PP={args.pp}: the CPU stand-in runs one process (world size 1)")
    if args.kv_cache_dtype != "auto":
        raise SystemExit(f"KV_CACHE_DTYPE={args.kv_cache_dtype} is for a GPU build (HF_MODEL=...): the CPU stand-in "
                         "keeps its cache in the model's dtype")
    paths = build_default_assets(args.assets, args.seed)
    export = tiny_modelopt_export(args.assets, log)
    profile = _profile(args)
    settings = _settings(
        args, llm=LLM_STAND_IN, target=export, tokenizer=paths["tokenizer"], profile=profile, spec=spec, built=True,
        llm_args=llm_arguments(profile=profile, tp=1, pp=1, kv_cache_dtype="auto",
                               kv_cache_fraction=profile.kv_cache_free_gpu_mem_fraction,
                               guided_decoding=args.guided_decoding, spec=spec, checkpoint=CHECKPOINT,
                               draft=DRAFT if spec.draft_dir else None,
                               # The embedded engine's concurrent sequences, unless MAX_BATCH_SIZE says otherwise.
                               max_batch_size=args.max_batch_size or DEFAULT_MAX_ACTIVE_REQUESTS, lora=_lora(args)),
        plan=None)
    return _assemble_and_check(args, settings, log)


def tiny_modelopt_export(assets: Path, log) -> Path:
    """build/assets/tiny-target-modelopt-hf: the tiny target's ModelOpt W4A16_AWQ Hugging Face export, remade when
    the tiny model or quantize.py changed (its stamp records their digests). Its own process, as every calibration."""
    import hashlib

    source = assets / "tiny-target-hf"
    out = assets / TINY_EXPORT
    stamp = assets / f"{TINY_EXPORT}.json"
    digest = hashlib.sha256((source / "model.safetensors").read_bytes()
                            + (Path(__file__).parent / "quantize.py").read_bytes()).hexdigest()[:16]
    if stamp.is_file() and json.loads(stamp.read_text()).get("fingerprint") == digest and out.is_dir():
        log(f"{out} is up to date")
        return out
    _run([Command("tiny target: ModelOpt W4A16_AWQ Hugging Face export (the stand-in's checkpoint)",
                  [sys.executable, "-m", "engine_build", "quantize", "--format", "hf", "--quantization", "awq",
                   "--hf-model", str(source), "--out", str(out)])], log)
    stamp.write_text(json.dumps({"fingerprint": digest}) + "\n")
    return out


CHECKPOINT = "checkpoint"  # tensorrt_llm/1/checkpoint: the ModelOpt export
DRAFT = "draft"  # tensorrt_llm/1/draft: the EAGLE-3 head or the draft model
LORA_DIR = "lora"  # tensorrt_llm/1/lora/<name>: the PEFT adapters of LORA_DIR


def _lora(args) -> dict | None:
    return lora_config(args.lora_dir, args.max_lora_rank) if args.lora_dir is not None else None


def _triton_sizes(llm: str, llm_args: dict) -> dict:
    """Triton's max_batch_size of tensorrt_llm and the text models, and tensorrt_llm's queue. The GPU build: the LLM's
    max_batch_size for both (as the engine flow sizes them from its profile). The stand-in: the default embedded
    repository's (RepositorySettings' defaults), since it runs the same embedded engine, which queues past its active
    sequences (EngineSettings.max_queued_requests) rather than refusing a batch larger than them."""
    if llm == LLM_STAND_IN:
        return {}
    return {"triton_max_batch_size": llm_args["max_batch_size"], "max_queue_size": llm_args["max_batch_size"]}


def _settings(args, *, llm: str, target: Path, tokenizer: Path, profile: Profile, spec: Speculation, built: bool,
              llm_args: dict, plan: dict | None) -> RepositorySettings:
    return RepositorySettings(
        engine="llmapi", llm=llm, tokenizer_dir=tokenizer, target=target, speculative_model=spec.draft_dir,
        llm_args=llm_args, **_triton_sizes(llm, llm_args), max_input_len=profile.max_input_len,
        max_seq_len=profile.max_seq_len, max_draft_len=spec.max_draft_len, decoupled=args.decoupled,
        query_special_tokens=args.query_special_tokens, exclude_input_in_output=args.exclude_input_in_output,
        world_size=args.tp * args.pp, engines_built=built, guided_decoding=args.guided_decoding, plan=plan,
        # LoRA adapters are checked against the HF checkpoint (the export's config.json is the same model's).
        lora_base=args.hf_model or None, **bls_settings(args), **text_instance_settings(args), **lora_settings(args))


def _assemble_and_check(args, settings: RepositorySettings, log) -> Path:
    try:
        out = assemble_repository(args.repo, settings)
    except RepositoryError as error:
        raise SystemExit(f"make repo ENGINE=llmapi: {error}") from None
    report = check_repository(out)
    print(report.text(out), flush=True)
    if not report.ok:
        raise SystemExit(f"the repository in {out} would not load (above); fix what it names and build again")
    log(f"model repository ({settings.llm}) " + ("ready" if settings.engines_built else
                                                 "rendered and checked (no checkpoint: dry run)") + f": {out}")
    return out


def _run(commands: list[Command], log) -> None:
    for command in commands:
        log(f"+ {command}")
        returncode = subprocess.call(command.argv, env={**os.environ, **command.env}, cwd=PROJECT_ROOT)
        if returncode != 0:
            raise SystemExit(f"[{command.title}] exited with status {returncode} (its output is above); "
                             "nothing after it ran")
