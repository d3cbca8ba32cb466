"""ggml's RoPE inside llama.cpp: a tiny Hugging Face model, converted by llama.cpp's own converter, run through
llama.cpp (llama-cpp-python, `make ggml`), gives transformers' logits on the same token ids.

The oracle is transformers' forward in float64 on the same weights. llama.cpp computes in float32 throughout
(ropelab.engines.ggml switches its float16 KV cache off), so its logits differ from the oracle by float32
rounding only. The bound is Higham's: every value is a dot product or sum of at most K rounded terms, with
K = hidden + intermediate + n_tokens (the longest accumulations of one block: a projection, the MLP's down
projection, the attention average), so each block's output carries a relative error of at most gamma_K,
and the L blocks and the output projection add theirs along the residual stream. To first order the logit
error is then at most (L + 1) gamma_K times S, the largest sum of |terms| of the output projection,
S = max_v sum_j |W_out[v, j]| |h_L[j]| (h_L the oracle's final normed hidden state); the RMSNorm's
rescaling keeps the residual stream's errors relative, so no larger amplification arises at this depth.
A wrong RoPE (a rope_theta changed after conversion) moves the logits by orders of magnitude more.

The tiny models and their sentencepiece tokenizer are built here (a minimal local version of the tiny-model
builder issue 22 shares; the lead reconciles it with ropelab.engines.tiny).
"""

from __future__ import annotations

import io
import json
import math
import os

import pytest
import torch
from _helpers import gamma

from ropelab.engines import converter, ggml

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")



def _missing(load) -> str | None:
    try:
        load()
    except ImportError as e:
        return str(e)
    return None


# llama-cpp-python compiles llama.cpp (about 4 CPU-minutes): opt-in, `make ggml`. Its tests skip until it is built,
# unless ROPELAB_REQUIRE_GGML=1, where a missing build is a failure. ggml's RoPE op alone also runs on the prebuilt
# CPU libraries of llama-cpp-py-sync (the engines extra), so those tests run in make test.
_NO_LLAMA_CPP, _NO_GGML = _missing(ggml.llama_cpp), _missing(ggml.ggml_libraries)
if _NO_LLAMA_CPP and os.environ.get("ROPELAB_REQUIRE_GGML") == "1":
    raise ImportError(_NO_LLAMA_CPP)
needs_llama_cpp = pytest.mark.skipif(_NO_LLAMA_CPP is not None, reason=str(_NO_LLAMA_CPP))
needs_ggml = pytest.mark.skipif(_NO_GGML is not None, reason=str(_NO_GGML))

N_TOKENS, HIDDEN, INTERMEDIATE, N_LAYERS, N_HEADS, N_KV, HEAD_DIM = 24, 64, 128, 2, 4, 2, 16

ARCHS = {
    # NORM type: the converter permutes q/k so that ggml's adjacent pairs equal transformers' half pairs.
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    # llama3 scaling: the converter writes it as the rope_freqs tensor (per-pair frequency divisors).
    "llama3": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    # NEOX type: no permutation, ggml rotates (i, i + n/2) like transformers.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    # yarn: the converter writes scaling.type, factor and original_context_length; ggml blends the frequencies
    # over beta_fast..beta_slow and multiplies cos/sin by the attention factor 0.1 ln(factor) + 1.
    "qwen2-yarn": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}}),
}


def _tokenizer_model() -> bytes:
    """A tiny sentencepiece model trained in code: the converter reads tokenizer.model for both archs."""
    words = ["rope", "angle", "base", "pair", "half", "norm", "neox", "ggml", "llama", "token", "phase", "scale"]
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[i] for i in torch.randint(len(words), (8,), generator=g).tolist()) for _ in range(200)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=64, model_type="bpe", character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )
    return buf.getvalue()


@pytest.fixture(scope="module")
def tokenizer_model() -> bytes:
    return _tokenizer_model()


