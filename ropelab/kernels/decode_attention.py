r"""Flash-decoding attention for one query token per sequence, with RoPE applied to the keys as they load.

One decoding step attends a query :math:`q` (already rotated to its position) over the :math:`L` cached
keys and values of its sequence,

.. math::  o = \sum_{n<L} p_n v_n,\qquad p_n = \operatorname{softmax}_n\big(s\, q\cdot \tilde k_n\big),
           \qquad s = 1/\sqrt{d},

where :math:`\tilde k_n` is the key at position n in the *current* frame. Two modes, one kernel source:

- ``post_rope``: the cache holds keys rotated when they were written, :math:`\tilde k_n = k_n`
  (Hugging Face's cache; the baseline, and inconsistent under a length-dependent scaling).
- ``rope_on_load``: the cache holds keys *before* RoPE; the kernel rotates each one in registers with the
  current step's frequencies, :math:`\tilde k_n = a\,R(n\,\omega(L))\,k_n` (consistent at every step, and
  the cached bytes are read once, as in ``post_rope``). Values are never rotated.

**Split-K (flash-decoding).** A decode step has one query row per sequence, too little work to fill a GPU
if one program walked all L keys. Stage 1 splits the cached length into chunks of ``split_len`` keys; the
program (query row i, kv head h, split j) computes, for the ``G = H_q / H_kv`` query heads that share kv
head h (grouped-query attention), the partial softmax of its chunk with an online max (Milakov & Gimelshein
2018, arXiv 1805.02867): the normalised partial output :math:`o_j` and its log-sum-exp :math:`\ell_j`
(base 2). Stage 2 combines the splits, :math:`o = \sum_j 2^{\ell_j - \ell^*} o_j / \sum_j 2^{\ell_j-\ell^*}`,
:math:`\ell^* = \max_j \ell_j`. This is the flash-decoding scheme (Dao, Haziza, Massa, Sizov 2023, "Flash-
Decoding for long-context inference", PyTorch blog; the same two-stage structure as lightllm's and
sglang's Triton GQA decode kernels), written here from the formulas above.

**Pairs without a second load.** Each key is loaded as its pair halves :math:`k_a` and :math:`k_b` (dims
``(i, i + r/2)`` for ``style="half"``, ``(2i, 2i+1)`` for ``"interleaved"``) and the pass-through dims
past the rotary dim r, so the rotation :math:`k'_a = k_a c - k_b s`, :math:`k'_b = k_b c + k_a s` needs no
shuffle, and the score is three dot products, :math:`q_a\cdot k'_a + q_b\cdot k'_b + q_p\cdot k_p`. Both
modes load exactly these bytes; ``post_rope`` skips the arithmetic. head_dim need not be a power of two
(64, 80, 96, 128, 256): every piece is padded to a power of two and masked.

**Angles at 128k positions.** The angle :math:`n\,\omega_i` formed in float32 from a float32
:math:`\omega_i` errs by up to about :math:`2 u_{32} n\,\omega_i` (:math:`u_{32}=2^{-24}`): 0.016 rad at
n = 131072 for :math:`\omega_0 = 1` (:func:`fp32_angle_error` measures it), four orders above the
float32 rounding of cos/sin themselves. The kernel instead reduces the angle modulo a turn *exactly* in
integer arithmetic: the launcher writes :math:`f_i = \operatorname{frac}(\omega_i / 2\pi)` as a 64-bit
fixed-point fraction :math:`F_i = \operatorname{round}(f_i 2^{64})` (from the float64 :math:`\omega_i`);
the kernel forms :math:`n F_i \bmod 2^{64}` with a wrapping int64 multiply, whose top bits are the
fraction of a turn, and rounds them to 24 bits. The nearest quarter turn is split off in integers too, so
only the remainder :math:`x \in [-\pi/4, \pi/4)` becomes a float32, and cos and sin are Taylor polynomials
in x (to :math:`x^{10}`, truncation below 3e-9) swapped and signed by the quarter: plain multiply-adds, the
same arithmetic in Triton's interpreter and on a GPU. The table entries then err by at most
:math:`2^{-25}\cdot 2\pi` (1.9e-7, the rounding to 24 bits) plus :math:`2\pi\, n\, 2^{-53} f_i` (the
float64 :math:`\omega`; 1e-11 at n = 2^17) plus a few :math:`u_{32}` from the float32 polynomial, below
5e-7 for any position below 2^31. :data:`ANGLE_ERROR` = 2^-20 (9.5e-7) is the bound the tests use.

:func:`decode_attention` is the launcher (validation, split choice, fixed-point frequencies); its
``backend="torch"`` path is the same computation in PyTorch (float64 tables, float32 or float64 math), which
runs anywhere without triton. :func:`decode_attention_oracle` is the float64 oracle the tests compare to,
and :func:`error_bound` the elementwise bound derived from the dtypes.
"""

