"""Repository hygiene: licences, citation, the notebook map and links, the README as a front page and the links of
its guides, notebook stripping on save, and figures that are not stale."""

from __future__ import annotations

import json
import re
import subprocess

import nbformat
import pytest
import tomllib
import yaml

from ropelab import figures, manifest, nbclean

REPO = figures.REPO


def test_licence_and_citation_agree_with_pyproject():
    licence = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    text = (REPO / "LICENSE").read_text()
    assert licence == "MIT" and text.startswith("MIT License") and "the ropelab authors" in text
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == licence and cff["authors"] and cff["title"]
    assert cff["version"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_every_data_file_has_a_licence_in_data_readme():
    rows = [line for line in (REPO / "data" / "README.md").read_text().splitlines() if line.startswith("| `")]
    for path in sorted(p for p in (REPO / "data").rglob("*") if p.is_file() and p.name != "README.md"):
        rel = path.relative_to(REPO / "data").as_posix()
        row = next((r for r in rows if f"`{rel}`" in r), None)
        assert row is not None, f"data/{rel} is not described in data/README.md"
        assert re.search(r"MIT|PSF|[Ll]icen[cs]e", row), f"data/{rel}: its row in data/README.md names no licence"


def test_index_links_every_notebook_and_its_figure():
    index = nbformat.read(REPO / "notebooks" / "index.ipynb", as_version=4)
    text = "\n".join(c.source for c in index.cells)
    for nb in figures.notebooks():
        assert f"]({nb.name})" in text, f"notebooks/index.ipynb does not link {nb.name}"
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if not target.startswith("http"):
            assert (REPO / "notebooks" / target).resolve().exists(), f"index.ipynb links a missing {target}"
    assert all(c.cell_type == "markdown" for c in index.cells)


@pytest.mark.parametrize("path", figures.notebooks(), ids=lambda p: p.stem)
def test_notebook_has_how_to_run_and_links_that_resolve(path):
    nb = nbformat.read(path, as_version=4)
    assert "How to run" in nb.cells[1].source, "the cell after the title explains how to run the notebook"
    last = nb.cells[-1].source
    assert "index.ipynb" in last
    for target in re.findall(r"\]\(([^)#]+)\)", "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")):
        if not target.startswith("http"):
            assert (path.parent / target).resolve().exists(), f"{path.name} links a missing {target}"


def test_footers_chain_the_notebooks_in_the_runners_order():
    """Each notebook ends with one footer (the markdown cell tagged figures.NAV_TAG) linking its neighbours
    along figures.notebooks(); `python -m ropelab.figures --nav` writes them."""
    paths = figures.notebooks()
    for i, path in enumerate(paths):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        nav = [k for k, c in enumerate(cells) if figures.NAV_TAG in c.get("metadata", {}).get("tags", [])]
        assert nav == [len(cells) - 1] and cells[-1]["cell_type"] == "markdown", (
            f"{path.name}: exactly its last cell, a markdown cell, is tagged {figures.NAV_TAG!r}"
        )
        footer = "".join(cells[-1]["source"])
        assert footer == figures.navigation(path), f"{path.name}'s footer is stale: python -m ropelab.figures --nav"
        links = re.findall(r"\*\*(Previous|Next):\*\* \[[^\]]+\]\(([^)]+)\)", footer)
        want = ([("Previous", paths[i - 1].name)] if i else []) + (
            [("Next", paths[i + 1].name)] if i + 1 < len(paths) else []
        )
        assert links == want, path.name


def test_the_footer_is_not_part_of_the_notebook_hash(tmp_path):
    """Fixing a link must not make a notebook's figures stale; any other change must."""
    source = figures.notebooks()[0]
    nb = json.loads(source.read_text(encoding="utf-8"))
    copy = tmp_path / source.name
    copy.write_text(json.dumps(nb), encoding="utf-8")
    before = figures.notebook_hash(copy)
    assert before == figures.notebook_hash(source)
    nb["cells"][-1]["source"] = ["---\n", "\n", "**Map:** [all notebooks](index.ipynb) · **Next:** [x](x.ipynb)"]
    copy.write_text(json.dumps(nb), encoding="utf-8")
    assert figures.notebook_hash(copy) == before
    nb["cells"][-2]["source"] = ["changed"]
    copy.write_text(json.dumps(nb), encoding="utf-8")
    assert figures.notebook_hash(copy) != before


