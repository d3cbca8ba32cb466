r"""Causal attention logits and distributions, and how far two of them are apart, query position by position.

For queries and keys :math:`q_m, k_n` (already rotated) the logits are
:math:`\ell_{mn} = q_m\cdot k_n/\sqrt{d}` for :math:`n \le m` and the attention row is
:math:`p_m = \operatorname{softmax}_n \ell_{mn}` (Vaswani et al. 2017, arXiv 1706.03762). Two ways of
computing them (say, RoPE in the style a model was trained with and in the other) are compared per query
position m by

- the relative logit error :math:`\|\hat\ell_{m,\le m} - \ell_{m,\le m}\| / \|\ell_{m,\le m}\|`, and
- the KL divergence :math:`\mathrm{KL}(p_m\,\|\,\hat p_m) = \sum_{n\le m} p_{mn}(\log p_{mn} - \log\hat p_{mn})`,

both over the causal prefix only, averaged over every leading (batch, head) axis. Everything is computed in
float64 from log-softmax, so a near-zero probability gives a finite KL instead of ``log 0``.

The attention a decoder runs (``ropelab.kvcache``) lives here too, in the input's dtype: queries
[b, hq, s, d] against cached keys and values [b, hkv, n, d] with grouped-query attention (each of the
hkv key/value heads serves hq / hkv query heads; Ainslie et al. 2023, arXiv 2305.13245), causal by
position: a query at position p sees the keys at positions <= p.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "causal_logits",
    "kl_divergence",
    "relative_logit_error_by_position",
    "kl_by_position",
    "grouped_scores",
    "attend_scores",
    "attend",
]


def causal_logits(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    r"""Logits :math:`q_m\cdot k_n \cdot s` [..., S, S] (s defaults to :math:`1/\sqrt{d}`), -inf above the
    diagonal. ``q`` and ``k`` are [..., S, d] with the same shape; the result is float64.

    Args:
        q: rotated queries [..., S, d].
        k: rotated keys, q's shape (ValueError otherwise).
        scale: the factor s on every dot product; None: :math:`1/\sqrt{d}`.
    """
    if q.shape != k.shape or q.ndim < 2:
        raise ValueError(
            f"q and k must have the same shape [..., seq, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}."
        )
    s = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    return logits.masked_fill(~mask, float("-inf"))


def _check_pair(ref: torch.Tensor, other: torch.Tensor) -> None:
    if ref.shape != other.shape or ref.ndim < 2 or ref.shape[-1] != ref.shape[-2]:
        raise ValueError(
            f"expected two logit tensors of the same shape [..., S, S] (from causal_logits), got "
            f"{tuple(ref.shape)} and {tuple(other.shape)}."
        )


def relative_logit_error_by_position(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    r"""Relative L2 error of each query's causal logit row, [S], averaged over the leading axes.

    Args:
        ref: the reference logits [..., S, S] (:func:`causal_logits`).
        other: the logits compared with them, ``ref``'s shape (ValueError otherwise).

    Returns float64 [S]: :math:`\|\hat\ell_{m,\le m} - \ell_{m,\le m}\| / \|\ell_{m,\le m}\|`.
    """
    _check_pair(ref, other)
    mask = torch.ones(ref.shape[-1], ref.shape[-1], dtype=torch.bool, device=ref.device).tril()
    r = ref.double().masked_fill(~mask, 0.0)
    o = other.double().masked_fill(~mask, 0.0)
    err = (o - r).norm(dim=-1) / r.norm(dim=-1)
    return err.reshape(-1, ref.shape[-1]).mean(dim=0)


def kl_divergence(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{KL}(\mathrm{softmax}(\ell)\,\|\,\mathrm{softmax}(\hat\ell))` in nats over the last dim of
    two logit tensors of one shape (rows may hold -inf where masked), float64, one value per row.

    Args:
        ref: the reference logits [..., n] (the distribution p).
        other: the other logits, the same shape (the distribution :math:`\hat p`).
    """
    lp, lq = ref.double().log_softmax(dim=-1), other.double().log_softmax(dim=-1)
    p = lp.exp()
    # Masked entries have p = 0 and log p = -inf: their terms are 0, not 0 * nan.
    return torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(dim=-1)


def kl_by_position(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{KL}(\mathrm{softmax}(\ell_m)\,\|\,\mathrm{softmax}(\hat\ell_m))` in nats per query
    position, [S], averaged over the leading axes; ``ref`` and ``other`` are causal logits.

    Args:
        ref: the reference logits [..., S, S] (:func:`causal_logits`).
        other: the logits compared with them, ``ref``'s shape (ValueError otherwise).
    """
    _check_pair(ref, other)
    return kl_divergence(ref, other).reshape(-1, ref.shape[-1]).mean(dim=0)


# --------------------------------------------------------------------------------------------------
# Grouped-query causal attention, as a decoder with a KV cache runs it (input dtype)
# --------------------------------------------------------------------------------------------------


def _group(q: torch.Tensor, n_kv: int) -> torch.Tensor:
    b, hq, s, d = q.shape
    if hq % n_kv:
        raise ValueError(f"query heads {hq} must be a multiple of key/value heads {n_kv}.")
    return q.view(b, n_kv, hq // n_kv, s, d)


def grouped_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""Scores :math:`q\cdot k/\sqrt{d}` [b, hkv, g, s, n] of queries [b, hq, s, d] against keys [b, hkv, n, d],
    query heads grouped g = hq / hkv per key head.

    Args:
        q: queries [b, hq, s, d], rotated.
        k: keys [b, hkv, n, d], rotated; hkv must divide hq (ValueError otherwise).

    Returns the scores in the inputs' dtype.
    """
    return torch.einsum("bhgsd,bhnd->bhgsn", _group(q, k.shape[1]), k) / math.sqrt(q.shape[-1])


def attend_scores(scores: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor,
                  key_pos: torch.Tensor) -> torch.Tensor:
    """Causal softmax of ``grouped_scores`` [b, hkv, g, s, n] and the weighted values: output [b, hq, s, d].

    Args:
        scores: [b, hkv, g, s, n] from :func:`grouped_scores`.
        values: [b, hkv, n, d].
        q_pos: the queries' positions [s]; a query sees the keys at positions <= its own.
        key_pos: the keys' positions [n] (either may be on the host; the mask moves to the scores' device).
    """
    # causal: a query sees keys at or before its position (positions may live on the host, scores on a GPU)
    mask = (key_pos[None, :] <= q_pos[:, None]).to(scores.device)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhgsn,bhnd->bhgsd", probs, values)
    b, hkv, g, s, d = out.shape
    return out.reshape(b, hkv * g, s, d)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor,
           key_pos: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention of rotated queries [b, hq, s, d] over rotated keys [b, hkv, n, d].

    Args:
        q: rotated queries [b, hq, s, d].
        keys: rotated keys [b, hkv, n, d]; hkv must divide hq (grouped-query attention).
        values: [b, hkv, n, d].
        q_pos: the queries' positions [s].
        key_pos: the keys' positions [n]; a query sees the keys at positions <= its own.

    Returns [b, hq, s, d] in the inputs' dtype (:func:`grouped_scores` then :func:`attend_scores`).
    """
    return attend_scores(grouped_scores(q, keys), values, q_pos, key_pos)
