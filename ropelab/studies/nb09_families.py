"""Notebook 09's evidence, read from the conformance table (``data/conformance/transformers-<version>.json``):

- :func:`variant_counts`: agreement per (model type, variant), so that "N types agree" does not hide variants
  that were not compared;
- :func:`text_decoders`: the count over the model types transformers registers as causal language models (its
  ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, read from the installed library), and those among them not compared;
- :func:`first_run`: what the first committed sweep found wrong (``data/conformance/first-run-5fa9217.json``,
  written from git history by ``scripts/conformance_first_run.py``), with what changed since;
- :func:`gemma3_v4_layers`: section 3's silent mismatch, a v4 Gemma 3 config read per layer and as one spec for
  all, against transformers' recorded forward.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["VARIANTS", "variant_counts", "text_decoders", "first_run", "gemma3_v4_layers"]

# The config variants the sweep runs per model type (ropelab.conformance.sweep), in its order.
VARIANTS = ("default", "linear", "yarn", "linear (v4 schema)")


def variant_counts(rows: dict, *, among: str = "agree") -> dict[str, dict[str, int]]:
    """Per variant, over the model types whose overall status is ``among``: how many compared and agree,
    disagree, were not covered (the run failed or was refused), or were never run (``"not run"``: the sweep
    builds no such variant for the type, e.g. a scaling its config class does not take)."""
    out: dict[str, dict[str, int]] = {}
    for variant in VARIANTS:
        c = {"agree": 0, "disagree": 0, "not covered": 0, "not run": 0}
        for r in rows.values():
            if r["status"] != among:
                continue
            v = r.get("variants", {}).get(variant)
            c["not run" if v is None else v["status"]] += 1
        out[variant] = c
    return out


def text_decoders(rows: dict) -> dict:
    """The table's model types that transformers registers as causal language models
    (``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``): counts by status and the
    names of those not compared, each with its reason's first line."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = sorted(mt for mt in rows if mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    counts = {k: sum(rows[mt]["status"] == k for mt in names) for k in ("agree", "disagree", "not covered")}
    missing = {mt: rows[mt].get("reason", "").split("\n")[0] for mt in names if rows[mt]["status"] != "agree"}
    return {"types": len(names), "counts": counts, "not_compared": missing}


def first_run(path: str | Path) -> list[dict]:
    """The first committed sweep's disagreements, one row per model type (variants merged): the variants and
    layers that disagreed, the worst error over the bound, and what differs today: the spec keys ``per_layer``
    now reads otherwise, a refusal, or nothing (the spec is unchanged: the sweep's comparison was fixed)."""
    data = json.loads(Path(path).read_text())
    merged: dict[str, dict] = {}
    for d in data["disagreements"]:
        row = merged.setdefault(d["model_type"], {"model_type": d["model_type"], "variants": [], "layers": 0,
                                                  "of_layers": 0, "worst_error_over_bound": 0.0, "changed": set(),
                                                  "status_now": d["status_now"], "reason_now": d["reason_now"]})
        row["variants"].append(d["variant"])
        row["layers"] = max(row["layers"], d["layers_disagreeing"])
        row["of_layers"] = max(row["of_layers"], d["layers"])
        row["worst_error_over_bound"] = max(row["worst_error_over_bound"], d["worst_error_over_bound"])
        then, now = d["spec_then"] or {}, d["spec_now"]
        if now is not None:
            row["changed"] |= {f"{k}: {then.get(k)} -> {now.get(k)}" for k in sorted(set(then) | set(now))
                               if then.get(k) != now.get(k)}
    for row in merged.values():
        row["changed"] = sorted(row["changed"])
    return list(merged.values())


def gemma3_v4_layers(v4: dict, *, torch_threads: int = 1) -> dict:
    """A tiny Gemma 3 (its own config class) with the v4 keys ``v4`` at the top of its dict, as an older
    ``config.json`` holds them; transformers' forward is recorded per layer and each layer's rotated q and k
    compared with ``apply_rope`` under (a) ``RopeSpec.per_layer`` of the dict and (b) one spec for every layer
    built from the top-level keys (the naive port). Returns per layer its type and both comparisons
    (``max_error``, ``error_over_bound``: the error in units of the float32 bound), the largest absolute element of q,
    and how far the naive sliding-layer frequencies are off (relative)."""
    import torch
    from transformers import CONFIG_MAPPING
    from transformers.models.gemma3 import modeling_gemma3

    import ropelab
    from ropelab.conformance.sweep import compare_call, run_transformers, tiny_kwargs

    torch.set_num_threads(torch_threads)
    cls = CONFIG_MAPPING["gemma3_text"]
    config = cls(**tiny_kwargs(cls), **v4)
    as_read = {**{k: v for k, v in config.to_dict().items() if k != "rope_parameters"}, **v4}
    run = run_transformers(config, modeling_gemma3)
    right = ropelab.RopeSpec.per_layer(as_read)
    scaling = v4.get("rope_scaling")
    naive = ropelab.RopeSpec.from_keywords(config.head_dim, base=v4["rope_theta"], rope_scaling=scaling)
    layers = []
    for i, kind in enumerate(config.layer_types):
        call = next(c for c in run["calls"] if c["layer"] == i)
        layers.append({"layer": i, "type": kind, "per_layer": compare_call(call, run["positions"], right[i]),
                       "one_spec": compare_call(call, run["positions"], naive)})
    q = next(c for c in run["calls"] if c["layer"] == 0)["args"][0]
    w_right, w_naive = right[0].frequencies(config.head_dim)[0], naive.frequencies(config.head_dim)[0]
    return {"layers": layers, "max_abs_q": float(q.abs().max()),
            "sliding_freq_off": float(((w_naive - w_right).abs() / w_right).max())}
