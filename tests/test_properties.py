"""Property-based tests (hypothesis) over shapes, layouts, styles, rotary dims and dtypes."""

from __future__ import annotations

import torch
from _helpers import rope_error_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from ropelab import apply_rope, frequencies, reference_complex

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


@st.composite
def cases(draw):
    axes = draw(st.permutations(["b", "s", "h", "d"]))
    keep = draw(st.lists(st.sampled_from(["b", "h"]), unique=True))
    axes = [a for a in axes if a in ("s", "d") or a in keep]
    half = draw(st.integers(1, 8))
    d = 2 * half + draw(st.integers(0, 3))
    sizes = {"b": draw(st.integers(1, 3)), "s": draw(st.integers(1, 9)), "h": draw(st.integers(1, 3)), "d": d}
    rotary_dim = 2 * draw(st.integers(1, d // 2))
    return dict(
        axes=axes,
        sizes=sizes,
        rotary_dim=rotary_dim,
        style=draw(st.sampled_from(["half", "interleaved"])),
        dtype=draw(st.sampled_from(DTYPES)),
        base=draw(st.sampled_from([100.0, 10000.0, 1e6])),
        start=draw(st.integers(0, 8000)),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None)
@given(cases())
def test_any_layout_matches_the_oracle(c):
    axes, sizes = c["axes"], c["sizes"]
    gen = torch.Generator().manual_seed(c["seed"])
    x = torch.randn([sizes[a] for a in axes], generator=gen).to(c["dtype"])
    positions = torch.arange(sizes["s"]) + c["start"]
    y = apply_rope(x, positions, layout=" ".join(axes), style=c["style"], rotary_dim=c["rotary_dim"], base=c["base"])
    assert y.shape == x.shape and y.dtype == x.dtype
    # Oracle on the same values, moved to [..., s, d]
    order = [i for i, a in enumerate(axes) if a not in ("s", "d")] + [axes.index("s"), axes.index("d")]
    xm = x.double().permute(order)
    inv, _ = frequencies(sizes["d"], c["base"], rotary_dim=c["rotary_dim"])
    ref = reference_complex(xm, positions, inv, style=c["style"])
    err = (y.double().permute(order) - ref).abs()
    bound = rope_error_bound(xm, ref, c["rotary_dim"], c["style"], c["dtype"])
    assert bool((err <= bound).all())


@settings(max_examples=40, deadline=None)
@given(cases())
def test_rotation_is_undone_by_negative_positions(c):
    """R_{-m} R_m = I, and rotation preserves every pair's norm (float64)."""
    axes, sizes = c["axes"], c["sizes"]
    gen = torch.Generator().manual_seed(c["seed"])
    x = torch.randn([sizes[a] for a in axes], generator=gen, dtype=torch.float64)
    pos = torch.arange(sizes["s"]) + c["start"]
    kw = dict(layout=" ".join(axes), style=c["style"], rotary_dim=c["rotary_dim"], base=c["base"])
    y = apply_rope(x, pos, **kw)
    assert torch.allclose(apply_rope(y, -pos, **kw), x, atol=1e-12)
    d_axis = axes.index("d")
    assert torch.allclose(y.norm(dim=d_axis), x.norm(dim=d_axis), rtol=1e-12)
