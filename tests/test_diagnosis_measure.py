"""diagnose's read-outs against ropelab's float64 ladders, and one test per class of wrong read-out that
the issue "diagnose right on real-world code" names (each failed before its fix)."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab import apply_rope, frequencies
from ropelab.diagnosis import diagnose, fit_ladder, zoo
from ropelab.diagnosis.ladder import LADDER_RTOL
from ropelab.precision import UNIT_ROUNDOFF, max_phase_error, phase_tolerance

MAXPOS = 1024


def run(name: str, **kw):
    row = zoo.ZOO[name]
    if row.needs:
        pytest.importorskip(row.needs)
    kw.setdefault("max_position", MAXPOS)
    kw.setdefault("dtype", row.dtype)
    return diagnose(row.fn, layout=row.layout, sizes=row.sizes, expect=row.expect, name=row.name, **kw)


# --------------------------------------------------------------------------------------------------
# Measured quantities
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, rope_scaling, base",
    [
        ("ropelab_half_bshd", None, 10000.0),
        ("ropelab_base_500k", None, 500000.0),
        ("ropelab_linear", zoo.LINEAR, 10000.0),
        ("ropelab_yarn", zoo.YARN, 10000.0),
        ("ropelab_llama3", zoo.LLAMA3, 10000.0),
        ("hf_llama_llama3", zoo.LLAMA3, 500000.0),
        ("hf_llama_yarn", zoo.YARN, 10000.0),
    ],
)
def test_inv_freq_base_and_scaling_are_measured(name, rope_scaling, base):
    dg = run(name)
    want, af = frequencies(dg.head_dim, base, rope_scaling=rope_scaling)
    # float32 implementations (Hugging Face) hold inv_freq to a few 2**-24; the ladder match tolerance is 2**-16.
    assert (dg.inv_freq / want - 1).abs().max() <= LADDER_RTOL
    assert dg.base == base
    assert (dg.rope_scaling or {}).get("rope_type") == (rope_scaling or {}).get("rope_type")
    if rope_scaling:
        assert dg.rope_scaling["factor"] == rope_scaling["factor"]
    assert math.isclose(dg.norm_scale, af, rel_tol=2**-14)


def test_partial_and_proportional_rotary_dim():
    assert run("ropelab_partial").rotary_dim == 16
    assert run("hf_gptj").rotary_dim == 16
    dg = run("ropelab_proportional")
    assert dg.rotary_dim == 32 and dg.rope_scaling["rope_type"] == "proportional"
    assert int((dg.inv_freq == 0).sum()) == 8


def test_seed_esm_call_rotates_along_heads_and_adds_an_axis():
    dg = diagnose(zoo.esm_old_unpadded(), layout="t h d", sizes={"h": 20, "d": 64})
    T = dg.sizes["t"]
    assert dg.output_shape == (1, T, 20, 64)
    assert dg.seq_axis == "h" and dg.varies_along == ("h",)
    assert {"shape", "seq_axis"} <= set(dg.codes)
    assert "rotates along axis h (size 20), not t" in " ".join(dg.problems)


def test_varlen_restart_is_checked():
    good = diagnose(zoo.ropelab_rope("t h d"), layout="t h d")
    bad = diagnose(zoo.varlen_no_restart(), layout="t h d")
    assert good.restarts_at_cu_seqlens is True
    assert bad.restarts_at_cu_seqlens is False and bad.seq_axis == "t"


@pytest.mark.parametrize(
    "name, cause, where",
    [
        ("positions_bf16", "positions in bf16", "positions"),
        ("inv_freq_bf16", "inv_freq in bf16", "inv_freq"),
        ("rotary_embedding_torch_bf16", "positions in bf16", "positions"),
    ],
)
def test_phase_error_matches_the_precision_model(name, cause, where):
    """The measured phase error is what ropelab.precision predicts for that ingredient held in 16 bits."""
    dg = run(name)
    assert dg.phase_cause == cause
    inv, _ = frequencies(dg.head_dim, 10000.0)
    predicted = max_phase_error(torch.arange(MAXPOS + 1), inv, where=where, dtype=torch.bfloat16)
    # The measurement adds the rounding of the output in the check's dtype (and float32 angles).
    tol = phase_tolerance(zoo.ZOO[name].dtype, float(MAXPOS)) + 4 * UNIT_ROUNDOFF[torch.bfloat16]
    assert abs(dg.phase_error - float(predicted.max())) <= tol
    assert dg.phase_error > dg.phase_allowed


def test_mixed_tables_explained():
    dg = run("mixed_tables")
    assert dg.codes == ["tables"] and "repeat_interleave" in dg.problems[0]


def test_attention_factor_twice_is_the_square():
    dg = run("attention_factor_twice")
    _, af = frequencies(32, 10000.0, rope_scaling=zoo.YARN)
    assert math.isclose(dg.norm_scale, af**2, rel_tol=2**-14)


def test_other_pairing_reports_the_permutation():
    """A half rotation on scrambled dims: the pairs found are (perm[i], perm[i + 16]), oriented forward."""
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(3))
    dg = run("permuted_pairs")
    assert dg.style == "other" and dg.codes == ["style"]
    assert set(dg.pairs) == {(int(perm[i]), int(perm[i + 16])) for i in range(16)}


def test_per_head_frequencies_named():
    dg = run("per_head_frequencies")
    assert dg.heads_alike is False and dg.codes == ["heads"]


# --------------------------------------------------------------------------------------------------
# Scaling and base read-out (issue classes 1-3)
# --------------------------------------------------------------------------------------------------

NON_DEFAULT = [
    (
        64,
        150000.0,
        {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
    ),
    (
        64,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "original_max_position_embeddings": 3000,
        },
    ),
    (128, 1e6, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "mscale": 0.707}),
    (32, 10000.0, {"rope_type": "yarn", "factor": 16.0, "truncate": False, "original_max_position_embeddings": 1000}),
    (
        64,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 16.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 6000,
        },
    ),
    (
        128,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    (
        64,
        10000.0,
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
            "original_max_position_embeddings": 3333,
        },
    ),
]


@pytest.mark.parametrize(
    "d, base, sc", NON_DEFAULT, ids=[f"{s['rope_type']}-{i}" for i, (_, _, s) in enumerate(NON_DEFAULT)]
)
def test_yarn_and_llama3_are_fitted_at_any_parameters(d, base, sc):
    """The ladder's parameters are fitted, the base read from the unscaled high-frequency end: type,
    base and factor come out right, and the fitted dict rebuilds the ladder."""
    inv, _ = frequencies(d, base, rope_scaling=sc, dtype=torch.float32)  # held in float32 as HF does
    lad = fit_ladder(inv.double(), d, d)
    assert lad is not None and lad.exact, lad
    assert lad.name == sc["rope_type"]
    assert math.isclose(lad.base, base, rel_tol=1e-6)
    assert math.isclose(lad.rope_scaling["factor"], sc["factor"], rel_tol=1e-6)
    rebuilt, _ = frequencies(d, lad.base, rope_scaling=lad.rope_scaling)
    assert float((rebuilt / inv.double() - 1).abs().max()) <= LADDER_RTOL


def test_gpt_oss_yarn_base_is_not_a_line_fit():
    """The issue's case: yarn x32 at base 1.5e5 (truncate False) was read as base 2.39e7."""
    dg = run("hf_gpt_oss")
    assert math.isclose(dg.base, 150000.0, rel_tol=1e-6) and dg.rope_scaling["rope_type"] == "yarn", str(dg)


