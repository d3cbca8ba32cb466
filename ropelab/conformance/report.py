r"""The sweep's table: counts, the classes of not-covered reasons, the paragraph of ``docs/guides/conformance.md``
on it, and notebook 09's figure of the convention classes."""

from __future__ import annotations

import torch

from .convention import conventions_of

__all__ = ["REASON_CLASSES", "COMPOSITE", "COMPOSITE_UNCOMPARED", "reason_class", "row_class",
           "summarise", "readme_paragraph", "plot_convention_classes"]


COMPOSITE = "composite config: the RoPE lives in a sub-config, compared as its own model type"
COMPOSITE_UNCOMPARED = "composite config: none of its sub-configs' model types is compared either"

# The classes of not-covered reasons the counts use: (a phrase of the reason, the class), first match wins. A
# composite config is run whole on token ids (``composite``) and its row says what failed, classed as any other;
# the first entry is the reason of a table written before that (a composite returned unrun).
REASON_CLASSES = (
    ("its RoPE lives in a sub-config", COMPOSITE),
    ("no decoder layers to attribute", "a composite without a decoder: no layers to attribute rotation calls to"),
    ("outside the decoder layers", "a rotation call outside the decoder layers (an encoder or a tower)"),
    ("no rotary class, no rotation function and no cos/sin", "the model's code applies no RoPE (no rotary class, "
     "rotation function or cos/sin in its modeling module)"),
    ("no module-level rotation function", "rotation inlined in the attention (no module-level apply function)"),
    ("applies no RoPE on this config", "the model applies no RoPE on the config (no rotary module, no rotation call)"),
    ("made no call to a rotation function", "rotation inlined in the attention (no module-level apply function)"),
    ("no ModuleList of num_hidden_layers", "the decoder's layers are no ModuleList of num_hidden_layers (calls "
     "cannot be attributed to layers)"),
    ("a component without decoder layers", "a component without decoder layers (no num_hidden_layers)"),
    ("no AutoModel and no *Model class", "no model class runs on this config class alone (a component)"),
    ("pair dims differently", "ropelab refuses: two pairings in one layer (a sparse-attention indexer)"),
    ("RopeSpec cannot represent", "ropelab refuses: a rotation RopeSpec cannot represent"),
    ("are not read by rope_type", "ropelab refuses: a RoPE variant ropelab does not have (multimodal, llama4 keys)"),
    ("is multi-axis (M-RoPE", "ropelab refuses: a RoPE variant ropelab does not have (multimodal, llama4 keys)"),
    ("ropelab:", "ropelab refuses the config it reads (ValueError)"),
    ("refuses the inputs the sweep builds", "the model refuses the inputs the sweep builds (pixels, patches and grid, "
     "audio features or samples)"),
    ("positions the model rotated by could not be read", "the model's positions are not read from its rotary module's "
     "call (it computes them inside)"),
    ("queries and keys are all zero", "the rotated queries and keys are all zero (the inputs are masked away)"),
    ("has no axis of the", "a rotated tensor shorter than the positions (queries fewer than keys)"),
    ("called with its tensors as keyword arguments only", "a rotation called with keyword arguments only (the "
     "sweep reads positional ones)"),
    ("missing", "the model needs inputs other than tokens"),
    ("pixel_values", "the model needs inputs other than tokens"),
    ("` must be given", "the model needs inputs other than tokens"),
    ("input_features", "the model needs inputs other than tokens"),
    ("fails on its config class's own default", "transformers' rotary fails on its config class's own default "
     "config (before any tiny size)"),
    ("does not run this config class in the v4 schema", "transformers' model does not run the v4 schema on this "
     "config class (the v5 one runs)"),
    ("requires the `default` rope type", "transformers' model accepts only its default rope type"),
    ("cannot be built on its config class's own default", "transformers' model cannot be built on its config "
     "class's own default config (before any tiny size)"),
    ("but it was not found in your environment", "the modeling module needs a package not installed"),
    ("cannot run on tokens", "transformers' model fails on the sweep's tiny config"),
    ("tiny config cannot be built", "the config class rejects the sweep's tiny sizes"),
    ("does not import", "the modeling module needs a package not installed"),
)


