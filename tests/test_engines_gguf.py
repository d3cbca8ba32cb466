"""GGUF as llama.cpp reads it: llama.cpp's own converter on tiny models, read back and compared per layer.

The converter comes from the llama-cpp-python sdist on PyPI (``ropelab.engines.converter``; downloaded once into
build/engines/, or ROPELAB_LLAMA_CPP_SDIST). The float bounds: GGUF stores bases and factors as float32, and
the converter computes llama3's ladder in float32, so frequencies agree to a few float32 unit roundoffs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from _helpers import EXTRA_MODELS  # noqa: E402

from ropelab.convert import permute_qk_weight  # noqa: E402
from ropelab.engines import converter, llamacpp_table  # noqa: E402
from ropelab.engines.gguf import llama3_from_rope_freqs, read_gguf, rope_type_of, write_gguf  # noqa: E402
from ropelab.engines.reading import ReadError, Reading  # noqa: E402
from ropelab.engines.tiny import FAMILIES  # noqa: E402
from ropelab.multiaxis import MultiAxis  # noqa: E402
from ropelab.spec import RopeSpec  # noqa: E402

U32 = 2.0 ** -24  # float32 unit roundoff
# Relative bound on a frequency: the base and the ladder are float32 (one rounding each), the converter's llama3
# ladder a few float32 operations (a pow, a division, the blend) before it is stored as float32.
FREQ_RTOL = 16 * U32


# `converted` (every tiny family and the extra variants, converted once per session by llama.cpp's converter) is a
# fixture of tests/conftest.py, shared with tests/test_engines_llamacpp.py, which runs the same files in llama.cpp.
_EXTRA = tuple(EXTRA_MODELS)


def _text_config(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    return cfg.get("text_config", cfg)


def _hf_expected(model_dir):
    """(per-layer specs, sections) that the transformers config says; M-RoPE's keys go to MultiAxis."""
    cfg = _text_config(model_dir)
    params = dict(cfg.get("rope_parameters") or {})
    sections = None
    if "mrope_section" in params:
        sections = MultiAxis.from_hf_config(cfg)
        params = {k: v for k, v in params.items() if k not in ("mrope_section", "mrope_interleaved")}
        cfg = {**cfg, "rope_parameters": params}
    return RopeSpec.per_layer(cfg), sections


def _assert_same_rope(got: RopeSpec, want: RopeSpec, head_dim: int, where: str, seq_lens=None):
    assert got.style == want.style, where
    assert got.is_nope == want.is_nope, where
    if got.is_nope:
        return
    assert (got.rotary_dim or head_dim) == (want.rotary_dim or head_dim), where
    assert math.isclose(got.base, want.base, rel_tol=U32), where
    for seq_len in seq_lens or (1, want.max_position_embeddings):
        inv_g, af_g = got.frequencies(head_dim, seq_len=seq_len)
        inv_w, af_w = want.frequencies(head_dim, seq_len=seq_len)
        torch.testing.assert_close(inv_g, inv_w, rtol=FREQ_RTOL, atol=0, msg=f"{where}: frequencies")
        assert math.isclose(af_g, af_w, rel_tol=4 * U32), f"{where}: attention factor {af_g} vs {af_w}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_converter_gguf_reads_as_the_hf_config_says(converted, family):
    model_dir, path = converted[family]
    reading = read_gguf(path)
    specs, sections = _hf_expected(model_dir)
    cfg = _text_config(model_dir)
    assert reading.format == "gguf" and reading.n_layers == len(specs)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert reading.head_dim == head_dim
    for i, (got, want) in enumerate(zip(reading.effective_specs(), specs)):
        # Phi-3's LongRoPE: llama.cpp runs one factor set, chosen by the allocated context (here its default, the
        # file's context_length 256 > L0 64: the long one), transformers switches by the current length; they agree
        # past L0 (the short regime, at a context <= L0, is run in tests/test_engines_llamacpp.py).
        longrope = want.scaling is not None and want.rope_type == "longrope"
        if want.scaling is not None and want.scaling.get("truncate") is False:
            # gpt-oss's yarn truncate: false: the converter writes no truncate key, and ggml always truncates
            # (ggml/src/ggml.c:4486-4487); the file says the truncated ramp (the run: tests/test_engines_llamacpp.py)
            want = dataclasses.replace(want, scaling={**want.scaling, "truncate": True})
        _assert_same_rope(got, want, head_dim, f"{family} layer {i}",
                          (want.max_position_embeddings,) if longrope else None)
    assert reading.sections == sections
    json.dumps(reading.to_dict())  # ropelab-check --json


