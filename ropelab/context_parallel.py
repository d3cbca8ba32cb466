r"""Context parallelism's load-balanced layout: which tokens a rank holds, and their global positions.

With context parallelism (CP) over ``cp`` ranks, every sequence of length s is cut into :math:`2\,cp` chunks of
:math:`c = s / (2\,cp)` tokens and rank r holds chunks r and :math:`2\,cp - 1 - r`:

.. math::
    \mathcal{P}_r = [\,r c,\ (r+1) c\,) \;\cup\; [\,(2cp - 1 - r) c,\ (2cp - r) c\,),
    \qquad |\mathcal{P}_r| = 2c = s / cp,

in that order (the first chunk's tokens, then the second's). Under a causal mask the token at position p
attends to p + 1 keys, and every rank's work is the same:
:math:`\sum_{p \in \mathcal{P}_r} (p + 1) = c^2 (2cp - 1) + c(c + 1)`, whatever r. This is the layout of
Transformer Engine (``_get_freqs_on_this_cp_rank`` and the fused kernels of
``transformer_engine/pytorch/attention/rope.py``; ``get_batch_on_this_cp_rank`` in
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``) and of Megatron-LM
(``get_batch_on_this_cp_rank`` in ``megatron/core/utils.py``). A packed (``thd``, varlen) batch is split
sequence by sequence: each sequence of ``cu_seqlens`` by the rule above, the rank's pieces packed in sequence
order, so its local ``cu_seqlens`` is the global one divided by ``cp`` (Transformer Engine's ``cu_seqlens //
cp_size``, which it expects to be the padded ``cu_seqlens``).

RoPE on a rank must rotate each local token by its *global* position: rotating the local tensor with 0, 1, 2,
... (or with ``cu_seqlens`` restarting at the local boundaries) is wrong on every rank but a ``cp == 1`` one.
The recipe with :func:`ropelab.apply_rope`::

    x_r = cp_slice(x, cp, r, seq_dim=1)                                   # [b, s/cp, h, d], this rank's tokens
    y_r = apply_rope(x_r, cp_positions(s, cp, r), layout="b s h d")        # = cp_slice(apply_rope(x, ...), ...)

    cu_r, pos_r, idx_r = cp_varlen(cu_seqlens, cp, r)                      # packed: x_r = x[idx_r]
    y_r = apply_rope(x[idx_r], pos_r, layout="t h d")                     # explicit positions, not cu_seqlens
    # cu_r is for the attention kernel (flash-attn varlen); give apply_rope the positions instead, as
    # cu_seqlens would restart them at 0 at each local boundary.

A per-sequence offset (Transformer Engine's ``start_positions``) adds to these positions: ``offset=start`` with a
``b`` axis, or ``pos_r + start.repeat_interleave(cu_r.diff())`` for a packed batch.

Every sequence length must be a multiple of :math:`2\,cp` when ``cp > 1`` (Transformer Engine pads each
sequence to one, its ``cu_seqlens_padded``; Megatron-LM's docstring says the same); ``cp == 1`` is the identity
for any length. The helpers only compute indices; no communication happens here.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .core import check_cu_seqlens

__all__ = ["CPVarlen", "cp_positions", "cp_varlen", "cp_slice", "cp_gather"]


class CPVarlen(NamedTuple):
    """What one rank holds of a packed batch (:func:`cp_varlen`).

    Args:
        local_cu_seqlens: the rank's cumulative lengths, ``cu_seqlens // cp_size`` (cu_seqlens' dtype).
        positions: int64 [t / cp_size], the global position (within its sequence) of each local token.
        token_index: int64 [t / cp_size], where each local token sits in the global packed tensor, so that
            ``x_global[token_index]`` (``index_select`` on the token axis) is the rank's slice.
    """

    local_cu_seqlens: torch.Tensor
    positions: torch.Tensor
    token_index: torch.Tensor


def _int(value: Any, name: str) -> int:
    """``value`` as a Python int, or ValueError (a bool, a float, a string are refused, not rounded)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got a bool ({value!r}).")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {type(value).__name__} ({value!r}).") from None


def _check_cp(cp_size: Any, cp_rank: Any) -> tuple[int, int]:
    cp_size, cp_rank = _int(cp_size, "cp_size"), _int(cp_rank, "cp_rank")
    if cp_size < 1:
        raise ValueError(f"cp_size must be at least 1 (the number of context-parallel ranks), got {cp_size}.")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, cp_size) = [0, {cp_size}), got {cp_rank}.")
    return cp_size, cp_rank


