r"""Frequency ladders: which known ``inv_freq`` ladder a measured one is, and with which parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..scaling import default_inv_freq, frequencies

__all__ = ["Ladder", "fit_ladder", "rel_err", "LADDER_RTOL", "LADDER_RESEMBLES", "fmt", "snap"]

# A frequency ladder matches within 2**-16 relative (inv_freq held in float32 errs by ~2**-24); it
# "resembles" one within 2**-5 (inv_freq held in bf16 errs by up to 2**-9 relative).
LADDER_RTOL = 2.0**-16
LADDER_RESEMBLES = 2.0**-5
# Original contexts tried when matching yarn / llama3 ladders (powers of two, 256 .. 256k).
ORIGINAL_CONTEXTS = tuple(2**k for k in range(8, 19))


def snap(v: float, digits: int = 3) -> float:
    """``v`` rounded to ``digits`` significant digits (10000.00003 -> 10000)."""
    if not math.isfinite(v) or v <= 0:
        return v
    return round(v, digits - 1 - math.floor(math.log10(v)))


def fmt(v: float | None, digits: int = 4) -> str:
    """``v`` in ``digits`` significant digits; "-" for None."""
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


@dataclass
class Ladder:
    """A known frequency ladder matched to measured ``inv_freq``."""

    name: str  # "default", "linear", "yarn", "llama3", "proportional"
    base: float
    rope_scaling: dict | None
    inv_freq: torch.Tensor  # float64, the ideal ladder
    attention_factor: float
    rel_err: float  # max |measured / ideal - 1|

    @property
    def exact(self) -> bool:
        return self.rel_err <= LADDER_RTOL

    def describe(self) -> str:
        if self.rope_scaling is None:
            return "default"
        p = {k: v for k, v in self.rope_scaling.items() if k != "rope_type"}
        return f"{self.name} (" + ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in p.items()) + ")"


def rel_err(measured: torch.Tensor, ideal: torch.Tensor) -> float:
    nz = ideal != 0
    if bool((measured[~nz] != 0).any()):
        return math.inf
    if not bool(nz.any()):
        return 0.0
    return float((measured[nz] / ideal[nz] - 1).abs().max())


def _candidate(name, head_dim, rotary_dim, base, rope_scaling, omega) -> Ladder | None:
    try:
        ideal, af = frequencies(head_dim, base, rotary_dim=rotary_dim, rope_scaling=rope_scaling)
    except ValueError:
        return None
    if ideal.shape != omega.shape:
        return None
    return Ladder(name, base, rope_scaling, ideal, af, rel_err(omega, ideal))


def fit_ladder(omega: torch.Tensor, rotary_dim: int, head_dim: int) -> Ladder | None:
    r"""The known ladder closest to the measured ``omega`` (float64, pair order), or None if none resembles it.

    default and linear: a least-squares line through :math:`\log\omega_i` against 2i/r (slope
    :math:`-\log b`, intercept :math:`-\log s`). yarn and llama3 keep the high frequencies: b comes from
    :math:`\omega_0/\omega_1 = b^{2/r}`, the factor s from the lowest frequency, and the original
    context is tried over powers of two. proportional: zero frequencies past the first pairs, exponents
    over the head dim. Among the ladders that match, the one with the roundest base and factor wins.
    """
    omega = omega.to(torch.float64)
    n = omega.numel()
    if n < 2 or bool((omega < 0).any()):
        return None
    nz = int((omega > 0).sum())
    if nz < n:  # proportional: zero frequencies after the first nz pairs
        if nz < 2 or bool((omega[:nz] == 0).any()) or rotary_dim != head_dim:
            return None
        x = 2 * torch.arange(nz, dtype=torch.float64) / head_dim
        slope, icpt = line_fit(x, omega[:nz].log())
        simple = [
            _candidate(
                "proportional",
                head_dim,
                None,
                b,
                {"rope_type": "proportional", "partial_rotary_factor": 2 * nz / head_dim, "factor": s},
                omega,
            )
            for b in _roundings(math.exp(-slope))
            for s in _roundings(math.exp(-icpt), one=True)
        ]
        return _choose([c for c in simple if c], [])
    x = 2 * torch.arange(n, dtype=torch.float64) / rotary_dim
    slope, icpt = line_fit(x, omega.log())
    simple = []
    for b in _roundings(math.exp(-slope)):
        for s in _roundings(math.exp(-icpt), one=True):
            if b > 1:
                sc = None if s == 1.0 else {"rope_type": "linear", "factor": s}
                simple.append(_candidate("default" if sc is None else "linear", rotary_dim, rotary_dim, b, sc, omega))
    simple = [c for c in simple if c]
    if any(c.exact for c in simple):
        return _choose(simple, [])
    # yarn / llama3: the first pairs keep b^{-2i/r}; the last are divided by the factor.
    complex_ = []
    for b in _roundings(float((omega[0] / omega[1]) ** (rotary_dim / 2))):
        if not b > 1:
            continue
        s_raw = float(default_inv_freq(rotary_dim, b)[-1] / omega[-1])
        if s_raw <= 1 + LADDER_RTOL:
            continue
        for s in _roundings(s_raw):
            for L0 in ORIGINAL_CONTEXTS:
                for sc in (
                    {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0},
                    {
                        "rope_type": "llama3",
                        "factor": s,
                        "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0,
                        "original_max_position_embeddings": L0,
                    },
                ):
                    c = _candidate(sc["rope_type"], rotary_dim, rotary_dim, b, sc, omega)
                    if c:
                        complex_.append(c)
    return _choose(simple, complex_)


def _roundings(v: float, one: bool = False) -> list[float]:
    """``v`` rounded to 1, 2 and 3 significant digits, then as is (roundest first); 1.0 first if ``one``."""
    out = [1.0] if one else []
    for c in (snap(v, 1), snap(v, 2), snap(v, 3), v):
        if c not in out:
            out.append(c)
    return out


def line_fit(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    A = torch.stack([x, torch.ones_like(x)], 1)
    sol = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
    return float(sol[0]), float(sol[1])


def _choose(simple: list[Ladder], complex_: list[Ladder]) -> Ladder | None:
    """The first exact candidate (candidates come roundest first, simple ladders before yarn/llama3); else
    the roundest simple one within twice the best simple error, if it resembles; else the closest other."""
    for c in simple + complex_:
        if c.exact:
            return c
    if simple:
        best = min(c.rel_err for c in simple)
        pick = next(c for c in simple if c.rel_err <= 2 * best)
        if pick.rel_err <= LADDER_RESEMBLES:
            return pick
    if complex_:
        pick = min(complex_, key=lambda c: c.rel_err)
        if pick.rel_err <= LADDER_RESEMBLES:
            return pick
    return None


def fit_base(omega: torch.Tensor, r: int) -> float | None:
    pos = omega > 0
    if int(pos.sum()) < 2:
        return None
    x = 2 * torch.arange(omega.numel(), dtype=torch.float64)[pos] / r
    slope, _ = line_fit(x, omega[pos].log())
    return math.exp(-slope) if slope < 0 else None