def test_rope_types_and_permutation_flags(converted):
    got = {f: (read_gguf(p).architecture, read_gguf(p).qk_permuted) for f, (_, p) in converted.items()}
    assert got["llama"] == ("llama", True) and got["llama3"] == ("llama", True)
    assert got["qwen2"] == ("qwen2", False) and got["phi3"] == ("phi3", False)
    assert rope_type_of("llama") == "NORM" and rope_type_of("qwen2") == "NEOX" and rope_type_of("gemma3") == "NEOX"
    assert rope_type_of("qwen2vl") == "MROPE" and rope_type_of("qwen3vl") == "IMROPE"
    assert read_gguf(converted["llama"][1]).layers[0].style == "interleaved"  # NORM, on the permuted weights


def test_llama3_is_written_as_rope_freqs_without_scaling_metadata(converted):
    reading = read_gguf(converted["llama3"][1])
    assert not any(k.startswith("llama.rope.scaling") for k in reading.declared)
    assert len(reading.declared["tensor rope_freqs.weight"]) == reading.head_dim // 2
    assert reading.layers[0].rope_type == "longrope"  # rope_freqs, represented exactly (see gguf.py)


def test_llama3_parameters_recovered_from_the_converters_rope_freqs(converted):
    """With L0 from the config, the converter's float32 ladder gives back factor, low and high. The fit's error is
    the ladder's few float32 roundings amplified by the conditioning of a line through 3 transition pairs (their
    1/wavelength spans a factor 2.3), well below 1e3 unit roundoffs."""
    model_dir, path = converted["llama3"]
    reading = read_gguf(path)
    want = dict(_text_config(model_dir)["rope_parameters"])
    got = llama3_from_rope_freqs(reading.declared["tensor rope_freqs.weight"], want["rope_theta"], reading.head_dim,
                                 want["original_max_position_embeddings"])
    assert got is not None
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        assert math.isclose(got[key], want[key], rel_tol=1e3 * U32), (key, got[key], want[key])
    # the ladder fixes l and h only up to the scale of L0: twice L0 gives twice the factors, the same frequencies
    twice = llama3_from_rope_freqs(reading.declared["tensor rope_freqs.weight"], want["rope_theta"], reading.head_dim,
                                   2 * want["original_max_position_embeddings"])
    assert math.isclose(twice["low_freq_factor"], 2 * got["low_freq_factor"], rel_tol=1e3 * U32)
    # one transition pair (head_dim 16) is not enough
    small = RopeSpec(base=5e5, scaling={k: v for k, v in want.items() if k != "rope_theta"},
                     max_position_embeddings=256)
    inv, _ = small.frequencies(16)
    inv0, _ = RopeSpec(base=5e5).frequencies(16)
    assert llama3_from_rope_freqs((inv0 / inv).tolist(), 5e5, 16, 64) is None


# What ropelab-check must say of each converted file against its transformers config: agree, or the difference
# that is really there: the 2-layer Gemma 3 (llama.cpp's assumed 5:1 pattern reads its global layer as sliding: base
# and scaling lost) and Qwen2's own yarn betas (written by the converter, never read by llama.cpp's qwen2).
_CHECK_DIFFERS = {"gemma3_2layer": {(1,): {"frequencies"}}, "qwen2_yarn_beta": {(0, 1): {"frequencies"}},
                  # llama.cpp's default context (context_length) exceeds L0: the long factors at every position,
                  # where transformers runs the short ones up to L0 (tests/test_engines_llamacpp.py runs both).
                  "phi3_longrope": {(0, 1): {"frequencies"}}, "phi3_longrope_l256": {(0, 1): {"frequencies"}},
                  # llama.cpp's smollm3 skips RoPE on every 4th layer, whatever no_rope_layers says.
                  "smollm3_nope_layer1": {(1,): {"nope"}, (3,): {"nope"}},
                  # an explicit yarn attention_factor, under a key only llama.cpp's grok reads
                  "qwen2_yarn_attn": {(0, 1): {"attention_factor"}},
                  # gpt-oss's yarn truncate: false, lost: ggml always truncates the ramp
                  "gpt_oss": {(0, 1): {"frequencies"}}}
