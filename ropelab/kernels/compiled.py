r"""``backend="compile"``: RoPE as one single-pass formula, compiled by ``torch.compile`` (the CPU path).

:func:`ropelab.rotate`'s eager inference path makes four half-size passes over x (two multiplies, two
multiply-adds into the output). Written as one expression,

.. math::
    y = \big[\,x_1 c - x_2 s,\; x_2 c + x_1 s,\; x_{r:}\,\big]
    \quad(\text{or the pairs interleaved}),

Inductor fuses it into one loop that reads x once and writes y once: the memory floor of a plain copy
plus the (small, cached) tables. Numerics are ropelab's: cos/sin are the caller's tables (formed in
float64 and rounded once, :func:`ropelab.cos_sin`), 16-bit inputs are computed in float32 and rounded
once on output, so the error bound of :func:`ropelab.rotate` holds (a fused multiply-add, if the C++
compiler contracts one, only removes a rounding). So does the backward's: AOTAutograd differentiates
the formula, whose first step upcasts x, so the incoming gradient is upcast to float32, rotated back
(:math:`R^\top g`) and summed there, and rounded to x's dtype once, at that upcast's backward.

The first call for a new shape, dtype or style compiles (seconds); :func:`compile_seconds` reports the
time spent so far, which ``python -m ropelab.bench cpu`` lists apart from the per-call time.
"""

from __future__ import annotations

import time

import torch

__all__ = ["rotate_compiled", "compile_seconds"]

_COMPILED: dict[str, object] = {}
_SECONDS = {"total": 0.0}
_SEEN: set[tuple] = set()


def _single_pass(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    half = cos.shape[-1]
    r = 2 * half
    cdt = torch.promote_types(x.dtype, torch.float32)
    xr = x[..., :r].to(cdt)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    rot = torch.stack([y1, y2], dim=-1).flatten(-2) if interleaved else torch.cat([y1, y2], dim=-1)
    rot = rot.to(x.dtype)
    return torch.cat([rot, x[..., r:]], dim=-1) if r < x.shape[-1] else rot


def compile_seconds() -> float:
    """Wall-clock seconds spent so far in first calls (tracing and compiling) of :func:`rotate_compiled`."""
    return _SECONDS["total"]


def rotate_compiled(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, style: str = "half") -> torch.Tensor:
    """:func:`ropelab.rotate` (same arguments, same checks) through one compiled single-pass kernel."""
    from ..core import rotate

    if x.numel() == 0:
        return rotate(x, cos, sin, style=style)
    # The eager function does every check; on a 1-element slice it costs nothing (and raises the same errors).
    rotate(x[(slice(0, 1),) * (x.ndim - 1)], cos[(slice(0, 1),) * (cos.ndim - 1)],
           sin[(slice(0, 1),) * (sin.ndim - 1)], style=style)
    cdt = torch.promote_types(x.dtype, torch.float32)
    c, s = cos.to(device=x.device, dtype=cdt), sin.to(device=x.device, dtype=cdt)
    fn = _COMPILED.get("fn")
    if fn is None:
        fn = _COMPILED["fn"] = torch.compile(_single_pass, dynamic=False, fullgraph=True)
    key = (tuple(x.shape), x.stride(), x.dtype, tuple(c.shape), c.stride(), style, x.requires_grad)
    t0 = time.perf_counter()
    y = fn(x, c, s, style == "interleaved")
    if key not in _SEEN:
        _SEEN.add(key)
        _SECONDS["total"] += time.perf_counter() - t0
    return y
