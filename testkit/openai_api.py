"""The OpenAI-compatible API (`python -m openai_api`) as a child process of the tests and benchmarks."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from serving.tritonserver import answers_200

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ApiProcess:
    url: str  # http://127.0.0.1:PORT (the API's routes are under /v1)
    process: subprocess.Popen
    log: Path

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def openai_api(grpc_url: str, log: Path, *args: str, startup_timeout_s: float = 60) -> Iterator[ApiProcess]:
    """The API on a free loopback port in front of tritonserver's gRPC endpoint, ready (its /health/ready is 200)
    when this yields; stopped on exit."""
    port = free_port()
    with open(log, "w") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "openai_api", "--triton-grpc", grpc_url, "--host",
                                    "127.0.0.1", "--port", str(port), *args],
                                   cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    api = ApiProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not answers_200(f"{api.url}/health/ready"):
            if process.poll() is not None:
                raise RuntimeError(f"the OpenAI-compatible API exited ({process.returncode}): {log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI-compatible API was not ready in {startup_timeout_s:.0f} s: "
                                   f"{log.read_text()}")
            time.sleep(0.2)
        yield api
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
