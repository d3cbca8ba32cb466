"""Notebook 09's evidence, read from the conformance table (``data/conformance/transformers-<version>.json``):

- :func:`variant_counts`: agreement per (model type, variant), so that "N types agree" does not hide variants
  that were not compared, and :func:`default_only`: why a type has no scaling variant at all;
- :func:`disagreements`: every (model type, variant) that disagrees, with its layers and error, so that a rerun
  that finds one prints it instead of stopping;
- :func:`composites` and :func:`no_rope`: the composite configs and what became of them, and the model types the
  discovery rule found whose model ran no rotation at all on its config (nothing to compare);
- :func:`convention_classes`: the conventions a config leaves unsaid, by class, and which types go beyond the
  textbook rotation (a config key the code ignores is counted apart: such a type rotates the textbook way);
- :func:`text_decoders`: the count over the model types transformers registers as causal language models (its
  ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, read from the installed library), and those among them not compared;
- :func:`not_covered`: why the others were not compared, in classes whose names claim only what the rows show
  (a composite config counts as covered through a sub-config only where that sub-config's model type was compared);
- :func:`probe_summary`: what ``diagnose`` read from each real rotary, the scaling parameters included, and where
  a parameter it read differs from the spec's without a trace in float32 outputs (undecidable, with the bound);
- :func:`first_run`: what the first committed sweep found wrong (``data/conformance/first-run-5fa9217.json``,
  written from git history by ``scripts/conformance_first_run.py``), with what changed since;
- :func:`gemma3_v4_layers`: section 3's silent mismatch, a v4 Gemma 3 config read per layer and as one spec for
  all, against transformers' recorded forward;
- :func:`rotating_layers`: which layers of a tiny model call a rotation function in transformers' own forward (the
  check of exercise 1).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["VARIANTS", "COMPOSITE_COMPARED", "CONVENTION_CLASSES", "PAIRING", "IGNORED_KEYS", "variant_names",
           "variant_counts", "default_only", "disagreements", "composites", "no_rope", "convention_classes",
           "text_decoders", "not_covered", "probe_summary", "short_value", "unscaled_head", "first_run",
           "gemma3_v4_layers", "rotating_layers"]

# The config variants the sweep runs for most model types (``ropelab.conformance.discovery.variants``), in its
# order; a class that takes no linear or yarn scaling gets ``longrope`` ones instead. ``variant_names`` reads them
# from the table, so a variant the sweep adds is counted too.
VARIANTS = ("default", "linear", "yarn", "linear (v4 schema)")


def variant_names(rows: dict) -> list[str]:
    """Every variant name in the table: ``VARIANTS`` first, in their order, then any other in the order met."""
    seen = [v for r in rows.values() for v in r.get("variants", {})]
    return [v for v in VARIANTS if v in seen] + list(dict.fromkeys(v for v in seen if v not in VARIANTS))


def variant_counts(rows: dict, *, among: str = "agree") -> dict[str, dict[str, int]]:
    """Per variant (:func:`variant_names`), over the model types whose overall status is ``among``: how many
    compared and agree, disagree, were not covered (the run failed or was refused), or were never run (``"not
    run"``: the sweep builds no such variant for the type; :func:`default_only` says why where none is built)."""
    out: dict[str, dict[str, int]] = {}
    for variant in variant_names(rows):
        c = {"agree": 0, "disagree": 0, "not covered": 0, "not run": 0}
        for r in rows.values():
            if r["status"] != among:
                continue
            v = r.get("variants", {}).get(variant)
            c["not run" if v is None else v["status"]] += 1
        out[variant] = c
    return out


def _default_rope_parameters(model_type: str, row: dict):
    """The ``rope_parameters`` of the config class's default instance (of its text sub-config for a composite
    run whole), or None."""
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # default instances warn about token ids; not what is read here
    try:
        config = CONFIG_MAPPING[model_type]()
        key = row.get("text_config_key")
        if key and getattr(config, "rope_parameters", None) is None:
            config = getattr(config, key, None)
        return getattr(config, "rope_parameters", None)
    except Exception:  # noqa: BLE001 - the reason then says it could not be read
        return None
    finally:
        hf_logging.set_verbosity(level)


def default_only(rows: dict, *, among: str = "agree") -> dict[str, list[str]]:
    """The model types (of status ``among``) with no variant but the default, by why, read from the config class's
    default ``rope_parameters``: already scaled (its ``rope_type``, a scaling variant would replace it), no
    ``rope_parameters`` (the RoPE keys are v4-style or the model's own), or no rope dict the sweep scales."""
    from ..conformance.discovery import main_rope_dict as _main_rope_dict

    out: dict[str, list[str]] = {}
    for mt, r in sorted(rows.items()):
        if r["status"] != among or set(r.get("variants", {})) != {"default"}:
            continue
        params = _default_rope_parameters(mt, r)
        if not isinstance(params, dict) or not params:
            why = "no rope_parameters on its default config"
        else:
            main = _main_rope_dict(params)[0]  # the dict the sweep would scale: its own rule
            kind = (main or {}).get("rope_type", "default") if isinstance(main, dict) else None
            why = (f"its default config is already scaled ({kind})" if kind not in (None, "default") else
                   "its rope_parameters hold no single rope dict to scale")
        out.setdefault(why, []).append(mt)
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))


