"""What a user installs: the wheel, in a fresh venv outside the repository, works with the core dependencies only
(``import ropelab``, ``ropelab-diagnose``, ``models.train`` with its progress bar); and every notebook runs in smoke
mode in a venv that holds only the core dependencies and the ``notebooks`` extra (the README's instruction for
students, ``pip install -e ".[notebooks]"``).

Slow: one venv per session, built once even under ``pytest -n 2`` (the first worker builds it under a lock, the
other reuses it): torch from ``TORCH_SPEC`` (default ``torch==2.13.0``, the Makefile's CPU build), then the wheel
with its core dependencies, the core checks, then the ``notebooks`` extra. Marked ``packaging``
(``-m "not packaging"`` leaves them out of a quick local run; CI runs them).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(3600)]

# Run from a folder outside the repository, with a tiny module of callables for the command line.
PROBE_MODULE = """
from ropelab import apply_rope
from ropelab.diagnosis import zoo

good = lambda x: apply_rope(x, layout="b s h d")
heads_axis = zoo.esm_old()  # rotates along the heads: the bug the command must name
"""

TRAIN = """
import torch
from ropelab.models import ModelConfig, TinyLM, train

model = TinyLM(ModelConfig(vocab_size=8, d_model=16, n_heads=2, n_layers=1))
sample = lambda gen: (torch.randint(0, 8, (2, 8), generator=gen),) * 2 + (None,)
history = train(model, sample, steps=3, warmup=1, log_every=1)  # progress=True by default: tqdm
print("trained:", history[-1])
"""

# Packages that only the extras install (torch itself needs sympy, jinja2, networkx, fsspec, filelock).
NOT_CORE = ("seaborn", "einops", "transformers", "diffusers", "IPython", "ipywidgets", "pandas", "nbclient")
IMPORTABLE = f"import importlib.util as u; print([m for m in {NOT_CORE!r} if u.find_spec(m)])"


def _env(venv: Path, **extra: str) -> dict[str, str]:
    """The venv first on PATH, nothing of this test run's Python (no PYTHONPATH, no venv of its own)."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "PIP_CONFIG_FILE") or
            k.startswith("PIP_")}
    return {**keep, "PATH": f"{venv / 'bin'}:/usr/bin:/bin", **extra}


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 1800) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return {"cmd": cmd, "rc": r.returncode, "stdout": r.stdout[-6000:], "stderr": r.stderr[-6000:],
            "seconds": round(time.perf_counter() - t0, 1)}


def _check(step: dict) -> dict:
    assert step["rc"] == 0, f"{' '.join(step['cmd'])} exited {step['rc']}:\n{step['stdout']}\n{step['stderr']}"
    return step


def _build(root: Path) -> dict:
    """Build the wheel from a copy of the sources, install it with core dependencies only, probe it from a folder
    outside the repository, then add the notebooks extra. Returns what each step printed, and its seconds."""
    src, wheels, outside, venv = root / "src", root / "wheels", root / "outside", root / "venv"
    for d in (src, wheels, outside):
        d.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "ropelab", src / "ropelab", ignore=shutil.ignore_patterns("__pycache__"))
    (outside / "probe_rope.py").write_text(PROBE_MODULE)
    env, py = _env(venv), str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "--disable-pip-version-check", "-q"]
    steps = {"venv": _check(_run([sys.executable, "-m", "venv", str(venv)], root, env))}
    steps["torch"] = _check(_run([*pip, "install", TORCH_SPEC], root, env))
    steps["wheel"] = _check(_run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(src)], root, env))
    (wheel,) = wheels.glob("ropelab-*.whl")
    steps["install core"] = _check(_run([*pip, "install", str(wheel)], root, env))
    core = {
        "import": _run([py, "-c", "import ropelab; print(ropelab.__file__)"], outside, env),
        "not core": _run([py, "-c", IMPORTABLE], outside, env),
        "diagnose good": _run(["ropelab-diagnose", "probe_rope:good", "--layout", "b s h d", "--sizes", "h=2,d=16",
                               "--max-position", "64"], outside, env),
        "diagnose heads_axis": _run(["ropelab-diagnose", "probe_rope:heads_axis", "--layout", "b s h d",
                                     "--max-position", "64"], outside, env),
        "train": _run([py, "-c", TRAIN], outside, env),
    }
    steps["install notebooks"] = _check(_run([*pip, "install", f"{wheel}[notebooks]"], root, env))
    return {"root": str(root), "venv": str(venv), "wheel": wheel.name, "steps": steps, "core": core}


@pytest.fixture(scope="session")
def user_venv(tmp_path_factory) -> dict:
    """The venv (built once per session, shared by xdist workers through a lock) and the core checks' outputs."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: workers' basetemps share it
    root, done = shared / "user-venv", shared / "user-venv.json"
    with open(shared / "user-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            done.write_text(json.dumps(_build(root), indent=1))
    info = json.loads(done.read_text())
    print("venv build, seconds per step:", {k: s["seconds"] for k, s in info["steps"].items()})
    return info


def test_the_wheel_works_outside_the_repository_with_core_dependencies_only(user_venv):
    core, venv = user_venv["core"], user_venv["venv"]
    path = _check(core["import"])["stdout"].strip()
    assert path.startswith(venv) and "site-packages" in path, f"imported {path}, not the installed wheel"
    assert _check(core["not core"])["stdout"].strip() == "[]", "a core install pulled in an extra's package"
    good = core["diagnose good"]
    assert good["rc"] == 0 and "OK: a correct RoPE" in good["stdout"], good
    bad = core["diagnose heads_axis"]
    assert bad["rc"] == 1 and "rotates along axis h" in bad["stdout"], bad
    assert "trained:" in _check(core["train"])["stdout"]


def test_every_notebook_runs_in_smoke_mode_with_only_the_notebooks_extra(user_venv, tmp_path):
    """The checkout's ropelab (as ``pip install -e``) on the venv's packages: the core dependencies and the
    notebooks extra, nothing of dev (pytest, hypothesis, triton). Notebook 06 prints why its Triton cell cannot
    run without triton, as it tells a student."""
    venv = Path(user_venv["venv"])
    py = str(venv / "bin" / "python")
    # Jupyter's data dir (kernelspecs, and the kernels' IPC sockets) of its own, at a path short enough for a socket
    jupyter = Path(tempfile.mkdtemp(prefix="ropelab-jupyter-"))
    env = _env(venv, PYTHONPATH=str(REPO), ROPELAB_BUILD=str(tmp_path / "build"), JUPYTER_DATA_DIR=str(jupyter),
               ROPELAB_THREADS="1")
    probe = _check(_run([py, "-c", "import importlib.util as u; print([m for m in ('pytest', 'hypothesis', "
                                   "'triton', 'ropelab') if u.find_spec(m)])"], tmp_path, env))
    assert probe["stdout"].strip() == "['ropelab']", probe
    try:
        run = _run([py, "-m", "ropelab.figures", "--smoke", "--jobs", "2", "--timeout", "600"], REPO, env, timeout=3000)
    finally:
        shutil.rmtree(jupyter, ignore_errors=True)
    print(run["stdout"][-3000:])
    assert run["rc"] == 0, f"a notebook failed with only the notebooks extra:\n{run['stdout']}\n{run['stderr']}"
    n = len(list((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    assert f"{n} of {n} notebooks ran" in run["stdout"]
