"""Context-parallel positions (``ropelab.context_parallel``): Transformer Engine's ``cp_size=2`` cases, rewritten.

Transformer Engine (repository NVIDIA/TransformerEngine) rotates a rank's local tokens at their global positions in
``apply_rotary_pos_emb`` (``transformer_engine/pytorch/attention/rope.py``: ``_get_freqs_on_this_cp_rank`` for
sbhd/bshd, ``cu_seqlens // cp_size`` per sequence for thd; the fused kernels in
``transformer_engine/common/fused_rope/fused_rope.cu``). Its tests compare fused against unfused on one rank's
local tensor; rewritten here, each case starts from the *full* sequence instead: for every rank, rotating the
rank's slice (``cp_slice`` / ``cp_varlen``) at ``cp_positions`` must give the slice of the fully rotated
sequence, within the dtype's error bound of a float64 oracle. Heads are fewer than Transformer Engine's (2 to 4,
not 64 or 256): the positions do not depend on them, and the machine running these tests is small.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from _helpers import assert_rotations_agree, rope_error_bound

import ropelab
from ropelab import apply_rope, reference_complex, varlen_positions
from ropelab.context_parallel import CPVarlen, cp_gather, cp_positions, cp_slice, cp_varlen

BASE = 10000.0


def inv_freq64(rotary_dim: int) -> torch.Tensor:
    """Transformer Engine's ``RotaryPositionEmbedding`` frequencies, base**(-2i/r), in float64 for the oracle."""
    return 1.0 / BASE ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def oracle(x: torch.Tensor, positions: torch.Tensor, layout: str, style: str, rotary_dim: int) -> torch.Tensor:
    """float64 complex-form oracle for x in ``layout`` ("b s h d", "s b h d" or "t h d"); ``positions`` [s] or
    [t], or [b, s] (one row per batch element)."""
    inv = inv_freq64(rotary_dim)
    x64 = x.double()
    if layout == "t h d":  # [t, h, d] -> [h, t, d]: positions on axis -2
        return reference_complex(x64.transpose(0, 1), positions, inv, style=style).transpose(0, 1)
    xb = x64.transpose(1, 2) if layout == "b s h d" else x64.permute(1, 2, 0, 3)  # [b, h, s, d]
    rows = positions if positions.ndim == 2 else positions.expand(xb.shape[0], -1)
    out = torch.stack([reference_complex(xb[i], rows[i], inv, style=style) for i in range(xb.shape[0])])
    return out.transpose(1, 2) if layout == "b s h d" else out.permute(2, 0, 1, 3)


def assert_within_bound(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, rotary_dim: int, style: str):
    """|y - ref| within ``rope_error_bound`` for y's dtype (x: the input y was rotated from)."""
    bound = rope_error_bound(x.double(), ref, rotary_dim, style, y.dtype)
    err = (y.double() - ref).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}, max err {err.max():.3g}"


# --------------------------------------------------------------------------------------------------
# tests/pytorch/test_fused_rope.py::test_fused_rope, cp_size=2 (sbhd and bshd)
# --------------------------------------------------------------------------------------------------