def disagreements(rows: dict) -> list[dict]:
    """Every (model type, variant) that disagrees: its layers that disagree and the largest error, in units of the
    float32 bound. Empty when nothing disagrees; a rerun that finds one lists it here."""
    out = []
    for mt, r in sorted(rows.items()):
        for vname, v in r.get("variants", {}).items():
            if v["status"] == "disagree":
                bad = [lay for lay in v.get("layers", []) if lay["status"] == "disagree"]
                out.append({"model_type": mt, "variant": vname, "layers": [lay["layer"] for lay in bad],
                            "of_layers": len(v.get("layers", [])),
                            "worst_error_over_bound": max((lay.get("error_over_bound", 0.0) for lay in bad),
                                                          default=float("nan"))})
    return out


def composites(rows: dict) -> dict:
    """The composite configs the sweep ran whole (rows with ``sub_config_types``): those that agree, and of those
    not compared, the ones whose text (or other) sub-config's model type was compared on its own."""
    comp = sorted((mt for mt, r in rows.items() if "sub_config_types" in r), key=str.lower)
    agree = [mt for mt in comp if rows[mt]["status"] == "agree"]
    rest = [mt for mt in comp if rows[mt]["status"] != "agree"]
    via = [mt for mt in rest if any(rows.get(t, {}).get("status") == "agree"
                                    for t in (rows[mt]["sub_config_types"] or {}).values())]
    return {"types": comp, "agree": agree, "not_compared": rest, "sub_config_compared": via}


# Phrases of a not-covered reason that say the model rotates nothing: no rotary module ran and no rotation function
# was called on the config (the sweep tried the model's own switch first), or its modeling module has none at all.
_NO_ROPE = ("applies no RoPE on this config", "no rotary class, no rotation function and no cos/sin")


def no_rope(rows: dict) -> list[str]:
    """The model types the discovery rule found (a rotary class or rotation function in the source, or RoPE keys
    in the config) whose model ran no rotation on the config the sweep built (no rotary module ran, no rotation
    function was called, after the model's own RoPE switch was tried), or whose modeling module has none: not
    compared because there was nothing to compare."""
    return sorted(mt for mt, r in rows.items()
                  if r["status"] == "not covered" and any(p in r.get("reason", "") for p in _NO_ROPE))


