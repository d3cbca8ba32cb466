"""Benchmarks: ratios measured in one run on the same inputs (not timed tests).

    python -m ropelab.bench cpu [--shape 1 32 4096 128] [--repeats 20] [--out data/bench/cpu.json]
    python -m ropelab.bench gpu [--out-dir data/bench] [--quick]   (ropelab.kernels.bench_gpu)
    python -m ropelab.bench decode [--lengths 1024 4096 16384 32768] [--batches 1 8] [--out data/bench/decode.json]
    python -m ropelab.bench explorers [--repeats 7] [--out data/bench/explorers.json]

``cpu`` times, on the same q and k ([b, h, s, d] float32 by default, the issue's Llama-7B-like head
shape): a copy of q and k into preallocated buffers (``out.copy_(q)``: the memory-traffic reference, no
allocation timed), ``ropelab.apply_rope`` (tables included),
``ropelab.rotate`` with precomputed tables, Hugging Face Llama's ``apply_rotary_pos_emb`` (eager, tables
precomputed by ``LlamaRotaryEmbedding`` and not timed) and ``torch.compile`` of it. Each method is timed
as the median and interquartile range of ``--repeats`` runs (at least 20) after warm-up, methods
interleaved round-robin so drift in the machine's speed touches all alike. Prints a table (time, IQR, GB/s,
ratio to the copy) and writes JSON; ``ordering`` lists only the pairs of methods whose IQRs do not overlap.

``explorers`` measures the CPU time of one update of each notebook explorer (``ropelab.explorers``: compute,
Agg drawing, PNG encoding) for every move in :data:`EXPLORER_MOVES`, each from the default view with the
explorers' caches cleared, ``--repeats`` times. CPU time of this process, not wall time, so a neighbour's load
counts less (the explorers aim at 200 ms per update on a 2-core CPU). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .core import cos_sin, rotate
from .machine import machine_info
from .paths import DATA_DIR
from .rope import apply_rope
from .scaling import frequencies
from .spec import RopeSpec

__all__ = ["machine_info", "time_methods", "bench_cpu", "bench_decode", "print_table", "print_decode",
           "step_distribution", "iqr_overlap", "EXPLORER_MOVES", "bench_explorers", "print_explorers", "main"]


def time_methods(methods: dict[str, Callable[[], object]], repeats: int, warmup: int = 3) -> dict[str, list[float]]:
    """Run every method ``warmup`` times, then ``repeats`` rounds of all methods in turn; seconds per call."""
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


COPY = "copy into preallocated buffers (reference)"  # bench_cpu's reference row


def bench_cpu(shape=(1, 32, 4096, 128), repeats: int = 20, threads: int = 2, compile: bool = True) -> dict:
    """RoPE on q and k [b, h, s, d]: ropelab vs Hugging Face eager and compiled vs a copy into preallocated
    buffers (module docstring). Each row has ``median_ms``, ``q25_ms``, ``q75_ms`` and ``ratio_to_copy``."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int (20 or more for an IQR), got {repeats!r}.")
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    b, h, s, d = shape
    q, k = torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    inv_freq, _ = frequencies(d)
    c, si = cos_sin(torch.arange(s), inv_freq, dtype=torch.float32)
    c4, s4 = c[None, None], si[None, None]
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)  # the copy writes into these: no allocation timed

    methods: dict[str, Callable[[], object]] = {
        COPY: lambda: (q_out.copy_(q), k_out.copy_(k)),
        "ropelab.apply_rope": lambda: (apply_rope(q, layout="b h s d"), apply_rope(k, layout="b h s d")),
        "ropelab.rotate (tables given)": lambda: (rotate(q, c4, s4), rotate(k, c4, s4)),
    }
    notes = {}
    if compile:  # backend="compile": one single-pass formula through torch.compile; compile time apart
        from .kernels import compiled as rope_compiled

        try:
            t0 = time.perf_counter()
            rope_compiled.rotate_compiled(q, c4, s4), rope_compiled.rotate_compiled(k, c4, s4)
            apply_rope(q, layout="b h s d", backend="compile")
            notes["compile_seconds_ropelab"] = time.perf_counter() - t0
            methods["ropelab compiled (tables given)"] = lambda: (rope_compiled.rotate_compiled(q, c4, s4),
                                                                  rope_compiled.rotate_compiled(k, c4, s4))
            methods["ropelab.apply_rope(backend='compile')"] = lambda: (
                apply_rope(q, layout="b h s d", backend="compile"), apply_rope(k, layout="b h s d", backend="compile"))
        except Exception as e:  # no C++ toolchain, etc.
            notes["ropelab compile"] = f"skipped: {type(e).__name__}: {str(e)[:200]}"
    try:
        from transformers import LlamaConfig
        from transformers.models.llama import modeling_llama

        config = LlamaConfig(hidden_size=h * d, num_attention_heads=h, head_dim=d, max_position_embeddings=s)
        hf_cos, hf_sin = modeling_llama.LlamaRotaryEmbedding(config)(q, torch.arange(s)[None])
        hf = modeling_llama.apply_rotary_pos_emb
        methods["HF apply_rotary_pos_emb (eager)"] = lambda: hf(q, k, hf_cos, hf_sin)
        if compile:
            compiled = torch.compile(hf, dynamic=False)
            try:
                t0 = time.perf_counter()
                compiled(q, k, hf_cos, hf_sin)
                notes["compile_seconds_hf"] = time.perf_counter() - t0
                methods["torch.compile(HF apply_rotary_pos_emb)"] = lambda: compiled(q, k, hf_cos, hf_sin)
            except Exception as e:  # no C++ toolchain, etc.: report rather than fail the benchmark
                notes["torch.compile"] = f"skipped: {type(e).__name__}: {str(e)[:200]}"
        # Same numbers? (HF forms angles in float32, ropelab in float64: differences are float32 angle error.)
        hq, _ = hf(q, k, hf_cos, hf_sin)
        notes["max_abs_diff_ropelab_vs_hf"] = float((apply_rope(q, layout="b h s d") - hq).abs().max())
    except ImportError:
        notes["transformers"] = "not installed: Hugging Face rows skipped (pip install -e '.[dev]')"

    times = time_methods(methods, repeats)
    nbytes = 4 * q.numel() * q.element_size()  # read q, k; write q', k'
    floor = statistics.median(times[COPY])
    rows = []
    for name, ts in times.items():
        q25, med, q75 = _quartiles(ts)
        rows.append(
            {
                "method": name,
                "median_ms": med * 1e3,
                "q25_ms": q25 * 1e3,
                "q75_ms": q75 * 1e3,
                "min_ms": min(ts) * 1e3,
                "gb_per_s": nbytes / med / 1e9,
                "ratio_to_copy": med / floor,
            }
        )
    # "a is faster than b" only where a's upper quartile lies below b's lower quartile
    ordering = [[a["method"], b["method"]] for a in rows for b in rows
                if a is not b and a["q75_ms"] < b["q25_ms"]]
    by = {r["method"]: r["median_ms"] for r in rows}
    ratios = {}
    if "HF apply_rotary_pos_emb (eager)" in by:
        ratios["hf_eager / ropelab.apply_rope"] = by["HF apply_rotary_pos_emb (eager)"] / by["ropelab.apply_rope"]
        if "torch.compile(HF apply_rotary_pos_emb)" in by:
            ratios["hf_compiled / ropelab.apply_rope"] = (
                by["torch.compile(HF apply_rotary_pos_emb)"] / by["ropelab.apply_rope"]
            )
    if "ropelab compiled (tables given)" in by and "torch.compile(HF apply_rotary_pos_emb)" in by:
        ratios["hf_compiled / ropelab compiled"] = (
            by["torch.compile(HF apply_rotary_pos_emb)"] / by["ropelab compiled (tables given)"])
    return {
        "benchmark": "cpu",
        "shape_bhsd": list(shape),
        "dtype": "float32",
        "bytes_moved_per_call": nbytes,
        "repeats": repeats,
        "machine": machine_info(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "ratios": ratios,
        "ordering": ordering,
        "notes": notes,
    }


def bench_decode(lengths=(1024, 4096, 16384, 32768), batches=(1, 8), heads=(32, 8), head_dim=128,
                 repeats: int = 100, threads: int = 2, l0: int = 4096, factor: float = 8.0) -> dict:
    """Time one decoding step of one attention layer at each cached length, for the four cache policies.

    Llama-3-8B-like heads (32 query heads, 8 key/value heads, d = 128), dynamic NTK past ``l0``. The
    cache is filled with L - 1 random keys and values (their values do not change the work), then
    ``RotaryKVCache.step`` appends the L-th token and attends over all L. ``bucketed`` is reported
    twice: its ordinary step, and amortised, adding the boundary re-rotation at L spread over the L
    steps until the next doubling (growth 2). Bytes are the cached-key traffic the policy's counters report.
    Policies take turns within each repeat, so a change in the machine's speed touches all alike.

    A mean hides ``bucketed``'s spike, so every row also carries the step-time distribution of a decode
    through the doubling window [L/2, L) (L/2 steps), from ``repeats`` timed ordinary steps per policy and,
    for ``bucketed``, ``repeats`` timed repeats of the window's one boundary step, timed as it happens (the
    cache still in the frame of L/2, so ``step`` re-rotates every cached key before attending):
    ``median_ms`` with its interquartile range ``q25_ms``-``q75_ms``, ``p99_ms`` (``None`` under 100
    ordinary samples, where a nearest-rank p99 is only the maximum), ``boundary_ms`` and ``max_ms``
    (:func:`step_distribution`). At L/2 >= 100 steps the boundary is under 1 % of the window, so it shows in
    the maximum, not in the median or the p99. ``equal_to_post_rope_within_noise`` says whether a row's IQR
    overlaps ``post_rope``'s (:func:`iqr_overlap`): then no speed difference between the two is claimed. At
    the default 100 repeats the run takes about a quarter of an hour on 2 idle cores (the batch-8, 32k-token
    cache is refilled for every timed step).
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int (at least 30 for a median with an IQR, 100 for a "
                         f"p99), got {repeats!r}.")
    from .kvcache import POLICIES, RopeSchedule, RotaryKVCache, schedule_for

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    hq, hkv = heads
    rope = {"rope_type": "dynamic", "factor": factor}
    spec = RopeSpec(scaling=rope, max_position_embeddings=l0)
    policies = ("post_rope", "bucketed", "recompute", "rope_on_load")  # the four PyTorch policies compared
    growth = {p: POLICIES[p].bucket_growth for p in policies}  # what each policy's schedule needs, from its class
    bucketed = tuple(p for p in policies if growth[p] is not None)  # these have a boundary step
    rows = []
    for b in batches:
        for length in lengths:
            n = length - 1
            keys = torch.randn(b, hkv, n, head_dim)
            values = torch.randn(b, hkv, n, head_dim)
            q = torch.randn(b, hq, 1, head_dim)
            k1, v1 = torch.randn(b, hkv, 1, head_dim), torch.randn(b, hkv, 1, head_dim)
            scheds = {p: schedule_for(p, spec, head_dim) for p in policies}
            times = {p: [] for p in policies}
            boundary = {p: [] for p in bucketed}  # the boundary step: the cache still in the previous bucket's frame
            traffic = {}
            for rep in range(repeats + 1):  # the first round warms up; policies take turns each round
                for policy, at_boundary in (*((p, False) for p in policies), *((p, True) for p in bucketed)):
                    cache = RotaryKVCache(scheds[policy], policy, 1)
                    # steady state: the cached keys are in the current frame; at the boundary, in L/g's
                    at = max(l0, int(length / growth[policy])) if at_boundary else length
                    cache.fill(0, keys, values, frame_length=at, spare=8)
                    t0 = time.perf_counter()
                    cache.step(0, q, k1, v1, torch.tensor([length - 1]), length)
                    if rep:
                        (boundary[policy] if at_boundary else times[policy]).append(time.perf_counter() - t0)
                    if not at_boundary:
                        traffic[policy] = cache.bytes_read + cache.bytes_written
                    del cache
            # The cos/sin table of all cached positions at the current frequencies: what the policies that
            # cache raw keys (recompute, rope_on_load) compute every step (once per step for all layers of a
            # model; all of it is charged to this one layer here).
            inv, af = RopeSchedule(spec, head_dim).at(length)
            table = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                cos_sin(torch.arange(length), inv, af)
                table.append(time.perf_counter() - t0)
            table_ms = statistics.median(table[1:]) * 1e3
            step_ms = {}
            for policy in policies:
                sched = scheds[policy]
                step_ms[policy] = statistics.median(times[policy]) * 1e3
                window = max(length // 2, 1)  # steps from L/2 to L
                crossing = policy in boundary and length > l0
                spread = step_distribution(times[policy], boundary[policy] if crossing else [], window)
                rows.append({"batch": b, "cached_tokens": length, "policy": policy,
                             "step_ms": step_ms[policy], "key_bytes_per_step": traffic[policy],
                             "table_ms": 0.0 if POLICIES[policy].rotated else table_ms,
                             **spread})
                if policy in boundary:
                    # The boundary step: re-rotate n keys from the frame of L/g to the frame of L, spread over
                    # the (g - 1) L steps until the next boundary.
                    cache = RotaryKVCache(sched, policy, 1)
                    cache.fill(0, keys, values, frame_length=max(l0, int(length / growth[policy])))
                    inv, af = sched.at(length)
                    t0 = time.perf_counter()
                    cache.rerotate(0, inv, af)
                    rerotate_ms = (time.perf_counter() - t0) * 1e3
                    steps = max((growth[policy] - 1) * length, 1)
                    amortised = step_ms[policy] + rerotate_ms / steps
                    rows.append({"batch": b, "cached_tokens": length, "policy": f"{policy} (amortised)",
                                 "step_ms": amortised, "rerotate_ms": rerotate_ms,
                                 "boundary_step_ms": statistics.median(boundary[policy]) * 1e3,
                                 "key_bytes_per_step": traffic[policy] + 2 * keys.numel() * 4 / steps})
            del keys, values
    base = {(r["batch"], r["cached_tokens"]): r for r in rows if r["policy"] == "post_rope"}
    for r in rows:
        ref = base[(r["batch"], r["cached_tokens"])]
        r["ratio_to_post_rope"] = r["step_ms"] / ref["step_ms"]
        if "q25_ms" in r:
            r["equal_to_post_rope_within_noise"] = iqr_overlap(r, ref)
    return {
        "benchmark": "decode",
        "heads_q_kv": [hq, hkv],
        "head_dim": head_dim,
        "dtype": "float32",
        "rope_scaling": rope,
        "l0": l0,
        "repeats": repeats,
        "machine": machine_info(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "note": ("ratios are measured within this one run; absolute times depend on the machine and its load "
                 "(see load_average: a load above the thread count means the CPU was shared while it ran)"),
        "rows": rows,
    }


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile of ``xs`` (linear interpolation between order statistics)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


P99_MIN_SAMPLES = 100  # nearest-rank p99 of n < 100 samples is just their maximum: no p99 is reported then


def step_distribution(steps: list[float], boundary: list[float], window: int) -> dict:
    """The per-step time (ms) over a window of ``window`` decoding steps, from ``steps`` (timed ordinary steps,
    seconds) and ``boundary`` (timed repeats of the window's one boundary step, seconds; empty if the window
    has none).

    - ``median_ms``, ``q25_ms``, ``q75_ms``, ``n_steps``: the ordinary steps' median and interquartile range
      (IQR), over the ``n_steps`` samples.
    - ``p99_ms``: the window's 99th percentile (nearest rank), each ordinary sample standing for an equal share
      of the ``window - 1`` ordinary steps and the boundary step for one. It needs at least
      :data:`P99_MIN_SAMPLES` ordinary samples, else it is ``None`` (the p99 of 30 samples is their maximum).
    - ``boundary_ms``, ``boundary_q25_ms``, ``boundary_q75_ms``, ``n_boundary``: the boundary step's median and
      IQR over its repeats (``None`` and 0 without a boundary).
    - ``max_ms``: the window's largest step: the boundary step's median if it has one and it is larger, else the
      slowest ordinary sample.
    """
    if not steps:
        raise ValueError("step_distribution needs at least one measured ordinary step.")
    if not isinstance(window, int) or window < 1 + bool(boundary):
        raise ValueError(f"window must be an int of at least {1 + bool(boundary)} steps, got {window!r}.")
    q25, med, q75 = _quartiles(steps)
    out = {"median_ms": med * 1e3, "q25_ms": q25 * 1e3, "q75_ms": q75 * 1e3, "n_steps": len(steps),
           "window_steps": window}
    n_boundary = 1 if boundary else 0
    if boundary:
        b25, bmed, b75 = _quartiles(boundary)
        out.update(boundary_ms=bmed * 1e3, boundary_q25_ms=b25 * 1e3, boundary_q75_ms=b75 * 1e3,
                   n_boundary=len(boundary))
    else:
        out.update(boundary_ms=None, boundary_q25_ms=None, boundary_q75_ms=None, n_boundary=0)
    samples = sorted([(t, (window - n_boundary) / len(steps)) for t in steps]
                     + ([(bmed, 1.0)] if boundary else []))
    acc, p99 = 0.0, samples[-1][0]
    for t, w in samples:
        acc += w
        if acc >= 0.99 * window - 1e-9:
            p99 = t
            break
    out["p99_ms"] = p99 * 1e3 if len(steps) >= P99_MIN_SAMPLES else None
    out["max_ms"] = max(max(steps), bmed if boundary else 0.0) * 1e3
    return out


def iqr_overlap(a: dict, b: dict) -> bool:
    """Whether two rows' interquartile ranges (``q25_ms`` to ``q75_ms``) overlap: then their medians are equal
    within noise, and no ordering of the two is claimed."""
    return a["q25_ms"] <= b["q75_ms"] and b["q25_ms"] <= a["q75_ms"]


# Moves across each explorer's controls, extremes included (what a student can reach with the sliders);
# tests/test_explorers.py draws the same ones.
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
    (min and max), and per explorer the median and the slowest move's median. Nothing is asserted."""
    from . import explorers

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
    """Print one line per explorer: the median update's CPU time over its moves, and the slowest move's."""
    print(f"explorer update CPU time ({result['repeats']} repeats per move; budget {result['budget_ms']} ms)")
    for name, s in result["summary"].items():
        median, slowest = s["cpu_ms_median_over_moves"], s["cpu_ms_slowest_move"]
        print(f"{name:20s} median {median:7.1f} ms   slowest move {slowest:7.1f} ms")


def print_decode(result: dict) -> None:
    """Print ``bench_decode``'s rows as a table."""
    print(f"one decoding step, one layer, heads {result['heads_q_kv']} (q, kv), d={result['head_dim']}, "
          f"dynamic NTK past {result['l0']}, {result['machine']['torch_threads']} threads, {result['machine']['cpu']}")
    print(f"{'batch':>5s} {'cached':>7s} {'policy':22s} {'ms/step':>9s} {'x post_rope':>11s} {'key MB/step':>11s} "
          f"{'of it cos/sin ms':>16s} {'median':>8s} {'IQR':>17s} {'p99':>8s} {'max':>8s}  (ordinary steps)")
    for r in result["rows"]:
        iqr = f" [{r['q25_ms']:7.2f}, {r['q75_ms']:7.2f}]" if "q25_ms" in r else f" {'':17s}"
        spread = "".join(f" {r[k]:8.2f}" if r.get(k) is not None else f" {'-' if k in r else '':>8s}"
                         for k in ("median_ms", "p99_ms", "max_ms"))
        spread = spread[:9] + iqr + spread[9:]
        print(f"{r['batch']:5d} {r['cached_tokens']:7d} {r['policy']:22s} {r['step_ms']:9.2f} "
              f"{r['ratio_to_post_rope']:11.2f} {r['key_bytes_per_step'] / 1e6:11.2f} {r.get('table_ms', 0.0):16.2f}"
              + spread)


def print_table(result: dict) -> None:
    """Print ``bench_cpu``'s rows and ratios as a table."""
    print(f"RoPE on q and k, shape {result['shape_bhsd']} (b h s d) float32, "
          f"{result['machine']['torch_threads']} threads, {result['machine']['cpu']}")
    print(f"{'method':44s} {'median ms':>10s} {'IQR ms':>19s} {'GB/s':>7s} {'x copy':>7s}")
    for r in result["rows"]:
        iqr = f"[{r['q25_ms']:8.2f}, {r['q75_ms']:8.2f}]" if "q25_ms" in r else ""
        ratio = r.get("ratio_to_copy", r.get("ratio_to_clone"))
        print(f"{r['method']:44s} {r['median_ms']:10.2f} {iqr:>19s} {r['gb_per_s']:7.2f} {ratio:7.2f}")
    for a, b in result.get("ordering", []):
        print(f"faster across the IQRs: {a} < {b}")
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.2f}x")
    for k, v in result["notes"].items():
        print(f"note {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.bench cpu | gpu | decode | explorers``."""
    parser = argparse.ArgumentParser(prog="python -m ropelab.bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="which", required=True)
    cpu = sub.add_parser("cpu", help="RoPE on q and k: ropelab vs Hugging Face eager and compiled, vs a copy")
    cpu.add_argument("--shape", type=int, nargs=4, default=[1, 32, 4096, 128], metavar=("B", "H", "S", "D"))
    cpu.add_argument("--repeats", type=int, default=20)
    cpu.add_argument("--threads", type=int, default=2)
    cpu.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    cpu.add_argument("--out", default=str(DATA_DIR / "bench" / "cpu.json"))
    gpu = sub.add_parser("gpu", help="fused RoPE kernels vs peers on a GPU (CPU implementations without one)")
    gpu.add_argument("--out-dir", default=str(DATA_DIR / "bench"))
    gpu.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    gpu.add_argument("--flash-rotary", default=None, help="path to flash-attn's flash_attn/ops/triton/rotary.py")
    dec = sub.add_parser("decode", help="time per decoding step for the four KV-cache policies")
    dec.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    dec.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    dec.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("Q", "KV"))
    dec.add_argument("--head-dim", type=int, default=128)
    dec.add_argument("--repeats", type=int, default=100,
                     help="timed ordinary steps per policy (and boundary steps): >= 30 for an IQR, 100 for a p99")
    dec.add_argument("--threads", type=int, default=2)
    dec.add_argument("--out", default=str(DATA_DIR / "bench" / "decode.json"))
    dec.add_argument("--gpu-out-dir", default=str(DATA_DIR / "bench"),
                     help="where the GPU rows go (decode-gpu-<device>.json; ropelab.kernels.decode_bench)")
    dec.add_argument("--gpu-only", action="store_true", help="measure the GPU rows only, not the CPU policies")
    exp = sub.add_parser("explorers", help="CPU time of one update of each notebook explorer")
    exp.add_argument("--repeats", type=int, default=7)
    exp.add_argument("--threads", type=int, default=2)
    exp.add_argument("--out", default=str(DATA_DIR / "bench" / "explorers.json"))
    args = parser.parse_args(argv)
    if args.which == "explorers":
        result = bench_explorers(args.repeats, args.threads)
        print_explorers(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    if args.which == "gpu":
        from .kernels import bench_gpu

        return bench_gpu.main(out_dir=args.out_dir, quick=args.quick, flash_rotary=args.flash_rotary)
    if args.which == "decode":  # the Triton decode kernel's rows, on a GPU only (ropelab.kernels.decode_bench)
        from .kernels.decode_bench import run_gpu_decode

        run_gpu_decode(args.gpu_out_dir)
        if args.gpu_only:
            return 0
    if args.which == "decode":
        result = bench_decode(tuple(args.lengths), tuple(args.batches), tuple(args.heads), args.head_dim,
                              args.repeats, args.threads, l0=min(4096, min(args.lengths)))
        print_decode(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    if args.which == "cpu":
        result = bench_cpu(tuple(args.shape), args.repeats, args.threads, compile=not args.no_compile)
        print_table(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
