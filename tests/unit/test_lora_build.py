"""`make repo LORA_DIR=...`: the adapters converted into the engine's prefetch folder and recorded, the LoRA
parameters of both engines' configs, the trtllm-build flags of the GPU dry run, refusals by name, and `make
check-repo`'s checks."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine_build import cli
from engine_build.check_repo import check_repository
from engine_build.lora import convert_lora_dir
from engine_build.render import parse_model_config
from engine_build.repository import RepositoryError, RepositorySettings, assemble_repository
from engine_build.trtllm import trtllm_build_command

ASSETS = Path(__file__).resolve().parents[2] / "build" / "assets"
PEFT_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

pytestmark = pytest.mark.skipif(not (ASSETS / "tiny-target-awq" / "config.json").is_file(),
                                reason="build/assets is missing: run `make repo`")


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """Two PEFT adapters of the tiny target (rank 8 on every projection; rank 4 on q and v, layers 0-3 only)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(str(ASSETS / "tiny-target-hf"))
    root = tmp_path_factory.mktemp("adapters")
    for name, config in (("alpha", LoraConfig(r=8, lora_alpha=16, target_modules=PEFT_MODULES)),
                         ("beta", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             layers_to_transform=[0, 1, 2, 3]))):
        model = get_peft_model(copy.deepcopy(base), config)
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if "lora_B" in parameter_name:
                    parameter.normal_(std=0.1)
        model.save_pretrained(str(root / name))
    return root


@pytest.fixture(scope="module")
def repo(lora_dir, tmp_path_factory):
    return assemble_repository(tmp_path_factory.mktemp("repo") / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq",
        lora_dir=lora_dir, max_lora_rank=16))


def parameters(repo: Path, model: str) -> dict[str, str]:
    config = parse_model_config((repo / model / "config.pbtxt").read_text(), model)
    return {key: value.string_value for key, value in config.parameters.items()}


def test_the_adapters_are_converted_into_the_prefetch_folder_and_recorded(repo, lora_dir):
    from embedded_engine.checkpoint import load_checkpoint

    converted = convert_lora_dir(lora_dir, load_checkpoint(ASSETS / "tiny-target-awq").config, 16)
    for adapter in converted:
        folder = repo / "tensorrt_llm" / "1" / "lora" / str(adapter.task_id)
        np.testing.assert_array_equal(np.load(folder / "model.lora_weights.npy"), adapter.weights)
        np.testing.assert_array_equal(np.load(folder / "model.lora_config.npy"), adapter.config)
    manifest = json.loads((repo / "repository.json").read_text())
    assert [(a["name"], a["task_id"], a["rank"], a["prefetch"]) for a in manifest["lora_adapters"]] == \
        [("alpha", 1, 8, "lora/1"), ("beta", 2, 4, "lora/2")]
    beta = np.load(repo / "tensorrt_llm" / "1" / "lora" / "2" / "model.lora_config.npy")
    assert sorted(set(beta[0, :, 1].tolist())) == [0, 1, 2, 3]  # layers_to_transform: those layers only
    assert parameters(repo, "preprocessing")["lora_adapters"] == "alpha=1,beta=2"
    engine = parameters(repo, "tensorrt_llm")
    assert engine["lora_target_modules"] == "attn_q,attn_k,attn_v,attn_dense,mlp_h_to_4h,mlp_4h_to_h,mlp_gate"
    assert engine["max_lora_rank"] == "16" and engine["lora_prefetch_dir"] == "lora"  # relative: relocatable
    assert int(engine["lora_cache_host_memory_bytes"]) >= 1 << 30
    report = check_repository(repo)
    assert report.ok, report.text(repo)


def test_a_repository_without_adapters_takes_no_lora(tmp_path):
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq"))
    engine = parameters(repo, "tensorrt_llm")
    assert engine["lora_target_modules"] == "" and engine["lora_prefetch_dir"] == ""
    assert parameters(repo, "preprocessing")["lora_adapters"] == ""
    assert json.loads((repo / "repository.json").read_text())["lora_adapters"] == []


