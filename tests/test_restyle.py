"""ropelab.studies.nb01_restyle: the same weights under another RoPE style, as they are (mixed) or permuted
(converted)."""

from __future__ import annotations

import pytest
import torch
from _helpers import gamma

from ropelab.convert import interleaved_to_half
from ropelab.models import ModelConfig, TinyLM
from ropelab.precision import unit_roundoff
from ropelab.spec import RopeSpec
from ropelab.studies.nb01_restyle import lag_copy, loss_in_dtype, permuted, restyled, rotated_qk


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=2, rope=RopeSpec(style="interleaved"))
    return TinyLM(cfg).eval()


def test_permuted_model_is_the_same_model_and_restyled_is_not(model):
    x, y, mask = lag_copy(torch.Generator().manual_seed(1), 4, 12, 16, 3)
    conv, mixed = permuted(model, "half"), restyled(model, "half")
    assert conv.cfg.rope.style == mixed.cfg.rope.style == "half" and model.cfg.rope.style == "interleaved"
    # converted: the rotated q is the trained one with its head dims re-ordered by P, to float32 round-off.
    # Layer 0 projects the same normed input h in both (embedding and ln1 unchanged), the converted model with the
    # rows of W_q, W_k permuted: each element is the same n = d_model products, but a GEMM may sum them in another
    # order (another blocking, a fused multiply-add or not) for another output column. Each is within
    # gamma_n (|h| |W|^T) of exact (Higham), so the two projections differ by at most 2 gamma_n M elementwise,
    # M = max(|h| |W|^T). The rotation mixes a pair, |e_a cos - e_b sin| <= |e_a| + |e_b| <= 4 gamma_n M, and
    # rounds within 4 u (|q_a| + |q_b|) <= 8 u (1 + gamma_n) M of its exact value (tests/_helpers.rope_error_bound),
    # once in each model.
    q_t, k_t = rotated_qk(model, x)
    q_c, k_c = rotated_qk(conv, x)
    with torch.no_grad():
        h = model.blocks[0].ln1(model.embed(x))
        big_m = float((h.double().abs() @ model.blocks[0].attn.qkv.weight.double().abs().T).max())
    n, u = model.cfg.d_model, unit_roundoff(torch.float32)
    qk_bound = (4 * gamma(n, torch.float32) + 16 * u * (1 + gamma(n, torch.float32))) * big_m
    assert float((q_c - interleaved_to_half(q_t)).abs().max()) <= qk_bound
    assert float((k_c - interleaved_to_half(k_t)).abs().max()) <= qk_bound
    with torch.no_grad():
        ref, out_c, out_m = model(x), conv(x), mixed(x)
    # the whole model agrees to float32 round-off of re-ordered dot products (head_dim terms, Higham's d u)
    scale = float(ref.abs().max())
    assert float((out_c - ref).abs().max()) <= 8 * 32 * unit_roundoff(torch.float32) * scale
    assert float((out_m - ref).abs().max()) > 1e-3 * scale  # the wrong pairs rotate: not round-off
    l32 = loss_in_dtype(conv, x, y, mask)
    l64 = loss_in_dtype(conv, x, y, mask, torch.float64)
    assert abs(l32 - l64) < 1e-5 and next(conv.parameters()).dtype == torch.float32  # cast back


def test_rotated_qk_of_a_later_layer_and_bad_arguments(model):
    x = torch.randint(0, 16, (2, 8))
    q, k = rotated_qk(model, x, layer=1)
    assert q.shape == k.shape == (2, 2, 8, 16)
    with pytest.raises(ValueError, match="layer"):
        rotated_qk(model, x, layer=2)
    with pytest.raises(ValueError, match="style"):
        restyled(model, "neox")
    with pytest.raises(ValueError, match="no RoPE"):
        permuted(TinyLM(ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2, pe="alibi")), "half")


def test_lag_copy_targets_are_the_inputs_lag_steps_back():
    x, y, mask = lag_copy(torch.Generator().manual_seed(0), 3, 10, 7, 2)
    # exact on every CPU: integer tokens, shifted
    assert torch.equal(y[:, 2:], x[:, :-2]) and not mask[:, :2].any() and mask[:, 2:].all()
    assert int(x.max()) < 7
    with pytest.raises(ValueError, match="lag"):
        lag_copy(torch.Generator(), 1, 4, 7, 4)
