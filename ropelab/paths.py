"""Where ropelab's files live: one definition of the repository, data, build and figure directories.

In a source checkout (``pip install -e .`` or ``PYTHONPATH=.``) everything is under the repository root
``REPO``, the parent of the package directory. An installed wheel carries only the package, so the data
directory is found in this order (the first that exists wins):

1. the environment variable ``ROPELAB_DATA`` (point it at a checkout's ``data/``);
2. ``ropelab/data`` inside the installed package (``importlib.resources``), for a build that ships it;
3. ``data/`` of the source checkout.

If none exists, ``DATA_DIR`` is the checkout path anyway and reading a file from it raises
``FileNotFoundError`` with that path, rather than a silent fallback. ``BUILD_DIR`` (executed notebooks,
evaluation outputs) defaults to ``build/`` of the checkout, or ``ROPELAB_BUILD`` when set.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

__all__ = ["REPO", "DATA_DIR", "BUILD_DIR", "FIGURES_DIR", "NOTEBOOK_DIR", "data_dir"]

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The data directory, resolved as the module docstring says (``ROPELAB_DATA``, the package, the checkout)."""
    env = os.environ.get("ROPELAB_DATA")
    if env:
        return Path(env)
    packaged = resources.files("ropelab") / "data"
    if packaged.is_dir():
        return Path(str(packaged))
    return REPO / "data"


DATA_DIR = data_dir()
BUILD_DIR = Path(os.environ.get("ROPELAB_BUILD", REPO / "build"))
FIGURES_DIR = REPO / "figures"
NOTEBOOK_DIR = REPO / "notebooks"
