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
]

# The notebooks ran before (`make figures`, or `python -m ropelab.figures --smoke`): render their outputs only.
nb_execution_mode = "off"
# No CDN: a page with a widget output would load require.js and the widget manager from unpkg. ropelab.site
# replaces explorer widgets by their browser twins (or a note) and drops the widget state.
nb_ipywidgets_js = {}
nb_merge_streams = True
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
html_show_sourcelink = False
# Search results without page excerpts: an excerpt is a fetch() of the page, which Chromium refuses from file://
# (build/site/index.html opened from disk); the results themselves come from searchindex.js and work there too.
html_show_search_summary = False
html_copy_source = False
