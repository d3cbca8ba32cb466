"""ropelab.diagnosis.compare: every difference between two implementations explained in words."""

from __future__ import annotations

import pytest
import torch

from ropelab import apply_rope
from ropelab.diagnosis import compare, diagnose, zoo
from ropelab.precision import UNIT_ROUNDOFF

MAXPOS = 1024


def test_compare_explains_the_seed():
    c = compare(
        zoo.ropelab_rope("t h d"),
        zoo.esm_old_unpadded(),
        layout="t h d",
        sizes={"h": 20, "d": 64},
        max_position=256,
        names=("varlen", "ESM"),
    )
    text = " ".join(c.differences)
    assert "ESM rotates along axis h (size 20), not t" in text
    assert "returns shape [1," in text
    assert c.max_abs_diff > 1


def test_compare_style_names_the_converter():
    c = compare(
        zoo.ropelab_rope("b s h d"), zoo.ropelab_rope("b s h d", "interleaved"), layout="b s h d", max_position=64
    )
    assert any("pairs (i, i+16)" in t and "pairs (2i, 2i+1)" in t and "interleaved_to_half" in t for t in c.differences)


def test_compare_precision_and_same():
    pytest.importorskip("transformers")
    c = compare(zoo.ropelab_rope("b s h d"), zoo.positions_bf16(), layout="b s h d", max_position=MAXPOS)
    assert any(t.startswith("B holds positions in bf16: phase error") for t in c.differences)
    hf = zoo.ZOO["hf_llama"]
    same = compare(zoo.ropelab_rope("b h s d"), hf.fn, layout="b h s d", sizes=hf.sizes, max_position=MAXPOS)
    assert same.same
    # Both in float32: what is left is float32 angles at positions <= 1024 (HF), times |x| <= ~5.
    assert same.max_abs_diff <= 8 * UNIT_ROUNDOFF[torch.float32] * (MAXPOS + 1) * 5


def test_compare_names_an_output_permutation():
    """DeepSeek's rope_interleave against the same rotation without the output permutation."""
    pytest.importorskip("transformers")
    a, b = zoo.ZOO["hf_deepseek_v3"], zoo.ZOO["hf_deepseek_v3_half"]

    def interleaved_in_place(x):  # the interleaved rotation of the trailing 16 dims, output not permuted
        return torch.cat(
            [
                x[..., :32],
                apply_rope(x[..., 32:], layout="b h s d", style="interleaved", rope_scaling={**zoo.DEEPSEEK_V3}),
            ],
            -1,
        )

    c = compare(a.fn, interleaved_in_place, layout="b h s d", sizes=a.sizes, max_position=256)
    assert any("permutes its output" in t for t in c.differences), c.differences
    assert b.name  # the half variant is a different style, explained as such
    c2 = compare(a.fn, b.fn, layout="b h s d", sizes=a.sizes, max_position=256)
    assert any("pairs (2i, 2i+1)" in t for t in c2.differences), c2.differences


def test_compare_flags_a_difference_the_probes_miss():
    """An implementation wrong only for long sequences with batch > 1, which no probe of diagnose feeds (the
    structure probe is short, the phase check has batch 1): compare's own input shows it and says so."""
    good = zoo.ropelab_rope("b s h d")

    def odd(x):
        y = apply_rope(x, layout="b s h d")
        if x.shape[0] > 1 and x.shape[1] > 32:
            y[1:] = x[1:]
        return y

    assert diagnose(odd, layout="b s h d", max_position=64).ok
    c = compare(good, odd, layout="b s h d", max_position=64)
    assert not c.same and "more than rounding allows" in c.differences[-1]
    assert compare(good, good, layout="b s h d", max_position=64).same


def test_compare_measures_a_ladder_difference_when_one_side_is_unrecognised():
    """A longrope ladder (random per-pair factors: "unrecognised") against the default one: no base or scaling
    to name, so the difference is the measured per-pair ratio, which equals longrope's 1 / short_factor."""
    params = zoo.longrope_params(32)
    long_side = zoo.ropelab_rope("b s h d", rope_scaling=params)
    c = compare(zoo.ropelab_rope("b s h d"), long_side, layout="b s h d", max_position=256, names=("plain", "long"))
    assert c.b.scaling.startswith("unrecognised") and not c.same
    text = next(t for t in c.differences if t.startswith("the frequency ladders differ"))
    assert "long: no known ladder" in text
    # The measured ratio plain / long is short_factor_i (positions <= 256 < original_max_position_embeddings).
    ratio = c.a.inv_freq / c.b.inv_freq
    want = torch.tensor(params["short_factor"], dtype=torch.float64)
    assert float((ratio / want - 1).abs().max()) <= 2.0**-16
    lo, hi = float(want.min()), float(want.max())
    assert f"from {lo:.4g} to {hi:.4g}" in text
    # Two identical unrecognised ladders: no such sentence.
    same = compare(long_side, zoo.ropelab_rope("b s h d", rope_scaling=params), layout="b s h d", max_position=256)
    assert same.same, same.differences
