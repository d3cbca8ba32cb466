"""The conformance sweep (ropelab.conformance): the committed table, its convention table, and a CI subset that
reruns one model type of every convention class the full sweep found against transformers' own code, and checks
that a fresh measurement of its conventions equals the committed table."""

from __future__ import annotations

import functools
import json
import pathlib
import re

import pytest
import torch

from ropelab import apply_rope
from ropelab.conformance.hf_table import CONVENTIONS, TRANSFORMERS_VERSION
from ropelab.spec import RopeSpec, hf_config_notes

transformers = pytest.importorskip("transformers")
from ropelab.conformance import sweep as conformance  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "conformance"
TABLE = DATA / f"transformers-{TRANSFORMERS_VERSION}.json"


@functools.cache
def _table() -> dict:
    return json.loads(TABLE.read_text())


@functools.cache
def _discovered() -> dict:
    return conformance.discover()


def test_committed_table_is_for_the_convention_table_and_has_no_disagreement():
    table = _table()
    assert table["transformers"] == TRANSFORMERS_VERSION
    assert json.loads(json.dumps(CONVENTIONS)) == table["conventions"]  # generated together, kept in step
    assert table["counts"]["disagree"] == 0
    assert sum(table["counts"].values()) == len(table["models"]) == table["discovered"]
    for mt, row in table["models"].items():
        assert row["status"] == "agree" or row.get("reason"), mt  # every uncovered model type says why
    # every row was compared against the table committed now (a row measured against an older one was rerun)
    stale = table["convention_table"]
    assert not stale["measured_differs_from_committed"] and not stale["absent_from_committed"], stale


def test_counts_are_those_of_the_rows():
    table = _table()
    again = conformance.summarise(table["models"], dict.fromkeys(range(table["discovered"])), table["transformers"],
                                  seconds=table["seconds"], cpu_seconds=table["cpu_seconds"])
    for key in ("counts", "not_covered_by_reason", "variants_of_compared_types", "convention_table", "diagnose"):
        assert again[key] == table[key], key
    assert sum(table["not_covered_by_reason"].values()) == table["counts"]["not covered"]


