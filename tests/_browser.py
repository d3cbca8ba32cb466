"""The browser the lab, site and explorer tests drive: Debian's Chromium through Playwright (which cannot download its
own browser here). Skipped when either is missing, unless ``ROPELAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``), where a
missing browser is a failure."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CHROMIUM = os.environ.get("ROPELAB_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("ROPELAB_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the dev extra installs it
    sync_playwright = None


def missing(extra: str | None = None) -> str | None:
    """Why the browser tests cannot run here (``extra``: the caller's own missing requirement), or None; raises under
    ``ROPELAB_REQUIRE_BROWSER=1`` instead of returning a reason."""
    why = (
        "playwright is not installed (pip install playwright; it is in the dev extra)"
        if sync_playwright is None
        else f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set ROPELAB_CHROMIUM)"
        if not Path(CHROMIUM).exists()
        else extra
    )
    if why and REQUIRED:
        raise RuntimeError(f"ROPELAB_REQUIRE_BROWSER=1 but {why}")
    return why


@contextlib.contextmanager
def chromium():
    """One headless Chromium for a module's tests."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()
