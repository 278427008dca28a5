"""How `make serve` launches tritonserver for a TensorRT-LLM repository, as TensorRT-LLM 1.2's
triton_backend/scripts/launch_triton_server.py does (read from its source; not runnable here)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from serving import tritonserver
from serving.tritonserver import ORCHESTRATOR_ENVIRONMENT, ServerPorts, needs_orchestrator, server_command


@pytest.fixture(autouse=True)
def fake_install(monkeypatch):
    monkeypatch.setattr(tritonserver, "find_tritonserver",
                        lambda: tritonserver.TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None))
    monkeypatch.setattr(tritonserver, "gpu_available", lambda: True)


def _ranks(command: list[str]) -> list[list[str]]:
    """The per-rank argv of an mpirun command (ranks are separated by ':')."""
    ranks, current = [], []
    for arg in command[2:]:
        if arg == ":":
            ranks.append(current)
            current = []
        else:
            current.append(arg)
    return ranks + [current]


def test_tp2_without_a_draft_is_leader_mode():
    command = server_command(Path("/repo"), ServerPorts(), exit_timeout=30, world_size=2)
    assert command[:2] == ["mpirun", "--allow-run-as-root"]
    first, second = _ranks(command)
    assert first[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert "--model-control-mode=explicit" not in first
    assert "--model-control-mode=explicit" in second and "--load-model=tensorrt_llm" in second
    assert "--backend-config=python,shm-region-prefix-name=prefix1_" in second


def test_a_draft_needs_orchestrator_mode_with_world_size_one():
    assert needs_orchestrator({"engine": "trtllm", "draft": "/a/draft"})
    assert not needs_orchestrator({"engine": "trtllm", "draft": None})
    assert not needs_orchestrator({"engine": "embedded", "draft": "/a/draft"})  # Python backend: no MPI
    command = server_command(Path("/repo"), ServerPorts(), exit_timeout=30, world_size=2, orchestrator=True,
                             engine_model_names=("tensorrt_llm", "tensorrt_llm_draft"))
    assert command[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and ":" not in command
    assert command.count("/opt/tritonserver/bin/tritonserver") == 1
    assert "--model-control-mode=explicit" not in command
    assert {"--enable-peer-access=false", "--cuda-memory-pool-byte-size=0:0",
            "--cuda-memory-pool-byte-size=1:0"} <= set(command)
    assert ORCHESTRATOR_ENVIRONMENT == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def test_the_http_thread_queue_is_measured_as_libevhtp_fills_it():
    """The count of 17-byte commands a non-blocking unix socketpair takes: what one HTTP thread may have queued."""
    capacity = tritonserver.http_thread_queue_capacity()
    assert 0 < capacity < 1 << 20


def test_a_small_http_thread_queue_is_a_warning_naming_the_sysctl(monkeypatch):
    monkeypatch.setattr(tritonserver, "http_thread_queue_capacity", lambda: 278)
    warning = tritonserver.http_queue_warning()
    assert "queue only 278 responses" in warning and "sysctl -w net.core.wmem_default=4194304" in warning
    monkeypatch.setattr(tritonserver, "http_thread_queue_capacity", lambda: 5462)
    assert tritonserver.http_queue_warning() is None


@pytest.mark.parametrize("manifest, ranks, orchestrator", [
    ({"engine": "trtllm", "world_size": 4, "draft": None}, 4, False),  # 70B TP=4: leader mode, four ranks
    ({"engine": "trtllm", "world_size": 2, "draft": "/a/draft-engine"}, 1, True),  # a draft: orchestrator, world 1
    ({"engine": "embedded", "world_size": 1, "draft": None}, 1, False),
])
def test_an_existing_repository_serves_as_it_was_built(tmp_path, manifest, ranks, orchestrator):
    """make serve-only passes no sizes: the launch follows the repository's repository.json."""
    import json

    (tmp_path / "repository.json").write_text(json.dumps(manifest))
    command, env = tritonserver.launch(tmp_path, ServerPorts())
    assert (command[0] == "mpirun") == (ranks > 1 or orchestrator)
    assert (len(_ranks(command)) if command[0] == "mpirun" else 1) == ranks
    assert all(env.get(key) == value for key, value in ORCHESTRATOR_ENVIRONMENT.items()) == orchestrator


def test_a_servers_three_ports_are_distinct():
    """Each port's socket stays bound until all three are chosen: the kernel never hands one out twice (a server
    given one port for HTTP and gRPC exits with its usage text; seen once in CI)."""
    for _ in range(200):
        ports = ServerPorts.free()
        assert len({ports.http, ports.grpc, ports.metrics}) == 3, ports