def tiny_model(arch: str, tokenizer: bytes, directory, *, seed: int = 0):
    """A seeded random tiny model of ``arch``, saved with its tokenizer in ``directory``; returns the model."""
    config_cls, model_cls, extra = ARCHS[arch]
    sp = spm.SentencePieceProcessor(model_proto=tokenizer)
    config = getattr(transformers, config_cls)(
        vocab_size=sp.vocab_size(), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, num_key_value_heads=N_KV, head_dim=HEAD_DIM, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        # Weights of std 1/sqrt(fan_in) (not transformers' 0.02), so attention is far from uniform and the
        # logits depend on RoPE strongly enough to see a wrong one.
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 * (HIDDEN**0.5 if "embed" in name else 1.0))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape))
            else:  # RMSNorm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
    model.save_pretrained(directory)
    (directory / "tokenizer.model").write_bytes(tokenizer)
    (directory / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "add_eos_token": False}))
    return model


def hf_logits(model, ids: list[int], rope_parameters: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' float64 logits and S per position (the sum of |terms| of the output projection).

    ``rope_parameters`` replaces the model's RoPE (same weights) for the deliberately wrong oracles.
    """
    m = model
    if rope_parameters is not None:
        m = type(model)(type(model.config).from_dict({**model.config.to_dict(), "rope_parameters": rope_parameters}))
        m.load_state_dict(model.state_dict())
        m.eval()
    m = m.to(torch.float64)
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_hidden_states=True)
    h = out.hidden_states[-1][0]  # the final normed hidden state (transformers applies the norm to the last)
    s = (h.abs() @ m.lm_head.weight.abs().T).amax(dim=-1)
    m.to(torch.float32)
    return out.logits[0], s


def bound(s: torch.Tensor) -> torch.Tensor:
    return (N_LAYERS + 1) * gamma(HIDDEN + INTERMEDIATE + N_TOKENS, torch.float32) * s.max()


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tokenizer_model):
    """converted(arch) -> (transformers model, GGUF path), built and converted once per module, on first use."""
    ggml.llama_cpp()  # fail early, naming `make ggml`, before the slow conversions
    cache = {}

    def get(arch):
        if arch not in cache:
            d = tmp_path_factory.mktemp(arch)
            model = tiny_model(arch, tokenizer_model, d / "hf")
            cache[arch] = (model, converter.convert(d / "hf", d / f"{arch}.gguf"))
        return cache[arch]

    return get


def token_ids(vocab: int) -> list[int]:
    return torch.randint(3, vocab, (N_TOKENS,), generator=torch.Generator().manual_seed(7)).tolist()


@needs_llama_cpp
@pytest.mark.parametrize("arch", list(ARCHS))
def test_llama_cpp_logits_match_transformers(converted, arch):
    model, path = converted(arch)
    ids = token_ids(model.config.vocab_size)
    ref, s = hf_logits(model, ids)
    got = ggml.logits(path, ids, n_threads=1)
    assert got.shape == ref.shape
    err = (got - ref).abs().max().item()
    print(f"{arch}: max |llama.cpp - transformers float64| = {err:.3e}, bound {bound(s):.3e}, "
          f"max |logit| {ref.abs().max():.3f}")
    assert err <= bound(s)


# Each GGUF against an oracle whose RoPE differs in one thing the GGUF encodes: the parity tests above would
# fail if llama.cpp dropped or misread that thing.
WRONG = {
    "rope_theta changed after conversion": ("llama", {"rope_type": "default", "rope_theta": 20000.0}),
    "llama3 scaling dropped (no rope_freqs)": ("llama3", {"rope_type": "default", "rope_theta": 500000.0}),
    "yarn dropped": ("qwen2-yarn", {"rope_type": "default", "rope_theta": 10000.0}),
    "yarn without its attention factor": ("qwen2-yarn", {**ARCHS["qwen2-yarn"][2]["rope_parameters"],
                                                         "attention_factor": 1.0}),
}


@needs_llama_cpp
@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_rope_is_caught(converted, case):
    arch, rope_parameters = WRONG[case]
    model, path = converted(arch)
    ids = token_ids(model.config.vocab_size)
    ref, s = hf_logits(model, ids, rope_parameters)
    err = (ggml.logits(path, ids, n_threads=1) - ref).abs().max().item()
    print(f"{arch} vs {case}: max |diff| = {err:.3e}, bound {bound(s):.3e}")
    assert err > 100 * bound(s)


@needs_llama_cpp
def test_bad_input_is_a_clear_error(converted, tmp_path):
    model, path = converted("llama")
    with pytest.raises(ValueError, match="n_threads"):
        ggml.logits(path, [3, 4], n_threads=0)
    with pytest.raises(ValueError, match="tokens"):
        ggml.logits(path, [], n_threads=1)
    with pytest.raises(ValueError, match=r"n_vocab"):
        ggml.logits(path, [3, model.config.vocab_size], n_threads=1)
    with pytest.raises(ValueError, match="gguf_path"):
        ggml.logits(tmp_path / "missing.gguf", [3], n_threads=1)
    with pytest.raises(ValueError, match="n_ctx"):
        ggml.logits(path, [3, 4], n_threads=1, n_ctx=1)


def test_missing_llama_cpp_names_the_make_target(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    with pytest.raises(ImportError, match="make ggml"):
        ggml.llama_cpp()


def test_pinned_version_is_the_one_built():
    # pyproject's `ggml` extra, the Makefile's build (which reads ropelab.engines.converter) and the converter agree.
    import tomllib

    from ropelab.paths import REPO

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ggml"]
    assert extra == [f"llama-cpp-python=={ggml.LLAMA_CPP_PYTHON_VERSION}"]


# --- ggml's RoPE op itself (ggml_rope_ext through ctypes) against ropelab's float64 rotation ---------------------
#
# ggml forms the angles in float32: s = powf(base, -2/n) (the exponent's rounding amplified by ln(base) 2/n), then
# theta_i = p s^i by i successive multiplications, divided by freq_factors[i] and, for YaRN, interpolated and blended
# (a few more roundings), so |theta_i error| <= theta_i (i (2 ln(base) / n + 2) + 8) u32. A rotated pair moves by at
# most that times a (|x_a| + |x_b|), a the cos/sin factor, plus 6 u32 a (|x_a| + |x_b|) for cosf/sinf, the
# products, the sum and the attention-factor product.

def ggml_rope_bound(x64, theta64, n_dims, base, style, factor=1.0):
    from ropelab import pair_indices

    u = 2.0**-24
    i = torch.arange(n_dims // 2, dtype=torch.float64)
    rel = (i * (2 * math.log(base) / n_dims + 2) + 8) * u
    a, b = pair_indices(n_dims, style)
    pair = x64[..., a].abs() + x64[..., b].abs()  # [s, h, n/2]
    per_pair = factor * pair * (theta64.abs()[:, None, :] * rel + 6 * u)
    out = torch.zeros_like(x64)
    out[..., a], out[..., b] = per_pair, per_pair
    return out


def ropelab_rope(x, pos, inv_freq, style, factor=1.0):
    from ropelab.core import cos_sin, rotate

    cos, sin = cos_sin(pos, inv_freq, factor, dtype=torch.float64)
    return rotate(x.double(), cos[:, None, :], sin[:, None, :], style=style), pos.double()[:, None] * inv_freq


OP_CASES = {
    # name: (ggml mode, ropelab style, n_dims of head_dim 32, base, ggml kwargs, ropelab scaling)
    "neox": ("neox", "half", 32, 10000.0, {}, None),
    "norm": ("norm", "interleaved", 32, 10000.0, {}, None),
    "neox-partial": ("neox", "half", 16, 1e6, {}, None),
    "norm-freq-factors": ("norm", "interleaved", 32, 500000.0, {"freq_factors": True}, None),
    "neox-yarn": ("neox", "half", 32, 10000.0, {"freq_scale": 0.25, "ext_factor": 1.0, "n_ctx_orig": 64},
                  {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
}


@needs_ggml
@pytest.mark.parametrize("case", list(OP_CASES))
def test_ggml_rope_op_matches_ropelab(case):
    from ropelab import frequencies

    mode, style, n_dims, base, kwargs, scaling = OP_CASES[case]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 3, 32, generator=g)
    pos = torch.cat([torch.arange(20), torch.randint(20, 8192, (20,), generator=g)])
    kwargs = dict(kwargs)
    ff = None
    if kwargs.pop("freq_factors", False):
        ff = 1.0 + 7.0 * torch.rand(n_dims // 2, generator=g)  # llama3-like divisors in [1, 8]
        kwargs["freq_factors"] = ff
    y = ggml.rope(x, pos, n_dims=n_dims, mode=mode, freq_base=base, **kwargs)
    if scaling is None:
        inv_freq = base ** (-torch.arange(0, n_dims, 2, dtype=torch.float64) / n_dims)
        factor = 1.0
    else:
        inv_freq, factor = frequencies(n_dims, base=base, rope_scaling=scaling)
    if ff is not None:
        inv_freq = inv_freq / ff.double()
    ref, theta = ropelab_rope(x[..., :n_dims], pos, inv_freq, style, factor)
    err = (y[..., :n_dims].double() - ref).abs()
    bound = ggml_rope_bound(x[..., :n_dims].double(), theta, n_dims, base, style, factor)
    print(f"{case}: max |ggml - ropelab float64| = {err.max():.3e}, worst err/bound = {(err / bound).max():.3f}")
    assert (err <= bound).all()
    assert torch.equal(y[..., n_dims:], x[..., n_dims:])  # the dims past n_dims pass through untouched


@needs_ggml
@pytest.mark.parametrize("mode, wrong_style", [("norm", "half"), ("neox", "interleaved")])
def test_ggml_rope_op_pairing_is_not_the_other_style(mode, wrong_style):
    x = torch.randn(8, 2, 32, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(8)
    inv_freq = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    ref, theta = ropelab_rope(x, pos, inv_freq, wrong_style)
    err = (ggml.rope(x, pos, n_dims=32, mode=mode).double() - ref).abs()
    assert (err > ggml_rope_bound(x.double(), theta, 32, 10000.0, wrong_style)).any()
    assert err.max() > 0.1


@needs_ggml
def test_ggml_rope_op_bad_input():
    x = torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match="mode"):
        ggml.rope(x, torch.arange(4), n_dims=8, mode="vision")
    with pytest.raises(ValueError, match="positions"):
        ggml.rope(x, torch.arange(4), n_dims=8, mode="mrope", sections=[2, 1, 1])
    with pytest.raises(ValueError, match="sections"):
        ggml.rope(x, torch.arange(4), n_dims=8, mode="neox", sections=[2, 1, 1])
    with pytest.raises(ValueError, match="n_dims"):
        ggml.rope(x, torch.arange(4), n_dims=10, mode="neox")
    with pytest.raises(ValueError, match="positions"):
        ggml.rope(x, torch.arange(3), n_dims=8, mode="neox")
    with pytest.raises(ValueError, match="x must"):
        ggml.rope(x[0], torch.arange(4), n_dims=8, mode="neox")


@needs_ggml
@pytest.mark.parametrize("mode, interleaved", [("mrope", False), ("imrope", True)])
def test_ggml_mrope_op_matches_ropelab_multiaxis(mode, interleaved):
    # Qwen2-VL's contiguous sections and Qwen3-VL's interleaved ones, on one head ladder, NEOX (half) pairs.
    from ropelab.core import rotate
    from ropelab.multiaxis import MultiAxis, axis_angles

    sections = MultiAxis.mrope([6, 5, 5], interleaved=interleaved)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(30, 2, 32, generator=g)
    pos = torch.randint(0, 2048, (3, 30), generator=g)
    y = ggml.rope(x, pos, n_dims=32, mode=mode, freq_base=1e6, sections=list(sections.sections))
    inv_freq = 1e6 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    theta = axis_angles(pos, sections, inv_freq)  # [s, r/2]
    ref = rotate(x.double(), torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :], style="half")
    err = (y.double() - ref).abs()
    bound = ggml_rope_bound(x.double(), theta, 32, 1e6, "half")
    print(f"{mode}: max |ggml - ropelab float64| = {err.max():.3e}, worst err/bound = {(err / bound).max():.3f}")
    assert (err <= bound).all()
    # The other section layout is a different rotation.
    other = axis_angles(pos, MultiAxis.mrope([6, 5, 5], interleaved=not interleaved), inv_freq)
    wrong = rotate(x.double(), torch.cos(other)[:, None, :], torch.sin(other)[:, None, :], style="half")
    assert (y.double() - wrong).abs().max() > 0.1
