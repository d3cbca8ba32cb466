"""ropelab.qk_norm_rope: fused QK-RMSNorm + RoPE (+ KV-cache write), every backend that runs here, against a
float64 oracle (norm then rope, every step in float64, from the same inputs).

The peers' test cases (vLLM, Liger, FlashInfer) are rewritten here, not imported: their ops need CUDA. Each
test's docstring names the peer file and function it rewrites. Bound per pair (a, b) of the output (see
:mod:`ropelab.kernels.qk_norm_rope`): ``(D/2 + 10) u_32 (|y_a| + |y_b|) + u |y_a|``, u the output dtype's unit
roundoff (twice that for bfloat16 under Triton's interpreter, which truncates), plus half a subnormal step.
Triton runs under ``TRITON_INTERPRET=1`` with tiny grids (one program per token-head row).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import ropelab
from ropelab import RopeSpec, qk_norm_rope
from ropelab.kernels import cpu_build, fused_rope
from ropelab.kernels import qk_norm_rope as qnr
from ropelab.kernels.qk_norm_rope import qk_norm_rope_oracle
from ropelab.precision import UNIT_ROUNDOFF

TRITON = fused_rope.available("cpu")
CPU_WHY = cpu_build.why_unavailable("cpu_qk_norm_rope", qnr._C_SOURCE)
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not TRITON, reason="Triton interpreter off")),
            pytest.param("cpu", marks=pytest.mark.skipif(CPU_WHY is not None, reason=f"no C kernel: {CPU_WHY}"))]


def pair_sum(a: torch.Tensor, r: int, style: str) -> torch.Tensor:
    """|y_a| + |y_b| for each element's pair (dims past r: 2|y_a|)."""
    out = 2 * a.clone()
    h = r // 2
    if style == "half":
        s = a[..., :h] + a[..., h:r]
        out[..., :h], out[..., h:r] = s, s
    else:
        s = a[..., 0:r:2] + a[..., 1:r:2]
        out[..., 0:r:2], out[..., 1:r:2] = s, s
    return out


def assert_within(y, ref, r, style, dtype, backend):
    D = ref.shape[-1]
    cdt = torch.float64 if dtype == torch.float64 else torch.float32
    u_c = UNIT_ROUNDOFF[cdt]
    u = UNIT_ROUNDOFF[dtype] if dtype != cdt else 0.0
    if dtype == torch.bfloat16 and backend == "triton":
        u *= 2  # the interpreter truncates float32 -> bfloat16 (the GPU rounds to nearest)
    a = ref.abs()
    tiny = torch.finfo(dtype).smallest_normal * UNIT_ROUNDOFF[dtype] if dtype != cdt else 0.0
    bound = (D / 2 + 10) * u_c * pair_sum(a, r, style) + u * a + tiny
    assert y.dtype == dtype
    err = (y.double() - ref).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}, max err {err.max().item():.3g}"


def cos_sin_cache(max_pos: int, r: int, base: float, dtype=torch.float32) -> torch.Tensor:
    """A vLLM-layout table [max_pos, r]: cos of the r/2 frequencies, then sin (angles in float64, one rounding)."""
    inv, _ = ropelab.frequencies(r, base)
    c, s = ropelab.cos_sin(torch.arange(max_pos), inv, dtype=dtype)
    return torch.cat([c, s], -1)


def make(T, Hq, Hkv, D, dtype, gen, jitter=0.1):
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=gen).to(dtype)
    wq = (1 + jitter * torch.randn(D, generator=gen)).to(dtype)
    wk = (1 + jitter * torch.randn(D, generator=gen)).to(dtype)
    return qkv, wq, wk


def parts(qkv, Hq, Hkv, D):
    qs, ks = Hq * D, Hkv * D
    return (qkv[:, :qs].unflatten(1, (Hq, D)), qkv[:, qs:qs + ks].unflatten(1, (Hkv, D)),
            qkv[:, qs + ks:].unflatten(1, (Hkv, D)))


def oracle_spec(x, w, eps, spec, p, D, unit_offset=False):
    inv, af = spec.frequencies(D)
    c, s = ropelab.cos_sin(p, inv, af, dtype=torch.float64)
    return qk_norm_rope_oracle(x, w, eps, c, s, spec.style, unit_offset), 2 * inv.numel()


