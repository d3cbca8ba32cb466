r"""GPU rows of ``python -m ropelab.bench decode``: the Triton decode kernel against the PyTorch cache policies
and SDPA, and the reader of the committed JSON for notebook 05.

    python -m ropelab.kernels.decode_bench [--out-dir data/bench] [--lengths ...] [--batches ...]

One decoding step of one attention layer, Llama-3-8B heads (32 query, 8 key/value heads, d = 128),
bfloat16 cache, dynamic NTK past ``l0`` (factor 8), at each cached length L and batch b (configurations past
``token_budget`` = b L cached tokens are skipped and listed). Methods, on the same tensors:

- ``kernel post_rope`` and ``kernel rope_on_load``: :func:`ropelab.kernels.decode_attention.decode_attention`
  over a post-RoPE cache and over a pre-RoPE cache rotated on load (launcher included);
- ``sdpa post_rope``: ``torch.nn.functional.scaled_dot_product_attention`` of the rotated query over the
  post-RoPE cache (``enable_gqa=True``), the baseline a user has today;
- ``policy <name>``: one ``RotaryKVCache.step`` of each policy in ``ropelab.kvcache.POLICIES`` and
  the kernel policy it registers (append the token, attend; the cos/sin table recomputed every step as a model
  would). ``bucketed`` is timed in its
  steady state, and its boundary step (re-rotating the whole cache from the frame of L/2 to that of L, once
  per doubling) is timed separately and reported as ``boundary_ms``.

Every step is timed alone with CUDA events after an L2 flush (a 256 MiB write), ``repeats`` times after a
warm-up; rows give the median, p99 and maximum. ``key_bytes_per_step`` is the key traffic: b H_kv L d
bytes read for the kernels and SDPA, the cache's own counters for the policies. The JSON goes to
``<out-dir>/decode-gpu-<device>.json``. Without a GPU nothing is measured and the command says so.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from ..machine import gpu_driver
from ..paths import DATA_DIR

KERNEL_MODES = ("kernel post_rope", "kernel rope_on_load")
NO_GPU = "no GPU measurement yet"

__all__ = ["bench_decode_gpu", "print_gpu_decode", "goal_check", "load_gpu_decode", "gpu_decode_summary",
           "plot_gpu_decode", "run_gpu_decode"]


def _quantiles(ts: list[float]) -> dict:
    ms = sorted(t * 1e3 for t in ts)
    k = (len(ms) - 1) * 0.99
    lo, hi = math.floor(k), math.ceil(k)
    p99 = ms[lo] + (ms[hi] - ms[lo]) * (k - lo)
    return {"median_ms": statistics.median(ms), "p99_ms": p99, "max_ms": ms[-1], "n": len(ms)}


def _device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _gpu_info() -> dict:
    import platform

    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["driver"] = gpu_driver()
    return info


def bench_decode_gpu(lengths=(4096, 16384, 32768, 131072), batches=(1, 8, 32), heads=(32, 8), head_dim=128,
                     dtype=torch.bfloat16, repeats: int = 50, l0: int = 4096, factor: float = 8.0,
                     token_budget: int = 2**20, device: str = "cuda", warmup: int = 3,
                     partial_out: str | Path | None = None) -> dict:
    """Time one decoding step per method at each (batch, cached length); see the module docstring.

    ``device="cpu"`` is a dry run of the same code for the tests (wall-clock timer, the kernel in Triton's
    interpreter): its numbers are not GPU measurements and are labelled so. With ``partial_out`` the rows so
    far are written there after every configuration (``"complete": false``), so a run cut short by a time
    limit still leaves what it measured.
    """
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError("bench_decode_gpu needs a CUDA GPU; on CPU run `python -m ropelab.bench decode`.")
    torch.manual_seed(0)
    rope = {"rope_type": "dynamic", "factor": factor}
    flush = torch.empty(256 * 2**20 if device != "cpu" else 1024, dtype=torch.uint8, device=device)
    rows, skipped = [], []
    for b in batches:
        for length in lengths:
            if b * length > token_budget:
                skipped.append({"batch": b, "cached_tokens": length,
                                "why": f"{b * length} cached tokens > token_budget {token_budget}"})
                continue
            rows += _bench_one(b, length, heads, head_dim, dtype, rope, l0, repeats, flush, warmup)
            if device != "cpu":
                torch.cuda.empty_cache()
            if partial_out is not None:
                partial = _result(rows, skipped, heads, head_dim, dtype, rope, l0, repeats, device)
                partial["complete"] = False
                Path(partial_out).write_text(json.dumps(partial, indent=1) + "\n")
    result = _result(rows, skipped, heads, head_dim, dtype, rope, l0, repeats, device)
    result["complete"] = True
    return result


def _result(rows, skipped, heads, head_dim, dtype, rope, l0, repeats, device) -> dict:
    base = {(r["batch"], r["cached_tokens"]): r for r in rows if r["method"] == "kernel post_rope"}
    for r in rows:
        ref = base[(r["batch"], r["cached_tokens"])]
        r["median_vs_kernel_post_rope"] = r["median_ms"] / ref["median_ms"]
        r["p99_vs_kernel_post_rope"] = r["p99_ms"] / ref["p99_ms"]
    result = {
        "benchmark": "decode-gpu",
        "heads_q_kv": list(heads),
        "head_dim": head_dim,
        "dtype": str(dtype).replace("torch.", ""),
        "rope_scaling": rope,
        "l0": l0,
        "repeats": repeats,
        "timing": "CUDA events around one step, L2 flushed (256 MiB write) before each; launcher included",
        "machine": _gpu_info() if device != "cpu" else {"device": "cpu (dry run, not a GPU measurement)",
                                                          "torch": torch.__version__, "triton": None, "driver": None},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "skipped": skipped,
    }
    result["goal"] = goal_check(result)
    return result


def _timed(fn, repeats: int, flush: torch.Tensor, setup=None, warmup: int = 3) -> list[float]:
    """Seconds per call of ``fn``, each call alone between two CUDA events after an L2 flush."""
    out = []
    for rep in range(repeats + warmup):
        if setup is not None:
            setup()
        flush.zero_()
        if flush.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:  # the dry run on CPU
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        if rep >= warmup:
            out.append(seconds)
    return out


def _bench_one(b, length, heads, head_dim, dtype, rope, l0, repeats, flush, warmup) -> list[dict]:
    """Every method at one (batch, cached length): the step that brings the cache to ``length`` keys."""
    from ..core import cos_sin, rotate
    from ..kvcache import POLICIES, RopeSchedule, RotaryKVCache
    from ..spec import RopeSpec
    from .decode_attention import decode_attention

    dev = flush.device
    hq, hkv = heads
    n, cap = length - 1, length + 8
    k_raw = torch.randn(b, hkv, cap, head_dim, device=dev, dtype=dtype)
    v = torch.randn(b, hkv, cap, head_dim, device=dev, dtype=dtype)
    q = torch.randn(b, hq, 1, head_dim, device=dev, dtype=dtype)
    k1, v1 = torch.randn(b, hkv, 1, head_dim, device=dev, dtype=dtype), torch.randn(b, hkv, 1, head_dim, device=dev,
                                                                                    dtype=dtype)
    spec = RopeSpec(scaling=rope, max_position_embeddings=l0)
    inv, af = RopeSchedule(spec, head_dim).at(length)
    cos, sin = (t.to(dev) for t in cos_sin(torch.arange(cap), inv, af, dtype=torch.float32))
    k_post = rotate(k_raw, cos[None, None], sin[None, None])  # the post-RoPE cache of the same keys
    q_rot = rotate(q, cos[None, None, n:length], sin[None, None, n:length])
    lengths_t = torch.full((b,), length, dtype=torch.int32)
    key_bytes = b * hkv * length * head_dim * k_raw.element_size()
    kp, vv = k_post[:, :, :length], v[:, :, :length]
    results = {
        "kernel post_rope": _timed(lambda: decode_attention(q_rot[:, :, 0], k_post, v, lengths_t, mode="post_rope"),
                                   repeats, flush, warmup=warmup),
        "kernel rope_on_load": _timed(lambda: decode_attention(q_rot[:, :, 0], k_raw, v, lengths_t,
                                                               mode="rope_on_load", inv_freq=inv,
                                                               attention_factor=af), repeats, flush, warmup=warmup),
        "sdpa post_rope": _timed(lambda: _sdpa(q_rot, kp, vv), repeats, flush, warmup=warmup),
    }
    traffic, extra = {}, {}
    pos = torch.tensor([n])
    for policy, cls in POLICIES.items():  # the PyTorch policies and the kernel policy (registered by ropelab.kernels)
        sched = cls.schedule(spec, head_dim)  # bucketed where the policy says so
        held = {}

        def setup(sched=sched, policy=policy, rotated=cls.rotated, held=held):
            # steady state: n cached keys in the current frame; the step appends token L at index L - 1
            held["cache"] = RotaryKVCache(sched, policy, 1)
            held["cache"].fill(0, (k_post if rotated else k_raw)[:, :, :n], v[:, :, :n], frame_length=length,
                               spare=8)

        results[f"policy {policy}"] = _timed(lambda held=held: held["cache"].step(0, q, k1, v1, pos, length),
                                             repeats, flush, setup, warmup)
        traffic[f"policy {policy}"] = held["cache"].bytes_read + held["cache"].bytes_written
        if cls.bucket_growth is not None:
            def boundary(sched=sched, policy=policy, held=held, g=cls.bucket_growth):
                # the cached keys (rotated: a bucketed policy re-rotates them) are in the previous bucket's frame
                held["cache"] = RotaryKVCache(sched, policy, 1)
                held["cache"].fill(0, k_post[:, :, :n], v[:, :, :n], frame_length=max(l0, int(length / g)))

            ts = _timed(lambda held=held: held["cache"].rerotate(0, inv, af), max(1, repeats // 10), flush,
                        boundary, warmup)
            extra[f"policy {policy}"] = {"boundary_ms": statistics.median(ts) * 1e3,
                                         "boundary_every_steps": int((cls.bucket_growth - 1) * length)}
    rows = []
    for method, ts in results.items():
        row = {"batch": b, "cached_tokens": length, "method": method, **_quantiles(ts),
               "key_bytes_per_step": traffic.get(method, key_bytes)}
        row.update(extra.get(method, {}))
        rows.append(row)
    return rows


def _sdpa(q, k, v):
    """SDPA with grouped-query heads: ``enable_gqa`` (torch >= 2.5), else the kv heads repeated."""
    try:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:
        g = q.shape[1] // k.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))


def goal_check(result: dict, length: int = 32768, limit: float = 1.05) -> list[dict]:
    """Issue 13's goal at ``length`` cached tokens, per batch: kernel rope_on_load within ``limit`` x the
    kernel's post_rope step at median and at p99, and both kernel modes at least as fast as SDPA (median)."""
    out = []
    by = {(r["batch"], r["cached_tokens"], r["method"]): r for r in result["rows"]}
    for b in sorted({r["batch"] for r in result["rows"] if r["cached_tokens"] == length}):
        post, rol, sdpa = (by.get((b, length, m)) for m in (*KERNEL_MODES, "sdpa post_rope"))
        if not (post and rol and sdpa):
            continue
        med, p99 = rol["median_ms"] / post["median_ms"], rol["p99_ms"] / post["p99_ms"]
        out.append({"batch": b, "cached_tokens": length, "rope_on_load_over_post_rope_median": med,
                    "rope_on_load_over_post_rope_p99": p99,
                    "kernel_post_rope_over_sdpa_median": post["median_ms"] / sdpa["median_ms"],
                    "kernel_rope_on_load_over_sdpa_median": rol["median_ms"] / sdpa["median_ms"],
                    "met": med <= limit and p99 <= limit and max(post["median_ms"], rol["median_ms"])
                    <= sdpa["median_ms"]})
    return out


