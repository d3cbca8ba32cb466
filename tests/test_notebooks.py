"""Every notebook runs top to bottom in smoke mode under 1 and under 2 threads and keeps its asserted claims under
both (the site test builds its pages from these runs), and every notebook is committed stripped."""

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


def _outputs(executed) -> list[str]:
    """What each code cell printed to stdout, one string per cell that printed. Joined per cell, since the kernel
    may deliver one cell's prints in one stream message or several depending on timing; stderr is left out (it
    carries library warnings, not claims)."""
    nb = json.loads(open(executed).read())
    per_cell = ["".join("".join(o.get("text", "")) for o in c.get("outputs", [])
                        if o.get("output_type") == "stream" and o.get("name") == "stdout")
                for c in nb["cells"] if c["cell_type"] == "code"]
    return [text for text in per_cell if text]


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_claims_hold_under_one_and_two_threads(path):
    # Float results change in the last bits with the thread count (reductions split differently); every
    # claim a notebook asserts must survive that. Each run fails on the first assertion that does not hold.
    printed = {}
    for threads in (1, 2):
        result = figures.run_notebook(path, smoke=True, timeout=600, threads=threads)  # a cell past 600 s fails
        assert result["notebook"] == path.stem and str(figures.BUILD_DIR / "smoke") in result["executed"]
        printed[threads] = _outputs(result["executed"])
        assert any(printed[threads]), "the executed notebook printed nothing"
    # The same cells ran and printed in both runs (the numbers may differ in their last digits).
    assert len(printed[1]) == len(printed[2])


def test_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("ROPELAB_THREADS", raising=False)
    assert figures.thread_count() == figures.THREADS
    monkeypatch.setenv("ROPELAB_THREADS", "1")
    assert figures.thread_count() == 1
    monkeypatch.setenv("ROPELAB_THREADS", "two")
    with pytest.raises(ValueError, match="ROPELAB_THREADS"):
        figures.thread_count()
