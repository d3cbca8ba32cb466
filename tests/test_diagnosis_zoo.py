"""ropelab.diagnosis.zoo through diagnose: no false alarm on a correct row, the right read-out (base,
scaling, style, rotary slice) on every row that states one, and the right finding for every broken row."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab.core import STYLES
from ropelab.diagnosis import diagnose, zoo
from ropelab.precision import phase_tolerance
from ropelab.scaling import LENGTH_DEPENDENT

# The zoo sweeps check positions up to 1024 (every precision bug in the zoo shows past 256) to stay fast.
MAXPOS = 1024
CORRECT = zoo.correct()
BROKEN = zoo.broken()


def run(row: zoo.Row, **kw):
    if row.needs:
        pytest.importorskip(row.needs)
    kw.setdefault("max_position", MAXPOS)
    kw.setdefault("dtype", row.dtype)
    return diagnose(row.fn, layout=row.layout, sizes=row.sizes, expect=row.expect, name=row.name, **kw)


def test_zoo_is_a_table_of_rows():
    assert len(zoo.ZOO) == len(zoo.ROWS) == len(CORRECT) + len(BROKEN)
    assert all(r.finding is None for r in CORRECT) and all(r.finding for r in BROKEN)
    row = zoo.ZOO["ropelab_half_bshd"]
    assert row.fn is not row.fn  # a fresh implementation on every access: no table cache carried over


@pytest.mark.parametrize("row", CORRECT, ids=[r.name for r in CORRECT])
def test_correct_rows_pass(row):
    dg = run(row)
    assert dg.ok, f"{row.about}\n{dg}"
    assert dg.seq_axis == dg.declared_seq
    assert dg.style in STYLES
    if row.expect and "style" in row.expect:
        assert dg.style == row.expect["style"]
    assert dg.direction == 1 and dg.identity_at_zero
    assert dg.heads_alike in (True, None) and dg.batch_alike in (True, None)
    assert dg.phase_error is not None and dg.phase_error <= dg.phase_allowed
    want = row.reads or {}
    if "base" in want:
        assert (dg.base is None) if want["base"] is None else math.isclose(dg.base, want["base"], rel_tol=1e-6), str(dg)
    if "rope_type" in want:
        assert (dg.rope_scaling or {}).get("rope_type") == want["rope_type"], str(dg)
    if want.get("factor") is not None:
        assert math.isclose(dg.rope_scaling["factor"], want["factor"], rel_tol=1e-6), str(dg)
    for key in ("style", "rotary_dim", "rotary_start"):
        if key in want:
            assert getattr(dg, key) == want[key], str(dg)
    if "scaling" in want:
        assert dg.scaling.startswith(want["scaling"]), str(dg)
    if want.get("rope_type") not in LENGTH_DEPENDENT:
        assert not dg.length_dependent, str(dg)


@pytest.mark.parametrize("row", BROKEN, ids=[r.name for r in BROKEN])
def test_broken_rows_are_named(row):
    dg = run(row)
    assert not dg.ok
    assert row.finding in dg.codes, f"{row.about}\n{dg}"
    assert all(p.strip() for p in dg.problems)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "name", ["ropelab_half_bshd", "ropelab_interleaved_thd", "hf_llama", "hf_gptj", "esm_old", "rotary_embedding_torch"]
)
def test_no_precision_false_alarm_in_16_bit(name, dtype):
    """Correct code whose angles are formed in float32 stays within the allowed phase error in bf16/fp16."""
    dg = run(zoo.ZOO[name], dtype=dtype, max_position=2048)
    if name == "rotary_embedding_torch" and dtype == torch.bfloat16:  # positions in x.dtype: exact only to 256
        assert "precision" in dg.codes
        return
    assert dg.ok, str(dg)
    assert dg.phase_error <= phase_tolerance(dtype, 2048.0)
