"""ropelab.scaling: the ladder and the scaling formulas, checked from their definitions in float64.

Parity of every type with transformers' own ROPE_INIT_FUNCTIONS is in test_hf_parity.py."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab.scaling import ROPE_TYPES, check_rotary_dim, default_inv_freq, frequencies, ntk_base, parse_scaling


def test_default_ladder_is_roformers():
    inv = default_inv_freq(8, 10000.0)
    want = torch.tensor([10000.0 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    torch.testing.assert_close(inv, want, rtol=4 * 2.0**-53, atol=0)
    assert default_inv_freq(8, 10000.0, torch.float32).dtype == torch.float32


def test_linear_divides_and_dynamic_moves_the_base():
    base, _ = frequencies(16, 500.0)
    lin, af = frequencies(16, 500.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert torch.equal(lin, base / 4.0) and af == 1.0
    dyn_short, _ = frequencies(16, 500.0, rope_scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=64,
                               max_position_embeddings=64)
    assert torch.equal(dyn_short, base)  # at L <= L0 dynamic NTK is the plain ladder
    b = ntk_base(500.0, 16, 256, 64, 2.0)
    assert b == pytest.approx(500.0 * (2.0 * 256 / 64 - 1.0) ** (16 / 14), rel=1e-15)
    dyn, _ = frequencies(16, 500.0, rope_scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=256,
                         max_position_embeddings=64)
    torch.testing.assert_close(dyn, default_inv_freq(16, b), rtol=0, atol=0)


def test_yarn_attention_factor_is_0_1_ln_s_plus_1():
    _, af = frequencies(32, rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64})
    assert af == pytest.approx(0.1 * math.log(8.0) + 1.0, rel=1e-15)


def test_parse_scaling_and_rotary_dim_checks():
    assert parse_scaling(None).rope_type == "default"
    assert parse_scaling({"type": "linear", "factor": 2.0}).rope_type == "linear"  # the legacy key
    for name, rec in ROPE_TYPES.items():  # every record's example is a valid dict of its type
        assert parse_scaling(rec.example).rope_type == name
    with pytest.raises(ValueError, match="unknown rope_type"):
        parse_scaling({"rope_type": "ntk"})
    for r, match in [(7, "even"), (0, "positive"), (18, "larger than the head dim")]:
        with pytest.raises(ValueError, match=match):
            check_rotary_dim(r, 16)
    assert frequencies(16, rope_scaling={"partial_rotary_factor": 0.5})[0].numel() == 4