def oracle_cache(x, w, eps, cache, p, style):
    rows = cache[p].double()
    r = cache.shape[1]
    return qk_norm_rope_oracle(x, w, eps, rows[:, :r // 2], rows[:, r // 2:], style), r


def hf_style_unfused(x, w, cos, sin, style):
    """The unfused sequence as Hugging Face runs it: Qwen3RMSNorm's roundings (normalised x rounded to x's
    dtype, times the weight in its dtype), then RoPE in x's dtype-rounded float32 (ropelab.rotate)."""
    xf = x.float()
    xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    return ropelab.rotate(xn, cos[:, None].float(), sin[:, None].float(), style=style)


# --------------------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_ratio,eps", [(1.0, 1e-5), (0.5, 1e-6), (0.25, 1e-5)])
def test_vllm_fused_qk_norm_rope_cases(backend, dtype, is_neox, rotary_ratio, eps, gen):
    """Rewrites vllm-project/vllm ``tests/kernels/core/test_fused_qk_norm_rope.py::
    test_fused_qk_norm_rope_matches_reference``: 16 q heads, 4 kv heads, head_dim 128, 4 tokens, bf16/fp16,
    neox or GPT-J pairs, eps 1e-5/1e-6, rotary_dim 128/64/32 of a cos_sin_cache [4096, r] (base 1e4),
    positions 0..3, weights around 1 (std 0.1). Against a float64 oracle instead of their bf16 reference; v
    and the input are left as they were."""
    Hq, Hkv, D, T = 16, 4, 128, 4
    qkv, wq, wk = make(T, Hq, Hkv, D, dtype, gen)
    before = qkv.clone()
    style = "half" if is_neox else "interleaved"
    r = int(D * rotary_ratio)
    cache = cos_sin_cache(4096, r, 10000.0)
    pos = torch.arange(T)
    oq, ok = qk_norm_rope(qkv, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=eps,
                          cos_sin_cache=cache, style=style, positions=pos, backend=backend)
    assert torch.equal(qkv, before)
    q, k, _ = parts(qkv, Hq, Hkv, D)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_cache(x, w, eps, cache, pos, style)
        assert_within(y, ref, r, style, dtype, backend)


# --------------------------------------------------------------------------------------------------
# Liger
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_qh,n_kh,hd", [(32, 8, 128), (16, 16, 64), (28, 4, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_liger_qk_norm_rope_correctness_cases(n_qh, n_kh, hd, dtype, gen):
    """Rewrites linkedin/Liger-Kernel ``test/transformers/test_qk_norm_rope.py::test_qk_norm_rope_correctness``
    (MHA and GQA mixes, odd sequence lengths, eps 1e-6, weights ~ N(0, 1)) and its methodology: the fused result
    must be no worse than the naive same-dtype sequence (HF's Qwen3RMSNorm roundings, then RoPE) against an exact
    reference (float64 here, their fp32 "gold"), and within ropelab's bound. Their lengths 51 and 200 become 7."""
    T = 7
    qkv, _, _ = make(T, n_qh, n_kh, hd, dtype, gen)
    wq = torch.randn(hd, generator=gen).to(dtype)
    wk = torch.randn(hd, generator=gen).to(dtype)
    spec = RopeSpec()
    pos = torch.arange(T)
    oq, ok = qk_norm_rope(qkv, num_heads=n_qh, num_kv_heads=n_kh, head_dim=hd, q_weight=wq, k_weight=wk, eps=1e-6,
                          spec=spec, positions=pos)
    inv, _ = spec.frequencies(hd)
    c, s = ropelab.cos_sin(pos, inv)
    q, k, _ = parts(qkv, n_qh, n_kh, hd)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_spec(x, w, 1e-6, spec, pos, hd)
        assert_within(y, ref, r, "half", dtype, "torch")
        if dtype != torch.float32:
            naive = hf_style_unfused(x, w, c, s, "half").to(dtype)
            assert (y.double() - ref).abs().max() <= (naive.double() - ref).abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_qh", [16, 32, 40, 64])
def test_liger_qwen3_real_configs(backend, n_qh, gen):
    """Rewrites linkedin/Liger-Kernel ``test/transformers/test_qk_norm_rope.py::test_qk_norm_rope_qwen3_real_configs``:
    Qwen3 dense shapes (16/32/40/64 q heads, 8 kv heads, head_dim 128), rms_norm_eps 1e-6, rope_theta 1e6,
    weights 1 + 0.1 N(0, 1), bf16. Their 4096/2048-token batches become 3 tokens at positions 4093..4095."""
    T, D = 3, 128
    qkv, wq, wk = make(T, n_qh, 8, D, torch.bfloat16, gen)
    spec = RopeSpec(base=1e6)
    oq, ok = qk_norm_rope(qkv, num_heads=n_qh, num_kv_heads=8, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6,
                          spec=spec, offset=4093, backend=backend)
    pos = torch.arange(T) + 4093
    q, k, _ = parts(qkv, n_qh, 8, D)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_spec(x, w, 1e-6, spec, pos, D)
        assert_within(y, ref, r, "half", torch.bfloat16, backend)


def test_hf_qwen3_parity_in_float32(gen):
    """Parity with Hugging Face's own code (imported): Qwen3RMSNorm on q and k, then apply_rotary_pos_emb with
    Qwen3RotaryEmbedding-style tables, in float32; within twice the bound (both round in float32)."""
    mq = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    T, Hq, Hkv, D = 5, 4, 2, 64
    qkv, wq, wk = make(T, Hq, Hkv, D, torch.float32, gen)
    q, k, _ = parts(qkv, Hq, Hkv, D)
    norm_q, norm_k = mq.Qwen3RMSNorm(D, eps=1e-6), mq.Qwen3RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        norm_q.weight.copy_(wq)
        norm_k.weight.copy_(wk)
        inv, _ = ropelab.frequencies(D, 1e6)
        c, s = ropelab.cos_sin(torch.arange(T), inv)
        cos, sin = torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]
        hq, hk = mq.apply_rotary_pos_emb(norm_q(q).transpose(0, 1)[None], norm_k(k).transpose(0, 1)[None], cos, sin)
    oq, ok = qk_norm_rope(qkv, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6,
                          spec=RopeSpec(base=1e6))
    for y, h, x, w in ((oq, hq, q, wq), (ok, hk, k, wk)):
        ref, r = oracle_spec(x, w, 1e-6, RopeSpec(base=1e6), torch.arange(T), D)
        hf = h[0].transpose(0, 1)
        bound = 2 * (D / 2 + 10) * UNIT_ROUNDOFF[torch.float32] * pair_sum(ref.abs(), r, "half")
        assert bool(((y.double() - hf.double()).abs() <= bound).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma_unit_offset(backend, gen):
    """``unit_offset=True`` is Gemma 3's ``x * (1 + weight)``, computed in float32 (Gemma3RMSNorm's order); the
    weight near 0 as Gemma stores it."""
    T, Hq, Hkv, D = 3, 2, 1, 32
    qkv, _, _ = make(T, Hq, Hkv, D, torch.bfloat16, gen)
    wq = (0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16)
    wk = (0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16)
    spec = RopeSpec(style="interleaved")
    oq, ok = qk_norm_rope(qkv, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6,
                          spec=spec, unit_offset=True, backend=backend)
    q, k, _ = parts(qkv, Hq, Hkv, D)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_spec(x, w, 1e-6, spec, torch.arange(T), D, unit_offset=True)
        assert_within(y, ref, r, "interleaved", torch.bfloat16, backend)


# --------------------------------------------------------------------------------------------------
# FlashInfer
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim,partial", [(64, 0.25), (128, 0.5), (256, 0.75), (64, 1.0)])
@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_flashinfer_rope_varlen_offsets(backend, head_dim, partial, style, gen):
    """Rewrites flashinfer-ai/flashinfer ``tests/attention/test_rope.py::test_rope`` and ``test_rope_pos_ids``:
    packed varlen tokens (their ``indptr`` is ``cu_seqlens``) with one offset per sequence (0, 15, 99), partial
    rotary 0.25-1.0, head_dim 64/128/256, both pair styles; the cu_seqlens + offsets call and the explicit
    position ids call agree exactly (same positions, same arithmetic), and both meet the bound. fp16 as theirs;
    their batches of up to 989 sequences become 3 of lengths 1, 4, 2."""
    dtype = torch.float16
    cu = torch.tensor([0, 1, 5, 7])
    offsets = torch.tensor([0, 15, 99])
    T, Hq, Hkv = 7, 2, 1
    qkv, wq, wk = make(T, Hq, Hkv, head_dim, dtype, gen)
    spec = RopeSpec(style=style, rotary_dim=int(head_dim * partial))
    kw = dict(num_heads=Hq, num_kv_heads=Hkv, head_dim=head_dim, q_weight=wq, k_weight=wk, eps=1e-6, spec=spec,
              backend=backend)
    a = qk_norm_rope(qkv, cu_seqlens=cu, offset=offsets, **kw)
    pos = torch.cat([torch.arange(n) + o for n, o in zip((1, 4, 2), (0, 15, 99))])
    b = qk_norm_rope(qkv, positions=pos, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    q, k, _ = parts(qkv, Hq, Hkv, head_dim)
    for x, w, y in ((q, wq, a[0]), (k, wk, a[1])):
        ref, r = oracle_spec(x, w, 1e-6, spec, pos, head_dim)
        assert_within(y, ref, r, style, dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "head_size,rotary_dim,max_pos,base,is_neox,seq_len,n_q,n_kv",
    [(64, 64, 32, 8000, True, 32, 1, 1), (256, 128, 4096, 10000, True, 5, 4, 2), (64, 32, 2048, 8432, True, 7, 4, 1),
     (64, 64, 32, 8000, False, 32, 1, 1), (192, 128, 4096, 9231, True, 3, 3, 2), (80, 64, 1024, 10000, False, 4, 2, 2),
     (112, 64, 2048, 12000, True, 5, 2, 1), (160, 96, 8192, 10000, False, 3, 6, 3)],
)
def test_flashinfer_cos_sin_cache_cases(backend, head_size, rotary_dim, max_pos, base, is_neox, seq_len, n_q, n_kv,
                                        gen):
    """Rewrites flashinfer-ai/flashinfer ``tests/attention/test_rope.py::test_rope_cos_sin_cache``'s parameter table
    (head sizes 64-256, not powers of two among them: 80, 112, 160, 192; rotary_dim < head_size; bases 8000-12000;
    neox and GPT-J; a vLLM cos_sin_cache of max_position rows), bf16, with the qk-norm in front. Their batch of
    sequences becomes one; positions are the last ``seq_len`` rows of the cache where it is short (max_pos 32)."""
    dtype = torch.bfloat16
    T = seq_len
    qkv, wq, wk = make(T, n_q, n_kv, head_size, dtype, gen)
    cache = cos_sin_cache(max_pos, rotary_dim, float(base))
    pos = torch.arange(max_pos - T, max_pos)
    style = "half" if is_neox else "interleaved"
    oq, ok = qk_norm_rope(qkv, num_heads=n_q, num_kv_heads=n_kv, head_dim=head_size, q_weight=wq, k_weight=wk,
                          eps=1e-6, cos_sin_cache=cache, style=style, positions=pos, backend=backend)
    q, k, _ = parts(qkv, n_q, n_kv, head_size)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_cache(x, w, 1e-6, cache, pos, style)
        assert_within(y, ref, r, style, dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_existing,num_new,page_size", [(10, 1, 16), (50, 8, 16), (10, 8, 32)])
def test_flashinfer_append_paged_kv_cache_decode(backend, num_existing, num_new, page_size, gen):
    """Rewrites flashinfer-ai/flashinfer ``tests/attention/test_rope.py::
    test_rope_quantize_fp8_append_paged_kv_cache_decode``
    (GQA 32/8 heads become 4/2, head_dim 64 + 64 unrotated, NHD pages of 16 or 32, a prefill of 10 or 50 tokens,
    then 1 or 8 appended at positions num_existing...), without the fp8 quantisation (ropelab's cache keeps
    the input dtype): the prefill and the append go through the op with a block table whose pages are shuffled;
    afterwards every written slot holds exactly the op's returned k (and v as given), every other cache entry is
    exactly what it was (NaN-filled), and the appended k meets the float64 bound."""
    dtype, Hq, Hkv, D, r = torch.bfloat16, 4, 2, 128, 64
    total = num_existing + num_new
    n_pages = -(-total // page_size) + 2
    kc = torch.full((n_pages, page_size, Hkv, D), float("nan"), dtype=dtype)
    vc = kc.clone()
    perm = torch.randperm(n_pages, generator=gen)
    block_table = perm[None, :]
    spec = RopeSpec(rotary_dim=r)
    kw = dict(num_heads=Hq, num_kv_heads=Hkv, head_dim=D, spec=spec, eps=1e-6, kv_cache=(kc, vc),
              block_table=block_table, backend=backend)
    pre, wq, wk = make(num_existing, Hq, Hkv, D, dtype, gen)
    qk_norm_rope(pre, q_weight=wq, k_weight=wk, **kw)
    k_before, v_before = kc.clone(), vc.clone()
    new, _, _ = make(num_new, Hq, Hkv, D, dtype, gen)
    oq, ok = qk_norm_rope(new, q_weight=wq, k_weight=wk, offset=num_existing, **kw)
    pos = torch.arange(num_existing, total)
    slots = perm[pos // page_size] * page_size + pos % page_size
    kf, vf = kc.view(-1, Hkv, D), vc.view(-1, Hkv, D)
    _, k_new, v_new = parts(new, Hq, Hkv, D)
    assert torch.equal(kf[slots], ok) and torch.equal(vf[slots], v_new)
    untouched = torch.ones(kf.shape[0], dtype=torch.bool)
    untouched[slots] = False
    for now, then in ((kf, k_before.view(-1, Hkv, D)), (vf, v_before.view(-1, Hkv, D))):
        assert torch.equal(now[untouched].isnan(), then[untouched].isnan())
        assert torch.equal(now[untouched].nan_to_num(), then[untouched].nan_to_num())
    written_before = torch.zeros(kf.shape[0], dtype=torch.bool)
    p0 = torch.arange(num_existing)
    written_before[perm[p0 // page_size] * page_size + p0 % page_size] = True
    assert not bool(kf[written_before | ~untouched].isnan().any())  # the prefill's slots were written too
    ref, r = oracle_spec(k_new, wk, 1e-6, spec, pos, D)
    assert_within(ok, ref, r, "half", dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_slot_mapping_with_padding_and_contiguous_cache(backend, gen):
    """vLLM's slot_mapping (``block * block_size + offset``, ``-1`` for a padding token that must not be written),
    and a contiguous [n_seq, max_len, Hkv, D] cache addressed by sequence and position (varlen, per-sequence
    offsets: a decode step after prompts of 3, 0 and 5 tokens)."""
    dtype, Hq, Hkv, D = torch.float16, 2, 1, 32
    qkv, wq, wk = make(4, Hq, Hkv, D, dtype, gen)
    kc = torch.zeros(3, 4, Hkv, D, dtype=dtype)
    vc = torch.zeros_like(kc)
    kw = dict(num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6, spec=RopeSpec(),
              backend=backend)
    slots = torch.tensor([5, -1, 0, 11])
    oq, ok = qk_norm_rope(qkv, positions=torch.tensor([1, 2, 0, 3]), kv_cache=(kc, vc), slot_mapping=slots, **kw)
    kf, vf = kc.view(-1, Hkv, D), vc.view(-1, Hkv, D)
    _, _, v = parts(qkv, Hq, Hkv, D)
    keep = slots >= 0
    assert torch.equal(kf[slots[keep]], ok[keep]) and torch.equal(vf[slots[keep]], v[keep])
    rest = torch.ones(12, dtype=torch.bool)
    rest[slots[keep]] = False
    assert not kf[rest].any() and not vf[rest].any()
    # contiguous cache: 3 sequences of max_len 8, one new token each at positions 3, 0, 5
    kc2 = torch.zeros(3, 8, Hkv, D, dtype=dtype)
    vc2 = torch.zeros_like(kc2)
    dec, _, _ = make(3, Hq, Hkv, D, dtype, gen)
    oq2, ok2 = qk_norm_rope(dec, cu_seqlens=torch.tensor([0, 1, 2, 3]), offset=torch.tensor([3, 0, 5]),
                            kv_cache=(kc2, vc2), **kw)
    for i, p in enumerate((3, 0, 5)):
        assert torch.equal(kc2[i, p], ok2[i])
    assert int((kc2.abs().sum((-1, -2)) > 0).sum()) == 3


def test_compile_backend(gen):
    """backend="compile" (torch.compile of the formula, Inductor's C++) against the oracle: bf16, GPT-J pairs,
    partial rotary, a paged cache write (one configuration: the first compile takes ~20 s on 2 cores)."""
    T, Hq, Hkv, D = 4, 2, 1, 64
    for dtype, style in ((torch.bfloat16, "interleaved"),):
        qkv, wq, wk = make(T, Hq, Hkv, D, dtype, gen)
        kc = torch.zeros(2, 4, Hkv, D, dtype=dtype)
        vc = torch.zeros_like(kc)
        spec = RopeSpec(style=style, rotary_dim=48)
        oq, ok = qk_norm_rope(qkv, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6,
                              spec=spec, offset=2, kv_cache=(kc, vc), slot_mapping=torch.tensor([7, 1, 2, 3]),
                              backend="compile")
        q, k, _ = parts(qkv, Hq, Hkv, D)
        for x, w, y in ((q, wq, oq), (k, wk, ok)):
            ref, r = oracle_spec(x, w, 1e-6, spec, torch.arange(T) + 2, D)
            assert_within(y, ref, r, style, dtype, "compile")
        assert torch.equal(kc.view(-1, Hkv, D)[torch.tensor([7, 1, 2, 3])], ok)


@pytest.mark.parametrize("backend", BACKENDS[:2])
def test_float64_and_separate_q_k_v(backend, gen):
    """float64 q, k given apart ([T, H*D] strided slices and [T, H, D]), computed in float64: within the float64
    bound of the oracle."""
    T, Hq, Hkv, D = 3, 2, 2, 16
    qkv, wq, wk = make(T, Hq, Hkv, D, torch.float64, gen)
    q, k, v = parts(qkv, Hq, Hkv, D)
    spec = RopeSpec(rotary_dim=8)
    oq, ok = qk_norm_rope(q=qkv[:, :Hq * D], k=k, v=v, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq,
                          k_weight=wk, eps=1e-5, spec=spec, backend=backend)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_spec(x, w, 1e-5, spec, torch.arange(T), D)
        assert_within(y, ref, r, "half", torch.float64, backend)


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def _base(**over):
    T, Hq, Hkv, D = 4, 2, 1, 16
    kw = dict(qkv=torch.randn(T, (Hq + 2 * Hkv) * D), num_heads=Hq, num_kv_heads=Hkv, head_dim=D,
              q_weight=torch.ones(D), k_weight=torch.ones(D), eps=1e-6, spec=RopeSpec())
    kw.update(over)
    qkv = kw.pop("qkv")
    return (qkv,), kw


def _cache(n=2, bs=4):
    return (torch.zeros(n, bs, 1, 16), torch.zeros(n, bs, 1, 16))


@pytest.mark.parametrize("over,match", [
    (dict(eps=0.0), "eps must be a positive"),
    (dict(eps=-1e-6), "eps must be a positive"),
    (dict(eps=float("nan")), "eps must be a positive"),
    (dict(q_weight=torch.ones(8)), r"q_weight has shape \(8,\)"),
    (dict(k_weight=torch.ones(2, 16)), "k_weight has shape"),
    (dict(qkv=torch.randn(4, 60)), "qkv has 60 columns"),
    (dict(qkv=torch.randn(4, 64).to(torch.int32)), "floating-point"),
    (dict(num_heads=0), "num_heads must be a positive int"),
    (dict(head_dim=15, qkv=torch.randn(4, 60), q_weight=torch.ones(15), k_weight=torch.ones(15)), "even"),
    (dict(spec=None), "exactly one of the two"),
    (dict(cos_sin_cache=torch.randn(8, 16)), "exactly one of the two"),
    (dict(spec=None, cos_sin_cache=torch.randn(8, 15)), "must be even"),
    (dict(spec=None, cos_sin_cache=torch.randn(3, 16)), "positions .* span"),
    (dict(spec=None, cos_sin_cache=torch.randn(8, 16), positions=torch.tensor([0.0, 1, 2, 3])), "integers"),
    (dict(spec=RopeSpec(), style="half"), "leave style= unset"),
    (dict(positions=torch.arange(3)), "one entry per token"),
    (dict(positions=torch.arange(4), cu_seqlens=torch.tensor([0, 4])), "not both"),
    (dict(offset=torch.tensor([1, 2])), "offset of shape"),
    (dict(cu_seqlens=torch.tensor([0, 3])), "must end at the token count"),
    (dict(backend="cuda"), "backend must be one of"),
    (dict(slot_mapping=torch.arange(4)), "pass kv_cache"),
    (dict(kv_cache=_cache(), slot_mapping=torch.tensor([0, 1, 2, 8])), r"slots span \[0, 8\]"),
    (dict(kv_cache=_cache(), slot_mapping=torch.tensor([0, 1, -2, 3])), "-1 alone"),
    (dict(kv_cache=_cache(), slot_mapping=torch.tensor([0, 1, 1, 3])), "same cache slot"),
    (dict(kv_cache=_cache(), slot_mapping=torch.arange(3)), r"slot_mapping must be an integer tensor \[tokens\]"),
    (dict(kv_cache=_cache(), slot_mapping=torch.arange(4), block_table=torch.zeros(1, 2)), "not both"),
    (dict(kv_cache=_cache(bs=2)), "does not fit a contiguous cache"),
    (dict(kv_cache=_cache(n=4, bs=2), block_table=torch.tensor([[0]])), "no entry for sequence"),
    (dict(kv_cache=(torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, 2, 16))), "k_cache must be"),
    (dict(kv_cache=(torch.zeros(2, 4, 1, 16), torch.zeros(2, 4, 1, 16, dtype=torch.float16))), "v_cache must have"),
    (dict(kv_cache=(torch.zeros(4, 2, 1, 16).transpose(0, 1), torch.zeros(2, 4, 1, 16))), "strides"),
    (dict(kv_cache=torch.zeros(2, 4, 1, 16)), "must be a pair"),
    (dict(spec=RopeSpec.nope()), "without RoPE"),
    (dict(angle_dtype=torch.float16), "angle_dtype"),
    (dict(qkv=torch.randn(4, 64, dtype=torch.float64), backend="cpu"), "backend='cpu' takes float32"),
])
def test_bad_input_raises_a_clear_error(over, match):
    args, kw = _base(**over)
    with pytest.raises(ValueError, match=match):
        qk_norm_rope(*args, **kw)


def test_bad_separate_inputs():
    D = 16
    w = torch.ones(D)
    kw = dict(num_heads=2, num_kv_heads=1, head_dim=D, q_weight=w, k_weight=w, eps=1e-6, spec=RopeSpec())
    with pytest.raises(ValueError, match="not both"):
        qk_norm_rope(torch.randn(4, 64), q=torch.randn(4, 32), **kw)
    with pytest.raises(ValueError, match="both q and k"):
        qk_norm_rope(q=torch.randn(4, 32), **kw)
    with pytest.raises(ValueError, match="k has 3 tokens"):
        qk_norm_rope(q=torch.randn(4, 32), k=torch.randn(3, 16), **kw)
    with pytest.raises(ValueError, match="share q's dtype"):
        qk_norm_rope(q=torch.randn(4, 32), k=torch.randn(4, 16).half(), **kw)
    with pytest.raises(ValueError, match="needs v"):
        qk_norm_rope(q=torch.randn(4, 32), k=torch.randn(4, 16), kv_cache=_cache(), **kw)


@pytest.mark.skipif(CPU_WHY is not None, reason="no C kernel")
def test_cpu_kernel_threads_and_strided_input(gen):
    """The C kernel on enough rows to split them over OpenMP threads (2 here), from a transposed-then-sliced q whose
    last dim is not contiguous (copied once by the wrapper), with a paged cache: within the oracle's bound."""
    T, Hq, Hkv, D = 256, 8, 2, 128
    torch.set_num_threads(2)
    qkv, wq, wk = make(T, Hq, Hkv, D, torch.bfloat16, gen)
    q, k, v = parts(qkv, Hq, Hkv, D)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, last-dim stride Hq
    kc = torch.zeros(T // 16 + 1, 16, Hkv, D, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    spec = RopeSpec(base=1e6)
    oq, ok = qk_norm_rope(q=q_strided, k=k, v=v, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq,
                          k_weight=wk, eps=1e-6, spec=spec, kv_cache=(kc, vc), slot_mapping=torch.arange(T) + 16,
                          backend="cpu")
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        ref, r = oracle_spec(x, w, 1e-6, spec, torch.arange(T), D)
        assert_within(y, ref, r, "half", torch.bfloat16, "cpu")
    assert torch.equal(kc.view(-1, Hkv, D)[16:], ok) and torch.equal(vc.view(-1, Hkv, D)[16:], v)
    assert not kc[0].any() and not vc[0].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_qk_rms_norm_alone(backend, gen):
    """qk_rms_norm: the same kernels with rotary dim 0 and no cache (the benchmark's own-norm reference) against
    the float64 norm; every dim is then a pass-through, so the bound is (D/2 + 10) u_32 2|y| + u |y|."""
    from ropelab.kernels.qk_norm_rope import qk_rms_norm

    T, Hq, Hkv, D = 3, 2, 1, 64
    qkv, wq, wk = make(T, Hq, Hkv, D, torch.bfloat16, gen)
    q, k, _ = parts(qkv, Hq, Hkv, D)
    oq, ok = qk_rms_norm(q, k, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6,
                         backend=backend)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        x64 = x.double()
        ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert_within(y, ref, 0, "half", torch.bfloat16, backend)


_AOT = r"""
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ropelab.kernels import qk_norm_rope_triton as kt
fn = kt.qk_norm_rope_kernel
tables, ids = ("COS", "SIN"), ("POS_IDX", "SLOT")
ptrs = ("Q", "K", "V", "WQ", "WK", "OQ", "OK", "KC", "VC") + tables + ids
for elem, cdt, interleaved, cache in (("bf16", tl.float32, False, True), ("fp16", tl.float32, True, False),
                                      ("fp64", tl.float64, False, True)):
    consts = {"BLOCK_D": 128, "INTERLEAVED": interleaved, "HAS_CACHE": cache, "CDT": cdt, "sqd": 1, "skd": 1,
              "svd": 1}
    sig = {}
    for n in fn.arg_names:
        if n in consts:
            sig[n] = "constexpr"
        elif n in ptrs:
            sig[n] = ("*fp64" if elem == "fp64" else "*fp32") if n in tables else "*i64" if n in ids else "*" + elem
        else:
            sig[n] = "fp32" if n in ("eps", "w_offset") else "i64"
    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    assert "cubin" in ck.asm, list(ck.asm)
print("ok")
"""


def test_triton_kernel_compiles_for_an_sm90_gpu_without_one():
    """The Triton program compiled ahead of time for sm_90 (H100/H200) by Triton's real compiler (not the
    interpreter), to a cubin: bf16 with a cache, fp16 GPT-J pairs without one, float64. Catches what the CPU
    interpreter accepts and the GPU compiler refuses (e.g. branches yielding values of different types)."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.backends.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0 and ("ptxas" in proc.stderr or "No such file" in proc.stderr):
        pytest.skip(f"Triton's CUDA toolchain (ptxas) is not usable here: {proc.stderr[-300:]}")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_angles(backend, gen):
    """angle_dtype=torch.float32 forms the angles as Hugging Face does (float32 position x float32 inv_freq): the
    result meets the bound of an oracle given those same float32-angle tables (in float64 from there on)."""
    T, Hq, Hkv, D = 3, 2, 1, 32
    qkv, wq, wk = make(T, Hq, Hkv, D, torch.float32, gen)
    spec = RopeSpec(base=1e6)
    pos = torch.arange(T) + 70000
    oq, ok = qk_norm_rope(qkv, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=wq, k_weight=wk, eps=1e-6,
                          spec=spec, positions=pos, angle_dtype=torch.float32, backend=backend)
    inv, af = spec.frequencies(D)
    c32, s32 = ropelab.cos_sin(pos, inv, af, dtype=torch.float64, angle_dtype=torch.float32)
    q, k, _ = parts(qkv, Hq, Hkv, D)
    for x, w, y in ((q, wq, oq), (k, wk, ok)):
        assert_within(y, qk_norm_rope_oracle(x, w, 1e-6, c32, s32, "half"), D, "half", torch.float32, backend)
