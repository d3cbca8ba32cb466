r"""Rotary position embedding (RoPE): layouts, positions, the tables, the rotation and two float64 oracles.

RoPE (Su et al. 2021, "RoFormer", arXiv 2104.09864) rotates each pair of dims :math:`(x_a, x_b)` of a
query or key at position m by the angle :math:`\theta_{m,i} = m\,\omega_i`:

.. math::
    y_a = x_a \cos\theta_{m,i} - x_b \sin\theta_{m,i}, \qquad
    y_b = x_a \sin\theta_{m,i} + x_b \cos\theta_{m,i}.

Because rotations compose, :math:`\langle R_m q, R_n k\rangle = \langle q, R_{n-m} k\rangle`: the score
depends on positions only through n - m. Which dims form pair i is the *style*:

- ``"half"``: :math:`(i, i + r/2)`, GPT-NeoX, Llama, ESM (Hugging Face's ``rotate_half``);
- ``"interleaved"``: :math:`(2i, 2i + 1)`, GPT-J, RoFormer, Meta's complex form.

Numerics: angles are formed in float64 (``angle_dtype`` may select float32, to mimic Hugging Face) and
cos/sin are rounded once to the compute dtype, float32 for 16-bit inputs; the output is cast back to the
input dtype, and so is the gradient, computed in float32 too (:func:`rotate`). Tensor layouts are named
einops-style (``"b s h d"``) so nothing is ever broadcast along an axis the caller did not mean.

These are the primitives; :func:`ropelab.apply_rope` (in :mod:`ropelab.rope`, above this module, the
spec, multi-axis positions and the kernels) puts them together.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

__all__ = [
    "Layout",
    "parse_layout",
    "STYLES",
    "AXIS_NAMES",
    "check_style",
    "pair_indices",
    "varlen_positions",
    "check_cu_seqlens",
    "check_positions",
    "check_not_meta",
    "PositionArgs",
    "check_position_args",
    "resolve_positions",
    "cos_sin",
    "tables_for",
    "rotate",
    "rotation_matrix",
    "reference_matrix",
    "reference_complex",
]

STYLES = ("half", "interleaved")

AXIS_NAMES = {
    "b": "batch",
    "s": "sequence",
    "h": "heads",
    "d": "head dim",
    "t": "packed tokens (varlen)",
}



# --------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A parsed layout string: ``axes`` in order, e.g. ``("b", "s", "h", "d")``.

    Args:
        axes: the axes' letters in the tensor's order (see :data:`AXIS_NAMES`); build it with
            :func:`parse_layout`, which checks them.
    """

    axes: tuple[str, ...]

    def index(self, axis: str) -> int | None:
        """The position of ``axis`` in the layout, None if absent.

        Args:
            axis: one letter of :data:`AXIS_NAMES`, e.g. ``"h"``.
        """
        return self.axes.index(axis) if axis in self.axes else None

    @property
    def seq(self) -> str:
        """The position-carrying axis: ``"s"`` or ``"t"``."""
        return "t" if "t" in self.axes else "s"

    def __str__(self) -> str:
        return " ".join(self.axes)


