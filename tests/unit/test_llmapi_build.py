"""`make repo ENGINE=llmapi`, the build side: the LLM() arguments model.yaml gets (every key and value held to the
recorded 1.2.x fields, engine_build/upstream_llm_args.py), the refusals made before any work, the dry run's commands,
how an llmapi repository is launched and deployed, and `check-repo` on good and broken llmapi repositories.

The repositories here are assembled with a template of this file's own for tensorrt_llm (the placeholders the build
fills, engine_build/repository.py _write_llmapi_model), so that these tests hold the build side alone; the serving
side's template and model are tested where they live.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import yaml

from bls.contract import CONTRACTS
from engine_build import check_repo, llmapi_flow, repository
from engine_build.check_repo import check_repository
from engine_build.gpu_plan import PROFILES
from engine_build.llmapi_flow import (
    LLM_STAND_IN,
    LLM_TENSORRT_LLM,
    Speculation,
    check_combinations,
    check_quantization,
    llm_arguments,
    parse_gpu_arch,
    speculation,
)
from engine_build.llmapi_yaml import MODEL_YAML
from engine_build.repository import RepositorySettings, assemble_repository
from engine_build.topology import LLMAPI_TEMPLATE
from engine_build.upstream_llm_args import (
    NESTED,
    SPECULATIVE_DECODING_TYPES,
    TORCH_LLM_ARGS,
    llm_args_problems,
)
from serving import tritonserver
from serving.tritonserver import ServerPorts, server_command

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "build" / "assets"
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "tie_word_embeddings": False, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}
# The placeholders the build fills in tensorrt_llm's template (the interface with the serving side).
TEST_TEMPLATE = """\
name: "${model_name}"
backend: "python"
max_batch_size: ${triton_max_batch_size}
model_transaction_policy { decoupled: ${decoupled_mode} }
dynamic_batching {
  max_queue_delay_microseconds: ${max_queue_delay_microseconds}
  default_queue_policy { max_queue_size: ${max_queue_size} }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
${tensors}
parameters { key: "llm" value: { string_value: "${llm}" } }
parameters { key: "exclude_input_in_output" value: { string_value: "${exclude_input_in_output}" } }
"""


# ---- every key we write is a recorded 1.2.x field -----------------------------------------------------------------

def _spec(mode: str, draft: bool = False) -> Speculation:
    return Speculation(mode, 4 if mode else 0, Path("/d") if draft else None)


ALL_RENDERINGS = [
    dict(spec=_spec(""), kv_cache_dtype="auto", guided_decoding="xgrammar"),
    dict(spec=_spec(""), kv_cache_dtype="fp8", guided_decoding="none"),
    dict(spec=_spec("ngram"), kv_cache_dtype="auto", guided_decoding="xgrammar"),
    dict(spec=_spec("eagle3", draft=True), kv_cache_dtype="auto", guided_decoding="xgrammar"),
    dict(spec=_spec("draft_target", draft=True), kv_cache_dtype="fp8", guided_decoding="xgrammar"),
]


def _render(spec: Speculation, kv_cache_dtype: str, guided_decoding: str, tp: int = 1, pp: int = 1) -> dict:
    return llm_arguments(profile=PROFILES["throughput"], tp=tp, pp=pp, kv_cache_dtype=kv_cache_dtype,
                         kv_cache_fraction=0.9, guided_decoding=guided_decoding, spec=spec, checkpoint="checkpoint",
                         draft="draft" if spec.draft_dir else None)


@pytest.mark.parametrize("case", ALL_RENDERINGS, ids=lambda c: f"{c['spec'].mode or 'plain'}-{c['kv_cache_dtype']}")
def test_every_key_the_renderer_writes_is_a_field_of_both_read_versions(case):
    args = _render(**case)
    document = {**args, "triton_config": {"max_batch_size": 256, "decoupled": True,
                                          "cancellation_check_period_ms": 100}}
    assert llm_args_problems(document) == ([], [])  # no problem, and no key recorded in only one version
    by_name = {arg.name: arg for arg in TORCH_LLM_ARGS}
    for key, value in args.items():
        assert by_name[key].since == "A,B", key
        if isinstance(value, dict) and key in ("kv_cache_config", "scheduler_config"):
            nested = {arg.name for arg in NESTED[by_name[key].nested] if arg.since == "A,B"}
            assert set(value) <= nested, key
        if key == "speculative_config":
            _, own, refused = SPECULATIVE_DECODING_TYPES[value["decoding_type"]]
            assert refused is None


def test_the_rendering_follows_the_profile_and_the_speculation():
    plain = _render(_spec(""), "auto", "xgrammar", tp=2)
    profile = PROFILES["throughput"]
    assert (plain["max_batch_size"], plain["max_num_tokens"], plain["max_seq_len"]) == (
        profile.max_batch_size, profile.max_num_tokens, profile.max_seq_len)
    assert plain["tensor_parallel_size"] == 2 and plain["enable_chunked_prefill"] is True
    assert plain["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True, "dtype": "auto"}
    assert plain["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}
    assert plain["guided_decoding_backend"] == "xgrammar" and "speculative_config" not in plain
    assert "guided_decoding_backend" not in _render(_spec(""), "auto", "none")
    ngram = _render(_spec("ngram"), "auto", "xgrammar")
    assert ngram["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}
    assert ngram["disable_overlap_scheduler"] is True  # the executor drafts (upstream's NGram example sets it)
    eagle = _render(_spec("eagle3", True), "auto", "xgrammar")
    assert eagle["speculative_config"]["decoding_type"] == "Eagle"  # EAGLE-3 in both read versions
    assert eagle["speculative_config"]["speculative_model_dir"] == "draft"
    assert "disable_overlap_scheduler" not in eagle  # one-model EAGLE-3 keeps the overlap scheduler
    two_model = _render(_spec("draft_target", True), "auto", "xgrammar")
    assert two_model["disable_overlap_scheduler"] is True
    assert two_model["speculative_config"] == {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                               "speculative_model_dir": "draft"}


# ---- refusals, before any work ------------------------------------------------------------------------------------

@pytest.mark.parametrize("quant,arch,expected", [
    ("awq", (8, 0), "W4A16_AWQ"), ("awq", (8, 9), "W4A16_AWQ"), ("awq", (9, 0), "W4A16_AWQ"),
    ("fp8", (8, 9), "FP8"), ("fp8", (9, 0), "FP8"), ("fp8", (10, 0), "FP8"), ("fp8", (12, 0), "FP8"),
])
def test_quantizations_load_on_their_gpus(quant, arch, expected):
    assert check_quantization(quant, arch) == expected


@pytest.mark.parametrize("quant,arch,named", [
    ("awq", (10, 0), "compute capability 10.0 (Blackwell)"),
    ("awq", (7, 5), "compute capability 7.5 (pre-Ampere)"),
    ("fp8", (8, 0), "compute capability 8.0 (Ampere)"),
    ("fp8", (8, 6), "compute capability 8.6 (Ampere)"),
    ("gptq", None, "QUANT=gptq is refused for ENGINE=llmapi: 1.2.x's PyTorch linear layers have no GPTQ method"),
    ("nvfp4", None, "NVFP4 runs on Blackwell only"),
    ("none", None, "QUANT=none is refused"),
    ("int8", None, "QUANT=int8 is none of ['awq', 'fp8']"),
])
def test_other_quantizations_are_refused_by_name(quant, arch, named):
    with pytest.raises(SystemExit, match=named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]").replace(".", r"\.")):
        check_quantization(quant, arch)


def test_gpu_arch_names_and_capabilities():
    assert parse_gpu_arch("hopper") == (9, 0) and parse_gpu_arch("Ada") == (8, 9) and parse_gpu_arch("12.0") == (12, 0)
    with pytest.raises(SystemExit, match="GPU_ARCH='volta-ish'"):
        parse_gpu_arch("volta-ish")


def _args(tmp_path: Path, **overrides) -> argparse.Namespace:
    hf = tmp_path / "hf"
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text(json.dumps(LLAMA3_8B))
    defaults = dict(hf_model=hf, draft_hf_model=None, draft_quant="none", eagle_dir=None, speculative=None,
                    max_draft_len=8, quant="awq", gpu_arch="hopper", gpu_mem_gb=80.0, tp=1, pp=1, lora_dir=None,
                    kv_cache_dtype="auto", profile="throughput", max_batch_size=None, max_num_tokens=None,
                    max_input_len=None, max_seq_len=None, kv_cache_fraction=None, batch_scheduler_policy=None,
                    enable_chunked_context=None, assets=tmp_path / "assets", dry_run=True, repo=tmp_path / "repo",
                    decoupled=False, query_special_tokens="text", exclude_input_in_output=True,
                    guided_decoding="xgrammar", bls_instances=None, stream_interval=1, preprocessing_instances=None,
                    postprocessing_instances=None, handoff_sender_threads=None, seed=0)
    return argparse.Namespace(**{**defaults, **overrides})


@pytest.mark.parametrize("overrides,named", [
    (dict(speculative="lookahead"), "SPECULATIVE=lookahead is refused for ENGINE=llmapi: LookaheadDecodingConfig"),
    (dict(speculative="medusa"), "SPECULATIVE=medusa is refused for ENGINE=llmapi: MedusaDecodingConfig"),
    (dict(speculative="eagle3"), "SPECULATIVE=eagle3 needs EAGLE_DIR"),
    (dict(speculative="draft_target"), "SPECULATIVE=draft_target needs DRAFT_HF_MODEL"),
    (dict(speculative="ngram", max_draft_len=0), "SPECULATIVE=ngram needs MAX_DRAFT_LEN >= 1"),
    (dict(quant="awq", gpu_arch="blackwell"), "QUANT=awq \\(W4A16_AWQ\\) does not load on this GPU"),
    (dict(gpu_arch=None), "GPU_ARCH=ampere\\|ada\\|hopper\\|blackwell"),
])
def test_plan_refuses_by_name(tmp_path, monkeypatch, overrides, named):
    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: None)
    with pytest.raises(SystemExit, match=named):
        llmapi_flow.plan(_args(tmp_path, **overrides))


def test_speculation_with_pipeline_parallelism_or_lora_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: None)
    head = tmp_path / "eagle"
    head.mkdir()
    (head / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="SPECULATIVE=eagle3 with PP=2: speculative decoding does not combine"):
        llmapi_flow.plan(_args(tmp_path, speculative="eagle3", eagle_dir=head, pp=2))
    with pytest.raises(SystemExit, match="SPECULATIVE=ngram with PP=2"):
        llmapi_flow.plan(_args(tmp_path, speculative="ngram", pp=2))
    with pytest.raises(SystemExit, match="LORA_DIR with SPECULATIVE=ngram"):
        check_combinations(_spec("ngram"), 1, lora=True)


def test_a_gpu_arch_that_contradicts_the_gpu_here_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: (8, 0))
    with pytest.raises(SystemExit, match="GPU_ARCH=hopper \\(9.0\\) but this machine's GPU is 8.0"):
        llmapi_flow.plan(_args(tmp_path))
    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: (9, 0))
    assert llmapi_flow.plan(_args(tmp_path, gpu_arch=None)).capability == (9, 0)


def test_a_draft_model_alone_means_draft_target(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    spec = speculation(_args(tmp_path, draft_hf_model=draft))
    assert (spec.mode, spec.draft_dir, spec.drafts_in_executor) == ("draft_target", draft, True)
    with pytest.raises(SystemExit, match="DRAFT_HF_MODEL is for SPECULATIVE=draft_target, not ngram"):
        speculation(_args(tmp_path, draft_hf_model=draft, speculative="ngram"))


# ---- the dry run's commands and the launch ------------------------------------------------------------------------

def test_the_dry_run_plan_quantizes_in_its_own_process_and_serves_as_nvidia_launches(tmp_path, monkeypatch):
    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: None)
    gpu_plan = llmapi_flow.plan(_args(tmp_path, quant="fp8", kv_cache_dtype="fp8", tp=2))
    quantize, serve = gpu_plan.commands(Path("/models/repo"))
    assert quantize.argv[1:] == ["-m", "engine_build", "quantize", "--format", "hf", "--quantization", "fp8",
                                 "--hf-model", str(tmp_path / "hf"), "--out",
                                 str(tmp_path / "assets" / "target-modelopt-hf"), "--kv-cache-dtype", "fp8"]
    # TP 2: one tritonserver as the single rank of mpirun; the LLM starts its two workers itself.
    assert serve.argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert ":" not in serve.argv and "--model-control-mode=explicit" not in serve.argv
    assert {"--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_"} <= set(
        serve.argv)


def test_an_llmapi_repository_launches_one_tritonserver(monkeypatch):
    monkeypatch.setattr(tritonserver, "find_tritonserver",
                        lambda: tritonserver.TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None))
    single = server_command(Path("/r"), ServerPorts(), exit_timeout=120, world_size=1, gpu=True,
                            llm_spawns_ranks=True)
    assert single[0] == "/opt/tritonserver/bin/tritonserver" and "mpirun" not in single
    four = server_command(Path("/r"), ServerPorts(), exit_timeout=120, world_size=4, gpu=True,
                          llm_spawns_ranks=True)
    assert four[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and four.count("-n") == 1
    assert tritonserver.llm_spawns_ranks({"engine": "llmapi"}) and not tritonserver.llm_spawns_ranks(
        {"engine": "trtllm"})


def test_serve_only_launches_an_llmapi_repository_from_its_manifest(tmp_path, monkeypatch):
    """`make serve-only` (serving.tritonserver.launch) decides from repository.json alone: TP x PP = 2 in an llmapi
    repository is one tritonserver under mpirun -n 1, never the engine flow's two ranks or orchestrator mode."""
    monkeypatch.setattr(tritonserver, "find_tritonserver",
                        lambda: tritonserver.TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None))
    monkeypatch.setattr(tritonserver, "gpu_available", lambda: True)
    monkeypatch.delenv("TRTLLM_ORCHESTRATOR", raising=False)
    (tmp_path / "repository.json").write_text(json.dumps({"engine": "llmapi", "llm": "tensorrt_llm",
                                                          "world_size": 2, "draft": None}))
    command, env = tritonserver.launch(tmp_path, ServerPorts())
    assert command[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert ":" not in command and "--model-control-mode=explicit" not in command
    assert "TRTLLM_ORCHESTRATOR" not in env


# ---- repositories: assembled, checked, broken -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """The project's templates and packages, with this file's tensorrt_llm_llmapi template (module docstring)."""
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(ROOT / "model_repository", root / "model_repository", ignore=shutil.ignore_patterns(
        "tensorrt_llm_llmapi"))
    template = root / "model_repository" / LLMAPI_TEMPLATE
    (template / "1").mkdir(parents=True)
    (template / "config.pbtxt").write_text(TEST_TEMPLATE)
    # Its files only, with the imports the LLM API's model makes: tensorrt_llm only where a missing one fails the load
    # naming it (inside `except ImportError`), yaml and, as an engine model, torch.
    (template / "1" / "model.py").write_text(
        '"""The build tests\' tensorrt_llm."""\nimport torch\nimport yaml\n\ntry:\n    import tensorrt_llm\n'
        "except ImportError as error:\n    raise RuntimeError(f'llm: tensorrt_llm: {error}') from None\n")
    for package in ("bls", "embedded_engine"):
        (root / package).symlink_to(ROOT / package)
    (root / "llmapi_engine").mkdir()
    (root / "llmapi_engine" / "__init__.py").write_text("")
    return root


@pytest.fixture
def project(templates, monkeypatch):
    monkeypatch.setattr(repository, "TEMPLATES", templates / "model_repository")
    monkeypatch.setattr(repository, "PROJECT_ROOT", templates)
    # The template's contract is the serving side's (bls/contract.py, under LLMAPI_TEMPLATE); where the build side
    # stands alone, the C++ backend's contract, which it extends, stands for it.
    monkeypatch.setitem(CONTRACTS, LLMAPI_TEMPLATE, CONTRACTS.get(LLMAPI_TEMPLATE, CONTRACTS["tensorrt_llm"]))
    return templates


def _export(folder: Path, algo: str = "W4A16_AWQ") -> Path:
    """The files check-repo requires of ModelOpt's Hugging Face export."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": algo}}))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def _llmapi_repo(root: Path, tokenizer_dir: Path, *, llm: str = LLM_STAND_IN, decoupled: bool = False,
                 spec: Speculation | None = None, built: bool = True, lora_dir: Path | None = None) -> Path:
    spec = spec or _spec("")
    args = _render(spec, "auto", "xgrammar")
    lora = {}
    if lora_dir is not None:
        args = llm_arguments(profile=PROFILES["throughput"], tp=1, pp=1, kv_cache_dtype="auto", kv_cache_fraction=0.9,
                             guided_decoding="xgrammar", spec=spec, checkpoint="checkpoint", draft=None,
                             lora=llmapi_flow.lora_config(lora_dir, 16))
        lora = dict(lora_dir=lora_dir, max_lora_rank=16, lora_base=ASSETS / "tiny-target-hf")
    return assemble_repository(root / "repo", RepositorySettings(
        engine="llmapi", llm=llm, tokenizer_dir=tokenizer_dir, target=_export(root / "export"),
        speculative_model=spec.draft_dir, llm_args=args, triton_max_batch_size=args["max_batch_size"],
        max_queue_size=args["max_batch_size"], decoupled=decoupled, engines_built=built, **lora))


def test_an_llmapi_repository_is_rendered_relocatable_and_passes(project, tmp_path, tokenizer_dir):
    repo = _llmapi_repo(tmp_path, tokenizer_dir, decoupled=True)
    version = repo / "tensorrt_llm" / "1"
    document = yaml.safe_load((version / MODEL_YAML).read_text())
    assert document["model"] == "checkpoint" and (version / "checkpoint" / "hf_quant_config.json").is_file()
    assert document["triton_config"] == {"max_batch_size": 256, "decoupled": True, "cancellation_check_period_ms": 100}
    assert "are relative to this file's" in (version / MODEL_YAML).read_text()  # the header says so
    config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in config and 'string_value: "stand_in"' in config
    assert {"bls", "llmapi_engine", "embedded_engine", "model.py"} <= {p.name for p in version.iterdir()}
    manifest = json.loads((repo / "repository.json").read_text())
    assert (manifest["engine"], manifest["llm"]) == ("llmapi", LLM_STAND_IN)
    report = check_repository(repo)
    assert report.ok, report.problems
    moved = Path(shutil.copytree(repo, tmp_path / "moved"))
    assert check_repository(moved).ok  # no path of the build machine


def test_a_tensorrt_llm_repository_ships_what_its_model_imports(tmp_path, tokenizer_dir):
    """The project's own template (not the build tests' one): its model imports embedded_engine whatever the LLM
    (response shapes, metric families, guide parsing), so the GPU build ships it as the CPU build does."""
    repo = _llmapi_repo(tmp_path, tokenizer_dir, llm=LLM_TENSORRT_LLM)
    version = repo / "tensorrt_llm" / "1"
    assert {"bls", "llmapi_engine", "embedded_engine", "model.py"} <= {p.name for p in version.iterdir()}
    assert check_repo.python_import_problems(version, engine_model=True) == []
    report = check_repository(repo)
    assert report.ok, report.problems


def test_a_dry_run_repository_says_what_it_cannot_check(project, tmp_path, tokenizer_dir):
    repo = _llmapi_repo(tmp_path, tokenizer_dir, llm=LLM_TENSORRT_LLM, built=False)
    report = check_repository(repo)
    assert report.ok, report.problems
    assert any("a dry run exports none" in item for item in report.unchecked)


def _broken(repo: Path, tmp_path: Path, edit) -> list[str]:
    copy = Path(shutil.copytree(repo, tmp_path / "broken"))
    edit(copy)
    manifest = json.loads((copy / "repository.json").read_text())
    from bls.artifact import file_checksums

    manifest["files"] = file_checksums(copy)  # the edit is the only problem
    (copy / "repository.json").write_text(json.dumps(manifest))
    return check_repository(copy).problems


def _edit_yaml(change):
    def edit(repo: Path) -> None:
        path = repo / "tensorrt_llm" / "1" / MODEL_YAML
        document = yaml.safe_load(path.read_text())
        change(document)
        path.write_text(yaml.safe_dump(document))
    return edit


@pytest.fixture
def good_repo(project, tmp_path, tokenizer_dir) -> Path:
    return _llmapi_repo(tmp_path / "good", tokenizer_dir)


@pytest.mark.parametrize("change,named", [
    (lambda d: d.update(max_batch_sise=8), "model.yaml max_batch_sise: TorchLlmArgs has no field 'max_batch_sise'"),
    (lambda d: d["kv_cache_config"].update(free_gpu_mem_fraction=0.5),
     "model.yaml kv_cache_config.free_gpu_mem_fraction: KvCacheConfig has no field 'free_gpu_mem_fraction'"),
    (lambda d: d.update(max_num_tokens="8192"), "model.yaml max_num_tokens: '8192' is not a int"),
    (lambda d: d.update(enable_chunked_prefill="yes"), "model.yaml enable_chunked_prefill: 'yes' is not a bool"),
    (lambda d: d["kv_cache_config"].update(free_gpu_memory_fraction=1.5),
     "kv_cache_config.free_gpu_memory_fraction: 1.5 is above its maximum 1"),
    (lambda d: d.update(guided_decoding_backend="outlines"),
     "guided_decoding_backend: 'outlines' is none of ['xgrammar', 'llguidance']"),
    (lambda d: d["scheduler_config"].update(capacity_scheduler_policy="guaranteed_no_evict"),
     "capacity_scheduler_policy: 'guaranteed_no_evict' is none of"),
    (lambda d: d.update(stream_interval=0), "stream_interval: 0 must be above 0"),
    (lambda d: d.update(speculative_config={"decoding_type": "Lookahead", "max_draft_len": 4}),
     "speculative_config.decoding_type: Lookahead: LookaheadDecodingConfig.supports_backend excludes pytorch"),
    (lambda d: d.update(speculative_config={"decoding_type": "NGram", "max_draft_len": 4, "max_ngram": 2}),
     "speculative_config.max_ngram: NGramDecodingConfig has no field 'max_ngram'"),
    (lambda d: d.update(lora_config={"lora_dir": [], "max_rank": 8}), "lora_config.max_rank: LoraConfig has no field"),
    (lambda d: d.pop("model"), "model: missing"),
    (lambda d: d.pop("triton_config"), "triton_config: missing or not a mapping"),
    (lambda d: d["triton_config"].update(decoupled=True), "triton_config.decoupled True differs from config.pbtxt's"),
    (lambda d: d["triton_config"].update(max_batch_size=0), "triton_config.max_batch_size 0 differs"),
    (lambda d: d.update(tensor_parallel_size=2), "tensor_parallel_size x pipeline_parallel_size = 2, but"),
    (lambda d: d.update(model="/abs/checkpoint"), "model '/abs/checkpoint' is absolute"),
    (lambda d: d.update(model="nowhere"), "model 'nowhere': no such folder under 1/"),
    (lambda d: d.update(speculative_config={"decoding_type": "DraftTarget", "max_draft_len": 4,
                                            "speculative_model_dir": "draft"}),
     "speculative_config.speculative_model_dir 'draft': no such folder under 1/"),
    (lambda d: d.update(speculative_config={"decoding_type": "Eagle", "max_draft_len": 4}),
     "speculative_config.speculative_model_dir is missing: speculative_config's decoding_type Eagle needs a draft"),
])
def test_a_broken_model_yaml_is_named(good_repo, tmp_path, change, named):
    problems = _broken(good_repo, tmp_path, _edit_yaml(change))
    assert any(named in problem for problem in problems), problems


@pytest.mark.parametrize("missing,named", [
    ("hf_quant_config.json", "model 'checkpoint' lacks ['hf_quant_config.json']"),
    ("config.json", "model 'checkpoint' lacks ['config.json']"),
    ("model.safetensors", "model 'checkpoint' holds no *.safetensors weights"),
])
def test_a_checkpoint_missing_a_file_is_named(good_repo, tmp_path, missing, named):
    problems = _broken(good_repo, tmp_path,
                       lambda repo: (repo / "tensorrt_llm" / "1" / "checkpoint" / missing).unlink())
    assert any(named in problem for problem in problems), problems


def test_a_missing_checkpoint_and_a_wrong_quant_algo_are_named(good_repo, tmp_path):
    problems = _broken(good_repo, tmp_path, lambda repo: shutil.rmtree(repo / "tensorrt_llm" / "1" / "checkpoint"))
    assert any("model 'checkpoint': no such folder under 1/" in problem for problem in problems), problems

    def gptq(repo: Path) -> None:
        (repo / "tensorrt_llm" / "1" / "checkpoint" / "hf_quant_config.json").write_text(
            json.dumps({"quantization": {"quant_algo": "W4A16_GPTQ"}}))
    problems = _broken(good_repo, tmp_path / "b", gptq)
    assert any("quant_algo 'W4A16_GPTQ' is none this build serves" in problem for problem in problems), problems


def test_the_llm_must_be_the_recorded_one(good_repo, tmp_path):
    def swap(repo: Path) -> None:
        config = repo / "tensorrt_llm" / "config.pbtxt"
        config.write_text(config.read_text().replace('"stand_in"', '"tensorrt_llm"'))
    problems = _broken(good_repo, tmp_path, swap)
    assert any("parameter llm 'tensorrt_llm', but repository.json records llm 'stand_in'" in p for p in problems)


def test_a_missing_model_yaml_is_named(good_repo, tmp_path):
    problems = _broken(good_repo, tmp_path, lambda repo: (repo / "tensorrt_llm" / "1" / MODEL_YAML).unlink())
    assert any("1/model.yaml is missing" in problem for problem in problems), problems


def test_the_speculative_model_is_linked_and_checked(project, tmp_path, tokenizer_dir):
    draft = _export(tmp_path / "eagle-head")
    repo = _llmapi_repo(tmp_path, tokenizer_dir, spec=Speculation("eagle3", 4, draft))
    assert (repo / "tensorrt_llm" / "1" / "draft" / "config.json").is_file()
    assert check_repository(repo).ok
    problems = _broken(repo, tmp_path, lambda r: (r / "tensorrt_llm" / "1" / "draft" / "config.json").unlink())
    assert any("speculative_config.speculative_model_dir 'draft' lacks ['config.json']" in p for p in problems)


def test_the_container_has_what_the_llmapi_model_imports(project, tmp_path, tokenizer_dir):
    assert check_repo.why_not_importable("yaml", engine_model=False) is None
    repo = _llmapi_repo(tmp_path, tokenizer_dir)
    assert check_repo.python_import_problems(repo / "tensorrt_llm" / "1", engine_model=True) == []
    # tensorrt_llm's model is an engine model (torch); the preprocessing model is not.
    problems = _broken(repo, tmp_path, lambda r: shutil.copy2(r / "tensorrt_llm" / "1" / "model.py",
                                                              r / "preprocessing" / "1" / "llm_imports.py"))
    assert any("llm_imports.py line 2 imports torch: 'torch' is for the embedded engine only" in p
               for p in problems), problems


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """Two PEFT adapters of the tiny target: rank 8 on q and v, rank 4 on the MLP's down projection."""
    if not (ASSETS / "tiny-target-hf" / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(str(ASSETS / "tiny-target-hf"))
    root = tmp_path_factory.mktemp("adapters")
    get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).save_pretrained(str(root / "beta"))
    base = LlamaForCausalLM.from_pretrained(str(ASSETS / "tiny-target-hf"))
    get_peft_model(base, LoraConfig(r=4, target_modules=["down_proj"])).save_pretrained(str(root / "alpha"))
    return root