def test_navigation_refuses_a_path_that_is_not_a_notebook():
    with pytest.raises(ValueError, match="path must be one of the notebooks"):
        figures.navigation("notebooks/index.ipynb")


@pytest.mark.parametrize("path", figures.notebooks(), ids=lambda p: p.stem)
def test_exercises_have_hidden_solutions_and_asserts(path):
    nb = nbformat.read(path, as_version=4)
    solutions = [c for c in nb.cells if c.source.startswith("# Solution")]
    assert solutions and all(c.metadata.get("jupyter", {}).get("source_hidden") for c in solutions)
    checks = [c for c in nb.cells if c.get("id", "").startswith("lab-ex") and c.id.endswith("-check")]
    assert len(checks) == len(solutions) and all("assert " in c.source for c in checks)
    # A check prints its verdict (ropelab.figures.checked), never the answer it checked: the site shows its output.
    assert all("checked(" in c.source for c in checks), path.name


def test_pre_save_hook_strips_a_run_notebook_back_to_the_committed_bytes(tmp_path):
    committed = REPO / "notebooks" / "00_rope_in_one_page.ipynb"
    target = tmp_path / "notebooks" / committed.name
    target.parent.mkdir()
    target.write_bytes(committed.read_bytes())
    nb = nbformat.read(committed, as_version=4)
    # what JupyterLab sends after Run All: outputs, counts, execution metadata, its kernel name
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            c.execution_count = i
            c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x\n")]
            c.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    nb.metadata["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    nb.metadata["language_info"].update(version="3.11.7", mimetype="text/x-python", file_extension=".py")
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}

    class ContentsManager:  # the one method of jupyter_server's FileContentsManager the hook uses
        def _get_os_path(self, path):
            return str(tmp_path / path)

    model = {"type": "notebook", "content": json.loads(nbformat.writes(nb))}
    nbclean.pre_save_hook(model, path=f"notebooks/{committed.name}", contents_manager=ContentsManager())
    saved = nbformat.writes(nbformat.from_dict(model["content"])) + "\n"
    assert saved == committed.read_text(), "a save from the lab must leave the committed notebook unchanged"
    elsewhere = {"type": "notebook", "content": json.loads(nbformat.writes(nb))}
    nbclean.pre_save_hook(elsewhere, path="scratch/mine.ipynb")
    assert elsewhere["content"]["cells"][2]["outputs"], "notebooks outside notebooks/ keep their outputs"


def test_git_filter_strips_outputs_and_status_stays_clean(tmp_path):
    """A fresh repository with the project's .gitattributes and the filter from `make setup`: a notebook
    rewritten with outputs shows as unchanged, and what `git add` stores is the stripped notebook."""
    committed = REPO / "notebooks" / "00_rope_in_one_page.ipynb"
    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    run("init", "-q")
    run("config", "user.email", "t@example.org")
    run("config", "user.name", "t")
    nbclean.install_git_filter(tmp_path)
    (tmp_path / ".gitattributes").write_text((REPO / ".gitattributes").read_text())
    (tmp_path / "notebooks").mkdir()
    target = tmp_path / "notebooks" / committed.name
    target.write_bytes(committed.read_bytes())
    run("add", ".")
    run("commit", "-q", "-m", "init")
    nb = nbformat.read(target, as_version=4)
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    nb.cells[2].execution_count = 3
    nbformat.write(nb, target)
    assert "hello" in target.read_text()
    assert run("diff") == "", "git diff compares stripped notebooks"
    # git status flags the file until its index entry is refreshed (its stat changed); `git add` stores
    # the stripped notebook, which is the committed blob, so nothing is left to commit.
    run("add", ".")
    assert run("status", "--porcelain") == "", "outputs alone must not make a notebook modified"
    assert "hello" not in run("show", f":notebooks/{committed.name}")


