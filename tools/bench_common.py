"""What every benchmark section shares: result rows with targets, variant repositories and their servers,
a lean HTTP client for timed requests, and small statistics.

The timed client is testkit.http's: one keep-alive connection per thread, events timestamped while a
stream runs and parsed afterwards.
"""

from __future__ import annotations

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
    results: list  # every client's results, in order
    wall_s: float  # from the common start to the last client's end
    client_cpu_s: float = 0.0  # CPU time of this (client) process during the run, all threads
    # per server process (see testkit.processes.cpu_seconds)
    server_cpu_s: dict[str, float] = field(default_factory=dict)


def run_clients(http_url: str, clients: int, work: Callable[[HttpSession, int], list[T]],
                stagger_s: float = 0.0) -> LoadRun:
    """`clients` threads, each with its own connection, start together and run `work(session, index)`;
    with `stagger_s`, client i starts i/clients of it later (arrivals spread, as in steady traffic)."""
    start = threading.Barrier(clients + 1)
    results: list[list[T] | BaseException] = [[] for _ in range(clients)]

    def client(index: int) -> None:
        session = HttpSession(http_url)
        try:
            start.wait()
            time.sleep(stagger_s * index / clients)
            results[index] = work(session, index)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            results[index] = error
        finally:
            session.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began, began_cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.join()
    wall, client_cpu = time.perf_counter() - began, time.process_time() - began_cpu
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return LoadRun([item for result in results for item in result], wall, client_cpu)


# -- streamed load ------------------------------------------------------------------------------------------
def stream_load(server: TritonServer, model: str, clients: int, rounds: int, body_for: Callable[[int], dict],
                stagger_s: float = 0.0) -> LoadRun:
    """`clients` concurrent clients, each streaming `rounds` requests back to back (client i sends body_for(i),
    starting at stagger_s * i / clients). The results are in client order: trace j is client j // rounds's."""
    cpu_before = cpu_seconds(server.process.pid)
    run = run_clients(server.http_url, clients,
                      lambda session, index: [session.generate_stream(model, body_for(index)) for _ in range(rounds)],
                      stagger_s)
    cpu_after = cpu_seconds(server.process.pid)
    run.server_cpu_s = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
    return run
