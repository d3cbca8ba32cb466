"""ropelab.precision (phase error of low-precision RoPE ingredients) and ropelab.attention (per-position
comparisons of attention), against float64 oracles and bounds derived from each dtype's unit roundoff."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import UNIT_ROUNDOFF

from ropelab import frequencies
from ropelab.precision import (
    PERTURBED,
    PRECISION_DTYPES,
    first_position_past,
    max_phase_error,
    perturbed_angle,
    phase_error,
    rotary_phase_error,
)

INV_FREQ, _ = frequencies(64, 10000.0)


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_positions_exact_until_the_significand_runs_out(name):
    """Integers are exact up to 1/u = 2**p (p significand bits); 1/u + 1 rounds to 1/u, one whole step off."""
    dtype, u = PRECISION_DTYPES[name], UNIT_ROUNDOFF[PRECISION_DTYPES[name]]
    last_exact = int(1 / u)
    m = torch.tensor([0, 1, last_exact - 1, last_exact])
    assert phase_error(m, INV_FREQ, where="positions", dtype=dtype).max() == 0
    if name != "fp32":  # keep the scan short; fp32's 2**24 + 1 is checked by the notebook's full run
        assert first_position_past(0.1, INV_FREQ, where="positions", dtype=dtype, limit=10 * last_exact) == (
            last_exact + 1
        )


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_angle_rounding_within_half_ulp(name):
    """Rounding the angle once errs by at most u |theta| (round to nearest)."""
    dtype, u = PRECISION_DTYPES[name], UNIT_ROUNDOFF[PRECISION_DTYPES[name]]
    m = torch.arange(0, 3000, 7)
    theta = m.double()[:, None] * INV_FREQ[None, :]
    err = phase_error(m, INV_FREQ, where="angle", dtype=dtype)
    assert (err <= u * theta + 1e-300).all()
    assert err.max() > 0  # not vacuous


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_inv_freq_error_is_linear_in_position(name):
    """Holding omega in the dtype: error m |omega_hat - omega| exactly (while it stays below pi)."""
    dtype = PRECISION_DTYPES[name]
    delta = (INV_FREQ.to(dtype).double() - INV_FREQ).abs()
    m = torch.tensor([1, 10, 50])
    err = phase_error(m, INV_FREQ, where="inv_freq", dtype=dtype)
    expect = m.double()[:, None] * delta[None, :]
    torch.testing.assert_close(err, expect, rtol=0, atol=1e-13)


@pytest.mark.parametrize("where", PERTURBED)
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_first_position_past_is_the_first(where, name):
    dtype = PRECISION_DTYPES[name]
    first = first_position_past(0.1, INV_FREQ, where=where, dtype=dtype, limit=1 << 14, chunk=100)
    assert first is not None
    errs = max_phase_error(torch.arange(first + 1), INV_FREQ, where=where, dtype=dtype)
    assert errs[first] > 0.1 and (errs[:first] <= 0.1).all()


def test_overflow_counts_as_lost_phase():
    # fp16's largest finite value is 65504: position 70000 becomes inf.
    err = phase_error(torch.tensor([70000]), INV_FREQ, where="positions", dtype=torch.float16)
    # exact on every CPU: an inf position is defined to lose the whole phase, pi
    assert torch.equal(err, torch.full_like(err, math.pi))


def test_bad_arguments():
    with pytest.raises(ValueError, match="where must be one of"):
        perturbed_angle(torch.arange(3), INV_FREQ, where="cos", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dtype must be one of"):
        perturbed_angle(torch.arange(3), INV_FREQ, where="angle", dtype=torch.float64)
    with pytest.raises(ValueError, match="threshold must be in"):
        first_position_past(4.0, INV_FREQ, where="angle", dtype=torch.bfloat16, limit=10)
    with pytest.raises(ValueError, match="limit and chunk must be"):
        first_position_past(0.1, INV_FREQ, where="angle", dtype=torch.bfloat16, limit=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        first_position_past(0.1, INV_FREQ, where="positions", dtype=torch.float64, limit=10)


def test_hf_rotary_cast_to_bf16_matches_bf16_inv_freq():
    """transformers' LlamaRotaryEmbedding stores inv_freq as a buffer: Module.to(bfloat16) casts it, and the
    phase then drifts exactly as predicted for 'inv_freq held in bf16'."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        hidden_size=128, num_attention_heads=2, head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 1e4}
    )
    rotary = llama.LlamaRotaryEmbedding(cfg)
    positions = torch.arange(2048)
    err32 = rotary_phase_error(rotary, positions, INV_FREQ)
    # float32 end to end: inv_freq, the product and cos/sin each off by a few u relative to the angle.
    u32 = UNIT_ROUNDOFF[torch.float32]
    theta = positions.double()[:, None] * INV_FREQ[None, :]
    assert (err32 <= 8 * u32 * (theta + 1)).all()
    rotary.to(torch.bfloat16)
    assert rotary.inv_freq.dtype == torch.bfloat16
    errbf = rotary_phase_error(rotary, positions, INV_FREQ).amax(dim=-1)
    predicted = first_position_past(0.1, INV_FREQ, where="inv_freq", dtype=torch.bfloat16, limit=2048)
    assert int((errbf > 0.1).nonzero()[0]) == predicted


def test_unit_roundoff_wrap_phase_and_first_index_past():
    from ropelab.precision import first_index_past, unit_roundoff, wrap_phase

    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        assert unit_roundoff(dt) == UNIT_ROUNDOFF[dt]
    with pytest.raises(ValueError, match="floating"):
        unit_roundoff(torch.int32)
    d = torch.tensor([0.1, 2 * math.pi - 0.1, -3.0, 4 * math.pi + 0.2, float("nan")], dtype=torch.float64)
    w = wrap_phase(d)
    assert torch.allclose(w, torch.tensor([0.1, 0.1, 3.0, 0.2, math.pi], dtype=torch.float64), atol=1e-12)
    assert bool(((w >= 0) & (w <= math.pi)).all())
    assert first_index_past(torch.tensor([0.0, 0.05, 0.2, 0.3]), 0.1) == 2
    assert first_index_past(torch.tensor([0.0, 0.05]), 0.1) is None
    with pytest.raises(ValueError, match="1-D"):
        first_index_past(torch.zeros(2, 2), 0.1)
