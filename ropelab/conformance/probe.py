r"""``ropelab.diagnose`` on transformers' real rotary, as a black box, against the spec ``per_layer`` gives."""

from __future__ import annotations

import torch

from .running import error_text, layout_of, rotated_pairs

__all__ = ["diagnose_probe"]


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


def diagnose_probe(run, specs, layers, sliced: bool, head_dim: int) -> dict:
    """``ropelab.diagnose`` on transformers' real rotary of the first layer of each distinct spec, as a black box,
    and whether its reading matches the spec: style, base, rotary_dim, scaling type."""
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
        r = d if sliced else (spec.rotary_dim or head_dim)
        want = {"style": spec.style, "base": spec.base, "rotary_dim": r, "scaling": spec.rope_type}
        try:
            dg = diagnose(fn, layout=layout, sizes={"d": d}, dtype=torch.float32,
                          max_position=min(4096, spec.max_position_embeddings or 4096))
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
        probes.append({"layer": i, "status": "match" if all(match.values()) else "mismatch", "spec": want,
                       "diagnose": got, "fields": match, "problems": list(dg.codes)})
    return {"probes": probes}
