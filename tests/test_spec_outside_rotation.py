"""What ``RopeSpec.per_layer`` reads beside the rotation, against transformers' own code: the query scale
``llama_4_scaling_beta`` of Ministral 3 / Mistral 4 (recorded on the spec, applied by ``RopeSpec.query_scale``,
never by ``apply_rope``), the rope dict's copy of ``max_position_embeddings``, a ``partial_rotary_factor`` of the
full head beside ``qk_rope_head_dim``, ``max_position_embeddings`` read only where a scaling reads it, and the
refusal where the layers without RoPE cannot be located, and the layer counts and layer types a config class
derives from other keys (LongCat-Flash's ``num_layers``, RecurrentGemma's ``block_types``)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from ropelab.spec import RopeSpec, hf_config_notes

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

U32 = 2.0 ** -24


def _config(model_type: str, **kw):
    return CONFIG_MAPPING[model_type](**kw)


@pytest.mark.parametrize("model_type", ["ministral3", "mistral4"])
def test_query_scale_is_transformers_llama_4_attn_scale(model_type):
    """``spec.query_scale`` against the modeling module's own ``get_llama_4_attn_scale`` (float32 there, so within a
    few float32 roundings of the value) and against a float64 oracle (math.log1p), at positions on both sides of
    multiples of L0."""
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    config = _config(model_type)
    spec = RopeSpec.per_layer(config.to_dict())[0]
    beta = config.rope_parameters["llama_4_scaling_beta"]
    l0 = config.rope_parameters["original_max_position_embeddings"]
    assert spec.llama_4_scaling_beta == beta and "llama_4_scaling_beta" not in spec.scaling
    m = [0, 1, l0 - 1, l0, l0 + 1, 3 * l0 - 1, 3 * l0, 7 * l0 + 5, 40 * l0]
    ours = spec.query_scale(m)
    oracle = torch.tensor([1 + beta * math.log1p(p // l0) for p in m], dtype=torch.float64)
    assert ours.dtype == torch.float64
    assert torch.allclose(ours, oracle, rtol=8 * 2.0 ** -53, atol=0)
    theirs = module.get_llama_4_attn_scale(torch.tensor([m]), beta, l0).double().flatten()
    assert theirs.shape == ours.shape
    assert ((theirs - ours).abs() <= 4 * U32 * ours).all(), (theirs, ours)
    assert not torch.equal(ours, torch.ones_like(ours))  # the scale does move past L0: the check could fail


@pytest.mark.parametrize("model_type", ["ministral3", "mistral4"])
def test_the_rotation_is_transformers_without_the_query_scale(model_type):
    """The spec's frequencies and attention factor are transformers' yarn init on the same config (float32 there:
    relative error within (ln b + 9) u), so dropping the two keys from the rotation changes nothing of it."""
    config = _config(model_type)
    spec = RopeSpec.per_layer(config.to_dict())[0]
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](config)
    rotated = getattr(config, "qk_rope_head_dim", None) or config.head_dim
    ours, ours_attention = spec.frequencies(rotated)
    assert ours.shape == inv_freq.shape  # Mistral 4: factor 0.5 of head_dim 128 is its whole 64-dim slice
    tol = (math.log(spec.base) + 9) * U32
    assert torch.allclose(ours, inv_freq.double(), rtol=tol, atol=0)
    assert ours_attention == pytest.approx(attention, rel=4 * U32)


def test_llama_4_scaling_beta_is_named_in_the_notes_and_follows_the_config():
    d = _config("ministral3").to_dict()
    d["rope_parameters"] = {**d["rope_parameters"], "llama_4_scaling_beta": 0.25}
    specs = RopeSpec.per_layer(d)
    assert {s.llama_4_scaling_beta for s in specs} == {0.25}
    (note,) = [n for n in hf_config_notes(d) if "llama_4_scaling_beta" in n]
    assert "0.25" in note and "query_scale" in note and "apply_rope does not apply it" in note
    spec = specs[0]
    assert RopeSpec(**spec.to_dict()) == spec and hash(RopeSpec(**spec.to_dict())) == hash(spec)
    assert "llama_4_scaling_beta" not in RopeSpec().to_dict()  # a spec without it keeps its old dict
    assert torch.equal(RopeSpec().query_scale([0, 5, 10 ** 6]), torch.ones(3, dtype=torch.float64))


def test_the_rope_dicts_max_position_embeddings_must_be_the_configs():
    d = _config("ministral3").to_dict()
    assert d["rope_parameters"]["max_position_embeddings"] == d["max_position_embeddings"]  # the class copies it
    d["rope_parameters"] = {**d["rope_parameters"], "max_position_embeddings": 1234}
    with pytest.raises(ValueError, match="differs from the config's max_position_embeddings"):
        RopeSpec.per_layer(d)


def test_llama_4_scaling_beta_is_validated():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError, match="llama_4_scaling_beta must be a finite number"):
        RopeSpec(scaling=yarn, llama_4_scaling_beta="0.1")
    with pytest.raises(ValueError, match="llama_4_scaling_beta must be a finite number"):
        RopeSpec(scaling=yarn, llama_4_scaling_beta=float("nan"))
    with pytest.raises(ValueError, match="needs L0"):
        RopeSpec(llama_4_scaling_beta=0.1)  # transformers divides by rope_parameters.get(...) = None and fails
    with pytest.raises(ValueError, match="positions must be ints >= 0"):
        RopeSpec(scaling=yarn, llama_4_scaling_beta=0.1).query_scale([-1, 2])
    with pytest.raises(ValueError, match="without RoPE"):
        RopeSpec(rotary_dim=0, llama_4_scaling_beta=0.1)


def test_a_partial_factor_beyond_the_rotated_slice_is_refused():
    d = _config("mistral4").to_dict()
    d["rope_parameters"] = {**d["rope_parameters"], "partial_rotary_factor": 0.75}  # 96 dims of a 64-dim slice
    with pytest.raises(ValueError, match="past the rotated slice qk_rope_head_dim=64"):
        RopeSpec.per_layer(d)


def test_max_position_embeddings_is_needed_only_where_a_scaling_reads_it():
    """CLVP's encoder config has no max_position_embeddings and its default RoPE reads none (transformers runs it);
    a dynamic NTK scaling does read it, and is refused without it."""
    d = _config("clvp_encoder").to_dict()
    assert d.get("max_position_embeddings") is None
    specs = RopeSpec.per_layer(d)
    assert specs[0].max_position_embeddings is None and specs[0].scaling is None
    dynamic = {**d, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}
    with pytest.raises(ValueError, match="max_position_embeddings"):
        RopeSpec.per_layer(dynamic)


@pytest.mark.parametrize("blocks", [["recurrent", "recurrent", "attention"], ["attention", "recurrent"],
                                    ["recurrent"], ["attention"]])
def test_layer_types_the_class_cycles_from_block_types_are_read_as_it_reads_them(blocks):
    """RecurrentGemma's class derives ``layers_block_type`` by cycling ``block_types`` (measured:
    ``hf_config_rules``' ``cycled``); its recurrent layers apply no RoPE (the table's nope_layer_types). Over 5
    layers (a list that does not divide them), per_layer of the class's dict rotates exactly the layers the class
    types ``sliding_attention``, each by the class's partial rotary share of the head."""
    config = _config("recurrent_gemma", num_hidden_layers=5, block_types=blocks)
    d = config.to_dict()
    assert "layer_types" not in d and "layers_block_type" not in d  # the dict holds only block_types
    specs = RopeSpec.per_layer(d)
    assert len(specs) == 5
    assert [s.is_nope for s in specs] == [t == "linear_attention" for t in config.layers_block_type]
    share = config.rope_parameters["partial_rotary_factor"]
    assert all(s.rotary_dim == int(config.head_dim * share) for s in specs if not s.is_nope)


