"""ropelab.paths: one definition of the directories, and the data directory's documented fallbacks."""

from __future__ import annotations

import subprocess
import sys

from ropelab import figures, lm, paths


def test_one_repo_and_the_checkout_layout():
    assert (paths.REPO / "ropelab" / "paths.py").is_file()
    assert paths.DATA_DIR == paths.REPO / "data" and (paths.DATA_DIR / "README.md").is_file()
    assert figures.REPO is paths.REPO and figures.DATA_DIR is paths.DATA_DIR and figures.BUILD_DIR is paths.BUILD_DIR
    assert lm.CORPUS.is_relative_to(paths.DATA_DIR)


def test_environment_variable_overrides_the_data_dir(tmp_path):
    code = "import ropelab.paths as p, ropelab.lm as lm; print(p.DATA_DIR); print(lm.CHECKPOINT)"
    env = {"ROPELAB_DATA": str(tmp_path), "PYTHONPATH": str(paths.REPO)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    out = run.stdout.split()
    assert out[0] == str(tmp_path) and out[1].startswith(str(tmp_path))


def test_data_dir_resolution_order(tmp_path, monkeypatch):
    monkeypatch.delenv("ROPELAB_DATA", raising=False)
    assert paths.data_dir() == paths.REPO / "data"  # no ropelab/data in a checkout
    monkeypatch.setenv("ROPELAB_DATA", str(tmp_path))
    assert paths.data_dir() == tmp_path
