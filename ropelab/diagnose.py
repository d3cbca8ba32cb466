r"""Tell what a RoPE implementation actually does, by probing it as a black box.

Two silent RoPE bugs pass the usual sanity checks (norms are preserved, and :math:`q\cdot k` still depends
only on a difference of indices): a rotation that runs along the wrong axis (the heads, because the code
assumed another layout), and varlen packing whose positions do not restart at each sequence. ``diagnose``
measures instead of trusting. A RoPE at position m is the linear map

.. math::  y = a\,R_m x, \qquad R_m = \bigoplus_i \begin{pmatrix}\cos m\omega_i & -\sin m\omega_i\\
           \sin m\omega_i & \cos m\omega_i\end{pmatrix} \text{ on the pairs } (a_i, b_i),

the same for every head and batch element (Su et al. 2021, "RoFormer", arXiv 2104.09864). So:

1. **Structure** (float64 where ``fn`` runs in it, else float32). Feeding the basis vector :math:`e_j` at
   every token gives column j of each token's matrix :math:`M_{\text{token}}` (d calls). Which dims couple
   gives the pairs (and so the style: ``half`` (i, i + r/2) or ``interleaved`` (2i, 2i + 1)) and
   ``rotary_dim``; each 2x2 block must be :math:`a\,[[c, -s], [s, c]]`, whose angle
   :math:`\theta = \operatorname{atan2}(M_{ba} - M_{ab}, M_{aa} + M_{bb})` and norm scale a are read off.
   The axis along which :math:`\theta` varies is where the positions actually run; the step between
   index 0 and 1 gives :math:`\omega`, and every token's position is the integer m with
   :math:`\theta \equiv m\,\omega`.
2. **Frequencies.** :math:`\log\omega_i = -\log s - (2i/r)\log b` fits the default ladder (s = 1) and
   linear interpolation (factor s); otherwise the ratio to the default ladder is matched against
   ``ropelab.frequencies`` for yarn and llama3 (Peng et al. 2023, arXiv 2309.00071; Meta 2024,
   arXiv 2407.21783). A ladder within ``2**-16`` relative matches; one within ``2**-5`` only
   resembles it (frequencies held in bf16 land there, and are named).
3. **Precision.** One long call with positions 0 .. ``max_position`` in ``dtype`` reads back each pair's
   angle and compares it with :math:`m\,\omega_i` of the matched ladder in float64. Allowed: output
   rounding plus angles formed in float32, :math:`4u_{dtype} + 8\cdot 2^{-24}(1 + \max|\theta|)`
   radians. Beyond that, the error pattern is matched against positions, ``inv_freq`` or angles held in
   bf16/fp16 (``ropelab.precision.perturbed_angle``) to name the cause.

``compare`` runs two implementations on the same input and explains every difference in words.
``sanity_checks`` runs the two usual checks (norms kept; scores depending on n - m only), which a rotation
along the wrong axis passes, and ``rotation_angles`` returns the angle a pair actually gets at every
token. The command ``python -m ropelab.diagnose MODULE:CALLABLE --layout "b s h d" [--sizes h=20,d=64]``
prints the report and exits 1 when the implementation is not a correct RoPE along the declared axis.

The implementations the checks are tested on (correct and broken) live in ``ropelab.zoo``.
"""

from __future__ import annotations

import argparse
import html
import importlib
import math
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from .core import AXIS_NAMES, STYLES, Layout, pair_indices, parse_layout, varlen_positions
from .precision import perturbed_angle
from .scaling import default_inv_freq, frequencies

__all__ = [
    "Diagnosis",
    "Comparison",
    "diagnose",
    "compare",
    "sanity_checks",
    "rotation_angles",
    "main",
    "probe_sizes",
    "probe_cu_seqlens",
]

