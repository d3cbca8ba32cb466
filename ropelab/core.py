r"""Rotary position embedding (RoPE): the tables, the rotation, ``apply_rope`` and two float64 oracles.

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
input dtype. Tensor layouts are named einops-style (``"b s h d"``) so nothing is ever broadcast along an
axis the caller did not mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .scaling import LENGTH_DEPENDENT, frequencies, rope_type_of

__all__ = [
    "Layout",
    "parse_layout",
    "STYLES",
    "AXIS_NAMES",
    "check_style",
    "pair_indices",
    "varlen_positions",
    "check_positions",
    "check_not_meta",
    "resolve_positions",
    "cos_sin",
    "rotate",
    "apply_rope",
    "rotation_matrix",
    "reference_matrix",
    "reference_complex",
]

STYLES = ("half", "interleaved")
BACKENDS = ("torch", "compile", "triton")

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
    """A parsed layout string: ``axes`` in order, e.g. ``("b", "s", "h", "d")``."""

    axes: tuple[str, ...]

    def index(self, axis: str) -> int | None:
        """The position of ``axis`` in the layout, None if absent."""
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
    """Raise ValueError unless ``style`` is one of ``STYLES``, saying which models use which."""
    if style not in STYLES:
        raise ValueError(
            f"style must be 'half' (pairs (i, i+r/2): Llama, GPT-NeoX, ESM) or 'interleaved' (pairs (2i, 2i+1): "
            f"GPT-J, RoFormer, Meta), got {style!r}."
        )


def pair_indices(rotary_dim: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The dims ``(a_i, b_i)`` that rotate together as pair i, for i in 0 .. r/2 - 1."""
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


def _check_cu_seqlens(cu_seqlens: Any, n_tokens: int) -> torch.Tensor:
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
    """Positions of packed tokens: 0, 1, ... restarting at each ``cu_seqlens`` boundary."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device) - starts


def check_positions(values: Any, name: str = "positions") -> torch.Tensor:
    r"""``values`` as a tensor of positions (integer or real), or ValueError naming ``name``.

    NaN and inf are refused (they would rotate by a NaN angle silently). Negative positions are valid:
    position -m rotates by :math:`-m\,\omega_i`, the inverse rotation (a re-rotation uses it)."""
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
    """Raise ValueError when ``t`` is a meta tensor and ``what`` needs its values."""
    if t.is_meta:
        raise ValueError(
            f"{what} reads the largest position, which a meta tensor does not hold; pass seq_len=... explicitly."
        )


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
    and ``("t",)``. Raises ValueError for every shape that does not fit, rather than broadcasting.
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
    if positions is None:
        if cu_seqlens is not None:
            p, axes = varlen_positions(_check_cu_seqlens(cu_seqlens, n).to(x.device)), ("t",)
        else:
            p, axes = torch.arange(n, device=x.device), (seq,)
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
    if off.ndim == 0:
        p = p + off.to(p.device)
    elif off.ndim == 1:
        if b_idx is None or off.shape[0] != x.shape[b_idx]:
            raise ValueError(
                f"offset of shape {tuple(off.shape)}: a per-sequence offset needs a 'b' axis of the same size; "
                "pass an int to shift every sequence alike."
            )
        if axes == (seq,):
            p = p.unsqueeze(0)
            axes = ("b", seq)
        p = p + off.to(p.device)[:, None]
    else:
        raise ValueError(
            f"offset must be an int or a 1-D tensor with one entry per batch element, got {tuple(off.shape)}."
        )
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
    rounded once on output.
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
        y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
        if style == "half":
            rot = torch.cat([y1, y2], dim=-1)
        else:
            rot = torch.stack([y1, y2], dim=-1).flatten(-2)
        out = torch.cat([rot, x[..., r:].to(cdt)], dim=-1) if r < d else rot
        return out if cdt == x.dtype else out.to(x.dtype)
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


def _tables_for(
    x: torch.Tensor,
    layout: Layout,
    p: torch.Tensor,
    p_axes: tuple[str, ...],
    inv_freq: torch.Tensor,
    attention_factor: float,
    angle_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin shaped for ``x.movedim(d, -1)``: size-1 dims everywhere but the position axes."""
    cdt = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos_sin(p, inv_freq, attention_factor, dtype=cdt, angle_dtype=angle_dtype)
    other = [a for a in layout.axes if a != "d"]
    order = [a for a in other if a in p_axes]
    perm = [p_axes.index(a) for a in order] + [len(p_axes)]
    shape = [x.shape[layout.index(a)] if a in p_axes else 1 for a in other] + [cos.shape[-1]]
    return cos.permute(perm).reshape(shape), sin.permute(perm).reshape(shape)


