"""The conformance sweep (ropelab.conformance): the committed table, its convention table, and a CI subset that
reruns one model type of every convention class the full sweep found against transformers' own code."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from ropelab import apply_rope
from ropelab.hf_conventions import CONVENTIONS, TRANSFORMERS_VERSION
from ropelab.spec import RopeSpec

transformers = pytest.importorskip("transformers")
from ropelab import conformance  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "conformance"
TABLE = DATA / f"transformers-{TRANSFORMERS_VERSION}.json"


def _table() -> dict:
    return json.loads(TABLE.read_text())


def test_committed_table_is_for_the_convention_table_and_has_no_disagreement():
    table = _table()
    assert table["transformers"] == TRANSFORMERS_VERSION
    assert json.loads(json.dumps(CONVENTIONS)) == table["conventions"]  # generated together, kept in step
    assert table["counts"]["disagree"] == 0
    assert sum(table["counts"].values()) == len(table["models"]) == table["discovered"]
    for mt, row in table["models"].items():
        assert row["status"] == "agree" or row.get("reason"), mt  # every uncovered model type says why


def _convention_class(conv: dict) -> tuple:
    return (conv["style"], conv.get("rotary_fraction", 1.0) < 1, bool(conv.get("nope_layer_types")),
            "output_permutation" in conv, "aliases" in conv, "v4" in conv, "fixed_base" in conv)


def _subset() -> list[str]:
    """One covered model type per convention class of the committed table (the classes come from the data)."""
    table = _table()
    chosen: dict[tuple, str] = {}
    for mt, row in sorted(table["models"].items()):
        if row["status"] == "agree" and mt in CONVENTIONS:
            key = _convention_class(CONVENTIONS[mt])
            nope_field = any(lay.get("transformers") for v in row["variants"].values() for lay in v.get("layers", []))
            chosen.setdefault(key + (nope_field,), mt)
    return sorted(chosen.values())


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", _subset() if TABLE.exists() else [])
def test_subset_agrees_with_transformers(model_type):
    torch.set_num_threads(1)
    found = conformance.discover()
    row = conformance.sweep_model_type(model_type, found[model_type])
    bad = {n: [lay for lay in v.get("layers", []) if lay["status"] == "disagree"] for n, v in row["variants"].items()}
    assert row["status"] == "agree", {n: b[:2] for n, b in bad.items() if b}


def test_nope_spec_is_identity_through_apply_rope():
    spec = RopeSpec.nope(4096)
    assert spec.is_nope and spec.rotary_dim == 0
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    assert torch.equal(apply_rope(x, layout="b s h d", spec=spec), x)
    inv, af = spec.frequencies(8)
    assert inv.numel() == 0 and af == 1.0
    with pytest.raises(ValueError, match="no scaling"):
        RopeSpec(rotary_dim=0, scaling={"rope_type": "linear", "factor": 2.0})


BASE = {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 64,
        "rope_theta": 1e4}


def test_unknown_or_missing_model_type_raises_naming_it_unless_style_is_given():
    with pytest.raises(ValueError, match="'not_a_model'.*convention table"):
        RopeSpec.per_layer({**BASE, "model_type": "not_a_model"})
    with pytest.raises(ValueError, match="None.*convention table"):
        RopeSpec.per_layer(BASE)
    assert RopeSpec.from_hf_config(BASE, style="interleaved").style == "interleaved"


def test_families_ropelab_cannot_represent_raise_naming_the_model_type():
    unrepresentable = [mt for mt, c in CONVENTIONS.items()
                       if c.get("direction", 1) != 1 or c["style"] not in ("half", "interleaved")]
    for mt in unrepresentable:
        with pytest.raises(ValueError, match=repr(mt)):
            RopeSpec.per_layer({**BASE, "model_type": mt})


def test_no_rope_layers_and_measured_nope_layer_types_give_identity_layers():
    specs = RopeSpec.per_layer({**BASE, "model_type": "llama", "no_rope_layers": [1, 1, 1, 0]})
    assert [s.is_nope for s in specs] == [False, False, False, True]
    nope_types = {mt: c["nope_layer_types"] for mt, c in CONVENTIONS.items() if c.get("nope_layer_types")}
    for mt, types in list(nope_types.items())[:3]:
        layer_types = ["sliding_attention", *types, "sliding_attention", *types][:4]
        try:
            specs = RopeSpec.per_layer({**BASE, "model_type": mt, "layer_types": layer_types})
        except ValueError:
            continue  # a family whose config needs more keys than this sketch has
        assert all(s.is_nope == (t in types) for s, t in zip(specs, layer_types)), mt


def test_deprecated_interleaved_list_warns_and_is_measured():
    import ropelab.spec

    with pytest.warns(DeprecationWarning):
        interleaved = ropelab.spec.INTERLEAVED_MODEL_TYPES
    assert interleaved == {mt for mt, c in CONVENTIONS.items() if c["style"] == "interleaved"}
