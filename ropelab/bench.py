"""Benchmarks: ratios measured in one run on the same inputs (not timed tests).

    python -m ropelab.bench cpu [--shape 1 32 4096 128] [--repeats 20] [--out data/bench/cpu.json]

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
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .core import apply_rope, cos_sin, rotate
from .scaling import frequencies

REPO = Path(__file__).resolve().parents[1]


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


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
                compiled(q, k, hf_cos, hf_sin)
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


def print_table(result: dict) -> None:
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
    parser = argparse.ArgumentParser(prog="python -m ropelab.bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="which", required=True)
    cpu = sub.add_parser("cpu", help="RoPE on q and k: ropelab vs Hugging Face eager and compiled, vs a clone")
    cpu.add_argument("--shape", type=int, nargs=4, default=[1, 32, 4096, 128], metavar=("B", "H", "S", "D"))
    cpu.add_argument("--repeats", type=int, default=20)
    cpu.add_argument("--threads", type=int, default=2)
    cpu.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    cpu.add_argument("--out", default=str(REPO / "data" / "bench" / "cpu.json"))
    args = parser.parse_args(argv)
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
