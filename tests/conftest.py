"""Shared test helpers: dtype-derived tolerances and seeded inputs."""

from __future__ import annotations

import pytest
import torch

# Unit roundoff u = 2**-p for a p-bit significand: round-to-nearest errs by at most u * |value|.
UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}


def rope_error_bound(x64: torch.Tensor, y_ref: torch.Tensor, rotary_dim: int, style: str, dtype: torch.dtype):
    """Elementwise bound on |apply_rope(x) - oracle| for input already representable in ``dtype``.

    ropelab forms cos/sin in float64, rounds them once to the compute dtype c (float32 for 16-bit
    inputs), computes y_a = x_a cos - x_b sin (each product and the sum rounded in c), then rounds y
    once to ``dtype``. So |err| <= u_c * 4 (|x_a| + |x_b|) + u_out |y_ref| (+ half the subnormal
    spacing of ``dtype`` for results that underflow).
    """
    from ropelab import pair_indices

    compute = torch.float64 if dtype == torch.float64 else torch.float32
    u_c, u_out = UNIT_ROUNDOFF[compute], (UNIT_ROUNDOFF[dtype] if dtype != compute else 0.0)
    a, b = pair_indices(rotary_dim, style)
    pair_mag = torch.zeros_like(x64)
    s = x64[..., a].abs() + x64[..., b].abs()
    pair_mag[..., a] = s
    pair_mag[..., b] = s
    tiny = torch.finfo(dtype).smallest_normal * UNIT_ROUNDOFF[dtype] if dtype != compute else 0.0
    return 4 * u_c * pair_mag + u_out * y_ref.abs() + tiny


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