def parse_layout(layout: str, ndim: int | None = None) -> Layout:
    """Parse an einops-style layout (``"b s h d"``, ``"t h d"``) and check it against ``ndim``.

    Axis letters: b batch, s sequence, h heads, d head dim, t packed tokens of several sequences
    (varlen). Each letter at most once; d required; exactly one of s and t; t has no b.

    Args:
        layout: the axes' letters separated by spaces, in the tensor's order.
        ndim: the tensor's number of dims, or None to check the letters only.

    Returns a :class:`Layout`; ValueError names the first thing wrong and how to write it.
    """
    if not isinstance(layout, str):
        raise ValueError(f"layout must be a string such as 'b s h d', got {type(layout).__name__}.")
    axes = tuple(layout.split())
    known = ", ".join(f"{k} ({v})" for k, v in AXIS_NAMES.items())
    for a in axes:
        if a not in AXIS_NAMES:
            raise ValueError(f"layout {layout!r} has an unknown axis {a!r}; name every axis with one of: {known}.")
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
        raise ValueError(f"layout {layout!r} names axis {repeated[0]!r} twice; each axis appears once.")
    if "d" not in axes:
        raise ValueError(f"layout {layout!r} has no 'd' (head dim) axis; name it, e.g. 'b s h d'.")
    if "s" not in axes and "t" not in axes:
        raise ValueError(
            f"layout {layout!r} has no sequence axis: name it 's' (padded sequences) or 't' "
            "(packed varlen tokens, with cu_seqlens)."
        )
    if "s" in axes and "t" in axes:
        raise ValueError(f"layout {layout!r} has both 's' and 't'; a tensor is either padded (s) or packed (t).")
    if "t" in axes and "b" in axes:
        raise ValueError(
            f"layout {layout!r} has both 't' and 'b': packed varlen tokens have no batch axis "
            "(cu_seqlens marks where each sequence starts); use 't h d'."
        )
    if ndim is not None and ndim != len(axes):
        raise ValueError(
            f"layout {layout!r} names {len(axes)} axes but the tensor has {ndim} dims; name every axis of the "
            "tensor, in order (for example 'b s h d' for [batch, seq, heads, head_dim])."
        )
    return Layout(axes)


def check_style(style: str) -> None:
    """Raise ValueError unless ``style`` is one of ``STYLES``, saying which models use which.

    Args:
        style: the pairing style to check: ``"half"`` or ``"interleaved"``.
    """
    if style not in STYLES:
        raise ValueError(
            f"style must be 'half' (pairs (i, i+r/2): Llama, GPT-NeoX, ESM) or 'interleaved' (pairs (2i, 2i+1): "
            f"GPT-J, RoFormer, Meta), got {style!r}."
        )


def pair_indices(rotary_dim: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The dims ``(a_i, b_i)`` that rotate together as pair i, for i in 0 .. r/2 - 1.

    Args:
        rotary_dim: r, how many leading dims rotate (even).
        style: ``"half"`` pairs (i, i + r/2); ``"interleaved"`` pairs (2i, 2i + 1).

    Returns two int64 tensors of r/2 dims each, ``a`` and ``b``.
    """
    check_style(style)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (RoPE rotates pairs of dims), got {rotary_dim}.")
    i = torch.arange(rotary_dim // 2)
    if style == "half":
        return i, i + rotary_dim // 2
    return 2 * i, 2 * i + 1


# --------------------------------------------------------------------------------------------------
# Positions
# --------------------------------------------------------------------------------------------------


def check_cu_seqlens(cu_seqlens: Any, n_tokens: int, *, read_values: bool = True) -> torch.Tensor:
    """``cu_seqlens`` as an int64 tensor, or ValueError naming what is wrong with it.

    Always checked: an integer dtype, 1-D, at least two entries. With ``read_values`` (default) also its
    values, which reads the tensor (a device-to-host copy on a GPU): it starts at 0, never decreases and
    ends at ``n_tokens``, the size of the packed axis ``t``. ``read_values=False`` is for a caller that
    vouches for them (the Triton kernel given ``max_seqlen``, as flash-attn's varlen kernels are).

    Args:
        cu_seqlens: [n_seq + 1] cumulative sequence lengths (a tensor, or anything ``torch.as_tensor`` takes) of
            an integer dtype, e.g. ``[0, len0, len0 + len1]``.
        n_tokens: the size of the packed axis ``t``, which the last entry must equal (checked with
            ``read_values`` only).
        read_values: check the values too (a device-to-host read); False checks dtype and shape only.

    Returns ``cu_seqlens`` as int64, on its device; ValueError names the first thing wrong and how to build it.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = torch.as_tensor(cu_seqlens)
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool or cu_seqlens.is_complex():
        raise ValueError(
            f"cu_seqlens must be an integer tensor (torch.int32 as flash-attn uses, or int64), got {cu_seqlens.dtype}; "
            "build it with torch.cumsum(lengths, 0) on integer lengths."
        )
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with one more entry than there are sequences ([0, len0, len0+len1, ...]), "
            f"got shape {tuple(cu_seqlens.shape)}."
        )
    if not read_values:
        return cu_seqlens.long()
    if int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu_seqlens[0])}; prepend a 0.")
    if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError(
            f"cu_seqlens must not decrease (they are cumulative lengths), got {cu_seqlens.tolist()}; "
            "build it with a cumulative sum of the lengths."
        )
    if int(cu_seqlens[-1]) != n_tokens:
        raise ValueError(
            f"cu_seqlens must end at the token count {n_tokens} (the size of axis 't'), got {int(cu_seqlens[-1])}; "
            "every packed token must belong to exactly one sequence."
        )
    return cu_seqlens.long()


