"""ropelab.engines.hf: a transformers config as a Reading and back, v5 and v4 schema; what a schema cannot say
raises, naming it; what cannot be read raises ReadError."""

from __future__ import annotations

import json

import pytest

from ropelab.engines import ReadError, Reading
from ropelab.engines.hf import _fraction, read_config, write_config
from ropelab.multiaxis import MultiAxis
from ropelab.spec import RopeSpec

L0 = 4096


def llama(rope: dict | None = None, *, v4: dict | None = None, **extra) -> dict:
    """A 4-layer Llama config (head_dim 64), RoPE given as a v5 dict or v4 keys."""
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
           "max_position_embeddings": L0, **extra}
    if rope is not None:
        cfg["rope_parameters"] = rope
    cfg.update(v4 or {})
    return cfg


YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 1024,
        "attention_factor": 1.2, "beta_fast": 16.0, "beta_slow": 2.0}
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": YARN,
    "yarn_mscale": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 4096,
                    "mscale": 1.0, "mscale_all_dim": 0.707},
    "longrope": {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 1024,
                 "short_factor": [1.0 + 0.01 * i for i in range(32)],
                 "long_factor": [1.0 + 0.2 * i for i in range(32)]},
    "llama3": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "partial": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "partial_yarn": {**YARN, "partial_rotary_factor": 0.25},
}


def _v4(rope: dict) -> dict:
    """The same RoPE in the v4 keys."""
    out = {"rope_theta": rope["rope_theta"]}
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if scaling != {"rope_type": "default"}:
        out["rope_scaling"] = scaling
    if "partial_rotary_factor" in rope:
        out["partial_rotary_factor"] = rope["partial_rotary_factor"]
    return out


@pytest.mark.parametrize("name", sorted(ROPES))
@pytest.mark.parametrize("source_schema", ["v5", "v4"])
@pytest.mark.parametrize("schema", ["v5", "v4"])
def test_round_trip_every_rope_type(name, source_schema, schema):
    # Llama's code rotates the whole head whatever partial_rotary_factor says (measured: hf_table's ignored_keys):
    # the partial rotations go through Phi's config, whose code reads the factor
    arch = "phi" if "partial" in name else "llama"
    cfg = llama(ROPES[name]) if source_schema == "v5" else llama(v4=_v4(ROPES[name]))
    cfg["model_type"] = arch
    reading = read_config(cfg)
    assert reading.format == "transformers" and reading.architecture == arch and reading.head_dim == 64
    assert (reading.layers[0].rotary_dim is not None) == ("partial" in name)
    written = write_config(reading, schema=schema)
    assert RopeSpec.per_layer(written) == reading.effective_specs()
    if schema == "v5":
        assert "rope_theta" not in written and "rope_scaling" not in written
        assert written["rope_parameters"]["rope_type"] == ROPES[name]["rope_type"]
    else:
        assert "rope_parameters" not in written and written["rope_theta"] == ROPES[name]["rope_theta"]
    # over the original config: its other keys are kept
    over = write_config(reading, cfg, schema=schema)
    assert over["hidden_size"] == 256 and RopeSpec.per_layer(over) == reading.layers


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # the v4 schema, on purpose
def test_written_configs_are_what_transformers_reads():
    """transformers' own config class (v5 standardises v4 keys) reads the written config to the same specs."""
    transformers = pytest.importorskip("transformers")
    for name in ("llama3", "yarn", "partial", "longrope"):
        reading = read_config({**llama(ROPES[name]), "model_type": "phi" if name == "partial" else "llama"})
        for schema in ("v5", "v4"):
            written = write_config(reading, schema=schema)
            cfg = transformers.AutoConfig.for_model(**written)
            assert RopeSpec.per_layer(cfg) == reading.layers, (name, schema)
    gemma = {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 5e4, "rope_scaling": {"rope_type": "linear",
                                                                                           "factor": 8.0}}
    qwen = {"model_type": "qwen2_vl", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2,
            "max_position_embeddings": 32768, "rope_theta": 1e6,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    for base in (gemma, qwen):
        reading = read_config(base)
        for schema in ("v5", "v4"):
            back = read_config(transformers.AutoConfig.for_model(**write_config(reading, base, schema=schema)))
            assert back.layers == reading.layers and back.sections == reading.sections, (base["model_type"], schema)


GEMMA3 = {"model_type": "gemma3_text", "num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 4,
          "head_dim": 64, "max_position_embeddings": 8192, "sliding_window_pattern": 3}


@pytest.mark.parametrize("schema", ["v5", "v4"])
def test_sliding_window_bases_round_trip(schema):
    cfg = {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear",
                                                                                         "factor": 8.0}}
    reading = read_config(cfg)
    full = RopeSpec(base=1e6, scaling={"rope_type": "linear", "factor": 8.0}, max_position_embeddings=8192)
    sliding = RopeSpec(base=1e4, max_position_embeddings=8192)
    assert reading.layers == (sliding, sliding, full, sliding, sliding, full)
    written = write_config(reading, cfg, schema=schema)
    assert RopeSpec.per_layer(written) == reading.layers
    if schema == "v5":
        assert set(written["rope_parameters"]) == {"full_attention", "sliding_attention"}
    else:
        assert written["rope_local_base_freq"] == 1e4 and written["rope_scaling"]["factor"] == 8.0