def test_unrecognised_ladder_shows_no_base():
    """Random per-frequency factors (longrope) fit no known type: say so, show the ladder, print no base."""
    dg = run("ropelab_longrope")
    assert dg.ok and dg.base is None and dg.rope_scaling is None
    assert dg.scaling.startswith("unrecognised")
    assert any("measured inv_freq" in n for n in dg.notes)


@pytest.mark.parametrize("angle_dtype", [torch.float64, torch.float32])
def test_a_base_that_is_no_round_number_is_not_length_dependent(angle_dtype):
    fn = lambda x: apply_rope(x, layout="b s h d", base=12345.678, angle_dtype=angle_dtype)
    dg = diagnose(fn, layout="b s h d", max_position=MAXPOS)
    assert dg.ok and not dg.length_dependent, str(dg)
    assert math.isclose(dg.base, 12345.678, rel_tol=1e-6)


def test_dynamic_ntk_is_length_dependent():
    fn = zoo.ropelab_rope("b s h d", rope_scaling=zoo.DYNAMIC, max_position_embeddings=256)
    dg = diagnose(fn, layout="b s h d", max_position=MAXPOS)
    assert dg.ok and dg.length_dependent


def test_rope_applied_twice_is_a_problem():
    dg = run("rope_applied_twice")
    assert not dg.ok and "twice" in dg.codes, str(dg)
    assert "applied twice" in " ".join(dg.problems)


