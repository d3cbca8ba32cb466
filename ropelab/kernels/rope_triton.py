r"""The Triton program of the fused RoPE: only the math and the memory access, no launch logic.

One program instance rotates a tile of ``BLOCK_S`` tokens x ``r/2`` pairs for a run of heads of one
tensor (q or k: both are served by one launch, so GQA's unequal head counts cost nothing extra):

.. math::
    y_a = x_a \cos\theta - x_b \sin\theta, \qquad y_b = x_b \cos\theta + x_a \sin\theta,
    \qquad \theta = p\,\omega_i,

with the pair ``(a, b) = (i, i + r/2)`` (``INTERLEAVED=False``, rotate_half) or ``(2i, 2i + 1)``
(``INTERLEAVED=True``). The backward pass is the inverse rotation, ``sin -> -sin`` (``CONJUGATE``),
because RoPE is linear in x and orthogonal: :math:`\partial L/\partial x = R^\top \partial L/\partial y`.

cos/sin are made once per program and reused for every head it handles, either

- gathered from a position-indexed table ``[P, r/2]`` (ropelab's tables: angles formed in float64,
  rounded once), or
- computed in the kernel from ``inv_freq`` (float64, with ``attention_factor`` stored after its
  ``r/2`` entries so it keeps float64 precision too): the angle ``p * inv_freq`` in float64 (``ANGLE_F64``, the
  same numerics as :func:`ropelab.cos_sin`) or float32 (Hugging Face's), cos/sin in that precision,
  times ``attention_factor``, rounded once to the compute dtype. Any ``rope_scaling`` type works,
  since it only changes ``inv_freq`` and ``attention_factor``.

Positions are ``s + offset`` (an int, or one offset per sequence), explicit position ids, or, for
packed varlen tokens, the index within the sequence that ``cu_seqlens`` delimits (the grid's third
axis is then the sequence). The dims past ``r`` are copied in the same pass unless the output aliases
the input (in place).

Numerics: every load is converted to ``CDT`` (float32 for fp32/fp16/bf16, float64 for float64) and
every store rounds once to the output dtype, in the backward pass as in the forward (so a gradient
small against its two terms survives); nothing is computed in 16-bit (Triton's interpreter has no
bf16 arithmetic, and fp32 math is what ropelab promises anyway). Address arithmetic is 64-bit
(:func:`row_offsets`): tensors past 2**31 elements and huge strides stay right.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_offsets(b, s, stride_b, stride_s):
    """Element offset of token rows ``s`` of batch ``b``, in int64 (an int32 product wraps past 2**31)."""
    return b.to(tl.int64) * stride_b + s.to(tl.int64) * stride_s


@triton.jit
def _offsets_probe_kernel(OUT, B, S, stride_b, stride_s, BLOCK: tl.constexpr):
    """Writes :func:`row_offsets` for rows 0..BLOCK-1 of batch B: lets a test check the int64 arithmetic
    with strides past 2**31 without allocating a tensor that large."""
    s = S + tl.arange(0, BLOCK)
    tl.store(OUT + tl.arange(0, BLOCK), row_offsets(B, s, stride_b, stride_s))


@triton.jit
def _rotate_heads(
    X, O, cos, sin, b, s, s_mask, h_start, h_end,
    sxb, sxs, sxh, sxd, sob, sos, soh, sod,
    half, head_dim,
    HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_PASS: tl.constexpr,
    CDT: tl.constexpr,
):
    i = tl.arange(0, HALF_PAD)
    m = s_mask[:, None] & (i < half)[None, :]
    if INTERLEAVED:
        ia = 2 * i
        ib = 2 * i + 1
    else:
        ia = i
        ib = i + half
    ia64 = ia.to(tl.int64)
    ib64 = ib.to(tl.int64)
    rx = row_offsets(b, s, sxb, sxs)
    ro = row_offsets(b, s, sob, sos)
    j = 2 * half + tl.arange(0, PASS_PAD)
    mj = s_mask[:, None] & (j < head_dim)[None, :]
    j64 = j.to(tl.int64)
    px = X + (rx + h_start.to(tl.int64) * sxh)[:, None]
    po = O + (ro + h_start.to(tl.int64) * soh)[:, None]
    for _ in range(h_start, h_end):
        xa = tl.load(px + ia64[None, :] * sxd, mask=m, other=0.0).to(CDT)
        xb = tl.load(px + ib64[None, :] * sxd, mask=m, other=0.0).to(CDT)
        ya = xa * cos - xb * sin
        yb = xb * cos + xa * sin
        tl.store(po + ia64[None, :] * sod, ya.to(O.dtype.element_ty), mask=m)
        tl.store(po + ib64[None, :] * sod, yb.to(O.dtype.element_ty), mask=m)
        if COPY_PASS:
            v = tl.load(px + j64[None, :] * sxd, mask=mj, other=0.0)
            tl.store(po + j64[None, :] * sod, v.to(O.dtype.element_ty), mask=mj)
        px += sxh  # next head: a pointer step, so no int32 product can wrap
        po += soh


@triton.jit
def rope_kernel(
    Q, OQ, K, OK, COS, SIN, INV_FREQ, POS, OFFSET, CU_SEQLENS,
    seqlen, heads_q, heads_k, half, head_dim, offset_int,
    sqb, sqs, sqh, sqd, soqb, soqs, soqh, soqd,
    skb, sks, skh, skd, sokb, soks, sokh, sokd,
    spb, sps, stride_table,
    BLOCK_S: tl.constexpr, HEADS_PER_PROG: tl.constexpr, HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, COPY_PASS: tl.constexpr, HAS_K: tl.constexpr,
    VARLEN: tl.constexpr, HAS_POS: tl.constexpr, OFFSET_PER_SEQ: tl.constexpr,
    FROM_TABLE: tl.constexpr, ANGLE_F64: tl.constexpr, CDT: tl.constexpr,
):
    """Grid: (token blocks, head runs of q then of k, batch or varlen sequence)."""
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)

    # --- which tokens, at which positions
    local = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    if VARLEN:
        start = tl.load(CU_SEQLENS + pid_b).to(tl.int64)
        length = tl.load(CU_SEQLENS + pid_b + 1).to(tl.int64) - start
        s_mask = local < length
        s = start + local
        b = pid_b * 0  # packed tokens have no batch axis: an int tensor zero, like pid_b's type
    else:
        s_mask = local < seqlen
        s = local
        b = pid_b
    if HAS_POS:
        pos = tl.load(POS + row_offsets(b, s, spb, sps), mask=s_mask, other=0)
    else:
        pos = local.to(tl.int64) + offset_int
    if OFFSET_PER_SEQ:
        pos = pos + tl.load(OFFSET + pid_b)

    # --- cos/sin for these tokens, once for all heads of this program
    i = tl.arange(0, HALF_PAD)
    mi = i < half
    mt = s_mask[:, None] & mi[None, :]
    if FROM_TABLE:
        t = pos.to(tl.int64)[:, None] * stride_table + i[None, :]
        cos = tl.load(COS + t, mask=mt, other=0.0).to(CDT)
        sin = tl.load(SIN + t, mask=mt, other=0.0).to(CDT)
    else:
        if ANGLE_F64:
            ang = pos.to(tl.float64)[:, None] * tl.load(INV_FREQ + i, mask=mi, other=0.0).to(tl.float64)[None, :]
            af = tl.load(INV_FREQ + half).to(tl.float64)
        else:
            ang = pos.to(tl.float32)[:, None] * tl.load(INV_FREQ + i, mask=mi, other=0.0).to(tl.float32)[None, :]
            af = tl.load(INV_FREQ + half).to(tl.float32)
        cos = (tl.cos(ang) * af).to(CDT)
        sin = (tl.sin(ang) * af).to(CDT)
    if CONJUGATE:
        sin = -sin

    # --- q heads, then k heads (GQA: different counts, one launch)
    blocks_q = tl.cdiv(heads_q, HEADS_PER_PROG)
    if pid_h < blocks_q:
        h0 = pid_h * HEADS_PER_PROG
        h1 = tl.minimum(h0 + HEADS_PER_PROG, heads_q)
        _rotate_heads(Q, OQ, cos, sin, b, s, s_mask, h0, h1, sqb, sqs, sqh, sqd, soqb, soqs, soqh, soqd,
                      half, head_dim, HALF_PAD, PASS_PAD, INTERLEAVED, COPY_PASS, CDT)
    elif HAS_K:
        h0 = (pid_h - blocks_q) * HEADS_PER_PROG
        h1 = tl.minimum(h0 + HEADS_PER_PROG, heads_k)
        _rotate_heads(K, OK, cos, sin, b, s, s_mask, h0, h1, skb, sks, skh, skd, sokb, soks, sokh, sokd,
                      half, head_dim, HALF_PAD, PASS_PAD, INTERLEAVED, COPY_PASS, CDT)
