"""The recorded 1.2.1 parameter contract, our rendering of it, and `check-repo` on good and broken repositories.

Built here: a TensorRT-LLM repository as `make repo ENGINE=trtllm DRY_RUN=1` assembles it (no engines), target and
draft, guided decoding on; then copies of it broken one way each (a missing parameter, a wrong dtype, a missing
file, an import the container lacks, a miswired ensemble), which check-repo must reject naming the reason.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bls.contract import TOKEN_TEXT_CLASSES_FILE, TokenTextClass
from engine_build import cli
from engine_build.check_repo import check_repository, python_import_problems
from engine_build.container_python import why_not_importable
from engine_build.pbtxt import first, parameters, parse_pbtxt
from engine_build.render import parse_model_config
from engine_build.repository import HANDOFF_MODEL, MANIFEST, RepositorySettings, assemble_repository
from engine_build.upstream_parameters import (
    PARAMETER_READS,
    TENSORRT_LLM_PARAMETER_READS,
    UPSTREAM_TEMPLATE_PARAMETERS,
    is_unset,
    upstream_placeholder,
)

TEMPLATE = Path(__file__).resolve().parents[2] / "model_repository" / "tensorrt_llm" / "config.pbtxt"
ENGINES = ("tensorrt_llm", "tensorrt_llm_draft")


def _template_parameters(text: str) -> list[tuple[str, str]]:
    return re.findall(r'parameters \{ key: "([^"]+)" value: \{ string_value: "([^"]*)" \} \}', text)


def test_the_template_declares_every_parameter_of_upstreams_in_its_order():
    assert _template_parameters(TEMPLATE.read_text()) == list(UPSTREAM_TEMPLATE_PARAMETERS)


def test_every_read_outside_a_try_is_declared():
    """The keys whose absence fails the load (before the fix: tokenizer_dir, xgrammar_tokenizer_info_path and
    guided_decoding_backend were missing from our template, and this failed)."""
    fatal = {read.name for read in TENSORRT_LLM_PARAMETER_READS if read.fatal_when_missing}
    assert fatal == {"gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend"}
    assert fatal <= {key for key, _ in _template_parameters(TEMPLATE.read_text())}


def test_the_record_covers_every_key_of_upstreams_template():
    keys = {key for key, _ in UPSTREAM_TEMPLATE_PARAMETERS}
    assert keys - set(PARAMETER_READS) == {"FORCE_CPU_ONLY_INPUT_TENSORS"}  # declared, read by no code read
    assert set(PARAMETER_READS) - keys == {"worker_path", "enable_trt_overlap", "recv_poll_period_ms"}


def test_unset_is_what_the_backend_compares_with():
    assert is_unset("tokenizer_dir", "${tokenizer_dir}") and is_unset("tokenizer_dir", "")
    assert is_unset("gpt_model_path", "${engine_dir}")  # upstream's placeholder name for this key
    assert not is_unset("gpt_model_path", "/models/llama3/tensorrt_llm/1")
    assert upstream_placeholder("gpt_model_type") == "batching_strategy"
    assert upstream_placeholder("executor_worker_path") is None


@pytest.fixture(scope="module")
def dry_run_repo(tmp_path_factory, tokenizer_dir) -> Path:
    """A TensorRT-LLM repository with a draft, as a dry run assembles it (engine folders without engines)."""
    root = tmp_path_factory.mktemp("trtllm")
    return assemble_repository(root / "repo", RepositorySettings(
        engine="trtllm", tokenizer_dir=tokenizer_dir, target=root / "target-engine", draft=root / "draft-engine",
        engines_built=False, world_size=2, draft_max_kv_tokens=100_000))


def _copy(repo: Path, tmp_path: Path) -> Path:
    """A copy whose engines' paths point into itself (as relocate leaves a moved repository)."""
    copy = Path(shutil.copytree(repo, tmp_path / "copy", symlinks=True))
    cli.main(["relocate", "--repo", str(copy), "--serve-path", str(copy)])
    return copy


def test_paths_into_another_repository_are_named(dry_run_repo, tmp_path):
    copy = Path(shutil.copytree(dry_run_repo, tmp_path / "unmoved", symlinks=True))
    problems = check_repository(copy).problems
    assert any(p.startswith(f"tensorrt_llm: {dry_run_repo}/tensorrt_llm/1 points into another repository") and
               f"relocate --serve-path {copy}" in p for p in problems)


