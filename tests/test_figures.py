"""The notebook runner and plot helpers: parameters are injected, sources untouched, output byte-stable."""

from __future__ import annotations

import hashlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402

from ropelab import figures  # noqa: E402


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_save_is_byte_stable(tmp_path):
    figures.setup()
    digests = []
    for run in range(2):
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [1, 0, 1])
        assert figures.save(fig, "probe", tmp_path / str(run)) is None  # a cell ending in save() prints nothing
        png, svg = tmp_path / str(run) / "probe.png", tmp_path / str(run) / "probe.svg"
        plt.close(fig)
        digests.append((_digest(png), _digest(svg)))
        assert b"Date" not in svg.read_bytes()
    assert digests[0] == digests[1]


def test_parameters_are_injected_after_the_tagged_cell(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# t"),
        nbformat.v4.new_code_cell('SMOKE = False\nFIGURES_DIR = "../figures"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    figures._inject_parameters(nb, True, tmp_path)
    assert nb.cells[2].metadata["tags"] == ["injected-parameters"]
    assert "SMOKE = True" in nb.cells[2].source and str(tmp_path) in nb.cells[2].source
    with pytest.raises(ValueError, match="tagged 'parameters'"):
        figures._inject_parameters(nbformat.v4.new_notebook(), True, tmp_path)


def test_unknown_notebook_name_is_reported():
    with pytest.raises(SystemExit, match="no notebook named"):
        figures.notebooks(["99_does_not_exist"])
    assert figures.notebooks() == sorted(figures.notebooks())


def test_runner_prints_progress_and_no_kernel_transport_warning(tmp_path, monkeypatch, capfd):
    """`make figures` names each notebook when it starts, then its time and the total so far; the kernels
    run on IPC sockets, so none logs "Kernel is running over TCP without encryption"."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    for name in ("01_one", "02_two"):
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell('SMOKE = False\nFIGURES_DIR = "x"\nRESULTS_DIR = "y"',
                                      metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell("from pathlib import Path\nassert SMOKE and Path(RESULTS_DIR).name == 'results'"),
        ])
        nbformat.write(nb, nb_dir / f"{name}.ipynb")
    monkeypatch.setattr(figures, "NOTEBOOK_DIR", nb_dir)
    monkeypatch.setattr(figures, "BUILD_DIR", tmp_path / "build")
    assert figures.main(["--smoke"]) == 0
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("01_one") and lines[0].endswith("started")
    done = [line for line in lines if " ok " in line]
    assert len(done) == 2 and "[1/2, " in done[0] and "[2/2, " in done[1] and "s so far]" in done[1]
    assert lines[-1].startswith("2 of 2 notebooks ran in")
    assert "without encryption" not in out + err
