"""The public surface: every module has a complete ``__all__``, every public definition a docstring, and the
package docstring and the module table (``docs/guides/modules.md``, linked from the README) name every module."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import ropelab

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "ropelab").glob("*.py") if not p.stem.startswith("_"))
MODULES += sorted(p.name for p in (ROOT / "ropelab").iterdir() if (p / "__init__.py").is_file())
OWN_API = MODULES


def _tree(module: str) -> ast.Module:
    path = ROOT / "ropelab" / f"{module}.py"
    return ast.parse((path if path.exists() else ROOT / "ropelab" / module / "__init__.py").read_text())


@pytest.mark.parametrize("module", OWN_API)
def test_all_is_complete_and_every_public_definition_has_a_docstring(module):
    mod = importlib.import_module(f"ropelab.{module}")
    assert hasattr(mod, "__all__"), f"ropelab.{module} has no __all__"
    missing_doc = []
    for node in _tree(module).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            assert node.name in mod.__all__, f"ropelab.{module}.{node.name} is public but not in __all__"
            if not ast.get_docstring(node):
                missing_doc.append(node.name)
            if isinstance(node, ast.ClassDef):
                missing_doc += [f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)
                                and not f.name.startswith("_") and not ast.get_docstring(f)]
    assert not missing_doc, f"ropelab.{module}: no docstring on {missing_doc}"
    assert all(hasattr(mod, name) for name in mod.__all__)


def test_names_other_modules_import_are_public():
    """Every ``from .x import name`` and ``from ..x import name`` (any level) inside the package names a
    public name of x (in its ``__all__``) or a submodule."""
    private = []
    for path in (ROOT / "ropelab").rglob("*.py"):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
                target = importlib.import_module(module)
                where = ROOT / module.replace(".", "/")
                private += [f"{path.relative_to(ROOT)} <- {module}.{a.name}" for a in node.names
                            if a.name != "*" and a.name not in getattr(target, "__all__", ())
                            and not (where / f"{a.name}.py").exists() and not (where / a.name).is_dir()]
    assert not private, private


def test_package_docstring_and_readme_name_every_module():
    table = (ROOT / "docs" / "guides" / "modules.md").read_text()
    assert "(docs/guides/modules.md)" in (ROOT / "README.md").read_text(), "the README links the module table"
    for module in MODULES:
        assert f"``{module}``" in ropelab.__doc__, f"ropelab/__init__.py's docstring does not name {module}"
        assert f"`ropelab.{module}`" in table, f"docs/guides/modules.md's table does not name ropelab.{module}"


def test_fused_qk_norm_rope_is_exported_from_the_package():
    """``ropelab.qk_norm_rope`` is the kernels module's function (one home), listed in the package's ``__all__``."""
    from ropelab.kernels import qk_norm_rope as home

    assert "qk_norm_rope" in ropelab.__all__
    assert ropelab.qk_norm_rope is home.qk_norm_rope
