"""trtllm-build argv against the TensorRT-LLM 1.2.x parser, and the GPU-stage environment errors."""

from __future__ import annotations

import importlib.util

import pytest

from engine_build import trtllm
from engine_build.trtllm import (
    GpuStageError,
    copy_engine,
    run_trtllm_build,
    trtllm_build_command,
)

# Flag names of `trtllm-build` in TensorRT-LLM 1.2.x (tensorrt_llm/commands/build.py and
# plugin/plugin.py::cli_plugin_args), from shared/reference/awq-and-trtllm-build.md §3.
TRTLLM_12_BUILD_FLAGS = frozenset(
    """
    --checkpoint_dir --model_config --build_config --output_dir --max_batch_size --max_input_len
    --max_seq_len --max_decoder_seq_len --max_beam_width --max_num_tokens --opt_num_tokens
    --max_encoder_input_len --max_prompt_embedding_table_size --max_multimodal_len --kv_cache_type
    --paged_kv_cache --input_timing_cache --output_timing_cache --profiling_verbosity --strip_plan
    --weight_sparsity --weight_streaming --fast_build --workers --log_level --enable_debug_output
    --visualize_network --dry_run --monitor_memory --logits_dtype --gather_context_logits
    --gather_generation_logits --gather_all_token_logits --lora_dir --lora_ckpt_source
    --lora_target_modules --max_lora_rank --speculative_decoding_mode --max_draft_len
    --bert_attention_plugin --gpt_attention_plugin --gemm_plugin --gemm_swiglu_plugin
    --fp8_rowwise_gemm_plugin --lora_plugin --dora_plugin --moe_plugin --mamba_conv1d_plugin
    --nccl_plugin --low_latency_gemm_plugin --low_latency_gemm_swiglu_plugin --gemm_allreduce_plugin
    --context_fmha --bert_context_fmha_fp32_acc --remove_input_padding --tokens_per_block
    --use_paged_context_fmha --use_fp8_context_fmha --fuse_fp4_quant --multiple_profiles
    --paged_state --norm_quant_fusion --reduce_fusion --user_buffer --pp_reduce_scatter
    --use_fused_mlp
    """.split()
)
# Flags of 0.x tutorials that the 1.x parser rejects.
REMOVED_FLAGS = {"--max_output_len", "--use_custom_all_reduce", "--multi_block_mode", "--enable_xqa",
                 "--lookup_plugin", "--context_fmha_fp32_acc", "--auto_parallel", "--cluster_key"}

SIZES = dict(max_batch_size=4, max_input_len=3072, max_seq_len=4096, max_num_tokens=8192)


def _flags(argv: list[str]) -> dict[str, str]:
    """--flag value pairs of an argv (every flag here takes one value)."""
    assert argv[0] == "trtllm-build"
    pairs = argv[1:]
    assert len(pairs) % 2 == 0 and all(p.startswith("--") for p in pairs[::2])
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def test_target_command_uses_only_documented_flags():
    flags = _flags(trtllm_build_command("ckpt", "out", **SIZES, max_draft_len=10, workers=2))
    assert set(flags) <= TRTLLM_12_BUILD_FLAGS
    assert not set(flags) & REMOVED_FLAGS
    assert flags["--checkpoint_dir"] == "ckpt" and flags["--output_dir"] == "out"
    assert flags["--gemm_plugin"] == "auto"
    assert flags["--kv_cache_type"] == "paged"
    assert flags["--context_fmha"] == "enable" and flags["--use_paged_context_fmha"] == "enable"
    assert flags["--speculative_decoding_mode"] == "draft_tokens_external"
    assert flags["--max_draft_len"] == "10"
    assert (flags["--max_batch_size"], flags["--max_input_len"], flags["--max_seq_len"]) == ("4", "3072", "4096")
    assert flags["--max_num_tokens"] == "8192" and flags["--workers"] == "2"


def test_draft_engine_command_has_no_speculative_flags():
    flags = _flags(trtllm_build_command("ckpt", "out", **SIZES))
    assert set(flags) <= TRTLLM_12_BUILD_FLAGS
    assert "--speculative_decoding_mode" not in flags and "--max_draft_len" not in flags
    assert flags["--use_paged_context_fmha"] == "enable"  # KV-cache reuse, needed by draft-target decoding


