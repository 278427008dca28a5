"""`make repo ENGINE=trtllm`: plan the engine, then quantize, build and assemble; or, with DRY_RUN=1, only
plan: read the HF config, size the engine and its KV cache, render and validate every config into the
repository folder, and print the exact commands a real run would run. A dry run calls nothing that needs
a GPU, so it works on any machine (give the GPU memory to plan for as GPU_MEM_GB= where there is no GPU).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine_build.check_repo import check_repository
from engine_build.gpu_plan import (
    DRAFT_KV_FRACTION,
    TARGET_KV_FRACTION_WITH_DRAFT,
    Capacity,
    GiB,
    ModelShape,
    Profile,
    QuantizationMemory,
    check_fp8_kv_cache,
    fitting_memory,
    gpu_compute_capability,
    planned_gpu_memory,
    profile_with,
)
from engine_build.repository import RepositorySettings, assemble_repository
from engine_build.settings_args import bls_settings, lora_settings, text_instance_settings
from engine_build.trtllm import trtllm_build_command

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Command:
    """One step of the plan, as a command line (what `python -m engine_build` or the container runs)."""

    title: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        env = " ".join(f"{key}={value}" for key, value in self.env.items())
        return f"# {self.title}\n" + (env + " " if env else "") + shlex.join(self.argv)


@dataclass(frozen=True)
class GpuPlan:
    profile: Profile
    kv_cache_dtype: str
    tp: int
    pp: int
    target_hf: Path
    draft_hf: Path | None
    draft_quant: str
    max_draft_len: int
    capacity: Capacity
    quantization: QuantizationMemory
    target_checkpoint: Path
    target_engine: Path
    draft_checkpoint: Path | None
    draft_engine: Path | None
    # LoRA (LORA_DIR): the target engine's --lora_target_modules and --max_lora_rank (engine_build/lora.py).
    lora_target_modules: tuple[str, ...] = ()
    max_lora_rank: int = 0

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def engine_builds(self) -> list[tuple[str, Path, Path, int]]:
        """(role, checkpoint, engine dir, max_draft_len) of each trtllm-build; draft-capable only with a draft."""
        builds = [("target", self.target_checkpoint, self.target_engine, self.max_draft_len if self.draft_hf else 0)]
        if self.draft_hf is not None:
            builds.append(("draft", self.draft_checkpoint, self.draft_engine, 0))
        return builds

    def build_options(self, max_draft_len: int, lora: bool = False) -> dict:
        profile = self.profile
        return dict(max_batch_size=profile.max_batch_size, max_input_len=profile.max_input_len,
                    max_seq_len=profile.max_seq_len, max_num_tokens=profile.max_num_tokens,
                    max_draft_len=max_draft_len, workers=self.world_size,
                    **(dict(lora_target_modules=self.lora_target_modules, max_lora_rank=self.max_lora_rank)
                       if lora and self.lora_target_modules else {}))

    def build_commands(self) -> list[Command]:
        """Quantization and trtllm-build, in order: what a real run runs, each its own process."""
        python = [sys.executable, "-m", "engine_build"]
        ranks = ["--tp", str(self.tp), "--pp", str(self.pp)]
        kv = ["--kv-cache-dtype", self.kv_cache_dtype] if self.kv_cache_dtype != "auto" else []
        # A LoRA engine is float16: the runtime takes lora_weights in the engine's dtype only (engine_build/trtllm.py).
        lora_dtype = ["--dtype", "float16"] if self.lora_target_modules else []
        steps = [Command("target: AWQ int4 (group 128) TensorRT-LLM checkpoint (nvidia-modelopt)",
                         [*python, "quantize", "--hf-model", str(self.target_hf), "--out", str(self.target_checkpoint),
                          *ranks, *kv, *lora_dtype])]
        if self.draft_hf is not None:
            steps.append(Command(f"draft: {'unquantized' if self.draft_quant == 'none' else 'AWQ int4'} checkpoint",
                                 [*python, "quantize", "--hf-model", str(self.draft_hf), "--out",
                                  str(self.draft_checkpoint), "--quantization", self.draft_quant, *ranks, *kv]))
        for role, checkpoint, engine, draft_len in self.engine_builds():
            steps.append(Command(f"{role}: trtllm-build",
                                 trtllm_build_command(checkpoint, engine,
                                                      **self.build_options(draft_len, lora=role == "target"))))
        return steps

    def commands(self, repo: Path) -> list[Command]:
        """The build commands, then how `make serve-only` serves the result: what a dry run prints."""
        from serving.tritonserver import (
            CONTAINER_TRITONSERVER,
            ORCHESTRATOR_ENVIRONMENT,
            ServerPorts,
            exit_timeout_s,
            server_command,
        )

        orchestrator = self.draft_hf is not None
        engines = ("tensorrt_llm", "tensorrt_llm_draft") if orchestrator else ("tensorrt_llm",)
        return [*self.build_commands(), Command(
            "serve (make serve)" + (": orchestrator mode, target and draft" if orchestrator else ""),
            server_command(repo, ServerPorts(), exit_timeout=exit_timeout_s({"engine": "trtllm"}),
                           world_size=self.world_size, engine_model_names=engines,
                           orchestrator=orchestrator, install=CONTAINER_TRITONSERVER, gpu=True),
            dict(ORCHESTRATOR_ENVIRONMENT) if orchestrator else {})]

    def repository_settings(self, tokenizer: Path, args) -> RepositorySettings:
        profile = self.profile
        return RepositorySettings(
            engine="trtllm", tokenizer_dir=tokenizer, target=self.target_engine, draft=self.draft_engine,
            # Triton's side follows the engine's: a batch of requests goes to the backend at once, and one more
            # engine batch may wait in Triton's queue before it answers "queue full".
            triton_max_batch_size=profile.max_batch_size, max_queue_size=profile.max_batch_size,
            max_queue_delay_microseconds=profile.max_queue_delay_microseconds,
            max_input_len=profile.max_input_len, max_seq_len=profile.max_seq_len, max_draft_len=self.max_draft_len,
            decoupled=args.decoupled, query_special_tokens=args.query_special_tokens, world_size=self.world_size,
            exclude_input_in_output=args.exclude_input_in_output,
            batch_scheduler_policy=profile.batch_scheduler_policy,
            enable_chunked_context=profile.enable_chunked_context,
            enable_kv_cache_reuse=profile.enable_kv_cache_reuse or self.draft_hf is not None,
            target_kv_cache_fraction=profile.kv_cache_free_gpu_mem_fraction,
            target_kv_cache_fraction_with_draft=TARGET_KV_FRACTION_WITH_DRAFT,
            draft_kv_cache_fraction=DRAFT_KV_FRACTION,
            draft_max_kv_tokens=self.capacity.kv_cache_tokens if self.draft_hf else None,
            engines_built=not args.dry_run, serve_path=args.serve_path, guided_decoding=args.guided_decoding,
            **bls_settings(args), **text_instance_settings(args), **lora_settings(args), lora_base=self.target_hf,
            plan={"profile": asdict(profile), "kv_cache_dtype": self.kv_cache_dtype, "tp": self.tp, "pp": self.pp,
                  "draft_quant": self.draft_quant if self.draft_hf else None, "capacity": self.capacity.as_dict(),
                  "quantization": {"model_gib": round(self.quantization.model_bytes / GiB, 1),
                                   "gpus": self.quantization.gpus}},
        )


def hf_config(path: Path, role: str) -> dict:
    config = Path(path) / "config.json"
    if not config.is_file():
        raise SystemExit(f"{role} {path} has no config.json: not a Hugging Face checkpoint")
    return json.loads(config.read_text())


def plan(args) -> GpuPlan:
    """Everything decided from the configs and the GPU's size, before anything runs."""
    profile = profile_with(
        args.profile, max_batch_size=args.max_batch_size, max_num_tokens=args.max_num_tokens,
        max_input_len=args.max_input_len, max_seq_len=args.max_seq_len,
        kv_cache_free_gpu_mem_fraction=args.kv_cache_fraction, batch_scheduler_policy=args.batch_scheduler_policy,
        enable_chunked_context=args.enable_chunked_context,
    )
    target = ModelShape.from_hf_config(hf_config(args.hf_model, "HF_MODEL"))
    draft = (ModelShape.from_hf_config(hf_config(args.draft_hf_model, "DRAFT_HF_MODEL"))
             if args.draft_hf_model else None)

    memory = planned_gpu_memory(args.gpu_mem_gb)
    if args.kv_cache_dtype == "fp8":
        capability = gpu_compute_capability()
        problem = check_fp8_kv_cache(capability)
        if problem:
            raise SystemExit(problem)
        if capability is None:
            print("[plan] KV_CACHE_DTYPE=fp8: no GPU here to check; it needs compute capability 8.9+ (Ada, Hopper)",
                  file=sys.stderr)

    weights = target.weight_bytes("awq")
    if draft is not None:
        weights += draft.weight_bytes(args.draft_quant)
    fraction = TARGET_KV_FRACTION_WITH_DRAFT if draft else profile.kv_cache_free_gpu_mem_fraction
    capacity, quantization = fitting_memory(target, profile, memory, weights, fraction, args.kv_cache_dtype, args.tp,
                                            args.pp)
    lora_modules, largest_rank = (), 0
    if args.lora_dir is not None:
        from embedded_engine.peft_lora import AdapterError, adapter_modules

        try:
            lora_modules, largest_rank = adapter_modules(args.lora_dir)
        except AdapterError as error:
            raise SystemExit(f"LORA_DIR: {error}") from None
        if largest_rank > args.max_lora_rank:
            raise SystemExit(f"LORA_DIR {args.lora_dir}: an adapter has rank {largest_rank}, above --max-lora-rank "
                             f"{args.max_lora_rank}")
    assets = args.assets
    return GpuPlan(
        profile=profile, kv_cache_dtype=args.kv_cache_dtype, tp=args.tp, pp=args.pp, target_hf=args.hf_model,
        draft_hf=args.draft_hf_model, draft_quant=args.draft_quant, max_draft_len=args.max_draft_len,
        capacity=capacity, quantization=quantization, target_checkpoint=assets / "target-awq",
        target_engine=assets / "target-engine",
        draft_checkpoint=assets / "draft-checkpoint" if draft else None,
        draft_engine=assets / "draft-engine" if draft else None,
        lora_target_modules=lora_modules, max_lora_rank=args.max_lora_rank if lora_modules else 0,
    )