def test_layer_types_without_the_keys_the_class_derives_them_from_are_refused():
    """A RecurrentGemma dict with neither layer_types nor block_types: ropelab does not guess the class's default
    list, and says which key to give; a block kind it has not measured, or more layers than the class cycles the
    list for (it refuses those), are refused too."""
    d = _config("recurrent_gemma", num_hidden_layers=5).to_dict()
    with pytest.raises(ValueError, match="block_types"):
        RopeSpec.per_layer({k: v for k, v in d.items() if k != "block_types"})
    with pytest.raises(ValueError, match="block kinds ropelab has not measured"):
        RopeSpec.per_layer({**d, "block_types": ["recurrent", "mlp"]})
    with pytest.raises(ValueError, match="cycles block_types"):
        RopeSpec.per_layer({**d, "block_types": ["attention"], "num_hidden_layers": 101})
    with pytest.raises(Exception, match="num_hidden_layers"):  # and transformers' class refuses that config too
        _config("recurrent_gemma", num_hidden_layers=101, block_types=["attention"])
    # with the list given, the config object and its dict read alike
    config = _config("recurrent_gemma", num_hidden_layers=5)
    assert RopeSpec.per_layer(config) == RopeSpec.per_layer(config.to_dict())


@pytest.mark.parametrize("num_layers", [1, 3])
def test_a_layer_count_the_class_derives_is_read_as_it_reads_it(num_layers):
    """LongCat-Flash's class stores ``num_layers`` and derives ``num_hidden_layers = 2 * num_layers`` (two attention
    sublayers per decoder layer; measured: ``hf_config_rules``' ``layer_count``). Its dict holds only num_layers;
    per_layer gives one spec per attention sublayer, as many as the class's num_hidden_layers."""
    config = _config("longcat_flash", num_layers=num_layers)
    d = config.to_dict()
    assert "num_hidden_layers" not in d and d["num_layers"] == num_layers
    assert len(RopeSpec.per_layer(d)) == config.num_hidden_layers == 2 * num_layers


