"""``python -m ropelab.bench explorers``: the CPU time of one update of each notebook explorer, per move."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from ..machine import machine_info

__all__ = ["EXPLORER_MOVES", "bench_explorers", "print_explorers"]


EXPLORER_MOVES: dict[str, list[dict]] = {
    "LadderExplorer": [{"position": 8192}, {"head_dim": 256}, {"dtype": "float16"}, {"base": 1e7},
                       {"base": 100.0, "head_dim": 16}, {"position": 0, "dtype": "float64"}],
    "DecayExplorer": [{"distance": 32768}, {"head_dim": 256}, {"base": 1e7}, {"base": 100.0},
                      {"distance": 64, "head_dim": 16}],
    "DriftExplorer": [{"length": 700}, {"factor": 16.0}, {"length": 1}, {"length": 300, "factor": 1.0},
                      {"length": 1024, "factor": 2.5}],
    "ExtensionExplorer": [{"factor": 8.0}, {"head_dim": 128}, {"original_length": 4096}, {"base": 1e7},
                          {"factor": 1.0}, {"base": 100.0, "head_dim": 16, "factor": 32.0}],
    "CoPEExplorer": [{"text": "the cat sat on the mat, " * 10}, {"count": "vowels"}, {"sharpness": 0.0},
                     {"text": "x"}, {"text": "a b  c   d e", "count": "spaces (word boundaries)"}],
    "BytesExplorer": [{"heads_q": 1}, {"heads_k": 64}, {"batch": 16, "seq": 8192}, {"head_dim": 256},
                      {"dtype": "float32", "seq": 16}],
}


def _clear_caches() -> None:
    """Empty every functools cache in ropelab's loaded modules, so an update is timed with its computation."""
    for name, module in list(sys.modules.items()):
        if name.startswith("ropelab.") and module is not None:
            for obj in list(vars(module).values()):
                if callable(getattr(obj, "cache_clear", None)):
                    obj.cache_clear()


def bench_explorers(repeats: int = 7, threads: int = 2) -> dict:
    """CPU time of one update per explorer and move (module docstring): the median over ``repeats`` and its spread
    (min and max), and per explorer the median and the slowest move's median. Nothing is asserted.

    Args:
        repeats: timed updates per move, a positive int (ValueError otherwise).
        threads: torch's intra-op threads, set for the process.
    """
    from .. import explorers

    if repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}.")
    torch.set_num_threads(threads)
    rows, summary = [], {}
    for name, moves in EXPLORER_MOVES.items():
        cls = getattr(explorers, name)
        ex = cls()
        ex.update()  # warm-up: first draw, imports
        medians = []
        for move in moves:
            cpu = []
            for _ in range(repeats):
                ex.update(**cls.defaults)
                _clear_caches()
                c0 = time.process_time()
                ex.update(**move)
                cpu.append(time.process_time() - c0)
            med = statistics.median(cpu)
            medians.append(med)
            rows.append({"explorer": name, "move": move, "cpu_ms_median": round(1e3 * med, 2),
                         "cpu_ms_min": round(1e3 * min(cpu), 2), "cpu_ms_max": round(1e3 * max(cpu), 2)})
        summary[name] = {"cpu_ms_median_over_moves": round(1e3 * statistics.median(medians), 2),
                         "cpu_ms_slowest_move": round(1e3 * max(medians), 2)}
    return {"benchmark": "explorers", "repeats": repeats, "threads": threads, "budget_ms": 200,
            "machine": machine_info(), "summary": summary, "rows": rows}


def print_explorers(result: dict) -> None:
    """Print one line per explorer: the median update's CPU time over its moves, and the slowest move's.

    Args:
        result: :func:`bench_explorers`' dict.
    """
    print(f"explorer update CPU time ({result['repeats']} repeats per move; budget {result['budget_ms']} ms)")
    for name, s in result["summary"].items():
        median, slowest = s["cpu_ms_median_over_moves"], s["cpu_ms_slowest_move"]
        print(f"{name:20s} median {median:7.1f} ms   slowest move {slowest:7.1f} ms")
