"""Keep notebook outputs out of git: one strip rule for the Jupyter pre-save hook and the git filter.

Two guards, both set up by the Makefile:

- ``make lab`` starts JupyterLab with ``.jupyter/jupyter_server_config.py``, which installs
  :func:`pre_save_hook`: every save (autosave included) of a notebook under ``notebooks/`` writes it
  stripped. The outputs stay in the browser tab until it is closed; they are never written to disk.
- ``make setup`` runs ``python -m ropelab.nbclean`` (:func:`install_git_filter`), which sets this clone's
  ``filter.nbstripout`` and ``diff.ipynb`` in ``.git/config``; ``.gitattributes`` applies them to
  ``notebooks/*.ipynb``. A notebook saved with outputs by another editor is stripped on ``git add``, and
  ``git status`` / ``git diff`` compare the stripped text, so they stay clean.

Both strip with nbstripout (outputs, execution counts, the metadata in :data:`EXTRA_KEYS`), keeping cell
ids, so a stripped notebook is byte-identical to the committed one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["EXTRA_KEYS", "strip", "pre_save_hook", "install_git_filter"]

# nbstripout's own defaults, and what JupyterLab adds to a notebook on save (the language's version and
# lexers): without them a save from the lab differs from the committed file. The kernel's display name,
# which the lab also rewrites ("Python 3 (ipykernel)"), is required by nbformat; the pre-save hook keeps
# the one on disk instead.
EXTRA_KEYS = (
    "metadata.signature",
    "metadata.widgets",
    "metadata.language_info.codemirror_mode",
    "metadata.language_info.file_extension",
    "metadata.language_info.mimetype",
    "metadata.language_info.nbconvert_exporter",
    "metadata.language_info.pygments_lexer",
    "metadata.language_info.version",
    "cell.metadata.collapsed",
    "cell.metadata.ExecuteTime",
    "cell.metadata.execution",
    "cell.metadata.heading_collapsed",
    "cell.metadata.hidden",
    "cell.metadata.scrolled",
    "cell.metadata.trusted",
)


def strip(nb):
    """Strip a notebook (an ``nbformat.NotebookNode``) in place and return it: no outputs, no execution
    counts, none of :data:`EXTRA_KEYS`; cell ids are kept.

    Args:
        nb: the notebook (needs ``nbstripout``).
    """
    from nbstripout import strip_output

    return strip_output(nb, keep_output=False, keep_count=False, keep_id=True, extra_keys=list(EXTRA_KEYS))


def pre_save_hook(model, path, **kwargs):
    """Jupyter server pre-save hook: strip notebooks saved under a ``notebooks/`` folder (the project's;
    a notebook elsewhere keeps its outputs).

    Args:
        model: the Jupyter contents model being saved; its ``content`` is replaced by the stripped notebook. A
            model that is not a notebook, or has no content, is left alone.
        path: the notebook's path as the server names it.
        **kwargs: the server's other arguments; ``contents_manager`` locates the file on disk, whose kernelspec
            is kept when the lab sends the same kernel under another display name.
    """
    if model.get("type") != "notebook" or model.get("content") is None:
        return
    if "notebooks" not in Path(path).parts[:-1]:
        return
    import nbformat

    nb = nbformat.from_dict(model["content"])
    cm = kwargs.get("contents_manager")
    on_disk = Path(cm._get_os_path(path)) if cm is not None and hasattr(cm, "_get_os_path") else None
    if on_disk is not None and on_disk.exists():
        try:
            old = nbformat.read(on_disk, as_version=4).metadata.get("kernelspec")
        except Exception:  # an unreadable file on disk: save what the lab sends
            old = None
        new = nb.metadata.get("kernelspec")
        if old and new and old.get("name") == new.get("name"):
            nb.metadata["kernelspec"] = old  # the lab renames the kernel "Python 3 (ipykernel)"; keep the file's
    model["content"] = strip(nb)


def install_git_filter(repo: str | Path = ".", python: str = sys.executable) -> list[list[str]]:
    """Configure this clone's git to strip notebooks (``.gitattributes`` names the files): sets
    ``filter.nbstripout.clean`` / ``smudge`` / ``required`` / ``extrakeys`` and ``diff.ipynb.textconv``
    in the repository's own config. Returns the commands run.

    Args:
        repo: the clone's folder (``git config`` runs there; a failing command raises CalledProcessError).
        python: the interpreter the filter runs ``nbstripout`` with.
    """
    clean = f"'{python}' -m nbstripout --keep-id"
    commands = [
        ["git", "config", "filter.nbstripout.clean", clean],
        ["git", "config", "filter.nbstripout.smudge", "cat"],
        ["git", "config", "filter.nbstripout.required", "true"],
        ["git", "config", "filter.nbstripout.extrakeys", " ".join(EXTRA_KEYS)],
        ["git", "config", "diff.ipynb.textconv", f"'{python}' -m nbstripout --keep-id -t"],
    ]
    for c in commands:
        subprocess.run(c, cwd=repo, check=True)
    return commands


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit("usage: python -m ropelab.nbclean   (sets this clone's nbstripout git filter; see the docstring)")
    for c in install_git_filter():
        print(" ".join(c))
