"""Start, probe and stop tritonserver for this repository.

Which server: `tritonserver` on PATH when there is one (the NGC container), else the Triton 2.51 build
inside the nvidia-pytriton wheel. The wheel's Python backend needs three things that are easy to miss:
its stub copied next to the backend, the venv's bin/ first on PATH (the stub ignores PYTHONPATH and
takes its prefix from the first python3 on PATH), and the interpreter's own libpython on
LD_LIBRARY_PATH (a pyenv venv otherwise mixes Debian's libpython with pyenv's stdlib and `ssl` fails). A
tritonserver on PATH (a container's) is launched with the environment as it is, but for PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from engine_build.gpu import gpu_available

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None  # None: the binary's built-in default (/opt/tritonserver/backends)


# tritonserver in NVIDIA's containers (the 26.07 TensorRT-LLM one among them).
CONTAINER_TRITONSERVER = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None)


def _wheel_root() -> Path:
    # Located, not imported: importing pytriton pulls in its client stack (gevent, ...), which a host that
    # only serves does not need.
    spec = importlib.util.find_spec("pytriton")  # the nvidia-pytriton wheel
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("pytriton")
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def find_tritonserver() -> TritonInstall:
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), None)
    try:
        root = _wheel_root()
    except ImportError:
        raise SystemExit("no tritonserver on PATH and nvidia-pytriton is not installed: run `make setup`") from None
    return TritonInstall(root / "bin" / "tritonserver", root / "backends")


def install_stub() -> Path | None:
    """Copy the Python backend stub matching this interpreter into the wheel's backend dir (idempotent)."""
    if shutil.which("tritonserver"):
        return None
    root = _wheel_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = root / "python_backend_stubs" / version / STUB_NAME
    if not source.is_file():
        raise SystemExit(f"nvidia-pytriton ships no Python backend stub for Python {version} ({source})")
    target = root / "backends" / "python" / STUB_NAME
    if not target.is_file() or target.read_bytes() != source.read_bytes():
        shutil.copy2(source, target)
    check_stub_starts(target)
    return target


def check_stub_starts(stub: Path) -> None:
    """Start the stub as the server will (its environment, no arguments): it must load its libraries (libpython
    X.Y.so.1.0 above all, which a Python built without --enable-shared, or a Debian machine without the
    libpythonX.Y package, lacks) and get as far as reading its arguments. Found at set-up, not at the first model
    load."""
    started = subprocess.run([str(stub)], env=server_environment(), capture_output=True, text=True, timeout=60)
    printed = started.stdout + started.stderr
    if "Expected 9 arguments" not in printed:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise SystemExit(f"the Python backend stub {stub} does not start with this Python ({sys.executable}): "
                         f"{printed.strip() or f'exit {started.returncode}'}\n(it links libpython{version}.so.1.0: on "
                         f"Debian `apt-get install libpython{version}`, or a Python built with --enable-shared)")


def server_environment(python: Path | None = None) -> dict[str, str]:
    """The server's environment; the Python backend's stubs run the first python3 on PATH: `python`'s
    environment (default: this interpreter's)."""
    env = dict(os.environ)
    # Busy-waiting OpenMP threads of one torch process starve every other process on a small CPU box
    # (each op ~250x slower while another model computes); passive waiting costs nothing measurable.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    venv_bin = str(Path(python or sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    # Only for the wheel's server: its stub must load this interpreter's libpython. A container's tritonserver
    # (on PATH) gets the environment untouched, as upstream's launch_triton_server.py leaves it: there LIBDIR is
    # /usr/lib/x86_64-linux-gnu, where the container runtime mounts the host's libcuda, and putting it first would
    # shadow the CUDA forward-compatibility libcuda the image wires through /etc/ld.so.conf.d.
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and find_tritonserver().backend_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
    return env


