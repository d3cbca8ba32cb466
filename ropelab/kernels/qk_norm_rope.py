r"""QK-RMSNorm + RoPE (+ the KV-cache write) as one op: the per-head norm of Qwen3/OLMo2-style attention,
the rotation and the store of k and v into a contiguous or paged cache, in one pass over the projection output.

::

    q, k = qk_norm_rope(qkv, num_heads=16, num_kv_heads=4, head_dim=128, q_weight=wq, k_weight=wk,
                        eps=1e-6, spec=RopeSpec(base=1e6), positions=pos)                 # packed QKV
    q, k = qk_norm_rope(q=q, k=k, v=v, ..., cos_sin_cache=cache, style="interleaved",  # vLLM's table
                        positions=pos, kv_cache=(k_cache, v_cache), slot_mapping=slots)

Production engines fuse these steps so that RoPE costs no memory pass of its own (vLLM's
``fused_qk_norm_rope``, SGLang's fused_qknorm_rope, FlashInfer's ``rope_quantize_fp8_append_paged_kv_cache``,
Liger's QK-norm+RoPE; see ``shared/research/anchors-2026.md`` section 1.2). The op per q or k head row
``x`` (``D = head_dim`` elements) is

.. math::
    \hat x = x\,\Big(\tfrac1D\textstyle\sum_j x_j^2 + \varepsilon\Big)^{-1/2} \odot (w + o), \qquad
    y = R(p)\,\hat x,

``o = 0`` (Hugging Face ``Qwen3RMSNorm``, OLMo2) or ``o = 1`` (``unit_offset=True``: Gemma's
``(1 + weight)``), :math:`R(p)` RoPE at the token's position ``p`` on the first ``r`` dims (pairs
``(i, i + r/2)``, ``style="half"``, vLLM's ``is_neox=True``; or ``(2i, 2i + 1)``, ``"interleaved"``, GPT-J),
the dims past ``r`` only normalised. v is not touched; with ``kv_cache`` the rotated k and v are written
into the cache at each token's slot.

**Numerics** (every backend): the input is converted to float32 (float64 for float64 input), the mean of
squares, the normalisation, the weight (converted to float32) and the rotation are computed there, and the
result is rounded **once** to the output dtype. Hugging Face's ``Qwen3RMSNorm`` instead returns
``self.weight * hidden_states.to(input_dtype)``: it rounds the normalised x to the input dtype, then
multiplies by the weight in the weight's dtype (a second rounding), and RoPE rounds a third time; the fused
result is therefore at least as accurate as the unfused sequence (tests/test_fused_qk_norm_rope.py checks it
against a float64 oracle). cos/sin come from a :class:`ropelab.RopeSpec` (angles formed in ``angle_dtype``,
float64 by default, rounded once to float32, as :func:`ropelab.cos_sin`) or from a vLLM-style
``cos_sin_cache`` ``[max_position, r]`` (cos in the first ``r/2`` columns, sin in the last), used as given
(converted to float32). Per pair (a, b), with :math:`y` the exact result and u the output's unit roundoff,
:math:`|y_a - y_a^{exact}| \le (D/2 + 8)\,u_{32}\,(|y^{exact}_a| + |y^{exact}_b|) + u\,|y^{exact}_a|` (the
sum of D squares in float32 carries up to ``D u_32`` relative error, halved by the square root).

**Cache**: ``kv_cache=(k_cache, v_cache)``, each ``[n_blocks, block_size, Hkv, D]`` (a paged cache, vLLM's
``NHD`` layout) or ``[n_seq, max_len, Hkv, D]`` (a contiguous cache: the same shape read as one block per
sequence). Slot ``s`` is row ``[s // block_size, s % block_size]``. The slots come from ``slot_mapping``
(``[tokens]``, ``block * block_size + offset`` as vLLM's; ``-1`` skips the token, vLLM's padding), from
``block_table`` (``[n_seq, max_blocks]``: slot = ``block_table[seq, p // block_size] * block_size +
p % block_size`` at the token's position ``p``), or, with neither, slot = ``seq * max_len + p`` (the
contiguous cache). Every other entry of the cache is left exactly as it was.

**Backends**: ``"torch"`` (eager PyTorch, the reference), ``"triton"`` (:mod:`ropelab.kernels.qk_norm_rope_triton`:
one launch, one program per token-head row; CUDA, or the CPU under ``TRITON_INTERPRET=1``), ``"cpu"``
(the C kernel ``cpu_qk_norm_rope.c``, built on first use by :mod:`ropelab.kernels.cpu_build`: one OpenMP pass
over the token-head rows, float32, the bf16 rounding to nearest even) and ``"compile"`` (``torch.compile`` of
the reference: Inductor's C++ on a CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core import check_cu_seqlens, check_positions, check_style, cos_sin, rotate, varlen_positions
from ..spec import RopeSpec

__all__ = ["qk_norm_rope", "qk_rms_norm", "qk_norm_rope_oracle", "QK_NORM_ROPE_BACKENDS", "resolve_slots"]

QK_NORM_ROPE_BACKENDS = ("torch", "compile", "triton", "cpu")
MAX_HEAD_DIM = 512
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def _as_heads(x: Any, name: str, heads: int, head_dim: int, tokens: int | None) -> torch.Tensor:
    """``x`` as a [tokens, heads, head_dim] view (x given as [tokens, heads * head_dim] or already 3-D)."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}.")
    if x.ndim == 2 and x.shape[1] == heads * head_dim:
        x = x.unflatten(1, (heads, head_dim))
    if x.ndim != 3 or tuple(x.shape[1:]) != (heads, head_dim):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}; expected [tokens, {heads}, {head_dim}] or "
            f"[tokens, {heads * head_dim}] ({heads} heads of head_dim {head_dim})."
        )
    if tokens is not None and x.shape[0] != tokens:
        raise ValueError(f"{name} has {x.shape[0]} tokens but q has {tokens}; q, k and v must have one row per token.")
    return x


