"""Bad numbers fail loudly, naming the argument: frequencies, apply_rope and RotaryKVCache refuse NaN, inf,
zero or negative bases and scaling values, non-numeric bases and positions, NaN/inf positions and offsets;
negative integer positions stay valid (a rotation by -m * theta)."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab import apply_rope, frequencies, reference_matrix
from ropelab.kvcache import RopeSchedule, RotaryKVCache
from ropelab.spec import RopeSpec

BAD_BASES = [float("nan"), float("inf"), 0.0, -10000.0, 1.0, "10000", None]


@pytest.mark.parametrize("base", BAD_BASES, ids=repr)
def test_frequencies_names_a_bad_base(base):
    with pytest.raises(ValueError, match="base"):
        frequencies(32, base)


@pytest.mark.parametrize("base", BAD_BASES, ids=repr)
def test_apply_rope_names_a_bad_base(base):
    with pytest.raises(ValueError, match="base"):
        apply_rope(torch.randn(1, 4, 2, 8), layout="b s h d", base=base)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -2.0, "2"], ids=repr)
@pytest.mark.parametrize(
    "rope_scaling, key",
    [
        ({"rope_type": "linear"}, "factor"),
        ({"rope_type": "dynamic"}, "factor"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, "attention_factor"),
        ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "high_freq_factor",
        ),
        ({"rope_type": "default"}, "rope_theta"),
        ({"rope_type": "default"}, "partial_rotary_factor"),
    ],
)
def test_scaling_values_are_named(rope_scaling, key, value):
    sc = {**rope_scaling, key: value}
    with pytest.raises(ValueError, match=key):
        frequencies(32, 10000.0, rope_scaling=sc, max_position_embeddings=2048)
    with pytest.raises(ValueError, match=key):
        apply_rope(torch.randn(1, 4, 2, 32), layout="b s h d", rope_scaling=sc, max_position_embeddings=2048)


def test_longrope_factors_are_checked():
    sc = {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
        "short_factor": [1.0] * 15 + [float("nan")],
        "long_factor": [2.0] * 16,
    }
    with pytest.raises(ValueError, match="short_factor"):
        frequencies(32, 10000.0, rope_scaling=sc)


@pytest.mark.parametrize("positions", [[0.0, float("nan"), 2.0, 3.0], [0, 1, float("inf"), 3], ["a", "b", "c", "d"]])
def test_apply_rope_names_bad_positions(positions):
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(1, 4, 2, 8), positions, layout="b s h d")


@pytest.mark.parametrize("offset", [float("nan"), float("inf"), "3"])
def test_apply_rope_names_a_bad_offset(offset):
    with pytest.raises(ValueError, match="offset"):
        apply_rope(torch.randn(1, 4, 2, 8), layout="b s h d", offset=offset)


def test_negative_positions_rotate_backwards():
    x = torch.randn(3, 1, 8, dtype=torch.float64)
    pos = torch.tensor([-1, -2, -7])
    y = apply_rope(x, pos, layout="s h d")
    want = reference_matrix(x.transpose(0, 1), pos, frequencies(8, 10000.0)[0]).transpose(0, 1)
    assert torch.allclose(y, want, atol=1e-12)
    back = apply_rope(apply_rope(x, -pos, layout="s h d"), pos, layout="s h d")  # -m undoes +m
    assert torch.allclose(back, x, atol=1e-12)


def test_dynamic_scaling_on_a_meta_tensor_is_a_clear_error():
    x = torch.empty(1, 4, 2, 8, device="meta")
    with pytest.raises(ValueError, match="seq_len"):
        apply_rope(
            x, layout="b s h d", rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16
        )


@pytest.mark.parametrize("base", [float("nan"), 0.0, -1.0, "1e4"], ids=repr)
def test_kv_cache_names_a_bad_base(base):
    with pytest.raises(ValueError, match="base"):
        RotaryKVCache(RopeSchedule(RopeSpec(base=base), head_dim=8), "post_rope", 1)


def test_kv_cache_names_a_bad_factor():
    with pytest.raises(ValueError, match="factor"):
        spec = RopeSpec(scaling={"rope_type": "dynamic", "factor": math.nan}, max_position_embeddings=16)
        RotaryKVCache(RopeSchedule(spec, head_dim=8), "recompute", 1)


@pytest.mark.parametrize("positions", [torch.tensor([float("nan")]), torch.tensor([float("inf")]), ["x"]])
def test_kv_cache_names_bad_positions(positions):
    cache = RotaryKVCache(RopeSchedule(RopeSpec(), head_dim=8), "post_rope", 1)
    q = k = v = torch.randn(1, 2, 1, 8)
    with pytest.raises(ValueError, match="positions"):
        cache.step(0, q, k, v, positions, 1)
