"""The CPU kernel behind ``apply_rope``'s default ``backend="auto"`` (ropelab.kernels.cpu_rope): within the
docstring's error bound of a float64 oracle for float32, bfloat16 and float16, both styles, partial rotary,
offsets, 2-D and negative positions, varlen, other layouts, out= and in place, q and k in one call; the dispatch
takes the torch path where the kernel would be wrong (autograd, float64, a strided head dim); the table cache
never returns stale tables; the build helper says why it fails."""

from __future__ import annotations

import pytest
import torch
from _helpers import rope_error_bound

import ropelab
from ropelab import rope
from ropelab.kernels import cpu_buffers, cpu_build, cpu_rope, tables

pytestmark = pytest.mark.skipif(not cpu_rope.available(), reason=f"no CPU kernel: {cpu_rope.why_unavailable()}")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _oracle(x, **kw):
    """The same call in float64 on the torch path: float64 angles, tables and rotation."""
    return ropelab.apply_rope(x.double(), backend="torch", **kw)


def _assert_within_bound(y, x, r, pairs, **kw):
    """y within rope_error_bound of the float64 oracle of the call ``kw`` (r rotary dims, pairs the style)."""
    ref = _oracle(x, **kw)
    bound = rope_error_bound(x.double(), ref, r, pairs, x.dtype)
    err = (y.double() - ref).abs()
    assert y.dtype == x.dtype and y.shape == x.shape
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 32])
def test_default_call_takes_the_kernel_and_meets_the_bound(dtype, style, rotary_dim):
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 17, 64) * 3).to(dtype)
    kw = dict(layout="b h s d", style=style, rotary_dim=rotary_dim, offset=5)
    assert ropelab.rope_path(x, **kw).backend == "cpu"
    y = ropelab.apply_rope(x, **kw)
    _assert_within_bound(y, x, rotary_dim or 64, style, **kw)
    if rotary_dim:  # dims past r pass through unchanged
        assert torch.equal(y[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_shape_near_32k_with_2d_positions_and_offsets(dtype):
    torch.manual_seed(1)
    x = torch.randn(8, 32, 1, 128).to(dtype)
    pos = (32000 + torch.arange(8))[:, None]
    spec = ropelab.RopeSpec.from_keywords(128, base=500000.0)
    _assert_within_bound(ropelab.apply_rope(x, pos, layout="b h s d", spec=spec), x, 128, "half",
                         positions=pos, layout="b h s d", spec=spec)
    off = 32000 + torch.arange(8)
    _assert_within_bound(ropelab.apply_rope(x, layout="b h s d", offset=off, spec=spec), x, 128, "half",
                         layout="b h s d", offset=off, spec=spec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_negative_positions_and_other_layouts(dtype):
    torch.manual_seed(2)
    t = torch.randn(11, 4, 32).to(dtype)
    cu = torch.tensor([0, 4, 11])
    kw = dict(layout="t h d", cu_seqlens=cu, offset=torch.tensor([3, 100]), style="interleaved")
    assert ropelab.rope_path(t, **kw).backend == "cpu"
    _assert_within_bound(ropelab.apply_rope(t, **kw), t, 32, "interleaved", **kw)
    # "b s h d" as a transposed view of a [b, h, s, d] buffer: strided axes, a contiguous head dim
    x = torch.randn(2, 4, 9, 32).to(dtype).transpose(1, 2)
    neg = torch.arange(-9, 0)
    assert ropelab.rope_path(x, neg, layout="b s h d").backend == "cpu"
    _assert_within_bound(ropelab.apply_rope(x, neg, layout="b s h d"), x, 32, "half", positions=neg,
                         layout="b s h d")


def test_a_strided_head_dim_float64_and_autograd_take_the_torch_path():
    torch.manual_seed(3)
    x = torch.randn(2, 32, 5, 3).transpose(1, 3)  # [b, h=3, s=5, d=32], d of stride 15
    path = ropelab.rope_path(x, layout="b h s d")
    assert path.backend == "torch" and "head dim" in path.reason
    _assert_within_bound(ropelab.apply_rope(x, layout="b h s d"), x, 32, "half", layout="b h s d")
    assert ropelab.rope_path(x.double(), layout="b h s d").backend == "torch"
    xg = torch.randn(2, 3, 5, 32, requires_grad=True)
    assert ropelab.rope_path(xg, layout="b h s d").backend == "torch"
    y = ropelab.apply_rope(xg, layout="b h s d")
    (g,) = torch.autograd.grad(y.square().sum(), xg)  # the differentiable path: a rotation keeps the norm
    torch.testing.assert_close(g.norm(), 2 * xg.detach().norm(), rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="autograd"):
        ropelab.apply_rope(xg, layout="b h s d", backend="cpu")
    with pytest.raises(ValueError, match="head dim"):
        ropelab.apply_rope(x, layout="b h s d", backend="cpu")
    with torch.no_grad():
        assert ropelab.rope_path(xg, layout="b h s d").backend == "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_and_inplace(dtype):
    torch.manual_seed(4)
    x = torch.randn(1, 4, 33, 64).to(dtype)
    kw = dict(layout="b h s d", offset=7)
    out = torch.full_like(x, float("nan"))
    assert ropelab.apply_rope(x, out=out, **kw) is out
    _assert_within_bound(out, x, 64, "half", **kw)
    xi = x.clone()
    assert ropelab.apply_rope(xi, inplace=True, **kw) is xi
    _assert_within_bound(xi, x, 64, "half", **kw)
    # an out that overlaps x without being x: computed apart, then written (the torch path)
    buf = torch.cat([x.reshape(-1), torch.zeros(64, dtype=dtype)])
    xs, shifted = buf[:x.numel()].view_as(x), buf[64:].view_as(x)
    assert ropelab.apply_rope(xs, out=shifted, **kw) is shifted
    _assert_within_bound(shifted.clone(), x, 64, "half", **kw)
    with pytest.raises(ValueError, match="out= or inplace"):
        ropelab.apply_rope(x, out=out, inplace=True, **kw)
    with pytest.raises(ValueError, match="shape, dtype"):
        ropelab.apply_rope(x, out=out[..., :32], **kw)


def test_q_and_k_in_one_call_with_grouped_heads():
    torch.manual_seed(5)
    q, k = torch.randn(2, 16, 8, 64).bfloat16(), torch.randn(2, 16, 2, 64).bfloat16()
    pos = torch.arange(16) + 1000
    kw = dict(layout="b s h d", style="interleaved")
    qr, kr = ropelab.apply_rope_qk(q, k, pos, **kw)
    _assert_within_bound(qr, q, 64, "interleaved", positions=pos, **kw)
    _assert_within_bound(kr, k, 64, "interleaved", positions=pos, **kw)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    assert ropelab.apply_rope_qk(q, k, pos, out=(qo, ko), **kw) == (qo, ko)
    assert torch.equal(qo, qr) and torch.equal(ko, kr)
    with pytest.raises(ValueError, match="must match"):
        ropelab.apply_rope_qk(q, k[:, :8], **kw)


def test_the_table_cache_follows_positions_mutated_in_place():
    tables.clear()
    rope.clear_plans()
    x = torch.randn(1, 2, 6, 32)
    pos = torch.arange(6)
    y0 = ropelab.apply_rope(x, pos, layout="b h s d")
    assert tables.cache_info()["misses"] == 1
    assert torch.equal(ropelab.apply_rope(x, pos, layout="b h s d"), y0)  # the call's plan: no table lookup
    assert tables.cache_info() == {"hits": 0, "misses": 1, "entries": 1}
    rope.clear_plans()
    ropelab.apply_rope(x, pos, layout="b h s d")
    assert tables.cache_info()["hits"] == 1
    pos += 50  # same tensor, new content: new tables
    y1 = ropelab.apply_rope(x, pos, layout="b h s d")
    assert not torch.allclose(y0, y1)
    _assert_within_bound(y1, x, 32, "half", positions=torch.arange(6) + 50, layout="b h s d")
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int32):  # any dtype's positions key the cache
        p = torch.arange(6).to(dtype)
        _assert_within_bound(ropelab.apply_rope(x, p, layout="b h s d"), x, 32, "half", positions=p,
                             layout="b h s d")


def test_bf16_nan_and_inf_stay_nonfinite_and_results_are_not_reused_while_alive():
    x = torch.zeros(1, 1, 2, 8, dtype=torch.bfloat16)
    x[0, 0, 0, 0] = float("nan")
    y = ropelab.apply_rope(x, layout="b h s d")
    assert y[0, 0, 0, 0].isnan() and y[0, 0, 0, 4].isnan()  # NaN * sin(0) = NaN in its pair partner
    big = torch.randn(1, 8, 512, 128)  # 2 MiB: from the buffer pool
    assert big.numel() * 4 >= cpu_buffers.MIN_BYTES
    first = ropelab.apply_rope(big, layout="b h s d")
    keep = first.clone()
    second = ropelab.apply_rope(big * 2, layout="b h s d")
    assert second.data_ptr() != first.data_ptr() and torch.equal(first, keep)


def test_pooled_outputs_of_concurrent_calls_never_share_memory():
    """Threads calling at once each get a block of their own (the pool's choice and its view are one step)."""
    import threading

    xs = [torch.randn(1, 8, 512, 128, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    want = [ropelab.apply_rope(x, layout="b h s d", backend="torch") for x in xs]
    got: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(xs))}
    start = threading.Barrier(len(xs))

    def work(i):
        start.wait()
        for _ in range(20):
            got[i].append(ropelab.apply_rope(xs[i], layout="b h s d"))
            if len(got[i]) > 2:
                got[i].pop(0)  # frees a block for the others while they run

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive = [y for ys in got.values() for y in ys]
    assert len({y.data_ptr() for y in alive}) == len(alive)
    bound = 8 * torch.finfo(torch.float32).eps * max(float(x.abs().max()) for x in xs)
    for i, ys in got.items():
        for y in ys:
            assert float((y - want[i]).abs().max()) <= bound, i


def test_build_helper_reports_compile_errors_and_build_info(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPELAB_KERNEL_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return }\n")
    with pytest.raises(cpu_build.BuildError, match="failed"):
        cpu_build.load_library("bad", bad)
    assert "failed" in cpu_build.why_unavailable("bad", bad)
    good = tmp_path / "good.c"
    good.write_text("int seven(void) { return 7; }\n")
    assert cpu_build.load_library("good", good).seven() == 7
    info = cpu_build.build_info("good")
    assert info["from_cache"] is False and info["seconds"] > 0 and "-march=native" not in info["flags"]
    assert list((tmp_path / "cache").glob("good-*.so")) and not list((tmp_path / "cache").glob("*.tmp"))
    assert cpu_rope.build_info()["path"].endswith(".so")


def test_an_edited_header_rebuilds_and_a_missing_one_is_named(tmp_path, monkeypatch):
    """The cache key covers the headers a source includes from its folder (cpu_dtypes.h is shared by both
    kernels): editing one rebuilds instead of loading a library compiled from the old header."""
    monkeypatch.setenv("ROPELAB_KERNEL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "uses.c"
    src.write_text('#include "value.h"\nint value(void) { return VALUE; }\n')
    with pytest.raises(cpu_build.BuildError, match="value.h"):
        cpu_build.load_library("uses_missing", src)
    (tmp_path / "value.h").write_text("#define VALUE 3\n")
    # _build_and_load: the on-disk cache alone (load_library also keeps loaded libraries for the process)
    assert cpu_build._build_and_load("uses", src, ()).value() == 3
    (tmp_path / "value.h").write_text("#define VALUE 4\n")
    assert cpu_build._build_and_load("uses", src, ()).value() == 4  # not the cached library built with VALUE 3
    assert cpu_build.build_info("uses")["from_cache"] is False
    assert len(list((tmp_path / "cache").glob("uses-*.so"))) == 2


def test_the_pool_keeps_at_most_its_byte_bound(monkeypatch):
    """A freed result is kept for reuse only within MAX_POOLED_BYTES: a one-off large call pins nothing."""
    cpu_buffers.clear()
    monkeypatch.setattr(cpu_buffers, "MAX_POOLED_BYTES", 3 << 20)
    x = torch.randn(1, 8, 512, 128)  # 2 MiB
    big = torch.randn(1, 16, 512, 128)  # 4 MiB: past the bound, not pooled
    ropelab.apply_rope(x, layout="b h s d")
    ropelab.apply_rope(big, layout="b h s d")
    ropelab.apply_rope(x * 2, layout="b h s d")
    assert sum(b.nbytes for b in cpu_buffers._BLOCKS) <= 3 << 20
    cpu_buffers.clear()


# Plans (ropelab.rope): a call seen before runs the kernel on what its first call checked and formed.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("layout", ["b h s d", "b s h d"])
def test_a_planned_call_gives_the_first_calls_bits_within_the_bound(dtype, style, layout):
    torch.manual_seed(3)
    rope.clear_plans()
    shape = (8, 4, 1, 64) if layout == "b h s d" else (8, 1, 4, 64)
    x = (torch.randn(shape) * 3).to(dtype)
    pos = (32000 + torch.arange(8))[:, None]  # a decode step: one new token per sequence
    kw = dict(layout=layout, style=style, rotary_dim=48, base=500000.0)
    first = ropelab.apply_rope(x, pos, **kw)
    assert len(rope._PLANS) == 1 and next(iter(rope._PLANS.values())) is not None
    again = ropelab.apply_rope(x, pos, **kw)
    assert again.data_ptr() != first.data_ptr()
    # the same kernel on the same tables and the same x: the same computation, so the same bits
    assert torch.equal(again, first)
    _assert_within_bound(again, x, 48, style, positions=pos, **kw)
    out = torch.empty_like(x)
    assert ropelab.apply_rope(x, pos, out=out, **kw) is out and torch.equal(out, first)
    assert ropelab.apply_rope(x, pos, out=out, **kw) is out and torch.equal(out, first)
    xi = x.clone()
    for _ in range(2):  # in place, twice through its plan: two rotations by the same angles
        assert ropelab.apply_rope(xi, pos, inplace=True, **kw) is xi
    twice = ropelab.apply_rope(first, pos, backend="torch", **kw)
    tol = 8 * torch.finfo(dtype).eps * x.abs().max().item()  # two roundings to x's dtype of each path
    assert (xi.double() - twice.double()).abs().max().item() <= tol
    with torch.no_grad():
        spec = ropelab.RopeSpec.from_keywords(64, style=style, rotary_dim=48, base=500000.0)
        assert torch.equal(ropelab.apply_rope(x, pos, layout=layout, spec=spec), first)
        assert torch.equal(ropelab.apply_rope(x, pos, layout=layout, spec=spec), first)


def test_a_planned_key_never_serves_other_positions_or_settings():
    rope.clear_plans()
    x = torch.randn(2, 3, 5, 32)
    pos = torch.arange(5)
    y0 = ropelab.apply_rope(x, pos, layout="b h s d")
    pos += 7  # mutated in place: its content is the key
    _assert_within_bound(ropelab.apply_rope(x, pos, layout="b h s d"), x, 32, "half",
                         positions=torch.arange(5) + 7, layout="b h s d")
    for kw in (dict(offset=3), dict(base=100.0), dict(style="interleaved"), dict(rotary_dim=16)):
        y = ropelab.apply_rope(x, torch.arange(5), layout="b h s d", **kw)
        _assert_within_bound(y, x, kw.get("rotary_dim", 32), kw.get("style", "half"), positions=torch.arange(5),
                             layout="b h s d", **kw)
        assert not torch.equal(y, y0)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides: another key
    assert torch.equal(ropelab.apply_rope(xt, torch.arange(5), layout="b h s d"), y0)


def test_a_failing_call_stores_no_plan_and_fails_again():
    rope.clear_plans()
    x = torch.randn(1, 2, 4, 16)
    for bad in (torch.tensor([0.0, 1.0, float("nan"), 3.0]), torch.arange(5)):
        for _ in range(2):
            with pytest.raises(ValueError):
                ropelab.apply_rope(x, bad, layout="b h s d")
    assert not any(rope._PLANS.values())
    out = torch.empty(1, 2, 4, 16, dtype=torch.float64)
    for _ in range(2):
        with pytest.raises(ValueError, match="out must"):
            ropelab.apply_rope(x, layout="b h s d", out=out)


def test_a_planned_out_that_overlaps_x_goes_the_whole_way():
    rope.clear_plans()
    buf = torch.randn(2 * 4 * 32 + 32)
    x = buf[:256].view(1, 2, 4, 32)
    want = ropelab.apply_rope(x.clone(), layout="b h s d")
    out_apart = torch.empty(1, 2, 4, 32)
    ropelab.apply_rope(x, layout="b h s d", out=out_apart)  # plans this key (out's shape, dtype and strides)
    shifted = buf[32:288].view(1, 2, 4, 32)  # the same key, but overlapping x: the kernel must not write it
    for _ in range(2):
        xs = x.clone()
        buf[:256] = xs.reshape(-1)
        assert ropelab.apply_rope(x, layout="b h s d", out=shifted) is shifted
        _assert_within_bound(shifted, xs, 32, "half", layout="b h s d")
    assert torch.equal(out_apart, want)


def test_plans_are_not_taken_with_autograd_and_stay_bounded():
    rope.clear_plans()
    x = torch.randn(1, 2, 3, 16, requires_grad=True)
    ropelab.apply_rope(x, layout="b h s d").sum().backward()
    assert not rope._PLANS and x.grad is not None
    for n in range(rope.MAX_PLANS + 10):
        ropelab.apply_rope(torch.randn(1, 1, n + 1, 8), layout="b h s d")
    assert len(rope._PLANS) == rope.MAX_PLANS


def test_threads_sharing_a_plan_each_get_their_own_result():
    import threading

    rope.clear_plans()
    pos = (32000 + torch.arange(4))[:, None]
    xs = [torch.randn(4, 8, 1, 64) for _ in range(6)]
    want = [ropelab.apply_rope(x, pos, layout="b h s d") for x in xs]  # one key: every thread shares its plan
    bad = []

    def work(i):
        for _ in range(200):
            if not torch.equal(ropelab.apply_rope(xs[i], pos, layout="b h s d"), want[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad and len(rope._PLANS) == 1


def test_apply_rope_qk_plans_give_the_first_calls_bits_and_keep_the_pairs_checks():
    rope.clear_plans()
    torch.manual_seed(4)
    pos = (32000 + torch.arange(3))[:, None]
    q, k = torch.randn(3, 8, 1, 64).to(torch.bfloat16), torch.randn(3, 2, 1, 64).to(torch.bfloat16)  # GQA
    first = ropelab.apply_rope_qk(q, k, pos, layout="b h s d")
    for _ in range(2):
        again = ropelab.apply_rope_qk(q, k, pos, layout="b h s d")
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    assert torch.equal(ropelab.apply_rope(q, pos, layout="b h s d"), first[0])
    qi, ki = q.clone(), k.clone()
    for _ in range(2):
        assert ropelab.apply_rope_qk(qi, ki, pos, layout="b h s d", inplace=True) == (qi, ki)
    _assert_within_bound(ropelab.apply_rope_qk(q.float(), k.float(), pos, layout="b h s d")[1], k.float(), 64,
                         "half", positions=pos, layout="b h s d")
    for _ in range(2):
        with pytest.raises(ValueError, match="must match"):
            ropelab.apply_rope_qk(q, k[:2], pos, layout="b h s d")


def test_a_sparse_x_is_refused_by_name():
    for _ in range(2):
        with pytest.raises(ValueError, match="dense"):
            ropelab.apply_rope(torch.randn(1, 2, 3, 8).to_sparse(), layout="b h s d")


# bfloat16 rounding by the CPU's instruction (AVX512-BF16, style half, r/2 % 16 == 0): the software rounding's bits.


def _soft_bf16(f):
    """cpu_dtypes.h's ropelab_f32_to_bf16 in numpy: nearest even; a NaN keeps its top bits, quiet bit set."""
    import numpy as np

    u = f.view(np.uint32).astype(np.uint64)
    nan = ((u >> 16) | 0x40) & 0xFFFF
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF) >> 16
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, nan, rounded).astype(np.uint16)


def test_the_kernels_bfloat16_rounding_is_the_software_roundings_bits():
    import ctypes

    import numpy as np

    lib = cpu_build.load_library(cpu_rope.LIBRARY, cpu_rope.SOURCE)
    lib.ropelab_round_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.ropelab_bf16_hw.restype = ctypes.c_int
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    bits[0::3] &= 0x80FFFFFF  # exponents near the bottom: subnormals and the smallest normals
    bits[1::5] &= 0x807FFFFF  # subnormals and zeros
    special = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                        0x7F800001, 0xFFFFFFFF, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7F8000, 0x00008000],
                       dtype=np.uint32)
    f = np.concatenate([special, bits]).view(np.float32)
    out = np.empty(f.size, dtype=np.uint16)
    lib.ropelab_round_bf16(f.ctypes.data, out.ctypes.data, f.size)
    want = _soft_bf16(f)
    bad = np.flatnonzero(out != want)
    path = "the CPU's instruction" if lib.ropelab_bf16_hw() else "software"
    assert bad.size == 0, f"{path}: {bad.size} of {f.size} differ, e.g. {f.view(np.uint32)[bad[:4]]}"
    finite = np.isfinite(f)  # and torch's own rounding where it defines the bits (it canonicalises NaNs)
    assert np.array_equal(out[finite], torch.from_numpy(f[finite]).to(torch.bfloat16).view(torch.int16).numpy()
                          .view(np.uint16))


@pytest.mark.parametrize("scale", [1.0, 1e-37, 1e-39])
def test_bfloat16_rows_with_subnormal_results_meet_the_bound(scale):
    torch.manual_seed(5)
    x = (torch.randn(4, 8, 1, 64, dtype=torch.float64) * scale).to(torch.bfloat16)  # subnormal products at 1e-39
    pos = (32000 + torch.arange(4))[:, None]
    kw = dict(layout="b h s d", positions=pos)
    y = ropelab.apply_rope(x, **kw)
    _assert_within_bound(y, x, 64, "half", **kw)
