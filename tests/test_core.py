"""apply_rope against the float64 oracles, across styles, layouts, partial rotary dims and dtypes."""

from __future__ import annotations

import pytest
import torch
from _helpers import UNIT_ROUNDOFF, assert_rotations_agree, rope_error_bound

import ropelab
from ropelab import apply_rope, frequencies, reference_complex, reference_matrix, rotation_matrix
from ropelab.spec import RopeSpec

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
STYLES = ["half", "interleaved"]


def oracle_bshd(x, positions, style, rotary_dim=None, base=10000.0):
    """The float64 complex-form oracle on a [b, s, h, d] tensor (positions along s)."""
    inv_freq, _ = frequencies(x.shape[-1], base, rotary_dim=rotary_dim)
    return reference_complex(x.double().transpose(1, 2), positions, inv_freq, style=style).transpose(1, 2)


@pytest.mark.parametrize("style", STYLES)
def test_oracles_agree(style, gen):
    """Meta's complex form and the explicit block-diagonal matrix are the same rotation."""
    x = torch.randn(3, 11, 16, generator=gen, dtype=torch.float64)
    inv_freq, _ = frequencies(16, 500.0, rotary_dim=12)
    pos = torch.arange(11) * 37
    a = reference_complex(x, pos, inv_freq, style=style)
    b = reference_matrix(x, pos, inv_freq, style=style)
    assert (a - b).abs().max() < 1e-12
    R = rotation_matrix(pos, inv_freq, 16, style=style)
    eye = torch.eye(16, dtype=torch.float64).expand_as(R)
    assert (R @ R.transpose(-1, -2) - eye).abs().max() < 1e-12  # orthogonal
    # exact on every CPU: cos(0) = 1 and sin(0) = 0 exactly in any libm, written into an identity
    assert torch.equal(R[0], torch.eye(16, dtype=torch.float64))  # position 0 is the identity
    assert torch.equal(x[..., 12:], a[..., 12:])  # dims past rotary_dim untouched: a copy, exact


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("rotary_dim", [None, 24])
def test_matches_oracle_up_to_8192(dtype, style, rotary_dim, gen):
    """Positions up to 8192, every dtype, within the bound derived from the dtype's rounding."""
    b, s, h, d = 2, 64, 3, 32
    x = torch.randn(b, s, h, d, generator=gen).to(dtype)
    positions = torch.linspace(0, 8192, s).round().long()
    y = apply_rope(x, positions, layout="b s h d", style=style, rotary_dim=rotary_dim)
    assert y.dtype == dtype and y.shape == x.shape
    ref = oracle_bshd(x, positions, style, rotary_dim)
    err = (y.double() - ref).abs()
    bound = rope_error_bound(x.double(), ref, rotary_dim or d, style, dtype)
    assert bool((err <= bound).all()), f"max err {err.max():.3g}, worst ratio {(err / bound).max():.3g}"
    if dtype == torch.float32:  # the headline figure: within 1e-6 relative
        assert float(err.max() / ref.abs().max()) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_error_is_one_rounding(dtype, gen):
    """16-bit inputs are computed in float32 and rounded once: the error is about u |y|, not m * u."""
    x = torch.randn(1, 256, 1, 64, generator=gen).to(dtype)
    pos = torch.arange(8192 - 256, 8192)
    y = apply_rope(x, pos, layout="b s h d")
    ref = oracle_bshd(x, pos, "half")
    rel = ((y.double() - ref).abs() / ref.abs().clamp_min(1e-3)).max()
    assert rel <= UNIT_ROUNDOFF[dtype] * 1.01


