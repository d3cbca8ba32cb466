"""Figure generation: the notebook runner and the two helpers every notebook calls.

Run every notebook headless, top to bottom, into ``build/`` (the sources in ``notebooks/`` are never
modified)::

    python -m ropelab.figures            # full run: writes figures/ (PNG + SVG)
    python -m ropelab.figures --smoke    # tiny sizes: writes only under build/smoke/
    python -m ropelab.figures --only 01_rotate_half_vs_interleaved
    python -m ropelab.figures --manifest # rewrite figures/manifest.json for the committed figures
    python -m ropelab.figures --readme   # re-render the map's, the README's and docs/guides/running.md's blocks
    python -m ropelab.figures --nav      # rewrite every notebook's Previous/Map/Next footer (cell tagged "nav")

Each notebook has one cell tagged ``parameters`` that sets ``SMOKE = False``,
``FIGURES_DIR = "../build/figures"`` and ``RESULTS_DIR = "../build/results"`` (paths relative to
``notebooks/``, where JupyterLab starts a notebook's kernel), so a notebook run by hand in the lab never
writes a tracked file. The runner inserts a cell after it that overrides all three: a full run writes
``figures/`` and ``data/`` (results such as notebook 04's JSON), a smoke run ``build/smoke/figures`` and
``build/smoke/results``. A full run also records in ``figures/manifest.json`` which notebook and package
sources every figure came from (see :func:`stale_figures`), and in ``figures/runs.json`` each notebook's wall time,
the machine and its load, and its headline (the text of its :func:`headline` call); the notebook map's cell, the
README's notebook table (question and headline) and the run-time block of ``docs/guides/running.md`` are rendered
from that file (:func:`write_pages`), and a notebook's :func:`runtime_note` shows its own last time at run time.
Inside a notebook::

    from ropelab.figures import setup, save
    setup()                       # seeds, a fixed thread count, deterministic matplotlib output
    save(fig, "00_frequency_ladder", FIGURES_DIR)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .manifest import (
    MANIFEST,
    NAV_TAG,
    RUNS,
    load_runs,
    machines_text,
    navigation,
    notebook_hash,
    notebooks,
    package_hash,
    questions,
    render_map,
    runtime_text,
    seconds_text,
    stale_figures,
    write_manifest,
    write_navigation,
)
from .paths import BUILD_DIR, DATA_DIR, FIGURES_DIR, NOTEBOOK_DIR, REPO

SEED = 0
THREADS = 2  # default torch thread count; the environment variable ROPELAB_THREADS overrides it

# REPO, DATA_DIR, FIGURES_DIR and BUILD_DIR are ropelab.paths' (re-exported: notebooks import them from here).
MAP = NOTEBOOK_DIR / "index.ipynb"
README = REPO / "README.md"  # the front page: its notebook table is rendered from MAP and RUNS
RUNS_PAGE = REPO / "docs" / "guides" / "running.md"  # the guide whose run-time block is rendered from RUNS
MAP_CELL_ID = "map-runs"  # the index cell rendered from RUNS
RUNS_BEGIN = "<!-- runs:begin (generated from figures/runs.json by python -m ropelab.figures --readme) -->"
RUNS_END = "<!-- runs:end -->"
README_BEGIN, README_END = RUNS_BEGIN, RUNS_END  # the old names of the run-time block's markers (it left the README)
TABLE_BEGIN = ("<!-- notebooks:begin (generated from notebooks/index.ipynb and figures/runs.json by "
               "python -m ropelab.figures --readme) -->")
TABLE_END = "<!-- notebooks:end -->"

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
    "navigation",
    "write_navigation",
    "NAV_TAG",
    "REPO",
    "DATA_DIR",
    "FIGURES_DIR",
    "MANIFEST",
    "BUILD_DIR",
    "answer",
    "headline",
    "checked",
    "CHECK_PASSED",
    "CHECK_ON_SOLUTION",
    "runtime_text",
    "runtime_note",
    "RUNS",
    "load_runs",
    "record_run",
    "render_map",
    "render_runs",
    "render_notebook_table",
    "render_readme",
    "write_pages",
    "pages_in_step",
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
    CPU or thread count changes float results in the last bits (``docs/guides/running.md`` says by how much).

    Args:
        seed: the seed of python's, numpy's and torch's generators; None: ``ROPELAB_SEED`` or 0.
        threads: torch's thread count (set for the process); None: ``ROPELAB_THREADS`` or 2.
    """
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
    except ImportError:  # seaborn is in the notebooks extra; a core-only install keeps matplotlib's style
        pass


