"""The bench's load clients: several forked client processes merged into one load (tools.bench_common)."""

from __future__ import annotations

import os
import time

import pytest

from testkit.stats import percentile
from tools.bench_common import ClientPart, merge_parts, run_clients

UNREACHABLE = "127.0.0.1:9"  # a session is opened per client but never used by these works


def test_merge_keeps_client_order_and_every_sample():
    # Client i in process i % 2, as run_clients splits them; each client returned two samples.
    parts = [ClientPart(began=10.0, ended=12.0, cpu_s=0.5, results={0: [1.0, 1.1], 2: [1.2, 1.3]}),
             ClientPart(began=10.1, ended=14.0, cpu_s=1.5, results={1: [9.0, 9.1], 3: [9.2, 9.3]})]
    run = merge_parts(parts)
    assert run.results == [1.0, 1.1, 9.0, 9.1, 1.2, 1.3, 9.2, 9.3]
    assert run.client_processes == 2


def test_merge_window_is_the_union_and_cpu_the_sum():
    parts = [ClientPart(began=10.0, ended=12.0, cpu_s=0.5, results={0: [1]}),
             ClientPart(began=10.1, ended=14.0, cpu_s=1.5, results={1: [1]})]
    run = merge_parts(parts)
    assert run.wall_s == pytest.approx(4.0)  # 10.0 .. 14.0, not either process's own window
    assert run.client_cpu_s == pytest.approx(2.0)
    assert run.client_cores == pytest.approx(0.5)
    assert run.busiest_client_cores == pytest.approx(1.5 / 3.9)


def test_percentiles_are_over_all_samples_not_averaged_per_process():
    fast = ClientPart(began=0.0, ended=1.0, cpu_s=0.1, results={0: [1.0, 2.0, 3.0]})
    slow = ClientPart(began=0.0, ended=1.0, cpu_s=0.1, results={1: [100.0, 200.0, 300.0, 400.0, 500.0]})
    run = merge_parts([fast, slow])
    averaged = (percentile([1.0, 2.0, 3.0], 50) + percentile([100.0, 200.0, 300.0, 400.0, 500.0], 50)) / 2
    assert percentile(run.results, 50) == 100.0  # the 4th of 8 ordered samples (nearest rank)
    assert percentile(run.results, 50) != averaged


def test_merge_refuses_a_client_in_two_processes():
    with pytest.raises(ValueError):
        merge_parts([ClientPart(0.0, 1.0, 0.0, {0: [1]}), ClientPart(0.0, 1.0, 0.0, {0: [2]})])


def test_run_clients_spreads_clients_over_processes():
    def work(_session, index: int) -> list[tuple[int, int]]:
        time.sleep(0.05)
        return [(index, os.getpid())]

    run = run_clients(UNREACHABLE, 5, work, processes=2)
    assert [index for index, _ in run.results] == [0, 1, 2, 3, 4]
    pids = {index: pid for index, pid in run.results}
    assert pids[0] == pids[2] == pids[4] != pids[1] == pids[3] != os.getpid()
    assert run.client_processes == 2
    assert run.wall_s >= 0.05


def test_run_clients_never_more_processes_than_clients():
    run = run_clients(UNREACHABLE, 1, lambda _session, index: [index], processes=4)
    assert run.client_processes == 1 and run.results == [0]


def test_run_clients_counts_the_client_processes_cpu():
    def spin(_session, index: int) -> list[int]:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
        return [index]

    run = run_clients(UNREACHABLE, 2, spin, processes=2)
    assert run.client_cpu_s >= 0.35  # 0.2 s in each process, not only the parent's (which only waits)


def test_run_clients_raises_a_client_error():
    def fail(_session, index: int) -> list[int]:
        if index == 1:
            raise ValueError("client one failed")
        return [index]

    with pytest.raises(RuntimeError, match="client one failed"):
        run_clients(UNREACHABLE, 3, fail, processes=2)
