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


def _run_module(tmp_path, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a fresh interpreter, from a folder holding CLI_MODULE as my_rope.py."""
    (tmp_path / "my_rope.py").write_text(CLI_MODULE)
    env_root = str(Path(ropelab.__file__).parents[1])
    return subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": env_root, "PATH": "/usr/bin:/bin"})


def test_runs_as_a_module(tmp_path):
    r = _run_module(tmp_path, "ropelab.diagnosis", "my_rope:bad", "--layout", "b s h d", "--max-position", "64")
    assert r.returncode == 1 and "NOT OK" in r.stdout, r.stderr
    r = _run_module(tmp_path, "ropelab.diagnosis", "my_rope:typo", "--layout", "b s h d")
    assert r.returncode == 2 and "has no attribute" in r.stderr


def test_console_script_entry_and_plain_function():
    text = (Path(ropelab.__file__).parents[1] / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    mod, attr = re.search(r'^ropelab-diagnose = "([\w.]+):(\w+)"', scripts, re.M).groups()
    assert getattr(importlib.import_module(mod), attr) is main
    # ropelab.diagnose is a plain function, and importing the package's modules does not shadow it
    importlib.import_module("ropelab.diagnosis.zoo")
    assert isinstance(ropelab.diagnose, types.FunctionType)


# --- deprecated old names (CHANGELOG.md) ---------------------------------------------------------------------


def test_old_module_name_runs_the_same_command_with_a_deprecation_warning(tmp_path):
    r = _run_module(tmp_path, "ropelab.diagnose", "my_rope:bad", "--layout", "b s h d", "--max-position", "64")
    assert r.returncode == 1 and "NOT OK" in r.stdout, r.stderr
    assert "DeprecationWarning" in r.stderr and "ropelab.diagnosis" in r.stderr


def test_old_module_imports_with_a_warning_and_does_not_shadow_the_function(monkeypatch):
    monkeypatch.delitem(sys.modules, "ropelab.diagnose", raising=False)
    with pytest.warns(DeprecationWarning, match="use ropelab.diagnosis"):
        old = importlib.import_module("ropelab.diagnose")
    assert old.diagnose is ropelab.diagnosis.diagnose and old.main is main and old.compare is ropelab.compare
    assert ropelab.diagnose is ropelab.diagnosis.diagnose  # the function, not the module


def test_diagnosis_pairing_is_a_deprecated_alias_of_style():
    fn = lambda x: ropelab.apply_rope(x, layout="b s h d", style="interleaved")  # noqa: E731
    dg = ropelab.diagnose(fn, layout="b s h d", sizes={"h": 2, "d": 16}, max_position=64)
    assert dg.style == "interleaved"
    with pytest.warns(DeprecationWarning, match=r"Diagnosis\.style"):
        assert dg.pairing == "interleaved"
    with pytest.warns(DeprecationWarning, match=r"Diagnosis\.phase_allowed"):
        assert dg.phase_tolerance == dg.phase_allowed
    with pytest.warns(DeprecationWarning):
        dg.pairing = "half"
    assert dg.style == "half"
    dg.codes.append("style")
    with pytest.warns(DeprecationWarning, match="'style'"):
        assert dg.has("pairing")