def test_v4_cannot_scale_gemma3_sliding_layers():
    full = RopeSpec(base=1e6, max_position_embeddings=8192)
    sliding = RopeSpec(base=1e4, scaling={"rope_type": "linear", "factor": 2.0}, max_position_embeddings=8192)
    reading = Reading("x", "transformers", "gemma3_text", 64, (sliding, sliding, full) * 2)
    assert RopeSpec.per_layer(write_config(reading, GEMMA3)) == reading.layers  # v5 can
    with pytest.raises(ValueError, match="sliding_attention.*schema='v5'"):
        write_config(reading, GEMMA3, schema="v4")


def test_permuted_gguf_reading_is_written_in_the_original_pairing():
    """A GGUF of a Llama stores q/k permuted and rotates NORM (interleaved): the config says half, Llama's."""
    spec = RopeSpec(style="interleaved", base=5e5, max_position_embeddings=L0)
    reading = Reading("m.gguf", "gguf", "llama", 64, (spec,) * 4, qk_permuted=True)
    written = write_config(reading)
    assert RopeSpec.per_layer(written) == tuple(RopeSpec(base=5e5, max_position_embeddings=L0) for _ in range(4))
    unpermuted = Reading("m.gguf", "gguf", "llama", 64, (spec,) * 4)
    with pytest.raises(ValueError, match="rope_interleave.*ropelab.convert"):
        write_config(unpermuted)


def test_pairing_is_written_where_the_config_has_a_key_for_it():
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "qk_rope_head_dim": 16, "max_position_embeddings": L0, "rope_interleave": True,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    reading = read_config(cfg)
    assert {s.style for s in reading.layers} == {"interleaved"}
    half = Reading("x", "transformers", "deepseek_v3", 16, (RopeSpec(base=1e4, max_position_embeddings=L0),) * 2)
    written = write_config(half, cfg)
    assert written["rope_interleave"] is False and RopeSpec.per_layer(written) == half.layers


def test_nope_layers_are_written_where_the_config_has_a_switch():
    cfg = {"model_type": "smollm3", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
           "max_position_embeddings": L0, "no_rope_layers": [1, 1, 1, 0],
           "rope_parameters": {"rope_type": "default", "rope_theta": 2e6}}
    reading = read_config(cfg)
    assert [s.is_nope for s in reading.layers] == [False, False, False, True]
    rope, nope = reading.layers[0], reading.layers[3]
    other = Reading("x", "transformers", "smollm3", 64, (nope, rope, rope, nope))
    written = write_config(other, cfg)
    assert written["no_rope_layers"] == [0, 1, 1, 0] and RopeSpec.per_layer(written) == other.layers
    with pytest.raises(ValueError, match=r"layers \[3\] have no RoPE.*no_rope_layers"):
        write_config(Reading("x", "transformers", "llama", 64, (rope, rope, rope, nope)))


def test_mrope_sections_read_and_written():
    flat = {"model_type": "qwen2_vl", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2,
            "max_position_embeddings": 32768, "rope_theta": 1e6,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    reading = read_config(flat)
    assert reading.sections == MultiAxis.mrope((16, 24, 24)) and reading.layers[0].scaling is None
    for schema in ("v5", "v4"):
        back = read_config(write_config(reading, flat, schema=schema))
        assert back.sections == reading.sections and back.layers == reading.layers
    nested = {"model_type": "qwen3_vl", "text_config": {
        "model_type": "qwen3_vl_text", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2,
        "head_dim": 128, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20],
                            "mrope_interleaved": True}}}
    reading = read_config(nested)
    assert reading.sections == MultiAxis.mrope((24, 20, 20), interleaved=True)
    written = write_config(reading, nested)
    assert written["model_type"] == "qwen3_vl" and read_config(written).sections == reading.sections
    axial = Reading("x", "transformers", "llama", 64, reading.layers[:1] * 4, sections=MultiAxis.axial_dims((32, 32)))
    with pytest.raises(ValueError, match="axial"):
        write_config(axial)


