"""ropelab.engines.mlx against MLX's and mlx-lm's own code: mx.fast.rope under every flag, each mlx-lm rope class,
read_mlx against RopeSpec.per_layer (transformers' reading of the same config.json), diagnose on MLX functions.

Bounds (as tests/test_hf_parity.py derives them): MLX forms its frequencies and angles in float32, ropelab its
oracle in float64. A period base**(2i/r) in float32 has relative error about (ln(base) + 4) u32, the angle
m * omega one more rounding, so |angle error| <= theta_max (ln(base) + 6) u32 and a rotated pair moves by at most
that times its norm (times the attention factor), plus a few u32 for the products: 8 u32.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import pytest
import torch

mx = pytest.importorskip("mlx.core")
rope_utils = pytest.importorskip("mlx_lm.models.rope_utils")

import ropelab  # noqa: E402
from ropelab import RopeSpec, apply_rope  # noqa: E402
from ropelab.engines import ReadError, Reading  # noqa: E402
from ropelab.engines import mlx as M  # noqa: E402
from ropelab.precision import UNIT_ROUNDOFF  # noqa: E402

U32 = UNIT_ROUNDOFF[torch.float32]
HEAD_DIM = 32
T = 24
MAX_POS = 32  # the trained context of the length-dependent types; T + offset crosses it


def _x(seed: int, d: int = HEAD_DIM, t: int = T) -> torch.Tensor:
    return torch.randn(2, 3, t, d, generator=torch.Generator().manual_seed(seed))  # b h s d


def _bound(x: torch.Tensor, spec: RopeSpec, seq_len: int, last_position: float) -> float:
    inv, af = spec.frequencies(HEAD_DIM, seq_len=seq_len)
    theta_max = last_position * float(inv.max()) if inv.numel() else 0.0
    pair = float(x.abs().max()) * 2 * af
    return pair * (theta_max * (math.log(spec.base) + 6) * U32 + 8 * U32)


def _run_mlx(fn, x: torch.Tensor) -> torch.Tensor:
    return M.to_torch(fn(M.to_mx(x))).double()


# --------------------------------------------------------------------------------------------------
# The boundary and the measured conventions of mx.fast.rope
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_arrays_cross_the_boundary_unchanged(dtype):
    t = (torch.randn(3, 5) * 100).to(dtype)
    a = M.to_mx(t)
    assert str(a.dtype).endswith({torch.bfloat16: "bfloat16"}.get(dtype, str(dtype).split(".")[-1]))
    back = M.to_torch(a)
    assert back.dtype == dtype and torch.equal(back, t)  # a conversion, not a computation: the same values


def test_boundary_refuses_other_types():
    with pytest.raises(ValueError, match="torch.Tensor"):
        M.to_mx([1.0, 2.0])
    with pytest.raises(ValueError, match="mx.array"):
        M.to_torch(torch.zeros(2))


def test_freqs_are_periods_not_inv_freq():
    """Measured: freqs=1/omega gives the base ladder's rotation; freqs=omega (inv_freq) does not."""
    x = _x(0)
    inv = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    by_base = _run_mlx(lambda a: mx.fast.rope(a, HEAD_DIM, traditional=False, base=1e4, scale=1.0, offset=0), x)
    periods = M.to_mx((1 / inv).float())
    by_periods = _run_mlx(lambda a: mx.fast.rope(a, HEAD_DIM, traditional=False, base=None, scale=1.0, offset=0,
                                                 freqs=periods), x)
    by_inv = _run_mlx(lambda a: mx.fast.rope(a, HEAD_DIM, traditional=False, base=None, scale=1.0, offset=0,
                                             freqs=M.to_mx(inv.float())), x)
    bound = _bound(x, RopeSpec(base=1e4), T, T - 1)
    assert (by_base - by_periods).abs().max() <= 2 * bound
    assert (by_base - by_inv).abs().max() > 0.1


def test_traditional_is_interleaved():
    x = _x(1)
    y = _run_mlx(lambda a: mx.fast.rope(a, HEAD_DIM, traditional=True, base=1e4, scale=1.0, offset=0), x)
    inter = apply_rope(x.double(), layout="b h s d", style="interleaved")
    half = apply_rope(x.double(), layout="b h s d", style="half")
    assert (y - inter).abs().max() <= _bound(x, RopeSpec(), T, T - 1)
    assert (y - half).abs().max() > 0.1