def varlen_positions(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions of packed tokens: 0, 1, ... restarting at each ``cu_seqlens`` boundary.

    Args:
        cu_seqlens: [n_seq + 1] cumulative lengths, starting at 0 (flash-attn's varlen format), already
            checked (:func:`check_cu_seqlens`).

    Returns a [T] tensor, T = ``cu_seqlens[-1]``, on ``cu_seqlens``'s device.
    """
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device) - starts


def check_positions(values: Any, name: str = "positions") -> torch.Tensor:
    r"""``values`` as a tensor of positions (integer or real), or ValueError naming ``name``.

    NaN and inf are refused (they would rotate by a NaN angle silently). Negative positions are valid:
    position -m rotates by :math:`-m\,\omega_i`, the inverse rotation (a re-rotation uses it).

    Args:
        values: an int, a float, a (nested) list or a tensor; bool and complex are refused.
        name: what the error messages call it (``"positions"``, ``"offset"``).

    Returns a tensor (``values`` itself when it is one; its dtype and device kept).
    """
    try:
        t = values if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as e:
        got = type(values).__name__
        raise ValueError(f"{name} must be numbers (an int, a list or a tensor), got {got}: {e}") from e
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must be integer or float numbers, got {t.dtype}.")
    if t.is_floating_point() and not t.is_meta and t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or inf; give finite {name} (integers 0, 1, 2, ... usually).")
    return t


def check_not_meta(t: torch.Tensor, what: str) -> None:
    """Raise ValueError when ``t`` is a meta tensor and ``what`` needs its values.

    Args:
        t: the tensor whose values are needed (positions, whose largest one sizes the tables).
        what: the caller, as the message names it; the message asks for ``seq_len=...`` instead.
    """
    if t.is_meta:
        raise ValueError(
            f"{what} reads the largest position, which a meta tensor does not hold; pass seq_len=... explicitly."
        )


class PositionArgs(NamedTuple):
    """The position arguments of one call, checked against x and its layout, not yet one position per token.

    Built by :func:`check_position_args`.

    Args:
        positions: the explicit positions on x's device, [s], [b, s] or [t], or None: 0, 1, 2, ... along
            the sequence axis, restarting at each ``cu_seqlens`` boundary.
        axes: the layout axes ``positions`` (or the implicit 0, 1, 2, ...) run along.
        cu_seqlens: int64 [n_seq + 1], or None.
        offset: a 0-D tensor (every sequence alike), or 1-D with one entry per batch element ([b]) or per
            packed sequence ([n_seq], with ``cu_seqlens``; flash-attn's ``seqlen_offsets``).
    """

    positions: torch.Tensor | None
    axes: tuple[str, ...]
    cu_seqlens: torch.Tensor | None
    offset: torch.Tensor


def check_position_args(
    x: torch.Tensor,
    layout: Layout,
    positions: Any = None,
    *,
    cu_seqlens: Any = None,
    offset: int | torch.Tensor = 0,
    read_cu_seqlens: bool = True,
) -> PositionArgs:
    """Check ``positions``, ``cu_seqlens`` and ``offset`` against x and its layout, once, for every backend.

    Raises ValueError for every combination or shape that does not fit, rather than broadcasting. What it
    returns is what :func:`resolve_positions` turns into one position per token, and what the Triton kernel
    reads as it is (``read_cu_seqlens=False``: see :func:`check_cu_seqlens`).

    Args:
        x: the tensor to rotate; its sizes along the layout's axes are what the arguments must fit.
        layout: x's parsed layout (:func:`parse_layout`).
        positions: None (0, 1, 2, ... along the sequence axis), or one position per token: [s] (or [t]), or
            [b, s] when the layout has ``b``; integer or float, finite. Not with ``cu_seqlens``.
        cu_seqlens: for a packed layout (``t``): [n_seq + 1] cumulative lengths; positions restart at 0 at
            each sequence start. Refused with an ``s`` layout or with ``positions``.
        offset: added to every position: an int (or 0-D tensor), or a 1-D tensor with one entry per batch
            element ([b]) or, with ``cu_seqlens``, per packed sequence ([n_seq]).
        read_cu_seqlens: check ``cu_seqlens``'s values (a device-to-host read); False for a caller that
            vouches for them.

    Returns a :class:`PositionArgs`.
    """
    seq = layout.seq
    n = x.shape[layout.index(seq)]
    b_idx = layout.index("b")
    if positions is not None and cu_seqlens is not None:
        raise ValueError(
            "give either positions or cu_seqlens, not both: cu_seqlens makes positions restart at 0 at each "
            "sequence start, explicit positions would silently override that."
        )
    if seq == "t" and positions is None and cu_seqlens is None:
        raise ValueError(
            "layout with 't' (packed varlen tokens) needs cu_seqlens (the sequence boundaries) or explicit positions."
        )
    if seq == "s" and cu_seqlens is not None:
        raise ValueError(
            "cu_seqlens describes packed (varlen) tokens; name the token axis 't' in the layout (e.g. 't h d') "
            "or drop cu_seqlens."
        )
    cu, p = None, None
    if positions is None:
        if cu_seqlens is not None:
            cu, axes = check_cu_seqlens(cu_seqlens, n, read_values=read_cu_seqlens).to(x.device), ("t",)
        else:
            axes = (seq,)
    else:
        p = check_positions(positions, "positions").to(x.device)
        if p.ndim == 1:
            if p.shape[0] != n:
                raise ValueError(
                    f"positions has {p.shape[0]} entries but the sequence axis {seq!r} of layout '{layout}' has "
                    f"size {n}; pass one position per token along {seq!r}."
                )
            axes = (seq,)
        elif p.ndim == 2:
            if b_idx is None:
                raise ValueError(
                    f"positions of shape {tuple(p.shape)} has a batch dim but layout '{layout}' has no 'b' axis; "
                    f"pass a 1-D tensor of {n} positions."
                )
            want = (x.shape[b_idx], n)
            if tuple(p.shape) != want:
                raise ValueError(
                    f"positions has shape {tuple(p.shape)} but layout '{layout}' needs [b, {seq}] = {list(want)} "
                    f"(one row per batch element) or a 1-D tensor of {n} positions."
                )
            axes = ("b", seq)
        else:
            raise ValueError(
                f"positions must be 1-D ([{seq}]) or 2-D ([b, {seq}]), got shape {tuple(p.shape)}."
            )
    off = check_positions(offset, "offset")
    if off.ndim == 1:
        if cu is not None:
            if off.shape[0] != cu.shape[0] - 1:
                raise ValueError(
                    f"offset has {off.shape[0]} entries but cu_seqlens delimits {cu.shape[0] - 1} sequences; give "
                    "one offset per packed sequence (flash-attn's seqlen_offsets), or an int to shift them alike."
                )
        elif b_idx is None or off.shape[0] != x.shape[b_idx]:
            raise ValueError(
                f"offset of shape {tuple(off.shape)}: a per-sequence offset needs a 'b' axis of the same size; "
                "pass an int to shift every sequence alike."
            )
    elif off.ndim != 0:
        raise ValueError(
            f"offset must be an int or a 1-D tensor with one entry per batch element (or per sequence of "
            f"cu_seqlens), got {tuple(off.shape)}."
        )
    return PositionArgs(p, axes, cu, off)


def resolve_positions(
    x: torch.Tensor,
    layout: Layout,
    positions: Any = None,
    *,
    cu_seqlens: Any = None,
    offset: int | torch.Tensor = 0,
) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The position of every token, and which layout axes its dims correspond to.

    Returns ``(p, axes)`` with ``p`` of shape [S] and axes ``("s",)``, [B, S] and ``("b", "s")``, or [T]
    and ``("t",)``. Raises ValueError for every shape that does not fit, rather than broadcasting
    (:func:`check_position_args`). A 1-D ``offset`` with ``cu_seqlens`` shifts each packed sequence by
    its own entry, as flash-attn's ``seqlen_offsets`` does: packed decoding, chunked prefill.

    Args:
        x: the tensor to rotate (only its shape and device are read).
        layout: x's parsed layout (:func:`parse_layout`).
        positions: None (0, 1, 2, ... along the sequence axis), a 1-D tensor of one position per token, or
            a [B, S] tensor, as :func:`ropelab.apply_rope` takes them.
        cu_seqlens: [n_seq + 1] cumulative lengths, for a ``t`` layout only.
        offset: added to every position: an int, one per batch element, or with ``cu_seqlens`` one per
            packed sequence.
    """
    p, axes, cu, off = check_position_args(x, layout, positions, cu_seqlens=cu_seqlens, offset=offset)
    if p is None:
        p = varlen_positions(cu) if cu is not None else torch.arange(x.shape[layout.index(axes[0])], device=x.device)
    if off.ndim == 0:
        p = p + off.to(p.device)
    elif cu is not None:  # [t] + each sequence's own offset, repeated over its tokens
        p = p + torch.repeat_interleave(off.to(p.device), cu[1:] - cu[:-1])
    else:
        if len(axes) == 1:
            p = p.unsqueeze(0)
            axes = ("b", axes[0])
        p = p + off.to(p.device)[:, None]
    return p, axes


# --------------------------------------------------------------------------------------------------
# Tables and the rotation
# --------------------------------------------------------------------------------------------------


def cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_factor: float = 1.0,
    *,
    dtype: torch.dtype = torch.float32,
    angle_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The tables :math:`a\cos(m\,\omega_i)` and :math:`a\sin(m\,\omega_i)`, shape ``positions.shape + [r/2]``.

    The angle is formed in ``angle_dtype`` (float64 by default; float32 reproduces Hugging Face, which
    multiplies float32 positions by a float32 ``inv_freq``), then rounded once to ``dtype``.

    Args:
        positions: the positions m, a tensor of any shape (integer or real).
        inv_freq: the r/2 frequencies :math:`\omega_i` (:func:`ropelab.frequencies`).
        attention_factor: a, which multiplies both tables (YaRN's and LongRoPE's attention scaling; 1 for
            the others).
        dtype: the dtype of the tables.
        angle_dtype: torch.float64 or torch.float32, the dtype the angle :math:`m\,\omega_i` is formed in.
    """
    if angle_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"angle_dtype must be torch.float32 or torch.float64, got {angle_dtype}.")
    angles = positions.to(angle_dtype)[..., None] * inv_freq.to(device=positions.device, dtype=angle_dtype)
    cos, sin = torch.cos(angles), torch.sin(angles)
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype), sin.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, style: str = "half") -> torch.Tensor:
    r"""Rotate the pairs of the last dim of ``x`` by the given tables; dims past ``r = 2 cos.shape[-1]`` pass.

    ``cos`` and ``sin`` have the same number of dims as ``x``, each of size 1 or equal to x's (explicit
    broadcast dims, never implicit ones), and last dim r/2. 16-bit inputs are computed in float32 and
    rounded once on output; so is their gradient, :math:`\partial L/\partial x = R^\top\,\partial L/\partial y`
    (the inverse rotation of the incoming gradient, sin negated, in float32, rounded once to x's dtype),
    which therefore meets the forward's bound with :math:`g = \partial L/\partial y` in place of x:
    :math:`|\mathrm{err}_a| \le 4u_{32}(|g_a| + |g_b|) + u\,|\partial L/\partial x_a|` for pair (a, b), u the
    unit roundoff of x's dtype (plus half its subnormal spacing); dims past r pass g through exactly.

    Args:
        x: a floating-point tensor whose last dim is the head dim d.
        cos: the table :math:`a\cos(m\,\omega_i)` of :func:`cos_sin`, reshaped to x's number of dims.
        sin: the table :math:`a\sin(m\,\omega_i)`, the same shape as ``cos``.
        style: ``"half"`` or ``"interleaved"``, which dims pair up (:func:`pair_indices`).

    Returns a new tensor of x's shape and dtype.
    """
    check_style(style)
    if not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}.")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}.")
    if cos.ndim != x.ndim:
        raise ValueError(
            f"cos/sin have {cos.ndim} dims but x has {x.ndim}; give them x's dims with size-1 axes where they "
            f"repeat (cos of shape {tuple(cos.shape)} would broadcast against the wrong axes)."
        )
    for i, (c, n) in enumerate(zip(cos.shape[:-1], x.shape[:-1])):
        if c not in (1, n):
            raise ValueError(
                f"cos/sin dim {i} has size {c} but x's has size {n}; each dim must be 1 or match x "
                f"(cos {tuple(cos.shape)}, x {tuple(x.shape)})."
            )
    half = cos.shape[-1]
    r, d = 2 * half, x.shape[-1]
    if r > d:
        raise ValueError(f"cos/sin cover {r} dims (last dim {half} pairs) but x's last dim is {d}.")
    cdt = torch.promote_types(x.dtype, torch.float32)
    c, s = cos.to(device=x.device, dtype=cdt), sin.to(device=x.device, dtype=cdt)
    if style == "half":
        x1, x2 = x[..., :half], x[..., half:r]
    else:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
    if torch.is_grad_enabled() and (x.requires_grad or c.requires_grad or s.requires_grad):
        # Differentiable path (training): the same formula without in-place writes.
        if cdt == x.dtype:
            return _rotate_formula(x, c, s, style)
        if not (c.requires_grad or s.requires_grad):
            # A 16-bit x: autograd would round each product's gradient to x's dtype and add the two
            # there (a small gradient of large terms came back as 0); the Function's backward is the
            # inverse rotation in float32, rounded once. Its forward is this same formula.
            return _RotateLowPrecision.apply(x, c, s, style)
        # Learned tables too: differentiate the formula on a float32 copy of x, so that x's gradient
        # is also summed in float32 and rounded once (at the copy's backward); the same forward numbers.
        return _rotate_formula(x.to(cdt), c, s, style).to(x.dtype)
    out = torch.empty(x.shape, dtype=cdt, device=x.device)
    if style == "half":
        o1, o2 = out[..., :half], out[..., half:r]
    else:
        o1, o2 = out[..., 0:r:2], out[..., 1:r:2]
    # Inference path: written into `out` in place, four passes over half the tensor each and no
    # temporaries (Hugging Face's rotate_half allocates three full-size intermediates).
    torch.mul(x1, c, out=o1)
    o1.addcmul_(x2, s, value=-1)
    torch.mul(x2, c, out=o2)
    o2.addcmul_(x1, s)
    if r < d:
        out[..., r:] = x[..., r:]
    return out if cdt == x.dtype else out.to(x.dtype)


def _rotate_formula(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, style: str) -> torch.Tensor:
    """:func:`rotate`'s differentiable formula (no checks): products and sums in c's dtype, one rounding
    to x's dtype at the end."""
    half = c.shape[-1]
    r, d = 2 * half, x.shape[-1]
    if style == "half":
        x1, x2 = x[..., :half], x[..., half:r]
    else:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    if style == "half":
        rot = torch.cat([y1, y2], dim=-1)
    else:
        rot = torch.stack([y1, y2], dim=-1).flatten(-2)
    out = torch.cat([rot, x[..., r:].to(c.dtype)], dim=-1) if r < d else rot
    return out if out.dtype == x.dtype else out.to(x.dtype)


class _RotateLowPrecision(torch.autograd.Function):
    r"""``y = R x`` for a 16-bit x and float32 tables that need no gradient.

    Forward: :func:`_rotate_formula` (float32 math, one rounding). Backward: RoPE is linear and
    orthogonal, so :math:`\partial L/\partial x = R^\top \partial L/\partial y`, the same formula with
    sin negated, again in float32 and rounded once (applied through this Function, so a double backward
    keeps the property). The Triton kernel's backward does the same (``CONJUGATE``).
    """

    @staticmethod
    def forward(ctx, x, c, s, style):
        ctx.save_for_backward(c, s)
        ctx.style = style
        return _rotate_formula(x, c, s, style)

    @staticmethod
    def backward(ctx, dy):
        c, s = ctx.saved_tensors
        return _RotateLowPrecision.apply(dy, c, -s, ctx.style), None, None, None


def tables_for(
    x: torch.Tensor,
    layout: Layout,
    cos: torch.Tensor,
    sin: torch.Tensor,
    axes: tuple[str, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``[*sizes of axes, r/2]`` (the axes in any order) shaped for ``x.movedim(d, -1)``.

    The result has x's dims without d, in layout order, then r/2: each of ``axes`` at its size in x, every
    other axis size 1, so :func:`rotate` repeats the tables only along the axes the layout names.
    E.g. layout ``"b h s d"`` and tables [b, s, r/2] with axes ``("b", "s")``: shape [b, 1, s, r/2].

    Args:
        x: the tensor the tables will rotate (its sizes along ``axes``).
        layout: x's parsed layout.
        cos: the cosine table, shape ``[*sizes of axes, r/2]`` (from :func:`cos_sin`).
        sin: the sine table, the same shape as ``cos``.
        axes: the layout axes the tables' leading dims run along, in the tables' order (e.g. ``("s",)``,
            ``("b", "s")``, ``("t",)``), as :func:`resolve_positions` returns them.

    Returns ``(cos, sin)`` permuted and reshaped (views where the permutation allows, else copies).
    """
    other = [a for a in layout.axes if a != "d"]  # x.movedim(d, -1)'s axes, d aside
    order = [a for a in other if a in axes]
    perm = [axes.index(a) for a in order] + [len(axes)]  # the tables' axes in layout order, pairs last
    shape = [x.shape[layout.index(a)] if a in axes else 1 for a in other] + [cos.shape[-1]]
    return cos.permute(perm).reshape(shape), sin.permute(perm).reshape(shape)


def __getattr__(name: str) -> Any:
    # apply_rope lived here until it moved above this module (ropelab.rope). The old import keeps
    # working, resolved by name at first use, so that core itself depends on nothing above it.
    if name == "apply_rope":
        warnings.warn("ropelab.core.apply_rope moved: import it from ropelab (or ropelab.rope).",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module("ropelab.rope").apply_rope
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------------
# float64 oracles: slow, obviously correct, used by tests and teaching
# --------------------------------------------------------------------------------------------------


def rotation_matrix(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    head_dim: int,
    *,
    style: str = "half",
    attention_factor: float = 1.0,
) -> torch.Tensor:
    r"""The block-diagonal rotations :math:`R_m` as explicit float64 matrices, shape [len(positions), d, d].

    Pair i = (a, b) gets the 2x2 block :math:`a_f\begin{pmatrix}\cos & -\sin\\ \sin & \cos\end{pmatrix}`
    at rows/cols (a, b); dims past :math:`r = 2\,\text{len}(\omega)` keep the identity.

    Args:
        positions: the positions m (any shape; flattened).
        inv_freq: the r/2 frequencies :math:`\omega_i`.
        head_dim: d, the size of each matrix.
        style: ``"half"`` or ``"interleaved"``, where each pair's block sits.
        attention_factor: :math:`a_f`, which multiplies every block.
    """
    positions = torch.as_tensor(positions).to(torch.float64).reshape(-1)
    inv_freq = inv_freq.to(torch.float64)
    r = 2 * inv_freq.numel()
    a, b = pair_indices(r, style)
    theta = positions[:, None] * inv_freq[None, :]
    c, s = torch.cos(theta) * attention_factor, torch.sin(theta) * attention_factor
    R = torch.eye(head_dim, dtype=torch.float64).repeat(positions.numel(), 1, 1)
    R[:, a, a] = c
    R[:, a, b] = -s
    R[:, b, a] = s
    R[:, b, b] = c
    return R


def reference_matrix(
    x: torch.Tensor,
    positions: Sequence[int] | torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    style: str = "half",
    attention_factor: float = 1.0,
) -> torch.Tensor:
    """float64 oracle: ``x[..., s, d]`` times the explicit matrix :math:`R_{p_s}` (positions on axis -2).

    Args:
        x: the vectors, sequence on axis -2 and head dim on axis -1.
        positions: one position per row of axis -2.
        inv_freq: the r/2 frequencies; dims past r pass unchanged.
        style: ``"half"`` or ``"interleaved"``.
        attention_factor: multiplies every rotation (:func:`rotation_matrix`).

    Returns a float64 tensor of x's shape: what every fast path is tested against.
    """
    R = rotation_matrix(positions, inv_freq, x.shape[-1], style=style, attention_factor=attention_factor)
    return torch.einsum("sij,...sj->...si", R, x.to(torch.float64))


def reference_complex(
    x: torch.Tensor,
    positions: Sequence[int] | torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    style: str = "half",
    attention_factor: float = 1.0,
) -> torch.Tensor:
    r"""float64 oracle in Meta's complex form: pair i is :math:`z = x_a + i x_b`, rotated to
    :math:`a_f\,z\,e^{i m \omega_i}` (Llama's ``apply_rotary_emb`` with ``torch.polar``). Positions on axis -2.

    Args:
        x: the vectors, sequence on axis -2 and head dim on axis -1.
        positions: one position per row of axis -2.
        inv_freq: the r/2 frequencies; dims past r pass unchanged.
        style: ``"half"`` or ``"interleaved"``, which dims form each complex number.
        attention_factor: :math:`a_f`, the modulus of each :math:`e^{i m \omega_i}` factor.

    Returns a float64 tensor of x's shape, by complex multiplication rather than the matrices of
    :func:`reference_matrix`.
    """
    x = x.to(torch.float64)
    positions = torch.as_tensor(positions).to(torch.float64).reshape(-1)
    r = 2 * inv_freq.numel()
    a, b = pair_indices(r, style)
    z = torch.complex(x[..., a], x[..., b])
    phase = torch.polar(
        torch.full((positions.numel(), r // 2), float(attention_factor), dtype=torch.float64),
        positions[:, None] * inv_freq.to(torch.float64)[None, :],
    )
    w = z * phase
    out = x.clone()
    out[..., a] = w.real
    out[..., b] = w.imag
    return out
