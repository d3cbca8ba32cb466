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
import re
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from _browser import chromium, missing

from ropelab import manifest
from ropelab.paths import REPO

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


LINKS_JS = """repo => ({
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  images: [...document.querySelectorAll('img')].map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0,
    alt: i.getAttribute('alt')})),
  text: document.body.innerText,
  rows: [...document.querySelectorAll('article table tr')].map(tr => [...tr.cells].map(c => c.innerText.trim())),
  // the build machine's checkout path anywhere in the page, attributes and scripts included
  hasRepo: document.documentElement.outerHTML.includes(repo),
  icon: !!document.querySelector('link[rel="icon"]'),
  copyButtons: document.querySelectorAll('.copybtn').length,  // the buttons sphinx-copybutton adds on load
  // Text a reader sees outside math, code and scripts: where a $...$ left unparsed would show as raw TeX.
  prose: (() => {
    const skip = 'script, style, pre, code, .math, mjx-container, .ropelab-webexplorer, textarea';
    const out = [], walker = document.createTreeWalker(document.querySelector('article') || document.body,
                                                       NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const n = walker.currentNode;
      if (!n.parentElement.closest(skip)) out.push(n.textContent);
    }
    return out.join('');
  })(),
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
            found = page.evaluate(LINKS_JS, str(REPO))
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
        figures = [i for i in crawl[url]["images"] if "/_figures/" in i["src"]]
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
        # A screen reader's setting (MathJax's menu, kept in localStorage): speech and the explorer on. Its speech rule
        # engine then loads sre/mathmaps/{base,en}.json from the site (404s once) and labels each formula.
        page.evaluate("() => localStorage.setItem('MathJax-Menu-Settings', JSON.stringify({speech: true, "
                      "explorer: true, assistiveMml: true}))")
        page.reload(wait_until="load")
        page.wait_for_function("() => [...document.querySelectorAll('mjx-container')].some(c => "
                               "c.getAttribute('aria-label') || c.querySelector('[aria-label]'))", timeout=60_000)
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
        # Excerpts: each page result shows its own text around the word, not the notebook banner (whose glossary
        # line named YaRN, NTK, M-RoPE...: every notebook matched "yarn", its excerpt the banner or breadcrumbs).
        page.goto(f"{served}/search.html?q=yarn", wait_until="load")
        page.wait_for_function("() => /Search finished/.test((document.querySelector('#search-results "
                               "p.search-summary') || {innerText: ''}).innerText)"
                               " && [...document.querySelectorAll('#search-results li.kind-text, "
                               "#search-results li.kind-title')].every(li => li.querySelector('p.context'))",
                               timeout=60_000)
        results = page.locator("#search-results li.kind-text, #search-results li.kind-title").evaluate_all(
            "els => els.map(li => [li.querySelector('a').href, li.querySelector('p.context').innerText])")
        mention = {stem for stem in NOTEBOOKS if "yarn" in json.dumps(_source(stem)).lower()}
        for href, excerpt in results:
            stem = re.search(r"/notebooks/([0-9]{2}_\w+)\.html", href)
            if not stem:
                continue
            assert "A term you do not know" not in excerpt and "Run it yourself" not in excerpt, (href, excerpt)
            assert stem.group(1) in mention, f"{href} matches 'yarn' but its notebook never says it"
        assert mention & {re.search(r"notebooks/(\w+)\.html", h).group(1) for h, _ in results if "/notebooks/" in h}
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
        # its notebook to download (the stripped source; the link check fetches it) and the source archive
        assert f"{served}/notebooks/{stem}.ipynb" in links, f"{stem}: no .ipynb to download"
        assert f"{served}/index.html#get-the-code" in links, f"{stem}: no link to the source"


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
                # Each plot keeps the size it draws at: the theme's CSS must not restyle it (Bootstrap's .ratio
                # once stretched notebook 07's "ratio" plot and moved its frame).
                sizes = root.evaluate("r => [...r.querySelectorAll('svg.ropelab-plot')].map(s => [+s.getAttribute("
                                      "'width'), s.getBoundingClientRect().width, s.className.baseVal])")
                bad = [sz for sz in sizes if sz[0] and abs(sz[0] - sz[1]) > 1]
                assert not bad, f"{stem}, explorer {i}: plots drawn at another size than their own: {bad}"
                assert any(number and figure for number, figure in moved), \
                    f"{stem}, explorer {i}: no control changed both the printed number and the figure: {moved}"
            assert not page.problems, page.problems
        finally:
            page.close()


# What a reader meets on the pages: the crawl's text and images, and each notebook page at a desktop and a phone
# width (the review that asked for these read the site at 1280 x 900 and 390 x 844).
WIDTHS = (1280, 390)
FILE_NAME = re.compile(r"(\.(png|svg|jpe?g)$)|(^[0-9]{2}_\w+$)|_images/|_figures/")
# An absolute path of the build machine: this checkout, or a typical home of one (/work/..., /home/..., /tmp/...).
ABSOLUTE = re.compile(r"(?<![\w.:/])/(?:work|check|home|root|tmp|Users|opt|usr)/[\w.-]+/")
RAW_TEX = re.compile(r"\$[^$\s][^$]*?\$")

BLOCKS_JS = """() => {
  // Code and output blocks of the article: one is clipped when its content is wider than its box and the box
  // neither wraps nor scrolls, or when the box itself runs past the article's right edge.
  const article = document.querySelector('article.bd-article');
  const right = article.getBoundingClientRect().right;
  const clipped = [];
  for (const el of article.querySelectorAll('div.cell_input pre, div.cell_output pre, div.highlight pre, '
                                             + 'div.cell_output .output, table')) {
    if (!el.checkVisibility()) continue;  // inside a collapsed block: not shown
    const r = el.getBoundingClientRect(), style = getComputedStyle(el);
    let scroller = el;  // a table scrolls inside its wrapper
    while (scroller !== article && !['auto', 'scroll'].includes(getComputedStyle(scroller).overflowX))
      scroller = scroller.parentElement;
    const scrolls = scroller !== article && scroller.getBoundingClientRect().right <= right + 1;
    const wide = el.scrollWidth > el.clientWidth + 1 || r.right > right + 1;
    const table = el.tagName === 'TABLE' || (el.querySelector('table') && !el.querySelector('pre'));
    if (wide && !(scrolls && table)) {  // a table may scroll in its box; code and text must wrap
      clipped.push(`${el.tagName.toLowerCase()}.${el.className}: ${el.scrollWidth} px in ${el.clientWidth} px, `
                   + `right edge ${Math.round(r.right)} of ${Math.round(right)}: ${el.innerText.slice(0, 60)}`);
    }
  }
  const figures = [...article.querySelectorAll('img')].filter(i => !i.closest('.ropelab-webexplorer')).map(i => ({
    src: i.src, natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
    zoom: !!i.closest('a.ropelab-zoom') && i.closest('a.ropelab-zoom').href === i.src}));
  const runtime = [...article.querySelectorAll('p')].map(p => p.innerText).filter(t => t.startsWith('Run time.'));
  return {clipped, figures, runtime};
}"""

SOLUTIONS_JS = """() => {
  // checkVisibility: false inside a closed <details> (its content is content-visibility: hidden in Chromium)
  const shown = el => !!el && el.checkVisibility({visibilityProperty: true})
    && el.getBoundingClientRect().height > 0;
  return [...document.querySelectorAll('.tag_ropelab-solution')].map(cell => ({
    summary: (cell.querySelector('summary') || {innerText: ''}).innerText.trim(),
    visible: shown(cell.querySelector('.cell_input pre')),
  }));
}"""


@pytest.fixture(scope="module")
def notebook_views(browser, served):
    """Each notebook page at each of :data:`WIDTHS`: its clipped blocks, its figures' natural and shown widths and
    whether each opens at full size, its run-time note; at the first width, its solutions before and after a click
    on each "Solution" control, and its checks' printed outputs."""
    t0, views = time.perf_counter(), {}
    for width in WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": 900 if width > 600 else 844})
        try:
            for stem in NOTEBOOKS:
                page.goto(f"{served}/notebooks/{stem}.html", wait_until="load")
                page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=30_000)
                view = page.evaluate(BLOCKS_JS)
                if width == WIDTHS[0]:
                    view["solutions_before"] = page.evaluate(SOLUTIONS_JS)
                    view["checks"] = page.locator(".tag_ropelab-check .cell_output").all_inner_texts()
                    for summary in page.locator(".tag_ropelab-solution summary").all():
                        summary.click()
                    view["solutions_after"] = page.evaluate(SOLUTIONS_JS)
                views[(stem, width)] = view
        finally:
            page.close()
    print(f"notebook pages at {WIDTHS} px: {time.perf_counter() - t0:.1f} s")
    return views


