r"""Multi-axis RoPE seen from outside: which pairs rotate with which position axis, and single-axis checks.

Two questions ``diagnose`` alone cannot answer:

- For ``fn(x, positions)`` taking multi-axis positions [A, s] (M-RoPE, axial RoPE),
  :func:`diagnose_axes` varies one axis at a time (that axis 0, 1, 2, ..., the others 0) and reads which
  pairs turn and at what frequency. That gives the pairing style, ``a(i)`` for every pair, the sections,
  whether they are contiguous (Qwen2-VL) or interleaved (Qwen3-VL), and whether each axis restarts the
  frequency ladder (axial) or shares one (M-RoPE): a :class:`ropelab.multiaxis.MultiAxis`.
- For a ``fn(x)`` that takes 1D input, a 2D RoPE hidden inside (a flattened grid whose row and column
  are derived from the token index) is not a RoPE along one axis: the score of a fixed q and k is not a
  function of n - m. :func:`single_axis_deviation` measures that on a sequence long enough to wrap, and
  ``diagnose`` then says "not single-axis RoPE" instead of proposing a pairing or precision fix.

Limit: the score check sees extra axes only where they move the scores. Measured over the zoo (64
positions): correct and buggy single-axis rows stay below 0.005 except ``mixed_tables`` (0.46) and
``decode_without_offset`` (0.81), whose position findings come first; a 2D RoPE behind 1D input of width 8
gives 0.85; but an M-RoPE whose h and w axes drive only low-frequency pairs (sections (8, 4, 4) at head
dim 32, t = 0, h = i // 8, w = i % 8: the zoo's ``mrope_behind_1d``) gives 0.003, as small as bf16 tables.
``diagnose`` therefore reads two more signs from its phase check (positions 0 .. ``max_position``):

- the phase error against the envelope of 16-bit rounding, :math:`4u(1 + |\theta|)` with u = 2^-8 (positions,
  inv_freq and their product each rounded once err by at most :math:`3u|\theta|`, cos/sin tables by
  :math:`\sqrt2 u`): the zoo's 16-bit rows and positions / inv_freq / angles / tables in bf16 or fp16 reach at
  most 0.61 of it at 4096 positions (``esm_old_bf16``; 0.59 at 1024), ``mrope_behind_1d`` 16 times it
  (5.0 at 1024; per pair 16, 10, 6.2, 3.6 on the w pairs at 4096), widths 32 and 64 give 40 and 48;
- dims unrotated over the short probe that turn later (pass-through dims stay exactly 1): every
  single-axis row 0, ``mrope_behind_1d`` 2.4 (its h pairs start turning at position 8).

Either sign makes the verdict "not single-axis RoPE", never a precision or pairing fix.

The structure probe sees 6 tokens only, and its findings come before the phase check. A grid narrower
than that (widths 2 and 4) turns h and w pairs inside it: it was read as a sequence-axis and style fault.
Qwen2-VL's own sizes (sections (16, 24, 24), head dim 128, base 1e6) with t constant turn their w pairs by
at most 5 * 1.8e-4 rad there, below the probe's angle tolerance 2^-10: read as no rotation plus style.
Qwen2-VL's numbering of 4 text tokens and then an image (t frozen, h and w offset by the text, as
transformers' ``get_rope_index``): read as a sequence-axis fault. So every such short-probe finding
(``no_rotation, positions, seq_axis, restart, style, direction``) still standing after the phase check is
confirmed, before it is reported, by
:func:`position_spread` over positions 0 .. ``max_position``: does every pair of a token read the same
position? Measured at 1025 and 4097 positions: every single-axis zoo row at most 0.014 (``esm_old_bf16``;
0.012 for bf16 tables), the M-RoPE rows 0.64 (``qwen2vl_text_then_image``) to 1.0, against
``SPREAD_TOL`` = 64u = 0.25. And when the phase error past the short probe matches no 16-bit cause at all
(an image after ~2000 text tokens: its error is then inside the envelope above, ratio 0.97 at 2000 text
tokens, 0.49 at 4000), ``diagnose`` says it cannot tell positions that change past the probe from several
positions per token, again "not single-axis RoPE" and no fix.

Still out of reach (measured): several positions per token that first differ past ``max_position`` (an
image after more text tokens than that, a grid wider than that) are a 1D RoPE over every position the
check reads: reported OK, or as the pairing the short probe saw. Probe such a function with
:func:`diagnose_axes`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core import Layout, pair_indices
from ..multiaxis import MultiAxis
from ..precision import UNIT_ROUNDOFF
from .ladder import fit_ladder
from .probes import STRUCT_TOL, NotATensor, call, sanity_checks

__all__ = [
    "AxisReport",
    "diagnose_axes",
    "single_axis_deviation",
    "position_spread",
    "Spread",
    "SINGLE_AXIS_LENGTH",
    "NOT_SINGLE_AXIS",
    "SPREAD_TOL",
    "ladder_check",
]

SINGLE_AXIS_LENGTH = 64  # long enough that a flattened grid of width <= 32 wraps at least once
NOT_SINGLE_AXIS = 0.3  # relative Toeplitz deviation; a 1D RoPE sits at round-off (bf16 angles below 0.1)
# fn may form its tables in float32 (transformers does): angles and |(cos, sin)| are then good to a few
# float32 ulps times the position, far below this, while a wrong pairing or a non-rotation is off by O(1).
AXIS_TOL = 2.0**-12


# One token, one position: under a single-axis RoPE every pair of a token reads the same position, each
# to within 3u of 16-bit rounding (positions are common to all pairs, inv_freq a per-pair scale, the angle
# and cos/sin rounded once each): normalised angles differ by at most ~12u = 0.047. 64u = 0.25 leaves 5x.
SPREAD_TOL = 64 * UNIT_ROUNDOFF[torch.bfloat16]
# Angles below fp16's smallest normal (2^-14) lose relative precision in fp16 tables: not compared.
ANGLE_FLOOR = 2.0**-14


@dataclass
class Spread:
    """What :func:`position_spread` read: the largest disagreement, where, and from how many pairs."""

    spread: float  # max over tokens of (max - min) / max |.| of the pairs' normalised angles
    token: int  # the token (index along the sequence axis) where it is largest
    pairs: int  # pairs compared (turning, never past pi/2, so unwrapped under a single-axis RoPE)
    style: str  # the pairing the long call was read with


def _pairings(pairs, d: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Full-width pairings that contain the pairs a short probe saw turn (all of them when it saw none):
    interleaved (2i, 2i+1) over the head, half (i, i + D) over [0, 2D) or [d - 2D, d) for the one offset D."""
    seen = {tuple(sorted(p)) for p in pairs}
    out = []
    if all(a % 2 == 0 and b == a + 1 for a, b in seen):
        a, b = pair_indices(d, "interleaved")
        out.append(("interleaved", a, b))
    offsets = {b - a for a, b in seen} or {d // 2}
    if len(offsets) == 1:
        D = offsets.pop()
        for start in sorted({0, d - 2 * D}):
            if start >= 0 and start + 2 * D <= d and all(start <= a < start + D for a, _ in seen):
                a, b = pair_indices(2 * D, "half")
                out.append(("half", a + start, b + start))
    return out


def position_spread(fn: Callable, lay: Layout, sizes: dict[str, int], *, length: int, pairs=(),
                    dtype: torch.dtype = torch.float64, output_permutation=None) -> Spread | None:
    r"""Does every pair of a token see the same position? Over positions 0 .. ``length`` - 1.

    A single-axis RoPE, right or wrong (shifted, restarting, flattened positions, scrambled pairs), turns
    pair i of token n by :math:`p_n\,\omega_i`: one position :math:`p_n` per token. An M-RoPE or axial RoPE
    turns it by :math:`p_{a(i),n}\,\omega_i`, with a(i) the axis driving pair i. Two calls (the a dims, then
    the b dims of a pairing set to 1 at every token) read the angle :math:`	heta_{n,i}` of every pair along
    the sequence (the other axes at index 0). Of the pairs that turn but never past :math:`\pi/2` (so no
    wrap hides a multiple of :math:`2\pi`), each is divided by its largest angle, giving
    :math:`p_n / p_{max}` under one position per token; the spread at token n is (max - min) / max|.| over
    the pairs (angles below ``ANGLE_FLOOR`` left out), on prefixes 16, 64, 256, ... of the sequence too (a
    pair that passes pi/2 late still counts early). Returns the largest spread, or None when no pairing
    containing ``pairs`` is a rotation at every token or fewer than two pairs qualify.
    """
    shape = [length if a == lay.seq else sizes[a] for a in lay.axes]
    d_idx = lay.index("d")
    cu = torch.tensor([0, length], dtype=torch.int32) if lay.seq == "t" else None
    best = None
    for style, a, b in _pairings(pairs, sizes["d"]):
        ys = []
        for idx in (a, b):
            x = torch.zeros(shape, dtype=dtype)
            x.movedim(d_idx, -1)[..., idx] = 1.0
            try:
                y = call(fn, x, lay, cu)
            except NotATensor:
                raise
            except Exception:  # noqa: BLE001 - fn refuses this length: no evidence
                return None
            y = y.reshape(shape).to(torch.float64).movedim(d_idx, -1).movedim(lay.index(lay.seq), 0)
            y = y.reshape(length, -1, y.shape[-1])[:, 0]
            if output_permutation is not None:  # back to input dims (output dim k holds input dim perm[k])
                y = y[:, torch.argsort(torch.tensor(output_permutation))]
            ys.append(y)
        ya, yb = ys  # e_a -> (c, s) in (a, b); e_b -> (-s, c)
        c, s = (ya[:, a] + yb[:, b]) / 2, (ya[:, b] - yb[:, a]) / 2
        scale = max(1.0, float(torch.hypot(c, s).max()))
        if float(torch.maximum((ya[:, a] - yb[:, b]).abs(), (ya[:, b] + yb[:, a]).abs()).max()) > STRUCT_TOL * scale:
            continue  # not this pairing: some pair is no rotation at some token
        theta = torch.atan2(s, c)
        n = 16
        while True:  # prefixes 16, 64, 256, ...: pairs that pass pi/2 later still count over a shorter one
            got = _spread(theta[: min(n, length)], style)
            if got is not None and (best is None or got.spread > best.spread):
                best = got
            if n >= length:
                break
            n *= 4
    return best


def _spread(theta: torch.Tensor, style: str) -> Spread | None:
    top = theta.abs().amax(0)
    keep = (top >= ANGLE_FLOOR) & (top <= math.pi / 2)
    if int(keep.sum()) < 2:
        return None
    th = theta[:, keep]
    ref = th.gather(0, th.abs().argmax(0, keepdim=True))  # each pair's largest angle, signed
    q = torch.where(th.abs() >= ANGLE_FLOOR, th / ref, torch.nan)
    n_ok = (~q.isnan()).sum(1)
    hi, lo = q.nan_to_num(-math.inf).amax(1), q.nan_to_num(math.inf).amin(1)
    row = torch.where(n_ok >= 2, (hi - lo) / torch.maximum(hi.abs(), lo.abs()), torch.zeros_like(hi))
    k = int(row.argmax())
    return Spread(float(row[k]), k, int(keep.sum()), style)


def single_axis_deviation(fn: Callable, *, layout: str, sizes: dict[str, int]) -> float:
    r""":math:`\max|S_{m+1,n+1} - S_{mn}| / \max|S|` over ``SINGLE_AXIS_LENGTH`` positions (one q, one k)."""
    lay_seq = "t" if "t" in layout.split() else "s"
    return sanity_checks(fn, layout=layout, sizes={**sizes, lay_seq: SINGLE_AXIS_LENGTH})["relative"]


@dataclass
class AxisReport:
    """What :func:`diagnose_axes` read: style, the axis of each pair, frequencies, and the matching sections
    (a :class:`~ropelab.multiaxis.MultiAxis`, or None)."""

    style: str | None
    axis_of_pair: list[int | None]
    inv_freq: torch.Tensor
    sections: MultiAxis | None
    verdict: str
    base: float | None = None  # the ladder's base the frequencies were checked against (None: no reading)

    @property
    def spec(self) -> MultiAxis | None:
        """Deprecated name of :attr:`sections` (a ``spec`` in ropelab is a ``RopeSpec``)."""
        warnings.warn("AxisReport.spec is renamed AxisReport.sections.", DeprecationWarning, stacklevel=2)
        return self.sections

    def __str__(self) -> str:
        counts = {k: self.axis_of_pair.count(k) for k in sorted({a for a in self.axis_of_pair if a is not None})}
        return (f"multi-axis RoPE: style {self.style}, pairs per axis {counts}, sections {self.sections}\n"
                f"  {self.verdict}")


def _pair_angles(fn, x, positions, a_idx, b_idx) -> torch.Tensor:
    """Each pair's angle at each token, from two basis inputs (float64): [s, r/2]."""
    s, d = x.shape
    outs = []
    for idx in (a_idx, b_idx):
        e = torch.zeros(s, d, dtype=torch.float64)
        e[:, idx] = 1.0
        outs.append(fn(e, positions).double())
    ya, yb = outs  # e_a -> (cos, sin) in (a, b); e_b -> (-sin, cos)
    c = (ya[:, a_idx] + yb[:, b_idx]) / 2
    sn = (ya[:, b_idx] - yb[:, a_idx]) / 2
    # a rotation of the pair keeps |(c, s)| = 1 and is antisymmetric; anything else gets a NaN angle
    ok = ((c**2 + sn**2 - 1).abs() < AXIS_TOL) & ((ya[:, a_idx] - yb[:, b_idx]).abs() < AXIS_TOL)
    return torch.where(ok, torch.atan2(sn, c), torch.nan)


def diagnose_axes(fn: Callable, *, n_axes: int, head_dim: int, seq: int = 8) -> AxisReport:
    """Probe ``fn(x [s, d], positions [n_axes, s]) -> [s, d]`` one axis at a time (float64)."""
    if n_axes < 1 or head_dim < 2 or head_dim % 2:
        raise ValueError(f"n_axes >= 1 and an even head_dim are needed, got {n_axes}, {head_dim}.")
    x = torch.zeros(seq, head_dim, dtype=torch.float64)
    best = None
    for style in ("half", "interleaved"):
        a_idx, b_idx = pair_indices(head_dim, style)
        per_axis = []
        for k in range(n_axes):
            pos = torch.zeros(n_axes, seq, dtype=torch.long)
            pos[k] = torch.arange(seq)
            per_axis.append(_pair_angles(fn, x, pos, a_idx, b_idx))  # [s, r/2]
        # A consistent pairing gives angles m * w_i (mod 2 pi) for the one axis that drives pair i.
        omega = torch.stack([t[1] for t in per_axis])  # [A, r/2]: the angle at position 1
        m = torch.arange(seq, dtype=torch.float64)[:, None]
        fits = torch.stack([
            (torch.remainder(t - m * w + math.pi, 2 * math.pi) - math.pi).abs().amax(0) < AXIS_TOL
            for t, w in zip(per_axis, omega)
        ])  # [A, r/2]
        turns = omega.abs() > AXIS_TOL * 1e-3  # the slowest real pair turns ~1e-4 rad/position
        if bool(fits.all()) and bool((turns.sum(0) <= 1).all()) and not any(bool(t.isnan().any()) for t in per_axis):
            best = (style, omega, turns)
            break
    if best is None:
        return AxisReport(None, [], torch.empty(0), None,
                          "not multi-axis RoPE: no pairing (half or interleaved) turns each pair by one axis's "
                          "position times a constant; nothing to fix from here.")
    style, omega, turns = best
    axis = [int(turns[:, i].nonzero()[0]) if bool(turns[:, i].any()) else None for i in range(turns.shape[1])]
    inv_freq = omega.abs().amax(0)
    counts = tuple(axis.count(k) for k in range(n_axes))
    spec, base, refused = None, None, []
    if None not in axis:
        for kw in ({}, {"interleaved": True}, {"axial": True}):
            try:
                cand = MultiAxis(counts, **kw)
            except ValueError:  # interleaving cannot realise these counts
                continue
            if cand.axis_of_pair().tolist() != axis:
                continue
            # M-RoPE shares one ladder: strictly decreasing across all pairs; axial restarts per axis
            if not cand.axial and not bool((inv_freq[1:] < inv_freq[:-1]).all()):
                continue
            got, why = ladder_check(cand, inv_freq)
            if got is None:
                refused.append(why)
                continue
            spec, base = cand, got
            if not cand.axial:
                break
    kind = "unmatched" if spec is None else ("axial" if spec.axial else
                                              "interleaved M-RoPE" if spec.interleaved else "contiguous M-RoPE")
    verdict = f"{kind}: {style} pairs, sections {counts}" + ("" if None not in axis else
                                                             f"; {axis.count(None)} pairs never turn")
    if spec is None and refused:
        verdict += "; " + "; ".join(refused)
    return AxisReport(style, axis, inv_freq, spec, verdict, base)


def _axis_rtol(base: float) -> float:
    r"""How far a measured frequency may sit from its ladder, relative. ``fn`` may form ``inv_freq`` in float32
    (:math:`b^{-2j/r}`: the exponent's rounding amplified by :math:`\ln b`, a few roundings more:
    :math:`(\ln b + 8)u`), the angle :math:`m\omega` one more u, and cos/sin one each, which move ``atan2``'s
    angle by at most :math:`2u|\theta|` (:math:`u = 2^{-24}`); the read-out is float64. Twice
    :math:`(\ln b + 11)u` covers it; a wrong base or another ladder is off by a fraction of the frequency."""
    return 2 * (math.log(base) + 11) * UNIT_ROUNDOFF[torch.float32]


def ladder_check(cand: MultiAxis, inv_freq: torch.Tensor) -> tuple[float | None, str]:
    r"""(the base, "") when the measured ``inv_freq`` is the candidate's ladder within :func:`_axis_rtol`, else
    (None, what differs). Axial: each axis's own default ladder :math:`b^{-2j/(2 s_k)}`, one base b for all
    (``MultiAxis.inv_freq``); M-RoPE: one known ladder across the head (``ropelab.diagnosis.ladder``, any
    scaling it recognises). The base is read by ``fit_ladder`` (from the leading pairs)."""
    kind = "axial" if cand.axial else "M-RoPE"
    if cand.axial:
        ends = [0]
        for k in cand.order or range(cand.n_axes):  # the runs in their order along the head
            ends.append(ends[-1] + cand.sections[k])
        fits = [fit_ladder(inv_freq[a:b], 2 * (b - a), 2 * (b - a)) if b - a >= 2 else None
                for a, b in zip(ends[:-1], ends[1:])]
        bases = [f.base for f in fits if f is not None and f.name == "default"]
        if not bases:
            return None, f"no {kind} reading: no axis's frequencies follow a default ladder b^(-2j/(2 s_k))"
        base = bases[0]
        ideal = cand.inv_freq(base)
    else:
        fit = fit_ladder(inv_freq, 2 * cand.n_pairs, 2 * cand.n_pairs)
        if fit is None:
            return None, f"no {kind} reading: its frequencies follow no known ladder across the head"
        base, ideal = fit.base, fit.inv_freq
    rel = (inv_freq / ideal - 1).abs()
    tol = _axis_rtol(base)
    if float(rel.max()) > tol:
        i = int(rel.argmax())
        return None, (f"no {kind} reading: pair {i} (axis {int(cand.axis_of_pair()[i])}) turns at "
                      f"{float(inv_freq[i]):.6g} rad/position, the {kind} ladder at base {base:.6g} at "
                      f"{float(ideal[i]):.6g} (relative {float(rel[i]):.2g} > {tol:.1e})")
    return base, ""
