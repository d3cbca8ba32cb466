r"""The frequency ladder :math:`\omega_i = b^{-2i/r}` and the closed forms built on it: the NTK-aware change of
base, the dynamic-NTK base at length L, and which pair completes a given number of turns within :math:`L_0`.
Pure functions of numbers; the rope types in ``rope_types`` compute with them."""

from __future__ import annotations

import math

import torch

__all__ = ["default_inv_freq", "ntk_aware_base", "pair_at_turns", "critical_pair", "ntk_base"]


def default_inv_freq(rotary_dim: int, base: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    r"""RoFormer's ladder :math:`\omega_i = b^{-2i/r}` for :math:`i = 0 .. r/2 - 1`.

    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", eq. (15).
    The exponent is formed in float64 before the power so float32 results are correctly rounded.

    Args:
        rotary_dim: r, how many dims rotate (even); the ladder has r/2 rungs.
        base: b, the RoPE base (``rope_theta``, 10000 in RoFormer and Llama 2).
        dtype: the dtype of the result (float64 by default).

    Returns a tensor of the r/2 frequencies :math:`\omega_i`, from 1 down to :math:`b^{-(r-2)/r}`.
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return (1.0 / (float(base) ** exponent)).to(dtype)


def ntk_aware_base(base: float, rotary_dim: int, alpha: float) -> float:
    r"""NTK-aware scaling as a change of base (bloc97): :math:`b' = b\,\alpha^{r / (r - 2)}`, which keeps the
    lowest frequency's wavelength :math:`\alpha` times longer. Static NTK-aware scaling uses :math:`\alpha = s`.

    Args:
        base: b, the trained base.
        rotary_dim: r, how many dims rotate (even, at least 4: the exponent divides by r - 2).
        alpha: :math:`\alpha`, how many times longer the lowest frequency's wavelength becomes.

    Returns the new base :math:`b'`."""
    return float(base) * float(alpha) ** (rotary_dim / (rotary_dim - 2))


def pair_at_turns(rotary_dim: int, base: float, original: int, turns: float) -> float:
    r"""The (fractional) pair index whose frequency completes ``turns`` full rotations over the trained context
    :math:`L_0`: pair i turns :math:`L_0\,\omega_i / 2\pi = L_0 b^{-2i/r} / 2\pi` times, so
    :math:`i(\beta) = r \ln(L_0 / 2\pi\beta) / (2 \ln b)`. Pairs above it turn fewer times. YaRN's correction
    range is :math:`[i(\beta_{fast}), i(\beta_{slow})]` (Peng et al. 2023, arXiv 2309.00071, section 3.2).

    Args:
        rotary_dim: r, how many dims rotate.
        base: b, the RoPE base.
        original: :math:`L_0`, the trained context in tokens.
        turns: :math:`\beta`, the number of full turns (YaRN's beta_fast 32 and beta_slow 1 are two such).

    Returns :math:`i(\beta)`, a float: negative when even pair 0 turns fewer times, above r/2 when every pair
    turns more."""
    return (rotary_dim * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))


def critical_pair(rotary_dim: int, base: float, original: int) -> int:
    r"""The first pair whose wavelength :math:`2\pi/\omega_i` exceeds :math:`L_0`, i.e. that never completes a
    turn within the trained context: :math:`\lceil i(1) \rceil` of :func:`pair_at_turns` (clamped to
    ``[0, rotary_dim / 2]``; ``rotary_dim / 2`` means every pair turns). Pairs at or above it only ever saw the
    angles :math:`[0, L_0\omega_i)`, so past :math:`L_0` they meet angles they were never trained on.

    Args:
        rotary_dim: r, how many dims rotate.
        base: b, the RoPE base.
        original: :math:`L_0`, the trained context in tokens.

    Returns the pair index, an int in ``[0, rotary_dim / 2]`` (e.g. 46 for r = 128, b = 10^4, L_0 = 4096:
    notebook 00's 18 pairs that never turn are 46 .. 63)."""
    return min(max(math.ceil(pair_at_turns(rotary_dim, base, original, 1.0)), 0), rotary_dim // 2)


def ntk_base(base: float, rotary_dim: int, seq_len: float, max_position_embeddings: int, factor: float) -> float:
    r"""The dynamic-NTK base :math:`b(L) = b\,(s L / L_0 - (s - 1))^{r / (r - 2)}` for :math:`L > L_0`, else b:
    :func:`ntk_aware_base` at :math:`\alpha(L) = sL/L_0 - (s - 1)`, which reaches :math:`s^2 - s + 1` at
    :math:`L = sL_0` (Hugging Face's ``_compute_dynamic_ntk_parameters``).

    Args:
        base: b, the trained base.
        rotary_dim: r, how many dims rotate.
        seq_len: L, the current length (the cache's length plus the new tokens); below :math:`L_0` it counts as
            :math:`L_0`.
        max_position_embeddings: :math:`L_0`, the trained context (the model config's key of that name).
        factor: s, the ``rope_scaling`` factor.

    Returns the base b(L)."""
    seq_len = max(float(seq_len), float(max_position_embeddings))
    return ntk_aware_base(base, rotary_dim, factor * seq_len / max_position_embeddings - (factor - 1))