FLAGS = [(trad, dims, base, scale, offset, use_freqs)
         for trad in (False, True) for dims in (HEAD_DIM, HEAD_DIM // 2) for base in (1e4, 5e5)
         for scale in (1.0, 0.25) for offset in (0, 37, "array") for use_freqs in (False, True)]


@pytest.mark.parametrize("trad, dims, base, scale, offset, use_freqs", FLAGS,
                         ids=["-".join(map(str, f)) for f in FLAGS])
def test_fast_rope_parity_under_every_flag(trad, dims, base, scale, offset, use_freqs):
    """mx.fast.rope(dims, traditional, base | freqs, scale, offset) == apply_rope(spec_from_fast_rope(...)) within
    float32 bounds; and fast_rope_kwargs gives back the same call."""
    x = _x(2)
    freqs = None
    if use_freqs:
        freqs = M.to_mx(base ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims).float())
    spec = M.spec_from_fast_rope(dims, trad, None if use_freqs else base, scale, freqs, HEAD_DIM)
    assert spec.style == ("interleaved" if trad else "half")
    assert (spec.rotary_dim or HEAD_DIM) == dims
    assert spec.base == pytest.approx(base, rel=1e-4)
    assert spec.rope_type == ("default" if scale == 1.0 else "linear")
    off = 37 if offset == "array" else offset
    mx_off = mx.array(37) if offset == "array" else offset
    y = _run_mlx(lambda a: mx.fast.rope(a, dims, traditional=trad, base=None if use_freqs else base, scale=scale,
                                        offset=mx_off, freqs=freqs), x)
    ref = apply_rope(x.double(), layout="b h s d", spec=spec, offset=off)
    assert (y - ref).abs().max() <= _bound(x, spec, T, off + T - 1)
    kw = M.fast_rope_kwargs(spec, HEAD_DIM)
    y2 = _run_mlx(lambda a: mx.fast.rope(a, offset=mx_off, **kw), x)
    assert (y2 - ref).abs().max() <= _bound(x, spec, T, off + T - 1)
    assert kw["dims"] == dims and kw["traditional"] == trad


SCALINGS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": MAX_POS},
    "yarn-no-temperature": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS,
                            "attention_factor": 1.0},
    "proportional": {"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "longrope-no-temperature": {"rope_type": "longrope", "original_max_position_embeddings": MAX_POS,
                                "attention_factor": 1.0, "short_factor": [1.0] * 16,
                                "long_factor": [1.0 + 0.2 * i for i in range(16)]},
}


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("trad", [False, True])
def test_fast_rope_kwargs_of_the_freqs_types(name, trad):
    """llama3, yarn, proportional (infinite periods), dynamic and longrope at a stated length as fast.rope freqs;
    spec_from_fast_rope with the rope dict reads the call back."""
    params = SCALINGS[name]
    spec = RopeSpec.from_rope_dict({**params, "rope_theta": 1e4}, head_dim=HEAD_DIM,
                                   style="interleaved" if trad else "half", max_position_embeddings=MAX_POS)
    x = _x(3)
    for seq_len in (T, 3 * MAX_POS):
        kw = M.fast_rope_kwargs(spec, HEAD_DIM, seq_len=seq_len)
        assert kw["base"] is None and kw["freqs"] is not None
        y = _run_mlx(lambda a, kw=kw: mx.fast.rope(a, offset=0, **kw), x)
        ref = apply_rope(x.double(), layout="b h s d", spec=spec, seq_len=seq_len)
        assert (y - ref).abs().max() <= _bound(x, spec, seq_len, T - 1)
        back = M.spec_from_fast_rope(kw["dims"], trad, None, 1.0, kw["freqs"], HEAD_DIM,
                                     rope_parameters={**params, "rope_theta": 1e4}, max_position_embeddings=MAX_POS,
                                     seq_len=seq_len)
        assert back == spec