def test_a_layer_count_without_its_keys_is_refused():
    d = _config("longcat_flash", num_layers=3).to_dict()
    with pytest.raises(ValueError, match="neither 'num_hidden_layers' nor 'num_layers'"):
        RopeSpec.per_layer({k: v for k, v in d.items() if k != "num_layers"})
    with pytest.raises(ValueError, match="num_layers must be an int"):
        RopeSpec.per_layer({**d, "num_layers": "3"})
    with pytest.raises(ValueError, match="derives num_hidden_layers = 2 \\* num_layers = 6"):
        RopeSpec.per_layer({**d, "num_hidden_layers": 4})
    assert len(RopeSpec.per_layer({**d, "num_hidden_layers": 6})) == 6  # both given and agreeing


def test_a_config_listing_blocks_per_layer_is_read_as_its_class_reads_it():
    """Dory's config.json lists each layer's attention block and then an ``mlp`` block (num_hidden_layers doubled);
    its class keeps every second entry (measured: ``serialized_layout``). per_layer reads it the same way: one spec
    per decoder layer, each with its layer type's base."""
    config = _config("dory")
    d = config.to_dict()
    assert len(d["layer_types"]) == 2 * config.num_hidden_layers and "mlp" in d["layer_types"]
    specs = RopeSpec.per_layer(d)
    assert len(specs) == config.num_hidden_layers
    bases = {t: p["rope_theta"] for t, p in config.rope_parameters.items()}
    assert [s.base for s in specs] == [bases[t] for t in config.layer_types]
    assert len(set(bases.values())) == 2  # the two layer types differ: the check could fail
    odd = {**d, "layer_types": d["layer_types"][:-1] + ["full_attention"]}
    assert len(RopeSpec.per_layer(odd)) == config.num_hidden_layers  # mlp still listed: the same stride
    with pytest.raises(ValueError, match="layer_types has"):
        RopeSpec.per_layer({**d, "layer_types": d["layer_types"][:-2]})


@pytest.mark.parametrize("model_type, rule", [("longcat_flash", "layer_count"), ("recurrent_gemma", "cycled"),
                                              ("llama", None), ("qwen3_next", None)])
def test_the_committed_layer_rules_are_those_measured_on_the_classes_now(model_type, rule):
    """``layer_count`` and ``cycled`` in ``hf_config_rules`` are what ``config_rules`` measures on the installed
    classes (regenerate with ``python -m ropelab.conformance.config_rules`` where they differ); a class with its own
    ``num_hidden_layers`` and ``layer_types`` fields gets neither."""
    from ropelab.conformance.config_rules import _cycled_layer_types, _layer_count
    from ropelab.conformance.discovery import tiny_kwargs
    from ropelab.conformance.hf_config_rules import READS

    cls = CONFIG_MAPPING[model_type]
    kw = tiny_kwargs(cls)
    measured = {"layer_count": _layer_count(cls, kw), "cycled": _cycled_layer_types(cls, kw)}
    committed = {k: READS.get(model_type, {}).get(k) for k in measured}
    assert measured == committed
    assert {k for k, v in measured.items() if v is not None} == ({rule} if rule else set())
