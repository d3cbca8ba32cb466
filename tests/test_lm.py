"""Notebook 05's language model: corpus as documented, a trained checkpoint, cached decoding = full forward."""

from __future__ import annotations

import math

import pytest

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
