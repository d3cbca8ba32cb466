r"""``ropelab.diagnose`` on transformers' real rotary, as a black box, against the spec ``per_layer`` gives.

What is compared: the style, the base (to 1e-3), the rotary dim and the scaling type, as read; then the scaling's
parameters (factor, the low/high frequency factors, beta_fast/beta_slow, the attention factor, the original
context, mscale, truncate, ...). A black box shows its parameters only through its outputs, and some differ
without a trace there: yarn's correction dims are whole numbers, so every ``original_max_position_embeddings`` in a
range gives the same ladder, and only :math:`L_0/\beta` is fixed at all (``ropelab.diagnosis.ladder``). So the
parameters are compared by what they do (:func:`parameter_comparison`): the spec and the reading, each applied to
the same input at positions 0 .. M (M the probe's longest position), differ by at most ``output_difference_over_bound``
times the sweep's own float32 rounding bound (``compare.bound``). At or below 1 a float32 implementation cannot tell
the two apart, and a reading whose values differ is *undecidable*, not wrong; above 1 it is a mismatch. The factor and
the attention factor are compared as values too: the attention factor (the norm scale, always decidable) to the bound at
position 0 (``12 u`` relative, u = 2^-24); the factor to the ladder's match tolerance ``LADDER_RTOL``, unless the
outputs cannot tell (a yarn ramp that runs past the last pair leaves no fully scaled pair to read s from, and a
smaller s on a shorter ramp gives a ladder within float32 rounding of it).
"""

from __future__ import annotations

import math

import torch

from ..rope import apply_rope
from ..spec import RopeSpec
from .compare import U32, bound
from .running import error_text, layout_of, rotated_pairs

__all__ = ["diagnose_probe", "parameter_comparison"]

_TYPE_KEYS = ("rope_type", "type")


def _black_box(call, rotary_call, layout: str):
    """``x -> rotated x`` from transformers' own pieces: the rotary module (called with positions 0 .. s-1, in
    x's dtype) and the rotation function, at the recorded call's other arguments."""
    module, r_args, r_kwargs, r_out, _ = rotary_call
    outs = list(r_out) if isinstance(r_out, (tuple, list)) else [r_out]
    where = {i: k for i, a in enumerate(call["args"]) for k, o in enumerate(outs) if a is o}
    n_rot = len(rotated_pairs(call))
    tensor_args = [i for i, a in enumerate(call["args"]) if isinstance(a, torch.Tensor)][:n_rot]
    s_axis = layout.split().index("s")

    def fn(x):
        pos = torch.arange(x.shape[s_axis])[None]
        args = list(r_args)
        args[0] = x
        kw = dict(r_kwargs)
        if len(args) > 1:
            args[1] = pos
        else:
            kw["position_ids"] = pos
        new = module(*args, **kw)
        new = list(new) if isinstance(new, (tuple, list)) else [new]
        call_args = list(call["args"])
        for i in tensor_args:
            call_args[i] = x
        for i, k in where.items():
            call_args[i] = new[k]
        out = call["fn"](*call_args, **call["kwargs"])
        return out[0] if isinstance(out, (tuple, list)) else out

    return fn, bool(where)


def _params(scaling) -> dict:
    return {k: v for k, v in (scaling or {}).items() if k not in _TYPE_KEYS}


def parameter_comparison(spec: RopeSpec, read: RopeSpec | None, d: int, max_position: int) -> dict:
    r"""The scaling parameters of ``spec`` against those ``diagnose`` read (``read``), on a head of ``d`` dims.

    A dict:

    - ``spec``, ``diagnose``: each dict without its type (an ``original_max_position_embeddings`` taken from
      ``max_position_embeddings`` is shown as a key);
    - ``differ``: the keys whose values differ, or that one side sets and the other leaves unset;
      ``unset_as_default``: keys of the second kind whose removal changes nothing on their side (frequencies and
      attention factor equal in float64: an explicit default), left out of ``differ``;
    - ``positions`` (M) and ``output_difference_over_bound``: the largest :math:`|y_{spec} - y_{read}|` over every
      element at positions 0 .. M, in units of ``compare.bound`` for a float32 input (the input is all ones; a
      pair's difference and its bound both scale with the pair's norm, so any input gives the same ratio);
    - ``factor``, ``attention_factor``: [spec's, read's], with ``factor_ok`` and ``attention_factor_ok``;
    - ``verdict``: "same" (no key differs), "undecidable" (keys differ, the outputs within the bound) or
      "differ"."""
    sp, rp = _params(spec.scaling), _params(None if read is None else read.scaling)
    for p, s in ((sp, spec), (rp, read)):
        if s is not None and s.max_position_embeddings and "original_max_position_embeddings" in {**sp, **rp}:
            p.setdefault("original_max_position_embeddings", s.max_position_embeddings)
    one_side = sorted(k for k in {**sp, **rp} if (k in sp) != (k in rp))
    unset = [k for k in one_side if _unsetting_is_no_change(spec if k in sp else read, k, d)]
    differ = sorted(k for k in {**sp, **rp} if k not in unset and (k in one_side or not _same(sp[k], rp[k])))
    af = spec.frequencies(d)[1]
    out = {"spec": sp, "diagnose": rp, "differ": differ, "unset_as_default": unset, "positions": max_position,
           "factor": [sp.get("factor"), rp.get("factor")], "attention_factor": [af, None]}
    if read is None:
        return {**out, "output_difference_over_bound": None, "factor_ok": False, "attention_factor_ok": False,
                "verdict": "differ"}
    af_read = read.frequencies(d)[1]
    out["attention_factor"][1] = af_read
    x = torch.ones(1, max_position + 1, 1, d, dtype=torch.float32)
    pos = torch.arange(max_position + 1)
    ys = [apply_rope(x.double(), pos, layout="b s h d", spec=s) for s in (spec, read)]
    tol = bound(x, "b s h d", pos.tolist(), spec)
    ratio = float(((ys[0] - ys[1]).abs() / tol).max())
    from ..diagnosis.ladder import LADDER_RTOL

    f0, f1 = out["factor"]
    factor_ok = f0 == f1 or (f0 is not None and f1 is not None and abs(f1 / f0 - 1) <= LADDER_RTOL) or ratio <= 1
    return {**out, "output_difference_over_bound": ratio, "factor_ok": factor_ok,
            "attention_factor_ok": abs(af_read - af) <= 12 * U32 * abs(af),
            "verdict": "same" if not differ else "undecidable" if ratio <= 1 else "differ"}


