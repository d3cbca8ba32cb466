"""Notebook 09's evidence (``ropelab.studies.nb09_families``): the counts it prints claim only what the rows show."""

from __future__ import annotations

from ropelab.studies import nb09_families as nb09


def _variant(status, layers=()):
    return {"status": status, "layers": [{"layer": i, "status": s, "error_over_bound": e} for i, s, e in layers]}


def test_convention_classes_count_ignored_keys_apart_from_the_textbook():
    """A type whose only entry is a key its code ignores rotates the textbook way: it is not "beyond the textbook";
    an interleaved type, a partial slice or NoPE layer types are; the pairing splits the covered types."""
    conventions = {
        "plain": {"style": "half", "rotary_fraction": 1.0},
        "llama_like": {"style": "half", "rotary_fraction": 1.0, "ignored_keys": ["partial_rotary_factor"]},
        "gptj_like": {"style": "interleaved", "rotary_fraction": 0.25, "fixed_base": 10000.0,
                      "v4": {"ignored_keys": ["rope_theta"]}},
        "nope": {"style": "half", "nope_layer_types": ["full_attention"], "ignored_keys": ["partial_rotary_factor"]},
        "not_covered": {"style": "interleaved"},
    }
    rows = {mt: {"status": "agree"} for mt in conventions}
    rows["not_covered"]["status"] = "not covered"
    rows["composite"] = {"status": "agree"}  # no entry of its own: not counted
    cc = nb09.convention_classes(rows, conventions)
    assert cc["covered"] == ["gptj_like", "llama_like", "nope", "plain"]
    assert cc["beyond_textbook"] == ["gptj_like", "nope"]
    assert cc["only_ignored_keys"] == ["llama_like"]
    assert cc["ignored_keys"] == {"partial_rotary_factor": 2, "rope_theta": 1}
    assert sum(len(cc["classes"][k]) for k in nb09.PAIRING) == len(cc["covered"])
    assert cc["classes"]["base fixed in the code"] == ["gptj_like"]


def test_variant_counts_read_the_variants_from_the_table():
    """A variant the hard-coded list lacks (LongRoPE, for a class that takes no linear or yarn scaling) is
    counted, not reported as never run; a type without it counts as "not run" there."""
    rows = {"phi3": {"status": "agree", "variants": {"default": _variant("agree"), "longrope": _variant("agree"),
                                                     "longrope (v4 schema)": _variant("agree")}},
            "llama": {"status": "agree", "variants": {"default": _variant("agree"), "linear": _variant("agree"),
                                                      "yarn": _variant("not covered")}},
            "broken": {"status": "not covered", "variants": {"default": _variant("not covered")}}}
    assert nb09.variant_names(rows) == ["default", "linear", "yarn", "longrope", "longrope (v4 schema)"]
    c = nb09.variant_counts(rows)
    assert c["longrope"] == {"agree": 1, "disagree": 0, "not covered": 0, "not run": 1}
    assert c["yarn"] == {"agree": 0, "disagree": 0, "not covered": 1, "not run": 1}
    assert c["default"]["agree"] == 2


def test_disagreements_are_listed_with_their_layers_and_error():
    rows = {"a": {"status": "agree", "variants": {"default": _variant("agree", [(0, "agree", 0.5)])}},
            "b": {"status": "disagree", "variants": {
                "default": _variant("agree", [(0, "agree", 0.2)]),
                "yarn": _variant("disagree", [(0, "agree", 0.3), (1, "disagree", 7e5), (2, "disagree", 3e6)])}}}
    assert nb09.disagreements(rows) == [{"model_type": "b", "variant": "yarn", "layers": [1, 2], "of_layers": 3,
                                         "worst_error_over_bound": 3e6}]
    assert nb09.disagreements({"a": rows["a"]}) == []


def test_no_rope_and_composites_claim_only_what_the_rows_show():
    rows = {"jamba": {"status": "not covered", "reason": "the model applies no RoPE on this config: no rotary module "
                      "ran and no rotation function was called"},
            "voxtral_encoder": {"status": "not covered", "reason": "the model's code applies no RoPE: no rotary class, "
                                "no rotation function and no cos/sin in its modeling module"},
            "broken": {"status": "not covered", "reason": "transformers' model cannot run on tokens: KeyError"},
            "vlm": {"status": "not covered", "reason": "x", "sub_config_types": {"text_config": "vlm_text"}},
            "vlm_text": {"status": "agree"},
            "Other": {"status": "agree", "sub_config_types": {"text_config": "missing"}}}
    assert nb09.no_rope(rows) == ["jamba", "voxtral_encoder"]
    comp = nb09.composites(rows)
    assert comp["types"] == ["Other", "vlm"] and comp["agree"] == ["Other"]
    assert comp["not_compared"] == comp["sub_config_compared"] == ["vlm"]


