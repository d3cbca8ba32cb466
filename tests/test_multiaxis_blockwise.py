"""``MultiAxis(blockwise=True)``: each axis' pairs half-paired within a block of its own dims (Gemma 4's vision
tower), against a float64 oracle and transformers' own ``apply_multidimensional_rope``."""

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