def save(fig, name: str, figures_dir: str | os.PathLike = FIGURES_DIR) -> None:
    """Write ``fig`` as ``name.png`` and ``name.svg`` into ``figures_dir``, without dates or versions in the
    metadata, so a re-run with the same numbers gives the same bytes. Returns None, so a notebook cell
    ending in ``save(...)`` prints nothing.

    Args:
        fig: the matplotlib Figure (saved with ``bbox_inches="tight"``).
        name: the files' stem, e.g. ``"03_decay"``.
        figures_dir: the folder (created if missing); notebooks pass their ``FIGURES_DIR``.
    """
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.savefig(paths[0], bbox_inches="tight", metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches="tight", metadata={"Date": None, "Creator": None})


def answer(text: str, smoke: bool) -> None:
    """Show a section's answer as Markdown, built in the cell that measured its numbers (so prose cannot go
    stale). In a smoke run the sizes are tiny: the answer says so instead of passing its numbers off as the
    full run's.

    Args:
        text: the answer, Markdown (``$...$`` math allowed), after the bold "Answer." lead.
        smoke: whether this is a smoke run (then the lead says the numbers are not the full run's).
    """
    from IPython.display import Markdown, display

    if smoke:
        head = "**Answer (smoke run: tiny sizes; these are not the full run's numbers, and its claims are asserted "
        head += "only in a full run, `python -m ropelab.figures`).** "
    else:
        head = "**Answer.** "
    display(Markdown(head + text))


CHECK_ON_SOLUTION = ("The hidden solution passes this check. Replace None above with your answer and run the check "
                     "again.")
CHECK_PASSED = "Correct: your answer passes the check."


def checked(yours) -> None:
    """An exercise check's verdict, printed after its asserts passed: it never prints the answer (a reader who has
    not solved the exercise yet must not find it in the check's output, nor on the site). ``yours`` is the reader's
    answer variable: None means the check ran on the hidden solution, which the verdict says.

    Args:
        yours: the reader's answer (only whether it is None is read; it is never printed).
    """
    print(CHECK_ON_SOLUTION if yours is None else CHECK_PASSED)


def headline(text: str, smoke: bool) -> None:
    """Show a notebook's headline, its main finding in one or two sentences with the number behind it, built
    from the numbers it measured. A full run of the runner saves the text in ``figures/runs.json``, from which
    the notebook map shows it (:func:`render_map`), so the map's answers cannot drift from the notebooks'.

    Args:
        text: the headline, Markdown; also stored in the output's metadata, where the runner reads it.
        smoke: whether this is a smoke run (then the lead says so).
    """
    from IPython.display import Markdown, display

    head = "**In one line (smoke run: tiny sizes, not the full run's numbers).** " if smoke else "**In one line.** "
    display(Markdown(head + text), metadata={"ropelab": {"headline": text}})


