"""RopeSpec: validation, and from_hf_config / per_layer against the frequencies transformers itself computes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ropelab.spec import RopeSpec

transformers = pytest.importorskip("transformers")


def _hf_rotary(config, module, cls_name):
    import importlib

    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return getattr(mod, cls_name)(config)


def _hf_tables(rotary, layer_type=None):
    """(inv_freq, attention_scaling) of a transformers rotary module, for one layer type if it has several."""
    if layer_type is None:
        return rotary.inv_freq, rotary.attention_scaling
    return getattr(rotary, f"{layer_type}_inv_freq"), getattr(rotary, f"{layer_type}_attention_scaling")


# (name, config factory, transformers module, rotary class). Sizes are small; RoPE settings are the real ones.
def _llama31():
    return transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def _qwen25_yarn():  # Qwen2.5's model card: add rope_scaling yarn factor 4 over 32768 (legacy 'type' key)
    return transformers.Qwen2Config(
        hidden_size=512, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=131072,
        rope_theta=1000000.0, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})


def _phi3_longrope():
    return transformers.Phi3Config(
        hidden_size=256, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0 + 0.01 * i for i in range(32)],
                         "long_factor": [1.0 + 0.5 * i for i in range(32)],
                         "original_max_position_embeddings": 4096})


def _gemma3():  # Gemma 3 4B-like: global layers linear x8 at base 1e6, sliding layers unscaled at 1e4
    return transformers.Gemma3TextConfig(
        hidden_size=256, num_attention_heads=4, head_dim=64, num_hidden_layers=12, max_position_embeddings=131072,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})


def _neox():
    return transformers.GPTNeoXConfig(hidden_size=256, num_attention_heads=4, num_hidden_layers=2,
                                      rotary_pct=0.25, rotary_emb_base=10000)


def _deepseek_v3():  # DeepSeek-V3's config.json RoPE block
    return transformers.DeepseekV3Config(
        hidden_size=256, num_attention_heads=4, num_hidden_layers=2, qk_rope_head_dim=64, qk_nope_head_dim=128,
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096})


FAMILIES = [
    ("llama 3.1", _llama31, "llama", "LlamaRotaryEmbedding"),
    ("qwen2.5 yarn", _qwen25_yarn, "qwen2", "Qwen2RotaryEmbedding"),
    ("phi-3 longrope", _phi3_longrope, "phi3", "Phi3RotaryEmbedding"),
    ("gemma 3", _gemma3, "gemma3", "Gemma3RotaryEmbedding"),
    ("gpt-neox", _neox, "gpt_neox", "GPTNeoXRotaryEmbedding"),
    ("deepseek-v3", _deepseek_v3, "deepseek_v3", "DeepseekV3RotaryEmbedding"),
]


@pytest.mark.parametrize("name, make, module, cls", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_per_layer_frequencies_match_transformers(name, make, module, cls):
    config = make()
    rotary = _hf_rotary(config, module, cls)
    specs = RopeSpec.per_layer(config)
    assert len(specs) == config.num_hidden_layers
    head_dim = config.qk_rope_head_dim if module == "deepseek_v3" else (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    layer_types = getattr(config, "layer_types", None)
    multi = module == "gemma3"
    for i, spec in enumerate(specs):
        hf_inv, hf_af = _hf_tables(rotary, layer_types[i] if multi else None)
        inv, af = spec.frequencies(head_dim)  # float64
        # transformers computes b ** (2i / r) in float32: the exponent's rounding error u is amplified by
        # ln(b ** (2i / r)) <= ln b, and a handful of further float32 operations (the scaling's mix, 1 / x)
        # add u each. So |ropelab - transformers| <= (ln b + 8) u |omega| with u = 2**-24.
        u = 2.0**-24
        torch.testing.assert_close(hf_inv.double(), inv, rtol=(math.log(spec.base) + 8) * u, atol=0)
        assert af == pytest.approx(float(hf_af), rel=2.0**-20)


def test_phi3_longrope_past_the_original_context_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _phi3_longrope()
    spec = RopeSpec.from_hf_config(config)
    for seq_len in (4096, 4097, 100000):  # short factors up to L0 = 4096, long ones past it
        hf_inv, hf_af = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)
        inv, af = spec.frequencies(64, seq_len=seq_len)
        torch.testing.assert_close(hf_inv.double(), inv, rtol=(math.log(spec.base) + 8) * 2.0**-24, atol=0)
        assert af == pytest.approx(hf_af, rel=1e-12)


def test_gemma3_has_two_settings_and_refuses_a_single_spec():
    config = _gemma3()
    specs = RopeSpec.per_layer(config)
    assert {s.base for s in specs} == {1e4, 1e6}
    for spec, kind in zip(specs, config.layer_types):
        assert (spec.scaling is None) == (kind == "sliding_attention")  # sliding layers stay unscaled
    with pytest.raises(ValueError, match="per_layer"):
        RopeSpec.from_hf_config(config)


def test_v4_gemma3_dict_with_local_base():
    # A transformers v4 config.json of Gemma 3: rope_theta / rope_scaling at the top, rope_local_base_freq for
    # the sliding-window layers.
    d = {"model_type": "gemma3_text", "num_hidden_layers": 6, "head_dim": 256, "max_position_embeddings": 131072,
         "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "rope_theta": 1000000.0,
         "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    specs = RopeSpec.per_layer(d)
    assert specs[0] == RopeSpec(base=1e4, max_position_embeddings=131072)
    linear = {"rope_type": "linear", "factor": 8.0}
    assert specs[5] == RopeSpec(base=1e6, scaling=linear, max_position_embeddings=131072)


def test_v4_gemma3_dict_with_a_sliding_window_pattern_instead_of_layer_types():
    d = {"model_type": "gemma3_text", "num_hidden_layers": 12, "head_dim": 256, "max_position_embeddings": 131072,
         "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
         "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    bases = [s.base for s in RopeSpec.per_layer(d)]
    assert bases == [1e4] * 5 + [1e6] + [1e4] * 5 + [1e6]  # layers 6 and 12 are global, as in transformers
    del d["rope_local_base_freq"]  # transformers' own fallback (Gemma3TextConfig.default_theta["local"]), measured
    assert [s.base for s in RopeSpec.per_layer(d)] == [1e4] * 5 + [1e6] + [1e4] * 5 + [1e6]


def test_v4_llama_dict_legacy_type_key_and_partial_rotary():
    d = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
         "max_position_embeddings": 4096, "rope_theta": 50000.0, "partial_rotary_factor": 0.5,
         "rope_scaling": {"type": "linear", "factor": 2.0}}
    # Llama's code rotates the whole head, linear's frequencies read the factor: transformers' forward fails on
    # the shapes (tests/test_spec_strict.py runs it), so the reader refuses, naming the key to drop.
    with pytest.raises(ValueError, match="drop partial_rotary_factor"):
        RopeSpec.from_hf_config(d)
    d.pop("partial_rotary_factor")
    spec = RopeSpec.from_hf_config(d)
    assert spec == RopeSpec(base=50000.0, scaling={"type": "linear", "factor": 2.0}, max_position_embeddings=4096)
    assert spec.frequencies(64)[0].numel() == 32


def test_deepseek_v3_is_interleaved_and_rotates_its_rope_slice():
    spec = RopeSpec.from_hf_config(_deepseek_v3())
    assert spec.style == "interleaved" and spec.rotary_dim is None


BASE = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2}


@pytest.mark.parametrize(
    "config, key",
    [
        # default RoPE reads no max_position_embeddings (CLVP's encoder config has none); dynamic NTK does
        ({**BASE, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
         "max_position_embeddings"),
        ({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2, "rope_theta": 1e4,
          "max_position_embeddings": 8},
         "hidden_size"),
        ({**BASE, "max_position_embeddings": 8,
          "rope_parameters": {"rope_type": "yarn"}}, "rope_theta"),
        ({**BASE, "max_position_embeddings": 8,
          "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factr": 2.0}}, "factr"),
        ({**BASE, "max_position_embeddings": 8,
          "rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4}}, "ntk"),
        ({**BASE, "max_position_embeddings": 8,
          "layer_types": ["a", "b"], "rope_parameters": {"a": {"rope_type": "default", "rope_theta": 1e4}}},
         "layer type"),
    ],
)
def test_missing_or_unknown_keys_fail_naming_the_key(config, key):
    with pytest.raises(ValueError, match=key):
        RopeSpec.per_layer(config)


def test_validation_and_replace():
    spec = RopeSpec(base=1e4, max_position_embeddings=256)
    dyn = dataclasses.replace(spec, scaling={"rope_type": "dynamic", "factor": 4.0})
    assert spec.scaling is None and dyn.rope_type == "dynamic"  # replace makes a new spec; the old is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.base = 2.0
    with pytest.raises(TypeError):
        dyn.scaling["factor"] = 8.0  # read-only
    for bad, match in [({"style": "neox"}, "style"), ({"base": 1.0}, "base"), ({"rotary_dim": 7}, "even"),
                       ({"scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5.0}}, "base="),
                       ({"scaling": {"rope_type": "yarn", "factor": 2.0, "betta_fast": 3}}, "betta_fast"),
                       ({"max_position_embeddings": 0}, "max_position_embeddings")]:
        with pytest.raises(ValueError, match=match):
            RopeSpec(**bad)
    assert RopeSpec(**dyn.to_dict()) == dyn and hash(RopeSpec(**dyn.to_dict())) == hash(dyn)


@pytest.mark.parametrize("schema", ["v4", "v5"])
def test_a_top_level_original_length_takes_priority_as_in_transformers(schema):
    # Phi-3's config.json keeps original_max_position_embeddings outside rope_scaling; transformers'
    # standardize_rope_params moves it in (with priority). Read as the raw dict, the spec must give what the config
    # class gives: attention factor sqrt(1 + ln(s) / ln(L0)) and the switch to the long factors past L0.
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    raw = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=256,
               original_max_position_embeddings=64)
    if schema == "v4":
        raw |= {"rope_theta": 10000.0, "rope_scaling": dict(rope)}
    else:
        raw |= {"rope_parameters": {**rope, "rope_theta": 10000.0, "original_max_position_embeddings": 256}}
    from_dict = RopeSpec.per_layer({**raw, "model_type": "phi3"})[0]
    from_class = RopeSpec.per_layer(transformers.Phi3Config(**raw))[0]
    assert from_dict.scaling["original_max_position_embeddings"] == 64
    for seq_len in (64, 65):
        (a, fa), (b, fb) = from_dict.frequencies(16, seq_len=seq_len), from_class.frequencies(16, seq_len=seq_len)
        assert torch.equal(a, b) and fa == fb
    assert from_dict.frequencies(16)[1] == pytest.approx((1 + math.log(4) / math.log(64)) ** 0.5, rel=1e-12)


def test_a_config_without_a_base_reads_the_class_default():
    """A published v4 config without rope_theta (Llama 2's) runs in transformers with its config class's default
    base; per_layer reads that default, measured into ``hf_config_rules``, and hf_config_notes names it."""
    from ropelab.conformance.hf_config_rules import READS
    from ropelab.spec import hf_config_notes

    config = {**BASE, "max_position_embeddings": 8}
    (spec,) = set(RopeSpec.per_layer(config))
    assert spec.base == READS["llama"]["default"]["rope_theta"]
    assert any("default rope_theta" in n for n in hf_config_notes(config))
