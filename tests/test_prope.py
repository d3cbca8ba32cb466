"""p-RoPE (ropelab.prope)."""

import pytest
import torch

import ropelab
from ropelab.decay import similarity_bound
from ropelab.prope import first_negative_distance, p_rope_frequencies, p_rope_scaling, p_rope_similarity_bound


def test_p_rope_keeps_the_highest_frequencies():
    full = p_rope_frequencies(64, 1.0)
    half = p_rope_frequencies(64, 0.5)
    # b^(-2i/d) on ladders of other lengths (pow may take vector or scalar paths): each within 1 ulp (2u) of
    # the exact power in SLEEF and glibc, so within 4u of each other; the zeros are exact
    torch.testing.assert_close(half[:16], full[:16], rtol=4 * 2.0**-53, atol=0)
    assert torch.all(half[16:] == 0)
    assert torch.all(p_rope_frequencies(64, 0.0) == 0)


def test_p_rope_bound_and_apply():
    r = torch.arange(0, 3000, 7)
    assert torch.allclose(p_rope_similarity_bound(r, 64, 1.0), similarity_bound(r, 64), atol=1e-9)
    assert torch.allclose(p_rope_similarity_bound(r, 64, 0.0), torch.full_like(r, 32, dtype=torch.float64))
    q = torch.randn(1, 10, 2, 64, dtype=torch.float64)
    out = ropelab.apply_rope(q, layout="b s h d", rope_scaling=p_rope_scaling(0.25))
    # exact on every CPU: dims that do not rotate are copied
    assert torch.equal(out[..., 8:32], q[..., 8:32]) and torch.equal(out[..., 40:], q[..., 40:])
    assert first_negative_distance(128, 1.0) is not None
    assert first_negative_distance(128, 0.5) is None


def test_bad_p():
    with pytest.raises(ValueError, match="fraction"):
        p_rope_scaling(1.5)