def test_a_container_tritonserver_gets_the_library_path_untouched(monkeypatch):
    """The container's tritonserver (on PATH) is launched with the host's LD_LIBRARY_PATH as it is: Python's LIBDIR
    there is /usr/lib/x86_64-linux-gnu, which would shadow the image's CUDA forward-compatibility libcuda."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/compat/lib")
    assert tritonserver.server_environment()["LD_LIBRARY_PATH"] == "/usr/local/cuda/compat/lib"


def test_the_wheels_tritonserver_gets_this_pythons_libpython_first(monkeypatch):
    import sysconfig

    monkeypatch.setattr(tritonserver, "find_tritonserver",
                        lambda: tritonserver.TritonInstall(Path("/wheel/bin/tritonserver"), Path("/wheel/backends")))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/host/lib")
    assert tritonserver.server_environment()["LD_LIBRARY_PATH"].split(":") == [
        sysconfig.get_config_var("LIBDIR"), "/host/lib"]


def test_a_stub_that_cannot_load_libpython_stops_set_up_naming_the_package(tmp_path):
    from serving.tritonserver import check_stub_starts

    stub = tmp_path / "triton_python_backend_stub"
    stub.write_text("#!/bin/sh\necho 'triton_python_backend_stub: error while loading shared libraries: "
                    "libpython3.11.so.1.0: cannot open shared object file: No such file or directory' >&2\nexit 127\n")
    stub.chmod(0o755)
    expected = r"(?s)libpython3\.11\.so\.1\.0: cannot open shared object file.*apt-get install libpython3\.\d+"
    with pytest.raises(SystemExit, match=expected):
        check_stub_starts(stub)


def test_the_installed_stub_starts_with_this_python():
    from serving.tritonserver import _wheel_root, check_stub_starts

    if shutil.which("tritonserver"):
        pytest.skip("tritonserver on PATH (a container's): it brings its own stub, install-stub installs none")
    check_stub_starts(_wheel_root() / "backends" / "python" / "triton_python_backend_stub")


def test_the_exit_timeout_is_sized_from_the_model_with_the_most_python_instances():
    """A model's instances unload one after another, INSTANCE_UNLOAD_S each (python_backend's 1 s health check, then
    the stub's exit); the engine's unload is ENGINE_UNLOAD_S; STREAMS_END_S before either."""
    assert tritonserver.exit_timeout_s({"engine": "embedded", "postprocessing_instance_count": 1}) == \
        tritonserver.STREAMS_END_S + tritonserver.ENGINE_UNLOAD_S
    assert tritonserver.exit_timeout_s({"engine": "embedded", "postprocessing_instance_count": 8,
                                        "bls_instance_count": 2}) == 5 + 8 * 3
    assert tritonserver.exit_timeout_s({"engine": "embedded", "bls_instance_count": 32}) == 5 + 32 * 3  # unary
    assert tritonserver.exit_timeout_s({"engine": "trtllm", "postprocessing_instance_count": 8}) == 120


def test_launch_passes_the_repositorys_exit_timeout(tmp_path):
    (tmp_path / "repository.json").write_text(json.dumps({"engine": "embedded", "bls_instance_count": 16}))
    command, _ = tritonserver.launch(tmp_path, ServerPorts())
    assert f"--exit-timeout-secs={5 + 16 * 3}" in command


def _child(code: str) -> subprocess.Popen:
    """A Python child that says when its SIGTERM handler is in place (then `code` runs in the handler)."""
    script = ("import signal, sys, time\n"
              f"def stop(signum, frame):\n    {code}\n"
              "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    return child


def test_stop_in_order_stops_tritonserver_then_the_api_and_says_how_it_went():
    """tritonserver first, then the API; the API's own SIGTERM after a graceful shutdown (uvicorn raises it again) is a
    clean stop; tritonserver's failure is the status."""
    server = _child("sys.exit(0)")
    api = _child("signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.raise_signal(signal.SIGTERM)")
    assert tritonserver.stop_in_order(server, api) == 0
    assert server.returncode == 0 and api.returncode == -signal.SIGTERM
    failing_server, api = _child("sys.exit(1)"), _child("sys.exit(0)")
    assert tritonserver.stop_in_order(failing_server, api) == 1
    assert api.returncode == 0  # stopped all the same
    server, failing_api = _child("sys.exit(0)"), _child("sys.exit(3)")
    assert tritonserver.stop_in_order(server, failing_api) == 3