def _check_divisible(lengths: torch.Tensor, cp_size: int, what: str) -> None:
    """Every length a multiple of 2 cp_size when cp_size > 1; else ValueError naming the first that is not."""
    if cp_size == 1:
        return
    m = 2 * cp_size
    bad = torch.nonzero(lengths % m).flatten()
    if bad.numel():
        i = int(bad[0])
        n = int(lengths[i])
        where = f"sequence {i} of {what} has length {n}" if what != "seq_len" else f"seq_len {n}"
        others = bad.numel() - 1
        more = f" ({others} more sequence{'s' if others > 1 else ''} too)" if others else ""
        raise ValueError(
            f"{where}, not a multiple of 2*cp_size = {m}{more}: the load-balanced layout cuts each sequence into "
            f"2*cp_size equal chunks. Pad it to {-(-n // m) * m} tokens (each sequence to a multiple of {m}, as "
            "Transformer Engine's cu_seqlens_padded does)."
        )


def _dual_chunk(lengths: torch.Tensor, cp_size: int, cp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For sequences of ``lengths`` (int64, each a multiple of 2 cp_size, or any with cp_size 1): the global
    position of each of the rank's tokens, and the index of its sequence. Local token k of a sequence with
    chunk size c sits at :math:`r c + k` if k < c, else at :math:`(2cp - 1 - r) c + (k - c)`; with cp = 1 both
    branches give k, so no length needs to be even there."""
    local = lengths // cp_size
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), local)
    starts = torch.cumsum(local, 0) - local
    k = torch.arange(int(local.sum()), device=lengths.device) - starts[seq]
    c = (local // 2)[seq]
    first = cp_rank * c + k
    second = (2 * cp_size - 1 - cp_rank) * c + (k - c)
    return torch.where(k < c, first, second), seq


def cp_positions(seq_len: int, cp_size: int, cp_rank: int, *, device: torch.device | str | None = None
                 ) -> torch.Tensor:
    r"""The global positions of the tokens rank ``cp_rank`` holds of a sequence of ``seq_len`` tokens (bshd, sbhd).

    int64, length ``seq_len / cp_size``: with :math:`c = s / (2\,cp)`, the positions :math:`rc, \dots, (r+1)c - 1`
    then :math:`(2cp - 1 - r)c, \dots, (2cp - r)c - 1` (see the module docstring). They are also the indices of
    the rank's tokens along the sequence axis (:func:`cp_slice`), and go to
    ``apply_rope(x_local, positions, layout=...)`` as they are. ``seq_len`` is the *global* length; it must be a
    multiple of ``2 * cp_size`` when ``cp_size > 1`` (ValueError naming the padded length otherwise).

    Args:
        seq_len: s, the global sequence length, an int >= 0 (a bool or a float raises ValueError).
        cp_size: the number of context-parallel ranks, an int >= 1.
        cp_rank: this rank, an int in [0, cp_size).
        device: where the result lives; None: the default device.
    """
    seq_len = _int(seq_len, "seq_len")
    cp_size, cp_rank = _check_cp(cp_size, cp_rank)
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0 (the global sequence length), got {seq_len}.")
    lengths = torch.tensor([seq_len], dtype=torch.int64, device=device)
    _check_divisible(lengths, cp_size, "seq_len")
    return _dual_chunk(lengths, cp_size, cp_rank)[0]


def cp_varlen(cu_seqlens: Any, cp_size: int, cp_rank: int) -> CPVarlen:
    r"""What rank ``cp_rank`` holds of a packed batch with global ``cu_seqlens``: a :class:`CPVarlen`.

    Each sequence i (length :math:`L_i`, a multiple of :math:`2\,cp`) is split as in :func:`cp_positions`; the
    rank's pieces are packed in sequence order, so ``local_cu_seqlens = cu_seqlens // cp_size``. ``positions``
    restart at 0 for each sequence and skip the chunks other ranks hold; ``token_index`` is
    ``cu_seqlens[i] + position`` for each local token of sequence i. Rotate with the positions, not the local
    cu_seqlens: ``apply_rope(x_global[token_index], positions, layout="t h d")``.

    ``cu_seqlens`` is checked by :func:`ropelab.core.check_cu_seqlens` (integer, 1-D, starts at 0, never
    decreases); a sequence length not a multiple of ``2 * cp_size`` (when ``cp_size > 1``) raises ValueError
    naming the sequence, its length and the padded length. Results live on cu_seqlens' device.

    Args:
        cu_seqlens: the global [n_seq + 1] cumulative lengths (a tensor or a list of ints).
        cp_size: the number of context-parallel ranks, an int >= 1.
        cp_rank: this rank, an int in [0, cp_size).
    """
    cp_size, cp_rank = _check_cp(cp_size, cp_rank)
    given = cu_seqlens if isinstance(cu_seqlens, torch.Tensor) else torch.as_tensor(cu_seqlens)
    cu = check_cu_seqlens(given, 0, read_values=False)  # dtype and shape first, then the values it must hold
    cu = check_cu_seqlens(cu, int(cu[-1]))
    lengths = cu[1:] - cu[:-1]
    _check_divisible(lengths, cp_size, "cu_seqlens")
    positions, seq = _dual_chunk(lengths, cp_size, cp_rank)
    return CPVarlen((cu // cp_size).to(given.dtype), positions, cu[:-1][seq] + positions)


def _seq_dim(x: Any, seq_dim: Any, what: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(x).__name__}.")
    d = _int(seq_dim, "seq_dim")
    if not -x.ndim <= d < x.ndim:
        raise ValueError(
            f"seq_dim {d} is out of range for a {x.ndim}-D tensor of shape {tuple(x.shape)}; give the sequence "
            "(or packed token) axis: 1 for [b, s, ...], 0 for [s, b, ...] or [t, ...]."
        )
    return d % x.ndim


def _rank_index(n: int, cp_size: int, cp_rank: int, cu_seqlens: Any, device: torch.device) -> torch.Tensor:
    """The indices along the sequence axis (of size n) of rank cp_rank's tokens."""
    if cu_seqlens is None:
        return cp_positions(n, cp_size, cp_rank, device=device)
    cu = check_cu_seqlens(cu_seqlens, n)
    return cp_varlen(cu, cp_size, cp_rank).token_index.to(device)


def cp_slice(x: torch.Tensor, cp_size: int, cp_rank: int, seq_dim: int, *, cu_seqlens: Any = None
             ) -> torch.Tensor:
    """Rank ``cp_rank``'s part of ``x`` along ``seq_dim``: ``x.index_select(seq_dim, cp_positions(...))``.

    ``seq_dim`` is 1 for [b, s, ...] (bshd) and 0 for [s, b, ...] (sbhd). With ``cu_seqlens`` (global), ``x`` is a
    packed batch whose ``seq_dim`` is the token axis t, split per sequence (:func:`cp_varlen`'s
    ``token_index``). Returns a new tensor with ``x.shape[seq_dim] / cp_size`` entries along ``seq_dim``
    (differentiable; only data moves, so the values are x's own). :func:`cp_gather` is the inverse.

    Args:
        x: the global tensor.
        cp_size: the number of context-parallel ranks, an int >= 1.
        cp_rank: this rank, an int in [0, cp_size).
        seq_dim: the sequence (or packed token) axis of x; negative counts from the end.
        cu_seqlens: None for padded sequences (every row of length ``x.shape[seq_dim]``), or the global
            cumulative lengths of a packed x, ending at ``x.shape[seq_dim]`` (checked).
    """
    d = _seq_dim(x, seq_dim, "x")
    cp_size, cp_rank = _check_cp(cp_size, cp_rank)
    return x.index_select(d, _rank_index(x.shape[d], cp_size, cp_rank, cu_seqlens, x.device))


def cp_gather(slices: Sequence[torch.Tensor], seq_dim: int, *, cu_seqlens: Any = None) -> torch.Tensor:
    """The full tensor from every rank's :func:`cp_slice`, ``slices[r]`` being rank r's (``cp_size = len(slices)``).

    The inverse of :func:`cp_slice`: ``cp_gather([cp_slice(x, cp, r, d) for r in range(cp)], d)`` is x (exactly:
    only data moves). With ``cu_seqlens`` (the global one), the slices are packed batches (:func:`cp_varlen`). For
    tests and teaching: in training the slices live on different ranks, and an all-gather does this.

    Args:
        slices: one tensor per rank, in rank order, all of one shape, dtype and device (ValueError otherwise).
        seq_dim: the sequence (or packed token) axis, as given to :func:`cp_slice`.
        cu_seqlens: None, or the global cumulative lengths the slices were cut with.
    """
    if isinstance(slices, torch.Tensor) or not isinstance(slices, Sequence) or not slices:
        raise ValueError("slices must be a non-empty list of tensors, one per rank in rank order (slices[r] from "
                         "rank r).")
    cp_size = len(slices)
    d = _seq_dim(slices[0], seq_dim, "slices[0]")
    first = slices[0]
    for r, s in enumerate(slices):
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"slices[{r}] must be a torch.Tensor, got {type(s).__name__}.")
        if s.shape != first.shape or s.dtype != first.dtype or s.device != first.device:
            raise ValueError(
                f"slices[{r}] has shape {tuple(s.shape)}, {s.dtype} on {s.device} but slices[0] has "
                f"{tuple(first.shape)}, {first.dtype} on {first.device}: every rank holds as many tokens "
                "(each sequence is split into equal chunks), of the same dtype."
            )
    n = cp_size * first.shape[d]
    order = torch.cat([_rank_index(n, cp_size, r, cu_seqlens, first.device) for r in range(cp_size)])
    # torch.cat(slices) holds token order[j] at j; its inverse permutation puts every token back in place.
    return torch.cat(list(slices), dim=d).index_select(d, torch.argsort(order))
