"""`python -m engine_build`: HF checkpoint -> AWQ checkpoint -> engine -> Triton model repository.

Stages (each runnable alone):
  assets     the real Llama 3 tokenizer and the tiny default target/draft models (CPU, ~1 min)
  quantize   HF checkpoint -> AWQ int4 (group 128) TensorRT-LLM checkpoint with nvidia-modelopt
  build      trtllm-build (GPU, TensorRT-LLM 1.2.x)
  assemble   engines/checkpoints + rendered configs -> model repository
  repo       all of the above, as `make repo` runs them
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from engine_build.assets import build_default_assets, stage
from engine_build.gpu_plan import PROFILES, Profile, profile_with
from engine_build.render import parse_model_config
from engine_build.repository import RepositorySettings, assemble_repository, read_manifest
from engine_build.settings_args import bls_settings, lora_settings, text_instance_settings
from engine_build.trtllm_flow import build_trtllm_repository

# The tensorrt_llm parameters that hold absolute paths into the repository (where it is served).
RELOCATED_PARAMETERS = ("gpt_model_path", "xgrammar_tokenizer_info_path", "lora_prefetch_dir")


def cmd_assets(args) -> None:
    build_default_assets(args.out, args.seed)


def cmd_quantize(args) -> None:
    from engine_build.quantize import export_unquantized, quantize_awq, quantize_modelopt_hf

    calib = args.calib.read_text().split("\n\n") if args.calib else None
    if args.format == "hf":  # ENGINE=llmapi: ModelOpt's Hugging Face export, which TensorRT-LLM's PyTorch flow loads
        if args.quantization == "none":
            raise SystemExit("--format hf --quantization none: an unquantized model is served from its own HF folder")
        if (args.tp, args.pp) != (1, 1) or args.dtype != "auto":
            raise SystemExit("--format hf takes no --tp/--pp/--dtype: the Hugging Face export is one folder, in the "
                             "checkpoint's dtype, that TensorRT-LLM's LLM shards at load (model.yaml's sizes)")
        quantize_modelopt_hf(args.hf_model, args.out, args.quantization, calib_texts=calib,
                             kv_cache_dtype=args.kv_cache_dtype)
        return
    if args.quantization == "fp8":
        raise SystemExit("--quantization fp8 is for --format hf (ENGINE=llmapi); the engine flow's checkpoint is AWQ")
    if args.quantization == "none":
        export_unquantized(args.hf_model, args.out, tp_size=args.tp, pp_size=args.pp)
        return
    quantize_awq(args.hf_model, args.out, calib_texts=calib, tp_size=args.tp, pp_size=args.pp,
                 kv_cache_dtype=args.kv_cache_dtype, dtype=args.dtype)


def cmd_build(args) -> None:
    from engine_build.trtllm import run_trtllm_build

    profile = _profile(args)
    run_trtllm_build(
        args.checkpoint, args.out, max_batch_size=profile.max_batch_size, max_input_len=profile.max_input_len,
        max_seq_len=profile.max_seq_len, max_num_tokens=profile.max_num_tokens, max_draft_len=args.max_draft_len,
        workers=args.tp * args.pp,
    )


def cmd_assemble(args) -> None:
    if args.engine == "llmapi":
        raise SystemExit("--engine llmapi is assembled by `repo` (engine_build/llmapi_flow.py): it writes model.yaml")
    profile = _profile(args)
    settings = RepositorySettings(
        engine=args.engine, tokenizer_dir=args.tokenizer, target=args.target, draft=args.draft,
        synthetic=args.synthetic, max_input_len=profile.max_input_len, max_seq_len=profile.max_seq_len,
        decoupled=args.decoupled, query_special_tokens=args.query_special_tokens,
        exclude_input_in_output=args.exclude_input_in_output, world_size=args.tp * args.pp,
        max_draft_len=args.max_draft_len, guided_decoding=args.guided_decoding,
        **bls_settings(args), **text_instance_settings(args), **lora_settings(args),
    )
    out = assemble_repository(args.repo, settings)
    stage(f"model repository ready: {out}")


def cmd_repo(args) -> None:
    """What `make repo` runs: the default is the embedded engine on the tiny AWQ model."""
    assets = args.assets
    if args.engine == "embedded":
        if args.hf_model:
            tokenizer, target, draft = args.hf_model, args.hf_model, args.draft_hf_model
            if args.quantize:
                stage(f"AWQ int4 quantization of {args.hf_model} on CPU (slow for large models)")
                from engine_build.quantize import quantize_awq

                target = quantize_awq(args.hf_model, assets / "target-awq")
        else:
            paths = build_default_assets(assets, args.seed)
            tokenizer, target, draft = paths["tokenizer"], paths["target_awq"], paths["draft_awq"]
        args.tokenizer, args.target, args.draft = tokenizer, target, draft
        cmd_assemble(args)
        return

    if args.engine == "llmapi":  # TensorRT-LLM's LLM API (PyTorch backend), or its CPU stand-in without HF_MODEL
        from engine_build.llmapi_flow import build_llmapi_repository

        build_llmapi_repository(args, stage)
        return

    # ENGINE=trtllm: the GPU flow, TensorRT-LLM 1.2.x (DRY_RUN=1: the plan, the configs and the commands only).
    if not args.hf_model:
        raise SystemExit("ENGINE=trtllm needs HF_MODEL=/path/to/a Llama 3 HF checkpoint")

    build_trtllm_repository(args, stage)


def cmd_dist(args) -> None:
    """The repository as one tarball: every file checked against repository.json first, the manifest inside."""
    import tarfile

    from bls.artifact import verify_model_files

    repo = args.repo.resolve()
    manifest = read_manifest(repo)
    for model in manifest["models"]:
        if (repo / model / "1").is_dir():
            verify_model_files(repo / model / "1")
    args.out.mkdir(parents=True, exist_ok=True)
    tarball = args.out / f"{repo.name}-{manifest['engine']}-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
    stage(f"packing {repo} ({len(manifest['files'])} files) into {tarball}")
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(repo, arcname=repo.name, filter=lambda info: None if "__pycache__" in info.name else info)
    stage(f"{tarball}: unpack anywhere (or copy to a volume / object store) and serve it with tritonserver "
           f"--model-repository=<path>/{repo.name}")


def cmd_relocate(args) -> None:
    """Point a TensorRT-LLM repository's paths at where it will be served.

    TensorRT-LLM 1.2.1's C++ backend opens gpt_model_path (model_instance_state.cc checks std::filesystem::exists on
    it) and xgrammar_tokenizer_info_path as given: absolute paths, or ones relative to tritonserver's working
    directory. So a moved engine needs its configs rewritten; the Python models resolve their paths themselves.
    """
    repo = args.repo.resolve()
    serve_path = Path(args.serve_path)
    if not serve_path.is_absolute():
        raise SystemExit(f"--serve-path {serve_path} must be absolute: the C++ backend does not resolve it")
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        config = repo / model / "config.pbtxt"
        if not config.is_file() or 'backend: "tensorrtllm"' not in config.read_text():
            continue
        text = config.read_text()
        for key in RELOCATED_PARAMETERS:
            text = re.sub(rf'(key: "{key}" value: {{ string_value: ")([^"$]*/{model}/1)((?:/[^"]*)?")',
                          lambda m, target=serve_path / model / "1": f"{m.group(1)}{target}{m.group(3)}", text)
        parse_model_config(text, str(config))
        config.write_text(text)
        stage(f"{model}: {', '.join(RELOCATED_PARAMETERS)} under {serve_path / model / '1'}")


def cmd_convert_lora(args) -> None:
    """One PEFT adapter in the backend's format, for a running deployment: the two files NVIDIA's client sends
    (inflight_batcher_llm_client.py --lora-path DIR --lora-task-id N), or a prefetch folder <dir>/<task id>/."""
    from embedded_engine.lora import LoraLayout
    from embedded_engine.peft_lora import AdapterError, adapter_modules, convert_peft_adapter
    from engine_build.lora import base_llama_config
    from engine_build.repository import repository_layout

    if args.task_id < 1:
        raise SystemExit(f"--task-id {args.task_id}: task ids start at 1 (NVIDIA's client sends no lora_task_id for 0)")
    try:
        if args.repo is not None:  # the running deployment's engine: its dims, modules, max rank and task ids
            layout, taken = repository_layout(args.repo)
            if args.task_id in taken:
                raise SystemExit(f"--task-id {args.task_id} is the repository's adapter {taken[args.task_id]!r}: "
                                 f"choose another (the repository's: {sorted(taken)})")
        else:
            modules, _ = adapter_modules(args.adapter.parent, only=args.adapter)
            layout = LoraLayout.from_config(base_llama_config(args.base), modules, args.max_lora_rank)
        adapter = convert_peft_adapter(args.adapter, args.task_id, layout)
    except AdapterError as error:
        raise SystemExit(str(error)) from None
    args.out.mkdir(parents=True, exist_ok=True)
    import numpy as np

    from embedded_engine.lora import PREFETCH_CONFIG, PREFETCH_WEIGHTS

    np.save(args.out / PREFETCH_WEIGHTS, adapter.weights, allow_pickle=False)
    np.save(args.out / PREFETCH_CONFIG, adapter.config, allow_pickle=False)
    stage(f"{args.adapter.name}: rank {adapter.rank}, modules {' '.join(adapter.modules)}, "
           f"{adapter.config.shape[1]} rows -> {args.out} (send with lora_task_id {args.task_id})")


def cmd_check_repo(args) -> None:
    from engine_build.check_repo import main as check

    sys.exit(check(args.repo))


def _sizes(parser: argparse.ArgumentParser, max_draft_len: int) -> None:
    """Engine sizes: a profile (engine_build/gpu_plan.py), any value overridable alone."""
    parser.add_argument("--profile", choices=sorted(PROFILES), default="throughput",
                        help="throughput (default: many users at once) or latency (small batch, interactive)")
    for flag in ("--max-batch-size", "--max-num-tokens", "--max-input-len", "--max-seq-len"):
        parser.add_argument(flag, type=int, help="default: the profile's")
    parser.add_argument("--max-draft-len", type=int, default=max_draft_len,
                        help="draft tokens a target engine verifies per step (0: an engine without a draft)")


def _profile(args) -> Profile:
    return profile_with(args.profile, max_batch_size=args.max_batch_size, max_num_tokens=args.max_num_tokens,
                        max_input_len=args.max_input_len, max_seq_len=args.max_seq_len)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.func(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """`python -m engine_build`'s arguments (the container rehearsal parses a GPU build's with it)."""
    parser = argparse.ArgumentParser(prog="python -m engine_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("assets", help="tokenizer + tiny default models (+ their AWQ checkpoints)")
    p.add_argument("--out", type=Path, default=Path("build/assets"))
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_assets)

    p = sub.add_parser("quantize", help="HF checkpoint -> AWQ int4 (or unquantized) TensorRT-LLM checkpoint")
    p.add_argument("--hf-model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quantization", choices=("awq", "fp8", "none"), default="awq",
                   help="awq: W4A16 AWQ int4, group 128; fp8: per-tensor FP8 (--format hf only); none: unquantized")
    p.add_argument("--format", choices=("trtllm", "hf"), default="trtllm",
                   help="trtllm: TensorRT-LLM checkpoint for trtllm-build (ENGINE=trtllm); hf: ModelOpt's Hugging "
                        "Face export with hf_quant_config.json, loaded by the LLM API's PyTorch flow (ENGINE=llmapi)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                   help="fp8: FP8 KV-cache quantizers calibrated with the weights (Ada/Hopper GPUs)")
    p.add_argument("--calib", type=Path, help="calibration text file (paragraphs separated by blank lines)")
    p.add_argument("--dtype", choices=("auto", "float16", "bfloat16"), default="auto",
                   help="AWQ: the unquantized tensors' dtype (auto: the checkpoint's; float16 for a LoRA engine)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("build", help="trtllm-build (GPU)")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    _sizes(p, max_draft_len=0)  # draft-capable only when asked: such an engine needs KV reuse
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("dist", help="pack a built repository into a tarball (checked against its manifest)")
    p.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    p.add_argument("--out", type=Path, default=Path("build/dist"))
    p.set_defaults(func=cmd_dist)

    p = sub.add_parser("convert-lora", help="one PEFT adapter -> model.lora_weights.npy + model.lora_config.npy "
                                            "(TensorRT-LLM 1.2.1's LoRA format, float16)")
    p.add_argument("--adapter", type=Path, required=True, help="the PEFT adapter folder (its name is the adapter's)")
    fits = p.add_mutually_exclusive_group(required=True)
    fits.add_argument("--repo", type=Path, help="the built repository it will be sent to: checked against its engine "
                                                "(dims, LoRA modules, max rank) and its adapters' task ids")
    fits.add_argument("--base", type=Path,
                      help="the base it must fit: an HF or TensorRT-LLM checkpoint, or a built engine folder")
    p.add_argument("--task-id", type=int, required=True, help="the lora_task_id it will be sent with (not 0)")
    p.add_argument("--max-lora-rank", type=int, default=64, help="with --base: the engine's --max_lora_rank")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_convert_lora)

    p = sub.add_parser("check-repo", help="static load check of a built repository (what would fail in the container)")
    p.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    p.set_defaults(func=cmd_check_repo)

    p = sub.add_parser("relocate", help="ENGINE=trtllm: set gpt_model_path for where the repository is served")
    p.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    p.add_argument("--serve-path", required=True, help="absolute path of the repository where it is served")
    p.set_defaults(func=cmd_relocate)

    for name, func, help_text in (("assemble", cmd_assemble, "checkpoints/engines + configs -> repository"),
                                  ("repo", cmd_repo, "every stage, as `make repo`")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--engine", choices=("embedded", "trtllm", "llmapi"), default="embedded",
                       help="embedded (CPU), trtllm (TensorRT-LLM engines, C++ backend) or llmapi (TensorRT-LLM's LLM "
                            "API on the PyTorch backend; without --hf-model, its CPU stand-in)")
        p.add_argument("--repo", type=Path, default=Path("build/model_repository"))
        p.add_argument("--synthetic", action="store_true", help="embedded engine emits tokens without a model")
        p.add_argument("--decoupled", action=argparse.BooleanOptionalAction, default=True,
                       help="streaming models (Triton's decoupled transaction policy); "
                            "--no-decoupled for unary clients")
        p.add_argument("--query-special-tokens", choices=("text", "parse"), default="text",
                       help="text (default): <|...|> strings in text_input stay text; parse: a trusted front end "
                            "(Triton's OpenAI frontend) sends prompts it rendered with the chat template")
        p.add_argument("--exclude-input-in-output", action=argparse.BooleanOptionalAction, default=True,
                       help="no prompt echo for a request that does not say (the engines' parameter, which the "
                            "ensemble and the BLS follow; default as NVIDIA's Llama guide); "
                            "--no-exclude-input-in-output for token-level clients that read the prompt back")
        _sizes(p, max_draft_len=8)  # used only when a draft model is given
        p.add_argument("--guided-decoding", choices=("xgrammar", "none"), default="xgrammar",
                       help="ENGINE=trtllm: xgrammar (default) configures TensorRT-LLM's guided decoding (the "
                            "tokenizer info file beside each engine); none leaves its keys unset")
        p.add_argument("--tp", type=int, default=1)
        p.add_argument("--pp", type=int, default=1)
        p.add_argument("--lora-dir", type=Path,
                       help="LoRA: one Hugging Face PEFT adapter per subfolder, named by it (engine_build/lora.py)")
        p.add_argument("--max-lora-rank", type=int, default=64,
                       help="LoRA: the largest adapter rank the engine takes (trtllm-build's --max_lora_rank)")
        if name == "assemble":
            p.add_argument("--tokenizer", type=Path, required=True)
            p.add_argument("--target", type=Path, required=True)
            p.add_argument("--draft", type=Path)
        else:
            p.add_argument("--assets", type=Path, default=Path("build/assets"))
            p.add_argument("--hf-model", type=Path)
            p.add_argument("--draft-hf-model", type=Path)
            p.add_argument("--draft-quant", choices=("none", "awq"), default="none",
                           help="ENGINE=trtllm draft: none (default; its own bf16/fp16, in TensorRT-LLM's documented "
                                "draft-target matrix) or awq (int4, outside it)")
            p.add_argument("--quantize", action="store_true", help="embedded + HF_MODEL: serve an AWQ copy")
            p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                           help="ENGINE=trtllm: fp8 halves the KV cache (compute capability 8.9+: Ada, Hopper)")
            p.add_argument("--kv-cache-fraction", type=float, help="KV cache share of free GPU memory (profile's)")
            p.add_argument("--batch-scheduler-policy", choices=("guaranteed_no_evict", "max_utilization"))
            p.add_argument("--enable-chunked-context", action=argparse.BooleanOptionalAction, default=None)
            p.add_argument("--gpu-mem-gb", type=float, help="memory of one GPU to plan for (GiB); default: nvidia-smi")
            p.add_argument("--serve-path", type=Path, help="ENGINE=trtllm: absolute path the repository will be "
                           "served from (the C++ backend's gpt_model_path); default: where it is built")
            p.add_argument("--dry-run", action="store_true",
                           help="ENGINE=trtllm: plan, render and validate the repository, print the commands; no GPU")
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--quant", default="awq",
                           help="ENGINE=llmapi: awq (W4A16_AWQ, default; Ampere/Ada/Hopper) or fp8 (Ada/Hopper/"
                                "Blackwell), ModelOpt's Hugging Face export; anything else is refused by name")
            p.add_argument("--gpu-arch", help="ENGINE=llmapi without a GPU here (DRY_RUN): the GPU to plan for, "
                                              "ampere|ada|hopper|blackwell or a compute capability such as 8.9")
            p.add_argument("--speculative", help="ENGINE=llmapi: ngram, eagle3 (with --eagle-dir) or draft_target "
                                                 "(with --draft-hf-model); lookahead and medusa are refused")
            p.add_argument("--eagle-dir", type=Path, help="ENGINE=llmapi --speculative eagle3: the EAGLE-3 draft head")
        p.add_argument("--bls-instances", type=int,
                       help="tensorrt_llm_bls instances (default: streaming, one per 4 cores of this host, 1 to 8; "
                            "unary, one per core, 4 to 32)")
        p.add_argument("--preprocessing-instances", type=int,
                       help="preprocessing instances (default: one per 4 cores of this host, 1 to 8)")
        p.add_argument("--postprocessing-instances", type=int,
                       help="postprocessing instances: the ensemble's per-token step (default: one per 2 cores of this "
                            "host, 1 to 16)")
        p.add_argument("--handoff-sender-threads", type=int,
                       help="streaming repositories: threads re-sending the engine's responses to the ensemble "
                            "(relay/handoff.h; default: one per 4 cores of this host, 1 to 8)")
        p.add_argument("--stream-interval", type=int, default=1,
                       help="tensorrt_llm_bls: new tokens per streamed response (default 1: every token; the first "
                            "token always goes at once); larger values cost the BLS less CPU per token")
        p.set_defaults(func=func)
    return parser


if __name__ == "__main__":
    sys.exit(main())
