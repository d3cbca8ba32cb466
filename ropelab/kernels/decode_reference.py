r"""The reference half of :mod:`ropelab.kernels.decode_attention`: the checks of a decode step's arguments, its
PyTorch path (the same computation as the kernel: float64 tables, float32 or float64 math, runs anywhere),
the float64 oracle the tests compare against and the elementwise error bound derived from the dtypes. The
kernel file keeps only the Triton programs and their launcher, as flash-attn's ``ops/triton/rotary.py`` does."""

from __future__ import annotations

import math

import torch

from ..core import check_style, cos_sin, rotate
from ..scaling import check_rotary_dim

__all__ = ["MODES", "KERNEL_DTYPES", "ANGLE_ERROR", "check_decode_args", "torch_path", "decode_attention_oracle",
           "error_bound"]

MODES = ("post_rope", "rope_on_load")
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Bound on |cos error| and |sin error| of the in-kernel table entry (before the attention factor):
#: 2^-25 turn of rounding (1.9e-7), the float32 remainder and its polynomials (a few u32 = 2^-24 each),
#: the float64 frequency (< 1e-11 at 2^17 positions); 2^-20 = 9.5e-7 covers their sum.
ANGLE_ERROR = 2.0**-20
_U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
_MAX_HEAD_DIM = 256