def test_inconsistent_lengths_are_rejected():
    with pytest.raises(ValueError, match="max_input_len"):
        trtllm_build_command("c", "o", max_batch_size=1, max_input_len=4096, max_seq_len=4096, max_num_tokens=8)
    with pytest.raises(ValueError, match="max_draft_len"):
        trtllm_build_command("c", "o", **SIZES, max_draft_len=-1)


def test_build_without_gpu_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setattr(trtllm, "gpu_available", lambda: False)
    with pytest.raises(GpuStageError, match="no NVIDIA GPU") as error:
        run_trtllm_build(tmp_path, tmp_path / "out", **SIZES)
    assert trtllm.TRITON_TRTLLM_CONTAINER in str(error.value)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is installed")
def test_build_without_tensorrt_llm_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setattr(trtllm, "gpu_available", lambda: True)  # pretend a GPU: the next check must fire
    with pytest.raises(GpuStageError, match="tensorrt_llm is not installed"):
        run_trtllm_build(tmp_path, tmp_path / "out", **SIZES)


def test_copy_engine(tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    (built / "rank0.engine").write_bytes(b"\x00engine")
    (built / "config.json").write_text("{}")
    (built / "timing.cache").write_bytes(b"not for the model repository")
    copied = copy_engine(built, tmp_path / "repo" / "tensorrt_llm" / "1")
    assert sorted(p.name for p in copied) == ["config.json", "rank0.engine"]
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "rank0.engine").read_bytes() == b"\x00engine"
    with pytest.raises(GpuStageError, match="no built engine"):
        copy_engine(tmp_path / "repo" / "missing", tmp_path / "elsewhere")


def test_the_standalone_build_makes_a_draft_capable_engine_only_when_asked(monkeypatch, tmp_path):
    """A draft_tokens_external engine refuses to load without KV-cache reuse: never the default."""
    from engine_build import cli

    built = {}
    monkeypatch.setattr(trtllm, "run_trtllm_build", lambda checkpoint, out, **options: built.update(options))
    cli.main(["build", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "engine")])
    assert built["max_draft_len"] == 0
    cli.main(["build", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "engine"), "--max-draft-len", "4"])
    assert built["max_draft_len"] == 4


def test_the_export_dtype_follows_the_checkpoint():
    from engine_build.quantize import export_dtype

    assert export_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"  # Meta's Llama 3 checkpoints
    assert export_dtype({"torch_dtype": "float16"}) == "float16"
    assert export_dtype({"dtype": "bfloat16"}) == "bfloat16"  # transformers 5 writes `dtype`
    assert export_dtype({"torch_dtype": "float32"}) == "float16"  # 16-bit unquantized layers in an AWQ engine


def test_the_real_run_runs_each_build_step_in_its_own_process(monkeypatch, tmp_path):
    """Calibration and trtllm-build are separate processes, the dry run's printed commands in order, so the
    calibration model's GPU memory is gone before the build starts; serving is not a build step; a failing step
    stops the run with its title."""
    from types import SimpleNamespace

    from engine_build import trtllm_flow
    from engine_build.trtllm_flow import Command

    steps = [Command("target: quantize", ["quantize-it"]), Command("target: trtllm-build", ["build-it"], {"K": "v"}),
             Command("serve (make serve)", ["serve-it"])]
    plan = SimpleNamespace(build_commands=lambda: steps[:2], commands=lambda repo: steps)
    calls = []
    monkeypatch.setattr(trtllm, "check_gpu_stage_environment", lambda: None)
    monkeypatch.setattr(trtllm_flow.subprocess, "call",
                        lambda argv, env, cwd: calls.append((argv, env.get("K"))) or 0)
    trtllm_flow._run(plan, lambda message: None)
    assert calls == [(["quantize-it"], None), (["build-it"], "v")]

    calls.clear()
    monkeypatch.setattr(trtllm_flow.subprocess, "call", lambda argv, env, cwd: calls.append(argv) or 3)
    with pytest.raises(SystemExit, match=r"\[target: quantize\] exited with status 3"):
        trtllm_flow._run(plan, lambda message: None)
    assert calls == [["quantize-it"]]
