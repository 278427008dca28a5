"""Custom Prometheus metrics through the Python backend (pb_utils.MetricFamily), handed to Triton by one thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import triton_python_backend_utils as pb_utils


class Metrics:
    """Custom Prometheus metrics, with every pb_utils metric call behind one process-wide lock.

    Triton 2.51 crashes (SIGSEGV / boost lock_exception) when metric calls come from several threads at
    once. Families are created once per name and each metric keeps its family alive: a metric whose
    family was garbage-collected fails.

    Updates are gathered in the process and handed to Triton every FLUSH_S by one thread: each pb_utils metric
    call is a round trip to tritonserver, and the embedded engine counts every generated token (py-spy: its
    per-token increments were ~11 % of its samples under load); histogram observations too, because the BLS
    observes a request's first token on the thread that reads every engine stream, which must never wait for
    the lock that sends hold.
    """

    FLUSH_S = 0.1

    def __init__(self, lock: threading.Lock | threading.RLock | None = None, flush_thread: bool = True):
        """lock: what serialises the metric calls. By default their own lock (they only need serialising among
        themselves, per the reference experiments): the embedded engine updates metrics every step and must
        not wait for sends. The BLS passes PB_LOCK so that all its pb_utils calls are serialised.
        flush_thread=False: no thread of its own; the owner calls flush_due() (tools/bench_metrics_models measures
        the hand-over's cost on its own thread so)."""
        self._lock = lock or threading.Lock()
        self._families: dict[str, Any] = {}
        self._metrics: list[_Metric] = []
        self._before_flush: list[Callable[[], None]] = []
        self._closed = threading.Event()
        self._next_flush = time.monotonic() + self.FLUSH_S
        self._flusher = None
        if flush_thread:
            self._flusher = threading.Thread(target=self._flush_every_period, name="metrics-flush", daemon=True)
            self._flusher.start()

    def flush_due(self) -> None:
        """Hand Triton what gathered, if FLUSH_S has passed since the last time (flush_thread=False)."""
        now = time.monotonic()
        if now < self._next_flush or self._closed.is_set():
            return
        self._next_flush = now + self.FLUSH_S
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Hand Triton what is pending, then release every metric and family now (call it from finalize): left
        to the stub's exit, a MetricFamily's destructor writes to shared memory that is gone by then, and the
        stub segfaulted after its model had unloaded (core dumps after two soaks). Later updates are ignored."""
        self._closed.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        with self._lock:
            self._flush()
            for metric in self._metrics:
                metric.release()
            self._metrics.clear()
            self._families.clear()
            self._before_flush.clear()

    def before_flush(self, hook: Callable[[], None]) -> None:
        """Call `hook` before each hand-over (with the lock held; it may set and observe, never block): for values
        that change far more often than they are handed over, set once per flush instead of at each change."""
        self._before_flush.append(hook)

    def _flush(self) -> None:
        for hook in self._before_flush:
            hook()
        for metric in self._metrics:
            metric.flush()

    def counter(self, name: str, description: str, labels: Mapping[str, str]) -> _Metric:
        return self._metric(name, description, pb_utils.MetricFamily.COUNTER, labels)

    def gauge(self, name: str, description: str, labels: Mapping[str, str]) -> _Metric:
        return self._metric(name, description, pb_utils.MetricFamily.GAUGE, labels)

    def histogram(self, name: str, description: str, labels: Mapping[str, str], buckets: Iterable[float]) -> _Metric:
        return self._metric(name, description, pb_utils.MetricFamily.HISTOGRAM, labels, list(buckets))

    def _metric(self, name, description, kind, labels, buckets=None) -> _Metric:
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            if buckets is None:
                metric = family.Metric(labels=dict(labels))
            else:
                metric = family.Metric(labels=dict(labels), buckets=buckets)
            self._metrics.append(_Metric(metric, family))
            return self._metrics[-1]

    def _flush_every_period(self) -> None:
        while not self._closed.wait(self.FLUSH_S):
            with self._lock:
                self._flush()


class _Metric:
    """One metric's updates since the last flush; only flush() and release() touch Triton (Metrics' lock held)."""

    def __init__(self, metric: Any, family: Any):
        self._metric = metric
        self._family = family  # the family must outlive its metrics
        self._pending = threading.Lock()  # guards the three values below, never held across a pb_utils call
        self._increment = 0.0
        self._value: float | None = None
        self._observations: list[float] = []

    def increment(self, value: float = 1.0) -> None:
        with self._pending:
            self._increment += value

    def set(self, value: float) -> None:
        with self._pending:
            self._value = value

    def observe(self, value: float) -> None:
        with self._pending:
            self._observations.append(value)

    def flush(self) -> None:
        """Hand Triton the increments, the last value and the observations since the previous flush (the caller
        holds the lock)."""
        with self._pending:
            increment, self._increment = self._increment, 0.0
            value, self._value = self._value, None
            observations, self._observations = self._observations, []
        if self._metric is None:
            return
        if increment:
            self._metric.increment(increment)
        if value is not None:
            self._metric.set(value)
        for observation in observations:
            self._metric.observe(observation)

    def release(self) -> None:
        """Drop the metric, then its family (Metrics.close; called with the lock held)."""
        self._metric = None
        self._family = None