def _engine_parameters(repo: Path, model: str) -> dict[str, str]:
    return parameters(parse_pbtxt((repo / model / "config.pbtxt").read_text()))


def test_the_rendered_engines_carry_every_key_set_or_unset_as_upstream(dry_run_repo):
    for model in ENGINES:
        params = _engine_parameters(dry_run_repo, model)
        assert list(params) == [key for key, _ in UPSTREAM_TEMPLATE_PARAMETERS]
        version = dry_run_repo / model / "1"
        assert params["guided_decoding_backend"] == "xgrammar"
        assert params["xgrammar_tokenizer_info_path"] == str(version / "xgrammar_tokenizer_info.json")
        assert params["tokenizer_dir"] == "${tokenizer_dir}"  # as upstream's C++ guided-decoding recipe leaves it
        assert params["gpu_device_ids"] == "0,1"  # orchestrator mode: TP x PP = 2 ranks
        assert params["lora_prefetch_dir"] == "${lora_prefetch_dir}"
        assert params["encoder_model_path"] == "${encoder_engine_dir}"
    assert _engine_parameters(dry_run_repo, "tensorrt_llm_draft")["max_tokens_in_paged_kv_cache"] == "100000"
    assert _engine_parameters(dry_run_repo, "tensorrt_llm")["max_tokens_in_paged_kv_cache"] == \
        "${max_tokens_in_paged_kv_cache}"


def test_the_schema_free_reader_agrees_with_tritons_schema(dry_run_repo):
    text = (dry_run_repo / "tensorrt_llm" / "config.pbtxt").read_text()
    config = parse_model_config(text, "engine")
    assert {k: v.string_value for k, v in config.parameters.items()} == parameters(parse_pbtxt(text))
    reader = parse_pbtxt(text)
    assert [first(t, "name") for t in reader["input"]] == [t.name for t in config.input]
    assert [tuple(t["dims"]) for t in reader["output"]] == [tuple(t.dims) for t in config.output]