def build_trtllm_repository(args, log) -> Path:
    gpu_plan = plan(args)
    log(f"profile {gpu_plan.profile.name}: " + ", ".join(
        f"{key}={value}" for key, value in asdict(gpu_plan.profile).items() if key != "name"))
    log(gpu_plan.capacity.report())
    log(gpu_plan.quantization.report())
    commands = gpu_plan.commands(args.repo.resolve())
    if args.dry_run:
        log("DRY_RUN: these are the commands a real run runs, in order:\n\n" + "\n\n".join(map(str, commands)) + "\n")
    else:
        _run(gpu_plan, log)
    out = assemble_repository(args.repo, gpu_plan.repository_settings(args.hf_model, args))
    report = check_repository(out)
    print(report.text(out), flush=True)
    if not report.ok:
        raise SystemExit(f"the repository in {out} would not load (above); fix what it names and build again")
    log(f"model repository {'rendered and checked (no engines: dry run)' if args.dry_run else 'ready'}: {out}")
    return out


def _run(gpu_plan: GpuPlan, log) -> None:
    """The build commands, each its own process, exactly as a dry run prints them: the calibration model's GPU memory
    is freed when its process exits, before trtllm-build starts (tens of GB a GPU for 70B; upstream's examples run
    them as separate commands too). `python -m engine_build` runs from this checkout, as make runs it."""
    from engine_build.trtllm import check_gpu_stage_environment

    check_gpu_stage_environment()  # before an hour of quantization, not after
    for command in gpu_plan.build_commands():
        log(f"+ {shlex.join(command.argv)}")
        returncode = subprocess.call(command.argv, env={**os.environ, **command.env}, cwd=PROJECT_ROOT)
        if returncode != 0:
            raise SystemExit(f"[{command.title}] exited with status {returncode} (its output is above); "
                             "nothing after it ran")