def _split(qkv, q, k, v, num_heads: int, num_kv_heads: int, head_dim: int):
    for name, n in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"{name} must be a positive int, got {n!r}.")
    if head_dim % 2 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM}, got {head_dim}.")
    if qkv is not None:
        if q is not None or k is not None or v is not None:
            raise ValueError("give the packed qkv or q, k (and v) separately, not both.")
        if not isinstance(qkv, torch.Tensor) or qkv.ndim != 2:
            raise ValueError(f"qkv must be a 2-D tensor [tokens, (Hq + 2 Hkv) * D], got "
                             f"{tuple(getattr(qkv, 'shape', ()))}.")
        width = (num_heads + 2 * num_kv_heads) * head_dim
        if qkv.shape[1] != width:
            raise ValueError(
                f"qkv has {qkv.shape[1]} columns but (num_heads + 2 num_kv_heads) * head_dim = "
                f"({num_heads} + 2*{num_kv_heads}) * {head_dim} = {width}."
            )
        qs, ks = num_heads * head_dim, num_kv_heads * head_dim
        q, k, v = qkv[:, :qs], qkv[:, qs:qs + ks], qkv[:, qs + ks:]
    elif q is None or k is None:
        raise ValueError("give qkv (the packed projection output) or both q and k.")
    q = _as_heads(q, "q", num_heads, head_dim, None)
    k = _as_heads(k, "k", num_kv_heads, head_dim, q.shape[0])
    v = _as_heads(v, "v", num_kv_heads, head_dim, q.shape[0]) if v is not None else None
    if q.dtype not in _DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; the op takes float32, float16, bfloat16 or float64.")
    for name, t in (("k", k), ("v", v)):
        if t is not None and (t.dtype != q.dtype or t.device != q.device):
            raise ValueError(f"{name} must share q's dtype and device ({q.dtype}, {q.device}), got {t.dtype}, "
                             f"{t.device}.")
    return q, k, v


def _check_weight(w: Any, name: str, head_dim: int, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point torch.Tensor [head_dim], got "
                         f"{getattr(w, 'dtype', type(w).__name__)}.")
    if tuple(w.shape) != (head_dim,):
        raise ValueError(
            f"{name} has shape {tuple(w.shape)}; the qk-norm weight is one vector [head_dim] = [{head_dim}] "
            "shared by every head (Qwen3's q_norm/k_norm)."
        )
    if w.device != x.device:
        raise ValueError(f"{name} is on {w.device} but q is on {x.device}.")
    return w


