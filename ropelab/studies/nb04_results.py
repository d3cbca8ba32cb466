"""Notebook 04's results files: the Selective Copy sweep as JSON (schema checked on write and read; notebook 03
reads it too) and the CoPE models at the selected learning rate as one checkpoint file. Written and read only
through these functions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..models import checkpoint_dict, from_checkpoint_dict

__all__ = ["RESULTS_SCHEMA", "save_selective_copy_results", "load_selective_copy_results", "models_path",
           "save_selective_copy_models", "load_selective_copy_models"]


RESULTS_SCHEMA = 2
_RESULTS_KEYS = {
    "schema": int,
    "source": str,
    "smoke": bool,
    "task": dict,
    "protocol": dict,
    "paper": dict,
    "selected": dict,
    "summary": dict,
    "runs": list,
    "cope": dict,
}
_COPE_MODEL_KEYS = {"seed": int, "lr": float, "errors": dict, "position_logits": list, "source_positions": dict}


def _check_record(record: dict) -> None:
    def need(obj, keys, where):
        for key, typ in keys.items():
            if key not in obj:
                raise ValueError(
                    f"{where} lacks {key!r}; write it with save_selective_copy_results (schema {RESULTS_SCHEMA})."
                )
            if not isinstance(obj[key], typ) or (typ is int and isinstance(obj[key], bool)):
                raise ValueError(f"{where}[{key!r}] must be {typ.__name__}, got {type(obj[key]).__name__}.")

    if not isinstance(record, dict):
        raise ValueError(f"a results record must be a dict, got {type(record).__name__}.")
    need(record, _RESULTS_KEYS, "the record")
    if record["schema"] != RESULTS_SCHEMA:
        raise ValueError(
            f"results schema {record['schema']} but this ropelab reads schema {RESULTS_SCHEMA}; rerun notebook 04."
        )
    models = record["cope"].get("models")
    if not isinstance(models, list):
        raise ValueError("record['cope']['models'] must be a list (one entry per CoPE seed).")
    for i, m in enumerate(models):
        need(m, _COPE_MODEL_KEYS, f"record['cope']['models'][{i}]")
        hist = m["source_positions"]
        if not {"bin_edges", "counts"} <= set(hist):
            raise ValueError(f"record['cope']['models'][{i}]['source_positions'] needs 'bin_edges' and 'counts'.")


def save_selective_copy_results(record: dict, path: str | os.PathLike) -> Path:
    r"""Write notebook 04's Selective Copy results as JSON, after checking the schema below.

    Schema (``RESULTS_SCHEMA`` = 2); errors are percentages of sequences, learning rates floats:

    - ``schema`` (int), ``source`` (str: the notebook that made it), ``smoke`` (bool);
    - ``task``: ``{split: SelectiveCopy.to_dict()}`` for ``in_dist``, ``ood_dense``, ``ood_sparse``;
    - ``protocol``: encodings, learning rates, seeds, steps, batch, set sizes, threads per run, metric;
    - ``paper``: the published numbers compared against, with their exact source;
    - ``selected``: :func:`select_learning_rates`'s output, ``{pe: {"lr", "sweep": {lr: validation}}}``
      (JSON object keys are strings: ``str(lr)``);
    - ``summary``: :func:`summarize_runs` of each encoding's runs at its selected learning rate;
    - ``runs``: every :func:`run_selective_copy` result of the sweep (history, validation, test errors);
    - ``cope``: ``{"models": [...], "gate_stats": [...], "npos_max", "scale"}``, one model entry per seed at
      CoPE's selected learning rate with ``seed``, ``lr``, ``errors`` (test, per split), ``position_logits``
      (``[layer][head][n]``: mean :math:`q_i\cdot e[n]` over the answer queries) and ``source_positions``
      (``{"bin_edges": [...], "counts": [layer][head][bin]}``: histogram of :func:`source_positions`).

    Returns the path written. Raises ``ValueError`` naming the first missing or mistyped entry.
    """
    _check_record(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def load_selective_copy_results(path: str | os.PathLike) -> dict:
    """Read a file written by :func:`save_selective_copy_results` and check its schema (``ValueError`` if it
    is from another schema or lacks an entry; ``FileNotFoundError`` if there is no file)."""
    record = json.loads(Path(path).read_text())
    _check_record(record)
    return record


def models_path(results_path: str | os.PathLike) -> Path:
    """Where the CoPE checkpoints of a results file live: ``X.json`` -> ``X_models.pt`` next to it."""
    p = Path(results_path)
    return p.with_name(p.stem + "_models.pt")


def save_selective_copy_models(models: dict, pe: str, lr: float, seeds, path: str | os.PathLike) -> Path:
    """Write the models ``models[pe, lr, seed]`` of every seed (float32 state dicts and configs) to ``path``:
    notebook 04 reads them back (:func:`load_selective_copy_models`) instead of training them again."""
    blob = {"pe": pe, "lr": float(lr), "models": {int(s): checkpoint_dict(models[pe, lr, s]) for s in seeds}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blob, path)
    return path


def load_selective_copy_models(path: str | os.PathLike) -> dict:
    """Read :func:`save_selective_copy_models`' file: ``{(pe, lr, seed): TinyLM}`` in eval mode."""
    blob = torch.load(Path(path), map_location="cpu", weights_only=True)
    out = {}
    for seed, m in blob["models"].items():
        out[blob["pe"], blob["lr"], int(seed)] = from_checkpoint_dict(m)
    return out