def test_figures_are_not_stale():
    """figures/manifest.json records, for each committed figure, the hash of the notebook it came from
    (cells' type and source; outputs do not count). Editing a notebook without re-running it fails here:
    run `python -m ropelab.figures --only NN` (or `make figures`), which rewrites its figures and entries."""
    assert figures.MANIFEST.exists(), "figures/manifest.json is missing: python -m ropelab.figures --manifest"
    problems = figures.stale_figures()
    assert not problems, "stale figures:\n" + "\n".join(problems)


def test_notebook_hash_ignores_outputs_and_counts_but_not_sources(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1")])
    a = tmp_path / "01_a.ipynb"
    nbformat.write(nb, a)
    h = figures.notebook_hash(a)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[1].execution_count = 7
    nb.cells[1].metadata["tags"] = ["x"]
    nbformat.write(nb, a)
    assert figures.notebook_hash(a) == h
    # a stale figure is reported, and a rewritten manifest clears it
    fig_dir = tmp_path / "figures"
    fig_dir.mkdir()
    (fig_dir / "01_plot.png").write_bytes(b"png")
    monkeypatch.setattr(manifest, "REPO", tmp_path)
    monkeypatch.setattr(manifest, "FIGURES_DIR", fig_dir)
    monkeypatch.setattr(manifest, "MANIFEST", fig_dir / "manifest.json")
    assert any("not in manifest.json" in p for p in figures.stale_figures())
    figures.write_manifest([a])
    assert figures.stale_figures() == []
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, a)
    assert figures.notebook_hash(a) != h
    assert any("01_a.ipynb changed" in p for p in figures.stale_figures())


def test_make_lab_opens_the_map_at_the_root_with_the_hook_and_lab_args():
    """`make lab` is what tests/test_lab.py starts by hand: the repository root, the map as the start page,
    the pre-save hook (JUPYTER_CONFIG_PATH=.jupyter), and LAB_ARGS passed through."""
    out = subprocess.run(["make", "-n", "lab", "VENV=/nonexistent", 'LAB_ARGS=--no-browser --port=8899'],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert f'JUPYTER_CONFIG_PATH="{REPO}/.jupyter' in out
    assert f'--ServerApp.root_dir="{REPO}"' in out and "--LabApp.default_url=/lab/tree/notebooks/index.ipynb" in out
    assert "--no-browser --port=8899" in out
    assert (REPO / "notebooks" / "index.ipynb").exists()
    assert "pre_save_hook" in (REPO / ".jupyter" / "jupyter_server_config.py").read_text()


def test_no_notebook_writes_under_data_dir():
    """Notebooks read data/ (DATA_DIR) but write results only to RESULTS_DIR, which is build/results/ in the
    lab and data/ only in the runner's full run: a full run in JupyterLab must not rewrite data/."""
    writes = re.compile(r"\.write_text\(|\.write_bytes\(|json\.dump\(|torch\.save\(|open\([^)]*['\"]w")
    for path in figures.notebooks():
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "DATA_DIR" in cell.source and writes.search(cell.source):
                raise AssertionError(f"{path.name}, cell {cell.get('id')}: writes next to DATA_DIR; use RESULTS_DIR")


def _pages() -> list:
    """The front page and the guides (the site's pages that are not notebooks)."""
    return [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]


def _links(text: str) -> list[str]:
    """The targets of a Markdown page's links and images, outside code (fenced blocks and inline code)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_readme_is_a_front_page_under_150_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines; move detail to a page under docs/guides/"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_internal_link_of_the_readme_and_the_guides_resolves(page):
    """A relative link (on GitHub as on the site) must name a file that exists; a link to a page's anchor alone
    is not used, since GitHub and the site spell heading anchors differently."""
    targets = [t for t in _links(page.read_text()) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert targets or page.name != "README.md", "the README links no guide"
    for target in targets:
        path = target.split("#", 1)[0]
        assert path, f"{page.name} links the anchor {target!r}; link the page that holds it instead"
        assert (page.parent / path).resolve().exists(), f"{page.relative_to(REPO)} links a missing {target}"


def test_the_readme_links_every_guide():
    """Everything that left the README is one link away from it."""
    linked = {(REPO / t.split("#", 1)[0]).resolve() for t in _links((REPO / "README.md").read_text())}
    for guide in sorted((REPO / "docs" / "guides").glob("*.md")):
        assert guide.resolve() in linked, f"README.md does not link {guide.relative_to(REPO)}"
