# JupyterLab settings for this repository, loaded by `make lab` (JUPYTER_CONFIG_PATH=.jupyter).
# Every save of a notebook under notebooks/ (autosave included) writes it stripped of outputs, so reading
# and running the notebooks never changes a tracked file. The strip rule is ropelab/nbclean.py's.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # works before `pip install -e .` too
from ropelab.nbclean import pre_save_hook  # noqa: E402

c.FileContentsManager.pre_save_hook = pre_save_hook  # noqa: F821 (c is the config object Jupyter passes)