def test_guided_decoding_off_leaves_the_keys_present_and_unset(tmp_path, tokenizer_dir):
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="trtllm", tokenizer_dir=tokenizer_dir, target=tmp_path / "engine", engines_built=False,
        guided_decoding="none"))
    params = _engine_parameters(repo, "tensorrt_llm")
    assert {key: params[key] for key in ("tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend")} \
        == {"tokenizer_dir": "${tokenizer_dir}", "xgrammar_tokenizer_info_path": "${xgrammar_tokenizer_info_path}",
            "guided_decoding_backend": "${guided_decoding_backend}"}
    assert not (repo / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").exists()
    assert check_repository(repo).ok


def test_a_dry_run_repository_passes(dry_run_repo, capsys):
    report = check_repository(dry_run_repo)
    assert report.ok, report.problems
    assert "tensorrt_llm: the engine files (a dry run builds none)" in report.unchecked
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check-repo", "--repo", str(dry_run_repo)])
    assert exit_.value.code == 0


def _broken(repo: Path, tmp_path: Path, edit) -> list[str]:
    copy = _copy(repo, tmp_path)
    edit(copy)
    report = check_repository(copy)
    assert not report.ok
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check-repo", "--repo", str(copy)])
    assert exit_.value.code == 1
    return report.problems


def _edit_config(model: str, old: str, new: str):
    def edit(repo: Path) -> None:
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        assert old in text
        config.write_text(text.replace(old, new, 1))
    return edit


def test_a_missing_parameter_read_outside_a_try_is_a_load_failure(dry_run_repo, tmp_path):
    def remove(repo: Path) -> None:
        config = repo / "tensorrt_llm" / "config.pbtxt"
        config.write_text(re.sub(r'parameters \{ key: "xgrammar_tokenizer_info_path"[^\n]*\n', "", config.read_text()))

    problems = _broken(dry_run_repo, tmp_path, remove)
    assert any(p.startswith("tensorrt_llm: parameter 'xgrammar_tokenizer_info_path' is missing: the backend reads it "
                            "outside any try/catch") and "Cannot find parameter with name" in p for p in problems)


def test_a_wrong_dtype_is_named(dry_run_repo, tmp_path):
    problems = _broken(dry_run_repo, tmp_path, _edit_config(
        "tensorrt_llm_draft", 'name: "seed"\n    data_type: TYPE_UINT64', 'name: "seed"\n    data_type: TYPE_INT64'))
    assert "tensorrt_llm_draft: input 'seed': data_type TYPE_INT64, the contract says TYPE_UINT64" in problems


def test_a_missing_file_is_named(dry_run_repo, tmp_path):
    def remove(repo: Path) -> None:
        (repo / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").unlink()
        (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").unlink()

    problems = _broken(dry_run_repo, tmp_path, remove)
    assert any("xgrammar_tokenizer_info_path" in p and "does not exist: the load fails" in p
               for p in problems)
    assert any(p.startswith("preprocessing: preprocessing/1/tokenizer/tokenizer.json is missing") for p in problems)
    assert any(p.startswith("preprocessing: tokenizer_dir 'tokenizer'") for p in problems)


def test_bad_values_are_named(dry_run_repo, tmp_path):
    problems = _broken(dry_run_repo, tmp_path, lambda repo: [
        _edit_config("tensorrt_llm", '"guided_decoding_backend" value: { string_value: "xgrammar"',
                     '"guided_decoding_backend" value: { string_value: "outlines"')(repo),
        _edit_config("tensorrt_llm", '"enable_kv_cache_reuse" value: { string_value: "true"',
                     '"enable_kv_cache_reuse" value: { string_value: "yes"')(repo),
        _edit_config("tensorrt_llm", '"gpt_model_type" value: { string_value: "inflight_fused_batching"',
                     '"gpt_model_type" value: { string_value: "${batching_strategy}"')(repo)])
    assert ("tensorrt_llm: parameter guided_decoding_backend='outlines': none of ('xgrammar',): the load fails"
            in problems)
    assert ("tensorrt_llm: parameter enable_kv_cache_reuse='yes': not a bool: the backend falls back to true"
            in problems)
    assert any("gpt_model_type is unset" in p for p in problems)


def test_a_miswired_ensemble_is_named(dry_run_repo, tmp_path):
    problems = _broken(dry_run_repo, tmp_path, _edit_config(
        "ensemble", 'key: "SEQUENCE_LENGTH"', 'key: "SEQUENCE_LENGTHS"'))
    assert any("step postprocessing: 'SEQUENCE_LENGTHS' is not an input of postprocessing" in p for p in problems)
    assert any("required input 'SEQUENCE_LENGTH' is not mapped" in p for p in problems)


def test_a_step_fed_by_a_decoupled_model_and_by_the_request_is_refused(dry_run_repo, tmp_path):
    """Triton's ValidateEnsembleConfig: a step's inputs must all come from the same decoupled model's responses (or
    none); postprocessing fed the engine's tokens and a length straight from the request would never load."""
    problems = _broken(dry_run_repo, tmp_path, _edit_config(
        "ensemble", 'input_map { key: "SEQUENCE_LENGTH" value: "_SEQUENCE_LENGTH" }',
        'input_map { key: "SEQUENCE_LENGTH" value: "max_tokens" }'))
    assert ("ensemble: step postprocessing receives inputs originated from different decoupled models (Triton "
            "refuses the ensemble)") in problems


def test_an_import_the_container_lacks_is_named(dry_run_repo, tmp_path):
    def add(repo: Path) -> None:
        (repo / "postprocessing" / "1" / "bls" / "extra.py").write_text(
            "import json\nimport tritonclient.grpc\nimport torch\n"
            "try:\n    import pandas\nexcept ImportError:\n    pandas = None\n")

    problems = _broken(dry_run_repo, tmp_path, add)
    assert any(p.startswith("postprocessing: postprocessing/1/bls/extra.py line 2 imports tritonclient.grpc: "
                            "'tritonclient' is not installed in the 26.07 container") for p in problems)
    assert any("line 3 imports torch: 'torch' is for the embedded engine only" in p for p in problems)
    assert not any("pandas" in p or "json" in p for p in problems)


def test_what_the_container_ships():
    assert why_not_importable("json", engine_model=False) is None
    assert why_not_importable("transformers", engine_model=False) is None
    assert why_not_importable("torch", engine_model=True) is None
    assert "not installed" in why_not_importable("grpc", engine_model=False)
    assert "not installed" in why_not_importable("distutils", engine_model=False)  # gone from Python 3.12


def test_this_projects_serve_time_code_imports_only_what_the_container_has(dry_run_repo):
    for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls_python"):
        assert python_import_problems(dry_run_repo / model / "1", engine_model=False) == []


def test_the_embedded_repository_passes_and_its_guided_decoding_file_is_checked(tmp_path, tokenizer_dir):
    target = Path(__file__).resolve().parents[2] / "build" / "assets" / "tiny-target-awq"
    if not (target / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=tokenizer_dir, target=target))
    report = check_repository(repo)
    assert report.ok, report.problems
    (repo / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").write_text('{"encoded_vocab": [1]}')
    problems = check_repository(repo).problems
    assert "tensorrt_llm: 1/xgrammar_tokenizer_info.json: encoded_vocab must be a list of strings: nlohmann::json " \
           "throws at load" in problems
    assert any("tokenizer_str must be a string" in p for p in problems)


def test_a_repository_wired_unlike_its_recorded_topology_is_named(dry_run_repo, tmp_path):
    """repository.json's topology (engine_build/topology.py) is what the configs wire: an ensemble that skips the
    handoff, or a record of another topology, is named."""
    assert json.loads((dry_run_repo / MANIFEST).read_text())["topology"]["name"] == "streaming"
    problems = _broken(dry_run_repo, tmp_path / "skip", _edit_config("ensemble", 'model_name: "tensorrt_llm_handoff"',
                                                                     'model_name: "tensorrt_llm"'))
    assert any(p.startswith("ensemble: its steps ['preprocessing', 'tensorrt_llm', 'postprocessing'] are not the "
                            "streaming topology's") for p in problems), problems

    def record_unary(repo: Path) -> None:
        manifest = json.loads((repo / MANIFEST).read_text())
        manifest["topology"]["name"] = "unary"
        (repo / MANIFEST).write_text(json.dumps(manifest))

    problems = _broken(dry_run_repo, tmp_path / "unary", record_unary)
    assert "repository: topology unary does not match decoupled=True" in problems


def test_a_relayed_trtllm_repository_passes_and_its_handoff_is_checked(tmp_path, tokenizer_dir):
    """Where the relay is built, the ensemble reaches the C++ backend's engine through the handoff (relay/handoff.h):
    the repository passes, and a handoff naming a model the repository lacks is named."""
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="trtllm", tokenizer_dir=tokenizer_dir, target=tmp_path / "target-engine", engines_built=False,
        handoff_sender_threads=4))
    report = check_repository(repo)
    assert report.ok, report.problems
    problems = _broken(repo, tmp_path, _edit_config("tensorrt_llm_handoff", 'string_value: "tensorrt_llm"',
                                                    'string_value: "tensorrt_llm_gone"'))
    assert "tensorrt_llm_handoff: handoff_to names 'tensorrt_llm_gone', which the repository does not have" in problems


def test_the_handoffs_token_text_classes_must_be_postprocessings_tokenizers(dry_run_repo, tmp_path):
    """relay/handoff.cc cannot load without its table, and a table of another tokenizer (or skip_special_tokens) would
    leave the stream state out where a character is split."""
    table = Path(HANDOFF_MODEL, "1", TOKEN_TEXT_CLASSES_FILE)

    def stale(repo: Path) -> None:
        data = bytearray((repo / table).read_bytes())
        data[data.index(TokenTextClass.PARTIAL)] = TokenTextClass.WHOLE
        (repo / table).write_bytes(bytes(data))

    problems = _broken(dry_run_repo, tmp_path / "stale", stale)
    assert any(p.startswith(f"{HANDOFF_MODEL}: 1/{TOKEN_TEXT_CLASSES_FILE} is not the one postprocessing's tokenizer")
               for p in problems), problems
    problems = _broken(dry_run_repo, tmp_path / "missing", lambda repo: (repo / table).unlink())
    assert f"{HANDOFF_MODEL}: 1/{TOKEN_TEXT_CLASSES_FILE} (written by make repo) is missing: the handoff cannot " \
           "load" in problems, problems
