"""Helpers shared by the tests (imported as ``from _helpers import ...``; fixtures stay in conftest.py)."""

from __future__ import annotations

import torch

from ropelab.precision import UNIT_ROUNDOFF  # u = 2**-p for a p-bit significand

__all__ = ["UNIT_ROUNDOFF", "EXTRA_MODELS", "gamma", "rope_error_bound", "assert_rotations_agree"]


def rope_error_bound(x64: torch.Tensor, y_ref: torch.Tensor, rotary_dim: int, style: str, dtype: torch.dtype):
    """Elementwise bound on |apply_rope(x) - oracle| for input already representable in ``dtype``.

    ropelab forms cos/sin in float64, rounds them once to the compute dtype c (float32 for 16-bit
    inputs), computes y_a = x_a cos - x_b sin (each product and the sum rounded in c), then rounds y
    once to ``dtype``. So |err| <= u_c * 4 (|x_a| + |x_b|) + u_out |y_ref| (+ half the subnormal
    spacing of ``dtype`` for results that underflow).
    """
    from ropelab import pair_indices

    compute = torch.float64 if dtype == torch.float64 else torch.float32
    u_c, u_out = UNIT_ROUNDOFF[compute], (UNIT_ROUNDOFF[dtype] if dtype != compute else 0.0)
    a, b = pair_indices(rotary_dim, style)
    pair_mag = torch.zeros_like(x64)
    s = x64[..., a].abs() + x64[..., b].abs()
    pair_mag[..., a] = s
    pair_mag[..., b] = s
    tiny = torch.finfo(dtype).smallest_normal * UNIT_ROUNDOFF[dtype] if dtype != compute else 0.0
    return 4 * u_c * pair_mag + u_out * y_ref.abs() + tiny


def gamma(n: int, dtype: torch.dtype) -> float:
    """Higham's gamma_n = n u / (1 - n u): a sum of n rounded products is within gamma_n sum |terms| of exact,
    whatever the order of the additions and whether a multiply-add is fused (BLAS and CPUs differ in both)."""
    u = UNIT_ROUNDOFF[dtype]
    return n * u / (1 - n * u)


def assert_rotations_agree(y1: torch.Tensor, y2: torch.Tensor, x: torch.Tensor, rotary_dim: int, style: str):
    """Two float32/float64 RoPE computations of the same x (d last) that may round differently (other shapes,
    strides or code paths: vectorised and scalar loops, other libm calls) agree within twice
    ``rope_error_bound``: each is within it of the exact rotation. Dims past ``rotary_dim`` must be equal."""
    assert y1.dtype == y2.dtype and y1.dtype in (torch.float32, torch.float64), (y1.dtype, y2.dtype)
    bound = 2 * rope_error_bound(x.double(), y2.double(), rotary_dim, style, y1.dtype)
    err = (y1.double() - y2.double()).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


def tiny_llama(layers: int, seed: int = 0, rope=None, l0: int = 32):
    """A randomly initialised Hugging Face ``LlamaForCausalLM`` (4 query heads, 2 key/value heads of 16 dims,
    vocabulary 97), dynamic NTK factor 2 past ``l0`` unless ``rope`` (a v5 rope_parameters dict) is given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=l0,
        rope_parameters=rope or {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    return LlamaForCausalLM(cfg).eval()


# The extra models beside every family of ropelab.engines.tiny.FAMILIES that `converted` saves and converts:
# name -> (family, save_tiny_model overrides).
EXTRA_MODELS = {
    # Gemma 3 off its 5:1 layer pattern (llama.cpp assumes it: load_swa_pattern(ml, 6)).
    "gemma3_2layer": ("gemma3", dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])),
    # Qwen2 yarn with its own betas (the converter writes them, llama.cpp's qwen2 never reads them).
    "qwen2_yarn_beta": ("qwen2_yarn", dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 16.0, "beta_slow": 2.0})),
    # Qwen2 yarn with an explicit attention_factor: the converter writes it as rope.scaling.yarn_attn_factor, which
    # only llama.cpp's grok reads; qwen2 runs the computed 0.1 ln s + 1.
    "qwen2_yarn_attn": ("qwen2_yarn", dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "attention_factor": 0.5})),
    # SmolLM3 with its NoPE layer second, not fourth: llama.cpp hard-codes every 4th layer (n_no_rope_layer_step = 4)
    # and the converter writes nothing for it.
    "smollm3_nope_layer1": ("smollm3", dict(no_rope_layers=[1, 0, 1, 1])),
    # Phi-3 LongRoPE with an original length of 256, llama.cpp's smallest context (it pads n_ctx to a multiple of
    # 256): so a context of 256 runs the short factors and one of 512 the long ones, at the same sequence.
    "phi3_longrope_l256": ("phi3_longrope", dict(max_position_embeddings=1024, original_max_position_embeddings=256,
                                                  rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0], "long_factor": [1.0, 1.5, 2.0, 4.0, 6.0, 8.0],
        "original_max_position_embeddings": 256})),
}
