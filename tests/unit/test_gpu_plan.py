"""The GPU engine's plan: profiles, the capacity check (against hand-computed numbers), and the dry run of
`make repo ENGINE=trtllm DRY_RUN=1` on the tiny HF checkpoint, which must call nothing that needs a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_build import cli, trtllm
from engine_build.gpu_plan import (
    PROFILES,
    Capacity,
    GiB,
    ModelShape,
    QuantizationMemory,
    check_fp8_kv_cache,
    profile_with,
)
from engine_build.render import parse_model_config

ASSETS = Path(__file__).resolve().parents[2] / "build" / "assets"

LLAMA3_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
LLAMA3_70B = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False}


def test_llama3_8b_awq_on_one_80_gib_gpu():
    shape = ModelShape.from_hf_config(LLAMA3_8B)
    # By hand: 32 layers x (q,o 2*4096*4096 + k,v 2*4096*1024 + mlp 3*4096*14336) = 6,979,321,856 linear
    # parameters at 4 bits plus one fp16 scale per 128, and 2 x 128256 x 4096 embedding/lm_head at 16 bits.
    assert shape.linear_params() == 6_979_321_856
    assert shape.weight_bytes("awq") == 3_489_660_928 + 109_051_904 + 2_101_346_304 == 5_700_059_136
    assert shape.kv_bytes_per_token("auto", tp_size=1) == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB
    capacity = Capacity(gpu_memory_bytes=80 * GiB, gpus=1, weight_bytes=5_700_059_136, kv_cache_fraction=0.9,
                        kv_bytes_per_token=131_072, max_seq_len=4096, max_batch_size=256)
    # (80 GiB - 5.31 GiB) x 0.9 = 72,179,358,105 bytes = 550,684 tokens = 134 sequences of 4,096.
    assert (capacity.kv_cache_bytes_per_gpu, capacity.kv_cache_tokens) == (72_179_358_105, 550_684)
    assert capacity.full_length_sequences == 134 and not capacity.batch_fits
    assert "WARNING: max_batch_size 256 cannot be met at full length: only 134" in capacity.report()
    # An FP8 KV cache halves the bytes per token: twice the sequences.
    assert shape.kv_bytes_per_token("fp8", tp_size=1) == 65_536
    fp8 = Capacity(80 * GiB, 1, 5_700_059_136, 0.9, 65_536, 4096, 256)
    assert (fp8.kv_cache_tokens, fp8.full_length_sequences) == (1_101_369, 268) and fp8.batch_fits


def test_llama3_70b_awq_on_four_80_gib_gpus():
    shape = ModelShape.from_hf_config(LLAMA3_70B)
    assert shape.linear_params() == 68_451_041_280
    assert shape.weight_bytes("awq") == 39_497_760_768  # 36.8 GiB over 4 GPUs
    # 8 KV heads over TP 4: 2 per rank, 2 x 80 layers x 2 heads x 128 x 2 bytes.
    assert shape.kv_bytes_per_token("auto", tp_size=4) == 81_920
    assert shape.kv_bytes_per_token("auto", tp_size=16) == 2 * 80 * 1 * 128 * 2  # at least one head per rank
    capacity = Capacity(80 * GiB, 4, 39_497_760_768, 0.9, 81_920, 4096, 256)
    assert (capacity.kv_cache_tokens, capacity.full_length_sequences) == (835_234, 203)


def test_quantization_memory_spreads_over_the_visible_gpus():
    """AWQ calibration holds the bf16 HF model: 70B is 2 x (68,451,041,280 + 2 x 128,256 x 8,192) = 141.1 GB, which no
    80 GiB GPU holds alone (85 % of it, 68 GiB, for weights); across two or four it fits, as upstream spreads it."""
    seventy = ModelShape.from_hf_config({**LLAMA3_70B, "torch_dtype": "bfloat16"})
    assert seventy.checkpoint_bytes() == 2 * (68_451_041_280 + 2 * 128_256 * 8192) == 141_104_775_168
    one = QuantizationMemory(seventy.checkpoint_bytes(), gpus=1, gpu_memory_bytes=80 * GiB)
    assert not one.fits and one.gpus_needed == 2
    assert "does NOT fit; it needs 2 such GPUs visible to the quantize step" in one.report()
    assert QuantizationMemory(seventy.checkpoint_bytes(), gpus=2, gpu_memory_bytes=80 * GiB).fits
    assert QuantizationMemory(seventy.checkpoint_bytes(), gpus=4, gpu_memory_bytes=80 * GiB).fits
    eight = ModelShape.from_hf_config(LLAMA3_8B)  # 16.1 GB of bf16: one GPU
    assert QuantizationMemory(eight.checkpoint_bytes(), gpus=1, gpu_memory_bytes=80 * GiB).fits
    assert ModelShape.from_hf_config({**LLAMA3_8B, "torch_dtype": "float32"}).checkpoint_bytes() == \
        2 * eight.checkpoint_bytes()


def test_a_dry_run_says_before_starting_what_quantization_needs(tmp_path, no_gpu_work, monkeypatch):
    from engine_build import gpu_plan

    monkeypatch.setattr(gpu_plan, "visible_gpu_count", lambda: None)  # none here: the plan uses TP x PP
    hf = tmp_path / "llama3-70b"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({**LLAMA3_70B, "torch_dtype": "bfloat16"}))
    with pytest.raises(SystemExit, match=r"131.4 GiB of 16-bit weights .* 1 GPU\(s\) x 80.0 GiB .* does NOT fit; it "
                                         r"needs 2 such GPUs"):
        cli.main(["repo", "--engine", "trtllm", "--hf-model", str(hf), "--repo", str(tmp_path / "repo"),
                  "--assets", str(tmp_path / "a"), "--dry-run", "--gpu-mem-gb", "80"])


def test_profiles_and_single_overrides():
    throughput, latency = PROFILES["throughput"], PROFILES["latency"]
    assert (throughput.max_batch_size, throughput.max_num_tokens, throughput.enable_chunked_context) == \
        (256, 8192, True)
    assert throughput.kv_cache_free_gpu_mem_fraction == 0.9 and throughput.enable_kv_cache_reuse
    assert throughput.batch_scheduler_policy == "guaranteed_no_evict"
    assert latency.max_batch_size == 8
    assert profile_with("throughput", max_batch_size=128).max_batch_size == 128
    assert profile_with("throughput", max_batch_size=None).max_batch_size == 256
    with pytest.raises(SystemExit, match="not a profile"):
        profile_with("fastest")
    with pytest.raises(SystemExit, match="needs chunked context"):
        profile_with("throughput", max_num_tokens=1024, enable_chunked_context=False)


def test_fp8_kv_cache_needs_ada_or_hopper():
    assert check_fp8_kv_cache((9, 0)) is None and check_fp8_kv_cache((8, 9)) is None
    problem = check_fp8_kv_cache((8, 0))  # A100
    assert problem and "compute capability 8.9" in problem and "8.0" in problem


@pytest.fixture
def no_gpu_work(monkeypatch):
    """Anything that would need a GPU or TensorRT-LLM fails the test if called."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a dry run called a GPU stage")

    from engine_build import quantize

    for module, name in ((trtllm, "run_trtllm_build"), (trtllm, "check_gpu_stage_environment"),
                         (trtllm, "copy_engine"), (quantize, "quantize_awq"), (quantize, "export_unquantized")):
        monkeypatch.setattr(module, name, forbidden)