def print_gpu_decode(result: dict) -> None:
    m = result["machine"]
    print(f"one decoding step, one layer, heads {result['heads_q_kv']} (q, kv), d={result['head_dim']}, "
          f"{result['dtype']}, dynamic NTK past {result['l0']}, {m['device']} (torch {m['torch']}, "
          f"triton {m['triton']}, driver {m['driver']})")
    print(f"{'batch':>5s} {'cached':>7s} {'method':28s} {'median ms':>9s} {'p99 ms':>8s} {'max ms':>8s} "
          f"{'x kpost med':>11s} {'key MB/step':>11s}")
    for r in result["rows"]:
        extra = ""
        if "boundary_ms" in r:
            extra = f"  boundary step {r['boundary_ms']:.2f} ms every {r['boundary_every_steps']}"
        print(f"{r['batch']:5d} {r['cached_tokens']:7d} {r['method']:28s} {r['median_ms']:9.3f} {r['p99_ms']:8.3f} "
              f"{r['max_ms']:8.3f} {r['median_vs_kernel_post_rope']:11.2f} "
              f"{r['key_bytes_per_step'] / 1e6:11.1f}{extra}")
    for s in result["skipped"]:
        print(f"skipped batch {s['batch']} at {s['cached_tokens']}: {s['why']}")
    for g in result["goal"]:
        print(f"goal at {g['cached_tokens']} tokens, batch {g['batch']}: rope_on_load / post_rope = "
              f"{g['rope_on_load_over_post_rope_median']:.3f} (median), {g['rope_on_load_over_post_rope_p99']:.3f} "
              f"(p99); kernel / SDPA = {g['kernel_post_rope_over_sdpa_median']:.2f}, "
              f"{g['kernel_rope_on_load_over_sdpa_median']:.2f} -> {'met' if g['met'] else 'NOT met'}")


