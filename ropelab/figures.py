"""Figure generation: the notebook runner and the two helpers every notebook calls.

Run every notebook headless, top to bottom, into ``build/`` (the sources in ``notebooks/`` are never
modified)::

    python -m ropelab.figures            # full run: writes figures/ (PNG + SVG)
    python -m ropelab.figures --smoke    # tiny sizes: writes only under build/smoke/
    python -m ropelab.figures --only 01_rotate_half_vs_interleaved
    python -m ropelab.figures --manifest # rewrite figures/manifest.json for the committed figures

Each notebook has one cell tagged ``parameters`` that sets ``SMOKE = False``,
``FIGURES_DIR = "../build/figures"`` and ``RESULTS_DIR = "../build/results"`` (paths relative to
``notebooks/``, where JupyterLab starts a notebook's kernel), so a notebook run by hand in the lab never
writes a tracked file. The runner inserts a cell after it that overrides all three: a full run writes
``figures/`` and ``data/`` (results such as notebook 04's JSON), a smoke run ``build/smoke/figures`` and
``build/smoke/results``. A full run also records in ``figures/manifest.json`` which notebook and package
sources every figure came from (see :func:`stale_figures`). Inside a notebook::

    from ropelab.figures import setup, save
    setup()                       # seeds, a fixed thread count, deterministic matplotlib output
    save(fig, "00_frequency_ladder", FIGURES_DIR)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .paths import BUILD_DIR, DATA_DIR, FIGURES_DIR, NOTEBOOK_DIR, REPO

SEED = 0
THREADS = 2  # default torch thread count; the environment variable ROPELAB_THREADS overrides it

# REPO, DATA_DIR, FIGURES_DIR and BUILD_DIR are ropelab.paths' (re-exported: notebooks import them from here).
MANIFEST = FIGURES_DIR / "manifest.json"

__all__ = [
    "setup",
    "save",
    "notebooks",
    "run_notebook",
    "main",
    "notebook_hash",
    "package_hash",
    "stale_figures",
    "write_manifest",
    "REPO",
    "DATA_DIR",
    "FIGURES_DIR",
    "MANIFEST",
    "BUILD_DIR",
    "answer",
    "thread_count",
    "seed_value",
]


def thread_count() -> int:
    """The torch thread count notebooks run with: ``ROPELAB_THREADS`` if set (a positive integer), else 2."""
    value = os.environ.get("ROPELAB_THREADS", "")
    if not value:
        return THREADS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"ROPELAB_THREADS must be a positive integer, got {value!r}; unset it for the default {THREADS}."
        )
    return int(value)


def seed_value() -> int:
    """The seed notebooks run with: ``ROPELAB_SEED`` if set (an integer), else 0. Only for measuring how much a
    notebook's numbers move with the seed; the committed figures use 0."""
    value = os.environ.get("ROPELAB_SEED", "")
    if not value:
        return SEED
    if not value.lstrip("-").isdigit():
        raise ValueError(f"ROPELAB_SEED must be an integer, got {value!r}; unset it for the default {SEED}.")
    return int(value)


def setup(seed: int | None = None, threads: int | None = None) -> None:
    """Make a notebook deterministic: seed python, numpy and torch (``seed``, else ``ROPELAB_SEED`` or 0), fix the
    thread count (``threads``, else ``ROPELAB_THREADS`` or 2), and set matplotlib to write byte-stable files (no
    dates, a fixed SVG id salt). A rerun on the same machine with the same thread count gives the same bytes; another
    CPU or thread count changes float results in the last bits (the README says by how much)."""
    import matplotlib
    import numpy as np
    import torch

    threads = thread_count() if threads is None else threads
    seed = seed_value() if seed is None else seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    matplotlib.rcParams["svg.hashsalt"] = "ropelab"
    matplotlib.rcParams["figure.dpi"] = 100
    matplotlib.rcParams["savefig.dpi"] = 120
    matplotlib.rcParams["figure.max_open_warning"] = 0
    try:
        import seaborn as sns

        sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")  # colour-blind safe C0..C9
    except ImportError:  # seaborn is a core dependency; this only guards odd environments
        pass


def save(fig, name: str, figures_dir: str | os.PathLike = FIGURES_DIR) -> None:
    """Write ``fig`` as ``name.png`` and ``name.svg`` into ``figures_dir``, without dates or versions in the
    metadata, so a re-run with the same numbers gives the same bytes. Returns None, so a notebook cell
    ending in ``save(...)`` prints nothing."""
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.savefig(paths[0], bbox_inches="tight", metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches="tight", metadata={"Date": None, "Creator": None})


def answer(text: str, smoke: bool) -> None:
    """Show a section's answer as Markdown, built in the cell that measured its numbers (so prose cannot go
    stale). In a smoke run the sizes are tiny: the answer says so instead of passing its numbers off as the
    full run's."""
    from IPython.display import Markdown, display

    if smoke:
        head = "**Answer (smoke run: tiny sizes; these are not the full run's numbers, and its claims are asserted "
        head += "only in a full run, `python -m ropelab.figures`).** "
    else:
        head = "**Answer.** "
    display(Markdown(head + text))


