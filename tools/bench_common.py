"""What every benchmark section shares: result rows with targets, variant repositories and their servers,
a lean HTTP client for timed requests, and small statistics.

The timed client is testkit.http's: one keep-alive connection per thread, events timestamped while a
stream runs and parsed afterwards; the threads are spread over several forked client processes (run_clients),
so that the client, not the server, is never what a figure measures on a many-core host.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from engine_build.repository import repository_tokenizer, variant_repository
from serving.tritonserver import TritonServer
from testkit.http import HttpSession
from testkit.processes import cpu_seconds

T = TypeVar("T")


# -- results ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    op: Literal[">=", "<=", "=="]
    value: float | bool

    def met(self, measured: float | bool) -> bool:
        if self.op == ">=":
            return measured >= self.value
        if self.op == "<=":
            return measured <= self.value
        return measured == self.value

    def __str__(self) -> str:
        return f"{self.op} {format_value(self.value)}"


@dataclass(frozen=True)
class Row:
    metric: str
    measured: float | bool | None  # None: could not be measured (see note)
    unit: str = ""
    target: Target | None = None  # None: reported only
    note: str = ""

    @property
    def status(self) -> str:
        if self.measured is None:
            return "n/a"
        if self.target is None:
            return ""
        return "PASS" if self.target.met(self.measured) else "MISS"

    def as_dict(self) -> dict:
        return {
            "metric": self.metric, "measured": self.measured, "unit": self.unit,
            "target": None if self.target is None else {"op": self.target.op, "value": self.target.value},
            "status": self.status, "note": self.note,
        }


def format_value(value: float | bool | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


# -- repositories and servers -------------------------------------------------------------------------------
def default_client_processes() -> int:
    """Client processes for a load: one per 4 of the host's cores (4 on a 16-core host, 1 on 2 cores). One Python
    client process tops out near one core (~21-25k streamed tokens/s on the 16-core host), so a single one would
    be measured instead of the server there; --client-processes overrides."""
    return max(1, len(os.sched_getaffinity(0)) // 4)


@dataclass
class BenchContext:
    """One `make bench` run: options, where variants are built, and at most one running server."""

    repo: Path  # the default (real) repository
    work_dir: Path  # build/bench
    quick: bool
    engine_instances: int = 1  # instances of the synthetic engine in section "streaming"'s throughput runs
    bls_instances: int | None = None  # None: the repository's default
    engine_step_ms: float = 0.0  # section "streaming", throughput runs: the synthetic engine's least step time
    paced_streams: tuple[int, ...] = (16, 64, 256)  # section "streaming": concurrencies of the runs paced like a GPU
    # Sections "streaming" and "openai": concurrencies of the throughput runs.
    streams: tuple[int, ...] = (1, 16, 64, 256, 1024)
    # Sections "streaming" and "openai": the engine stand-in, "cpp" (tools/bench_engine: one step thread, as
    # TensorRT-LLM's executor; needs a C++ compiler) or "python" (the synthetic embedded engine behind its relay).
    engine: Literal["cpp", "python"] = "cpp"
    client_processes: int = field(default_factory=default_client_processes)  # per load (run_clients)
    aiperf_venv: Path = Path("build/venv-aiperf")  # section "aiperf": NVIDIA's AIPerf, in a venv of its own
    _server: TritonServer | None = None

    @property
    def tokenizer_dir(self) -> Path:
        return repository_tokenizer(self.repo)

    def variant(self, name: str, **overrides) -> Path:
        """A repository like the default one, with RepositorySettings fields overridden, under work_dir."""
        return variant_repository(self.repo, self.work_dir / name, **overrides)

    def synthetic_repo(self, accumulate_tokens: bool = False) -> Path:
        """The synthetic engine (no model: only our Python layers are measured), long enough for 4,096-token
        streams; no draft model, so no idle draft process shares the cores."""
        name = "synthetic-accumulate" if accumulate_tokens else "synthetic"
        return self.variant(name, synthetic=True, draft=None, max_seq_len=8192, accumulate_tokens=accumulate_tokens)

    def server(self, repo: Path) -> TritonServer:
        """The server for `repo`, started if needed. Only one runs at a time: an idle one would still hold
        memory and its start-up would overlap the next section's measurements."""
        repo = repo.resolve()
        if self._server is not None and self._server.repo == repo and self._server.is_alive():
            return self._server
        self.stop_server()
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._server = TritonServer(repo, log_path=logs / f"{repo.name}.log").start()
        return self._server

    def stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None



@dataclass
class LoadRun:
    results: list  # every client's results, in client order
    wall_s: float  # the union of the client processes' windows: the earliest common start to the last client's end
    client_cpu_s: float = 0.0  # CPU (user + system) of every client process during its window, all threads
    client_processes: int = 1
    busiest_client_cores: float = 0.0  # the most any one client process used of a core over its own window
    server_cpu_s: dict[str, float] = field(default_factory=dict)  # per server process (testkit.processes.cpu_seconds)

    @property
    def client_cores(self) -> float:
        """Cores all client processes used together over the run."""
        return self.client_cpu_s / self.wall_s