# Unit roundoff u (round-to-nearest errs by at most u |value|), as the project's tests use it.
UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Structure tolerance on entries of M (|M| <= ~1): 2**-14 is >= 256 float32 ulps (implementations that
# form angles or tables in float32 sit far below it), yet every structural bug is an O(0.1) effect.
STRUCT_TOL = 2.0**-14
# An angle is "the same" within 2**-10 rad: float32 angles at the probe's small positions err < 1e-5.
ANGLE_TOL = 2.0**-10
# A frequency ladder matches within 2**-16 relative (inv_freq held in float32 errs by ~2**-24); it
# "resembles" one within 2**-5 (inv_freq held in bf16 errs by up to 2**-9 relative).
LADDER_RTOL = 2.0**-16
# Two dims are coupled when one leaks into the other at all: non-partners stay exactly 0 (0 * sin = 0),
# and a low frequency such as 500000**(-126/128) = 2e-6 must still count as a rotating pair.
COUPLE_TOL = 2.0**-30
LADDER_RESEMBLES = 2.0**-5
# Original contexts tried when matching yarn / llama3 ladders (powers of two, 256 .. 256k).
ORIGINAL_CONTEXTS = tuple(2**k for k in range(8, 19))

DEFAULT_SIZES = {"b": 2, "s": 6, "t": 12, "h": 3, "d": 32}


# --------------------------------------------------------------------------------------------------
# Probe construction
# --------------------------------------------------------------------------------------------------


def probe_sizes(layout: str | Layout, sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """The size of every axis of ``layout`` the checker uses: ``sizes`` as given, the rest chosen so that
    no two non-d axes share a size (otherwise a rotation along one could not be told from the other)."""
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
    """Three packed sequences of different lengths covering ``n_tokens`` (int32, flash-attn's format)."""
    n1 = max(2, n_tokens // 4)
    n2 = max(2, (n_tokens - n1) // 2 + 1)
    n3 = n_tokens - n1 - n2
    if n3 < 1:
        raise ValueError(f"need at least 6 packed tokens to probe three sequences, got {n_tokens}.")
    return torch.tensor([0, n1, n1 + n2, n_tokens], dtype=torch.int32)


class _NotATensor(ValueError):
    """fn broke the black-box contract (a usage error, raised); any other failure of fn is a finding."""


def _call(fn: Callable, x: torch.Tensor, lay: Layout, cu: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        y = fn(x, cu) if lay.seq == "t" else fn(x)
    if not isinstance(y, torch.Tensor):
        raise _NotATensor(
            f"fn returned {type(y).__name__}, not a tensor; diagnose needs fn(x) -> rotated x (for a module "
            "returning (q, k), pass lambda x: module(x, x)[0])."
        )
    return y


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run the probes on one intra-op thread: they are tiny tensors, and on a busy machine thread
    synchronisation made them 30x slower (0.2 s vs 7 s per diagnosis measured with 2 threads at load 9)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _wrap(x: torch.Tensor) -> torch.Tensor:
    """Angles folded onto [-pi, pi)."""
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def _snap(v: float, digits: int = 3) -> float:
    """``v`` rounded to ``digits`` significant digits (10000.00003 -> 10000)."""
    if not math.isfinite(v) or v <= 0:
        return v
    return round(v, digits - 1 - math.floor(math.log10(v)))


def _fmt(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


# --------------------------------------------------------------------------------------------------
# Frequency ladders
# --------------------------------------------------------------------------------------------------


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
        return f"{self.name} (" + ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in p.items()) + ")"


def _rel_err(measured: torch.Tensor, ideal: torch.Tensor) -> float:
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
    return Ladder(name, base, rope_scaling, ideal, af, _rel_err(omega, ideal))


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
        slope, icpt = _line(x, omega[:nz].log())
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
    slope, icpt = _line(x, omega.log())
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
    for c in (_snap(v, 1), _snap(v, 2), _snap(v, 3), v):
        if c not in out:
            out.append(c)
    return out


def _line(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
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


# --------------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class Diagnosis:
    """What ``diagnose`` measured. ``ok`` is True only for a correct RoPE along the declared axis.

    ``problems`` holds plain-English findings, each with its fix; ``codes`` the short name of each (one of
    ``error, dtype, shape, not_linear, no_rotation, mixing, not_rotation, tables, seq_axis, positions, varlen,
    batch, heads, direction, norm_scale, attention_factor, inv_freq_precision, precision, pairing,
    rotary_dim, base, scaling``); ``notes`` what is worth knowing but not wrong.
    """

    name: str
    layout: str
    sizes: dict[str, int]
    dtype: torch.dtype
    probe_dtype: torch.dtype | None = None
    cu_seqlens: list[int] | None = None
    output_shape: tuple[int, ...] | None = None  # set only when it differs from the input's
    declared_seq: str = "s"
    seq_axis: str | None = None
    varies_along: tuple[str, ...] = ()
    positions_ok: bool | None = None
    restarts_at_cu_seqlens: bool | None = None
    pairing: str | None = None
    pairs: list[tuple[int, int]] = field(default_factory=list)
    rotary_dim: int | None = None
    head_dim: int | None = None
    inv_freq: torch.Tensor | None = None
    base: float | None = None
    scaling: str | None = None
    rope_scaling: dict | None = None
    ladder_rel_err: float | None = None
    direction: int | None = None
    norm_scale: float | None = None
    identity_at_zero: bool | None = None
    heads_alike: bool | None = None
    batch_alike: bool | None = None
    length_dependent: bool | None = None
    phase_error: float | None = None
    phase_error_position: int | None = None
    phase_tolerance: float | None = None
    phase_cause: str | None = None
    max_position: int = 4096
    problems: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, code: str, text: str) -> None:
        self.codes.append(code)
        self.problems.append(text)

    def has(self, code: str) -> bool:
        return code in self.codes

    # --- rendering -----------------------------------------------------------------------------

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, measured, verdict) rows of the report; verdict is "ok", "PROBLEM" or ""."""
        flag = lambda bad: "PROBLEM" if bad else "ok"
        c = set(self.codes)
        rows = []
        shape = "same as input" if self.output_shape is None else f"changed to {list(self.output_shape)}"
        rows.append(("output shape", shape, flag("shape" in c)))
        seq = self.seq_axis if self.seq_axis is not None else "none"
        if self.varies_along and len(self.varies_along) > 1:
            seq += f" (varies along {', '.join(self.varies_along)})"
        rows.append(("sequence axis", f"{seq} (declared {self.declared_seq})", flag("seq_axis" in c)))
        if self.positions_ok is not None:
            rows.append(("positions 0, 1, 2, ...", "yes" if self.positions_ok else "no", flag(not self.positions_ok)))
        if self.restarts_at_cu_seqlens is not None:
            rows.append(("restart at cu_seqlens", "yes" if self.restarts_at_cu_seqlens else "no", flag("varlen" in c)))
        if self.pairing is not None:
            if self.pairing in STYLES and self.rotary_dim:
                r = self.rotary_dim
                pairs = f"(i, i+{r // 2})" if self.pairing == "half" else "(2i, 2i+1)"
                desc = f"{self.pairing} {pairs}"
            else:
                desc = (
                    "other: "
                    + ", ".join(f"({a}, {b})" for a, b in self.pairs[:6])
                    + (", ..." if len(self.pairs) > 6 else "")
                )
            rows.append(("pairing", desc, flag(c & {"pairing", "mixing", "not_rotation", "tables"})))
        if self.rotary_dim is not None:
            rows.append(("rotary_dim", f"{self.rotary_dim} of {self.head_dim}", flag("rotary_dim" in c)))
        if self.inv_freq is not None:
            w = [_fmt(v) for v in self.inv_freq.tolist()]
            shown = ", ".join(w if len(w) <= 4 else w[:3] + ["...", w[-1]])
            rows.append(("inv_freq", shown, flag("inv_freq_precision" in c)))
        if self.base is not None or self.inv_freq is not None:
            rows.append(("base", _fmt(self.base, 6), flag("base" in c)))
        if self.scaling is not None:
            err = f" (max rel. deviation {self.ladder_rel_err:.1e})" if self.ladder_rel_err else ""
            rows.append(("scaling", self.scaling + err, flag("scaling" in c)))
        if self.direction is not None:
            d = "+m*theta (counter-clockwise)" if self.direction > 0 else "-m*theta (reversed)"
            rows.append(("rotation direction", d, flag("direction" in c)))
        if self.norm_scale is not None:
            rows.append(("norm scale", _fmt(self.norm_scale, 6), flag(c & {"norm_scale", "attention_factor"})))
        if self.identity_at_zero is not None:
            rows.append(
                ("position 0 is identity", "yes" if self.identity_at_zero else "no", flag(not self.identity_at_zero))
            )
        if self.heads_alike is not None:
            rows.append(("heads treated alike", "yes" if self.heads_alike else "no", flag(not self.heads_alike)))
        if self.batch_alike is not None:
            rows.append(("batch treated alike", "yes" if self.batch_alike else "no", flag(not self.batch_alike)))
        if self.length_dependent:
            rows.append(("length-dependent frequencies", "yes", ""))
        if self.phase_error is None and self.probe_dtype is not None:
            rows.append((f"phase error in {DTYPE_NAMES[self.dtype]}", "not checked (fix the problems above first)", ""))
        if self.phase_error is not None:
            v = f"{self.phase_error:.2e} rad at position {self.phase_error_position}"
            v += f" (allowed {self.phase_tolerance:.1e})"
            rows.append((f"phase error in {DTYPE_NAMES[self.dtype]}", v, flag(c & {"precision"})))
        return rows

    def _header(self) -> str:
        sz = " ".join(f"{k}={v}" for k, v in self.sizes.items())
        probe = DTYPE_NAMES.get(self.probe_dtype, "-")
        return (
            f"RoPE diagnosis of {self.name}: layout '{self.layout}' ({sz}), structure probed in {probe}, "
            f"phase checked in {DTYPE_NAMES[self.dtype]} up to position {self.max_position}"
        )

    def __str__(self) -> str:
        rows = self.rows()
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [self._header(), ""]
        lines += [f"  {q:<{w0}}  {m:<{w1}}  {v}".rstrip() for q, m, v in rows]
        lines.append("")
        if self.ok:
            lines.append("OK: a correct RoPE along the declared axis.")
        else:
            lines.append(f"NOT OK: {len(self.problems)} problem(s)")
            lines += [f"  {i + 1}. {p}" for i, p in enumerate(self.problems)]
        if self.notes:
            lines.append("Notes:")
            lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        esc = html.escape
        color = {"ok": "#1a7f37", "PROBLEM": "#cf222e", "": "#555"}
        body = "".join(
            f"<tr><td style='text-align:left'>{esc(q)}</td><td style='text-align:left'><code>{esc(m)}</code></td>"
            f"<td style='text-align:left;color:{color[v]};font-weight:bold'>{esc(v)}</td></tr>"
            for q, m, v in self.rows()
        )
        verdict = (
            "<p style='color:#1a7f37'><b>OK</b>: a correct RoPE along the declared axis.</p>"
            if self.ok
            else "<p style='color:#cf222e'><b>NOT OK</b></p><ol>"
            + "".join(f"<li>{esc(p)}</li>" for p in self.problems)
            + "</ol>"
        )
        notes = (
            ("<p>Notes:</p><ul>" + "".join(f"<li>{esc(n)}</li>" for n in self.notes) + "</ul>") if self.notes else ""
        )
        return (
            f"<div><p><b>{esc(self._header())}</b></p><table><thead><tr><th style='text-align:left'>quantity</th>"
            f"<th style='text-align:left'>measured</th><th style='text-align:left'>verdict</th></tr></thead>"
            f"<tbody>{body}</tbody></table>{verdict}{notes}</div>"
        )


# --------------------------------------------------------------------------------------------------
# diagnose
# --------------------------------------------------------------------------------------------------

EXPECT_KEYS = ("pairing", "base", "rotary_dim", "rope_scaling", "attention_factor")


def _check_args(fn, layout, dtype, max_position, expect) -> Layout:
    if not callable(fn):
        raise ValueError(f"fn must be callable (x -> rotated x, or (x, cu_seqlens) for 't'), got {type(fn).__name__}.")
    lay = parse_layout(layout)
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype must be one of {list(DTYPE_NAMES.values())} (torch dtypes), got {dtype}.")
    if not isinstance(max_position, int) or max_position < 2:
        raise ValueError(
            f"max_position must be an int >= 2 (the last position the phase check reaches), got {max_position!r}."
        )
    for k in expect or {}:
        if k not in EXPECT_KEYS:
            raise ValueError(f"expect has an unknown key {k!r}; known keys: {', '.join(EXPECT_KEYS)}.")
    if expect and "pairing" in expect and expect["pairing"] not in STYLES:
        raise ValueError(f"expect['pairing'] must be 'half' or 'interleaved', got {expect['pairing']!r}.")
    return lay


def _fn_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def diagnose(
    fn: Callable,
    *,
    layout: str,
    sizes: Mapping[str, int] | None = None,
    dtype: torch.dtype = torch.float32,
    max_position: int = 4096,
    expect: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Diagnosis:
    """Probe ``fn`` and report what rotation it applies. See the module docstring for the method.

    Args:
        fn: takes one tensor laid out as ``layout`` and returns it rotated, positions 0, 1, 2, ... along
            the axis the caller means as the sequence; for a ``t`` layout ``fn(x, cu_seqlens)``.
        layout: einops-style axes of the tensor (``"b s h d"``, ``"b h s d"``, ``"s h d"``, ``"t h d"``, ...).
        sizes: axis sizes fn needs (``{"h": 20, "d": 64}``); the checker picks the rest, all different.
        dtype: the dtype of the phase check (where low-precision positions or frequencies show).
        max_position: the last position of the phase check.
        expect: what fn should do, each a problem when it differs: ``pairing`` ("half"/"interleaved"),
            ``base``, ``rotary_dim``, ``rope_scaling`` (a Hugging Face dict; None for default),
            ``attention_factor``.
        name: how the report names fn.
    """
    lay = _check_args(fn, layout, dtype, max_position, expect)
    sz = probe_sizes(lay, sizes)
    with _one_thread():
        return _diagnose(fn, lay, sz, dtype, max_position, expect, name)


def _diagnose(fn, lay: Layout, sz: dict[str, int], dtype, max_position, expect, name) -> Diagnosis:
    cu = probe_cu_seqlens(sz["t"]) if lay.seq == "t" else None
    dg = Diagnosis(
        name=name or _fn_name(fn),
        layout=str(lay),
        sizes=sz,
        dtype=dtype,
        cu_seqlens=None if cu is None else cu.tolist(),
        declared_seq=lay.seq,
        max_position=max_position,
        head_dim=sz["d"],
    )
    st = _structure(fn, lay, sz, cu, dg)
    if st is not None:
        _frequencies(st, dg)
        _expectations(dg, expect or {})
        if dg.seq_axis == lay.seq and dg.inv_freq is not None and not dg.has("varlen") and not dg.has("positions"):
            _phase(fn, lay, sz, dtype, max_position, st, dg)
    return dg


@dataclass
class _Structure:
    M: torch.Tensor  # [*token_shape, d_out, d_in], float64
    tok_axes: tuple[str, ...]
    theta: torch.Tensor  # [*token_shape, P]: angle of each pair (a < b)
    scale: torch.Tensor  # [*token_shape, P]
    pairs: list[tuple[int, int]]
    pair_order: list[int]  # index into pairs, in style order
    positions: torch.Tensor | None  # [*token_shape] measured integer positions (-1 where none fits)
    omega: torch.Tensor | None  # [P], in the order of ``pairs``
    probe_dtype: torch.dtype
    ladder: Ladder | None = None


def _token_axes(lay: Layout) -> tuple[str, ...]:
    return tuple(a for a in lay.axes if a != "d")


def _probe_matrix(fn, lay, sz, cu, dg) -> tuple[torch.Tensor, torch.dtype] | None:
    """[*token_shape, d, d] float64 matrix of every token, from d calls with e_j at every token."""
    shape = [sz[a] for a in lay.axes]
    d_idx = lay.index("d")
    d = sz["d"]
    last_err = None
    for pdt in (torch.float64, torch.float32):
        cols = []
        try:
            for j in range(d):
                x = torch.zeros(shape, dtype=pdt)
                x.select(d_idx, j).fill_(1.0)
                y = _call(fn, x, lay, cu)
                if y.dtype != pdt and pdt == torch.float64:
                    raise TypeError(f"returns {y.dtype} for a float64 input")
                if pdt == torch.float32 and y.dtype in (torch.bfloat16, torch.float16):
                    dg.problem(
                        "dtype",
                        f"fn returns {y.dtype} for a float32 input: it computes in 16 bits whatever it is given, so "
                        "its rotation cannot be measured (nor trusted) to better than 16-bit rounding. Compute in the "
                        "input's dtype (or float32) and cast only the output.",
                    )
                    return None
                if tuple(y.shape) != tuple(shape):
                    if y.numel() != x.numel():
                        dg.output_shape = tuple(y.shape)
                        dg.problem(
                            "shape",
                            f"the output has shape {list(y.shape)} for an input of shape {shape} (layout '{lay}'): "
                            "the cos/sin tables broadcast against the wrong axes. Give them size-1 dims on every "
                            "axis but the sequence and head dim (ropelab.apply_rope(x, layout=...) does).",
                        )
                        return None
                    dg.output_shape = tuple(y.shape)
                    y = y.reshape(shape)
                cols.append(y.to(torch.float64).movedim(d_idx, -1))
        except _NotATensor:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the black box is reported, not raised
            last_err = e
            continue
        if pdt == torch.float32:
            dg.notes.append(
                f"fn does not run in float64 ({type(last_err).__name__}: {str(last_err)[:120]}); "
                "the structure was measured in float32."
            )
        return torch.stack(cols, -1), pdt
    dg.problem(
        "error",
        f"fn raised {type(last_err).__name__}: {str(last_err)[:300]} on a float32 input of shape {shape} "
        f"(layout '{lay}'). If it needs particular sizes, pass sizes={{...}} (e.g. sizes={{'h': 20, 'd': 64}}).",
    )
    return None


def _components(C: torch.Tensor) -> list[list[int]]:
    d = C.shape[0]
    parent = list(range(d))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in (C > COUPLE_TOL).nonzero().tolist():
        if i != j:
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(d):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


def _classify_pairs(pairs: list[tuple[int, int]], d: int) -> tuple[str, int | None, list[int]]:
    """(style, rotary_dim, order) if the pairs are a style's (a prefix of one for proportional), else other."""
    S = {p: k for k, p in enumerate(pairs)}
    for r in range(2, d + 1, 2):
        for style in STYLES:
            a, b = pair_indices(r, style)
            P = list(zip(a.tolist(), b.tolist()))
            if set(P) == set(S):
                return style, r, [S[p] for p in P]
    for style in STYLES:  # proportional: the first pairs of the full-dim style rotate, the rest are zero
        a, b = pair_indices(d, style)
        P = list(zip(a.tolist(), b.tolist()))
        k = len(S)
        if set(P[:k]) == set(S):
            return style, d, [S[p] for p in P[:k]]
    return "other", None, list(range(len(pairs)))


def _structure(fn, lay: Layout, sz, cu, dg: Diagnosis) -> _Structure | None:
    got = _probe_matrix(fn, lay, sz, cu, dg)
    if got is None:
        return None
    M, pdt = got
    dg.probe_dtype = pdt
    d = sz["d"]
    tok_axes = _token_axes(lay)
    if dg.output_shape is not None:
        dg.problem(
            "shape",
            f"the output has shape {list(dg.output_shape)} for an input of shape {[sz[a] for a in lay.axes]} "
            f"(layout '{lay}'): the cos/sin tables (e.g. cached as [1, 1, seq, dim]) broadcast against the "
            "input and add or move an axis. Shape the tables for this layout (ropelab.apply_rope(x, layout=...)).",
        )
    # Linearity and locality: a random input must give what the per-token matrices predict.
    g = torch.Generator().manual_seed(0)
    x = torch.randn([sz[a] for a in lay.axes], generator=g, dtype=pdt)
    pred = torch.einsum("...ij,...j->...i", M, x.to(torch.float64).movedim(lay.index("d"), -1))
    try:
        y = _call(fn, x, lay, cu).reshape(x.shape).to(torch.float64).movedim(lay.index("d"), -1)
        resid = float((y - pred).abs().max() / (pred.abs().max() + 1e-300))
        if resid > STRUCT_TOL * 4:
            dg.problem(
                "not_linear",
                f"the output at a token depends on other tokens or is not linear in x (relative residual "
                f"{resid:.1e} against the per-token maps): RoPE rotates each token's vector on its own. Check "
                "for a reshape/transpose that mixes tokens.",
            )
    except _NotATensor:
        raise
    except Exception:  # noqa: BLE001 - the probe with e_j worked; a failure here is not informative
        pass
    Mf = M.reshape(-1, d, d)
    C = Mf.abs().amax(0)
    comps = _components(C)
    big = [c for c in comps if len(c) > 2]
    if big:
        dg.pairing = "other"
        dg.problem(
            "mixing",
            f"dims {big[0]} mix together: RoPE rotates disjoint pairs of dims, each by its own angle. "
            "Check the rotate_half / rotate_every_two helper and the cos/sin layout.",
        )
        return None
    pairs = [(c[0], c[1]) for c in comps if len(c) == 2]
    singles = [c[0] for c in comps if len(c) == 1]
    eye_ok = all(float((Mf[:, j, j] - Mf[0, j, j]).abs().max()) <= STRUCT_TOL for j in singles)
    if not eye_ok:
        bad = [j for j in singles if float((Mf[:, j, j] - Mf[0, j, j]).abs().max()) > STRUCT_TOL]
        dg.problem(
            "not_rotation",
            f"dims {bad[:6]} are scaled by a position-dependent factor but pair with no other dim (a cos term "
            "without its sin term): each dim must rotate with a partner.",
        )
        return None
    if not pairs:
        dg.problem(
            "no_rotation",
            "fn leaves every dim unrotated (no two dims mix at any token): it applies no RoPE along any axis.",
        )
        return None
    a = torch.tensor([p[0] for p in pairs])
    b = torch.tensor([p[1] for p in pairs])
    Maa, Mab, Mba, Mbb = M[..., a, a], M[..., a, b], M[..., b, a], M[..., b, b]
    is_rot = ((Maa - Mbb).abs().amax() <= STRUCT_TOL) and ((Mab + Mba).abs().amax() <= STRUCT_TOL)
    style, r, order = _classify_pairs(pairs, d)
    dg.pairs = [pairs[k] for k in order] if style != "other" else pairs
    dg.pairing = style
    dg.rotary_dim = r
    if not bool(is_rot):
        _explain_not_rotation(M, pairs, a, b, tok_axes, lay, dg)
        return None
    theta = torch.atan2(Mba - Mab, Maa + Mbb)
    scale = torch.hypot(Maa + Mbb, Mba - Mab) / 2
    st = _Structure(M, tok_axes, theta, scale, pairs, order, None, None, pdt)
    _positions(st, lay, sz, cu, dg)
    if style == "other":  # after _positions, which orients each pair (a, b) so that b is a turned forward
        dg.problem(
            "pairing",
            "the rotating pairs (a, b) are "
            + ", ".join(f"({p}, {q})" for p, q in dg.pairs[:8])
            + (", ..." if len(dg.pairs) > 8 else "")
            + ": neither half (i, i+r/2) nor interleaved (2i, 2i+1). Permute the head dims (weights too) "
            "into one of the two styles.",
        )
    return st


def _explain_not_rotation(M, pairs, a, b, tok_axes, lay, dg) -> None:
    """A pair whose two dims turn by different angles: usually tables laid out for the other style."""
    # Row angles at the token one step along the declared sequence axis.
    idx = [0] * len(tok_axes)
    idx[tok_axes.index(lay.seq)] = 1
    Mt = M[tuple(idx)]
    phi_a = torch.atan2(-Mt[a, b], Mt[a, a])
    phi_b = torch.atan2(Mt[b, a], Mt[b, b])
    d = M.shape[-1]
    phi = torch.zeros(d, dtype=torch.float64)
    phi[a], phi[b] = phi_a, phi_b
    worst = int((phi_a - phi_b).abs().argmax())
    p, q = pairs[worst]
    msg = (
        f"pair ({p}, {q}) is not a rotation: at position 1 dim {p} turns by {float(phi_a[worst]):.4g} rad but dim "
        f"{q} by {float(phi_b[worst]):.4g} rad (a rotation turns both by one angle)."
    )
    r = dg.rotary_dim or d
    omega = phi[:r].clone()
    uniq = sorted({round(v, 9) for v in omega.tolist()}, reverse=True)
    w = torch.tensor(uniq, dtype=torch.float64)
    if w.numel() == r // 2 and dg.pairing in STYLES:
        as_half = torch.cat([w, w])
        as_inter = w.repeat_interleave(2)
        if dg.pairing == "half" and torch.allclose(omega, as_inter, atol=ANGLE_TOL):
            dg.problem(
                "tables",
                msg + " The cos/sin tables are laid out for interleaved pairs (repeat_interleave) while the "
                "rotation pairs halves (rotate_half): build them with torch.cat((freqs, freqs), -1), or rotate "
                "with rotate_every_two.",
            )
            return
        if dg.pairing == "interleaved" and torch.allclose(omega, as_half, atol=ANGLE_TOL):
            dg.problem(
                "tables",
                msg + " The cos/sin tables are laid out for half pairs (torch.cat((freqs, freqs), -1)) while "
                "the rotation pairs neighbours (rotate_every_two): build them with "
                "freqs.repeat_interleave(2, -1), or rotate with rotate_half.",
            )
            return
    dg.problem("not_rotation", msg + " Use one cos and one sin per pair for both of its dims.")


def _index_grid(tok_shape, tok_axes) -> dict[str, torch.Tensor]:
    grids = torch.meshgrid(*[torch.arange(n) for n in tok_shape], indexing="ij")
    return dict(zip(tok_axes, grids))


def _positions(st: _Structure, lay: Layout, sz, cu, dg: Diagnosis) -> None:
    """Which axis the angle runs along, the unit step omega, and each token's integer position."""
    theta, tok_axes = st.theta, st.tok_axes
    varies = []
    for k, ax in enumerate(tok_axes):
        if theta.shape[k] < 2:
            continue
        diff = _wrap(theta - theta.select(k, 0).unsqueeze(k)).abs().amax()
        if float(diff) > ANGLE_TOL:
            varies.append(ax)
    dg.varies_along = tuple(varies)
    grid = _index_grid(theta.shape[:-1], tok_axes)
    if "h" in tok_axes:
        k = tok_axes.index("h")
        dg.heads_alike = bool((st.M - st.M.select(k, 0).unsqueeze(k)).abs().amax() <= STRUCT_TOL)
    if "b" in tok_axes:
        k = tok_axes.index("b")
        dg.batch_alike = bool((st.M - st.M.select(k, 0).unsqueeze(k)).abs().amax() <= STRUCT_TOL)
    if not varies:
        dg.problem(
            "no_rotation",
            "the rotation angle is the same at every token (no axis carries positions): fn applies one fixed "
            f"rotation instead of RoPE. Pass positions 0, 1, 2, ... along '{lay.seq}'.",
        )
        return
    # Heads or batch elements turning at different rates (not just shifted positions) is its own finding.
    if lay.seq in varies:
        ks = tok_axes.index(lay.seq)
        for ax, code, what in (("h", "heads", "head"), ("b", "batch", "batch element")):
            if ax not in tok_axes or ax == lay.seq or sz[ax] < 2:
                continue
            ka = tok_axes.index(ax)

            def at(i_ax, i_seq, ka=ka):
                return theta[tuple(i_ax if j == ka else (i_seq if j == ks else 0) for j in range(len(tok_axes)))]

            steps = torch.stack([_wrap(at(i, 1) - at(i, 0)) for i in range(sz[ax])])
            starts = torch.stack([_wrap(at(i, 0) - at(0, 0)) for i in range(sz[ax])])
            dev = (steps - steps[0]).abs()
            if float(starts.abs().max()) <= ANGLE_TOL and float(dev.max()) > ANGLE_TOL:
                i, p = divmod(int(dev.argmax()), dev.shape[1])
                a, b = st.pairs[p]
                dg.problem(
                    code,
                    f"{what}s turn at different rates: from position 0 to 1, dims ({a}, {b}) turn by "
                    f"{float(steps[0, p]):.4g} rad in {what} 0 but by {float(steps[i, p]):.4g} rad in {what} {i}. "
                    f"RoPE uses one inv_freq for every {what}: give the cos/sin tables size 1 on axis '{ax}'.",
                )
                return
    # The unit step: index 0 -> 1 along the declared axis if it varies there, else along another axis;
    # the first choice under which every token's angles are an integer multiple of it wins.
    fit = None
    free = dg.pairing == "other"  # no canonical order (a, b) within a pair: orient each by its own step
    for step_axis in [lay.seq] * (lay.seq in varies) + [a for a in varies if a != lay.seq]:
        fit = _integer_positions(theta, tok_axes, step_axis, free)
        if isinstance(fit, tuple):
            break
    if not isinstance(fit, tuple):
        dg.problem(
            "direction" if fit == "direction" else "positions",
            {
                "direction": "some pairs turn forward and others backward with position: the sin term has the wrong "
                "sign on part of the head dim.",
                "step": "the angle does not change between index 0 and 1 of the sequence axis but does further on: "
                "positions are not 0, 1, 2, ...",
                "fit": "at some tokens the angles are not an integer multiple of the step between positions 0 and 1 "
                "(different heads or batch elements get different frequencies?): RoPE turns every token by "
                "m * inv_freq with one inv_freq.",
            }[fit or "fit"],
        )
        return
    pos, omega, sign = fit
    dg.direction = 1 if free else int(sign[0])
    theta = theta * sign
    if free:  # report each pair as (a, b) with b = a rotated forward
        st.pairs = [(a, b) if sg > 0 else (b, a) for (a, b), sg in zip(st.pairs, sign.tolist())]
        dg.pairs = list(st.pairs)
    flat = theta.reshape(-1, theta.shape[-1])
    # Refine omega by least squares over every token (angles unwrapped around m * omega).
    m = pos.reshape(-1).to(torch.float64)
    unw = m[:, None] * omega[None, :] + _wrap(flat - m[:, None] * omega[None, :])
    denom = float((m * m).sum())
    if denom > 0:
        omega = (m[:, None] * unw).sum(0) / denom
    st.positions, st.omega = pos, omega
    _judge_positions(st, lay, sz, cu, grid, dg)
    dg.norm_scale = float(st.scale.median())


def _integer_positions(theta: torch.Tensor, tok_axes, step_axis: str, free: bool = False):
    """(positions, omega, sign) taking index 0 -> 1 along ``step_axis`` as one position step, or the reason
    it does not fit ("step", "direction", "fit"). ``sign`` [P] is the direction of each pair: all +1 or all
    -1, unless ``free`` (pairs without a canonical orientation), where each pair gets its own."""
    k = tok_axes.index(step_axis)
    t0 = theta[(0,) * len(tok_axes)]
    t1 = theta[tuple(1 if i == k else 0 for i in range(len(tok_axes)))]
    omega = _wrap(t1 - t0)
    if float(omega.abs().max()) <= ANGLE_TOL:
        return "step"
    # Direction: RoPE turns pair (a, b) by +m*omega (y_b = x_a sin + x_b cos).
    sgn = torch.sign(omega[omega.abs() > ANGLE_TOL])
    if free:
        direction = torch.where(omega < 0, -1.0, 1.0).to(torch.float64)
    elif bool((sgn > 0).all()):
        direction = torch.ones_like(omega)
    elif bool((sgn < 0).all()):
        direction = -torch.ones_like(omega)
    else:
        return "direction"
    omega = omega * direction
    flat = theta.reshape(-1, theta.shape[-1]) * direction
    # Each token's position: the integer m in [-K, K] with theta = m * omega (mod 2 pi) for every pair.
    K = max(flat.shape[0], 16)
    cand = torch.arange(-K, K + 1, dtype=torch.float64)
    pos = torch.empty(flat.shape[0], dtype=torch.long)
    chunk = max(1, 2_000_000 // (cand.numel() * flat.shape[1]))
    for s in range(0, flat.shape[0], chunk):
        res = _wrap(flat[s : s + chunk, None, :] - cand[None, :, None] * omega[None, None, :]).abs().amax(-1)
        best, arg = res.min(-1)
        if bool((best > ANGLE_TOL * 4).any()):
            return "fit"
        pos[s : s + chunk] = cand[arg].long()
    return pos.reshape(theta.shape[:-1]), omega, direction


def _judge_positions(st: _Structure, lay: Layout, sz, cu, grid, dg: Diagnosis) -> None:
    pos = st.positions
    seq = lay.seq
    if seq == "t":
        expected = varlen_positions(cu.long())[grid["t"]]
    else:
        expected = grid[seq]
    # Which single axis the positions run along (index 0, 1, 2, ... of that axis).
    along = [a for a in st.tok_axes if torch.equal(pos, grid[a])]
    if seq == "t" and torch.equal(pos, expected):
        along = ["t"]
    dg.seq_axis = along[0] if along else None
    zero = expected == 0
    dg.identity_at_zero = bool((st.theta[zero].abs() <= ANGLE_TOL).all())
    if torch.equal(pos, expected):
        dg.positions_ok = True
        if seq == "t":
            dg.restarts_at_cu_seqlens = True
        return
    dg.positions_ok = False
    n = {a: sz[a] for a in st.tok_axes}
    if dg.seq_axis is not None and dg.seq_axis != seq:
        ax = dg.seq_axis
        dg.problem(
            "seq_axis",
            f"fn rotates along axis {ax} (size {n[ax]}), not {seq}: it treats the {AXIS_NAMES[ax]} as positions "
            f"(position = index along {ax}). It assumes another layout; transpose x to the layout it expects "
            f"(or tell it the sequence dim of '{lay}'), e.g. ropelab.apply_rope(x, layout='{lay}').",
        )
        return
    if seq == "t":
        if torch.equal(pos, grid["t"]):
            dg.restarts_at_cu_seqlens = False
            dg.seq_axis = "t"
            dg.problem(
                "varlen",
                f"positions do not restart at the cu_seqlens boundaries {cu.tolist()}: packed token t gets "
                "position t, so every sequence after the first is rotated as if it continued the previous one. "
                "Use positions = ropelab.varlen_positions(cu_seqlens) (position - start of its sequence).",
            )
            return
    offset = pos - expected
    if bool((offset == offset.reshape(-1)[0]).all()):
        c = int(offset.reshape(-1)[0])
        dg.seq_axis = seq
        dg.problem(
            "positions",
            f"positions start at {c}, not 0 (position 0 is not the identity): every position is shifted by {c}. "
            "Drop the offset (ESM-style padding_idx + 1 position ids belong to learned embeddings, not RoPE).",
        )
        return
    if "b" in st.tok_axes:
        k = st.tok_axes.index("b")
        per_b = offset.amin(dim=tuple(i for i in range(offset.ndim) if i != k))
        if bool((offset == per_b.reshape([-1 if i == k else 1 for i in range(offset.ndim)])).all()):
            dg.seq_axis = seq
            dg.problem(
                "batch",
                f"batch elements get shifted positions (offsets {per_b.tolist()} for b = 0, 1, ...): positions "
                f"are counted over the flattened batch. Give every sequence positions 0 .. {sz[seq] - 1}.",
            )
            return
    along_each = []
    for i, a in enumerate(st.tok_axes):
        line = pos[tuple(slice(None) if j == i else 0 for j in range(pos.ndim))]
        if not bool((line == line[0]).all()):
            along_each.append(f"along {a} {line.tolist()}")
    dg.problem(
        "seq_axis",
        f"positions depend on more than the '{seq}' axis (with the other indices at 0 they run "
        + "; ".join(along_each)
        + "): fn flattens several axes into one sequence. Pass x in the layout it expects, or name that layout.",
    )


def _frequencies(st: _Structure, dg: Diagnosis) -> None:
    if st.omega is None:
        return
    d = dg.head_dim
    omega = st.omega[st.pair_order] if dg.pairing in STYLES else st.omega
    if dg.pairing in STYLES and dg.rotary_dim == d and len(omega) < d // 2:  # proportional: zero tail
        omega = torch.cat([omega, torch.zeros(d // 2 - len(omega), dtype=torch.float64)])
    dg.inv_freq = omega
    # Norm scale: one factor for every pair and token.
    spread = float((st.scale - dg.norm_scale).abs().max())
    if STRUCT_TOL * max(1.0, dg.norm_scale) < spread <= 4 * UNIT_ROUNDOFF[torch.bfloat16]:
        dg.problem(
            "precision",
            f"cos and sin are rounded to a 16-bit dtype even for {DTYPE_NAMES[st.probe_dtype]} input: the norm "
            f"scale wobbles by {spread:.1e} (cos^2 + sin^2 != 1). Build the tables in float32 and cast them to "
            "the input's dtype, not lower.",
        )
    elif spread > STRUCT_TOL * max(1.0, dg.norm_scale):
        dg.problem(
            "norm_scale",
            f"the norm scale varies with position or pair (from {float(st.scale.min()):.4g} to "
            f"{float(st.scale.max()):.4g}): RoPE multiplies every pair by one constant (1, or the attention "
            "factor of yarn/longrope). Remove the extra position-dependent factor (xPos-style decay?).",
        )
    if dg.direction == -1:
        dg.problem(
            "direction",
            "fn rotates by -m*theta (clockwise): y_b = x_b cos - x_a sin instead of x_b cos + x_a sin. Scores then "
            "see n - m with the opposite sign, which pretrained weights were not trained with: flip the sign of "
            "sin (or of the rotate_half output).",
        )
    if dg.pairing not in STYLES:
        return
    lad = fit_ladder(omega, dg.rotary_dim, d)
    if lad is None:
        dg.scaling = "other (per-frequency factors, e.g. longrope)"
        dg.base = _fit_base(omega, dg.rotary_dim)
        if abs(dg.norm_scale - 1) > STRUCT_TOL:
            dg.notes.append(f"norm scale {dg.norm_scale:.6g}: an attention factor folded into cos/sin.")
        return
    dg.base = lad.base
    dg.rope_scaling = lad.rope_scaling
    dg.scaling = lad.describe()
    st.ladder = lad
    dg.ladder_rel_err = lad.rel_err if not lad.exact else None
    if not lad.exact:
        cause = next((dt for dt in (torch.float16, torch.bfloat16) if lad.rel_err <= 2 * UNIT_ROUNDOFF[dt]), None)
        if cause is not None:
            dg.problem(
                "inv_freq_precision",
                f"inv_freq deviates from the {lad.describe()} ladder (base {lad.base:.6g}) by up to "
                f"{lad.rel_err:.1e} relative, the size of {DTYPE_NAMES[cause]} rounding (u = "
                f"2^{int(math.log2(UNIT_ROUNDOFF[cause]))}): inv_freq (or the tables) are held in "
                f"{DTYPE_NAMES[cause]}, "
                "so the phase drifts by m times that at position m. Keep inv_freq in float32 (a non-persistent "
                "buffer that model.to(dtype) leaves alone, or recompute it in float32 in forward).",
            )
        else:
            dg.problem(
                "scaling",
                f"inv_freq resembles the {lad.describe()} ladder but deviates by up to {lad.rel_err:.1e} "
                "relative: compute it as ropelab.frequencies(...) does, in float64 or float32.",
            )
    expected_af = lad.attention_factor
    s = dg.norm_scale
    tol = STRUCT_TOL * max(1.0, s)
    if abs(s - expected_af) <= tol:
        pass
    elif expected_af != 1.0 and abs(s - expected_af**2) <= tol:
        dg.problem(
            "attention_factor",
            f"the norm scale is {s:.6g} = {expected_af:.6g}^2: the {lad.name} attention factor {expected_af:.6g} is "
            "applied twice (to cos/sin and again to q/k or the output). Apply it once.",
        )
    elif expected_af != 1.0 and abs(s - 1) <= tol:
        dg.notes.append(
            f"the {lad.name} attention factor {expected_af:.6g} is not folded into the rotation (norm scale 1); "
            "that is right only if it is applied to the attention logits elsewhere."
        )
    else:
        dg.problem(
            "norm_scale",
            f"the norm scale is {s:.6g}, expected {expected_af:.6g} for {lad.describe()}: RoPE is a rotation "
            "(times yarn's attention factor). Remove the extra factor.",
        )


def _fit_base(omega: torch.Tensor, r: int) -> float | None:
    pos = omega > 0
    if int(pos.sum()) < 2:
        return None
    x = 2 * torch.arange(omega.numel(), dtype=torch.float64)[pos] / r
    slope, _ = _line(x, omega[pos].log())
    return math.exp(-slope) if slope < 0 else None


def _expectations(dg: Diagnosis, expect: Mapping[str, Any]) -> None:
    if not expect:
        return
    if "pairing" in expect and dg.pairing in STYLES and dg.pairing != expect["pairing"]:
        conv = "interleaved_to_half" if expect["pairing"] == "half" else "half_to_interleaved"
        dg.problem(
            "pairing",
            f"fn pairs dims {'(i, i+r/2) (half)' if dg.pairing == 'half' else '(2i, 2i+1) (interleaved)'} but "
            f"{expect['pairing']} was expected: weights trained for one style give wrong scores with the other. "
            f"Use the {expect['pairing']} style, or permute the q/k weights "
            f"(ropelab.convert.permute_qk_weight; for vectors ropelab.convert.{conv}).",
        )
    if "rotary_dim" in expect and dg.rotary_dim is not None and dg.rotary_dim != expect["rotary_dim"]:
        dg.problem(
            "rotary_dim",
            f"fn rotates {dg.rotary_dim} of {dg.head_dim} head dims, expected {expect['rotary_dim']}: set rotary_dim "
            "(partial_rotary_factor) so the dims past it pass through unrotated.",
        )
    if "base" in expect and dg.base is not None:
        want = float(expect["base"])
        if abs(dg.base / want - 1) > 1e-3:
            dg.problem(
                "base",
                f"the base is {dg.base:.6g}, expected {want:.6g}: inv_freq_i = base^(-2i/r) with r the rotary dim "
                "(the head dim, not the hidden size). Fix rope_theta or the exponent's denominator.",
            )
    if "rope_scaling" in expect and dg.inv_freq is not None and dg.rotary_dim:
        base = float(expect.get("base", dg.base or 10000.0))
        want, af = frequencies(
            dg.head_dim,
            base,
            rotary_dim=dg.rotary_dim if dg.rotary_dim < dg.head_dim else None,
            rope_scaling=expect["rope_scaling"],
        )
        if want.shape != dg.inv_freq.shape or _rel_err(dg.inv_freq, want) > LADDER_RTOL:
            wanted = (expect["rope_scaling"] or {}).get("rope_type", "default") if expect["rope_scaling"] else "default"
            dg.problem(
                "scaling",
                f"inv_freq does not match rope_scaling {expect['rope_scaling']} ({wanted}): it looks like "
                f"{dg.scaling}. Build inv_freq with ropelab.frequencies(head_dim, base, rope_scaling=...).",
            )
    if "attention_factor" in expect and dg.norm_scale is not None:
        want = float(expect["attention_factor"])
        if abs(dg.norm_scale - want) > STRUCT_TOL * max(1.0, want) and not dg.has("attention_factor"):
            dg.problem(
                "attention_factor",
                f"the norm scale is {dg.norm_scale:.6g}, expected attention factor {want:.6g}: multiply cos and sin "
                "by it exactly once.",
            )


def phase_tolerance(dtype: torch.dtype, max_angle: float) -> float:
    """Allowed phase error in radians: output rounding in ``dtype`` plus angles formed in float32."""
    return 4 * UNIT_ROUNDOFF[dtype] + 8 * UNIT_ROUNDOFF[torch.float32] * (1 + max_angle)


def _phase_call(fn, lay: Layout, sz, pdt, L, pairs_ab, st_dir) -> torch.Tensor:
    """Angles [L, P] read back from a call with positions 0 .. L-1 and every pair set to (1, 0)."""
    shape = [L if a == lay.seq else (sz[a] if a in ("d", "h") else 1) for a in lay.axes]
    a, b = pairs_ab
    x = torch.zeros(shape, dtype=pdt)
    d_idx = lay.index("d")
    x.movedim(d_idx, -1)[..., a] = 1.0
    cu = torch.tensor([0, L], dtype=torch.int32) if lay.seq == "t" else None
    y = _call(fn, x, lay, cu)
    y = y.reshape(shape).to(torch.float64).movedim(d_idx, -1).movedim(lay.index(lay.seq), 0)
    y = y.reshape(L, -1, y.shape[-1])[:, 0]
    return torch.atan2(y[:, b], y[:, a]) * st_dir


def _phase(fn, lay: Layout, sz, dtype, max_position, st: _Structure, dg: Diagnosis) -> None:
    L = max_position + 1
    a = torch.tensor([p[0] for p in dg.pairs])
    b = torch.tensor([p[1] for p in dg.pairs])
    k = min(len(dg.pairs), len(dg.inv_freq))
    a, b = a[:k], b[:k]
    m = torch.arange(L, dtype=torch.float64)
    try:
        hi = _phase_call(fn, lay, sz, st.probe_dtype, L, (a, b), dg.direction)
        lo = hi if dtype == st.probe_dtype else _phase_call(fn, lay, sz, dtype, L, (a, b), dg.direction)
    except _NotATensor:
        raise
    except Exception as e:  # noqa: BLE001
        dg.notes.append(f"the phase check at {L} positions failed ({type(e).__name__}: {str(e)[:160]}); skipped.")
        return
    # The frequencies of this call (dynamic NTK / longrope change with length), from positions <= 64.
    w0 = dg.inv_freq[:k]
    w_long = _wrap(hi[1])  # theta(1) = omega, no wrap ambiguity; then refined over 4, 16, 64 positions
    for n in (4, 16, 65):
        n = min(n, L)
        unw = m[:n, None] * w_long + _wrap(hi[:n] - m[:n, None] * w_long)
        w_long = (m[:n, None] * unw).sum(0) / (m[:n] ** 2).sum()
    full = torch.cat([w_long, dg.inv_freq[k:]])
    lad = fit_ladder(full, dg.rotary_dim, dg.head_dim) if dg.pairing in STYLES else None
    if lad is not None and st.ladder is not None:
        changed = (lad.describe(), lad.base) != (st.ladder.describe(), st.ladder.base)
    else:
        changed = _rel_err(w_long, w0) > (LADDER_RESEMBLES if lad is None and st.ladder is None else LADDER_RTOL)
    if changed:
        dg.length_dependent = True
        dg.notes.append(
            f"the frequencies change with the sequence length (dynamic NTK / longrope): at length {L} they are "
            + (f"{lad.describe()} with base {lad.base:.6g}" if lad else "not a known ladder")
            + f", at length {sz[lay.seq]} {dg.scaling} with base {_fmt(dg.base, 6)}."
        )
    else:
        lad = st.ladder
    ref = lad.inv_freq[:k] if lad is not None else w_long
    exact = m[:, None] * ref[None, :]
    err = _wrap(lo - exact).abs()
    per_pos = err.amax(-1)
    worst = int(per_pos.argmax())
    dg.phase_error = float(per_pos[worst])
    dg.phase_error_position = worst
    max_angle = float(exact.abs().max())
    dg.phase_tolerance = phase_tolerance(dtype, max_angle)
    if dg.phase_error <= dg.phase_tolerance:
        return
    first = int((per_pos > dg.phase_tolerance).nonzero()[0])
    best = None
    for where in ("positions", "inv_freq", "angle", "all"):
        for tag, dt in LOW_PRECISION.items():
            pred = perturbed_angle(m, ref, where=where, dtype=dt)
            e = float(_wrap(lo - pred).abs().max())
            if best is None or e < best[0]:
                best = (e, where, tag, dt)
    what = {
        "positions": "positions",
        "inv_freq": "inv_freq",
        "angle": "the angles m * inv_freq",
        "all": "positions, inv_freq and their product",
    }
    # Tables rounded to 16 bits add up to ~2u(bf16) on top of the named cause; the causes themselves differ
    # by whole steps m*omega, far more than that.
    if best is not None and best[0] <= dg.phase_tolerance + 4 * UNIT_ROUNDOFF[torch.bfloat16]:
        _, where, tag, dt = best
        dg.phase_cause = f"{where} in {tag}"
        hint = {
            "positions": f"integers above {int(1 / UNIT_ROUNDOFF[dt])} are not all exact in {tag}",
            "inv_freq": f"its relative rounding error, up to 2^{int(math.log2(UNIT_ROUNDOFF[dt])) - 1}, grows into "
            "an angle error of m * inv_freq times that",
            "angle": f"{tag} keeps {int(-math.log2(UNIT_ROUNDOFF[dt]))} bits of m * inv_freq",
            "all": f"{tag} positions are not all exact above {int(1 / UNIT_ROUNDOFF[dt])} and inv_freq is rounded",
        }[where]
        text = (
            f"fn holds {what[where]} in {DTYPE_NAMES[dt]}: phase error {dg.phase_error:.2g} rad at position {worst} "
            f"(first above the allowed {dg.phase_tolerance:.1e} rad at position {first}; {hint}). Form positions "
            "and inv_freq in float32 (or float64) and only cast cos/sin to the activation dtype."
        )
    else:
        text = (
            f"the angles drift from m * inv_freq: phase error {dg.phase_error:.2g} rad at position {worst} in "
            f"{DTYPE_NAMES[dtype]} (allowed {dg.phase_tolerance:.1e}, first exceeded at position {first}). Form "
            "positions, inv_freq and angles in float32 or float64."
        )
    dg.problem("precision", text)


# --------------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class Comparison:
    """Two implementations on the same input: the max abs difference and why they differ, in words."""

    name_a: str
    name_b: str
    a: Diagnosis
    b: Diagnosis
    dtype: torch.dtype
    max_abs_diff: float | None
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    differences: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        """No structural difference (what is left of max_abs_diff is rounding)."""
        return not self.differences

    def __str__(self) -> str:
        diff = "-" if self.max_abs_diff is None else f"{self.max_abs_diff:.3g}"
        lines = [
            f"compare {self.name_a} with {self.name_b}, layout '{self.a.layout}', "
            f"positions 0 .. {self.a.max_position}, "
            f"{DTYPE_NAMES[self.dtype]}: max abs difference {diff}"
        ]
        if self.same:
            lines.append("  the same rotation: the difference is rounding only.")
        lines += [f"  - {t}" for t in self.differences]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        esc = html.escape
        diff = "-" if self.max_abs_diff is None else f"{self.max_abs_diff:.3g}"
        items = "".join(f"<li>{esc(t)}</li>" for t in self.differences) or "<li>the same rotation: rounding only</li>"
        return (
            f"<div><p><b>compare {esc(self.name_a)} with {esc(self.name_b)}</b>, layout "
            f"<code>{esc(self.a.layout)}</code>, positions 0 .. {self.a.max_position}, {DTYPE_NAMES[self.dtype]}: "
            f"max abs difference <b>{diff}</b></p>"
            f"<ul>{items}</ul></div>"
        )


def _pair_words(dg: Diagnosis) -> str:
    if dg.pairing == "half" and dg.rotary_dim:
        return f"pairs (i, i+{dg.rotary_dim // 2})"
    if dg.pairing == "interleaved":
        return "pairs (2i, 2i+1)"
    return "pairs " + ", ".join(f"({a}, {b})" for a, b in dg.pairs[:4]) + " ..."


def compare(
    fn_a: Callable,
    fn_b: Callable,
    *,
    layout: str,
    sizes: Mapping[str, int] | None = None,
    dtype: torch.dtype = torch.float32,
    max_position: int = 4096,
    names: tuple[str, str] = ("A", "B"),
) -> Comparison:
    """Run ``fn_a`` and ``fn_b`` on the same random input (in ``dtype``, the probe sizes with positions
    0 .. ``max_position`` along the sequence) and explain each difference.

    Both are diagnosed (same sizes and arguments as ``diagnose``); every field where they differ becomes a
    sentence: the axis they rotate along, the pairing (with the ropelab.convert function that maps one onto
    the other), rotary_dim, base and scaling, direction, norm scale, varlen restarts, precision.
    """
    lay = _check_args(fn_a, layout, dtype, max_position, None)
    _check_args(fn_b, layout, dtype, max_position, None)
    sz = probe_sizes(lay, sizes)
    A = diagnose(fn_a, layout=layout, sizes=sz, dtype=dtype, max_position=max_position, name=names[0])
    B = diagnose(fn_b, layout=layout, sizes=sz, dtype=dtype, max_position=max_position, name=names[1])
    # The input: the probe sizes, with positions 0 .. max_position along the sequence (for t: one long
    # sequence and two short ones, so restarts count too).
    L = max_position + 1
    shape = [L if a == lay.seq else sz[a] for a in lay.axes]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    cu = torch.tensor([0, L - 9, L - 4, L], dtype=torch.int32) if lay.seq == "t" else None
    with _one_thread():
        ya = _call(fn_a, x.clone(), lay, cu)  # clones: an in-place fn must not change the other's input
        yb = _call(fn_b, x.clone(), lay, cu)
    diff = None
    if ya.numel() == yb.numel():
        diff = float((ya.reshape(x.shape).double() - yb.reshape(x.shape).double()).abs().max())
    cmp = Comparison(names[0], names[1], A, B, dtype, diff, tuple(ya.shape), tuple(yb.shape))
    cmp.differences = _explain(A, B, names, sz, lay)
    if not cmp.differences and diff is not None:
        # Same measured rotation: what is left must be rounding (output in dtype, angles in float32).
        scale = float(ya.double().abs().max())
        w = A.inv_freq if A.inv_freq is not None else torch.ones(1, dtype=torch.float64)
        allowed = 2 * phase_tolerance(dtype, max_position * float(w.abs().max())) * scale
        if diff > allowed:
            cmp.differences.append(
                f"the outputs differ by {diff:.3g}, more than rounding allows ({allowed:.2g}), although both "
                "diagnose alike: they differ somewhere the probes do not reach (larger batch, other sizes, "
                "non-contiguous input?)."
            )
    return cmp


def _explain(A: Diagnosis, B: Diagnosis, names, sz, lay: Layout) -> list[str]:
    out: list[str] = []
    seq = lay.seq
    for D, nm in ((A, names[0]), (B, names[1])):
        if D.has("error"):
            out.append(f"{nm} fails on the probe input: {D.problems[D.codes.index('error')]}")
        if D.output_shape is not None:
            out.append(
                f"{nm} returns shape {list(D.output_shape)} for an input of shape {[sz[a] for a in lay.axes]}: its "
                "cos/sin tables broadcast against the input and add an axis."
            )
    for D, nm in ((A, names[0]), (B, names[1])):
        if D.seq_axis is not None and D.seq_axis != seq:
            out.append(
                f"{nm} rotates along axis {D.seq_axis} (size {sz[D.seq_axis]}), not {seq}: it treats the "
                f"{AXIS_NAMES[D.seq_axis]} as positions, so {nm} agrees with a correct RoPE only where a token's "
                f"position equals its index along {D.seq_axis} (e.g. {D.seq_axis} = 0 at position 0)."
            )
        elif D.has("seq_axis"):
            out.append(f"{nm}: " + D.problems[D.codes.index("seq_axis")])
    for code in ("varlen", "positions", "batch", "not_rotation", "tables", "mixing", "no_rotation", "not_linear"):
        for D, nm in ((A, names[0]), (B, names[1])):
            if D.has(code) and not (code == "positions" and D.has("seq_axis")):
                out.append(f"{nm}: " + D.problems[D.codes.index(code)])
    if A.pairing in STYLES and B.pairing in STYLES and A.pairing != B.pairing:
        conv = "interleaved_to_half" if A.pairing == "half" else "half_to_interleaved"
        out.append(
            f"{names[0]} {_pair_words(A)}, {names[1]} {_pair_words(B)}: convert with ropelab.convert.{conv} "
            f"(vectors) or ropelab.convert.permute_qk_weight (q/k weights)."
        )
    elif A.pairing == "other" or B.pairing == "other":
        if A.pairs != B.pairs:
            out.append(f"{names[0]} {_pair_words(A)}, {names[1]} {_pair_words(B)}.")
    if A.rotary_dim and B.rotary_dim and A.rotary_dim != B.rotary_dim:
        out.append(f"{names[0]} rotates {A.rotary_dim} head dims, {names[1]} {B.rotary_dim}.")
    if A.base and B.base and abs(A.base / B.base - 1) > 1e-3:
        out.append(f"{names[0]} uses base {A.base:.6g}, {names[1]} base {B.base:.6g}.")
    if A.scaling and B.scaling and A.scaling != B.scaling and (A.base and B.base and abs(A.base / B.base - 1) <= 1e-3):
        out.append(f"{names[0]} uses the {A.scaling} frequency ladder, {names[1]} {B.scaling}.")
    if A.direction and B.direction and A.direction != B.direction:
        rev = names[0] if A.direction < 0 else names[1]
        out.append(f"{rev} rotates the other way (-m*theta): the sin term has the opposite sign.")
    if A.norm_scale is not None and B.norm_scale is not None and abs(A.norm_scale - B.norm_scale) > STRUCT_TOL:
        out.append(
            f"{names[0]} scales norms by {A.norm_scale:.6g}, {names[1]} by {B.norm_scale:.6g} (attention factor)."
        )
    for D, nm in ((A, names[0]), (B, names[1])):
        for code in ("inv_freq_precision", "precision", "attention_factor", "norm_scale", "direction"):
            if D.has(code):
                t = D.problems[D.codes.index(code)]
                if code == "precision" and D.phase_cause:
                    where, tag = D.phase_cause.split(" in ")
                    t = (
                        f"{nm} holds {where} in {tag}: phase error {D.phase_error:.2g} rad at position "
                        f"{D.phase_error_position}."
                    )
                    out.append(t)
                elif code in ("attention_factor", "inv_freq_precision"):
                    out.append(f"{nm}: {t}")
    # de-duplicate, keep order
    seen, uniq = set(), []
    for t in out:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    return uniq


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
            y = _call(fn, x, lay, cu).reshape(shape).double()
            d = lay.index("d")
            out["norm"] = float((y.norm(dim=d) / x.double().norm(dim=d) - 1).abs().max())
            # one q and one k vector repeated at every position (and every other index)
            q = torch.randn(sz["d"], generator=g, dtype=pdt)
            k = torch.randn(sz["d"], generator=g, dtype=pdt)
            qs = _seq_last(_call(fn, _fill(q, shape, d), lay, cu).reshape(shape).double(), lay)
            ks = _seq_last(_call(fn, _fill(k, shape, d), lay, cu).reshape(shape).double(), lay)
            S = qs @ ks.transpose(-1, -2)
            out["relative"] = float((S[..., 1:, 1:] - S[..., :-1, :-1]).abs().max() / S.abs().max())
            return out
        except _NotATensor:
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
    layout (d removed), in layout order. For a ``t`` layout ``cu_seqlens`` defaults to one sequence."""
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
        y = _call(fn, x, lay, cu_seqlens)
    except _NotATensor:
        raise
    except Exception:  # noqa: BLE001 - fn does not take float64
        y = _call(fn, x.float(), lay, cu_seqlens)
    y = y.reshape(shape).double().movedim(d, -1)
    return torch.atan2(y[..., b], y[..., a])


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _parse_kv(text: str | None, what: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise SystemExit(f"--{what} takes comma-separated key=value items (e.g. h=20,d=64), got {item!r}.")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _load(target: str) -> Callable:
    if ":" not in target:
        raise SystemExit(f"name the function as MODULE:CALLABLE (e.g. mypkg.rope:apply), got {target!r}.")
    mod_name, attr = target.split(":", 1)
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise SystemExit(f"cannot import module {mod_name!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"module {mod_name!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SystemExit(f"{target} is not callable.")
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropelab.diagnose",
        description="Probe a RoPE implementation and print what it does; exit 1 when it is not a correct RoPE.",
    )
    parser.add_argument("target", help="MODULE:CALLABLE, the function fn(x) (fn(x, cu_seqlens) for 't' layouts)")
    parser.add_argument("--layout", required=True, help='einops-style axes of x, e.g. "b s h d" or "t h d"')
    parser.add_argument("--sizes", help="axis sizes fn needs, e.g. h=20,d=64")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPE_NAMES.values()), help="phase-check dtype")
    parser.add_argument("--max-position", type=int, default=4096, help="last position of the phase check")
    parser.add_argument("--expect", help="expected values, e.g. pairing=half,base=10000,rotary_dim=64")
    args = parser.parse_args(argv)
    try:
        sizes = {k: int(v) for k, v in _parse_kv(args.sizes, "sizes").items()}
    except ValueError as e:
        raise SystemExit(f"--sizes takes integer sizes such as h=20,d=64 ({e}).") from e
    expect: dict[str, Any] = {}
    for k, v in _parse_kv(args.expect, "expect").items():
        if k not in ("pairing", "base", "rotary_dim", "attention_factor"):
            raise SystemExit(f"--expect knows pairing, base, rotary_dim, attention_factor; got {k!r}.")
        try:
            expect[k] = v if k == "pairing" else (int(v) if k == "rotary_dim" else float(v))
        except ValueError as e:
            raise SystemExit(f"--expect {k} needs a number, got {v!r}.") from e
    dtype = {v: k for k, v in DTYPE_NAMES.items()}[args.dtype]
    fn = _load(args.target)
    try:
        dg = diagnose(
            fn,
            layout=args.layout,
            sizes=sizes,
            dtype=dtype,
            max_position=args.max_position,
            expect=expect,
            name=args.target,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(dg)
    return 0 if dg.ok else 1


class _CallableModule(types.ModuleType):
    """``ropelab.diagnose`` is this module (``python -m ropelab.diagnose``, ``from ropelab.diagnose import
    Diagnosis``) and, called, the function: a submodule and a function of one name cannot otherwise both
    live on the package, and either import order would shadow one of them."""

    def __call__(self, *args, **kwargs) -> Diagnosis:
        return diagnose(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(main())