def test_fast_rope_kwargs_refuses_what_one_call_cannot_express():
    with pytest.raises(ValueError, match="without RoPE"):
        M.fast_rope_kwargs(RopeSpec.nope(), HEAD_DIM)
    yarn = RopeSpec(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    with pytest.raises(ValueError, match="attention_factor=1.13863.*multiply x"):
        M.fast_rope_kwargs(yarn, HEAD_DIM)
    dyn = RopeSpec(scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=32)
    with pytest.raises(ValueError, match="seq_len="):
        M.fast_rope_kwargs(dyn, HEAD_DIM)
    with pytest.raises(ValueError, match="spec must be a ropelab.RopeSpec"):
        M.fast_rope_kwargs({"base": 1e4}, HEAD_DIM)


def test_spec_from_fast_rope_refuses_bad_input():
    periods = M.to_mx((1e4 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM)).float())
    with pytest.raises(ValueError, match="exactly one of base and freqs"):
        M.spec_from_fast_rope(HEAD_DIM, False, 1e4, 1.0, periods, HEAD_DIM)
    with pytest.raises(ValueError, match="exactly one of base and freqs"):
        M.spec_from_fast_rope(HEAD_DIM, False, None, 1.0, None, HEAD_DIM)
    with pytest.raises(ValueError, match="dims must be"):
        M.spec_from_fast_rope(HEAD_DIM + 2, False, 1e4, 1.0, None, HEAD_DIM)
    with pytest.raises(ValueError, match="dims/2 = 8 periods"):
        M.spec_from_fast_rope(16, False, None, 1.0, periods, HEAD_DIM)
    with pytest.raises(ValueError, match="not inv_freq"):
        M.spec_from_fast_rope(HEAD_DIM, False, None, 1.0, -periods, HEAD_DIM)
    llama3 = rope_utils.Llama3RoPE(HEAD_DIM, base=1e4, scaling_config=SCALINGS["llama3"])
    with pytest.raises(ValueError, match="not a geometric ladder.*rope_parameters="):
        M.spec_from_fast_rope(HEAD_DIM, False, None, 1.0, llama3._freqs, HEAD_DIM)
    with pytest.raises(ValueError, match="do not give these periods"):  # the ladder checked, not trusted
        M.spec_from_fast_rope(HEAD_DIM, False, None, 1.0, llama3._freqs, HEAD_DIM,
                              rope_parameters={**SCALINGS["llama3"], "factor": 4.0, "rope_theta": 1e4})


# --------------------------------------------------------------------------------------------------
# mlx-lm's rope classes
# --------------------------------------------------------------------------------------------------

