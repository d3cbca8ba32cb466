"""Notebook 05's language model: corpus as documented, a trained checkpoint, cached decoding = full forward."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab import lm


def test_corpus_is_the_python_reference():
    text = lm.CORPUS.read_text(encoding="utf-8")
    assert 400_000 < len(text) < 600_000
    assert text.startswith('The "assert" statement')
    assert (lm.CORPUS.parent / "LICENSE-PSF.txt").read_text().count("PYTHON SOFTWARE FOUNDATION LICENSE") >= 1
    train, val = lm.load_corpus()
    assert train.numel() + val.numel() == len(text.encode("utf-8"))


@pytest.fixture(scope="module")
def model():
    return lm.load_lm()


def test_checkpoint_is_trained(model):
    """Far below the uniform byte distribution (ln 256 = 5.55 nats) on held-out text, within the trained context."""
    _, val = lm.load_corpus()
    ids = lm.val_windows(val, 4, lm.L0)
    loss = lm.per_position_loss(model, ids, lm.schemes(model.cfg.head_dim)["no scaling"])
    assert float(loss.mean()) < 0.5 * math.log(256)
    assert sum(p.numel() for p in model.parameters()) * 4 < 10e6  # the checkpoint stays under 10 MB


def test_cached_decoding_equals_full_forward_without_length_dependent_scaling(model):
    """With a fixed base every cache policy must reproduce the full forward: the caches differ only in
    how they handle a base that moves."""
    _, val = lm.load_corpus()
    ids = lm.val_windows(val, 2, 40)
    full = lm.per_position_loss(model, ids, {"base": 10000.0, "scaling": None})
    for policy in ("post_rope", "recompute", "rope_on_load"):
        cached = lm.per_position_loss(model, ids, {"base": 10000.0, "scaling": None, "policy": policy},
                                      prompt_len=8)
        assert (cached - full).abs().max() < 1e-4, policy


def test_schemes_switch_rope_without_touching_the_shared_config(model):
    """Every scheme runs the same weights with another RopeSpec passed in; the model's config is unchanged."""
    before = model.cfg
    _, val = lm.load_corpus()
    ids = lm.val_windows(val, 1, 24)
    lm.per_position_loss(model, ids, lm.schemes(model.cfg.head_dim)["linear (PI)"])
    assert model.cfg is before and model.cfg.rope.scaling is None


def test_static_ntk_aware_is_alpha_s_and_dynamic_reaches_s_squared_minus_s_plus_1():
    """Static NTK-aware at alpha = s is 4.39 b (r = 32, s = 4); Hugging Face's dynamic formula at L = s L0 is the
    same expression at alpha = s^2 - s + 1 = 13 (15.4 b), checked against ropelab.scaling and transformers."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ropelab.scaling import ntk_aware_base, ntk_base

    r, s, b = 32, lm.SCALE, 10000.0
    assert abs(ntk_aware_base(b, r, s) / b - 4.0 ** (32 / 30)) < 1e-12 and 4.38 < 4.0 ** (32 / 30) < 4.40
    dyn = ntk_base(b, r, s * lm.L0, lm.L0, s)
    assert abs(dyn / ntk_aware_base(b, r, s * s - s + 1) - 1) < 1e-12 and 15.3 < dyn / b < 15.5
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, head_dim=r, max_position_embeddings=lm.L0,
                      rope_parameters={"rope_type": "dynamic", "factor": s, "rope_theta": b})
    inv_hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=int(s * lm.L0))
    inv = 1.0 / dyn ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    assert torch.allclose(inv_hf.double(), inv, rtol=1e-6)
    assert lm.schemes(r)["NTK-aware"].rope.base == ntk_aware_base(b, r, s)
    with pytest.warns(DeprecationWarning, match="ntk_aware_base"):
        assert lm.static_ntk_base(b, r, s) == ntk_aware_base(b, r, s)  # the deprecated name notebook 05 calls


def test_schemes_are_extends_methods_under_notebook_05s_labels_and_an_explicit_policy_tuple():
    """Notebook 05's schemes, in its order: five methods of ropelab.extend.methods, one full forward each, then
    dynamic NTK under each of lm.CACHE_POLICIES. A policy registered later joins no evaluation."""
    from ropelab import extend, kvcache

    r = 32
    table = extend.methods(lm.SCALE, r, base=10000.0, original=lm.L0)
    got = lm.schemes(r)
    assert list(got) == ["no scaling", "linear (PI)", "NTK-aware", "YaRN", "dynamic NTK, full sequence",
                         *(f"dynamic NTK, cache {p}" for p in lm.CACHE_POLICIES)]
    assert lm.CACHE_POLICIES == ("post_rope", "recompute", "bucketed", "rope_on_load")
    for label, name in lm.METHODS.items():
        assert got[label] == lm.Scheme(table[name], None)
    assert all(got[f"dynamic NTK, cache {p}"] == lm.Scheme(table["dynamic NTK"], p) for p in lm.CACHE_POLICIES)

    @kvcache.register_policy
    class Late(kvcache.PostRope):
        name = "test_late_policy"

    try:
        assert list(lm.schemes(r)) == list(got)
    finally:
        del kvcache.POLICIES["test_late_policy"]


def test_per_position_loss_takes_a_scheme_a_spec_or_a_mapping_alike(model):
    """The three forms of one scheme give the same loss: they put the same base and scaling on the model's RoPE."""
    _, val = lm.load_corpus()
    ids = lm.val_windows(val, 1, 24)
    yarn = lm.schemes(model.cfg.head_dim)["YaRN"]
    a = lm.per_position_loss(model, ids, yarn)
    b = lm.per_position_loss(model, ids, yarn.rope)
    c = lm.per_position_loss(model, ids, {"base": yarn.rope.base, "scaling": dict(yarn.rope.scaling)})
    assert torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(ValueError, match="scheme must be"):
        lm.per_position_loss(model, ids, "YaRN")