LAYOUTS = ["b s h d", "b h s d", "s h d", "h s d", "s b h d", "b s d", "d s", "b d s h"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("style", STYLES)
def test_every_layout_equals_bshd(layout, style, gen):
    """Naming the axes is all it takes: any layout gives the 'b s h d' result (to rounding: other strides
    may take other vectorised or scalar loops)."""
    sizes = {"b": 2, "s": 7, "h": 3, "d": 16}
    canon = torch.randn(2, 7, 3, 16, generator=gen, dtype=torch.float64)
    ref = apply_rope(canon, layout="b s h d", style=style, rotary_dim=12)
    axes = layout.split()
    # Build x in `layout` from the canonical tensor (dropping b / h axes the layout lacks).
    c = canon
    keep = [a for a in "bshd" if a in axes]
    c = canon[tuple(slice(None) if a in axes else 0 for a in "bshd")]
    x = c.permute([keep.index(a) for a in axes]).contiguous()
    assert list(x.shape) == [sizes[a] for a in axes]
    y = apply_rope(x, layout=layout, style=style, rotary_dim=12)
    r = ref[tuple(slice(None) if a in axes else 0 for a in "bshd")].permute([keep.index(a) for a in axes])
    d = axes.index("d")
    assert_rotations_agree(y.movedim(d, -1), r.movedim(d, -1), x.movedim(d, -1), 12, style)


def test_positions_per_batch_and_offset(gen):
    x = torch.randn(3, 5, 2, 8, generator=gen, dtype=torch.float64)
    rows = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14], [7, 3, 9, 0, 2]])
    y = apply_rope(x, rows, layout="b s h d")
    # other shapes, other tables' shapes: the same rotation to rounding (cos/sin of a [3, 5] and of a [5]
    # tensor may go through vectorised and scalar libm paths for the same element)
    for i in range(3):
        assert_rotations_agree(y[i], apply_rope(x[i], rows[i], layout="s h d"), x[i], 8, "half")
    # offset: a KV-cache step shifts every position
    assert_rotations_agree(apply_rope(x, layout="b s h d", offset=10)[1], y[1], x[1], 8, "half")
    per_batch = apply_rope(x, layout="b s h d", offset=torch.tensor([0, 10, 20]))
    assert_rotations_agree(per_batch[2], apply_rope(x[2], layout="s h d", offset=20), x[2], 8, "half")


def test_varlen_equals_padded(gen):
    """Packed 't h d' with cu_seqlens equals the padded 'b s h d' result position by position."""
    lengths = [5, 0, 9, 1, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    h, d, s = 2, 16, max(lengths)
    padded = torch.randn(len(lengths), s, h, d, generator=gen)
    packed = torch.cat([padded[i, :n] for i, n in enumerate(lengths)])
    for style in STYLES:
        y_pad = apply_rope(padded, layout="b s h d", style=style)
        y_pack = apply_rope(packed, layout="t h d", cu_seqlens=cu, style=style)
        for i, n in enumerate(lengths):
            assert_rotations_agree(y_pack[cu[i] : cu[i + 1]], y_pad[i, :n], padded[i, :n], 16, style)
    # positions restart at each boundary
    assert ropelab.varlen_positions(cu.long()).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 1, 2]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "linear", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 64}],
)
def test_scores_depend_only_on_relative_position(style, scaling, gen):
    """<R_m q, R_n k> = <q, R_{n-m} k>: shifting both positions by c leaves every score unchanged."""
    q = torch.randn(1, 16, 1, 32, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 16, 1, 32, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 1000, (16,), generator=gen)

    def scores(shift):
        kw = dict(layout="b s h d", style=style, rope_scaling=scaling, max_position_embeddings=64)
        qr, kr = apply_rope(q, pos + shift, **kw), apply_rope(k, pos + shift, **kw)
        return torch.einsum("bihd,bjhd->bhij", qr, kr)

    base = scores(0)
    for c in (1, 17, 5000):
        assert (scores(c) - base).abs().max() < 1e-9 * base.abs().max()


def test_attention_factor_scales_norm(gen):
    """YaRN's attention factor multiplies cos and sin: the norm of each rotated pair scales by it."""
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128}
    _, af = frequencies(64, rope_scaling=scaling)
    assert af == pytest.approx(0.1 * torch.log(torch.tensor(8.0)).item() + 1)
    x = torch.randn(4, 10, 64, generator=gen, dtype=torch.float64)
    y = apply_rope(x, layout="h s d", rope_scaling=scaling)
    assert torch.allclose(y.norm(dim=-1), af * x.norm(dim=-1), rtol=1e-12)