def reason_class(reason: str) -> str:
    """The class of a not-covered reason, for the counts (``REASON_CLASSES``; else the text before its colon)."""
    return next((c for phrase, c in REASON_CLASSES if phrase in reason), reason.split(":")[0])


def row_class(row: dict, rows: dict) -> str:
    """The class of a not-covered row: :func:`reason_class`, except that a composite config is ``COMPOSITE`` only
    where one of its sub-configs' model types (``row["sub_config_types"]``) was itself compared in ``rows``."""
    c = reason_class(row["reason"])
    if c != COMPOSITE:
        return c
    compared = [t for t in (row.get("sub_config_types") or {}).values()
                if rows.get(t, {}).get("status") in ("agree", "disagree")]
    return COMPOSITE if compared else COMPOSITE_UNCOMPARED


def summarise(rows: dict, found: dict, version: str, *, seconds: float, cpu_seconds: float) -> dict:
    """The JSON table: counts (status, not-covered reasons, convention table check, diagnose), and the rows."""
    counts = {k: sum(r["status"] == k for r in rows.values()) for k in ("agree", "disagree", "not covered")}
    reasons: dict[str, int] = {}
    for r in rows.values():
        if r["status"] == "not covered":
            reasons[row_class(r, rows)] = reasons.get(row_class(r, rows), 0) + 1
    # The variants (linear, yarn, v4) of the compared model types: each compared, or its reason's class
    variants: dict[str, int] = {}
    for r in rows.values():
        if r["status"] == "not covered":
            continue
        for v in r.get("variants", {}).values():
            key = v["status"] if v["status"] != "not covered" else reason_class(v.get("reason", ""))
            variants[key] = variants.get(key, 0) + 1
    table = {k: sorted(mt for mt, r in rows.items() if r.get("table") == k) for k in ("differs", "absent")}
    diag = {"match": 0, "mismatch": 0, "not probed": 0}
    fields: dict[str, int] = {}
    for r in rows.values():
        v = r.get("diagnose")
        if v is None:
            continue
        key = v.split(":")[0]
        diag[key] += 1
        for f in v.split(":")[1].split(",") if ":" in v else []:
            fields[f.strip()] = fields.get(f.strip(), 0) + 1
    return {"transformers": version, "torch": torch.__version__,
            "generated_by": "python -m ropelab.conformance", "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu_seconds, 1),
            "tolerance": "per element: a*rho*(|m w|(ln b + 9) + 4)*2**-24 on rotated pairs, 16*2**-53*|x| elsewhere",
            "counts": counts, "not_covered_by_reason": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
            "variants_of_compared_types": dict(sorted(variants.items(), key=lambda kv: -kv[1])),
            "convention_table": {"measured_differs_from_committed": table["differs"],
                                 "absent_from_committed": table["absent"]},
            "diagnose": {"model_types": diag, "mismatched_fields": dict(sorted(fields.items()))},
            "discovered": len(found), "conventions": conventions_of(rows), "models": dict(sorted(rows.items()))}


