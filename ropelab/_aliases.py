"""Old module names kept as deprecated aliases of their new homes (``CHANGELOG.md`` lists every move).

``import ropelab.tasks``, ``from ropelab.tasks import x`` and ``from ropelab import tasks`` still work: each
warns once with a :class:`DeprecationWarning` naming the new module and returns the new module itself (one
module object under two names, so state and ``isinstance`` checks agree). ``python -m`` needs the new name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "MOVED_NAMES", "install", "load_moved", "moved_name", "warn_moved"]

# old dotted name -> new dotted name (both absolute); one line per move, in the order they happened
MOVED: dict[str, str] = {
    "ropelab.restyle": "ropelab.studies.nb01_restyle",
    "ropelab.tasks": "ropelab.studies.nb04_selective_copy",
    "ropelab.gridtask": "ropelab.studies.nb08_gridtask",
    "ropelab.hf": "ropelab.adapters",
}

# (old module, name) -> the module that holds the name now
MOVED_NAMES: dict[tuple[str, str], str] = {
    ("ropelab.models", "TinyLMAdapter"): "ropelab.adapters",
}


def moved_name(module: str, name: str):
    """A module ``__getattr__``'s answer: a moved name from its new home, with a DeprecationWarning."""
    if (module, name) not in MOVED_NAMES:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new = MOVED_NAMES[(module, name)]
    warnings.warn(f"{module}.{name} moved to {new}.{name}; import it from there (the old name is a deprecated "
                  "alias).", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new), name)


def warn_moved(old: str, stacklevel: int = 3) -> None:
    """The one deprecation message for a moved module."""
    warnings.warn(f"{old} moved to {MOVED[old]}; import it from there (the old name is a deprecated alias).",
                  DeprecationWarning, stacklevel=stacklevel)


def load_moved(old: str):
    """The new module behind an old name, with the deprecation warning."""
    warn_moved(old, stacklevel=4)
    return importlib.import_module(MOVED[old])


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        # The import system keeps the module returned here under the old name: the new module itself.
        self.module = load_moved(spec.name)
        self.real_spec = self.module.__spec__
        return self.module

    def exec_module(self, module):
        # Already executed under its new name; the import system has just set __spec__ to the alias's: undo it.
        module.__spec__ = self.real_spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, _Loader())
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``ropelab/__init__.py`` calls it)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
