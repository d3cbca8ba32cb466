"""MLA's decoupled RoPE (ropelab.mla): absorption, cache bytes, parity with transformers' DeepSeek-V3."""

import pytest
import torch

from ropelab.mla import absorption_error, cache_bytes_per_token, deepseek_rope, gqa_equivalent_groups, mla_scores
from ropelab.precision import UNIT_ROUNDOFF

F64, F32 = UNIT_ROUNDOFF[torch.float64], UNIT_ROUNDOFF[torch.float32]


@pytest.mark.parametrize("seed", [0, 1])
def test_rope_breaks_absorption_and_decoupling_restores_it(seed):
    e = absorption_error(seed)
    assert e["no_rope"] < 1e3 * F64
    assert e["rope"] > 0.05
    assert e["rope_fixed_distance_on"] < 1e3 * F64 and e["rope_fixed_distance_off"] > 0.05
    g = torch.Generator().manual_seed(seed)
    H, dn, dr, dcq, dc, dm, s = 3, 8, 8, 12, 10, 20, 16
    w = {"UQ": torch.randn(H, dn, dcq, generator=g, dtype=torch.float64),
         "UK": torch.randn(H, dn, dc, generator=g, dtype=torch.float64),
         "QR": torch.randn(H, dr, dcq, generator=g, dtype=torch.float64),
         "KR": torch.randn(dr, dm, generator=g, dtype=torch.float64)}
    c_q, c_kv, h = (torch.randn(s, n, generator=g, dtype=torch.float64) for n in (dcq, dc, dm))
    pos = torch.arange(100, 100 + s)
    a = mla_scores(c_q, c_kv, h, w, pos, absorbed=True)
    b = mla_scores(c_q, c_kv, h, w, pos, absorbed=False)
    assert (a - b).abs().max() <= 1e3 * F64 * b.abs().max()
    # and the rotary part alone is relative: shifting every position leaves the scores unchanged
    assert (mla_scores(c_q, c_kv, h, w, pos - 100, absorbed=True) - a).abs().max() <= 1e3 * F64 * b.abs().max()


def test_cache_bytes_at_deepseek_v3_defaults():
    from transformers import DeepseekV3Config

    # DeepSeek-V2 Table 1: MHA 2 n_h d_h l, GQA 2 n_g d_h l, MQA 2 d_h l, MLA (d_c + d_h^R) l ~ 9/2 d_h l,
    # "equal to GQA with only 2.25 groups"; V3's sizes: l = 61, n_h = 128, d_h = 128, d_c = 512, d_h^R = 64.
    c = cache_bytes_per_token(DeepseekV3Config(), bytes_per_element=2, gqa_groups=8)
    assert c["MLA"] == 61 * (512 + 64) * 2 == 61 * 4.5 * 128 * 2
    assert c["MHA"] == 2 * 128 * 128 * 61 * 2
    assert c["GQA (8 groups)"] == 2 * 8 * 128 * 61 * 2 and c["MQA"] == 2 * 128 * 61 * 2
    assert gqa_equivalent_groups(DeepseekV3Config()) == 2.25
    assert cache_bytes_per_token(DeepseekV3Config(), gqa_groups=2)["GQA (2 groups)"] < c["MLA"]
    with pytest.raises(ValueError, match="gqa_groups"):
        cache_bytes_per_token(DeepseekV3Config(), gqa_groups=0)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        cache_bytes_per_token({"num_hidden_layers": 2, "num_attention_heads": 2, "qk_nope_head_dim": 2,
                               "qk_rope_head_dim": 2, "v_head_dim": 2})


@pytest.mark.parametrize("interleave", [False, True])
def test_rotary_part_matches_transformers_deepseek_v3(interleave):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    cfg = DeepseekV3Config(hidden_size=64, num_attention_heads=2, qk_rope_head_dim=16, qk_nope_head_dim=16,
                           v_head_dim=16, kv_lora_rank=32, q_lora_rank=None, rope_interleave=interleave,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    rot = m.DeepseekV3RotaryEmbedding(cfg)
    q = torch.randn(2, 2, 30, 16, dtype=torch.float64)  # b h s d: the q_rot slice
    k = torch.randn(2, 1, 30, 16, dtype=torch.float64)  # the shared k_rot
    pos = torch.arange(30)[None].expand(2, 30)
    cos, sin = rot(q.float(), pos)
    fn = m.apply_rotary_pos_emb_interleave if interleave else m.apply_rotary_pos_emb
    rq, rk = fn(q, k, cos.double(), sin.double())
    for x, ref in ((q, rq), (k, rk)):
        ours = deepseek_rope(x, layout="b h s d", interleave=interleave)
        assert (ours - ref).abs().max() <= 8 * 30 * F32 * x.abs().max()
