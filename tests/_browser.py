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


@contextlib.contextmanager
def jupyterlab(root: Path, tmp: Path, env: dict | None = None, timeout: float = 120):
    """A JupyterLab server on a free port, serving ``root``, with its config, data, runtime, settings and workspaces
    under ``tmp`` (never the user's) and ``window.jupyterapp`` exposed, so tests run commands as a user's menu click
    does. ``env`` adds to (or overrides) that environment. Yields ``{"url", "token", "log"}``; the server stops after.
    """
    import secrets
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    import pytest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    full_env = {**os.environ,
                "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_DATA_DIR": str(tmp / "data"),
                "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
                "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"), "IPYTHONDIR": str(tmp / "ipython"),
                **(env or {})}
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
    ] + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])  # CI containers run as root
    log_path = tmp / "lab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=root, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        yield {"url": url, "token": token, "log": log_path}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
