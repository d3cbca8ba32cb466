"""Every notebook runs top to bottom in smoke mode, and every notebook is committed stripped."""

from __future__ import annotations

import json

import pytest

from ropelab import figures

NOTEBOOKS = figures.notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stripped_and_parametrised(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for c in code:
        assert not c.get("outputs") and c.get("execution_count") is None, "strip outputs (nbstripout)"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    src = "".join(tagged[0]["source"])
    # Defaults for a run in JupyterLab: under build/, never the committed figures/ or data/ (the runner
    # overrides all three).
    for line in ("SMOKE = False", 'FIGURES_DIR = "../build/figures"', 'RESULTS_DIR = "../build/results"'):
        assert line in src, f"the parameters cell must set {line}"


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path):
    result = figures.run_notebook(path, smoke=True, timeout=600)
    assert result["seconds"] < 600
    assert str(figures.BUILD_DIR / "smoke") in result["executed"]
