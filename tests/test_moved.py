"""Moved modules and names keep working under their old names, with a DeprecationWarning (CHANGELOG.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from ropelab import _aliases


@pytest.mark.parametrize("old, new", sorted(_aliases.MOVED.items()))
def test_an_old_module_name_is_the_new_module_with_a_warning(old, new):
    # a fresh interpreter: in this one the old name may already be cached by another test
    code = (f"import warnings, importlib\nwarnings.simplefilter('error', DeprecationWarning)\n"
            f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as e:\n    print('W', e)\n"
            f"warnings.simplefilter('ignore')\nimport {old} as a, {new} as b\nprint(a is b, b.__spec__.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith("W ") and new in out[0], out
    assert out[1] == f"True {new}", out


def test_from_ropelab_import_an_old_name():
    with pytest.warns(DeprecationWarning, match="nb04_selective_copy"):
        from ropelab import tasks
    assert tasks is importlib.import_module("ropelab.studies.nb04_selective_copy")


@pytest.mark.parametrize("module, name", sorted(_aliases.MOVED_NAMES))
def test_a_moved_name_is_found_in_its_old_module_with_a_warning(module, name):
    new = importlib.import_module(_aliases.MOVED_NAMES[(module, name)])
    with pytest.warns(DeprecationWarning, match=new.__name__):
        obj = getattr(importlib.import_module(module), name)
    assert obj is getattr(new, name)


def test_an_unknown_name_is_still_an_attribute_error():
    import ropelab
    import ropelab.models

    with pytest.raises(AttributeError, match="no_such_thing"):
        ropelab.no_such_thing  # noqa: B018
    with pytest.raises(AttributeError, match="no_such_thing"):
        ropelab.models.no_such_thing  # noqa: B018
