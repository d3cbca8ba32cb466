r"""llama.cpp running (ropelab.engines.llamacpp_run, the llama-cpp-py-sync wheel's libllama.so, b11739) on the GGUF
files llama.cpp's own converter wrote from every tiny family (the `converted` fixture of conftest.py, shared with
tests/test_engines_gguf.py), against transformers' float64 forward of the same weights, within the float32 bound
derived in ropelab.engines.parity (Higham's gamma_K per block along the residual stream, times the output
projection's sum of |terms|; plus ggml's float16 GELU table for the GELU families).

A family where llama.cpp differs from transformers is a finding: the test names the cause and checks it, running
transformers on the model as llama.cpp reads it (the cause's config change) and finding llama.cpp's logits within
the same bound of that. The reader (ropelab.engines.gguf.read_gguf, with the context llama.cpp allocated) must
predict each verdict: a reader that says "agree" where llama.cpp's run differs fails here.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _helpers import EXTRA_MODELS

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from ropelab.engines import check, llamacpp_run, parity  # noqa: E402
from ropelab.engines.gguf import allocated_context, read_gguf  # noqa: E402
from ropelab.engines.tiny import FAMILIES, VOCAB_SIZE  # noqa: E402

# llama.cpp runs in make test and CI (pyproject's engines extra installs the wheel); ROPELAB_ALLOW_NO_LLAMACPP=1
# lets a machine without it skip instead of fail (Linux x86-64 only: the wheel is built for nothing else).
if not llamacpp_run.available():
    if os.environ.get("ROPELAB_ALLOW_NO_LLAMACPP") == "1":
        pytest.skip(f"llama-cpp-py-sync=={llamacpp_run.LLAMA_CPP_PY_SYNC} is not installed", allow_module_level=True)

N_TOKENS = parity.N_TOKENS

# name -> (context requested from llama.cpp (None: len(tokens)), None for "agrees with transformers", or the cause:
# (words with file and line at the converter's llama.cpp commit 0c1e570, transformers config changes that make the
# model llama.cpp runs)).
LONG = {"short_factor": [1.0, 1.5, 2.0, 4.0, 6.0, 8.0]}  # = the families' long_factor
CASES = {
    **{f: (None, None) for f in FAMILIES if f not in ("phi3_longrope", "gpt_oss")},
    "gpt_oss": (None, ("ggml always truncates yarn's correction range (ggml/src/ggml.c:4486-4487, floorf / ceilf in "
                       "ggml_rope_yarn_corr_dims) and the converter writes no truncate key: gpt-oss's truncate: false "
                       "is lost", {"rope_parameters": {"truncate": True}})),
    "phi3_longrope_l256@256": (256, None),
    "gemma3_2layer": (None, ("llama.cpp assumes Gemma 3's 5 sliding : 1 full layer pattern "
                             "(src/models/gemma3.cpp:7, load_swa_pattern(ml, 6)) and the converter writes none: "
                             "the full-attention layer 1 runs as sliding (base 10000, no linear scaling)",
                             {"layer_types": ["sliding_attention", "sliding_attention"]})),
    "qwen2_yarn_beta": (None, ("llama.cpp's qwen2 never reads rope.scaling.yarn_beta_fast / _slow, which the converter "
                               "writes: it runs the defaults 32 / 1 (src/llama-hparams.h:161-162)",
                               {"rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0}})),
    "qwen2_yarn_attn": (None, ("the converter writes an explicit yarn attention_factor as "
                               "rope.scaling.yarn_attn_factor (conversion/base.py:1477-1478), which only llama.cpp's "
                               "grok reads (src/models/grok.cpp:25); the generic loader reads rope.scaling.attn_factor "
                               "(src/llama-model.cpp:1431): qwen2 runs the computed 0.1 ln s + 1",
                               {"rope_parameters": {"attention_factor": None}})),
    "smollm3_nope_layer1": (None, ("llama.cpp's smollm3 skips RoPE on every 4th layer whatever the config says "
                                   "(src/models/smollm3.cpp:5 n_no_rope_layer_step = 4, :69 use_rope), and the "
                                   "converter writes no pattern: layer 1 rotates, layer 3 does not",
                                   {"no_rope_layers": [1, 1, 1, 0]})),
    "phi3_longrope": (None, ("llama.cpp picks Phi-3's long factors when the allocated context exceeds "
                             "original_context_length 64 (src/llama-model.cpp:2345-2346, llama_model::"
                             "get_rope_factors), and pads any context to a multiple of 256: the long factors at "
                             "every position, transformers' short ones up to length 64", {"rope_parameters": LONG})),
    "phi3_longrope_l256@512": (512, ("the same choice at a context of 512 > original_context_length 256: the long "
                                     "factors at 24 tokens, where transformers runs the short ones",
                                     {"rope_parameters": LONG})),
}


def _model_of(name: str) -> str:
    return name.split("@")[0]


def token_ids() -> list[int]:
    return parity.token_ids(VOCAB_SIZE)


_RUNS: dict = {}


def llama(converted, name):
    """llama.cpp's run of case ``name`` (cached for the session: each costs a process start and a model load)."""
    if name not in _RUNS:
        n_ctx = CASES[name][0]
        _RUNS[name] = llamacpp_run.run(converted[_model_of(name)][1], token_ids(), n_ctx=n_ctx)
    return _RUNS[name]


