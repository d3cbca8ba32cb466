"""diagnose names a ladder rounded to bf16/fp16 by any route as an inv_freq precision problem (issue 31, item 5),
and ropelab.diagnosis.rounding reads no rounding into float32 ladders or ladders of another base."""

from __future__ import annotations

import pytest
import torch

from ropelab.core import rotate
from ropelab.diagnosis import diagnose, zoo
from ropelab.diagnosis.rounding import fit_frequencies, read_rounding, ulp
from ropelab.scaling import frequencies

MAXPOS = 1024
TAG = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def run(fn, d, **kw):
    return diagnose(fn, layout="b s h d", sizes={"d": d}, max_position=MAXPOS, **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("route", ["native", "cast", "denominator", "exponent"])
@pytest.mark.parametrize("d, base", [(64, 1e4), (96, 1e6), (128, 5e5)])
def test_a_rounded_ladder_is_inv_freq_precision_by_any_route(route, dtype, d, base):
    if dtype == torch.float16 and route in ("native", "denominator") and base > 65504:
        pytest.skip("base ** (2i/r) overflows float16 here: test_fp16_overflow_is_named")
    dg = run(zoo.rounded_ladder(route, dtype, base), d)
    if route == "exponent" and d in (64, 128):  # 2i/r is exact in 16 bits for a power-of-two r: a float32 ladder
        assert dg.ok, str(dg)
        return
    assert dg.codes == ["inv_freq_precision"], str(dg)
    assert dg.ladder_rounding.endswith(f" in {TAG[dtype]}"), str(dg)
    assert {"bf16": "bfloat16", "fp16": "float16"}[TAG[dtype]] in dg.problems[0]
    assert dg.base == pytest.approx(base, rel=1e-6) and dg.phase_cause.endswith(TAG[dtype])


def test_fp16_overflow_is_named():
    """A base above 65504 raised in float16 is inf: only pair 0 (base^0 = 1) turns; the denominator formed in
    float16 overflows on the last pairs, which must not read as a p-RoPE."""
    dg = run(zoo.rounded_ladder("native", torch.float16, 5e5), 64)
    assert dg.codes == ["inv_freq_precision"] and "overflowing to inf" in dg.problems[0], str(dg)
    dg = run(zoo.rounded_ladder("denominator", torch.float16, 5e5), 64)
    assert dg.codes == ["inv_freq_precision"] and "no p-RoPE" in dg.problems[0], str(dg)


def test_inv_freq_rounded_only_for_16_bit_input():
    """inv_freq formed in x.dtype (angles in float32): the float64 probes see a float32 ladder, the bf16 call
    the rounded one; the phase call's own fit names it."""

    def fn(x):
        d = x.shape[-1]
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
        fr = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv.float()
        c, s = fr.cos()[None, :, None, :], fr.sin()[None, :, None, :]
        return rotate(x.float(), c, s, style="half").to(x.dtype)

    assert run(fn, 64).ok
    dg = run(fn, 64, dtype=torch.bfloat16)
    assert "inv_freq_precision" in dg.codes and dg.phase_cause == "inv_freq in bf16", str(dg)
    assert "not_single_axis" not in dg.codes


def _angles(inv: torch.Tensor, L: int = MAXPOS + 1) -> torch.Tensor:
    """Angles of a float32 RoPE with this inv_freq, read back through cos/sin as diagnose does."""
    fr = torch.arange(L, dtype=torch.float32)[:, None] * inv.float()
    return torch.atan2(fr.sin().double(), fr.cos().double())


@pytest.mark.parametrize("d, base", [(64, 1e4), (96, 5e5), (128, 1e6)])
def test_no_rounding_read_into_float32_or_other_ladders(d, base):
    w = frequencies(d, base)[0].double()
    g = torch.Generator().manual_seed(d)
    cases = {
        "float32": w.float(),
        "base 1% off": frequencies(d, 1.01 * base)[0],
        "jitter 1e-3": (w * (1 + 1e-3 * (torch.rand(d // 2, generator=g, dtype=torch.float64) - 0.5))).float(),
    }
    for what, inv in cases.items():
        w_hat, sig = fit_frequencies(_angles(inv))
        assert read_rounding(w_hat, sig, w, base=base) is None, what
    for dt in (torch.bfloat16, torch.float16):  # and the same fit reads the rounded one
        w_hat, sig = fit_frequencies(_angles(w.to(dt)))
        r = read_rounding(w_hat, sig, w, base=base)
        assert r is not None and r.dtype == dt and r.quantity == "inv_freq" and r.ulps <= 0.5 + 1e-3


def test_fit_uncertainty_covers_the_fit_error():
    """The fitted frequencies are within 4 standard errors (plus float32 angle rounding) of the true ones."""
    w = frequencies(64, 1e4)[0].float().double()
    w_hat, sig = fit_frequencies(_angles(w.float()))
    assert bool(((w_hat - w).abs() <= 4 * sig + 4 * 2.0**-24 * w).all())


def test_ulp_includes_subnormals():
    assert float(ulp(torch.tensor([1.0]), torch.bfloat16)) == 2.0**-7
    assert float(ulp(torch.tensor([1.0]), torch.float16)) == 2.0**-10
    assert float(ulp(torch.tensor([1e-6]), torch.float16)) == 2.0**-24  # below 2^-14: the subnormal spacing


@pytest.mark.parametrize("name", ["YARN", "LLAMA3"])
def test_a_rounded_ramp_that_no_ladder_fits_is_still_precision(name):
    """yarn / llama3 inv_freq cast to bf16 matches no ladder (unrecognised), but lies on the bf16 grid: named.
    Float32 ladders no type fits (longrope's random factors) stay correct: the zoo's correct rows."""
    sc = getattr(zoo, name)

    def fn(x):
        inv = frequencies(x.shape[-1], 1e4, rope_scaling=sc)[0].float().to(torch.bfloat16).float()
        fr = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv
        return rotate(x, fr.cos().to(x.dtype)[None, :, None], fr.sin().to(x.dtype)[None, :, None], style="half")

    dg = run(fn, 64)
    assert dg.codes == ["inv_freq_precision"] and dg.ladder_rounding == "inv_freq in bf16", str(dg)
    assert dg.scaling.startswith("unrecognised")