def apply_rope(
    x: torch.Tensor,
    positions: Any = None,
    *,
    layout: str,
    style: str = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    cu_seqlens: Any = None,
    offset: int | torch.Tensor = 0,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
    angle_dtype: torch.dtype = torch.float64,
    spec: Any = None,
    backend: str = "torch",
    sections: Any = None,
) -> torch.Tensor:
    r"""Apply RoPE to ``x``, whose every axis is named by ``layout``.

    Args:
        x: queries or keys, e.g. [batch, seq, heads, head_dim] with ``layout="b s h d"``.
        positions: None (0, 1, 2, ... along the sequence axis, restarting at each ``cu_seqlens``
            boundary for ``t``), a 1-D tensor with one position per token of the sequence axis, or a
            2-D [b, s] tensor with one row per batch element. Negative positions are valid (a rotation
            by :math:`-m\,\omega_i`); NaN or inf raise ValueError.
        layout: einops-style names of x's axes: b batch, s sequence, h heads, d head dim, t packed
            tokens (varlen). ``"b s h d"``, ``"b h s d"``, ``"s h d"``, ``"t h d"``, ...
        style: ``"half"`` pairs (i, i + r/2) (Llama, GPT-NeoX, ESM); ``"interleaved"`` pairs
            (2i, 2i + 1) (GPT-J, RoFormer, Meta).
        base: the RoPE base b (``rope_theta``).
        rotary_dim: how many leading head dims rotate (even); the rest pass through. Default: all,
            or ``partial_rotary_factor`` from ``rope_scaling``.
        rope_scaling: a Hugging Face scaling dict; see :func:`ropelab.frequencies`.
        cu_seqlens: [n_seq + 1] cumulative lengths for a ``t`` layout (flash-attn's varlen format).
        offset: added to every position (an int, or one per batch element): a KV-cache step.
        max_position_embeddings: the model's trained context (dynamic NTK's threshold).
        seq_len: the current length for length-dependent scalings (dynamic, longrope); default
            ``max(positions) + 1`` as Hugging Face does in a full forward.
        angle_dtype: float64 (default) or float32 for the angles :math:`m\,\omega_i`.
        spec: a :class:`ropelab.spec.RopeSpec` giving style, base, rotary_dim, scaling and
            max_position_embeddings at once (then leave those keywords at their defaults).
        backend: ``"torch"`` (eager PyTorch, :func:`rotate`), ``"compile"`` (one single-pass formula
            through ``torch.compile``: the CPU path at the memory floor) or ``"triton"`` (the fused
            kernel of :mod:`ropelab.kernels`, CUDA or ``TRITON_INTERPRET=1``). Same checks, same
            tables and the same error bound for all three.
        sections: a :class:`ropelab.multiaxis.MultiAxis` (M-RoPE or axial): then ``positions`` is
            [A, s] or [A, b, s], one row per axis, and pair i rotates with its axis's position.

    Returns a tensor of x's shape and dtype.
    """
    if spec is not None:
        if (style, base, rotary_dim, rope_scaling, max_position_embeddings) != ("half", 10000.0, None, None, None):
            raise ValueError("give the RoPE settings either as spec= or as keywords (style, base, ...), not both.")
        if spec.is_nope:  # a layer without RoPE (RopeSpec.nope()): the same checks, then x as it is
            if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
                raise ValueError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x))}.")
            resolve_positions(x, parse_layout(layout, x.ndim), positions, cu_seqlens=cu_seqlens, offset=offset)
            return x.clone()
        style, base, rotary_dim = spec.style, spec.base, spec.rotary_dim
        rope_scaling, max_position_embeddings = spec.scaling, spec.max_position_embeddings
    if sections is not None:  # multi-axis positions: ropelab.multiaxis builds on core, loaded on first use
        if (backend != "torch" or cu_seqlens is not None or isinstance(offset, torch.Tensor) or offset != 0
                or seq_len is not None or max_position_embeddings is not None):
            raise ValueError("sections= (multi-axis positions) takes positions, layout, style, base, rotary_dim "
                             "and rope_scaling only; give offsets inside the positions, backend='torch'.")
        from .multiaxis import apply_multiaxis_rope

        return apply_multiaxis_rope(x, positions, sections, layout=layout, style=style, base=base,
                                    rotary_dim=rotary_dim, rope_scaling=rope_scaling, angle_dtype=angle_dtype)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}.")
    lay = parse_layout(layout, x.ndim)
    check_style(style)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    p, p_axes = resolve_positions(x, lay, positions, cu_seqlens=cu_seqlens, offset=offset)
    if seq_len is None and rope_type_of(rope_scaling) in LENGTH_DEPENDENT and p.numel():
        check_not_meta(p, "a length-dependent rope_type (dynamic, longrope) without seq_len")
        seq_len = int(p.max()) + 1
    d_idx = lay.index("d")
    inv_freq, attention_factor = frequencies(
        x.shape[d_idx],
        base,
        rotary_dim=rotary_dim,
        rope_scaling=rope_scaling,
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
    )
    # The accelerated backends live in ropelab.kernels, which builds on this module: imported on first
    # use, so core never depends on it (and never on triton) otherwise.
    if backend == "triton":
        from .kernels.fused_rope import rope_positions

        return rope_positions(x, lay, p, p_axes, inv_freq, attention_factor, style=style, angle_dtype=angle_dtype)
    cos, sin = _tables_for(x, lay, p, p_axes, inv_freq, attention_factor, angle_dtype)
    if backend == "compile":
        from .kernels.compiled import rotate_compiled

        return rotate_compiled(x.movedim(d_idx, -1), cos, sin, style=style).movedim(-1, d_idx)
    return rotate(x.movedim(d_idx, -1), cos, sin, style=style).movedim(-1, d_idx)


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
    """float64 oracle: ``x[..., s, d]`` times the explicit matrix :math:`R_{p_s}` (positions on axis -2)."""
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
