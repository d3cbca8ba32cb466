"""Helpers shared by the tests (imported as ``from _helpers import ...``; fixtures stay in conftest.py)."""

from __future__ import annotations

import torch

from ropelab.precision import UNIT_ROUNDOFF  # u = 2**-p for a p-bit significand

__all__ = ["UNIT_ROUNDOFF", "rope_error_bound"]


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