def run_gpu_decode(out_dir: str | Path | None = None, **kw) -> dict | None:
    """The GPU part of ``python -m ropelab.bench decode``: measure, print, write the JSON; on a machine
    without a GPU print that the kernel rows need one and return None."""
    if not torch.cuda.is_available():
        print("kernel rows (Triton decode kernel, SDPA baseline, PyTorch policies on GPU) need a CUDA GPU: "
              "none here, so none were measured.")
        return None
    out = Path(out_dir or DATA_DIR / "bench") / f"decode-gpu-{_device_slug(torch.cuda.get_device_name())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = bench_decode_gpu(partial_out=out, **kw)
    print_gpu_decode(result)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


# --------------------------------------------------------------------------------------------------
# For notebook 05: what was measured, or that nothing was
# --------------------------------------------------------------------------------------------------


def load_gpu_decode(path: str | Path | None = None) -> dict | None:
    """The committed GPU decode JSON (``data/bench/decode-gpu-*.json``, the first if several; or ``path``),
    or None when there is none."""
    if path is None:
        found = sorted(glob.glob(str(DATA_DIR / "bench" / "decode-gpu-*.json")))
        if not found:
            return None
        path = found[0]
    if not Path(path).exists():
        return None
    return json.loads(Path(path).read_text())


