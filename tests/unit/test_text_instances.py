"""The ensemble's sizing in a built repository: its Python steps' instances and the handoff's sender threads sized
from the host's cores (overridable from the command line, as `make repo PREPROCESSING_INSTANCES=...
POSTPROCESSING_INSTANCES=... HANDOFF_SENDER_THREADS=...` passes them), postprocessing's batching of every stream's
tokens, and the handoff in front of the engine where the relay is built."""

from argparse import Namespace

import pytest

from bls.contract import HANDOFF_TEXT_STATE
from engine_build.render import parse_model_config
from engine_build.repository import (
    HANDOFF_MODEL,
    RELAY_LIBRARY,
    TARGET_MODEL,
    RepositorySettings,
    assemble_repository,
    default_handoff_sender_threads,
    default_postprocessing_instance_count,
    default_preprocessing_instance_count,
    read_manifest,
)
from engine_build.settings_args import text_instance_settings
from tests.unit.test_render import _fake_checkpoint, _fake_tokenizer


def test_instances_follow_the_host_cores():
    """preprocessing (once per request): one per 4 cores, 1 to 8; postprocessing (once per token): one per 2 cores, 1
    to 16; the handoff's senders: one per 4 cores, 1 to 8. A 2-core machine keeps one of each; a 16-core GPU host
    gets 4, 8 and 4 (measured on both: docs/benchmarks.md)."""
    cpus = (1, 2, 4, 8, 16, 32, 64)
    assert [default_preprocessing_instance_count(n) for n in cpus] == [1, 1, 1, 2, 4, 8, 8]
    assert [default_postprocessing_instance_count(n) for n in cpus] == [1, 1, 2, 4, 8, 16, 16]
    assert [default_handoff_sender_threads(n) for n in cpus] == [1, 1, 1, 2, 4, 8, 8]


def _repository(tmp_path, **settings):
    return assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t"),
        **settings))


def _config(repo, model):
    return parse_model_config((repo / model / "config.pbtxt").read_text(), model)


def test_default_repository_sizes_its_text_steps_from_this_host(tmp_path):
    repo = _repository(tmp_path)
    assert _config(repo, "preprocessing").instance_group[0].count == default_preprocessing_instance_count() == \
        read_manifest(repo)["preprocessing_instance_count"]
    assert _config(repo, "postprocessing").instance_group[0].count == default_postprocessing_instance_count() == \
        read_manifest(repo)["postprocessing_instance_count"]


def test_command_line_instances_reach_the_configs(tmp_path):
    repo = _repository(tmp_path, **text_instance_settings(
        Namespace(preprocessing_instances=3, postprocessing_instances=5, handoff_sender_threads=6)))
    assert _config(repo, "preprocessing").instance_group[0].count == 3
    assert _config(repo, "postprocessing").instance_group[0].count == 5
    assert _config(repo, HANDOFF_MODEL).parameters["sender_threads"].string_value == "6"
    unset = dict(preprocessing_instances=None, postprocessing_instances=None, handoff_sender_threads=None)
    assert text_instance_settings(Namespace(**unset)) == {}
    with pytest.raises(SystemExit, match="--postprocessing-instances must be at least 1"):
        text_instance_settings(Namespace(**{**unset, "postprocessing_instances": 0}))
    with pytest.raises(SystemExit, match="--handoff-sender-threads must be at least 1"):
        text_instance_settings(Namespace(**{**unset, "handoff_sender_threads": 0}))
    with pytest.raises(SystemExit, match="--handoff-sender-threads must be at most 256"):
        text_instance_settings(Namespace(**{**unset, "handoff_sender_threads": 257}))


def _ensemble_engine_step(repo) -> str:
    steps = _config(repo, "ensemble").ensemble_scheduling.step
    return next(step.model_name for step in steps if "_TOKENS_BATCH" in step.output_map.values())


def test_a_streaming_ensemble_reaches_the_engine_through_the_handoff(tmp_path):
    """Streaming (every host): the ensemble's engine step is the handoff (the engine's tensors, decoupled), which
    forwards to tensorrt_llm; unary (DECOUPLED=false): the engine itself."""
    for name in ("relayed", "unary"):
        (tmp_path / name).mkdir()
    relayed = _repository(tmp_path / "relayed", handoff_sender_threads=3)
    assert _ensemble_engine_step(relayed) == HANDOFF_MODEL
    handoff = _config(relayed, HANDOFF_MODEL)
    engine = _config(relayed, TARGET_MODEL)
    assert handoff.backend == "llama3_relay" and handoff.model_transaction_policy.decoupled
    assert handoff.parameters["handoff_to"].string_value == TARGET_MODEL
    assert handoff.parameters["sender_threads"].string_value == "3"
    # The engine's outputs, then its own stream state for postprocessing (exact streamed text), mapped by the ensemble.
    outputs = [(t.name, t.data_type) for t in handoff.output]
    assert outputs[: len(engine.output)] == [(t.name, t.data_type) for t in engine.output]
    assert [name for name, _ in outputs[len(engine.output):]] == list(HANDOFF_TEXT_STATE)
    post_step = _config(relayed, "ensemble").ensemble_scheduling.step[2]
    assert set(post_step.input_map) == {"TOKENS_BATCH", "SEQUENCE_LENGTH", *HANDOFF_TEXT_STATE.values()}
    assert [(t.name, t.data_type) for t in handoff.input] == [(t.name, t.data_type) for t in engine.input]
    assert handoff.max_batch_size == engine.max_batch_size
    assert (relayed / HANDOFF_MODEL / "1" / RELAY_LIBRARY).is_file()
    for repo in (_repository(tmp_path / "unary", decoupled=False),):
        assert _ensemble_engine_step(repo) == TARGET_MODEL and not (repo / HANDOFF_MODEL).exists()
        # No handoff, no stream state: postprocessing gets NVIDIA's two inputs (one response a request unstreamed).
        assert set(_config(repo, "ensemble").ensemble_scheduling.step[2].input_map) == {"TOKENS_BATCH",
                                                                                        "SEQUENCE_LENGTH"}


def test_postprocessing_batches_streams_for_at_most_its_delay(tmp_path):
    """A batch of up to max_batch_size requests (every stream's token of an engine step), held at most the delay;
    preprocessing keeps the repository's queue delay and its bounded queue."""
    repo = _repository(tmp_path, triton_max_batch_size=32, postprocessing_max_queue_delay_microseconds=700,
                       max_queue_delay_microseconds=0)
    post = _config(repo, "postprocessing").dynamic_batching
    assert list(post.preferred_batch_size) == [32] and post.max_queue_delay_microseconds == 700
    assert not post.HasField("default_queue_policy"), "a refused token would lose text mid-stream"
    pre = _config(repo, "preprocessing").dynamic_batching
    assert pre.max_queue_delay_microseconds == 0 and pre.default_queue_policy.max_queue_size == 256
