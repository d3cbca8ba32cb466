"""``python -m ropelab.bench cpu``: RoPE on q and k, ropelab against Hugging Face eager and compiled and llama.cpp's
``ggml_rope_ext``, against a copy of the same bytes into preallocated buffers (the memory-traffic reference), in one
run on the same inputs.

Two shapes: prefill (``[b, h, s, d]``, positions 0 .. s-1) and decode (one new token per sequence,
``[b, h, 1, d]``, positions ``32000 + i`` for sequence i, as 2-D ``[b, 1]`` positions); float32 or bfloat16.
The ropelab rows: the default ``apply_rope`` call (keywords, and ``spec=``), its ``out=`` and ``inplace=True``
forms, ``apply_rope_qk`` (q and k in one call), ``backend="torch"``, ``rotate`` with tables given, and
``backend="compile"``. ggml's row times ``ggml_graph_compute_with_ctx`` of a graph holding the two
``ggml_rope_ext`` ops (q and k) alone, built once (tensors, graph and the data copies are not timed), float32 only
(its CPU op takes float32 and float16). First-call costs (the CPU kernel's build, torch.compile) are notes apart.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable

import torch

from ..core import cos_sin, rotate
from ..machine import machine_info
from ..rope import apply_rope, apply_rope_qk, rope_path
from ..scaling import frequencies
from ..spec import RopeSpec
from .timing import quartiles, time_methods

__all__ = ["COPY", "bench_cpu", "print_table"]

COPY = "copy into preallocated buffers (reference)"  # bench_cpu's reference row


DECODE_POSITION = 32000  # the decode shape's first sequence's position (sequence i at 32000 + i)
GGML = "ggml_rope_ext (llama.cpp, compute only)"


class _GgmlRope:
    """ggml_rope_ext on q and k ([b, h, s, d] float32, as ggml's [n_tokens, n_heads, head_dim] per batch element
    folded into tokens), the graph built once; :meth:`__call__` runs ggml_graph_compute_with_ctx only."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, threads: int, mode: str):
        from ..engines import ggml

        base, self.cpu = ggml._ggml()
        self.base = base
        b, h, s, d = q.shape
        n_tok = b * s
        pos = positions.reshape(-1).to(torch.int32).contiguous()
        nbytes = 4 * 4 * q.numel() + 4 * pos.numel()
        self.ctx = base.ggml_init(ggml._InitParams(nbytes + (64 << 20), None, False))
        if not self.ctx:
            raise RuntimeError("ggml_init failed")
        p = base.ggml_new_tensor_1d(self.ctx, ggml._GGML_TYPE_I32, n_tok)
        ctypes.memmove(base.ggml_get_data(p), pos.data_ptr(), pos.numel() * 4)
        self.graph = base.ggml_new_graph(self.ctx)
        for x in (q, k):
            t = base.ggml_new_tensor_3d(self.ctx, ggml._GGML_TYPE_F32, d, h, n_tok)
            xs = x.permute(0, 2, 1, 3).contiguous()  # [b, s, h, d]: token-major
            ctypes.memmove(base.ggml_get_data(t), xs.data_ptr(), xs.numel() * 4)
            y = base.ggml_rope_ext(self.ctx, t, p, None, d, ggml.ROPE_MODES[mode], 0, 10000.0, 1.0, 0.0, 1.0,
                                   32.0, 1.0)
            base.ggml_build_forward_expand(self.graph, y)
        self.threads = threads

    def __call__(self):
        status = self.cpu.ggml_graph_compute_with_ctx(self.ctx, self.graph, self.threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx failed with status {status}")

    def close(self):
        self.base.ggml_free(self.ctx)


def _fresh_build_seconds() -> float:
    """Seconds to compile the CPU kernel from scratch (into a temporary cache: the cached one is untouched)."""
    import os
    import tempfile

    from ..kernels import cpu_build, cpu_rope

    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("ROPELAB_KERNEL_CACHE")
        os.environ["ROPELAB_KERNEL_CACHE"] = tmp
        try:
            t0 = time.perf_counter()
            cpu_build.load_library(f"cpu_rope_probe_{time.time_ns()}", cpu_rope.SOURCE)  # a new name: no reuse
            return time.perf_counter() - t0
        finally:
            if old is None:
                del os.environ["ROPELAB_KERNEL_CACHE"]
            else:
                os.environ["ROPELAB_KERNEL_CACHE"] = old


def bench_cpu(shape=(1, 32, 4096, 128), repeats: int = 20, threads: int = 2, compile: bool = True,
              dtype: torch.dtype = torch.float32, decode: bool = False) -> dict:
    """RoPE on q and k [b, h, s, d] (``decode``: [b, h, 1, d] at positions 32000 + i): ropelab vs Hugging Face
    eager and compiled vs ggml vs a copy into preallocated buffers (module docstring). Each row has
    ``median_ms``, ``q25_ms``, ``q75_ms`` and ``ratio_to_copy``.

    Args:
        shape: (b, h, s, d) of q and of k (random normal, seed 0); with ``decode`` s is 1.
        repeats: timed rounds, a positive int (20 or more for an IQR; ValueError otherwise).
        threads: torch's intra-op threads, set for the process (``torch.set_num_threads``) and left so.
        compile: also time the ``torch.compile`` rows (ropelab's compiled formula, Hugging Face's function); their
            compile time is a note, not a row.
        dtype: torch.float32 or torch.bfloat16 (ValueError otherwise).
        decode: the decode case: batch b of one token each, at positions 32000 + i.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int (20 or more for an IQR), got {repeats!r}.")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype!r}.")
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    b, h, s, d = shape
    if decode:
        s = 1
        shape = (b, h, 1, d)
    q, k = torch.randn(b, h, s, d).to(dtype), torch.randn(b, h, s, d).to(dtype)
    pos2 = (DECODE_POSITION + torch.arange(b))[:, None] if decode else torch.arange(s)[None].expand(b, s)
    positions = pos2 if decode else torch.arange(s)
    inv_freq, _ = frequencies(d)
    c, si = cos_sin(positions, inv_freq, dtype=torch.float32)
    c4, s4 = (c[:, None], si[:, None]) if decode else (c[None, None], si[None, None])
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)  # the copy writes into these: no allocation timed
    q_ip, k_ip = q.clone(), k.clone()  # rotated in place, round after round (a rotation keeps them finite)
    spec = RopeSpec.from_keywords(d)
    lay = "b h s d"

    from ..kernels import cpu_build, cpu_fast, cpu_rope

    try:  # apply_rope's C++ fast path for small calls: built once (make setup), never on a call; its time apart
        fast_build = cpu_fast.build()
    except cpu_build.BuildError as e:
        fast_build = {"not built": str(e)[:300]}
    t0 = time.perf_counter()
    apply_rope(q, positions, layout=lay)
    notes: dict = {"first_call_seconds_apply_rope": time.perf_counter() - t0,
                   "apply_rope_path": list(rope_path(q, positions, layout=lay)),
                   "cpu_kernel_build": cpu_rope.build_info(), "cpu_fast_build": fast_build}
    if cpu_rope.available():
        notes["cpu_kernel_fresh_build_seconds"] = _fresh_build_seconds()
    methods: dict[str, Callable[[], object]] = {
        COPY: lambda: (q_out.copy_(q), k_out.copy_(k)),
        "ropelab.apply_rope": lambda: (apply_rope(q, positions, layout=lay), apply_rope(k, positions, layout=lay)),
        "ropelab.rotate (tables given)": lambda: (rotate(q, c4, s4), rotate(k, c4, s4)),
        "ropelab.apply_rope(spec=)": lambda: (apply_rope(q, positions, layout=lay, spec=spec),
                                              apply_rope(k, positions, layout=lay, spec=spec)),
        "ropelab.apply_rope(out=)": lambda: (apply_rope(q, positions, layout=lay, out=q_out),
                                             apply_rope(k, positions, layout=lay, out=k_out)),
        "ropelab.apply_rope(inplace=True)": lambda: (apply_rope(q_ip, positions, layout=lay, inplace=True),
                                                     apply_rope(k_ip, positions, layout=lay, inplace=True)),
        "ropelab.apply_rope_qk": lambda: apply_rope_qk(q, k, positions, layout=lay),
        "ropelab.apply_rope(backend='torch')": lambda: (apply_rope(q, positions, layout=lay, backend="torch"),
                                                        apply_rope(k, positions, layout=lay, backend="torch")),
    }
    if compile:  # backend="compile": one single-pass formula through torch.compile; compile time apart
        from ..kernels import compiled as rope_compiled

        try:
            t0 = time.perf_counter()
            rope_compiled.rotate_compiled(q, c4, s4), rope_compiled.rotate_compiled(k, c4, s4)
            apply_rope(q, positions, layout=lay, backend="compile")
            notes["compile_seconds_ropelab"] = time.perf_counter() - t0
            methods["ropelab compiled (tables given)"] = lambda: (rope_compiled.rotate_compiled(q, c4, s4),
                                                                  rope_compiled.rotate_compiled(k, c4, s4))
            methods["ropelab.apply_rope(backend='compile')"] = lambda: (
                apply_rope(q, positions, layout=lay, backend="compile"),
                apply_rope(k, positions, layout=lay, backend="compile"))
        except Exception as e:  # no C++ toolchain, etc.
            notes["ropelab compile"] = f"skipped: {type(e).__name__}: {str(e)[:200]}"
    try:
        from transformers import LlamaConfig
        from transformers.models.llama import modeling_llama

        config = LlamaConfig(hidden_size=h * d, num_attention_heads=h, head_dim=d,
                             max_position_embeddings=max(s, DECODE_POSITION + b))
        hf_cos, hf_sin = modeling_llama.LlamaRotaryEmbedding(config)(q, pos2)
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
        notes["max_abs_diff_ropelab_vs_hf"] = float((apply_rope(q, positions, layout=lay) - hq).abs().max())
    except ImportError:
        notes["transformers"] = "not installed: Hugging Face rows skipped (pip install -e '.[dev]')"
    ggml_op = None
    if dtype != torch.float32:
        notes["ggml"] = "not timed: ropelab.engines.ggml.rope takes float32 (ggml's CPU RoPE: float32, float16)"
    else:
        try:
            ggml_op = _GgmlRope(q, k, pos2, threads, "neox")
            methods[GGML] = ggml_op
            from ..engines.ggml import ggml_libraries

            notes["ggml_build"] = ggml_libraries()[2]
        except ImportError as e:
            notes["ggml"] = f"not timed: {e}"

    notes["cpu_fast"] = cpu_fast.build_info()
    try:
        times = time_methods(methods, repeats)
    finally:
        if ggml_op is not None:
            ggml_op.close()
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
    for name in ("torch.compile(HF apply_rotary_pos_emb)", GGML):
        if name in by:
            ratios[f"{name} / ropelab.apply_rope"] = by[name] / by["ropelab.apply_rope"]
    return {
        "benchmark": "cpu",
        "shape_bhsd": list(shape),
        "case": "decode" if decode else "prefill",
        "dtype": str(dtype).removeprefix("torch."),
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
    """Print ``bench_cpu``'s rows and ratios as a table.

    Args:
        result: :func:`bench_cpu`'s dict (or the JSON it was saved as).
    """
    print(f"RoPE on q and k, {result.get('case', 'prefill')} shape {result['shape_bhsd']} (b h s d) "
          f"{result['dtype']}, "
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
