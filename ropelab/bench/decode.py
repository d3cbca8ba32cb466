"""``python -m ropelab.bench decode``: one decoding step of one attention layer under dynamic NTK, for every KV-cache
policy, the step-time distribution of a doubling window and the boundary step as it happens."""

from __future__ import annotations

import os
import statistics
import time

import torch

from ..core import cos_sin
from ..machine import machine_info
from ..spec import RopeSpec
from .timing import P99_MIN_SAMPLES, iqr_overlap, quartiles

__all__ = ["bench_decode", "step_distribution", "print_decode"]


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

    Args:
        lengths: the cached lengths L (tokens after the step).
        batches: the batch sizes.
        heads: (query heads, key/value heads).
        head_dim: d.
        repeats: timed steps per policy, length and batch: a positive int (ValueError otherwise).
        threads: torch's intra-op threads, set for the process.
        l0: dynamic NTK's :math:`L_0` (``max_position_embeddings``), where the frequencies start to move.
        factor: dynamic NTK's factor s.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int (at least 30 for a median with an IQR, 100 for a "
                         f"p99), got {repeats!r}.")
    from ..kvcache import POLICIES, RopeSchedule, RotaryKVCache, schedule_for

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

    Args:
        steps: timed ordinary steps in seconds, at least one (ValueError otherwise).
        boundary: timed repeats of the boundary step in seconds; empty when the window has none.
        window: the window's number of steps, an int >= 1 (>= 2 with a boundary).
    """
    if not steps:
        raise ValueError("step_distribution needs at least one measured ordinary step.")
    if not isinstance(window, int) or window < 1 + bool(boundary):
        raise ValueError(f"window must be an int of at least {1 + bool(boundary)} steps, got {window!r}.")
    q25, med, q75 = quartiles(steps)
    out = {"median_ms": med * 1e3, "q25_ms": q25 * 1e3, "q75_ms": q75 * 1e3, "n_steps": len(steps),
           "window_steps": window}
    n_boundary = 1 if boundary else 0
    if boundary:
        b25, bmed, b75 = quartiles(boundary)
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


def print_decode(result: dict) -> None:
    """Print ``bench_decode``'s rows as a table.

    Args:
        result: :func:`bench_decode`'s dict (or the JSON it was saved as).
    """
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
