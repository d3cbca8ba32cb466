r"""The fused Triton RoPE as a PyTorch op: the kernel's own input checks, launch, and the ``autograd.Function``.

:func:`rope` rotates q, and optionally k, in one kernel launch (see :mod:`ropelab.kernels.rope_triton`
for the program itself)::

    q, k = rope(q, k, layout="b s h d", cos=cos, sin=sin)                  # ropelab tables [P, r/2]
    q, k = rope(q, k, layout="t h d", inv_freq=inv_freq, cu_seqlens=cu)     # cos/sin made in the kernel
    q = rope(qkv[:, :, 0], layout="b s h d", cos=cos, sin=sin, offset=past) # a strided view, no copy

It supports both styles, partial rotary (dims past ``r`` pass through in the same launch), any even
head_dim up to 256, any layout whose axes ``layout`` names (``b s h d``, ``b h s d``, ``t h d`` with
``cu_seqlens``, ...) with arbitrary strides, an int or per-sequence ``offset``, explicit position ids,
q and k with different head counts, fp32/fp16/bf16 (fp32 math) and float64 (float64 math, for
gradcheck), and ``inplace=True``, which writes into q and k and marks them dirty so that autograd
raises, rather than silently corrupting a gradient, when another op still needs their old values.

The design follows flash-attn's Triton rotary (``flash_attn/ops/triton/rotary.py``: a 2-D tile of
tokens x pairs, cos/sin gathered per token, ``CONJUGATE`` for the backward pass) and differs where
the peers miss a feature: the pass-through dims, q and k in one launch, cos/sin from ``inv_freq``
in float64, the int64 addresses.

It runs on CUDA tensors, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set
before triton is imported; slow, for tests). Anything else raises a ValueError that says what to use.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..core import Layout, check_position_args, check_style, parse_layout

__all__ = ["rope", "rope_positions", "available", "why_unavailable", "as_bshd", "launch_tiles"]

MAX_HEAD_DIM = 256


def why_unavailable(device: torch.device | str = "cuda") -> str | None:
    """None if the Triton kernel can run on ``device``, else the reason in words (and what to do).

    Args:
        device: a torch device or its name; ``"cuda"`` needs triton and CUDA, another device triton's
            interpreter (``TRITON_INTERPRET=1`` set before triton is first imported).
    """
    try:
        import triton  # noqa: F401
    except ImportError:
        return (
            "triton is not installed (pip install 'triton>=3.2', in the dev extra); use backend='torch' or "
            "backend='compile' instead."
        )
    device = torch.device(device)
    if device.type == "cuda":
        return None if torch.cuda.is_available() else "CUDA is not available on this machine."
    from triton.runtime.interpreter import InterpretedFunction

    from . import rope_triton

    if isinstance(rope_triton.rope_kernel, InterpretedFunction):
        return None
    interp = os.environ.get("TRITON_INTERPRET")
    hint = (
        "TRITON_INTERPRET=1 was set after triton compiled the kernel; set it before the first import"
        if interp == "1"
        else "set TRITON_INTERPRET=1 before importing triton to run it on the CPU (slow: for tests)"
    )
    return (
        f"the Triton kernel runs on CUDA tensors, not on {device.type}; {hint}, or use backend='torch' "
        "or backend='compile' on the CPU."
    )


def available(device: torch.device | str = "cuda") -> bool:
    """Whether the Triton kernel can run on ``device`` (:func:`why_unavailable` says why not).

    Args:
        device: a torch device or its name (``"cuda"``, ``"cpu"``).
    """
    return why_unavailable(device) is None


def as_bshd(x: torch.Tensor, layout: str | Layout) -> torch.Tensor:
    """A [batch, seq (or t), heads, head_dim] *view* of ``x`` (axes permuted, missing ones size 1; no copy).

    ``layout`` is a string, checked against x, or a :class:`ropelab.core.Layout` already checked.

    Args:
        x: the tensor to view.
        layout: x's axes: a string (parsed and checked against ``x.ndim``; ValueError if it does not fit) or a
            :class:`ropelab.core.Layout`, trusted as it is.
    """
    lay = layout if isinstance(layout, Layout) else parse_layout(layout, x.ndim)
    seq = lay.seq
    order = [lay.index(a) for a in ("b", seq, "h", "d") if a in lay.axes]
    v = x.permute(order)
    if "b" not in lay.axes:
        v = v.unsqueeze(0)
    if "h" not in lay.axes:
        v = v.unsqueeze(2)
    return v


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def launch_tiles(span: int, n_seq: int, heads_q: int, heads_k: int, half: int, *, block_s: int | None = None,
                 heads_per_program: int | None = None) -> tuple[int, int, int, tuple[int, int, int]]:
    """The launch's tiling, without launching: (tokens per program, token blocks, heads per program, grid).

    ``span`` tokens per sequence (the longest with ``cu_seqlens``), ``n_seq`` sequences, ``heads_q`` and ``heads_k``
    heads (0 without k), ``half`` rotated pairs. ``grid[1]`` is the number of programs that share one token block,
    each loading that block's cos/sin rows once for its heads (what :mod:`ropelab.kernels.traffic` counts)."""
    half_pad = _pow2(half)
    # Tile: about 2048 pairs per program and head (a few KB of loads in flight), fewer tokens for big d.
    block_s = block_s or max(1, min(_pow2(max(span, 1)), 2048 // half_pad))
    n_sblocks = max(1, -(-span // block_s))
    hpp = heads_per_program
    if hpp is None:
        # Reuse cos/sin over several heads when there are enough programs to fill the machine anyway.
        hpp = 1
        while hpp < 8 and n_sblocks * n_seq * (-(-(heads_q + heads_k) // (2 * hpp))) >= 1024:
            hpp *= 2
    grid = (n_sblocks, -(-heads_q // hpp) + (-(-heads_k // hpp) if heads_k else 0), n_seq)
    return block_s, n_sblocks, hpp, grid


def _launch(
    q4: torch.Tensor,
    oq4: torch.Tensor,
    k4: torch.Tensor | None,
    ok4: torch.Tensor | None,
    ctx: dict,
    *,
    conjugate: bool,
    copy_pass: bool,
) -> None:
    """One launch over q's and k's heads. ``ctx`` holds the checked position and cos/sin arguments."""
    from . import rope_triton

    B, S, Hq, D = q4.shape
    Hk = k4.shape[2] if k4 is not None else 0
    half = ctx["half"]
    half_pad = _pow2(half)
    pass_pad = _pow2(max(D - 2 * half, 1))
    varlen = ctx["cu_seqlens"] is not None
    n_seq = ctx["cu_seqlens"].numel() - 1 if varlen else B
    span = ctx["max_seqlen"] if varlen else S
    block_s, n_sblocks, hpp, grid = launch_tiles(span, n_seq, Hq, Hk, half, block_s=ctx.get("block_s"),
                                                 heads_per_program=ctx.get("heads_per_program"))
    if grid[1] > 65535 or grid[2] > 65535:
        raise ValueError(f"too many heads or sequences for one launch (grid {grid}); split the batch.")
    kk, okk = (k4, ok4) if k4 is not None else (q4, oq4)
    cos, sin, inv = ctx["cos"], ctx["sin"], ctx["inv_freq"]
    dummy = q4  # never read when the matching flag is off
    pos = ctx["positions"]
    off = ctx["offset_tensor"]
    cdt = rope_triton.tl.float64 if q4.dtype == torch.float64 else rope_triton.tl.float32
    rope_triton.rope_kernel[grid](
        q4, oq4, kk, okk,
        cos if cos is not None else dummy, sin if sin is not None else dummy,
        inv if inv is not None else dummy,
        pos if pos is not None else dummy,
        off if off is not None else dummy,
        ctx["cu_seqlens"] if varlen else dummy,
        S, Hq, Hk, half, D, ctx["offset_int"],
        *q4.stride(), *oq4.stride(), *kk.stride(), *okk.stride(),
        *(ctx["pos_strides"]), cos.stride(0) if cos is not None else 0,
        BLOCK_S=block_s, HEADS_PER_PROG=hpp, HALF_PAD=half_pad, PASS_PAD=pass_pad,
        INTERLEAVED=ctx["style"] == "interleaved", CONJUGATE=conjugate, COPY_PASS=copy_pass and D > 2 * half,
        HAS_K=k4 is not None, VARLEN=varlen, HAS_POS=pos is not None, OFFSET_PER_SEQ=off is not None,
        FROM_TABLE=cos is not None, ANGLE_F64=ctx["angle_f64"], CDT=cdt,
        num_warps=4,
    )


class _RopeFunction(torch.autograd.Function):
    """y = R(p) x for q (and k); backward dx = R(p)^T dy, the same kernel with sin negated.

    RoPE is linear in x, so backward needs only the positions and tables, never x itself: the in-place
    variant saves nothing that it overwrites, and ``mark_dirty`` bumps q's and k's version counters so
    autograd refuses (with an error) any other op's backward that saved their old values.
    """

    @staticmethod
    def forward(ctx_autograd, q, k, ctx: dict, inplace: bool):
        q4 = as_bshd(q, ctx["layout"])
        k4 = as_bshd(k, ctx["layout"]) if k is not None else None
        if inplace:
            oq, ok = q, k
        else:
            oq = torch.empty_like(q)
            ok = torch.empty_like(k) if k is not None else None
        oq4 = as_bshd(oq, ctx["layout"])
        ok4 = as_bshd(ok, ctx["layout"]) if ok is not None else None
        _launch(q4, oq4, k4, ok4, ctx, conjugate=False, copy_pass=not inplace)
        ctx_autograd.rope_ctx = ctx
        ctx_autograd.has_k = k is not None
        if inplace:
            ctx_autograd.mark_dirty(*([q, k] if k is not None else [q]))
        if k is None:
            return oq, None
        return oq, ok

    @staticmethod
    def backward(ctx_autograd, dq, dk):
        ctx = ctx_autograd.rope_ctx
        lay = ctx["layout"]
        gq = gk = None
        if dq is not None:
            gq = torch.empty_like(dq)
        if ctx_autograd.has_k and dk is not None:
            gk = torch.empty_like(dk)
        if gq is None and gk is None:
            return None, None, None, None
        if gq is None:  # only k's gradient flows: rotate it as the "q" of the launch
            _launch(as_bshd(dk, lay), as_bshd(gk, lay), None, None, ctx, conjugate=True, copy_pass=True)
        else:
            _launch(as_bshd(dq, lay), as_bshd(gq, lay), as_bshd(dk, lay) if gk is not None else None,
                    as_bshd(gk, lay) if gk is not None else None, ctx, conjugate=True, copy_pass=True)
        return gq, gk, None, None


def _check_dtypes(q: Any, k: Any) -> None:
    """The kernel can run on q's device, and q (and k) have a dtype it takes."""
    why = why_unavailable(q.device if isinstance(q, torch.Tensor) else "cpu")
    if why is not None:
        raise ValueError(f"ropelab.kernels.rope cannot run: {why}")
    for name, t in (("q", q), ("k", k)):
        if t is None and name == "k":
            continue
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            got = getattr(t, "dtype", type(t).__name__)
            raise ValueError(f"{name} must be a floating-point torch.Tensor, got {got}.")
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise ValueError(f"{name} has dtype {t.dtype}; the kernel takes float32, float16, bfloat16 or float64.")


def _check_shapes(q: torch.Tensor, k: torch.Tensor | None, lay: Layout) -> tuple[int, int, int, int]:
    """q's [batch, seq, heads, head_dim] sizes, once k agrees with q and head_dim fits the kernel."""
    B, S, Hq, D = as_bshd(q, lay).shape
    if k is not None:
        if k.ndim != q.ndim:
            raise ValueError(f"k has {k.ndim} dims but layout '{lay}' (and q) have {q.ndim}.")
        k4 = as_bshd(k, lay)
        if (k4.shape[0], k4.shape[1], k4.shape[3]) != (B, S, D):
            raise ValueError(
                f"k {tuple(k.shape)} and q {tuple(q.shape)} must agree on every axis but 'h' (heads may differ: GQA)."
            )
        if k.dtype != q.dtype or k.device != q.device:
            raise ValueError(f"q and k must share dtype and device, got {q.dtype}/{q.device} and {k.dtype}/{k.device}.")
    if D % 2 or D > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM}, got {D}.")
    return B, S, Hq, D


def _inv_freq_arg(inv_freq: Any, attention_factor: float, device: torch.device) -> torch.Tensor:
    """inv_freq [r/2] with attention_factor after it, in float64 like the frequencies, on ``device``."""
    inv = torch.as_tensor(inv_freq)
    if inv.ndim != 1:
        raise ValueError(f"inv_freq must be 1-D [r/2], got shape {tuple(inv.shape)}.")
    return torch.cat([inv.to(torch.float64), torch.tensor([float(attention_factor)], dtype=torch.float64)]).to(device)


def _check_angle_dtype(angle_dtype: torch.dtype) -> None:
    if angle_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"angle_dtype must be torch.float32 or torch.float64, got {angle_dtype}.")


def _pos_strides(p: torch.Tensor | None) -> tuple[int, int]:
    """(batch, token) strides of position ids: batch stride 0 for ids shared by the batch ([s] or [t])."""
    if p is None:
        return (0, 0)
    return (0, p.stride(0)) if p.ndim == 1 else (p.stride(0), p.stride(1))


def _apply(q: torch.Tensor, k: torch.Tensor | None, ctx: dict, inplace: bool):
    if inplace and not torch.is_grad_enabled():
        lay = ctx["layout"]
        k4 = as_bshd(k, lay) if k is not None else None
        _launch(as_bshd(q, lay), as_bshd(q, lay), k4, k4, ctx, conjugate=False, copy_pass=False)
        return q if k is None else (q, k)
    oq, ok = _RopeFunction.apply(q, k, ctx, inplace)
    return oq if k is None else (oq, ok)


def rope(
    q: torch.Tensor,
    k: torch.Tensor | None = None,
    *,
    layout: str,
    style: str = "half",
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float = 1.0,
    angle_dtype: torch.dtype = torch.float64,
    positions: Any = None,
    offset: int | torch.Tensor = 0,
    cu_seqlens: Any = None,
    max_seqlen: int | None = None,
    inplace: bool = False,
    block_s: int | None = None,
    heads_per_program: int | None = None,
):
    r"""Rotate q (and k) by RoPE in one fused Triton launch; returns q' (or (q', k')).

    Args:
        q: a tensor whose axes ``layout`` names, float32, float16, bfloat16 or float64, on a device the kernel
            runs on (:func:`why_unavailable`; ValueError with the reason otherwise). Any strides (a slice of a
            packed qkv works without a copy).
        k: None, or a tensor like q: it may have another head count (GQA) but the same other sizes, dtype
            and device.
        layout: the axes of q (and k), einops-style: ``"b s h d"``, ``"t h d"``, ...
        style: ``"half"`` or ``"interleaved"`` pairs.
        cos: a position-indexed table ``[P, r/2]``, e.g. ``ropelab.cos_sin(torch.arange(P), inv_freq)``: row p
            is position p; float32 (float64 for float64 inputs). ``r = 2 * (r/2)`` dims rotate; the rest of
            head_dim passes through. Give the tables or ``inv_freq``, exactly one (ValueError otherwise).
        sin: the sine table, ``cos``'s shape.
        inv_freq: ``[r/2]`` frequencies instead of the tables: the kernel forms :math:`a\cos(p\,\omega_i)`,
            :math:`a\sin(p\,\omega_i)` itself (fractional positions need this).
        attention_factor: a, multiplying cos and sin (with ``inv_freq`` only; tables carry their own).
        angle_dtype: the dtype the kernel forms the angles in with ``inv_freq``: torch.float64 (default, like
            :func:`ropelab.cos_sin`) or torch.float32.
        positions: None (0, 1, ... along the sequence, restarting at each ``cu_seqlens`` boundary), or
            ids ``[s]`` / ``[b, s]`` (``[t]`` for packed tokens).
        offset: added to every position: an int, or one per sequence (``[b]``, or ``[n_seq]`` with
            ``cu_seqlens``).
        cu_seqlens: ``[n_seq + 1]`` cumulative lengths for a ``t`` layout (at most 65535 sequences).
        max_seqlen: with ``cu_seqlens``, the longest sequence's length: it spares a device-to-host read (the
            caller vouches for cu_seqlens' values); None: cu_seqlens is read and checked.
        inplace: write into q and k (autograd-safe: they are marked dirty, see :class:`_RopeFunction`).
        block_s: tile override: tokens per program (None: the launch's choice, :func:`launch_tiles`).
        heads_per_program: tile override: heads per program (None: the launch's choice).

    positions, offset and cu_seqlens are checked by :func:`ropelab.core.check_position_args`, as
    :func:`ropelab.apply_rope` checks them; the kernel reads them as they are (no position per token is
    built for the implicit 0, 1, 2, ...).
    """
    _check_dtypes(q, k)
    lay = parse_layout(layout, q.ndim)
    check_style(style)
    B, S, Hq, D = _check_shapes(q, k, lay)
    if (cos is None) == (inv_freq is None):
        raise ValueError("give the tables (cos and sin, [P, r/2]) or inv_freq ([r/2]), exactly one of the two.")
    if cos is not None:
        if sin is None or cos.shape != sin.shape or cos.ndim != 2:
            raise ValueError(
                f"cos and sin must both be position-indexed tables [P, r/2], got {getattr(cos, 'shape', None)} "
                f"and {getattr(sin, 'shape', None)}."
            )
        half = cos.shape[1]
        cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
        if cos.dtype != cdt:
            raise ValueError(
                f"cos/sin must be {cdt} for {q.dtype} inputs (ropelab forms them in float64 and rounds once: "
                f"ropelab.cos_sin(..., dtype={cdt})), got {cos.dtype}."
            )
        cos, sin = cos.to(q.device), sin.to(q.device)
        if cos.stride(1) != 1 or sin.stride() != cos.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
    else:
        inv_freq = _inv_freq_arg(inv_freq, attention_factor, q.device)
        half = inv_freq.shape[0] - 1
    _check_angle_dtype(angle_dtype)
    if half < 1 or 2 * half > D:
        raise ValueError(f"the tables cover {2 * half} dims (r/2 = {half} pairs) but head_dim is {D}.")

    # What only the kernel needs of the (already checked) position arguments.
    pos, _, cu, off = check_position_args(q, lay, positions, cu_seqlens=cu_seqlens, offset=offset,
                                          read_cu_seqlens=max_seqlen is None)
    varlen = cu is not None
    if varlen:
        if max_seqlen is None:
            max_seqlen = int((cu[1:] - cu[:-1]).max())
        if cu.numel() - 1 > 65535:
            raise ValueError(f"at most 65535 sequences per launch, got {cu.numel() - 1}.")
    if pos is not None and cos is not None and pos.dtype.is_floating_point:
        raise ValueError("fractional positions need inv_freq (cos/sin made in the kernel), not a table.")
    offset_int, offset_tensor = 0, None
    if off.ndim == 0:
        if off.dtype.is_floating_point and (cos is not None or float(off) != int(off)):
            raise ValueError(f"offset must be an integer (a KV-cache length), got {float(off)}.")
        offset_int = int(off)
    else:
        if off.dtype.is_floating_point:
            raise ValueError(f"offset must hold integers, got {off.dtype}.")
        offset_tensor = off.to(device=q.device, dtype=torch.int64)
    if cos is not None and pos is None and offset_tensor is None:
        need = (max_seqlen if varlen else S) + offset_int
        if offset_int < 0 or need > cos.shape[0]:
            raise ValueError(
                f"positions {offset_int} .. {need - 1} fall outside the cos/sin table of {cos.shape[0]} rows; "
                "make the table longer (or pass inv_freq)."
            )
    ctx = {
        "layout": lay, "style": style, "half": half, "cos": cos, "sin": sin,
        "inv_freq": inv_freq if cos is None else None, "angle_f64": angle_dtype == torch.float64,
        "positions": pos, "pos_strides": _pos_strides(pos), "offset_int": offset_int, "offset_tensor": offset_tensor,
        "cu_seqlens": cu if varlen else None, "max_seqlen": max_seqlen, "block_s": block_s,
        "heads_per_program": heads_per_program,
    }
    return _apply(q, k, ctx, inplace)


def rope_positions(
    x: torch.Tensor,
    layout: Layout,
    p: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_factor: float,
    *,
    style: str,
    angle_dtype: torch.dtype,
) -> torch.Tensor:
    """``apply_rope(..., backend="triton")``: x, its parsed layout and the style already checked, the
    positions already resolved by :func:`ropelab.core.resolve_positions` (``p`` of shape [s], [b, s] or
    [t]), the frequencies of the spec. Checks only what the kernel adds (device, dtype, head_dim); cos/sin
    are made in the kernel from ``inv_freq`` in ``angle_dtype``, the same numbers as :func:`ropelab.cos_sin`."""
    _check_dtypes(x, None)
    _check_shapes(x, None, layout)
    _check_angle_dtype(angle_dtype)
    inv = _inv_freq_arg(inv_freq, attention_factor, x.device)
    ctx = {
        "layout": layout, "style": style, "half": inv.shape[0] - 1, "cos": None, "sin": None, "inv_freq": inv,
        "angle_f64": angle_dtype == torch.float64, "positions": p, "pos_strides": _pos_strides(p),
        "offset_int": 0, "offset_tensor": None, "cu_seqlens": None, "max_seqlen": None, "block_s": None,
        "heads_per_program": None,
    }
    return _apply(x, None, ctx, False)