def test_linear_factor_below_one_is_a_problem():
    fn = zoo.ropelab_rope("b s h d", rope_scaling={"rope_type": "linear", "factor": 0.8})
    dg = diagnose(fn, layout="b s h d", max_position=MAXPOS)
    assert not dg.ok and "scaling" in dg.codes and "below 1" in " ".join(dg.problems), str(dg)


# --------------------------------------------------------------------------------------------------
# Naming the bug right (issue classes 4-8)
# --------------------------------------------------------------------------------------------------


def test_a_length_cache_does_not_hide_a_bf16_bug():
    """rotary-embedding-torch caches its table by length (on by default): the float64 call at the same length
    used to fill the cache before the bf16 call read it, hiding a 3 rad error near position 1800."""
    pytest.importorskip("rotary_embedding_torch")
    dg = diagnose(zoo.rotary_embedding_torch(), layout="b h s d", dtype=torch.bfloat16, max_position=2048)
    assert "precision" in dg.codes and dg.phase_cause == "positions in bf16", str(dg)
    assert dg.phase_error > 1.0


def test_xpos_is_named_a_growing_norm_scale():
    pytest.importorskip("rotary_embedding_torch")
    dg = diagnose(zoo.rotary_embedding_torch(xpos=True), layout="b h s d", max_position=MAXPOS)
    assert dg.codes == ["norm_scale"], str(dg)
    assert "xPos" in dg.problems[0] and "16-bit" not in dg.problems[0]


def test_bf16_tables_on_float32_input_are_a_precision_problem():
    dg = run("tables_bf16")
    assert dg.positions_ok and dg.seq_axis == "s", str(dg)
    assert "precision" in dg.codes and "positions" not in dg.codes
    assert "16-bit" in " ".join(dg.problems)


def test_missing_decode_offset_is_named_a_restart():
    dg = run("decode_without_offset")
    assert dg.codes == ["restart"], str(dg)
    assert "offset" in dg.problems[0] and "flattens" not in dg.problems[0]


@pytest.mark.parametrize("name, style", [("hf_deepseek_v3", "interleaved"), ("hf_deepseek_v3_half", "half")])
def test_trailing_rotary_slice_is_located(name, style):
    """DeepSeek's MLA: RoPE on the trailing 16 of 48 dims, with rope_interleave an output permutation."""
    dg = run(name)
    assert dg.ok, str(dg)
    assert (dg.rotary_start, dg.rotary_dim, dg.style) == (32, 16, style)
    text = str(dg)
    assert "dims 32..47" in text
    if style == "interleaved":
        assert dg.output_permutation is not None and "permut" in " ".join(dg.notes)
    else:
        assert dg.output_permutation is None


def test_expect_dynamic_takes_max_position_embeddings():
    fn = zoo.ropelab_rope("b s h d", rope_scaling=zoo.DYNAMIC, max_position_embeddings=2048)
    with pytest.raises(ValueError, match=r"expect\['max_position_embeddings'\]"):
        diagnose(fn, layout="b s h d", max_position=64, expect={"rope_scaling": zoo.DYNAMIC})
    dg = diagnose(
        fn, layout="b s h d", max_position=64, expect={"rope_scaling": zoo.DYNAMIC, "max_position_embeddings": 2048}
    )
    assert dg.ok, str(dg)


def test_expect_pairing_is_renamed_style():
    with pytest.raises(ValueError, match="'style'"):
        diagnose(zoo.ropelab_rope("b s h d"), layout="b s h d", expect={"pairing": "half"})