# (initialize_rope's scaling_config, dims) per rope type mlx-lm 0.32.2 handles; the HF dict is the same keys.
MLX_LM_TYPES = {
    "default": (None, HEAD_DIM),
    "linear": ({"rope_type": "linear", "factor": 4.0}, HEAD_DIM),
    "dynamic": ({"rope_type": "dynamic", "factor": 4.0}, HEAD_DIM),
    "llama3": (SCALINGS["llama3"], HEAD_DIM),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS}, HEAD_DIM),
    "yarn-mscale": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS,
                     "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2}, HEAD_DIM),
    "proportional": ({"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5}, HEAD_DIM),
    "partial-default": (None, HEAD_DIM // 2),
}


def _hf_spec(scaling, dims, trad, base=1e4) -> RopeSpec:
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": base}
    if dims != HEAD_DIM:
        params["partial_rotary_factor"] = dims / HEAD_DIM
    return RopeSpec.from_rope_dict(params, head_dim=HEAD_DIM, style="interleaved" if trad else "half",
                                   max_position_embeddings=MAX_POS)


@pytest.mark.parametrize("name", list(MLX_LM_TYPES))
@pytest.mark.parametrize("trad", [False, True])
@pytest.mark.parametrize("offset", [0, 20])
def test_initialize_rope_parity(name, trad, offset):
    """Each module initialize_rope returns, run on x, equals apply_rope with the transformers dict of the same
    keys (float32 bounds), and spec_from_mlx_rope reads the module as a spec that computes the same."""
    scaling, dims = MLX_LM_TYPES[name]
    module = rope_utils.initialize_rope(dims, 1e4, trad, scaling_config=scaling, max_position_embeddings=MAX_POS)
    expected_class = {"default": "RoPE", "linear": "RoPE", "partial-default": "RoPE", "dynamic":
                      "DynamicNTKScalingRoPE", "llama3": "Llama3RoPE", "yarn": "YarnRoPE", "yarn-mscale": "YarnRoPE",
                      "proportional": "ProportionalRoPE"}[name]
    assert type(module).__name__ == expected_class
    x = _x(4)
    y = _run_mlx(lambda a: module(a, offset=offset), x)
    seq_len = offset + T  # mlx-lm's DynamicNTKScalingRoPE: max(T + offset, L0); apply_rope: max position + 1
    hf = _hf_spec(scaling, dims, trad)
    ref = apply_rope(x.double(), layout="b h s d", spec=hf, offset=offset)
    assert (y - ref).abs().max() <= _bound(x, hf, seq_len, offset + T - 1)
    read = M.spec_from_mlx_rope(module, head_dim=HEAD_DIM, base=1e4, scaling_config=scaling,
                                max_position_embeddings=MAX_POS)
    ref_read = apply_rope(x.double(), layout="b h s d", spec=read, offset=offset)
    assert (ref_read - ref).abs().max() <= _bound(x, hf, seq_len, offset + T - 1)


@pytest.mark.parametrize("name", list(MLX_LM_TYPES))
@pytest.mark.parametrize("trad", [False, True])
def test_mlx_rope_from_spec_runs_the_spec(name, trad):
    scaling, dims = MLX_LM_TYPES[name]
    spec = _hf_spec(scaling, dims, trad)
    module = M.mlx_rope_from_spec(spec, HEAD_DIM)
    x = _x(6, t=2 * MAX_POS)
    y = _run_mlx(lambda a: module(a, offset=3), x)
    ref = apply_rope(x.double(), layout="b h s d", spec=spec, offset=3)
    assert (y - ref).abs().max() <= _bound(x, spec, 2 * MAX_POS + 3, 2 * MAX_POS + 2)


def test_mlx_rope_from_spec_refuses_what_mlx_lm_cannot_express():
    short, long = [1.0] * 16, [1.0 + 0.2 * i for i in range(16)]
    longrope = RopeSpec(scaling={"rope_type": "longrope", "short_factor": short, "long_factor": long,
                                 "original_max_position_embeddings": MAX_POS}, max_position_embeddings=4 * MAX_POS)
    with pytest.raises(ValueError, match="SuScaledRoPE cannot express this longrope spec: at length 1 "):
        M.mlx_rope_from_spec(longrope, HEAD_DIM)
    same = dataclasses.replace(longrope, scaling={**longrope.scaling, "short_factor": long})
    M.mlx_rope_from_spec(same, HEAD_DIM)  # long_factor everywhere: what SuScaledRoPE does
    with pytest.raises(ValueError, match="rotates 'half' pairs only"):
        M.mlx_rope_from_spec(dataclasses.replace(same, style="interleaved"), HEAD_DIM)
    yarn = RopeSpec(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS,
                             "attention_factor": 1.5}, max_position_embeddings=4 * MAX_POS)
    with pytest.raises(ValueError, match="attention factor is 1.13863, the spec's 1.5"):
        M.mlx_rope_from_spec(yarn, HEAD_DIM)
    untruncated = RopeSpec(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS,
                                    "truncate": False}, max_position_embeddings=4 * MAX_POS)
    with pytest.raises(ValueError, match="do not give these periods"):  # YarnRoPE always floors / ceils
        M.mlx_rope_from_spec(untruncated, HEAD_DIM)
    with pytest.raises(ValueError, match="without RoPE"):
        M.mlx_rope_from_spec(RopeSpec.nope(), HEAD_DIM)


def test_what_initialize_rope_returns_per_type():
    """The rope types of mlx-lm's initialize_rope, measured: 'su' is not among them (phi3 and phimoe build
    SuScaledRoPE themselves), 'mrope' is a 1D nn.RoPE (its sections dropped), longrope is SuScaledRoPE."""
    def make(scaling):
        return rope_utils.initialize_rope(HEAD_DIM, 1e4, False, scaling_config=scaling, max_position_embeddings=MAX_POS)

    long = {"rope_type": "longrope", "original_max_position_embeddings": MAX_POS, "short_factor": [1.0] * 16,
            "long_factor": [2.0] * 16}
    assert type(make(long)).__name__ == "SuScaledRoPE"
    mrope = make({"rope_type": "mrope", "mrope_section": [4, 6, 6]})
    assert type(mrope).__name__ == "RoPE"
    assert M.spec_from_mlx_rope(mrope, head_dim=HEAD_DIM) == RopeSpec(base=1e4)
    for kind in ("deepseek_yarn", "telechat3-yarn"):
        assert type(make({"rope_type": kind, "factor": 4.0})).__name__ == "YarnRoPE"
    with pytest.raises(ValueError, match="Unsupported RoPE type su"):
        make({"type": "su", "short_factor": [1.0] * 16, "long_factor": [1.0] * 16})


