"""Bad input gets a ValueError naming the problem and the fix; nothing is broadcast silently."""

from __future__ import annotations

import pytest
import torch

from ropelab import apply_rope, frequencies, rotate

X = torch.zeros(2, 5, 3, 8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(layout="b s d"), "names 3 axes but the tensor has 4 dims"),
        (dict(layout="b s h d s"), "twice"),
        (dict(layout="b s s d"), "twice"),
        (dict(layout="b s h x"), "unknown axis 'x'"),
        (dict(layout="b s h q"), "unknown axis"),
        (dict(layout="b s h c"), "unknown axis"),
        (dict(layout="b h s t"), "no 'd'"),
        (dict(layout="b e h d"), "unknown axis"),
        (dict(layout="b h h d"), "twice"),
        (dict(layout="b h b d"), "twice"),
        (dict(layout="b x h d"), "unknown"),
        (dict(layout="b s h d", rotary_dim=5), "must be even"),
        (dict(layout="b s h d", rotary_dim=10), "larger than the head dim 8"),
        (dict(layout="b s h d", rotary_dim=0), "positive"),
        (dict(layout="b s h d", style="neox"), "style must be"),
        (dict(layout="b s h d", rope_scaling={"rope_type": "ntk"}), "unknown rope_type 'ntk'"),
        (dict(layout="b s h d", rope_scaling={"type": "linear"}), "needs the key 'factor'"),
        (dict(layout="b s h d", rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "max_position_embeddings"),
        (dict(layout="b s h d", rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64}), "low_freq_factor"),
        (dict(layout="b s h d", rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4,
                                              "original_max_position_embeddings": 64}), "long_factor"),
        (dict(layout="b s h d", rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 3,
                                              "long_factor": [1.0] * 3, "factor": 2.0,
                                              "original_max_position_embeddings": 64}), "length rotary_dim/2 = 4"),
        (dict(layout="b s h d", rope_scaling={"rope_type": "yarn", "factor": 2.0}), "original_max_position"),
        (dict(layout="b s h d", rope_scaling="linear"), "must be a dict"),
        (dict(layout="b s h d", base=1.0), "base must be > 1"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        apply_rope(X, **kwargs)


def test_layout_with_both_s_and_t_or_t_and_b():
    with pytest.raises(ValueError, match="both 's' and 't'"):
        apply_rope(torch.zeros(4, 3, 8, 2), layout="s t d h", cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="no batch axis"):
        apply_rope(torch.zeros(2, 4, 8), layout="b t d", cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="no sequence axis"):
        apply_rope(torch.zeros(2, 3, 8), layout="b h d")


@pytest.mark.parametrize(
    "positions, match",
    [
        (torch.arange(4), "has 4 entries but the sequence axis 's'.*size 5"),
        (torch.arange(3), "size 5"),
        (torch.zeros(3, 5, dtype=torch.long), r"needs \[b, s\] = \[2, 5\]"),
        (torch.zeros(5, 2, dtype=torch.long), r"needs \[b, s\]"),
        (torch.zeros(2, 5, 3, dtype=torch.long), "1-D"),
        (torch.zeros(5, dtype=torch.bool), "integer or float"),
    ],
)
def test_positions_that_do_not_fit(positions, match):
    with pytest.raises(ValueError, match=match):
        apply_rope(X, positions, layout="b s h d")


def test_positions_rows_need_a_batch_axis():
    with pytest.raises(ValueError, match="no 'b' axis"):
        apply_rope(torch.zeros(5, 3, 8), torch.zeros(2, 5, dtype=torch.long), layout="s h d")


def test_positions_for_the_heads_axis_are_refused():
    """The seed's bug: 3 positions (one per head) for a 'b s h d' tensor must not broadcast along h."""
    with pytest.raises(ValueError, match="sequence axis 's'"):
        apply_rope(X, torch.arange(3), layout="b s h d")


T = torch.zeros(10, 2, 8)


@pytest.mark.parametrize(
    "cu, match",
    [
        (torch.tensor([0.0, 4.0, 10.0]), "integer tensor"),
        (torch.tensor([1, 4, 10]), "must start at 0"),
        (torch.tensor([0, 6, 4, 10]), "must not decrease"),
        (torch.tensor([0, 4, 9]), "end at the token count 10"),
        (torch.tensor([0, 4, 11]), "end at the token count 10"),
        (torch.tensor([[0, 10]]), "1-D"),
        (torch.tensor([0]), "1-D with one more entry"),
    ],
)
def test_bad_cu_seqlens(cu, match):
    with pytest.raises(ValueError, match=match):
        apply_rope(T, layout="t h d", cu_seqlens=cu)


def test_varlen_needs_boundaries_and_not_both():
    with pytest.raises(ValueError, match="needs cu_seqlens"):
        apply_rope(T, layout="t h d")
    with pytest.raises(ValueError, match="not both"):
        apply_rope(T, torch.arange(10), layout="t h d", cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="name the token axis 't'"):
        apply_rope(X, layout="b s h d", cu_seqlens=torch.tensor([0, 5]))


def test_rotate_refuses_implicit_broadcast():
    x = torch.zeros(2, 5, 3, 8)
    cos = torch.ones(5, 4)  # would broadcast against (h, d/2), not (s, d/2)
    with pytest.raises(ValueError, match="cos/sin have 2 dims but x has 4"):
        rotate(x, cos, cos)
    with pytest.raises(ValueError, match="dim 1 has size 3"):
        rotate(x, torch.ones(1, 3, 1, 4), torch.ones(1, 3, 1, 4))
    with pytest.raises(ValueError, match="same shape"):
        rotate(x, torch.ones(1, 5, 1, 4), torch.ones(1, 5, 1, 2))


def test_integer_input_and_frequency_dtype():
    with pytest.raises(ValueError, match="floating-point"):
        apply_rope(torch.zeros(2, 5, 3, 8, dtype=torch.long), layout="b s h d")
    with pytest.raises(ValueError, match="float32 or float64"):
        frequencies(8, dtype=torch.bfloat16)