def test_a_step_ladder_is_llama3_or_yarn_by_the_measured_norm_scale():
    """A llama3 ladder with equal low and high frequency factors is a step (no band), which yarn with adjacent
    correction dims reproduces too: the norm scale decides (llama3: 1; yarn: 0.1 ln s + 1 folded in)."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
              "original_max_position_embeddings": 8192}
    yarn = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 1.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 4096}
    ladders = [frequencies(64, 5e5, rope_scaling=sc)[0] for sc in (llama3, yarn)]
    assert torch.allclose(ladders[0], ladders[1], rtol=2.0**-50, atol=0)  # one step; the attention factors differ
    for sc in (llama3, yarn):
        fn = lambda x, sc=sc: apply_rope(x, layout="b s h d", base=5e5, rope_scaling=sc)
        dg = diagnose(fn, layout="b s h d", sizes={"d": 64}, max_position=MAXPOS)
        assert dg.ok and dg.rope_scaling["rope_type"] == sc["rope_type"], str(dg)
        read = frequencies(64, dg.base, rope_scaling=dg.rope_scaling)
        want = frequencies(64, 5e5, rope_scaling=sc)
        assert torch.allclose(read[0], want[0], rtol=2.0**-50, atol=0) and read[1] == pytest.approx(want[1])
        assert any("is not the measured norm scale" in n for n in dg.notes)


# yarn on a narrow rotary slice (the transformers conformance sweep's gpt_neox, phi, stablelm, neomme) or with a
# tiny trained context (CSM's depth decoder, L0 = 16): at most two leading pairs are unscaled, too few to read
# the base from, but the fully scaled tail keeps the ratio b^(2/r). (rotary dim, base, L0), yarn x4.
NARROW_YARN = [(24, 1e4, 512), (32, 1e4, 512), (20, 1e4, 1024), (16, 1e6, 4096), (128, 5e5, 16)]


@pytest.mark.parametrize("r, base, L0", NARROW_YARN, ids=[f"r{r}-L{L0}" for r, _, L0 in NARROW_YARN])
def test_narrow_yarn_ladders_are_read_from_their_scaled_tail(r, base, L0):
    sc = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0}
    inv, af = frequencies(r, base, rope_scaling=sc, dtype=torch.float32)  # held in float32 as HF does
    assert int(((inv.double() / frequencies(r, base)[0] - 1).abs() <= 2**-14).sum()) <= 2  # few unscaled pairs
    lad = fit_ladder(inv.double(), r, r, norm_scale=af)
    assert lad is not None and lad.exact and lad.name == "yarn" and lad.base == base, lad
    assert lad.rope_scaling["factor"] == 4.0 and lad.attention_factor == af
    # the read L0 may be another value of the range that gives the same whole correction dims: the same ladder
    read, want = (frequencies(r, lad.base, rope_scaling=lad.rope_scaling)[0], frequencies(r, base, rope_scaling=sc)[0])
    assert torch.allclose(read, want, rtol=2.0**-50, atol=0)
    if lad.rope_scaling["original_max_position_embeddings"] != L0:
        assert "only to the range" in lad.note


def test_narrow_yarn_black_box_is_diagnosed_with_its_base_and_the_l0_range():
    sc = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    fn = lambda x: apply_rope(x, layout="b s h d", base=1e6, rope_scaling=sc)
    dg = diagnose(fn, layout="b s h d", sizes={"d": 16}, max_position=MAXPOS)
    assert dg.ok and dg.base == 1e6 and dg.rope_scaling["factor"] == 4.0, str(dg)
    assert any("original_max_position_embeddings only to the range" in n for n in dg.notes), dg.notes


def test_yarn_with_attention_factor_one_is_read_as_such():
    """A config may set yarn's attention_factor to 1 (transformers' mistral_large4_text default does): the norm
    scale 1 is read into the dict, with the note that it is also what a factor applied elsewhere looks like."""
    sc = {"rope_type": "yarn", "factor": 16.0, "attention_factor": 1.0, "original_max_position_embeddings": 512}
    fn = lambda x: apply_rope(x, layout="b s h d", base=1e4, rope_scaling=sc)
    dg = diagnose(fn, layout="b s h d", sizes={"d": 64}, max_position=MAXPOS)
    assert dg.ok and dg.rope_scaling["attention_factor"] == 1.0, str(dg)
    assert any("not folded into the rotation" in n for n in dg.notes)


def test_a_yarn_ramp_running_past_the_last_pair_is_read_with_its_factor():
    """transformers' bamba at the conformance sweep's sizes: yarn x4, L0 = 65536 on 32 pairs at base 1e4, whose
    correction dims (20, 33) end past the last pair, so no pair is fully scaled: the factor is read from the ramp's
    slope and a whole end, not as 1 / (the last pair's factor)."""
    sc = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 65536}
    inv, af = frequencies(64, 1e4, rope_scaling=sc, dtype=torch.float32)
    lad = fit_ladder(inv.double(), 64, 64, norm_scale=af)
    assert lad is not None and lad.exact and lad.base == 1e4 and lad.rope_scaling["factor"] == 4.0, lad
    assert "runs past the last pair" in lad.note
