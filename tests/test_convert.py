"""ropelab.convert: the half <-> interleaved permutation, for vectors and for q/k projection weights.

The reference for the weight permutation is Hugging Face's own code, run rather than copied: the nested
``permute`` of ``write_model`` in ``convert_llama_weights_to_hf.py`` (parsed out of the file with ``ast``),
and the GGUF loader's ``LlamaTensorProcessor._reverse_permute_weights`` (the same map, shipped in
transformers 5.x, which no longer ships the conversion script).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from _helpers import UNIT_ROUNDOFF, gamma, rope_error_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from ropelab import apply_rope, frequencies, pair_indices, reference_matrix, rotation_matrix
from ropelab.convert import (
    convert_style,
    half_to_interleaved,
    interleaved_to_half,
    permute_qk_weight,
    style_permutation,
)

CONVERT_SCRIPT = "convert_llama_weights_to_hf.py"
# A copy of the script outside the installed package (e.g. a transformers source checkout's
# src/transformers/models/llama/convert_llama_weights_to_hf.py) can be named here.
CONVERT_SCRIPT_ENV = "ROPELAB_HF_LLAMA_CONVERT"


@st.composite
def dims(draw):
    """(head_dim, rotary_dim or None): head_dim may be odd past an even rotary_dim."""
    half = draw(st.integers(1, 12))
    head_dim = 2 * half + draw(st.integers(0, 3))
    rotary_dim = draw(st.one_of(st.none(), st.integers(1, half).map(lambda i: 2 * i)))
    if rotary_dim is None and head_dim % 2:
        rotary_dim = 2 * half
    return head_dim, rotary_dim


# --------------------------------------------------------------------------------------------------
# The permutation of head dims
# --------------------------------------------------------------------------------------------------


def test_seed_example():
    """The forum thread's vector, both ways: interleaved pairs (0,1),(2,3),(4,5) land at (i, i + 3)."""
    x = torch.arange(6)
    assert interleaved_to_half(x).tolist() == [0, 2, 4, 1, 3, 5]
    assert half_to_interleaved(x).tolist() == [0, 3, 1, 4, 2, 5]
    # Only the first rotary_dim dims move.
    assert interleaved_to_half(torch.arange(8), rotary_dim=4).tolist() == [0, 2, 1, 3, 4, 5, 6, 7]


@settings(max_examples=80, deadline=None)
@given(dims(), st.integers(0, 2**16))
def test_round_trip_is_identity(d, seed):
    head_dim, rotary_dim = d
    x = torch.randn(3, head_dim, generator=torch.Generator().manual_seed(seed))
    # exact on every CPU: permutations (indexing) only, no arithmetic
    assert torch.equal(half_to_interleaved(interleaved_to_half(x, rotary_dim), rotary_dim), x)
    assert torch.equal(interleaved_to_half(half_to_interleaved(x, rotary_dim), rotary_dim), x)
    # A permutation: every dim used once, the pass-through tail fixed, same style -> identity.
    idx = style_permutation(head_dim, src="interleaved", dst="half", rotary_dim=rotary_dim)
    assert sorted(idx.tolist()) == list(range(head_dim))
    r = head_dim if rotary_dim is None else rotary_dim
    assert idx[r:].tolist() == list(range(r, head_dim))
    # exact on every CPU: an identity permutation (indexing)
    assert torch.equal(convert_style(x, src="half", dst="half", rotary_dim=rotary_dim), x)


def permutation_matrix(idx: torch.Tensor) -> torch.Tensor:
    """P with P @ x == x[idx]."""
    return torch.eye(idx.numel(), dtype=torch.float64)[idx]


@settings(max_examples=40, deadline=None)
@given(dims(), st.sampled_from([100.0, 10000.0, 1e6]), st.integers(0, 2**16))
def test_half_rotation_is_interleaved_rotation_conjugated_by_p(d, base, seed):
    """R_half = P R_int P^T as float64 matrices: a permutation only moves entries, so the match is exact."""
    head_dim, rotary_dim = d
    r = head_dim if rotary_dim is None else rotary_dim
    inv_freq, _ = frequencies(r, base)
    positions = torch.randint(0, 100_000, (5,), generator=torch.Generator().manual_seed(seed))
    P = permutation_matrix(style_permutation(head_dim, src="interleaved", dst="half", rotary_dim=rotary_dim))
    R_half = rotation_matrix(positions, inv_freq, head_dim, style="half")
    R_int = rotation_matrix(positions, inv_freq, head_dim, style="interleaved")
    # exact on every CPU: P is 0/1, so each entry is 1.0 * R_ij plus zeros in any order, fused or not
    assert torch.equal(P @ R_int @ P.T, R_half)


