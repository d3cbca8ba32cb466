"""``compare``: two implementations on the same input, and every difference explained in words."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..core import AXIS_NAMES, STYLES, Layout
from ..precision import phase_tolerance
from .ladder import LADDER_RTOL
from .measure import check_args, diagnose
from .probes import STRUCT_TOL, as_torch_fn, call, one_thread, probe_sizes
from .report import Comparison, Diagnosis

__all__ = ["compare"]


def _pair_words(dg: Diagnosis) -> str:
    if dg.style == "half" and dg.rotary_dim:
        return f"pairs (i, i+{dg.rotary_dim // 2})"
    if dg.style == "interleaved":
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
    """Run ``fn_a`` and ``fn_b`` (torch functions, or MLX ones: detected as ``diagnose`` does) on the same random
    input (in ``dtype``, the probe sizes with positions 0 .. ``max_position`` along the sequence) and explain each
    difference.

    Both are diagnosed (same sizes and arguments as ``diagnose``); every field where they differ becomes a
    sentence: the axis they rotate along, the pairing (with the ropelab.convert function that maps one onto
    the other), rotary_dim, base and scaling, direction, norm scale, varlen restarts, precision.

    Args:
        fn_a: one implementation, called as :func:`diagnose` calls it (``fn(x)``, or ``fn(x, cu_seqlens)`` for a
            ``t`` layout).
        fn_b: the other, on the same input.
        layout: einops-style axes of the tensor both take (``"b s h d"``, ``"t h d"``, ...).
        sizes: axis sizes the functions need (``{"h": 20, "d": 64}``); the checker picks the rest.
        dtype: the input's dtype.
        max_position: the last position of the shared input and of the phase check.
        names: how the sentences name the two functions.

    Returns a :class:`Comparison`: both diagnoses, the largest output difference and the sentences.
    """
    fn_a, fn_b = as_torch_fn(fn_a, None), as_torch_fn(fn_b, None)  # an MLX function converts at the boundary
    lay = check_args(fn_a, layout, dtype, max_position, None)
    check_args(fn_b, layout, dtype, max_position, None)
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
    with one_thread():
        ya = call(fn_a, x.clone(), lay, cu)  # clones: an in-place fn must not change the other's input
        yb = call(fn_b, x.clone(), lay, cu)
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
    if A.output_permutation != B.output_permutation:
        for D, nm in ((A, names[0]), (B, names[1])):
            if D.output_permutation is not None:
                perm = D.output_permutation
                moved = [k for k in range(len(perm)) if perm[k] != k]
                out.append(
                    f"{nm} permutes its output dims: output dim k holds input dim perm[k] (perm[{moved[0]}.."
                    f"{moved[-1]}] = {[perm[k] for k in moved][:8]}{' ...' if len(moved) > 8 else ''}), as "
                    "DeepSeek's rope_interleave does. Scores q.k agree when q and k both pass through it; to compare "
                    f"outputs dim by dim, read {nm}'s output at torch.argsort(perm)."
                )
    if A.style in STYLES and B.style in STYLES and A.style != B.style:
        conv = "interleaved_to_half" if A.style == "half" else "half_to_interleaved"
        out.append(
            f"{names[0]} {_pair_words(A)}, {names[1]} {_pair_words(B)}: convert with ropelab.convert.{conv} "
            f"(vectors) or ropelab.convert.permute_qk_weight (q/k weights)."
        )
    elif A.style == "other" or B.style == "other":
        if A.pairs != B.pairs:
            out.append(f"{names[0]} {_pair_words(A)}, {names[1]} {_pair_words(B)}.")
    if A.rotary_dim and B.rotary_dim and A.rotary_dim != B.rotary_dim:
        out.append(f"{names[0]} rotates {A.rotary_dim} head dims, {names[1]} {B.rotary_dim}.")
    if A.base and B.base and abs(A.base / B.base - 1) > 1e-3:
        out.append(f"{names[0]} uses base {A.base:.6g}, {names[1]} base {B.base:.6g}.")
    if A.scaling and B.scaling and A.scaling != B.scaling and (A.base and B.base and abs(A.base / B.base - 1) <= 1e-3):
        out.append(f"{names[0]} uses the {A.scaling} frequency ladder, {names[1]} {B.scaling}.")
    out += _unrecognised_ladders(A, B, names)
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


def _unrecognised_ladders(A: Diagnosis, B: Diagnosis, names) -> list[str]:
    r"""The ladder difference measured directly where a side's ladder is "unrecognised" (no base or scaling to
    name): the per-pair ratio :math:`\omega^A_i / \omega^B_i` of the measured frequencies, and the pairs where it
    leaves 1 by more than ``LADDER_RTOL`` (each measured ladder is known to ~2**-20 relative in float32 probes,
    ``ladder.py``). Two recognised ladders are named by the base and scaling sentences instead."""
    if not any((D.scaling or "").startswith("unrecognised") for D in (A, B)):
        return []
    if A.inv_freq is None or B.inv_freq is None or A.inv_freq.shape != B.inv_freq.shape:
        return []  # a different rotary_dim or pairing is said on its own
    wa, wb = A.inv_freq.double(), B.inv_freq.double()
    both = (wa > 0) & (wb > 0)
    if bool(((wa > 0) != (wb > 0)).any()):
        zero = [i for i in range(wa.numel()) if bool((wa[i] > 0) != (wb[i] > 0))]
        return [f"{names[0]} and {names[1]} leave different pairs unrotated (zero frequency): pairs {zero[:8]}."]
    ratio = torch.where(both, wa / wb.where(both, torch.ones_like(wb)), torch.ones_like(wa))
    off = [i for i in range(ratio.numel()) if abs(float(ratio[i]) - 1) > LADDER_RTOL]
    if not off:
        return []
    which = " and ".join(nm for D, nm in ((A, names[0]), (B, names[1])) if (D.scaling or "").startswith("unrec"))
    shown = ", ".join(f"{v:.4g}" for v in ratio.tolist()[:6]) + (", ..." if ratio.numel() > 6 else "")
    return [
        f"the frequency ladders differ ({which}: no known ladder, so no base or scaling to compare): per pair "
        f"inv_freq {names[0]} / {names[1]} = [{shown}] (from {float(ratio.min()):.4g} to {float(ratio.max()):.4g}), "
        f"{len(off)} of {ratio.numel()} pairs differ by more than {LADDER_RTOL:.1e} relative (first pair {off[0]})."
    ]

