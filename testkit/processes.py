"""The processes of a local tritonserver, found with psutil: the server and one Python backend stub per
model instance (what the soak's memory checks, the fault tests and the benchmarks' CPU accounting watch)."""

from __future__ import annotations

from pathlib import Path

import psutil

STUB_NAME = "triton_python_backend_stub"
# The relays' threads in tritonserver (relay/, its thread_name): the BLS's, whose CPU is the relayed BLS's
# sending, and the one in front of the benchmark engine (tools/engine_relay), the engine's.
RELAY_THREAD = "llama3_relay"
ENGINE_RELAY_THREAD = "engine_relay"
BENCH_ENGINE_THREAD = "bench_engine"  # the C++ bench engine's step thread (tools/bench_engine)
HANDOFF_THREAD = "handoff_sender"  # the ensemble's handoff's sender threads (relay/handoff.h)
# Python backend stub argv: stub model.py shm_region shm_default shm_growth parent_pid backend_dir
# ipc_handle instance_name ...
_STUB_INSTANCE_ARG = 8


def find_server_pid(http_port: int) -> int:
    """The local tritonserver listening on `http_port` (its command line names the port; 8000 is the default)."""
    for process in psutil.process_iter(["cmdline"]):
        args = process.info["cmdline"] or []
        if not args or not args[0].endswith("tritonserver"):
            continue
        ports = [a.split("=", 1)[1] for a in args if a.startswith("--http-port=")]
        if ports == [str(http_port)] or (not ports and http_port == 8000):
            return process.pid
    raise LookupError(f"no local tritonserver process with --http-port={http_port}")


def triton_processes(server_pid: int) -> dict[str, psutil.Process]:
    """'tritonserver' and each Python backend stub, named by its model instance (e.g. tensorrt_llm_bls_0_0)."""
    server = psutil.Process(server_pid)
    processes = {"tritonserver": server}
    for child in server.children():
        try:
            args = child.cmdline()
        except psutil.Error:  # ended meanwhile
            continue
        if args and args[0].endswith(STUB_NAME) and len(args) > _STUB_INSTANCE_ARG:
            processes[args[_STUB_INSTANCE_ARG]] = child
    return processes


def stub_process(server_pid: int, instance: str) -> psutil.Process:
    try:
        return triton_processes(server_pid)[instance]
    except KeyError:
        raise LookupError(f"no Python backend stub for model instance {instance}") from None


def cpu_seconds(server_pid: int) -> dict[str, float]:
    """CPU seconds so far (user + system) of the server, of each stub, and of the relays' threads in the server
    (under RELAY_THREAD, ENGINE_RELAY_THREAD, HANDOFF_THREAD and BENCH_ENGINE_THREAD, all threads of a name
    together, where there are such; the server's figure includes them)."""
    seconds = {}
    for name, process in triton_processes(server_pid).items():
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds[name] = times.user + times.system
    try:
        for thread in psutil.Process(server_pid).threads():
            comm = Path(f"/proc/{server_pid}/task/{thread.id}/comm")
            name = comm.read_text().strip() if comm.is_file() else ""
            if name in (RELAY_THREAD, ENGINE_RELAY_THREAD, HANDOFF_THREAD, BENCH_ENGINE_THREAD):
                seconds[name] = seconds.get(name, 0.0) + thread.user_time + thread.system_time
    except (psutil.Error, OSError):
        pass
    return seconds


def rss_bytes(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def shm_files(processes: list[psutil.Process]) -> set[str]:
    """/dev/shm files mapped by any of the processes (the Python backend's shared-memory regions)."""
    files = set()
    for process in processes:
        try:
            files.update(m.path for m in process.memory_maps(grouped=True) if m.path.startswith("/dev/shm/"))
        except psutil.Error:
            continue
    return files
