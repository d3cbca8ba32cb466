"""Deprecated: the old name of :mod:`ropelab.diagnosis` (renamed when the checker became a package).

``python -m ropelab.diagnose MODULE:CALLABLE --layout "b s h d"`` still runs the same command line as
``python -m ropelab.diagnosis`` (and ``ropelab-diagnose``), and ``from ropelab.diagnose import diagnose, compare``
still works; both warn with a ``DeprecationWarning`` naming the new module. Importing this module does not
shadow the function ``ropelab.diagnose`` (``ropelab/__init__.py`` keeps it).
"""

from __future__ import annotations

import sys
import warnings

from .diagnosis import Comparison, Diagnosis, compare, diagnose
from .diagnosis.__main__ import main

__all__ = ["diagnose", "compare", "Diagnosis", "Comparison", "main"]

warnings.warn(
    "ropelab.diagnose is deprecated; use ropelab.diagnosis (python -m ropelab.diagnosis, or ropelab-diagnose).",
    DeprecationWarning,
    stacklevel=1 if __name__ == "__main__" else 2,  # under -m, attributed to __main__ so that Python shows it
)

if __name__ == "__main__":
    sys.exit(main())
