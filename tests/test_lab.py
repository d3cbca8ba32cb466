"""A real browser in a real JupyterLab: the notebooks run, render, respond, and leave the repository clean.

Starts JupyterLab on 127.0.0.1 (a free port, its own config, data, runtime and settings directories) on a
temporary copy of the notebooks, the lab config (``.jupyter/``) and the figures their Markdown shows, and
drives Debian's Chromium (``/usr/bin/chromium``) with Playwright, whose own browser download cannot run
here. For notebook 00 (full run) and notebook 03 (full run, about 6 s on 2 idle cores), it runs all
cells, waits for the kernel to go idle, asserts no cell raised and at least one figure rendered, moves a
control of the notebook's explorer and waits for its figure to change, saves a screenshot under
``build/lab/``, and saves the notebook: the pre-save hook must write back the original bytes. Last, the
repository's ``git status --porcelain`` must be what it was before the test (clean in CI).

Skipped when Chromium or Playwright is missing, unless ``ROPELAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``,
which installs Chromium with apt first), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from _browser import REQUIRED, chromium, jupyterlab, missing

from ropelab import figures

REPO = figures.REPO
SHOTS = REPO / "build" / "lab"

_missing = missing()
pytestmark = [
    pytest.mark.skipif(_missing is not None, reason=_missing or ""),
    pytest.mark.timeout(1200),
    pytest.mark.lab,
]


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "repo"
    shutil.copytree(REPO / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(REPO / ".jupyter", root / ".jupyter")
    shutil.copytree(REPO / "figures", root / "figures", ignore=shutil.ignore_patterns("*.svg"))
    shutil.copy(REPO / "README.md", root / "README.md")
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')  # no "get notified about Jupyter news?" toast over the screenshots
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "JUPYTER_CONFIG_PATH": str(root / ".jupyter"),  # what `make lab` sets: the pre-save hook
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    with jupyterlab(root, tmp, env) as server:
        yield {**server, "root": root, "figures": _snapshot(root / "figures")}


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


STATE_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  if (!w || !w.content || !w.content.widgets || !w.sessionContext.session) return null;
  const kernel = w.sessionContext.session.kernel;
  const cells = w.content.widgets.map(c => c.model.toJSON());
  const code = cells.filter(c => c.cell_type === 'code');
  return {
    kernel: kernel ? kernel.status : null,
    ran: code.filter(c => c.execution_count !== null).length,
    code: code.length,
    errors: code.flatMap(c => c.outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue)),
    dirty: w.context.model.dirty,
  };
}"""


def _wait(page, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = page.evaluate(STATE_JS)
        if state is not None and predicate(state):
            return state
        page.wait_for_timeout(500)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last state {state}")


def _run_notebook(page, lab, name: str, timeout: float) -> dict:
    page.goto(f"{lab['url']}/lab/tree/notebooks/{name}?reset&token={lab['token']}")  # reset: only this tab
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget", timeout=120_000)
    _wait(page, lambda s: s["kernel"] == "idle", 180, "the kernel to start")
    t0 = time.monotonic()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    state = _wait(page, lambda s: (s["ran"] == s["code"] or s["errors"]) and s["kernel"] == "idle", timeout,
                  "Run All to finish")
    state["seconds"] = round(time.monotonic() - t0, 1)
    return state


def _explorer_image(page):
    img = page.locator(".ropelab-explorer-image").first
    img.scroll_into_view_if_needed()
    return img


@pytest.mark.parametrize(
    "name, move",
    [
        ("00_rope_in_one_page.ipynb", "slider"),  # the position slider, moved with the keyboard
        ("03_decay_rope_vs_cope.ipynb", "select"),  # the head_dim drop-down
    ],
)
def test_notebook_runs_renders_and_responds_in_the_lab(lab, browser, name, move):
    before = _git_status()
    original = (lab["root"] / "notebooks" / name).read_bytes()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        state = _run_notebook(page, lab, name, timeout=600)
        assert not state["errors"], f"{name}: cells raised {state['errors']}"
        assert state["ran"] == state["code"]
        n_figures = page.locator(".jp-OutputArea-output img").count()
        assert n_figures >= 1, f"{name}: no rendered figure"

        img = _explorer_image(page)
        img.wait_for(state="visible", timeout=60_000)
        src = img.get_attribute("src")
        box = page.locator(".ropelab-explorer").first
        t0 = time.monotonic()
        if move == "slider":
            handle = box.locator(".noUi-handle").nth(1)  # base, then position
            handle.focus()
            for _ in range(5):
                page.keyboard.press("ArrowRight")
        else:
            box.locator("select").first.select_option("64")
        page.wait_for_function(
            "([sel, old]) => document.querySelector(sel).getAttribute('src') !== old",
            arg=[".ropelab-explorer-image", src], timeout=30_000,
        )
        response = time.monotonic() - t0
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / f"{Path(name).stem}.png"
        box.scroll_into_view_if_needed()
        page.screenshot(path=str(shot))
        print(f"{name}: Run All {state['seconds']} s, {n_figures} figures, explorer redrawn {response:.2f} s "
              f"after the move; screenshot {shot}")

        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        _wait(page, lambda s: not s["dirty"], 60, "the save")
        saved = (lab["root"] / "notebooks" / name).read_bytes()
        assert saved == original, f"{name}: a save from the lab changed the notebook (outputs or metadata)"
    finally:
        page.close()
    assert _snapshot(lab["root"] / "figures") == lab["figures"], "a lab run wrote into figures/"
    assert (lab["root"] / "build" / "figures").is_dir(), "a lab run writes its figures under build/"
    after = _git_status()
    assert after == before, f"running a notebook in the lab changed the repository:\n{after}"
    if REQUIRED:  # CI: a fresh checkout, so clean means clean
        assert after == "", f"git status is not clean:\n{after}"


def test_start_page_shows_the_map(lab, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab['url']}/lab/tree/notebooks/index.ipynb?reset&token={lab['token']}")
        page.wait_for_selector(".jp-RenderedMarkdown img[alt='00_relative_position']", timeout=120_000)
        page.wait_for_timeout(1000)
        links = page.locator(".jp-RenderedMarkdown a[href*='00_rope_in_one_page.ipynb']").count()
        assert links >= 1
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "index.png"))
        original = (lab["root"] / "notebooks" / "index.ipynb").read_bytes()
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        _wait(page, lambda s: not s["dirty"], 60, "the save")
        assert (lab["root"] / "notebooks" / "index.ipynb").read_bytes() == original
    finally:
        page.close()
