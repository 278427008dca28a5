"""Config templates: strict rendering and validation as Triton ModelConfig protobufs."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from bls.artifact import verify_model_files
from engine_build.render import TemplateError, parse_model_config, render_model_config, render_template
from engine_build.repository import (
    RepositoryError,
    RepositorySettings,
    assemble_repository,
    default_bls_instance_count,
    read_manifest,
)
from tools import engine_relay

TEMPLATES = Path(__file__).resolve().parents[2] / "model_repository"


def test_unknown_key_is_an_error():
    with pytest.raises(TemplateError, match=r"unknown template keys \['typo'\]"):
        render_template("max_batch_size: ${triton_max_batch_size}", {"triton_max_batch_size": 8, "typo": 1}, "t")


def test_unfilled_key_is_an_error():
    with pytest.raises(TemplateError, match=r"unfilled template keys \['triton_max_batch_size'\]"):
        render_template("max_batch_size: ${triton_max_batch_size}", {}, "t")


def test_invalid_protobuf_is_an_error():
    with pytest.raises(TemplateError, match="not a valid Triton ModelConfig"):
        parse_model_config('name: "x"\nmax_batch_size: "eight"', "t")


def test_booleans_render_as_protobuf_booleans():
    assert render_template("decoupled: ${d}", {"d": True}, "t") == "decoupled: true"


def _fake_checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def _fake_tokenizer(path: Path) -> Path:
    """A three-token fast byte-level tokenizer (as Llama 3's are; no other kind is served): enough for every file a
    repository makes of one (the xgrammar tokenizer info loads it), with an HF checkpoint's other files beside it."""
    from tokenizers import Tokenizer, decoders, models

    path.mkdir()
    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "</s>": 2}, unk_token="<unk>"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"}')
    (path / "generation_config.json").write_text("{}")
    (path / "model.safetensors").write_text("weights are not part of a tokenizer")
    return path


def test_embedded_repository_renders_every_model(tmp_path):
    target = _fake_checkpoint(tmp_path / "target")
    draft = _fake_checkpoint(tmp_path / "draft")
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=target, draft=draft,
        handoff_sender_threads=1))
    models = {"preprocessing", "postprocessing", "ensemble", "tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls",
              "tensorrt_llm_bls_python", "tensorrt_llm_handoff"}
    assert set(read_manifest(repo)["models"]) == models
    for name in models:
        config = parse_model_config((repo / name / "config.pbtxt").read_text(), name)
        assert config.name == name
    engine = parse_model_config((repo / "tensorrt_llm" / "config.pbtxt").read_text(), "engine")
    assert engine.backend == "python" and engine.model_transaction_policy.decoupled
    assert (repo / "tensorrt_llm" / "1" / "checkpoint" / "config.json").is_file()
    bls = parse_model_config((repo / "tensorrt_llm_bls_python" / "config.pbtxt").read_text(), "bls")
    assert bls.parameters["tensorrt_llm_draft_model_name"].string_value == "tensorrt_llm_draft"
    assert bls.instance_group[0].count == default_bls_instance_count(relayed=True) == \
        read_manifest(repo)["bls_instance_count"]
    assert bls.parameters["transport"].string_value == "relay"
    assert bls.parameters["max_concurrent_requests"].string_value == "256"
    assert not bls.HasField("dynamic_batching"), "a relayed BLS admits requests in its own pool"
    relay = parse_model_config((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text(), "relay")
    assert relay.backend == "llama3_relay" and relay.model_transaction_policy.decoupled
    assert relay.parameters["python_model_name"].string_value == "tensorrt_llm_bls_python"
    assert [i.name for i in relay.input] == [i.name for i in bls.input]  # the same contract, to the tensor
    assert [o.name for o in relay.output] == [o.name for o in bls.output]
    assert (repo / "tensorrt_llm_bls" / "1" / "libtriton_llama3_relay.so").is_file()


def test_the_benchmark_engine_behind_its_relay_keeps_the_engine_contract(tmp_path):
    repo = engine_relay.install(assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t"),
        synthetic=True, engine_instance_count=3)))
    relay = parse_model_config((repo / "tensorrt_llm" / "config.pbtxt").read_text(), "relay")
    engine = parse_model_config((repo / "tensorrt_llm_python" / "config.pbtxt").read_text(), "engine")
    assert relay.backend == "llama3_relay" and engine.backend == "python" and engine.name == "tensorrt_llm_python"
    assert relay.parameters["python_model_name"].string_value == "tensorrt_llm_python"
    assert relay.parameters["thread_name"].string_value == "engine_relay"
    assert engine.instance_group[0].count == 3 and relay.instance_group[0].count == 1
    assert [i.name for i in relay.input] == [i.name for i in engine.input]
    assert [o.name for o in relay.output] == [o.name for o in engine.output]
    # The relay forwards inputs in the shape it sees: it must not reshape them, the engine's own config does.
    assert not any(i.HasField("reshape") for i in relay.input)
    assert engine.input[[i.name for i in engine.input].index("request_output_len")].HasField("reshape")
    assert (repo / "tensorrt_llm" / "1" / "libtriton_llama3_relay.so").is_file()
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()
    # The product's engine model beside the one that sends to the relay, every file as the manifest now says.
    assert (repo / "tensorrt_llm_python" / "1" / "embedded_model.py").is_file()
    assert read_manifest(repo)["engine_relay"]
    assert re.fullmatch(r"[1-9]\d* files match repository.json", verify_model_files(repo / "tensorrt_llm_python" / "1"))