def test_case_list_covers_every_family_and_extra():
    assert {_model_of(n) for n in CASES} == {*FAMILIES, *EXTRA_MODELS}


@pytest.mark.parametrize("name", list(CASES))
def test_llama_cpp_runs_as_transformers_or_as_the_named_cause(converted, name):
    n_ctx, cause = CASES[name]
    model_dir, path = converted[_model_of(name)]
    run = llama(converted, name)
    r = parity.compare(model_dir, path, ids=token_ids(), run=run)
    print(f"{name}: n_ctx {r['n_ctx']}, max |llama.cpp - transformers float64| = {r['max_err']:.3e}, bound "
          f"{r['bound']:.3e} (ratio {r['ratio']:.2e}), max |logit| {r['max_abs_logit']:.2f}")
    assert run.logits.shape == (N_TOKENS, VOCAB_SIZE)
    if cause is None:
        assert r["status"] == "agree", r
        return
    words, changes = cause
    assert r["status"] == "differ", (words, r)
    r2 = parity.compare(model_dir, path, ids=token_ids(), run=run, changes=changes)
    print(f"  as llama.cpp reads it ({changes}): max err {r2['max_err']:.3e}, bound {r2['bound']:.3e}")
    assert r2["status"] == "agree", (words, r2)


@pytest.mark.parametrize("name", list(CASES))
def test_the_gguf_reader_predicts_the_run(converted, name):
    """read_gguf at the context llama.cpp allocated, compared with the transformers config at the run's positions:
    agree exactly where llama.cpp's logits agree with transformers."""
    n_ctx, cause = CASES[name]
    model_dir, path = converted[_model_of(name)]
    allocated = llama(converted, name).info["n_ctx"]
    assert allocated == allocated_context(n_ctx or N_TOKENS, 0)  # the reader's padding is the runtime's
    result = check.check([check.read(f"hf:{model_dir}"), read_gguf(path, n_ctx=allocated)], position=N_TOKENS - 1,
                         n_ctx=allocated)
    assert result["ok"] == (cause is None), (name, result["mismatches"], result["problems"])


def test_longrope_reading_follows_the_allocated_context(converted):
    _, path = converted["phi3_longrope_l256"]
    short = read_gguf(path, n_ctx=256).layers[0].scaling
    long = read_gguf(path, n_ctx=257).layers[0].scaling
    assert short["short_factor"] == short["long_factor"] == pytest.approx([1.0, 1.1, 1.2, 1.5, 2.0, 3.0])
    assert long["short_factor"] == long["long_factor"] == pytest.approx([1.0, 1.5, 2.0, 4.0, 6.0, 8.0])
    default = read_gguf(path).layers[0].scaling  # llama.cpp's default context: the file's context_length 1024
    assert default["short_factor"] == long["short_factor"]
    assert any("allocated context" in n for n in read_gguf(path).notes)


