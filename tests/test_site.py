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
import os
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from ropelab import manifest

CHROMIUM = os.environ.get("ROPELAB_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("ROPELAB_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the dev extra installs it
    sync_playwright = None
try:
    import myst_nb  # noqa: F401  (the site extra)
    import sphinx  # noqa: F401
except ImportError:
    myst_nb = None

_missing = (
    "playwright is not installed (pip install playwright; it is in the dev extra)"
    if sync_playwright is None
    else f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set ROPELAB_CHROMIUM)"
    if not Path(CHROMIUM).exists()
    else "sphinx or myst-nb is not installed (pip install -e '.[site]')"
    if myst_nb is None
    else None
)
if _missing and REQUIRED:
    raise RuntimeError(f"ROPELAB_REQUIRE_BROWSER=1 but {_missing}")
pytestmark = [pytest.mark.skipif(_missing is not None, reason=_missing or ""), pytest.mark.timeout(1800),
              pytest.mark.lab]

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
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


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


def test_every_notebook_is_a_page_with_outputs_and_figures(built, crawl, served):
    for stem in NOTEBOOKS:
        url = f"{served}/notebooks/{stem}.html"
        assert url in crawl, f"{stem}: no page reachable from the front page"
        figures = [i for i in crawl[url]["images"] if "/_images/" in i["src"]]
        assert figures, f"{stem}: its page shows no figure"
    html = (Path(built["out"]) / "notebooks" / f"{NOTEBOOKS[0]}.html").read_text()
    assert "cell_output" in html, "the notebook page has no cell outputs"


def test_every_page_loads_without_a_console_error_or_an_off_site_request(crawl):
    problems = {url: p["problems"] for url, p in crawl.items() if p["problems"]}
    assert not problems, problems


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


def test_every_notebook_page_links_to_the_previous_and_next_notebook(crawl, served):
    for i, stem in enumerate(NOTEBOOKS):
        url = f"{served}/notebooks/{stem}.html"
        links = crawl[url]["banner"]  # the banner's own links (the sidebar lists every notebook anyway)
        want = ([NOTEBOOKS[i - 1]] if i > 0 else []) + ([NOTEBOOKS[i + 1]] if i + 1 < len(NOTEBOOKS) else [])
        for other in want:
            assert f"{served}/notebooks/{other}.html" in links, f"{stem}: no link to {other}"
        text = crawl[url]["bannerText"]
        assert "make lab" in text and f"notebooks/{stem}.ipynb" in text, f"{stem}: no run-it-locally banner: {text!r}"
