"""ropelab.diagnose: no false alarms on correct implementations, the right finding for every broken one,
measured quantities against ropelab's float64 ladders, compare's explanations, the CLI and bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from ropelab import apply_rope, frequencies, zoo
from ropelab.diagnose import (
    LADDER_RTOL,
    UNIT_ROUNDOFF,
    compare,
    diagnose,
    main,
    phase_tolerance,
    probe_cu_seqlens,
    probe_sizes,
)
from ropelab.precision import max_phase_error

# The zoo sweeps check positions up to 1024 (every precision bug in the zoo shows past 256) to stay fast.
MAXPOS = 1024
CORRECT = zoo.correct()
BROKEN = zoo.broken()


def run(member: zoo.Member, **kw):
    # Members calling third-party code need the dev extras (transformers, rotary-embedding-torch).
    if member.name.startswith("hf_"):
        pytest.importorskip("transformers")
    if member.name.startswith("rotary_embedding_torch"):
        pytest.importorskip("rotary_embedding_torch")
    kw.setdefault("max_position", MAXPOS)
    kw.setdefault("dtype", member.dtype)
    return diagnose(
        member.fn,
        layout=member.layout,
        sizes=member.sizes,
        expect=member.expect,
        name=member.name,
        **kw,
    )


# --------------------------------------------------------------------------------------------------
# The zoo: no false alarms, every bug named
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("member", CORRECT, ids=[m.name for m in CORRECT])
def test_correct_implementations_pass(member):
    dg = run(member)
    assert dg.ok, str(dg)
    assert dg.seq_axis == dg.declared_seq
    assert dg.pairing in ("half", "interleaved")
    if member.expect and "pairing" in member.expect:
        assert dg.pairing == member.expect["pairing"]
    assert dg.direction == 1 and dg.identity_at_zero
    assert dg.heads_alike in (True, None) and dg.batch_alike in (True, None)
    assert dg.phase_error is not None and dg.phase_error <= dg.phase_tolerance


@pytest.mark.parametrize("member", BROKEN, ids=[m.name for m in BROKEN])
def test_broken_implementations_are_named(member):
    dg = run(member)
    assert not dg.ok
    assert member.finding in dg.codes, str(dg)
    assert all(p.strip() for p in dg.problems)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["ropelab_half_bshd", "ropelab_interleaved_thd", "hf_llama", "hf_gptj", "esm_old"])
def test_no_precision_false_alarm_in_16_bit(name, dtype):
    """Correct code whose angles are formed in float32 stays within the allowed phase error in bf16/fp16."""
    dg = run(zoo.ZOO[name], dtype=dtype, max_position=2048)
    assert dg.ok, str(dg)
    assert dg.phase_error <= phase_tolerance(dtype, 2048.0)


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
    m = zoo.ZOO[name]
    dg = run(m)
    want, af = frequencies(dg.head_dim, base, rope_scaling=rope_scaling)
    # float32 implementations (Hugging Face) hold inv_freq to a few 2**-24; the ladder match tolerance is 2**-16.
    assert (dg.inv_freq / want - 1).abs().max() <= LADDER_RTOL
    assert dg.base == base
    want_type = (rope_scaling or {}).get("rope_type")
    assert (dg.rope_scaling or {}).get("rope_type") == want_type
    if rope_scaling:
        assert dg.rope_scaling["factor"] == rope_scaling["factor"]
    assert math.isclose(dg.norm_scale, af, rel_tol=2**-14)


def test_partial_and_proportional_rotary_dim():
    assert run(zoo.ZOO["ropelab_partial"]).rotary_dim == 16
    assert run(zoo.ZOO["hf_gptj"]).rotary_dim == 16
    dg = run(zoo.ZOO["ropelab_proportional"])
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
    "name, cause, where, dtype",
    [
        ("positions_bf16", "positions in bf16", "positions", torch.bfloat16),
        ("inv_freq_bf16", "inv_freq in bf16", "inv_freq", torch.bfloat16),
        ("rotary_embedding_torch_bf16", "positions in bf16", "positions", torch.bfloat16),
    ],
)
def test_phase_error_matches_the_precision_model(name, cause, where, dtype):
    """The measured phase error is what ropelab.precision predicts for that ingredient held in 16 bits."""
    m = zoo.ZOO[name]
    dg = run(m)
    assert dg.phase_cause == cause
    inv, _ = frequencies(dg.head_dim, 10000.0)
    predicted = max_phase_error(torch.arange(MAXPOS + 1), inv, where=where, dtype=dtype)
    # The measurement adds the rounding of the output in the check's dtype (and float32 angles).
    tol = phase_tolerance(m.dtype, float(MAXPOS)) + 4 * UNIT_ROUNDOFF[torch.bfloat16]
    assert abs(dg.phase_error - float(predicted.max())) <= tol
    assert dg.phase_error > dg.phase_tolerance


def test_mixed_tables_explained():
    dg = run(zoo.ZOO["mixed_tables"])
    assert dg.codes == ["tables"] and "repeat_interleave" in dg.problems[0]


def test_attention_factor_twice_is_the_square():
    dg = run(zoo.ZOO["attention_factor_twice"])
    _, af = frequencies(32, 10000.0, rope_scaling=zoo.YARN)
    assert math.isclose(dg.norm_scale, af**2, rel_tol=2**-14)


# --------------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------------


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


def test_compare_pairing_names_the_converter():
    c = compare(
        zoo.ropelab_rope("b s h d"), zoo.ropelab_rope("b s h d", "interleaved"), layout="b s h d", max_position=64
    )
    assert any("pairs (i, i+16)" in t and "pairs (2i, 2i+1)" in t and "interleaved_to_half" in t for t in c.differences)


def test_compare_precision_and_same():
    pytest.importorskip("transformers")
    c = compare(zoo.ropelab_rope("b s h d"), zoo.positions_bf16(), layout="b s h d", max_position=MAXPOS)
    assert any(t.startswith("B holds positions in bf16: phase error") for t in c.differences)
    same = compare(zoo.ropelab_rope("b h s d"), zoo.hf_llama(), layout="b h s d", max_position=MAXPOS)
    assert same.same
    # Both in float32: what is left is float32 angles at positions <= 1024 (HF), times |x| <= ~5.
    assert same.max_abs_diff <= 8 * UNIT_ROUNDOFF[torch.float32] * (MAXPOS + 1) * 5


# --------------------------------------------------------------------------------------------------
# Rendering, CLI, bad input
# --------------------------------------------------------------------------------------------------


def test_rendering():
    dg = run(zoo.ZOO["esm_old_on_bshd"])
    text, page = str(dg), dg._repr_html_()
    assert "NOT OK" in text and "sequence axis" in text and "PROBLEM" in text
    assert page.startswith("<div>") and "<table>" in page and "rotates along axis h" in page
    assert "OK: a correct RoPE" in str(run(zoo.ZOO["ropelab_half_bshd"]))


CLI_MODULE = """
from ropelab import apply_rope, zoo
good = lambda x: apply_rope(x, layout="b s h d")
bad = zoo.esm_old()
"""


def test_cli_exit_codes(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_rope.py").write_text(CLI_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["my_rope:good", "--layout", "b s h d", "--sizes", "h=4,d=16", "--max-position", "256"]) == 0
    assert "OK: a correct RoPE" in capsys.readouterr().out
    assert main(["my_rope:bad", "--layout", "b s h d", "--max-position", "256", "--expect", "base=10000"]) == 1
    assert "rotates along axis h" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["my_rope", "--layout", "b s h d"])


def test_cli_runs_as_a_module(tmp_path):
    (tmp_path / "my_rope.py").write_text(CLI_MODULE)
    r = subprocess.run(
        [sys.executable, "-m", "ropelab.diagnose", "my_rope:bad", "--layout", "b s h d", "--max-position", "64"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "NOT OK" in r.stdout


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"layout": "b s h"}, "no 'd'"),
        ({"layout": "b s h d", "sizes": {"s": 4, "h": 4}}, "same size"),
        ({"layout": "b s h d", "sizes": {"d": 7}}, "even"),
        ({"layout": "b s h d", "sizes": {"t": 7}}, "does not have"),
        ({"layout": "b s h d", "max_position": 1}, "max_position"),
        ({"layout": "b s h d", "expect": {"bse": 1}}, "unknown key"),
        ({"layout": "b s h d", "dtype": torch.int32}, "dtype"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        diagnose(zoo.ropelab_rope("b s h d"), **kwargs)


def test_fn_returning_a_tuple_is_a_clear_error():
    with pytest.raises(ValueError, match="not a tensor"):
        diagnose(lambda x: (x, x), layout="b s h d")


def test_fn_that_fails_is_reported():
    dg = diagnose(lambda x: x.view(-1, 7), layout="b s h d")
    assert dg.codes == ["error"] and "sizes=" in dg.problems[0]


def test_identity_has_no_rotation():
    assert diagnose(lambda x: x.clone(), layout="s h d").codes == ["no_rotation"]


def test_probe_sizes_are_distinct():
    sz = probe_sizes("b s h d", {"h": 6, "d": 64})
    assert sz["h"] == 6 and sz["d"] == 64 and len({sz["b"], sz["s"], sz["h"]}) == 3
    cu = probe_cu_seqlens(12)
    assert cu.tolist()[0] == 0 and cu.tolist()[-1] == 12 and len(cu) == 4


def test_other_pairing_reports_the_permutation():
    """A half rotation on scrambled dims: the pairs found are (perm[i], perm[i + 16]), oriented forward."""
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(3))
    dg = run(zoo.ZOO["permuted_pairs"])
    assert dg.pairing == "other" and dg.codes == ["pairing"]
    assert set(dg.pairs) == {(int(perm[i]), int(perm[i + 16])) for i in range(16)}


def test_per_head_frequencies_named():
    dg = run(zoo.ZOO["per_head_frequencies"])
    assert dg.heads_alike is False and dg.codes == ["heads"]


def test_diagnose_leaves_the_thread_count_alone():
    n = torch.get_num_threads()
    diagnose(zoo.ropelab_rope("s h d"), layout="s h d", max_position=64)
    assert torch.get_num_threads() == n


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


def test_fn_raising_value_error_is_a_finding_not_a_crash():
    def needs_64(x):
        if x.shape[-1] != 64:
            raise ValueError("head_dim must be 64")
        return apply_rope(x, layout="b s h d")

    dg = diagnose(needs_64, layout="b s h d")
    assert dg.codes == ["error"] and "head_dim must be 64" in dg.problems[0]
    assert diagnose(needs_64, layout="b s h d", sizes={"d": 64}, max_position=64).ok


def test_output_with_more_elements_is_a_shape_finding():
    dg = diagnose(lambda x: apply_rope(x, layout="b s h d") * torch.ones(2, 1, 1, 1, 1), layout="b s h d")
    assert dg.codes == ["shape"] and dg.output_shape == (2, *[dg.sizes[a] for a in "bshd"])