def readme_paragraph(table: dict, load: str = "about 7") -> str:
    """The paragraph of ``docs/guides/conformance.md`` on the committed table (``tests/test_conformance.py``
    requires it there verbatim; the name is from when it was the README's)."""
    c, d = table["counts"], table["diagnose"]["model_types"]
    fields = ", ".join(f"{f} {n}" for f, n in table["diagnose"]["mismatched_fields"].items()) or "none"
    lines = [
        f"`make conformance` (`python -m ropelab.conformance`) runs transformers' own modeling code for every model "
        f"type of the installed transformers that uses rotary embeddings, found by reading the library "
        f"({table['discovered']} in transformers {table['transformers']}), on a tiny config of its own config class "
        "(default; linear and yarn in the v5 schema, longrope where the class accepts no other; the same in the v4 "
        "schema), and compares each layer's rotated "
        "queries and keys with `apply_rope(x, spec=RopeSpec.per_layer(config)[layer])` in float64, element by "
        "element within a float32 rounding bound. `per_layer` takes what the config does not say (pairing, a fixed "
        "rotary fraction, NoPE layer types, aliases, ignored keys, v4 rules) from the convention table "
        "`ropelab/conformance/hf_table.py`, generated by the previous run and checked against a fresh measurement. "
        "A composite config (a vision-language or speech model's) runs whole on token ids and is compared on its "
        "text model's layers against `per_layer` of the whole dict; a model that takes no tokens runs on tiny "
        "inputs built for it, a vision tower compared on its multi-axis rotation (`multiaxis.per_layer_axes`). "
        f"Result (`data/conformance/transformers-{table['transformers']}.json`): **{c['agree']} agree, "
        f"{c['disagree']} disagree and {c['not covered']} not covered**, each with its reason:",
        ""]
    for reason, n in table["not_covered_by_reason"].items():
        lines.append(f"- {reason}: {n}")
    variants = table.get("variants_of_compared_types")
    if variants:
        lines += ["", "The scaling variants of the compared model types, each compared or with its reason: "
                  + "; ".join(f"{k}: {n}" for k, n in variants.items()) + "."]
    lines += ["",
              f"`diagnose`, probing each covered family's real rotary as a black box, reads the spec's style, base, "
              f"rotary_dim, scaling type and scaling parameters (the same, or different only where float32 outputs "
              f"cannot tell) for {d['match']} of the {d['match'] + d['mismatch']} model types "
              f"probed; for {d['mismatch']} it does not (fields: {fields}; see [where it cannot decide](diagnose.md)); "
              f"{d['not probed']} could not be probed. The sweep took {round(table['seconds'] / 60)} min wall "
              f"({round(table['cpu_seconds'] / 60)} min of CPU) on one thread, on a machine shared with other jobs "
              f"(load average {load}). A new transformers release: rerun `make conformance`; a model type the table "
              "has never seen is not covered (\"not in ropelab's convention table\") until its measured entry, "
              "written by that run, is reviewed and the model type rerun."]
    return "\n".join(lines)


def plot_convention_classes(n_class: dict, n_covered: int, version: str, partition: tuple = ()):
    """The convention classes (``n_class``: class -> the covered model types in it), out of ``n_covered``
    covered model types measured on transformers ``version``. The classes named in ``partition`` split the
    covered types (each type in exactly one: the pairing) and are drawn in a panel of their own on top; the
    others are properties a type may have several of, one bar each below, on the same axis. Returns the figure
    (notebook 09)."""
    import matplotlib.pyplot as plt

    props = [n for n in n_class if n not in partition][::-1]
    if partition:
        fig, (top, ax) = plt.subplots(2, 1, figsize=(8, 4.2), height_ratios=[len(partition), len(props)],
                                      sharex=True)
        names = list(partition)[::-1]
        top.barh(names, [len(n_class[n]) for n in names], color="#dd8452")
        for y, n in enumerate(names):
            top.text(len(n_class[n]) + 0.5, y, str(len(n_class[n])), va="center", fontsize=8)
        top.set_xlim(0, n_covered * 1.06)
        top.set_title(f"pairing: each of the {n_covered} covered model types has exactly one (they sum to "
                      f"{n_covered})", fontsize=9)
    else:
        fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.barh(props, [len(n_class[n]) for n in props], color="#4c72b0")
    for y, n in enumerate(props):
        ax.text(len(n_class[n]) + 0.5, y, str(len(n_class[n])), va="center", fontsize=8)
    ax.set_xlabel(f"model types (of {n_covered} covered), measured on transformers {version}")
    if partition:
        ax.set_title("conventions beyond the pairing (a type can have several)", fontsize=9)
        fig.suptitle("RoPE conventions the config does not state, across model families")
    else:
        ax.set_title("RoPE conventions the config does not state, across model families")
    fig.tight_layout()
    return fig
