"""CoPE against a loop-based float64 oracle, its position convention, masking and gradient path."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import UNIT_ROUNDOFF

from ropelab.cope import CoPE, contextual_positions, reference_cope


def causal(s: int) -> torch.Tensor:
    return torch.ones(s, s, dtype=torch.bool).tril()


def inputs(gen, b=2, h=3, s=9, d=8, dtype=torch.float32, spread=3.0):
    q = torch.randn(b, h, s, d, generator=gen).to(dtype)
    k = torch.randn(b, h, s, d, generator=gen).to(dtype)
    return q, spread * (q @ k.transpose(-1, -2))  # spread: gates away from 1/2, some near 0 and 1


def random_cope(gen, npos, d, n_heads=None, scale="after", dtype=torch.float32):
    cope = CoPE(npos, d, n_heads=n_heads, scale=scale).to(dtype)
    with torch.no_grad():
        cope.pos_emb.copy_(torch.randn(cope.pos_emb.shape, generator=gen))
    return cope


def test_all_gates_one_give_relative_distance_plus_one():
    """Convention: with every gate 1, p_ij = i - j + 1 for j <= i (the key itself counts), 0 above the diagonal."""
    s = 12
    mask = causal(s)
    p = contextual_positions(torch.ones(s, s).masked_fill(~mask, 0))
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    # exact on every CPU: sums of 0/1 gates are small integers, exact in float32 in any order
    assert torch.equal(p, torch.where(j <= i, (i - j + 1).float(), torch.zeros(())))
    # Through the module: scores so large that sigmoid rounds to exactly 1 in float32.
    cope = CoPE(64, 4)
    q = torch.zeros(1, 2, s, 4)
    gates, pos = cope.positions(q, torch.full((1, 2, s, s), 1e4), mask)
    # exact on every CPU: sigmoid(1e4 / sqrt(d)) = 1 / (1 + exp(-2500)) = 1 / (1 + 0) = 1; positions are integer sums
    assert torch.equal(gates, mask.float().expand_as(gates))
    assert torch.equal(pos[0, 0], p)
    # The clamp: with npos_max = 5 every distance past 3 reads table row 4.
    assert torch.equal(CoPE(5, 4).positions(q, torch.full((1, 2, s, s), 1e4), mask)[1][0, 0], p.clamp(max=4))


def test_gates_only_on_separators_count_separators():
    """Gates that are 1 on chosen keys and 0 elsewhere make p_ij the number of chosen keys in [j, i]."""
    s = 10
    chosen = torch.tensor([0, 1, 0, 0, 1, 0, 1, 0, 0, 0], dtype=torch.float)
    gates = chosen.expand(s, s).clone().masked_fill(~causal(s), 0)
    p = contextual_positions(gates)
    for i in range(s):
        for j in range(i + 1):
            # exact on every CPU: sums of 0/1 gates, small integers
            assert p[i, j] == chosen[j : i + 1].sum()


@pytest.mark.parametrize("scale", ["after", "before"])
def test_masked_keys_add_nothing(scale, gen):
    """Scores at masked keys change nothing (not the count, not the logits), and masked logits are -inf."""
    s = 8
    q, qk = inputs(gen, s=s)
    cope = random_cope(gen, 16, 8, scale=scale)
    # A causal mask with two keys also padded out (columns 2 and 5).
    mask = causal(s)
    mask[:, [2, 5]] = False
    out = cope(q, qk, mask)
    qk2 = torch.where(mask, qk, torch.randn(qk.shape, generator=gen) * 100)
    # exact on every CPU: masked entries are overwritten (gate 0, logit -inf); the rest: same ops, same values
    assert torch.equal(cope(q, qk2, mask), out)
    assert bool(torch.isneginf(out[..., ~mask]).all()) and bool(torch.isfinite(out[..., mask]).all())
    gates, p = cope.positions(q, torch.full_like(qk, 1e4), mask)
    assert bool((gates[..., ~mask] == 0).all())
    # with all unmasked gates 1, p_ij counts the unmasked keys in [j, i]
    for i in range(s):
        for j in range(i + 1):
            # exact on every CPU: sums of 0/1 gates, small integers
            assert p[0, 0, i, j] == mask[i, j : i + 1].sum()


def cope_error_bound(q, qk, table, npos, d, dtype):
    """Bound on |CoPE(float32) - oracle| derived from the unit roundoff u of ``dtype``.

    a = qk / sqrt(d): 2u|a|. Each gate: within 4u. p, a sum of at most s gates <= 1: within s(s + 4)u.
    Integer logits q.e[n], d-term dot products: within d u sum|q||e|. The interpolation is continuous and
    piecewise linear in p with slope |L[n+1] - L[n]| <= 2 max|L|, plus 3 roundings of size max|L|.
    """
    u = UNIT_ROUNDOFF[dtype]
    s = qk.shape[-1]
    tab = table if table.ndim == 3 else table.expand(q.shape[1], *table.shape)
    abs_l = torch.einsum("bhsd,hdn->bhsn", q.double().abs(), tab.double().abs()).amax(-1, keepdim=True)
    dp = s * (s + 4) * u
    pos_err = d * u * abs_l + 2 * abs_l * dp + 3 * u * abs_l
    return 2 * u * (qk.double().abs() / math.sqrt(d)) + 2 * pos_err + u * abs_l


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("scale", ["after", "before"])
@pytest.mark.parametrize("per_head", [False, True])
def test_matches_loop_reference(dtype, scale, per_head, gen):
    """The vectorised module equals the loop oracle, with the clamp active (npos_max = 6 < s)."""
    b, h, s, d, npos = 2, 3, 9, 8, 6
    q, qk = inputs(gen, b, h, s, d, dtype)
    cope = random_cope(gen, npos, d, n_heads=h if per_head else None, scale=scale, dtype=dtype)
    mask = causal(s)
    out = cope(q, qk, mask)
    ref = reference_cope(q, qk, mask, cope.pos_emb.detach(), scale=scale)
    assert out.dtype == dtype
    # exact on every CPU: which entries are masked (-inf) is boolean, not rounded
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    err = (out.double() - ref)[..., mask]
    bound = cope_error_bound(q, qk, cope.pos_emb.detach(), npos, d, dtype)[..., :1].expand_as(ref)[..., mask]
    assert bool((err.abs() <= bound).all()), f"max err {err.abs().max():.3g}, ratio {(err.abs() / bound).max():.3g}"
    # the clamp matters in this test: some positions reach the last row
    assert bool((cope.positions(q, qk, mask)[1] == npos - 1).any())


def test_gradients_reach_gates_through_interpolation_weight(gen):
    """d logits / d qk has, besides the content term, the chain gate -> position -> interpolation weight:

    d z_ij / d qk_ik = (L[ceil p_ij] - L[floor p_ij]) * sigmoid'(a_ik) / sqrt(d) for j <= k <= i (p unclamped).
    """
    b, h, s, d, npos = 1, 2, 7, 4, 64
    q, qk = inputs(gen, b, h, s, d, torch.float64, spread=1.0)
    qk.requires_grad_(True)
    cope = random_cope(gen, npos, d, dtype=torch.float64)
    mask = causal(s)
    c = torch.randn(qk.shape, generator=gen, dtype=torch.float64)
    out = cope(q, qk, mask)
    (torch.where(mask, out, 0) * c).sum().backward()
    with torch.no_grad():
        gates, p = cope.positions(q, qk, mask)
        L = cope.integer_logits(q)
        slope = L.gather(-1, p.ceil().long()) - L.gather(-1, p.floor().long())
        dsig = gates * (1 - gates) / math.sqrt(d)
        expected = torch.where(mask, c, 0) / math.sqrt(d)  # the content term
        for i in range(s):
            for k in range(i + 1):
                expected[..., i, k] += dsig[..., i, k] * (c[..., i, : k + 1] * slope[..., i, : k + 1]).sum(-1)
    tol = 64 * UNIT_ROUNDOFF[torch.float64] * float(expected.abs().max())
    assert torch.allclose(qk.grad, expected, rtol=0, atol=tol)
    position_part = qk.grad - torch.where(mask, c, 0) / math.sqrt(d)
    assert position_part.abs().max() > 0.01 * expected.abs().max()  # the gate path carries real gradient
    # and finite differences agree (positions are generic, so no integer crossings at this step size)
    f = lambda x: cope(q, x, mask).masked_fill(~mask, 0)
    assert torch.autograd.gradcheck(f, (qk.detach().requires_grad_(True),), eps=1e-6, atol=1e-6)


def test_zero_table_is_content_only_attention_and_scales_relate(gen):
    """Zero-initialised: logits are qk/sqrt(d), masked. 'before' with table E equals 'after' with E/sqrt(d)."""
    q, qk = inputs(gen, 2, 2, 6, 8, torch.float64)
    mask = causal(6)
    # exact on every CPU: with a zero table the module computes qk / sqrt(8) + 0, the same division
    assert torch.equal(CoPE(16, 8).double()(q, qk, mask), (qk / math.sqrt(8)).masked_fill(~mask, float("-inf")))
    before = random_cope(gen, 16, 8, scale="before", dtype=torch.float64)
    after = CoPE(16, 8, scale="after").double()
    with torch.no_grad():
        after.pos_emb.copy_(before.pos_emb / math.sqrt(8))
    with torch.no_grad():
        a, b = before(q, qk, mask), after(q, qk, mask)
    tol = 32 * UNIT_ROUNDOFF[torch.float64] * float(a[..., mask].abs().max())
    assert torch.allclose(a[..., mask], b[..., mask], rtol=0, atol=tol)


def test_bad_input_raises():
    cope = CoPE(8, 4, n_heads=2)
    q, qk, mask = torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 5), causal(5)
    with pytest.raises(ValueError, match="bool"):
        cope(q, qk, mask.float())
    with pytest.raises(ValueError, match="mask must be"):
        cope(q, qk, causal(4))
    with pytest.raises(ValueError, match="per head"):
        cope(torch.zeros(1, 3, 5, 4), torch.zeros(1, 3, 5, 5), mask)
    with pytest.raises(ValueError, match="head_dim"):
        cope(torch.zeros(1, 2, 5, 6), qk, mask)
    with pytest.raises(ValueError, match="qk must be"):
        cope(q, torch.zeros(1, 2, 4, 5), mask)
    with pytest.raises(ValueError, match="dtype"):
        cope(q.double(), qk.double(), mask)
    with pytest.raises(ValueError, match="scale"):
        CoPE(8, 4, scale="middle")
    with pytest.raises(ValueError, match="npos_max"):
        CoPE(1, 4)


@pytest.mark.parametrize("pe", ["cope", "cope+rope"])
@pytest.mark.parametrize("per_head", [False, True])
def test_tinylm_with_cope_learns_its_table(pe, per_head):
    """In the model: one step gives the zero table a gradient; the table then shapes the logits."""
    from ropelab.models import ModelConfig, TinyLM

    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=11, d_model=16, n_heads=2, pe=pe, cope_npos_max=8, cope_per_head=per_head))
    cope = model.blocks[0].attn.cope
    assert cope.pos_emb.shape == ((2, 8, 8) if per_head else (8, 8))
    idx = torch.randint(0, 11, (3, 10))
    logits, maps = model.forward_with_attention(idx)
    logits.logsumexp(-1).sum().backward()
    assert cope.pos_emb.grad is not None and cope.pos_emb.grad.abs().max() > 0
    assert torch.allclose(maps[0].sum(-1), torch.ones(3, 2, 10), atol=16 * UNIT_ROUNDOFF[torch.float32])
    assert bool((maps[0].triu(1) == 0).all())  # causal: no weight on future keys