@dataclass
class ClientPart:
    """One client process's share of a load: its window (perf_counter, the same clock in every process on
    Linux), its CPU over that window, and each of its clients' results by client index."""

    began: float
    ended: float
    cpu_s: float
    results: dict[int, list]


def merge_parts(parts: list[ClientPart]) -> LoadRun:
    """The load as if one client had run it: results in client order (every sample kept, so percentiles are over
    all of them, never averages of per-process percentiles), the wall time from the earliest start to the latest
    end (rates over the union window), the CPU of all processes summed, and the busiest process's share of a
    core (near 1.0: that process, one Python interpreter, was the bottleneck)."""
    by_index = {index: result for part in parts for index, result in part.results.items()}
    if len(by_index) != sum(len(part.results) for part in parts):
        raise ValueError("a client index appears in two client processes")
    return LoadRun(results=[item for index in sorted(by_index) for item in by_index[index]],
                   wall_s=max(part.ended for part in parts) - min(part.began for part in parts),
                   client_cpu_s=sum(part.cpu_s for part in parts), client_processes=len(parts),
                   busiest_client_cores=max(part.cpu_s / (part.ended - part.began) for part in parts))


def _client_process(conn, ready: multiprocessing.synchronize.Barrier, http_url: str, indices: list[int], clients: int,
                    work: Callable[[HttpSession, int], list[T]], stagger_s: float) -> None:
    """A forked client process: a thread per client index, each with its own connection, released together
    when every process is ready; sends back its ClientPart (or the first client's exception)."""
    start = threading.Barrier(len(indices) + 1)
    results: dict[int, list | BaseException] = {}

    def client(index: int) -> None:
        session = HttpSession(http_url)
        try:
            start.wait()
            time.sleep(stagger_s * index / clients)
            results[index] = work(session, index)
        except BaseException as error:  # noqa: BLE001 - sent to the parent, which raises it
            results[index] = error
        finally:
            session.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in indices]
    for thread in threads:
        thread.start()
    ready.wait(timeout=_READY_TIMEOUT_S)
    start.wait()
    began, began_cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.join()
    ended, cpu = time.perf_counter(), time.process_time() - began_cpu
    errors = [result for result in results.values() if isinstance(result, BaseException)]
    if errors:
        conn.send(RuntimeError(f"client process {os.getpid()}: {errors[0]!r}"))
    else:
        conn.send(ClientPart(began, ended, cpu, results))
    conn.close()


_READY_TIMEOUT_S = 120.0


def run_clients(http_url: str, clients: int, work: Callable[[HttpSession, int], list[T]],
                stagger_s: float = 0.0, processes: int = 1) -> LoadRun:
    """`clients` clients, each a thread with its own connection, spread over min(processes, clients) forked
    client processes (client i in process i % processes), start together and run `work(session, index)`; with
    `stagger_s`, client i starts i/clients of it later (arrivals spread, as in steady traffic). Forked, so `work`
    may be any callable; what it returns goes back pickled."""
    count = max(1, min(processes, clients))
    context = multiprocessing.get_context("fork")
    ready = context.Barrier(count + 1)
    pipes, workers = [], []
    for rank in range(count):
        receiver, sender = context.Pipe(duplex=False)
        worker = context.Process(target=_client_process, daemon=True,
                                 args=(sender, ready, http_url, list(range(rank, clients, count)), clients, work,
                                       stagger_s))
        worker.start()
        sender.close()
        pipes.append(receiver)
        workers.append(worker)
    try:
        ready.wait(timeout=_READY_TIMEOUT_S)
        parts = []
        for receiver, worker in zip(pipes, workers, strict=True):
            try:
                part = receiver.recv()
            except EOFError:
                worker.join(timeout=5)
                raise RuntimeError(f"client process {worker.pid} ended without a result (exit code "
                                   f"{worker.exitcode})") from None
            if isinstance(part, BaseException):
                raise part
            parts.append(part)
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    return merge_parts(parts)


# -- streamed load ------------------------------------------------------------------------------------------
def stream_load(server: TritonServer, model: str, clients: int, rounds: int, body_for: Callable[[int], dict],
                stagger_s: float = 0.0, processes: int = 1) -> LoadRun:
    """`clients` concurrent clients over up to `processes` client processes, each streaming `rounds` requests back
    to back (client i sends body_for(i), starting at stagger_s * i / clients). The results are in client order:
    trace j is client j // rounds's."""
    cpu_before = cpu_seconds(server.process.pid)
    run = run_clients(server.http_url, clients,
                      lambda session, index: [session.generate_stream(model, body_for(index)) for _ in range(rounds)],
                      stagger_s, processes)
    cpu_after = cpu_seconds(server.process.pid)
    run.server_cpu_s = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
    return run