@in_browser
def test_no_raw_dollar_math_in_the_text(crawl):
    # "Answer." and "In one line." paragraphs are markdown outputs of code: their $...$ must render as math too.
    raw = {url: RAW_TEX.findall(p["prose"])[:5] for url, p in crawl.items() if RAW_TEX.search(p["prose"])}
    assert not raw, raw


@in_browser
def test_no_absolute_build_path_on_any_page(crawl):
    found = {url: sorted(set(ABSOLUTE.findall(p["text"])))[:5] or [str(REPO)] for url, p in crawl.items()
             if ABSOLUTE.search(p["text"]) or p["hasRepo"]}
    assert not found, found


# What a library prints on stderr (transformers' config notices, Python's warnings) is not part of a page.
LIBRARY_WARNING = re.compile(r"\[transformers\]|\b(User|Deprecation|Future|Runtime)Warning\b")


@in_browser
def test_no_library_warning_on_any_page(crawl):
    found = {url: LIBRARY_WARNING.findall(p["text"])[:3] for url, p in crawl.items()
             if "/notebooks/" in url and LIBRARY_WARNING.search(p["text"])}
    assert not found, found


@in_browser
def test_copy_buttons_citation_favicon_and_speech_maps(crawl, served, built):
    front = crawl[f"{served}/index.html"]
    assert "@software{ropelab," in front["text"], "no citation block on the front page"
    assert f"{served}/ropelab-src.tar.gz" in front["links"], "no source archive to get the code from"
    assert front["icon"], "no favicon"
    assert all(crawl[f"{served}/notebooks/{stem}.html"]["copyButtons"] for stem in NOTEBOOKS), "no copy buttons"
    # the archive is the source tree a reader can run: the Makefile and the notebooks under ropelab/
    import tarfile

    with tarfile.open(Path(built["out"]) / "ropelab-src.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"ropelab/Makefile", "ropelab/pyproject.toml", *(f"ropelab/notebooks/{s}.ipynb" for s in NOTEBOOKS)} <= names
    # MathJax's speech rule engine (its menu's speech and explorer) loads these; they were 404s.
    maps = Path(built["out"]) / "_static" / "mathjax" / "sre" / "mathmaps"
    assert (maps / "base.json").is_file() and (maps / "en.json").is_file()


@in_browser
def test_every_image_has_alt_text_that_is_not_a_file_name(crawl):
    # ... nor TeX source (a screen reader reads "\\cos(m\\,\\omega_i)" backslash by backslash)
    bad = [f"{url}: {i['src']} alt={i['alt']!r}" for url, p in crawl.items() for i in p["images"]
           if not (i["alt"] or "").strip() or FILE_NAME.search(i["alt"].strip()) or re.search(r"[\\$]", i["alt"])]
    assert not bad, "\n".join(bad[:20])


# The runner's and the lab's plumbing, which the running guide says for maintainers: not on a notebook page.
PLUMBING = ("How to run.", "pre-save hook", "injected by ropelab.figures", "git status")


@in_browser
def test_no_runner_plumbing_on_a_notebook_page(crawl, served):
    found = {stem: [w for w in PLUMBING if w in crawl[f"{served}/notebooks/{stem}.html"]["text"]] for stem in NOTEBOOKS}
    assert not any(found.values()), found


@in_browser
def test_the_map_shows_a_key_figure_for_every_notebook(crawl, served):
    figures = [i for i in crawl[f"{served}/index.html"]["images"] if "_images/" in i["src"] and i["ok"]]
    assert len(figures) >= len(NOTEBOOKS), [i["src"] for i in figures]


@in_browser
def test_solutions_stay_hidden_until_asked_for_and_no_check_prints_an_answer(notebook_views):
    from ropelab.figures import CHECK_ON_SOLUTION, CHECK_PASSED

    total = 0
    for stem in NOTEBOOKS:
        view = notebook_views[(stem, WIDTHS[0])]
        want = sum("".join(c["source"]).startswith("# Solution") for c in _source(stem)["cells"])
        before, after = view["solutions_before"], view["solutions_after"]
        assert len(before) == want, f"{stem}: {len(before)} solutions behind a control, the notebook has {want}"
        assert all(s["summary"] == "Solution" for s in before), f"{stem}: {before}"
        assert not any(s["visible"] for s in before), f"{stem}: a solution shows before its control is used"
        assert all(s["visible"] for s in after), f"{stem}: a solution does not open from its control"
        # The checks ran on the solution: each prints the verdict only, never the value it checked.
        assert len(view["checks"]) == want, f"{stem}: {len(view['checks'])} check outputs for {want} exercises"
        for text in view["checks"]:
            assert text.strip() in (CHECK_ON_SOLUTION, CHECK_PASSED) or text.startswith("no Triton here"), \
                f"{stem}: a check prints more than its verdict: {text!r}"
        total += want
    assert total >= 20, total


@in_browser
def test_no_code_or_output_block_is_clipped(notebook_views):
    clipped = {f"{stem} at {width} px": v["clipped"][:3] for (stem, width), v in notebook_views.items()
               if v["clipped"]}
    assert not clipped, clipped


@in_browser
def test_figures_are_legible_or_open_at_full_size(notebook_views, browser, served):
    # Shown at 60 % of its natural width or more, a figure's text keeps a readable size (10-point text saved at
    # 120 dpi is 17 px tall, so 10 px or more). At a desktop width every figure must be legible in the column
    # itself; on a phone none can be, and each must open at full size (a link to its own PNG, which ropelab.js
    # shows in a lightbox).
    small, count = [], 0
    for (stem, width), v in notebook_views.items():
        for f in v["figures"]:
            count += 1
            legible = f["shown"] >= 0.6 * f["natural"]
            if not f["zoom"] or (width == WIDTHS[0] and not legible):
                small.append(f"{stem} at {width} px: {f['src']} shown {f['shown']:.0f} of {f['natural']} px"
                             + ("" if f["zoom"] else ", and it does not open at full size"))
    assert count and not small, small
    for width in WIDTHS:  # how many are shown below 60 % of their size (they open at full size): for the log
        shown = [f["shown"] / f["natural"] for (_, w), v in notebook_views.items() if w == width for f in v["figures"]]
        print(f"at {width} px: {sum(r < 0.6 for r in shown)} of {len(shown)} figures below 60 % of their size, "
              f"smallest {min(shown):.0%}")
    # The lightbox does show the figure at its natural size.
    page = _page(browser, served)
    try:
        page.goto(f"{served}/notebooks/{NOTEBOOKS[0]}.html", wait_until="load")
        page.locator("a.ropelab-zoom").first.click()
        box = page.locator(".ropelab-lightbox img")
        box.wait_for(timeout=10_000)
        page.wait_for_function("() => document.querySelector('.ropelab-lightbox img').complete")
        natural, shown = box.evaluate("i => [i.naturalWidth, i.getBoundingClientRect().width]")
        assert natural > 0 and abs(shown - natural) <= 1, (natural, shown)
        page.keyboard.press("Escape")
        assert page.locator(".ropelab-lightbox").count() == 0
        assert not page.problems, page.problems
    finally:
        page.close()


@in_browser
def test_every_pages_run_time_is_the_maps(notebook_views, crawl, served):
    # One source: figures/runs.json, which the map's table and each page's note are rendered from at build time.
    rows = crawl[f"{served}/index.html"]["rows"]
    for stem in NOTEBOOKS:
        notes = notebook_views[(stem, WIDTHS[0])]["runtime"]
        assert len(notes) == 1, f"{stem}: {len(notes)} run-time notes"
        took = re.search(r"took (\d+ s(?: \([\d.]+ min\))?)", notes[0])
        assert took, notes[0]
        # The map's table (notebook, full run, headline) and the reading path's (step, notebook, builds on, to read,
        # full run) both give it.
        times = [r[1] for r in rows if len(r) == 3 and r[0] == stem[:2]]
        times += [r[4] for r in rows if len(r) == 5 and r[1].startswith(f"{stem[:2]} ·")]
        assert len(times) == 2 and set(times) == {took.group(1)}, (stem, took.group(1), times)


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
    solution = next(c for c in nb["cells"] if "".join(c["source"]).startswith("# Solution"))
    check = next(c for c in nb["cells"] if c.get("id", "").endswith("-check"))
    injected = {"cell_type": "code", "id": "inj", "metadata": {"tags": [site.INJECTED_TAG]}, "outputs": [],
                "source": "SMOKE = False\nFIGURES_DIR = '/tmp/another-clone/figures'"}  # it ran in another checkout
    nb["cells"].insert(3, injected)
    howto = {"cell_type": "markdown", "id": "howto", "metadata": {"tags": ["ropelab-lab"]},
             "source": "**How to run.** *Kernel → Restart Kernel and Run All Cells.*\n\n- `SMOKE = True` ..."}
    nb["cells"].insert(4, howto)  # as 08-10 have it: another id than lab-how-to-run
    runtime = next(c for c in nb["cells"] if "runtime_note(" in "".join(c["source"]))
    runtime["outputs"] = [{"output_type": "display_data", "metadata": {},
                           "data": {"text/markdown": "**Run time.** stale: 1 s", "text/plain": "x"}}]
    stream = {"output_type": "stream", "name": "stdout",
              "text": f"losses: {manifest.REPO}/data/lm/x.pt\nseeds: /tmp/another-clone/data/y.json\n"}
    saving["outputs"] = [stream]
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
    shown = [o["data"]["text/html"] for o in staged["outputs"] if "text/html" in o.get("data", {})]
    assert any('src="../_figures/00_pair_rotation.png"' in h and 'class="ropelab-zoom"' in h for h in shown), \
        "the saved figure is not shown, in a link to its full size"
    assert all('alt="Figure: ' in h and 'alt="00_pair_rotation' not in h for h in shown), shown
    assert staged["outputs"][0]["text"] == "losses: data/lm/x.pt\nseeds: data/y.json\n", \
        "an absolute path (this checkout's, or the one the notebook ran in) is left in an output"
    assert "inj" not in {c.get("id") for c in cells}, "the runner's injected cell is on the page"
    assert not {site.LAB_HOW_TO_RUN, "howto"} & {c.get("id") for c in cells}, "the lab's how-to-run notes are shown"
    runtime_out = next(c for c in cells if c.get("id") == runtime.get("id"))["outputs"]
    from ropelab.figures import load_runs, runtime_text

    assert runtime_out[0]["data"]["text/markdown"] == "**Run time.** " + runtime_text(src.stem, load_runs())
    sol = next(c for c in cells if c.get("id") == solution.get("id"))["metadata"]
    assert "hide-input" in sol["tags"] and sol["mystnb"]["code_prompt_show"] == "Solution"
    assert "hide-input" in next(c for c in cells if c.get("id") == check.get("id"))["metadata"]["tags"]
    outputs = next(c for c in cells if c.get("id") == explorer.get("id"))["outputs"]
    assert not any(site.WIDGET_MIME in o.get("data", {}) for o in outputs), "a widget output is left for no kernel"
    assert "widgets" not in page["metadata"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "](index.ipynb)" not in text and "](../README.md)" not in text and "](../index.md)" in text
    assert "figures/00_explore_ladder.png" in images


def test_a_notebook_page_is_titled_by_the_maps_short_title_with_its_own_under_it():
    from ropelab import site

    src = manifest.notebooks()[1]  # 01 · rotate_half vs interleaved: one rotation in two memory layouts, ...
    cells = site.stage_notebook(src, _source(src.stem), manifest.FIGURES_DIR, smoke=False, images=set())["cells"]
    short = site._short_titles()[src.stem]
    full = site._notebook_title(src)
    assert cells[0]["source"] == f"# {short}" and full.startswith(short + ": "), (cells[0]["source"], full)
    sub = full[len(short) + 2:]
    assert cells[1]["source"] == f":::{{container}} {site.SUBTITLE_CLASS}\n{sub[0].upper() + sub[1:]}\n:::"
    assert site.BANNER_CLASS in cells[2]["source"]


def test_alt_text_is_the_figures_own_titles():
    from ropelab import site

    # read from the SVG beside the PNG: the title (with its d), not the file name's words
    assert site.figure_caption(manifest.FIGURES_DIR / "00_frequency_ladder.png").startswith(
        "Figure: frequency ladder, d = ")
    caption = site.figure_caption(manifest.FIGURES_DIR / "00_cos_sin_tables.png")
    assert "cos(m" in caption and "sin(m" in caption and "$" not in caption and "\\" not in caption, caption
    # the math as it reads: Greek letters and symbols as characters, spacing and braces gone
    assert site._plain_tex(r"$S_{mn} = \langle R_m q, R_n k\rangle$") == "S_mn = ⟨ R_m q, R_n k⟩"
    assert site._plain_tex(r"$\cos(m\,\omega_i)$; $\tilde{p}_m$, $\alpha \geq 6$") == "cos(m ω_i); p̃_m, α ≥ 6"


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


def test_the_api_reference_is_grouped_by_topic_and_each_page_says_what_it_is():
    from ropelab import site

    modules = site.api_modules()
    groups = site.api_topics(modules)
    placed = [m for _, _, group in groups for m, _ in group]
    assert sorted(placed) == sorted(m for m, _ in modules), "a module is in no topic, or in two"
    for title, _, group in groups:  # every module is named by its topic's prefixes, not left to the last by default
        prefixes = next(p for t, _, p in site.API_TOPICS if t == title)
        assert all(any(m == p or m.startswith(p + ".") for p in prefixes) for m, _ in group), (title, group)
    assert groups[0][2][0][0] == "ropelab.rope", "the first module a newcomer meets is not apply_rope's"
    index = site._api_index(f"# API\n\n{site.MODULES_MARKER}\n", modules)
    assert index.count(":caption:") == len(groups) and all(f"### {t}" in index for t, _, _ in groups)
    for module, job in modules:
        title = site._api_page(module, job).splitlines()[0]
        assert title.startswith(f"# `{module}` — ") and len(title) < 160, title  # the module and what it is
        assert title.count("(") == title.count(")") and "``" not in title, title
    # a summary is a whole first sentence: not cut inside a parenthesis ("...(the design")
    assert all(job.count("(") == job.count(")") for _, job in modules), [j for _, j in modules if "(" in j]


def test_the_glossary_defines_the_rope_terms_and_every_notebook_banner_links_it():
    from ropelab import site

    text = (site.DOCS_DIR / site.GLOSSARY).read_text()
    terms = {line.strip() for line in text.splitlines() if line and not line.startswith((" ", "#", "`", "The "))}
    for term in ("rotate_half", "interleaved", "layout", "partial rotary", "varlen", "KV cache", "NTK-aware scaling",
                 "dynamic NTK", "YaRN", "LongRoPE", "llama3", "M-RoPE", "NoPE", "p-RoPE", "MLA", "CoPE"):
        assert term in terms, term
    banner = site._banner(manifest.notebooks()[0], smoke=False)["source"]
    assert f"(../{site.GLOSSARY})" in banner


@pytest.mark.parametrize("text, want", [
    ("Peng et al., arXiv:2309.00071, quoted",
     "Peng et al., [arXiv:2309.00071](https://arxiv.org/abs/2309.00071), quoted"),
    ("DeepSeek-V2, arXiv:2405.04434 (https://arxiv.org/abs/2405.04434), section 2",
     "DeepSeek-V2, [arXiv:2405.04434](https://arxiv.org/abs/2405.04434), section 2"),
    ("[arXiv 2104.09864](https://arxiv.org/abs/2104.09864)", "[arXiv 2104.09864](https://arxiv.org/abs/2104.09864)"),
    ("bloc97, https://www.reddit.com/r/LocalLLaMA/x/.", "bloc97, <https://www.reddit.com/r/LocalLLaMA/x/>."),
    ("[repo](https://github.com/a/b) and <https://x.org>", "[repo](https://github.com/a/b) and <https://x.org>"),
    ("in code `https://x.org arXiv:2309.00071` stays", "in code `https://x.org arXiv:2309.00071` stays"),
    ("transformers (https://github.com/huggingface/transformers); x",
     "transformers (<https://github.com/huggingface/transformers>); x"),
    ('<a href="https://x.org/a">x</a>', '<a href="https://x.org/a">x</a>'),
    ("llama.cpp (https://github.com/ggml-org/llama.cpp) #19443, #22612; sglang #30111",
     "llama.cpp (<https://github.com/ggml-org/llama.cpp>) "
     "[#19443](https://github.com/ggml-org/llama.cpp/issues/19443), "
     "[#22612](https://github.com/ggml-org/llama.cpp/issues/22612); sglang #30111"),
])
def test_bare_references_become_links(text, want):
    from ropelab import site

    assert site.link_references(text) == want
