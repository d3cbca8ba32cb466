r"""Is a measured frequency ladder a known ladder rounded to a 16-bit dtype, by whatever route?

``inv_freq`` reaches a model rounded in many ways: computed in float32 and cast (``model.to(torch.bfloat16)``
on a persistent buffer), computed entirely in bf16/fp16 (``1 / base ** (arange(0, d, 2, dtype=bf16) / d)``:
the base, the power and the reciprocal each rounded), the denominator :math:`b^{2i/r}` formed in 16 bits and
inverted in float32, or the exponent :math:`2i/r` rounded (a head dim that is no power of two). What they
share: the measured frequencies :math:`\hat\omega_i` sit a few roundings of that dtype off the expected
ladder :math:`\omega_i`, and one ingredient is *exactly representable* in it. So:

1. **Fit** (``fit_frequencies``). Angles linear in the position, :math:`\theta_{m,i} = m\hat\omega_i`
   (position 0 is the identity), give each pair's frequency by least squares through the origin over
   positions 0 .. L-1, unwrapped around the running estimate on 4, 16, 64, 256, ... positions; its
   standard error :math:`\sigma_i = s_i / \sqrt{\sum m^2}` from the residuals' RMS :math:`s_i` (the
   output's rounding, float32 angles) taken as independent.
2. **Match** (``read_rounding``). For q one of ``inv_freq`` :math:`\omega`, ``denominator``
   :math:`1/\omega` or ``exponent`` :math:`-\ln\omega/\ln b` (default ladder only) and each dtype (bf16
   before fp16: every bf16 value in fp16's range is an fp16 value, so the coarser grid first), the
   ladder is q held in that dtype when, with :math:`\mathrm{ulp}(q)`
   the dtype's spacing at q (subnormals included) and :math:`\tau_i = (4\sigma_i + 4u_{fp32}\hat\omega_i)
   |dq/d\omega|` (the fit's uncertainty and the float32 operations after the rounding, carried into q):

   - every :math:`\hat q_i` is within :math:`\tau_i` of a value of the dtype (checked where
     :math:`\tau_i \le \mathrm{ulp}/16`, on at least ``MIN_RESOLVED`` pairs: a value off the grid passes
     by chance with probability :math:`\le 1/8` per pair);
   - every :math:`|\hat q_i - q_i| \le K\,\mathrm{ulp}(q_i) + \tau_i` with ``K = ROUNDINGS`` = 4: each
     rounding (base, power, reciprocal, cast) errs by at most u relative, and :math:`\mathrm{ulp} > u|q|`;
   - some pair is off by more than :math:`2\tau_i` (else the ladder is float32-exact, no finding).

A float32 ladder, or one of a different base or scaling, fails the first test on the resolved pairs: it is
no 16-bit grid. The report names the dtype, the ingredient and the deviation in ulps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..precision import DTYPE_NAMES, UNIT_ROUNDOFF, wrap_angle

__all__ = ["Rounding", "fit_frequencies", "on_grid", "read_rounding", "ulp", "ROUNDINGS", "MIN_RESOLVED", "QUANTITIES"]

ROUNDINGS = 4  # at most this many ulps off: base, power, reciprocal and cast each rounded once
MIN_RESOLVED = 4  # pairs whose fit resolves the dtype's grid (tau <= ulp / 16) needed to call it a grid
RESOLVE = 1 / 16
QUANTITIES = {
    "inv_freq": "inv_freq",
    "denominator": "the denominator base^(2i/r) (inverted after the rounding)",
    "exponent": "the exponent 2i/r",
}
DTYPES = (torch.bfloat16, torch.float16)  # the coarser grid first: every bf16 value in range is an fp16 value


@dataclass
class Rounding:
    """A measured ladder read as ``quantity`` of the expected ladder held in ``dtype``."""

    dtype: torch.dtype
    quantity: str  # a key of QUANTITIES
    ulps: float  # max |q_hat - q| / ulp(q) over the pairs
    rel_err: float  # max |omega_hat / omega - 1|
    resolved: int  # pairs on which the dtype's grid was checked

    @property
    def tag(self) -> str:
        return {torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]

    def describe(self) -> str:
        name = DTYPE_NAMES[self.dtype]
        return (
            f"the measured frequencies sit up to {self.ulps:.2g} {name} ulps of {QUANTITIES[self.quantity]} "
            f"({self.rel_err:.1e} relative in inv_freq) off it, and {QUANTITIES[self.quantity]} lies exactly on the "
            f"{name} grid on all {self.resolved} pairs measured finely enough to tell"
        )


def ulp(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s values at |q| (float64): eps * 2^floor(log2|q|), subnormals eps * tiny."""
    fi = torch.finfo(dtype)
    a = q.abs().to(torch.float64).clamp_min(fi.tiny)
    return fi.eps * torch.exp2(torch.floor(torch.log2(a)))


