"""The config readers (``RopeSpec.per_layer``, ``from_hf_config``, ``read_config``) are as strict as transformers, and
no stricter: a parity test drives transformers on the same odd and invalid config dicts and compares
accept / refuse, and the rotation where both accept; property tests over config dicts hold the contract
(nothing escapes but ValueError, within a time and memory budget)."""

from __future__ import annotations

import importlib
import json
import math
import resource
import time
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ropelab.engines.hf import read_config
from ropelab.spec import MAX_HEAD_DIM, MAX_LAYERS, RopeSpec, head_dim_of, hf_config_notes

transformers = pytest.importorskip("transformers")

# Small, complete configs per model type: what the corpus mutates. Each model type stands for a way of reading
# RoPE: llama (the whole head, v4 and v5 keys), phi (partial_rotary_factor), gpt_neox (Pythia's legacy
# rotary_pct / rotary_emb_base, the class drops rope_theta), phi3 (LongRoPE lists), qwen2 (layer_types).
_SMALL = {"intermediate_size": 32, "vocab_size": 32, "num_key_value_heads": 4, "pad_token_id": 0}
BASES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "max_position_embeddings": 128, "rope_theta": 10000.0},
    "phi": {"model_type": "phi", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "max_position_embeddings": 128, "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    # the RoPE keys of EleutherAI/pythia-70m's config.json as published (sizes shrunk)
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                 "max_position_embeddings": 128, "rotary_pct": 0.25, "rotary_emb_base": 10000},
    "phi3": {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
             "max_position_embeddings": 512, "original_max_position_embeddings": 128, "rope_theta": 10000.0,
             "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                              "long_factor": [1.0 + i for i in range(8)]}},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "max_position_embeddings": 128, "rope_theta": 10000.0, "sliding_window": 64, "use_sliding_window": True,
              "layer_types": ["full_attention", "full_attention"]},
}

# (base, key, value): the classes of the issue (strings, floats where an int belongs, zero and negative sizes,
# an odd head, null layer types, wrong containers, infinities, wrong-length lists) on each way of reading.
_ODD: list[tuple[str, str, Any]] = [
    ("llama", "rope_theta", "10000"), ("llama", "rope_theta", "1e4"), ("llama", "rope_theta", [1]),
    ("llama", "rope_theta", {"a": 1}), ("llama", "rope_theta", 10000), ("llama", "rope_theta", 500000.0),
    ("llama", "head_dim", "16"), ("llama", "head_dim", 16.5), ("llama", "head_dim", -16), ("llama", "head_dim", 15),
    ("llama", "head_dim", 32), ("llama", "head_dim", 8), ("llama", "num_attention_heads", "4"),
    ("llama", "num_attention_heads", -4), ("llama", "num_attention_heads", 0), ("llama", "num_attention_heads", 3),
    ("llama", "num_hidden_layers", "2"), ("llama", "num_hidden_layers", 2.0), ("llama", "num_hidden_layers", -1),
    ("llama", "hidden_size", "64"), ("llama", "hidden_size", 65), ("llama", "max_position_embeddings", "128"),
    ("llama", "max_position_embeddings", 128.0), ("llama", "model_type", ["llama"]),
    ("llama", "rope_scaling", [1, 2]), ("llama", "rope_scaling", "linear"),
    ("llama", "rope_scaling", {"rope_type": "linear", "factor": 2.0}),
    ("llama", "rope_scaling", {"rope_type": "linear", "factor": "2"}),
    ("llama", "rope_scaling", {"type": "dynamic", "factor": 2.0}),
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": "10000"}),
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": 20000.0}),
    ("llama", "rope_parameters", [1, 2]),
    ("llama", "head_dim", 0), ("llama", "rope_theta", 1.0), ("llama", "rope_theta", -1.0),
    ("llama", "rope_theta", True),
    ("llama", "max_position_embeddings", 0), ("llama", "partial_rotary_factor", 0.5),
    ("llama", "partial_rotary_factor", "0.5"), ("llama", "partial_rotary_factor", float("inf")),
    ("llama", "layer_types", [None, None]), ("llama", "layer_types", 5), ("llama", "layer_types", "full_attention"),
    ("phi", "partial_rotary_factor", "0.5"), ("phi", "partial_rotary_factor", float("inf")),
    ("phi", "partial_rotary_factor", 0.25), ("phi", "partial_rotary_factor", [0.5]),
    ("phi", "partial_rotary_factor", 1.0), ("phi", "rope_theta", "1e4"),
    ("gpt_neox", "rotary_emb_base", "10000"), ("gpt_neox", "rotary_emb_base", 500000),
    ("gpt_neox", "rotary_pct", "0.25"), ("gpt_neox", "rotary_pct", 0.5), ("gpt_neox", "rope_theta", 500000.0),
    ("phi3", "rope_scaling", {"rope_type": "longrope", "short_factor": [1.0] * 7, "long_factor": [2.0] * 7}),
    ("phi3", "rope_scaling", {"rope_type": "longrope", "short_factor": [1.0] * 9, "long_factor": [2.0] * 9}),
    ("phi3", "rope_scaling", {"rope_type": "longrope", "short_factor": "1.0", "long_factor": [2.0] * 8}),
    ("phi3", "original_max_position_embeddings", "128"),
    ("qwen2", "layer_types", [None, None]), ("qwen2", "layer_types", ["full_attention"]),
    ("qwen2", "layer_types", ["full_attention", "sliding_attention"]), ("qwen2", "layer_types", 5),
    ("qwen2", "num_hidden_layers", "2"),
]
CORPUS = {f"{b}:{k}={json.dumps(v)}": {**BASES[b], k: v} for b, k, v in _ODD}
CORPUS.update({f"{b}:as is": dict(d) for b, d in BASES.items()})
# Llama's default rotation reads no partial_rotary_factor; its scalings do (modeling_rope_utils) and then the
# shorter tables meet the whole head in apply_rotary_pos_emb: transformers fails on the forward.
CORPUS["llama:linear with partial_rotary_factor"] = {**BASES["llama"], "partial_rotary_factor": 0.5,
                                                     "rope_scaling": {"type": "linear", "factor": 2.0}}
