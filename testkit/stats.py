"""The statistics benchmark and soak reports use."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a measured value, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def quarter_means(values: Sequence[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of a per-token series."""
    quarter = max(1, len(values) // 4)
    return statistics.fmean(values[:quarter]), statistics.fmean(values[-quarter:])