def test_the_engine_relay_is_for_the_synthetic_benchmark_engine_only(tmp_path):
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t")))
    with pytest.raises(RepositoryError, match="engine_relay"):
        engine_relay.install(repo)


def test_a_unary_repositorys_python_bls_is_tensorrt_llm_bls(tmp_path):
    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t"),
        decoupled=False))
    manifest = read_manifest(repo)
    assert "tensorrt_llm_bls_python" not in manifest["models"] and "tensorrt_llm_handoff" not in manifest["models"]
    assert manifest["topology"]["name"] == "unary"
    assert manifest["topology"]["paths"]["ensemble"] == ["ensemble", "preprocessing", "tensorrt_llm", "postprocessing"]
    bls = parse_model_config((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text(), "bls")
    assert bls.name == "tensorrt_llm_bls" and bls.backend == "python"
    assert (repo / "tensorrt_llm_bls" / "1" / "model.py").is_file()
    # One request at a time per instance (bls.transports), so Triton's queue bounds admission, a request per
    # execute; the instances are the concurrency.
    assert bls.parameters["transport"].string_value == "in_process"
    assert "max_concurrent_requests" not in bls.parameters
    assert list(bls.dynamic_batching.preferred_batch_size) == [1]
    assert bls.dynamic_batching.default_queue_policy.max_queue_size == 256
    assert bls.instance_group[0].count == default_bls_instance_count(relayed=False) >= 4


def test_the_topology_is_the_same_on_every_host_only_counts_scale(tmp_path, monkeypatch):
    """What CI builds on 2 cores is what a 16-core GPU host builds: the same models and paths
    (engine_build/topology.py); only instance and thread counts follow the cores."""
    built = {}
    for cpus in (2, 16):
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        settings = RepositorySettings(engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / f"tok{cpus}"),
                                      target=_fake_checkpoint(tmp_path / f"t{cpus}"))
        built[cpus] = read_manifest(assemble_repository(tmp_path / f"repo{cpus}", settings))
    small, large = built[2], built[16]
    assert small["models"] == large["models"]
    assert small["topology"]["name"] == large["topology"]["name"] == "streaming"
    assert small["topology"]["paths"] == large["topology"]["paths"] == {
        "ensemble": ["ensemble", "preprocessing", "tensorrt_llm_handoff", "tensorrt_llm", "postprocessing"],
        "tensorrt_llm_bls": ["tensorrt_llm_bls", "tensorrt_llm_bls_python", "preprocessing", "tensorrt_llm",
                             "postprocessing"]}
    assert small["topology"]["scaled_by_host"]["handoff_sender_threads"] == 1
    assert large["topology"]["scaled_by_host"]["handoff_sender_threads"] == 4


