r"""Build a small C source of ropelab's into a shared library once, cache it, and load it with ctypes.

The one home of compiling ropelab's CPU kernels (:mod:`ropelab.kernels.cpu_rope` uses it; so may any other C
kernel). API, stable:

- :func:`load_library(name, source, extra_flags=()) <load_library>` -> :class:`ctypes.CDLL`, raising
  :class:`BuildError` with the compiler's message when no library can be built;
- :func:`why_unavailable(name, source, extra_flags=()) <why_unavailable>` -> None when it loads, else the reason
  (a sentence naming the fix);
- :func:`build_info(name) <build_info>` -> how the last load of ``name`` went: ``seconds`` (compile, or 0 when
  cached), ``from_cache``, ``path``, ``compiler``, ``flags``;
- :func:`cache_dir` -> ``$ROPELAB_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/ropelab/cpu-kernels``, else
  ``~/.cache/ropelab/cpu-kernels``.

Portability: the flags are portable (``-O3 -fPIC -fopenmp``, never ``-march=native``), so a cached library runs on
any x86-64 or aarch64 CPU of the same OS; a kernel that wants AVX2/AVX-512 asks for it per function with GCC's
``__attribute__((target_clones(...)))``, resolved at load time for the CPU that runs it. The cache key is a hash
of the source and the headers it includes from its folder, the flags, the compiler's ``--version`` and the
machine's architecture (:func:`platform.machine`): a changed source or header, or a new compiler, rebuilds.
Parallel processes (pytest-xdist workers) are safe: each compiles into a temporary file in the cache directory
and renames it onto the final name (:func:`os.replace` is atomic), so a reader never sees half a library.

The compiler is ``$CC``, else ``cc``, else ``gcc``. Without OpenMP (``-fopenmp`` refused) the library is
rebuilt without it, single-threaded, and :func:`build_info` says so (``openmp: False``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BuildError", "BASE_FLAGS", "cache_dir", "compiler", "load_library", "why_unavailable", "build_info"]

# Portable: no -march=native (the cache may be shared, CI's CPU may differ); vector ISAs via target_clones.
BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno")
OPENMP_FLAGS = ("-fopenmp",)

_LOCK = threading.Lock()
_LOADED: dict[tuple, ctypes.CDLL] = {}
_INFO: dict[str, dict] = {}
_FAILED: dict[tuple, str] = {}


class BuildError(RuntimeError):
    """No shared library could be built or loaded from a C source (no compiler, a compile error, ...)."""


def cache_dir() -> Path:
    """Where built libraries live: ``$ROPELAB_KERNEL_CACHE``, ``$XDG_CACHE_HOME/ropelab/cpu-kernels`` or
    ``~/.cache/ropelab/cpu-kernels``."""
    if os.environ.get("ROPELAB_KERNEL_CACHE"):
        return Path(os.environ["ROPELAB_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ropelab" / "cpu-kernels"


def compiler() -> str | None:
    """The C compiler used: ``$CC``, else ``cc``, else ``gcc`` (None when none is on PATH)."""
    for cand in (os.environ.get("CC"), "cc", "gcc"):
        if cand and shutil.which(cand.split()[0]):
            return cand
    return None


def _version(cc: str) -> str:
    try:
        return subprocess.run([*cc.split(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"the C compiler {cc!r} does not run ({e}); install gcc or set CC.") from e


def _compile(cc: str, source: Path, flags: Sequence[str], target: Path) -> None:
    """Compile ``source`` into ``target`` through a temporary file and an atomic rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([*cc.split(), *flags, f"-I{source.parent}", str(source), "-o", tmp, "-lm"],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BuildError(f"compiling {source.name} with {cc} {' '.join(flags)} failed:\n{proc.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_library(name: str, source: Path | str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The shared library built from the C file ``source``, loaded with ctypes; built on first use and cached
    (module docstring). ``name`` names the library in the cache and in :func:`build_info`; ``extra_flags`` are
    appended to :data:`BASE_FLAGS` and OpenMP's. Raises :class:`BuildError` saying why when it cannot."""
    source = Path(source)
    key = (name, str(source), tuple(extra_flags))
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        if key in _FAILED:
            raise BuildError(_FAILED[key])
        try:
            lib = _build_and_load(name, source, tuple(extra_flags))
        except BuildError as e:
            _FAILED[key] = str(e)
            raise
        _LOADED[key] = lib
        return lib


def _build_and_load(name: str, source: Path, extra: tuple[str, ...]) -> ctypes.CDLL:
    if not source.is_file():
        raise BuildError(f"the C source {source} is missing (a broken install? reinstall ropelab).")
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler on PATH (tried $CC, cc, gcc): install gcc (e.g. apt-get install gcc) "
                         "or set CC.")
    version = _version(cc)
    text = b"\0".join([source.read_bytes(), *_local_headers(source)])
    last: BuildError | None = None
    for openmp in (True, False):
        flags = (*BASE_FLAGS, *(OPENMP_FLAGS if openmp else ()), *extra)
        digest = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), version.encode(),
                                            platform.machine().encode(), platform.system().encode()]))
        path = cache_dir() / f"{name}-{digest.hexdigest()[:16]}.so"
        t0 = time.perf_counter()
        from_cache = path.is_file()
        try:
            if not from_cache:
                _compile(cc, source, flags, path)
            lib = ctypes.CDLL(str(path))
        except (BuildError, OSError) as e:
            last = e if isinstance(e, BuildError) else BuildError(f"loading {path} failed: {e}")
            continue
        _INFO[name] = {"seconds": 0.0 if from_cache else time.perf_counter() - t0, "from_cache": from_cache,
                       "path": str(path), "compiler": cc, "compiler_version": version.splitlines()[0] if version
                       else "", "flags": list(flags), "openmp": openmp}
        return lib
    assert last is not None
    raise last


def _local_headers(source: Path) -> list[bytes]:
    """The bytes of each header ``source`` includes by ``#include "name.h"`` from its own folder (one level: the
    headers include none), in the order included: part of the cache key, so that editing a shared header
    rebuilds every library built from it."""
    out = []
    for name in re.findall(rb'^\s*#\s*include\s+"([^"]+)"', source.read_bytes(), flags=re.M):
        header = source.parent / name.decode()
        if not header.is_file():
            raise BuildError(f"{source.name} includes {name.decode()}, which is missing next to it (a broken "
                             "install? reinstall ropelab).")
        out.append(header.read_bytes())
    return out


def why_unavailable(name: str, source: Path | str, extra_flags: Sequence[str] = ()) -> str | None:
    """None when :func:`load_library` succeeds for these arguments, else its reason (building it if needed)."""
    try:
        load_library(name, source, extra_flags)
    except BuildError as e:
        return str(e)
    return None


def build_info(name: str) -> dict | None:
    """How the library ``name`` was loaded in this process (``seconds`` compiling, 0.0 when ``from_cache``;
    ``path``, ``compiler``, ``flags``, ``openmp``), or None before its first load."""
    info = _INFO.get(name)
    return None if info is None else dict(info)
