r"""p-RoPE: rotate only the highest-frequency fraction p of the pairs (Barbero et al., 2024).

Barbero, Vitvitskyi, Perivolaropoulos, Pascanu, Veličković, "Round and Round We Go! What makes Rotary
Positional Encodings useful?", ICLR 2025, arXiv:2410.06205 (https://arxiv.org/abs/2410.06205): p-RoPE
removes the lowest frequencies, keeping :math:`\omega_i = b^{-2i/d}` for the first
:math:`\lfloor p\,d/2 \rfloor` pairs and setting the rest to 0 (those pairs pass unrotated, a NoPE
channel); p = 1 is RoPE, p = 0 is NoPE. p is the fraction *kept*: the paper's pseudocode ``apply_p_rope``
takes ``rope_percentage`` and sets ``rope_angles = int(rope_percentage * head_dim // 2)``, ``nope_angles =
head_dim // 2 - rope_angles``, and of its Table 2 it writes "truncating the lowest frequencies not only
maintains the same performance, but even seems to improve the validation perplexity" (both as the paper's
text is reproduced at acmrep2026.k117.org; the arXiv PDF itself was not reachable here). The same ladder is
Google DeepMind's Gemma library (github.com/google-deepmind/gemma, ``gemma/gm/math/_positional_embeddings.py``,
``apply_rope(..., rope_proportion)``, "The proportion of the head dimension to apply RoPE to."): exponents
:math:`2i/d` over the whole head dim for the ``rope_angles`` pairs, an infinite timescale (angle 0) for the
rest, half-style pairs (i, i + d/2), so the unrotated dims are the tail of each half. Hugging Face's
``proportional`` rope type with ``partial_rotary_factor = p`` is this ladder
(:func:`ropelab.scaling.frequencies`), so ``apply_rope(x, layout=..., rope_scaling=p_rope_scaling(p))``
applies p-RoPE.
"""

from __future__ import annotations

import torch

from .scaling import frequencies

__all__ = ["p_rope_scaling", "p_rope_frequencies", "p_rope_similarity_bound", "first_negative_distance"]


def p_rope_scaling(p: float) -> dict:
    """The ``rope_scaling`` dict that makes ``apply_rope`` / ``frequencies`` p-RoPE (0 < p <= 1).

    Args:
        p: the fraction of pairs that rotate, in (0, 1]; p = 0 (NoPE: skip RoPE) and anything else raise
            ValueError. ``{"rope_type": "proportional", "partial_rotary_factor": p}`` is returned.
    """
    if not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
        raise ValueError(f"p is the fraction of pairs that rotate, in (0, 1] (p = 0 is NoPE: skip RoPE); got {p!r}.")
    return {"rope_type": "proportional", "partial_rotary_factor": float(p)}


def p_rope_frequencies(head_dim: int, p: float, base: float = 10000.0) -> torch.Tensor:
    r"""p-RoPE's ladder (float64): :math:`b^{-2i/d}` for :math:`i < \lfloor p d/2\rfloor`, 0 after.

    Args:
        head_dim: d, the head size (even); the ladder has d/2 entries.
        p: the fraction of pairs that rotate, in [0, 1]; p = 0 gives all zeros (NoPE).
        base: RoPE's base b.
    """
    if p == 0:  # NoPE: nothing rotates (Hugging Face's proportional type refuses a factor of 0)
        return torch.zeros(frequencies(head_dim, base)[0].numel(), dtype=torch.float64)
    return frequencies(head_dim, base, rope_scaling=p_rope_scaling(p))[0].to(torch.float64)


def p_rope_similarity_bound(distances, head_dim: int = 128, p: float = 1.0, base: float = 10000.0) -> torch.Tensor:
    r""":math:`B_r = \sum_i \cos(r\,\omega_i)` under p-RoPE (notebook 03's aligned-q,k logit / 2).

    Each unrotated pair adds a constant 1, so :math:`B_r \ge (1-p)\,d/2 - p\,d/2` never decays below
    the NoPE part.

    Args:
        distances: the relative distances r: any shape (flattened) of finite numbers (ValueError otherwise).
        head_dim: d.
        p: the fraction of pairs that rotate, in [0, 1].
        base: RoPE's base b.

    Returns float64 [number of distances].
    """
    r = torch.as_tensor(distances, dtype=torch.float64).reshape(-1)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("distances must be finite numbers.")
    theta = p_rope_frequencies(head_dim, p, base)
    return torch.cos(r[:, None] * theta[None, :]).sum(-1)


def first_negative_distance(head_dim: int, p: float, base: float = 10000.0, max_distance: int = 1 << 16) -> int | None:
    """The smallest distance r <= max_distance with B_r < 0 under p-RoPE, or None if there is none.

    Args:
        head_dim: d.
        p: the fraction of pairs that rotate, in [0, 1].
        base: RoPE's base b.
        max_distance: the largest distance checked; every integer 0 .. max_distance is (in one tensor).
    """
    b = p_rope_similarity_bound(torch.arange(max_distance + 1), head_dim, p, base)
    neg = torch.nonzero(b < 0)
    return int(neg[0]) if neg.numel() else None
