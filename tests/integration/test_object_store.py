"""A repository served from an object store, as check-repo predicts: Triton's own s3:// support (built into the
tritonserver here, as into the 26.07 image's) against an S3-compatible server (moto's, from PyPI), the repository's
files uploaded as listed in its repository.json.

- A repository whose models ship no backend library and name no absolute path (a unary one, DECOUPLED=false, embedded
  engine) serves from the store as is: Triton copies it to a temporary folder; the answers equal the local server's.
- The relay (a model's own backend library) and ENGINE=trtllm's absolute engine paths need a local folder: check-repo
  says so, and docs/operations.md says to sync the repository there first.
"""

from __future__ import annotations

import json
import socket

import pytest

from engine_build.check_repo import check_repository
from engine_build.repository import MANIFEST
from serving.tritonserver import TritonServer
from testkit.http import generate

from .conftest import assembled_repository

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

BUCKET = "models"
PROMPT = {"text_input": "Once upon a time", "max_tokens": 12}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def unary_repo(tmp_path_factory):
    return assembled_repository(tmp_path_factory, "unary", decoupled=False)


@pytest.fixture(scope="module")
def s3_url(unary_repo):
    """The unary repository in a bucket of a local S3 server: tritonserver's URL for it."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as env:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1"}.items():
            env.setenv(key, value)  # read by boto3 here and by tritonserver, which inherits this environment
        host, port = server.get_host_and_port()
        s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
        s3.create_bucket(Bucket=BUCKET)
        files = [MANIFEST, *json.loads((unary_repo / MANIFEST).read_text())["files"]]
        for name in files:
            s3.upload_file(str(unary_repo / name), BUCKET, f"llama3/{name}")
        yield f"s3://http://{host}:{port}/{BUCKET}/llama3"
    server.stop()


def test_check_repo_says_where_each_repository_can_be_served_from(repo_dir, unary_repo):
    assert check_repository(unary_repo).model_libraries == []
    assert "or an object store as is" in check_repository(unary_repo).text(unary_repo)
    relayed = check_repository(repo_dir)  # the default repository: streaming, the relay built
    assert "tensorrt_llm_bls/1/libtriton_llama3_relay.so" in relayed.model_libraries
    assert "From an object store, sync it to one first" in relayed.text(repo_dir)


@pytest.mark.slow
def test_a_repository_without_model_libraries_serves_from_s3_as_is(s3_url, endpoint, tmp_path):
    with TritonServer(s3_url, log_path=tmp_path / "tritonserver.log") as server:
        for model in ("ensemble", "tensorrt_llm_bls"):
            remote = generate(server.http_url, model, PROMPT)
            assert remote["text_output"] == generate(endpoint.http, model, PROMPT)["text_output"], model