@settings(max_examples=40, deadline=None)
@given(dims(), st.sampled_from([torch.float64, torch.float32]), st.integers(0, 2**16))
def test_convert_commutes_with_rotation(d, dtype, seed):
    """half-RoPE(P x) == P interleaved-RoPE(x): in the float64 oracle, and for apply_rope within its bound."""
    head_dim, rotary_dim = d
    r = head_dim if rotary_dim is None else rotary_dim
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 7, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    positions = torch.randint(0, 5000, (7,), generator=gen)
    inv_freq, _ = frequencies(r, 10000.0)
    px = interleaved_to_half(x, rotary_dim)
    # Oracle: both sides are the same float64 products, only re-ordered. Each output is a sum over d of
    # R_ij x_j with two non-zero terms per rotated dim (one, times 1.0, per passed dim), and the matrix
    # product may order and fuse them differently on each side (an Intel Xeon differs by 2.2e-16 here):
    # each side is within gamma_2 (|x_a c| + |x_b s|) <= gamma_2 (|x_a| + |x_b|) of exact, so they agree
    # within twice that; passed dims are 1.0 * x_j plus zeros, exact.
    ref_half = reference_matrix(px, positions, inv_freq, style="half")
    ref_int = interleaved_to_half(reference_matrix(x, positions, inv_freq, style="interleaved"), rotary_dim)
    a, b = pair_indices(r, "half")
    pair_mag = torch.zeros_like(ref_half)
    pair_mag[..., a] = pair_mag[..., b] = px.double()[..., a].abs() + px.double()[..., b].abs()
    assert bool(((ref_half - ref_int).abs() <= 2 * gamma(2, torch.float64) * pair_mag).all())
    # The fast path against the oracle, each side within apply_rope's own error bound.
    y_half = apply_rope(px, positions, layout="b s d", style="half", rotary_dim=r)
    y_int = interleaved_to_half(apply_rope(x, positions, layout="b s d", style="interleaved", rotary_dim=r), rotary_dim)
    bound = rope_error_bound(px.double(), ref_half, r, "half", dtype)
    assert ((y_half.double() - ref_half).abs() <= bound).all()
    assert ((y_int.double() - ref_half).abs() <= bound).all()


# --------------------------------------------------------------------------------------------------
# Weights: against Hugging Face's conversion, and scores unchanged
# --------------------------------------------------------------------------------------------------


def _find_convert_script() -> Path | None:
    candidates = []
    if os.environ.get(CONVERT_SCRIPT_ENV):
        candidates.append(Path(os.environ[CONVERT_SCRIPT_ENV]))
    try:
        import transformers

        candidates.append(Path(transformers.__file__).parent / "models" / "llama" / CONVERT_SCRIPT)
    except ImportError:
        pass
    return next((p for p in candidates if p.is_file()), None)


def _hf_permute():
    """The nested ``permute`` of ``write_model`` in Hugging Face's Llama conversion script, exec'd from the
    script's own source (the rest of the script, which loads checkpoints, never runs)."""
    path = _find_convert_script()
    if path is None:
        pytest.skip(
            f"{CONVERT_SCRIPT} is not in the installed transformers (5.x dropped the conversion scripts); set "
            f"{CONVERT_SCRIPT_ENV} to a copy from a transformers source checkout to run this test."
        )
    tree = ast.parse(path.read_text(), filename=str(path))
    write_model = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "write_model")
    fn = next(n for n in ast.walk(write_model) if isinstance(n, ast.FunctionDef) and n.name == "permute")
    # Its defaults read write_model's local `dim` at definition time; every call below passes dim1 and dim2.
    namespace = {"torch": torch, "dim": 0}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["permute"]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 4, 8), (8, 2, 16), (3, 1, 6), (2, 2, 128)])