def test_a_streaming_repository_without_a_compiler_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    settings = dict(engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"),
                    target=_fake_checkpoint(tmp_path / "t"))
    with pytest.raises(RepositoryError, match="needs a C.. compiler .*no-such-compiler not found; install one "
                                              r"\(apt-get install g\+\+, or clang.*DECOUPLED=false"):
        assemble_repository(tmp_path / "repo", RepositorySettings(**settings))
    assert not (tmp_path / "repo" / "tensorrt_llm_bls").exists()
    repo = assemble_repository(tmp_path / "unary", RepositorySettings(**settings, decoupled=False))  # needs none
    assert parse_model_config((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text(), "bls").backend == "python"


def test_bls_instances_follow_the_host_cores():
    """Relayed, a 16-core GPU host gets 4 (measured best there: docs/benchmarks.md), this 2-core machine 1;
    in-process, an instance per core (each serves one request at a time), at least 4."""
    cpus = (1, 2, 4, 8, 16, 32, 128)
    assert [default_bls_instance_count(True, n) for n in cpus] == [1, 1, 1, 2, 4, 8, 8]
    assert [default_bls_instance_count(False, n) for n in cpus] == [4, 4, 4, 8, 16, 32, 32]


def _trtllm_config(engine_dir: str, **parameters) -> str:
    from engine_build.trtllm_config import engine_parameter_values

    return render_model_config(TEMPLATES / "tensorrt_llm" / "config.pbtxt", {
        "model_name": "tensorrt_llm", "triton_max_batch_size": 8, "decoupled_mode": True,
        "max_queue_delay_microseconds": 0, "max_queue_size": 0,
        **engine_parameter_values({"engine_dir": engine_dir, **parameters}),
    }, contract_name="tensorrt_llm")


def test_trtllm_config_targets_the_cpp_backend():
    config = parse_model_config(_trtllm_config("/engines/llama3", enable_kv_cache_reuse=True), "trtllm")
    assert config.backend == "tensorrtllm"
    assert config.parameters["gpt_model_path"].string_value == "/engines/llama3"
    assert config.parameters["enable_kv_cache_reuse"].string_value == "true"
    scalar = next(i for i in config.input if i.name == "request_output_len")
    assert list(scalar.reshape.shape) == [] and scalar.HasField("reshape")


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "precious.txt").write_text("keep me")
    with pytest.raises(RuntimeError, match="refusing to overwrite"):
        assemble_repository(tmp_path / "repo", RepositorySettings(
            engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"),
            target=_fake_checkpoint(tmp_path / "t")))
    assert (tmp_path / "repo" / "precious.txt").read_text() == "keep me"


