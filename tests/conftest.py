"""Shared fixtures and command-line options.

--repo        the rendered model repository the integration tests serve (default build/model_repository)
--server-url  host of an already running tritonserver (HTTP port 8000 / gRPC 8001 unless given as
              host:http_port[,grpc_port]); the tests then start no server. This is how they run inside the
              NGC TensorRT-LLM container against a real engine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Before torch is imported: busy-waiting OpenMP threads starve the server's processes on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser):
    parser.addoption("--repo", default=str(ROOT / "build" / "model_repository"))
    parser.addoption("--server-url", default=None)


@pytest.fixture(scope="session", autouse=True)
def relay_compiled_once(tmp_path_factory):
    """Every repository a test assembles compiles the relay (relay/*.cc, ~8 s on 2 cores), from the same sources
    with the same command: compiled once per command (compiler, flags, headers) in a session, copied after that."""
    from engine_build import repository

    compile_relay = repository.compile_relay
    compiled: dict[tuple[str, ...], Path] = {}

    def compile_once(library: Path) -> None:
        command = tuple(repository.relay_compile_command(Path("<library>")))
        if command not in compiled:
            built = tmp_path_factory.mktemp("relay") / repository.RELAY_LIBRARY
            compile_relay(built)
            compiled[command] = built
        shutil.copy2(compiled[command], library)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repository, "compile_relay", compile_once)
        yield


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