def test_permute_matches_hf_convert_script(n_heads, n_kv_heads, head_dim):
    hf_permute = _hf_permute()
    gen = torch.Generator().manual_seed(n_heads * head_dim)
    dim = n_heads * head_dim
    wq = torch.randn(dim, dim, generator=gen)
    wk = torch.randn(n_kv_heads * head_dim, dim, generator=gen)
    ours_q = permute_qk_weight(wq, n_heads, src="interleaved", dst="half")
    ours_k = permute_qk_weight(wk, n_kv_heads, src="interleaved", dst="half")
    # exact on every CPU: both are row permutations (view/transpose/reshape and indexing), no arithmetic
    assert torch.equal(ours_q, hf_permute(wq, n_heads, dim1=dim, dim2=dim))
    assert torch.equal(ours_k, hf_permute(wk, n_kv_heads, dim1=n_kv_heads * head_dim, dim2=dim))
    # And the way back undoes it.
    assert torch.equal(permute_qk_weight(ours_q, n_heads, src="half", dst="interleaved"), wq)


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 4, 8), (8, 2, 16), (2, 2, 128)])
def test_permute_matches_hf_gguf_loader(n_heads, n_kv_heads, head_dim):
    """GGUF files hold q/k in Meta's interleaved order; transformers' loader undoes llama.cpp's permute."""
    gguf = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    proc = gguf.LlamaTensorProcessor(config={"num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads})
    gen = torch.Generator().manual_seed(head_dim)
    d_model = n_heads * head_dim
    cases = [(d_model, n_heads, "blk.0.attn_q.weight"), (n_kv_heads * head_dim, n_kv_heads, "blk.0.attn_k.weight")]
    for rows, heads, name in cases:
        w = torch.randn(rows, d_model, generator=gen)
        hf = torch.from_numpy(proc.process(w.numpy(), name).weights)
        # exact on every CPU: row permutations only
        assert torch.equal(permute_qk_weight(w, heads, src="interleaved", dst="half"), hf)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 8),
    st.integers(0, 3),
    st.sampled_from(["interleaved", "half"]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_scores_identical_after_permuting_wq_wk(n_heads, half, extra, src, partial, seed):
    """q.k of a model in style src equals q'.k' with permuted W_q, W_k (and biases) in the other style."""
    dst = "half" if src == "interleaved" else "interleaved"
    head_dim = 2 * half + extra
    rotary_dim = 2 * half if (partial or extra % 2) else None
    r = head_dim if rotary_dim is None else rotary_dim
    d_model, seq = 12, 9
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(seq, d_model, generator=gen, dtype=torch.float64)
    wq, wk = (torch.randn(n_heads * head_dim, d_model, generator=gen, dtype=torch.float64) for _ in range(2))
    bq = torch.randn(n_heads * head_dim, generator=gen, dtype=torch.float64)

    def scores(wq, wk, bq, style):
        q = (x @ wq.T + bq).view(seq, n_heads, head_dim)
        k = (x @ wk.T).view(seq, n_heads, head_dim)
        q = apply_rope(q, layout="s h d", style=style, rotary_dim=r)
        k = apply_rope(k, layout="s h d", style=style, rotary_dim=r)
        return torch.einsum("mhd,nhd->hmn", q, k), torch.einsum("mhd,nhd->hmn", q.abs(), k.abs())

    ref, mag = scores(wq, wk, bq, src)
    conv = [permute_qk_weight(w, n_heads, src=src, dst=dst, rotary_dim=rotary_dim) for w in (wq, wk, bq)]
    got, _ = scores(*conv, dst)
    mismatched, _ = scores(wq, wk, bq, dst)
    # The same products summed in another order, plus the rotation's own rounding: d u sum|q||k| per score
    # (Higham's dot-product bound), with room for the rotated q and k each off by 4u relative.
    u = UNIT_ROUNDOFF[torch.float64]
    bound = (head_dim + 8) * u * mag
    assert ((got - ref).abs() <= bound).all()
    if seq > 1 and r >= 4:
        # Not vacuous: running the unpermuted weights in the other style changes the scores.
        assert not ((mismatched - ref).abs() <= bound).all()


def test_permute_qk_weight_rejects_bad_input():
    w = torch.randn(24, 8)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        permute_qk_weight(w, 5, src="interleaved", dst="half")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        permute_qk_weight(w, 0, src="interleaved", dst="half")
    with pytest.raises(ValueError, match="weight \\[out, in\\] or a bias"):
        permute_qk_weight(torch.randn(2, 12, 8), 2, src="interleaved", dst="half")
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        permute_qk_weight(torch.randn(6, 8), 2, src="interleaved", dst="half")  # head_dim 3
    with pytest.raises(ValueError, match="larger than the head dim"):
        permute_qk_weight(w, 3, src="interleaved", dst="half", rotary_dim=10)
    with pytest.raises(ValueError, match="style must be"):
        permute_qk_weight(w, 3, src="neox", dst="half")
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        interleaved_to_half(torch.randn(4, 8), rotary_dim=3)


def test_relative_position_property_in_both_styles():
    """R_m^T R_n = R_{n-m} for both styles (float64, a few ulps of the angle m*omega)."""
    inv_freq, _ = frequencies(16, 10000.0)
    m, n = torch.tensor([3.0, 1000.0, 40000.0]), torch.tensor([10.0, 1017.0, 40005.0])
    for style in ("half", "interleaved"):
        Rm, Rn = (rotation_matrix(p, inv_freq, 16, style=style) for p in (m, n))
        lhs = Rm.transpose(-1, -2) @ Rn
        rhs = rotation_matrix(n - m, inv_freq, 16, style=style)
        # cos/sin of an angle theta carry an absolute error of about u * |theta| each.
        u = UNIT_ROUNDOFF[torch.float64]
        tol = 8 * u * float(n.max()) * float(inv_freq.max()) + 4 * u
        assert (lhs - rhs).abs().max() <= tol, style


def test_packed_qkv_permutes_q_and_k_and_keeps_v():
    from ropelab.convert import permute_qkv_weight

    w = torch.randn(3 * 4 * 8, 5, dtype=torch.float64)
    out = permute_qkv_weight(w, 4, src="interleaved", dst="half")
    q, k, v = w.split(32)
    # exact on every CPU: row permutations and concatenation only
    assert torch.equal(out[:32], permute_qk_weight(q, 4, src="interleaved", dst="half"))
    assert torch.equal(out[32:64], permute_qk_weight(k, 4, src="interleaved", dst="half"))
    assert torch.equal(out[64:], v)
    assert torch.equal(permute_qkv_weight(out, 4, src="half", dst="interleaved"), w)
    with pytest.raises(ValueError, match="3 equal row blocks"):
        permute_qkv_weight(torch.zeros(10, 2), 1, src="half", dst="interleaved")