def test_su_scaled_rope_uses_long_factor_at_every_length():
    """A real disagreement: transformers' longrope uses short_factor up to the original length; mlx-lm's
    SuScaledRoPE (phi3, phimoe, minicpm3, initialize_rope's longrope) uses long_factor at every length, so at
    positions below the original length the two differ; past it they agree."""
    short, long = [1.0] * 16, [1.0 + 0.2 * i for i in range(16)]
    module = rope_utils.SuScaledRoPE(HEAD_DIM, base=1e4, max_position_embeddings=4 * MAX_POS,
                                     original_max_position_embeddings=MAX_POS, short_factor=short, long_factor=long)
    hf = RopeSpec.from_rope_dict({"rope_type": "longrope", "rope_theta": 1e4, "short_factor": short,
                                  "long_factor": long, "original_max_position_embeddings": MAX_POS},
                                 head_dim=HEAD_DIM, max_position_embeddings=4 * MAX_POS)
    x = _x(5)
    y = _run_mlx(module, x)
    at_short = apply_rope(x.double(), layout="b h s d", spec=hf, seq_len=T)  # T < L0: short_factor
    at_long = apply_rope(x.double(), layout="b h s d", spec=hf, seq_len=4 * MAX_POS)  # long_factor
    bound = _bound(x, hf, T, T - 1)
    assert (y - at_long).abs().max() <= bound
    assert (y - at_short).abs().max() > 100 * bound
    read = M.spec_from_mlx_rope(module, head_dim=HEAD_DIM, base=1e4,
                                scaling_config={"type": "longrope", "short_factor": short, "long_factor": long},
                                max_position_embeddings=4 * MAX_POS)
    assert read.scaling["short_factor"] == long  # the spec says what mlx-lm does
    assert read.frequencies(HEAD_DIM, seq_len=T)[1] == pytest.approx(float(module._scale), rel=1e-6)


