"""The static site of the executed notebooks (``make site``): Sphinx with myst-nb, read without installing anything.

::

    python -m ropelab.site                 # from build/*.ipynb (make figures) into build/site/
    python -m ropelab.site --smoke         # from build/smoke/*.ipynb (figures --smoke) into build/smoke/site/
    python -m ropelab.site --run-missing   # first run the figures runner for the notebooks with no current run

The notebooks are never executed here (myst-nb's ``nb_execution_mode = "off"``) and the sources in ``notebooks/``
are never touched: the builder stages copies of the executed notebooks under ``build/site-src/``
(``build/smoke/site-src/``), laid out like the repository (``notebooks/``, ``figures/``, and ``docs/`` at the root),
and Sphinx builds that with ``docs/conf.py``. On each staged copy (:func:`stage_notebook`):

- the map's short title (``07 · Context extension``) as the page's title, the notebook's own (a sentence) under it;
- a banner after the title: links to the previous and next notebook along :func:`ropelab.manifest.notebooks`
  (:func:`ropelab.manifest.navigation`), the notebook's stripped ``.ipynb`` to download and how to run it;
- the runner's injected parameters cell and the lab's "How to run" notes are left out (the running guide says
  them, for maintainers); the run-time note is rendered again from ``figures/runs.json``, as the map's table is;
- every figure a code cell saved (``save(fig, "NN_name", ...)``: a string literal naming one of the notebook's
  figures) is shown under that cell, since the runner draws on matplotlib's Agg backend and so records none: from
  the site's ``_figures/``, in a link to its full size (a lightbox, ``docs/_static/ropelab.js``), with its own
  titles as alt text (:func:`figure_caption`);
- an explorer's widget output (it needs a kernel) is replaced by its browser twins, :func:`explorer_html`
  (the hook: ``ropelab.webexplorers.embed_html`` when that module is importable), else by a note;
- an exercise's solution (``jupyter.source_hidden`` in the lab) sits behind a "Solution" control, and its check's
  code is collapsed too (the check prints a verdict only, :func:`ropelab.figures.checked`);
- the checkout's absolute path in an output is made repository-relative;
- links to other notebooks, the map, ``../figures/`` and ``../README.md`` point at the site's pages, and bare
  arXiv ids and URLs become links (:func:`link_references`).

The front page is ``docs/index.md``, for a newcomer, with generated parts at its markers: the reading path
(:func:`render_path`), how to get the code (:func:`render_get`: the source archive :func:`build` writes, and two
commands), the notebook map (:func:`render_map`: the markdown cells of ``notebooks/index.ipynb`` after its title,
its run table rendered from ``figures/runs.json``) and the citation (:func:`render_cite`, from ``CITATION.cff``).
Its sections, in the header: Notebooks (in :func:`ropelab.manifest.notebooks`' order), Guides (every
``docs/guides/*.md``, or that folder's own ``index.md``), API reference (one page per public module,
:func:`api_modules`: read from ``ropelab``'s docstring, members from each ``__all__``) and the README as a page.
Markdown links in all of them are pointed at the site's pages (a link to ``ropelab/x.py`` at its API page); one
to a file the site does not carry loses its link.
Search is Sphinx's own; MathJax is served from the site itself (``sphinx-mathjax-offline``, pruned to what a page
loads), so a page renders its math with no network, and from ``file://`` too.

:func:`build` measures the build's time and the site's size and prints both (no number is kept here to go stale).
"""

from __future__ import annotations

import argparse
import html
import importlib
import importlib.util
import json
import os
import pkgutil
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .manifest import NAV_TAG, cells_hash, navigation, notebooks
from .paths import BUILD_DIR, FIGURES_DIR, NOTEBOOK_DIR, REPO

__all__ = ["DOCS_DIR", "SITE_DIR", "MAP_MARKER", "MODULES_MARKER", "PATH_MARKER", "GET_MARKER", "CITE_MARKER",
           "BANNER_CLASS", "SUBTITLE_CLASS", "WIDGET_MIME", "EXPLORER_TWINS", "ARCHIVE", "executed_notebooks",
           "stage_notebook", "render_map", "render_path", "render_get", "render_cite", "figure_caption",
           "reading_minutes", "builds_on", "api_modules", "API_TOPICS", "api_topics", "api_title", "GLOSSARY",
           "link_references", "explorer_html", "stage", "build", "main"]

DOCS_DIR = REPO / "docs"
SITE_DIR = BUILD_DIR / "site"  # the full run's site; a smoke site goes to build/smoke/site
MAP_MARKER = "<!-- ropelab:map -->"  # in docs/index.md: replaced by render_map()
MODULES_MARKER = "<!-- ropelab:modules -->"  # in docs/api/index.md: replaced by the module table and toctree
PATH_MARKER = "<!-- ropelab:path -->"  # in docs/index.md: the reading path (render_path)
GET_MARKER = "<!-- ropelab:get -->"  # in docs/index.md: how to get the code (the source archive and two commands)
CITE_MARKER = "<!-- ropelab:cite -->"  # in docs/index.md: the citation block (render_cite, from CITATION.cff)
GLOSSARY = "glossary.md"  # in docs/: the RoPE terms; every notebook page's banner links it
BANNER_CLASS = "ropelab-banner"  # the run-locally / previous / next banner of a notebook page
SUBTITLE_CLASS = "ropelab-subtitle"  # a notebook page's full title, under its short one
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
INJECTED_TAG = "injected-parameters"  # the cell ropelab.figures inserts after the parameters cell
# Pages of the site that are not at their repository path: the README (a page of its own) and the map (the front page).
SITE_TARGETS = {"README.md": "readme.md", "notebooks/index.ipynb": "index.md"}


# --------------------------------------------------------------------------------------------------
# Which executed notebooks
# --------------------------------------------------------------------------------------------------


def _candidates(name: str, smoke: bool) -> list[Path]:
    """Where the runner leaves an executed copy of notebook ``name``: ``build/`` for a full run; for a smoke run
    ``build/smoke/`` and the test suite's thread-pinned copies (``build/smoke/threads1``, ``threads2``)."""
    if not smoke:
        return [BUILD_DIR / name]
    return [BUILD_DIR / "smoke" / name] + sorted((BUILD_DIR / "smoke").glob(f"threads*/{name}"))