def _unsetting_is_no_change(spec: RopeSpec | None, key: str, d: int) -> bool:
    """Whether ``spec`` without ``key`` in its scaling has the same frequencies and attention factor (float64,
    exactly): the key is set to what leaving it unset gives (its default, at least here)."""
    if spec is None or key not in (spec.scaling or {}):
        return False
    try:
        alt = RopeSpec(spec.style, spec.base, spec.rotary_dim, {k: v for k, v in spec.scaling.items() if k != key},
                       spec.max_position_embeddings)
        (w0, a0), (w1, a1) = spec.frequencies(d), alt.frequencies(d)
    except ValueError:
        return False
    return bool(torch.equal(w0, w1)) and a0 == a1


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def diagnose_probe(run, specs, layers, sliced: bool, head_dim: int) -> dict:
    """``ropelab.diagnose`` on transformers' real rotary of the first layer of each distinct spec, as a black box,
    and whether its reading matches the spec: style, base, rotary_dim, scaling type, and the scaling's parameters
    (factor, attention factor, and all of them by their effect on the outputs: :func:`parameter_comparison`)."""
    from ..diagnosis import diagnose

    probes = []
    seen = set()
    for entry in layers:
        i = entry["layer"]
        spec = specs[i]
        if entry["status"] != "agree" or spec.is_nope or spec in seen:
            continue
        seen.add(spec)
        call = next(c for c in run["calls"] if c["layer"] == i)
        x = rotated_pairs(call)[0][0]
        layout = layout_of(tuple(x.shape), len(run["positions"]))
        rotary = [r for r in run["rotary"] if any(a is o for a in call["args"]
                                                  for o in (r[3] if isinstance(r[3], (tuple, list)) else [r[3]]))]
        if not rotary:
            probes.append({"layer": i, "status": "not probed", "reason": "the rotation's cos/sin are not a rotary "
                           "module's outputs as they are (reshaped or sliced on the way)"})
            continue
        fn, _ = _black_box(call, rotary[0], layout)
        d = x.shape[-1]
        # The layer's own head: Gemma 4's full-attention layers are wider (global_head_dim 512) than the config's
        # head_dim (256, the sliding layers'), and a spec without rotary_dim rotates the whole input it is given.
        r = d if sliced else (spec.rotary_dim or d)
        want = {"style": spec.style, "base": spec.base, "rotary_dim": r, "scaling": spec.rope_type}
        max_position = min(4096, spec.max_position_embeddings or 4096)
        try:
            dg = diagnose(fn, layout=layout, sizes={"d": d}, dtype=torch.float32, max_position=max_position)
        except Exception as e:  # noqa: BLE001
            probes.append({"layer": i, "status": "not probed", "reason": f"diagnose raised {error_text(e)}"})
            continue
        unrecognised = (dg.scaling or "").startswith("unrecognised")
        got = {"style": dg.style, "base": dg.base, "rotary_dim": dg.rotary_dim,
               "scaling": None if unrecognised or dg.scaling is None else
               (dg.rope_scaling or {}).get("rope_type", (dg.rope_scaling or {}).get("type", "default"))}
        match = {"style": got["style"] == want["style"],
                 "base": got["base"] is not None and abs(got["base"] / want["base"] - 1) < 1e-3,
                 "rotary_dim": got["rotary_dim"] == want["rotary_dim"],
                 "scaling": got["scaling"] == want["scaling"]}
        params = parameter_comparison(_on_probe(spec, sliced), _reading(dg, spec, d), d, max_position)
        match.update({"factor": params["factor_ok"], "attention_factor": params["attention_factor_ok"],
                      "parameters": params["verdict"] != "differ"})
        probes.append({"layer": i, "status": "match" if all(match.values()) else "mismatch", "spec": want,
                       "diagnose": got, "fields": match, "parameters": params, "problems": list(dg.codes)})
    return {"probes": probes}


def _on_probe(spec: RopeSpec, sliced: bool) -> RopeSpec:
    """The spec on the probe's input: where the attention hands the rotation only its slice, the whole input."""
    return RopeSpec(spec.style, spec.base, None, spec.scaling, spec.max_position_embeddings) if sliced else spec


def _reading(dg, spec: RopeSpec, d: int) -> RopeSpec | None:
    """diagnose's reading as a spec on the probe's input (None where it read no base, or its reading is no valid
    spec); the trained context it cannot see is the spec's."""
    if dg.base is None or dg.style not in ("half", "interleaved"):
        return None
    try:
        return RopeSpec(dg.style, dg.base, None if dg.rotary_dim in (None, d) else dg.rotary_dim, dg.rope_scaling,
                        spec.max_position_embeddings)
    except ValueError:
        return None
