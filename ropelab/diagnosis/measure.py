r"""``diagnose``: the measuring pipeline (structure, frequencies, expectations, phase) behind one call."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core import STYLES, Layout, parse_layout
from ..precision import DTYPE_NAMES, UNIT_ROUNDOFF, perturbed_angle, phase_tolerance, wrap_angle
from ..scaling import default_inv_freq, frequencies
from .axes import NOT_SINGLE_AXIS, SINGLE_AXIS_LENGTH, SPREAD_TOL, position_spread, single_axis_deviation
from .ladder import LADDER_RESEMBLES, LADDER_RTOL, fit_ladder, fmt, head_base, rel_err
from .probes import STRUCT_TOL, NotATensor, as_torch_fn, call, one_thread, probe_cu_seqlens, probe_sizes
from .report import Diagnosis
from .rounding import Rounding, fit_frequencies, on_grid, read_rounding
from .structure import Structure, measure_structure

__all__ = ["diagnose", "check_args", "EXPECT_KEYS"]

LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNEXPLAINED = "unexplained"  # phase_cause when no 16-bit cause reproduces the phase error
# Findings of the short structure probe that a RoPE with several positions per token behind 1D input can
# produce (a grid narrower than the probe, or extra axes too slow to turn in it): each is confirmed over
# positions 0 .. max_position before it is reported (axes.position_spread).
SHORT_PROBE_FINDINGS = frozenset({"no_rotation", "positions", "seq_axis", "restart", "style", "direction"})


EXPECT_KEYS = ("style", "base", "rotary_dim", "rope_scaling", "max_position_embeddings", "attention_factor")


def check_args(fn, layout, dtype, max_position, expect) -> Layout:
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
        if k == "pairing":
            raise ValueError(
                "expect names the pairing 'style' (as apply_rope does), not 'pairing': pass "
                f"expect={{'style': {expect['pairing']!r}}}."
            )
        if k not in EXPECT_KEYS:
            raise ValueError(f"expect has an unknown key {k!r}; known keys: {', '.join(EXPECT_KEYS)}.")
    if expect and "style" in expect and expect["style"] not in STYLES:
        raise ValueError(f"expect['style'] must be 'half' or 'interleaved', got {expect['style']!r}.")
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
    framework: str | None = None,
) -> Diagnosis:
    """Probe ``fn`` and report what rotation it applies. See the module docstring for the method.

    Args:
        fn: takes one tensor laid out as ``layout`` and returns it rotated, positions 0, 1, 2, ... along
            the axis the caller means as the sequence; for a ``t`` layout ``fn(x, cu_seqlens)``.
        layout: einops-style axes of the tensor (``"b s h d"``, ``"b h s d"``, ``"s h d"``, ``"t h d"``, ...).
        sizes: axis sizes fn needs (``{"h": 20, "d": 64}``); the checker picks the rest, all different.
        dtype: the dtype of the phase check (where low-precision positions or frequencies show).
        max_position: the last position of the phase check.
        expect: what fn should do, each a problem when it differs: ``style`` ("half"/"interleaved"),
            ``base``, ``rotary_dim``, ``rope_scaling`` (a Hugging Face dict; None for default) with
            ``max_position_embeddings`` where the type needs it (dynamic), ``attention_factor``. The old key
            ``pairing`` is refused with a message naming ``style`` (one name per idea, as ``apply_rope``).
        name: how the report names fn.
        framework: the arrays fn takes: ``"torch"``, or ``"mlx"`` (``mx.array`` in and out, converted at the
            boundary by ``ropelab.engines.mlx``, so ``functools.partial(mx.fast.rope, dims=..., ...)`` or an mlx-lm
            rope module is diagnosed like a torch function); None (the default) detects MLX from fn's module.
    """
    name = name or _fn_name(fn)
    fn = as_torch_fn(fn, framework)
    lay = check_args(fn, layout, dtype, max_position, expect)
    sz = probe_sizes(lay, sizes)
    with one_thread():
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
    st = measure_structure(fn, lay, sz, cu, dg)
    short = SHORT_PROBE_FINDINGS & set(dg.codes)
    if st is not None:
        _frequencies(st, dg)
        _expectations(dg, expect or {})
        positions_wrong = any(map(dg.has, ("varlen", "positions", "restart")))
        if dg.seq_axis == lay.seq and dg.inv_freq is not None and not positions_wrong:
            _phase(fn, lay, sz, dtype, max_position, st, dg)
        if (dg.problems or dg.phase_cause == UNEXPLAINED) and dg.positions_ok and not positions_wrong:
            _single_axis(fn, lay, sz, dg)
    if short & set(dg.codes):  # still reported: confirm it over positions 0 .. max_position
        _several_positions(fn, lay, sz, max_position, dg)
    return dg


def _several_positions(fn, lay: Layout, sz: dict[str, int], max_position: int, dg: Diagnosis) -> None:
    """Before a short-probe finding is reported: do the pairs of one token read different positions over
    positions 0 .. max_position? Then fn is no RoPE along one axis, and that finding's fix would be wrong."""
    sp = position_spread(fn, lay, sz, length=max_position + 1, pairs=dg.pairs, dtype=dg.probe_dtype or torch.float64,
                         output_permutation=dg.output_permutation)
    if sp is None or sp.spread <= SPREAD_TOL:
        return
    dg.position_spread = sp.spread
    dg.positions_ok = None  # the short probe's reading of the positions does not apply
    _not_single_axis(dg, [
        f"over positions 0 .. {max_position} the pairs of one token read different positions: at index {sp.token} "
        f"their angles, each divided by its largest, spread by {sp.spread:.2g} of their size ({sp.pairs} pairs that "
        f"never pass pi/2, read as {sp.style} pairs; one position per token keeps this below {SPREAD_TOL:.2g} even "
        "with 16-bit tables)"
    ])


