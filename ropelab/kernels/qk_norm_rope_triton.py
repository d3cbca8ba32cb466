r"""The Triton program of the fused QK-RMSNorm + RoPE + KV-cache write: only the math and the memory access.

One program instance handles one row: a token ``t`` and one head of q, of k or of v (the grid is
``(tokens, Hq + Hkv [+ Hkv])``, so the three parts of a packed QKV projection output are served by one
launch). For a q or k row of ``D`` elements:

.. math::
    \hat x_j = x_j\,\Big(\tfrac1D\textstyle\sum_i x_i^2 + \varepsilon\Big)^{-1/2} (w_j + o),
    \qquad y_a = \hat x_a\cos\theta - \hat x_b\sin\theta, \quad y_b = \hat x_b\cos\theta + \hat x_a\sin\theta,

``o`` = 0 (Qwen3, OLMo2) or 1 (Gemma's ``1 + weight``), the pair ``(a, b)`` = ``(i, i + r/2)`` or
``(2i, 2i + 1)`` (``INTERLEAVED``), dims past ``r`` only normalised. The pair partner is loaded a second
time from the same row (an L1 hit on a GPU) rather than shuffled in registers: the row is read from
memory once. A k row is stored to ``k_out`` and, where its slot is not ``-1``, to the cache slot; a v row
is only copied into its slot (no norm, no rotation).

Numerics: every load is converted to ``CDT`` (float32 for fp32/fp16/bf16, float64 for float64); the sum
of squares, the normalisation, the weight and the rotation are all in ``CDT``; each store rounds once to
the output dtype. Nothing is computed in 16-bit (Triton's interpreter has no bf16 arithmetic). Row
addresses are 64-bit (``.to(tl.int64)`` before the stride product).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def qk_norm_rope_kernel(
    Q, K, V, WQ, WK, COS, SIN, POS_IDX, SLOT, OQ, OK, KC, VC,
    Hq, Hkv, D, half, eps, w_offset,
    sqt, sqh, sqd, skt, skh, skd, svt, svh, svd,
    soqt, soqh, sokt, sokh, scs, sch, svcs, svch, s_cos,
    BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_CACHE: tl.constexpr, CDT: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    t64 = t.to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    is_q = h < Hq
    is_v = h >= Hq + Hkv
    hk = tl.where(is_q, 0, h - Hq).to(tl.int64)  # head index within k (or v, below)
    hv = tl.where(is_v, h - Hq - Hkv, 0).to(tl.int64)
    hq = tl.where(is_q, h, 0).to(tl.int64)
    # The pair partner of each dim (dims past r have none), and its cos/sin column.
    r = 2 * half
    rot = d < r
    if INTERLEAVED:
        partner = d ^ 1
        first = (d % 2) == 0
        i = d // 2
    else:
        first = d < half
        partner = tl.where(first, d + half, d - half)
        i = tl.where(first, d, d - half)
    pmask = dmask & rot
    if HAS_CACHE:
        slot = tl.load(SLOT + t).to(tl.int64)
    else:
        slot = t64 * 0 - 1
    smask = dmask & ((d.to(tl.int64) * 0 + slot) >= 0)  # -1: the token is not written to the cache
    if is_v:  # a v row: only its copy into the cache slot
        if HAS_CACHE:
            xv = tl.load(V + t64 * svt + hv * svh + d * svd, mask=dmask, other=0.0)
            tl.store(VC + slot * svcs + hv * svch + d, xv.to(VC.dtype.element_ty), mask=smask)
    else:
        # Each branch yields loaded values only (the row, its partners, the weights), never pointers or strides.
        if is_q:
            row_q = Q + t64 * sqt + hq * sqh
            x = tl.load(row_q + d * sqd, mask=dmask, other=0.0).to(CDT)
            xp = tl.load(row_q + partner * sqd, mask=pmask, other=0.0).to(CDT)
            w = tl.load(WQ + d, mask=dmask, other=0.0).to(CDT)
            wp = tl.load(WQ + partner, mask=pmask, other=0.0).to(CDT)
        else:
            row_k = K + t64 * skt + hk * skh
            x = tl.load(row_k + d * skd, mask=dmask, other=0.0).to(CDT)
            xp = tl.load(row_k + partner * skd, mask=pmask, other=0.0).to(CDT)
            w = tl.load(WK + d, mask=dmask, other=0.0).to(CDT)
            wp = tl.load(WK + partner, mask=pmask, other=0.0).to(CDT)
        ms = tl.sum(x * x, axis=0) / D
        rstd = 1.0 / tl.sqrt(ms + eps)
        xn = x * rstd * (w + w_offset)
        xpn = xp * rstd * (wp + w_offset)
        row = tl.load(POS_IDX + t).to(tl.int64) * s_cos
        c = tl.load(COS + row + i, mask=pmask, other=1.0).to(CDT)
        s = tl.load(SIN + row + i, mask=pmask, other=0.0).to(CDT)
        # y_a = xa c - xb s (first of the pair), y_b = xb c + xa s (second): x here is this dim, xp its partner.
        y = tl.where(rot, tl.where(first, xn * c - xpn * s, xn * c + xpn * s), xn)
        if is_q:
            tl.store(OQ + t64 * soqt + hq * soqh + d, y.to(OQ.dtype.element_ty), mask=dmask)
        else:
            tl.store(OK + t64 * sokt + hk * sokh + d, y.to(OK.dtype.element_ty), mask=dmask)
            if HAS_CACHE:
                tl.store(KC + slot * scs + hk * sch + d, y.to(KC.dtype.element_ty), mask=smask)
