"""Write ``data/conformance/first-run-5fa9217.json``: what the first committed conformance table found wrong.

The first committed run of ``make conformance`` (commit 5fa9217, transformers 5.24.0) had 5 model types that
disagree with transformers. This script reads that table and today's from git, and records per disagreeing
(type, variant): how many layers disagreed, the worst error over its float32 bound, the spec ``per_layer`` gave
then, and what stands in today's table (its spec, or the refusal). Notebook 09 shows it. Run from the repository
root: ``python scripts/conformance_first_run.py`` (needs the git history; the output is committed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIRST = "5fa9217"
TABLE = "data/conformance/transformers-5.24.0.json"
OUT = Path("data/conformance/first-run-5fa9217.json")


def _table(rev: str | None) -> dict:
    if rev is None:
        return json.loads(Path(TABLE).read_text())
    text = subprocess.run(["git", "show", f"{rev}:{TABLE}"], capture_output=True, text=True, check=True).stdout
    return json.loads(text)


def main() -> int:
    old, new = _table(FIRST), _table(None)
    rows = []
    for mt, r in sorted(old["models"].items()):
        if r["status"] != "disagree":
            continue
        now = new["models"].get(mt, {})
        for variant, v in r["variants"].items():
            if v.get("status") != "disagree":
                continue
            bad = [lay for lay in v["layers"] if lay["status"] == "disagree"]
            first = bad[0]
            now_v = now.get("variants", {}).get(variant, {})
            now_layer = next((lay for lay in now_v.get("layers", []) if lay["layer"] == first["layer"]), None)
            rows.append({"model_type": mt, "variant": variant, "layers_disagreeing": len(bad),
                         "layers": len(v["layers"]),
                         "worst_error_over_bound": max(lay["error_over_bound"] for lay in bad),
                         "worst_max_error": max(lay["max_error"] for lay in bad),
                         "first_layer": first["layer"], "spec_then": first.get("spec"),
                         "status_now": now_v.get("status", now.get("status")),
                         "spec_now": (now_layer or {}).get("spec"),
                         "reason_now": now.get("reason") if now.get("status") == "not covered" else None})
    out = {"source": f"git show {FIRST}:{TABLE} (the first committed run) against the table at HEAD",
           "generated_by": "python scripts/conformance_first_run.py", "first_run_counts": old["counts"],
           "counts_now": new["counts"], "disagreements": rows}
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(rows)} disagreeing (type, variant) runs in {FIRST}'s table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
