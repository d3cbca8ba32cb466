"""ropelab.kernels on a real GPU (skipped without CUDA; run by scripts/gpu_check.sh).

The same checks as tests/test_kernels.py, compiled by Triton for the device rather than interpreted:
every result against the float64 oracle (computed on the CPU) within ``rope_error_bound``, with
round-to-nearest bf16 stores, plus what the CPU cannot afford: a tensor past 2**31 elements.
"""

from __future__ import annotations

import os

import pytest
import torch
from _helpers import rope_error_bound

import ropelab

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs CUDA (and the compiled, not interpreted, kernel)")


def oracle(x, layout, **kw):
    return ropelab.apply_rope(x.detach().double().cpu(), layout=layout, **kw)


def check(y, x, ref, r, style, dtype):
    bound = rope_error_bound(x.detach().double().cpu(), ref, r, style, dtype)
    err = (y.detach().double().cpu() - ref).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("d,r", [(64, 64), (80, 80), (96, 64), (128, 128), (256, 200)])
def test_kernel_matches_oracle(d, r, style, dtype):
    g = torch.Generator().manual_seed(d + r)
    q = torch.randn(2, 300, 8, d, generator=g).to(dtype)
    k = torch.randn(2, 300, 2, d, generator=g).to(dtype)
    inv, af = ropelab.frequencies(d, rotary_dim=r)
    c, s = ropelab.cos_sin(torch.arange(400), inv, af)
    off = torch.tensor([0, 77])
    oq, ok = ropelab.kernels.rope(q.cuda(), k.cuda(), layout="b s h d", style=style, cos=c.cuda(), sin=s.cuda(),
                                  offset=off.cuda())
    for x, y in ((q, oq), (k, ok)):
        check(y, x, oracle(x, "b s h d", style=style, rotary_dim=r, offset=off), r, style, dtype)
    if dtype == torch.bfloat16:  # apply_rope's path: cos/sin made in the kernel in float64 (one dtype: compile time)
        y = ropelab.apply_rope(q.cuda(), layout="b s h d", style=style, rotary_dim=r, offset=off.cuda(),
                               backend="triton")
        check(y, q, oracle(q, "b s h d", style=style, rotary_dim=r, offset=off), r, style, dtype)


