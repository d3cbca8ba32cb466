"""``python -m ropelab.conformance``: the whole sweep (``make conformance``)."""

from .sweep import main

raise SystemExit(main())
