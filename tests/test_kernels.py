"""ropelab.kernels: the fused Triton RoPE under Triton's CPU interpreter (TRITON_INTERPRET=1, set
before triton is imported), and backend="compile".

Every result is compared with a float64 oracle (ropelab's torch path on float64 input, itself tested
against the complex and matrix oracles in test_core.py) within ``rope_error_bound``: cos/sin rounded
once to float32, products and sums in float32, output rounded once. Grids are tiny: the interpreter
runs each program instance in Python.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import UNIT_ROUNDOFF, rope_error_bound

import ropelab
from ropelab.kernels import fused_rope, rope

triton = pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not ropelab.kernels.available("cpu"), reason="Triton interpreter not active")


def oracle(x, layout, style="half", rotary_dim=None, **kw):
    """float64 reference: the torch path on float64 input (float64 tables, float64 math)."""
    return ropelab.apply_rope(x.double(), layout=layout, style=style, rotary_dim=rotary_dim, **kw)


def assert_close_bound(y, x, ref, r, style, dtype, truncating_bf16=True):
    bound = rope_error_bound(x.double(), ref, r, style, dtype)
    if dtype == torch.bfloat16 and truncating_bf16 and y.device.type == "cpu":
        # Triton's interpreter casts float32 -> bfloat16 by truncation (triton/runtime/interpreter.py,
        # _convert_float without a rounding mode), the GPU rounds to nearest: one more unit roundoff.
        bound = bound + UNIT_ROUNDOFF[torch.bfloat16] * ref.abs()
    err = (y.double() - ref).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


def tables(d, r=None, n=64, dtype=torch.float32, **kw):
    inv, af = ropelab.frequencies(d, rotary_dim=r, **kw)
    c, s = ropelab.cos_sin(torch.arange(n), inv, af, dtype=dtype)
    return c, s, inv, af


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("d,r", [(64, 64), (80, 80), (96, 64), (128, 128), (256, 200)])
def test_styles_head_dims_partial_gqa(style, d, r, gen):
    """q (3 heads) and k (1 head) in one launch; dims past r copied in the same pass."""
    q = torch.randn(1, 5, 3, d, generator=gen)
    k = torch.randn(1, 5, 1, d, generator=gen)
    c, s, _, _ = tables(d, r)
    oq, ok = rope(q, k, layout="b s h d", style=style, cos=c, sin=s)
    for x, y in ((q, oq), (k, ok)):
        ref = oracle(x, "b s h d", style, r)
        assert_close_bound(y, x, ref, r, style, torch.float32)
        # exact on every CPU: the dims past r are copied
        assert torch.equal(y[..., r:], x[..., r:])


def test_one_launch_for_q_and_k(monkeypatch, gen):
    calls = []
    real = fused_rope._launch
    monkeypatch.setattr(fused_rope, "_launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k = torch.randn(1, 3, 4, 16, generator=gen), torch.randn(1, 3, 2, 16, generator=gen)
    c, s, _, _ = tables(16)
    rope(q, k, layout="b s h d", cos=c, sin=s)
    assert len(calls) == 1


@pytest.mark.parametrize("layout,shape", [("b h s d", (2, 3, 5, 32)), ("s h d", (6, 2, 32)), ("b s d", (2, 4, 32))])
def test_layouts(layout, shape, gen):
    x = torch.randn(*shape, generator=gen)
    c, s, _, _ = tables(32)
    ref = oracle(x, layout, offset=2)
    assert_close_bound(rope(x, layout=layout, cos=c, sin=s, offset=2), x, ref, 32, "half", torch.float32)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_varlen_cu_seqlens_and_offsets(style, gen):
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    q, k = torch.randn(9, 2, 24, generator=gen), torch.randn(9, 1, 24, generator=gen)
    c, s, _, _ = tables(24, 16)
    off = torch.tensor([0, 7, 2])
    oq, ok = rope(q, k, layout="t h d", style=style, cos=c, sin=s, cu_seqlens=cu, offset=off)
    pos = ropelab.varlen_positions(cu.long()) + torch.repeat_interleave(off, cu.diff().long())
    for x, y in ((q, oq), (k, ok)):
        ref = oracle(x, "t h d", style, 16, positions=pos)
        assert_close_bound(y, x, ref, 16, style, torch.float32)
    # max_seqlen given: no device read of cu_seqlens, same result
    oq2 = rope(q, layout="t h d", style=style, cos=c, sin=s, cu_seqlens=cu, offset=off, max_seqlen=5)
    # exact on every CPU: the same launch (max_seqlen equals the computed one) on the same input
    assert torch.equal(oq2, oq)
    # the same through apply_rope's API
    y = ropelab.apply_rope(q, layout="t h d", style=style, rotary_dim=16, cu_seqlens=cu, backend="triton")
    assert_close_bound(y, q, oracle(q, "t h d", style, 16, cu_seqlens=cu), 16, style, torch.float32)


def test_positions_int_per_sequence_and_ids(gen):
    x = torch.randn(2, 4, 2, 16, generator=gen)
    c, s, inv, _ = tables(16)
    off = torch.tensor([3, 11])
    ref = oracle(x, "b s h d", offset=off)
    assert_close_bound(rope(x, layout="b s h d", cos=c, sin=s, offset=off), x, ref, 16, "half", torch.float32)
    ids = torch.tensor([[5, 1, 9, 9], [0, 30, 2, 7]])
    ref = oracle(x, "b s h d", positions=ids)
    assert_close_bound(rope(x, layout="b s h d", cos=c, sin=s, positions=ids), x, ref, 16, "half", torch.float32)
    ids1 = torch.tensor([2, 3, 4, 40])
    ref = oracle(x, "b s h d", positions=ids1, offset=off)
    y = rope(x, layout="b s h d", inv_freq=inv, positions=ids1, offset=off)
    assert_close_bound(y, x, ref, 16, "half", torch.float32)


def test_strided_view_of_packed_qkv_without_copy(gen):
    qkv = torch.randn(2, 5, 3, 4, 32, generator=gen)  # [b, s, 3, h, d]
    q, k = qkv[:, :, 0], qkv[:, :, 1, :2]  # k: 2 of the 4 heads, another stride pattern
    assert not q.is_contiguous() and q.data_ptr() == qkv.data_ptr()
    c, s, _, _ = tables(32)
    oq, ok = rope(q, k, layout="b s h d", style="interleaved", cos=c, sin=s)
    assert_close_bound(oq, q, oracle(q, "b s h d", "interleaved"), 32, "interleaved", torch.float32)
    assert_close_bound(ok, k, oracle(k, "b s h d", "interleaved"), 32, "interleaved", torch.float32)
    # in place: only q's and k's slots of qkv change
    before = qkv.clone()
    with torch.no_grad():
        rope(q, k, layout="b s h d", style="interleaved", cos=c, sin=s, inplace=True)
    # exact on every CPU: the same kernel on the same values, written in place or out of place; the rest untouched
    assert torch.equal(qkv[:, :, 0], oq) and torch.equal(qkv[:, :, 1, :2], ok)
    assert torch.equal(qkv[:, :, 2], before[:, :, 2]) and torch.equal(qkv[:, :, 1, 2:], before[:, :, 1, 2:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_fp32_math(dtype, gen):
    x = torch.randn(1, 6, 2, 48, generator=gen).to(dtype)
    c, s, _, _ = tables(48, 32)
    y = rope(x, layout="b s h d", cos=c, sin=s)
    assert y.dtype == dtype
    assert_close_bound(y, x, oracle(x, "b s h d", rotary_dim=32), 32, "half", dtype)
    # exact on every CPU: the dims past r are copied
    assert torch.equal(y[..., 32:], x[..., 32:])
    # in-kernel cos/sin from inv_freq: the same float64 angles, rounded once
    assert_close_bound(ropelab.apply_rope(x, layout="b s h d", rotary_dim=32, backend="triton"),
                       x, oracle(x, "b s h d", rotary_dim=32), 32, "half", dtype)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "dynamic", "factor": 2.0},
])
def test_inv_freq_in_kernel_any_scaling(scaling, gen):
    x = torch.randn(1, 2, 40, 32, generator=gen)
    kw = dict(layout="b h s d", rope_scaling=scaling, max_position_embeddings=16, offset=100)
    y = ropelab.apply_rope(x, backend="triton", **kw)
    assert_close_bound(y, x, oracle(x, **kw), 32, "half", torch.float32)
    # float32 angles (Hugging Face's numerics) follow the torch path with float32 angles
    y32 = ropelab.apply_rope(x, backend="triton", angle_dtype=torch.float32, **kw)
    t32 = ropelab.apply_rope(x, angle_dtype=torch.float32, **kw)
    assert (y32 - t32).abs().max() < 1e-5


def test_inplace_is_autograd_safe(gen):
    c, s, _, _ = tables(16, n=8)
    w = torch.randn(16, 16, dtype=torch.float64, generator=gen)
    z = torch.randn(1, 4, 2, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    c64, s64 = ropelab.cos_sin(torch.arange(8), ropelab.frequencies(16)[0], dtype=torch.float64)
    # z @ w saves z and w, not its output: rotating the output in place is fine, and the gradient is exact
    y_out = rope(z @ w, layout="b s h d", cos=c64, sin=s64)
    y_in = rope(z @ w, layout="b s h d", cos=c64, sin=s64, inplace=True)
    # exact on every CPU: the same kernel on the same values (z @ w computed twice the same way in one process)
    assert torch.equal(y_in, y_out)
    g_out, = torch.autograd.grad(y_out.square().sum(), z)
    g_in, = torch.autograd.grad(y_in.square().sum(), z)
    assert torch.allclose(g_in, g_out, rtol=0, atol=1e-12)
    # exp saves its output: overwriting it in place must raise, never corrupt the gradient silently
    e = z.exp()
    rope(e, layout="b s h d", cos=c64, sin=s64, inplace=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        e.sum().backward()
    # a leaf that requires grad cannot be rotated in place
    with pytest.raises(RuntimeError, match="leaf"):
        rope(z, layout="b s h d", cos=c64, sin=s64, inplace=True)


def test_gradcheck_float64(gen):
    """Backward is the inverse rotation: gradcheck in float64 (partial rotary: the copied dims too)."""
    q = torch.randn(1, 2, 2, 10, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 1, 10, dtype=torch.float64, generator=gen, requires_grad=True)
    inv, _ = ropelab.frequencies(10, rotary_dim=6)
    c, s = ropelab.cos_sin(torch.arange(8), inv, dtype=torch.float64)
    for style in ("half", "interleaved"):
        f = lambda a, b, style=style: rope(a, b, layout="b s h d", style=style, cos=c, sin=s, offset=2)
        assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-9, fast_mode=True)
    # grad through k alone, and through apply_rope's triton path (in-kernel float64 cos/sin)
    f = lambda b: ropelab.apply_rope(b, layout="b s h d", rotary_dim=6, backend="triton")
    assert torch.autograd.gradcheck(f, (k,), eps=1e-6, atol=1e-9, fast_mode=True)


def test_int64_offsets_with_strides_past_2_31():
    """The address arithmetic the kernel uses (rope_triton.row_offsets), with strides of 2**30 and
    2**31 + 1: int32 products would wrap. (A real tensor past 2**31 elements, 4 GiB in fp16, is run by
    tests/test_kernels_gpu.py on a GPU; this CPU interpreter test needs no such allocation.)"""
    from ropelab.kernels import rope_triton

    out = torch.empty(8, dtype=torch.int64)
    for b, s0, sb, ss in ((3, 5, 2**30, 2**29 + 7), (2, 2**20, 2**31 + 1, 4096)):
        rope_triton._offsets_probe_kernel[(1,)](out, b, s0, sb, ss, BLOCK=8)
        want = torch.tensor([b * sb + (s0 + i) * ss for i in range(8)], dtype=torch.int64)
        # exact on every CPU: int64 address arithmetic
        assert want.max() > 2**31 and torch.equal(out, want)


def test_matches_torch_backend_every_layout_option(gen):
    """apply_rope(backend="triton") equals the torch backend's float64-table numerics within the bound,
    with per-batch offsets and 2-D position ids (positions resolved by the same code)."""
    x = torch.randn(2, 3, 2, 64, generator=gen)
    for kw in (dict(offset=torch.tensor([1, 9])), dict(positions=torch.tensor([[0, 5, 2], [7, 7, 1]])),
               dict(style="interleaved", rotary_dim=32, base=500.0)):
        ref = oracle(x, "b s h d", **kw)
        y = ropelab.apply_rope(x, layout="b s h d", backend="triton", **kw)
        assert_close_bound(y, x, ref, kw.get("rotary_dim", 64), kw.get("style", "half"), torch.float32)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_per_sequence_offsets_with_cu_seqlens_every_backend(style, gen):
    """apply_rope(t h d, cu_seqlens=cu, offset=[n_seq]): sequence i at offset[i], offset[i] + 1, ... (flash-attn's
    seqlen_offsets), on every backend, against a float64 oracle built from the lengths alone."""
    lengths, offsets = [3, 0, 5, 1], [4, 9, 0, 100]
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    x = torch.randn(9, 2, 24, generator=gen)
    pos = torch.cat([torch.arange(n) + o for n, o in zip(lengths, offsets)])
    ref = oracle(x, "t h d", style, 16, positions=pos)
    for backend in ("torch", "compile", "triton"):
        y = ropelab.apply_rope(x, layout="t h d", style=style, rotary_dim=16, cu_seqlens=cu,
                               offset=torch.tensor(offsets), backend=backend)
        assert_close_bound(y, x, ref, 16, style, torch.float32)
    # and the kernel's own entry reads the same arguments without building the positions
    c, s, _, _ = tables(24, 16, n=128)
    assert_close_bound(rope(x, layout="t h d", style=style, cos=c, sin=s, cu_seqlens=cu, offset=torch.tensor(offsets)),
                       x, ref, 16, style, torch.float32)


BAD_APPLY_ROPE = [
    dict(layout="b s h"),  # wrong axis count
    dict(layout="b s h d", positions=torch.arange(5)),  # positions do not fit
    dict(layout="b s h d", rotary_dim=7),  # odd rotary_dim
    dict(layout="b s h d", rotary_dim=64),  # too large
    dict(layout="b s h d", style="neox"),
    dict(layout="b s h d", offset=torch.tensor([1, 2, 3])),
    dict(layout="b s h d", cu_seqlens=torch.tensor([0, 4])),
    dict(layout="b s h d", rope_scaling={"rope_type": "nope"}),
]


@pytest.mark.parametrize("kw", BAD_APPLY_ROPE)
def test_bad_input_same_errors_as_torch_backend(kw):
    x = torch.randn(2, 4, 2, 32)
    with pytest.raises(ValueError) as torch_err:
        ropelab.apply_rope(x, **kw)
    for backend in ("triton", "compile"):  # the checks run before any backend is reached
        with pytest.raises(ValueError) as err:
            ropelab.apply_rope(x, backend=backend, **kw)
        assert str(err.value) == str(torch_err.value)


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        ropelab.apply_rope(torch.randn(1, 2, 2, 8), layout="b s h d", backend="cuda")


def test_bad_input_kernel_api():
    x, k = torch.randn(1, 4, 2, 32), torch.randn(1, 5, 1, 32)
    c, s, inv, _ = tables(32, n=8)
    cases = [
        (dict(q=x, k=k, cos=c, sin=s), "agree on every axis but 'h'"),
        (dict(q=x, cos=c, sin=s, inv_freq=inv), "exactly one"),
        (dict(q=x), "exactly one"),
        (dict(q=x, cos=c, sin=s, offset=6), "outside the cos/sin table"),
        (dict(q=x, cos=c.double(), sin=s.double()), "must be torch.float32"),
        (dict(q=x, cos=c, sin=s, positions=torch.tensor([0.5, 1, 2, 3])), "fractional positions need inv_freq"),
        (dict(q=torch.randn(1, 4, 2, 31), inv_freq=inv[:8]), "head_dim must be even"),
        (dict(q=torch.randn(1, 2, 1, 258), inv_freq=inv), "at most 256"),
        (dict(q=x.int(), cos=c, sin=s), "floating-point"),
        (dict(q=x, cos=c, sin=s, layout="t h d", cu_seqlens=[0, 4]), "names 3 axes"),
    ]
    for kw, msg in cases:
        kw.setdefault("layout", "b s h d")
        with pytest.raises(ValueError, match=msg):
            rope(kw.pop("q"), kw.pop("k", None), **kw)
    t = torch.randn(6, 2, 32)
    with pytest.raises(ValueError, match="cu_seqlens must end at the token count 6"):
        rope(t, layout="t h d", cos=c, sin=s, cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match="needs cu_seqlens"):
        rope(t, layout="t h d", cos=c, sin=s)
    # positions, offsets and cu_seqlens are checked by core, as for apply_rope: the same messages
    with pytest.raises(ValueError, match="offset has 3 entries but cu_seqlens delimits 2 sequences"):
        rope(t, layout="t h d", inv_freq=inv, cu_seqlens=torch.tensor([0, 2, 6]), offset=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="cu_seqlens must be an integer tensor"):
        rope(t, layout="t h d", inv_freq=inv, cu_seqlens=torch.tensor([0.0, 6.0]), max_seqlen=6)
    with pytest.raises(ValueError, match="positions has 3 entries but the sequence axis 's'"):
        rope(x, layout="b s h d", inv_freq=inv, positions=torch.arange(3))


def test_no_triton_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    why = ropelab.kernels.why_unavailable("cpu")
    assert "triton is not installed" in why and "backend='torch'" in why
    with pytest.raises(ValueError, match="triton is not installed"):
        ropelab.apply_rope(torch.randn(1, 2, 2, 8), layout="b s h d", backend="triton")


def test_cpu_without_interpreter_says_so():
    """On a CUDA-less machine, without TRITON_INTERPRET, the triton backend raises a clear ValueError."""
    code = ("import torch, ropelab\n"
            "try:\n    ropelab.apply_rope(torch.randn(1, 2, 2, 8), layout='b s h d', backend='triton')\n"
            "except ValueError as e:\n    print('ValueError:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if torch.cuda.is_available():
        pytest.skip("CUDA present: CPU tensors without the interpreter are not the case tested here")
    assert "ValueError:" in out.stdout, out.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in out.stdout and "backend='compile'" in out.stdout


def test_compile_backend(gen):
    """backend='compile': one fused single-pass formula, same bound; its first call compiles."""
    from ropelab.kernels import compiled

    x = torch.randn(1, 2, 8, 24, generator=gen).to(torch.bfloat16)
    kw = dict(layout="b h s d", style="interleaved", rotary_dim=16, offset=3)
    try:
        y = ropelab.apply_rope(x, backend="compile", **kw)
    except Exception as e:  # no C++ toolchain for Inductor on this machine
        pytest.skip(f"torch.compile unavailable: {type(e).__name__}")
    assert y.dtype == torch.bfloat16
    assert_close_bound(y, x, oracle(x, **kw), 16, "interleaved", torch.bfloat16)
    assert compiled.compile_seconds() > 0
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        ropelab.apply_rope(x, backend="compile", layout="b h s d", rotary_dim=5)


AOT = r'''
import inspect, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ropelab.kernels import rope_triton as rt

names = list(inspect.signature(rt.rope_kernel.fn).parameters)
ptrs = {"Q": "*bf16", "OQ": "*bf16", "K": "*bf16", "OK": "*bf16", "COS": "*fp32", "SIN": "*fp32",
        "INV_FREQ": "*fp64", "POS": "*i64", "OFFSET": "*i64", "CU_SEQLENS": "*i32"}
base = dict(BLOCK_S=32, HEADS_PER_PROG=8, HALF_PAD=64, PASS_PAD=1, INTERLEAVED=False, CONJUGATE=False,
            COPY_PASS=False, HAS_K=True, VARLEN=False, HAS_POS=False, OFFSET_PER_SEQ=False, FROM_TABLE=True,
            ANGLE_F64=True, CDT=tl.float32)
variants = [dict(), dict(INTERLEAVED=True, COPY_PASS=True, PASS_PAD=16, VARLEN=True, OFFSET_PER_SEQ=True),
            dict(HAS_POS=True, FROM_TABLE=False, CONJUGATE=True, HAS_K=False, BLOCK_S=1)]
for v in variants:
    const = {**base, **v, "sqd": 1, "soqd": 1, "skd": 1, "sokd": 1}
    sig = {n: ptrs.get(n, "constexpr" if n in const else ("i64" if n in ("sqb", "skb") else "i32")) for n in names}
    src = ASTSource(fn=rt.rope_kernel, signature=sig, constexprs={(names.index(k),): c for k, c in const.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert "cubin" in k.asm and "cos.approx" not in k.asm["ptx"]
print("compiled", len(variants))
'''


def test_compiles_for_hopper_without_a_gpu():
    """The interpreter runs the kernel's Python; this compiles it for sm_90 (H100/H200) ahead of time,
    through Triton's real front end, LLVM and ptxas, with no GPU: the variants a GPU run uses compile, and
    in-kernel cos/sin use libdevice (no fast approximate cos)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(REPO), TRITON_DEFAULT_FP_FUSION="1")
    out = subprocess.run([sys.executable, "-c", AOT], env=env, capture_output=True, text=True, timeout=300)
    if "compiled" not in out.stdout and "ptxas" in out.stderr and "not found" in out.stderr:
        pytest.skip("this triton build ships no ptxas")
    assert "compiled 3" in out.stdout, out.stderr[-3000:]