@dataclass
class ServerPorts:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls) -> ServerPorts:
        """Three distinct ports free now: their sockets stay open until all three are chosen (one closed before the
        next bind could be handed out again: a server given one port twice exits with its usage text)."""
        with contextlib.ExitStack() as open_sockets:
            ports = []
            for _ in range(3):
                sock = open_sockets.enter_context(socket.socket())
                sock.bind(("127.0.0.1", 0))
                ports.append(sock.getsockname()[1])
        return cls(*ports)


# How long tritonserver may take to stop (--exit-timeout-secs), sized from what a stop takes, measured on the 2-core
# CI host (docs/operations.md, "Stopping the server"). Its parts:
# - the streams still running end within STREAMS_END_S of the signal (the relay and the handoff end them at once:
#   relay/relay.h kShutdownMessage; measured 0.1-0.2 s), and the HTTP clients close their connections (Triton waits
#   for every open HTTP connection before it stops the models: an idle keep-alive connection holds the stop up to
#   the whole timeout, server src/http_server.cc HTTPServer::Stop, r24.10 and r26.07);
# - then the models unload, all at once (core's ModelDeleter: a thread per model), but a model's instances one after
#   another (core's ~TritonModel: instances_.clear()), and each Python instance's unload starts with python_backend's
#   1 s health check (StubLauncher::UpdateHealth's sleep(1), r24.10 and r26.07) before its finalize and its stub's
#   exit: 1.4-2.6 s an instance measured, so INSTANCE_UNLOAD_S each; on a 16-core host postprocessing's 8 instances
#   alone took longer than the 10 s this used to pass (issue 47);
# - the embedded engine's unload (the engine's thread, torch), measured 2.5-8 s on the loaded 2-core host:
#   ENGINE_UNLOAD_S. TensorRT-LLM's (the GPU engine's) was not measured here: its repositories keep the 120 s
#   deploy/ has always given tritonserver.
STREAMS_END_S = 5
STOP_MARGIN_S = 30  # past its exit timeout, a tritonserver that has not exited is killed (TritonServer.stop)
INSTANCE_UNLOAD_S = 3
ENGINE_UNLOAD_S = 15
TRTLLM_EXIT_TIMEOUT_S = 120
_INSTANCE_COUNTS = ("preprocessing_instance_count", "postprocessing_instance_count", "bls_instance_count",
                    "engine_instance_count")


def exit_timeout_s(manifest: dict) -> int:
    """--exit-timeout-secs for a repository (its repository.json): the stop's parts above, for the model with the
    most Python instances."""
    engine = manifest.get("engine")
    if engine == "trtllm" or (engine == "llmapi" and manifest.get("llm") == "tensorrt_llm"):
        return TRTLLM_EXIT_TIMEOUT_S  # TensorRT-LLM's engine, C++ backend or LLM API alike
    instances = max((int(manifest.get(key) or 1) for key in _INSTANCE_COUNTS), default=1)
    return STREAMS_END_S + max(ENGINE_UNLOAD_S, INSTANCE_UNLOAD_S * instances)