def _read_executed(path: Path, source_hash: str, attempts: int = 3) -> dict | None:
    """The executed notebook at ``path`` if it ran the current source and raised nothing, else None. A file that
    does not parse may be mid-write by a parallel run (the test suite's): it is read again after a pause."""
    for attempt in range(attempts):
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
            break
        except (OSError, ValueError):
            if not path.exists() or attempt == attempts - 1:
                return None
            time.sleep(2.0)
    cells = [c for c in nb.get("cells", []) if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    if cells_hash(cells) != source_hash:
        return None
    if any(o.get("output_type") == "error" for c in cells for o in c.get("outputs", [])):
        return None
    return nb


def executed_notebooks(smoke: bool = False, run_missing: bool = False) -> dict[Path, tuple[dict, Path]]:
    """Source notebook -> (its executed copy, where that copy's figures are), for every notebook. A copy counts
    when it ran the notebook's current source (:func:`ropelab.manifest.cells_hash`) without an error. With
    ``run_missing`` the runner (``python -m ropelab.figures [--smoke] --only ...``, in a process of its own: no
    module imports the runner) executes the notebooks that have none, a full run writing ``figures/`` and
    ``figures/runs.json`` as ``make figures`` does; without it their absence is a ``SystemExit`` naming the command."""
    from .manifest import notebook_hash

    found, missing = {}, []
    for src in notebooks():
        want = notebook_hash(src)
        for path in _candidates(src.name, smoke):
            nb = _read_executed(path, want)
            if nb is not None:
                found[src] = (nb, path.parent / "figures" if smoke else FIGURES_DIR)
                break
        else:
            missing.append(src)
    if missing and not run_missing:
        only = " ".join(p.stem[:2] for p in missing)
        cmd = "make figures-smoke" if smoke else "make figures"
        raise SystemExit(
            f"no current executed copy of {', '.join(p.name for p in missing)} under "
            f"{BUILD_DIR / 'smoke' if smoke else BUILD_DIR} (missing, failed, or run from an older source): run "
            f"`{cmd}` (or python -m ropelab.figures {'--smoke ' if smoke else ''}--only {only}), or pass --run-missing."
        )
    if missing:  # the runner itself, as `make figures` runs it (a full run also records its figures and run times)
        only = [p.stem for p in missing]
        print(f"running the figures runner for {', '.join(only)}: no current executed copy", flush=True)
        cmd = [sys.executable, "-m", "ropelab.figures", *(["--smoke"] if smoke else []), "--only", *only]
        if subprocess.run(cmd, env=_env()).returncode != 0:
            raise SystemExit(f"the figures runner failed: {' '.join(cmd[1:])}")
        return executed_notebooks(smoke=smoke, run_missing=False)
    return {src: found[src] for src in notebooks()}


# --------------------------------------------------------------------------------------------------
# Staging: a copy of each executed notebook, made into a page
# --------------------------------------------------------------------------------------------------

_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")  # [text](target) and ![alt](image)


def _site_target(repo_path: str, modules: set[str]) -> str | None:
    """The staged path (from the site's root) of a repository path a page links to, or None if the site has none:
    a notebook, a committed PNG figure, a page of ``docs/``, the README, or a module of ``modules`` (its API page)."""
    if repo_path in SITE_TARGETS:
        return SITE_TARGETS[repo_path]
    if re.fullmatch(r"notebooks/[0-9]{2}_[^/]+\.ipynb", repo_path) or re.fullmatch(r"figures/[^/]+\.png", repo_path):
        return repo_path
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path == "ropelab" or repo_path.startswith("ropelab/"):
        module = re.sub(r"(/__init__)?\.py$", "", repo_path.rstrip("/")).replace("/", ".")
        if module in modules:
            return "api/index.md" if module == "ropelab" else f"api/{module}.md"
    return None


def _rewrite_links(text: str, repo_dir: str, site_dir: str, images: set[str], modules: set[str] = frozenset()) -> str:
    """Markdown links and images of a page written at ``repo_dir`` (repository-relative) and staged at ``site_dir``
    (site-relative), pointed at the staged pages (:func:`_site_target`); the figures it shows are added to
    ``images``. A link to a file the site does not carry (``LICENSE``, ``data/...``) becomes its text and path in
    code, with no link; such an image stays as it is (Sphinx warns, and the site's test fails on it)."""

    def fix(m: re.Match) -> str:
        bang, label, target = m.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        staged = _site_target(posixpath.normpath(posixpath.join(repo_dir, path)), modules)
        if staged is None:
            return m.group(0) if bang else (label if label.strip("`") == path else f"{label} (`{path}`)")
        if staged.startswith("figures/"):
            images.add(staged)
            if bang:  # the figure's own titles, not its file name, as alt text
                label = re.sub(r"([\\`*_\[\]<>])", r"\\\1", figure_caption(REPO / staged))
        rel = posixpath.relpath(staged, site_dir or ".")
        return f"{bang}[{label}]({rel}{'#' + anchor if anchor else ''})"

    return _LINK.sub(fix, text)


def _banner(src: Path, smoke: bool) -> dict:
    """The markdown cell a notebook page opens with (after its title): previous, map and next; the notebook to
    download (the stripped source, as committed) and how to run it; a smoke run's note."""
    nav = navigation(src).split("\n\n", 1)[1]  # "**Previous:** [..](..) · **Map:** [..](index.ipynb) · **Next:** .."
    nav = nav.replace("(index.ipynb)", "(../index.md)")
    # no-search: Sphinx leaves the banner out of the search index (its glossary line names YaRN, NTK, M-RoPE...:
    # every notebook matched those words); ropelab.js leaves it out of the results' excerpts too.
    lines = [f":::{{container}} {BANNER_CLASS} no-search", nav, "",
             f'**Run it yourself:** <a class="ropelab-download" href="{src.name}" download>download '
             f"<code>{src.name}</code></a> (the notebook's source, outputs stripped), or get the "
             f"[whole source](../index.md#get-the-code), run `make lab` and open `notebooks/{src.name}` "
             "(*Kernel → Restart Kernel and Run All Cells*); [more on running](../guides/running.md).", "",
             f"**A term you do not know?** The [glossary](../{GLOSSARY}) says what each RoPE term means (style, "
             "layout, partial rotary, NTK, YaRN, M-RoPE, NoPE, ...) and where it is taught."]
    if smoke:
        lines += ["", "*This page shows a smoke run (tiny sizes, `python -m ropelab.figures --smoke`): its numbers "
                  "are not the full run's, which `make figures` then `make site` show.*"]
    lines.append(":::")
    return {"cell_type": "markdown", "id": BANNER_CLASS, "metadata": {"tags": [BANNER_CLASS]},
            "source": "\n".join(lines)}


# Each notebook explorer (its class in ropelab.explorers) -> the names of its browser twins in ropelab.webexplorers.
EXPLORER_TWINS = {
    "LadderExplorer": ("ladder", "rotation"),  # notebook 00's explorer: the frequency ladder and a pair's rotation
    "DecayExplorer": ("decay",),
    "DriftExplorer": ("drift",),
    "ExtensionExplorer": ("extension",),
    "CoPEExplorer": ("cope",),
    "BytesExplorer": ("bytes",),
}


def explorer_html(name: str) -> str | None:
    """The hook where an explorer's widget (``explorers.<name>().widget()``, which needs a kernel) becomes its
    browser twin on the site: for each twin :data:`EXPLORER_TWINS` names, ``ropelab.webexplorers.embed_html(twin,
    inline=True)``, the module inlined in the page so it runs from ``file://`` too (Chromium refuses to import a
    module file there). None when ``ropelab.webexplorers`` is not importable or has no such twin: the page then
    says the explorer needs a kernel. The twins' ``static_files()`` are also copied to ``_static/explorers/`` of the
    built site (:func:`build`), for a page that imports them instead."""
    try:
        webexplorers = importlib.import_module("ropelab.webexplorers")
    except ImportError:
        return None
    twins = EXPLORER_TWINS.get(name, ())
    try:
        parts = [webexplorers.embed_html(twin, inline=True) for twin in twins]
    except (KeyError, ValueError, TypeError):
        return None
    return "\n".join(parts) or None


def _explorer_output(source: str) -> dict:
    m = re.search(r"explorers\.(\w+Explorer)\(", source)
    name = m.group(1) if m else None
    twin = explorer_html(name) if name else None
    if twin is None:
        label = f" ({html.escape(name)})" if name else ""
        twin = (f"<p class='ropelab-explorer-note'><em>Interactive explorer{label}: its sliders need a running "
                "kernel (<code>make lab</code>); the figure above is its default view.</em></p>")
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": twin, "text/plain": "explorer"}}


def figure_caption(png: Path) -> str:
    """A figure's alt text, from its own titles: the SVG that :func:`ropelab.figures.save` writes beside each PNG
    keeps every text of the figure as a comment, in drawing order; an axes draws its title after its other texts
    (matplotlib's ``Axes.get_children``), so the last text drawn directly in each axes group (not a tick, an axis
    label or a legend entry) is its title, and a text outside every axes is the figure's suptitle. Math is kept as
    its TeX, without the dollars. When the SVG is missing or has no title: "Figure" and the name's words."""
    import xml.etree.ElementTree as ET

    words = "Figure: " + png.stem[3:].replace("_", " ") if re.match(r"[0-9]{2}_", png.stem) else png.stem
    svg = png.with_suffix(".svg")
    try:
        parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))  # the texts are in comments
        root = ET.fromstring(svg.read_bytes(), parser=parser)
    except (OSError, ET.ParseError):
        return words
    ns = "{http://www.w3.org/2000/svg}"

    def comment_text(g) -> str:
        m = re.search(r"<!--\s*(.*?)\s*-->", ET.tostring(g, encoding="unicode"), re.S)
        return m.group(1) if m else ""

    suptitles, titles = [], []
    for fig in root.iter(f"{ns}g"):
        if not fig.get("id", "").startswith("figure_"):
            continue
        for child in fig:
            cid = child.get("id", "")
            if cid.startswith("text_"):  # a figure-level text: the suptitle (first: it names the whole figure)
                suptitles.append(comment_text(child))
            elif cid.startswith("axes_"):
                own = [c for c in child if c.get("id", "").startswith("text_")]
                if own:
                    titles.append(comment_text(own[-1]))
    titles = [" ".join(_plain_tex(html.unescape(t)).split()) for t in suptitles + titles]
    titles = [t for t in dict.fromkeys(titles) if t and not re.fullmatch(r"[-+0-9.,e ]*", t)]
    if not titles:
        return words
    text = "Figure: " + "; ".join(titles)
    return text if len(text) <= 300 else text[:297].rsplit(" ", 1)[0] + " ..."