def test_parity_with_flash_attn_triton_rotary(monkeypatch):
    """flash-attn's own Triton rotary (its rotary.py from the sdist, as scripts/fetch_wheels.sh fetches it,
    or $FLASH_ROTARY), run by the same interpreter, on the same fp32 tables: the same numbers, both styles,
    partial rotary, per-sequence offsets. Skipped where the file is absent (flash-attn is opt-in)."""
    import contextlib

    from ropelab.bench import gpu as bench_gpu

    found = sorted(REPO.glob(".whl/flash_attn-*/flash_attn/ops/triton/rotary.py"))
    path = os.environ.get("FLASH_ROTARY") or (str(found[-1]) if found else None)
    flash_apply, why = bench_gpu.load_flash_rotary(path)
    if flash_apply is None:
        pytest.skip(why)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())  # it selects a CUDA device
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, 3, 64, generator=g)
    inv, _ = ropelab.frequencies(64, rotary_dim=48)
    c, s = ropelab.cos_sin(torch.arange(20), inv)
    off = torch.tensor([1, 4])
    for style in ("half", "interleaved"):
        theirs = flash_apply(x, c, s, seqlen_offsets=off, interleaved=style == "interleaved")
        ours = rope(x, layout="b s h d", style=style, cos=c, sin=s, offset=off)
        # each errs by at most 4u(|x_a| + |x_b|) <= 8u max|x| from the exact rotation by these tables
        assert (theirs - ours).abs().max() <= 16 * UNIT_ROUNDOFF[torch.float32] * x.abs().max()
    # varlen: one offset per packed sequence (seqlen_offsets with cu_seqlens), through apply_rope on every backend
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    t, off = torch.randn(9, 3, 64, generator=g), torch.tensor([4, 9, 0, 10])
    for style in ("half", "interleaved"):
        theirs = flash_apply(t, c, s, seqlen_offsets=off.int(), cu_seqlens=cu, max_seqlen=5,
                             interleaved=style == "interleaved")
        for backend in ("torch", "compile", "triton"):
            ours = ropelab.apply_rope(t, layout="t h d", style=style, rotary_dim=48, cu_seqlens=cu, offset=off,
                                      backend=backend)
            assert (theirs - ours).abs().max() <= 16 * UNIT_ROUNDOFF[torch.float32] * t.abs().max()