def test_lora_adapters_are_linked_in_task_id_order_without_cuda_graphs(project, tmp_path, tokenizer_dir, lora_dir):
    config = llmapi_flow.lora_config(lora_dir, 16)
    assert config == {"lora_dir": ["lora/alpha", "lora/beta"], "lora_ckpt_source": "hf", "max_lora_rank": 16,
                      "lora_target_modules": ["attn_q", "attn_k", "attn_v", "mlp_4h_to_h"], "max_loras": 2,
                      "max_cpu_loras": 2}
    repo = _llmapi_repo(tmp_path, tokenizer_dir, lora_dir=lora_dir)
    version = repo / "tensorrt_llm" / "1"
    document = yaml.safe_load((version / MODEL_YAML).read_text())
    assert document["lora_config"] == config and document["cuda_graph_config"] is None  # LoRA x CUDA graph: No
    assert llm_args_problems(document) == ([], [])
    assert (version / "lora" / "alpha" / "adapter_config.json").is_file()
    manifest = json.loads((repo / "repository.json").read_text())
    assert [(a["name"], a["task_id"]) for a in manifest["lora_adapters"]] == [("alpha", 1), ("beta", 2)]
    report = check_repository(repo)
    assert report.ok, report.problems

    def reorder(document: dict) -> None:
        document["lora_config"]["lora_dir"].reverse()
    problems = _broken(repo, tmp_path, _edit_yaml(reorder))
    assert any("lora_config.lora_dir names ['beta', 'alpha'], but repository.json records" in p for p in problems)
    problems = _broken(repo, tmp_path / "b", lambda r: shutil.rmtree(r / "tensorrt_llm" / "1" / "lora" / "beta"))
    assert any("lora_config.lora_dir 'lora/beta': no such folder under 1/" in p for p in problems), problems
    with pytest.raises(SystemExit, match="an adapter has rank 8, above --max-lora-rank 4"):
        llmapi_flow.lora_config(lora_dir, 4)