# Where the costs are taken (default max_position_embeddings - 1): LongRoPE's difference lies below L0.
_CHECK_AT = {"phi3_longrope": 63, "phi3_longrope_l256": 255}


@pytest.mark.parametrize("family", sorted([*FAMILIES, *_EXTRA]))
def test_ropelab_check_agrees_with_every_converted_file_or_names_the_real_difference(converted, family):
    from ropelab.engines import check

    model_dir, path = converted[family]
    result = check.check([check.read(f"hf:{model_dir}"), check.read(str(path))], position=_CHECK_AT.get(family))
    assert not result["problems"], result["problems"]
    got = {tuple(i for run in m["layers"] for i in range(run[0], run[-1] + 1)): set(m["kinds"])
           for m in result["mismatches"]}
    want = _CHECK_DIFFERS.get(family, {})
    assert got == want, result["mismatches"]
    assert result["ok"] == (not want)
    for m in result["mismatches"]:  # each difference comes with what it costs (an attention factor: no phase)
        assert m["cost"]["phase_error"] > 1 or m["kinds"] == ["attention_factor"], m["cost"]
        assert m["cost"]["max_kl"] > 0.1, m["cost"]


def test_gemma3_layer_pattern_other_than_5_to_1_is_misread_by_llama_cpp(converted):
    """The converter writes no sliding_window_pattern for Gemma 3, and llama.cpp assumes 5 local : 1 global
    (llama_model_gemma3::load_arch_hparams, load_swa_pattern(ml, 6)): a [local, global] model loses its global layer."""
    model_dir, path = converted["gemma3_2layer"]
    reading = read_gguf(path)
    specs, _ = _hf_expected(model_dir)
    assert specs[1].base == 1e6 and specs[1].rope_type == "linear"
    assert reading.layers[1].base == 10000.0 and reading.layers[1].scaling is None  # read as a sliding layer
    assert reading.layers[0] == dataclasses.replace(specs[0], max_position_embeddings=reading.layers[0]
                                                    .max_position_embeddings)


def test_yarn_betas_the_converter_writes_but_llama_cpp_ignores_for_qwen2(converted):
    """The converter writes yarn_beta_fast / _slow for any architecture; llama.cpp reads them only where the
    architecture's load_arch_hparams does (grok, mistral3, ...), not qwen2, which runs with 32 / 1."""
    model_dir, path = converted["qwen2_yarn_beta"]
    reading = read_gguf(path)
    assert "qwen2.rope.scaling.yarn_beta_fast" in reading.declared
    assert any("yarn_beta_fast" in n and "does not read it" in n for n in reading.notes)
    (want,) = set(_hf_expected(model_dir)[0])
    got = reading.layers[0]
    assert (got.scaling["beta_fast"], got.scaling["beta_slow"]) == (32.0, 1.0)
    assert (want.scaling["beta_fast"], want.scaling["beta_slow"]) == (16.0, 2.0)
    inv_g, inv_w = got.frequencies(16)[0], want.frequencies(16)[0]
    assert (inv_g - inv_w).abs().max() > 1e3 * FREQ_RTOL * inv_w.max()  # a real difference, far above rounding


def _gguf_tensor(path, name):
    import gguf

    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == name:
            return torch.from_numpy(np.array(t.data)).reshape([int(n) for n in reversed(t.shape)])
    raise KeyError(name)