CORPUS["llama:rope dict with partial_rotary_factor"] = {
    **BASES["llama"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}
CORPUS["gpt_neox:rope_theta only"] = {**{k: v for k, v in BASES["gpt_neox"].items() if k != "rotary_emb_base"},
                                      "rope_theta": 500000.0}

# Where ropelab refuses what transformers accepts, on purpose: each is a config whose numbers transformers
# computes with although they mean nothing (or a default it falls back to, which ropelab never guesses).
# The test holds that transformers does accept each (so the list cannot go stale) and that ropelab refuses it.
STRICTER = {
    "llama:rope_theta=1.0": "every pair turns by 1 rad per token, no ladder of frequencies; RoPE's base is > 1",
    "llama:rope_theta=-1.0": "transformers' inv_freq is NaN past the first pair",
    "llama:rope_theta=true": "transformers takes True as the base 1; a bool is not a number here",
    "llama:max_position_embeddings=0": "a trained context of 0 tokens",
    "gpt_neox:rope_theta only": "GPT-NeoX's config class reads no rope_theta and falls back to its default base; "
                                "ropelab names rotary_emb_base, the key the class reads, rather than run a base the "
                                "config does not say",
}
_MODULES: dict[str, Any] = {}


def _modeling(model_type: str):
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    if model_type not in _MODULES:
        name = model_type_to_module_name(model_type)
        _MODULES[model_type] = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    return _MODULES[model_type]


def transformers_reads(d: dict) -> tuple[str, Any]:
    """("refuse", why) when transformers refuses the config (its config class) or fails on it (building the model
    or running a forward of 3 tokens); else ("accept", (inv_freq, attention_scaling, head_dim)) of its rotary
    module after that forward."""
    from transformers import AutoConfig, AutoModel

    d = {**_SMALL, **d}
    model_type = d.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **d)
    except Exception as e:  # noqa: BLE001 - any refusal of transformers is a refusal
        return "refuse", f"config: {type(e).__name__}: {e}"
    try:
        torch.manual_seed(0)
        model = AutoModel.from_config(config)
        model(torch.tensor([[1, 2, 3]]))
    except Exception as e:  # noqa: BLE001
        return "refuse", f"forward: {type(e).__name__}: {e}"
    rot = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    return "accept", (rot.inv_freq.to(torch.float64), float(rot.attention_scaling), config.head_dim
                      if getattr(config, "head_dim", None) else config.hidden_size // config.num_attention_heads)


def ropelab_reads(d: dict) -> tuple[str, Any]:
    """("refuse", message) for a ValueError; ("accept", specs); anything else escapes (and fails the test)."""
    try:
        specs = RopeSpec.per_layer(d)
    except ValueError as e:
        return "refuse", str(e)
    return "accept", specs


def _eps_bound(base: float) -> float:
    """The relative error of transformers' float32 inv_freq = base ** (-2i / d): the float32 exponent's rounding
    (one ulp, times ln(base)) plus the power's own (a few ulp)."""
    return 8 * torch.finfo(torch.float32).eps * (1 + math.log(base))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_readers_accept_what_transformers_accepts(name):
    d = CORPUS[name]
    theirs, got = transformers_reads(d)
    ours, specs = ropelab_reads(d)
    if name in STRICTER:
        assert theirs == "accept", f"transformers now refuses {name}: drop it from STRICTER ({got})"
        assert ours == "refuse"
        return
    if theirs == "refuse":
        assert ours == "refuse", f"transformers refuses ({got}) but ropelab reads {specs}"
        return
    assert ours == "accept", f"transformers reads it, ropelab refuses: {specs}"
    inv, att, head_dim = got
    spec = specs[0]
    ours_inv, ours_att = spec.frequencies(head_dim, seq_len=3)
    assert ours_inv.shape == inv.shape, f"ropelab rotates {2 * len(ours_inv)} dims, transformers {2 * len(inv)}"
    assert torch.allclose(ours_inv, inv, rtol=_eps_bound(spec.base), atol=0)
    assert math.isclose(ours_att, att, rel_tol=4 * torch.finfo(torch.float32).eps)
    assert len(specs) == d["num_hidden_layers"] and len(set(specs)) == 1


def test_the_corpus_holds_both_outcomes():
    """The parity test asserts something: transformers refuses part of the corpus and accepts part of it."""
    outcomes = {transformers_reads(CORPUS[n])[0] for n in ("llama:as is", "llama:head_dim=\"16\"")}
    assert outcomes == {"accept", "refuse"}


# ---------------------------------------------------------------------------------------------------------
# Sizes transformers would allocate for: refused before any allocation, naming the bound
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, bound", [("num_hidden_layers", 10 ** 12, MAX_LAYERS),
                                               ("head_dim", 2 ** 40, MAX_HEAD_DIM),
                                               ("hidden_size", 2 ** 42, MAX_HEAD_DIM)])
