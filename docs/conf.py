"""Sphinx configuration of ropelab's site (``make site``, ``python -m ropelab.site``).

Sphinx reads the sources that :mod:`ropelab.site` stages under ``build/site-src/`` (copies of the executed
notebooks, this folder's pages, the generated API pages) with this file (``sphinx-build -c docs``). myst-nb renders
the notebooks with the outputs they already have: nothing is executed. Everything a page loads is served by the
site itself (MathJax included, from ``sphinx-mathjax-offline``), so it reads offline and from ``file://``.
"""

project = "ropelab"
author = "ropelab contributors"
copyright = "ropelab contributors, MIT licence"

extensions = [
    "myst_nb",  # .md (MyST) and .ipynb pages; brings myst_parser
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings' Args: / Returns: sections (Google style)
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # copies MathJax 3 into _static/mathjax and points mathjax_path there
    "sphinx_copybutton",  # a copy button on every code block (pure JavaScript: offline and from file:// too)
]
copybutton_prompt_text = r">>> |\.\.\. |\$ "  # what a reader pastes: the command, not its prompt
copybutton_prompt_is_regexp = True
copybutton_exclude = ".linenos, .gp, .go"

# The notebooks ran before (`make figures`, or `python -m ropelab.figures --smoke`): render their outputs only.
nb_execution_mode = "off"
# No CDN: a page with a widget output would load require.js and the widget manager from unpkg. ropelab.site
# replaces explorer widgets by their browser twins (or a note) and drops the widget state.
nb_ipywidgets_js = {}
nb_merge_streams = True
# Markdown outputs (the "Answer." and "In one line." paragraphs, built in code) are parsed as MyST, with the same
# extensions as the pages: their $...$ math renders (commonmark, myst-nb's default, left it as raw TeX).
nb_render_markdown_format = "myst"
# A library's warnings on stderr (transformers' config notices) are not part of a notebook's argument.
nb_output_stderr = "remove"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
# MathJax's options: the notebooks write inline math as $...$ (myst's dollarmath turns it into \(...\)).
mathjax3_config = {"tex": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]]}}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["flash_attn", "liger_kernel"]  # the gpu extra: not installed by make test

exclude_patterns = ["**.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # notebooks start sections at ## after a # title, some jump a level

html_theme = "pydata_sphinx_theme"
html_title = "ropelab"
html_theme_options = {
    "navigation_with_keys": False,
    "show_prev_next": True,  # the theme's own previous/next at the foot of each page, in toctree order
    "navbar_align": "left",
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
# The theme's light/dark mode follows the reader's system; unset, its script logs "Got invalid theme mode" as an error.
html_context = {"default_mode": "auto"}
html_static_path = ["_static"]
html_css_files = ["ropelab.css"]
html_js_files = ["ropelab.js"]  # figures open at full size in a lightbox (and their link works without it)
html_favicon = "_static/favicon.svg"
# Notebook pages drop the left sidebar (the banner and the theme's previous/next link the notebooks): their column
# is then wide enough for the figures and outputs. The other pages keep it.
html_sidebars = {"notebooks/[0-9]*": []}
html_show_sourcelink = False
# Search results with an excerpt of each page (a fetch() of the page; from file:// Chromium refuses it, and the
# results come without excerpts, from searchindex.js, as before).
html_show_search_summary = True
html_copy_source = False


def _relative(text):
    """The build machine's checkout path made repository-relative (``data/lm/x.pt``) and its interpreter
    ``python``: a default like ``DATA_DIR / "lm" / ...`` is evaluated when the module is imported, so its signature
    would show this machine's path (``autodoc_preserve_defaults`` would show the source text instead, but cannot
    read wrapped functions)."""
    import sys

    from ropelab.paths import REPO

    if not text:
        return text
    text = text.replace(sys.executable, "python")  # a default of sys.executable: the build's interpreter
    return text.replace(str(REPO) + "/", "").replace(str(REPO), ".")


def _relative_signature(app, what, name, obj, options, signature, return_annotation):
    return _relative(signature), _relative(return_annotation)


def _relative_docstring(app, what, name, obj, options, lines):
    lines[:] = [_relative(line) for line in lines]


def setup(app):
    app.connect("autodoc-process-signature", _relative_signature)
    app.connect("autodoc-process-docstring", _relative_docstring)