def test_bootstrap_intervals_cover_the_mean_and_pair_the_windows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    m, lo, hi = lm.bootstrap_means(x)
    # exact on every CPU: bootstrap_means reports x.mean(0), the same reduction of the same tensor
    assert torch.equal(m, x.mean(0)) and bool(((lo < m) & (m < hi)).all())
    # about 1.96 standard errors each side
    se = x.std(0) / 40**0.5
    assert bool((((hi - lo) / (2 * 1.96 * se) - 1).abs() < 0.25).all())
    with pytest.raises(ValueError, match="2 windows"):
        lm.bootstrap_means(x[:1])
    result = {"window_loss": {"a": x.tolist(), "b": (x + 0.5).tolist()}}
    paired = lm.band_intervals(result, edges=(0, 1, 3), reference="a")
    assert paired["a"] == [(0.0, 0.0, 0.0)] * 2  # a scheme against itself: no spread at all
    assert all(abs(v - 0.5) < 1e-12 for band in paired["b"] for v in band)  # a constant shift is exact when paired
    with pytest.raises(ValueError, match="reference"):
        lm.band_intervals(result, reference="c")


def test_neighbour_intervals_order_only_separated_neighbours():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(30, 8, generator=g, dtype=torch.float64)
    result = {"window_loss": {"a": base.tolist(), "b": (base + 0.5).tolist(),
                              "c": (base + 0.5 + 1e-3 * torch.randn(30, 8, generator=g, dtype=torch.float64)).tolist()}}
    steps = lm.neighbour_intervals(result, ["a", "b", "c"], edges=(0, 4, 8))
    assert [s[:2] for s in steps] == [("a", "b"), ("b", "c")]
    (m, lo, hi) = steps[0][2]
    assert abs(m - 0.5) < 1e-12 and lo > 0  # paired: the window-to-window spread cancels
    assert steps[1][2][1] < 0 < steps[1][2][2]
    text = lm.order_text(steps, {"a": 1.0, "b": 1.5, "c": 1.5})
    assert text == "a 1.00 < b 1.50 ≈ c 1.50"
    with pytest.raises(ValueError, match="not evaluated"):
        lm.neighbour_intervals(result, ["a", "z"])


def test_band_panels_cover_every_interval_and_skip_the_reference_in_its_own_panel():
    import matplotlib

    matplotlib.use("Agg")
    g = torch.Generator().manual_seed(0)
    wl = {"ref": torch.rand(5, 96, generator=g).tolist(), "high": (3 + torch.rand(5, 96, generator=g)).tolist()}
    fig = lm.plot_band_panels(wl, "ref", L0=48, ncol=2)
    ax_ref, ax_high = fig.axes[:2]
    assert len(ax_ref.lines) == 2 and len(ax_high.lines) == 3  # curve + L0 line; + the dashed reference
    _, hi = lm.bootstrap_means(lm.smooth_positions(torch.tensor(wl["high"]))[0])[1:]
    assert ax_high.get_ylim()[1] >= float(hi.max())
    with pytest.raises(ValueError, match="reference"):
        lm.plot_band_panels(wl, "missing")


def test_span_means_and_paired_intervals_keep_windows_paired():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(40, 12, generator=g, dtype=torch.float64)
    result = {"window_loss": {"a": base.tolist(), "b": (base + 0.5).tolist()}}
    spans = lm.span_means(result, 4, 8)
    assert torch.allclose(spans["a"], base[:, 4:8].mean(1))
    paired = lm.paired_intervals(spans, reference="a")["b"]
    # b - a is 0.5 in every window: the paired interval has no width beyond float64 round-off
    assert paired[0] == pytest.approx(0.5) and paired[2] - paired[1] < 1e-12
    unpaired = lm.paired_intervals(spans)["b"]
    assert unpaired[2] - unpaired[1] > 0.1
    with pytest.raises(ValueError, match="not inside"):
        lm.span_means(result, 8, 13)
    with pytest.raises(ValueError, match="reference"):
        lm.paired_intervals(spans, reference="c")
    with pytest.raises(ValueError, match="same windows"):
        lm.paired_intervals({"a": torch.zeros(3), "b": torch.zeros(4)})