from __future__ import annotations

import math
import os

import torch

from .decode_reference import (
    ANGLE_ERROR,
    KERNEL_DTYPES,
    MODES,
    check_decode_args,
    decode_attention_oracle,
    error_bound,
    torch_path,
)

try:  # triton is optional: without it the PyTorch path runs (backend="torch", or "auto").
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = tl = None

__all__ = [
    "MODES",
    "KERNEL_DTYPES",
    "ANGLE_ERROR",
    "decode_attention",
    "decode_attention_oracle",
    "error_bound",
    "fixed_point_turns",
    "fp32_angle_error",
    "kernel_available",
    "kernel_table_error",
]



def kernel_available() -> str | None:
    """None when the Triton kernel can run here, else the reason it cannot (and what to do)."""
    if triton is None:
        return "triton is not installed (pip install triton; the PyTorch path backend='torch' runs without it)"
    if not (torch.cuda.is_available() or _interpreting()):
        return "no CUDA device and TRITON_INTERPRET is not set (set TRITON_INTERPRET=1 to run the kernel on CPU)"
    if _interpreting() and isinstance(tl.max, triton.JITFunction):
        return ("TRITON_INTERPRET=1 was set after triton was imported, so triton's own functions are compiled, "
                "not interpreted; set it before the first import of triton (or of ropelab.kernels)")
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# --------------------------------------------------------------------------------------------------
# Frequencies as fixed-point turns, and what float32 angles would cost
# --------------------------------------------------------------------------------------------------


def fixed_point_turns(inv_freq: torch.Tensor) -> torch.Tensor:
    r""":math:`F_i = \operatorname{round}(\operatorname{frac}(\omega_i/2\pi)\,2^{64})` as int64 (two's
    complement), from a float64 ``inv_freq``: n * F_i mod 2^64 is the angle of position n in units of
    2^-64 turn, exact up to the float64 rounding of :math:`\omega_i / 2\pi`."""
    f = inv_freq.detach().to(torch.float64) / (2 * math.pi)
    frac = f - torch.floor(f)
    v = torch.round(frac * 2.0**64)  # a multiple of 2^11 when >= 2^63: exact in float64
    v = torch.where(v >= 2.0**63, v - 2.0**64, v)
    return v.to(torch.int64)


def fp32_angle_error(inv_freq: torch.Tensor, max_position: int) -> float:
    r"""Largest error in radians of float32 angles :math:`\mathrm{fl}(\mathrm{fl}(n)\,\mathrm{fl}(\omega_i))`
    against :math:`n\,\omega_i` in float64, over n < ``max_position``: what an in-kernel float32 angle
    (the usual ``positions.float() * inv_freq.float()``) would err by before any cos/sin."""
    n = torch.arange(max_position, dtype=torch.float64)
    inv64 = inv_freq.to(torch.float64)
    exact = n[:, None] * inv64[None, :]
    fp32 = (n.float()[:, None] * inv64.float()[None, :]).double()
    return float((fp32 - exact).abs().max())


