r"""Convert between the two RoPE styles: the exact permutation, for vectors and for q/k weights.

The half style pairs dims (i, i + r/2), the interleaved style (2i, 2i + 1). Both are the same
block-diagonal rotation written in two orders of the head dims: with the permutation P that sends
interleaved dim 2i to half dim i and 2i + 1 to half dim i + r/2,

.. math::  R^{half}_m = P\,R^{int}_m\,P^\top,

so rotating ``P x`` in the half style equals ``P`` applied to ``x`` rotated in the interleaved style,
and :math:`\langle R^{half}_m P q, R^{half}_n P k\rangle = \langle R^{int}_m q, R^{int}_n k\rangle`.
Permuting the output rows of :math:`W_q` and :math:`W_k` therefore moves a model from one style to the
other with identical attention scores: this is what Hugging Face's Llama conversion script does to
Meta's checkpoints (``permute`` in ``convert_llama_weights_to_hf.py``).
"""

from __future__ import annotations

import torch

from .core import check_style, pair_indices
from .scaling import check_rotary_dim

__all__ = [
    "style_permutation",
    "half_to_interleaved",
    "interleaved_to_half",
    "convert_style",
    "permute_qk_weight",
    "permute_qkv_weight",
]


def style_permutation(head_dim: int, *, src: str, dst: str, rotary_dim: int | None = None) -> torch.Tensor:
    """Index ``idx`` with ``y = x[..., idx]`` re-ordering dims of style ``src`` into style ``dst``.

    Dims at and past ``rotary_dim`` stay where they are.

    Args:
        head_dim: d, the length of the permutation.
        src: the style x is in: ``"half"`` (pairs (i, i + r/2)) or ``"interleaved"`` (pairs (2i, 2i + 1)).
        dst: the style wanted.
        rotary_dim: how many leading dims rotate (even); None for the whole head.
    """
    check_style(src)
    check_style(dst)
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    check_rotary_dim(rotary_dim, head_dim)
    idx = torch.arange(head_dim)
    a_src, b_src = pair_indices(rotary_dim, src)
    a_dst, b_dst = pair_indices(rotary_dim, dst)
    # Pair i sits at (a_src[i], b_src[i]) in src and must land at (a_dst[i], b_dst[i]) in dst.
    idx[a_dst] = a_src
    idx[b_dst] = b_src
    return idx


def convert_style(x: torch.Tensor, *, src: str, dst: str, rotary_dim: int | None = None) -> torch.Tensor:
    """Re-order the last dim of ``x`` from style ``src`` to style ``dst`` (pair i keeps its values).

    Args:
        x: vectors whose last dim is the head dim.
        src: the style of x: ``"half"`` (pairs (i, i + r/2)) or ``"interleaved"`` (pairs (2i, 2i + 1)).
        dst: the style wanted.
        rotary_dim: how many leading dims rotate (even); None for the whole head.
    """
    return x[..., style_permutation(x.shape[-1], src=src, dst=dst, rotary_dim=rotary_dim).to(x.device)]


def half_to_interleaved(x: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """``[x0 .. x_{r/2-1}, x_{r/2} .. x_{r-1}]`` -> ``[x0, x_{r/2}, x1, x_{r/2+1}, ...]`` on the last dim.

    Args:
        x: vectors in the ``"half"`` style, head dim last.
        rotary_dim: how many leading dims rotate; None for the whole head.
    """
    return convert_style(x, src="half", dst="interleaved", rotary_dim=rotary_dim)


def interleaved_to_half(x: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """``[x0, x1, x2, x3, ...]`` -> ``[x0, x2, ..., x1, x3, ...]`` on the last dim (inverse of the above).

    Args:
        x: vectors in the ``"interleaved"`` style, head dim last.
        rotary_dim: how many leading dims rotate; None for the whole head.
    """
    return convert_style(x, src="interleaved", dst="half", rotary_dim=rotary_dim)


def permute_qk_weight(
    w: torch.Tensor, n_heads: int, *, src: str, dst: str, rotary_dim: int | None = None
) -> torch.Tensor:
    """Permute the output rows of a q or k projection (weight [n_heads * head_dim, in], or bias [n_heads * head_dim])
    so a model trained with RoPE style ``src`` gives identical scores with style ``dst``.

    ``src="interleaved", dst="half"`` is the Meta-to-Hugging-Face Llama conversion; the reverse undoes it.
    For grouped-query attention pass the number of key/value heads for ``W_k``.

    Args:
        w: the projection's weight [n_heads * head_dim, in] or its bias [n_heads * head_dim].
        n_heads: how many heads this projection produces (key/value heads for ``W_k`` under grouped-query
            attention).
        src: the style the model was trained with: ``"half"`` (pairs (i, i + r/2)) or ``"interleaved"``
            (pairs (2i, 2i + 1)).
        dst: the style wanted.
        rotary_dim: how many leading dims rotate (even); None for the whole head.
    """
    if w.ndim not in (1, 2):
        raise ValueError(f"w must be a weight [out, in] or a bias [out], got shape {tuple(w.shape)}.")
    out = w.shape[0]
    if n_heads <= 0 or out % n_heads:
        raise ValueError(
            f"w has {out} output rows, not a multiple of n_heads={n_heads}; pass the number of heads this "
            "projection produces (key/value heads for W_k under grouped-query attention)."
        )
    head_dim = out // n_heads
    idx = style_permutation(head_dim, src=src, dst=dst, rotary_dim=rotary_dim).to(w.device)
    heads = w.reshape(n_heads, head_dim, *w.shape[1:])
    return heads[:, idx].reshape(w.shape)


def permute_qkv_weight(w: torch.Tensor, n_heads: int, *, src: str, dst: str, rotary_dim: int | None = None):
    """``permute_qk_weight`` for a packed projection ``[W_q; W_k; W_v]`` (three equal row blocks, as in
    GPT-NeoX's ``query_key_value`` or ``ropelab.models``' ``qkv``): the q and k blocks are permuted head by
    head, the v block is left alone (values are not rotated).

    Args:
        w: the packed weight [3 n_heads head_dim, in] or bias [3 n_heads head_dim].
        n_heads: heads per block (q, k and v have the same number in a packed projection).
        src: the style the model was trained with: ``"half"`` (pairs (i, i + r/2)) or ``"interleaved"``
            (pairs (2i, 2i + 1)).
        dst: the style wanted.
        rotary_dim: how many leading dims rotate (even); None for the whole head.
    """
    if w.shape[0] % 3:
        raise ValueError(f"a packed qkv projection has 3 equal row blocks; got {w.shape[0]} rows.")
    q, k, v = w.split(w.shape[0] // 3, dim=0)
    kw = dict(src=src, dst=dst, rotary_dim=rotary_dim)
    return torch.cat([permute_qk_weight(q, n_heads, **kw), permute_qk_weight(k, n_heads, **kw), v], dim=0)