def notebooks(only: list[str] | None = None) -> list[Path]:
    """The notebooks under ``notebooks/`` in order, or those whose stem starts with a name in ``only``."""
    found = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return found
    chosen = [p for p in found if any(p.stem == o or p.stem.startswith(o) for o in only)]
    missing = [o for o in only if not any(p.stem == o or p.stem.startswith(o) for p in found)]
    if missing:
        names = ", ".join(p.stem for p in found)
        raise SystemExit(f"no notebook named {missing}; choose from: {names}")
    return chosen


def _inject_parameters(nb, smoke: bool, figures_dir: Path, results_dir: Path | None = None) -> None:
    import nbformat

    tagged = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])
    ]
    if not tagged:
        raise ValueError("the notebook has no cell tagged 'parameters' (it must set SMOKE and FIGURES_DIR)")
    i = tagged[0]
    src = f"# injected by ropelab.figures\nSMOKE = {smoke!r}\nFIGURES_DIR = {str(figures_dir)!r}\n"
    if results_dir is not None:
        src += f"RESULTS_DIR = {str(results_dir)!r}\n"
    injected = nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(i + 1, injected)


def run_notebook(
    path: str | os.PathLike, *, smoke: bool = False, timeout: int = 1800, threads: int | None = None
) -> dict:
    """Execute one notebook headless into ``build/`` (``build/smoke/`` when ``smoke``).

    Figures go to ``figures/`` in a full run and ``build/smoke/figures/`` in a smoke run; results
    (``RESULTS_DIR``) to ``data/`` and ``build/smoke/results/``. ``threads`` sets the kernel's thread count
    (``ROPELAB_THREADS`` and ``OMP_NUM_THREADS``) for this run only. Returns a dict
    with the notebook name, the executed copy's path and the wall time in seconds. Raises
    ``nbclient.exceptions.CellExecutionError`` when a cell fails.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    out_dir = BUILD_DIR / "smoke" if smoke else BUILD_DIR
    if smoke and threads is not None:  # a run pinned to a thread count keeps its own copy (tests run in parallel)
        out_dir = out_dir / f"threads{threads}"
    figures_dir = out_dir / "figures" if smoke else FIGURES_DIR
    results_dir = out_dir / "results" if smoke else DATA_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    _inject_parameters(nb, smoke, figures_dir, results_dir)
    # Determinism and headless plotting for the kernel, which inherits this environment.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ["MPLBACKEND"] = "Agg"
    saved = {k: os.environ.get(k) for k in ("ROPELAB_THREADS", "OMP_NUM_THREADS")}
    if threads is not None:
        os.environ["ROPELAB_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(thread_count()))
    client = NotebookClient(
        nb,
        kernel_manager_class=_kernel_manager_class(),
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        target = out_dir / path.name
        nbformat.write(nb, target)
        if threads is not None:  # the next run gets the caller's environment back
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return {"notebook": path.stem, "executed": str(target), "seconds": round(time.perf_counter() - start, 1)}


def _kernel_manager_class():
    """Kernels on IPC sockets (files in Jupyter's runtime directory) where the OS has them: over TCP every
    kernel logs "Kernel is running over TCP without encryption" (ipykernel's kernelapp), five copies in a
    ``make figures``. Windows has no IPC transport and keeps TCP."""
    import uuid

    from jupyter_client import AsyncKernelManager  # nbclient's default manager
    from jupyter_core.paths import jupyter_runtime_dir

    if os.name == "nt":
        return AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            # The sockets are files named after ``ip``; without one they would be ./kernel-ipc-N in the
            # notebook's folder, shared by parallel runs. The kernel removes them when it shuts down.
            runtime = Path(jupyter_runtime_dir())
            runtime.mkdir(parents=True, exist_ok=True)
            ip = str(runtime / f"ropelab-{uuid.uuid4().hex}-ipc")
            super().__init__(transport="ipc", ip=ip, **kwargs)

    return IPCKernelManager


def _run_one(args: tuple[str, bool, int]) -> dict:
    path, smoke, timeout = args
    print(f"{Path(path).stem:40s} started", flush=True)
    try:
        return run_notebook(path, smoke=smoke, timeout=timeout)
    except Exception as e:  # report and carry on with the others; main() exits non-zero
        return {"notebook": Path(path).stem, "error": f"{type(e).__name__}: {str(e)[-2000:]}"}


# --------------------------------------------------------------------------------------------------
# Staleness: which sources every committed figure came from
# --------------------------------------------------------------------------------------------------


def notebook_hash(path: str | os.PathLike) -> str:
    """SHA-256 of a notebook's cells (type and source only): outputs, execution counts, ids and metadata
    do not count, so a stripped notebook and the same notebook after a run hash the same."""
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    text = json.dumps([[c["cell_type"], "".join(c["source"])] for c in cells], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def package_hash() -> str:
    """SHA-256 of every ``ropelab/**/*.py`` source, sub-packages included (paths and bytes, in path order)."""
    h = hashlib.sha256()
    for p in sorted((REPO / "ropelab").rglob("*.py")):
        h.update(p.relative_to(REPO).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _figures_of(nb_path: Path) -> list[Path]:
    """A notebook's committed figures: ``figures/NN_*`` for notebook ``NN_*`` (every figure is saved
    under its notebook's number, README "Adding a notebook")."""
    prefix = nb_path.stem.split("_")[0] + "_"
    return sorted(p for p in FIGURES_DIR.glob(prefix + "*") if p.suffix in (".png", ".svg"))


def write_manifest(paths: list[Path] | None = None) -> dict:
    """Record, in ``figures/manifest.json``, for every figure of the given notebooks (default all): the
    notebook, its :func:`notebook_hash` and the :func:`package_hash` now. The runner calls it after each
    notebook of a full run; ``python -m ropelab.figures --manifest`` calls it for the committed figures."""
    entries = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    pkg = package_hash()
    for nb_path in paths if paths is not None else notebooks():
        nb_path = Path(nb_path)
        rel_nb = nb_path.resolve().relative_to(REPO).as_posix()
        entries = {k: v for k, v in entries.items() if v["notebook"] != rel_nb}
        for fig in _figures_of(nb_path):
            entries[fig.name] = {"notebook": rel_nb, "notebook_sha256": notebook_hash(nb_path), "package_sha256": pkg}
    entries = dict(sorted(entries.items()))
    MANIFEST.write_text(json.dumps(entries, indent=1) + "\n")
    return entries


def stale_figures(package: bool = False) -> list[str]:
    """Why committed figures may be out of date, one line each (empty when none): a figure missing from
    the manifest, a manifest entry whose figure or notebook is gone, a notebook changed since its figures
    were made, and with ``package=True`` also a package changed since then (any ``ropelab/*.py``)."""
    entries = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    problems, pkg = [], package_hash()
    for fig in sorted(p for p in FIGURES_DIR.iterdir() if p.suffix in (".png", ".svg")):
        if fig.name not in entries:
            problems.append(f"{fig.name}: not in {MANIFEST.name}; run its notebook with python -m ropelab.figures")
    for name, e in entries.items():
        nb_path = REPO / e["notebook"]
        if not (FIGURES_DIR / name).exists():
            problems.append(f"{name}: in {MANIFEST.name} but not in figures/; run python -m ropelab.figures --manifest")
        elif not nb_path.exists():
            problems.append(f"{name}: its notebook {e['notebook']} is gone")
        elif notebook_hash(nb_path) != e["notebook_sha256"]:
            problems.append(f"{name}: {e['notebook']} changed since; python -m ropelab.figures --only {nb_path.stem}")
        elif package and e["package_sha256"] != pkg:
            problems.append(f"{name}: ropelab/ changed since; python -m ropelab.figures --only {nb_path.stem}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.figures [--smoke] [--only NAME ...] [--jobs N]``; non-zero if a notebook failed."""
    parser = argparse.ArgumentParser(prog="python -m ropelab.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; write only under build/smoke/")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (name or prefix)")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run in parallel (default 1)")
    parser.add_argument("--timeout", type=int, default=3600, help="per-cell timeout in seconds")
    parser.add_argument(
        "--manifest", action="store_true", help="only rewrite figures/manifest.json for the committed figures"
    )
    args = parser.parse_args(argv)
    paths = notebooks(args.only)
    if args.manifest:
        entries = write_manifest(paths)
        print(f"wrote {MANIFEST.relative_to(REPO)}: {len(entries)} figures of {len(paths)} notebooks")
        return 0
    if not paths:
        print("no notebooks found under notebooks/")
        return 1
    work = [(str(p), args.smoke, args.timeout) for p in paths]
    start, results = time.perf_counter(), []

    def report(r: dict) -> None:
        results.append(r)
        status = f"FAILED {r['error']}" if "error" in r else f"ok {r['seconds']:.1f} s -> {r['executed']}"
        done = f"[{len(results)}/{len(work)}, {time.perf_counter() - start:.0f} s so far]"
        print(f"{r['notebook']:40s} {status} {done}", flush=True)
        if not args.smoke and "error" not in r:
            write_manifest([Path(p) for p, *_ in work if Path(p).stem == r["notebook"]])

    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for fut in as_completed([pool.submit(_run_one, w) for w in work]):
                report(fut.result())
    else:
        for w in work:
            report(_run_one(w))
    failed = [r for r in results if "error" in r]
    print(f"{len(results) - len(failed)} of {len(results)} notebooks ran in {time.perf_counter() - start:.0f} s")
    timings = BUILD_DIR / ("smoke" if args.smoke else "") / "timings.json"
    timings.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(timings.read_text()) if timings.exists() else {}
    previous.update({r["notebook"]: r["seconds"] for r in results if "seconds" in r})
    timings.write_text(json.dumps(previous, indent=1, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
