"""Small statistics helpers shared by every experiment (no numpy in the base install)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["mean", "percentile", "ratio"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-quantile (0..1, linear interpolation) of `values`, or None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


def mean(values: Sequence[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