def test_layouts_varlen_strides_inplace_grad():
    g = torch.Generator().manual_seed(0)
    c, s = (t.cuda() for t in ropelab.cos_sin(torch.arange(4096), ropelab.frequencies(128)[0]))
    x = torch.randn(2, 8, 1000, 128, generator=g).bfloat16()
    check(ropelab.kernels.rope(x.cuda(), layout="b h s d", cos=c, sin=s), x, oracle(x, "b h s d"), 128, "half",
          torch.bfloat16)
    cu = torch.tensor([0, 1000, 1001, 3000], dtype=torch.int32)
    t = torch.randn(3000, 4, 128, generator=g)
    check(ropelab.kernels.rope(t.cuda(), layout="t h d", cos=c, sin=s, cu_seqlens=cu.cuda()), t,
          oracle(t, "t h d", cu_seqlens=cu), 128, "half", torch.float32)
    qkv = torch.randn(2, 500, 3, 8, 128, generator=g).cuda()
    q = qkv[:, :, 0]
    q0, v0 = q.clone(), qkv[:, :, 2].clone()
    with torch.no_grad():
        ropelab.kernels.rope(q, layout="b s h d", cos=c, sin=s, inplace=True)
    check(qkv[:, :, 0], q0, oracle(q0, "b s h d"), 128, "half", torch.float32)
    # exact: v is not touched by the kernel
    assert torch.equal(qkv[:, :, 2], v0)
    z = torch.randn(1, 16, 2, 32, dtype=torch.float64, device="cuda", requires_grad=True)
    c64, s64 = (t.cuda() for t in ropelab.cos_sin(torch.arange(32), ropelab.frequencies(32)[0],
                                                     dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda a: ropelab.kernels.rope(a, layout="b s h d", cos=c64, sin=s64), (z,))


def test_past_2_31_elements():
    """A bf16 tensor of 2**31 + 2**20 elements (4.3 GB): the last heads' addresses need int64."""
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip("needs about 12 GB of free GPU memory")
    n_tok = (2**31 + 2**20) // (16 * 128) + 1
    x = torch.empty(1, n_tok, 16, 128, dtype=torch.bfloat16, device="cuda")
    assert x.numel() > 2**31
    rows = {"head": slice(0, 3), "tail": slice(n_tok - 3, n_tok)}
    before = {}
    for name, sl in rows.items():
        x[0, sl].normal_()
        before[name] = x[0, sl].cpu()
    c, s = (t.cuda() for t in ropelab.cos_sin(torch.arange(n_tok), ropelab.frequencies(128)[0]))
    with torch.no_grad():
        ropelab.kernels.rope(x, layout="b s h d", cos=c, sin=s, inplace=True)
    for name, sl in rows.items():
        pos = torch.arange(n_tok)[sl]
        check(x[0, sl], before[name], oracle(before[name], "s h d", positions=pos), 128, "half", torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("d,r", [(128, 128), (128, 64), (80, 64), (256, 256)])
def test_qk_norm_rope_triton_matches_oracle_and_writes_the_paged_cache(dtype, style, d, r):
    """ropelab.qk_norm_rope(backend="triton") compiled for the GPU: q and k against the float64 oracle (norm then
    rope in float64, on the CPU) within (D/2 + 10) u_32 (|y_a| + |y_b|) + u |y_a|, and the paged cache: the written
    slots hold exactly the returned k and the given v, every other entry is untouched (NaN-filled)."""
    from ropelab.kernels.qk_norm_rope import qk_norm_rope_oracle
    from ropelab.precision import UNIT_ROUNDOFF

    g = torch.Generator().manual_seed(0)
    T, Hq, Hkv, bs = 300, 16, 4, 16
    qkv = torch.randn(T, (Hq + 2 * Hkv) * d, generator=g).to(dtype)
    wq, wk = ((1 + 0.1 * torch.randn(d, generator=g)).to(dtype) for _ in range(2))
    spec = ropelab.RopeSpec(style=style, base=1e6, rotary_dim=r)
    pos = torch.arange(T) + 1000
    n_blocks = -(-(T + 1000) // bs) + 1
    perm = torch.randperm(n_blocks, generator=g)
    slots = perm[pos // bs] * bs + pos % bs
    kc = torch.full((n_blocks, bs, Hkv, d), float("nan"), dtype=dtype, device="cuda")
    vc = kc.clone()
    oq, ok = ropelab.qk_norm_rope(qkv.cuda(), num_heads=Hq, num_kv_heads=Hkv, head_dim=d, q_weight=wq.cuda(),
                                  k_weight=wk.cuda(), eps=1e-6, spec=spec, positions=pos.cuda(), kv_cache=(kc, vc),
                                  slot_mapping=slots.cuda(), backend="triton")
    inv, af = spec.frequencies(d)
    c, s = ropelab.cos_sin(pos, inv, af, dtype=torch.float64)
    q3 = qkv[:, :Hq * d].unflatten(1, (Hq, d))
    k3 = qkv[:, Hq * d:(Hq + Hkv) * d].unflatten(1, (Hkv, d))
    v3 = qkv[:, (Hq + Hkv) * d:].unflatten(1, (Hkv, d))
    u = UNIT_ROUNDOFF[dtype] if dtype != torch.float32 else 0.0
    for x, w, y in ((q3, wq, oq), (k3, wk, ok)):
        ref = qk_norm_rope_oracle(x, w, 1e-6, c, s, style)
        a = ref.abs()
        pair = 2 * a.clone()
        h = r // 2
        if style == "half":
            pair[..., :h] = pair[..., h:r] = a[..., :h] + a[..., h:r]
        else:
            pair[..., 0:r:2] = pair[..., 1:r:2] = a[..., 0:r:2] + a[..., 1:r:2]
        bound = (d / 2 + 10) * UNIT_ROUNDOFF[torch.float32] * pair + u * a
        err = (y.double().cpu() - ref).abs()
        assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"
    kf, vf = kc.view(-1, Hkv, d).cpu(), vc.view(-1, Hkv, d).cpu()
    assert torch.equal(kf[slots], ok.cpu()) and torch.equal(vf[slots], v3)
    rest = torch.ones(kf.shape[0], dtype=torch.bool)
    rest[slots] = False
    assert bool(kf[rest].isnan().all()) and bool(vf[rest].isnan().all())
