"""embedded_engine.cancellation: the asks of a process share one rate, so their cost follows the work, not the stream
count."""

from __future__ import annotations

import pytest

from embedded_engine import cancellation
from embedded_engine.cancellation import CancellationChecks


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Client:
    def __init__(self, gone: bool = False):
        self.asks = 0
        self.gone = gone

    def is_cancelled(self) -> bool:
        self.asks += 1
        return self.gone


@pytest.fixture()
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(cancellation.time, "monotonic", clock)
    return clock


def run(clock, polls, seconds, step_s=0.001):
    """Every poll called every step (a token every millisecond for each stream) for `seconds`."""
    for _ in range(round(seconds / step_s)):
        for poll in polls:
            poll()
        clock.now += step_s


def test_a_few_streams_are_each_asked_once_per_min_period(clock):
    checks = CancellationChecks(min_period_s=0.02, max_checks_per_s=500)
    clients = [Client() for _ in range(4)]
    polls = [checks.poll(client.is_cancelled) for client in clients]
    run(clock, polls, 1.0)
    assert all(47 <= client.asks <= 50 for client in clients)  # once per 20 ms (a tick late on float rounding)


def test_many_streams_share_the_process_rate(clock):
    checks = CancellationChecks(min_period_s=0.02, max_checks_per_s=500)
    clients = [Client() for _ in range(100)]  # 100 streams / 500 a second: each every 200 ms
    polls = [checks.poll(client.is_cancelled) for client in clients]
    run(clock, polls, 2.0)
    total = sum(client.asks for client in clients)
    assert 900 <= total <= 1100, total  # ~500 a second, not 100 / 20 ms = 5,000
    assert all(9 <= client.asks <= 11 for client in clients)  # and every stream gets its share


def test_ended_and_unasked_requests_take_no_share(clock):
    checks = CancellationChecks(min_period_s=0.02, max_checks_per_s=500)
    queued = [checks.poll(Client().is_cancelled) for _ in range(1000)]  # never asked: still in the queue
    ended = [checks.poll(Client().is_cancelled) for _ in range(100)]
    run(clock, ended, 0.01)
    assert checks.period_s() == pytest.approx(0.2)
    for poll in ended:
        poll.close()
        poll.close()  # idempotent
    assert checks.period_s() == pytest.approx(0.02)
    ended[0]()  # an ended poll asked again does not come back into the count
    assert checks.period_s() == pytest.approx(0.02)
    assert len(queued) == 1000


def test_a_cancellation_is_seen_within_the_period(clock):
    checks = CancellationChecks(min_period_s=0.02, max_checks_per_s=500)
    client = Client()
    poll = checks.poll(client.is_cancelled)
    assert not poll()
    client.gone = True
    clock.now += 0.01
    assert not poll()  # asked 10 ms ago: the answer waits
    clock.now += 0.01
    assert poll()
    assert client.asks == 2