def kernel_table_error(inv_freq: torch.Tensor, positions) -> float:
    r"""Largest |cos| or |sin| error of the kernel's table entries against float64 :math:`\cos(n\omega_i)`,
    over the given positions: the kernel's integer steps done exactly (Python integers), its float32 steps in
    float32 (a GPU may fuse some multiply-adds, which moves results by a float32 rounding, not more)."""
    freq = fixed_point_turns(inv_freq).tolist()
    ns = [int(n) for n in positions]
    w = torch.tensor([[((n * f + (1 << 39)) % 2**64) >> 40 for f in freq] for n in ns], dtype=torch.int64)
    shifted = w + (1 << 21)
    quadrant = (shifted >> 22) & 3
    x = ((shifted & 0x3FFFFF) - (1 << 21)).to(torch.float32) * torch.tensor(3.745070282923929e-07, dtype=torch.float32)
    x2 = x * x
    sin_x = x * (1.0 + x2 * (-1.0 / 6 + x2 * (1.0 / 120 + x2 * (-1.0 / 5040 + x2 * (1.0 / 362880)))))
    cos_x = 1.0 + x2 * (-0.5 + x2 * (1.0 / 24 + x2 * (-1.0 / 720 + x2 * (1.0 / 40320 - x2 / 3628800))))
    s = torch.stack([sin_x, cos_x, -sin_x, -cos_x]).gather(0, quadrant[None]).squeeze(0)
    c = torch.stack([cos_x, -sin_x, -cos_x, sin_x]).gather(0, quadrant[None]).squeeze(0)
    angle = torch.tensor(ns, dtype=torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    return float(torch.maximum((c.double() - angle.cos()).abs(), (s.double() - angle.sin()).abs()).max())


# --------------------------------------------------------------------------------------------------
# The Triton kernels
# --------------------------------------------------------------------------------------------------


def _split_kernel(
    Q, K, V, Lengths, Rows, Freq, OMid, LMid,
    stride_qi, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_oi, stride_oh, stride_os,
    stride_li, stride_lh,
    qk_scale, attention_factor, split_len,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HALF: tl.constexpr, BLOCK_R: tl.constexpr,
    PASS: tl.constexpr, BLOCK_P: tl.constexpr,
    INTERLEAVED: tl.constexpr, ROTATE: tl.constexpr, ROUND_OPS: tl.constexpr, TC_DOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Stage 1: program (query row i, kv head h, split j) -> normalised partial output and base-2 LSE
    of the G query heads of group h over keys [j * split_len, min((j + 1) * split_len, L_i)).

    ROUND_OPS rounds the dot operands (q, rotated keys, probabilities) to the cache's 16-bit dtype, as
    tensor-core attention does; TC_DOT then takes the native low-precision dot (fp32 accumulation), else
    the operands go back to fp32 for an IEEE dot (the interpreter, which has no bf16 arithmetic)."""
    i = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(Lengths + i)
    row = tl.load(Rows + i).to(tl.int64)
    start = split * split_len
    end = tl.minimum(start + split_len, length)

    g = tl.arange(0, BLOCK_G)
    g_mask = g < GROUP
    heads = (kvh * GROUP + g).to(tl.int64)
    j = tl.arange(0, BLOCK_R)
    j_mask = j < HALF
    if INTERLEAVED:
        dim_a = 2 * j
        dim_b = 2 * j + 1
    else:
        dim_a = j
        dim_b = j + HALF
    q_rows = Q + i.to(tl.int64) * stride_qi + heads[:, None] * stride_qh
    qj_mask = g_mask[:, None] & j_mask[None, :]
    q_a = tl.load(q_rows + dim_a[None, :] * stride_qd, mask=qj_mask, other=0.0).to(tl.float32)
    q_b = tl.load(q_rows + dim_b[None, :] * stride_qd, mask=qj_mask, other=0.0).to(tl.float32)
    p_off = tl.arange(0, BLOCK_P)
    p_mask = p_off < PASS
    dim_p = 2 * HALF + p_off
    if PASS > 0:
        q_p = tl.load(q_rows + dim_p[None, :] * stride_qd, mask=g_mask[:, None] & p_mask[None, :], other=0.0)
        q_p = q_p.to(tl.float32)
    if ROUND_OPS:  # 16-bit caches: dots on operands in the cache's dtype, fp32 accumulation
        q_a = q_a.to(K.dtype.element_ty)
        q_b = q_b.to(K.dtype.element_ty)
        if PASS > 0:
            q_p = q_p.to(K.dtype.element_ty)
        if not TC_DOT:
            q_a = q_a.to(tl.float32)
            q_b = q_b.to(tl.float32)
            if PASS > 0:
                q_p = q_p.to(tl.float32)
    if ROTATE:
        freq = tl.load(Freq + j, mask=j_mask, other=0)  # int64 fixed-point turns per position

    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    k_head = K + row * stride_kb + kvh.to(tl.int64) * stride_kh
    v_head = V + row * stride_vb + kvh.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        k_rows = k_head + n.to(tl.int64)[:, None] * stride_kn
        kj_mask = n_mask[:, None] & j_mask[None, :]
        k_a = tl.load(k_rows + dim_a[None, :] * stride_kd, mask=kj_mask, other=0.0).to(tl.float32)
        k_b = tl.load(k_rows + dim_b[None, :] * stride_kd, mask=kj_mask, other=0.0).to(tl.float32)
        if ROTATE:
            # n * F mod 2^64 (wrapping int64 multiply) is the angle in 2^-64 turns; keep 24 bits, rounded:
            # w in [0, 2^24). Split off the quarter turn nearest to it, so the rest x lies in [-pi/4, pi/4).
            w = ((n.to(tl.int64)[:, None] * freq[None, :] + (1 << 39)) >> 40) & 0xFFFFFF
            shifted = w + (1 << 21)
            quadrant = (shifted >> 22) & 3
            x = ((shifted & 0x3FFFFF) - (1 << 21)).to(tl.float32) * 3.745070282923929e-07  # 2 pi / 2^24
            x2 = x * x
            # Taylor to x^9 and x^10: truncation below 3e-9 on [-pi/4, pi/4]; plain FMAs, the same code in
            # the interpreter and on a GPU (no libdevice range reduction, no approximate instructions)
            sin_x = x * (1.0 + x2 * (-1.0 / 6 + x2 * (1.0 / 120 + x2 * (-1.0 / 5040 + x2 * (1.0 / 362880)))))
            cos_x = 1.0 + x2 * (-0.5 + x2 * (1.0 / 24 + x2 * (-1.0 / 720 + x2 * (1.0 / 40320 - x2 / 3628800))))
            s = tl.where(quadrant == 0, sin_x, tl.where(quadrant == 1, cos_x, tl.where(quadrant == 2, -sin_x, -cos_x)))
            c = tl.where(quadrant == 0, cos_x, tl.where(quadrant == 1, -sin_x, tl.where(quadrant == 2, -cos_x, sin_x)))
            c = c * attention_factor
            s = s * attention_factor
            k_a, k_b = k_a * c - k_b * s, k_b * c + k_a * s
        if ROUND_OPS:
            k_a = k_a.to(K.dtype.element_ty)
            k_b = k_b.to(K.dtype.element_ty)
        if TC_DOT:
            scores = tl.dot(q_a, tl.trans(k_a)) + tl.dot(q_b, tl.trans(k_b))
        else:
            scores = tl.dot(q_a, tl.trans(k_a.to(tl.float32)), input_precision="ieee")
            scores += tl.dot(q_b, tl.trans(k_b.to(tl.float32)), input_precision="ieee")
        if PASS > 0:
            k_p = tl.load(k_rows + dim_p[None, :] * stride_kd, mask=n_mask[:, None] & p_mask[None, :], other=0.0)
            if TC_DOT:
                scores += tl.dot(q_p, tl.trans(k_p))
            else:
                scores += tl.dot(q_p, tl.trans(k_p.to(tl.float32)), input_precision="ieee")
        scores = tl.where(n_mask[None, :], scores * qk_scale, float("-inf"))  # log2 domain
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + n.to(tl.int64)[:, None] * stride_vn + d[None, :] * stride_vd,
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        if ROUND_OPS:
            p = p.to(V.dtype.element_ty)
        if TC_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        m_i = m_new
    # An empty split (start >= L_i) is never read by stage 2; keep its numbers finite all the same.
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    o_ptr = OMid + i.to(tl.int64) * stride_oi + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(o_ptr, out, mask=g_mask[:, None] & d_mask[None, :])
    tl.store(LMid + i.to(tl.int64) * stride_li + heads * stride_lh + split, lse, mask=g_mask)


def _combine_kernel(
    OMid, LMid, Lengths, Out,
    stride_oi, stride_oh, stride_os,
    stride_li, stride_lh,
    stride_out_i, stride_out_h, stride_out_d,
    split_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Stage 2: program (query row i, query head h) combines the non-empty splits of row i."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    length = tl.load(Lengths + i)
    n_splits = tl.cdiv(length, split_len)
    sp = tl.arange(0, BLOCK_S)
    s_mask = sp < n_splits
    lse = tl.load(LMid + i.to(tl.int64) * stride_li + h * stride_lh + sp, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.where(s_mask, tl.exp2(lse - top), 0.0)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    o = tl.load(OMid + i.to(tl.int64) * stride_oi + h * stride_oh + sp[:, None] * stride_os + d[None, :],
                mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(Out + i.to(tl.int64) * stride_out_i + h * stride_out_h + d * stride_out_d,
             out.to(Out.dtype.element_ty), mask=d_mask)


_JITTED: dict[bool, tuple] = {}


def _kernels():
    """The jitted kernels, made on first use: ``triton.jit`` reads TRITON_INTERPRET when it decorates, so
    a process that sets it after importing ropelab still gets interpreted kernels."""
    key = _interpreting()
    if key not in _JITTED:
        _JITTED[key] = (triton.jit(_split_kernel), triton.jit(_combine_kernel))
    return _JITTED[key]


# --------------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------------


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, int(n) - 1).bit_length())


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    *,
    mode: str = "rope_on_load",
    inv_freq: torch.Tensor | None = None,
    attention_factor: float = 1.0,
    style: str = "half",
    rows: torch.Tensor | None = None,
    scale: float | None = None,
    split_len: int | None = None,
    block_n: int = 64,
    backend: str = "auto",
) -> torch.Tensor:
    r"""Attention of one query token per row over its cached keys and values; returns [queries, H_q, d].

    Args:
        q: [queries, H_q, d], already rotated to its position (query i sits at position ``lengths[i] - 1``).
        k_cache: [batch, H_kv, capacity, d] (any strides); the key at index n has position n.
            ``post_rope``: keys rotated; ``rope_on_load``: keys before RoPE. H_kv divides H_q.
        v_cache: the values, k_cache's shape; values are never rotated.
        lengths: int [queries], 1 <= L_i <= capacity: query i attends keys 0 .. L_i - 1 of its row.
        mode: ``"post_rope"`` or ``"rope_on_load"``.
        inv_freq: ``rope_on_load`` only: the current step's :math:`\omega` (float64 preferred), r/2 values;
            dims past r = 2 len(inv_freq) pass through.
        attention_factor: a, multiplying cos and sin (yarn, longrope).
        style: ``"half"`` (pairs (i, i + r/2)) or ``"interleaved"`` (pairs (2i, 2i + 1)).
        rows: int [queries], the cache row of each query (default: query i reads row i). Several queries may
            share a row (a prefill's tokens, each with its own causal length).
        scale: softmax scale, default :math:`1/\sqrt{d}`.
        split_len: keys per stage-1 program (a multiple of ``block_n``); default: enough splits for about
            four programs per GPU multiprocessor.
        block_n: keys per inner block of the Triton kernel, a power of two >= 16 (ValueError otherwise).
        backend: ``"triton"``, ``"torch"`` (the same computation in PyTorch, float64 tables), or ``"auto"``
            (triton when it can run here and the dtype is one of ``KERNEL_DTYPES``, else torch).

    Errors: mismatched heads or head dims, lengths past the cache or below 1, non-float or mixed dtypes,
    mixed devices, a missing ``inv_freq`` all raise ValueError naming the fix.
    """
    check_decode_args(q, k_cache, v_cache, lengths, rows, mode, inv_freq, style, backend)
    nq, hq, d = q.shape
    b, hkv, cap, _ = k_cache.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if rows is None:
        rows = torch.arange(nq, device=q.device)
    unsupported = k_cache.dtype not in KERNEL_DTYPES
    if backend == "auto":
        cpu_compiled = q.device.type == "cpu" and not _interpreting()
        backend = "torch" if (kernel_available() or unsupported or cpu_compiled) else "triton"
    if backend == "torch":
        return torch_path(q, k_cache, v_cache, lengths, rows, mode, inv_freq, attention_factor, style, scale)
    reason = kernel_available()
    if reason:
        raise ValueError(f"backend='triton' cannot run: {reason}.")
    if unsupported:
        raise ValueError(
            f"the Triton kernel takes caches in {[str(t) for t in KERNEL_DTYPES]}, got {k_cache.dtype}; cast the "
            "cache, or use backend='torch' (float64 runs there)."
        )
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}.")
    max_len = int(lengths.max()) if nq else 0
    if split_len is None:
        # about four programs per multiprocessor; one split per row in the interpreter, where every
        # program costs time and nothing runs in parallel
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 0
        want = max(1, math.ceil(4 * sms / max(1, nq * hkv)))
        split_len = max(block_n, math.ceil(max_len / want / block_n) * block_n)
    if split_len < block_n or split_len % block_n:
        raise ValueError(f"split_len must be a positive multiple of block_n={block_n}, got {split_len}.")
    n_splits = max(1, math.ceil(max_len / split_len))
    group = hq // hkv
    lowp = k_cache.dtype != torch.float32
    half = d // 2 if mode == "post_rope" else inv_freq.numel()
    pass_dims = d - 2 * half
    if mode == "rope_on_load":
        freq = fixed_point_turns(inv_freq).to(q.device)
    else:
        freq = torch.zeros(1, dtype=torch.int64, device=q.device)
    lengths32 = lengths.to(device=q.device, dtype=torch.int32).contiguous()
    rows32 = rows.to(device=q.device, dtype=torch.int32).contiguous()
    o_mid = torch.empty(nq, hq, n_splits, _pow2(d), dtype=torch.float32, device=q.device)
    l_mid = torch.empty(nq, hq, n_splits, dtype=torch.float32, device=q.device)
    out = torch.empty(nq, hq, d, dtype=v_cache.dtype, device=q.device)
    split, combine = _kernels()
    split[(nq, hkv, n_splits)](
        q, k_cache, v_cache, lengths32, rows32, freq, o_mid, l_mid,
        *q.stride(), *k_cache.stride(), *v_cache.stride(),
        o_mid.stride(0), o_mid.stride(1), o_mid.stride(2),
        l_mid.stride(0), l_mid.stride(1),
        scale * math.log2(math.e), float(attention_factor), split_len,
        GROUP=group, BLOCK_G=_pow2(group), HEAD_DIM=d, BLOCK_D=_pow2(d),
        HALF=half, BLOCK_R=_pow2(half), PASS=pass_dims, BLOCK_P=_pow2(max(pass_dims, 1)),
        INTERLEAVED=style == "interleaved", ROTATE=mode == "rope_on_load",
        ROUND_OPS=lowp, TC_DOT=lowp and not _interpreting(), BLOCK_N=block_n,
    )
    combine[(nq, hq)](
        o_mid, l_mid, lengths32, out,
        o_mid.stride(0), o_mid.stride(1), o_mid.stride(2),
        l_mid.stride(0), l_mid.stride(1),
        *out.stride(), split_len,
        HEAD_DIM=d, BLOCK_D=_pow2(d), BLOCK_S=_pow2(n_splits, least=2),
    )
    return out


# --------------------------------------------------------------------------------------------------
# The PyTorch path, the float64 oracle and the error bound
# --------------------------------------------------------------------------------------------------


