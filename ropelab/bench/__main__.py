"""``python -m ropelab.bench ...``: see :mod:`ropelab.bench`."""

import sys

from . import main

sys.exit(main())
