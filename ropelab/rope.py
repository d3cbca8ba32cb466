r"""``apply_rope``: one call from a tensor, its layout and a RoPE setting to the rotated tensor, on any backend.

This module sits above everything it dispatches to, so imports flow one way::

    core (layouts, positions, tables, rotation)  scaling (frequencies)
        <- spec (RopeSpec)  <- multiaxis (M-RoPE, axial)  <- kernels (Triton, torch.compile)  <- rope

:func:`apply_rope` takes the settings as keywords or as a :class:`ropelab.spec.RopeSpec`; keywords become a
spec once (:meth:`RopeSpec.from_keywords`). The positions are checked and resolved once, in
:func:`ropelab.core.resolve_positions`. The spec and the resolved positions then go down to one backend:

- ``"torch"``: the tables of :func:`ropelab.core.cos_sin` and the eager :func:`ropelab.core.rotate`;
- ``"compile"``: the same tables through one single-pass formula (:mod:`ropelab.kernels.compiled`);
- ``"triton"``: the fused kernel, cos/sin formed in the kernel (:mod:`ropelab.kernels.fused_rope`);
- ``sections=``: multi-axis positions (:func:`ropelab.multiaxis.multiaxis_rope`).

The kernels are imported on first use: importing ropelab never needs triton or the compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .core import Layout, check_not_meta, cos_sin, parse_layout, resolve_positions, rotate, tables_for
from .multiaxis import MultiAxis, multiaxis_rope
from .scaling import LENGTH_DEPENDENT
from .spec import RopeSpec

__all__ = ["apply_rope", "BACKENDS"]

BACKENDS = ("torch", "compile", "triton")
# style, base, rotary_dim, rope_scaling and max_position_embeddings at the signature's defaults: what spec= replaces.
_SPEC_DEFAULTS = ("half", 10000.0, None, None, None)


def _check_spec_alone(spec: Any, keywords: tuple) -> None:
    """spec= replaces the five setting keywords: they must stay at the signature's defaults."""
    if keywords != _SPEC_DEFAULTS:
        raise ValueError("give the RoPE settings either as spec= or as keywords (style, base, ...), not both.")
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec must be a ropelab.RopeSpec (e.g. RopeSpec.from_hf_config(config)), got "
                         f"{type(spec).__name__}.")


def _check_sections_alone(spec: RopeSpec | None, backend: str, cu_seqlens: Any, offset: Any, seq_len: Any,
                          max_position_embeddings: Any) -> None:
    """sections= takes its offsets inside the positions and runs on the torch backend."""
    max_pos = spec.max_position_embeddings if spec is not None else max_position_embeddings
    if (backend != "torch" or cu_seqlens is not None or isinstance(offset, torch.Tensor) or offset != 0
            or seq_len is not None or max_pos is not None):
        raise ValueError("sections= (multi-axis positions) takes positions, layout, style, base, rotary_dim "
                         "and rope_scaling only; give offsets inside the positions, backend='torch'.")


def _current_length(spec: RopeSpec, p: torch.Tensor, seq_len: int | None) -> int | None:
    """seq_len for the length-dependent scalings: as given, else max(position) + 1 as Hugging Face does in a
    full forward."""
    if seq_len is None and spec.rope_type in LENGTH_DEPENDENT and p.numel():
        check_not_meta(p, "a length-dependent rope_type (dynamic, longrope) without seq_len")
        seq_len = int(p.max()) + 1
    return seq_len


def _rotate_on(backend: str, x: torch.Tensor, lay: Layout, p: torch.Tensor, p_axes: tuple[str, ...],
               spec: RopeSpec, seq_len: int | None, angle_dtype: torch.dtype) -> torch.Tensor:
    """x rotated by ``spec`` at the resolved positions ``p`` on one backend (the kernels are imported on first
    use); a layer without RoPE (:meth:`RopeSpec.nope`) returns x as it is, its positions checked."""
    if spec.is_nope:
        return x.clone()
    inv_freq, attention_factor = spec.frequencies(x.shape[lay.index("d")], seq_len=_current_length(spec, p, seq_len))
    style = spec.style
    if backend == "triton":
        from .kernels.fused_rope import rope_positions

        return rope_positions(x, lay, p, inv_freq, attention_factor, style=style, angle_dtype=angle_dtype)
    d_idx = lay.index("d")
    cdt = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos_sin(p, inv_freq, attention_factor, dtype=cdt, angle_dtype=angle_dtype)
    cos, sin = tables_for(x, lay, cos, sin, p_axes)
    if backend == "compile":
        from .kernels.compiled import rotate_compiled

        return rotate_compiled(x.movedim(d_idx, -1), cos, sin, style=style).movedim(-1, d_idx)
    return rotate(x.movedim(d_idx, -1), cos, sin, style=style).movedim(-1, d_idx)


