r"""Notebook 06's section 3: the byte model set against times measured on a CPU, with the spread of both.

Each implementation's *reference* is its bytes in units of a copy of q and k times the copy's measured time. The
copy's own spread carries into every reference, so the reference is a band, bytes :math:`\times` the copy's
interquartile range (IQR), not a line; and where the copy's IQR is wide against its median (a busy machine) no
comparison with the reference is stated at all (:data:`MAX_COPY_SPREAD`). On a CPU the reference is no bound: caches
and per-op allocations decide more than the bytes do.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

__all__ = ["MAX_COPY_SPREAD", "time_round_robin", "quartiles_ms", "reference_rows", "copy_spread", "load_average",
           "plot_reference"]

MAX_COPY_SPREAD = 0.5  # the copy's IQR / median above which a run states no comparison with the reference


def time_round_robin(methods: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of every method, ``repeats`` rounds in turn (round-robin: a slower spell of a shared machine
    slows every method alike, not one)."""
    from ..bench.timing import time_methods

    if repeats < 4:
        raise ValueError(f"repeats must be at least 4 for an interquartile range, got {repeats}.")
    return time_methods(methods, repeats, warmup=0)


def quartiles_ms(samples: list[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile) of ``samples`` (seconds), in milliseconds."""
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1 * 1e3, med * 1e3, q3 * 1e3


def copy_spread(times: dict[str, list[float]], copy: str) -> float:
    """The copy's IQR over its median: how steady the yardstick of every reference was in this run."""
    q1, med, q3 = quartiles_ms(times[copy])
    return (q3 - q1) / med


def reference_rows(model_bytes: dict[str, int], times: dict[str, list[float]], copy: str) -> list[dict]:
    """One row per method of ``times``: its bytes in copies (``x_copy``), its reference band (bytes times the copy's
    25th percentile, median and 75th percentile: ``ref_q25_ms``, ``ref_ms``, ``ref_q75_ms``), its measured
    quartiles (``q25_ms``, ``ms``, ``q75_ms``), and ``beats_reference``: its 75th percentile below the band's lower
    end, i.e. faster than its bytes at the copy's pace even with both spreads counted."""
    missing = sorted(set(times) - set(model_bytes))
    if missing or copy not in times:
        raise ValueError(f"need a byte count for every timed method and a timed {copy!r}; missing {missing}.")
    cq1, cmed, cq3 = quartiles_ms(times[copy])
    rows = []
    for name in times:
        x = model_bytes[name] / model_bytes[copy]
        q1, med, q3 = quartiles_ms(times[name])
        rows.append({"name": name, "x_copy": x, "ref_q25_ms": x * cq1, "ref_ms": x * cmed, "ref_q75_ms": x * cq3,
                     "q25_ms": q1, "ms": med, "q75_ms": q3, "beats_reference": name != copy and q3 < x * cq1})
    return rows


def load_average() -> float | None:
    """The 1-minute load average where the OS reports one (None elsewhere)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def plot_reference(ax, rows: list[dict], title: str) -> None:
    """Per implementation: the reference band (bytes times the copy's IQR, its median marked) and the measured
    median with IQR whiskers, side by side."""
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["ref_q75_ms"] - r["ref_q25_ms"] for r in rows],
            left=[r["ref_q25_ms"] for r in rows], height=0.4, color="C0", alpha=0.45,
            label="reference: bytes x the copy's time (its IQR; | median)")
    ax.plot([r["ref_ms"] for r in rows], [i + 0.2 for i in y], "|", color="C0", ms=10)
    ax.barh([i - 0.2 for i in y], [r["ms"] for r in rows], height=0.4, color="C1", label="measured: median, IQR",
            xerr=[[r["ms"] - r["q25_ms"] for r in rows], [r["q75_ms"] - r["ms"] for r in rows]],
            error_kw={"capsize": 3, "lw": 1})
    ax.set(yticks=list(y), yticklabels=[r["name"] for r in rows], xlabel="ms", title=title)
    ax.legend(loc="lower right", fontsize=8)
