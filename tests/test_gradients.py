"""16-bit gradients: every backend computes the backward in float32 and rounds once, like the forward.

RoPE is linear and orthogonal, so :math:`\\partial L/\\partial x = R^\\top g` with ``g = dL/dy``: per pair,
``dx_a = g_a cos + g_b sin``. Rounding each product to 16 bits and adding in 16 bits (what autograd does
on a 16-bit x times float32 tables) loses a small ``dx_a`` whose terms nearly cancel; one rounding of
the float32 result does not.

Two checks. (1) Transformer Engine's (``tests/pytorch/test_fused_rope.py``): each backend on a 16-bit
input against the same rotation computed on ``x.float()`` and rounded to the dtype, forward and
gradient, at ``torch.testing.assert_close``'s default tolerances for the dtype (bf16 rtol 1.6e-2, fp16
1e-3: one unit in the last place fits), for a random and for a broadcast-scalar gradient, on every
layout, both styles, full and partial rotary. (2) The reported class of case: gradients small against
their terms are within one rounding of the exact float64 value (plus the float32 compute term).
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from _helpers import UNIT_ROUNDOFF

import ropelab

BACKENDS = ["torch", "compile", "triton"]
DTYPES = [torch.bfloat16, torch.float16]
# Each layout's shape: b=2, s=5 (t=7 packed as 3 + 4), h=2, d=16. Grids stay tiny for the interpreter.
LAYOUTS = {
    "b s h d": (2, 5, 2, 16),
    "b h s d": (2, 2, 5, 16),
    "s b h d": (5, 2, 2, 16),
    "b s d": (2, 5, 16),
    "t h d": (7, 2, 16),
}
CU_SEQLENS = torch.tensor([0, 3, 7], dtype=torch.int32)
OFFSET = 1000  # angles up to ~1000 rad on the fastest pair: cos and sin of every size, both signs


def _skip_unless_runs(backend: str) -> None:
    if backend == "triton":
        pytest.importorskip("triton")
        from ropelab import kernels

        if not kernels.available("cpu"):
            pytest.skip("Triton interpreter not active")
    if backend == "compile":
        # dynamo recompiles per shape and falls back to eager past its recompile limit (8 per function):
        # start each case afresh so that every case runs the compiled code it claims to test.
        torch._dynamo.reset()


def _bf16_truncates(backend: str, dtype: torch.dtype) -> bool:
    # Triton's interpreter casts float32 -> bfloat16 by truncation (no rounding mode), a GPU rounds to
    # nearest: one more unit roundoff there.
    return backend == "triton" and dtype == torch.bfloat16 and not torch.cuda.is_available()


def _cases():
    """Every dtype x layout x style x rotary for torch and triton. For compile each case costs a compile
    (seconds), and apply_rope hands it x with d moved last, so the layout changes only strides: the full
    dtype x style x rotary matrix on 'b s h d', and every other layout once."""
    full = [(dt, lay, st, rd) for dt in DTYPES for lay in LAYOUTS for st in ("half", "interleaved")
            for rd in (None, 10)]
    some = [c for c in full if c[1] == "b s h d"]
    some += [(DTYPES[i % 2], lay, ("half", "interleaved")[i // 2 % 2], (None, 10)[i % 2])
             for i, lay in enumerate(lay for lay in LAYOUTS if lay != "b s h d")]
    for backend in BACKENDS:
        for dt, lay, st, rd in some if backend == "compile" else full:
            name = f"{backend}-{str(dt).split('.')[1]}-{lay.replace(' ', '')}-{st}-{'partial' if rd else 'full'}"
            yield pytest.param(backend, dt, lay, st, rd, id=name)


@pytest.mark.parametrize("backend,dtype,layout,style,rotary_dim", list(_cases()))
def test_16bit_matches_float32_reference(backend, dtype, layout, style, rotary_dim):
    """Forward and gradient of each backend on a 16-bit x = the float32 computation rounded once."""
    _skip_unless_runs(backend)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(LAYOUTS[layout], generator=gen).to(dtype).requires_grad_()
    kw = dict(layout=layout, style=style, rotary_dim=rotary_dim, offset=OFFSET)
    if "t" in layout.split():
        kw["cu_seqlens"] = CU_SEQLENS
    # The reference, as Transformer Engine builds it: the float32 computation (eager torch) on x.float(),
    # rounded to the dtype; its gradient reaches x through x.float(), so it too is float32 rounded once.
    y_ref = ropelab.apply_rope(x.float(), backend="torch", **kw).to(dtype)
    try:
        y = ropelab.apply_rope(x, backend=backend, **kw)
    except Exception as e:  # pragma: no cover - no C++ toolchain for Inductor on this machine
        if backend == "compile" and not isinstance(e, ValueError):
            pytest.skip(f"torch.compile unavailable: {type(e).__name__}")
        raise
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, y_ref)
    g_random = torch.randn(y.shape, generator=gen).to(dtype)
    g_scalar = torch.tensor(2.0, dtype=dtype).expand(y.shape)  # TE's "overlapping" gradient: stride 0
    for g in (g_random, g_scalar):
        dx, = torch.autograd.grad(y, x, g, retain_graph=True)
        dx_ref, = torch.autograd.grad(y_ref, x, g, retain_graph=True)
        assert dx.dtype == dtype
        torch.testing.assert_close(dx, dx_ref)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelling_gradient_within_one_rounding(backend, dtype, style):
    r"""Gradients small against their terms come back within one rounding of the exact value.

    Per pair at angle :math:`\theta`, the incoming gradient is :math:`g = \rho(\cos\varphi, \sin\varphi)`
    with :math:`\varphi = \theta + \pi/2 - \varepsilon`, so the exact :math:`dx_a = \rho\sin\varepsilon`
    is 1e-3 .. 1e-2 of :math:`\rho` (the report: -0.00372 returned as 0.0). ropelab rounds cos/sin to
    float32 (:math:`u_{32}`), forms the two products and their sum in float32, and rounds once to the
    dtype (u), so :math:`|dx - dx_{exact}| \le 4u_{32}(|g_a| + |g_b|) + u|dx_{exact}|` plus half the
    subnormal spacing. Rounding each product to the dtype before adding breaks that bound.
    """
    _skip_unless_runs(backend)
    gen = torch.Generator().manual_seed(11)
    d, s = 16, 9
    positions = torch.arange(s) + OFFSET
    inv_freq, af = ropelab.frequencies(d)
    a, b = ropelab.pair_indices(d, style)
    theta = positions.double()[:, None] * inv_freq.double()[None, :]  # [s, d/2]
    rho = 1 + 3 * torch.rand(2, s, 3, d // 2, generator=gen, dtype=torch.float64)
    eps = 1e-3 + 9e-3 * torch.rand(2, s, 3, d // 2, generator=gen, dtype=torch.float64)
    phi = theta[None, :, None, :] + math.pi / 2 - eps
    g64 = torch.zeros(2, s, 3, d, dtype=torch.float64)
    g64[..., a], g64[..., b] = rho * torch.cos(phi), rho * torch.sin(phi)
    g = g64.to(dtype)  # the gradient as the backward receives it: representable in the dtype
    g64 = g.double()

    x = torch.randn(2, s, 3, d, generator=gen).to(dtype).requires_grad_()
    try:
        y = ropelab.apply_rope(x, layout="b s h d", style=style, offset=OFFSET, backend=backend)
    except Exception as e:  # pragma: no cover - no C++ toolchain for Inductor on this machine
        if backend == "compile" and not isinstance(e, ValueError):
            pytest.skip(f"torch.compile unavailable: {type(e).__name__}")
        raise
    dx, = torch.autograd.grad(y, x, g)

    # exact: R^T g with the float64 oracle's explicit rotation matrices
    R = ropelab.rotation_matrix(positions, inv_freq, d, style=style, attention_factor=af)
    exact = torch.einsum("sji,bshj->bshi", R, g64)
    pair_mag = torch.zeros_like(g64)
    pair_mag[..., a] = pair_mag[..., b] = g64[..., a].abs() + g64[..., b].abs()
    # the construction is the reported class: every dx_a is at most 1/50 of its terms
    assert bool((exact[..., a].abs() <= 0.02 * pair_mag[..., a]).all())

    u, u32 = UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF[torch.float32]
    tiny = torch.finfo(dtype).smallest_normal * u
    rounding = (2 if _bf16_truncates(backend, dtype) else 1) * u * exact.abs()
    bound = 4 * u32 * pair_mag + rounding + tiny
    err = (dx.double() - exact).abs()
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max().item():.3g}"

    # the bound discriminates: rounding each product to the dtype and adding there (the old eager
    # backward, autograd's rule for a 16-bit x times float32 tables) falls outside it
    c, sn = torch.cos(theta).float()[None, :, None], torch.sin(theta).float()[None, :, None]
    naive_a = (g[..., a] * c).to(dtype) + (g[..., b] * sn).to(dtype)
    assert bool(((naive_a.double() - exact[..., a]).abs() > bound[..., a]).any())