def _headline_of(executed: Path) -> str | None:
    """The text of the :func:`headline` call in an executed notebook, or None."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    found = [o.get("metadata", {}).get("ropelab", {}).get("headline") for c in nb.cells if c.cell_type == "code"
             for o in c.get("outputs", []) if o.get("output_type") == "display_data"]
    found = [f for f in found if f]
    return found[-1] if found else None


def record_run(nb_path: str | os.PathLike, seconds: float, executed: str | os.PathLike,
               path: str | os.PathLike | None = None) -> dict:
    """Record one notebook's full run in ``figures/runs.json`` (the runner calls it after each notebook of a full
    run): its seconds, headline, source hash, the machine and the load average at its end.

    Args:
        nb_path: the source notebook (its stem is the record's key, its :func:`ropelab.manifest.notebook_hash`
            the ``notebook_sha256``).
        seconds: the run's wall time.
        executed: the executed copy, whose :func:`headline` output is recorded (None when it has none).
        path: the JSON file; None: ``figures/runs.json``.

    Returns every record, as written.
    """
    from .machine import machine_info

    path = RUNS if path is None else Path(path)
    runs = load_runs(path)
    info = machine_info()
    nb_path = Path(nb_path)
    runs[nb_path.stem] = {
        "seconds": round(float(seconds), 1),
        "headline": _headline_of(Path(executed)),
        "notebook_sha256": notebook_hash(nb_path),
        "machine": {"cpu": info["cpu"], "logical_cpus": info["logical_cpus"], "threads": thread_count()},
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    runs = dict(sorted(runs.items()))
    path.write_text(json.dumps(runs, indent=1, ensure_ascii=False) + "\n")
    return runs


def runtime_note(notebook: str, path: str | os.PathLike | None = None) -> None:
    """Show, at run time, how long this notebook's last recorded full run took (from ``figures/runs.json``): a
    notebook cannot hard-code its own run time. ``notebook`` is its file stem.

    Args:
        notebook: the notebook's file stem.
        path: the runs file; None: ``figures/runs.json``.
    """
    from IPython.display import Markdown, display

    display(Markdown("**Run time.** " + runtime_text(notebook, load_runs(path))))


def render_runs(runs: dict | None = None) -> str:
    """The run-time block of ``docs/guides/running.md``: each notebook's last full-run time, the total and the
    machine.

    Args:
        runs: notebook stem -> run record (``ropelab.manifest.load_runs``' form); None: ``figures/runs.json``.
    """
    runs = load_runs() if runs is None else runs
    stems = [nb.stem for nb in notebooks()]
    recorded = {k: runs[k] for k in stems if k in runs}
    if not recorded:
        return "No full run is recorded yet in `figures/runs.json`."
    times = ", ".join(f"{k[:2]} {seconds_text(v['seconds'])}" for k, v in recorded.items())
    missing = [k[:2] for k in stems if k not in runs]
    total = sum(v["seconds"] for v in recorded.values())
    text = (f"Full-run times (`figures/runs.json`, written by `python -m ropelab.figures`): {times}; "
            f"{seconds_text(total)} in all, one notebook at a time, " + machines_text(recorded) + ".")
    if missing:
        text += " Not recorded yet: " + ", ".join(missing) + "."
    return text


def render_readme(runs: dict | None = None) -> str:
    """Deprecated: the old name of :func:`render_runs` (the run-time block moved from the README to
    ``docs/guides/running.md``).

    Args:
        runs: as in :func:`render_runs`.
    """
    warnings.warn("ropelab.figures.render_readme is now render_runs (the run-time block moved to "
                  "docs/guides/running.md); the old name is a deprecated alias.", DeprecationWarning, stacklevel=2)
    return render_runs(runs)


def render_notebook_table(runs: dict | None = None) -> str:
    """The README's notebook table, one line per notebook: its title and question as the map
    (``notebooks/index.ipynb``) gives them, and its headline from its last full run (``figures/runs.json``).

    Args:
        runs: notebook stem -> run record (``ropelab.manifest.load_runs``' form); None: ``figures/runs.json``.
    """
    runs = load_runs() if runs is None else runs
    asked = questions()
    lines = ["| notebook | its question | what its last full run found |", "|---|---|---|"]
    for nb in notebooks():
        title, question = asked.get(nb.name, (nb.stem, "not in the map"))
        headline = (runs.get(nb.stem) or {}).get("headline") or "no full run recorded"
        lines.append(f"| [{title}](notebooks/{nb.name}) | {question.replace('|', '/')} | "
                     f"{headline.replace('|', '/')} |")
    return "\n".join(lines)


def _block_with(text: str, block: str, begin: str, end: str, where: str) -> str:
    if begin not in text or end not in text:
        raise ValueError(f"{where} has no block between {begin!r} and {end!r}; add the two lines.")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "\n" + block + "\n" + end + tail


def _map_with(nb, text: str):
    import nbformat

    cells = [c for c in nb.cells if c.get("id") == MAP_CELL_ID]
    if not cells:
        cell = nbformat.v4.new_markdown_cell(text)
        cell.id = MAP_CELL_ID
        nb.cells.insert(2, cell)
    else:
        cells[0].source = text
    return nb


def _readme_with(text: str, block: str) -> str:
    """``text`` (the README) with its notebook table replaced by ``block``."""
    return _block_with(text, block, TABLE_BEGIN, TABLE_END, "README.md")


def _runs_page_with(text: str, block: str) -> str:
    """``text`` (``docs/guides/running.md``) with its run-time block replaced by ``block``."""
    return _block_with(text, block, RUNS_BEGIN, RUNS_END, "docs/guides/running.md")


def write_pages() -> None:
    """Re-render the map's generated cell, the README's notebook table and the run-time block of
    ``docs/guides/running.md`` from ``figures/runs.json`` (the runner does it at the end of a full run;
    ``python -m ropelab.figures --readme`` does it alone)."""
    import nbformat

    runs = load_runs()
    nb = nbformat.read(MAP, as_version=4)
    nbformat.write(_map_with(nb, render_map(runs)), MAP)
    README.write_text(_readme_with(README.read_text(), render_notebook_table(runs)))
    RUNS_PAGE.write_text(_runs_page_with(RUNS_PAGE.read_text(), render_runs(runs)))


def pages_in_step() -> list[str]:
    """What is out of step with ``figures/runs.json``, one line each (empty when nothing): the map's generated
    cell, the README's notebook table, the run-time block of ``docs/guides/running.md``, and a recorded run whose
    notebook changed since."""
    import nbformat

    runs, problems = load_runs(), []
    nb = nbformat.read(MAP, as_version=4)
    cell = next((c for c in nb.cells if c.get("id") == MAP_CELL_ID), None)
    if cell is None or cell.source != render_map(runs):
        problems.append(f"notebooks/index.ipynb: cell {MAP_CELL_ID!r} is not figures/runs.json's; run "
                        "python -m ropelab.figures --readme")
    for path, begin, render, stale in ((README, TABLE_BEGIN, render_notebook_table, "notebook table"),
                                       (RUNS_PAGE, RUNS_BEGIN, render_runs, "runs block")):
        text = path.read_text() if path.exists() else ""
        end = TABLE_END if begin == TABLE_BEGIN else RUNS_END
        if begin not in text or end not in text or _block_with(text, render(runs), begin, end, path.name) != text:
            problems.append(f"{path.relative_to(REPO).as_posix()}: the {stale} is not figures/runs.json's; run "
                            "python -m ropelab.figures --readme")
    for stem, r in runs.items():
        path = NOTEBOOK_DIR / f"{stem}.ipynb"
        if not path.exists():
            problems.append(f"figures/runs.json: {stem} has no notebook")
        elif notebook_hash(path) != r["notebook_sha256"]:
            problems.append(f"figures/runs.json: {stem} changed since its recorded run; "
                            f"python -m ropelab.figures --only {stem[:2]}")
    return problems


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

    Args:
        path: the notebook to run.
        smoke: tiny sizes (the notebook's ``SMOKE`` parameter), everything written under ``build/smoke/``.
        timeout: nbclient's per-cell timeout, in seconds.
        threads: the kernel's thread count; None: the environment's (``ROPELAB_THREADS``, else 2).
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


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.figures [--smoke] [--only NAME ...] [--jobs N]``; non-zero if a notebook failed.

    Args:
        argv: the command-line arguments (also ``--timeout``, ``--manifest``, ``--readme``, ``--nav``); None:
            ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(prog="python -m ropelab.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; write only under build/smoke/")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (name or prefix)")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run in parallel (default 1)")
    parser.add_argument("--timeout", type=int, default=3600, help="per-cell timeout in seconds")
    parser.add_argument(
        "--manifest", action="store_true", help="only rewrite figures/manifest.json for the committed figures"
    )
    parser.add_argument(
        "--readme", action="store_true",
        help="only re-render the map's cell, the README's notebook table and docs/guides/running.md's run block"
    )
    parser.add_argument("--nav", action="store_true", help="only rewrite the notebooks' Previous/Map/Next footers")
    args = parser.parse_args(argv)
    if args.readme:
        write_pages()
        print(f"rendered {MAP.relative_to(REPO)}, {README.relative_to(REPO)} and {RUNS_PAGE.relative_to(REPO)} "
              f"from {RUNS.relative_to(REPO)}")
        return 0
    paths = notebooks(args.only)
    if args.nav:
        changed = write_navigation(paths)
        print(f"rewrote the footer of {len(changed)} of {len(paths)} notebooks: {[p.name for p in changed]}")
        return 0
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
            nb_path = next(Path(p) for p, *_ in work if Path(p).stem == r["notebook"])
            write_manifest([nb_path])
            record_run(nb_path, r["seconds"], r["executed"])

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
    if not args.smoke and len(failed) < len(results):
        write_pages()  # the map, the README and the running guide show the times and headlines just recorded
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
