"""Model types the conformance sweep once left to a refusal of ropelab's own, rerun against transformers' code (the
default variant only, to keep CI short): the M-RoPE text path, a layer with two rotation functions of different
pairings, proportional RoPE measured as the half pairing it is; and the refusals that stay, checked true against
transformers' rotation functions."""

from __future__ import annotations

import functools
import importlib
import json

import pytest
import torch

from ropelab import apply_rope
from ropelab.conformance.hf_table import CONVENTIONS, TRANSFORMERS_VERSION
from ropelab.spec import RopeSpec

transformers = pytest.importorskip("transformers")
from ropelab.conformance import sweep as conformance  # noqa: E402
from ropelab.conformance.records import _without_inner_keyword_calls  # noqa: E402

pytestmark = pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                                reason="the committed table is for another transformers; rerun make conformance")


@functools.cache
def _discovered() -> dict:
    return conformance.discover()


def _row(model_type: str) -> dict:
    torch.set_num_threads(1)
    return conformance.sweep_model_type(model_type, _discovered()[model_type], diagnose=False, only_default=True)


def _layers(row: dict) -> list[dict]:
    return row["variants"]["default"]["layers"]


def test_an_mrope_text_model_is_compared_through_the_mrope_reader_on_text_tokens():
    """Cosmos 3 Edge's text model keeps mrope_section in its rope dict (per_layer refuses it); on text tokens every
    axis is equal, and ``read_config``'s specs agree with transformers, the row saying the sections are unchecked."""
    with pytest.raises(ValueError, match="multi-axis"):
        RopeSpec.per_layer(transformers.AutoConfig.for_model("cosmos3_edge_text").to_dict())
    row = _row("cosmos3_edge_text")
    assert row["status"] == "agree", row.get("reason")
    default = row["variants"]["default"]
    assert "not the sections" in default["mrope"] and "[24, 20, 20]" in default["mrope"]
    assert all(lay["status"] == "agree" and lay["error_over_bound"] <= 1 for lay in _layers(row))


def test_a_layer_with_two_pairings_is_compared_per_rotation_function():
    """AXK2's sparse-attention indexer pairs half, its main attention interleaved (measured): each function's calls
    agree with ``per_layer(config, style=)`` of its own pairing, in every layer; per_layer without style= refuses."""
    assert set(CONVENTIONS["axk2"]["rotations"].values()) == {"half", "interleaved"}
    with pytest.raises(ValueError, match="pair dims"):
        RopeSpec.per_layer(transformers.AutoConfig.for_model("axk2").to_dict())
    row = _row("axk2")
    assert row["status"] == "agree" and row["table"] == "matches"
    fns = set(CONVENTIONS["axk2"]["rotations"])
    for lay in _layers(row):
        assert lay["rotations"] == {fn: "agree" for fn in fns} and lay["error_over_bound"] <= 1


def test_proportional_rope_is_measured_as_the_half_pairing_and_agrees():
    """LFM3's full-attention layers run proportional RoPE (a share of the pairs turning, the rest at frequency 0), its
    sliding ones default RoPE over the whole head: the fresh measurement is the half pairing with zero-frequency pairs
    (the committed entry), and every layer agrees, the conv layers as NoPE."""
    row = _row("lfm3")
    assert row["status"] == "agree", row.get("reason")
    assert json.loads(json.dumps(conformance.table_entry(row["convention"]))) == CONVENTIONS["lfm3"]
    assert CONVENTIONS["lfm3"]["style"] == "half" and CONVENTIONS["lfm3"]["zero_frequency_pairs"] > 0
    specs = [lay["spec"] for lay in _layers(row)]
    assert any((s["scaling"] or {}).get("rope_type") == "proportional" for s in specs)
    assert any(s["rotary_dim"] == 0 for s in specs)


def test_keyword_only_calls_inside_a_recorded_call_are_dropped_and_the_others_kept():
    x = torch.ones(1, 3, 2, 4)
    outer = {"layer": 0, "fn": None, "args": (x,), "kwargs": {}, "out": x, "inside": False}
    inner = {"layer": 0, "fn": None, "args": (), "kwargs": {"x": x}, "out": x, "inside": True}
    alone = {**inner, "inside": False}
    assert _without_inner_keyword_calls({"calls": [inner, outer]})["calls"] == [outer]
    assert _without_inner_keyword_calls({"calls": [alone, outer]})["calls"] == [alone, outer]


def test_nanochat_rotates_by_minus_m_omega_as_its_refusal_says():
    """NanoChat's ``rotate_half`` flips the signs, so its rotation is R(-m w): the reflection of standard RoPE
    (negate the second dim of each pair, rotate, negate back), not RoPE itself, which no RopeSpec style holds."""
    module = importlib.import_module("transformers.models.nanochat.modeling_nanochat")
    assert CONVENTIONS["nanochat"]["direction"] == -1
    with pytest.raises(ValueError, match="-m\\*omega"):
        RopeSpec.per_layer({"model_type": "nanochat", "num_hidden_layers": 1, "hidden_size": 64,
                            "num_attention_heads": 2, "max_position_embeddings": 64, "rope_theta": 10000.0})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 5, 32, generator=g, dtype=torch.float64)
    pos = torch.tensor([0, 1, 3, 17, 40])
    spec = RopeSpec(base=10000.0)
    inv_freq, _ = spec.frequencies(32)
    ang = pos[:, None].double() * inv_freq
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[None], torch.cat([ang.sin(), ang.sin()], -1)[None]
    theirs, _ = module.apply_rotary_pos_emb(x, x, cos, sin)
    flip = torch.cat([torch.ones(16), -torch.ones(16)]).double()
    mirrored = apply_rope(x * flip, pos, layout="b h s d", spec=spec) * flip
    bound = 64 * 2.0 ** -53 * (1 + pos.max().item())
    assert (theirs - mirrored).abs().max() <= bound
    assert (theirs - apply_rope(x, pos, layout="b h s d", spec=spec)).abs().max() > 0.1


def test_deepseek_v4_rotates_the_trailing_slice_of_the_head_as_its_refusal_says():
    """DeepSeek-V4's ``apply_rotary_pos_emb`` rotates the last 2 * pairs dims of the head it is handed and passes the
    leading ones through (its heads are [nope | rope]); a RopeSpec rotates a leading slice, so per_layer refuses."""
    module = importlib.import_module("transformers.models.deepseek_v4.modeling_deepseek_v4")
    assert CONVENTIONS["deepseek_v4"]["style"].startswith("other: rotating dims [448")
    x = torch.randn(1, 1, 3, 512, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ang = torch.arange(3, dtype=torch.float64)[:, None] * torch.rand(32, dtype=torch.float64)
    y = module.apply_rotary_pos_emb(x, ang.cos()[None], ang.sin()[None])
    assert torch.equal(y[..., :448], x[..., :448])
    assert (y[..., 448:] - x[..., 448:]).abs().max() > 1e-3