def fit_frequencies(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(omega_hat, sigma), each [P] float64, from ``angles`` [L, P] read at positions 0 .. L-1 (see module)."""
    th = angles.to(torch.float64)
    L = th.shape[0]
    m = torch.arange(L, dtype=torch.float64)
    w = wrap_angle(th[1]) if L > 1 else torch.zeros(th.shape[1], dtype=torch.float64)
    n = 4
    while True:
        n = min(n, L)
        unw = m[:n, None] * w + wrap_angle(th[:n] - m[:n, None] * w)
        w = (m[:n, None] * unw).sum(0) / (m[:n] ** 2).sum()
        if n == L:
            break
        n *= 4
    res = unw - m[:, None] * w
    s = (res.pow(2).sum(0) / max(L - 1, 1)).sqrt()
    return w, s / (m**2).sum().sqrt()


def _roundings(q: torch.Tensor, w: torch.Tensor, dt: torch.dtype, base: float | None) -> torch.Tensor:
    """How many ulps of q each pair may be off: ROUNDINGS, plus ln(b) e_i where the exponent e_i = -ln(w_i)/ln b
    is not a value of dt (rounding it by u relative moves ln(omega) by ln(b) e_i u, and ulp(q) > u|q|)."""
    k = torch.full_like(q, float(ROUNDINGS))
    if base is None or not base > 1:
        return k
    e = -w.log() / math.log(base)
    inexact = (e.to(dt).to(torch.float64) - e).abs() > 4 * UNIT_ROUNDOFF[torch.float32] * e.abs()
    return k + math.log(base) * e.abs() * inexact


def _quantity(name: str, omega: torch.Tensor, base: float | None) -> torch.Tensor | None:
    if name == "inv_freq":
        return omega
    if name == "denominator":
        return 1 / omega
    return -omega.log() / math.log(base)


def read_rounding(
    omega_hat: torch.Tensor, sigma: torch.Tensor, expected: torch.Tensor, *, base: float | None = None
) -> Rounding | None:
    """The 16-bit rounding that turns the ``expected`` ladder (float64) into the measured ``omega_hat`` (with
    standard errors ``sigma``), or None. ``base`` (the ladder's, default type only) enables the exponent."""
    w_hat, sig, w = (t.to(torch.float64) for t in (omega_hat, sigma, expected))
    keep = (w > 0) & (w_hat > 0) & torch.isfinite(w_hat)
    if int(keep.sum()) < MIN_RESOLVED or bool(((w == 0) != (w_hat.abs() <= sig * 4)).any()):
        return None
    w_hat, sig, w = w_hat[keep], sig[keep], w[keep]
    rel = float((w_hat / w - 1).abs().max())
    for dt in DTYPES:
        for name in QUANTITIES:
            if name == "exponent" and (base is None or not base > 1):
                continue
            q_hat, q = _quantity(name, w_hat, base), _quantity(name, w, base)
            # the fit's uncertainty and float32 operations after the rounding (a few u relative in omega),
            # carried through q(omega) by |dq/domega|
            slope = {"inv_freq": 1.0, "denominator": 1 / w_hat**2, "exponent": 1 / (w_hat * math.log(base or 2))}[name]
            tau = (4 * sig + 4 * UNIT_ROUNDOFF[torch.float32] * w_hat) * slope
            grid = ulp(q, dt)
            on_grid = q_hat.to(dt).to(torch.float64)
            if not bool(torch.isfinite(on_grid).all()):
                continue
            resolved = (tau <= RESOLVE * grid) & (q != 0)  # q = 0 (the exponent of pair 0) is on every grid
            if int(resolved.sum()) < MIN_RESOLVED:
                continue
            if not bool(((q_hat - on_grid).abs() <= tau)[resolved].all()):
                continue
            off = (q_hat - q).abs()
            if not bool((off <= _roundings(q, w, dt, base) * grid + tau).all()) or not bool((off > 2 * tau).any()):
                continue
            return Rounding(dt, name, float((off / grid)[q != 0].max()), rel, int(resolved.sum()))
    return None


MIN_ON_GRID = 8  # resolved pairs that must all lie on a grid when no ladder is matched: chance <= (1/8)^8


def on_grid(omega_hat: torch.Tensor, sigma: torch.Tensor) -> Rounding | None:
    """The 16-bit dtype whose grid holds every measured frequency, when no known ladder matches (a yarn or
    llama3 ramp rounded to bf16 hides its type): each resolved pair within tau of a value of the dtype, on at
    least ``MIN_ON_GRID`` pairs (a float32 value passes by chance with probability <= 1/8 each)."""
    w_hat, sig = omega_hat.to(torch.float64), sigma.to(torch.float64)
    keep = (w_hat > 4 * sig) & torch.isfinite(w_hat)
    w_hat, sig = w_hat[keep], sig[keep]
    tau = 4 * sig + 4 * UNIT_ROUNDOFF[torch.float32] * w_hat
    for dt in DTYPES:
        resolved = tau <= RESOLVE * ulp(w_hat, dt)
        if int(resolved.sum()) < MIN_ON_GRID:
            continue
        if bool(((w_hat - w_hat.to(dt).to(torch.float64)).abs() <= tau)[resolved].all()):
            return Rounding(dt, "inv_freq", float("nan"), float("nan"), int(resolved.sum()))
    return None