def test_gradients_flow(gen):
    """The training path is differentiable and equals the in-place inference path."""
    x = torch.randn(2, 6, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    y = apply_rope(x, layout="b s h d", style="interleaved", rotary_dim=6)
    with torch.no_grad():
        y_nograd = apply_rope(x, layout="b s h d", style="interleaved", rotary_dim=6)
    assert torch.allclose(y, y_nograd, atol=1e-15)
    assert torch.autograd.gradcheck(
        lambda t: apply_rope(t, layout="b s h d", style="interleaved", rotary_dim=6), (x,)
    )


def test_length_dependent_scaling_uses_max_position():
    """dynamic NTK in a full forward uses L = max(position) + 1, as Hugging Face does."""
    x = torch.randn(1, 300, 1, 16, dtype=torch.float64)
    sc = {"rope_type": "dynamic", "factor": 2.0}
    y = apply_rope(x, layout="b s h d", rope_scaling=sc, max_position_embeddings=100)
    y_explicit = apply_rope(x, layout="b s h d", rope_scaling=sc, max_position_embeddings=100, seq_len=300)
    # exact on every CPU: the same frequencies and the same [300] positions, so the same ops on the same input
    assert torch.equal(y, y_explicit)
    y_short = apply_rope(x, layout="b s h d", rope_scaling=sc, max_position_embeddings=100, seq_len=100)
    assert not torch.allclose(y, y_short)
    # exact: at L <= L0 dynamic NTK returns the default ladder (test_scaling), then the same ops on the same input
    assert torch.equal(y_short, apply_rope(x, layout="b s h d"))  # at L <= L0 dynamic is the default


# --------------------------------------------------------------------------------------------------
# apply_rope(..., spec=...): one RopeSpec instead of the keywords
# --------------------------------------------------------------------------------------------------

SPECS = [
    RopeSpec(),
    RopeSpec(style="interleaved", base=500.0, rotary_dim=12),
    RopeSpec(base=1e6, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
    RopeSpec(scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=8),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.style}-{s.rope_type}")
def test_spec_is_its_keywords(spec, gen):
    """apply_rope(x, spec=spec) is the rotation its keywords give, and matches the float64 oracle."""
    x = torch.randn(2, 20, 3, 16, generator=gen)
    y = apply_rope(x, layout="b s h d", spec=spec)
    kw = dict(style=spec.style, base=spec.base, rotary_dim=spec.rotary_dim,
              max_position_embeddings=spec.max_position_embeddings,
              rope_scaling=None if spec.scaling is None else dict(spec.scaling))
    assert torch.equal(y, apply_rope(x, layout="b s h d", **kw))  # the same ops on the same numbers
    inv, af = spec.frequencies(16, seq_len=20)
    ref = reference_complex(x.double().transpose(1, 2), torch.arange(20), inv, style=spec.style,
                            attention_factor=af).transpose(1, 2)
    bound = rope_error_bound(x.double(), ref, spec.rotary_dim or 16, spec.style, torch.float32) * max(af, 1.0)
    assert bool(((y.double() - ref).abs() <= bound).all())


def test_keywords_read_a_rope_dict_as_frequencies_does(gen):
    """A v5 rope dict in rope_scaling: its rope_theta is the base, its partial_rotary_factor the rotary dim."""
    x = torch.randn(1, 10, 2, 32, generator=gen, dtype=torch.float64)
    params = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5, "partial_rotary_factor": 0.5}
    spec = RopeSpec.from_keywords(32, rope_scaling=params)
    assert (spec.base, spec.rotary_dim, dict(spec.scaling)) == (5e5, 16, {"rope_type": "linear", "factor": 2.0})
    inv, _ = frequencies(32, rope_scaling=params)
    ref = reference_complex(x.transpose(1, 2), torch.arange(10), inv).transpose(1, 2)
    assert (apply_rope(x, layout="b s h d", rope_scaling=params) - ref).abs().max() < 1e-12
    assert (apply_rope(x, layout="b s h d", spec=spec) - ref).abs().max() < 1e-12
    # proportional keeps the factor in the dict (exponents over the full head dim)
    prop = RopeSpec.from_keywords(32, rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert prop.rotary_dim is None and prop.scaling["partial_rotary_factor"] == 0.25


@pytest.mark.parametrize("keyword", [dict(style="interleaved"), dict(base=500.0), dict(rotary_dim=8),
                                     dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
                                     dict(max_position_embeddings=64)])
def test_spec_and_keywords_both_given_raise(keyword):
    with pytest.raises(ValueError, match="either as spec= or as keywords"):
        apply_rope(torch.randn(1, 4, 2, 16), layout="b s h d", spec=RopeSpec(), **keyword)


def test_spec_must_be_a_rope_spec():
    with pytest.raises(ValueError, match="spec must be a ropelab.RopeSpec"):
        apply_rope(torch.randn(1, 4, 2, 16), layout="b s h d", spec={"style": "half"})


def test_core_apply_rope_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="ropelab.core.apply_rope moved"):
        from ropelab.core import apply_rope as old
    assert old is apply_rope


# --------------------------------------------------------------------------------------------------
# Per-sequence offsets with cu_seqlens (flash-attn's seqlen_offsets): packed decoding, chunked prefill
# --------------------------------------------------------------------------------------------------

LENGTHS, OFFSETS = [3, 0, 5, 1], [4, 9, 0, 100]


def packed_oracle(x, lengths, offsets, style, rotary_dim=None):
    """float64: sequence i's tokens at positions offsets[i], offsets[i] + 1, ..."""
    pos = torch.cat([torch.arange(n) + o for n, o in zip(lengths, offsets)])
    inv, _ = frequencies(x.shape[-1], rotary_dim=rotary_dim)
    return reference_complex(x.double().transpose(0, 1), pos, inv, style=style).transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", STYLES)
def test_per_sequence_offsets_with_cu_seqlens(dtype, style, gen):
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(sum(LENGTHS), 2, 16, generator=gen).to(dtype)
    y = apply_rope(x, layout="t h d", style=style, rotary_dim=12, cu_seqlens=cu, offset=torch.tensor(OFFSETS))
    ref = packed_oracle(x, LENGTHS, OFFSETS, style, 12)
    bound = rope_error_bound(x.double(), ref, 12, style, dtype)
    assert y.dtype == dtype and bool(((y.double() - ref).abs() <= bound).all())
    # the same as the padded batch with one offset per row
    if dtype == torch.float64:
        padded = torch.zeros(len(LENGTHS), max(LENGTHS), 2, 16, dtype=dtype)
        for i, n in enumerate(LENGTHS):
            padded[i, :n] = x[cu[i]:cu[i + 1]]
        y_pad = apply_rope(padded, layout="b s h d", style=style, rotary_dim=12, offset=torch.tensor(OFFSETS))
        for i, n in enumerate(LENGTHS):
            assert torch.equal(y[cu[i]:cu[i + 1]], y_pad[i, :n])


@pytest.mark.parametrize("offset, match", [
    (torch.tensor([1, 2, 3]), "offset has 3 entries but cu_seqlens delimits 4 sequences"),
    (torch.tensor([1, 2, 3, 4, 5]), "offset has 5 entries"),
    (torch.tensor([True, False, True, False]), "offset must be integer or float"),
    (torch.tensor([1.0, float("nan"), 0.0, 2.0]), "offset holds NaN"),
    (torch.ones(4, 1, dtype=torch.long), "offset must be an int or a 1-D tensor"),
])
def test_bad_per_sequence_offsets_name_the_argument(offset, match):
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    with pytest.raises(ValueError, match=match):
        apply_rope(torch.randn(sum(LENGTHS), 2, 16), layout="t h d", cu_seqlens=cu, offset=offset)