def check_decode_args(q, k_cache, v_cache, lengths, rows, mode, inv_freq, style, backend) -> None:
    """Every check of a decode step's arguments, shared by the launcher, its PyTorch path and the oracle: a
    ValueError naming the argument and the fix."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    check_style(style)
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}.")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t))}.")
    if q.ndim != 3:
        raise ValueError(
            f"q must be [queries, q_heads, head_dim] (one token per sequence), got shape {tuple(q.shape)}; "
            "for q of shape [batch, heads, 1, d] pass q[:, :, 0]."
        )
    if k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [batch, kv_heads, capacity, head_dim] of one shape, got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}."
        )
    nq, hq, d = q.shape
    b, hkv, cap, dk = k_cache.shape
    if d != dk:
        raise ValueError(f"q has head_dim {d} but the cache has {dk}; they must match.")
    if hq % hkv:
        raise ValueError(
            f"query heads {hq} must be a multiple of key/value heads {hkv} (grouped-query attention shares each "
            f"kv head among H_q / H_kv query heads); check the head counts of q and the cache."
        )
    if d % 2 or d > _MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be even and at most {_MAX_HEAD_DIM}, got {d}.")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must have one dtype, got {k_cache.dtype} and {v_cache.dtype}.")
    if q.device != k_cache.device or v_cache.device != k_cache.device:
        raise ValueError(
            f"q, k_cache, v_cache must be on one device, got {q.device}, {k_cache.device}, {v_cache.device}."
        )
    if not isinstance(lengths, torch.Tensor) or lengths.dtype.is_floating_point or lengths.ndim != 1:
        raise ValueError(f"lengths must be a 1-D integer tensor (keys cached per query row), got {lengths!r}.")
    if lengths.numel() != nq:
        raise ValueError(f"lengths has {lengths.numel()} entries but q has {nq} query rows; give one per row.")
    if rows is not None:
        if not isinstance(rows, torch.Tensor) or rows.dtype.is_floating_point or rows.shape != lengths.shape:
            raise ValueError(f"rows must be an integer tensor of shape [{nq}] (the cache row of each query).")
        if nq and (int(rows.min()) < 0 or int(rows.max()) >= b):
            raise ValueError(f"rows must lie in 0..{b - 1} (the cache's batch), got {rows.tolist()}.")
    elif nq != b:
        raise ValueError(f"q has {nq} query rows but the cache {b} sequences; pass rows= to map queries to sequences.")
    if nq and int(lengths.min()) < 1:
        raise ValueError(f"every length must be >= 1 (the current token's key is cached), got {lengths.tolist()}.")
    if nq and int(lengths.max()) > cap:
        raise ValueError(
            f"lengths past the cache: the longest is {int(lengths.max())} but the cache holds {cap} positions; "
            "append the keys first, or pass lengths no larger than k_cache.shape[2]."
        )
    if mode == "rope_on_load":
        if inv_freq is None:
            raise ValueError(
                "mode 'rope_on_load' needs inv_freq, the current step's frequencies (rotary_dim/2 of them)."
            )
        if inv_freq.ndim != 1 or not inv_freq.dtype.is_floating_point:
            raise ValueError(f"inv_freq must be a 1-D float tensor, got {inv_freq.dtype} {tuple(inv_freq.shape)}.")
        check_rotary_dim(2 * inv_freq.numel(), d)
    elif inv_freq is not None:
        raise ValueError("mode 'post_rope' reads keys already rotated: drop inv_freq, or use mode='rope_on_load'.")


def _current_keys(k, length, mode, inv_freq, attention_factor, style, compute):
    """Keys 0 .. length-1 of one cache row [H_kv, n, d] in the current frame, in ``compute`` dtype."""
    keys = k[:, :length].to(compute)
    if mode == "rope_on_load":
        c, s = cos_sin(torch.arange(length, device=k.device), inv_freq.to(k.device), attention_factor,
                       dtype=compute, angle_dtype=torch.float64)
        keys = rotate(keys, c[None], s[None], style=style)
    return keys


def _attend_rows(q, k_cache, v_cache, lengths, rows, mode, inv_freq, attention_factor, style, scale, compute):
    nq, hq, d = q.shape
    hkv = k_cache.shape[1]
    out = torch.empty(nq, hq, d, dtype=compute, device=q.device)
    for i, (length, row) in enumerate(zip(lengths.tolist(), rows.tolist())):
        keys = _current_keys(k_cache[row], length, mode, inv_freq, attention_factor, style, compute)
        values = v_cache[row, :, :length].to(compute)
        qg = q[i].to(compute).reshape(hkv, hq // hkv, d)
        probs = (torch.einsum("hgd,hnd->hgn", qg, keys) * scale).softmax(dim=-1)
        out[i] = torch.einsum("hgn,hnd->hgd", probs, values).reshape(hq, d)
    return out


def torch_path(q, k_cache, v_cache, lengths, rows, mode, inv_freq, attention_factor, style, scale):
    """The same attention in PyTorch: float64 tables rounded once, float32 math (float64 for float64)."""
    compute = torch.promote_types(k_cache.dtype, torch.float32)
    out = _attend_rows(q, k_cache, v_cache, lengths, rows, mode, inv_freq, attention_factor, style, scale, compute)
    return out.to(v_cache.dtype)


def decode_attention_oracle(q, k_cache, v_cache, lengths, *, mode="rope_on_load", inv_freq=None,
                            attention_factor=1.0, style="half", rows=None, scale=None) -> torch.Tensor:
    r"""The float64 oracle: the inputs' values as stored, every step in float64. Returns float64.

    The arguments are :func:`ropelab.kernels.decode_attention`'s, checked the same way.

    Args:
        q: [queries, H_q, d], already rotated (query i at position ``lengths[i] - 1``).
        k_cache: [batch, H_kv, capacity, d]; rotated keys (``post_rope``) or keys before RoPE (``rope_on_load``).
        v_cache: the values, k_cache's shape.
        lengths: int [queries]: query i attends keys 0 .. lengths[i] - 1 of its row.
        mode: ``"post_rope"`` or ``"rope_on_load"``.
        inv_freq: ``rope_on_load`` only: the r/2 frequencies the keys are rotated with as they are read.
        attention_factor: a, multiplying cos and sin.
        style: ``"half"`` or ``"interleaved"``.
        rows: int [queries], the cache row of each query; None: query i reads row i.
        scale: the softmax scale; None: :math:`1/\sqrt{d}`.

    Returns [queries, H_q, d] in float64.
    """
    check_decode_args(q, k_cache, v_cache, lengths, rows, mode, inv_freq, style, "torch")
    rows = torch.arange(q.shape[0]) if rows is None else rows
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _attend_rows(q, k_cache, v_cache, lengths, rows, mode, inv_freq, attention_factor, style, scale,
                        torch.float64)


def error_bound(q, k_cache, v_cache, lengths, *, mode="rope_on_load", inv_freq=None, attention_factor=1.0,
                style="half", rows=None, scale=None, out_dtype=None) -> torch.Tensor:
    r"""Elementwise bound [queries, H_q, d] on |kernel - oracle|, derived from the dtypes.

    Per key n of query head g: with :math:`P_{nj} = a(|k_{a}| + |k_{b}|)` on the pair containing dim j
    (:math:`|k_j|` on pass-through dims and in ``post_rope``) and :math:`M_n = \sum_j |q_j| P_{nj}`, the
    score :math:`s\,q\cdot\tilde k_n` errs by at most
    :math:`E_n = s M_n (\varepsilon_{cs} + 2u_{op} + (d + 8) u_{32})`: the table entries (``ANGLE_ERROR``),
    q and the rotated key rounded to the dot's operand dtype (:math:`u_{op}`: the cache's dtype for 16-bit
    caches, float32 otherwise), the rotation and the d-term float32 dot. A perturbation of at most E of
    every score moves the softmax output by at most :math:`(e^{2E} - 1)\max|v|`; the probabilities rounded
    to the operand dtype for :math:`p\cdot v`, ``exp2`` (relative 2^-21 on a GPU), the L-term float32
    accumulation and the split combine add :math:`(u_{op} + 2^{-21} + (L + 8) u_{32})\max|v|`, and the
    output's rounding :math:`u_{out}|o|`.
    """
    check_decode_args(q, k_cache, v_cache, lengths, rows, mode, inv_freq, style, "torch")
    nq, hq, d = q.shape
    hkv = k_cache.shape[1]
    rows = torch.arange(nq) if rows is None else rows
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out_dtype = out_dtype or v_cache.dtype
    u32 = _U[torch.float32]
    u_op = _U[k_cache.dtype] if k_cache.dtype in (torch.float16, torch.bfloat16) else u32
    eps = (ANGLE_ERROR if mode == "rope_on_load" else 0.0) + 2 * u_op + (d + 8) * u32
    ref = decode_attention_oracle(q, k_cache, v_cache, lengths, mode=mode, inv_freq=inv_freq,
                                  attention_factor=attention_factor, style=style, rows=rows, scale=scale)
    bound = torch.empty_like(ref)
    for i, (length, row) in enumerate(zip(lengths.tolist(), rows.tolist())):
        k = k_cache[row, :, :length].double().abs()
        if mode == "rope_on_load":
            r = 2 * inv_freq.numel()
            if style == "half":
                pair = k[..., : r // 2] + k[..., r // 2 : r]
                mag = torch.cat([pair, pair], dim=-1)
            else:
                pair = k[..., 0:r:2] + k[..., 1:r:2]
                mag = torch.stack([pair, pair], dim=-1).flatten(-2)
            mag = torch.cat([attention_factor * mag, k[..., r:]], dim=-1)
        else:
            mag = k
        qg = q[i].double().abs().reshape(hkv, hq // hkv, d)
        e = scale * torch.einsum("hgd,hnd->hgn", qg, mag).amax(dim=-1) * eps  # [hkv, g]
        vmax = v_cache[row, :, :length].double().abs().amax(dim=(-1, -2))  # [hkv]
        extra = u_op + 2.0**-21 + (length + 8) * u32
        per_head = (torch.expm1(2 * e) + extra) * vmax[:, None]
        bound[i] = per_head.reshape(hq, 1).expand(hq, d)
    u_out = _U[out_dtype] if out_dtype != torch.float64 else 0.0
    return bound + u_out * ref.abs()
