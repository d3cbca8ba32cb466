r"""How far the RoPE phase drifts when part of it is held in a low-precision dtype.

The angle of pair i at position m is :math:`\theta_{m,i} = m\,\omega_i`. Holding one ingredient in a
dtype with unit roundoff u (bf16 :math:`2^{-8}`, fp16 :math:`2^{-11}`, fp32 :math:`2^{-24}`) perturbs it:

- ``"inv_freq"``: :math:`\hat\omega_i = \omega_i(1+\delta)`, so the error :math:`m\,\omega_i\delta` grows
  linearly in m, without bound (the pitfall of casting a model, rotary buffer included, to bf16);
- ``"positions"``: integers are exact up to :math:`1/u` (256 in bf16, 2048 in fp16, :math:`2^{24}` in
  fp32), then neighbouring positions collapse onto one value, an error of at least one whole step
  :math:`\omega_i` on every pair;
- ``"angle"``: the product :math:`m\,\omega_i` rounded once, an error up to :math:`u\,|\theta|`;
- ``"all"``: positions and ``inv_freq`` held in the dtype and multiplied in it (a model computing its
  tables natively in that dtype).

The phase error is the distance on the circle between the perturbed angle and a float64 oracle
:math:`m\,\omega_i` (``ropelab.scaling.default_inv_freq`` in float64), wrapped to :math:`[0, \pi]`. A
non-finite angle (fp16 overflows past 65504) has lost its phase: it counts as error :math:`\pi`.
Cos and sin are periodic, so only this wrapped error reaches the attention scores.

``rotary_phase_error`` measures a real rotary module (Hugging Face's ``LlamaRotaryEmbedding``, or anything
with its ``forward(x, position_ids) -> (cos, sin)``) the same way, from the tables it returns.

``plot_threshold_table`` and ``plot_cast_pitfall`` draw notebook 01's figures of these measurements.
"""

from __future__ import annotations

import math

import torch

from .scaling import frequencies
from .scaling.checks import check_base, check_int

__all__ = [
    "PRECISION_DTYPES",
    "PERTURBED",
    "perturbed_angle",
    "phase_error",
    "max_phase_error",
    "first_position_past",
    "rotary_phase_error",
    "UNIT_ROUNDOFF",
    "DTYPE_NAMES",
    "wrap_angle",
    "phase_tolerance",
    "unit_roundoff",
    "wrap_phase",
    "first_index_past",
    "LADDER_DTYPES",
    "ladder",
    "plot_threshold_table",
    "plot_cast_pitfall",
]

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PERTURBED = ("inv_freq", "positions", "angle", "all")