def _check_eps(eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0 or eps != eps or eps == float("inf"):
        raise ValueError(f"eps must be a positive finite number (e.g. the config's rms_norm_eps, 1e-6), got {eps!r}.")
    return float(eps)


def _positions(T: int, device, positions, cu_seqlens, offset) -> tuple[torch.Tensor, torch.Tensor]:
    """(p [T], seq [T]): each token's position and sequence index (positions: explicit [T]; or 0, 1, ...
    restarting at each cu_seqlens boundary, plus ``offset``, an int or one per sequence)."""
    if positions is not None and cu_seqlens is not None:
        raise ValueError("give either positions or cu_seqlens, not both: cu_seqlens makes positions restart at 0 "
                         "at each sequence start, explicit positions would silently override that.")
    cu = None
    if cu_seqlens is not None:
        cu = check_cu_seqlens(cu_seqlens, T).to(device)
        p = varlen_positions(cu)
        seq = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=device), cu[1:] - cu[:-1])
    elif positions is not None:
        p = check_positions(positions, "positions").to(device)
        if p.ndim != 1 or p.shape[0] != T:
            raise ValueError(f"positions must be 1-D with one entry per token ({T}), got shape {tuple(p.shape)}.")
        seq = torch.zeros(T, dtype=torch.long, device=device)
    else:
        p = torch.arange(T, device=device)
        seq = torch.zeros(T, dtype=torch.long, device=device)
    off = check_positions(offset, "offset").to(device)
    if off.ndim == 0:
        p = p + off
    elif off.ndim == 1 and cu is not None and off.shape[0] == cu.numel() - 1:
        p = p + off[seq]
    else:
        n = "one per sequence of cu_seqlens" if cu is not None else "an int (no cu_seqlens given)"
        raise ValueError(f"offset of shape {tuple(off.shape)} does not fit: give an int, or {n}.")
    return p, seq


