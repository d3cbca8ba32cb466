r"""``apply_rope``: one call from a tensor, its layout and a RoPE setting to the rotated tensor, on any backend.

This module sits above everything it dispatches to, so imports flow one way::

    core (layouts, positions, tables, rotation)  scaling (frequencies)
        <- spec (RopeSpec)  <- multiaxis (M-RoPE, axial)  <- kernels (Triton, torch.compile)  <- rope

:func:`apply_rope` takes the settings as keywords or as a :class:`ropelab.spec.RopeSpec`; keywords become a
spec once (:meth:`RopeSpec.from_keywords`). The positions are checked and resolved once, in
:func:`ropelab.core.resolve_positions`. The spec and the resolved positions then go down to one backend:

- ``"auto"`` (the default): ``"cpu"`` where it applies (:func:`rope_path` says which path a call takes and why),
  else ``"torch"``;
- ``"cpu"``: the C/OpenMP kernel (:mod:`ropelab.kernels.cpu_rope`) on cached float32 tables
  (:mod:`ropelab.kernels.tables`): CPU, float32/bfloat16/float16, no autograd; built on first use;
- ``"torch"``: the tables of :func:`ropelab.core.cos_sin` and the eager :func:`ropelab.core.rotate`;
- ``"compile"``: the same tables through one single-pass formula (:mod:`ropelab.kernels.compiled`);
- ``"triton"``: the fused kernel, cos/sin formed in the kernel (:mod:`ropelab.kernels.fused_rope`);
- ``sections=``: multi-axis positions (:func:`ropelab.multiaxis.multiaxis_rope`).

The kernels are imported on first use: importing ropelab never needs triton or the compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from .core import Layout, check_not_meta, cos_sin, parse_layout, resolve_positions, rotate, tables_for
from .multiaxis import MultiAxis, multiaxis_rope
from .scaling import LENGTH_DEPENDENT
from .spec import RopeSpec

__all__ = ["apply_rope", "apply_rope_qk", "rope_path", "RopePath", "BACKENDS", "MAX_PLANS", "clear_plans"]

BACKENDS = ("auto", "cpu", "torch", "compile", "triton")
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
    if (backend not in ("torch", "auto") or cu_seqlens is not None or isinstance(offset, torch.Tensor) or offset != 0
            or seq_len is not None or max_pos is not None):
        raise ValueError("sections= (multi-axis positions) takes positions, layout, style, base, rotary_dim "
                         "and rope_scaling only; give offsets inside the positions, backend='torch' (or 'auto').")


def _current_length(spec: RopeSpec, p: torch.Tensor, seq_len: int | None) -> int | None:
    """seq_len for the length-dependent scalings: as given, else max(position) + 1 as Hugging Face does in a
    full forward."""
    if seq_len is None and spec.rope_type in LENGTH_DEPENDENT and p.numel():
        check_not_meta(p, "a length-dependent rope_type (dynamic, longrope) without seq_len")
        seq_len = int(p.max()) + 1
    return seq_len


class RopePath(NamedTuple):
    """Which backend a call of :func:`apply_rope` runs on (``"cpu"``, ``"torch"``, ...) and why.

    Args:
        backend: the backend's name, as :func:`apply_rope`'s ``backend=`` takes it.
        reason: a sentence saying why that path (or, for a named backend, that it was asked for).
    """

    backend: str
    reason: str


def _auto_path(x: torch.Tensor, lay: Layout, spec: RopeSpec) -> RopePath:
    """``backend="auto"``: the CPU kernel when it computes this call correctly, else eager torch, with why."""
    from .kernels import cpu_rope

    if spec.is_nope:
        return RopePath("torch", "a layer without RoPE (spec.nope()): x is returned as it is")
    if torch.compiler.is_compiling():
        return RopePath("torch", "inside torch.compile: the traceable torch path")
    if type(x) is not torch.Tensor:
        return RopePath("torch", f"x is a {type(x).__name__} (a tensor subclass): the torch path")
    if torch.is_grad_enabled() and x.requires_grad:
        return RopePath("torch", "x requires grad: the differentiable torch path")
    half = (spec.rotary_dim or x.shape[lay.index("d")]) // 2
    why = cpu_rope.supported(x, half, lay.index("d"))
    if why is not None:
        return RopePath("torch", why)
    return RopePath("cpu", "CPU, no autograd, a supported dtype and a contiguous head dim: the C kernel")


def _kernel_can_write(x: torch.Tensor, out: torch.Tensor, d_idx: int) -> bool:
    """Whether the kernel can write into ``out``: a contiguous head dim, and either x itself (in place: each row
    is read whole before it is written) or memory apart from x's."""
    if out.shape[d_idx] > 1 and out.stride(d_idx) != 1:
        return False
    if out.data_ptr() == x.data_ptr() and out.stride() == x.stride():
        return True
    return not _ranges_meet(x, out)


