"""The built site (``make site``, ``ropelab.site``) in a real browser: every page loads with no console error and no
request leaving the site, math renders, every internal link and image resolves, search finds ``rotate_half``, and
every notebook page links to the previous and next notebook.

For speed the site is built from smoke-mode runs (``python -m ropelab.site --smoke``; ``ROPELAB_SITE=full`` tests
the full run's site instead): the executed copies that ``tests/test_notebooks.py`` and ``tests/test_packaging.py``
leave under ``build/smoke/`` are reused when they ran the current sources, and only the notebooks with none are
executed here. It is served with ``http.server`` on a free port and crawled from ``index.html`` with Playwright
driving Debian's Chromium, as ``tests/test_lab.py`` does.

Skipped when Chromium or Playwright is missing, unless ``ROPELAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``), where a
missing browser is a failure.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from _browser import chromium, missing

from ropelab import manifest

try:
    import myst_nb  # noqa: F401  (the site extra)
    import sphinx  # noqa: F401
except ImportError:
    myst_nb = None

_missing = missing("sphinx or myst-nb is not installed (pip install -e '.[site]')" if myst_nb is None else None)
# The browser tests; the staging tests at the end need neither a browser nor Sphinx.
browser_test = [pytest.mark.skipif(_missing is not None, reason=_missing or ""), pytest.mark.timeout(1800),
                pytest.mark.lab]


def in_browser(f):
    for mark in browser_test:
        f = mark(f)
    return f

NOTEBOOKS = [p.stem for p in manifest.notebooks()]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would drown the test's output
        pass


# ROPELAB_SITE=full tests the real site instead, built from the full run's executed notebooks (make figures).
SMOKE = os.environ.get("ROPELAB_SITE", "smoke") != "full"


@pytest.fixture(scope="module")
def built():
    from ropelab import site

    t0 = time.perf_counter()
    result = site.build(smoke=SMOKE, run_missing=SMOKE)
    result["test_build_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"site: {result['pages']} pages, {result['bytes'] / 1e6:.1f} MB, built in {result['test_build_seconds']} s "
          f"(executing missing notebooks included), {len(result['warnings'])} Sphinx warnings")
    return result


@pytest.fixture(scope="module")
def served(built):
    handler = functools.partial(_Quiet, directory=str(built["out"]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _page(browser, base: str):
    """A page that records console errors, uncaught exceptions, failed requests and any request off the site
    (aborted: the site must read offline, MathJax included)."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.problems = []
    page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: page.problems.append(f"exception: {e}"))
    # A request cut off by the next navigation (a font MathJax was still fetching) fails as net::ERR_ABORTED; a
    # missing file is an HTTP 404 response, caught below.
    page.on("requestfailed", lambda r: "ERR_ABORTED" not in (r.failure or "")
            and page.problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and page.problems.append(f"HTTP {r.status}: {r.url}"))

    def route(r):
        if r.request.url.startswith(base) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            page.problems.append(f"off-site request: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    return page


LINKS_JS = """() => ({
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  images: [...document.querySelectorAll('img')].map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0})),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  banner: [...document.querySelectorAll('.ropelab-banner a')].map(a => a.href),
  bannerText: [...document.querySelectorAll('.ropelab-banner')].map(b => b.innerText).join(' '),
})"""


@pytest.fixture(scope="module")
def crawl(served, browser):
    """Every internal page reachable from index.html, visited once: its problems, links, images and ids."""
    t0 = time.perf_counter()
    page = _page(browser, served)
    seen, queue, pages = set(), [f"{served}/index.html"], {}
    try:
        while queue:
            url = queue.pop(0)
            if url in seen:
                continue
            seen.add(url)
            page.problems = []
            page.goto(url, wait_until="load")
            found = page.evaluate(LINKS_JS)
            pages[url] = {**found, "problems": list(page.problems)}
            for link in found["links"]:
                target = urllib.parse.urldefrag(link).url
                if target.startswith(served) and target.endswith(".html") and target not in seen:
                    queue.append(target)
    finally:
        page.close()
    print(f"crawled {len(pages)} pages in {time.perf_counter() - t0:.1f} s")
    return pages


@in_browser
def test_every_notebook_is_a_page_with_outputs_and_figures(built, crawl, served):
    for stem in NOTEBOOKS:
        url = f"{served}/notebooks/{stem}.html"
        assert url in crawl, f"{stem}: no page reachable from the front page"
        figures = [i for i in crawl[url]["images"] if "/_images/" in i["src"]]
        assert figures, f"{stem}: its page shows no figure"
    html = (Path(built["out"]) / "notebooks" / f"{NOTEBOOKS[0]}.html").read_text()
    assert "cell_output" in html, "the notebook page has no cell outputs"


@in_browser
def test_every_page_loads_without_a_console_error_or_an_off_site_request(crawl):
    problems = {url: p["problems"] for url, p in crawl.items() if p["problems"]}
    assert not problems, problems


@in_browser
def test_every_internal_link_and_image_resolves(crawl, served):
    broken, status = [], {}
    for url, p in crawl.items():
        broken += [f"{url}: image {i['src']} did not load" for i in p["images"] if not i["ok"]]
        for link in p["links"]:
            target, fragment = urllib.parse.urldefrag(link)
            if not target.startswith(served):
                continue
            if target not in status:
                if target in crawl:
                    status[target] = 200
                else:
                    try:
                        with urllib.request.urlopen(target, timeout=10) as r:
                            status[target] = r.status
                    except OSError as e:
                        status[target] = str(e)
            if status[target] != 200:
                broken.append(f"{url}: link {link} -> {status[target]}")
            elif fragment and target in crawl and urllib.parse.unquote(fragment) not in crawl[target]["ids"]:
                broken.append(f"{url}: link {link}: no element with id {fragment!r} on {target}")
    assert not broken, "\n".join(broken[:40])


@in_browser
def test_math_renders(browser, served):
    page = _page(browser, served)
    try:
        page.goto(f"{served}/notebooks/{NOTEBOOKS[0]}.html", wait_until="load")
        page.wait_for_selector("mjx-container", timeout=30_000)  # MathJax's output element
        n = page.locator("mjx-container").count()
        assert n >= 5, f"only {n} typeset formulas on {NOTEBOOKS[0]}"
        page.wait_for_timeout(500)  # the fonts MathJax fetches after typesetting
        assert not page.problems, page.problems
    finally:
        page.close()


@in_browser
def test_search_finds_rotate_half(browser, served):
    page = _page(browser, served)
    try:
        page.goto(f"{served}/search.html?q=rotate_half", wait_until="load")
        page.wait_for_selector("#search-results ul.search li a", timeout=30_000)
        hits = page.locator("#search-results ul.search li a").evaluate_all("els => els.map(e => e.href)")
        assert any("01_rotate_half_vs_interleaved" in h for h in hits), hits
        assert not page.problems, page.problems
    finally:
        page.close()


@in_browser
def test_every_notebook_page_links_to_the_previous_and_next_notebook(crawl, served):
    for i, stem in enumerate(NOTEBOOKS):
        url = f"{served}/notebooks/{stem}.html"
        links = crawl[url]["banner"]  # the banner's own links (the sidebar lists every notebook anyway)
        want = ([NOTEBOOKS[i - 1]] if i > 0 else []) + ([NOTEBOOKS[i + 1]] if i + 1 < len(NOTEBOOKS) else [])
        for other in want:
            assert f"{served}/notebooks/{other}.html" in links, f"{stem}: no link to {other}"
        text = crawl[url]["bannerText"]
        assert "make lab" in text and f"notebooks/{stem}.ipynb" in text, f"{stem}: no run-it-locally banner: {text!r}"


# Resolves after two animation frames: the explorers redraw on the next one after a change.
FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
# Move one control as a reader would: a slider to its other end, a menu to its next entry, a text field gets a word.
MOVE = """c => {
  if (c.type === "range") c.value = c.value === c.max ? c.min : c.max;
  else if (c.tagName === "SELECT") c.selectedIndex = (c.selectedIndex + 1) % c.options.length;
  else c.value = c.value + " and one more, 42.";
  c.dispatchEvent(new Event("input", {bubbles: true}));
  c.dispatchEvent(new Event("change", {bubbles: true}));
}"""


@in_browser
def test_every_explorer_responds_on_its_notebook_page_with_no_kernel(browser, served):
    # The notebooks whose explorer has a browser twin (ropelab.site.EXPLORER_TWINS); on each page, every twin's
    # sliders move, and its printed number and its figure change. No kernel: the site is static files.
    from ropelab import site

    pages = [stem for stem in NOTEBOOKS
             if any(name in json.dumps(_source(stem)) for name in site.EXPLORER_TWINS)]
    assert len(pages) >= 5, pages
    for stem in pages:
        page = _page(browser, served)
        try:
            page.goto(f"{served}/notebooks/{stem}.html", wait_until="load")
            roots = page.locator(".ropelab-webexplorer")
            assert roots.count() >= 1, f"{stem}: no browser explorer on its page"
            for i in range(roots.count()):
                root = roots.nth(i)
                root.locator(".ropelab-readout").wait_for(timeout=30_000)
                page.evaluate(FRAMES)  # the first draw happens on the next animation frame
                state = "r => [r.querySelector('.ropelab-readout').textContent, r.querySelector('.ropelab-figure')" \
                        ".innerHTML + [...r.querySelectorAll('canvas')].map(c => c.toDataURL()).join()]"
                # Some controls move only the figure (CoPE's sharpness leaves its count); one must move both.
                controls, moved = root.locator(".ropelab-controls input, .ropelab-controls select"), []
                for j in range(controls.count()):
                    before = root.evaluate(state)
                    controls.nth(j).evaluate(MOVE)
                    page.evaluate(FRAMES)  # the redraw too: wait for it, not for a fixed time
                    after = root.evaluate(state)
                    moved.append((after[0] != before[0], after[1] != before[1]))
                assert moved, f"{stem}, explorer {i}: no control"
                assert any(number and figure for number, figure in moved), \
                    f"{stem}, explorer {i}: no control changed both the printed number and the figure: {moved}"
            assert not page.problems, page.problems
        finally:
            page.close()


# --------------------------------------------------------------------------------------------------
# Staging, without a browser: what the builder makes of an executed notebook
# --------------------------------------------------------------------------------------------------


def _source(stem: str) -> dict:
    return json.loads((manifest.NOTEBOOK_DIR / f"{stem}.ipynb").read_text())


def test_a_missing_or_stale_run_names_the_make_target(monkeypatch, tmp_path):
    from ropelab import site

    monkeypatch.setattr(site, "BUILD_DIR", tmp_path)
    with pytest.raises(SystemExit, match="make figures-smoke"):
        site.executed_notebooks(smoke=True)
    with pytest.raises(SystemExit, match=r"`make figures`"):
        site.executed_notebooks(smoke=False)
    # A copy of the current source counts (outputs do not enter the hash); one with a changed cell does not.
    src = manifest.notebooks()[0]
    nb = _source(src.stem)
    want = manifest.notebook_hash(src)
    (tmp_path / src.name).write_text(json.dumps(nb))
    assert site._read_executed(tmp_path / src.name, want) is not None
    nb["cells"][1]["source"] = "changed"
    (tmp_path / src.name).write_text(json.dumps(nb))
    assert site._read_executed(tmp_path / src.name, want) is None


def test_a_staged_notebook_gets_its_banner_figures_and_links(tmp_path):
    from ropelab import site

    src = manifest.notebooks()[0]
    before = src.read_bytes()
    nb = _source(src.stem)
    saving = next(c for c in nb["cells"] if c["cell_type"] == "code" and '"00_pair_rotation"' in "".join(c["source"]))
    explorer = next(c for c in nb["cells"] if "explorers.LadderExplorer()" in "".join(c["source"]))
    explorer["outputs"] = [{"output_type": "display_data", "metadata": {},
                            "data": {site.WIDGET_MIME: {"model_id": "x"}, "text/plain": "VBox(...)"}}]
    images = set()
    page = site.stage_notebook(src, nb, manifest.FIGURES_DIR, smoke=True, images=images)
    assert src.read_bytes() == before, "staging wrote into notebooks/"
    cells = page["cells"]
    assert "".join(cells[0]["source"]).startswith("# ") and "\n" not in "".join(cells[0]["source"]).strip()
    banner = "".join(cells[1]["source"])
    assert site.BANNER_CLASS in banner and "make lab" in banner and f"notebooks/{src.name}" in banner
    assert "smoke run" in banner and f"({manifest.notebooks()[1].name})" in banner and "(../index.md)" in banner
    staged = next(c for c in cells if c.get("id") == saving.get("id"))
    assert any("image/png" in o.get("data", {}) for o in staged["outputs"]), "the saved figure is not shown"
    outputs = next(c for c in cells if c.get("id") == explorer.get("id"))["outputs"]
    assert not any(site.WIDGET_MIME in o.get("data", {}) for o in outputs), "a widget output is left for no kernel"
    assert "widgets" not in page["metadata"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "](index.ipynb)" not in text and "](../README.md)" not in text and "](../readme.md)" in text
    assert "figures/00_explore_ladder.png" in images


@pytest.mark.parametrize("target, want", [
    ("01_rotate_half_vs_interleaved.ipynb", "[x](01_rotate_half_vs_interleaved.ipynb)"),
    ("index.ipynb#the-map", "[x](../index.md#the-map)"),
    ("../ropelab/core.py", "[x](../api/ropelab.core.md)"),
    ("../docs/guides/diagnose.md", "[x](../guides/diagnose.md)"),
    ("../LICENSE", "x (`../LICENSE`)"),
    ("https://arxiv.org/abs/2104.09864", "[x](https://arxiv.org/abs/2104.09864)"),
])
def test_links_point_at_the_site(target, want):
    from ropelab import site

    assert site._rewrite_links(f"[x]({target})", "notebooks", "notebooks", set(), {"ropelab.core"}) == want


def test_every_public_module_has_an_api_page():
    from ropelab import site

    pages = {m for m, _ in site.api_modules()}
    for p in sorted((manifest.REPO / "ropelab").iterdir()):
        name = p.stem if p.suffix == ".py" else p.name if (p / "__init__.py").is_file() else None
        if name is None or name.startswith("_") or name == "diagnose":  # diagnose: the deprecated module alias
            continue
        assert f"ropelab.{name}" in pages or any(m.startswith(f"ropelab.{name}.") for m in pages), name


@in_browser
def test_the_site_reads_from_disk_too(built, browser):
    """Opened from ``build/site/index.html`` (``file://``), with no server: the pages load with no console error and
    render their math, and search finds ``rotate_half``."""
    root = Path(built["out"]).resolve().as_uri()
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"{page.url}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"{page.url}: {e}"))
    try:
        for path in ("index.html", f"notebooks/{NOTEBOOKS[0]}.html"):
            page.goto(f"{root}/{path}", wait_until="load")
        page.wait_for_selector("mjx-container", timeout=30_000)
        page.goto(f"{root}/search.html?q=rotate_half", wait_until="load")
        page.wait_for_selector("#search-results ul.search li a", timeout=30_000)
        page.wait_for_timeout(500)
    finally:
        page.close()
    assert not problems, problems