# Transformer Engine's grid: dtype x seq_length {2048, 4096} x hidden_size {128, 256} x rotary_percent {0.5, 1}
# x margin {0, 10} x transpose {None, (0, 1), (2, 3)} x tensor_format x interleaved x start_positions (not with
# margin 0). Here every tensor_format x interleaved x dtype once (12 cases), the other values cycled through.
_FORMATS, _INTERLEAVED, _DTYPES = ("sbhd", "bshd"), (False, True), (torch.float32, torch.bfloat16, torch.float16)
FUSED_ROPE_CASES = [
    (fmt, inter, dtype, (2048, 4096)[i % 2], (0, 10)[i // 2 % 2], (128, 256)[i // 4 % 2], (0.5, 1.0)[i // 3 % 2],
     (None, (0, 1), (2, 3))[i // 3 % 3], i // 2 % 2 == 1 and i % 4 != 2)
    for i, (fmt, inter, dtype) in enumerate(itertools.product(_FORMATS, _INTERLEAVED, _DTYPES))
]


def _case_id(case) -> str:
    fmt, inter, dtype, seq, margin, hidden, pct, transpose, start = case
    return (f"{fmt}-{'interleaved' if inter else 'half'}-{str(dtype)[6:]}-s{seq}-m{margin}-d{hidden}-r{pct}-"
            f"t{''.join(map(str, transpose or ()))}-{'start' if start else 'nostart'}")


@pytest.mark.parametrize("case", FUSED_ROPE_CASES, ids=_case_id)
def test_te_fused_rope_cp2(case, gen):
    """Transformer Engine ``tests/pytorch/test_fused_rope.py::test_fused_rope`` at ``cp_size=2``, rewritten: its
    local tensor is ``seq_length - margin`` tokens, so the full sequence here is twice that; batch 2 as there,
    ``start_positions`` drawn in [0, margin) per batch element as there (``offset=`` here), the same strides
    (``transpose``: a contiguous copy of the transposed tensor, transposed back)."""
    fmt, interleaved, dtype, seq_length, margin, hidden, pct, transpose, start = case
    cp, b, h = 2, 2, 2
    s = cp * (seq_length - margin)  # the global length
    layout, seq_dim = ("s b h d", 0) if fmt == "sbhd" else ("b s h d", 1)
    style, rotary_dim = ("interleaved" if interleaved else "half"), int(hidden * pct)
    shape = (s, b, h, hidden) if fmt == "sbhd" else (b, s, h, hidden)
    x = torch.rand(shape, generator=gen).to(dtype)
    if transpose:
        x = x.transpose(*transpose).contiguous().transpose(*transpose)
    offset = torch.randint(0, margin, (b,), generator=gen) if start else 0
    rows = torch.arange(s) + (offset[:, None] if start else 0)  # [b, s] or [s]: the global positions
    ref = oracle(x, rows, layout, style, rotary_dim)
    kw = dict(layout=layout, style=style, rotary_dim=rotary_dim, offset=offset)
    y_full = apply_rope(x, **kw)
    for rank in range(cp):
        pos = cp_positions(s, cp, rank)
        assert pos.dtype == torch.int64 and pos.shape == (s // cp,)
        x_r = cp_slice(x, cp, rank, seq_dim)
        y_r = apply_rope(x_r, pos, **kw)
        ref_r = cp_slice(ref, cp, rank, seq_dim)
        assert_within_bound(y_r, ref_r, x_r, rotary_dim, style)  # the rank's rotation ...
        assert_within_bound(cp_slice(y_full, cp, rank, seq_dim), ref_r, x_r, rotary_dim, style)  # ... = the slice
        assert torch.equal(y_r[..., rotary_dim:], x_r[..., rotary_dim:])  # dims past rotary_dim: copied


def test_local_positions_would_fail(gen):
    """The check above can fail: rank 1 rotated at 0, 1, 2, ... (its local indices, the CP bug) is far outside
    the bound, while rank 0's first chunk (positions 0 .. c - 1 either way) is not; so is a packed rank rotated
    with its local cu_seqlens instead of cp_varlen's positions."""
    s, cp = 64, 2
    x = torch.rand(1, s, 2, 32, generator=gen)
    ref = oracle(x, torch.arange(s), "b s h d", "half", 32)
    x_r, ref_r = cp_slice(x, cp, 1, 1), cp_slice(ref, cp, 1, 1)
    with pytest.raises(AssertionError, match="max excess"):
        assert_within_bound(apply_rope(x_r, layout="b s h d"), ref_r, x_r, 32, "half")
    x0, ref0 = cp_slice(x, cp, 0, 1)[:, : s // 4], cp_slice(ref, cp, 0, 1)[:, : s // 4]
    assert_within_bound(apply_rope(x0, layout="b s h d"), ref0, x0, 32, "half")
    # packed: the local cu_seqlens restart the positions at 0 at each local boundary, which is wrong too
    cu = torch.tensor([0, 16, 64])
    packed = torch.rand(64, 2, 32, generator=gen)
    ref_t = oracle(packed, varlen_positions(cu), "t h d", "half", 32)
    local = cp_varlen(cu, cp, 1)
    x_t, ref_tr = packed[local.token_index], ref_t[local.token_index]
    assert_within_bound(apply_rope(x_t, local.positions, layout="t h d"), ref_tr, x_t, 32, "half")
    with pytest.raises(AssertionError, match="max excess"):
        assert_within_bound(apply_rope(x_t, layout="t h d", cu_seqlens=local.local_cu_seqlens), ref_tr, x_t, 32,
                            "half")


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_positions_are_transformer_engines(cp):
    """The positions, in order, as Transformer Engine's two code paths state them (rewritten on integers):
    ``_get_freqs_on_this_cp_rank`` in ``transformer_engine/pytorch/attention/rope.py`` (rows r seg .. (r+1) seg
    then full - (r+1) seg .. full - r seg of the table, seg = local length / 2, full = cp * local length) and
    ``fused_rope_forward_kernel`` in ``transformer_engine/common/fused_rope/fused_rope.cu`` (local token s_id
    at s_id + r cur/2 in the first half, else at s_id + cur cp - (r+1) cur/2 - cur/2; cur = local length)."""
    for local in (2, 6, 40):
        full, seg = cp * local, local // 2
        table = torch.arange(full)
        for r in range(cp):
            unfused = table[:local] if cp == 1 else torch.cat(
                [table[r * seg:(r + 1) * seg], table[full - (r + 1) * seg:full - r * seg]])
            s_id = torch.arange(local)
            kernel = s_id if cp == 1 else torch.where(
                s_id < local // 2, s_id + r * local // 2, s_id + local * cp - (r + 1) * local // 2 - local // 2)
            assert torch.equal(cp_positions(full, cp, r), unfused)
            assert torch.equal(cp_positions(full, cp, r), kernel)


# --------------------------------------------------------------------------------------------------
# tests/pytorch/test_fused_rope.py::test_fused_rope_thd, cp_size=2 (packed, uneven lengths)
# --------------------------------------------------------------------------------------------------

TE_CU_SEQLENS = [0, 400, 542, 711, 727, 752, 1270, 1426, 1450, 1954, 2044, 2048]  # test_fused_rope_thd's
TE_CU_SEQLENS_DIFF = torch.tensor(TE_CU_SEQLENS).diff()


def te_padded(cu_seqlens: list[int], cp_size: int) -> torch.Tensor:
    """test_fused_rope_thd's ``cu_seqlens_padded``: each sequence rounded up to a multiple of 2 cp_size."""
    out = [0]
    for a, b in itertools.pairwise(cu_seqlens):
        out.append(out[-1] + math.ceil((b - a) / (2 * cp_size)) * 2 * cp_size)
    return torch.tensor(out, dtype=torch.int32)


THD_CASES = [(inter, dtype, (128, 256)[i % 2], (1.0, 0.5)[i // 2 % 2], i % 3 == 0, i % 2 == 1)
             for i, (inter, dtype) in enumerate(itertools.product(_INTERLEAVED, _DTYPES))]


@pytest.mark.parametrize("interleaved, dtype, hidden, pct, transpose, start", THD_CASES,
                         ids=[f"{'interleaved' if c[0] else 'half'}-{str(c[1])[6:]}-d{c[2]}-r{c[3]}-"
                              f"{'t12' if c[4] else 'contig'}-{'start' if c[5] else 'nostart'}" for c in THD_CASES])
def test_te_fused_rope_thd_cp2(interleaved, dtype, hidden, pct, transpose, start, gen):
    """Transformer Engine ``tests/pytorch/test_fused_rope.py::test_fused_rope_thd`` at ``cp_size=2``, rewritten:
    its eleven sequences (``cu_seqlens`` 0, 400, ..., 2048, lengths 400, 142, 169, 16, 25, ...), each padded
    to a multiple of 2 cp_size as there; ``start_positions`` in [0, 10) per sequence as there; its
    ``transpose=(1, 2)`` strides. The global packed tensor is rotated by the oracle at each sequence's
    positions; every rank's ``x[token_index]`` rotated at ``positions`` must be that oracle's rows."""
    cp, h = 2, 2
    cu = te_padded(TE_CU_SEQLENS, cp)
    lengths = cu.diff()
    assert bool((lengths % (2 * cp) == 0).all()) and bool((lengths != TE_CU_SEQLENS_DIFF).any())
    style, rotary_dim = ("interleaved" if interleaved else "half"), int(hidden * pct)
    x = torch.rand(int(cu[-1]), h, hidden, generator=gen).to(dtype)
    if transpose:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    start_positions = torch.randint(0, 10, (lengths.numel(),), generator=gen) if start else None
    global_pos = varlen_positions(cu.long())
    if start:
        global_pos = global_pos + start_positions.repeat_interleave(lengths)
    ref = oracle(x, global_pos, "t h d", style, rotary_dim)
    held = []
    for rank in range(cp):
        local = cp_varlen(cu, cp, rank)
        assert isinstance(local, CPVarlen) and local.local_cu_seqlens.dtype == torch.int32
        assert torch.equal(local.local_cu_seqlens, cu // cp)  # rope.py's unfused thd: cu_seqlens // cp_size
        assert torch.equal(local.positions, varlen_positions(cu.long())[local.token_index])  # global, per sequence
        pos = local.positions
        if start:
            pos = pos + start_positions.repeat_interleave(local.local_cu_seqlens.diff())
        x_r = x[local.token_index]
        assert torch.equal(x_r, cp_slice(x, cp, rank, 0, cu_seqlens=cu))
        y_r = apply_rope(x_r, pos, layout="t h d", style=style, rotary_dim=rotary_dim)
        assert_within_bound(y_r, ref[local.token_index], x_r, rotary_dim, style)
        held.append(local.token_index)
    assert torch.equal(torch.sort(torch.cat(held)).values, torch.arange(int(cu[-1])))  # a partition


# --------------------------------------------------------------------------------------------------
# tests/pytorch/test_fused_rope.py::test_unfused_rope_thd_vs_bshd (cp_size=2)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hidden", [128, 256])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("start", [False, True])
def test_te_unfused_rope_thd_vs_bshd_cp2(hidden, interleaved, start, gen):
    """Transformer Engine ``tests/pytorch/test_fused_rope.py::test_unfused_rope_thd_vs_bshd``, rewritten: four
    sequences of 16 tokens, bfloat16, cp_size=2, ``start_positions = cu_seqlens[:-1]`` or None as there. The
    same batch packed (thd) and padded (bshd, sbhd): each rank holds the same tokens at the same positions in
    all three (exact: only indices and data move), and each rotation is within the bf16 bound of the oracle."""
    cp, b, s, h = 2, 4, 16, 4
    style = "interleaved" if interleaved else "half"
    x = torch.rand(b, s, h, hidden, generator=gen).to(torch.bfloat16)  # bshd, the full batch
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32)
    offset = cu[:-1].long() if start else torch.zeros(b, dtype=torch.long)
    ref = oracle(x, torch.arange(s) + offset[:, None], "b s h d", style, hidden)
    for rank in range(cp):
        pos = cp_positions(s, cp, rank)
        local = cp_varlen(cu, cp, rank)
        x_bshd = cp_slice(x, cp, rank, 1)
        x_thd = x.reshape(b * s, h, hidden)[local.token_index]
        assert torch.equal(x_thd, x_bshd.reshape(-1, h, hidden))
        assert torch.equal(local.positions, pos.repeat(b))
        ref_r = cp_slice(ref, cp, rank, 1)
        y_bshd = apply_rope(x_bshd, pos, layout="b s h d", style=style, offset=offset)
        y_sbhd = apply_rope(x_bshd.transpose(0, 1), pos, layout="s b h d", style=style, offset=offset)
        y_thd = apply_rope(x_thd, local.positions + offset.repeat_interleave(local.local_cu_seqlens.diff()),
                           layout="t h d", style=style)
        assert_within_bound(y_bshd, ref_r, x_bshd, hidden, style)
        assert_within_bound(y_sbhd.transpose(0, 1), ref_r, x_bshd, hidden, style)
        assert_within_bound(y_thd.reshape(b, s // cp, h, hidden), ref_r, x_bshd, hidden, style)


# --------------------------------------------------------------------------------------------------
# tests/pytorch/attention/test_cp_utils.py (cp_size=2 and 4): which tokens a rank holds, exact
# --------------------------------------------------------------------------------------------------


def test_te_thd_get_partitioned_indices_cp2():
    """``TestTHDKernels.test_thd_get_partitioned_indices_matches_dual_chunk_expected_indices``: cu_seqlens
    [0, 8, 16], cp_size 2; its expected indices per rank."""
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    assert cp_varlen(cu, 2, 0).token_index.tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert cp_varlen(cu, 2, 1).token_index.tolist() == [2, 3, 4, 5, 10, 11, 12, 13]


def test_te_cp_rank_slicing_cases():
    """``TestContextParallelUtils`` (``get_batch_on_this_cp_rank``): ``test_cp_rank_slicing_simple_case``,
    ``..._multiple_sequences``, ``..._with_cp_size_1`` and ``..._sequence_dim_detection``, their inputs and
    expected tokens and position ids."""
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    one = torch.tensor([0, 8])
    assert cp_slice(ids, 2, 0, 1, cu_seqlens=one).tolist() == [[1, 2, 7, 8]]
    assert cp_slice(ids, 2, 1, 1, cu_seqlens=one).tolist() == [[3, 4, 5, 6]]
    assert cp_varlen(one, 2, 0).positions.tolist() == [0, 1, 6, 7]
    assert cp_varlen(one, 2, 1).positions.tolist() == [2, 3, 4, 5]
    two = torch.tensor([0, 8, 16])
    ids2 = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17, 18]])
    assert cp_slice(ids2, 2, 0, 1, cu_seqlens=two).tolist() == [[1, 2, 7, 8, 11, 12, 17, 18]]
    assert cp_varlen(two, 2, 0).positions.tolist() == [0, 1, 6, 7, 0, 1, 6, 7]
    assert torch.equal(cp_slice(ids, 1, 0, 1, cu_seqlens=one), ids)  # cp_size 1: unchanged
    by_seq = torch.tensor([[1, 10], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60], [7, 70], [8, 80]])  # [s, b]
    assert cp_slice(by_seq, 2, 0, 0).tolist() == [[1, 10], [2, 20], [7, 70], [8, 80]]


def test_te_thd_cp_rank_order_roundtrip_cp4():
    """``TestTHDKernels.test_thd_sequence_cp_rank_order_roundtrip_matches_legacy_python_reorder``: cp_size 4,
    cu_seqlens [0, 8, 24, 40], x = arange(320) as [40, 2, 4] float16: to the ranks and back is x (exact)."""
    cu = torch.tensor([0, 8, 24, 40], dtype=torch.int32)
    x = torch.arange(40 * 2 * 4, dtype=torch.float16).view(40, 2, 4)
    slices = [cp_slice(x, 4, r, 0, cu_seqlens=cu) for r in range(4)]
    assert all(sl.shape == (10, 2, 4) for sl in slices)
    assert torch.equal(cp_gather(slices, 0, cu_seqlens=cu), x)


# --------------------------------------------------------------------------------------------------
# Properties of the layout
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_ranks_partition_the_tokens(cp, gen):
    """Every token is held by exactly one rank, s / cp each; the same for a packed batch, sequence by sequence."""
    for s in (0, 2 * cp, 6 * cp, 40 * cp):
        held = torch.cat([cp_positions(s, cp, r) for r in range(cp)])
        assert held.numel() == s and torch.equal(torch.sort(held).values, torch.arange(s))
    lengths = 2 * cp * torch.randint(0, 7, (9,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    parts = [cp_varlen(cu, cp, r) for r in range(cp)]
    assert all(p.token_index.numel() == int(cu[-1]) // cp for p in parts)
    assert torch.equal(torch.sort(torch.cat([p.token_index for p in parts])).values, torch.arange(int(cu[-1])))
    for p in parts:  # each local token is in the sequence local_cu_seqlens puts it in
        seq_global = torch.searchsorted(cu, p.token_index, right=True) - 1
        seq_local = torch.searchsorted(p.local_cu_seqlens, torch.arange(p.token_index.numel()), right=True) - 1
        assert torch.equal(seq_global, seq_local)


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_causal_work_is_balanced(cp):
    r"""Under a causal mask the token at position p attends to p + 1 keys: every rank's total is
    :math:`c^2(2cp - 1) + c(c + 1)`; a contiguous split (rank r holding [r s/cp, (r+1) s/cp)) is not balanced."""
    for c in (1, 3, 16):
        s = 2 * cp * c
        work = [int((cp_positions(s, cp, r) + 1).sum()) for r in range(cp)]
        assert work == [c * c * (2 * cp - 1) + c * (c + 1)] * cp
        contiguous = [int((torch.arange(r * s // cp, (r + 1) * s // cp) + 1).sum()) for r in range(cp)]
        assert len(set(contiguous)) == cp


def test_cp_size_1_is_the_identity(gen):
    """One rank holds everything in order, for any length (no divisibility needed), packed or not."""
    for s in (0, 1, 7, 10):
        assert torch.equal(cp_positions(s, 1, 0), torch.arange(s))
    x = torch.randn(2, 7, 3, generator=gen)
    assert torch.equal(cp_slice(x, 1, 0, 1), x) and torch.equal(cp_gather([x], 1), x)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    local = cp_varlen(cu, 1, 0)
    assert torch.equal(local.local_cu_seqlens, cu) and torch.equal(local.positions, varlen_positions(cu.long()))
    assert torch.equal(local.token_index, torch.arange(10))


@pytest.mark.parametrize("cp, seq_dim", [(2, 1), (3, 0), (4, -3)])
def test_gather_inverts_slice(cp, seq_dim, gen):
    """cp_gather(cp_slice for every rank) is x, exactly; and the gradient of a slice lands on its own tokens."""
    x = torch.randn(4 * cp, 4 * cp, 3, generator=gen, requires_grad=True)
    slices = [cp_slice(x, cp, r, seq_dim) for r in range(cp)]
    assert torch.equal(cp_gather(slices, seq_dim), x)
    slices[1].sum().backward()
    mask = torch.zeros(4 * cp, dtype=torch.bool)
    mask[cp_positions(4 * cp, cp, 1)] = True
    shape = [1, 1, 1]
    shape[seq_dim] = -1
    assert torch.equal(x.grad, mask.view(shape).expand_as(x).to(x.dtype))


def test_results_on_cu_seqlens_device_and_exported():
    """cp_varlen's results live on cu_seqlens' device; the names are exported from ropelab."""
    cu = torch.tensor([0, 8], dtype=torch.int64)
    assert {t.device for t in cp_varlen(cu, 2, 0)} == {cu.device}
    assert ropelab.cp_positions is cp_positions and ropelab.cp_varlen is cp_varlen


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: cp_positions(8, 0, 0), r"cp_size must be at least 1"),
    (lambda: cp_positions(8, 2, 2), r"cp_rank must be in \[0, cp_size\) = \[0, 2\), got 2"),
    (lambda: cp_positions(8, 2, -1), r"cp_rank must be in"),
    (lambda: cp_positions(8.0, 2, 0), r"seq_len must be an int, got float"),
    (lambda: cp_positions(8, 2.0, 0), r"cp_size must be an int, got float"),
    (lambda: cp_positions(8, True, 0), r"cp_size must be an int, got a bool"),
    (lambda: cp_positions(8, 2, "0"), r"cp_rank must be an int, got str"),
    (lambda: cp_positions(-4, 2, 0), r"seq_len must be >= 0"),
    (lambda: cp_positions(6, 2, 0), r"seq_len 6, not a multiple of 2\*cp_size = 4.*Pad it to 8 tokens"),
    (lambda: cp_positions(12, 4, 0), r"not a multiple of 2\*cp_size = 8.*Pad it to 16"),
    (lambda: cp_varlen([0, 8, 14, 20], 2, 0),
     r"sequence 1 of cu_seqlens has length 6, not a multiple of 2\*cp_size = 4 \(1 more sequence too\).*Pad it to 8"),
    (lambda: cp_varlen(torch.tensor([0.0, 8.0]), 2, 0), r"cu_seqlens must be an integer tensor"),
    (lambda: cp_varlen(torch.tensor([4, 8]), 2, 0), r"cu_seqlens must start at 0"),
    (lambda: cp_varlen(torch.tensor([0, 8, 4]), 2, 0), r"cu_seqlens must not decrease"),
    (lambda: cp_varlen(torch.tensor([0]), 2, 0), r"cu_seqlens must be 1-D"),
    (lambda: cp_slice(torch.zeros(2, 8), 2, 0, 2), r"seq_dim 2 is out of range for a 2-D tensor"),
    (lambda: cp_slice([1, 2, 3, 4], 2, 0, 0), r"x must be a torch.Tensor, got list"),
    (lambda: cp_slice(torch.zeros(2, 6), 2, 0, 1), r"seq_len 6, not a multiple"),
    (lambda: cp_slice(torch.zeros(12, 3), 2, 0, 0, cu_seqlens=torch.tensor([0, 8])),
     r"cu_seqlens must end at the token count 12"),
    (lambda: cp_gather([], 0), r"slices must be a non-empty list"),
    (lambda: cp_gather(torch.zeros(2, 4), 0), r"slices must be a non-empty list"),
    (lambda: cp_gather([torch.zeros(2, 4), torch.zeros(2, 6)], 1), r"slices\[1\] has shape \(2, 6\)"),
    (lambda: cp_gather([torch.zeros(4), torch.zeros(4, dtype=torch.float16)], 0), r"slices\[1\] has shape"),
])
def test_errors_name_the_problem_and_the_fix(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------------------------------
# Parity with Transformer Engine's own function, where it is installed (needs CUDA)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_parity_with_transformer_engine(fmt, interleaved):
    """Transformer Engine's unfused ``apply_rotary_pos_emb(..., cp_size=2, cp_rank=r)`` on a rank's local
    tensor against ropelab's rotation at ``cp_positions`` / ``cp_varlen`` positions, with the same float32
    angles (rows of Transformer Engine's ``RotaryPositionEmbedding`` table): the two differ only in rounding
    order (``assert_rotations_agree``). Its fused kernel against its unfused path is its own test's job
    (``torch.testing.assert_close`` there); it is compared here with that same check."""
    pytest.importorskip("transformer_engine", reason="transformer_engine (NVIDIA Transformer Engine) is not installed")
    if not torch.cuda.is_available():
        pytest.skip("transformer_engine's RoPE runs on CUDA only; no CUDA device here")
    from transformer_engine.pytorch.attention import rope as rope_te

    from ropelab.core import pair_indices, rotate

    cp, h, d = 2, 4, 128
    style = "interleaved" if interleaved else "half"
    g = torch.Generator(device="cuda").manual_seed(0)
    emb = rope_te.RotaryPositionEmbedding(d, interleaved=interleaved)(4096)  # [S, 1, 1, d] float32 angles
    freqs = emb[:, 0, 0, pair_indices(d, style)[0].cuda()]  # [S, d/2]: angle of pair i at each position
    if fmt == "thd":
        cu = te_padded(TE_CU_SEQLENS, cp).cuda()
        x = torch.rand(int(cu[-1]), h, d, device="cuda", generator=g)
    else:
        s = 2 * 1000
        x = torch.rand((s, 2, h, d) if fmt == "sbhd" else (2, s, h, d), device="cuda", generator=g)
    for rank in range(cp):
        if fmt == "thd":
            local = cp_varlen(cu, cp, rank)
            x_r, pos = x[local.token_index], local.positions
            cos, sin = torch.cos(freqs[pos])[:, None], torch.sin(freqs[pos])[:, None]  # [t, 1, d/2]
            kw = dict(tensor_format="thd", cu_seqlens=cu)
        else:
            seq_dim = 0 if fmt == "sbhd" else 1
            x_r, pos = cp_slice(x, cp, rank, seq_dim), cp_positions(s, cp, rank, device="cuda")
            shape = (-1, 1, 1, d // 2) if fmt == "sbhd" else (1, -1, 1, d // 2)
            cos, sin = torch.cos(freqs[pos]).view(shape), torch.sin(freqs[pos]).view(shape)
            kw = dict(tensor_format=fmt)
        ours = rotate(x_r, cos, sin, style=style)
        te_unfused = rope_te.apply_rotary_pos_emb(x_r, emb, interleaved=interleaved, fused=False, cp_size=cp,
                                                  cp_rank=rank, **kw)
        te_fused = rope_te.apply_rotary_pos_emb(x_r, emb, interleaved=interleaved, fused=True, cp_size=cp,
                                                cp_rank=rank, **kw)
        assert_rotations_agree(te_unfused, ours, x_r, d, style)
        torch.testing.assert_close(te_fused, te_unfused)