def _extent(t: torch.Tensor) -> int:
    """The bytes from t's first element to the end of its last (for a tensor with elements; non-negative
    strides)."""
    return (sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) + 1) * t.element_size()


def _ranges_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges a and b span (first to last element) intersect: a cheap, conservative overlap test."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + _extent(b) and b0 < a0 + _extent(a)


def _rotate_on(backend: str, x: torch.Tensor, lay: Layout, p: torch.Tensor, p_axes: tuple[str, ...],
               spec: RopeSpec, seq_len: int | None, angle_dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x rotated by ``spec`` at the resolved positions ``p`` on one backend (the kernels are imported on first
    use); a layer without RoPE (:meth:`RopeSpec.nope`) returns x as it is, its positions checked. With ``out``
    the result is written there (which may be x) and ``out`` returned."""
    d_idx = lay.index("d")
    checked = False
    if backend == "auto":
        backend = _auto_path(x, lay, spec).backend
        if backend == "cpu" and out is not None and not _kernel_can_write(x, out, d_idx):
            backend = "torch"
        checked = True
    if backend == "cpu":
        from .kernels import cpu_buffers, cpu_rope
        from .kernels.tables import cached_tables_for

        if spec.is_nope:
            return x.clone() if out is None else out.copy_(x)
        cos, sin = cached_tables_for(spec, x, lay, p, p_axes, _current_length(spec, p, seq_len), angle_dtype)
        if not checked:
            why = cpu_rope.supported(x, cos.shape[-1], d_idx)
            if why is not None:
                raise ValueError(f"backend='cpu' cannot take this call: {why}; use backend='auto' (which then "
                                 "runs the torch path) or backend='torch'.")
            if torch.is_grad_enabled() and x.requires_grad:
                raise ValueError("backend='cpu' has no autograd and x requires grad; use backend='auto' or "
                                 "'torch'.")
            if out is not None and not _kernel_can_write(x, out, d_idx):
                raise ValueError("backend='cpu' writes out= only with a contiguous head dim, into x itself or "
                                 "into memory apart from x's; use backend='auto' or 'torch' for this out.")
        xm = x.movedim(d_idx, -1) if d_idx != x.ndim - 1 else x
        if out is None:
            out = cpu_buffers.empty(x) if x.is_contiguous() else None
            om = None if out is None else (out.movedim(d_idx, -1) if d_idx != x.ndim - 1 else out)
            if om is None:
                return cpu_rope.rotate_cpu(xm, cos, sin, style=spec.style).movedim(-1, d_idx)
        else:
            om = out.movedim(d_idx, -1) if d_idx != x.ndim - 1 else out
        if x.numel():
            cpu_rope.launch(xm, cos, sin, spec.style, om)
        return out
    y = _rotate_torch(backend, x, lay, p, p_axes, spec, seq_len, angle_dtype)
    return y if out is None else out.copy_(y)


def _rotate_torch(backend: str, x: torch.Tensor, lay: Layout, p: torch.Tensor, p_axes: tuple[str, ...],
                  spec: RopeSpec, seq_len: int | None, angle_dtype: torch.dtype) -> torch.Tensor:
    """The torch, compile and triton backends."""
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
               angle_dtype: torch.dtype = torch.float64, spec: RopeSpec | None = None, backend: str = "auto",
               sections: MultiAxis | None = None, out: torch.Tensor | None = None,
               inplace: bool = False) -> torch.Tensor:
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
        backend: ``"auto"`` (the default: ``"cpu"`` where it computes the call correctly, else ``"torch"``;
            :func:`rope_path` says which and why), ``"cpu"`` (the C/OpenMP kernel of
            :mod:`ropelab.kernels.cpu_rope` on cached float32 tables: CPU tensors of float32, bfloat16 or
            float16 with a contiguous head dim, no autograd; compiled on first use, about 0.5 s with gcc, then
            cached on disk: :func:`ropelab.kernels.cpu_rope.build_info`; a small call seen before runs from
            its plan, in C++ where :mod:`ropelab.kernels.cpu_fast` is built), ``"torch"`` (eager PyTorch,
            :func:`rotate`, exactly as before ``"auto"`` existed), ``"compile"`` (one single-pass formula through
            ``torch.compile``: the CPU path at the memory floor) or ``"triton"`` (the fused kernel of
            :mod:`ropelab.kernels`, CUDA or ``TRITON_INTERPRET=1``). Same checks, same tables and the same
            error bound for all, forward and backward: 16-bit x is computed in float32 and rounded
            once, so per pair (a, b) :math:`|y_a - y_a^{exact}| \le 4u_{32}(|x_a| + |x_b|) + u\,|y_a^{exact}|`
            and, for the gradient (:math:`R^\top g`, g = dL/dy), :math:`|dx_a - dx_a^{exact}| \le
            4u_{32}(|g_a| + |g_b|) + u\,|dx_a^{exact}|`, u the unit roundoff of x's dtype (plus half its
            subnormal spacing; Triton's CPU interpreter truncates to bfloat16: 2u there).
        sections: a :class:`ropelab.multiaxis.MultiAxis` (M-RoPE or axial): then ``positions`` is [A, s] or
            [A, b, s], one row per axis, and pair i rotates with its axis's position.
        out: a tensor of x's shape and dtype to write the result into (no allocation); it may be x.
        inplace: write the result into x itself (``out=x``), as flash-attn's ``apply_rotary_emb(...,
            inplace=True)``; not with ``out``, nor for an x that requires grad.

    Returns a tensor of x's shape and dtype (``out``, or x when ``inplace``).
    """
    fast = _FAST[0]
    if fast is not None and not torch.compiler.is_compiling():  # plans kept in C++ (kernels.cpu_fast)
        y = fast.call(x, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
                      max_position_embeddings, seq_len, angle_dtype, spec, backend, sections, out, inplace)
        if y is not None:
            return y
    key = _plan_key(x, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
                    max_position_embeddings, seq_len, angle_dtype, spec, backend, sections, out, inplace)
    if key is not None:
        plan = _PLANS.get(key, _MISSING)
        if plan is _MISSING:
            plan = _remember(key, _build_plan(x, positions, layout, style, base, rotary_dim, offset,
                                              max_position_embeddings, seq_len, angle_dtype, spec, out, inplace))
        if plan is not None:
            if fast is not None:  # the next call of this key runs in C++ (a no-op for calls it does not take)
                fast.store(x, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
                           max_position_embeddings, seq_len, angle_dtype, spec, backend, sections, out, inplace,
                           plan[0], plan[1], plan[4], plan[5], *plan[6])
            y = _run_plan(plan, x, out, inplace)
            if y is not None:
                return y
    lay, spec, p, p_axes = _prepare(x, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
                                    max_position_embeddings, seq_len, spec, backend, sections)
    out = _check_out(x, out, inplace)
    if sections is not None:
        y = multiaxis_rope(x, lay, positions, sections, spec, angle_dtype=angle_dtype)
        return y if out is None else out.copy_(y)
    return _rotate_on(backend, x, lay, p, p_axes, spec, seq_len, angle_dtype, out)


# ---------------------------------------------------------------------------------------------------------------
# Plans: a call seen before runs the kernel on what its first call checked and formed.
#
# A decode step calls apply_rope with the same shapes, settings and positions for q and k and for every layer.
# Its tensors are small (a [8, 32, 1, 128] q is 128 KiB: a copy takes about 3 us), so the checks, the spec, the
# positions and the table lookup (about 50 us in Python) cost many times the rotation. A call whose key (x's
# dtype, shape and strides; every setting; the positions' dtype, shape and *content*; out's and inplace's) was
# seen runs the C kernel with the packed arguments its first call built: the same kernel on the same tables, so
# the same bits. The first call of a key goes the whole way, with every check; one that fails raises there and
# stores no plan. Keys only hold plain values (str, int, float, None, dtypes, shapes, bytes, frozen specs).
# ---------------------------------------------------------------------------------------------------------------

MAX_PLANS = 64
_PLANS: dict = {}
# The C++ plans of kernels.cpu_fast: [module or None], loaded on the first plan built (never built on a call).
_FAST: list = [None]
_FAST_TRIED: set = set()
_MISSING = object()
_INT_OR_NONE = (int, type(None))
_POSITION_DTYPES = (torch.int64, torch.int32, torch.int16, torch.float64, torch.float32)


def _plan_key(x, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
              max_position_embeddings, seq_len, angle_dtype, spec, backend, sections, out, inplace) -> tuple | None:
    """The plan key of an apply_rope call, or None when the call is not one plans take (then every call goes
    the whole way): backend "auto", a plain CPU x without autograd, no scaling dict (``spec=`` carries one), no
    varlen or multi-axis positions, an int offset, positions None or a CPU tensor (its bytes are the key)."""
    if (backend != "auto" or sections is not None or cu_seqlens is not None or rope_scaling is not None
            or type(x) is not torch.Tensor or not x.is_cpu or x.layout is not torch.strided
            or type(offset) is not int or type(inplace) is not bool
            or type(layout) is not str or type(style) is not str or type(base) not in (int, float)
            or type(rotary_dim) not in _INT_OR_NONE or type(max_position_embeddings) not in _INT_OR_NONE
            or type(seq_len) not in _INT_OR_NONE or (spec is not None and type(spec) is not RopeSpec)
            or (x.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling()):
        return None
    if positions is None:
        pkey = None
    elif (type(positions) is torch.Tensor and positions.is_cpu and positions.layout is torch.strided
          and not positions.requires_grad and positions.dtype in _POSITION_DTYPES):
        pkey = (positions.dtype, positions.shape, positions.numpy().tobytes())
    else:
        return None
    if out is None:
        okey = None
    elif type(out) is torch.Tensor and out.is_cpu and out.layout is torch.strided and not out.requires_grad:
        okey = (out.dtype, out.shape, out.stride())
    else:
        return None
    return (layout, style, base, rotary_dim, max_position_embeddings, seq_len, offset, angle_dtype, spec, inplace,
            x.dtype, x.shape, x.stride(), pkey, okey)


def _remember(key: tuple, plan):
    """Store a plan (None too: a key whose calls go the whole way); the oldest goes when full."""
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.pop(next(iter(_PLANS)), None)
    _PLANS[key] = plan
    return plan


def _build_plan(x, positions, layout, style, base, rotary_dim, offset, max_position_embeddings, seq_len,
                angle_dtype, spec, out, inplace):
    """Every check and choice of the whole way (raising as it does); a plan (the packed kernel arguments, whether
    an out at x's address has x's strides, the launch and allocation functions, the tables it points into) when
    the call runs on the C kernel, else None."""
    from .kernels import cpu_rope
    from .kernels.tables import cached_tables_for

    lay, spec, p, p_axes = _prepare(x, positions, layout, style, base, rotary_dim, None, None, offset,
                                    max_position_embeddings, seq_len, spec, "auto", None)
    target = _check_out(x, out, inplace)
    if spec.is_nope or x.numel() == 0 or _auto_path(x, lay, spec).backend != "cpu":
        return None
    d_idx = lay.index("d")
    if target is None and not x.is_contiguous():
        return None  # the whole way allocates its output per call
    if target is not None and target.shape[d_idx] > 1 and target.stride(d_idx) != 1:
        return None
    from .kernels import cpu_buffers

    if _FAST[0] is None and "module" not in _FAST_TRIED:
        _FAST_TRIED.add("module")
        from .kernels import cpu_fast

        _FAST[0] = cpu_fast.load(cpu_rope.packed_address(), RopeSpec, MAX_PLANS)
    cos, sin = cached_tables_for(spec, x, lay, p, p_axes, _current_length(spec, p, seq_len), angle_dtype)
    xm = x.movedim(d_idx, -1)
    om = xm if target is None else target.movedim(d_idx, -1)  # a new output has x's (contiguous) strides
    same_strides = target is None or target.stride() == x.stride()
    # the plan holds the functions it calls (no import machinery per call) and the byte extents of x and out
    # (fixed by their shapes and strides, which the key holds) for _ranges_meet's overlap test
    return (cpu_rope.pack(xm, cos, sin, spec.style, om), same_strides, cpu_rope.launch_packed, cpu_buffers.empty,
            _extent(x), None if target is None else _extent(target), (cos, sin))


def _run_plan(plan, x: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> torch.Tensor | None:
    """The kernel on a plan: the result, or None when this out overlaps x (the whole way decides then)."""
    args, same_strides, launch, empty, x_bytes, out_bytes, _ = plan
    x0 = x.data_ptr()
    if inplace:
        target = x
    elif out is None:
        target = empty(x)
    else:
        target = out
        o0 = target.data_ptr()
        if o0 == x0:
            if not same_strides:
                return None
        elif x0 < o0 + out_bytes and o0 < x0 + x_bytes:  # _ranges_meet on the plan's extents
            return None
    launch(args, x0, target.data_ptr())
    return target


def clear_plans() -> None:
    """Forget every plan (the next call of each key goes the whole way again), the C++ ones too."""
    _PLANS.clear()
    if _FAST[0] is not None:
        _FAST[0].clear()


def _check_out(x: torch.Tensor, out: torch.Tensor | None, inplace: bool) -> torch.Tensor | None:
    """The tensor to write into: ``out``, x when ``inplace``, None for a new one; checked."""
    if not isinstance(inplace, bool):
        raise ValueError(f"inplace must be True or False, got {inplace!r}.")
    if inplace:
        if out is not None:
            raise ValueError("give out= or inplace=True, not both (inplace=True means out=x).")
        out = x
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"out must be a tensor of x's shape, dtype and device ({tuple(x.shape)}, {x.dtype}, "
                             f"{x.device}), got {getattr(out, 'shape', type(out).__name__)}.")
        if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
            raise ValueError("out= and inplace=True write without autograd; x (or out) requires grad: call "
                             "apply_rope without them, or under torch.no_grad().")
    return out


def _prepare(x, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
             max_position_embeddings, seq_len, spec, backend, sections):
    """apply_rope's checks, the spec, the resolved positions: what every backend starts from."""
    if spec is not None:
        _check_spec_alone(spec, (style, base, rotary_dim, rope_scaling, max_position_embeddings))
    if sections is not None:
        _check_sections_alone(spec, backend, cu_seqlens, offset, seq_len, max_position_embeddings)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}.")
    if x.layout is not torch.strided:
        raise ValueError(f"x is a {x.layout} tensor; apply_rope takes dense (strided) tensors: pass x.to_dense().")
    lay = parse_layout(layout, x.ndim)
    head_dim = x.shape[lay.index("d")]
    if spec is None:  # the keywords become one spec, here and only here
        spec = RopeSpec.from_keywords(head_dim, style=style, base=base, rotary_dim=rotary_dim,
                                      rope_scaling=rope_scaling, max_position_embeddings=max_position_embeddings)
    if sections is not None:
        return lay, spec, None, None
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    p, p_axes = resolve_positions(x, lay, positions, cu_seqlens=cu_seqlens, offset=offset)
    return lay, spec, p, p_axes


def rope_path(x: torch.Tensor, positions: Any = None, *, layout: str, backend: str = "auto",
              sections: MultiAxis | None = None, **settings: Any) -> RopePath:
    """Which backend :func:`apply_rope` with these arguments runs on, and why (the same checks; nothing is
    rotated). ``backend="auto"`` names the path it picks; another backend names itself. E.g.
    ``rope_path(q, layout="b h s d")`` -> ``RopePath(backend='cpu', reason='CPU, no autograd, ...')``.

    Args:
        x: the tensor :func:`apply_rope` would rotate (its device, dtype, strides and autograd flag decide).
        positions: as in :func:`apply_rope`.
        layout: as in :func:`apply_rope`.
        backend: ``"auto"`` (which path it would pick, and why) or a backend's name (checked, then named).
        sections: a :class:`ropelab.multiaxis.MultiAxis`: multi-axis calls run on the torch path.
        **settings: the rest of :func:`apply_rope`'s keywords (``style``, ``base``, ``rotary_dim``,
            ``rope_scaling``, ``cu_seqlens``, ``offset``, ``max_position_embeddings``, ``seq_len``,
            ``angle_dtype``, ``spec``); another keyword raises ValueError.

    Returns a :class:`RopePath` ``(backend, reason)``; the call's errors are raised as :func:`apply_rope` raises
    them."""
    spec = settings.pop("spec", None)
    keys = ("style", "base", "rotary_dim", "rope_scaling", "cu_seqlens", "offset", "max_position_embeddings",
            "seq_len")
    unknown = sorted(set(settings) - set(keys) - {"angle_dtype"})
    if unknown:
        raise ValueError(f"rope_path takes apply_rope's keywords; unknown: {unknown}.")
    defaults = {"style": "half", "base": 10000.0, "rotary_dim": None, "rope_scaling": None, "cu_seqlens": None,
                "offset": 0, "max_position_embeddings": None, "seq_len": None}
    kw = {**defaults, **{k: v for k, v in settings.items() if k in keys}}
    lay, spec, _, _ = _prepare(x, positions, layout, *(kw[k] for k in keys[:4]), kw["cu_seqlens"], kw["offset"],
                               kw["max_position_embeddings"], kw["seq_len"], spec, backend, sections)
    if sections is not None:
        return RopePath("torch", "sections= (multi-axis positions) runs on the torch path")
    if backend != "auto":
        return RopePath(backend, f"backend={backend!r} was asked for")
    return _auto_path(x, lay, spec)


def apply_rope_qk(q: torch.Tensor, k: torch.Tensor, positions: Any = None, *, layout: str, style: str = "half",
                  base: float = 10000.0, rotary_dim: int | None = None, rope_scaling: Mapping[str, Any] | None = None,
                  cu_seqlens: Any = None, offset: int | torch.Tensor = 0, max_position_embeddings: int | None = None,
                  seq_len: int | None = None, angle_dtype: torch.dtype = torch.float64, spec: RopeSpec | None = None,
                  backend: str = "auto", out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` on queries and keys at the same positions in one call: ``(q_rot, k_rot)``.

    The same arguments and results as two :func:`apply_rope` calls (q and k may differ in their number of heads,
    as in grouped-query attention; every other axis but d must match, and d too), with the positions resolved,
    the tables formed and the path chosen once. ``out`` is a pair ``(q_out, k_out)``; ``inplace=True`` writes
    into q and k.

    Args:
        q: the queries, laid out as ``layout``.
        k: the keys, laid out as ``layout``: the same sizes as q but (possibly) the heads axis ``h``.
        positions: one set of positions for both, as in :func:`apply_rope`.
        layout: the axes of q and of k (one layout for both).
        style: as in :func:`apply_rope`.
        base: as in :func:`apply_rope`.
        rotary_dim: as in :func:`apply_rope`.
        rope_scaling: as in :func:`apply_rope`.
        cu_seqlens: as in :func:`apply_rope`.
        offset: as in :func:`apply_rope`.
        max_position_embeddings: as in :func:`apply_rope`.
        seq_len: as in :func:`apply_rope`.
        angle_dtype: as in :func:`apply_rope`.
        spec: as in :func:`apply_rope`.
        backend: as in :func:`apply_rope`; one path is chosen for both tensors.
        out: a pair ``(q_out, k_out)`` of tensors of q's and k's shapes and dtypes to write into.
        inplace: write the results into q and k themselves; not with ``out``.

    Returns ``(q_rot, k_rot)``.
    """
    settings = dict(layout=layout, style=style, base=base, rotary_dim=rotary_dim, rope_scaling=rope_scaling,
                    cu_seqlens=cu_seqlens, offset=offset, max_position_embeddings=max_position_embeddings,
                    seq_len=seq_len, angle_dtype=angle_dtype, spec=spec, backend=backend)
    if out is not None:
        return _apply_rope_qk(q, k, positions, out=out, inplace=inplace, **settings)
    # plans (see apply_rope): both tensors' keys seen before, with the pair's own checks passed
    args = (positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset, max_position_embeddings,
            seq_len, angle_dtype, spec, backend, None, None, inplace)
    key_q, key_k = _plan_key(q, *args), _plan_key(k, *args)
    if key_q is None or key_k is None:
        return _apply_rope_qk(q, k, positions, out=None, inplace=inplace, **settings)
    plans = _PLANS.get(("qk", key_q, key_k), _MISSING)
    if plans is _MISSING:
        pair = _apply_rope_qk(q, k, positions, out=None, inplace=inplace, **settings)  # raises for a bad call
        # each tensor's plan as a new output's; in place, _run_plan writes x itself, which has those strides
        built = [_build_plan(t, positions, layout, style, base, rotary_dim, offset, max_position_embeddings, seq_len,
                             angle_dtype, spec, None, False) for t in (q, k)]
        _remember(("qk", key_q, key_k), None if None in built else tuple(built))
        return pair
    if plans is None:
        return _apply_rope_qk(q, k, positions, out=None, inplace=inplace, **settings)
    return _run_plan(plans[0], q, None, inplace), _run_plan(plans[1], k, None, inplace)


def _apply_rope_qk(q: torch.Tensor, k: torch.Tensor, positions: Any, *, layout: str, style: str, base: float,
                   rotary_dim: int | None, rope_scaling: Mapping[str, Any] | None, cu_seqlens: Any,
                   offset: int | torch.Tensor, max_position_embeddings: int | None, seq_len: int | None,
                   angle_dtype: torch.dtype, spec: RopeSpec | None, backend: str,
                   out: tuple[torch.Tensor, torch.Tensor] | None, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rope_qk the whole way: every check, the positions resolved and the path chosen once."""
    if not isinstance(k, torch.Tensor) or not isinstance(q, torch.Tensor):
        raise ValueError("q and k must be torch tensors.")
    lay, spec, p, p_axes = _prepare(q, positions, layout, style, base, rotary_dim, rope_scaling, cu_seqlens, offset,
                                    max_position_embeddings, seq_len, spec, backend, None)
    if k.ndim != q.ndim or any(a != "h" and q.shape[i] != k.shape[i] for i, a in enumerate(lay.axes)):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must match on every axis of {layout!r} but "
                         "h (the heads may differ: grouped-query attention).")
    if k.dtype != q.dtype or k.device != q.device:
        raise ValueError(f"q and k must share dtype and device, got {q.dtype}/{q.device} and {k.dtype}/{k.device}.")
    if out is not None and not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ValueError("out must be a pair (q_out, k_out).")
    q_out = _check_out(q, None if out is None else out[0], inplace)
    k_out = _check_out(k, None if out is None else out[1], inplace)
    if backend == "auto":
        backend = _auto_path(q, lay, spec).backend
        if backend == "cpu" and _auto_path(k, lay, spec).backend != "cpu":
            backend = "torch"
    return (_rotate_on(backend, q, lay, p, p_axes, spec, seq_len, angle_dtype, q_out),
            _rotate_on(backend, k, lay, p, p_axes, spec, seq_len, angle_dtype, k_out))
