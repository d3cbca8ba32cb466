r"""Frequency ladders: which known ``inv_freq`` ladder a measured one is, and with which parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..scaling import default_inv_freq, frequencies
from .probes import STRUCT_TOL

__all__ = ["Ladder", "fit_ladder", "head_base", "tail_base", "rel_err", "LADDER_RTOL", "LADDER_RESEMBLES", "fmt",
           "snap", "RHO_TOL"]

# A frequency ladder matches within 2**-16 relative (inv_freq held in float32 errs by ~2**-24); it
# "resembles" one within 2**-5 (inv_freq held in bf16 errs by up to 2**-9 relative).
LADDER_RTOL = 2.0**-16
LADDER_RESEMBLES = 2.0**-5
# Log-ratios of neighbouring frequencies agree within this on the unscaled head of a ladder (float32
# inv_freq errs by ~2**-23 there), while a yarn / llama3 ramp departs from it by O(0.01) or more.
RUN_TOL = 2.0**-16
# A per-pair factor rho_i = omega_i / b^{-2i/r} within this of 1 (or of 1/s) is unscaled (or fully scaled).
RHO_TOL = 2.0**-14


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
    """A known frequency ladder matched to measured ``inv_freq``.

    Args:
        name: the ladder's rope type: ``"default"``, ``"linear"``, ``"yarn"``, ``"llama3"`` or
            ``"proportional"``.
        base: its base.
        rope_scaling: its Hugging Face scaling dict, None for the default ladder.
        inv_freq: the ideal ladder, float64, one frequency per pair.
        attention_factor: the attention factor the ladder implies.
        rel_err: max ``|measured / ideal - 1|`` over the pairs (``exact`` when within the fit's tolerance).
        note: what the ladder cannot determine (e.g. YaRN's L0 and betas only up to a common scale).
    """

    name: str  # "default", "linear", "yarn", "llama3", "proportional"
    base: float
    rope_scaling: dict | None
    inv_freq: torch.Tensor  # float64, the ideal ladder
    attention_factor: float
    rel_err: float  # max |measured / ideal - 1|
    note: str = ""  # what the ladder cannot determine (e.g. yarn's L0 and betas only up to a common scale)

    @property
    def exact(self) -> bool:
        return self.rel_err <= LADDER_RTOL

    def describe(self) -> str:
        if self.rope_scaling is None:
            return "default"
        p = {k: v for k, v in self.rope_scaling.items() if k != "rope_type"}
        def show(v):
            if isinstance(v, float):
                return str(int(v)) if v.is_integer() and abs(v) < 1e9 else fmt(v, 6)
            return v

        return f"{self.name} (" + ", ".join(f"{k}={show(v)}" for k, v in p.items()) + ")"


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


def fit_ladder(
    omega: torch.Tensor, rotary_dim: int, head_dim: int, *, norm_scale: float | None = None
) -> Ladder | None:
    r"""The known ladder of the measured ``omega`` (float64, pair order) with fitted parameters, or None.

    1. The base b from the unscaled high-frequency end: every scaling keeps :math:`\omega_i/\omega_{i+1}
       = b^{2/r}` on its leading pairs (linear divides all of them by s alike), so b is the mean ratio
       over the longest leading run of equal ratios (``head_base``), rounded to the fewest significant
       digits that still reproduce the ladder. The fully scaled low-frequency end of a yarn or llama3 ladder
       keeps the same ratio (every pair there is divided by the same s), so b is also read from the longest
       trailing run (``tail_base``): a yarn ladder on a narrow rotary slice, or with a short trained context,
       leaves fewer than two leading pairs unscaled, too few for the head.
    2. The per-pair factor :math:`\rho_i = \omega_i / b^{-2i/r}`: constant 1 (default) or 1/s (linear);
       else 1 on the head, 1/s on the tail (s from the tail) and a ramp between, linear in i for yarn
       (:math:`\rho_i = 1 - (1 - 1/s)\,(i - \ell)/(h - \ell)`, Peng et al. 2023 eq. (18)-(20)) and linear
       in :math:`\omega^{b}_i` for llama3 (Meta 2024). The ramp's ends give yarn's correction range and
       llama3's wavelength band, and from them the config values (``ramp_params``).
    3. Every candidate is rebuilt with ``ropelab.frequencies`` and compared with ``omega``: the roundest
       exact one wins (within ``LADDER_RTOL``); else the closest that resembles it (``LADDER_RESEMBLES``).
       Where ladders of different types reproduce it and ``norm_scale`` (the measured norm scale) is given,
       those whose attention factor is that scale come first: a step (llama3 with equal low and high
       frequency factors, or yarn with adjacent correction dims) is llama3 at norm scale 1, yarn at
       :math:`0.1\ln s + 1`.

    proportional (zero frequencies past the first pairs, exponents over the head dim) is a line fit.

    Args:
        omega: the measured frequency of each pair (float64, pair order), e.g. from :func:`rotation_angles`.
        rotary_dim: r, how many dims rotate (2 ``len(omega)``).
        head_dim: d, the whole head (proportional's exponents are over d).
        norm_scale: the measured norm scale (an attention factor), to prefer ladders whose factor is that scale;
            None when not measured.
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
        return _choose([c for c in simple if c], norm_scale)
    head = head_base(omega, rotary_dim)
    cands: list[Ladder] = []
    bases = _roundings(head[0], rtol=2.0**-10) if head else []
    tail = tail_base(omega, rotary_dim)
    if tail is not None and (head is None or abs(math.log(tail[0] / head[0])) > 2.0**-10):
        bases += [b for b in _roundings(tail[0], rtol=2.0**-10) if b not in bases]
    for b in bases:
        if not b > 1:
            continue
        rho = omega / default_inv_freq(rotary_dim, b)
        if float((rho / rho[0] - 1).abs().max()) <= RHO_TOL:  # one factor for every pair: default or linear
            for s in _roundings(1 / float(rho[0]), one=True):
                if s != 1.0 and abs(s - 1) <= RHO_TOL:  # a factor indistinguishable from 1 is the default
                    continue
                sc = None if s == 1.0 else {"rope_type": "linear", "factor": s}
                cands.append(_candidate("default" if sc is None else "linear", rotary_dim, rotary_dim, b, sc, omega))
            continue
        for name, sc, note in ramp_params(rho, b, rotary_dim):
            c = _candidate(name, rotary_dim, rotary_dim, b, sc, omega)
            if c is not None:
                c.note = note
                cands.append(c)
    cands = [c for c in cands if c]
    if not any(c.exact for c in cands):  # a ladder held in 16 bits: only a line through it resembles one
        x = 2 * torch.arange(n, dtype=torch.float64) / rotary_dim
        slope, icpt = line_fit(x, omega.log())
        for b in _roundings(math.exp(-slope))[:3]:
            for s in _roundings(math.exp(-icpt), one=True)[:3]:
                if b > 1 and (s == 1.0 or abs(s - 1) > RHO_TOL):
                    sc = None if s == 1.0 else {"rope_type": "linear", "factor": s}
                    c = _candidate("default" if sc is None else "linear", rotary_dim, rotary_dim, b, sc, omega)
                    cands += [c] if c else []
    return _choose(cands, norm_scale)


def head_base(omega: torch.Tensor, rotary_dim: int) -> tuple[float, int] | None:
    r"""``(b, k)``: the base from the k leading ratios :math:`\omega_i/\omega_{i+1}` that agree (the
    unscaled high-frequency end), :math:`b = \exp(\tfrac r2 \overline{\ln(\omega_i/\omega_{i+1})})`;
    None when the very first ratios already disagree (no unscaled end to read a base from)."""
    lr = (omega[:-1] / omega[1:]).log()
    if lr.numel() == 0 or not bool(torch.isfinite(lr).all()) or float(lr[0]) <= 0:
        return None
    k = 1
    while k < lr.numel() and abs(float(lr[k] - lr[0])) <= RUN_TOL:
        k += 1
    if k < 2 and lr.numel() >= 2:  # one ratio alone cannot tell a ladder from a ramp
        return None
    return math.exp(rotary_dim / 2 * float(lr[:k].mean())), k


def tail_base(omega: torch.Tensor, rotary_dim: int) -> tuple[float, int] | None:
    r"""``(b, k)``: the base from the k trailing ratios :math:`\omega_i/\omega_{i+1}` that agree (the fully
    scaled low-frequency end of a yarn or llama3 ladder, every pair there divided by the same s, so the
    ratio is still :math:`b^{2/r}`); None when fewer than two trailing ratios agree."""
    lr = (omega[:-1] / omega[1:]).log()
    if lr.numel() < 2 or not bool(torch.isfinite(lr).all()) or float(lr[-1]) <= 0:
        return None
    k = 1
    while k < lr.numel() and abs(float(lr[-1 - k] - lr[-1])) <= RUN_TOL:
        k += 1
    if k < 2:
        return None
    return math.exp(rotary_dim / 2 * float(lr[-k:].mean())), k


def ramp_params(rho: torch.Tensor, b: float, r: int) -> list[tuple[str, dict, str]]:
    r"""yarn and llama3 configs whose per-pair factor is ``rho`` at base ``b``: (name, rope_scaling, note).

    Needs a head (rho = 1) and a tail (rho = 1/s): s = 1/rho_tail. Between them g_i = (1 - rho_i) /
    (1 - 1/s) is the ramp. yarn: g linear in i from the correction dim :math:`\ell = d(\beta_{fast})` to
    :math:`h = d(\beta_{slow})`, :math:`d(\beta) = r\ln(L_0/2\pi\beta) / (2\ln b)`, so only
    :math:`L_0/\beta = 2\pi b^{2d/r}` is determined: reported with beta_slow = 1 unless beta_fast = 32,
    beta_slow = 1 (the defaults) fit. With truncation (the default) :math:`\ell, h` are integers.
    llama3: :math:`\mu_i = 1 - g_i = (L_0\,\omega^b_i/2\pi - f_{lo}) / (f_{hi} - f_{lo})`, linear in
    :math:`\omega^b_i`, so only :math:`L_0/f_{lo}` and :math:`L_0/f_{hi}` are determined: reported with
    low_freq_factor = 1.
    """
    n = rho.numel()
    w0 = default_inv_freq(r, b)
    one = (rho - 1).abs() <= RHO_TOL
    if not bool(one[0]):
        return []
    tail = float(rho[-1])
    if not 0 < tail < 1 - RHO_TOL:
        return []
    s_raw = 1 / tail
    at_tail = (rho - tail).abs() <= RHO_TOL * tail
    i0 = int((~one).nonzero()[0]) - 1  # last unscaled pair
    i1 = int(at_tail.nonzero()[0])  # first fully scaled pair
    if i1 <= i0 or not bool(at_tail[i1:].all()) or not bool(one[: i0 + 1].all()):
        return []
    idx = torch.arange(n, dtype=torch.float64)
    out: list[tuple[str, dict, str]] = []
    for s in _roundings(s_raw, rtol=2.0**-10):
        g = (1 - rho) / (1 - 1 / s)
        mid = list(range(i0 + 1, i1))
        out += _yarn_configs(g, idx, mid, i0, i1, s, b, r)
        out += _llama3_configs(g, w0, mid, i0, i1, s)
    if i1 == n - 1 and i1 - i0 >= 2:  # the ramp may run past the last pair: its whole end h > n - 1 and s with
        k = 1 - float(rho[i0 + 1])  # the measured first step (1 - 1/s) / (h - i0) (truncated yarn), roundest s
        for h in range(n, r):
            if not 0 < k * (h - i0) < 1:
                break
            for s in _roundings(1 / (1 - k * (h - i0)), rtol=2.0**-10)[:3]:
                g = (1 - rho) / (1 - 1 / s)
                past = "the yarn ramp runs past the last pair: the ladder fixes the factor only with the ramp's end"
                out += [(nm, sc, "; ".join(filter(None, [note, past])))
                        for nm, sc, note in _yarn_configs(g, idx, list(range(i0 + 1, n)), i0, n, s, b, r)]
    return out


def _yarn_configs(g, idx, mid, i0, i1, s, b, r) -> list[tuple[str, dict, str]]:
    def L_over_beta(d: float) -> float:  # d(beta) = corr -> L0 / beta
        return 2 * math.pi * b ** (2 * d / r)

    ranges: list[tuple[float, float, bool]] = []  # (low, high, truncate)
    if len(mid) >= 2:
        slope, icpt = line_fit(idx[mid], g[mid])
        if slope > 0:
            ranges.append((-icpt / slope, (1 - icpt) / slope, False))
    if len(mid) >= 1:  # truncated: integer ends, low = i0 and the ramp's first step gives high
        ranges.append((float(i0), i0 + 1 / float(g[i0 + 1]), True))
    else:
        ranges.append((float(i0), float(i1), True))
    default_gap = r * math.log(32) / (2 * math.log(b))
    out = []
    note = (
        "yarn's ladder fixes only original_max_position_embeddings / beta_fast and / beta_slow "
        "(one common scale is free)"
    )
    for low, high, trunc in ranges:
        # yarn's correction dims lie in [0, r - 1] (clamped); a fit far outside is no yarn ramp (and
        # b ** (2 d / r) would overflow for a ramp of near-zero slope, as a multi-axis RoPE can give).
        if not (math.isfinite(low) and math.isfinite(high)) or max(abs(low), abs(high)) > 2 * r:
            continue
        if trunc and abs(high - round(high)) > 1e-3:
            continue
        if trunc:
            high = float(round(high))
        L_hi, L_lo = L_over_beta(high), L_over_beta(low)  # L0 / beta_slow, L0 / beta_fast
        if trunc:  # d(beta_slow) in (high - 1, high], d(beta_fast) in [low, low + 1), or below 1 when low = 0
            lo_range = (L_over_beta(high - 1), L_hi)  # (transformers clamps a negative d(beta_fast) to 0)
            fast_lo = 32 * L_over_beta(low) if low > 0 else 0.0
            L0_lo, L0_hi = max(lo_range[0], fast_lo), min(lo_range[1], 32 * L_over_beta(low + 1))
            interval = (f"with the default betas (32, 1) the ladder fixes original_max_position_embeddings only to the "
                        f"range {L0_lo:.6g} .. {L0_hi:.6g}: every value there gives the same whole correction dims "
                        f"({low:g}, {high:g}); the roundest is shown")
            for L0 in _roundest_in(L0_lo, L0_hi):
                sc = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}
                out.append(("yarn", sc, interval))
            for L0 in _roundest_in(*lo_range):
                for bf in _roundest_in(L0 / L_over_beta(low + 1), L0 / L_lo):
                    sc = {
                        "rope_type": "yarn",
                        "factor": s,
                        "beta_fast": bf,
                        "beta_slow": 1.0,
                        "original_max_position_embeddings": L0,
                    }
                    out.append(("yarn", sc, note))
        else:
            if abs((high - low) / default_gap - 1) <= 1e-3:
                for L0 in _roundings(L_hi, rtol=2.0**-8):
                    sc = {"rope_type": "yarn", "factor": s, "truncate": False, "original_max_position_embeddings": L0}
                    out.append(("yarn", sc, ""))
            for L0 in _roundings(L_hi, rtol=2.0**-8):
                for bf in _roundings(L0 / L_lo, rtol=2.0**-8):
                    sc = {
                        "rope_type": "yarn",
                        "factor": s,
                        "beta_fast": bf,
                        "beta_slow": 1.0,
                        "truncate": False,
                        "original_max_position_embeddings": L0,
                    }
                    out.append(("yarn", sc, note))
    return out


def _llama3_configs(g, w0, mid, i0, i1, s) -> list[tuple[str, dict, str]]:
    note = "llama3's ladder fixes only original_max_position_embeddings / low_freq_factor and / high_freq_factor"
    lam = 2 * math.pi / w0
    cands: list[tuple[float, float]] = []  # (L0, high_freq_factor) with low_freq_factor = 1
    mu = 1 - g
    if len(mid) >= 2:
        A, B = line_fit(w0[mid], mu[mid])
        if A > 0 and B < 0:
            hf = 1 - 1 / B
            cands.append((-2 * math.pi * A / B, hf))
    elif len(mid) == 1:  # one point on the band: assume high / low = 4 (the default ratio)
        i = mid[0]
        cands.append((float(lam[i]) * (1 + 3 * float(mu[i])), 4.0))
    else:  # no point on the band: any L0 with 4 lambda_i0 < L0 < lambda_i1 (low = 1, high = 4)
        lo, hi = 4 * float(lam[i0]), float(lam[i1])
        if lo < hi:
            cands += [(L0, 4.0) for L0 in _roundest_in(lo, hi)]
        # or a step: low = high (= 1), no band at all, any L0 with lambda_i0 < L0 < lambda_i1
        cands += [(L0, 1.0) for L0 in _roundest_in(float(lam[i0]), float(lam[i1]))]
    out = []
    for L0_raw, hf_raw in cands:
        for L0 in _roundings(L0_raw, rtol=2.0**-8):
            for hf in _roundings(hf_raw, rtol=2.0**-8):
                sc = {
                    "rope_type": "llama3",
                    "factor": s,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": hf,
                    "original_max_position_embeddings": L0,
                }
                out.append(("llama3", sc, note if hf != 4.0 or len(mid) < 2 else ""))
    return out


def _roundest_in(lo: float, hi: float) -> list[float]:
    """The roundest numbers in [lo, hi) (fewest significant digits, powers of two), roundest first."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo or hi <= 0:
        return []
    out = []
    for k in range(int(math.floor(math.log2(max(lo, 1e-300)))), int(math.ceil(math.log2(hi))) + 1):
        if lo <= 2.0**k < hi:
            out.append(float(2**k))
    for digits in range(1, 8):
        q = 10.0 ** (math.floor(math.log10(hi)) - digits + 1)
        c = math.ceil(lo / q) * q
        if c < hi and c not in out:
            out.append(float(round(c, 10)))
        if len(out) >= 3:
            break
    return out[:3]


def _roundings(v: float, one: bool = False, rtol: float | None = None) -> list[float]:
    """``v`` rounded to 1 .. 6 significant digits, then as is (roundest first); 1.0 first if ``one``.
    With ``rtol`` only the roundings within that relative distance of ``v`` (a fitted value is known
    that well, so rounder numbers further away cannot reproduce the ladder)."""
    out = [1.0] if one else []
    for c in (*(snap(v, k) for k in range(1, 7)), v):
        if c not in out and (rtol is None or abs(c / v - 1) <= rtol):
            out.append(c)
    return out


def line_fit(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y against x."""
    A = torch.stack([x, torch.ones_like(x)], 1)
    sol = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
    return float(sol[0]), float(sol[1])


def _digits(v) -> int:
    """Significant digits ``v`` needs (1 for 4096 as a power of two too); 0 for non-floats."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return 0
    if math.log2(v) == round(math.log2(v)):
        return 1
    return next((k for k in range(1, 8) if snap(v, k) == v), 8)


def _roundness(c: Ladder) -> int:
    return _digits(c.base) + sum(_digits(v) for v in (c.rope_scaling or {}).values())


def _choose(cands: list[Ladder], norm_scale: float | None = None) -> Ladder | None:
    """Among the candidates within float32 rounding of the ladder (2**-20), else within ``LADDER_RTOL``,
    the one with the roundest parameters (fewest significant digits in all); else the roundest within twice
    the smallest error, if it resembles the ladder (a ladder held in bf16). When two types reproduce it,
    the choice is noted: the ladder cannot tell them, unless only some of them have the measured
    ``norm_scale`` as their attention factor (within ``STRUCT_TOL``, the norm probe's tolerance): those are kept."""
    for tol in (2.0**-20, LADDER_RTOL):
        fits = [c for c in cands if c.rel_err <= tol]
        if fits and norm_scale is not None:
            agree = [c for c in fits if abs(c.attention_factor - norm_scale) <= STRUCT_TOL * max(1.0, norm_scale)]
            if agree and len({c.name for c in agree}) < len({c.name for c in fits}):
                pick = min(agree, key=_roundness)
                for other in sorted({c.name for c in fits} - {c.name for c in agree}):
                    alt = min((c for c in fits if c.name == other), key=_roundness)
                    pick.note = "; ".join(filter(None, [
                        pick.note, f"{alt.describe()} reproduces this ladder too, but its attention factor "
                        f"{alt.attention_factor:.6g} is not the measured norm scale {norm_scale:.6g}: {pick.name}"]))
                fits = [c for c in agree if c.name == pick.name]
        if fits:
            pick = min(fits, key=_roundness)
            others = sorted({c.name for c in fits} - {pick.name})
            if others:
                alt = min((c for c in fits if c.name == others[0]), key=_roundness)
                pick.note = "; ".join(
                    filter(
                        None,
                        [
                            pick.note,
                            f"{alt.describe()} reproduces this ladder too (too few pairs on the "
                            f"ramp to tell {pick.name} from {alt.name}); the rounder parameters are shown",
                        ],
                    )
                )
            return pick
    if cands:  # none fits: the roundest within twice the best error, if that resembles the ladder
        best = min(c.rel_err for c in cands)
        pick = min((c for c in cands if c.rel_err <= 2 * best), key=_roundness)
        if pick.rel_err <= LADDER_RESEMBLES:
            return pick
    return None