def unit_roundoff(dtype: torch.dtype) -> float:
    r"""Unit roundoff :math:`u = \varepsilon_{mach} / 2` of a floating dtype (round to nearest): float64
    :math:`2^{-53}`, float32 :math:`2^{-24}`, fp16 :math:`2^{-11}`, bf16 :math:`2^{-8}` (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., Section 2.1).

    Args:
        dtype: a floating torch dtype; anything else raises ValueError.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"unit_roundoff needs a floating torch dtype (e.g. torch.float32), got {dtype!r}.")
    return torch.finfo(dtype).eps / 2


def wrap_phase(diff: torch.Tensor) -> torch.Tensor:
    r"""A phase difference folded onto :math:`[0, \pi]`, the distance on the circle (what reaches cos and
    sin): an error near :math:`2\pi k` is no error at all. At :math:`\pi/2` a pair's contribution to a score
    has turned orthogonal; at :math:`\pi` it has flipped sign. Non-finite entries count as :math:`\pi`.

    Args:
        diff: phase differences in radians, any shape and floating dtype (computed in float64).

    Returns a float64 tensor of ``diff``'s shape, in :math:`[0, \pi]`.
    """
    return _wrapped(diff.to(torch.float64))


def first_index_past(err: torch.Tensor, threshold: float) -> int | None:
    """The first index of the 1-D ``err`` whose value exceeds ``threshold`` (e.g. the first position whose
    phase error passes 0.1 rad), or None when none does.

    Args:
        err: a 1-D tensor, one value per position (ValueError for another number of dims).
        threshold: the value to exceed (strictly); NaN entries never exceed it.
    """
    if err.ndim != 1:
        raise ValueError(f"err must be 1-D (one value per position), got shape {tuple(err.shape)}; reduce it first.")
    hit = (err > threshold).nonzero()
    return int(hit[0]) if hit.numel() else None


def _check(where: str, dtype: torch.dtype) -> None:
    if where not in PERTURBED:
        raise ValueError(f"where must be one of {PERTURBED} (the ingredient held in low precision), got {where!r}.")
    if dtype not in PRECISION_DTYPES.values():
        raise ValueError(f"dtype must be one of torch.bfloat16, torch.float16, torch.float32, got {dtype}.")


def perturbed_angle(positions: torch.Tensor, inv_freq: torch.Tensor, *, where: str, dtype: torch.dtype) -> torch.Tensor:
    r"""The angles :math:`m\,\omega_i` [len(positions), r/2] with ingredient ``where`` held in ``dtype``,
    returned in float64. ``positions`` and ``inv_freq`` are exact (integers; float64 frequencies).

    Args:
        positions: the positions m, any shape (flattened), taken exactly in float64.
        inv_freq: the r/2 frequencies :math:`\omega_i` (flattened), taken exactly in float64.
        where: the ingredient held in ``dtype``: ``"inv_freq"``, ``"positions"``, ``"angle"`` or ``"all"``
            (:data:`PERTURBED`; see the module's docstring); another raises ValueError.
        dtype: torch.bfloat16, torch.float16 or torch.float32 (:data:`PRECISION_DTYPES`); another raises
            ValueError.
    """
    _check(where, dtype)
    m = positions.to(torch.float64).reshape(-1)
    w = inv_freq.to(torch.float64).reshape(-1)
    if where == "inv_freq":
        return m[:, None] * w.to(dtype).to(torch.float64)[None, :]
    if where == "positions":
        return m.to(dtype).to(torch.float64)[:, None] * w[None, :]
    if where == "angle":
        return (m[:, None] * w[None, :]).to(dtype).to(torch.float64)
    return (m.to(dtype)[:, None] * w.to(dtype)[None, :]).to(torch.float64)


def _wrapped(diff: torch.Tensor) -> torch.Tensor:
    """|diff| folded onto [0, pi] (the magnitude of :func:`wrap_angle`); non-finite entries (an overflowed
    angle) count as pi."""
    return wrap_angle(diff).abs_().masked_fill_(~torch.isfinite(diff), math.pi)


def phase_error(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, where: str, dtype: torch.dtype
) -> torch.Tensor:
    r"""Wrapped phase error :math:`|\hat\theta_{m,i} - m\,\omega_i|` in radians, [len(positions), r/2].

    Args:
        positions: the positions m, any shape (flattened).
        inv_freq: the r/2 exact frequencies :math:`\omega_i`.
        where: the ingredient held in ``dtype``: ``"inv_freq"``, ``"positions"``, ``"angle"`` or ``"all"``
            (:data:`PERTURBED`; see the module's docstring); another raises ValueError.
        dtype: torch.bfloat16, torch.float16 or torch.float32 (:data:`PRECISION_DTYPES`); another raises
            ValueError.

    Returns float64 errors in :math:`[0, \pi]` (:math:`\pi` where the perturbed angle is not finite).
    """
    m = positions.to(torch.float64).reshape(-1)
    exact = m[:, None] * inv_freq.to(torch.float64).reshape(-1)[None, :]
    return _wrapped(perturbed_angle(positions, inv_freq, where=where, dtype=dtype) - exact)


def max_phase_error(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, where: str, dtype: torch.dtype, chunk: int = 1 << 15
) -> torch.Tensor:
    """The worst pair's phase error at each position, [len(positions)], computed in chunks of positions.

    Args:
        positions: the positions m, any shape (flattened).
        inv_freq: the r/2 exact frequencies.
        where: the ingredient held in ``dtype``: ``"inv_freq"``, ``"positions"``, ``"angle"`` or ``"all"``
            (:data:`PERTURBED`; see the module's docstring); another raises ValueError.
        dtype: torch.bfloat16, torch.float16 or torch.float32 (:data:`PRECISION_DTYPES`); another raises
            ValueError.
        chunk: positions per chunk (bounds the memory of the [chunk, r/2] intermediate).

    Returns a float64 tensor (empty when ``positions`` is).
    """
    positions = positions.reshape(-1)
    out = [
        phase_error(positions[i : i + chunk], inv_freq, where=where, dtype=dtype).amax(dim=-1)
        for i in range(0, positions.numel(), chunk)
    ]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


def first_position_past(
    threshold: float,
    inv_freq: torch.Tensor,
    *,
    where: str,
    dtype: torch.dtype,
    limit: int,
    chunk: int = 1 << 16,
) -> int | None:
    """The first integer position m in [0, limit) at which some pair's phase error exceeds ``threshold``
    radians, found by scanning every position (no sampling, so no crossing is missed); None if none does.

    Args:
        threshold: radians, in (0, pi) (ValueError otherwise: the wrapped error never exceeds pi).
        inv_freq: the r/2 exact frequencies.
        where: the ingredient held in ``dtype``: ``"inv_freq"``, ``"positions"``, ``"angle"`` or ``"all"``
            (:data:`PERTURBED`; see the module's docstring); another raises ValueError.
        dtype: torch.bfloat16, torch.float16 or torch.float32 (:data:`PRECISION_DTYPES`); another raises
            ValueError.
        limit: positions scanned are 0 .. limit - 1 (positive; ValueError otherwise).
        chunk: positions per chunk (positive), which bounds memory, not the result.
    """
    if threshold <= 0 or threshold >= math.pi:
        raise ValueError(f"threshold must be in (0, pi) radians (the wrapped error never exceeds pi), got {threshold}.")
    if limit <= 0 or chunk <= 0:
        raise ValueError(f"limit and chunk must be positive numbers of positions, got limit={limit}, chunk={chunk}.")
    _check(where, dtype)
    w = inv_freq.to(torch.float64).reshape(-1)
    for start in range(0, limit, chunk):
        m = torch.arange(start, min(start + chunk, limit), dtype=torch.float64)
        if where == "positions":
            # A position the dtype holds exactly gives the oracle's own float64 product: error exactly 0.
            m = m[m.to(dtype).to(torch.float64) != m]
            if not m.numel():
                continue
        diff = perturbed_angle(m, w, where=where, dtype=dtype) - m[:, None] * w[None, :]
        # The wrapped error never exceeds |diff|, so rows whose |diff| stays under the threshold are
        # below it for sure; only the others need the (costlier) wrap. NaN fails `<=` and is kept.
        suspect = (~(diff.abs().amax(dim=-1) <= threshold)).nonzero().flatten()
        if suspect.numel():
            hit = (_wrapped(diff[suspect]).amax(dim=-1) > threshold).nonzero()
            if hit.numel():
                return int(m[suspect[hit[0, 0]]])
    return None


def rotary_phase_error(
    rotary: torch.nn.Module,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    x_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    r"""Phase error of a real rotary module against the float64 oracle, [len(positions), r/2].

    Calls ``rotary(x, position_ids) -> (cos, sin)`` (Hugging Face's ``LlamaRotaryEmbedding`` convention:
    half style, tables of width head_dim holding each pair's angle twice), reads each pair's angle back
    as :math:`\operatorname{atan2}(\sin, \cos)` and compares it with :math:`m\,\omega_i` for the exact
    ``inv_freq``. ``x_dtype`` is the activation dtype (the tables are returned in it): keep float32 to
    see the error of the angle itself rather than the final rounding of cos and sin.

    Args:
        rotary: the module, called as ``rotary(x, position_ids)`` with x zeros [1, len(positions), 2 * r/2]
            and ``position_ids`` [1, len(positions)] (int64), under ``torch.no_grad()``.
        positions: the integer positions m, any shape (flattened).
        inv_freq: the module's exact frequencies; a table width other than 2 * len(inv_freq) raises
            ValueError.
        x_dtype: the dtype of the dummy activation x.

    Returns float64 errors in :math:`[0, \pi]`.
    """
    positions = positions.reshape(-1)
    half = inv_freq.numel()
    x = torch.zeros(1, positions.numel(), 2 * half, dtype=x_dtype)
    with torch.no_grad():
        cos, sin = rotary(x, positions[None, :].long())
    if cos.shape[-1] != 2 * half:
        raise ValueError(
            f"the module returned tables of width {cos.shape[-1]} but inv_freq has {half} pairs; pass the "
            "module's exact frequencies (ropelab.frequencies(head_dim, base) for the default type)."
        )
    angle = torch.atan2(sin[0, :, :half].double(), cos[0, :, :half].double())
    exact = positions.double()[:, None] * inv_freq.double()[None, :]
    return _wrapped(angle - exact)



# --------------------------------------------------------------------------------------------------
# Unit roundoff, dtype names, angle wrapping and the phase error a correct implementation may show
# --------------------------------------------------------------------------------------------------

# Unit roundoff u: round-to-nearest errs by at most u |value| (Higham, "Accuracy and Stability of
# Numerical Algorithms", 2nd ed., section 2.1: u = 2^-t for a t-bit significand).
UNIT_ROUNDOFF = {dt: unit_roundoff(dt) for dt in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def wrap_angle(x: torch.Tensor) -> torch.Tensor:
    """Angles folded onto [-pi, pi) (signed; ``phase_error`` reports the magnitude).

    Args:
        x: angles in radians, any shape; the result has its shape and dtype (NaN stays NaN).
    """
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def phase_tolerance(dtype: torch.dtype, max_angle: float) -> float:
    r"""The phase error (radians) a correct RoPE may show in ``dtype`` with angles up to ``max_angle``:
    the output rounded to ``dtype`` (:math:`4u_{dtype}`) plus the angle :math:`m\,\omega` formed in float32
    (:math:`8u_{fp32}(1 + |\theta|_{max})`, as Hugging Face and most implementations do).

    Args:
        dtype: the output's dtype: float64, float32, bfloat16 or float16 (ValueError otherwise).
        max_angle: the largest angle :math:`|m\,\omega|` (radians) the call forms.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype must be one of {list(DTYPE_NAMES.values())} (torch dtypes), got {dtype}.")
    return 4 * UNIT_ROUNDOFF[dtype] + 8 * UNIT_ROUNDOFF[torch.float32] * (1 + max_angle)


LADDER_DTYPES = ("float64", "float32", "bfloat16", "float16")  # what ladder() holds an angle in


_LADDER_KEYS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def ladder(base: float = 10000.0, head_dim: int = 64, position: int = 100, dtype: str = "float32") -> dict:
    r"""The frequency ladder and the rotation of every pair at one position.

    Returns float64 numpy arrays over the pairs i = 0 .. d/2 - 1: ``inv_freq`` :math:`\omega_i = b^{-2i/d}`,
    ``wavelength`` :math:`2\pi/\omega_i` (positions per full turn), ``angle`` :math:`m\,\omega_i` (exact,
    float64), ``angle_dtype`` (the same angle when positions, frequencies and their product are held in
    ``dtype``, :func:`phase_error` with ``where="all"``), ``phase_error`` (its wrapped
    distance from the exact angle, rad), and ``turned`` (whether pair i has completed one turn by
    ``position``: :math:`m\,\omega_i \ge 2\pi`, a bool array).

    Args:
        base: RoPE's base b (a finite number > 1).
        head_dim: d, an even int in [2, 4096].
        position: the position m, an int in [0, 2**24].
        dtype: the dtype the angle is held in: a name of :data:`LADDER_DTYPES` (``"float64"``: no error).

    ValueError names an argument out of range.
    """
    check_base(base)
    base = float(base)
    head_dim = check_int("head_dim", head_dim, 2, 4096, even=True)
    position = check_int("position", position, 0, 1 << 24)
    if dtype not in LADDER_DTYPES:
        raise ValueError(f"dtype must be one of {LADDER_DTYPES}, got {dtype!r}.")
    inv = frequencies(head_dim, base)[0]
    pos = torch.tensor([position])
    angle = (pos.double()[:, None] * inv[None, :])[0]
    if dtype == "float64":
        held, err = angle, torch.zeros_like(angle)
    else:
        held = perturbed_angle(pos, inv, where="all", dtype=PRECISION_DTYPES[_LADDER_KEYS[dtype]])[0]
        err = phase_error(pos, inv, where="all", dtype=PRECISION_DTYPES[_LADDER_KEYS[dtype]])[0]
    return {
        "inv_freq": inv.numpy(),
        "wavelength": (2 * math.pi / inv).numpy(),
        "angle": angle.numpy(),
        "angle_dtype": held.numpy(),
        "phase_error": err.numpy(),
        "turned": (angle >= 2 * math.pi).numpy(),
    }


def plot_threshold_table(ax, first, scan: int, title: str) -> None:
    """``first`` (a DataFrame, dtype name x ingredient held in it -> the first position whose phase error passes
    the threshold, NaN where none up to ``scan``) as a heat map coloured by log10 position, each cell labelled
    with its position (notebook 01, section 4).

    Args:
        ax: the matplotlib Axes to draw on.
        first: the DataFrame described above (rows: dtype names; columns: ingredients).
        scan: how many positions were scanned: what a NaN cell shows (``> scan``) and is coloured as.
        title: the Axes' title.
    """
    import numpy as np
    import pandas as pd
    import seaborn as sns

    shown = np.log10(first.astype(float).fillna(scan).to_numpy())
    labels = first.map(lambda v: f"> {scan:,}" if pd.isna(v) else f"{int(v):,}")
    sns.heatmap(shown, annot=labels.to_numpy(), fmt="", cmap="viridis_r", cbar_kws={"label": "log10 position"},
                xticklabels=first.columns, yticklabels=first.index, ax=ax)
    ax.set(title=title, xlabel="held in the dtype")


def plot_cast_pitfall(axes, positions: torch.Tensor, err32: torch.Tensor, err_bf: torch.Tensor, threshold: float,
                      rel_hf: dict) -> None:
    """Left: the worst pair's phase error of a float32 and a bf16-cast rotary module against position
    (``err32``, ``err_bf`` [len(positions)]), with the ``threshold``; right: the relative logit error per query
    position of scores rotated with each (``rel_hf``: ``"fp32"``/``"bf16"`` -> [s]) against float64; log-log,
    position 0 left out (notebook 01, section 5).

    Args:
        axes: two matplotlib Axes, left and right.
        positions: the positions m of ``err32`` and ``err_bf``.
        err32: the float32 module's worst phase error per position (radians).
        err_bf: the bf16-cast module's, the same length.
        threshold: a phase error (radians) drawn as a dotted line on the left.
        rel_hf: ``{"fp32": ..., "bf16": ...}``, each the relative logit error per query position [s].
    """
    s_hf = rel_hf["fp32"].shape[0]  # the query positions scored
    axes[0].loglog(positions[1:], err32[1:], label="float32 module", color="C0")
    axes[0].loglog(positions[1:], err_bf[1:], label="module.to(torch.bfloat16)", color="C1", ls="--")
    axes[0].axhline(threshold, color="k", ls=":", lw=1)
    axes[0].set(xlabel="position m", ylabel="worst pair's phase error (rad)", title="LlamaRotaryEmbedding vs float64")
    axes[0].legend()
    for name, color, ls in [("fp32", "C0", "-"), ("bf16", "C1", "--")]:
        axes[1].loglog(torch.arange(1, s_hf), rel_hf[name][1:], color=color, ls=ls, label=name)
    axes[1].set(xlabel="query position m", ylabel="relative logit error", title="scores of random q, k vs float64")
    axes[1].legend()
