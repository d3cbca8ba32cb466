r"""ropelab's ``apply_rope`` against one recorded call of transformers' rotation, element by element within the
float32 rounding bound of ``ropelab.conformance``'s docstring."""

from __future__ import annotations

import math

import torch

from ..core import pair_indices
from ..multiaxis import MultiAxis, axis_angles
from ..rope import apply_rope
from ..spec import RopeSpec
from .running import layout_of, rotated_pairs

__all__ = ["U32", "U64", "bound", "compare_call"]

U32, U64 = 2.0**-24, 2.0**-53


def bound(x: torch.Tensor, layout: str, positions, spec: RopeSpec, sections: MultiAxis | None = None) -> torch.Tensor:
    r"""The per-element bound of the module docstring, for ropelab's ``spec`` on input ``x``; with ``sections`` the
    positions are [A, s] (one row per axis) and pair i's angle is :math:`p_{a(i)}\omega_i`."""
    d_axis = layout.split().index("d")
    s_axis = layout.split().index("s")
    xd = x.movedim(d_axis, -1).movedim(s_axis if s_axis < d_axis else s_axis - 1, -2)  # [..., s, d]
    tol = 16 * (U64 if x.dtype == torch.float64 else U32) * xd.double().abs()
    xd = xd.double()
    if not spec.is_nope:
        d = xd.shape[-1]
        r = spec.rotary_dim or d
        if sections is None:
            inv, af = spec.frequencies(d, seq_len=max(positions) + 1)
            theta = torch.tensor(positions, dtype=torch.float64)[:, None] * inv[None, :]
        else:
            inv, af = (sections.inv_freq(spec.base), 1.0) if sections.axial else spec.frequencies(d)
            theta = axis_angles(torch.as_tensor(positions), sections, inv)  # [s, r/2]
            r = 2 * sections.n_pairs
        a, b = pair_indices(r, spec.style) if sections is None else sections.pair_dims(r, spec.style)
        rho = torch.hypot(xd[..., a], xd[..., b])
        const = 4 if x.dtype == torch.float64 else 12  # float32 models round the products and the sum too
        pair_tol = abs(af) * rho * (theta.abs() * (math.log(spec.base) + 9) + const) * U32 + 16 * U64 * rho
        tol[..., a] = pair_tol
        tol[..., b] = pair_tol
    return tol.movedim(-2, s_axis if s_axis < d_axis else s_axis - 1).movedim(-1, d_axis)


def _layout(shape: tuple[int, ...], n: int, call) -> str:
    """``layout_of``; a call at one position read from its cos rows (``token_positions``: one block key) has
    several axes of size 1: the first is taken as the sequence, which at one position rotates the same whatever
    it is."""
    if n == 1 and call.get("token_positions") is not None and list(shape[:-1]).count(1) > 1:
        names = ["s" if i == list(shape).index(1) else ("b" if i == 0 else "h") for i in range(len(shape) - 1)]
        if names.count("h") <= 1:
            return " ".join(names + ["d"])
    return layout_of(shape, n)


def compare_call(call, positions, spec: RopeSpec, perm: list[int] | None = None,
                 sections: MultiAxis | None = None) -> dict:
    """Worst error and worst error / bound of ropelab's ``spec`` against one recorded call; ``perm`` is the
    measured output permutation of transformers' function (undone before comparing). With ``sections`` (a
    vision tower's axial RoPE) the positions are the call's own, [A, s], read from the rotary module
    (``running``)."""
    worst_err, worst_ratio = 0.0, 0.0
    if sections is not None:
        positions = call["positions"]
    elif call.get("token_positions") is not None:  # another set of tokens than the sequence (running)
        positions = call["token_positions"]
    n = positions.shape[-1] if isinstance(positions, torch.Tensor) else len(positions)
    k = (call.get("prefix") or {}).get("tokens", 0) if sections is not None else 0
    for x, y in rotated_pairs(call):
        if k:  # tokens the rotary did not number (MLCD's class token, by a learned angle): not compared
            axis = layout_of(tuple(x.shape), n + k).split().index("s")
            x, y = x.narrow(axis, k, n), y.narrow(axis, k, n)
        if perm is not None and len(perm) == y.shape[-1]:
            y = y[..., torch.tensor(perm)]  # undo transformers' output order: (R x)[a] = y[perm[a]]
        layout = _layout(tuple(x.shape), n, call)
        pos = torch.as_tensor(positions)
        x64 = x.double()
        ours = x64.clone() if spec.is_nope else apply_rope(x64, pos, layout=layout, spec=spec, sections=sections)
        err = (ours - y.double()).abs()
        tol = bound(x, layout, positions, spec, sections)
        worst_err = max(worst_err, float(err.max()))
        worst_ratio = max(worst_ratio, float((err / tol.clamp_min(1e-300)).max()))
    return {"max_error": worst_err, "error_over_bound": worst_ratio}