def test_gpu_bench_implementations_agree(monkeypatch):
    """The GPU benchmark's own closures (ropelab's kernel, HF eager, flash-attn's rotary when fetched), run
    here through the interpreter on tiny cases of every kind (padded, decode, varlen): the same outputs and
    gradients, so a GPU run times implementations that compute the same thing."""
    import contextlib

    from ropelab.bench import gpu as bench_gpu

    found = sorted(REPO.glob(".whl/flash_attn-*/flash_attn/ops/triton/rotary.py"))
    flash_apply, _ = bench_gpu.load_flash_rotary(os.environ.get("FLASH_ROTARY") or (str(found[-1]) if found else None))
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    for kind, b, s in (("padded", 2, 6), ("decode", 3, 1), ("varlen", 1, 40)):
        case = bench_gpu.make_case(kind, b, s, 32, "cpu", torch.float32, heads=(4, 2), varlen_range=(9, 16))
        impls = bench_gpu.implementations(case, "cuda", flash_apply, None)
        assert "ropelab triton" in impls and "HF eager" in impls
        q, k = case["q"], case["k"]
        ref = [t.reshape(x.shape) for t, x in zip(impls["ropelab triton"](q, k), (q, k))]
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        grads = {}
        for name, fn in impls.items():
            out = fn(q, k)
            for o, r in zip(out, ref):
                assert (o.reshape(r.shape) - r).abs().max() < 1e-5, (kind, name)
            if kind != "decode":  # forward + backward as the benchmark times it (decode: forward only here)
                qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
                grads[name] = bench_gpu._fwd_bwd(fn, qq, kk, gq, gk)()
        for name, (dq, dk) in grads.items():
            assert (dq - grads["ropelab triton"][0]).abs().max() < 1e-5, (kind, name)
            assert (dk - grads["ropelab triton"][1]).abs().max() < 1e-5, (kind, name)
