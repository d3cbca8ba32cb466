"""Benchmarks: ratios measured in one run on the same inputs (not timed tests).

    python -m ropelab.bench cpu [--shape 1 32 4096 128] [--repeats 20] [--out data/bench/cpu.json]
    python -m ropelab.bench gpu [--out-dir data/bench] [--quick]   (ropelab.kernels.bench_gpu)
    python -m ropelab.bench decode [--lengths 1024 4096 16384 32768] [--batches 1 8] [--out data/bench/decode.json]

``cpu`` times, on the same q and k ([b, h, s, d] float32 by default, the issue's Llama-7B-like head
shape): a plain clone of q and k (the memory-traffic floor), ``ropelab.apply_rope`` (tables included),
``ropelab.rotate`` with precomputed tables, Hugging Face Llama's ``apply_rotary_pos_emb`` (eager, tables
precomputed by ``LlamaRotaryEmbedding`` and not timed) and ``torch.compile`` of it. Each method is timed
as the median of ``--repeats`` runs after warm-up, methods interleaved round-robin so drift in the
machine's speed touches all alike. Prints a table (time, GB/s, ratio to the clone) and writes JSON.
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

from .core import apply_rope, cos_sin, rotate
from .machine import machine_info
from .paths import DATA_DIR
from .scaling import frequencies
from .spec import RopeSpec

__all__ = ["machine_info", "time_methods", "bench_cpu", "bench_decode", "print_table", "print_decode",
           "step_distribution", "main"]


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


def bench_cpu(shape=(1, 32, 4096, 128), repeats: int = 20, threads: int = 2, compile: bool = True) -> dict:
    """RoPE on q and k [b, h, s, d]: ropelab vs Hugging Face eager and compiled vs a clone (module docstring)."""
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    b, h, s, d = shape
    q, k = torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    inv_freq, _ = frequencies(d)
    c, si = cos_sin(torch.arange(s), inv_freq, dtype=torch.float32)
    c4, s4 = c[None, None], si[None, None]

    methods: dict[str, Callable[[], object]] = {
        "clone (floor)": lambda: (q.clone(), k.clone()),
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
    floor = statistics.median(times["clone (floor)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "method": name,
                "median_ms": med * 1e3,
                "min_ms": min(ts) * 1e3,
                "gb_per_s": nbytes / med / 1e9,
                "ratio_to_clone": med / floor,
            }
        )
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
        "notes": notes,
    }


def bench_decode(lengths=(1024, 4096, 16384, 32768), batches=(1, 8), heads=(32, 8), head_dim=128,
                 repeats: int = 3, threads: int = 2, l0: int = 4096, factor: float = 8.0) -> dict:
    """Time one decoding step of one attention layer at each cached length, for the four cache policies.

    Llama-3-8B-like heads (32 query heads, 8 key/value heads, d = 128), dynamic NTK past ``l0``. The
    cache is filled with L - 1 random keys and values (their values do not change the work), then
    ``RotaryKVCache.step`` appends the L-th token and attends over all L. ``bucketed`` is reported
    twice: its ordinary step, and amortised, adding the boundary re-rotation at L spread over the L
    steps until the next doubling (growth 2). Bytes are the cached-key traffic the policy's counters report.
    Policies take turns within each repeat, so a change in the machine's speed touches all alike.

    A mean hides ``bucketed``'s spike, so every row also carries the step-time distribution of a decode
    through the doubling window [L/2, L) (L/2 steps): ``median_ms``, ``p99_ms`` and ``max_ms``. The
    ordinary steps are the measured samples, each standing for an equal share of the window; for
    ``bucketed`` one step of the window is the boundary step, timed as it happens (the cache still in
    the frame of L/2, so ``step`` re-rotates every cached key before attending). At L/2 >= 100 steps the
    boundary is under 1 % of them, so it shows in the maximum, not in the median or the p99.
    """
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
    base = {(r["batch"], r["cached_tokens"]): r["step_ms"] for r in rows if r["policy"] == "post_rope"}
    for r in rows:
        r["ratio_to_post_rope"] = r["step_ms"] / base[(r["batch"], r["cached_tokens"])]
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
    """Median, p99 and max (ms) of the per-step time over a window of ``window`` decoding steps: one of them a
    boundary step (when ``boundary`` samples are given), the rest ordinary. Each measured sample stands for an
    equal share of the steps of its kind (a weighted empirical distribution; p99 by nearest rank)."""
    if not steps:
        raise ValueError("step_distribution needs at least one measured ordinary step.")
    n_boundary = 1 if boundary else 0
    samples = [(t, (window - n_boundary) / len(steps)) for t in steps]
    samples += [(t, n_boundary / len(boundary)) for t in boundary]
    samples.sort()
    total = sum(w for _, w in samples)

    def quantile(p: float) -> float:
        acc = 0.0
        for t, w in samples:
            acc += w
            if acc >= p * total - 1e-9:
                return t
        return samples[-1][0]

    return {"median_ms": quantile(0.5) * 1e3, "p99_ms": quantile(0.99) * 1e3, "max_ms": samples[-1][0] * 1e3,
            "window_steps": window}


def print_decode(result: dict) -> None:
    """Print ``bench_decode``'s rows as a table."""
    print(f"one decoding step, one layer, heads {result['heads_q_kv']} (q, kv), d={result['head_dim']}, "
          f"dynamic NTK past {result['l0']}, {result['machine']['torch_threads']} threads, {result['machine']['cpu']}")
    print(f"{'batch':>5s} {'cached':>7s} {'policy':22s} {'ms/step':>9s} {'x post_rope':>11s} {'key MB/step':>11s} "
          f"{'of it cos/sin ms':>16s} {'median':>8s} {'p99':>8s} {'max':>8s}")
    for r in result["rows"]:
        spread = "".join(f" {r[k]:8.2f}" if k in r else f" {'':8s}" for k in ("median_ms", "p99_ms", "max_ms"))
        print(f"{r['batch']:5d} {r['cached_tokens']:7d} {r['policy']:22s} {r['step_ms']:9.2f} "
              f"{r['ratio_to_post_rope']:11.2f} {r['key_bytes_per_step'] / 1e6:11.2f} {r.get('table_ms', 0.0):16.2f}"
              + spread)


