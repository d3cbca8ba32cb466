"""apply_rope's small-call fast path (ropelab.kernels.cpu_fast): plans kept and run in C++.

What could go wrong, and is tested: a stored plan serving a call it was not built for (other positions' content,
settings, strides, out, spec), a result that differs from the Python path's, a refusal the Python path makes
that the fast path skips (an overlapping out), autograd lost, threads sharing plans, plans never forgotten.
Every comparison is with the same kernel on the same tables (rope's plans, backend="cpu"), so bit-equal.
"""

from __future__ import annotations

import threading

import pytest
import torch

import ropelab
from ropelab import rope
from ropelab.kernels import cpu_build, cpu_fast


@pytest.fixture(scope="module")
def fast():
    try:
        cpu_fast.build()  # cached after make setup; else about 20-40 s, once per machine
    except cpu_build.BuildError as e:
        pytest.skip(f"the fast path does not build here: {e}")
    cpu_fast._STATE.clear()
    rope._FAST_TRIED.clear()
    rope._FAST[0] = None
    rope.clear_plans()
    ropelab.apply_rope(torch.randn(1, 1, 2, 8), layout="b h s d")  # the first plan built loads it
    assert rope._FAST[0] is not None, cpu_fast.why_unavailable()
    assert cpu_fast.build_info()["in_use"]
    return rope._FAST[0]


def _python_way(x, positions, **kw):
    """The whole way on the C kernel (no plan, no fast path): the reference bits."""
    return ropelab.apply_rope(x, positions, backend="cpu", **kw)


def _thrice(x, positions, fast, **kw):
    """Three calls of one key: the first builds the plan, the second stores it in C++, the third runs there."""
    rope.clear_plans()
    ys = [ropelab.apply_rope(x, positions, **kw) for _ in range(3)]
    assert fast.size() == 1, "the fast path did not store this call's plan"
    return ys


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_the_fast_path_gives_the_python_paths_bits(fast, dtype, style):
    torch.manual_seed(0)
    x = (torch.randn(8, 32, 1, 128) * 3).to(dtype)
    pos = (32000 + torch.arange(8))[:, None]
    kw = dict(layout="b h s d", style=style, rotary_dim=96, base=500000.0)
    want = _python_way(x, pos, **kw)
    for y in _thrice(x, pos, fast, **kw):
        assert torch.equal(y, want) and y.data_ptr() != x.data_ptr()
    out = torch.empty_like(x)
    for _ in range(3):
        assert ropelab.apply_rope(x, pos, out=out, **kw) is out and torch.equal(out, want)
    xi = x.clone()
    for _ in range(3):
        assert ropelab.apply_rope(xi, pos, inplace=True, **kw) is xi
    thrice = _python_way(_python_way(want, pos, **kw), pos, **kw)
    assert torch.equal(xi, thrice)  # three rotations in place, each one the kernel's


def test_a_stored_plan_never_serves_other_positions_settings_or_strides(fast):
    x = torch.randn(4, 8, 1, 64)
    pos = (100 + torch.arange(4))[:, None]
    want = _python_way(x, pos, layout="b h s d")
    _thrice(x, pos, fast, layout="b h s d")
    pos += 5  # mutated in place: the content is the key
    assert torch.equal(ropelab.apply_rope(x, pos, layout="b h s d"), _python_way(x, pos, layout="b h s d"))
    pos -= 5
    assert torch.equal(ropelab.apply_rope(x, pos, layout="b h s d"), want)
    for kw in (dict(offset=3), dict(base=100.0), dict(base=10000), dict(style="interleaved"), dict(rotary_dim=32),
               dict(angle_dtype=torch.float32), dict(max_position_embeddings=4096)):
        for _ in range(3):
            assert torch.equal(ropelab.apply_rope(x, pos, layout="b h s d", **kw),
                               _python_way(x, pos, layout="b h s d", **kw)), kw
    for p in (pos.to(torch.int32), pos.double(), pos.clone()):
        for _ in range(3):
            assert torch.equal(ropelab.apply_rope(x, p, layout="b h s d"), want)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    for _ in range(3):
        assert torch.equal(ropelab.apply_rope(xt, pos, layout="b h s d"), want)
    spec_a = ropelab.RopeSpec.from_keywords(64, base=10000.0)
    spec_b = ropelab.RopeSpec.from_keywords(64, base=20000.0)
    for spec in (spec_a, spec_b, spec_a):
        for _ in range(3):
            assert torch.equal(ropelab.apply_rope(x, pos, layout="b h s d", spec=spec),
                               _python_way(x, pos, layout="b h s d", spec=spec))


def test_the_python_paths_refusals_and_autograd_still_hold(fast):
    buf = torch.randn(2 * 4 * 32 + 32)
    x = buf[:256].view(1, 2, 4, 32)
    _thrice(x, None, fast, layout="b h s d", out=torch.empty(1, 2, 4, 32))
    shifted = buf[32:288].view(1, 2, 4, 32)  # the stored key's shapes, but overlapping x
    for _ in range(3):
        xs = x.clone()
        assert ropelab.apply_rope(x, layout="b h s d", out=shifted) is shifted
        # the Python way writes an overlapping out through a temporary (its own rounding): within float32's bound
        tol = 8 * torch.finfo(torch.float32).eps * xs.abs().max().item()
        assert (shifted - _python_way(xs, None, layout="b h s d")).abs().max().item() <= tol
        buf[:256] = xs.reshape(-1)
    xg = torch.randn(1, 2, 4, 32, requires_grad=True)
    for _ in range(3):
        ropelab.apply_rope(xg, layout="b h s d").sum().backward()
    assert xg.grad is not None
    with pytest.raises(ValueError, match="out="):
        ropelab.apply_rope(xg, layout="b h s d", out=torch.empty(1, 2, 4, 32))
    with pytest.raises(ValueError, match="not both"):
        ropelab.apply_rope(x, layout="b h s d", out=torch.empty(1, 2, 4, 32), inplace=True)


def test_large_calls_stay_on_the_python_path_and_plans_stay_bounded(fast):
    rope.clear_plans()
    big = torch.randn(1, 8, 512, 64)  # 1 MiB: the pool's outputs
    for _ in range(3):
        ropelab.apply_rope(big, layout="b h s d")
    assert fast.size() == 0
    for n in range(rope.MAX_PLANS + 10):
        for _ in range(2):
            ropelab.apply_rope(torch.randn(1, 1, n + 1, 8), layout="b h s d")
    assert fast.size() == rope.MAX_PLANS
    rope.clear_plans()
    assert fast.size() == 0


def test_threads_sharing_fast_plans_each_get_their_own_result(fast):
    rope.clear_plans()
    pos = (32000 + torch.arange(4))[:, None]
    xs = [torch.randn(4, 8, 1, 64) for _ in range(6)]
    want = [_python_way(x, pos, layout="b h s d") for x in xs]
    _thrice(xs[0], pos, fast, layout="b h s d")
    bad = []

    def work(i):
        for _ in range(300):
            if not torch.equal(ropelab.apply_rope(xs[i], pos, layout="b h s d"), want[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad and fast.size() == 1


def test_the_extension_refuses_wrong_calls_by_name(fast):
    with pytest.raises(TypeError, match="17 arguments"):
        fast.call(torch.randn(2))
    with pytest.raises(TypeError, match="6 more"):
        fast.store(torch.randn(2))