def test_huge_sizes_are_refused_naming_the_bound(key, value, bound):
    d = {**BASES["llama"], key: value}
    if key == "hidden_size":
        d["num_attention_heads"] = 4
    with pytest.raises(ValueError, match=str(bound)):
        RopeSpec.per_layer(d)
    with pytest.raises(ValueError, match=str(bound)):
        read_config(d)


def test_a_huge_layer_list_is_refused():
    d = {**BASES["qwen2"], "num_hidden_layers": MAX_LAYERS + 1, "layer_types": ["full_attention"] * (MAX_LAYERS + 1)}
    with pytest.raises(ValueError, match=str(MAX_LAYERS)):
        RopeSpec.per_layer(d)


def test_pythia_as_published_reads_and_refusals_do_not_contradict():
    """Issue 29: the published Pythia config (rotary_pct, rotary_emb_base, no rope_theta) reads as transformers
    runs it; rope_theta added beside it is named as not read (a note), never asked for. Without any base key the
    config class's default applies (measured into hf_config_rules, named in a note), as in transformers; a base
    given only under a key the class does not read is refused naming the key it reads, and following that advice
    reads (no circle)."""
    pythia = BASES["gpt_neox"]
    (spec,) = set(RopeSpec.per_layer(pythia))
    assert spec.base == 10000.0 and spec.rotary_dim == 4
    with_theta = {**pythia, "rope_theta": 500000.0}
    assert RopeSpec.per_layer(with_theta) == RopeSpec.per_layer(pythia)
    assert any("'rope_theta'" in n and "does not read" in n for n in read_config(with_theta).notes)
    without = {k: v for k, v in pythia.items() if k != "rotary_emb_base"}
    assert RopeSpec.per_layer(without) == RopeSpec.per_layer(pythia)
    assert any("default rope_theta=10000.0" in n for n in hf_config_notes(without))
    only_theta = {**without, "rope_theta": 500000.0}
    with pytest.raises(ValueError, match="rotary_emb_base") as e:
        RopeSpec.per_layer(only_theta)
    assert "does not read" in str(e.value) and "drop" not in str(e.value)
    (fixed,) = set(RopeSpec.per_layer({**only_theta, "rotary_emb_base": 500000.0}))
    assert fixed.base == 500000.0
    assert hf_config_notes(pythia) == ()