@pytest.mark.parametrize("family,permuted", [("llama", True), ("qwen2", False)])
def test_converter_permutes_qk_exactly_for_norm_archs(converted, family, permuted):
    """Measured on the converter's output: the GGUF q/k rows are Hugging Face's permuted half -> interleaved
    (ropelab.convert.permute_qk_weight) for NORM architectures, untouched for NEOX ones. The permutation moves
    float32 values without arithmetic, so equality is exact."""
    from safetensors.torch import load_file

    model_dir, path = converted[family]
    cfg = _text_config(model_dir)
    hf = load_file(str(model_dir / "model.safetensors"))
    for proj, gname, heads in (("q_proj", "attn_q", cfg["num_attention_heads"]),
                               ("k_proj", "attn_k", cfg["num_key_value_heads"])):
        w = hf[f"model.layers.0.self_attn.{proj}.weight"]
        g = _gguf_tensor(path, f"blk.0.{gname}.weight")
        want = permute_qk_weight(w, heads, src="half", dst="interleaved") if permuted else w
        assert torch.equal(g, want), (family, proj)
        if permuted:
            assert not torch.equal(g, w)
    reading = read_gguf(path)
    assert reading.qk_permuted is permuted
    # The reading's spec on the GGUF weights gives the scores the Hugging Face spec gives on the HF weights.
    from ropelab import apply_rope

    hd, nh, nkv = reading.head_dim, cfg["num_attention_heads"], cfg["num_key_value_heads"]
    x = torch.randn(1, 12, cfg["hidden_size"], generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def scores(wq, wk, spec):
        q = (x @ wq.double().T).view(1, 12, nh, hd)
        k = (x @ wk.double().T).view(1, 12, nkv, hd).repeat_interleave(nh // nkv, dim=2)
        q, k = (apply_rope(t, layout="b s h d", spec=spec) for t in (q, k))
        return torch.einsum("bshd,bthd->bhst", q, k), torch.einsum("bshd,bthd->bhst", q.abs(), k.abs())

    hf_spec = _hf_expected(model_dir)[0][0]
    gq, gk = _gguf_tensor(path, "blk.0.attn_q.weight"), _gguf_tensor(path, "blk.0.attn_k.weight")
    got, _ = scores(gq, gk, reading.layers[0])
    want, mag = scores(hf["model.layers.0.self_attn.q_proj.weight"], hf["model.layers.0.self_attn.k_proj.weight"],
                       hf_spec)
    # float64 throughout; the two sides differ only in the order of the projections' and the dot products' sums
    # and in the rotation's roundings: a few unit roundoffs per term, times hidden_size + head_dim terms.
    bound = 8 * (cfg["hidden_size"] + hd) * 2.0 ** -53 * mag
    assert ((got - want).abs() <= bound).all()
    if permuted:  # the stored weights with the HF pairing (a reader that ignores the permutation) are far off
        wrong, _ = scores(gq, gk, reading.effective_specs()[0])
        assert (wrong - want).abs().max() > 1e-2 * want.abs().max()


# ------------------------------------------------------------------------------------------------------------
# write -> read


_ROUND_TRIPS = {
    "llama": ("llama", 16, [RopeSpec(style="interleaved", base=10000.0, max_position_embeddings=128)] * 2, None),
    "linear": ("qwen2", 16, [RopeSpec(style="half", base=1e6, scaling={"rope_type": "linear", "factor": 4.0},
                                      max_position_embeddings=128)] * 2, None),
    "yarn": ("qwen2", 32, [RopeSpec(style="half", base=1e6, scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, max_position_embeddings=256)] * 3,
        None),
    "llama3": ("llama", 32, [RopeSpec(style="interleaved", base=5e5, scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}, max_position_embeddings=256)] * 2, None),
    "swa": ("gemma3", 16, [RopeSpec(style="half", base=1e4, max_position_embeddings=128)] * 2
            + [RopeSpec(style="half", base=1e6, rotary_dim=8, scaling={"rope_type": "linear", "factor": 8.0},
                        max_position_embeddings=128)], None),
    "nope": ("smollm3", 16, [RopeSpec(style="interleaved", base=2e6, max_position_embeddings=128)] * 3
             + [RopeSpec.nope(128)] * 1 + [RopeSpec(style="interleaved", base=2e6, max_position_embeddings=128)], None),
    "mrope": ("qwen2vl", 16, [RopeSpec(style="half", base=1e6, max_position_embeddings=128)] * 2,
              MultiAxis.mrope([2, 3, 3])),
    "imrope": ("qwen3vl", 16, [RopeSpec(style="half", base=5e6, max_position_embeddings=128)] * 2,
               MultiAxis.mrope([4, 2, 2], interleaved=True)),
}


@pytest.mark.parametrize("case", sorted(_ROUND_TRIPS))
def test_write_read_round_trip(tmp_path, case):
    arch, head_dim, specs, sections = _ROUND_TRIPS[case]
    path = write_gguf(specs, tmp_path / f"{case}.gguf", architecture=arch, head_dim=head_dim, sections=sections)
    reading = read_gguf(path)
    assert reading.architecture == arch and reading.head_dim == head_dim and reading.sections == sections
    assert reading.n_layers == len(specs)
    for i, (got, want) in enumerate(zip(reading.layers, specs)):
        _assert_same_rope(got, want, head_dim, f"{case} layer {i}")
    again = read_gguf(write_gguf(reading, tmp_path / f"{case}-again.gguf"))
    assert again.layers == reading.layers


def test_write_refuses_what_llama_cpp_cannot_hold(tmp_path):
    half = [RopeSpec(style="half")]
    with pytest.raises(ValueError, match="pairs dims as 'interleaved'"):
        write_gguf(half, tmp_path / "x.gguf", architecture="llama", head_dim=16)
    with pytest.raises(ValueError, match="architecture="):
        write_gguf(half, tmp_path / "x.gguf")
    rope = RopeSpec(style="interleaved")
    with pytest.raises(ValueError, match="skips RoPE on layers \\[3\\]"):  # SmolLM3's every 4th layer, not 2nd
        write_gguf([rope, RopeSpec.nope(), rope, rope], tmp_path / "x.gguf", architecture="smollm3", head_dim=16)
    dyn = [RopeSpec(style="half", scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=64)]
    with pytest.raises(ValueError, match="no GGUF form"):
        write_gguf(dyn, tmp_path / "x.gguf", architecture="qwen2", head_dim=16)


# ------------------------------------------------------------------------------------------------------------
# bad input: a ReadError naming the problem, never a traceback from deeper down


def _minimal(tmp_path, name="m.gguf", *, arch="qwen2", skip=(), extra=None):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / name), arch)
    fields = {f"{arch}.block_count": ("uint32", 2), f"{arch}.context_length": ("uint32", 64),
              f"{arch}.attention.key_length": ("uint32", 16), f"{arch}.rope.freq_base": ("float32", 1e4)}
    fields.update(extra or {})
    for key, (kind, value) in fields.items():
        if key not in skip:
            getattr(w, f"add_{kind}")(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / name


def test_minimal_file_reads(tmp_path):
    reading = read_gguf(_minimal(tmp_path))
    assert isinstance(reading, Reading) and reading.layers == (RopeSpec(style="half", max_position_embeddings=64),) * 2


@pytest.mark.parametrize("make,match", [
    (lambda p: p / "absent.gguf", "no such file"),
    (lambda p: (p / "junk.gguf").write_bytes(b"not a gguf file at all" * 4) and p / "junk.gguf", "not a readable GGUF"),
    (lambda p: _minimal(p, skip=("qwen2.block_count",)), "has no 'qwen2.block_count'"),
    (lambda p: _minimal(p, extra={"qwen2.rope.freq_base": ("string", "10000")}), "'qwen2.rope.freq_base' is STRING"),
    (lambda p: _minimal(p, arch="not_an_arch"), "'not_an_arch' is not an architecture"),
    (lambda p: _minimal(p, extra={"qwen2.rope.scaling.type": ("string", "ntk")}), "'ntk' is not a rope scaling type"),
    (lambda p: _minimal(p, extra={"qwen2.rope.dimension_count": ("uint32", 7)}), "must be an even count"),
])
def test_bad_input_is_a_read_error(tmp_path, make, match):
    with pytest.raises(ReadError, match=match):
        read_gguf(make(tmp_path))


def test_rope_type_llama_cpp_computes_is_a_read_error(tmp_path):
    computed = sorted(a for a, e in llamacpp_table.ARCHS.items() if e["rope_type"] is None)
    assert computed  # dflash at 0.3.36
    with pytest.raises(ReadError, match="computes its rope type"):
        read_gguf(_minimal(tmp_path, arch=computed[0]))


def test_truncated_file_is_a_read_error(tmp_path, converted):
    data = converted["qwen2"][1].read_bytes()
    for cut in (3, 20, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ReadError, match="not a readable GGUF"):
            read_gguf(tmp_path / "cut.gguf")


def test_mrope_arch_without_sections_is_a_read_error(tmp_path):
    path = _minimal(tmp_path, arch="qwen2vl")
    with pytest.raises(ReadError, match="needs the sections"):
        read_gguf(path)
    bad = _minimal(tmp_path, "b.gguf", arch="qwen2vl")
    data = bytearray(bad.read_bytes())
    struct.pack_into("<I", data, 0, 0x12345678)  # the magic
    bad.write_bytes(bytes(data))
    with pytest.raises(ReadError, match="not a readable GGUF"):
        read_gguf(bad)


# ------------------------------------------------------------------------------------------------------------
# the table is generated from llama.cpp's source, not typed


def test_committed_table_matches_a_fresh_parse_of_the_sdist():
    from ropelab.engines.llamacpp_parse import parse

    fresh = parse(converter.converter_dir())
    assert fresh["commit"] == llamacpp_table.LLAMA_CPP_COMMIT
    assert fresh["archs"] == llamacpp_table.ARCHS
    assert fresh["keys"] == llamacpp_table.KEYS and fresh["defaults"] == llamacpp_table.DEFAULTS


def test_converter_failure_is_a_conversion_error_with_its_output(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"],
                                                      "model_type": "no_such_model"}))
    with pytest.raises(converter.ConversionError, match="(?s)converter failed on.*NoSuchModelForCausalLM"):
        converter.convert(tmp_path, tmp_path / "out.gguf")
    with pytest.raises(converter.ConversionError, match="has no config.json"):
        converter.convert(tmp_path / "absent", tmp_path / "out.gguf")


