"""Published config.json files (data/configs) read as transformers reads them.

Every corpus config is read by ``RopeSpec.per_layer`` and checked against transformers' own config class on the same
dict (base, rope type, scaling values, rotary share per layer), or its refusal is checked to name a true reason. A
subset (the shallowest config of each model type ropelab reads) also runs transformers' model at a tiny width with
depth, head size and RoPE keys kept, compared per layer with ropelab's rotation (``ropelab.conformance.corpus``);
``python -m ropelab.conformance.corpus`` runs the whole corpus that way.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from ropelab.conformance.corpus import CORPUS_DIR, load_corpus
from ropelab.conformance.hf_config_rules import MODEL_TYPES, NOT_COVERED
from ropelab.conformance.hf_table import CONVENTIONS, TRANSFORMERS_VERSION
from ropelab.spec import RopeSpec, head_dim_of, text_part

transformers = pytest.importorskip("transformers")
needs_version = pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                                   reason="the measured tables are for another transformers")

CORPUS = load_corpus()
NAMES = [m["file"] for m, _ in CORPUS]
BY_NAME = {m["file"]: (m, d) for m, d in CORPUS}


def test_the_manifest_names_every_file_and_where_it_was_read():
    files = sorted(p.name for p in CORPUS_DIR.glob("*.json") if p.name != "manifest.json")
    assert sorted(NAMES) == files
    assert len(files) >= 100
    for m, _ in CORPUS:
        src = m["source"]
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["repo"].count("/") == 1
        assert src["url"] == f"https://github.com/{src['repo']}/blob/{src['commit']}/{src['path']}"
        assert hashlib.sha256((CORPUS_DIR / m["file"]).read_bytes()).hexdigest() == m["sha256"]


def _ours(d: dict):
    try:
        return RopeSpec.per_layer(d), None
    except ValueError as e:
        return None, str(e)


def _check_refusal(d: dict, message: str) -> None:
    """The refusal names a reason that holds: checked against transformers and the measured tables."""
    model_type = text_part(d)["model_type"]
    if "is not a model type of transformers" in message:
        assert model_type not in transformers.CONFIG_MAPPING and model_type not in MODEL_TYPES
    elif "the conformance sweep could not compare" in message:
        assert model_type in NOT_COVERED and model_type not in CONVENTIONS
        assert NOT_COVERED[model_type] in message
    elif "multi-axis (M-RoPE" in message:
        params = json.dumps(text_part(d).get("rope_parameters") or text_part(d).get("rope_scaling"))
        assert "mrope_section" in params
    elif "pair dims differently" in message:
        assert "rotations" in CONVENTIONS[model_type]
    elif "which RopeSpec cannot represent" in message:
        assert CONVENTIONS[model_type]["style"] not in ("half", "interleaved")
    else:
        pytest.fail(f"a refusal with no checked reason: {message}")


@needs_version
@pytest.mark.parametrize("name", NAMES)
def test_reading_matches_the_config_class(name):
    """Per layer, ropelab's base, rope type, scaling values and rotary share are the ones transformers' config class
    makes of the same dict (AutoConfig.for_model); a refusal names a reason that holds."""
    from ropelab.conformance.corpus import class_reading

    _, d = BY_NAME[name]
    specs, refusal = _ours(d)
    if refusal is not None:
        _check_refusal(d, refusal)
        return
    text = text_part(d)
    theirs = class_reading(d)
    assert len(theirs) == len(specs)
    conv = CONVENTIONS[text["model_type"]]
    head_dim = head_dim_of({**text, **{k: text[v] for k, v in conv.get("aliases", {}).items() if v in text}})
    for i, (spec, params) in enumerate(zip(specs, theirs)):
        if spec.is_nope or params is None:
            continue
        where = f"layer {i}"
        assert spec.base == float(params["rope_theta"]), where
        assert spec.rope_type == params.get("rope_type", params.get("type", "default")), where
        for key, value in (spec.scaling or {}).items():
            if key not in ("type", "rope_type"):
                assert params.get(key) == value, (where, key)
        share = params.get("partial_rotary_factor")
        reads_share = "partial_rotary_factor" not in conv.get("ignored_keys", ()) and spec.rope_type != "proportional"
        if share is not None and reads_share:
            assert (spec.rotary_dim or head_dim) == int(head_dim * share), where


def _subset() -> list[str]:
    """The shallowest config of each (text) model type ropelab reads: every model type of the corpus, at the least
    depth it has (the data choose, not a list)."""
    chosen: dict[str, tuple[int, str]] = {}
    for m, d in CORPUS:
        if _ours(d)[1] is not None:
            continue
        text = text_part(d)
        key = (text.get("num_hidden_layers") or 0, m["file"])
        if text["model_type"] not in chosen or key < chosen[text["model_type"]]:
            chosen[text["model_type"]] = key
    return sorted(name for _, name in chosen.values())


@needs_version
@pytest.mark.parametrize("name", _subset())
def test_the_model_rotates_as_ropelab_reads(name):
    """transformers' model of the config at a tiny width (depth, head size, RoPE keys kept) rotates q and k in every
    layer as apply_rope does with ropelab's spec for that layer, within the float32 bound; shrinking changed no
    layer's spec."""
    import torch

    from ropelab.conformance.corpus import compare_config, shrink

    torch.set_num_threads(1)
    _, d = BY_NAME[name]
    tiny = shrink(d)
    assert RopeSpec.per_layer(tiny) == RopeSpec.per_layer(d)
    row = compare_config(tiny)
    bad = [lay for lay in row.get("layers", []) if lay["status"] != "agree"]
    assert row["status"] == "agree", (row.get("reason"), bad[:2])
    assert len(row["layers"]) == text_part(d)["num_hidden_layers"]