def test_mrope_sections_must_be_lists_of_ints():
    """A section that is not an int is refused at reading (MultiAxis would turn "16" into 16 silently); a sum that
    misses the rotary pairs is ropelab.engines.check's consistency problem, reported there."""
    qwen2_vl = {"model_type": "qwen2_vl_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                "max_position_embeddings": 128,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}}
    assert read_config(qwen2_vl).sections.n_pairs == 8
    for bad in (["2", 3, 3], [2.0, 3, 3], "233", [], [-1, 5, 4], [True, 3, 4]):
        config = {**qwen2_vl, "rope_parameters": {**qwen2_vl["rope_parameters"], "mrope_section": bad}}
        with pytest.raises(ValueError, match="mrope_section"):
            read_config(config)


def test_head_dim_of_refuses_what_cannot_be_a_head():
    for d in ({"head_dim": "16"}, {"head_dim": 0}, {"hidden_size": 64, "num_attention_heads": 0},
              {"hidden_size": 65, "num_attention_heads": 4}, {"qk_rope_head_dim": 2 ** 40}):
        with pytest.raises(ValueError):
            head_dim_of(d)
    assert head_dim_of({"hidden_size": 64, "num_attention_heads": 4}) == 16


# ---------------------------------------------------------------------------------------------------------
# Property tests: any config dict, only ValueError, within budget
# ---------------------------------------------------------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.text(max_size=6)
                     | st.floats(allow_nan=True, allow_infinity=True),
                     lambda inner: (st.lists(inner, max_size=4)
                                    | st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                     max_leaves=12)
_SIZES = st.one_of(st.integers(-4, 70), st.sampled_from([0, 2 ** 40, 10 ** 12, MAX_LAYERS + 1]), _JSON)
_KEYS = ("model_type", "hidden_size", "num_attention_heads", "num_hidden_layers", "head_dim", "qk_rope_head_dim",
         "max_position_embeddings", "original_max_position_embeddings", "rope_theta", "partial_rotary_factor",
         "rotary_pct", "rotary_dim", "rotary_emb_base", "layer_types", "sliding_window_pattern", "no_rope_layers",
         "rope_scaling", "rope_parameters", "rope_local_base_freq", "rope_interleave")
_ROPE_DICTS = st.fixed_dictionaries({}, optional={
    "rope_type": st.sampled_from(["default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional",
                                  "mrope", "nope", ""]) | _JSON,
    "type": st.sampled_from(["linear", "yarn"]) | _JSON, "rope_theta": st.floats(0.5, 1e7) | _JSON,
    "factor": st.floats(-1, 64) | _JSON, "partial_rotary_factor": st.floats(-1, 2) | _JSON,
    "short_factor": st.lists(st.floats(0.5, 4), max_size=12) | _JSON,
    "long_factor": st.lists(st.floats(0.5, 4), max_size=12) | _JSON,
    "original_max_position_embeddings": _SIZES, "mrope_section": st.lists(_SIZES, max_size=4) | _JSON,
    "low_freq_factor": _JSON, "high_freq_factor": _JSON, "beta_fast": _JSON, "attention_factor": _JSON})


_PER_TYPE = st.dictionaries(st.sampled_from(["full_attention", "sliding_attention", "chunked_attention"]),
                            _ROPE_DICTS | st.none(), max_size=3)


@st.composite
def configs(draw):
    """A valid small config of a model type the readers know, with a few keys replaced by anything JSON holds (or
    by sizes near the edges), and now and then a rope dict of any type."""
    d = dict(draw(st.sampled_from(list(BASES.values()) + [dict(BASES["llama"], model_type="gemma3_text"),
                                                           dict(BASES["llama"], model_type="qwen2_vl_text")])))
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=4, unique=True)):
        d[key] = draw(_SIZES if key not in ("rope_scaling", "rope_parameters") else _ROPE_DICTS | _JSON | _PER_TYPE)
    if draw(st.integers(0, 9)) == 0:  # a vision-language config: the decoder's keys under text_config
        d = {"model_type": draw(st.sampled_from(["qwen2_vl", "gemma3"]) | _JSON), "text_config": d}
    return d


_BUDGET_S = 5.0  # per config, generous for a loaded CI machine (a valid read takes milliseconds)
_BUDGET_MIB = 256  # growth of the peak resident set over the whole property run


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(configs())
def test_any_config_dict_gives_specs_or_a_value_error(d):
    for read in (RopeSpec.per_layer, RopeSpec.from_hf_config, read_config, hf_config_notes):
        t0 = time.perf_counter()
        try:
            out = read(d)
        except ValueError as e:
            assert str(e)  # a message, naming something
        else:
            if read is RopeSpec.per_layer and "text_config" not in d:
                assert len(out) == d["num_hidden_layers"]
        assert time.perf_counter() - t0 < _BUDGET_S


def test_property_run_stays_within_memory():
    """The property test's examples plus the seed corpus, read in one process: the peak resident set grows by
    less than the budget (a reader that allocated per layer or per head dim would take GiBs at these sizes)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for d in list(CORPUS.values()) + [{**BASES["llama"], "num_hidden_layers": 10 ** 12},
                                      {**BASES["llama"], "head_dim": 2 ** 40}]:
        for read in (RopeSpec.per_layer, read_config):
            try:
                read(d)
            except ValueError:
                pass
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # ru_maxrss is KiB on Linux
    assert grown_mib < _BUDGET_MIB