# The conventions a config leaves unsaid, as measured into each model type's convention entry
# (``ropelab.conformance.convention``): a class name and the test of an entry. ``PAIRING`` splits the types (each has
# exactly one style); the others are properties a type may have several of. ``IGNORED_KEYS`` is apart: a type whose
# config class declares a key its code never reads (Llama's ``partial_rotary_factor``) still rotates the textbook way;
# the trap is for a port that honours the key.
PAIRING = ("interleaved pairs (2i, 2i+1)", "half pairs (i, i+r/2)")
IGNORED_KEYS = "config keys the code ignores"
CONVENTION_CLASSES = {
    PAIRING[0]: lambda c: c["style"] == "interleaved",
    PAIRING[1]: lambda c: c["style"] == "half",
    "partial rotary slice (r < head dim)": lambda c: c.get("rotary_fraction", 1.0) < 1,
    "NoPE layer types": lambda c: bool(c.get("nope_layer_types")),
    "per-layer-type v4 rules": lambda c: "scaled_layer_types" in c.get("v4", {}),
    "output permutation": lambda c: "output_permutation" in c,
    "base fixed in the code": lambda c: "fixed_base" in c,
    IGNORED_KEYS: lambda c: "ignored_keys" in c or "ignored_keys" in c.get("v4", {}),
}


def convention_classes(rows: dict, conventions: dict) -> dict:
    """The agreeing model types with a convention entry of their own (``covered``; a composite reads its text
    model type's) by class (``classes``: name -> sorted types), and two sets that do not overlap:
    ``beyond_textbook``, the types with a convention other than half pairs on every dim of every layer at the
    config's base (interleaved, or any class but ``IGNORED_KEYS``), and ``only_ignored_keys``, the textbook types
    whose config class declares keys the code ignores; ``ignored_keys`` counts those keys over all covered types."""
    covered = sorted(mt for mt, r in rows.items() if r["status"] == "agree" and mt in conventions)
    classes = {name: [mt for mt in covered if test(conventions[mt])] for name, test in CONVENTION_CLASSES.items()}
    beyond = sorted({mt for name, mts in classes.items() if name not in (PAIRING[1], IGNORED_KEYS) for mt in mts})
    only_ignored = sorted(set(classes[IGNORED_KEYS]) - set(beyond))
    keys: dict[str, int] = {}
    for mt in covered:
        c = conventions[mt]
        for k in sorted(set(c.get("ignored_keys", ())) | set(c.get("v4", {}).get("ignored_keys", ()))):
            keys[k] = keys.get(k, 0) + 1
    return {"covered": covered, "classes": classes, "beyond_textbook": beyond, "only_ignored_keys": only_ignored,
            "ignored_keys": dict(sorted(keys.items(), key=lambda kv: -kv[1]))}


def text_decoders(rows: dict) -> dict:
    """The table's model types that transformers registers as causal language models
    (``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``): counts by status and the
    names of those not compared, each with its reason's first line."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = sorted(mt for mt in rows if mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    counts = {k: sum(rows[mt]["status"] == k for mt in names) for k in ("agree", "disagree", "not covered")}
    missing = {mt: rows[mt].get("reason", "").split("\n")[0] for mt in names if rows[mt]["status"] != "agree"}
    return {"types": len(names), "counts": counts, "not_compared": missing,
            "no_rope": [mt for mt in no_rope(rows) if mt in names]}


COMPOSITE_COMPARED = "composite config: RoPE compared through a sub-config's model type"

# Reasons whose class in the table (``conformance.report.REASON_CLASSES``) claims more than the row shows: (a phrase
# of the row's reason, what it does show). First match wins; any other row keeps the table's class.
_PLAINER = (
    ("but it was not found in your environment", "transformers' model needs a package not installed here (named in "
     "the reason)"),
    ("No module named 'transformers.models.", "no modeling module in the model type's own folder (the sweep looked "
     "only there)"),
    ("no module-level rotation function", "no module-level rotation function in the modeling module (the rotation "
     "is inlined in the attention)"),
    ("made no call to a rotation function", "the forward made no call to a module-level rotation function (inlined, "
     "or no RoPE on this config)"),
    ("cannot run on tokens", "transformers' model raised on the sweep's tiny config (its own failure, the shrinking's "
     "or the recorder's: not told apart)"),
)
_ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")


def _sub_config_types(model_type: str, row: dict) -> dict:
    """{sub-config key: model type}: the row's own record where the sweep wrote one (``sub_config_types``), else
    read from the config class's default instance (an AutoConfig sub-config has its model type only there)."""
    if "sub_config_types" in row:
        return row["sub_config_types"]
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging as hf_logging

    cls = CONFIG_MAPPING[model_type]
    subs = getattr(cls, "sub_configs", None) or {}
    if all(getattr(c, "model_type", None) for c in subs.values()):  # each a config class of one model type
        return {k: c.model_type for k, c in subs.items()}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # default instances warn about token ids; not what is read here
    try:
        inst = cls()
    except Exception:  # noqa: BLE001 - the class's own sub-config classes then
        inst = None
    finally:
        hf_logging.set_verbosity(level)
    return {k: getattr(getattr(inst, k, None), "model_type", None) or getattr(c, "model_type", None) or None
            for k, c in subs.items()}