def test_yarn_mscale_without_mscale_all_dim_differs_from_transformers():
    """A real disagreement: with mscale alone (no mscale_all_dim), transformers' yarn attention factor is
    0.1 ln(s) + 1 (mscale ignored); mlx-lm's YarnRoPE uses 0.1 mscale ln(s) + 1. read_mlx's spec carries mlx-lm's
    value as attention_factor."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS, "mscale": 2.0}
    module = rope_utils.initialize_rope(HEAD_DIM, 1e4, False, scaling_config=scaling, max_position_embeddings=MAX_POS)
    hf_af = _hf_spec(scaling, HEAD_DIM, False).frequencies(HEAD_DIM)[1]
    assert hf_af == pytest.approx(0.1 * math.log(4) + 1)
    assert module.mscale == pytest.approx(0.2 * math.log(4) + 1)
    read = M.spec_from_mlx_rope(module, head_dim=HEAD_DIM, base=1e4, scaling_config=scaling,
                                max_position_embeddings=MAX_POS)
    assert read.scaling["attention_factor"] == pytest.approx(module.mscale)


def test_spec_from_mlx_rope_refuses_unknown_classes_and_missing_base():
    with pytest.raises(ValueError, match="not one ropelab maps"):
        M.spec_from_mlx_rope(mx, head_dim=HEAD_DIM)
    module = rope_utils.initialize_rope(HEAD_DIM, 1e4, False, scaling_config=SCALINGS["llama3"],
                                        max_position_embeddings=MAX_POS)
    with pytest.raises(ValueError, match="pass base="):
        M.spec_from_mlx_rope(module, head_dim=HEAD_DIM)


# --------------------------------------------------------------------------------------------------
# read_mlx: mlx-lm's reading of a config.json against transformers' (RopeSpec.per_layer)
# --------------------------------------------------------------------------------------------------

COMMON = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=128, rms_norm_eps=1e-6, max_position_embeddings=512,
              tie_word_embeddings=True)
AGREE = {
    "llama-llama3": dict(model_type="llama", rope_theta=5e5, rope_scaling=SCALINGS["llama3"]),
    "qwen2": dict(model_type="qwen2", rope_theta=1e6),
    "qwen3-yarn": dict(model_type="qwen3", head_dim=16, rope_theta=1e6,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
    "gemma3-sliding": dict(model_type="gemma3_text", head_dim=16, rope_theta=1e6, rope_local_base_freq=2e4,
                           sliding_window_pattern=2, sliding_window=8, rope_scaling={"rope_type": "linear",
                                                                                      "factor": 8.0}),
    "smollm3-nope": dict(model_type="smollm3", rope_theta=2e6, no_rope_layers=[1, 1, 0, 1]),
}


def _write(tmp_path, config) -> str:
    d = tmp_path / config["model_type"]
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**COMMON, **config}))
    return str(d)


def _transformers_specs(path: str) -> tuple[RopeSpec, ...]:
    from transformers import AutoConfig

    return RopeSpec.per_layer(AutoConfig.from_pretrained(path))


def _differences(a: RopeSpec, b: RopeSpec, head_dim: int) -> list[str]:
    """What differs in the rotation two specs compute (not how their dicts spell it): style, rotary_dim, NoPE,
    inv_freq and attention factor at a short and a long current length."""
    if a.is_nope or b.is_nope:
        return [] if a.is_nope == b.is_nope else ["nope"]
    out = [k for k in ("style",) if getattr(a, k) != getattr(b, k)]
    if (a.rotary_dim or head_dim) != (b.rotary_dim or head_dim):
        out.append("rotary_dim")
    for L in (16, 4 * COMMON["max_position_embeddings"]):
        (ia, fa), (ib, fb) = a.frequencies(head_dim, seq_len=L), b.frequencies(head_dim, seq_len=L)
        if ia.shape != ib.shape or not torch.allclose(ia, ib, rtol=1e-6, atol=0):
            out.append(f"inv_freq@{L}")
        if abs(fa - fb) > 1e-6 * fb:
            out.append(f"attention_factor@{L}")
    return out


@pytest.mark.parametrize("name", list(AGREE))
def test_read_mlx_agrees_with_transformers(tmp_path, name):
    path = _write(tmp_path, AGREE[name])
    reading = M.read_mlx(path)
    assert isinstance(reading, Reading) and reading.format == "mlx"
    hf = _transformers_specs(path)
    assert reading.n_layers == len(hf) == COMMON["num_hidden_layers"]
    for i, (mine, theirs) in enumerate(zip(reading.layers, hf)):
        assert _differences(mine, theirs, reading.head_dim) == [], (i, mine, theirs)
    assert reading.to_dict()["format"] == "mlx"
    if name == "gemma3-sliding":
        assert [s.base for s in reading.layers] == [2e4, 1e6, 2e4, 1e6]
    if name == "smollm3-nope":
        assert [s.is_nope for s in reading.layers] == [False, False, True, False]


def test_read_mlx_phi3_longrope_disagrees_below_the_original_length(tmp_path):
    """Phi-3 with longrope and a partial rotary factor: mlx-lm keeps the rotary slice and the attention factor,
    and disagrees only in the factor set below the original length (SuScaledRoPE's long_factor everywhere)."""
    path = _write(tmp_path, dict(model_type="phi3", rope_theta=1e4, partial_rotary_factor=0.5,
                                 original_max_position_embeddings=64,
                                 rope_scaling={"type": "longrope", "short_factor": [1.0] * 4,
                                               "long_factor": [1.0 + i for i in range(4)]}))
    reading = M.read_mlx(path)
    hf = _transformers_specs(path)
    assert {tuple(_differences(m, t, reading.head_dim)) for m, t in zip(reading.layers, hf)} == {("inv_freq@16",)}
    assert reading.layers[0].rotary_dim == 8
    assert any("long_factor at every length" in n for n in reading.notes)


V5 = {  # (the transformers config class, its arguments, the bases mlx-lm's ModelArgs defaults give instead)
    "llama": ("LlamaConfig", dict(rope_theta=5e5, rope_scaling=SCALINGS["llama3"]), [1e4] * 4),
    "qwen2": ("Qwen2Config", dict(rope_theta=5e5), [1e6] * 4),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=16, rope_theta=2e6, rope_local_base_freq=5e4,
                                             sliding_window_pattern=2), [1e4, 1e6, 1e4, 1e6]),
}


@pytest.mark.parametrize("name", list(V5))
def test_read_mlx_drops_transformers5_rope_parameters(tmp_path, name):
    """A real disagreement: a config written by transformers 5 (rope_parameters, no rope_theta / rope_scaling /
    rope_local_base_freq at the top) loses its bases and scaling in mlx-lm's llama, qwen2 and gemma3_text, whose
    ModelArgs read the v4 keys only: they run their own default bases, unscaled. read_mlx names the unread key.
    (mlx-lm's qwen3 reads rope_parameters.)"""
    import transformers

    cls, kwargs, mlx_bases = V5[name]
    common = {k: v for k, v in COMMON.items() if k != "rms_norm_eps"}
    d = tmp_path / name
    getattr(transformers, cls)(**common, **kwargs).save_pretrained(d)
    written = json.loads((d / "config.json").read_text())
    assert "rope_parameters" in written and written.get("rope_theta") is None
    reading = M.read_mlx(d)
    hf = _transformers_specs(str(d))
    assert [s.base for s in reading.layers] == mlx_bases
    assert [s.base for s in hf] != mlx_bases
    assert all("inv_freq@16" in _differences(m, t, reading.head_dim) for m, t in zip(reading.layers, hf))
    if name == "llama":
        assert hf[0].rope_type == "llama3" and reading.layers[0].rope_type == "default"
    assert any("does not read ['rope_parameters'" in n for n in reading.notes)


