"""Probe construction for ``ropelab.diagnosis``: the sizes and packings it feeds, how it calls the black
box, its tolerances, and the two usual sanity checks (which the silent bugs pass).

Tolerances (entries of a RoPE matrix are at most ~1 in magnitude):

- ``STRUCT_TOL = 2**-14`` on matrix entries: >= 256 float32 ulps (implementations that form angles or
  tables in float32 sit far below it), yet every structural bug is an O(0.1) effect.
- ``ANGLE_TOL = 2**-10`` rad: float32 angles at the probe's small positions err < 1e-5.
- ``COUPLE_TOL = 2**-30``: two dims are coupled when one leaks into the other at all (non-partners stay
  exactly 0, and a frequency such as 500000**(-126/128) = 2e-6 must still count as a rotating pair).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..core import Layout, parse_layout
from ..machine import one_thread

__all__ = [
    "probe_sizes",
    "probe_cu_seqlens",
    "sanity_checks",
    "rotation_angles",
    "NotATensor",
    "call",
    "as_torch_fn",
    "FRAMEWORKS",
    "one_thread",
    "STRUCT_TOL",
    "ANGLE_TOL",
    "COUPLE_TOL",
]

STRUCT_TOL = 2.0**-14
ANGLE_TOL = 2.0**-10
COUPLE_TOL = 2.0**-30

DEFAULT_SIZES = {"b": 2, "s": 6, "t": 12, "h": 3, "d": 32}
# The array libraries a black box may take: torch, or MLX (its arrays converted at the boundary,
# ropelab.engines.mlx.to_mx / to_torch). None detects MLX from where fn is defined.
FRAMEWORKS = ("torch", "mlx")


def as_torch_fn(fn: Callable, framework: str | None) -> Callable:
    """``fn`` as a function of torch tensors: as it is for ``framework="torch"``; wrapped by
    ``ropelab.engines.mlx.torch_callable`` for ``"mlx"`` (``mx.fast.rope`` partials, mlx-lm rope modules); None
    picks "mlx" when fn (or the function a ``functools.partial`` wraps) is defined in ``mlx`` or ``mlx_lm``."""
    if framework is not None and framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS} or None (detect), got {framework!r}.")
    if framework is None:
        if not callable(fn):
            return fn  # check_args refuses it with its own message
        from ..engines.mlx import is_mlx_function

        framework = "mlx" if is_mlx_function(fn) else "torch"
    if framework == "torch":
        return fn
    from ..engines.mlx import torch_callable

    return torch_callable(fn)


def probe_sizes(layout: str | Layout, sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """The size of every axis of ``layout`` the checker uses: ``sizes`` as given, the rest chosen so that
    no two non-d axes share a size (otherwise a rotation along one could not be told from the other).

    Args:
        layout: einops-style axes (``"b s h d"``, ``"t h d"``, ...), or a parsed :class:`~ropelab.core.Layout`.
        sizes: the sizes the function under test needs (``{"h": 20, "d": 64}``); None for all chosen.
    """
    lay = layout if isinstance(layout, Layout) else parse_layout(layout)
    sizes = dict(sizes or {})
    for k, v in sizes.items():
        if k not in lay.axes:
            raise ValueError(f"sizes names axis {k!r}, which layout '{lay}' does not have; use its axes {lay.axes}.")
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"sizes[{k!r}] must be a positive int, got {v!r}.")
    if "d" in sizes and sizes["d"] % 2:
        raise ValueError(f"sizes['d'] must be even (RoPE rotates pairs of dims), got {sizes['d']}.")
    seq = lay.seq
    if seq in sizes and sizes[seq] < (6 if seq == "t" else 3):
        raise ValueError(
            f"sizes[{seq!r}] must be at least {6 if seq == 't' else 3} so positions 0, 1, 2 (and, for t, three "
            f"packed sequences) can be probed; got {sizes[seq]}."
        )
    fixed = {a: n for a, n in sizes.items() if a != "d"}
    seen: dict[int, str] = {}
    for a, n in fixed.items():
        if n in seen and n > 1:
            raise ValueError(
                f"sizes gives axes {seen[n]!r} and {a!r} the same size {n}: the checker could not tell a rotation "
                "along one from one along the other. Give them different sizes."
            )
        seen[n] = a
    out = {}
    for a in lay.axes:
        if a in sizes:
            out[a] = sizes[a]
            continue
        n = DEFAULT_SIZES[a]
        if a != "d":
            while n in seen:
                n += 1
            seen[n] = a
        out[a] = n
    return out


def probe_cu_seqlens(n_tokens: int) -> torch.Tensor:
    """Three packed sequences of different lengths covering ``n_tokens`` (int32, flash-attn's format).

    Args:
        n_tokens: the size of the packed axis ``t``.
    """
    n1 = max(2, n_tokens // 4)
    n2 = max(2, (n_tokens - n1) // 2 + 1)
    n3 = n_tokens - n1 - n2
    if n3 < 1:
        raise ValueError(f"need at least 6 packed tokens to probe three sequences, got {n_tokens}.")
    return torch.tensor([0, n1, n1 + n2, n_tokens], dtype=torch.int32)


class NotATensor(ValueError):
    """fn broke the black-box contract (a usage error, raised); any other failure of fn is a finding."""


def call(fn: Callable, x: torch.Tensor, lay: Layout, cu: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        y = fn(x, cu) if lay.seq == "t" else fn(x)
    if not isinstance(y, torch.Tensor):
        raise NotATensor(
            f"fn returned {type(y).__name__}, not a tensor; diagnose needs fn(x) -> rotated x (for a module "
            "returning (q, k), pass lambda x: module(x, x)[0])."
        )
    return y




# --------------------------------------------------------------------------------------------------
# The usual sanity checks (which the silent bugs pass) and the angle a token actually gets
# --------------------------------------------------------------------------------------------------


def _seq_last(y: torch.Tensor, lay: Layout) -> torch.Tensor:
    """``y`` (laid out as ``lay``) with the sequence axis second to last and the head dim last."""
    order = [i for i, a in enumerate(lay.axes) if a not in (lay.seq, "d")] + [lay.index(lay.seq), lay.index("d")]
    return y.permute(order)


def sanity_checks(
    fn: Callable, *, layout: str, sizes: Mapping[str, int] | None = None, seed: int = 0
) -> dict[str, float]:
    r"""The two checks people usually run on a RoPE, in float64 where ``fn`` allows.

    - ``"norm"``: :math:`\max |\,\|f(x)\| / \|x\| - 1|` over tokens (a rotation keeps norms);
    - ``"relative"``: with one random q at every position and one k at every position, the scores
      :math:`S_{mn} = \langle f(q)_m, f(k)_n\rangle` along the declared sequence axis must depend on n - m
      only: :math:`\max |S_{m+1,n+1} - S_{mn}| / \max |S|`.

    Both sit at round-off level for a correct RoPE, and also for one that rotates along the wrong axis (its scores
    are then constant along the sequence: nothing depends on position at all), which is why they miss it.

    Args:
        fn: the function under test, called as :func:`ropelab.diagnose` calls it.
        layout: einops-style axes of the tensor fn takes.
        sizes: axis sizes fn needs; the rest are chosen (:func:`probe_sizes`).
        seed: the seed of the random q and k.

    Returns ``{"norm": ..., "relative": ...}``.
    """
    lay = parse_layout(layout)
    sz = probe_sizes(lay, sizes)
    cu = torch.tensor([0, sz["t"]], dtype=torch.int32) if lay.seq == "t" else None
    shape = [sz[a] for a in lay.axes]
    g = torch.Generator().manual_seed(seed)
    out = {}
    for pdt in (torch.float64, torch.float32):
        try:
            x = torch.randn(shape, generator=g, dtype=pdt)
            y = call(fn, x, lay, cu).reshape(shape).double()
            d = lay.index("d")
            out["norm"] = float((y.norm(dim=d) / x.double().norm(dim=d) - 1).abs().max())
            # one q and one k vector repeated at every position (and every other index)
            q = torch.randn(sz["d"], generator=g, dtype=pdt)
            k = torch.randn(sz["d"], generator=g, dtype=pdt)
            qs = _seq_last(call(fn, _fill(q, shape, d), lay, cu).reshape(shape).double(), lay)
            ks = _seq_last(call(fn, _fill(k, shape, d), lay, cu).reshape(shape).double(), lay)
            S = qs @ ks.transpose(-1, -2)
            out["relative"] = float((S[..., 1:, 1:] - S[..., :-1, :-1]).abs().max() / S.abs().max())
            return out
        except NotATensor:
            raise
        except Exception:  # noqa: BLE001 - fall back to float32 as diagnose does
            continue
    raise ValueError(f"fn fails on float64 and float32 inputs of shape {shape} (layout '{lay}'); pass sizes=...")


def _fill(v: torch.Tensor, shape: list[int], d: int) -> torch.Tensor:
    """A tensor of ``shape`` holding vector ``v`` along axis ``d`` at every other index."""
    view = [1] * len(shape)
    view[d] = v.numel()
    return v.reshape(view).expand(shape).contiguous()


def rotation_angles(
    fn: Callable,
    *,
    layout: str,
    sizes: Mapping[str, int] | None = None,
    dims: tuple[int, int] = (0, 1),
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The angle (radians, in (-pi, pi]) by which ``fn`` turns dims ``dims = (a, b)`` at every token: input
    :math:`e_a` everywhere, angle :math:`\operatorname{atan2}(y_b, y_a)`. Returns the token axes of the
    layout (d removed), in layout order. For a ``t`` layout ``cu_seqlens`` defaults to one sequence.

    Args:
        fn: the function under test, called as :func:`ropelab.diagnose` calls it.
        layout: einops-style axes of the tensor fn takes.
        sizes: axis sizes fn needs; the rest are chosen (:func:`probe_sizes`).
        dims: the two head dims (a, b) whose plane is measured: (0, 1) is pair 0 of the interleaved style,
            (0, d/2) pair 0 of the half style.
        cu_seqlens: the packed sequences' boundaries, for a ``t`` layout.
    """
    lay = parse_layout(layout)
    sz = probe_sizes(lay, sizes)
    shape = [sz[a] for a in lay.axes]
    if lay.seq == "t" and cu_seqlens is None:
        cu_seqlens = torch.tensor([0, sz["t"]], dtype=torch.int32)
    a, b = dims
    if not (0 <= a < sz["d"] and 0 <= b < sz["d"] and a != b):
        raise ValueError(f"dims must be two different head dims in [0, {sz['d']}), got {dims}.")
    e = torch.zeros(sz["d"], dtype=torch.float64)
    e[a] = 1.0
    d = lay.index("d")
    x = _fill(e, shape, d)
    try:
        y = call(fn, x, lay, cu_seqlens)
    except NotATensor:
        raise
    except Exception:  # noqa: BLE001 - fn does not take float64
        y = call(fn, x.float(), lay, cu_seqlens)
    y = y.reshape(shape).double().movedim(d, -1)
    return torch.atan2(y[..., b], y[..., a])