def test_rendering_works_where_tritonclient_cannot_be_imported(monkeypatch, capsys):
    """The NGC server container need not have tritonclient: configs still render (strictly)."""
    import builtins

    from engine_build import render

    real_import = builtins.__import__

    def no_tritonclient(name, *args, **kwargs):
        if name.startswith("tritonclient"):
            raise ImportError("No module named 'tritonclient'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tritonclient)
    monkeypatch.setattr(render, "_warned", [])
    text = render_model_config(TEMPLATES / "postprocessing" / "config.pbtxt", {
        "triton_max_batch_size": 8, "postprocessing_max_queue_delay_microseconds": 0,
        "postprocessing_instance_count": 1, "tokenizer_dir": "tok", "skip_special_tokens": True,
    }, contract_name="postprocessing")
    assert 'name: "postprocessing"' in text and "${" not in text
    assert "not parsed" in capsys.readouterr().err
    with pytest.raises(TemplateError, match="unfilled"):  # strictness does not depend on the schema
        render_template("a: ${b}", {}, "t")


def test_the_repository_is_self_contained_and_checks_its_files(tmp_path):
    """Every Python model ships the library it imports and its tokenizer; no config names a path of the build
    machine; repository.json's checksums catch a file changed after the build."""
    from bls.artifact import ArtifactError, verify_model_files

    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t")))
    assert "tensorrt_llm_bls/1/libtriton_llama3_relay.so" in read_manifest(repo)["files"]
    for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls_python", "tensorrt_llm"):
        version = repo / model / "1"
        assert (version / "bls" / "contract.py").is_file(), model
        assert str(tmp_path) not in (repo / model / "config.pbtxt").read_text(), model
        assert "files match" in verify_model_files(version)
    assert (repo / "tensorrt_llm" / "1" / "embedded_engine" / "scheduler.py").is_file()
    assert (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").is_file()
    assert not (repo / "preprocessing" / "1" / "tokenizer" / "model.safetensors").exists()  # never the weights
    manifest = read_manifest(repo)
    assert manifest["versions"]["transformers"] and "preprocessing/1/tokenizer/tokenizer.json" in manifest["files"]

    (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").unlink()  # a hard link: replace, not edit
    (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").write_text('{"edited": true}')
    with pytest.raises(ArtifactError, match="preprocessing/1/tokenizer/tokenizer.json differs"):
        verify_model_files(repo / "preprocessing" / "1")
    (repo / "postprocessing" / "1" / "bls" / "contract.py").unlink()
    with pytest.raises(ArtifactError, match="postprocessing/1/bls/contract.py is missing"):
        verify_model_files(repo / "postprocessing" / "1")


def test_dist_packs_the_checked_repository(tmp_path):
    import tarfile

    from engine_build import cli

    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t")))
    cli.main(["dist", "--repo", str(repo), "--out", str(tmp_path / "dist")])
    (tarball,) = (tmp_path / "dist").glob("repo-embedded-*.tar.gz")
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    assert "repo/repository.json" in names
    assert {f"repo/{name}" for name in read_manifest(repo)["files"]} <= names
    (repo / "tensorrt_llm" / "1" / "checkpoint" / "config.json").unlink()
    with pytest.raises(RuntimeError, match="checkpoint/config.json is missing"):  # never ship a damaged copy
        cli.main(["dist", "--repo", str(repo), "--out", str(tmp_path / "dist2")])


def test_relocate_points_the_cpp_backend_at_the_served_path(tmp_path):
    from engine_build import cli

    repo = tmp_path / "repo"
    (repo / "tensorrt_llm").mkdir(parents=True)
    built = "/build/machine/tensorrt_llm/1"
    text = _trtllm_config(built, guided_decoding_backend="xgrammar",
                          xgrammar_tokenizer_info_path=f"{built}/xgrammar_tokenizer_info.json")
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(text)
    cli.main(["relocate", "--repo", str(repo), "--serve-path", "/models/llama3"])
    config = parse_model_config((repo / "tensorrt_llm" / "config.pbtxt").read_text(), "moved")
    assert config.parameters["gpt_model_path"].string_value == "/models/llama3/tensorrt_llm/1"
    assert (config.parameters["xgrammar_tokenizer_info_path"].string_value
            == "/models/llama3/tensorrt_llm/1/xgrammar_tokenizer_info.json")
    assert config.parameters["lora_prefetch_dir"].string_value == "${lora_prefetch_dir}"  # unset stays unset
    with pytest.raises(SystemExit, match="must be absolute"):
        cli.main(["relocate", "--repo", str(repo), "--serve-path", "models/llama3"])


def test_stream_interval_reaches_the_bls_config(tmp_path):
    from argparse import Namespace

    from engine_build.settings_args import bls_settings

    repo = assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t"),
        **bls_settings(Namespace(stream_interval=4, bls_instances=None))))
    bls = parse_model_config((repo / "tensorrt_llm_bls_python" / "config.pbtxt").read_text(), "bls")
    assert bls.parameters["stream_interval"].string_value == "4"
    with pytest.raises(SystemExit, match="--stream-interval must be at least 1"):
        bls_settings(Namespace(stream_interval=0, bls_instances=None))


def test_the_embedded_default_is_never_built_over_tensorrt_llm_engines(tmp_path):
    """`make serve` builds the embedded default into REPO first: over a GPU repository it would delete the engines."""
    from engine_build.repository import MANIFEST, RepositoryError, _prepare_output_dir

    (tmp_path / "tensorrt_llm" / "1").mkdir(parents=True)
    (tmp_path / "tensorrt_llm" / "1" / "rank0.engine").write_bytes(b"engine")
    (tmp_path / MANIFEST).write_text("{}")
    engines = tmp_path / "new-engine"
    for settings in (SimpleNamespace(engine="embedded", target=tmp_path / "tiny"),
                     SimpleNamespace(engine="trtllm", target=engines)):  # a dry run: no engine built
        with pytest.raises(RepositoryError, match=r"holds TensorRT-LLM engines.*make serve-only REPO="):
            _prepare_output_dir(tmp_path, settings)
        assert (tmp_path / "tensorrt_llm" / "1" / "rank0.engine").is_file()
    engines.mkdir()
    (engines / "rank0.engine").write_bytes(b"new")
    _prepare_output_dir(tmp_path, SimpleNamespace(engine="trtllm", target=engines))  # a rebuild replaces it
    assert not any(tmp_path.iterdir())
