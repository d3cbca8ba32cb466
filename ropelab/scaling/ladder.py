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
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return (1.0 / (float(base) ** exponent)).to(dtype)


def ntk_aware_base(base: float, rotary_dim: int, alpha: float) -> float:
    r"""NTK-aware scaling as a change of base (bloc97): :math:`b' = b\,\alpha^{r / (r - 2)}`, which keeps the
    lowest frequency's wavelength :math:`\alpha` times longer. Static NTK-aware scaling uses :math:`\alpha = s`."""
    return float(base) * float(alpha) ** (rotary_dim / (rotary_dim - 2))


def pair_at_turns(rotary_dim: int, base: float, original: int, turns: float) -> float:
    r"""The (fractional) pair index whose frequency completes ``turns`` full rotations over the trained context
    :math:`L_0`: pair i turns :math:`L_0\,\omega_i / 2\pi = L_0 b^{-2i/r} / 2\pi` times, so
    :math:`i(\beta) = r \ln(L_0 / 2\pi\beta) / (2 \ln b)`. Pairs above it turn fewer times. YaRN's correction
    range is :math:`[i(\beta_{fast}), i(\beta_{slow})]` (Peng et al. 2023, arXiv 2309.00071, section 3.2)."""
    return (rotary_dim * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))


def critical_pair(rotary_dim: int, base: float, original: int) -> int:
    r"""The first pair whose wavelength :math:`2\pi/\omega_i` exceeds :math:`L_0`, i.e. that never completes a
    turn within the trained context: :math:`\lceil i(1) \rceil` of :func:`pair_at_turns` (clamped to
    ``[0, rotary_dim / 2]``; ``rotary_dim / 2`` means every pair turns). Pairs at or above it only ever saw the
    angles :math:`[0, L_0\omega_i)`, so past :math:`L_0` they meet angles they were never trained on."""
    return min(max(math.ceil(pair_at_turns(rotary_dim, base, original, 1.0)), 0), rotary_dim // 2)


def ntk_base(base: float, rotary_dim: int, seq_len: float, max_position_embeddings: int, factor: float) -> float:
    r"""The dynamic-NTK base :math:`b(L) = b\,(s L / L_0 - (s - 1))^{r / (r - 2)}` for :math:`L > L_0`, else b:
    :func:`ntk_aware_base` at :math:`\alpha(L) = sL/L_0 - (s - 1)`, which reaches :math:`s^2 - s + 1` at
    :math:`L = sL_0` (Hugging Face's ``_compute_dynamic_ntk_parameters``)."""
    seq_len = max(float(seq_len), float(max_position_embeddings))
    return ntk_aware_base(base, rotary_dim, factor * seq_len / max_position_embeddings - (factor - 1))
