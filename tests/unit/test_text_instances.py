"""The ensemble's Python steps in a built repository: instances sized from the host's cores (overridable from the
command line, as `make repo PREPROCESSING_INSTANCES=... POSTPROCESSING_INSTANCES=...` passes them) and
postprocessing's batching of every stream's tokens."""

from argparse import Namespace

import pytest

from engine_build.settings_args import text_instance_settings
from engine_build.render import parse_model_config
from engine_build.repository import (
    RepositorySettings, assemble_repository, default_postprocessing_instance_count, default_preprocessing_instance_count,
    read_manifest,
)
from tests.unit.test_render import _fake_checkpoint, _fake_tokenizer


def test_instances_follow_the_host_cores():
    """One of each per 4 cores, 1 to 8: a 2-core machine keeps one of each, a 16-core GPU host gets 4 (measured
    best there for postprocessing: docs/benchmarks.md)."""
    cpus = (1, 2, 4, 8, 16, 32, 64)
    assert [default_preprocessing_instance_count(n) for n in cpus] == [1, 1, 1, 2, 4, 8, 8]
    assert [default_postprocessing_instance_count(n) for n in cpus] == [1, 1, 1, 2, 4, 8, 8]


def _repository(tmp_path, **settings):
    return assemble_repository(tmp_path / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=_fake_tokenizer(tmp_path / "tok"), target=_fake_checkpoint(tmp_path / "t"),
        relay="off", **settings))


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
        Namespace(preprocessing_instances=3, postprocessing_instances=5)))
    assert _config(repo, "preprocessing").instance_group[0].count == 3
    assert _config(repo, "postprocessing").instance_group[0].count == 5
    assert text_instance_settings(Namespace(preprocessing_instances=None, postprocessing_instances=None)) == {}
    with pytest.raises(SystemExit, match="--postprocessing-instances must be at least 1"):
        text_instance_settings(Namespace(preprocessing_instances=None, postprocessing_instances=0))


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