def _not_single_axis(dg: Diagnosis, evidence: list[str]) -> None:
    dg.problems.clear()
    dg.codes.clear()
    dg.length_dependent = None  # frequencies refitted at another length describe no single ladder here
    dg.notes[:] = [n for n in dg.notes if not n.startswith("the frequencies change with the sequence length")]
    dg.problem(
        "not_single_axis",
        "not single-axis RoPE: " + "; ".join(evidence) + ". The rows above describe a short probe only, and no "
        "pairing, position, base or precision fix applies. A 2D/3D or M-RoPE computing several positions per token "
        "(row and column, or frame, from the token index) does this: probe it with multi-axis positions "
        "(ropelab.diagnosis.axes.diagnose_axes).",
    )


def _single_axis(fn, lay: Layout, sz: dict[str, int], dg: Diagnosis) -> None:
    """Replace pairing/ladder/precision fixes by one finding when fn is not a RoPE along one axis at all."""
    try:
        dev = single_axis_deviation(fn, layout=str(lay), sizes=sz)
    except Exception:  # noqa: BLE001 - fn may refuse the longer probe; the phase check's evidence remains
        dev = None
    evidence = []
    if dev is not None and dev > NOT_SINGLE_AXIS:
        evidence.append(
            f"with one q and one k at every position, the scores are not a function of n - m over "
            f"{SINGLE_AXIS_LENGTH} positions (relative deviation {dev:.2g})"
        )
    if dg.late_turn is not None and dg.late_turn > STRUCT_TOL:
        evidence.append(
            f"head dims that stay unrotated over the first {dg.sizes[dg.declared_seq]} positions turn later, by up "
            f"to {dg.late_turn:.2g} by position {dg.max_position} (a single-axis RoPE turns every rotating pair "
            "from position 1 on)"
        )
    if dg.roundoff_ratio is not None and dg.roundoff_ratio > 1:
        evidence.append(
            f"the angles depart from m * inv_freq by up to {dg.roundoff_ratio:.2g} times what positions, inv_freq, "
            "angles or cos/sin tables rounded to bfloat16 or float16 can produce (4u(1 + |theta|), u = 2^-8)"
        )
    elif dg.phase_cause == UNEXPLAINED:
        evidence.append(
            f"past position {dg.phase_first} the angles depart from m * inv_freq (phase error {dg.phase_error:.2g} "
            f"rad at position {dg.phase_error_position}, allowed {dg.phase_allowed:.1e}) in a pattern that none of "
            "positions, inv_freq, angles or cos/sin tables held in bfloat16 or float16 reproduces; diagnose cannot "
            "tell positions that change past its short probe from several positions per token"
        )
    if evidence:
        _not_single_axis(dg, evidence)


