"""RepositorySettings fields from `python -m engine_build` arguments that both the plain assembly (engine_build.cli)
and the TensorRT-LLM flow (engine_build.trtllm_flow) take."""

from __future__ import annotations


def bls_settings(args) -> dict:
    """The BLS's settings from the command line: --bls-instances if given (else RepositorySettings' host-sized
    default) and --stream-interval."""
    if args.stream_interval < 1:
        raise SystemExit(f"--stream-interval must be at least 1 (got {args.stream_interval})")
    settings = {"stream_interval": args.stream_interval}
    if args.bls_instances is None:
        return settings
    if args.bls_instances < 1:
        raise SystemExit(f"--bls-instances must be at least 1 (got {args.bls_instances})")
    return {**settings, "bls_instance_count": args.bls_instances}


def lora_settings(args) -> dict:
    """LoRA from the command line (make repo LORA_DIR=...): the adapters' folder and the largest rank the engine
    takes; nothing without --lora-dir."""
    if getattr(args, "lora_dir", None) is None:
        return {}
    if args.max_lora_rank < 1:
        raise SystemExit(f"--max-lora-rank must be at least 1 (got {args.max_lora_rank})")
    return {"lora_dir": args.lora_dir, "max_lora_rank": args.max_lora_rank}


def text_instance_settings(args) -> dict:
    """The ensemble's sizing from the command line, where given (else RepositorySettings' host-sized defaults):
    preprocessing's and postprocessing's instance counts and the handoff's sender threads."""
    settings = {}
    # (option, settings key, the least it may be, the most)
    for option, key, least, most in (("preprocessing_instances", "preprocessing_instance_count", 1, None),
                                     ("postprocessing_instances", "postprocessing_instance_count", 1, None),
                                     ("handoff_sender_threads", "handoff_sender_threads", 1, 256)):  # relay/backend.cc
        count = getattr(args, option)
        if count is None:
            continue
        if count < least:
            raise SystemExit(f"--{option.replace('_', '-')} must be at least {least} (got {count})")
        if most is not None and count > most:
            raise SystemExit(f"--{option.replace('_', '-')} must be at most {most} (got {count})")
        settings[key] = count
    return settings