def apply_rope(x: torch.Tensor, positions: Any = None, *, layout: str, style: str = "half", base: float = 10000.0,
               rotary_dim: int | None = None, rope_scaling: Mapping[str, Any] | None = None, cu_seqlens: Any = None,
               offset: int | torch.Tensor = 0, max_position_embeddings: int | None = None, seq_len: int | None = None,
               angle_dtype: torch.dtype = torch.float64, spec: RopeSpec | None = None, backend: str = "torch",
               sections: MultiAxis | None = None) -> torch.Tensor:
    r"""Apply RoPE to ``x``, whose every axis is named by ``layout``.

    Args:
        x: queries or keys, e.g. [batch, seq, heads, head_dim] with ``layout="b s h d"``.
        positions: None (0, 1, 2, ... along the sequence axis, restarting at each ``cu_seqlens`` boundary for
            ``t``), a 1-D tensor with one position per token of the sequence axis, or a 2-D [b, s] tensor with
            one row per batch element. Negative positions are valid (a rotation by :math:`-m\,\omega_i`); NaN
            or inf raise ValueError.
        layout: einops-style names of x's axes: b batch, s sequence, h heads, d head dim, t packed tokens
            (varlen). ``"b s h d"``, ``"b h s d"``, ``"s h d"``, ``"t h d"``, ...
        style: ``"half"`` pairs (i, i + r/2) (Llama, GPT-NeoX, ESM); ``"interleaved"`` pairs (2i, 2i + 1)
            (GPT-J, RoFormer, Meta).
        base: the RoPE base b (``rope_theta``).
        rotary_dim: how many leading head dims rotate (even); the rest pass through. Default: all, or
            ``partial_rotary_factor`` from ``rope_scaling``.
        rope_scaling: a Hugging Face scaling dict; see :func:`ropelab.frequencies`.
        cu_seqlens: [n_seq + 1] cumulative lengths for a ``t`` layout (flash-attn's varlen format).
        offset: added to every position (an int, or one per batch element, or with ``cu_seqlens`` one per
            packed sequence, as flash-attn's ``seqlen_offsets``): a KV-cache step.
        max_position_embeddings: the model's trained context (dynamic NTK's threshold).
        seq_len: the current length for length-dependent scalings (dynamic, longrope); default
            ``max(positions) + 1`` as Hugging Face does in a full forward.
        angle_dtype: float64 (default) or float32 for the angles :math:`m\,\omega_i`.
        spec: a :class:`ropelab.spec.RopeSpec` giving style, base, rotary_dim, scaling and
            max_position_embeddings at once (then leave those keywords at their defaults).
        backend: ``"torch"`` (eager PyTorch, :func:`rotate`), ``"compile"`` (one single-pass formula through
            ``torch.compile``: the CPU path at the memory floor) or ``"triton"`` (the fused kernel of
            :mod:`ropelab.kernels`, CUDA or ``TRITON_INTERPRET=1``). Same checks, same tables and the same
            error bound for all three, forward and backward: 16-bit x is computed in float32 and rounded
            once, so per pair (a, b) :math:`|y_a - y_a^{exact}| \le 4u_{32}(|x_a| + |x_b|) + u\,|y_a^{exact}|`
            and, for the gradient (:math:`R^\top g`, g = dL/dy), :math:`|dx_a - dx_a^{exact}| \le
            4u_{32}(|g_a| + |g_b|) + u\,|dx_a^{exact}|`, u the unit roundoff of x's dtype (plus half its
            subnormal spacing; Triton's CPU interpreter truncates to bfloat16: 2u there).
        sections: a :class:`ropelab.multiaxis.MultiAxis` (M-RoPE or axial): then ``positions`` is [A, s] or
            [A, b, s], one row per axis, and pair i rotates with its axis's position.

    Returns a tensor of x's shape and dtype.
    """
    if spec is not None:
        _check_spec_alone(spec, (style, base, rotary_dim, rope_scaling, max_position_embeddings))
    if sections is not None:
        _check_sections_alone(spec, backend, cu_seqlens, offset, seq_len, max_position_embeddings)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}.")
    lay = parse_layout(layout, x.ndim)
    head_dim = x.shape[lay.index("d")]
    if spec is None:  # the keywords become one spec, here and only here
        spec = RopeSpec.from_keywords(head_dim, style=style, base=base, rotary_dim=rotary_dim,
                                      rope_scaling=rope_scaling, max_position_embeddings=max_position_embeddings)
    if sections is not None:
        return multiaxis_rope(x, lay, positions, sections, spec, angle_dtype=angle_dtype)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    p, p_axes = resolve_positions(x, lay, positions, cu_seqlens=cu_seqlens, offset=offset)
    return _rotate_on(backend, x, lay, p, p_axes, spec, seq_len, angle_dtype)
