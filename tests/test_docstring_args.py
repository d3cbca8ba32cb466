"""The API pages describe every parameter: in the modules below, each public function, class and public method has
an ``Args:`` entry (Google style, what napoleon renders) for every parameter of its signature.

A class's docstring describes its constructor's parameters (the API pages show the class docstring only); a
``typing.Protocol``'s ``(*args, **kwargs)`` constructor is no API and is left out. A module joins ``COMPLETE`` once
every parameter of its public callables is described, and stays complete: a new parameter without an entry fails
here, naming it.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

COMPLETE = [
    "adapters", "attention", "bench", "context_parallel", "convert", "cope", "core", "decay", "diagnosis", "engines",
    "explorers", "extend", "extension", "figures", "kernels", "kvcache", "lm", "manifest", "mla", "models", "nbclean",
    "precision", "prope", "rope", "scaling", "staleness", "webexplorers",
]

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Keyword Args|Keyword Arguments|Parameters|Other Parameters):\s*$")
_ENTRY = re.compile(r"\s*\**(\w+)\s*(\([^)]*\))?\s*:")


def described(doc: str | None) -> set[str]:
    """The names with an entry in the docstring's Args sections: the lines one indent level under the header."""
    names: set[str] = set()
    lines = inspect.cleandoc(doc or "").splitlines()
    i = 0
    while i < len(lines):
        head = _SECTION.match(lines[i])
        i += 1
        if not head:
            continue
        indent = None
        while i < len(lines):
            line = lines[i]
            if line.strip():
                depth = len(line) - len(line.lstrip())
                if depth <= len(head.group(1)):
                    break
                indent = depth if indent is None else indent
                entry = _ENTRY.match(line) if depth == indent else None
                if entry:
                    names.add(entry.group(1))
            i += 1
    return names


def test_described_reads_google_style_entries():
    doc = """Summary.

    Args:
        x: the input, continued
            on a second line: with a colon.
        y (int): typed.
        **settings: the rest.

    Returns something: not a parameter.
    """
    assert described(doc) == {"x", "y", "settings"}


def _parameters(obj) -> list[str]:
    """The signature's parameters but self; none for a class whose constructor is a builtin's (an exception
    or a dict subclass: inspect cannot read its signature, and it has no parameters of its own to describe)."""
    try:
        sig = inspect.signature(obj)
    except ValueError:
        if inspect.isclass(obj) and isinstance(obj.__init__, type(object.__init__)):
            return []
        raise
    return [p.name for p in sig.parameters.values() if p.name != "self"]  # a function's own cls parameter counts


def _public_callables(modname: str):
    """(qualified name, the callable whose signature counts or None, its docstring) of the module's public API: the
    names of ``__all__`` defined in it (or, for a package, in its submodules) and their classes' own public methods
    that have a docstring (autodoc shows no other)."""
    mod = importlib.import_module(modname)
    package = hasattr(mod, "__path__")
    for name in mod.__all__:
        obj = getattr(mod, name)
        home = getattr(obj, "__module__", "") or ""
        if not (home == modname or (package and home.startswith(modname + "."))):
            continue  # a re-export: checked at home
        if inspect.isclass(obj):
            constructor = None if getattr(obj, "_is_protocol", False) else obj
            yield f"{modname}.{name}", constructor, obj.__dict__.get("__doc__")
            for attr, raw in vars(obj).items():
                func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
                if not attr.startswith("_") and inspect.isfunction(func) and func.__doc__:
                    yield f"{modname}.{name}.{attr}", getattr(obj, attr), func.__doc__
        elif inspect.isfunction(inspect.unwrap(obj)):  # a function, or one wrapped by functools.cache
            yield f"{modname}.{name}", obj, obj.__doc__


@pytest.mark.parametrize("module", COMPLETE)
def test_every_public_parameter_is_described(module):
    missing = []
    for qualname, obj, doc in _public_callables(f"ropelab.{module}"):
        have = described(doc)
        missing += [f"{qualname}: {p}" for p in (_parameters(obj) if obj is not None else []) if p not in have]
    assert not missing, f"parameters without an Args: entry (add one to the docstring): {missing}"
