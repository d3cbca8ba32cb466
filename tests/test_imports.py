"""The package's import graph: no cycles, imports flow one way, and no domain module imports the runner."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ropelab"
RUNNER = "ropelab.figures"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every ropelab module that ``path`` imports, at module level or inside a function."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ropelab"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] != "ropelab":
                continue
            submodules = {
                f"{target}.{a.name}"
                for a in node.names  # `from . import kvcache` imports a module (the package's __init__ aside)
                if (PACKAGE.parent / Path(*f"{target}.{a.name}".split("."))).with_suffix(".py").exists()
            }
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(target)
    return found - {name}


def graph() -> dict[str, set[str]]:
    """{module: the ropelab modules it imports} for every module of the package (sub-packages included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {t for t in _imports(p) if t in modules} for m, p in modules.items()}


def test_the_graph_is_read():
    g = graph()
    assert "ropelab.kvcache" in g and "ropelab.core" in g["ropelab.kvcache"]
    assert "ropelab.scaling" in g["ropelab.spec"]
    # imports inside functions count: apply_rope loads the kernels on first use
    assert {"ropelab.kernels.fused_rope", "ropelab.kernels.compiled"} <= g["ropelab.rope"]


def test_core_imports_nothing_of_the_package():
    """core holds the primitives: it is on the ground floor, below scaling, spec, multiaxis, kernels and rope."""
    assert graph()["ropelab.core"] == set()


def test_no_import_cycles():
    """No cycle in the whole graph, imports inside functions included (no exemption)."""
    g = graph()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(g[m]):
            if t == "ropelab":  # the package __init__ re-exports; importing it from inside is not a dependency
                continue
            if state.get(t) == 1:
                pytest.fail(f"import cycle: {' -> '.join(path + [m, t])}")
            if t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])


def test_no_domain_module_imports_the_runner():
    offenders = sorted(m for m, targets in graph().items() if RUNNER in targets and m != RUNNER)
    assert not offenders, f"{offenders} import the notebook runner {RUNNER}; take paths from ropelab.paths"


@pytest.mark.parametrize("low, high", [("ropelab.scaling", "ropelab.core"), ("ropelab.core", "ropelab.spec"),
                                       ("ropelab.spec", "ropelab.multiaxis"), ("ropelab.multiaxis", "ropelab.rope"),
                                       ("ropelab.kernels.fused_rope", "ropelab.rope"),
                                       ("ropelab.kernels.compiled", "ropelab.rope"),
                                       ("ropelab.spec", "ropelab.kvcache"), ("ropelab.kvcache", "ropelab.lm")])
def test_imports_flow_one_way(low, high):
    """core, scaling <- spec <- multiaxis, kernels <- rope (apply_rope); spec <- kvcache <- lm: a lower layer
    never reaches a higher one."""
    g = graph()
    seen, todo = set(), [low]
    while todo:
        m = todo.pop()
        for t in g[m] - seen:
            seen.add(t)
            todo.append(t)
    assert high not in seen, f"{low} reaches {high}"