def server_command(
    repo: Path,
    ports: ServerPorts,
    *,
    exit_timeout: int,
    address: str = "0.0.0.0",
    world_size: int = 1,
    engine_model_names: tuple[str, ...] = ("tensorrt_llm",),
    orchestrator: bool = False,
    extra_args: tuple[str, ...] = (),
    install: TritonInstall | None = None,
    gpu: bool | None = None,
    llm_spawns_ranks: bool = False,
) -> list[str]:
    """tritonserver's argv, launched as TensorRT-LLM's launch_triton_server.py launches it.

    llm_spawns_ranks (an LLM API repository, ENGINE=llmapi): one tritonserver whatever TP x PP; with world_size > 1 it
    runs as the single rank of `mpirun -n 1`, as NVIDIA's docs/llmapi.md launches it (launch_triton_server.py
    --model_repo=... at its default --world_size 1, TP and PP set in model.yaml), and the LLM spawns its TP x PP
    workers itself (the llmapi model passes no MPI session when COMM_WORLD has one rank, so LLM() starts a pool).

    Leader mode (one TensorRT-LLM model): MPI world size = TP x PP, one tritonserver per rank; ranks > 0
    load only the engine. Orchestrator mode (several TensorRT-LLM models, e.g. a target and its draft;
    upstream's --multi-model): one tritonserver (world size 1) whose executor spawns a worker process per
    engine rank (executor_worker_path), each model placed by its gpu_device_ids; it needs
    ORCHESTRATOR_ENVIRONMENT, and the CUDA memory pools off as upstream sets them.
    """
    install = install or find_tritonserver()
    gpu = gpu_available() if gpu is None else gpu

    def rank_args(rank: int) -> list[str]:
        args = [
            str(install.binary),
            f"--model-repository={repo}",
            "--disable-auto-complete-config",
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
            f"--http-address={address}",
            f"--grpc-address={address}",
            f"--metrics-address={address}",
            f"--http-port={ports.http}",
            f"--grpc-port={ports.grpc}",
            f"--metrics-port={ports.metrics}",
            f"--exit-timeout-secs={exit_timeout}",
        ]
        if install.backend_dir is not None:
            args.append(f"--backend-directory={install.backend_dir}")
        if not gpu:
            # Without these, a CPU box logs NVML/DCGM/pinned-memory errors at every start.
            args += ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]
        if rank > 0:
            # Ranks > 0 only host engine shards; the tensorrtllm backend talks to them over MPI.
            args += ["--model-control-mode=explicit"] + [f"--load-model={name}" for name in engine_model_names]
        return args + list(extra_args)

    if llm_spawns_ranks:
        return ["mpirun", "--allow-run-as-root", "-n", "1", *rank_args(0)] if world_size > 1 else rank_args(0)
    if orchestrator:
        pools = [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(world_size)]
        gpu_only = ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false", *pools] if gpu else []
        return ["mpirun", "--allow-run-as-root", "-n", "1", *rank_args(0), *gpu_only]
    if world_size == 1:
        return rank_args(0)
    command = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        command += ["-n", "1", *rank_args(rank), ":"]
    return command[:-1]


# libevhtp (Triton's HTTP frontend, 2.51 up to the 26.07 container) hands every response of a generate_stream
# call to the connection's HTTP thread as a 17-byte command written to a non-blocking unix socketpair
# (evthr_defer, third_party libevhtp/thread.c); when the socket is full the command is dropped and Triton does not
# check (src/http_server.cc): that stream's start, next event or end never goes out, and the client hangs. The
# socket holds ~278 commands with the kernel's default net.core.wmem_default (212992); a 10-minute soak saw 93
# dropped in two bursts, with 4 hung streams (docs/benchmarks.md, "HTTP responses dropped under load: how it
# was found"). 4 MiB makes it ~5,400.
EVTHR_COMMAND_BYTES = 17
RECOMMENDED_WMEM_DEFAULT = 4 << 20
MIN_HTTP_QUEUE = 5000  # commands; below it serve and soak warn


def http_thread_queue_capacity() -> int:
    """How many commands one HTTP thread of tritonserver can have queued before libevhtp drops the next: measured
    on a socketpair made as evthr makes it (the limit comes from net.core.wmem_default, host-wide)."""
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with writer, reader:
        writer.setblocking(False)
        command, count = b"\0" * EVTHR_COMMAND_BYTES, 0
        try:
            while count < 1 << 20:
                writer.send(command)
                count += 1
        except BlockingIOError:
            pass
        return count


def http_queue_warning() -> str | None:
    capacity = http_thread_queue_capacity()
    if capacity >= MIN_HTTP_QUEUE:
        return None
    return (f"WARNING: this host's net.core.wmem_default lets each tritonserver HTTP thread queue only {capacity} "
            "responses; beyond that Triton's HTTP frontend drops them without a word and generate/generate_stream "
            f"clients hang. Set it on the host: sysctl -w net.core.wmem_default={RECOMMENDED_WMEM_DEFAULT} "
            "(docs/operations.md, 'HTTP responses dropped under load').")