def _tables(spec, cos_sin_cache, style, p: torch.Tensor, head_dim: int, angle_dtype, seq_len, cdt):
    """(style, cos [T, r/2], sin [T, r/2]) in ``cdt`` for each token's position, from spec or cos_sin_cache."""
    if (spec is None) == (cos_sin_cache is None):
        raise ValueError("give the RoPE as spec= (a ropelab.RopeSpec) or cos_sin_cache= ([max_position, r], cos||sin "
                         "as vLLM's RotaryEmbedding.cos_sin_cache), exactly one of the two.")
    if spec is not None:
        if not isinstance(spec, RopeSpec):
            raise ValueError(f"spec must be a ropelab.RopeSpec, got {type(spec).__name__}.")
        if style is not None:
            raise ValueError("spec= carries the style; leave style= unset (it is for cos_sin_cache=).")
        if spec.is_nope:
            raise ValueError("spec is a layer without RoPE (rotary_dim=0); use an RMSNorm alone for it.")
        from ..scaling import LENGTH_DEPENDENT

        if seq_len is None and spec.rope_type in LENGTH_DEPENDENT and p.numel():
            seq_len = int(p.max()) + 1
        inv_freq, af = spec.frequencies(head_dim, seq_len=seq_len)
        c, s = cos_sin(p, inv_freq, af, dtype=cdt, angle_dtype=angle_dtype)
        return spec.style, c, s
    style = "half" if style is None else style
    check_style(style)
    cache = cos_sin_cache
    if not isinstance(cache, torch.Tensor) or cache.ndim != 2 or not cache.dtype.is_floating_point:
        raise ValueError(f"cos_sin_cache must be a floating-point tensor [max_position, r], got "
                         f"{tuple(getattr(cache, 'shape', ()))} {getattr(cache, 'dtype', type(cache).__name__)}.")
    r = cache.shape[1]
    if r % 2 or r == 0 or r > head_dim:
        raise ValueError(f"cos_sin_cache has {r} columns: the rotary dim r must be even, positive and at most "
                         f"head_dim {head_dim}.")
    if p.is_floating_point():
        raise ValueError(f"positions index the rows of cos_sin_cache: give integers, got {p.dtype}.")
    if p.numel() and (int(p.min()) < 0 or int(p.max()) >= cache.shape[0]):
        raise ValueError(f"positions (with offset) span [{int(p.min())}, {int(p.max())}] but cos_sin_cache has rows "
                         f"0..{cache.shape[0] - 1}; build the cache for max_position_embeddings >= {int(p.max()) + 1}.")
    rows = cache.to(p.device)[p.long()].to(cdt)
    return style, rows[:, : r // 2], rows[:, r // 2:]


def _check_cache(kv_cache, k: torch.Tensor, v: torch.Tensor | None):
    if not (isinstance(kv_cache, (tuple, list)) and len(kv_cache) == 2):
        raise ValueError("kv_cache must be a pair (k_cache, v_cache), each [n_blocks, block_size, Hkv, D].")
    if v is None:
        raise ValueError("writing the KV cache needs v (pass qkv, or v=).")
    kc, vc = kv_cache
    for name, c in (("k_cache", kc), ("v_cache", vc)):
        if not isinstance(c, torch.Tensor) or c.ndim != 4 or tuple(c.shape[2:]) != tuple(k.shape[1:]):
            raise ValueError(f"{name} must be [n_blocks, block_size, {k.shape[1]}, {k.shape[2]}] (Hkv, head_dim of "
                             f"k), got {tuple(getattr(c, 'shape', ()))}.")
        if c.dtype != k.dtype or c.device != k.device:
            raise ValueError(f"{name} must have k's dtype and device ({k.dtype}, {k.device}); got {c.dtype}, "
                             f"{c.device} (a quantised cache is not supported).")
        if c.stride(3) != 1 or c.stride(0) != c.shape[1] * c.stride(1):
            raise ValueError(f"{name} must be addressable as [n_slots, Hkv, D] rows (contiguous last dim, blocks "
                             f"back to back), got strides {c.stride()}; pass a .contiguous() cache.")
    if kc.shape != vc.shape:
        raise ValueError(f"k_cache {tuple(kc.shape)} and v_cache {tuple(vc.shape)} must have the same shape.")
    return kc, vc


def resolve_slots(n_slots_shape: tuple[int, int], p: torch.Tensor, seq: torch.Tensor, slot_mapping: Any = None,
                  block_table: Any = None) -> torch.Tensor:
    """The cache slot of every token (int64 [T], ``-1`` = skip), checked: in range, no slot written twice.

    ``n_slots_shape = (n_blocks, block_size)``. From ``slot_mapping``, or ``block_table`` and the positions,
    or (neither) ``seq * block_size + p`` (a contiguous [n_seq, max_len] cache)."""
    n_blocks, bs = n_slots_shape
    T = p.shape[0]
    if slot_mapping is not None and block_table is not None:
        raise ValueError("give slot_mapping or block_table, not both (slot_mapping already names every slot).")
    if slot_mapping is not None:
        sm = torch.as_tensor(slot_mapping)
        if sm.dtype.is_floating_point or sm.dtype == torch.bool or sm.ndim != 1 or sm.shape[0] != T:
            raise ValueError(f"slot_mapping must be an integer tensor [tokens] = [{T}], got {tuple(sm.shape)} "
                             f"{sm.dtype}.")
        slots = sm.to(device=p.device, dtype=torch.long)
    else:
        if p.is_floating_point():
            raise ValueError(f"a cache slot needs an integer position; positions are {p.dtype}: pass slot_mapping.")
        if T and int(p.min()) < 0:
            raise ValueError(f"positions (with offset) reach {int(p.min())}: a cache slot needs positions >= 0.")
        if block_table is not None:
            bt = torch.as_tensor(block_table)
            if bt.dtype.is_floating_point or bt.dtype == torch.bool or bt.ndim != 2:
                raise ValueError(f"block_table must be an integer tensor [n_seq, max_blocks], got {tuple(bt.shape)} "
                                 f"{bt.dtype}.")
            bt = bt.to(device=p.device, dtype=torch.long)
            page = p.long() // bs
            if T and (int(seq.max()) >= bt.shape[0] or int(page.max()) >= bt.shape[1]):
                raise ValueError(f"block_table {tuple(bt.shape)} has no entry for sequence {int(seq.max())} at page "
                                 f"{int(page.max())} (position // block_size {bs}); extend it.")
            slots = bt[seq, page] * bs + p.long() % bs
        else:
            if T and int(p.max()) >= bs:
                raise ValueError(f"position {int(p.max())} does not fit a contiguous cache of max_len {bs} "
                                 "(cache dim 1); allocate a longer cache or pass slot_mapping/block_table.")
            slots = seq * bs + p.long()
    if T and (int(slots.min()) < -1 or int(slots.max()) >= n_blocks * bs):
        raise ValueError(f"cache slots span [{int(slots.min())}, {int(slots.max())}] but the cache has slots "
                         f"0..{n_blocks * bs - 1} ({n_blocks} blocks of {bs}); -1 alone means skip the token.")
    used = slots[slots >= 0]
    if used.numel() != used.unique().numel():
        raise ValueError("two tokens write the same cache slot; every token needs its own slot (or -1 to skip).")
    return slots


# --------------------------------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------------------------------


def _norm_rope_formula(x, w, cos, sin, eps: float, w_offset: float, style: str, out_dtype):
    """One head row: norm, weight, rotate in ``cos``'s dtype (float32/float64), one rounding at the end."""
    cdt = cos.dtype
    xf = x.to(cdt)
    xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (w.to(cdt) + w_offset)
    return rotate(xn, cos[:, None, :], sin[:, None, :], style=style).to(out_dtype)


_COMPILED: dict[str, Any] = {}


def _compiled_path(x, w, cos, sin, eps, w_offset, style, out_dtype):
    """``torch.compile`` (Inductor) of :func:`_norm_rope_formula`: one fused loop per row."""
    fn = _COMPILED.get("fn")
    if fn is None:
        fn = _COMPILED["fn"] = torch.compile(_norm_rope_formula, dynamic=False)
    return fn(x, w, cos, sin, eps, w_offset, style, out_dtype)


_C_SOURCE = Path(__file__).with_name("cpu_qk_norm_rope.c")
_C_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _c_library():
    """The C kernel, built once by :mod:`ropelab.kernels.cpu_build` (ValueError saying why when it cannot be)."""
    import ctypes

    from .cpu_build import BuildError, load_library

    try:
        lib = load_library("cpu_qk_norm_rope", _C_SOURCE)
    except BuildError as e:
        raise ValueError(f"backend='cpu' cannot run: {e} Use backend='torch' or 'compile' instead.") from e
    fn = lib.ropelab_qk_norm_rope
    if fn.argtypes is None:
        P, I64, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        fn.argtypes = [P] * 12 + [I64] * 13 + [F, F] + [ctypes.c_int] * 4
        fn.restype = ctypes.c_int
        lib.ropelab_qkn_has_f16.restype = ctypes.c_int
    return lib


def _cpu_path(q, k, v, wq, wk, cos, sin, eps, w_offset, style, slots, kc, vc):
    """The C kernel (:file:`cpu_qk_norm_rope.c`): one OpenMP pass over the token-head rows."""
    if q.device.type != "cpu":
        raise ValueError(f"backend='cpu' runs on CPU tensors, got {q.device}; use backend='triton' on a GPU.")
    if q.dtype not in _C_DTYPES:
        raise ValueError(f"backend='cpu' takes float32, bfloat16 or float16, got {q.dtype}; use backend='torch'.")
    lib = _c_library()
    if q.dtype == torch.float16 and not lib.ropelab_qkn_has_f16():
        raise ValueError("backend='cpu': this C compiler has no _Float16, so float16 is not built; use "
                         "backend='torch' or 'compile' for float16.")
    # the kernel reads rows with a contiguous last dim; another layout is copied once here (never silently
    # computed differently)
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    v = v if v is None or v.stride(-1) == 1 else v.contiguous()
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    oq = torch.empty(T, Hq, D, dtype=q.dtype)
    ok = torch.empty(T, Hkv, D, dtype=q.dtype)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    wq32, wk32 = wq.float().contiguous(), wk.float().contiguous()
    has_cache = kc is not None
    vv = v if v is not None else k
    sl = slots.contiguous() if has_cache else torch.zeros(1, dtype=torch.long)
    kcf = kc.view(-1, Hkv, D) if has_cache else ok
    vcf = vc.view(-1, Hkv, D) if has_cache else ok
    rc = lib.ropelab_qk_norm_rope(
        q.data_ptr(), k.data_ptr(), vv.data_ptr(), wq32.data_ptr(), wk32.data_ptr(), cos.data_ptr(), sin.data_ptr(),
        sl.data_ptr(), oq.data_ptr(), ok.data_ptr(), kcf.data_ptr(), vcf.data_ptr(),
        T, Hq, Hkv, D, cos.shape[1], q.stride(0), q.stride(1), k.stride(0), k.stride(1), vv.stride(0), vv.stride(1),
        kcf.stride(0), kcf.stride(1), eps, w_offset, int(style == "interleaved"), _C_DTYPES[q.dtype],
        int(has_cache), torch.get_num_threads(),
    )
    if rc != 0:
        raise ValueError(f"the C kernel refused its arguments (head_dim {D} at most 512, r/2 {cos.shape[1]}).")
    return oq, ok


def _triton_path(q, k, v, wq, wk, cos, sin, eps, w_offset, style, slots, kc, vc):
    from . import qk_norm_rope_triton as kt
    from .fused_rope import why_unavailable

    why = why_unavailable(q.device)
    if why is not None:
        raise ValueError(f"backend='triton' cannot run: {why}")
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    oq = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    ok = torch.empty(T, Hkv, D, dtype=q.dtype, device=q.device)
    if T == 0:
        return oq, ok
    cos, sin = cos.contiguous(), sin.contiguous()
    pos_idx = torch.arange(T, device=q.device)
    has_cache = kc is not None
    kcf = kc.view(-1, Hkv, D) if has_cache else ok
    vcf = vc.view(-1, Hkv, D) if has_cache else ok
    vv = v if v is not None else k
    grid = (T, Hq + Hkv + (Hkv if has_cache else 0))
    if grid[1] > 65535:
        raise ValueError(f"too many heads for one launch ({grid[1]} rows per token).")
    cdt = kt.tl.float64 if q.dtype == torch.float64 else kt.tl.float32
    kt.qk_norm_rope_kernel[grid](
        q, k, vv, wq, wk, cos, sin, pos_idx, slots if has_cache else pos_idx, oq, ok, kcf, vcf,
        Hq, Hkv, D, cos.shape[1], eps, w_offset,
        *q.stride(), *k.stride(), *vv.stride(),
        oq.stride(0), oq.stride(1), ok.stride(0), ok.stride(1),
        kcf.stride(0), kcf.stride(1), vcf.stride(0), vcf.stride(1), cos.stride(0),
        BLOCK_D=1 << (D - 1).bit_length(), INTERLEAVED=style == "interleaved", HAS_CACHE=has_cache, CDT=cdt,
        num_warps=4,
    )
    return oq, ok


def _norm_args(q: torch.Tensor, q_weight: Any, k_weight: Any, head_dim: int, eps: Any,
               unit_offset: bool) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """The norm's checked weights, epsilon and weight offset (1 for Gemma's ``1 + weight``), for both ops."""
    return (_check_weight(q_weight, "q_weight", head_dim, q), _check_weight(k_weight, "k_weight", head_dim, q),
            _check_eps(eps), 1.0 if unit_offset else 0.0)


def qk_norm_rope(
    qkv: torch.Tensor | None = None,
    *,
    q: torch.Tensor | None = None,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    spec: RopeSpec | None = None,
    cos_sin_cache: torch.Tensor | None = None,
    style: str | None = None,
    positions: Any = None,
    cu_seqlens: Any = None,
    offset: int | torch.Tensor = 0,
    seq_len: int | None = None,
    angle_dtype: torch.dtype = torch.float64,
    unit_offset: bool = False,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    slot_mapping: Any = None,
    block_table: Any = None,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-head RMSNorm of q and k, then RoPE, in one pass; optionally writes rotated k and v into a cache.

    Args:
        qkv: the packed projection output ``[tokens, (Hq + 2 Hkv) * D]`` (q, k, v side by side, as vLLM's
            ``qkv_proj``), or None and ``q``, ``k`` (and ``v``) as ``[tokens, H * D]`` or ``[tokens, H, D]``
            (any strides).
        num_heads, num_kv_heads, head_dim: Hq, Hkv (any counts: the op is per head, GQA's grouping is
            attention's), D (even, at most 512).
        q_weight, k_weight: the norm weights ``[D]`` (Qwen3's ``q_norm.weight``/``k_norm.weight``), shared by
            every head. ``unit_offset=True`` multiplies by ``1 + weight`` (Gemma 3's ``q_norm``).
        eps: the RMSNorm epsilon (``rms_norm_eps``), > 0.
        spec: a :class:`ropelab.RopeSpec` (style, base, rotary_dim, scaling); or ``cos_sin_cache``
            ``[max_position, r]`` (cos || sin, vLLM's ``RotaryEmbedding.cos_sin_cache``) with ``style``
            (``"half"`` = vLLM's ``is_neox=True``, default; ``"interleaved"`` = GPT-J).
        positions: ``[tokens]`` position ids; or None: 0, 1, ... (restarting at each ``cu_seqlens``
            boundary); plus ``offset`` (an int, or one per sequence with ``cu_seqlens``).
        seq_len, angle_dtype: for ``spec``: the current length of length-dependent scalings (default
            max(position) + 1) and the angle precision (float64 default, or float32).
        kv_cache, slot_mapping, block_table: see the module docstring ("Cache").
        backend: ``"torch"``, ``"compile"``, ``"triton"`` or ``"cpu"`` (the C kernel; fp32/bf16/fp16).

    Returns ``(q', k')`` as ``[tokens, Hq, D]`` and ``[tokens, Hkv, D]`` new tensors in q's dtype (inputs
    are not modified); the cache, when given, is written in place.
    """
    if backend not in QK_NORM_ROPE_BACKENDS:
        raise ValueError(f"backend must be one of {QK_NORM_ROPE_BACKENDS}, got {backend!r}.")
    q, k, v = _split(qkv, q, k, v, num_heads, num_kv_heads, head_dim)
    wq, wk, eps, w_offset = _norm_args(q, q_weight, k_weight, head_dim, eps, unit_offset)
    if angle_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"angle_dtype must be torch.float32 or torch.float64, got {angle_dtype}.")
    T = q.shape[0]
    p, seq = _positions(T, q.device, positions, cu_seqlens, offset)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    style, cos, sin = _tables(spec, cos_sin_cache, style, p, head_dim, angle_dtype, seq_len, cdt)
    kc = vc = slots = None
    if kv_cache is not None:
        kc, vc = _check_cache(kv_cache, k, v)
        slots = resolve_slots((kc.shape[0], kc.shape[1]), p, seq, slot_mapping, block_table)
    elif slot_mapping is not None or block_table is not None:
        raise ValueError("slot_mapping/block_table place tokens in a cache: pass kv_cache=(k_cache, v_cache) too.")
    if backend == "triton":
        return _triton_path(q, k, v, wq, wk, cos, sin, eps, w_offset, style, slots, kc, vc)
    if backend == "cpu":
        return _cpu_path(q, k, v, wq, wk, cos, sin, eps, w_offset, style, slots, kc, vc)
    run = _compiled_path if backend == "compile" else _norm_rope_formula
    oq = run(q, wq, cos, sin, eps, w_offset, style, q.dtype)
    ok = run(k, wk, cos, sin, eps, w_offset, style, q.dtype)
    if kc is not None:
        keep = slots >= 0
        kc.view(-1, *kc.shape[2:])[slots[keep]] = ok[keep]
        vc.view(-1, *vc.shape[2:])[slots[keep]] = v[keep]
    return oq, ok


def qk_rms_norm(q: torch.Tensor, k: torch.Tensor, *, num_heads: int, num_kv_heads: int, head_dim: int,
                q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, unit_offset: bool = False,
                backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """The per-head RMSNorm of q and k alone (no RoPE, no cache), by the same kernels as :func:`qk_norm_rope`
    (rotary dim 0): the reference a fused op's overhead is measured against (``python -m ropelab.bench fused``).
    Same numerics (float32, one rounding) and checks; backends ``"torch"``, ``"triton"``, ``"cpu"``."""
    if backend not in ("torch", "triton", "cpu"):
        raise ValueError(f"backend must be 'torch', 'triton' or 'cpu', got {backend!r}.")
    q, k, _ = _split(None, q, k, None, num_heads, num_kv_heads, head_dim)
    wq, wk, eps, w_offset = _norm_args(q, q_weight, k_weight, head_dim, eps, unit_offset)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    none = torch.empty(q.shape[0], 0, dtype=cdt, device=q.device)
    if backend == "triton":
        return _triton_path(q, k, None, wq, wk, none, none, eps, w_offset, "half", None, None, None)
    if backend == "cpu":
        return _cpu_path(q, k, None, wq, wk, none, none, eps, w_offset, "half", None, None, None)

    def norm(x, w):
        xf = x.to(cdt)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (w.to(cdt) + w_offset)).to(q.dtype)

    return norm(q, wq), norm(k, wk)


def qk_norm_rope_oracle(x: torch.Tensor, w: torch.Tensor, eps: float, cos64: torch.Tensor, sin64: torch.Tensor,
                        style: str, unit_offset: bool = False) -> torch.Tensor:
    """float64 reference for one of q or k ``[T, H, D]``: norm then rope, every step in float64 (cos64/sin64
    ``[T, r/2]`` float64, e.g. :func:`ropelab.cos_sin` with ``dtype=torch.float64``)."""
    x = x.double()
    xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w.double() + (1.0 if unit_offset else 0.0))
    return rotate(xn, cos64[:, None, :].double(), sin64[:, None, :].double(), style=style)