def test_composite_rows_name_sub_config_types_and_count_as_composite_only_where_one_was_compared():
    """"composite config" is a true reason only where a sub-config's model type was itself compared; the others
    are counted apart. The sub-config types are those of the installed config class's default instance."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import _sub_config_types
    from ropelab.conformance.report import COMPOSITE, COMPOSITE_UNCOMPARED

    rows = _table()["models"]
    composite = {mt: r for mt, r in rows.items()
                 if r["status"] == "not covered" and r["reason"].startswith("composite")}
    # none since composites are run whole (test_composite_rows_say_what_the_code_gives_now_at_config_level)
    compared = 0
    for mt, r in composite.items():
        subs = r["sub_config_types"]
        assert subs == _sub_config_types(CONFIG_MAPPING[mt]), mt
        compared += any(rows.get(t, {}).get("status") in ("agree", "disagree") for t in subs.values())
    counts = _table()["not_covered_by_reason"]
    assert counts.get(COMPOSITE, 0) == compared
    assert counts.get(COMPOSITE, 0) + counts.get(COMPOSITE_UNCOMPARED, 0) == len(composite)


def test_config_only_model_types_run_the_module_automodel_maps_them_to():
    """A model type whose folder has no modeling file (EXAONE's config reuses Llama's model) is run through the
    module of its AutoModel class; a folder with a modeling file keeps its own."""
    from ropelab.conformance.records import modeling_module

    assert modeling_module("exaone", "exaone").__name__ == "transformers.models.llama.modeling_llama"
    assert modeling_module("llama", "llama").__name__ == "transformers.models.llama.modeling_llama"
    with pytest.raises(ModuleNotFoundError):
        modeling_module("no_such_type", "no_such_type")


def test_a_default_that_opts_out_of_rope_is_run_with_the_models_own_switch_and_attention_layers():
    """GraniteMoeHybrid's default has no attention layer and position_embedding_type=None: the tiny config makes
    odd layers attend, and the switch value is the one its modeling code compares with (read, not typed in)."""
    import importlib

    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import _rope_switch

    cls = CONFIG_MAPPING["granitemoehybrid"]
    kw = conformance.tiny_kwargs(cls)
    assert "full_attention" in cls(**kw).layer_types and "linear_attention" in cls(**kw).layer_types
    module = importlib.import_module("transformers.models.granitemoehybrid.modeling_granitemoehybrid")
    assert _rope_switch(cls, module) == "rope"
    assert _rope_switch(CONFIG_MAPPING["llama"], module) is None  # no such key in the config class


def _convention_class(conv: dict) -> tuple:
    v4 = conv.get("v4", {})
    return (conv["style"], conv.get("rotary_fraction", 1.0) < 1, bool(conv.get("nope_layer_types")),
            "output_permutation" in conv, "aliases" in conv, "scaled_layer_types" in v4, "ignored_keys" in v4,
            "fixed_base" in conv, "ignored_keys" in conv, "rotations" in conv, conv.get("direction", 1),
            "axes" in conv)


def _subset() -> list[str]:
    """The quickest model type of each convention class of the committed table (the classes come from the data),
    among the rows that agree and those ropelab refuses with a ValueError of its own."""
    table = _table()
    chosen: dict[tuple, tuple[float, str]] = {}
    for mt, row in sorted(table["models"].items()):
        refused = row["status"] == "not covered" and row["reason"].startswith("ropelab: ValueError")
        if (row["status"] == "agree" or refused) and mt in CONVENTIONS:
            nope_field = any(lay.get("transformers") for v in row["variants"].values() for lay in v.get("layers", []))
            key = _convention_class(CONVENTIONS[mt]) + (nope_field, row["status"])
            if key not in chosen or row.get("seconds", 1e9) < chosen[key][0]:
                chosen[key] = (row.get("seconds", 1e9), mt)
    return sorted(mt for _, mt in chosen.values())


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", _subset() if TABLE.exists() else [])
def test_subset_agrees_with_transformers(model_type):
    torch.set_num_threads(1)
    committed = _table()["models"][model_type]
    refused = committed["status"] == "not covered"  # refused on the default config: the other variants add nothing
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], diagnose=False, only_default=refused)
    if refused:
        committed = {**committed, "variants": {"default": committed["variants"]["default"]}}
    # the pairing check is independent: the comparison used the committed table, this is a fresh measurement
    assert json.loads(json.dumps(conformance.table_entry(row["convention"]))) == CONVENTIONS[model_type]
    assert row["table"] == "matches"
    bad = {n: [lay for lay in v.get("layers", []) if lay["status"] == "disagree"] for n, v in row["variants"].items()}
    assert row["status"] == committed["status"], {n: b[:2] for n, b in bad.items() if b}
    assert row.get("reason") == committed.get("reason")
    assert {n: v["status"] for n, v in row["variants"].items()} == \
        {n: v["status"] for n, v in committed["variants"].items()}


def test_readme_states_the_counts_and_the_time_of_the_committed_table():
    """The conformance guide (it was the README's section) quotes the committed table's counts and time."""
    section = (ROOT / "docs" / "guides" / "conformance.md").read_text()
    table = _table()
    load = re.search(r"\(load average ([^)]+)\)", section)
    assert load, "docs/guides/conformance.md's paragraph says how loaded the machine was"
    assert conformance.readme_paragraph(table, load.group(1)) in section  # counts and time from the JSON


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


def test_families_with_two_pairings_in_a_layer_raise_unless_style_is_given():
    mixed = [mt for mt, c in CONVENTIONS.items() if "rotations" in c]
    assert mixed, "the committed table has no model type with two rotation functions that pair differently"
    for mt in mixed:
        config = {**BASE, "model_type": mt}
        with pytest.raises(ValueError, match=rf"{mt!r}.*pair dims differently.*style="):
            RopeSpec.per_layer(config)
        for style in set(CONVENTIONS[mt]["rotations"].values()):
            try:
                specs = RopeSpec.per_layer(config, style=style)
            except ValueError as e:
                assert "pair dims differently" not in str(e)
                continue
            assert {s.style for s in specs if not s.is_nope} <= {style}


def test_v4_keys_a_config_class_drops_are_not_applied_and_are_named():
    """transformers runs such a config without the key: per_layer does not apply it, hf_config_notes names it."""
    from ropelab.spec import hf_config_notes

    dropping = {mt: c["v4"]["ignored_keys"] for mt, c in CONVENTIONS.items() if "ignored_keys" in c.get("v4", {})}
    assert dropping, "the committed table has no config class that drops a v4 key"
    for mt, keys in dropping.items():
        config = {**BASE, "model_type": mt, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
        if "rope_scaling" in keys:
            assert all(s.is_nope or s.rope_type == "default" for s in RopeSpec.per_layer(config)), mt
            assert any(f"{mt!r}" in n and "'rope_scaling'" in n and "does not read" in n
                       for n in hf_config_notes(config)), mt
        # the v5 form of the same setting is read as transformers reads it
        v5 = {**BASE, "model_type": mt, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
        v5.pop("rope_theta")
        try:
            specs = RopeSpec.per_layer(v5)
        except ValueError as e:
            assert "does not read" not in str(e)
        else:
            assert all(s.is_nope or s.rope_type == "linear" for s in specs)


def test_slice_keys_the_modeling_code_ignores_are_not_read():
    ignoring = {mt: c["ignored_keys"] for mt, c in CONVENTIONS.items() if c.get("ignored_keys")}
    assert ignoring, "the committed table has no model type whose code ignores a rotary-slice key"
    for mt, keys in ignoring.items():
        if "rotary_dim" in keys:
            cfg = {**BASE, "model_type": mt, "rotary_dim": 16}
            assert all(s.rotary_dim is None or s.is_nope for s in RopeSpec.per_layer(cfg)), mt
        if "partial_rotary_factor" in keys and mt in ("llama", "qwen3", "olmo2"):
            # measured (the default rotation run with half the factor rotated the same dims): not applied, from
            # the top level nor from the rope dict where transformers moves it, and named as a note
            top = {**BASE, "model_type": mt, "partial_rotary_factor": 0.5}
            nested = {**BASE, "model_type": mt, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                     "partial_rotary_factor": 0.5}}
            for cfg in (top, nested):
                assert all(s.rotary_dim is None for s in RopeSpec.per_layer(cfg)), (mt, cfg)
                assert any("partial_rotary_factor" in n for n in hf_config_notes(cfg)), (mt, cfg)
    assert "partial_rotary_factor" not in CONVENTIONS["phi"].get("ignored_keys", ())  # Phi's code reads it
    assert RopeSpec.per_layer({**BASE, "model_type": "phi", "partial_rotary_factor": 0.5})[0].rotary_dim == 32
    with pytest.raises(ValueError):  # the same key is read where the code reads it (GPT-J's rotary_dim)
        RopeSpec.per_layer({**BASE, "model_type": "gptj", "rotary_dim": True})
    assert RopeSpec.per_layer({**BASE, "model_type": "gptj", "rotary_dim": 16})[0].rotary_dim == 16


def _yarn16(L0: int, factor: float = 4.0, **keys) -> RopeSpec:
    """yarn x``factor`` on 16 rotary dims at base 1e6 (the conformance sweep's neomme geometry)."""
    sc = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L0, **keys}
    return RopeSpec("half", 1e6, None, sc, 16384)


def test_parameter_comparison_tells_an_undecidable_reading_from_a_wrong_one():
    """Two L0 with the same whole correction dims give the same outputs: undecidable, not wrong; another L0, another
    factor or attention factor moves outputs past the float32 bound; an explicit default is no difference."""
    from ropelab.conformance.probe import parameter_comparison

    same_dims = parameter_comparison(_yarn16(4096), _yarn16(2048), 16, 4096)
    assert same_dims["verdict"] == "undecidable" and same_dims["differ"] == ["original_max_position_embeddings"]
    assert same_dims["output_difference_over_bound"] <= 1 and same_dims["factor_ok"]
    other = parameter_comparison(_yarn16(4096), _yarn16(32768), 16, 4096)  # correction dims (2, 5), not (1, 4)
    assert other["verdict"] == "differ" and other["output_difference_over_bound"] > 1
    factor = parameter_comparison(_yarn16(4096), _yarn16(4096, factor=4.5), 16, 4096)
    assert not factor["factor_ok"] and factor["verdict"] == "differ"
    af = parameter_comparison(_yarn16(4096, attention_factor=1.0), _yarn16(4096), 16, 4096)
    assert not af["attention_factor_ok"] and af["verdict"] == "differ"
    explicit = parameter_comparison(_yarn16(4096, beta_fast=32.0, beta_slow=1.0), _yarn16(4096), 16, 4096)
    assert explicit["verdict"] == "same" and explicit["unset_as_default"] == ["beta_fast", "beta_slow"]
    unread = parameter_comparison(_yarn16(4096), None, 16, 4096)
    assert unread["verdict"] == "differ" and not unread["factor_ok"]


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", ["phi", "neomme"])
def test_diagnose_probe_reads_narrow_yarn_rotaries_and_their_parameters(model_type):
    """Two of the narrow yarn ladders (phi: 32 rotary dims; neomme: 16 on some layers) through transformers' real
    rotary: every probe reads style, base, rotary dim, scaling type and parameters, an L0 it cannot decide within
    the float32 bound."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type(model_type, _discovered()[model_type])
    probes = [p for v in row["variants"].values() for p in (v.get("diagnose") or {}).get("probes", [])]
    assert row["diagnose"] == "match", [p for p in probes if p["status"] != "match"]
    assert all(p["parameters"]["output_difference_over_bound"] <= 1 for p in probes)
    assert any(p["spec"]["scaling"] == "yarn" for p in probes)


def test_notebook_09_classes_claim_only_what_the_rows_show():
    """A composite counts as covered only through a sub-config's model type that was compared; a composite whose
    config class takes RoPE keys itself is named; a missing modeling file is not called a missing package."""
    from ropelab.studies.nb09_families import COMPOSITE_COMPARED, not_covered

    composite = "composite config (sub-configs x): its RoPE lives in a sub-config, whose model type is swept on its own"
    rows = {"csm": {"status": "not covered", "reason": composite,
                    "sub_config_types": {"depth_decoder_config": "csm_depth_decoder_model"}},
            "csm_depth_decoder_model": {"status": "agree"},
            "moshi": {"status": "not covered", "reason": composite, "sub_config_types": {"depth": "moshi_depth"}},
            "moshi_depth": {"status": "not covered", "reason": "transformers' model cannot run on tokens: LookupError: "
                            "no AutoModel and no *Model class for MoshiDepthConfig"},
            "exaone": {"status": "not covered", "reason": "modeling module does not import: ModuleNotFoundError: No "
                       "module named 'transformers.models.exaone.modeling_exaone'"}}
    got = not_covered(rows)
    assert got["classes"][COMPOSITE_COMPARED] == ["csm"]
    assert [k for k, v in got["classes"].items() if v == ["moshi"]] == [
        "composite config: its sub-configs' model types were not compared either"]
    assert got["own_rope_keys"]["csm"] == ["rope_parameters"]
    exaone = next(k for k, v in got["classes"].items() if v == ["exaone"])
    assert "package" not in exaone and "modeling module" in exaone


def test_tiny_kwargs_fill_sizes_the_default_leaves_unusable_and_keep_rope_keys():
    """Sizes that stop a default from running at the tiny depth are filled, RoPE keys untouched: a size stored
    under an attribute_map name (BailingHybrid's n_group is num_expert_group), MoE sizes left None by a class whose
    layers build experts anyway (Dots1) but not by one with a switch (Gemma 4's enable_moe_block), a None vocabulary
    (ESM), a count of layers the tiny depth cannot hold (Gemma 3n's KV-sharing layers), a per-layer list the model
    indexes (LFM2-MoE's layer_types, the other type named by its modeling code)."""
    from transformers import CONFIG_MAPPING

    kws = {mt: conformance.tiny_kwargs(CONFIG_MAPPING[mt])
           for mt in ("bailing_hybrid", "dots1", "gemma4_text", "esm", "gemma3n_text", "lfm2_moe")}
    assert kws["bailing_hybrid"]["num_expert_group"] == 1 and kws["bailing_hybrid"]["num_experts_per_token"] == 2
    assert kws["dots1"]["n_routed_experts"] == 4 and kws["dots1"]["num_experts_per_tok"] == 2
    assert "num_experts" not in kws["gemma4_text"]
    assert kws["esm"]["vocab_size"] == 128
    assert 0 < kws["gemma3n_text"]["num_kv_shared_layers"] < kws["gemma3n_text"]["num_hidden_layers"]
    assert set(kws["lfm2_moe"]["layer_types"]) == {"conv", "full_attention"}
    for mt, kw in kws.items():
        cls = CONFIG_MAPPING[mt]
        assert not [k for k in kw if "rope" in k or "theta" in k or "rotary" in k], mt
        assert getattr(cls(**kw), "rope_parameters", None) == getattr(cls(), "rope_parameters", None), mt


def test_repairs_name_values_the_model_needs_and_no_rope_key():
    """A tiny config the model cannot run gets what the failure names, never a RoPE key: the attribute the
    composite config of its module sets on it (T5Gemma 2's dropout_rate), an MLP size its class never defines
    (Qwen3-Omni's talker), a sliding window the masks require (Step-3.5), the default vocabulary sizes a padding id
    is set for (Kyutai's)."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import _repair

    t5 = CONFIG_MAPPING["t5gemma2_text"]
    assert _repair(t5, {}, "transformers' model cannot run on tokens: AttributeError: 'T5Gemma2TextConfig' object "
                   "has no attribute 'dropout_rate'") == {"dropout_rate": 0.0}
    talker = CONFIG_MAPPING["qwen3_omni_moe_talker_text"]
    assert _repair(talker, {}, "AttributeError: 'Qwen3OmniMoeTalkerTextConfig' object has no attribute "
                   "'shared_expert_intermediate_size'") == {"shared_expert_intermediate_size": 32}
    assert _repair(CONFIG_MAPPING["step3p5"], {}, "ValueError: Could not find a `sliding_window` argument in the "
                   "config, or it is not set") == {"sliding_window": 4096}
    assert _repair(t5, {}, "AttributeError: 'T5Gemma2TextConfig' object has no attribute 'rope_whatever'") is None
    kyutai = CONFIG_MAPPING["kyutai_speech_to_text"]  # its audio padding id is past the tiny vocabulary
    fix = _repair(kyutai, {"vocab_size": 128, "codebook_vocab_size": 128, "hidden_size": 128},
                  "AssertionError: Padding_idx must be within num_embeddings")
    assert fix == {"vocab_size": kyutai().vocab_size, "codebook_vocab_size": kyutai().codebook_vocab_size}


# --------------------------------------------------------------------------------------------------
# Models that take no tokens: vision towers (multi-axis RoPE) and audio encoders
# --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", ["qwen2_5_vl_vision", "lasr_encoder", "mlcd_vision_model"])
def test_models_that_take_no_tokens_run_on_built_inputs_and_agree(model_type):
    """Qwen2.5-VL's vision tower (patches and grid_thw; it reorders the tokens into windows after its rotary module,
    so each token's (row, column) is matched by its cos row) and an audio encoder (features): compared, and the
    fresh measurement is the committed table's (for the tower: its axes)."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], diagnose=False)
    assert row["status"] == "agree", row.get("reason") or row["variants"]["default"]["layers"][:1]
    assert row["table"] == "matches"
    default = row["variants"]["default"]
    assert default["inputs"] and "input_ids" not in default["inputs"]
    assert all(lay["status"] == "agree" and lay["error_over_bound"] <= 1 for lay in default["layers"])
    if model_type.endswith("_vision"):
        from ropelab.conformance.running import GRID_THW

        assert CONVENTIONS[model_type]["axes"]["axial"] and default["inputs"]["grid_thw"] == [list(GRID_THW)]
        assert CONVENTIONS["minimax_m3_vl_vision"]["axes"]["sections"][0] > 0  # a frame axis, seen on two frames
    if model_type == "mlcd_vision_model":
        # its class token, rotated by a learned angle (no position), is not compared: the row says so
        assert default["prefix_not_compared"] == {"tokens": [1], "identity": False, "calls": 8, "of_calls": 8}
        assert CONVENTIONS[model_type]["axes"] == {"sections": [26, 26], "axial": True, "interleaved": False}


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
def test_a_second_stage_fed_what_its_first_stage_makes_runs_and_agrees():
    """DeepSeek-OCR 2's encoder takes embeddings and the number of leading patch tokens (num_patches): built, it
    runs, and its 1D RoPE (positions 0 .. 8, numbered by the encoder itself) agrees on every layer."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type("deepseek_ocr2_encoder", _discovered()["deepseek_ocr2_encoder"],
                                       only_default=True, diagnose=False)
    assert row["status"] == "agree" == _table()["models"]["deepseek_ocr2_encoder"]["status"], row.get("reason")
    assert row["table"] == "matches"
    default = row["variants"]["default"]
    assert default["inputs"] == {"inputs_embeds": [1, 9, 256], "num_patches": 4}
    assert default["positions"] == list(range(9))
    assert all(lay["status"] == "agree" and lay["error_over_bound"] <= 1 for lay in default["layers"])


def test_vision_reading_matches_transformers_rotary_at_the_published_size():
    """per_layer_axes on Qwen2-VL's published vision sizes (head 1280 / 16 = 80, not the sweep's tiny head) against
    transformers' own rotary module and rotation function, on a 64 x 64 grid: the measured sections scale to the
    real head, within the sweep's bound."""
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m

    from ropelab.conformance.compare import bound
    from ropelab.multiaxis import MultiAxis, grid_positions, per_layer_axes

    cfg = transformers.Qwen2VLConfig().vision_config
    layers = per_layer_axes(cfg.to_dict())
    assert len(layers) == cfg.depth and len(set(layers)) == 1
    spec, sections = layers[0]
    assert sections == MultiAxis((20, 20), axial=True) and spec.style == "half" and spec.base == 1e4
    pos = grid_positions(64, 64)[:, ::37]  # [2, s]: rows and columns up to 63
    cos, sin = m.Qwen2VLVisionRotaryEmbedding(cfg)(torch.zeros(1), pos.T)
    q = torch.randn(pos.shape[1], 2, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    hf, _ = m.apply_rotary_pos_emb_vision(q, q, cos.double(), sin.double())
    ours = apply_rope(q, pos, layout="s h d", spec=spec, sections=sections)
    assert float(((ours - hf).abs() / bound(q, "s h d", pos, spec, sections)).max()) <= 1


def test_vision_reading_gives_measured_nope_layer_types_and_refuses_what_multiaxis_cannot_hold():
    """LFM3-VL's vision "conv" layers (measured: no rotation call) read as NoPE; a multi-axis layout MultiAxis
    cannot hold (Pixtral: the column axis takes the odd frequencies of one ladder) is refused with the layout the
    sweep measured, and the committed row's reason is exactly that error."""
    from ropelab.conformance.running import error_text
    from ropelab.multiaxis import per_layer_axes

    cfg = {"model_type": "lfm3_vl_vision", "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 2,
           "layer_types": ["conv", "full_attention", "conv", "full_attention"],
           "rope_parameters": {"rope_type": "axial", "rope_theta": 1e6}}
    assert CONVENTIONS["lfm3_vl_vision"]["nope_layer_types"] == ["conv"]
    assert [s.is_nope for s, _ in per_layer_axes(cfg)] == [True, False, True, False]
    rows = _table()["models"]
    refused = [mt for mt, c in CONVENTIONS.items() if str(c.get("style")).startswith("other: pair")]
    assert "pixtral" in refused
    for mt in refused:
        with pytest.raises(ValueError, match=repr(mt)) as e:
            per_layer_axes({"model_type": mt})
        assert rows[mt]["reason"] == f"ropelab: {error_text(e.value)}", mt
    with pytest.raises(ValueError, match="one position axis"):
        per_layer_axes({"model_type": "llama", "num_hidden_layers": 2})
    with pytest.raises(ValueError, match="'lfm3_vl_vision'.*per_layer_axes"):
        RopeSpec.per_layer(cfg)


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", ["cosmos3_edge_vision", "dinov3_vit", "lightglue", "voxtral_encoder",
                                        "unlimited_ocr_vision_encoder", "diffusion_gemma", "wav2vec2-conformer"])
def test_reasons_of_models_that_take_no_tokens_are_what_the_code_gives(model_type):
    """One row of each not-covered class of the models built inputs for: a vision tower whose code calls no
    rotation (its module's RoPE is the text model's), positions computed inside the rotary module, inputs the
    model refuses, a module with no RoPE code at all, a second stage that runs on the patch embeddings built for it
    and applies no RoPE (Unlimited-OCR's CLIP stage: learned absolute positions); and two rotations the sweep cannot
    attribute: calls from an encoder's layers outside the decoder (diffusion_gemma), a rotation inlined in a
    conformer's attention method with no module-level function (wav2vec2-conformer): rerun, the reason is the
    committed one."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], diagnose=False)
    committed = _table()["models"][model_type]
    assert row["status"] == committed["status"] == "not covered"
    assert row["reason"] == committed["reason"]


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
def test_a_rotary_that_fails_on_its_own_default_config_is_transformers_reason():
    """Cohere Compass's default has no rope dict for its layer types: it fails on the class's own default config,
    before any tiny size, and its row says so with the error the code gives now. GLM-4.1V's default fails too
    (its sections [8, 12, 12] span 32 pairs of a 64-pair head), but a head that holds its sections runs, so its row
    is compared on that head (``discovery.mrope_fit``), and says which. Llama's and Gemma 3's (one call per layer
    type) run."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.discovery import fitted_head
    from ropelab.conformance.records import _DEFAULT_FAILS, default_rotary_failure, modeling_module
    from ropelab.conformance.report import reason_class

    found = _discovered()
    for mt in ("glm4v_text", "cohere_compass_text"):
        failure = default_rotary_failure(CONFIG_MAPPING[mt], modeling_module(mt, found[mt]["module"]))
        assert failure is not None
    reason = _table()["models"]["cohere_compass_text"]["reason"]
    assert reason.startswith(_DEFAULT_FAILS) and failure in reason
    assert reason_class(reason).startswith("transformers' rotary fails on its config class's own default")
    assert fitted_head(CONFIG_MAPPING["cohere_compass_text"]) is None  # no sections: nothing a head could fit
    for mt in ("llama", "gemma3_text"):
        assert default_rotary_failure(CONFIG_MAPPING[mt], modeling_module(mt, found[mt]["module"])) is None


def test_a_tiny_head_holds_the_mrope_sections_its_rotary_splits():
    """GLM-4.1V / GLM-Image (sections [8, 12, 12] = 32 pairs, whole head rotated: head 64) and GLM-4.5V (half of
    the head rotated: head 128) get the head whose rotary slice holds exactly their sections, read from the rotary
    module built on the tiny config; their rows are compared and record the fit. No RoPE key changes, and a
    rotary whose sections need not fill the slice (Qwen3-Omni's interleaved ones) or that has none keeps its head."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.discovery import fitted_head

    rows = _table()["models"]
    for mt, head in (("glm4v_text", 64), ("glm_image_text", 64), ("glm4v_moe_text", 128)):
        cls = CONFIG_MAPPING[mt]
        kw = conformance.tiny_kwargs(cls)
        config = cls(**kw)
        assert config.hidden_size // config.num_attention_heads == head, mt
        assert config.rope_parameters == cls().rope_parameters, mt
        assert rows[mt]["status"] == "agree" and rows[mt]["tiny_head_fits_mrope_section"] == fitted_head(cls), mt
    for mt in ("glm4v", "glm4v_moe", "glm_image"):
        assert rows[mt]["status"] == "agree" and rows[mt]["tiny_head_fits_mrope_section"], mt
    for mt in ("qwen3_omni_moe_text", "qwen2_vl_text", "llama"):
        assert fitted_head(CONFIG_MAPPING[mt]) is None, mt


def test_tiny_composites_keep_the_ties_their_classes_validate():
    """A composite whose validators tie sizes across its sub-configs accepts the tiny config: a tower's output
    width or a flow head's condition width at the tiny text / backbone width, a diarization head's input at the
    tiny audio width, Molmo2's tower at the depth its adapter indexes, Apertus 1.5's vocabulary holding its token
    ranges; the text sub-config's RoPE keys are the default's. The rows built so are compared."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.composite import tiny_composite

    rows = _table()["models"]
    for mt, tied in (("granite_docling", ("vision_config", "out_hidden_size", "text_config")),
                     ("gradium_phonon_tts", ("flow_head_config", "condition_dim", None)),
                     ("nemotron3_diarization", ("head_config", "audio_hidden_size", "audio_config")),
                     ("molmo2", None), ("apertus1p5", None)):
        cls = CONFIG_MAPPING[mt]
        kw, key = tiny_composite(cls)
        config = cls(**json.loads(json.dumps(kw)))  # accepted
        if tied is not None:
            sub, name, other = tied
            width = getattr(config, other).hidden_size if other else config.hidden_size
            assert getattr(getattr(config, sub), name) == width < getattr(getattr(cls(), sub), name), mt
        if key is not None:
            assert getattr(config, key).rope_parameters == getattr(cls(), key).rope_parameters, mt
    for mt in ("granite_docling", "gradium_phonon_tts", "pocket_tts", "molmo2", "apertus1p5", "muse_spark",
               "dots3_note", "dots3_note_vision_encoder", "dbrx", "llama4", "hrm_text", "t5_gemma_module"):
        assert rows[mt]["status"] == "agree", mt


def test_sweep_build_choices_are_not_called_transformers_failures():
    """A config class with no model class of its own (a mask decoder, a vision tower built by its parent) is the
    sweep's lookup, never "transformers' model cannot be built"; its row says which config the module's rotary
    classes take. DBRX is built as its published configs are: attn_config.rope_theta (read by its attention, not
    defined by DbrxAttentionConfig) from the parent's rope dict, the one its rotary reads."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import default_build_failure, modeling_module

    found = _discovered()
    rows = _table()["models"]
    mt = "idefics_vision"
    assert default_build_failure(CONFIG_MAPPING[mt], modeling_module(mt, found[mt]["module"])) is None
    for mt, owner in (("sam2_video_mask_decoder", "Sam2VideoConfig"), ("idefics_vision", "IdeficsConfig")):
        assert f"no rotary class takes a {CONFIG_MAPPING[mt].__name__}" in rows[mt]["reason"], mt
        assert f"takes {owner}" in rows[mt]["reason"], mt
    dbrx = rows["dbrx"]
    theta = CONFIG_MAPPING["dbrx"]().rope_parameters["rope_theta"]
    assert dbrx["status"] == "agree" and dbrx["added_to_config"]["attn_config"]["rope_theta"] == theta


def test_no_rope_reasons_hold_at_the_default_layer_pattern():
    """A row that says the model applies no RoPE ran a tiny config holding every layer type of the class's
    default (none cut off by the tiny depth) and its code has no rotary class taking its (text) config class:
    the text models of GLM-5-Next and Inkling-2 (their rotaries are their vision towers'), Jamba and Nemotron-H
    (no rotary class at all), Molmo2's and Cosmos-3-Edge's towers (their rotaries are the text models')."""
    import inspect

    from transformers import CONFIG_MAPPING

    from ropelab.conformance.composite import text_key
    from ropelab.conformance.records import _NO_ROPE, modeling_module

    found = _discovered()
    rows = _table()["models"]
    for mt in ("glm5_next", "glm5_next_text", "inkling2", "inkling2_text", "jamba", "nemotron_h", "molmo2_vision",
               "cosmos3_edge_vision", "moshi_depth"):
        assert rows[mt]["reason"].startswith(_NO_ROPE), mt
        cls = CONFIG_MAPPING[mt]
        key = text_key(cls) if getattr(cls, "sub_configs", None) else None
        cls = type(getattr(cls(), key)) if key else cls
        tiny = cls(**json.loads(json.dumps(conformance.tiny_kwargs(cls))))
        for attr in ("layer_types", "layers_block_type"):
            default = getattr(cls(), attr, None)
            if isinstance(default, list):
                assert set(getattr(tiny, attr)) == set(default), (mt, attr)
        module = modeling_module(mt, found[mt]["module"])
        takes = [getattr(inspect.signature(c.__init__).parameters.get("config"), "annotation", None)
                 for n, c in vars(module).items() if inspect.isclass(c) and "Rotary" in n]
        assert cls not in takes and cls.__name__ not in takes, mt


def test_layers_numbered_by_their_attention_modules():
    """LongCat-Flash's decoder layers hold two MLA sublayers each (num_hidden_layers = 2 * num_layers): no ModuleList
    of num_hidden_layers, but its attention modules' layer_idx number them exactly (built on the meta device)."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import modeling_module
    from ropelab.conformance.running import _attention_slots, _layer_list, base_model

    cls = CONFIG_MAPPING["longcat_flash"]
    config = cls(**conformance.tiny_kwargs(cls))
    with torch.device("meta"):
        model = base_model(config, modeling_module("longcat_flash", "longcat_flash"))
    n = config.num_hidden_layers
    assert _layer_list(model, n) is None
    assert sorted(m.layer_idx for m in _attention_slots(model, n)) == list(range(n))
    row = _table()["models"]["hrm_text"]
    assert row["status"] == "agree" and "layer_idx" in row["variants"]["default"]["layers_by"]


def test_a_model_that_cannot_be_built_on_its_own_default_config_is_transformers_reason():
    """A model built on the meta device (no weights) from its class's untouched default: Llama's builds; a row
    whose model fails so (Qwen4-Exp's QSA indexer sizes left None) says so, with that error."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import _DEFAULT_BUILD_FAILS, default_build_failure, modeling_module
    from ropelab.conformance.report import reason_class

    assert default_build_failure(CONFIG_MAPPING["llama"], modeling_module("llama", "llama")) is None
    reason = f"{_DEFAULT_BUILD_FAILS}, before any tiny size: TypeError: unsupported operand type(s) for //: " \
        "'NoneType' and 'NoneType'"
    cls = CONFIG_MAPPING["qwen4_exp_text"]
    failure = default_build_failure(cls, modeling_module("qwen4_exp_text", "qwen4_exp"))
    assert f"{_DEFAULT_BUILD_FAILS}, before any tiny size: {failure}" == reason  # the untouched default still fails
    assert reason_class(reason).startswith("transformers' model cannot be built on its config class's own default")


def test_sizes_a_validator_requires_together_are_given_and_the_rows_compare_the_layers_that_rotate():
    """Qwen4-Exp's config class leaves its QSA indexer sizes None (its model computes ``None // None``) while its
    validator requires them together: the sweep gives them the smallest values that validator accepts, never a RoPE
    key; a class with no such group gets none. With them both rows (the text config, and the composite through
    its text_config) compare every layer: the indexed-attention layers rotate (the indexer's block keys at the
    positions read from their cos rows), the linear-attention ones apply none."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import _repair, _required_together

    cls = CONFIG_MAPPING["qwen4_exp_text"]
    kw = conformance.tiny_kwargs(cls)
    fix = _required_together(cls, kw)
    assert fix == {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": cls().head_dim,
                   "indexer_budget": 1, "indexer_compress_ratio": 1}
    assert _repair(cls, kw, "transformers' model cannot run on tokens: TypeError: unsupported operand type(s) for "
                   "//: 'NoneType' and 'NoneType'") == fix
    assert _required_together(CONFIG_MAPPING["llama"], conformance.tiny_kwargs(CONFIG_MAPPING["llama"])) is None
    rows = _table()["models"]
    assert rows["qwen4_exp_text"]["added_to_config"] == fix and rows["qwen4_exp"]["added_to_config"] == \
        {"text_config": fix}
    for mt in ("qwen4_exp_text", "qwen4_exp"):
        assert rows[mt]["status"] == "agree"
        for v in rows[mt]["variants"].values():
            assert [lay["status"] for lay in v["layers"]] == ["agree"] * 8, mt
            assert [("max_error" in lay) for lay in v["layers"]] == [t == "indexed_attention" for t in
                                                                     cls(**kw).layer_types], mt


def test_tiny_kwargs_a_class_refuses_are_tied_as_its_validators_require():
    """A class whose validators tie sizes together accepts the tiny config once the ties are kept: Zamba2's default
    block list (54 layers) cut to the tiny depth with its hybrid layer ids, dots.3's audio adapter input at the tiny
    hidden size, a CTC blank id inside the tiny vocabulary; no RoPE key among them."""
    from transformers import CONFIG_MAPPING

    for mt in ("zamba2", "dots3_note_audio_encoder", "nemotron3_5_transcribe_word_timestamp"):
        cls = CONFIG_MAPPING[mt]
        kw = conformance.tiny_kwargs(cls)
        config = cls(**kw)  # accepted
        assert not [k for k in kw if "rope" in k or "theta" in k or "rotary" in k], mt
        assert getattr(config, "rope_parameters", None) == getattr(cls(), "rope_parameters", None), mt
    kw = conformance.tiny_kwargs(CONFIG_MAPPING["zamba2"])
    assert len(kw["layers_block_type"]) == kw["num_hidden_layers"] and kw["hybrid_layer_ids"] == \
        [i for i, t in enumerate(kw["layers_block_type"]) if t == "hybrid"]


def _composites() -> dict:
    return {mt: r for mt, r in _table()["models"].items() if "sub_config_types" in r}


def test_composite_rows_say_what_the_code_gives_now_at_config_level():
    """Each composite row (a config class with sub-configs) names the installed class's sub-config types and its
    text sub-config; a row refused at config level ("tiny config cannot be built") has the error the tiny composite
    raises now, and every other row's tiny composite builds (its reason, if any, comes from running it)."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.composite import composite_variants, text_key, tiny_composite
    from ropelab.conformance.records import _sub_config_types
    from ropelab.conformance.report import COMPOSITE, COMPOSITE_UNCOMPARED, row_class
    from ropelab.conformance.running import error_text

    composites = _composites()
    assert len(composites) >= 100  # the sweep's composites, each run whole (none returned unrun)
    for mt, row in composites.items():
        cls = CONFIG_MAPPING[mt]
        assert row["sub_config_types"] == _sub_config_types(cls), mt
        assert row.get("text_config_key") == text_key(cls), mt
        if row["status"] == "not covered":  # the reason says what failed, never "composite" alone
            measured = re.search(r"every rotation call of the whole model run on .* came from the sub-model on its "
                                 r"\w+ \((\w+)\), a model type with a row of its own", row["reason"])
            if measured:  # run whole, every call was a sub-model's: that sub-config's type has its own row
                assert measured.group(1) in _table()["models"], mt
            else:
                assert row_class(row, _table()["models"]) not in (COMPOSITE, COMPOSITE_UNCOMPARED), mt
        try:
            kw, key = tiny_composite(cls)
            composite_variants(cls, kw, key)
        except Exception as e:  # noqa: BLE001 - the committed row must say this
            assert row["status"] == "not covered", mt
            assert row["reason"] == f"tiny config cannot be built: {error_text(e)}", mt
        else:
            assert not row.get("reason", "").startswith("tiny config cannot be built"), mt


def _composite_subset() -> list[str]:
    """The quickest agreeing composite of each kind, from the committed rows: its text sub-config's key (None: the
    decoder is the top config), whether that sub-config is another model type's config (built through AutoConfig:
    Mistral 3's ``mistral``), and whether its modeling code numbers positions on several axes (M-RoPE: Qwen2-VL)."""
    from transformers import CONFIG_MAPPING

    models = pathlib.Path(transformers.__file__).parent / "models"
    chosen: dict[tuple, tuple[float, str]] = {}
    for mt, row in sorted(_composites().items()):
        if row["status"] != "agree":
            continue
        key = row["text_config_key"]
        auto = key is not None and not hasattr(CONFIG_MAPPING[mt].sub_configs[key], "sub_configs")
        mrope = any("mrope" in p.read_text() for p in (models / row["module"]).glob("modeling_*.py"))
        kind = (key, auto, mrope)
        if kind not in chosen or row.get("seconds", 1e9) < chosen[kind][0]:
            chosen[kind] = (row.get("seconds", 1e9), mt)
    return sorted(mt for _, mt in chosen.values())


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", ["esm", "lfm2_moe", "qwen3_omni_moe_talker_text",
                                        "qwen3_omni_moe_talker_code_predictor"])
def test_types_the_tiny_config_once_broke_run_and_agree(model_type):
    """Model types that failed on the sweep's tiny config now run and agree, as their committed rows say: ESM's
    None vocabulary (and its rotary switch), LFM2-MoE's layer types, Qwen3-Omni's talker (an MLP size its config
    class never defines, and embeddings where it has no token embedding) and code predictor (embeddings only)."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], only_default=True, diagnose=False)
    assert row["status"] == "agree" == _table()["models"][model_type]["status"], row.get("reason")
    assert row["table"] == "matches"
    if model_type == "qwen3_omni_moe_talker_text":
        assert row["added_to_config"] == {"shared_expert_intermediate_size": 32}


def test_a_scaled_rope_whose_factor_is_the_rotated_slices_share_is_read():
    """dots.3's config class sets each layer type's partial_rotary_factor to qk_rope_head_dim / head_dim: a linear
    or yarn scaling's frequencies then cover exactly the rotated slice (ropelab's head), and transformers runs it;
    ropelab reads it rather than refusing it. A factor that is not that share is still refused."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.discovery import variants

    cls = CONFIG_MAPPING["dots3_note_text"]
    runs = variants(cls, conformance.tiny_kwargs(cls))
    d = cls(**json.loads(json.dumps(runs["linear"]))).to_dict()
    specs = RopeSpec.per_layer(d)
    assert {s.rope_type for s in specs} >= {"linear"} and all(s.rotary_dim is None for s in specs)
    bad = json.loads(json.dumps(d))
    for params in bad["rope_parameters"].values():
        params["partial_rotary_factor"] = 0.5 * params["partial_rotary_factor"]
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RopeSpec.per_layer(bad)
    rows = _table()["models"]
    assert all(v["status"] == "agree" for v in rows["dots3_note_text"]["variants"].values())
    # The probe compares with the layer's own head: Gemma 4's global layers (512 wide) read as the spec says.
    assert all(rows[mt]["diagnose"] == "match" for mt in ("gemma4_text", "gemma4_unified_text",
                                                           "embedding_gemma2_text"))


def test_a_v4_variant_said_not_to_run_in_the_v4_schema_ran_in_the_v5_one():
    """A v4-schema variant is said to fail for the schema only where the same scaling in rope_parameters ran."""
    from ropelab.conformance.records import _V4_FAILS

    said = [(mt, n) for mt, r in _table()["models"].items() for n, v in r.get("variants", {}).items()
            if v.get("reason", "").startswith(_V4_FAILS)]
    assert said
    for mt, name in said:
        assert name.endswith("(v4 schema)")
        assert _table()["models"][mt]["variants"][name.replace(" (v4 schema)", "")]["status"] == "agree", mt


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type", _composite_subset() if TABLE.exists() else [])
def test_composite_subset_agrees_with_transformers(model_type):
    """A composite run whole on token ids, the calls of its text sub-model's layers against ``per_layer`` of the
    composite's dict: every variant as committed, every layer that ran compared."""
    torch.set_num_threads(1)
    committed = _table()["models"][model_type]
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], diagnose=False)
    bad = {n: [lay for lay in v.get("layers", []) if lay["status"] == "disagree"] for n, v in row["variants"].items()}
    assert row["status"] == "agree", {n: b[:2] for n, b in bad.items() if b}
    assert {n: v["status"] for n, v in row["variants"].items()} == \
        {n: v["status"] for n, v in committed["variants"].items()}
    default = row["variants"]["default"]
    assert any("max_error" in lay for lay in default["layers"])  # calls recorded and compared, not vacuous


# --------------------------------------------------------------------------------------------------
# Audio, speech and encoder-decoder models: inputs built from the forward's signature (sequence_inputs)
# --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type,keys", [
    ("pocket_tts_audio_tokenizer_decoder", {"latents"}),  # a codec decoder: latents of hidden_size channels
    ("blt_local_encoder", {"input_ids", "num_patches", "patch_ids", "position_ids"}),  # bytes and their patches
    ("kyutai_speech_to_text", {"input_ids", "position_ids"}),  # a text stream and num_codebooks audio ones
])
def test_audio_models_run_on_inputs_built_from_their_signature_and_agree(model_type, keys):
    """Models whose forward needs more than token ids run on inputs read from their signature and config, and every
    layer's rotation agrees with per_layer, as committed; the positions are those their rotary module was given."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], only_default=True, diagnose=False)
    committed = _table()["models"][model_type]
    assert row["status"] == "agree" == committed["status"], row.get("reason")
    assert row["table"] == "matches"
    default = row["variants"]["default"]
    assert set(default["inputs"]) == keys and default["inputs"] == committed["variants"]["default"]["inputs"]
    assert all(lay["status"] == "agree" and lay["error_over_bound"] <= 1 for lay in default["layers"])
    if model_type == "kyutai_speech_to_text":  # ids [1, s, 1 + num_codebooks]; the padding id's vocabulary restored
        cls = transformers.CONFIG_MAPPING[model_type]
        assert default["inputs"]["input_ids"] == [1, 9, cls().num_codebooks + 1]
        assert set(row["added_to_config"]) == {"vocab_size", "codebook_vocab_size"}


@pytest.mark.skipif(transformers.__version__ != TRANSFORMERS_VERSION,
                    reason="the committed table is for another transformers; rerun make conformance")
@pytest.mark.parametrize("model_type,phrase", [
    ("moonshine", "outside the decoder layers"),  # samples and decoder tokens run; its encoder rotates too
    ("t5gemma", "outside the decoder layers"),  # decoder_input_ids given: the encoder's calls are no decoder layer's
    ("qwen2_5_omni_audio_encoder", "applies no RoPE"),  # features and feature_lens run: sinusoidal positions only
    ("muse_glimmer_assistant", "has no axis of the 16 positions"),  # 9 queries rotated against 16 keys
    ("lasr_ctc", "came from the sub-model on its encoder_config (lasr_encoder)"),  # its RoPE: its encoder's
])
def test_audio_and_encoder_decoder_reasons_are_what_the_code_gives_on_built_inputs(model_type, phrase):
    """Where the built inputs run but cannot be compared, the row says why, and a rerun gives the committed reason."""
    torch.set_num_threads(1)
    row = conformance.sweep_model_type(model_type, _discovered()[model_type], only_default=True, diagnose=False)
    committed = _table()["models"][model_type]
    assert row["status"] == committed["status"] == "not covered"
    assert row["reason"] == committed["reason"] and phrase in row["reason"]


def test_encoder_decoder_calls_are_attributed_to_the_decoders_layers_only():
    """In an encoder-decoder (Moonshine: both halves have num_hidden_layers-long stacks) the layers per_layer
    describes are the decoder's; the encoder's stack is not mistaken for them."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.records import modeling_module
    from ropelab.conformance.running import _layer_list, base_model
    from ropelab.conformance.sequence_inputs import decoder_layers

    cls = CONFIG_MAPPING["moonshine"]
    config = cls(**conformance.tiny_kwargs(cls))
    with torch.device("meta"):
        model = base_model(config, modeling_module("moonshine", "moonshine"))
    layers = decoder_layers(model, config, config.num_hidden_layers, _layer_list)
    assert layers is model.decoder.layers and _layer_list(model, config.num_hidden_layers) is model.encoder.layers
    llama = CONFIG_MAPPING["llama"](**conformance.tiny_kwargs(CONFIG_MAPPING["llama"]))
    with torch.device("meta"):
        assert decoder_layers(base_model(llama, modeling_module("llama", "llama")), llama, 2, _layer_list) is None


