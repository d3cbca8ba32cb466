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