def test_problems_inside_one_config():
    cfg = llama({"rope_type": "default", "rope_theta": 1e4}, v4={"rope_theta": 5e5})
    (problem,) = read_config(cfg).problems
    assert "rope_theta=500000.0" in problem and "ignores rope_theta" in problem
    cfg = llama({"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
                v4={"rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    assert "['factor']" in read_config(cfg).problems[0]
    assert read_config(llama(ROPES["yarn"])).problems == ()


def test_reads_files_and_directories(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(llama(ROPES["llama3"])))
    assert read_config(tmp_path).layers == read_config(tmp_path / "config.json").layers == read_config(
        llama(ROPES["llama3"])).layers
    assert read_config(tmp_path).source == str(tmp_path / "config.json")


@pytest.mark.parametrize("content, words", [
    (None, "no config.json"),
    ("{not json", "not a readable JSON"),
    ("[1, 2]", "not an object"),
    (json.dumps({**llama(ROPES["default"]), "model_type": "no_such_model"}), "convention table"),
    (json.dumps({**llama(), "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}), "needs the key 'factor'"),
    # dynamic NTK reads the context length (default RoPE does not, and reads without it)
    (json.dumps({k: v for k, v in llama(ROPES["dynamic"]).items() if k != "max_position_embeddings"}),
     "max_position_embeddings"),
])
def test_unreadable_configs_raise_read_error(tmp_path, content, words):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(ReadError, match=words):
        read_config(tmp_path)
    with pytest.raises(ReadError, match="no such file"):
        read_config(tmp_path / "nothing.json")


def test_what_a_schema_cannot_express_raises():
    rope = RopeSpec(base=1e4, max_position_embeddings=L0)
    other = RopeSpec(base=5e5, max_position_embeddings=L0)
    with pytest.raises(ValueError, match="layers 0 and 2 have different RoPE.*no layer_types"):
        write_config(Reading("x", "transformers", "llama", 64, (rope, rope, other, other)))
    with pytest.raises(ValueError, match="base_config="):
        write_config(Reading("x", "gguf", "no_such_arch", 64, (rope,) * 4))
    with pytest.raises(ValueError, match="num_hidden_layers=4 but the reading 2 layers"):
        write_config(Reading("x", "transformers", "llama", 64, (rope,) * 2), llama(ROPES["default"]))
    with pytest.raises(ValueError, match="head dim is 64 but the reading's 128"):
        write_config(Reading("x", "transformers", "llama", 128, (rope,) * 4), llama(ROPES["default"]))
    with pytest.raises(ValueError, match="schema must be one of"):
        write_config(Reading("x", "transformers", "llama", 64, (rope,) * 4), schema="v6")
    neox = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
            "max_position_embeddings": L0, "rotary_pct": 0.25, "rope_parameters": {"rope_type": "default",
                                                                                     "rope_theta": 1e4}}
    reading = read_config(neox)
    assert reading.layers[0].rotary_dim == 16
    assert RopeSpec.per_layer(write_config(reading, neox)) == reading.layers
    with pytest.raises(ValueError, match="does not read the v4 key.*rope_theta"):
        write_config(reading, neox, schema="v4")


def test_fraction_floors_back_to_the_rotary_dim():
    """transformers' rotary dim is int(head_dim * partial_rotary_factor): the written factor floors back."""
    for d in range(2, 513, 2):
        for r in range(2, d + 1, 2):
            assert int(d * _fraction(r, d)) == r


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # the v4 schema, on purpose
def test_a_config_class_with_its_own_rotary_key_gets_it_written():
    """GPT-J's config class reads an absolute rotary_dim (and its own key names): the writer sets that key, so
    transformers' config class reads the same rotary slice."""
    transformers = pytest.importorskip("transformers")
    gptj = {"model_type": "gptj", "n_layer": 2, "n_embd": 256, "n_head": 4, "n_positions": 2048, "rotary_dim": 16}
    reading = read_config(gptj)
    assert reading.head_dim == 64 and reading.layers[0].rotary_dim == 16 and reading.layers[0].style == "interleaved"
    wider = Reading("x", "gguf", "gptj", 64, tuple(RopeSpec(style="interleaved", rotary_dim=32,
                                                            max_position_embeddings=2048) for _ in range(2)))
    for base in (gptj, None):
        for schema in ("v5", "v4"):
            written = write_config(wider, base, schema=schema)
            assert written["rotary_dim"] == 32 and "partial_rotary_factor" not in written
            assert RopeSpec.per_layer(transformers.AutoConfig.for_model(**written)) == wider.layers
            if base is not None:
                assert written["n_layer"] == 2 and "num_hidden_layers" not in written



def test_a_partial_rotation_is_not_written_as_a_type_whose_code_rotates_the_whole_head():
    """Llama's code reads no partial_rotary_factor (measured): a config written for it could not hold the slice, so
    write_config refuses, saying what it would read back as."""
    reading = read_config({**llama(ROPES["partial"]), "model_type": "phi"})
    with pytest.raises(ValueError, match="cannot express"):
        write_config(reading, llama())