def test_cohere2_rotates_only_its_sliding_layers(converted):
    """llama.cpp's cohere2 graph applies RoPE only `if (is_swa)` (src/models/cohere2.cpp:89), read from the source into
    the table; Command R7B's full-attention layer (every 4th) is NoPE, as in transformers. llama.cpp's run agrees
    with transformers on this family (tests/test_engines_llamacpp.py)."""
    assert llamacpp_table.ARCHS["cohere2"]["use_rope"]["cpp"] == "(hparams.is_swa(il))"
    reading = read_gguf(converted["cohere2"][1])
    assert [s.is_nope for s in reading.layers] == [False, False, False, True]
    assert any("skips RoPE" in n for n in reading.notes)


def test_mla_reads_the_rotated_slice_as_the_rope_head(converted, tmp_path):
    """DeepSeek-V3's multi-head latent attention: the converter writes attention.key_length = kv_lora_rank + n_rot
    (40, the absorbed form llama.cpp computes in), attention.key_length_mla = qk_nope + qk_rope (24) and
    rope.dimension_count = qk_rope_head_dim (8). llama.cpp rotates the 8-wide slice q_pe / k_pe; so does transformers
    (qk_rope_head_dim): the reading's RoPE head is that slice, and ropelab-check agrees (llama.cpp's run agrees with
    transformers' logits: tests/test_engines_llamacpp.py)."""
    _, path = converted["deepseek_v3"]
    reading = read_gguf(path)
    assert reading.declared  # the rope keys as written
    assert reading.head_dim == 8 and all(s.rotary_dim in (None, 8) for s in reading.layers)
    assert any("key_length_mla=24" in n and "key_length=40" in n for n in reading.notes)
    import gguf

    from ropelab.engines.gguf_file import open_gguf  # noqa: F401 - the reader's own file access
    r = gguf.GGUFReader(path)
    assert r.fields["deepseek2.attention.key_length"].contents() == 40
    assert r.fields["deepseek2.attention.key_length_mla"].contents() == 24
