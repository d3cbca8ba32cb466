r"""The conformance sweep itself (the design: ``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import argparse
import json
import pathlib
import time
import traceback

import torch

# The jobs live in modules of their own; ``sweep`` runs them all and re-exports their names.
from .compare import U32, U64, bound, compare_call  # noqa: F401 - re-exported
from .convention import TABLE_PATH, conventions_of, measure_convention, table_entry, write_conventions  # noqa: F401
from .discovery import N_HEADS, N_LAYERS, discover, tiny_kwargs, variants  # noqa: F401 - re-exported
from .probe import diagnose_probe
from .records import sweep_model_type
from .report import REASON_CLASSES, readme_paragraph, reason_class, summarise
from .running import error_text, positions_for, run_transformers

__all__ = ["discover", "tiny_kwargs", "variants", "positions_for", "run_transformers", "bound", "compare_call",
           "measure_convention", "diagnose_probe", "sweep_model_type", "table_entry", "sweep", "reason_class",
           "REASON_CLASSES", "summarise", "readme_paragraph", "conventions_of", "write_conventions", "main"]


DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "data" / "conformance"


def sweep(model_types: list[str] | None = None, *, only_default: bool = False, log=print) -> dict:
    """Run the sweep (all discovered model types, or ``model_types``) and return the table."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    found = discover()
    chosen = sorted(found) if model_types is None else list(model_types)
    t0, c0 = time.perf_counter(), time.process_time()
    rows = {}
    for mt in chosen:
        t = time.perf_counter()
        try:
            rows[mt] = sweep_model_type(mt, found[mt], only_default=only_default)
            rows[mt]["seconds"] = round(time.perf_counter() - t, 2)  # lets a test pick the quickest per class
        except Exception as e:  # noqa: BLE001 - one family's failure is a row, never the end of the sweep
            rows[mt] = {"module": found[mt]["module"], "status": "not covered",
                        "reason": f"sweep error: {error_text(e)}", "trace": traceback.format_exc(limit=3)[-600:]}
        if log:
            log(f"{mt:40s} {rows[mt]['status']:12s} {time.perf_counter() - t:5.2f}s {rows[mt].get('reason', '')[:90]}")
    return summarise(rows, found, transformers.__version__, seconds=time.perf_counter() - t0,
                     cpu_seconds=time.process_time() - c0)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The conformance sweep: RopeSpec.per_layer against transformers' "
                                 "own modeling code, every RoPE model type (see ropelab.conformance).")
    ap.add_argument("model_types", nargs="*", help="only these model types: their rows replace those of the "
                    "committed JSON (its counts are recomputed, its time is the full sweep's)")
    ap.add_argument("--out", default=None, help="the JSON to write (default data/conformance/transformers-<v>.json)")
    ap.add_argument("--no-table", action="store_true", help="do not rewrite ropelab/conformance/hf_table.py")
    args = ap.parse_args(argv)
    import transformers

    out = pathlib.Path(args.out) if args.out else DATA_DIR / f"transformers-{transformers.__version__}.json"
    table = sweep(args.model_types or None)
    if args.model_types and out.exists():
        old = json.loads(out.read_text())
        rows = {**old["models"], **table["models"]}
        table = {**summarise(rows, discover(), table["transformers"], seconds=old["seconds"],
                             cpu_seconds=old.get("cpu_seconds", float("nan"))),
                 "rerun_after_the_full_sweep": sorted(set(old.get("rerun_after_the_full_sweep", []))
                                                      | set(args.model_types))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    stale = table["convention_table"]
    changed = stale["measured_differs_from_committed"] + stale["absent_from_committed"]
    if not args.no_table and (not args.model_types or changed):
        from .hf_table import CONVENTIONS

        write_conventions({**(CONVENTIONS if args.model_types else {}), **table["conventions"]}, table["transformers"])
    print(f"{table['counts']} of {table['discovered']} model types in {table['seconds']} s -> {out}")
    if changed:
        print(f"the measured conventions of {changed} differ from the committed table (now rewritten): review its "
              "diff, then rerun these model types (`python -m ropelab.conformance " + " ".join(changed) + "`): "
              "their rows compared against the old table")
    return 1 if table["counts"]["disagree"] else (2 if changed else 0)
