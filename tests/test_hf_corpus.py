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
    elif "per-layer-type defaults of its own" in message:
        # the class nests its default rope dict by layer type, and a layer type's base is not the config's
        cls = transformers.CONFIG_MAPPING[model_type]
        built = cls(**{k: v for k, v in text_part(d).items() if k not in ("model_type", "rope_parameters",
                                                                           "rope_scaling")})
        params = built.rope_parameters
        assert isinstance(params, dict) and all(isinstance(v, dict) for v in params.values())
        theta = text_part(d).get("rope_theta")
        assert any(v.get("rope_theta") != theta for v in params.values())
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


def _kind(d: dict, specs) -> tuple:
    """What a reading exercises: the pairing, the rope types, NoPE layers, a partial rotary slice, different RoPE per
    layer, a composite config."""
    return (specs[0].style, tuple(sorted({s.rope_type for s in specs if not s.is_nope})), any(s.is_nope for s in specs),
            any(s.rotary_dim for s in specs), len(set(specs)) > 1, "text_config" in d)


def _subset() -> list[str]:
    """For CI: the shallowest config of each kind of reading (``_kind``) the corpus holds (the data choose, not a
    list). ``python -m ropelab.conformance.corpus`` runs every config."""
    chosen: dict[tuple, tuple[int, str]] = {}
    for m, d in CORPUS:
        specs, refusal = _ours(d)
        if refusal is not None:
            continue
        key = (len(specs), m["file"])
        kind = _kind(d, specs)
        if kind not in chosen or key < chosen[kind]:
            chosen[kind] = key
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
    if row["status"] == "not covered" and row["reason"].startswith("transformers' model cannot run it"):
        pytest.skip(f"transformers' model does not run at the tiny width: {row['reason']}")  # compared nothing
    assert row["status"] == "agree", (row.get("reason"), bad[:2])
    assert len(row["layers"]) == text_part(d)["num_hidden_layers"]


@needs_version
@pytest.mark.parametrize("model_type", ["deepseek_v2", "hunyuan_v1_dense", "hunyuan_v1_moe", "bamba", "nemotron",
                                        "ministral", "glm4_moe"])
def test_types_the_sweep_could_not_build_are_measured_and_read(model_type):
    """Model types the sweep's tiny configs used to break (sizes the class leaves None, an odd rotary slice, a hybrid
    without attention layers) have a measured entry that agreed with transformers, and their config class's own
    default config reads."""
    rows = json.loads((CORPUS_DIR.parent / "conformance" / f"transformers-{TRANSFORMERS_VERSION}.json").read_text())
    assert rows["models"][model_type]["status"] == "agree"
    assert model_type in CONVENTIONS and model_type not in NOT_COVERED
    config = transformers.AutoConfig.for_model(model_type).to_dict()
    if config["hidden_size"] % config["num_attention_heads"] and config.get("head_dim") is None:
        # GLM-4.5 MoE's class default (4096 / 96 heads) fixes no head size: refused, naming head_dim
        with pytest.raises(ValueError, match="head_dim"):
            RopeSpec.per_layer(config)
        config["head_dim"] = 128
    assert len(RopeSpec.per_layer(config)) == config["num_hidden_layers"]


def test_an_unknown_model_type_keeps_a_clear_refusal():
    d = {"model_type": "no_such_model", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
         "max_position_embeddings": 128, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="is not a model type of transformers .*style="):
        RopeSpec.per_layer(d)
    (spec,) = set(RopeSpec.per_layer(d, style="half"))
    assert spec.base == 1e4