def test_the_cpu_build_serves_the_tiny_modelopt_export_on_the_stand_in(project, tmp_path, monkeypatch):
    """`make repo ENGINE=llmapi` without HF_MODEL: the tiny target's W4A16_AWQ export (made once, in its own process,
    then reused while up to date) behind `llm: stand_in`, checked."""
    if not (ASSETS / "tiny-target-hf" / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: None)
    args = _args(tmp_path, hf_model=None, dry_run=False, gpu_arch=None, assets=ASSETS, speculative="ngram",
                 max_draft_len=4)
    repo = llmapi_flow.build_llmapi_repository(args, lambda message: None)
    version = repo / "tensorrt_llm" / "1"
    document = yaml.safe_load((version / MODEL_YAML).read_text())
    assert document["max_batch_size"] == 16 and document["speculative_config"]["decoding_type"] == "NGram"
    # Triton's batches are the default embedded repository's (the engine queues rows past its 16 active sequences).
    defaults = RepositorySettings(engine="embedded", tokenizer_dir=tmp_path, target=tmp_path)
    assert document["triton_config"]["max_batch_size"] == defaults.triton_max_batch_size == 64
    for model in ("tensorrt_llm", "preprocessing", "postprocessing", "ensemble"):
        assert f"max_batch_size: {defaults.triton_max_batch_size}\n" in (repo / model / "config.pbtxt").read_text()
    quant = json.loads((version / "checkpoint" / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "W4A16_AWQ"
    assert json.loads((repo / "repository.json").read_text())["llm"] == LLM_STAND_IN
    with pytest.raises(SystemExit, match="DRY_RUN=1 plans a GPU build"):
        llmapi_flow.build_llmapi_repository(_args(tmp_path, hf_model=None), lambda message: None)
    with pytest.raises(SystemExit, match="QUANT=fp8: the CPU build serves the tiny model's AWQ export"):
        llmapi_flow.build_llmapi_repository(_args(tmp_path, hf_model=None, dry_run=False, quant="fp8"),
                                            lambda message: None)


def test_a_gpu_build_without_a_gpu_or_tensorrt_llm_stops_before_any_work(tmp_path, monkeypatch):
    from engine_build import gpu, trtllm

    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: None)
    monkeypatch.setattr(llmapi_flow, "_run", lambda commands, log: pytest.fail(f"ran {commands}"))
    monkeypatch.setattr(gpu, "gpu_available", lambda: False)
    with pytest.raises(SystemExit, match="no NVIDIA GPU found .* or plan it anywhere with DRY_RUN=1"):
        llmapi_flow.build_llmapi_repository(_args(tmp_path, dry_run=False), lambda message: None)
    monkeypatch.setattr(gpu, "gpu_available", lambda: True)
    monkeypatch.setattr(trtllm, "installed_trtllm_version", lambda: None)
    with pytest.raises(SystemExit, match="tensorrt_llm is not installed; run it inside nvcr.io/nvidia/tritonserver"):
        llmapi_flow.build_llmapi_repository(_args(tmp_path, dry_run=False), lambda message: None)


def test_the_quantize_step_must_fit_the_gpus(tmp_path, monkeypatch):
    """Calibration holds the 16-bit model: Llama 3 8B (15 GiB) does not fit one 16 GiB GPU's usable 85 %."""
    from engine_build import gpu_plan

    monkeypatch.setattr(llmapi_flow, "gpu_compute_capability", lambda: None)
    monkeypatch.setattr(gpu_plan, "visible_gpu_count", lambda: None)
    with pytest.raises(SystemExit, match="does NOT fit"):
        llmapi_flow.plan(_args(tmp_path, gpu_mem_gb=16.0))
    assert llmapi_flow.plan(_args(tmp_path, gpu_mem_gb=16.0, tp=2)).quantization.fits