@pytest.mark.parametrize("break_it, words", [
    (lambda repo: (repo / "tensorrt_llm" / "1" / "lora" / "2" / "model.lora_config.npy").unlink(),
     "adapter 'beta' \\(task 2\\) in lora/2: .*model.lora_config.npy is missing"),
    (lambda repo: _set_parameter(repo, "preprocessing", "lora_adapters", "alpha=2,beta=1"),
     "preprocessing's lora_adapters .* differ from"),
    (lambda repo: _set_parameter(repo, "tensorrt_llm", "lora_target_modules", "attn_q,attn_k,attn_v"),
     "adapter 'alpha' .* modules \\['attn_dense', .* are not in the engine's lora_target_modules"),
    (lambda repo: _set_parameter(repo, "tensorrt_llm", "lora_prefetch_dir", ""), "lora_prefetch_dir is unset"),
    (lambda repo: np.save(repo / "tensorrt_llm" / "1" / "lora" / "1" / "model.lora_weights.npy",
                          np.zeros((1, 3, 4), np.float32)), "model.lora_weights.npy is float32"),
])
def test_check_repo_names_what_is_wrong_with_the_adapters(repo, tmp_path, break_it, words):
    import re

    copy_ = tmp_path / "copy"
    shutil.copytree(repo, copy_)
    break_it(copy_)
    report = check_repository(copy_)
    assert not report.ok
    assert any(re.search(words, line) for line in report.text(copy_).splitlines()), report.text(copy_)


def _set_parameter(repo: Path, model: str, key: str, value: str) -> None:
    import re

    config = repo / model / "config.pbtxt"
    config.write_text(re.sub(rf'(key: "{key}" value: {{ string_value: ")[^"]*(")', rf"\g<1>{value}\g<2>",
                             config.read_text()))


def test_an_adapter_for_another_base_is_refused_naming_it(lora_dir, tmp_path):
    # The draft is the target's architecture with fewer layers: alpha has LoRA weights in layers it lacks.
    with pytest.raises(RepositoryError, match="adapter 'alpha' layer .* the base has .* layers"):
        assemble_repository(tmp_path / "repo", RepositorySettings(
            engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-draft-awq",
            lora_dir=lora_dir))
    with pytest.raises(RepositoryError, match="adapter 'alpha': rank 8 is above max_lora_rank 4"):
        assemble_repository(tmp_path / "repo2", RepositorySettings(
            engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq",
            lora_dir=lora_dir, max_lora_rank=4))


def test_trtllm_build_gets_the_lora_plugin_modules_and_rank():
    command = trtllm_build_command(Path("ckpt"), Path("engine"), max_batch_size=8, max_input_len=64, max_seq_len=128,
                                   max_num_tokens=256, lora_target_modules=("attn_q", "attn_k", "attn_v"),
                                   max_lora_rank=16)
    text = " ".join(command)
    assert "--lora_plugin float16 --lora_target_modules attn_q attn_k attn_v --max_lora_rank 16" in text
    assert "--lora_dir" not in text  # serving-time adapters: none baked into the engine
    assert "--lora_plugin" not in " ".join(trtllm_build_command(
        Path("ckpt"), Path("engine"), max_batch_size=8, max_input_len=64, max_seq_len=128, max_num_tokens=256))


