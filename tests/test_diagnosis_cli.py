"""The command line (python -m ropelab.diagnosis, ropelab-diagnose): exit 0 correct, 1 a diagnosed
problem and nothing else, 2 a usage error named in one line."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ropelab
from ropelab.diagnosis.__main__ import main

CLI_MODULE = """
from ropelab import apply_rope
from ropelab.diagnosis import zoo
good = lambda x: apply_rope(x, layout="b s h d")
bad = zoo.esm_old()
"""


@pytest.fixture
def my_rope(tmp_path, monkeypatch):
    (tmp_path / "my_rope.py").write_text(CLI_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_exit_codes(my_rope, capsys):
    assert main(["my_rope:good", "--layout", "b s h d", "--sizes", "h=4,d=16", "--max-position", "256"]) == 0
    assert "OK: a correct RoPE" in capsys.readouterr().out
    assert main(["my_rope:bad", "--layout", "b s h d", "--max-position", "256", "--expect", "base=10000"]) == 1
    assert "rotates along axis h" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["no_such_module_xyz:f", "--layout", "b s h d"], "cannot import module"),
        (["my_rope:nothing", "--layout", "b s h d"], "has no attribute"),
        (["my_rope", "--layout", "b s h d"], "MODULE:CALLABLE"),
        (["my_rope:good", "--layout", "b s h d", "--sizes", "h4"], "--sizes"),
        (["my_rope:good", "--layout", "b s h d", "--sizes", "h=four"], "--sizes"),
        (["my_rope:good", "--layout", "b s h d", "--expect", "bse=1"], "--expect"),
        (["my_rope:good", "--layout", "b s h d", "--expect", "base=ten"], "--expect"),
        (["my_rope:good", "--layout", "b s h d", "--expect", "pairing=half"], "style=half"),
        (["my_rope:good", "--layout", "b s h"], "no 'd'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(my_rope, capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_runs_as_a_module(tmp_path):
    (tmp_path / "my_rope.py").write_text(CLI_MODULE)
    env_root = str(Path(ropelab.__file__).parents[1])
    r = subprocess.run(
        [sys.executable, "-m", "ropelab.diagnosis", "my_rope:bad", "--layout", "b s h d", "--max-position", "64"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_root, "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 1 and "NOT OK" in r.stdout, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "ropelab.diagnosis", "my_rope:typo", "--layout", "b s h d"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_root, "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 2 and "has no attribute" in r.stderr


def test_console_script_entry_and_plain_function():
    text = (Path(ropelab.__file__).parents[1] / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    mod, attr = re.search(r'^ropelab-diagnose = "([\w.]+):(\w+)"', scripts, re.M).groups()
    assert getattr(importlib.import_module(mod), attr) is main
    # ropelab.diagnose is a plain function, and importing the package's modules does not shadow it
    importlib.import_module("ropelab.diagnosis.zoo")
    assert isinstance(ropelab.diagnose, types.FunctionType)
