"""ropelab.attention: causal logits and their comparisons (float64), and the decoder's grouped-query attention."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab.attention import (
    attend,
    attend_scores,
    causal_logits,
    grouped_scores,
    kl_by_position,
    kl_divergence,
    relative_logit_error_by_position,
)


def test_attention_comparisons():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 6, 8, generator=gen), torch.randn(2, 3, 6, 8, generator=gen)
    ref = causal_logits(q, k)
    assert ref.dtype == torch.float64 and torch.isinf(ref[..., 0, 1:]).all()
    # exact on every CPU: the same function of the same input twice in one process, then x - x = 0
    assert relative_logit_error_by_position(ref, ref).abs().max() == 0
    assert kl_by_position(ref, ref).abs().max() == 0
    other = causal_logits(q, k.flip(-2))
    kl = kl_by_position(ref, other)
    # KL by hand for one row, one (batch, head).
    p, pq = ref[0, 0, 3, :4].softmax(-1), other[0, 0, 3, :4].softmax(-1)
    by_hand = (p * (p.log() - pq.log())).sum()
    per_row = kl_by_position(ref[:1, :1], other[:1, :1])
    torch.testing.assert_close(per_row[3], by_hand, rtol=1e-12, atol=0)
    assert kl[0] == 0 and (kl[1:] > 0).all()  # position 0 attends to itself only
    rel = relative_logit_error_by_position(ref, other)
    assert rel.shape == (6,) and (rel[1:] > 0).all()
    with pytest.raises(ValueError, match="same shape"):
        causal_logits(q, k[..., :4])
    with pytest.raises(ValueError, match=r"\[\.\.\., S, S\]"):
        kl_by_position(ref, ref[..., :5])


def test_grouped_attention_equals_per_head_softmax_with_repeated_kv_heads():
    """Grouped-query attention = ordinary attention with each key/value head repeated for its query heads
    (float64, computed here from the definition)."""
    gen = torch.Generator().manual_seed(1)
    b, hq, hkv, s, n, d = 2, 6, 3, 4, 7, 8
    q = torch.randn(b, hq, s, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hkv, n, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, n, d, generator=gen, dtype=torch.float64)
    q_pos, key_pos = torch.arange(n - s, n), torch.arange(n)  # the last s positions query all n keys
    got = attend(q, k, v, q_pos, key_pos)
    kr, vr = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    logits = q @ kr.transpose(-1, -2) / math.sqrt(d)
    logits = logits.masked_fill(key_pos[None, :] > q_pos[:, None], float("-inf"))
    want = logits.softmax(-1) @ vr
    torch.testing.assert_close(got, want, rtol=0, atol=64 * 2.0**-53 * float(v.abs().max()))
    # exact on every CPU: attend is this composition, the same ops on the same input
    assert torch.equal(attend_scores(grouped_scores(q, k), v, q_pos, key_pos), got)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        grouped_scores(q[:, :5], k)


def test_kl_divergence_of_masked_rows_is_finite():
    ref = torch.tensor([[0.0, float("-inf")], [1.0, 2.0]])
    # exact on every CPU: p (log p - log p) with both logs of the same input in one process: 0
    assert torch.isfinite(kl_divergence(ref, ref)).all() and kl_divergence(ref, ref).abs().max() == 0