def test_a_missing_package_is_not_called_an_unexplained_failure():
    """The table classes "requires the timm library but it was not found" as a missing package; notebook 09's
    classes keep that cause instead of folding it into "raised on the tiny config, not told apart"."""
    rows = {"gemma3n": {"status": "not covered", "reason": "transformers' model cannot run on tokens: ImportError: "
                        "TimmWrapperModel requires the timm library but it was not found in your environment."},
            "glm4v": {"status": "not covered", "reason": "transformers' model cannot run on tokens: RuntimeError: "
                      "split_with_sizes expects split_sizes to sum exactly to 64"}}
    classes = nb09.not_covered(rows)["classes"]
    gemma = next(k for k, v in classes.items() if v == ["gemma3n"])
    glm = next(k for k, v in classes.items() if v == ["glm4v"])
    assert "package not installed" in gemma and "not told apart" in glm


def test_short_value_shortens_long_lists_only():
    assert nb09.short_value([1.0] * 48) == "[1, 1, 1, ... (48)]"
    assert nb09.short_value([1.0, 2.0]) == "[1.0, 2.0]" and nb09.short_value(1024) == "1024"


def test_default_only_reads_why_from_the_config_class():
    """transformers' own config classes: gpt-oss's default is yarn already, GPT-J's has no rope_parameters; a type
    with scaling variants is not listed."""
    rows = {"gpt_oss": {"status": "agree", "variants": {"default": _variant("agree")}},
            "gptj": {"status": "agree", "variants": {"default": _variant("agree")}},
            "llama": {"status": "agree", "variants": {"default": _variant("agree"), "linear": _variant("agree")}}}
    got = nb09.default_only(rows)
    assert got == {"its default config is already scaled (yarn)": ["gpt_oss"],
                   "no rope_parameters on its default config": ["gptj"]}


def test_rotating_layers_is_what_transformers_cohere2_rotates():
    """Exercise 1's check: in transformers' cohere2 forward only the sliding-window layers call the rotation; the
    tiny config keeps the default config's layer pattern."""
    got = nb09.rotating_layers("cohere2", 4)
    assert got["layer_types"] == got["default_layer_types"]
    assert got["rotating"] == [i for i, k in enumerate(got["layer_types"]) if k == "sliding_attention"]
    assert 0 < len(got["rotating"]) < 4


def test_committed_table_partitions_the_covered_types():
    """On the committed table: the covered types split into beyond-the-textbook, textbook with ignored keys, and
    plain textbook, with no type in two; every variant name the table has is counted."""
    import json

    from ropelab.conformance.hf_table import TRANSFORMERS_VERSION
    from ropelab.figures import DATA_DIR

    table = json.loads((DATA_DIR / "conformance" / f"transformers-{TRANSFORMERS_VERSION}.json").read_text())
    cc = nb09.convention_classes(table["models"], table["conventions"])
    assert set(cc["beyond_textbook"]).isdisjoint(cc["only_ignored_keys"])
    plain = [mt for mt in cc["covered"] if mt not in cc["beyond_textbook"] and mt not in cc["only_ignored_keys"]]
    assert all(table["conventions"][mt]["style"] == "half" for mt in plain + cc["only_ignored_keys"])
    counts = nb09.variant_counts(table["models"])
    n = table["counts"]["agree"]
    assert all(sum(c.values()) == n for c in counts.values())
    ran = sum(len(r.get("variants", {})) for r in table["models"].values() if r["status"] == "agree")
    assert sum(n - c["not run"] for c in counts.values()) == ran


def test_llama3_parameters_scaled_together_give_the_same_rotation_in_transformers():
    """Section 4's reason a Llama 3 reading can differ from the config without a trace: transformers'
    ``_compute_llama3_parameters`` reads L0, low_freq_factor and high_freq_factor only through L0/low and L0/high,
    so (1024, 0.125, 0.5) and (8192, 1, 4) give the same frequencies; (8192, 1, 2) does not."""
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def inv_freq(l0, low, high):
        config = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters={
            "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": l0,
            "low_freq_factor": low, "high_freq_factor": high})
        return ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")[0].double()

    a, b = inv_freq(8192, 1.0, 4.0), inv_freq(1024, 0.125, 0.5)
    plain = 5e5 ** -(torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    rho = plain / a  # 1 unscaled, 8 fully scaled, in between on the ramp: the comparison covers all three
    assert (rho < 1.001).any() and (rho > 7.99).any() and ((rho > 1.01) & (rho < 7.9)).any()
    assert torch.allclose(a, b, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    assert not torch.allclose(a, inv_freq(8192, 1.0, 2.0), rtol=1e-3, atol=0)
