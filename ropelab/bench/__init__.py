"""Benchmarks: ratios measured in one run on the same inputs (not timed tests).

The commands::

    python -m ropelab.bench cpu [--shape 1 32 4096 128] [--repeats 20] [--dtypes float32 bfloat16]
        [--cases prefill decode] [--out data/bench/cpu.json]
    python -m ropelab.bench gpu [--out-dir data/bench] [--quick]   (ropelab.bench.gpu)
    python -m ropelab.bench decode [--lengths 1024 4096 16384 32768] [--batches 1 8] [--out data/bench/decode.json]
    python -m ropelab.bench explorers [--repeats 7] [--out data/bench/explorers.json]
    python -m ropelab.bench fused [--tokens 1024] [--heads 32 8] [--head-dim 128] [--repeats 20] [--out F]
    python -m ropelab.bench readme      (docs/guides/benchmarks.md's block, from the committed JSON: ``report``)

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

``fused`` times QK-RMSNorm alone, the unfused norm -> ``apply_rope`` -> cache-write sequence and the fused
``ropelab.qk_norm_rope`` (each backend that runs) on the same packed QKV and paged cache, with each row's ratio
to the norm alone (``ropelab.bench.fused``).

One file per benchmark: ``cpu``, ``decode``, ``explorers``, ``fused``, ``gpu`` (the fused kernels against their
peers) and ``gpu_decode`` (the Triton decode kernel's GPU rows); ``timing`` holds what they share. Benchmarks sit above
everything they time; nothing in the package imports them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..machine import machine_info
from ..paths import DATA_DIR
from .cpu import COPY, bench_cpu, print_table
from .decode import bench_decode, print_decode, step_distribution
from .explorers import EXPLORER_MOVES, bench_explorers, print_explorers
from .report import write_page
from .timing import iqr_overlap, time_methods

__all__ = ["machine_info", "time_methods", "bench_cpu", "bench_decode", "print_table", "print_decode", "COPY",
           "step_distribution", "iqr_overlap", "EXPLORER_MOVES", "bench_explorers", "print_explorers", "main"]


def _write_json(result: dict, path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.bench cpu | gpu | decode | explorers | fused``.

    Args:
        argv: the command-line arguments (a subcommand and its options); None: ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(prog="python -m ropelab.bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="which", required=True)
    cpu = sub.add_parser("cpu", help="RoPE on q and k: ropelab vs Hugging Face eager and compiled, vs a copy")
    cpu.add_argument("--shape", type=int, nargs=4, default=[1, 32, 4096, 128], metavar=("B", "H", "S", "D"))
    cpu.add_argument("--repeats", type=int, default=20)
    cpu.add_argument("--threads", type=int, default=2)
    cpu.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    cpu.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    cpu.add_argument("--cases", nargs="+", default=["prefill"], choices=["prefill", "decode"],
                     help="prefill: --shape as given; decode: batch 8, one token per sequence at 32000 + i, "
                          "--shape's heads and head dim")
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
                     help="where the GPU rows go (decode-gpu-<device>.json; ropelab.bench.gpu_decode)")
    dec.add_argument("--gpu-only", action="store_true", help="measure the GPU rows only, not the CPU policies")
    sub.add_parser("readme", help="rewrite docs/guides/benchmarks.md's benchmark block from data/bench/cpu.json "
                   "and decode.json")
    exp = sub.add_parser("explorers", help="CPU time of one update of each notebook explorer")
    exp.add_argument("--repeats", type=int, default=7)
    exp.add_argument("--threads", type=int, default=2)
    exp.add_argument("--out", default=str(DATA_DIR / "bench" / "explorers.json"))
    fus = sub.add_parser("fused", help="QK-RMSNorm alone vs norm -> RoPE -> cache write vs the fused qk_norm_rope")
    fus.add_argument("--tokens", type=int, default=1024)
    fus.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("Q", "KV"))
    fus.add_argument("--head-dim", type=int, default=128)
    fus.add_argument("--rotary-dim", type=int, default=None)
    fus.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    fus.add_argument("--repeats", type=int, default=20)
    fus.add_argument("--threads", type=int, default=2)
    fus.add_argument("--backends", nargs="+", default=["torch", "compile", "cpu", "triton"])
    fus.add_argument("--device", default="cpu")
    fus.add_argument("--out", default=str(DATA_DIR / "bench" / "fused.json"))
    args = parser.parse_args(argv)
    if args.which == "fused":
        from .fused import bench_fused, print_fused

        result = bench_fused(args.tokens, tuple(args.heads), args.head_dim, args.rotary_dim, args.dtype, args.repeats,
                             args.threads, backends=tuple(args.backends), device=args.device)
        print_fused(result)
        _write_json(result, args.out)
        return 0
    if args.which == "readme":
        print(f"wrote the benchmark block of {write_page()}")
        return 0
    if args.which == "explorers":
        result = bench_explorers(args.repeats, args.threads)
        print_explorers(result)
        _write_json(result, args.out)
        return 0
    if args.which == "gpu":
        from . import gpu as bench_gpu

        return bench_gpu.main(out_dir=args.out_dir, quick=args.quick, flash_rotary=args.flash_rotary)
    if args.which == "decode":  # the Triton decode kernel's rows, on a GPU only (ropelab.bench.gpu_decode)
        from .gpu_decode import run_gpu_decode

        run_gpu_decode(args.gpu_out_dir)
        if args.gpu_only:
            return 0
    if args.which == "decode":
        result = bench_decode(tuple(args.lengths), tuple(args.batches), tuple(args.heads), args.head_dim,
                              args.repeats, args.threads, l0=min(4096, min(args.lengths)))
        print_decode(result)
        _write_json(result, args.out)
    if args.which == "cpu":
        import torch

        for case in args.cases:
            for dtype in args.dtypes:
                shape = tuple(args.shape) if case == "prefill" else (8, args.shape[1], 1, args.shape[3])
                result = bench_cpu(shape, args.repeats, args.threads, compile=not args.no_compile,
                                   dtype=getattr(torch, dtype), decode=case == "decode")
                print_table(result)
                # prefill float32 goes to --out (the file the guide quotes); every other case beside it
                out = Path(args.out)
                if (case, dtype) != ("prefill", "float32"):
                    out = out.with_name(f"{out.stem}-{case}-{dtype}{out.suffix}")
                _write_json(result, str(out))
    return 0
