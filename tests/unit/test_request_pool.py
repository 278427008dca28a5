"""bls.relay.admission: bounded admission and an unload that answers every request."""

from __future__ import annotations

import threading

from bls.errors import Unavailable
from bls.relay.admission import RequestPool


class Answers:
    def __init__(self):
        self.errors: list[BaseException] = []

    def fail(self, error: BaseException) -> None:
        self.errors.append(error)


def test_beyond_workers_plus_queue_is_refused_at_once():
    release = threading.Event()
    pool = RequestPool(workers=2, queued=1, name="t")
    answers = Answers()
    for _ in range(3):
        pool.submit(release.wait, answers.fail)
    pool.submit(release.wait, answers.fail)  # the fourth: over capacity
    assert len(answers.errors) == 1 and isinstance(answers.errors[0], Unavailable)
    assert "at capacity: 3 requests in flight" in str(answers.errors[0])
    release.set()
    pool.shutdown(5, lambda: None)


def test_unload_answers_queued_at_once_and_running_after_the_wait():
    release, started = threading.Event(), threading.Event()
    stopped = []

    def long_running():
        started.set()
        release.wait(10)

    pool = RequestPool(workers=1, queued=2, name="t")
    running, queued = Answers(), Answers()
    pool.submit(long_running, running.fail)
    assert started.wait(5)
    pool.submit(long_running, queued.fail)
    cut_short = pool.shutdown(0.2, lambda: stopped.append(True))
    assert cut_short == 2
    assert "unloading" in str(queued.errors[0]) and "unloaded before the request finished" in str(running.errors[0])
    assert stopped == [True]  # the running engine work was stopped
    later = Answers()
    pool.submit(long_running, later.fail)
    assert "unloading" in str(later.errors[0])
    release.set()


def test_finished_requests_free_their_place():
    pool = RequestPool(workers=1, queued=0, name="t")
    answers = Answers()
    done = threading.Event()
    pool.submit(done.set, answers.fail)
    assert done.wait(5)
    for _ in range(50):
        if pool.in_flight() == 0:
            break
        threading.Event().wait(0.01)
    pool.submit(lambda: None, answers.fail)
    assert answers.errors == []
    pool.shutdown(5, lambda: None)