# Upstream's --multi-model: the tensorrtllm backend runs as orchestrator and spawns its worker processes.
ORCHESTRATOR_ENVIRONMENT = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def llm_spawns_ranks(manifest: dict) -> bool:
    """An LLM API repository: its LLM starts its own TP x PP ranks (server_command)."""
    return manifest.get("engine") == "llmapi"


def needs_orchestrator(manifest: dict) -> bool:
    """Several TensorRT-LLM models in one repository (a target and its draft) need orchestrator mode."""
    return manifest.get("engine") == "trtllm" and bool(manifest.get("draft"))


@dataclass
class TritonServer:
    """A tritonserver child process; a context manager that waits for readiness and stops cleanly."""

    repo: Path | str  # a folder, or an object store's URL as tritonserver takes it
    ports: ServerPorts = field(default_factory=ServerPorts.free)
    log_path: Path | None = None
    address: str = "127.0.0.1"
    startup_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()
    python: Path | None = None  # the Python environment of the model stubs (default: this interpreter's)
    cwd: Path | None = None
    process: subprocess.Popen | None = None
    exit_timeout_s: int = 0  # its --exit-timeout-secs, known once started

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def start(self) -> TritonServer:
        command, env = launch(self.repo, self.ports, address=self.address, extra_args=self.extra_args,
                              python=self.python)
        self.exit_timeout_s = next(int(arg.split("=", 1)[1]) for arg in command
                                   if arg.startswith("--exit-timeout-secs="))
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        cwd=self.cwd)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode}; {self._log_hint()}")
            if is_ready(self.http_url):
                return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {self.startup_timeout_s:.0f} s; {self._log_hint()}")

    def stop(self) -> None:
        """SIGTERM to tritonserver alone, as Kubernetes or `docker stop` send it (its stubs and their watchers go with
        their models); SIGKILL to its whole process group if it has not exited STOP_MARGIN_S after its own exit
        timeout."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(self.exit_timeout_s + STOP_MARGIN_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # also the orphaned Python stubs of the group
            self.process.wait()

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _log_hint(self) -> str:
        if not self.log_path:
            return "no log captured"
        tail = Path(self.log_path).read_text(errors="replace").splitlines()[-25:]
        return f"last log lines of {self.log_path}:\n" + "\n".join(tail)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def answers_200(url: str) -> bool:
    """Whether a GET of `url` (a health endpoint) answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def is_ready(http_url: str) -> bool:
    """tritonserver's readiness at host:port."""
    return answers_200(f"http://{http_url}/v2/health/ready")