def test_read_mlx_qwen2_ignores_head_dim(tmp_path):
    """A real disagreement: mlx-lm's qwen2 computes head_dim = hidden_size // num_attention_heads and ignores a
    config's head_dim, which transformers' Qwen2 reads."""
    path = _write(tmp_path, dict(model_type="qwen2", rope_theta=1e6, head_dim=32))
    reading = M.read_mlx(path)
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(path).head_dim == 32
    assert reading.head_dim == COMMON["hidden_size"] // COMMON["num_attention_heads"] == 16
    assert any("does not read ['head_dim']" in n for n in reading.notes)


DEEPSEEK_V3 = dict(model_type="deepseek_v3", num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
                   num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                   v_head_dim=16, qk_nope_head_dim=8, first_k_dense_replace=4, n_group=1, topk_group=1, rope_theta=1e4,
                   rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                 "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1})


def test_read_mlx_deepseek_v3_yarn_agrees(tmp_path):
    path = _write(tmp_path, DEEPSEEK_V3)
    reading = M.read_mlx(path)
    assert reading.head_dim == 8 and reading.layers[0].style == "interleaved"
    for mine, theirs in zip(reading.layers, _transformers_specs(path)):
        assert _differences(mine, theirs, 8) == []


def test_read_mlx_deepseek_v3_ignores_rope_interleave(tmp_path):
    """A real disagreement: transformers' DeepSeek-V3 reads rope_interleave (false: half pairs); mlx-lm's
    deepseek_v3 passes traditional=True always."""
    path = _write(tmp_path, {**DEEPSEEK_V3, "rope_interleave": False})
    reading = M.read_mlx(path)
    hf = _transformers_specs(path)
    assert {tuple(_differences(m, t, 8)) for m, t in zip(reading.layers, hf)} == {("style",)}
    assert any("does not read ['rope_interleave']" in n for n in reading.notes)


def test_read_mlx_yarn_without_original_length_disagrees(tmp_path):
    """A real disagreement: a yarn dict without original_max_position_embeddings is max_position_embeddings (512)
    in transformers and YarnRoPE's default 4096 (read from its signature) in mlx-lm."""
    assert M.yarn_defaults()["original_max_position_embeddings"] == 4096
    path = _write(tmp_path, dict(model_type="qwen3", head_dim=16, rope_theta=1e6,
                                 rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    reading = M.read_mlx(path)
    hf = _transformers_specs(path)
    assert reading.layers[0].scaling["original_max_position_embeddings"] == 4096
    assert "inv_freq@16" in _differences(reading.layers[0], hf[0], 16)
    assert any("'original_max_position_embeddings': 4096" in n for n in reading.notes)


def test_read_mlx_llama3_defaults_it_cannot_read_are_a_read_error(tmp_path):
    """Llama3RoPE fills a missing original_max_position_embeddings (8192 in its body, not its signature): ropelab
    cannot read that default, and the check of the periods says so instead of guessing."""
    scaling = {k: v for k, v in SCALINGS["llama3"].items() if k != "original_max_position_embeddings"}
    path = _write(tmp_path, dict(model_type="llama", rope_theta=5e5, rope_scaling=scaling))
    with pytest.raises(ReadError, match="layer 0 .*Llama3RoPE.*do not give these periods"):
        M.read_mlx(path)


def test_read_mlx_bad_input(tmp_path):
    with pytest.raises(ReadError, match="no config.json"):
        M.read_mlx(tmp_path)
    with pytest.raises(ReadError, match="no such file"):
        M.read_mlx(tmp_path / "absent")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ReadError, match="not a readable JSON"):
        M.read_mlx(tmp_path)
    with pytest.raises(ReadError, match="no 'model_type'"):
        M.read_mlx({"hidden_size": 64})
    with pytest.raises(ReadError, match="no model code for model_type 'nosuchmodel'"):
        M.read_mlx({"model_type": "nosuchmodel"})
    with pytest.raises(ReadError, match="refuses this config"):
        M.read_mlx({"model_type": "llama"})  # ModelArgs needs hidden_size, ...


def test_is_mlx_model_dir(tmp_path):
    """Measured: mlx_lm.utils.save_model writes safetensors metadata format=mlx; transformers writes format=pt."""
    from mlx_lm.utils import _get_classes, save_model

    config = {**COMMON, **AGREE["qwen2"]}
    model_class, args_class = _get_classes(config)
    mlx_dir = tmp_path / "mlx"
    save_model(mlx_dir, model_class(args_class.from_dict(config)))
    (mlx_dir / "config.json").write_text(json.dumps(config))
    assert M.is_mlx_model_dir(mlx_dir)
    from transformers import AutoConfig, AutoModelForCausalLM

    pt_dir = tmp_path / "pt"
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).save_pretrained(pt_dir)
    assert not M.is_mlx_model_dir(pt_dir)
    assert not M.is_mlx_model_dir(tmp_path / "absent")
    assert M.read_mlx(mlx_dir).architecture == M.read_mlx(pt_dir).architecture == "qwen2"


# --------------------------------------------------------------------------------------------------
# diagnose on MLX functions
# --------------------------------------------------------------------------------------------------

DIAG = [(False, HEAD_DIM, 1e4, 1.0), (True, HEAD_DIM, 5e5, 1.0), (False, HEAD_DIM // 2, 1e4, 0.25),
        (True, HEAD_DIM // 2, 1e6, 0.5)]


@pytest.mark.parametrize("trad, dims, base, scale", DIAG, ids=["-".join(map(str, d)) for d in DIAG])
def test_diagnose_reads_mx_fast_rope(trad, dims, base, scale):
    fn = functools.partial(mx.fast.rope, dims=dims, traditional=trad, base=base, scale=scale, offset=0)
    dg = ropelab.diagnose(fn, layout="b h s d", sizes={"d": HEAD_DIM}, max_position=256)  # detected as MLX
    assert dg.ok, dg
    assert dg.style == ("interleaved" if trad else "half")
    assert dg.rotary_dim == dims
    assert dg.base == pytest.approx(base, rel=1e-3)
    want = None if scale == 1.0 else {"rope_type": "linear", "factor": pytest.approx(1 / scale, rel=1e-3)}
    assert (dg.rope_scaling if dg.rope_scaling is None else dict(dg.rope_scaling)) == want


def test_diagnose_mlx_framework_argument():
    module = rope_utils.initialize_rope(HEAD_DIM // 2, 5e5, True, scaling_config={"rope_type": "linear", "factor": 4.0})
    dg = ropelab.diagnose(lambda a: module(a), layout="b h s d", sizes={"d": HEAD_DIM}, max_position=256,
                          framework="mlx")  # a lambda is defined here: told, not detected
    assert dg.ok and (dg.style, dg.rotary_dim) == ("interleaved", HEAD_DIM // 2)
    assert dg.base == pytest.approx(5e5, rel=1e-3)
    assert dict(dg.rope_scaling) == {"rope_type": "linear", "factor": pytest.approx(4.0, rel=1e-3)}
    with pytest.raises(ValueError, match="not a tensor"):  # undetected, an MLX function fails the torch contract
        ropelab.diagnose(lambda a: module(M.to_mx(a)), layout="b h s d", sizes={"d": HEAD_DIM}, max_position=64)
    with pytest.raises(ValueError, match="framework must be one of"):
        ropelab.diagnose(module, layout="b h s d", framework="jax")


def test_compare_takes_mlx_functions():
    a = functools.partial(mx.fast.rope, dims=HEAD_DIM, traditional=True, base=1e4, scale=1.0, offset=0)
    cmp = ropelab.compare(a, lambda x: apply_rope(x, layout="b h s d"), layout="b h s d", sizes={"d": HEAD_DIM},
                          max_position=64)
    assert any("pair" in s or "style" in s for s in cmp.differences), cmp


def test_reading_specs_replace_cleanly():
    """The specs a Reading holds are plain RopeSpecs (dataclasses.replace works on them)."""
    reading = M.read_mlx({**COMMON, **AGREE["qwen2"]})
    assert dataclasses.replace(reading.layers[0], base=2e4).base == 2e4