def _own_rope_keys(model_type: str) -> list[str]:
    """The RoPE keys a config class takes itself (its ``__init__`` parameters and annotations)."""
    import inspect

    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    names = set(inspect.signature(cls.__init__).parameters) | set(getattr(cls, "__annotations__", {}))
    return sorted(names & set(_ROPE_KEYS))


def not_covered(rows: dict) -> dict:
    """The rows not compared, by class: {class: [model types]}, largest first. A composite config (a config class
    with sub-configs) is put in one of three classes by its sub-configs' model types, followed through nested
    composites: one of them was compared; they are rows of the table but none was compared; none is a row.
    ``own_rope_keys``: the composites whose config class takes RoPE keys itself, never compared. Other rows keep
    the table's class (``reason_class``) unless it claims more than the reason shows (``_PLAINER``)."""
    from ..conformance.report import reason_class

    def is_composite(mt):
        return rows.get(mt, {}).get("status") == "not covered" and "composite config" in rows[mt].get("reason", "")

    def reach(mt, seen):
        out = []
        for t in _sub_config_types(mt, rows[mt]).values():
            if t and t not in seen:
                seen.add(t)
                out += [t] + (reach(t, seen) if is_composite(t) else [])
        return out

    overstated = {reason_class(r) for r in ("cannot run on tokens", "does not import", "made no call to a rotation "
                                           "function")} - {reason_class("")}
    classes: dict[str, list[str]] = {}
    own = {}
    for mt, r in sorted(rows.items()):
        if r["status"] != "not covered":
            continue
        if is_composite(mt):
            subs = reach(mt, {mt})
            compared = [t for t in subs if rows.get(t, {}).get("status") == "agree"]
            key = (COMPOSITE_COMPARED if compared else
                   "composite config: its sub-configs' model types were not compared either" if
                   any(t in rows for t in subs) else "composite config: no sub-config is a model type of the table")
            if _own_rope_keys(mt):
                own[mt] = _own_rope_keys(mt)
        else:
            key = reason_class(r["reason"])
            if key in overstated:
                key = next((c for phrase, c in _PLAINER if phrase in r["reason"]), key)
        classes.setdefault(key, []).append(mt)
    return {"classes": dict(sorted(classes.items(), key=lambda kv: -len(kv[1]))), "own_rope_keys": own}


def unscaled_head(spec: dict, rotary_dim: int) -> int:
    """How many leading pairs of a recorded spec's ladder (``{"base", "scaling"}``) no scaling touches: per-pair
    factor 1 within ``diagnosis.ladder.RHO_TOL``."""
    import torch

    from ..diagnosis.ladder import RHO_TOL
    from ..scaling import default_inv_freq, frequencies

    inv, _ = frequencies(rotary_dim, spec["base"], rope_scaling=spec["scaling"],
                         max_position_embeddings=spec.get("max_position_embeddings"))
    rho = inv.double() / default_inv_freq(rotary_dim, spec["base"])
    return int(torch.cumprod(((rho - 1).abs() <= RHO_TOL).int(), 0).sum())


