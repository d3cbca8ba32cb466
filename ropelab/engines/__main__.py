"""``python -m ropelab.engines PATH [PATH ...]``: the same as the ``ropelab-check`` console script."""

import sys

from .check import main

if __name__ == "__main__":
    sys.exit(main())
