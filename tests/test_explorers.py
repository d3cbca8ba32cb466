"""The notebook explorers: their numbers against independent float64 formulas, their errors, their figures
and widgets, and that an update draws what its compute function returns. How long an update takes is a
benchmark (`python -m ropelab.bench explorers`), not a test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropelab import bench, cope, decay, explorers, extend, precision, staleness
from ropelab.kernels import traffic
from ropelab.machine import one_thread
from ropelab.precision import phase_error as precision_phase_error
from ropelab.scaling import frequencies


def _theta(d, base):
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


# ---------------------------------------------------------------------------------------------- ladder


def test_ladder_matches_the_closed_forms():
    out = precision.ladder(base=10000.0, head_dim=128, position=4096, dtype="float64")
    np.testing.assert_allclose(out["inv_freq"], _theta(128, 10000.0).numpy(), rtol=1e-15)
    np.testing.assert_allclose(out["wavelength"] * out["inv_freq"], 2 * math.pi, rtol=1e-15)
    np.testing.assert_allclose(out["angle"], 4096 * _theta(128, 10000.0).numpy(), rtol=1e-15)
    # exact on every CPU: at float64 the held angle is the same float64 product as the reference angle
    assert not out["phase_error"].any() and np.array_equal(out["angle_dtype"], out["angle"])
    # pair i has turned once when 2 pi b^(2i/d) <= m: i <= (d/2) log(m / 2pi) / log b
    assert out["turned"].sum() == math.floor(64 * math.log(4096 / (2 * math.pi)) / math.log(10000.0)) + 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_ladder_low_precision_error_is_the_precision_modules(dtype):
    out = precision.ladder(base=10000.0, head_dim=64, position=1000, dtype=dtype)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ref = precision_phase_error(torch.tensor([1000]), frequencies(64, 10000.0)[0], where="all", dtype=torch_dtype)
    # exact on every CPU: the explorer calls this function with these arguments, in one process
    np.testing.assert_array_equal(out["phase_error"], ref[0].numpy())
    assert out["phase_error"].max() > 0
    wrapped = np.abs(np.remainder(out["angle_dtype"] - out["angle"] + np.pi, 2 * np.pi) - np.pi)
    np.testing.assert_allclose(wrapped, out["phase_error"], atol=1e-12)


# ----------------------------------------------------------------------------------------------- decay


def test_decay_values_at_zero_and_the_first_negative_distance():
    out = decay.decay_view(base=10000.0, head_dim=128, distance=2000, n_points=2001, n_pairs=8)
    # exact on every CPU: integer distances
    assert np.array_equal(out["r"], np.arange(2001))
    assert out["envelope"][0] == pytest.approx(32.5, abs=1e-12)  # (1/64) sum_{j=1}^{64} j
    assert out["aligned"][0] == pytest.approx(128.0, abs=1e-12)  # 2 B_0 = d
    b = torch.cos(torch.arange(2001, dtype=torch.float64)[:, None] * _theta(128, 10000.0)).sum(-1)
    np.testing.assert_allclose(out["aligned"], 2 * b.numpy(), atol=1e-9)
    assert out["first_negative"] == int((b < 0).nonzero()[0, 0]) == 1707  # Men et al.'s bound at base 1e4
    coarse = decay.decay_view(base=10000.0, head_dim=128, distance=4096, n_points=256, n_pairs=8)
    assert coarse["first_negative"] == 1707  # on every integer, not on the plotted grid
    assert decay.decay_view(base=1e6, head_dim=128, distance=4096, n_points=16, n_pairs=2)["first_negative"] is None


def test_decay_gaussian_logits_do_not_decay():
    out = decay.decay_view(base=10000.0, head_dim=64, distance=4096, n_points=64, n_pairs=2000)
    # std of <R q, k> for independent unit normals is sqrt(d) = 8; the sample std of 2000 pairs has a
    # standard error of about 8 / sqrt(4000) = 0.13, so 5 standard errors is 0.65.
    assert np.abs(out["gaussian_std"] - 8.0).max() < 0.65
    # the mean's standard error is 8 / sqrt(2000) = 0.18; 5 of them is 0.9, far below the aligned 2 B_0 = 64
    assert np.abs(out["gaussian_mean"]).max() < 0.9


# ------------------------------------------------------------------------------------------- ntk drift


def test_ntk_drift_is_zero_within_the_trained_context_and_grows_past_it():
    inside = staleness.ntk_drift(length=256, head_dim=64, original_length=256, factor=4.0)
    assert not inside["phase_error"].any() and inside["base_now"] == 10000.0
    out = staleness.ntk_drift(length=1024, head_dim=64, original_length=256, factor=4.0)
    assert out["phase_error"].shape == (1024, 32)
    assert not out["phase_error"][0].any()  # the key at position 0 has angle 0 in every frame
    assert 0 < out["frac_over_half_pi"] < 1
    assert out["wrapped"].min() >= 0 and out["wrapped"].max() <= math.pi
    np.testing.assert_allclose(np.cos(out["wrapped"]), np.cos(out["phase_error"]), atol=1e-9)
    assert out["frac_over_half_pi"] == pytest.approx(float((np.cos(out["phase_error"]) < 0).mean()), abs=1e-3)
    # b(L) = b (s L / L0 - (s - 1))^(d / (d - 2))
    assert out["base_now"] == pytest.approx(10000.0 * (4 * 1024 / 256 - 3) ** (64 / 62), rel=1e-12)
    # the error of key m at length L is m (w_i(L) - w_i(m + 1)), here checked for one key directly
    m = 700
    now = frequencies(64, out["base_now"])[0]
    then = frequencies(64, 10000.0 * (4 * (m + 1) / 256 - 3) ** (64 / 62))[0]
    np.testing.assert_allclose(out["phase_error"][m], (m * (now - then)).numpy(), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------- CoPE gates


def test_cope_gates_count_what_the_rule_picks():
    text = "ab  c, d"
    out = cope.cope_gates(text, count="symbols (not blanks or punctuation)", sharpness=40.0)
    counted = np.array([c.isalnum() for c in text], dtype=float)
    s = len(text)
    # seen from the last query, key j is at the number of counted tokens from j to the end
    np.testing.assert_allclose(out["positions"][-1], np.cumsum(counted[::-1])[::-1], atol=1e-12)
    np.testing.assert_allclose(out["gates"][-1], counted, atol=1e-12)
    assert not np.triu(out["positions"], 1).any() and not np.triu(out["gates"], 1).any()
    every = cope.cope_gates(text, count="every token", sharpness=40.0)
    np.testing.assert_allclose(every["positions"], every["token_distance"], atol=1e-12)
    half = cope.cope_gates(text, count="vowels", sharpness=0.0)  # every gate is 1/2
    np.testing.assert_allclose(half["positions"], half["token_distance"] / 2, atol=1e-15)
    assert out["tokens"] == list(text) and out["positions"].shape == (s, s)


# -------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: precision.ladder(head_dim=63), "even"),
        (lambda: precision.ladder(dtype="int8"), "dtype must be one of"),
        (lambda: precision.ladder(base=1.0), "base must be"),
        (lambda: precision.ladder(position=-1), "position must be an int"),
        (lambda: decay.decay_view(distance=0), "distance must be an int"),
        (lambda: staleness.ntk_drift(factor=0.5), "factor must be"),
        (lambda: extend.extension_ratios(factor=0.5), "factor must be"),
        (lambda: extend.extension_ratios(head_dim=30, original_length=4), "original_length must be"),
        (lambda: cope.cope_gates(""), "non-empty string"),
        (lambda: cope.cope_gates("abc", count="letters"), "count must be one of"),
        (lambda: cope.cope_gates("abc", sharpness=-1), "sharpness"),
        (lambda: explorers.LadderExplorer(bass=3.0), "unknown parameters"),
        (lambda: explorers.DecayExplorer().update(head_dim=3), "even"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------- figures and widgets

ALL = [explorers.LadderExplorer, explorers.DecayExplorer, explorers.DriftExplorer, explorers.ExtensionExplorer,
       explorers.CoPEExplorer, explorers.BytesExplorer]

# Moves across each control's range, extremes included (the benchmark's moves: what a student can reach).
MOVES = {cls: bench.EXPLORER_MOVES[cls.__name__] for cls in ALL}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_update_draws_a_new_png_and_save_is_byte_stable(cls, tmp_path):
    ex = cls()
    first = ex.update()
    assert first.startswith(b"\x89PNG")
    assert ex.update(**MOVES[cls][0]) != first
    a = [p.read_bytes() for p in ex.save(tmp_path / "a")]
    ex.update(**MOVES[cls][1])
    b = [p.read_bytes() for p in cls().save(tmp_path / "b")]
    assert a == b and b"Date" not in a[1]
    assert ex.update(**cls.defaults) == cls().update()


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_widget_redraws_when_a_control_moves_and_reports_bad_input(cls):
    ex = cls()
    box = ex.widget()
    image, message = box.children[-1], box.children[-2]
    for key, value in MOVES[cls][0].items():
        before = image.value
        ex.widgets[key].value = value
        assert image.value != before and message.value == ""
    if cls is explorers.CoPEExplorer:
        shown = image.value
        ex.widgets["text"].value = ""  # an empty sequence: the error is shown, the last figure stays
        assert "non-empty" in message.value and image.value == shown


def _drawn(ex) -> list[tuple[np.ndarray, np.ndarray]]:
    """(what the figure shows, what the compute function returns for ex.params) pairs, per explorer."""
    p = ex.params
    if isinstance(ex, explorers.LadderExplorer):
        out = precision.ladder(**p)
        pairs = [(ex.wave.get_ydata(), out["wavelength"]), (ex.err.get_ydata(), np.maximum(out["phase_error"], 1e-17))]
        for n, i in enumerate((0, p["head_dim"] // 8, p["head_dim"] // 4, p["head_dim"] // 2 - 1)):
            pairs.append((ex.exact[n].get_xydata()[1], [np.cos(out["angle"][i]), np.sin(out["angle"][i])]))
        return pairs
    if isinstance(ex, explorers.DecayExplorer):
        out = decay.decay_view(**p)
        return [(ex.env.get_ydata(), out["envelope"]), (ex.aligned.get_ydata(), out["aligned"]),
                (ex.gauss.get_ydata(), out["gaussian_mean"])]
    if isinstance(ex, explorers.DriftExplorer):
        out = staleness.ntk_drift(**p)
        worst = np.maximum(np.abs(out["phase_error"]).max(0), 1e-12)
        # the image holds, per block of keys, the largest wrapped error: its maximum is the largest of all
        return [(ex.worst.get_ydata(), worst), (np.max(ex.im.get_array()), out["wrapped"].max())]
    if isinstance(ex, explorers.ExtensionExplorer):
        out = extend.extension_ratios(**p)
        return [(ex.lines[n].get_ydata(), out["ratio"][n]) for n in ex.lines] + [
            (ex.reach[n].get_ydata(), p["factor"] * out["ratio"][n]) for n in ex.reach]
    if isinstance(ex, explorers.CoPEExplorer):
        out = cope.cope_gates(**p)
        return [(ex.gate.get_ydata(), out["gates"][-1]), (ex.pos.get_ydata(), out["positions"][-1]),
                (ex.dist.get_ydata(), out["token_distance"][-1])]
    if isinstance(ex, explorers.BytesExplorer):
        out = traffic.bytes_view(**p)
        copy = sum(out["copy"])
        keys = [k for k, _ in ex._BARS]
        return [([b.get_height() for b in ex.read], [out[k][0] / copy for k in keys]),
                ([b.get_height() for b in ex.written], [out[k][1] / copy for k in keys]),
                ([b.get_y() for b in ex.written], [out[k][0] / copy for k in keys])]
    raise AssertionError(f"no check for {type(ex).__name__}")


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_an_update_draws_what_its_compute_function_returns(cls):
    """Every move a student can reach redraws the figure from the compute function at exactly the moved
    parameters (the others at their defaults): recomputed the same way (one thread), the numbers are the same."""
    ex = cls()
    for move in MOVES[cls]:
        ex.update(**cls.defaults)
        ex.update(**move)
        assert ex.params == {**cls.defaults, **move}
        with one_thread():  # as Explorer.render computes: the same operations on one thread round alike
            drawn = _drawn(ex)
        for shown, computed in drawn:
            np.testing.assert_array_equal(np.asarray(shown, dtype=float), np.asarray(computed, dtype=float))