def probe_summary(rows: dict) -> dict:
    """Every diagnose probe of the table (``rows[*].variants[*].diagnose.probes``) in one list of dicts: model type,
    variant, layer, status, the fields that differ, the spec's scaling (``spec``), its unscaled leading pairs
    (``head``, scaled ladders only) and, where the table records it (a sweep since the parameter comparison),
    the parameter ``verdict`` ("same", "undecidable", "differ"), the keys that differ and the output difference in
    units of the float32 bound; ``read_spec``, what diagnose read (style, base, rotary dim, scaling type), and
    ``problems``, the codes of what it found but attributes to no spec field. ``probes`` and ``by_type``
    ({model type: "match" / "mismatch: fields"})."""
    probes = []
    for mt, r in sorted(rows.items()):
        for vname, v in r.get("variants", {}).items():
            for p in (v.get("diagnose") or {}).get("probes", []):
                if p["status"] == "not probed":
                    continue
                spec = next(x["spec"] for x in v["layers"] if x["layer"] == p["layer"])
                par = p.get("parameters") or {}
                probes.append({
                    "model_type": mt, "variant": vname, "layer": p["layer"], "status": p["status"],
                    "wrong": sorted(f for f, ok in p["fields"].items() if not ok), "spec": spec,
                    "rotary_dim": p["spec"]["rotary_dim"],
                    "head": unscaled_head(spec, p["spec"]["rotary_dim"]) if spec.get("scaling") else None,
                    "verdict": par.get("verdict"), "differ": par.get("differ", []), "spec_params": par.get("spec"),
                    "read": par.get("diagnose"), "over_bound": par.get("output_difference_over_bound"),
                    "positions": par.get("positions"), "read_spec": p.get("diagnose"),
                    "problems": p.get("problems", [])})
    return {"probes": probes, "by_type": {mt: r["diagnose"] for mt, r in sorted(rows.items()) if "diagnose" in r}}


def short_value(v, n: int = 3) -> str:
    """A parameter value for print: a long list as its first ``n`` items and its length (LongRoPE's per-pair
    factors), anything else as it is."""
    if isinstance(v, (list, tuple)) and len(v) > n:
        return "[" + ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v[:n]) + f", ... ({len(v)})]"
    return str(v)


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


def rotating_layers(model_type: str, num_hidden_layers: int, *, torch_threads: int = 1) -> dict:
    """Which layers rotate in transformers' own forward: a tiny model of ``model_type`` (its config class with the
    sweep's tiny sizes, ``num_hidden_layers`` layers), run once with every module-level rotation function of its
    modeling module recorded (``ropelab.conformance.running.run_transformers``). Returns ``layer_types`` (the tiny
    config's), ``default_layer_types`` (the class's default config at that depth: the check is on the same
    pattern) and ``rotating``, the sorted indices of the decoder layers that called a rotation function."""
    import importlib

    import torch
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging as hf_logging

    from ropelab.conformance.sweep import run_transformers, tiny_kwargs

    torch.set_num_threads(torch_threads)
    cls = CONFIG_MAPPING[model_type]
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the tiny config's token-id warnings are not what is read here
    try:
        config = cls(**{**tiny_kwargs(cls), "num_hidden_layers": num_hidden_layers})
        default = cls(num_hidden_layers=num_hidden_layers)
        module = importlib.import_module(f"{cls.__module__.rsplit('.', 1)[0]}.modeling_{model_type}")
        run = run_transformers(config, module)
    finally:
        hf_logging.set_verbosity(level)
    return {"layer_types": list(getattr(config, "layer_types", []) or []),
            "default_layer_types": list(getattr(default, "layer_types", []) or []),
            "rotating": sorted({c["layer"] for c in run["calls"]})}
