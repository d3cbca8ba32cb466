"""``MultiAxis(blockwise=True)``: each axis' pairs half-paired within a block of its own dims (Gemma 4's vision
tower), and ``MultiAxis(order=...)``: the axes' runs in another order along the head (Step3p5's vision tower), each
against a float64 oracle and transformers' own rotation."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from ropelab import apply_rope
from ropelab.multiaxis import MultiAxis, grid_positions, per_layer_axes
from ropelab.spec import RopeSpec

BLOCKS = MultiAxis((4, 4), axial=True, blockwise=True)


def _oracle(x: torch.Tensor, pos: torch.Tensor, sections: tuple[int, ...], base: float) -> torch.Tensor:
    """Pair j of axis k at dims (o_k + j, o_k + s_k + j) turns by p_k * base^(-2j / (2 s_k)), in float64 math."""
    y = x.clone()
    o = 0
    for k, n in enumerate(sections):
        for j in range(n):
            w = base ** (-2 * j / (2 * n))
            for t in range(x.shape[-2]):
                c, s = math.cos(float(pos[k, t]) * w), math.sin(float(pos[k, t]) * w)
                a, b = x[..., t, o + j], x[..., t, o + n + j]
                y[..., t, o + j], y[..., t, o + n + j] = a * c - b * s, a * s + b * c
        o += 2 * n
    return y


def test_blockwise_rotates_each_axis_within_its_block():
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pos = grid_positions(2, 3)
    ours = apply_rope(x, pos, layout="h s d", spec=RopeSpec(base=100.0), sections=BLOCKS)
    assert (ours - _oracle(x, pos, (4, 4), 100.0)).abs().max() <= 64 * 2.0 ** -53 * x.abs().max()
    plain = apply_rope(x, pos, layout="h s d", spec=RopeSpec(base=100.0), sections=MultiAxis((4, 4), axial=True))
    assert (ours - plain).abs().max() > 0.1  # the layout matters: the check could fail
    a, b = BLOCKS.pair_dims(16, "half")
    assert a.tolist() == [0, 1, 2, 3, 8, 9, 10, 11] and b.tolist() == [4, 5, 6, 7, 12, 13, 14, 15]


def test_blockwise_is_refused_where_it_means_nothing():
    with pytest.raises(ValueError, match="axial=True"):
        MultiAxis((4, 4), blockwise=True)
    with pytest.raises(ValueError, match="pair half within each axis' block"):
        BLOCKS.pair_dims(16, "interleaved")
    x = torch.randn(6, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="pair half within each axis' block"):
        apply_rope(x, grid_positions(2, 3), layout="s d", spec=RopeSpec(style="interleaved"), sections=BLOCKS)


def test_gemma4_vision_reading_is_transformers_multidimensional_rope():
    """``per_layer_axes`` of Gemma 4's vision config (the measured entry: blockwise axial sections) against its
    rotary module and ``apply_multidimensional_rope`` in float64; the rotary forms angles in float32, so the bound
    is the float32 one of the conformance sweep."""
    transformers = pytest.importorskip("transformers")
    from ropelab.conformance.compare import bound

    module = importlib.import_module("transformers.models.gemma4.modeling_gemma4")
    config = transformers.CONFIG_MAPPING["gemma4_vision"]()
    spec, sections = per_layer_axes(config.to_dict())[0]
    assert sections.blockwise and sections.axial
    d = config.head_dim
    rotary = module.Gemma4VisionRotaryEmbedding(config)
    pos = grid_positions(4, 5)  # (row, column) of 20 patches
    x = torch.randn(1, 20, 2, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cos, sin = rotary(x, pos.T[None])
    theirs = module.apply_multidimensional_rope(x, cos, sin, pos.T[None], unsqueeze_dim=2)
    ours = apply_rope(x, pos, layout="b s h d", spec=spec, sections=sections)
    tol = bound(x, "b s h d", pos, spec, sections)
    assert ((ours - theirs).abs() <= tol).all(), float(((ours - theirs).abs() / tol).max())
    wrong = MultiAxis(sections.sections, axial=True)
    assert ((apply_rope(x, pos, layout="b s h d", spec=spec, sections=wrong) - theirs).abs() > tol).any()


def test_order_lays_out_the_axes_runs_along_the_head():
    """``order=(1, 0)``: the column's run of pairs first. Against a float64 oracle (the same rotation with the
    position rows swapped and the default order), and refused where it means nothing."""
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pos = grid_positions(2, 3)
    spec = RopeSpec(base=100.0)
    ordered = apply_rope(x, pos, layout="s d", spec=spec, sections=MultiAxis((3, 5), axial=True, order=(1, 0)))
    swapped = apply_rope(x, pos.flip(0), layout="s d", spec=spec, sections=MultiAxis((5, 3), axial=True))
    assert (ordered - swapped).abs().max() <= 64 * 2.0 ** -53 * x.abs().max()
    assert MultiAxis((3, 5), axial=True, order=(1, 0)).axis_of_pair().tolist() == [1] * 5 + [0] * 3
    assert MultiAxis((3, 5), order=(0, 1)) == MultiAxis((3, 5))  # the default order has one spelling
    with pytest.raises(ValueError, match="order must be a tuple"):
        MultiAxis((3, 5), order=(1, 1))
    with pytest.raises(ValueError, match="interleaved sections have none"):
        MultiAxis((4, 2, 2), interleaved=True, order=(2, 1, 0))


def test_step3p5_vision_reading_is_transformers_rotation():
    """``per_layer_axes`` of Step3p5's vision config (measured: axial, the column's run first) against its rotary
    module and ``apply_rotary_pos_emb_vision`` (float32 inside), within the conformance sweep's bound."""
    transformers = pytest.importorskip("transformers")
    from ropelab.conformance.compare import bound

    module = importlib.import_module("transformers.models.step3p7.modeling_step3p7")
    config = transformers.CONFIG_MAPPING["step3p5_vision"]()
    spec, sections = per_layer_axes(config.to_dict())[0]
    assert sections.order == (1, 0) and sections.axial
    d = config.hidden_size // config.num_attention_heads
    rotary = module.Step3p7VisionRotaryEmbedding(config)
    pos = grid_positions(4, 5)
    x = torch.randn(1, 20, 2, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    cos, sin = rotary(x, pos.T)
    theirs, _ = module.apply_rotary_pos_emb_vision(x, x, cos[None], sin[None])
    ours = apply_rope(x, pos, layout="b s h d", spec=spec, sections=sections)
    tol = bound(x, "b s h d", pos, spec, sections)
    assert ((ours - theirs).abs() <= tol).all(), float(((ours - theirs).abs() / tol).max())
    default = MultiAxis(sections.sections, axial=True)
    assert ((apply_rope(x, pos, layout="b s h d", spec=spec, sections=default) - theirs).abs() > tol).any()