def test_ropelab_check_ctx_decides_longrope(converted, capsys):
    model_dir, path = converted["phi3_longrope_l256"]
    assert check.main([str(model_dir), str(path), "--ctx", "256", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_ctx"] == 256
    assert check.main([str(model_dir), str(path), "--ctx", "512", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["mismatches"] and out["mismatches"][0]["kinds"] == ["frequencies"]
    assert check.main([str(model_dir), str(path), "--ctx", "1", "--json"]) == 2
    assert check.main([str(model_dir), str(path), "--ctx", "256", "--position", "300"]) == 2
    assert "past a context" in capsys.readouterr().err


def test_loader_refusal_is_a_problem_and_a_refusal(converted, tmp_path, capsys):
    """llama.cpp refuses a llama file whose rope.dimension_count is not the head dim (src/llama-model.cpp:1450-1454,
    "invalid n_rot"): the run says so as a LoaderRefusal (a ReadError, no crash), ropelab-check as a problem."""
    import gguf

    _, path = converted["llama"]
    bad = tmp_path / "llama_nrot8.gguf"
    _rewrite(path, bad, {"llama.rope.dimension_count": 8})
    with pytest.raises(llamacpp_run.LoaderRefusal, match=r"invalid n_rot: 8, expected 16"):
        llamacpp_run.run(bad, [3, 4])
    reading = read_gguf(bad)
    assert any("invalid n_rot: 8, expected 16" in p for p in reading.problems)
    assert check.main([str(bad)]) == 1
    assert "invalid n_rot" in capsys.readouterr().out
    assert not read_gguf(path).problems  # the faithful file loads, and the reader says nothing
    assert gguf  # the rewrite used llama.cpp's own gguf package


def _rewrite(src, dst, changes):
    """Copy a GGUF file with some scalar metadata values changed (llama.cpp's gguf package reads and writes)."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = changes.get(key, field.contents())
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_run_errors_are_clear(converted, tmp_path):
    _, path = converted["llama"]
    with pytest.raises(ValueError, match="gguf_path"):
        llamacpp_run.run(tmp_path / "missing.gguf", [3])
    with pytest.raises(ValueError, match="tokens"):
        llamacpp_run.run(path, [])
    with pytest.raises(ValueError, match="n_ctx"):
        llamacpp_run.run(path, [3, 4], n_ctx=1)
    with pytest.raises(ValueError, match="n_threads"):
        llamacpp_run.run(path, [3], n_threads=0)
    with pytest.raises(llamacpp_run.RunError, match="n_vocab"):
        llamacpp_run.run(path, [3, VOCAB_SIZE])
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(llamacpp_run.LoaderRefusal, match="refuses"):
        llamacpp_run.run(junk, [3])


def test_versions_record_both_llama_cpps(converted):
    v = llamacpp_run.versions()
    assert v["runtime llama.cpp tag"] == "b11739" and v["converter llama.cpp commit"].startswith("0c1e570")
    info = llama(converted, "llama").info
    assert info["runtime"] == "b11739" and info["runtime_commit"] == llamacpp_run.RUNTIME_COMMIT
    import llama_cpp_py_sync

    assert llamacpp_run.RUNTIME_COMMIT.startswith(llama_cpp_py_sync.__llama_cpp_commit__)
    assert llama_cpp_py_sync.__llama_cpp_tag__ == llamacpp_run.RUNTIME_TAG


def test_pinned_runtime_is_in_the_engines_extra():
    import tomllib

    from ropelab.paths import REPO

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["engines"]
    assert any(e.startswith(f"llama-cpp-py-sync=={llamacpp_run.LLAMA_CPP_PY_SYNC};") for e in extra)
