"""However tritonserver ends with streams in flight (SIGKILL; a crash; SIGTERM, which waits --exit-timeout-secs for
them and then exits without unloading the models), every Python backend stub ends within seconds of it
(bls/server_watch.py), and so do their watchers: none is left holding its model's memory and threads for
nobody. The relay's Python processes
are these stubs (tensorrt_llm_bls_python's).

The server is not reaped until the end: a killed parent that its own parent has not waited for yet is a zombie,
which python_backend's own check (kill(pid, 0)) takes for alive.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from engine_build.repository import RepositorySettings, assemble_repository
from serving.tritonserver import TritonServer
from testkit.http import HttpSession
from testkit.processes import triton_processes
from tests.integration.conftest import ASSETS

# tritonserver's --exit-timeout-secs (serving.tritonserver) and the watch's poll, with room for a loaded 2-core host.
EXIT_TIMEOUT_S = 10
STUBS_GONE_WITHIN_S = 5.0
LONG_STREAM = {"text_input": "tell me", "max_tokens": 4000, "end_id": -1, "stream": True}  # 20 s at 5 ms a step


@pytest.fixture(scope="module")
def paced_repo(tmp_path_factory) -> Path:
    """The synthetic engine at 5 ms a step: quick to start, streams that last."""
    if not (ASSETS / "tokenizer" / "tokenizer.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    return assemble_repository(tmp_path_factory.mktemp("server_exit") / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq", synthetic=True,
        step_ms=5.0))


def start_streams(server: TritonServer) -> list[threading.Thread]:
    """A BLS stream (through the relay, where there is one) and an ensemble stream, each running once this returns."""
    started = [threading.Event(), threading.Event()]
    threads = []
    for model, event in zip(("tensorrt_llm_bls", "ensemble"), started, strict=True):
        def run(model=model, event=event):
            try:
                HttpSession(server.http_url, timeout_s=60).generate_stream(model, LONG_STREAM,
                                                                           on_event=lambda _: event.set())
            except Exception:  # noqa: BLE001 - the server is killed under it: how the stream ends is not the point
                pass
        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()
    for model, event in zip(("tensorrt_llm_bls", "ensemble"), started, strict=True):
        assert event.wait(60), f"no {model} stream started"
    return threads


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("ending", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM], ids=lambda s: s.name)
def test_every_stub_exits_when_tritonserver_ends(paced_repo, tmp_path, ending):
    with TritonServer(paced_repo, log_path=tmp_path / "tritonserver.log") as server:
        start_streams(server)
        stubs = {name: process for name, process in triton_processes(server.process.pid).items()
                 if name != "tritonserver"}
        assert {"preprocessing_0_0", "postprocessing_0_0", "tensorrt_llm_0_0"} <= set(stubs), stubs
        watchers = {f"{name}'s watcher": child for name, stub in stubs.items() for child in stub.children()}
        assert len(watchers) == len(stubs), watchers
        os.kill(server.process.pid, ending)  # the server alone, not its process group: nothing else ends the stubs
        server_gone = time.monotonic()
        if ending == signal.SIGTERM:  # it waits out --exit-timeout-secs for the streams, then exits
            deadline = server_gone + EXIT_TIMEOUT_S + 30
            while alive(psutil.Process(server.process.pid)):
                assert time.monotonic() < deadline, "tritonserver did not exit after SIGTERM"
                time.sleep(0.1)
            server_gone = time.monotonic()
        while any(alive(process) for process in {**stubs, **watchers}.values()):
            left = [name for name, process in {**stubs, **watchers}.items() if alive(process)]
            assert time.monotonic() < server_gone + STUBS_GONE_WITHIN_S, f"stubs outlived tritonserver: {left}"
            time.sleep(0.05)
        log = server.log_path.read_text(errors="replace")
        if ending != signal.SIGTERM:
            for name, stub in stubs.items():
                assert f"is gone; its stub process (pid {stub.pid}) is killed" in log, name
        server.process.wait()  # reaped only now