_TEX_SYMBOLS = {"langle": "⟨", "rangle": "⟩", "cdot": "·", "times": "×", "approx": "≈", "le": "≤", "leq": "≤",
                "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "infty": "∞", "pm": "±", "to": "→", "sum": "Σ",
                "prime": "′", "ell": "ℓ", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉"}


def _plain_tex(text: str) -> str:
    """A figure title's math as a reader (or a screen reader) reads it: ``$\\cos(m\\,\\omega_i)$`` becomes
    ``cos(m ω_i)`` and ``\\langle R_m q, R_n k\\rangle`` becomes ``⟨R_m q, R_n k⟩``: the dollars, spacing commands
    and braces go, Greek letters and common symbols become their characters, other commands (``\\cos``,
    ``\\mathrm``) their names."""
    import unicodedata

    def command(m: re.Match) -> str:
        name = m.group(1)
        if name in _TEX_SYMBOLS:
            return _TEX_SYMBOLS[name]
        case = "CAPITAL" if name[0].isupper() else "SMALL"
        try:
            return unicodedata.lookup(f"GREEK {case} LETTER {name.upper()}")
        except KeyError:
            return "" if name in ("mathdefault", "left", "right", "displaystyle") else name

    text = text.replace("$", "")
    text = re.sub(r"\\[,;:! ]", " ", text)  # spacing commands
    accents = {"tilde": "\u0303", "hat": "\u0302", "bar": "\u0304", "vec": "\u20d7", "dot": "\u0307"}
    text = re.sub(r"\\(tilde|hat|bar|vec|dot)\s*\{?(\\?[A-Za-z]+?)\}?(?=[^A-Za-z]|$)",
                  lambda m: _plain_tex(m.group(2)) + accents[m.group(1)], text)  # p̃, not "tildep"
    text = re.sub(r"\\([A-Za-z]+)", command, text)
    return text.replace("{", "").replace("}", "").replace("\\", "")


def _png_size(png: Path) -> tuple[int, int]:
    head = png.read_bytes()[:24]  # the IHDR chunk: width and height, big-endian, at bytes 16..24
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _figure_output(png: Path, site_figures: dict[str, Path]) -> dict:
    """A saved figure under the cell that saved it: its PNG, served from the site's ``_figures/`` (collected in
    ``site_figures``), in a link to itself at full size (``ropelab.js`` opens it in a lightbox), with the figure's
    own titles as alt text (:func:`figure_caption`) and its natural size, which the page scales to the column."""
    site_figures[png.name] = png
    width, height = _png_size(png)
    src = f"../_figures/{html.escape(png.name)}"
    alt = html.escape(figure_caption(png), quote=True)
    tag = (f'<figure class="ropelab-output-figure"><a class="ropelab-zoom" href="{src}" '
           f'title="Open the figure at full size"><img src="{src}" alt="{alt}" width="{width}" height="{height}">'
           "</a></figure>")
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": tag, "text/plain": alt}}


# The lab's "How to run" cell (runner plumbing: SMOKE, the pre-save hook, git status): not on the site, where the
# banner links the guide that says it (docs/guides/running.md). Known by its id in most notebooks, and by its opening
# words in all (08, 09 and 10 gave it other ids, and their pages once opened with it).
LAB_HOW_TO_RUN = "lab-how-to-run"
LAB_HOW_TO_RUN_OPENING = "**How to run.**"


def _is_how_to_run(cell: dict) -> bool:
    return cell.get("id") == LAB_HOW_TO_RUN or (
        cell["cell_type"] == "markdown" and "".join(cell["source"]).lstrip().startswith(LAB_HOW_TO_RUN_OPENING))
SOLUTION_TAG = "ropelab-solution"  # an exercise's solution cell on the site: collapsed behind "Solution"
CHECK_TAG = "ropelab-check"  # an exercise's check cell (lab-exN-check): its code collapsed, its verdict shown
EXPLORER_NOTE = ("*The explorer below runs in your browser, with no kernel: move a control and it redraws. Above: "
                 "its default view, as the last full run saved it.*")


_ARXIV = re.compile(r"(?<![\[\w/])arXiv[: ]([0-9]{4}\.[0-9]{4,5})(?!\]\()")
# A URL not already a link's target (after "](") or text (after "["), an autolink (after "<") or an attribute's value.
_BARE_URL = re.compile(r"(?<!\]\()(?<![<\w/\[\"'=])(https?://[^\s)<>\]\"'`]*[^\s)<>\]\"'`.,;:])")
# "llama.cpp (https://github.com/ggml-org/llama.cpp) #19443, #22612": the issue numbers after a repository's URL
_ISSUES_AFTER_REPO = re.compile(r"\(<https://github\.com/([\w.-]+/[\w.-]+?)/?>\)((?:,? #[0-9]+)+)")
_URL_IN_PARENS = re.compile(r"\]\(https://arxiv\.org/abs/([0-9]{4}\.[0-9]{4,5})\) \(https://arxiv\.org/abs/\1\)")


def link_references(text: str) -> str:
    """Markdown with its bare references made links (the site's review: a bare arXiv id, or a URL that overflows the
    column, is no link): ``arXiv:2309.00071`` or ``arXiv 2309.00071`` not already a link's text becomes a link to
    its abstract (the URL printed after it, if any, is dropped: the link carries it), a bare ``https://`` URL (in
    parentheses too) an autolink, and the issue numbers right after a GitHub repository's URL ("llama.cpp
    (https://github.com/ggml-org/llama.cpp) #19443, #22612") links to those issues (GitHub sends an issue's address
    to its pull request when it is one). Inline code (between backticks) is left as it is."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside inline code
        s = _ARXIV.sub(r"[arXiv:\1](https://arxiv.org/abs/\1)", parts[i])
        s = _URL_IN_PARENS.sub(r"](https://arxiv.org/abs/\1)", s)
        s = _BARE_URL.sub(r"<\1>", s)
        parts[i] = _ISSUES_AFTER_REPO.sub(_link_issues, s)
    return "`".join(parts)


def _link_issues(m: re.Match) -> str:
    repo = m.group(1)
    refs = re.sub(r"#([0-9]+)", lambda n: f"[#{n.group(1)}](https://github.com/{repo}/issues/{n.group(1)})", m.group(2))
    return f"(<https://github.com/{repo}>){refs}"


def _scrub_paths(text: str, roots: tuple[str, ...] = ()) -> str:
    """A notebook output with the build machine's checkout path, and ``roots`` (the checkout the notebook ran in,
    when another: :func:`_run_root`), made repository-relative (``data/lm/x.pt``)."""
    for root in dict.fromkeys((str(REPO), *roots)):
        text = text.replace(root + os.sep, "").replace(root, ".")
    return text


def _scrub_output(out: dict, roots: tuple[str, ...] = ()) -> dict:
    if "text" in out:
        out["text"] = _scrub_paths("".join(out["text"]), roots)
    for mime, value in list(out.get("data", {}).items()):
        if mime.startswith("text/") or mime == "application/javascript":
            out["data"][mime] = _scrub_paths("".join(value) if isinstance(value, list) else value, roots)
    return out


def _run_root(nb: dict, figures_dir: Path) -> tuple[str, ...]:
    """The checkout an executed notebook ran in, when it is not this one (a fresh clone's run copied here): read
    from the runner's injected ``FIGURES_DIR``, which is that checkout's counterpart of ``figures_dir``."""
    import ast

    try:
        suffix = "/" + figures_dir.resolve().relative_to(REPO.resolve()).as_posix()
    except ValueError:
        return ()
    for cell in nb.get("cells", []):
        if INJECTED_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        m = re.search(r"^FIGURES_DIR = (.+)$", "".join(cell["source"]), re.M)
        try:
            value = ast.literal_eval(m.group(1)) if m else None
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, str) and value.endswith(suffix) and value.startswith("/"):
            return (value[: -len(suffix)],)
    return ()


def _runtime_output(stem: str) -> dict:
    from .manifest import load_runs, runtime_text

    text = "**Run time.** " + runtime_text(stem, load_runs())
    return {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": text, "text/plain": text}}


def stage_notebook(src: Path, nb: dict, figures_dir: Path, smoke: bool, images: set[str],
                   modules: set[str] = frozenset(), site_figures: dict[str, Path] | None = None) -> dict:
    """The page made of notebook ``src``'s executed copy ``nb`` (a new dict; ``nb`` is left as it is): banner after
    the title; the runner's injected cell and the lab's how-to-run cell left out; the run-time note rendered from
    ``figures/runs.json`` now (as the map's table is, so the two agree); each saved figure shown under the cell that
    saved it (from ``figures_dir``; collected in ``site_figures``); explorer widgets replaced
    (:func:`explorer_html`); an exercise's solution collapsed behind "Solution" and its check's code collapsed too
    (the check prints a verdict only); links pointed at the site; absolute paths in outputs made relative."""
    nb = json.loads(json.dumps(nb))
    nb.get("metadata", {}).pop("widgets", None)  # the widget state: a page has no kernel to give it to
    site_figures = {} if site_figures is None else site_figures
    own = {p.stem for p in figures_dir.glob(src.stem[:3] + "*.png")}
    roots = _run_root(nb, figures_dir)  # where it ran, if another checkout: its paths are scrubbed too
    cells = []
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        meta = cell.setdefault("metadata", {})
        tags = meta.get("tags", [])
        if INJECTED_TAG in tags or _is_how_to_run(cell):
            continue
        if cell["cell_type"] == "markdown":
            if importlib.util.find_spec("ropelab.webexplorers") is not None:  # the twins replace the kernel's widget
                source = re.sub(r"\*Above: the default view.*?\*", EXPLORER_NOTE, source, flags=re.S)
            # the lab's words for a hidden solution, said for the page's control
            source = source.replace("a hidden solution (click the collapsed cell to show it)",
                                    "a hidden solution (the *Solution* control shows it)")
            cell["source"] = link_references(_rewrite_links(source, "notebooks", "notebooks", images, modules))
        elif cell["cell_type"] == "code":
            if meta.get("jupyter", {}).get("source_hidden"):  # an exercise's solution: collapsed, as in the lab
                meta["tags"] = [*tags, "hide-input", SOLUTION_TAG]
                meta["mystnb"] = {"code_prompt_show": "Solution", "code_prompt_hide": "Hide the solution"}
            elif "parameters" in tags:  # SMOKE and the output folders: for a run, not for reading; one click away
                meta["tags"] = [*tags, "hide-input"]
                meta["mystnb"] = {"code_prompt_show": "Run parameters (SMOKE)", "code_prompt_hide": "Hide"}
            elif re.fullmatch(r"lab-ex[0-9]+-check", cell.get("id", "")):
                meta["tags"] = [*tags, "hide-input", CHECK_TAG]
                meta["mystnb"] = {"code_prompt_show": "The check's code", "code_prompt_hide": "Hide the check's code"}
            if re.search(r"^runtime_note\(", source, re.M):
                meta["tags"] = [*meta.get("tags", []), "remove-input"]
                cell["outputs"] = [_runtime_output(src.stem)]
                cells.append(cell)
                continue
            outputs = [_explorer_output(source) if WIDGET_MIME in out.get("data", {}) else _scrub_output(out, roots)
                       for out in cell.get("outputs", [])]
            saved = [n for n in dict.fromkeys(re.findall(r"[\"']([0-9]{2}_\w+)[\"']", source)) if n in own]
            outputs += [_figure_output(figures_dir / f"{n}.png", site_figures) for n in saved]
            cell["outputs"] = outputs
        cells.append(cell)
    title = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                  and "".join(c["source"]).lstrip().startswith("# ")), -1)
    head_cells = []
    if title >= 0:  # the banner goes right under the title line: split it from the rest of its cell
        head, _, rest = "".join(cells[title]["source"]).lstrip().partition("\n")
        # The page's title is the map's short one (the browser's tab, search results, the previous/next links); the
        # notebook's full title, a sentence, is its subtitle.
        full = head[2:].strip()
        short = _short_titles().get(src.stem, full)
        head_cells = [{**cells[title], "source": f"# {short}"}]
        if short != full:
            sub = full[len(short) + 1:].strip() if full.startswith(short + ":") else full.split(" · ", 1)[-1]
            head_cells.append({"cell_type": "markdown", "id": SUBTITLE_CLASS, "metadata": {},
                               "source": f":::{{container}} {SUBTITLE_CLASS}\n{sub[:1].upper() + sub[1:]}\n:::"})
        head_cells.append(_banner(src, smoke))
        if rest.strip():
            head_cells.append({**cells[title], "id": f"{cells[title].get('id', 'title')}-rest", "source": rest})
        cells[title : title + 1] = head_cells
    else:
        cells.insert(0, _banner(src, smoke))
    nb["cells"] = cells
    return nb


def render_map(images: set[str], modules: set[str] = frozenset()) -> str:
    """The front page's notebook map: the markdown cells of ``notebooks/index.ipynb`` but its first (the title and
    the lab's how-to-run notes, which ``docs/index.md`` and the running guide say for the site), links pointed at
    the site's pages. Its run table is rendered again from ``figures/runs.json`` now
    (:func:`ropelab.figures.render_map`, as each page's run-time note is), and a key figure the map still calls
    to come is shown when ``figures/`` has it."""
    from .manifest import load_runs
    from .manifest import render_map as run_table

    cells = json.loads((NOTEBOOK_DIR / "index.ipynb").read_text(encoding="utf-8"))["cells"]
    parts = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
             and NAV_TAG not in c.get("metadata", {}).get("tags", [])]
    if parts and parts[0].lstrip().startswith("# "):
        parts = parts[1:]
    generated = "<!-- generated from ../figures/runs.json"
    parts = [run_table(load_runs()) if p.lstrip().startswith(generated) else p for p in parts]

    def key_figure(m: re.Match) -> str:
        name = m.group(1)
        if not (REPO / "figures" / f"{name}.png").is_file():
            return m.group(0)
        return f"Key figure, `{name}`:\n\n![{name}](../figures/{name}.png)"

    parts = [re.sub(r"Key figure, `([0-9]{2}_\w+)` \(committed with the first full run\)\.", key_figure, p)
             for p in parts]
    text = "\n\n".join(p.strip() for p in parts if p.strip())
    text = re.sub(r"^(#{2,5}) ", r"#\1 ", text, flags=re.M)  # below docs/index.md's own headings
    text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
    return _rewrite_links(text, "notebooks", "", images, modules)


def _notebook_title(src: Path) -> str:
    for c in json.loads(src.read_text(encoding="utf-8"))["cells"]:
        text = "".join(c["source"]).lstrip()
        if c["cell_type"] == "markdown" and text.startswith("# "):
            return text[2:].split("\n", 1)[0].strip()
    return src.stem


WORDS_PER_MINUTE = 200  # reading time: words of the notebook's text and code at this pace, rounded up


def reading_minutes(src: Path) -> int:
    """Minutes to read notebook ``src``: the words of its markdown and code cells (as committed, outputs aside) at
    :data:`WORDS_PER_MINUTE`, rounded up."""
    cells = json.loads(src.read_text(encoding="utf-8"))["cells"]
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] in ("markdown", "code"))
    return max(1, -(-words // WORDS_PER_MINUTE))


def builds_on(src: Path) -> list[str]:
    """The earlier notebooks (two-digit numbers) that notebook ``src``'s text cites ("notebook 01", "notebooks 00
    and 03", a link to ``03_...ipynb``): what a reader should have read first, read from the notebook itself."""
    own = int(src.stem[:2])
    text = "\n".join("".join(c["source"]) for c in json.loads(src.read_text(encoding="utf-8"))["cells"]
                     if c["cell_type"] == "markdown" and NAV_TAG not in c.get("metadata", {}).get("tags", []))
    found = set(re.findall(r"\]\(([0-9]{2})_\w+\.ipynb", text))
    for m in re.finditer(r"[Nn]otebooks? ((?:[0-9]{2}(?:,? and |, | or |–| to )?)+)", text):
        found |= set(re.findall(r"[0-9]{2}", m.group(1)))
    return sorted(n for n in found if int(n) < own)


def render_path() -> str:
    """The front page's "Start here" table: each notebook in reading order, the earlier ones it builds on
    (:func:`builds_on`), its reading time (:func:`reading_minutes`) and its full run's time from
    ``figures/runs.json`` (the map's source)."""
    from .manifest import load_runs, seconds_text

    runs = load_runs()
    rows = ["| | notebook | earlier notebooks it cites | to read | full run |", "|---|---|---|---|---|"]
    for i, src in enumerate(notebooks(), 1):
        stems = {p.stem[:2]: p.name for p in notebooks()}
        before = ", ".join(f"[{n}]({stems[n]})" for n in builds_on(src) if n in stems)
        before = before or ("start here" if i == 1 else "none by number")
        run = seconds_text(runs[src.stem]["seconds"]) if src.stem in runs else "not recorded"
        rows.append(f"| {i} | [{_notebook_title(src)}]({src.name}) | {before} | {reading_minutes(src)} min | {run} |")
    return _rewrite_links("\n".join(rows), "notebooks", "", set())


ARCHIVE = "ropelab-src.tar.gz"  # the source the site carries (git archive of the checkout's tree at build time)


def render_cite() -> str:
    """The citation block, from ``CITATION.cff`` (its title, authors, version, licence and references)."""
    import yaml

    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    authors = " and ".join(a.get("name") or f"{a.get('family-names', '')}, {a.get('given-names', '')}"
                           for a in cff.get("authors", []))
    bib = ["@software{ropelab,", f"  title   = {{{{{cff['title']}}}}},", f"  author  = {{{{{authors}}}}},",
           f"  version = {{{cff.get('version', '')}}},", f"  license = {{{cff.get('license', '')}}},", "}"]
    refs = []
    for r in cff.get("references", []):
        names = ", ".join(a.get("family-names", a.get("name", "")) for a in r.get("authors", []))
        ids = "; ".join(i.get("value", "") for i in r.get("identifiers", []))
        refs.append(f"- {names} ({r.get('year', '')}). *{r.get('title', '')}*. {ids}")
    text = [cff.get("message", ""), "", "```bibtex", *bib, "```"]
    if refs:
        text += ["", "It builds on:", "", *refs]
    return "\n".join(text)


# --------------------------------------------------------------------------------------------------
# The API reference
# --------------------------------------------------------------------------------------------------


def api_modules() -> list[tuple[str, str]]:
    """(module, its one-line job) for every public module: the list in ``ropelab``'s docstring (a deprecated alias
    left out), and for a package that exports nothing itself (empty ``__all__``) its public submodules instead."""
    import ropelab

    listed = re.findall(r"^- ``(\w+)``( \(the module\))?: (.*?)(?=^- ``|\n\n|\Z)", ropelab.__doc__, re.M | re.S)
    out = []  # ropelab itself: docs/api/index.md shows its docstring
    for name, _, job in listed:
        job = " ".join(job.split()).rstrip(";.")
        if "deprecated alias" in job:
            continue
        full = f"ropelab.{name}"
        module = importlib.import_module(full)
        if hasattr(module, "__path__") and not getattr(module, "__all__", None):
            for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda i: i.name):
                if not info.name.startswith("_"):
                    sub = importlib.import_module(f"{full}.{info.name}")
                    first = " ".join((sub.__doc__ or "").strip().split("\n\n")[0].split())
                    out.append((f"{full}.{info.name}", _first_sentence(first)))
        else:
            out.append((full, job))
    return out


def _first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph: up to the first ". " or ": " outside parentheses (a
    period inside one, as in "(the design. ...)", once cut the summary mid-parenthesis), without its stop."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch in ".:" and text[i + 1:i + 2] in ("", " "):
            return text[:i]
    return text.rstrip(".:")


# The API reference by topic, in the order a newcomer looks for things: what to call first, then the frequencies
# and long context, other encodings, checking an implementation, speed, the notebooks' own studies, and last the
# project's machinery. Each topic: (title, what it is for, module prefixes); a module goes to the first topic with
# a prefix it starts with, and one no topic names goes to the last (a test checks that none does).
API_TOPICS = (
    ("Rotate q and k: start here", "The one call (`apply_rope`), the primitives under it, one validated setting "
     "read from a Hugging Face config, and the conversion between the two pairing styles.",
     ("ropelab.rope", "ropelab.core", "ropelab.spec", "ropelab.convert")),
    ("Frequencies, scaling and long context", "The frequency ladder and every Hugging Face `rope_type`, the "
     "context-extension methods, precision, decay, KV caches under length-dependent scalings, context parallelism.",
     ("ropelab.scaling", "ropelab.extend", "ropelab.precision", "ropelab.decay", "ropelab.kvcache",
      "ropelab.staleness", "ropelab.context_parallel")),
    ("Other encodings and architectures", "Multi-axis RoPE (M-RoPE, axial), MLA's decoupled RoPE, p-RoPE, CoPE, "
     "and the attention helpers they are measured with.",
     ("ropelab.multiaxis", "ropelab.mla", "ropelab.prope", "ropelab.cope", "ropelab.attention")),
    ("Checking an implementation", "The black-box checker, the conformance sweep against transformers' own code, "
     "and how each engine (transformers, llama.cpp's GGUF, MLX) reads a model's RoPE.",
     ("ropelab.diagnosis", "ropelab.conformance", "ropelab.engines")),
    ("Kernels and speed", "The fused kernels, the byte model, the benchmarks and the machine record they print "
     "with.", ("ropelab.kernels", "ropelab.bench", "ropelab.machine")),
    ("The notebooks' models and studies", "The tiny models the notebooks train, one study module per notebook, "
     "and the explorers.",
     ("ropelab.models", "ropelab.adapters", "ropelab.lm", "ropelab.extension", "ropelab.studies",
      "ropelab.explorers", "ropelab.webexplorers")),
    ("Running the project (maintainers)", "The notebook runner, the figure manifest, this site, the notebook "
     "filter and the repository's paths.",
     ("ropelab.figures", "ropelab.manifest", "ropelab.site", "ropelab.nbclean", "ropelab.paths")),
)


def api_topics(modules: list[tuple[str, str]]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``modules`` (:func:`api_modules`) grouped by :data:`API_TOPICS`: (title, what it is for, [(module, job)]),
    in the topics' order, each topic's modules in the order of its prefixes; empty topics left out."""
    def place(module: str) -> tuple[int, int]:  # (its topic, its prefix's rank there)
        for k, (_, _, prefixes) in enumerate(API_TOPICS):
            for j, pre in enumerate(prefixes):
                if module == pre or module.startswith(pre + "."):
                    return k, j
        return len(API_TOPICS) - 1, len(API_TOPICS[-1][2])

    ranked = sorted(modules, key=lambda m: place(m[0]))  # stable: a package's submodules keep their order
    groups = [(title, why, [m for m in ranked if place(m[0])[0] == k]) for k, (title, why, _) in enumerate(API_TOPICS)]
    return [g for g in groups if g[2]]


def api_title(module: str, job: str) -> str:
    """An API page's title: the module and what it is, its job without its parentheses, up to its first semicolon
    and cut at a word within 100 characters: what the sidebar and the browser's tab show."""
    kept, depth = [], 0
    for ch in job:  # the job without its parentheses, up to its first semicolon
        if depth == 0 and ch == ";":
            break
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch != ")":
            kept.append(ch)
    short = " ".join("".join(kept).split()).replace(" ,", ",").replace(" :", ":")
    if len(short) > 100:
        short = short[:100].rsplit(" ", 1)[0].rstrip(",;:") + " …"
    short = short.replace("``", "`").strip(" ,:")
    return f"`{module}` — {short}" if short else f"`{module}`"


def _api_page(module: str, job: str = "") -> str:
    mod = importlib.import_module(module)
    is_package = hasattr(mod, "__path__")
    options = ["   :members:", "   :show-inheritance:"]
    if module == "ropelab":  # the package's names are documented in their own modules; here only its docstring
        options = []
    elif is_package:
        options.append("   :imported-members:")  # a package's __all__ re-exports its submodules' names
    return "\n".join([f"# {api_title(module, job)}", "", "```{eval-rst}", f".. automodule:: {module}", *options, "```",
                      ""])


def _api_index(template: str, modules: list[tuple[str, str]]) -> str:
    def escape(text: str) -> str:
        return text.replace("|", "\\|")

    parts = []
    for title, why, group in api_topics(modules):
        rows = ["| module | its job |", "|---|---|"]
        rows += [f"| [`{m}`]({m}.md) | {escape(job)} |" for m, job in group]
        # one toctree per topic, captioned: the sidebar shows the modules under their topic
        toc = ["```{toctree}", ":hidden:", ":maxdepth: 1", f":caption: {title}", "", *[m for m, _ in group], "```"]
        parts += [f"### {title}", "", why, "", *rows, "", *toc, ""]
    return template.replace(MODULES_MARKER, "\n".join(parts))


# --------------------------------------------------------------------------------------------------
# Staging and building
# --------------------------------------------------------------------------------------------------


def _write(path: Path, text: str | bytes) -> None:
    """Write only when the bytes change, so Sphinx's incremental build re-reads only what changed."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _short_titles() -> dict[str, str]:
    """Notebook stem -> its short title, as the map's table links it (``00 · RoPE in one page``): the sidebar's and
    the previous/next links' text, where a page's full title (a sentence) overflowed."""
    cells = json.loads((NOTEBOOK_DIR / "index.ipynb").read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {stem: label for label, stem in re.findall(r"\[([0-9]{2} · [^\]]+)\]\(([0-9]{2}_\w+)\.ipynb\)", text)}


def _notebooks_index() -> str:
    """The Notebooks section's page: the notebooks in the runner's order (:func:`ropelab.manifest.notebooks`), each
    under its short title (:func:`_short_titles`)."""
    intro = ("Each notebook as the runner executed it, outputs and figures included; read them in order, each builds "
             "on the ones before. The [map](../index.md) says what each found.")
    short = _short_titles()
    entries = [f"{short[p.stem]} <{p.stem}>" if p.stem in short else p.stem for p in notebooks()]
    toc = ["```{toctree}", ":maxdepth: 1", "", *entries, "```", ""]
    return "\n".join(["# Notebooks", "", intro, "", *toc])


# The guides in a reader's order: running first, the contributors' guide last; a guide not named here comes
# after these, before the contributors' guide, in name order.
GUIDES_ORDER = ("running", "notebooks", "instructors", "package", "diagnose", "conformance", "benchmarks", "data",
                "modules")


def _guides_index(guides: list[str]) -> str:
    """The Guides section's page, when ``docs/guides/`` brings none: its pages (``guides``, their stems) in
    :data:`GUIDES_ORDER`."""
    if not guides:
        return "# Guides\n\nNo guide yet: each is a page of `docs/guides/`.\n"
    rank = {name: i for i, name in enumerate(GUIDES_ORDER)}
    order = sorted(guides, key=lambda g: (g == "adding-a-notebook", rank.get(g, len(rank)), g))
    return "# Guides\n\n```{toctree}\n:maxdepth: 1\n\n" + "\n".join(order) + "\n```\n"


def stage(executed: dict[Path, tuple[dict, Path]], src_dir: Path, smoke: bool = False,
          site_figures: dict[str, Path] | None = None) -> list[Path]:
    """Write the site's sources into ``src_dir``: ``docs/`` (its ``conf.py`` and ``_static/`` aside, which Sphinx
    reads in place), the front page with the map, the README as a page, one API page per module, the staged
    notebooks, the figures the markdown shows. Markdown links everywhere are pointed at the staged pages. Files from
    an earlier staging that are no longer part of the site are removed. The figures the notebook pages show are
    collected in ``site_figures`` (name -> PNG), for :func:`build` to copy. Returns the files written."""
    images: set[str] = set()
    modules = api_modules()
    names = {m for m, _ in modules} | {"ropelab"}
    pages: dict[str, str | bytes] = {}
    for path in sorted(DOCS_DIR.rglob("*")):
        rel = path.relative_to(DOCS_DIR).as_posix()
        skip = rel == "conf.py" or rel.startswith(("_static/", "_build/")) or "__pycache__" in rel
        if path.is_file() and not skip:
            data = path.read_bytes()
            if path.suffix == ".md":
                where = posixpath.dirname(rel)
                data = _rewrite_links(data.decode(), posixpath.join("docs", where), where, images, names)
            pages[rel] = data
    if MAP_MARKER not in pages.get("index.md", ""):
        raise SystemExit(f"{DOCS_DIR / 'index.md'} must hold the line {MAP_MARKER} (where the notebook map goes).")
    pages["index.md"] = (pages["index.md"].replace(MAP_MARKER, render_map(images, names))
                         .replace(PATH_MARKER, render_path()).replace(GET_MARKER, render_get())
                         .replace(CITE_MARKER, render_cite()))
    pages["readme.md"] = _rewrite_links((REPO / "README.md").read_text(encoding="utf-8"), "", "", images, names)
    pages["notebooks/index.md"] = _notebooks_index()
    if "guides/index.md" not in pages:
        pages["guides/index.md"] = _guides_index([posixpath.splitext(posixpath.basename(p))[0] for p in pages
                                                  if p.startswith("guides/") and p.endswith(".md")])
    api_template = pages.get("api/index.md", f"# API reference\n\n{MODULES_MARKER}\n")
    pages["api/index.md"] = _api_index(api_template, modules)
    for module, job in modules:
        pages[f"api/{module}.md"] = _api_page(module, job)
    site_figures = {} if site_figures is None else site_figures
    for src, (nb, figures_dir) in executed.items():
        page = stage_notebook(src, nb, figures_dir, smoke, images, names, site_figures)
        pages[f"notebooks/{src.name}"] = json.dumps(page, indent=1, ensure_ascii=False) + "\n"
    for image in sorted(images):
        pages[image] = (REPO / image).read_bytes()  # the committed figures the markdown shows (the map, explorers)
    for rel, data in pages.items():
        _write(src_dir / rel, data)
    for old in sorted(src_dir.rglob("*"), reverse=True):
        rel = old.relative_to(src_dir).as_posix()
        if old.is_file() and rel not in pages:
            old.unlink()
    return [src_dir / rel for rel in pages]


def render_get() -> str:
    """How to get the code and run it: the source archive the site carries (:data:`ARCHIVE`, written by
    :func:`build`), unpacked, then ``make lab``."""
    return "\n".join([
        "ropelab has no public repository to link to: this site carries its source instead, as of the build that made "
        f'the site: <a class="ropelab-archive" href="{ARCHIVE}" download><code>{ARCHIVE}</code></a> (notebooks, '
        "package, tests, committed data and figures; every page also offers its own notebook). Two commands, with "
        "Python 3.10 or later and `make` (Linux or macOS; no GPU, no conda):", "",
        "```bash", f"tar -xzf {ARCHIVE} && cd ropelab", "make lab EXTRAS=notebooks", "```", "",
        "`make lab` creates `.venv`, installs ropelab with the notebooks' dependencies (`EXTRAS=notebooks`: only "
        "those; a CPU build of PyTorch) and opens JupyterLab on the notebook map; open a notebook and choose "
        "*Kernel → Restart Kernel and Run All Cells*. "
        "Without `make`: `python -m venv .venv`, `.venv/bin/pip install torch==2.13.0 -e \".[notebooks]\"`, then "
        "`.venv/bin/jupyter lab notebooks/00_rope_in_one_page.ipynb`.",
    ])


def _write_archive(out: Path) -> Path | None:
    """The source archive (:data:`ARCHIVE`) of this checkout's tracked files as they are now (``git stash create``
    records uncommitted changes without touching the work tree; HEAD when there are none), under ``ropelab/``.
    None, with a message, when this is not a git checkout."""
    git = ["git", "-C", str(REPO)]
    try:
        rev = subprocess.run([*git, "stash", "create"], capture_output=True, text=True, check=True).stdout.strip()
        target = out / ARCHIVE
        subprocess.run([*git, "archive", "--format=tar.gz", "--prefix=ropelab/", "-o", str(target), rev or "HEAD"],
                       capture_output=True, text=True, check=True)
        return target
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"no source archive: {REPO} is not a git checkout git can archive ({e})", file=sys.stderr)
        return None


def _prune_mathjax(out: Path) -> None:
    """sphinx-mathjax-offline copies all of MathJax 3 (24 MB); a page loads ``tex-chtml.js``, which fetches from
    its own folder only the TeX extensions it autoloads, the menu's parts and the CommonHTML fonts. The other
    combined builds, the SVG output and the speech rule engine are never fetched (``a11y`` stays: the menu's
    accessibility options load it, and so does the speech rule engine's English maps)."""
    mathjax = out / "_static" / "mathjax"
    if not mathjax.is_dir():
        return
    for p in mathjax.glob("*.js"):
        if p.name != "tex-chtml.js":
            p.unlink()
    for sub in ("output/svg", "output/svg.js", "adaptors"):
        target = mathjax / sub
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    # The speech rule engine's maps stay for English (the menu's speech and explorer, for a screen reader): without
    # them MathJax asked for sre/mathmaps/{base,en}.json and got 404s; the other locales go.
    for p in (mathjax / "sre" / "mathmaps").glob("*.json"):
        if p.name not in ("base.json", "en.json"):
            p.unlink()


def _copy_explorer_files(out: Path) -> None:
    """The browser twins' files (``ropelab.webexplorers.static_files()``, when that module is importable) into
    ``_static/explorers/`` of the site (``embed_html``'s default ``base_url``)."""
    try:
        webexplorers = importlib.import_module("ropelab.webexplorers")
    except ImportError:
        return
    if hasattr(webexplorers, "static_files"):
        target = out / "_static" / "explorers"
        target.mkdir(parents=True, exist_ok=True)
        for f in webexplorers.static_files():
            shutil.copy2(f, target / Path(f).name)


def _copy_downloads(out: Path, site_figures: dict[str, Path]) -> None:
    """What the pages link to beside themselves: each figure a notebook page shows (``_figures/``, at full size),
    each notebook's stripped source (``notebooks/NN_name.ipynb``, beside its page) and the source archive."""
    figures = out / "_figures"
    if figures.is_dir():
        shutil.rmtree(figures)
    figures.mkdir(parents=True)
    for name, png in site_figures.items():
        shutil.copy2(png, figures / name)
    for src in notebooks():
        shutil.copy2(src, out / "notebooks" / src.name)
    _write_archive(out)


def _env() -> dict:
    """The environment of the processes the builder starts (Sphinx, the runner): this checkout's package first."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def build(smoke: bool = False, out: str | os.PathLike | None = None, run_missing: bool = False,
          jobs: int = 1, quiet: bool = True) -> dict:
    """Stage and build the site; returns ``out`` (the HTML folder), ``seconds`` (staging and Sphinx), ``bytes``
    (the site's size), ``pages`` (HTML files) and ``warnings`` (Sphinx's, one string each). Raises SystemExit when
    an executed notebook is missing (see :func:`executed_notebooks`) or Sphinx fails."""
    base = BUILD_DIR / "smoke" if smoke else BUILD_DIR
    out = Path(out) if out is not None else base / "site"
    src_dir = base / "site-src"
    start = time.perf_counter()
    executed = executed_notebooks(smoke=smoke, run_missing=run_missing)
    site_figures: dict[str, Path] = {}
    stage(executed, src_dir, smoke=smoke, site_figures=site_figures)
    warnings_file = out.parent / f"{out.name}-warnings.txt"
    doctrees = out.parent / f"{out.name}-doctrees"  # Sphinx's cache, beside the site (not published with it)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(DOCS_DIR), "-d", str(doctrees),
           "-w", str(warnings_file), "-j", str(jobs), str(src_dir), str(out)] + (["-q"] if quiet else [])
    proc = subprocess.run(cmd, env=_env())
    if proc.returncode != 0:
        raise SystemExit(f"sphinx-build failed (exit {proc.returncode}); its warnings are in {warnings_file}")
    _prune_mathjax(out)
    _copy_explorer_files(out)
    _copy_downloads(out, site_figures)
    seconds = time.perf_counter() - start
    warnings = [w for w in warnings_file.read_text().splitlines() if "WARNING" in w or "ERROR" in w]
    return {"out": out, "seconds": round(seconds, 1), "bytes": _size(out),
            "pages": len(list(out.rglob("*.html"))), "warnings": warnings}


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.site [--smoke] [--out DIR] [--run-missing] [--jobs N]``."""
    parser = argparse.ArgumentParser(prog="python -m ropelab.site", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="from build/smoke/*.ipynb into build/smoke/site/")
    parser.add_argument("--out", help="the HTML folder (default build/site/, or build/smoke/site/ with --smoke)")
    parser.add_argument("--run-missing", action="store_true",
                        help="run the figures runner for notebooks with no current executed copy")
    parser.add_argument("--jobs", type=int, default=1, help="Sphinx's parallel jobs (default 1)")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    args = parser.parse_args(argv)
    r = build(smoke=args.smoke, out=args.out, run_missing=args.run_missing, jobs=args.jobs, quiet=not args.verbose)
    for w in r["warnings"]:
        print(w)
    print(f"built {r['pages']} pages into {r['out']} in {r['seconds']:.0f} s, {r['bytes'] / 1e6:.1f} MB, "
          f"{len(r['warnings'])} warnings; open {r['out'] / 'index.html'} or serve it: "
          f"python -m http.server -d {r['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