@pytest.mark.parametrize("profile, batch, exclude_input", [("throughput", 256, False), ("latency", 8, True)])
def test_dry_run_renders_every_config_and_prints_the_commands(tmp_path, capsys, no_gpu_work, profile, batch,
                                                              exclude_input):
    if not (ASSETS / "tiny-target-hf" / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    repo = tmp_path / "repo"
    cli.main(["repo", "--engine", "trtllm", "--hf-model", str(ASSETS / "tiny-target-hf"),
              "--draft-hf-model", str(ASSETS / "tiny-draft-hf"), "--repo", str(repo), "--assets", str(tmp_path / "a"),
              "--dry-run", "--gpu-mem-gb", "80", "--tp", "2", "--profile", profile,
              *([] if exclude_input else ["--no-exclude-input-in-output"])])
    out = capsys.readouterr().out
    assert f"--max_batch_size {batch} " in out and "--max_num_tokens 8192" in out
    assert out.count("trtllm-build --checkpoint_dir") == 2
    assert "--speculative_decoding_mode draft_tokens_external --max_draft_len 8" in out  # the target only
    assert "TRTLLM_ORCHESTRATOR=1" in out and "/opt/tritonserver/bin/tritonserver" in out
    assert "capacity check: 2 GPU(s) x 80.0 GiB" in out
    for model in ("preprocessing", "postprocessing", "ensemble", "tensorrt_llm_bls", "tensorrt_llm",
                  "tensorrt_llm_draft"):
        config = parse_model_config((repo / model / "config.pbtxt").read_text(), model)
        if model.startswith("tensorrt_llm") and model != "tensorrt_llm_bls":
            parameters = {key: value.string_value for key, value in config.parameters.items()}
            assert config.backend == "tensorrtllm" and config.max_batch_size == batch
            assert parameters["enable_chunked_context"] == "true" and parameters["enable_kv_cache_reuse"] == "true"
            assert parameters["gpu_device_ids"] == "0,1"  # orchestrator mode: both models on the TP group
            assert parameters["exclude_input_in_output"] == str(exclude_input).lower()
    # The Python BLS (behind the relay where g++ is here) follows the engine's default, as upstream's BLS does.
    bls = "tensorrt_llm_bls_python" if (repo / "tensorrt_llm_bls_python").is_dir() else "tensorrt_llm_bls"
    bls_config = parse_model_config((repo / bls / "config.pbtxt").read_text(), bls)
    assert bls_config.parameters["exclude_input_in_output"].string_value == str(exclude_input).lower()
    draft = parse_model_config((repo / "tensorrt_llm_draft" / "config.pbtxt").read_text(), "draft")
    manifest = json.loads((repo / "repository.json").read_text())
    assert manifest["engines_built"] is False and manifest["plan"]["profile"]["name"] == profile
    assert int(draft.parameters["max_tokens_in_paged_kv_cache"].string_value) == \
        manifest["plan"]["capacity"]["kv_cache_tokens"]


def test_dry_run_without_a_gpu_asks_for_its_memory(tmp_path, no_gpu_work, monkeypatch):
    if not (ASSETS / "tiny-target-hf" / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    from engine_build import gpu_plan

    monkeypatch.setattr(gpu_plan, "gpu_memory_bytes", lambda: None)
    with pytest.raises(SystemExit, match="GPU_MEM_GB"):
        cli.main(["repo", "--engine", "trtllm", "--hf-model", str(ASSETS / "tiny-target-hf"),
                  "--repo", str(tmp_path / "repo"), "--dry-run"])
