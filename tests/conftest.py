"""Shared fixtures and command-line options.

--repo        the rendered model repository the integration tests serve (default build/model_repository)
--server-url  host of an already running tritonserver (HTTP port 8000 / gRPC 8001 unless given as
              host:http_port[,grpc_port]); the tests then start no server. This is how they run inside the
              NGC TensorRT-LLM container against a real engine.
"""

from __future__ import annotations

import os
from pathlib import Path

# Before torch is imported: busy-waiting OpenMP threads starve the server's processes on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser):
    parser.addoption("--repo", default=str(ROOT / "build" / "model_repository"))
    parser.addoption("--server-url", default=None)


@pytest.fixture(scope="session")
def repo_dir(request) -> Path:
    return Path(request.config.getoption("--repo")).resolve()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, repo_dir) -> Path:
    """The tokenizer the repository serves; without a built repository, Llama 3's converted fresh (~5 s)."""
    from engine_build.repository import repository_tokenizer

    if repository_tokenizer(repo_dir).is_dir():
        return repository_tokenizer(repo_dir)
    from engine_build.assets.tokenizer import write_llama3_tokenizer

    return write_llama3_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def bundle(tokenizer_dir):
    """The tokenizer bundle every text test shares (loading it takes ~2 s)."""
    from bls.text.tokenizer import TokenizerBundle

    return TokenizerBundle.from_dir(tokenizer_dir)
