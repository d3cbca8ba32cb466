"""``python -m ropelab.bench cpu``: RoPE on q and k, ropelab against Hugging Face eager and compiled, against a copy
of the same bytes into preallocated buffers (the memory-traffic reference), in one run on the same inputs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..core import cos_sin, rotate
from ..machine import machine_info
from ..rope import apply_rope
from ..scaling import frequencies
from .timing import quartiles, time_methods

__all__ = ["COPY", "bench_cpu", "print_table"]

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
        from ..kernels import compiled as rope_compiled

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
        q25, med, q75 = quartiles(ts)
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