def launch(repo: Path | str, ports: ServerPorts, address: str = "0.0.0.0", extra_args: tuple[str, ...] = (),
           python: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """argv and environment that serve `repo`: the launch mode and the engines' world size (TP x PP) follow what
    its repository.json says, so an existing repository serves as it was built."""
    # An object store's repository (s3://, gs://, as://: Triton copies it to a local folder) is served with the
    # defaults: only a repository that needs no fixed path can be (check-repo says which).
    manifest_file = None if "://" in str(repo) else Path(repo) / "repository.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file and manifest_file.is_file() else {}
    orchestrator = needs_orchestrator(manifest)
    engines = ("tensorrt_llm", "tensorrt_llm_draft") if manifest.get("draft") else ("tensorrt_llm",)
    command = server_command(repo, ports, exit_timeout=exit_timeout_s(manifest), address=address,
                             world_size=int(manifest.get("world_size", 1)), engine_model_names=engines,
                             orchestrator=orchestrator, extra_args=extra_args,
                             llm_spawns_ranks=llm_spawns_ranks(manifest))
    env = server_environment(python)
    if orchestrator:
        env.update(ORCHESTRATOR_ENVIRONMENT)
    return command, env


@dataclass(frozen=True)
class ApiSettings:
    """The OpenAI-compatible API (openai_api) that `serve` starts beside tritonserver."""

    host: str = "127.0.0.1"
    port: int = 9000
    key_file: Path | None = None
    python: Path = Path(sys.executable)  # the interpreter that has the `api` extra (the container: the client venv)
    workers: int | None = None  # its worker processes; None: its default (one per 4 cores)


def api_command(api: ApiSettings, repo: Path, grpc_port: int) -> list[str]:
    command = [str(api.python), "-m", "openai_api", "--triton-grpc", f"127.0.0.1:{grpc_port}",
               "--host", api.host, "--port", str(api.port), "--repo", str(repo)]
    command += ["--workers", str(api.workers)] if api.workers else []
    return command + (["--api-key-file", str(api.key_file)] if api.key_file else [])


def _api_is_ready(api: ApiSettings) -> bool:
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::") else api.host
    return answers_200(f"http://{host}:{api.port}/health/ready")


class StopRequested(Exception):
    """SIGINT (Ctrl-C) or SIGTERM reached `serve`."""


def _request_stop(signum, _frame) -> None:
    # Once: the stop that follows must not be interrupted by the next Ctrl-C.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    raise StopRequested(signal.Signals(signum).name)


# serve's last line after a stop in which tritonserver and the API both ended cleanly (the container rehearsal reads it:
# `make` itself reports an interrupt after Ctrl-C whatever its recipe's status).
STOPPED_CLEANLY = "stopped cleanly: tritonserver and the API exited 0"


def stop_in_order(server: subprocess.Popen, api_process: subprocess.Popen | None) -> int:
    """A clean stop of what `serve` runs: tritonserver first (SIGTERM: the streams still running end with an error
    their clients read, the API's included, which the API passes on as its streams' last event; tritonserver bounds
    its own stop by --exit-timeout-secs), then the API (SIGTERM: uvicorn's graceful shutdown, nothing left in flight).
    The exit status: tritonserver's, else the API's; 0 when both stopped cleanly. uvicorn (0.54.0, the `api` extra's)
    ends a graceful shutdown by raising the signal that started it again (uvicorn/server.py, capture_signals), so the
    API's SIGTERM status after ours is its clean stop (passed on, it would be exit status 241)."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    status = server.wait()
    if api_process is None:
        return status
    if api_process.poll() is None:
        api_process.terminate()
        api_status = 0 if api_process.wait() == -signal.SIGTERM else api_process.returncode
    else:
        api_status = api_process.returncode
    return status or api_status


def serve(repo: Path, ports: ServerPorts, api: ApiSettings | None = None) -> int:
    """Run tritonserver in the foreground (logs to the terminal), then the OpenAI-compatible API beside it (unless
    api is None), and print working requests once both are ready. Either process ending stops the other; Ctrl-C or
    SIGTERM stops both, in order (stop_in_order). Both run in sessions of their own, so that a terminal's Ctrl-C
    reaches this process alone: it would otherwise reach every process of the group at once, the API stopping while
    tritonserver still ends its streams."""
    command, env = launch(repo, ports)
    if warning := http_queue_warning():
        print(warning, file=sys.stderr, flush=True)
    overrides = " ".join(f"{key}={env[key]}" for key in ORCHESTRATOR_ENVIRONMENT if key in env)
    print("+ " + (overrides + " " if overrides else "") + " ".join(command), flush=True)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, _request_stop)
    process: subprocess.Popen | None = None
    api_process: subprocess.Popen | None = None
    try:
        process = subprocess.Popen(command, env=env, start_new_session=True)
        while not is_ready(f"127.0.0.1:{ports.http}"):
            if process.poll() is not None:
                return process.returncode
            time.sleep(0.5)
        if api is not None:
            argv = api_command(api, repo, ports.grpc)
            print("+ " + " ".join(argv), flush=True)
            api_process = subprocess.Popen(argv, start_new_session=True)
            while not _api_is_ready(api):
                if api_process.poll() is not None:
                    break
                time.sleep(0.5)
        if api_process is None or api_process.poll() is None:
            print(
                "\n=== tritonserver is ready ===\n"
                f"curl -s -X POST localhost:{ports.http}/v2/models/ensemble/generate "
                "-d '{\"text_input\": \"What is Triton?\", \"max_tokens\": 20}'\n"
                f"curl -s -X POST localhost:{ports.http}/v2/models/ensemble/generate "
                "-d '{\"messages\": \"[{\\\"role\\\": \\\"user\\\", \\\"content\\\": \\\"Hi!\\\"}]\", "
                "\"max_tokens\": 20}'\n"
                f"curl -s -N -X POST localhost:{ports.http}/v2/models/tensorrt_llm_bls/generate_stream "
                "-d '{\"text_input\": \"Tell me a story\", \"max_tokens\": 64, \"stream\": true}'\n"
                f"metrics: curl -s localhost:{ports.metrics}/metrics   (Ctrl-C stops the server)\n",
                flush=True,
            )
            if api is not None:
                print(_openai_snippet(api), flush=True)
        while process.poll() is None and (api_process is None or api_process.poll() is None):
            time.sleep(0.5)
        if process.poll() is not None:
            print(f"tritonserver exited ({process.returncode}); stopping the API", file=sys.stderr, flush=True)
            stop_in_order(process, api_process)
            return process.returncode or 1
        print(f"the OpenAI-compatible API exited ({api_process.returncode}); stopping tritonserver", file=sys.stderr,
              flush=True)
        status = api_process.returncode
        stop_in_order(process, api_process)
        return status or 1
    except StopRequested as stop:
        print(f"{stop}: stopping tritonserver, then the API", file=sys.stderr, flush=True)
        if process is None:
            return 1
        status = stop_in_order(process, api_process)
        print(STOPPED_CLEANLY if status == 0 else f"stopped with exit status {status}", file=sys.stderr, flush=True)
        return status


def _openai_snippet(api: ApiSettings) -> str:
    host = "localhost" if api.host in ("127.0.0.1", "0.0.0.0", "::") else api.host
    key = f"open('{api.key_file}').readline().strip()" if api.key_file else '"unused"'
    return (
        f"=== OpenAI-compatible API: http://{host}:{api.port}/v1 (docs/openai.md) ===\n"
        "python - <<'EOF'\n"
        "from openai import OpenAI\n"
        f"client = OpenAI(base_url=\"http://{host}:{api.port}/v1\", api_key={key})\n"
        "model = client.models.list().data[0].id\n"
        "reply = client.chat.completions.create(model=model, max_tokens=32,\n"
        "    messages=[{\"role\": \"user\", \"content\": \"What is Triton?\"}])\n"
        "print(reply.choices[0].message.content)\n"
        "EOF\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.tritonserver", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install-stub", help="copy the Python backend stub into the wheel's tritonserver")
    run = sub.add_parser("serve", help="run tritonserver in the foreground")
    run.add_argument("--repo", type=Path, required=True)
    run.add_argument("--http-port", type=int, default=8000)
    run.add_argument("--grpc-port", type=int, default=8001)
    run.add_argument("--metrics-port", type=int, default=8002)
    run.add_argument("--api-port", type=int, default=9000, help="the OpenAI-compatible API's port (0: no API)")
    run.add_argument("--api-host", default="127.0.0.1", help="the API's address (default: loopback only)")
    run.add_argument("--api-key-file", type=Path, help="the API's keys, one a line (default: no authentication)")
    run.add_argument("--api-python", type=Path, default=Path(sys.executable),
                     help="the Python that runs the API (it needs the `api` extra)")
    run.add_argument("--api-workers", type=int,
                     help="the API's worker processes (default: the API's own, one per 4 cores, at least one)")
    args = parser.parse_args(argv)
    if args.command == "install-stub":
        target = install_stub()
        print(f"python backend stub: {target or 'tritonserver on PATH, nothing to install'}")
        return 0
    if not (args.repo / "ensemble").is_dir():
        raise SystemExit(f"{args.repo} is not a built model repository: run `make repo` first")
    api = (ApiSettings(args.api_host, args.api_port, args.api_key_file, args.api_python, args.api_workers)
           if args.api_port else None)
    return serve(args.repo.resolve(), ServerPorts(args.http_port, args.grpc_port, args.metrics_port), api)


if __name__ == "__main__":
    sys.exit(main())