def test_a_layer_whose_rotated_queries_and_keys_are_zero_is_not_compared():
    """Zero queries and keys (inputs masked away before the layer: dots.3's audio encoder on a sample length shorter
    than its features) agree with any rotation; the layer is not covered, never counted as agreeing. The same call
    on nonzero tensors, rotated by ropelab itself, agrees."""
    from ropelab.conformance.records import compare_layers

    spec = RopeSpec("half", 1e4, None, None, 4096)
    positions = [0, 1, 2, 3, 5, 17, 1024, 2048, 4095]
    zero = torch.zeros(1, 2, 9, 64, dtype=torch.float64)
    run = {"calls": [{"layer": 0, "args": (zero, zero), "out": (zero, zero)}], "ran": [0], "positions": positions}
    (entry,) = compare_layers(run, [spec], 1, 64, 64, None)
    assert entry["status"] == "not covered" and "all zero" in entry["reason"]
    q = torch.randn(1, 2, 9, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = apply_rope(q, torch.tensor(positions), layout="b h s d", spec=spec)
    run["calls"] = [{"layer": 0, "args": (q, q), "out": (y, y)}]
    (entry,) = compare_layers(run, [spec], 1, 64, 64, None)
    assert entry["status"] == "agree"


def test_a_mapping_or_list_a_config_class_leaves_none_is_given_empty_and_the_rows_name_it():
    """Chameleon's and Emu3's config classes leave ``vocabulary_map`` (the tokenizer's image-token vocabulary) None
    while their models call ``.get`` on it; Granite 4 Vision's leaves ``deepstack_layer_map`` None while its model
    takes its ``len``: the sweep gives the one such field of the class's own an empty one (no image tokens, no
    vision layer feeding the text ones; the sweep runs text tokens), never a RoPE key nor a base-config field, and
    the rows that ran with it say so. Llama has none."""
    from transformers import CONFIG_MAPPING

    from ropelab.conformance.composite import tiny_composite
    from ropelab.conformance.records import _none_mapping

    for mt, kind, want in (("chameleon", dict, {"vocabulary_map": {}}), ("emu3", dict, {"vocabulary_map": {}}),
                           ("granite4_vision", list, {"deepstack_layer_map": []})):
        assert _none_mapping(CONFIG_MAPPING[mt], tiny_composite(CONFIG_MAPPING[mt])[0], kind) == want, mt
        row = _table()["models"][mt]
        if row["status"] == "agree":
            assert row["added_to_config"] == want, mt
    llama = CONFIG_MAPPING["llama"]
    assert _none_mapping(llama, conformance.tiny_kwargs(llama)) is None
    assert _none_mapping(llama, conformance.tiny_kwargs(llama), list) is None  # architectures: the base's field
    assert {_table()["models"][mt]["status"] for mt in ("chameleon", "emu3")} == {"agree"}
    # Granite 4 Vision then fails on the next field its class leaves None: downsample_rate, a "q/w" fraction its
    # downsampler splits (no empty value means anything there): not covered, the row says so.
    granite = _table()["models"]["granite4_vision"]
    assert CONFIG_MAPPING["granite4_vision"]().downsample_rate is None
    assert granite["status"] == "not covered" and granite["added_to_config"] == {"deepstack_layer_map": []}
    assert granite["reason"] == "transformers' model cannot run on tokens: AttributeError: 'NoneType' object has " \
        "no attribute 'split'"
