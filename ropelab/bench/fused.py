"""``python -m ropelab.bench fused``: QK-RMSNorm alone vs the unfused norm -> RoPE -> cache-write sequence vs the
fused :func:`ropelab.qk_norm_rope` (each backend that runs here), in one run on the same inputs.

The question is quack's and the peers' (``shared/research/anchors-2026.md`` section 1.2): what RoPE and the cache
write cost *on top of* the norm they are fused into. Every method gets the same packed QKV projection output
``[tokens, (Hq + 2 Hkv) * D]``, the same weights, positions and paged cache (a shuffled block table's
``slot_mapping``):

- ``RMSNorm alone``: the per-head norm of q and k (float32 math, one rounding), nothing else;
- ``unfused``: that norm, then :func:`ropelab.apply_rope` on q and k (``spec=``, ``layout="t h d"``), then the
  cache write of k and v (an indexed copy);
- ``fused (backend=...)``: :func:`ropelab.qk_norm_rope` writing the same cache: ``torch`` (eager reference),
  ``compile`` (``torch.compile`` of it), ``cpu`` (the C/OpenMP kernel), ``triton`` (on a GPU).

For the C and Triton backends the same kernel also runs with rotary dim 0 and no cache
(:func:`ropelab.kernels.qk_norm_rope.qk_rms_norm`): the norm alone at that kernel's speed, so ``x own norm`` is
what RoPE and the cache write add inside the fused pass (quack's "overhead vs the unfused producer op").
Median and interquartile range of ``--repeats`` rounds, methods interleaved round-robin
(:func:`ropelab.bench.timing.time_methods`); ``x norm`` is each row's median over the eager norm's. The byte model of
:func:`ropelab.kernels.traffic.qk_norm_rope_traffic` is printed beside it (a model, not a measurement).
``backend="triton"`` is timed only on a GPU (Triton's CPU interpreter is for tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..kernels.qk_norm_rope import qk_norm_rope, qk_rms_norm
from ..kernels.traffic import qk_norm_rope_traffic
from ..machine import machine_info
from ..rope import apply_rope
from ..spec import RopeSpec
from .timing import quartiles, time_methods

__all__ = ["NORM", "OWN_NORM", "bench_fused", "print_fused"]

NORM = "RMSNorm alone (q, k)"
OWN_NORM = "RMSNorm alone, the fused op's kernel without RoPE and cache (backend={})"


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def bench_fused(tokens: int = 1024, heads: tuple[int, int] = (32, 8), head_dim: int = 128,
                rotary_dim: int | None = None,
                dtype: str = "bfloat16", repeats: int = 20, threads: int = 2, page_size: int = 16,
                backends: tuple[str, ...] = ("torch", "compile", "cpu", "triton"), device: str = "cpu") -> dict:
    """Time the three ways (module docstring) on one input; rows carry ``median_ms``, ``q25_ms``, ``q75_ms`` and
    ``ratio_to_norm``; ``traffic`` holds the byte model's totals for the same shape."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int (20 or more for an IQR), got {repeats!r}.")
    dt = getattr(torch, dtype, None)
    if dt not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}.")
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    Hq, Hkv = heads
    D, T = head_dim, tokens
    spec = RopeSpec(base=1e6, rotary_dim=rotary_dim)
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, device=device).to(dt)
    wq = (1 + 0.1 * torch.randn(D, device=device)).to(dt)
    wk = (1 + 0.1 * torch.randn(D, device=device)).to(dt)
    pos = torch.arange(T, device=device) + 7
    n_blocks = -(-T // page_size) + 1
    perm = torch.randperm(n_blocks).to(device)
    slots = perm[pos // page_size] * page_size + pos % page_size
    kc = torch.zeros(n_blocks, page_size, Hkv, D, dtype=dt, device=device)
    vc = torch.zeros_like(kc)
    kf, vf = kc.view(-1, Hkv, D), vc.view(-1, Hkv, D)
    qs, ks = Hq * D, Hkv * D
    q3 = qkv[:, :qs].unflatten(1, (Hq, D))
    k3 = qkv[:, qs:qs + ks].unflatten(1, (Hkv, D))
    v3 = qkv[:, qs + ks:].unflatten(1, (Hkv, D))
    eps = 1e-6

    def unfused():
        qn, kn = _norm(q3, wq, eps), _norm(k3, wk, eps)
        qr = apply_rope(qn, pos, layout="t h d", spec=spec)
        kr = apply_rope(kn, pos, layout="t h d", spec=spec)
        kf[slots] = kr
        vf[slots] = v3
        return qr, kr

    kw = dict(num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=eps, spec=spec,
              positions=pos, kv_cache=(kc, vc), slot_mapping=slots)
    methods: dict[str, Callable[[], object]] = {
        NORM: lambda: (_norm(q3, wq, eps), _norm(k3, wk, eps)),
        "unfused: norm -> apply_rope -> cache write": unfused,
    }
    notes: dict[str, object] = {}
    for b in backends:
        if b == "triton" and torch.device(device).type != "cuda":
            notes["fused (backend=triton)"] = "not timed: the Triton kernel is timed on a GPU only"
            continue
        try:
            t0 = time.perf_counter()
            qk_norm_rope(qkv, backend=b, **kw)  # the first call builds: Inductor for "compile", the C library for "cpu"
            notes[f"first call seconds, backend={b}"] = round(time.perf_counter() - t0, 3)
        except Exception as e:  # no C++ toolchain, no GPU: say so rather than fail
            notes[f"fused (backend={b})"] = f"skipped: {type(e).__name__}: {str(e)[:200]}"
            continue
        if b in ("cpu", "triton"):  # the same kernel with rotary dim 0 and no cache: the fused op's own norm
            methods[OWN_NORM.format(b)] = (lambda b=b: qk_rms_norm(q3, k3, num_heads=Hq, num_kv_heads=Hkv,
                                                                   head_dim=D, q_weight=wq, k_weight=wk, eps=eps,
                                                                   backend=b))
        methods[f"fused qk_norm_rope (backend={b})"] = (lambda b=b: qk_norm_rope(qkv, backend=b, **kw))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times = time_methods({n: (lambda f=f: (f(), sync())) for n, f in methods.items()}, repeats)
    rows = []
    for name, ts in times.items():
        q1, med, q3_ = quartiles(ts)
        rows.append({"method": name, "median_ms": med * 1e3, "q25_ms": q1 * 1e3, "q75_ms": q3_ * 1e3})
    base = rows[0]["median_ms"]
    by_name = {r["method"]: r for r in rows}
    for r in rows:
        r["ratio_to_norm"] = r["median_ms"] / base
        b = r["method"].rsplit("backend=", 1)[-1].rstrip(")") if r["method"].startswith("fused") else None
        own = by_name.get(OWN_NORM.format(b)) if b else None
        if own is not None:  # quack's metric: the fused op over the same kernel doing the norm alone
            r["ratio_to_own_norm"] = r["median_ms"] / own["median_ms"]
    model = {t.name: t.total for t in qk_norm_rope_traffic(T, Hq, Hkv, D, rotary_dim, itemsize=qkv.element_size())}
    return {"benchmark": "fused", "shape": {"tokens": T, "heads": Hq, "kv_heads": Hkv, "head_dim": D,
                                            "rotary_dim": rotary_dim or D, "dtype": dtype, "page_size": page_size},
            "repeats": repeats, "threads": threads, "device": device, "rows": rows, "traffic_bytes": model,
            "notes": notes, "machine": machine_info()}


def print_fused(result: dict) -> None:
    """The table: time (median, IQR) and the ratio to the norm alone, then the byte model."""
    sh = result["shape"]
    print(f"QK-RMSNorm + RoPE + cache write: {sh['tokens']} tokens, {sh['heads']}/{sh['kv_heads']} heads x "
          f"{sh['head_dim']} (rotary {sh['rotary_dim']}), {sh['dtype']}, {result['device']}, "
          f"{result['threads']} threads, {result['repeats']} rounds")
    print(f"{'method':82s} {'median ms':>10s} {'IQR ms':>17s} {'x norm':>7s} {'x own norm':>10s}")
    for r in result["rows"]:
        own = f"{r['ratio_to_own_norm']:10.2f}" if "ratio_to_own_norm" in r else " " * 10
        print(f"{r['method']:82s} {r['median_ms']:10.3f} {r['q25_ms']:8.3f}-{r['q75_ms']:<8.3f} "
              f"{r['ratio_to_norm']:7.2f} {own}")
    print("byte model (ropelab.kernels.traffic.qk_norm_rope_traffic; a model):")
    norm = next(iter(result["traffic_bytes"].values()))
    for name, total in result["traffic_bytes"].items():
        print(f"  {name:46s} {total / 1e6:9.2f} MB  x{total / norm:5.2f}")
    for k, v in result["notes"].items():
        print(f"  note: {k}: {v}")
