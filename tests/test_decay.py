"""RoFormer's decay envelope, the actual RoPE logits against distance, and Men et al.'s base bound."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import UNIT_ROUNDOFF

from ropelab import frequencies, pair_indices
from ropelab.decay import (
    base_scan,
    decay_envelope,
    min_similarity_bound,
    rope_logits,
    similarity_bound,
    smallest_nonnegative_base,
)

U64 = UNIT_ROUNDOFF[torch.float64]


def test_envelope_at_zero_is_32_5_for_d128():
    """At r = 0, S_j = j, so the envelope is (1/64) sum_{j=1}^{64} j = 32.5 (RoFormer Figure 2's first point)."""
    env = decay_envelope(torch.arange(3), head_dim=128, base=10000.0)
    assert abs(float(env[0]) - 32.5) <= 64 * 32.5 * U64
    for d in (8, 64, 256):  # in general (d/2 + 1) / 2
        assert abs(float(decay_envelope([0], head_dim=d)[0]) - (d / 2 + 1) / 2) <= d * d * U64
    assert float(env[1]) < float(env[0])


def complex_pairs(x, style="half"):
    a, b = pair_indices(x.shape[-1], style)
    return torch.complex(x[..., a].double(), x[..., b].double())


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_logits_match_complex_form_and_obey_the_envelope(style, gen):
    """<R_r q, k> = Re sum_i h_i e^{i r theta_i} with h_i = q_i conj(k_i) (pairs as complex numbers), and
    |that| <= max_i |h_{i+1} - h_i| * sum_j |S_j| (Abel summation with h_{d/2} = 0)."""
    d, base = 32, 10000.0
    q, k = torch.randn(5, d, generator=gen, dtype=torch.float64), torch.randn(5, d, generator=gen, dtype=torch.float64)
    r = torch.arange(0, 300, 7)
    got = rope_logits(q, k, r, base=base, style=style)
    theta = frequencies(d, base)[0]
    h = complex_pairs(q, style) * complex_pairs(k, style).conj()  # [5, d/2]
    phase = torch.polar(torch.ones(r.numel(), d // 2, dtype=torch.float64), r[:, None].double() * theta)
    want = (h[:, None, :] * phase[None]).sum(-1)
    assert torch.allclose(got, want.real, rtol=0, atol=8 * d * U64 * float(h.abs().sum(-1).max()))
    h_ext = torch.cat([h, torch.zeros(5, 1, dtype=h.dtype)], dim=-1)
    lip = (h_ext[:, 1:] - h_ext[:, :-1]).abs().amax(-1)  # max_i |h_{i+1} - h_i|
    env_sum = decay_envelope(r, d, base) * (d / 2)
    assert bool((want.abs() <= lip[:, None] * env_sum[None] * (1 + 1e-12)).all())


def test_all_ones_logit_is_twice_men_bound():
    """For q = k = 1 each pair gives 2 cos(r theta_i): the logit is 2 B_r."""
    r = torch.arange(0, 5000, 13)
    ones = torch.ones(128, dtype=torch.float64)
    assert torch.allclose(rope_logits(ones, ones, r), 2 * similarity_bound(r), rtol=0, atol=1e-9)
    # exact on every CPU: 64 terms cos(0) = 1, summed: a small integer
    assert float(similarity_bound([0])[0]) == 64.0


def test_gaussian_logits_have_mean_zero_and_variance_d(gen):
    """Independent N(0, I) q and k: E<R_r q, k> = 0 and Var = d at every distance (no decay)."""
    d, n = 64, 4000
    q = torch.randn(n, d, generator=gen, dtype=torch.float64)
    k = torch.randn(n, d, generator=gen, dtype=torch.float64)
    r = torch.tensor([0, 1, 10, 100, 1000, 10000])
    logits = rope_logits(q, k, r)
    se = math.sqrt(d / n)
    assert bool((logits.mean(0).abs() < 4.5 * se).all()), logits.mean(0) / se
    # the sample variance of a product of normals: relative SE about sqrt(2 * 9 / n) here; 5 SEs
    assert bool(((logits.var(0) / d - 1).abs() < 5 * math.sqrt(18 / n)).all()), logits.var(0) / d


def test_similar_key_logit_follows_men_bound(gen):
    """k = q + noise, q ~ N(0, I): E<R_r q, k> = 2 B_r (the noise term has mean 0)."""
    d, n = 64, 4000
    q = torch.randn(n, d, generator=gen, dtype=torch.float64)
    k = q + 0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    r = torch.arange(0, 2000, 50)
    logits = rope_logits(q, k, r)
    se = logits.std(0) / math.sqrt(n)
    assert bool(((logits.mean(0) - 2 * similarity_bound(r, d)).abs() < 4.5 * se).all())


def test_smallest_nonnegative_base_is_a_boundary():
    """The returned base keeps B_r >= 0 up to the context; the grid below it and b / (1 + tol) do not."""
    L, d = 1024, 128
    b = smallest_nonnegative_base(L, d, rel_tol=1e-3)
    r = torch.arange(L + 1)
    assert float(similarity_bound(r, d, b).min()) >= 0
    assert float(similarity_bound(r, d, b / 1.0011).min()) < 0
    grid = [100 * 1.02**i for i in range(int(math.log(b / 100) / math.log(1.02)))]
    assert all(float(similarity_bound(r, d, g).min()) < 0 for g in grid)
    # a longer context needs a larger base
    assert smallest_nonnegative_base(2048, d) > b


def test_passing_bases_are_not_closed_upward():
    """d = 128, L = 4096: the smallest passing base (about 2.86e4) is no threshold, 4e4 fails (min B_r < -2)."""
    L, d = 4096, 128
    b = smallest_nonnegative_base(L, d, lo=2e4)
    low = min_similarity_bound(L, d, [b, 4e4])
    assert float(low[0]) >= 0 and float(low[1]) < -2.0
    assert float(low[1]) == pytest.approx(float(similarity_bound(torch.arange(L + 1), d, 4e4).min()), abs=1e-9)


def test_base_scan_reports_the_base_above_which_all_pass():
    """On the grid: every base from all_pass_above up passes, the grid point below it fails, and first_pass is
    the smallest passing grid base; each pass/fail agrees with a direct evaluation of min B_r."""
    L, d = 512, 64
    scan = base_scan(L, d, lo=100.0, hi=1e6, points_per_decade=20)
    bases, passes = scan["bases"], scan["passes"]
    i = int((bases == scan["all_pass_above"]).nonzero()[0])
    assert bool(passes[i:].all()) and not bool(passes[i - 1]) and scan["last_fail"] == float(bases[i - 1])
    assert scan["first_pass"] == float(bases[int(passes.nonzero()[0])]) <= scan["all_pass_above"]
    r = torch.arange(L + 1)
    for k in range(0, len(bases), 7):
        assert bool(passes[k]) == (float(similarity_bound(r, d, float(bases[k])).min()) >= 0)
    assert base_scan(L, d, lo=100.0, hi=300.0, points_per_decade=5)["all_pass_above"] is None  # hi fails


def test_bad_input_raises():
    with pytest.raises(ValueError, match="even"):
        decay_envelope([0, 1], head_dim=7)
    with pytest.raises(ValueError, match="1-D"):
        decay_envelope(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="same shape"):
        rope_logits(torch.ones(2, 8), torch.ones(8), [0, 1])
    with pytest.raises(ValueError, match="base"):
        similarity_bound([0], base=1.0)
    with pytest.raises(ValueError, match="lower lo"):
        smallest_nonnegative_base(4, 128, lo=1e6)
    with pytest.raises(ValueError, match="bases"):
        min_similarity_bound(16, 8, [0.5])
    with pytest.raises(ValueError, match="points_per_decade"):
        base_scan(16, 8, lo=10.0, hi=5.0)
