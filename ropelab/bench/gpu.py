"""``python -m ropelab.bench gpu``: the fused Triton RoPE against the best peers, forward and forward + backward.

Implementations, in one run on the same inputs (bf16, Llama-3-8B attention: 32 q / 8 kv heads):

- ``ropelab triton``: :func:`ropelab.kernels.rope`, q and k in one launch, cos/sin tables [P, d/2] fp32;
- ``HF eager``: Hugging Face Llama's ``apply_rotary_pos_emb`` (tables [b, s, d] as LlamaRotaryEmbedding
  makes them), and ``torch.compile`` of it (``dynamic=True``: one compile for every shape);
- ``Liger``: Liger-Kernel's ``LigerRopeFunction`` (b h s d views, in place on its own copies), when importable;
- ``flash-attn``: flash-attn's Triton ``apply_rotary`` (``flash_attn/ops/triton/rotary.py``, loaded by
  path from its sdist: ``--flash-rotary PATH`` or ``$FLASH_ROTARY``; never vendored), q and k in two
  calls, backward as its own ``conjugate=True`` call, when found;
- ``copy``: a device-to-device copy of q and k into preallocated buffers (the same bytes): the ceiling.

Shapes: batch x seq from 1 x 512 to 8 x 4096 (working sets up to 671 MB, several times a data-centre GPU's L2
at the larger shapes: 50 MB on an H100 SXM, the H200 not confirmed from an NVIDIA source), a
packed varlen batch of 131072 tokens, decode (one token for each of 256 sequences at scattered
positions), and head_dim 64 and 256.

Method: ``triton.testing.do_bench`` (median; it zeroes a 256 MB buffer before every run, flushing L2).
Each call is captured once in a CUDA graph and ``do_bench`` times the graph's replay, so the small
shapes are not timed as Python and launch overhead; where capture fails the plain call is timed and the
row says so. GB/s counts the bytes every implementation must move: q and k read and written once (twice
for forward + backward), plus the cos/sin rows; ``pct_of_copy`` divides by the copy's GB/s on the same
shape in the same run.

Without a GPU it says so, runs the same table for the CPU implementations (smaller shapes, forward
only, ``time.perf_counter`` medians), and returns 0.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..core import cos_sin
from ..machine import gpu_driver
from ..scaling import frequencies

HEADS = (32, 8)
GPU_SHAPES = [  # (name, batch, seq, head_dim) for the padded layout
    ("llama3-8b", 1, 512, 128), ("llama3-8b", 1, 2048, 128), ("llama3-8b", 2, 4096, 128),
    ("llama3-8b", 4, 4096, 128), ("llama3-8b", 8, 4096, 128),
    ("d64", 4, 4096, 64), ("d256", 4, 4096, 256),
]
VARLEN_TOKENS = 131072
DECODE_BATCH = 256
CPU_SHAPES = [("llama3-8b", 1, 256, 128), ("llama3-8b", 1, 1024, 128), ("d64", 1, 1024, 64)]


# --------------------------------------------------------------------------------------------------
# Inputs and implementations
# --------------------------------------------------------------------------------------------------


def load_flash_rotary(path: str | None):
    """flash-attn's ``apply_rotary`` from its Triton rotary file, imported by path (no flash_attn package)."""
    path = path or os.environ.get("FLASH_ROTARY")
    if not path or not Path(path).is_file():
        return None, "flash-attn rotary.py not given (--flash-rotary or $FLASH_ROTARY; scripts/fetch_wheels.sh)"
    spec = importlib.util.spec_from_file_location("flash_attn_triton_rotary", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # a triton API it needs may be missing
        return None, f"flash-attn rotary.py failed to import: {type(e).__name__}: {e}"
    return mod.apply_rotary, None


def make_case(kind: str, b: int, s: int, d: int, device: str, dtype: torch.dtype, heads=HEADS,
              varlen_range: tuple[int, int] | None = None) -> dict:
    """q, k in b s h d (or [1, t, h, d] for varlen: s tokens packed), per-token positions, each peer's tables."""
    g = torch.Generator(device="cpu").manual_seed(0)
    hq, hk = heads
    if kind == "varlen":  # sequences of s/256 .. s/16 tokens (512 .. 8192 for 128k), the last one topping up
        low, high = varlen_range or (max(1, s // 256), max(2, s // 16))
        lengths = torch.randint(low, high, (4096,), generator=g)
        lengths = lengths[torch.cumsum(lengths, 0) <= s]
        lengths = torch.cat([lengths, torch.tensor([s - int(lengths.sum())])])
        lengths = lengths[lengths > 0]
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)]).to(torch.int32)
        pos = torch.cat([torch.arange(int(n)) for n in lengths])[None]
        b = 1
        offset = None
    elif kind == "decode":
        cu = None
        offset = torch.randint(0, 8000, (b,), generator=g)
        pos = offset[:, None]  # one token per sequence, at its own position
    else:
        cu, offset = None, None
        pos = torch.arange(s)[None].expand(b, s)
    q = torch.randn(b, s, hq, d, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(b, s, hk, d, generator=g).to(device=device, dtype=dtype)
    n_pos = int(pos.max()) + 1
    inv, _ = frequencies(d)
    c, si = cos_sin(torch.arange(n_pos), inv)  # float64 angles, rounded once to float32
    pos = pos.to(device)
    hf_cos = torch.cat([c, c], -1).to(device)[pos].to(dtype)  # [b, s, d], HF's form
    hf_sin = torch.cat([si, si], -1).to(device)[pos].to(dtype)
    return {"kind": kind, "q": q, "k": k, "cos": c.to(device), "sin": si.to(device), "hf_cos": hf_cos,
            "hf_sin": hf_sin, "cu": cu.to(device) if cu is not None else None,
            "max_seqlen": int((cu[1:] - cu[:-1]).max()) if cu is not None else None,
            "offset": offset.to(device) if offset is not None else 0, "pos": pos,
            "table_bytes": 2 * n_pos * (d // 2) * 4 if kind != "decode" else 2 * b * (d // 2) * 4}


NATIVE_BHSD = {"Liger"}


def implementations(case: dict, device: str, flash_apply, compiled_hf) -> dict[str, Callable]:
    """name -> fn(q, k) returning (q', k'), for the case's layout. Each is differentiable where its peer is."""
    impls: dict[str, Callable] = {}
    kind = case["kind"]
    qkv_layout = "t h d" if kind == "varlen" else "b s h d"
    if device == "cuda":
        from ..kernels.fused_rope import rope

        def ropelab_triton(q, k):
            if kind == "varlen":
                return rope(q[0], k[0], layout="t h d", cos=case["cos"], sin=case["sin"], cu_seqlens=case["cu"],
                            max_seqlen=case["max_seqlen"])
            return rope(q, k, layout=qkv_layout, cos=case["cos"], sin=case["sin"], offset=case["offset"])

        impls["ropelab triton"] = ropelab_triton
    else:
        from ..rope import apply_rope

        def ropelab_on(backend):
            def fn(q, k):
                if kind == "decode":
                    kw = dict(offset=case["offset"])
                elif kind == "varlen":
                    kw = dict(positions=case["pos"][0])
                else:
                    kw = {}
                return tuple(apply_rope(t, layout="b s h d", backend=backend, **kw) for t in (q, k))
            return fn

        impls["ropelab apply_rope (torch)"] = ropelab_on("torch")
        if compiled_hf is not None:  # compiling is wanted in this run
            impls["ropelab apply_rope (compile)"] = ropelab_on("compile")
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        apply_rotary_pos_emb = None
    if apply_rotary_pos_emb is not None:
        c, s = case["hf_cos"], case["hf_sin"]
        impls["HF eager"] = lambda q, k: apply_rotary_pos_emb(q, k, c, s, unsqueeze_dim=2)
        if compiled_hf is not None:
            impls["torch.compile(HF)"] = lambda q, k: compiled_hf(q, k, c, s, unsqueeze_dim=2)
    if device == "cuda":
        try:
            from liger_kernel.ops.rope import LigerRopeFunction
        except ImportError:
            LigerRopeFunction = None
        if LigerRopeFunction is not None:
            c, s = case["hf_cos"], case["hf_sin"]
            # Liger takes b h s d views of b s h d storage (as HF's attention makes them) and rotates that
            # storage in place: the runner hands it views of its own copies (NATIVE_BHSD), outputs transposed back.
            impls["Liger"] = lambda q, k: LigerRopeFunction.apply(q, k, c, s)
        if flash_apply is not None:
            cos, sin = case["cos"], case["sin"]

            class _Flash(torch.autograd.Function):  # flash-attn's own forward/backward pairing
                @staticmethod
                def forward(ctx, x):
                    if kind == "varlen":
                        return flash_apply(x[0], cos, sin, cu_seqlens=case["cu"],
                                           max_seqlen=case["max_seqlen"])[None]
                    return flash_apply(x, cos, sin, seqlen_offsets=case["offset"])

                @staticmethod
                def backward(ctx, g):
                    if kind == "varlen":
                        return flash_apply(g[0], cos, sin, cu_seqlens=case["cu"], max_seqlen=case["max_seqlen"],
                                           conjugate=True)[None]
                    return flash_apply(g, cos, sin, seqlen_offsets=case["offset"], conjugate=True)

            impls["flash-attn triton"] = lambda q, k: (_Flash.apply(q), _Flash.apply(k))
    return impls


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def _fwd_bwd(fn, q, k, gq, gk):
    def run():
        oq, ok = fn(q, k)
        return torch.autograd.grad((oq, ok), (q, k), tuple(g if g.shape == o.shape else g.reshape(o.shape)
                                                           for g, o in ((gq, oq), (gk, ok))))
    return run


def time_gpu(run: Callable[[], object]) -> tuple[float, str]:
    """Median ms of ``run`` by triton's do_bench (L2 flushed before each run), replayed from a CUDA graph."""
    import triton.testing

    run()
    torch.cuda.synchronize()
    method = "do_bench, CUDA graph replay, L2 flushed"
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        target = graph.replay
    except Exception as e:  # e.g. a host sync inside: time the plain call
        method = f"do_bench, plain launch (graph capture failed: {type(e).__name__}), L2 flushed"
        target = run
    ms = triton.testing.do_bench(target, warmup=25, rep=100, return_mode="median")
    return float(ms), method


def time_cpu(run: Callable[[], object], repeats: int = 7) -> tuple[float, str]:
    run()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, f"perf_counter median of {repeats}"


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def versions(flash_path: str | None) -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("triton", "transformers", "liger-kernel"):
        try:
            v[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            v[dist] = None
    v["flash-attn rotary.py"] = flash_path
    if torch.cuda.is_available():
        v["cuda"] = torch.version.cuda
        v["driver"] = gpu_driver()
    return v


def run(device: str, quick: bool = False, flash_rotary: str | None = None, budget_s: float = 150.0,
        shapes: list | None = None, compile: bool = True) -> dict:
    """Time every implementation on every shape; ``shapes`` overrides the default list (tests use tiny ones)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    flash_apply, flash_note = load_flash_rotary(flash_rotary) if device == "cuda" else (None, "GPU only")
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        compiled_hf = torch.compile(apply_rotary_pos_emb, dynamic=True) if compile else None
    except ImportError:
        compiled_hf = None
    if device == "cuda":
        shapes_default = [("padded",) + s for s in GPU_SHAPES] + [
            ("varlen", "varlen-128k", 1, VARLEN_TOKENS, 128), ("decode", "decode", DECODE_BATCH, 1, 128)]
        if quick:
            shapes_default = [shapes_default[i] for i in (0, 2, -2, -1)]
        modes = ("fwd", "fwd+bwd")
        timer = time_gpu
    else:
        shapes_default = [("padded",) + s for s in CPU_SHAPES] + [("decode", "decode", 16, 1, 128)]
        if quick:
            shapes_default = shapes_default[:1]
        modes = ("fwd",)
        timer = time_cpu
    shapes = shapes if shapes is not None else shapes_default
    t_start = time.perf_counter()
    rows, notes = [], {"flash-attn": flash_note} if flash_note else {}
    for kind, name, b, s, d in shapes:
        if time.perf_counter() - t_start > budget_s:
            notes.setdefault("skipped (time budget)", []).append(f"{name} {b}x{s} d={d}")
            continue
        case = make_case(kind, b, s, d, device, dtype)
        q, k = case["q"], case["k"]
        must = 2 * (q.numel() + k.numel()) * q.element_size() + case["table_bytes"]
        impls = implementations(case, device, flash_apply, compiled_hf)
        oq_ref = None
        ref_name = "ropelab triton" if device == "cuda" else "ropelab apply_rope (torch)"
        for mode in modes:
            qq = q.detach().clone().requires_grad_(mode != "fwd")
            kk = k.detach().clone().requires_grad_(mode != "fwd")
            gq, gk = torch.randn_like(q), torch.randn_like(k)
            bufs = (torch.empty_like(q), torch.empty_like(k), 1 if mode == "fwd" else 2)
            runs = {"copy (ceiling)": lambda b=bufs, q=q, k=k: [(b[0].copy_(q), b[1].copy_(k)) for _ in range(b[2])]}
            for iname, fn in impls.items():
                if iname in NATIVE_BHSD:  # b h s d views of its own copies (it rotates them in place)
                    qi = qq.detach().clone().requires_grad_(mode != "fwd").transpose(1, 2)
                    ki = kk.detach().clone().requires_grad_(mode != "fwd").transpose(1, 2)
                    gqi, gki = gq.transpose(1, 2), gk.transpose(1, 2)
                    fwd = (lambda fn=fn, qi=qi, ki=ki: tuple(t.transpose(1, 2) for t in fn(qi, ki)))
                else:
                    qi, ki, gqi, gki = qq, kk, gq, gk
                    fwd = (lambda fn=fn, qi=qi, ki=ki: fn(qi, ki))
                runs[iname] = fwd if mode == "fwd" else _fwd_bwd(fn, qi, ki, gqi, gki)
            results = {}
            for iname, r in runs.items():
                try:
                    with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                        if mode == "fwd" and iname != "copy (ceiling)":
                            out = r()
                            oq = out[0].reshape(q.shape) if out[0].shape != q.shape else out[0]
                            if iname == ref_name:
                                oq_ref = oq.float()
                            err = float((oq.float() - oq_ref).abs().max()) if oq_ref is not None else None
                        else:
                            err = None
                        ms, method = timer(r)
                    results[iname] = (ms, method, err)
                except Exception as e:  # a peer that cannot take this case: say so in the JSON
                    notes[f"{iname} {name} {b}x{s} d={d} {mode}"] = f"{type(e).__name__}: {str(e)[:300]}"
            copy_ms = results.get("copy (ceiling)", (None,))[0]
            nbytes = must * (1 if mode == "fwd" else 2)
            for iname, (ms, method, err) in results.items():
                gbps = nbytes / (ms * 1e-3) / 1e9
                rows.append({"shape": name, "kind": kind, "batch": b, "seq": s, "head_dim": d, "heads_q_kv": HEADS,
                             "dtype": str(dtype).replace("torch.", ""), "mode": mode, "implementation": iname,
                             "median_ms": ms, "bytes": nbytes, "gb_per_s": gbps,
                             "pct_of_copy": 100 * copy_ms / ms if copy_ms else None,
                             "max_abs_diff_vs_ropelab": err, "timing": method})
        del case, impls
        if device == "cuda":
            torch.cuda.empty_cache()
    dev_name = torch.cuda.get_device_name() if device == "cuda" else _cpu_name()
    return {"benchmark": "gpu", "device": dev_name, "device_kind": device, "versions": versions(flash_rotary),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows, "notes": notes,
            "seconds": time.perf_counter() - t_start}


def _cpu_name() -> str:
    from ..machine import machine_info

    return machine_info()["cpu"]


def print_rows(result: dict) -> None:
    print(f"RoPE on q and k ({HEADS[0]} q / {HEADS[1]} kv heads), {result['device']}")
    print(f"{'shape':12s} {'b x s':>10s} {'d':>4s} {'mode':8s} {'implementation':30s} {'ms':>9s} {'GB/s':>8s} "
          f"{'% copy':>7s}")
    for r in result["rows"]:
        pct = f"{r['pct_of_copy']:7.1f}" if r["pct_of_copy"] is not None else "      -"
        print(f"{r['shape']:12s} {r['batch']:>4d} x {r['seq']:<5d} {r['head_dim']:4d} {r['mode']:8s} "
              f"{r['implementation']:30s} {r['median_ms']:9.4f} {r['gb_per_s']:8.1f} {pct}")
    for k, v in result["notes"].items():
        print(f"note {k}: {v}")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def main(out_dir: str = "data/bench", quick: bool = False, flash_rotary: str | None = None) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("no GPU (torch.cuda.is_available() is False): no GPU measurement is made. "
              "Running the same table for the CPU implementations instead.")
        result = run("cpu", quick=quick)
        print_rows(result)
        path = out / "gpu-bench-cpu-fallback.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path} (CPU implementations only)")
        return 0
    result = run("cuda", quick=quick, flash_rotary=flash_rotary)
    print_rows(result)
    path = out / f"gpu-{slug(result['device'])}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------------------------------
# Reading results back (notebook 06)
# --------------------------------------------------------------------------------------------------


def load_gpu_results(data_dir: str | os.PathLike) -> list[dict]:
    """Every committed ``gpu-<device>.json`` measured on a GPU (the CPU fallback's file is not one)."""
    out = []
    for path in sorted(Path(data_dir).glob("gpu-*.json")):
        result = json.loads(path.read_text())
        if result.get("device_kind") == "cuda":
            out.append(result)
    return out


def bandwidth_series(result: dict, mode: str, kind: str = "padded", head_dim: int = 128) -> dict[str, list]:
    """implementation -> [(bytes, GB/s, % of copy)] sorted by bytes, for one mode and shape family."""
    series: dict[str, list] = {}
    for r in result["rows"]:
        if r["mode"] == mode and r["kind"] == kind and r["head_dim"] == head_dim:
            series.setdefault(r["implementation"], []).append((r["bytes"], r["gb_per_s"], r["pct_of_copy"]))
    return {k: sorted(v) for k, v in series.items()}
