"""pyproject.toml is the single source of dependencies; environment.yml must mirror it; the README's and the
package guide's examples run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name
# core or notebooks packages that environment.yml installs through pip (its conda-forge copy is not checked here)
PIP_ONLY = {"rotary-embedding-torch", "gguf", "sentencepiece"}


def _split(req: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req)
    return m.group(1).lower(), m.group(2).replace(" ", "")


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want_conda = dict(_split(r) for r in project["dependencies"] + project["optional-dependencies"]["notebooks"])
    want_pip = {k: want_conda.pop(k) for k in PIP_ONLY}
    want_conda = {CONDA_NAMES.get(k, k): v.replace("==", "=") for k, v in want_conda.items()}
    want_pip |= dict(_split(r) for extra in ("dev", "site") for r in project["optional-dependencies"][extra])

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip.update(_split(r) for r in dep["pip"] if not r.startswith("-e"))
        else:
            name, spec = _split(dep)
            if name not in ("python", "pip"):
                conda[name] = spec
    assert conda == want_conda
    assert pip == want_pip


def test_gpu_extra_is_opt_in():
    """flash-attn cannot build without CUDA: only the gpu extra may name it. triton (CPU interpreter
    tests of ropelab.kernels) is in dev, not in core."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for group, reqs in [("core", project["dependencies"])] + [
        (k, v) for k, v in project["optional-dependencies"].items() if k != "gpu"
    ]:
        names = {_split(r)[0] for r in reqs}
        assert not names & {"flash-attn", "flash_attn", "ropelab"}, group
        assert group != "core" or "triton" not in names
    assert "flash-attn" in {_split(r)[0] for r in project["optional-dependencies"]["gpu"]}
    assert "triton" in {_split(r)[0] for r in project["optional-dependencies"]["dev"]}


def test_torch_is_not_pinned_in_pyproject_but_in_the_makefile():
    """An unpinned torch pulls a CUDA build; the Makefile pins the CPU build (overridable)."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_SPEC \?= torch==2\.13\.0$", makefile, re.M)
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


@pytest.mark.parametrize("page", ["README.md", "docs/guides/package.md"])
def test_readme_example_runs(page):
    """The Python blocks of the README and of the package guide are executed as they stand (a page's blocks in
    order, as one script), so they cannot go stale."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    assert blocks, f"{page} has no python block"
    exec(compile("\n".join(blocks), page, "exec"), {})
