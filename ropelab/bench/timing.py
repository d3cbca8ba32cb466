"""Timing helpers every benchmark shares: methods timed round-robin on the same inputs, quartiles, and whether
two measurements are equal within noise (their interquartile ranges overlap)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["time_methods", "quartiles", "iqr_overlap", "P99_MIN_SAMPLES"]


def time_methods(methods: dict[str, Callable[[], object]], repeats: int, warmup: int = 3) -> dict[str, list[float]]:
    """Run every method ``warmup`` times, then ``repeats`` rounds of all methods in turn; seconds per call.

    Args:
        methods: name -> a callable of no arguments, timed as a whole (wall time, ``time.perf_counter``).
        repeats: rounds; each method gets one timed call per round, in dict order (interleaved, so drift in the
            machine's speed touches all alike).
        warmup: untimed calls of each method first.

    Returns name -> ``repeats`` times in seconds.
    """
    for fn in methods.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile of ``xs`` (linear interpolation between order statistics)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


P99_MIN_SAMPLES = 100  # nearest-rank p99 of n < 100 samples is just their maximum: no p99 is reported then


def iqr_overlap(a: dict, b: dict) -> bool:
    """Whether two rows' interquartile ranges (``q25_ms`` to ``q75_ms``) overlap: then their medians are equal
    within noise, and no ordering of the two is claimed.

    Args:
        a: a benchmark row with ``q25_ms`` and ``q75_ms``.
        b: another.
    """
    return a["q25_ms"] <= b["q75_ms"] and b["q25_ms"] <= a["q75_ms"]


# Moves across each explorer's controls, extremes included (what a student can reach with the sliders);
# tests/test_explorers.py draws the same ones.