def gpu_decode_summary(result: dict | None = None, length: int = 32768) -> str:
    """Plain-text summary of the kernel's measured numbers, or a plain statement that none exist."""
    result = load_gpu_decode() if result is None else result
    if result is None:
        return (f"{NO_GPU}: the Triton decode kernel has been tested on CPU (TRITON_INTERPRET=1) but never "
                "timed on a GPU; run scripts/gpu_check_decode.sh on one and commit data/bench/decode-gpu-*.json.")
    lines = [f"measured on {result['machine']['device']} ({result['date_utc']}), {result['dtype']} cache, "
             f"median / p99 / max ms per step:"]
    for r in result["rows"]:
        if r["cached_tokens"] == length:
            lines.append(f"  batch {r['batch']:2d} {r['method']:28s} {r['median_ms']:8.3f} {r['p99_ms']:8.3f} "
                         f"{r['max_ms']:8.3f}")
    for g in result["goal"]:
        lines.append(f"  goal (batch {g['batch']}): rope_on_load/post_rope "
                     f"{g['rope_on_load_over_post_rope_median']:.3f} median, "
                     f"{g['rope_on_load_over_post_rope_p99']:.3f} p99 -> {'met' if g['met'] else 'not met'}")
    return "\n".join(lines)


def plot_gpu_decode(ax, result: dict | None = None, batch: int = 1):
    """Median step time (p99 as the bar's top) against cached tokens, per method, at one batch; with no
    measurement, an empty axis that says so (nothing is drawn that was not measured)."""
    result = load_gpu_decode() if result is None else result
    if result is None:
        ax.text(0.5, 0.5, f"{NO_GPU}\n(the kernel ran only in the CPU interpreter)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    methods = list(dict.fromkeys(r["method"] for r in result["rows"]))
    for method in methods:
        rs = sorted((r for r in result["rows"] if r["method"] == method and r["batch"] == batch),
                    key=lambda r: r["cached_tokens"])
        if not rs:
            continue
        x = [r["cached_tokens"] for r in rs]
        med = [r["median_ms"] for r in rs]
        up = [r["p99_ms"] - r["median_ms"] for r in rs]
        ax.errorbar(x, med, yerr=[[0] * len(rs), up], marker="o", capsize=3, label=method,
                    linewidth=2.5 if method.startswith("kernel") else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("cached tokens")
    ax.set_ylabel("ms per decoding step (median; bar to p99)")
    ax.set_title(f"one decode step, batch {batch}, {result['machine']['device']}")
    ax.legend(fontsize=7)
    return ax


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropelab.kernels.decode_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=str(DATA_DIR / "bench"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768, 131072])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--token-budget", type=int, default=2**20)
    args = parser.parse_args(argv)
    run_gpu_decode(args.out_dir, lengths=tuple(args.lengths), batches=tuple(args.batches), repeats=args.repeats,
                   token_budget=args.token_budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
