"""Parity with the real implementations: Hugging Face transformers (every ROPE_INIT_FUNCTIONS entry,
Llama's apply_rotary_pos_emb, GPT-J's interleaved rotary) and lucidrains' rotary-embedding-torch.

Hugging Face forms inv_freq and the angles in float32; ropelab in float64. Tolerances below are the
float32 error of those steps, derived, not tuned: inv_freq = base ** (i / r) has relative error about
(ln(base) + 4) * u32 (the exponent's rounding is amplified by ln(base)), and the angle m * w adds one
rounding, so |angle error| <= |m w| (ln(base) + 6) u32 and a rotated pair moves by at most that times
its norm, plus a few u32 for the products.
"""

from __future__ import annotations

import math

import pytest
import torch

import ropelab
from ropelab import apply_rope, cos_sin, frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

U32 = 2.0**-24
HEAD_DIM, MAX_POS = 64, 256

CONFIGS = {
    "default": [{"rope_type": "default", "rope_theta": 10000.0}, {"rope_type": "default", "rope_theta": 500000.0}],
    "linear": [{"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
               {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0, "partial_rotary_factor": 0.5}],
    "dynamic": [{"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.25}],
    "yarn": [{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
             {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "original_max_position_embeddings": 32,
              "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 0.707},
             {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "original_max_position_embeddings": 64,
              "truncate": False, "attention_factor": 1.3}],
    "longrope": [{"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
                  "short_factor": [1.0 + 0.05 * i for i in range(32)],
                  "long_factor": [1.0 + 0.5 * i for i in range(32)]},
                 {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
                  "factor": 3.0, "short_factor": [1.0] * 32, "long_factor": [2.0 + i for i in range(32)]}],
    "llama3": [{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 32.0, "low_freq_factor": 2.0,
                "high_freq_factor": 8.0, "original_max_position_embeddings": 128}],
    "proportional": [{"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                     {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}],
}
CASES = [(t, i, p) for t, ps in CONFIGS.items() for i, p in enumerate(ps)]


def hf_config(params: dict) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEAD_DIM * 4, num_attention_heads=4, num_key_value_heads=4, head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS, rope_parameters=dict(params),
    )


def hf_init(params: dict, seq_len):
    config = hf_config(params)
    if params["rope_type"] == "default":
        return modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=seq_len)


def test_every_hf_rope_type_is_covered():
    assert set(ROPE_INIT_FUNCTIONS) <= set(ropelab.ROPE_TYPES)
    assert set(ROPE_INIT_FUNCTIONS) <= set(CONFIGS)


@pytest.mark.parametrize("rope_type, i, params", CASES, ids=[f"{t}-{i}" for t, i, _ in CASES])
@pytest.mark.parametrize("seq_len", [None, 32, MAX_POS, 3 * MAX_POS + 5])
def test_frequencies_match_rope_init_functions(rope_type, i, params, seq_len):
    hf_inv, hf_af = hf_init(params, seq_len)
    inv, af = frequencies(HEAD_DIM, rope_scaling=params, seq_len=seq_len, max_position_embeddings=MAX_POS)
    assert inv.dtype == torch.float64 and inv.shape == hf_inv.shape
    rtol = (math.log(params["rope_theta"]) + 8) * U32
    err = ((inv - hf_inv.double()).abs() / hf_inv.double().abs().clamp_min(1e-30)).max()
    assert err <= rtol, f"relative error {err:.3g} > {rtol:.3g}"
    assert af == pytest.approx(hf_af, rel=1e-12)


def test_a_different_scaling_would_be_caught():
    """The tolerance is tight enough to tell a 5 % different factor apart."""
    a = hf_init(CONFIGS["yarn"][0], None)[0].double()
    b, _ = frequencies(HEAD_DIM, rope_scaling={**CONFIGS["yarn"][0], "factor": 4.2},
                       max_position_embeddings=MAX_POS)
    assert ((a - b).abs() / a).max() > 1e-3


@pytest.mark.parametrize("rope_type, i, params", CASES, ids=[f"{t}-{i}" for t, i, _ in CASES])
@pytest.mark.parametrize("seq", [48, 3 * MAX_POS])
def test_llama_rotary_end_to_end(rope_type, i, params, seq):
    """LlamaRotaryEmbedding + apply_rotary_pos_emb (float32 angles) vs ropelab.apply_rope (float64 angles)."""
    config = hf_config(params)
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    gen = torch.Generator().manual_seed(i)
    q = torch.randn(2, 4, seq, HEAD_DIM, generator=gen)
    k = torch.randn(2, 4, seq, HEAD_DIM, generator=gen)
    position_ids = torch.arange(seq)[None].expand(2, seq)
    cos, sin = rotary(q, position_ids)
    r = cos.shape[-1]
    # Llama's apply_rotary_pos_emb rotates cos.shape[-1] dims: with a partial rotary factor the model
    # hands it the rotary part and concatenates the rest, as done here.
    hq, hk = modeling_llama.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
    hq, hk = torch.cat([hq, q[..., r:]], -1), torch.cat([hk, k[..., r:]], -1)
    kw = dict(layout="b h s d", rope_scaling=params, max_position_embeddings=MAX_POS)
    for mine, theirs, x in ((apply_rope(q, **kw), hq, q), (apply_rope(k, **kw), hk, k)):
        inv, af = frequencies(HEAD_DIM, rope_scaling=params, seq_len=seq, max_position_embeddings=MAX_POS)
        theta_max = (seq - 1) * float(inv.max())
        pair = x.abs().amax() * 2 * af
        bound = pair * (theta_max * (math.log(params["rope_theta"]) + 6) * U32 + 8 * U32)
        err = (mine - theirs).abs().max()
        assert err <= bound, f"{err:.3g} > {bound:.3g}"


def test_llama_rotation_formula_exact_in_float64():
    """Hand Hugging Face's apply_rotary_pos_emb ropelab's float64 tables: identical to round-off."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 40, 32, generator=gen, dtype=torch.float64)
    inv, _ = frequencies(32, 10000.0)
    c, s = cos_sin(torch.arange(40), inv, dtype=torch.float64)
    cos, sin = torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]
    hq, _ = modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)
    assert (hq - apply_rope(q, layout="b h s d")).abs().max() < 1e-13


def test_gptj_interleaved():
    """GPT-J rotates (2i, 2i+1) pairs: ropelab's interleaved style, including partial rotary_dim."""
    from transformers.models.gptj import modeling_gptj

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 50, 4, 64, generator=gen, dtype=torch.float64)  # GPT-J: [b, s, h, d]
    for rotary_dim in (64, 32):
        table = modeling_gptj.create_sinusoidal_positions(50, rotary_dim).double()
        sin, cos = torch.split(table[None], rotary_dim // 2, dim=-1)
        rot = modeling_gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos)
        theirs = torch.cat([rot, x[..., rotary_dim:]], -1)
        mine = apply_rope(x, layout="b s h d", style="interleaved", rotary_dim=rotary_dim)
        # GPT-J's table is float32 (angles and inv_freq), positions < 50.
        bound = 2 * float(x.abs().max()) * (49 * (math.log(1e4) + 6) * U32 + 8 * U32)
        assert (mine - theirs).abs().max() <= bound
        assert (mine - apply_rope(x, layout="b s h d", style="half", rotary_dim=rotary_dim)).abs().max() > 0.1


def test_rotary_embedding_torch():
    """lucidrains' rotary-embedding-torch pairs (2i, 2i+1); rotate_queries_or_keys on [b, h, s, d]."""
    from rotary_embedding_torch import RotaryEmbedding

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 64, 48, generator=gen)
    for dim, theta in ((48, 10000), (32, 500)):
        rot = RotaryEmbedding(dim=dim, theta=theta)
        theirs = rot.rotate_queries_or_keys(x, seq_dim=-2)
        mine = apply_rope(x, layout="b h s d", style="interleaved", rotary_dim=dim, base=theta)
        bound = 2 * float(x.abs().max()) * (63 * (math.log(theta) + 6) * U32 + 8 * U32)
        assert (mine - theirs).abs().max() <= bound
    # and its interpolate_factor is position interpolation, i.e. rope_type 'linear'
    rot = RotaryEmbedding(dim=48, interpolate_factor=4.0)
    theirs = rot.rotate_queries_or_keys(x, seq_dim=-2)
    mine = apply_rope(x, layout="b h s d", style="interleaved", rope_scaling={"rope_type": "linear", "factor": 4.0})
    bound = 2 * float(x.abs().max()) * ((63 / 4) * (math.log(1e4) + 6) * U32 + 8 * U32)
    assert (mine - theirs).abs().max() <= bound
