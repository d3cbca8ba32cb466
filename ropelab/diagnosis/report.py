"""The result of ``diagnose`` and ``compare``, and their rendering as text and HTML."""

from __future__ import annotations

import html
import warnings
from dataclasses import dataclass, field

import torch

from ..core import STYLES
from ..precision import DTYPE_NAMES
from .ladder import fmt

__all__ = ["Diagnosis", "Comparison"]

# Problem codes renamed since the first ``diagnose`` (old -> new; CHANGELOG.md). Renamed fields are the
# deprecated properties of Diagnosis (``pairing``, ``phase_tolerance``).
_RENAMED_CODES = {"pairing": "style"}


def _renamed(old: str, new: str) -> property:
    """A deprecated alias of field ``new``: reads and writes it, with a DeprecationWarning naming ``new``."""

    def warn() -> None:
        warnings.warn(f"Diagnosis.{old} is deprecated; use Diagnosis.{new}.", DeprecationWarning, stacklevel=3)

    def get(self):
        warn()
        return getattr(self, new)

    def set_(self, value) -> None:
        warn()
        setattr(self, new, value)

    return property(get, set_, doc=f"Deprecated alias of ``{new}``.")


@dataclass(repr=False)
class Diagnosis:
    """What ``diagnose`` measured. ``ok`` is True only for a correct RoPE along the declared axis.

    ``problems`` holds plain-English findings, each with its fix; ``codes`` the short name of each (one of
    ``error, dtype, shape, not_linear, no_rotation, mixing, not_rotation, tables, seq_axis, positions, varlen,
    restart, batch, heads, direction, norm_scale, attention_factor, twice, inv_freq_precision, precision,
    style, rotary_dim, base, scaling, not_single_axis``); ``notes`` what is worth knowing but not wrong. ``style`` and
    ``pairs`` are read in input dims (after undoing an ``output_permutation``); the rotary slice is head
    dims ``rotary_start .. rotary_start + rotary_dim - 1``; ``phase_allowed`` is the phase error a correct
    implementation may show (``ropelab.precision.phase_tolerance``).

    :func:`diagnose` builds and fills it; None in a field means not measured (or not applicable).

    Args:
        name: how the report names fn.
        layout: the layout diagnosed, as a string (``"b s h d"``).
        sizes: the probe's axis sizes, axis letter -> size (the caller's, the rest picked by the checker).
        dtype: the dtype of the phase check.
        probe_dtype: the dtype of the structure probe: float64 when fn keeps float64, else float32.
        cu_seqlens: the probe's cumulative lengths for a ``t`` layout, else None.
        output_shape: fn's output shape, set only when it differs from the input's.
        declared_seq: the layout's sequence axis, ``"s"`` or ``"t"``.
        seq_axis: the axis the measured positions run along (index 0, 1, 2, ... of it), None if none.
        varies_along: the token axes along which the rotation angle changes.
        positions_ok: whether every token's measured position is the expected one (0, 1, 2, ... along the
            declared axis, restarting at each ``cu_seqlens`` boundary for ``t``).
        restarts_at_cu_seqlens: ``t`` layouts: whether positions restart at each sequence boundary.
        style: ``"half"``, ``"interleaved"`` or ``"other"`` (then ``pairs`` lists them).
        pairs: the measured pairs (a, b) of input dims that rotate together, b turning forward from a.
        rotary_dim: how many head dims rotate.
        rotary_start: the first rotating head dim.
        output_permutation: output dim k holds input dim ``output_permutation[k]``; None when fn does not
            reorder its output.
        head_dim: the probe's head size d.
        inv_freq: the measured frequencies, one per pair (float64), in pair order.
        base: the base of the ladder that reproduces them.
        scaling: that ladder in words (``"default"``, or its rope_type and parameters; "unrecognised ..." when
            no known ladder reproduces the frequencies).
        rope_scaling: the matched ladder as a Hugging Face dict, None for the default ladder.
        ladder_rel_err: max relative difference between the measured and the matched ladder, set only when
            the match is not exact.
        direction: +1 when the pairs turn forward with position, -1 when backward (the sin term's sign).
        norm_scale: the median factor by which the 2x2 blocks scale a pair (1 for a pure rotation; an
            attention factor shows here).
        identity_at_zero: whether position 0 leaves x unchanged (angle 0).
        heads_alike: whether every head gets the same rotation (None without an ``h`` axis).
        batch_alike: whether every batch element gets the same rotation (None without a ``b`` axis).
        length_dependent: whether the frequencies change with the sequence length (dynamic scalings).
        phase_error: the worst pair's phase error (radians) over the phase check, against the matched ladder
            in float64.
        phase_error_position: the position where that error is largest.
        phase_allowed: the phase error a correct implementation may show in ``dtype``.
        phase_cause: the rounding that explains an error past ``phase_allowed`` (e.g. ``"positions in bf16"``),
            or ``"unexplained"``.
        phase_first: the first position whose phase error passes ``phase_allowed`` (when a cause is named).
        ladder_rounding: the rounding that turns the matched ladder into the measured one (e.g.
            ``"inv_freq in bf16"``), if any.
        roundoff_ratio: the worst phase error over the most any 16-bit rounding can give (set past
            ``phase_allowed``; above 1: no rounding explains it).
        late_turn: how far dims that did not rotate in the short probe move over the phase check.
        position_spread: how far the pairs of one token disagree about its position (when read).
        max_position: the last position of the phase check.
        problems: the findings, one sentence each with its fix; empty when ``ok``.
        codes: the short name of each problem, in the same order.
        notes: what is worth knowing but not wrong.
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
    style: str | None = None  # "half", "interleaved" or "other" (pairs in dg.pairs)
    pairs: list[tuple[int, int]] = field(default_factory=list)
    rotary_dim: int | None = None
    rotary_start: int = 0  # the rotary slice is head dims rotary_start .. rotary_start + rotary_dim - 1
    output_permutation: list[int] | None = None  # output dim k holds input dim output_permutation[k]
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
    phase_allowed: float | None = None
    phase_cause: str | None = None  # e.g. "positions in bf16"; "unexplained" when no 16-bit cause fits
    phase_first: int | None = None  # the first position whose phase error passes phase_allowed (if named)
    ladder_rounding: str | None = None  # e.g. "inv_freq in bf16": the measured ladder is the matched one rounded
    roundoff_ratio: float | None = None  # worst phase error / the most any 16-bit rounding can give (set past allowed)
    late_turn: float | None = None  # how far dims unrotated in the short probe move over the phase check
    position_spread: float | None = None  # how far the pairs of one token disagree about its position (if read)
    max_position: int = 4096
    problems: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, code: str, text: str) -> None:
        """Record a problem: its code (what a program tests with :meth:`has`) and its sentence (what the report
        prints).

        Args:
            code: a short stable name, e.g. ``"not_rotation"`` or ``"precision"``.
            text: the sentence that names the problem and the fix.
        """
        self.codes.append(code)
        self.problems.append(text)

    def has(self, code: str) -> bool:
        """Whether a problem with this code was found (a renamed code still answers, with a DeprecationWarning).

        Args:
            code: a problem code, as :meth:`problem` records it.
        """
        if code in _RENAMED_CODES:
            warnings.warn(f"the code {code!r} is now {_RENAMED_CODES[code]!r}.", DeprecationWarning, stacklevel=2)
            code = _RENAMED_CODES[code]
        return code in self.codes

    pairing = _renamed("pairing", "style")
    phase_tolerance = _renamed("phase_tolerance", "phase_allowed")

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
        if self.style is not None:
            if self.style in STYLES and self.rotary_dim:
                r = self.rotary_dim
                pairs = f"(i, i+{r // 2})" if self.style == "half" else "(2i, 2i+1)"
                desc = f"{self.style} {pairs}"
                if self.rotary_start:
                    desc += f" within dims {self.rotary_start}..{self.rotary_start + r - 1}"
            else:
                desc = (
                    "other: "
                    + ", ".join(f"({a}, {b})" for a, b in self.pairs[:6])
                    + (", ..." if len(self.pairs) > 6 else "")
                )
            rows.append(("style (pairs)", desc, flag(c & {"style", "mixing", "not_rotation", "tables"})))
        if self.rotary_dim is not None:
            where = ""
            if self.rotary_dim < self.head_dim:
                end = self.rotary_start + self.rotary_dim - 1
                where = f" (dims {self.rotary_start}..{end}, {'trailing' if self.rotary_start else 'leading'})"
            rows.append(("rotary_dim", f"{self.rotary_dim} of {self.head_dim}{where}", flag("rotary_dim" in c)))
        if self.inv_freq is not None:
            w = [fmt(v) for v in self.inv_freq.tolist()]
            shown = ", ".join(w if len(w) <= 4 else w[:3] + ["...", w[-1]])
            rows.append(("inv_freq", shown, flag("inv_freq_precision" in c)))
        if self.base is not None or self.inv_freq is not None:
            rows.append(("base", fmt(self.base, 6), flag("base" in c)))
        if self.scaling is not None:
            err = f" (max rel. deviation {self.ladder_rel_err:.1e})" if self.ladder_rel_err else ""
            rows.append(("scaling", self.scaling + err, flag("scaling" in c)))
        if self.direction is not None:
            d = "+m*theta (counter-clockwise)" if self.direction > 0 else "-m*theta (reversed)"
            rows.append(("rotation direction", d, flag("direction" in c)))
        if self.norm_scale is not None:
            rows.append(("norm scale", fmt(self.norm_scale, 6), flag(c & {"norm_scale", "attention_factor"})))
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
            v += f" (allowed {self.phase_allowed:.1e})"
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
# compare
# --------------------------------------------------------------------------------------------------


@dataclass(repr=False)
class Comparison:
    """Two implementations on the same input: the max abs difference and why they differ, in words.

    Args:
        name_a: how the report names the first implementation.
        name_b: how it names the second.
        a: the first one's :class:`Diagnosis`.
        b: the second one's.
        dtype: the dtype of the shared input.
        max_abs_diff: the largest absolute difference of the two outputs, or None when their sizes differ.
        shape_a: the first output's shape.
        shape_b: the second output's shape.
        differences: one sentence per field where the diagnoses differ; empty when they agree.
    """

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