def print_table(result: dict) -> None:
    """Print ``bench_cpu``'s rows and ratios as a table."""
    print(f"RoPE on q and k, shape {result['shape_bhsd']} (b h s d) float32, "
          f"{result['machine']['torch_threads']} threads, {result['machine']['cpu']}")
    print(f"{'method':42s} {'median ms':>10s} {'GB/s':>7s} {'x clone':>8s}")
    for r in result["rows"]:
        print(f"{r['method']:42s} {r['median_ms']:10.2f} {r['gb_per_s']:7.2f} {r['ratio_to_clone']:8.2f}")
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.2f}x")
    for k, v in result["notes"].items():
        print(f"note {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.bench cpu | decode``."""
    parser = argparse.ArgumentParser(prog="python -m ropelab.bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="which", required=True)
    cpu = sub.add_parser("cpu", help="RoPE on q and k: ropelab vs Hugging Face eager and compiled, vs a clone")
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
    dec.add_argument("--repeats", type=int, default=3)
    dec.add_argument("--threads", type=int, default=2)
    dec.add_argument("--out", default=str(DATA_DIR / "bench" / "decode.json"))
    dec.add_argument("--gpu-out-dir", default=str(DATA_DIR / "bench"),
                     help="where the GPU rows go (decode-gpu-<device>.json; ropelab.kernels.decode_bench)")
    dec.add_argument("--gpu-only", action="store_true", help="measure the GPU rows only, not the CPU policies")
    args = parser.parse_args(argv)
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