def test_the_gpu_dry_run_builds_for_the_adapters_and_prefetches_them(lora_dir, tmp_path, capsys):
    repo = tmp_path / "repo"
    cli.main(["repo", "--engine", "trtllm", "--hf-model", str(ASSETS / "tiny-target-hf"),
              "--draft-hf-model", str(ASSETS / "tiny-draft-hf"), "--repo", str(repo), "--assets", str(tmp_path / "a"),
              "--dry-run", "--gpu-mem-gb", "80", "--lora-dir", str(lora_dir)])
    out = capsys.readouterr().out
    target_build, draft_build = [line for line in out.splitlines() if line.startswith("trtllm-build")]
    assert target_build.endswith("--lora_plugin float16 --lora_target_modules attn_q attn_k attn_v attn_dense "
                                 "mlp_h_to_4h mlp_4h_to_h mlp_gate --max_lora_rank 64")
    assert "--lora" not in draft_build  # the draft serves no adapter
    assert f"quantize --hf-model {ASSETS / 'tiny-target-hf'} --out {tmp_path / 'a' / 'target-awq'} --tp 1 --pp 1 " \
           "--dtype float16" in out
    engine = parameters(repo, "tensorrt_llm")
    assert engine["lora_prefetch_dir"] == str(repo.resolve() / "tensorrt_llm" / "1" / "lora")
    assert engine["lora_cache_optimal_adapter_size"] == "8" and engine["lora_cache_max_adapter_size"] == "64"
    assert engine["lora_cache_gpu_memory_fraction"] == "${lora_cache_gpu_memory_fraction}"  # the backend's 0.05
    assert parameters(repo, "tensorrt_llm_draft")["lora_prefetch_dir"] == "${lora_prefetch_dir}"
    assert sorted(p.name for p in (repo / "tensorrt_llm" / "1" / "lora").iterdir()) == ["1", "2"]
    assert check_repository(repo).ok
    cli.main(["relocate", "--repo", str(repo), "--serve-path", "/models/llama3"])
    assert parameters(repo, "tensorrt_llm")["lora_prefetch_dir"] == "/models/llama3/tensorrt_llm/1/lora"


def test_the_gpu_dry_run_refuses_adapters_above_the_maximum_rank(lora_dir, tmp_path):
    with pytest.raises(SystemExit, match="an adapter has rank 8, above --max-lora-rank 4"):
        cli.main(["repo", "--engine", "trtllm", "--hf-model", str(ASSETS / "tiny-target-hf"), "--repo",
                  str(tmp_path / "repo"), "--dry-run", "--gpu-mem-gb", "80", "--lora-dir", str(lora_dir),
                  "--max-lora-rank", "4"])


def test_convert_lora_writes_the_files_nvidias_client_sends(lora_dir, tmp_path):
    from embedded_engine.lora import LoraLayout
    from embedded_engine.peft_lora import convert_peft_adapter
    from engine_build.lora import base_llama_config

    cli.main(["convert-lora", "--adapter", str(lora_dir / "beta"), "--base", str(ASSETS / "tiny-target-awq"),
              "--task-id", "9", "--out", str(tmp_path / "beta")])
    layout = LoraLayout.from_config(base_llama_config(ASSETS / "tiny-target-awq"), ("attn_q", "attn_k", "attn_v"), 64)
    expected = convert_peft_adapter(lora_dir / "beta", 9, layout)
    np.testing.assert_array_equal(np.load(tmp_path / "beta" / "model.lora_weights.npy"), expected.weights)
    np.testing.assert_array_equal(np.load(tmp_path / "beta" / "model.lora_config.npy"), expected.config)
    with pytest.raises(SystemExit, match="task ids start at 1"):
        cli.main(["convert-lora", "--adapter", str(lora_dir / "beta"), "--base", str(ASSETS / "tiny-target-awq"),
                  "--task-id", "0", "--out", str(tmp_path / "zero")])


def test_convert_lora_against_a_running_repository_refuses_what_its_engine_cannot_take(lora_dir, tmp_path):
    only_beta = tmp_path / "adapters"
    shutil.copytree(lora_dir / "beta", only_beta / "beta")
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq",
        lora_dir=only_beta))  # an engine built for attn_q, attn_k, attn_v
    with pytest.raises(SystemExit, match="adapter 'alpha': targets attn_dense, mlp_h_to_4h, mlp_4h_to_h, mlp_gate, "
                                         "which the engine is not built for"):
        cli.main(["convert-lora", "--adapter", str(lora_dir / "alpha"), "--repo", str(repo), "--task-id", "5",
                  "--out", str(tmp_path / "alpha")])
    with pytest.raises(SystemExit, match="--task-id 1 is the repository's adapter 'beta'"):
        cli.main(["convert-lora", "--adapter", str(lora_dir / "beta"), "--repo", str(repo), "--task-id", "1",
                  "--out", str(tmp_path / "beta")])
    cli.main(["convert-lora", "--adapter", str(lora_dir / "beta"), "--repo", str(repo), "--task-id", "5",
              "--out", str(tmp_path / "beta")])
    assert np.load(tmp_path / "beta" / "model.lora_config.npy")[0, :, 0].tolist()[:3] == [1, 2, 3]
