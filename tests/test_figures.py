"""The notebook runner and plot helpers: parameters are injected, sources untouched, output byte-stable."""

from __future__ import annotations

import hashlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402

from ropelab import figures, manifest  # noqa: E402


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
    monkeypatch.setattr(manifest, "NOTEBOOK_DIR", nb_dir)  # notebooks() reads it there
    monkeypatch.setattr(figures, "BUILD_DIR", tmp_path / "build")
    assert figures.main(["--smoke"]) == 0
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("01_one") and lines[0].endswith("started")
    done = [line for line in lines if " ok " in line]
    assert len(done) == 2 and "[1/2, " in done[0] and "[2/2, " in done[1] and "s so far]" in done[1]
    assert lines[-1].startswith("2 of 2 notebooks ran in")
    assert "without encryption" not in out + err


def test_headline_is_recorded_with_the_time_and_rendered_into_the_map_and_readme(tmp_path, monkeypatch):
    """A full run's record (figures/runs.json) holds each notebook's seconds, machine and the text of its
    headline() call; the map, the README's notebook table and the running guide's run block render from it, and
    pages_in_step names what is out of step."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    src = nb_dir / "01_one.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), src)
    executed = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("headline(...)")])
    executed.cells[0].outputs = [nbformat.v4.new_output(
        "display_data", data={"text/markdown": "**In one line.** 2 | 3"}, metadata={"ropelab": {"headline": "2 | 3"}})]
    nbformat.write(executed, tmp_path / "run.ipynb")
    index = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# map"), nbformat.v4.new_markdown_cell(
        "## [01 · One](01_one.ipynb)\n\n**Does one\nwork?** More text.")])
    nbformat.write(index, nb_dir / "index.ipynb")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{figures.TABLE_BEGIN}\nold\n{figures.TABLE_END}\nrest\n")
    guide = tmp_path / "running.md"
    guide.write_text(f"# run\n{figures.RUNS_BEGIN}\nold\n{figures.RUNS_END}\nend\n")
    runs = tmp_path / "runs.json"
    for name, value in (("NOTEBOOK_DIR", nb_dir), ("RUNS", runs), ("MAP", nb_dir / "index.ipynb"), ("README", readme),
                        ("RUNS_PAGE", guide), ("REPO", tmp_path)):
        monkeypatch.setattr(figures, name, value)
        if hasattr(manifest, name):
            monkeypatch.setattr(manifest, name, value)
    assert "not recorded" in figures.render_map({})
    assert "| [01 · One](notebooks/01_one.ipynb) | Does one work? | no full run recorded |" in \
        figures.render_notebook_table({})
    record = figures.record_run(src, 123.4, tmp_path / "run.ipynb")["01_one"]
    assert record["seconds"] == 123.4 and record["headline"] == "2 | 3"
    assert record["notebook_sha256"] == figures.notebook_hash(src) and record["machine"]["logical_cpus"] >= 1
    assert len(figures.pages_in_step()) == 3  # the map, the README and the running guide are not rendered yet
    figures.write_pages()
    assert figures.pages_in_step() == []
    page = "\n".join(c.source for c in nbformat.read(nb_dir / "index.ipynb", as_version=4).cells)
    assert "| [01](01_one.ipynb) | 123 s (2.1 min) | 2 / 3 |" in page and "shared with other jobs" in page
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert "| [01 · One](notebooks/01_one.ipynb) | Does one work? | 2 / 3 |" in text
    text = guide.read_text()
    assert text.startswith("# run\n") and text.endswith("end\n") and "01 123 s (2.1 min)" in text
    assert "old" not in text
    with pytest.warns(DeprecationWarning, match="render_runs"):
        assert figures.render_readme() == figures.render_runs()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2")]), src)
    assert any("changed since its recorded run" in p for p in figures.pages_in_step())


def test_readme_block_must_exist():
    with pytest.raises(ValueError, match="README.md has no block.*notebooks:begin"):
        figures._readme_with("no block\n", "x")
    with pytest.raises(ValueError, match="running.md has no block.*runs:begin"):
        figures._runs_page_with("no block\n", "x")


def test_committed_map_and_readme_are_in_step_with_the_recorded_runs():
    """The map's run cell, the README's notebook table and the running guide's run block are renders of
    figures/runs.json (and the map's questions), so none can quote a time or a headline that no run produced."""
    problems = [p for p in figures.pages_in_step() if "changed since" not in p]
    assert problems == []
