"""The server the integration tests talk to: started here on free ports, or given by --server-url."""

from __future__ import annotations

import json
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from engine_build.repository import RepositorySettings, assemble_repository, repository_tokenizer
from serving.tritonserver import TritonServer, is_ready

ASSETS = Path(__file__).resolve().parents[2] / "build" / "assets"


@dataclass(frozen=True)
class Endpoint:
    http: str  # host:port
    grpc: str
    metrics: str  # full URL of the Prometheus endpoint

    def model_config(self, model: str) -> dict:
        with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/config", timeout=10) as response:
            return json.loads(response.read())

    def model_parameter(self, model: str, key: str) -> str | None:
        value = self.model_config(model).get("parameters", {}).get(key)
        return None if value is None else value["string_value"]

    def has_model(self, model: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/ready", timeout=10) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics, timeout=10) as response:
            return response.read().decode()


def _parse_url(url: str) -> Endpoint:
    host, _, ports = url.partition(":")
    http, _, grpc = (ports or "8000").partition(",")
    grpc = grpc or str(int(http) + 1)
    return Endpoint(f"{host}:{http}", f"{host}:{grpc}", f"http://{host}:{int(http) + 2}/metrics")


@pytest.fixture(scope="session")
def endpoint(request, repo_dir, tmp_path_factory):
    url = request.config.getoption("--server-url")
    if url:
        endpoint = _parse_url(url)
        if not is_ready(endpoint.http):
            pytest.exit(f"--server-url {url}: server is not ready at http://{endpoint.http}", returncode=2)
        yield endpoint
        return
    if not (repo_dir / "ensemble").is_dir():
        pytest.exit(f"{repo_dir} is not a built model repository: run `make repo`", returncode=2)
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with TritonServer(repo_dir, log_path=log) as server:
        yield Endpoint(server.http_url, server.grpc_url, server.metrics_url)
        assert server.is_alive(), f"tritonserver died during the tests; see {log}"


@pytest.fixture(scope="session")
def tokenizer_dir(endpoint, repo_dir):
    """The tokenizer the server under test uses: the one its repository ships (--repo: the served repository,
    also with --server-url)."""
    tokenizer = repository_tokenizer(repo_dir)
    if not tokenizer.is_dir():
        pytest.exit(f"{tokenizer} is missing: give --repo the repository the server serves", returncode=2)
    return tokenizer


@contextmanager
def built_repository_server(request, tmp_path_factory, name: str, **settings) -> Iterator[TritonServer]:
    """tritonserver on a repository assembled here from build/assets (the tokenizer, the tiny target) with
    RepositorySettings fields overridden: for tests of build-time settings, which --server-url cannot serve."""
    if request.config.getoption("--server-url"):
        pytest.skip("builds and starts its own repository")
    if not (ASSETS / "tokenizer" / "tokenizer.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    repo = assemble_repository(tmp_path_factory.mktemp(name) / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq", **settings))
    with TritonServer(repo, log_path=tmp_path_factory.mktemp("log") / "tritonserver.log") as server:
        yield server


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