def _frequencies(st: Structure, dg: Diagnosis) -> None:
    if st.omega is None:
        return
    d = dg.head_dim
    omega = st.omega[st.pair_order] if dg.style in STYLES else st.omega
    if dg.style in STYLES and dg.rotary_dim == d and len(omega) < d // 2:  # proportional: zero tail
        omega = torch.cat([omega, torch.zeros(d // 2 - len(omega), dtype=torch.float64)])
    dg.inv_freq = omega
    _norm_scale(st, dg)
    if dg.direction == -1:
        dg.problem(
            "direction",
            "fn rotates by -m*theta (clockwise): y_b = x_b cos - x_a sin instead of x_b cos + x_a sin. Scores then "
            "see n - m with the opposite sign, which pretrained weights were not trained with: flip the sign of "
            "sin (or of the rotate_half output).",
        )
    if dg.style not in STYLES:
        return
    lad = fit_ladder(omega, dg.rotary_dim, d, norm_scale=dg.norm_scale)
    twice = lad is None or (lad.name == "linear" and lad.rope_scaling["factor"] == 0.5)
    if twice:  # doubled angles read as a linear factor 0.5, or (on a yarn / llama3 ladder) as nothing known
        half = fit_ladder(omega / 2, dg.rotary_dim, d)
        if half is not None and half.exact and (lad is None or half.name != "linear"):
            dg.problem(
                "twice",
                f"every angle is twice that of the {half.describe()} ladder with base {half.base:.6g} (it reads as "
                "a linear factor 0.5, which Hugging Face rejects: factors are >= 1): RoPE is applied twice, "
                "e.g. in the attention layer and again in a fused kernel or the cache. Apply it once.",
            )
            lad = dataclasses.replace(half, inv_freq=2 * half.inv_freq)  # the doubled ladder, for the phase check
    if lad is None:
        _unrecognised(omega, dg)
        return
    dg.base = lad.base
    dg.rope_scaling = lad.rope_scaling
    dg.scaling = lad.describe()
    st.ladder = lad
    if lad.note:
        dg.notes.append(lad.note + ".")
    dg.ladder_rel_err = lad.rel_err if not lad.exact else None
    if lad.name == "linear" and lad.rope_scaling["factor"] < 1 and not dg.has("twice"):
        dg.problem(
            "scaling",
            f"the ladder is linear with factor {lad.rope_scaling['factor']:.4g}, below 1: positions are stretched, "
            "not interpolated (Hugging Face rejects factors below 1). Check the factor (inverted?) and that RoPE "
            "is applied once.",
        )
    if not lad.exact and dg.has("precision"):  # 16-bit cos/sin tables: the ladder is read to that accuracy
        dg.notes.append(
            f"inv_freq is read only to {lad.rel_err:.1e} relative through the 16-bit tables; it resembles the "
            f"{lad.describe()} ladder."
        )
    elif not lad.exact:
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
    _attention_factor(lad, dg)


def _unrecognised(omega: torch.Tensor, dg: Diagnosis) -> None:
    """No known ladder reproduces omega: say so and show it; no base is printed (a line fit through a
    scaled ladder can be wrong by 100x)."""
    dg.scaling = "unrecognised (no default, linear, yarn, llama3 or proportional ladder reproduces it)"
    if len(omega) >= 2 and abs(float(omega[0]) - 1) <= LADDER_RTOL and bool((omega[1:].abs() <= LADDER_RTOL).all()):
        dg.problem(
            "inv_freq_precision",
            "only the first pair rotates, by 1 rad per position (base^0 = 1 for any base); every other pair has "
            "frequency 0. No RoPE ladder does this; base ** (2i/r) overflowing to inf does (a base above float16's "
            f"largest value {torch.finfo(torch.float16).max:.6g} raised in float16). Compute inv_freq in float32.",
        )
    dg.notes.append("measured inv_freq: [" + ", ".join(f"{v:.6g}" for v in omega.tolist()) + "].")
    head = head_base(omega, dg.rotary_dim)
    if head is not None and head[1] >= 3:
        b, k = head
        factors = omega / default_inv_freq(dg.rotary_dim, b)
        dg.notes.append(
            f"its first {k + 1} pairs follow base^(-2i/r) with base {b:.6g}; relative to that ladder the per-pair "
            "factors are [" + ", ".join(f"{v:.4g}" for v in factors.tolist()) + "] (longrope-style per-frequency "
            "factors?)."
        )
    if abs(dg.norm_scale - 1) > STRUCT_TOL:
        dg.notes.append(f"norm scale {dg.norm_scale:.6g}: an attention factor folded into cos/sin.")


def _norm_scale(st: Structure, dg: Diagnosis) -> None:
    """One norm scale for every pair and token; else name what varies: 16-bit rounding of cos and sin
    (a wobble without trend), or a factor that grows or decays with position (xPos)."""
    spread = float((st.scale - dg.norm_scale).abs().max())
    if spread <= STRUCT_TOL * max(1.0, dg.norm_scale):
        return
    # log a_i(m) against the position m, per pair: xPos is exactly linear (zeta_i^((m - c) / scale_base)).
    m = st.positions.reshape(-1).to(torch.float64)
    la = st.scale.reshape(m.numel(), -1).clamp_min(1e-300).log()
    A = torch.stack([m, torch.ones_like(m)], 1)
    coef = torch.linalg.lstsq(A, la).solution
    resid = float((la - A @ coef).abs().max())
    trend = float((coef[0] * (m.max() - m.min())).abs().max())
    if m.unique().numel() >= 3 and trend > 8 * resid and trend > STRUCT_TOL:
        lo, hi = float(st.scale.min()), float(st.scale.max())
        dg.problem(
            "norm_scale",
            f"the norm scale changes with position, per pair, by a factor up to exp({trend:.3g}) over positions "
            f"{int(m.min())}..{int(m.max())} (from {lo:.4g} to {hi:.4g}; log-linear in position to {resid:.1e}): an "
            "xPos-style decay (q scaled by zeta^(m/scale_base), k by its inverse), not a plain rotation. It is "
            "right only if the model was trained with xPos; RoPE multiplies every pair by one constant.",
        )
    elif spread <= 4 * UNIT_ROUNDOFF[torch.bfloat16]:
        dg.problem(
            "precision",
            f"cos and sin are rounded to a 16-bit dtype even for {DTYPE_NAMES[st.probe_dtype]} input: the norm "
            f"scale wobbles by {spread:.1e} without trend (cos^2 + sin^2 != 1). Build the tables in float32 and "
            "cast them to the input's dtype, not lower.",
        )
    else:
        dg.problem(
            "norm_scale",
            f"the norm scale varies with position or pair (from {float(st.scale.min()):.4g} to "
            f"{float(st.scale.max()):.4g}): RoPE multiplies every pair by one constant (1, or the attention "
            "factor of yarn/longrope). Remove the extra factor.",
        )


def _attention_factor(lad, dg: Diagnosis) -> None:
    expected_af = lad.attention_factor
    s = dg.norm_scale
    tol = STRUCT_TOL * max(1.0, s)
    if dg.has("norm_scale") or dg.has("precision") or abs(s - expected_af) <= tol:
        return
    if expected_af != 1.0 and abs(s - expected_af**2) <= tol:
        dg.problem(
            "attention_factor",
            f"the norm scale is {s:.6g} = {expected_af:.6g}^2: the {lad.name} attention factor {expected_af:.6g} is "
            "applied twice (to cos/sin and again to q/k or the output). Apply it once.",
        )
    elif expected_af != 1.0 and abs(s - 1) <= tol:
        if lad.name == "yarn":  # what the rotation does: yarn with attention factor 1 (a config can say so)
            dg.rope_scaling = {**lad.rope_scaling, "attention_factor": 1.0}
        dg.notes.append(
            f"the {lad.name} attention factor {expected_af:.6g} is not folded into the rotation (norm scale 1); "
            "that is right only if it is applied to the attention logits elsewhere, or configured as 1 "
            "(attention_factor 1, or mscale = mscale_all_dim)."
        )
    elif lad.name == "yarn":  # yarn's factor is a config value of its own (attention_factor, mscale)
        dg.rope_scaling = {**lad.rope_scaling, "attention_factor": round(s, 6)}
        dg.notes.append(
            f"the norm scale {s:.6g} is yarn's attention factor as configured (attention_factor or mscale / "
            f"mscale_all_dim), not the default 0.1 ln(s) + 1 = {expected_af:.6g}."
        )
    else:
        dg.problem(
            "norm_scale",
            f"the norm scale is {s:.6g}, expected {expected_af:.6g} for {lad.describe()}: RoPE is a rotation "
            "(times yarn's attention factor). Remove the extra factor.",
        )


def _expectations(dg: Diagnosis, expect: Mapping[str, Any]) -> None:
    if not expect:
        return
    if "style" in expect and dg.style in STYLES and dg.style != expect["style"]:
        conv = "interleaved_to_half" if expect["style"] == "half" else "half_to_interleaved"
        dg.problem(
            "style",
            f"fn pairs dims {'(i, i+r/2) (half)' if dg.style == 'half' else '(2i, 2i+1) (interleaved)'} but "
            f"{expect['style']} was expected: weights trained for one style give wrong scores with the other. "
            f"Use the {expect['style']} style, or permute the q/k weights "
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
        try:
            want, af = frequencies(
                dg.head_dim,
                base,
                rotary_dim=dg.rotary_dim if dg.rotary_dim < dg.head_dim else None,
                rope_scaling=expect["rope_scaling"],
                max_position_embeddings=expect.get("max_position_embeddings"),
                seq_len=dg.sizes[dg.declared_seq] if dg.declared_seq in dg.sizes else None,
            )
        except ValueError as e:  # name the way to give it to diagnose
            raise ValueError(
                f"expect['rope_scaling'] cannot be evaluated: {e} Give it to diagnose as "
                "expect['max_position_embeddings'] (or add the key to the dict)."
            ) from e
        if want.shape != dg.inv_freq.shape or rel_err(dg.inv_freq, want) > LADDER_RTOL:
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


def _phase_call(fn, lay: Layout, sz, pdt, L, pairs_ab, st_dir, perm=None, still=None) -> torch.Tensor:
    """Angles [L, P] read back from a call with positions 0 .. L-1 and every pair set to (1, 0). With
    ``still`` (the dims the short probe saw unrotated, set to 1 too) returns also how far they move,
    ``max |y_j - 1|`` over the positions: 0 for a pass-through dim."""
    shape = [L if a == lay.seq else (sz[a] if a in ("d", "h") else 1) for a in lay.axes]
    a, b = pairs_ab
    x = torch.zeros(shape, dtype=pdt)
    d_idx = lay.index("d")
    x.movedim(d_idx, -1)[..., a] = 1.0
    if still is not None:
        x.movedim(d_idx, -1)[..., still] = 1.0
    cu = torch.tensor([0, L], dtype=torch.int32) if lay.seq == "t" else None
    y = call(fn, x, lay, cu)
    y = y.reshape(shape).to(torch.float64).movedim(d_idx, -1).movedim(lay.index(lay.seq), 0)
    y = y.reshape(L, -1, y.shape[-1])[:, 0]
    if perm is not None:  # back to input dims: output dim k holds input dim perm[k]
        y = y[:, torch.argsort(torch.tensor(perm))]
    angles = torch.atan2(y[:, b], y[:, a]) * st_dir
    if still is None:
        return angles
    return angles, float((y[:, still] - 1).abs().max()) if len(still) else 0.0


def _phase(fn, lay: Layout, sz, dtype, max_position, st: Structure, dg: Diagnosis) -> None:
    L = max_position + 1
    a = torch.tensor([p[0] for p in dg.pairs])
    b = torch.tensor([p[1] for p in dg.pairs])
    k = min(len(dg.pairs), len(dg.inv_freq))
    a, b = a[:k], b[:k]
    m = torch.arange(L, dtype=torch.float64)
    try:
        # The low-precision call first: a module that caches its tables by length (rotary-embedding-torch)
        # would otherwise serve it the tables the high-precision call at this length just built.
        args = (lay, sz), L, (a, b), dg.direction, dg.output_permutation
        lo = _phase_call(fn, *args[0], dtype, *args[1:])
        paired = {i for p in dg.pairs for i in p}
        still = [j for j in range(dg.head_dim) if j not in paired]
        hi, dg.late_turn = _phase_call(fn, *args[0], st.probe_dtype, *args[1:], still=still)
    except NotATensor:
        raise
    except Exception as e:  # noqa: BLE001
        dg.notes.append(f"the phase check at {L} positions failed ({type(e).__name__}: {str(e)[:160]}); skipped.")
        return
    # The frequencies of this call (dynamic NTK / longrope change with length), from positions <= 64.
    w0 = dg.inv_freq[:k]
    w_long = wrap_angle(hi[1])  # theta(1) = omega, no wrap ambiguity; then refined over 4, 16, 64 positions
    for n in (4, 16, 65):
        n = min(n, L)
        unw = m[:n, None] * w_long + wrap_angle(hi[:n] - m[:n, None] * w_long)
        w_long = (m[:n, None] * unw).sum(0) / (m[:n] ** 2).sum()
    full = torch.cat([w_long, dg.inv_freq[k:]])
    lad = fit_ladder(full, dg.rotary_dim, dg.head_dim) if dg.style in STYLES else None
    # Changed only beyond what the two measurements can resolve: each omega_i comes from angles at positions
    # <= 64, each within phase_tolerance of the probe dtype, so it is known to ~that / 64 (absolute), and the
    # structure's to LADDER_RTOL relative. (Comparing the two fitted bases as floats flagged 12345.678.)
    resolution = 4 * phase_tolerance(st.probe_dtype, 65 * float(w0.abs().max())) / 64 + LADDER_RTOL * w0.abs()
    if lad is None and st.ladder is None:
        resolution = torch.maximum(resolution, LADDER_RESEMBLES * w0.abs())
    if dg.has("precision"):  # angles read through 16-bit tables (named by the structure probe)
        resolution = resolution + 4 * UNIT_ROUNDOFF[torch.bfloat16] / 64
    if st.ladder is not None and not st.ladder.exact:  # w0 itself is known only to the ladder's deviation
        resolution = resolution + 2 * st.ladder.rel_err * w0.abs()
    changed = bool(((w_long - w0).abs() > resolution).any())
    if changed and lad is not None and st.ladder is not None and lad.describe() == st.ladder.describe():
        changed = abs(lad.base / st.ladder.base - 1) > 1e-6  # the same ladder read twice
    if changed:
        dg.length_dependent = True
        dg.notes.append(
            f"the frequencies change with the sequence length (dynamic NTK / longrope): at length {L} they are "
            + (f"{lad.describe()} with base {lad.base:.6g}" if lad else "not a known ladder")
            + f", at length {sz[lay.seq]} {dg.scaling} with base {fmt(dg.base, 6)}."
        )
    else:
        lad = st.ladder
    ref = lad.inv_freq[:k] if lad is not None else w_long
    # A ladder off the matched one (not exact): is it that ladder rounded to 16 bits, by any route? The
    # frequencies of the long high-precision call, each fitted with its uncertainty (rounding.read_rounding).
    w_hat, rounded = None, None
    if lad is not None and not lad.exact:
        w_hat, sig = fit_frequencies(hi)
        rounded = read_rounding(w_hat, sig, ref, base=lad.base if lad.rope_scaling is None else None)
        if rounded is not None:
            _rounded_ladder(dg, lad, rounded, "")
    elif lad is None and dg.scaling and dg.scaling.startswith("unrecognised"):
        grid = on_grid(*fit_frequencies(hi))
        if grid is not None:
            name = DTYPE_NAMES[grid.dtype]
            dg.ladder_rounding = f"inv_freq in {grid.tag}"
            dg.problem(
                "inv_freq_precision",
                f"inv_freq matches no known ladder, and every one of the {grid.resolved} frequencies measured finely "
                f"enough to tell lies exactly on the {name} grid: inv_freq is held in {name}, which also hides its "
                "type (a yarn or llama3 ramp rounded this way is no ladder diagnose can fit). Compute inv_freq in "
                "float32 and keep it there, then diagnose again to read its type.",
            )
    exact = m[:, None] * ref[None, :]
    err = wrap_angle(lo - exact).abs()
    per_pos = err.amax(-1)
    worst = int(per_pos.argmax())
    dg.phase_error = float(per_pos[worst])
    dg.phase_error_position = worst
    max_angle = float(exact.abs().max())
    dg.phase_allowed = phase_tolerance(dtype, max_angle)
    if dg.phase_error <= dg.phase_allowed:
        return
    # Every 16-bit cause below errs by at most 3u|theta| (positions, inv_freq and their product each
    # rounded once) plus ~sqrt(2)u (cos and sin rounded): within 4u(1 + |theta|) for u = u(bf16), the largest
    # unit roundoff of the formats named. An error past that envelope is no rounding (measured over the
    # zoo's 16-bit rows: at most 0.61 of it; an M-RoPE behind 1D input: 16 to 48 times it).
    envelope = dg.phase_allowed + 4 * UNIT_ROUNDOFF[torch.bfloat16] * (1 + exact.abs())
    # Against a rounded ladder read from the measurement, the roundings past it are what remains.
    base_angles = exact if rounded is None else m[:, None] * w_hat[None, :]
    dg.roundoff_ratio = float((wrap_angle(lo - base_angles).abs() / envelope).max())
    first = int((per_pos > dg.phase_allowed).nonzero()[0])
    best = None
    for where in ("positions", "inv_freq", "angle", "all", "tables"):
        for tag, dt in LOW_PRECISION.items():
            if where == "tables":  # exact angles, cos and sin rounded to dt
                pred = torch.atan2(exact.sin().to(dt).double(), exact.cos().to(dt).double())
            else:
                pred = perturbed_angle(m, ref, where=where, dtype=dt)
            e = float(wrap_angle(lo - pred).abs().max())
            if best is None or e < best[0]:
                best = (e, where, tag, dt)
    if rounded is not None:  # the measured rounded ladder, as is or times positions held in that dtype
        for where, mm in (("inv_freq", m), ("all", m.to(rounded.dtype).double())):
            e = float(wrap_angle(lo - mm[:, None] * w_hat[None, :]).abs().max())
            if e < best[0]:
                best = (e, where, rounded.tag, rounded.dtype)
    explained = dg.phase_allowed + 4 * UNIT_ROUNDOFF[torch.bfloat16]
    if best[0] > explained and rounded is None:  # inv_freq rounded only for 16-bit input, by any route
        best = _rounded_in_dtype(lo, ref, lad, dg, best)
    what = {
        "positions": "positions",
        "inv_freq": "inv_freq",
        "angle": "the angles m * inv_freq",
        "all": "positions, inv_freq and their product",
        "tables": "the cos/sin tables",
    }
    # Tables rounded to 16 bits add up to ~2u(bf16) on top of the named cause; the causes themselves differ
    # by whole steps m*omega, far more than that.
    if best[0] <= explained:
        _, where, tag, dt = best
        dg.phase_cause = f"{where} in {tag}"
        hint = {
            "positions": f"integers above {int(1 / UNIT_ROUNDOFF[dt])} are not all exact in {tag}",
            "inv_freq": f"its relative rounding error, up to 2^{int(math.log2(UNIT_ROUNDOFF[dt])) - 1}, grows into "
            "an angle error of m * inv_freq times that",
            "angle": f"{tag} keeps {int(-math.log2(UNIT_ROUNDOFF[dt]))} bits of m * inv_freq",
            "all": f"{tag} positions are not all exact above {int(1 / UNIT_ROUNDOFF[dt])} and inv_freq is rounded",
            "tables": f"cos and sin rounded to {tag} err by up to {UNIT_ROUNDOFF[dt]:.1e} rad at every position",
        }[where]
        text = (
            f"fn holds {what[where]} in {DTYPE_NAMES[dt]}: phase error {dg.phase_error:.2g} rad at position {worst} "
            f"(first above the allowed {dg.phase_allowed:.1e} rad at position {first}; {hint}). Form positions "
            "and inv_freq in float32 (or float64) and only cast cos/sin to the activation dtype."
        )
    else:
        text = (
            f"the angles drift from m * inv_freq: phase error {dg.phase_error:.2g} rad at position {worst} in "
            f"{DTYPE_NAMES[dtype]} (allowed {dg.phase_allowed:.1e}, first exceeded at position {first}). Form "
            "positions, inv_freq and angles in float32 or float64."
        )
    tables_named = dg.has("precision")  # the structure probe named 16-bit cos/sin tables already
    if best[0] > explained and not tables_named and dg.positions_ok:
        # No 16-bit cause reproduces the error and the tables are not 16-bit: no precision fix is known to
        # be right. _single_axis reports it (positions changing past the short probe, or an M-RoPE behind
        # 1D input whose image starts late: at 2000 text tokens its error is inside 4u(1 + |theta|)).
        dg.phase_cause = UNEXPLAINED
        dg.phase_first = first
        return
    if dg.phase_cause in ("inv_freq in bf16", "inv_freq in fp16", "all in bf16", "all in fp16"):
        if dg.has("inv_freq_precision") and dg.ladder_rounding:  # named with its route already
            if dg.phase_cause.startswith("all"):
                dg.problem("precision", text)
        elif tables_named and not dg.has("inv_freq_precision"):  # drift growing with m: more than the tables
            dg.problem("inv_freq_precision", text)
        elif not tables_named:
            dg.problem("precision", text)
    elif not (tables_named and (dg.phase_cause or "").startswith("tables")):
        dg.problem("precision", text)




def _rounded_ladder(dg: Diagnosis, lad, r: Rounding, when: str) -> None:
    """Name a ladder read as ``lad`` rounded to 16 bits (``r``), replacing the structure probe's guess from the
    size of the deviation alone (inv_freq_precision or scaling)."""
    guesses = ("inv_freq deviates from", "inv_freq resembles")  # _frequencies' texts for a ladder off its match
    keep = [
        (c, p) for c, p in zip(dg.codes, dg.problems)
        if not (c in ("inv_freq_precision", "scaling") and p.startswith(guesses))
    ]
    dg.codes[:] = [c for c, _ in keep]
    dg.problems[:] = [p for _, p in keep]
    dg.ladder_rounding = f"{r.quantity} in {r.tag}"
    name = DTYPE_NAMES[r.dtype]
    route = {
        "inv_freq": f"inv_freq itself is a {name} tensor (cast, a persistent buffer after model.to({name}), or "
        f"computed in {name})",
        "denominator": f"base ** (2i/r) is formed in {name} and inverted afterwards",
        "exponent": f"the exponent arange(0, r, 2) / r is formed in {name} (exact only where r is a power of two)",
    }[r.quantity]
    overflow = ""
    if r.quantity == "denominator" and lad.name == "proportional":  # zero tail where base^(2i/r) overflows
        big = default_inv_freq(dg.head_dim, lad.base).reciprocal() > torch.finfo(r.dtype).max
        if torch.equal(big, lad.inv_freq == 0):
            overflow = (
                f" The pairs read as frequency 0 are exactly those whose base^(2i/r) exceeds {name}'s largest value "
                f"{torch.finfo(r.dtype).max:.6g}: it overflowed to inf, so this is no p-RoPE."
            )
    dg.problem(
        "inv_freq_precision",
        f"inv_freq is the {lad.describe()} ladder (base {lad.base:.6g}) rounded to {name}{when}: "
        f"{r.describe()}. So {route}, and the phase drifts by m times that error at position m.{overflow} Compute "
        "inv_freq in float32 (or float64) from float32 positions and exponents, and keep it there (a "
        "non-persistent buffer that model.to(dtype) leaves alone, or recomputed in forward).",
    )


def _rounded_in_dtype(lo: torch.Tensor, ref: torch.Tensor, lad, dg: Diagnosis, best):
    """The phase call in the check's dtype read as the ladder rounded to 16 bits (a module that forms inv_freq in
    x.dtype): fit its frequencies, read the rounding, and return the match if m * omega_hat reproduces it."""
    w_lo, sig = fit_frequencies(lo)
    r = read_rounding(w_lo, sig, ref, base=lad.base if lad is not None and lad.rope_scaling is None else None)
    if r is None:
        return best
    m = torch.arange(lo.shape[0], dtype=torch.float64)
    e = float(wrap_angle(lo - m[:, None] * w_lo[None, :]).abs().max())
    if e > dg.phase_allowed + 4 * UNIT_ROUNDOFF[torch.bfloat16]:
        return best
    if lad is not None:
        _rounded_ladder(dg, lad, r, f" for {DTYPE_NAMES[dg.dtype]} input")
    return (e, "inv_freq", r.tag, r.dtype)
