r"""apply_rope's small-call fast path: its plans kept and run in C++ (``cpu_fast.cpp``), built against torch.

Why: a decode step's RoPE (q ``[8, 32, 1, 128]``, 128 KiB in float32) is a few microseconds of arithmetic in the
C kernel of :mod:`ropelab.kernels.cpu_rope`. Run from Python, the rest of a planned call (the plan key with the
positions' bytes, the output's allocation, ctypes' conversion) costs more than the rotation. The extension keeps
:func:`ropelab.apply_rope`'s plans in C++ and does the key, the lookup, the allocation and the launch there,
with torch's C++ tensors (measured by ``python -m ropelab.bench cpu --cases decode``: see
``docs/guides/benchmarks.md``).

What it changes: nothing in the results. A stored plan is the one apply_rope's Python path built and checked for
the same key (x's dtype, shape and strides, every setting, the positions' content, out's shape and strides); the
extension runs the same C kernel on the same tables, so the same bits (tested). Calls it does not take, or whose
key it has not stored, go on in Python exactly as without it. It takes only small calls (x under
:data:`MAX_BYTES`: there the Python overhead matters; larger outputs come from :mod:`ropelab.kernels.cpu_buffers`'
pool, and the kernel then runs without the GIL).

Building: it compiles against the installed torch's headers with the C++ compiler (``$CXX``, ``c++`` or ``g++``):
about 20 s (17.9 s measured with g++ 12 on this project's 2-core machine), so **it is never built on a call**.
``make setup`` builds it (``python -m ropelab.kernels.cpu_fast``, which prints the time), into
:func:`ropelab.kernels.cpu_build.cache_dir` keyed by the source, torch's version and ABI, Python's and the
compiler's. apply_rope loads it when it is there (:func:`load`); without it, apply_rope is the same function,
slower per small call, and :func:`why_unavailable` says why and how to build it. ``ROPELAB_CPU_FAST=0`` turns it
off.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import torch

from . import cpu_build

__all__ = ["SOURCE", "MAX_BYTES", "enabled", "library_path", "build", "load", "why_unavailable", "build_info"]

SOURCE = Path(__file__).with_name("cpu_fast.cpp")
MAX_BYTES = 1 << 20  # x's bytes below which calls take the fast path (cpu_buffers.MIN_BYTES: the pool's floor)
_MODULE_NAME = "ropelab_cpu_fast"
_LOCK = threading.Lock()
_STATE: dict = {}


def enabled() -> bool:
    """Whether the fast path may be used (``ROPELAB_CPU_FAST`` unset or not ``0``)."""
    return os.environ.get("ROPELAB_CPU_FAST", "1") != "0"


def _compiler() -> str | None:
    for cand in (os.environ.get("CXX"), "c++", "g++"):
        if cand and shutil.which(cand.split()[0]):
            return cand
    return None


def _flags() -> list[str]:
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    inc = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    return ["-O2", "-shared", "-fPIC", "-std=c++17", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *[f"-I{p}" for p in inc], *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs]]


_LIBS = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def library_path() -> Path | None:
    """Where the extension for this torch, Python and compiler lives (built or not); None without a C++
    compiler."""
    cxx = _compiler()
    if cxx is None:
        return None
    try:
        version = subprocess.run([*cxx.split(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    digest = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(_flags()).encode(), version.encode(),
                                        torch.__version__.encode(), sys.version.encode(),
                                        platform.machine().encode()])).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cpu_build.cache_dir() / f"cpu_fast-{digest}{suffix}"


def build() -> dict:
    """Compile the extension into the cache unless it is there: ``{"path", "seconds", "from_cache"}``. Raises
    :class:`ropelab.kernels.cpu_build.BuildError` naming the fix when it cannot."""
    cxx = _compiler()
    path = library_path()
    if cxx is None or path is None:
        raise cpu_build.BuildError("no C++ compiler on PATH (tried $CXX, c++, g++): install g++ (apt-get install "
                                   "g++) or set CXX; apply_rope works without the fast path, slower per small call.")
    if path.is_file():
        return {"path": str(path), "seconds": 0.0, "from_cache": True}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([*cxx.split(), *_flags(), str(SOURCE), "-o", tmp, *_LIBS], capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != 0:
            raise cpu_build.BuildError(f"compiling {SOURCE.name} with {cxx} failed (apply_rope works without it):\n"
                                       f"{proc.stderr[-2000:]}")
        os.replace(tmp, path)  # atomic: a parallel loader never sees half a library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"path": str(path), "seconds": time.perf_counter() - t0, "from_cache": False}


def load(kernel_address: int, spec_type: type, max_plans: int):
    """The extension module, initialised with the C kernel's packed entry, the RopeSpec type and the plan limit;
    None when it is off, not built, or does not load (:func:`why_unavailable` says which). Never builds."""
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        module, reason = None, None
        if not enabled():
            reason = "ROPELAB_CPU_FAST=0"
        else:
            path = library_path()
            if path is None or not path.is_file():
                reason = ("not built for this torch and compiler: run `python -m ropelab.kernels.cpu_fast` (or make "
                          "setup), about 20 s once")
            else:
                try:
                    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    module.init(kernel_address, spec_type, max_plans, MAX_BYTES)
                except (ImportError, OSError, ValueError, TypeError) as e:
                    module, reason = None, f"loading {path} failed: {e}"
        _STATE["module"], _STATE["reason"] = module, reason
        return module


def why_unavailable() -> str | None:
    """None when apply_rope uses the extension in this process, else why not (before apply_rope's first planned
    call: that it has not been loaded yet)."""
    if "module" not in _STATE:
        return "not loaded yet: apply_rope loads it on its first planned call"
    return _STATE["reason"]


def build_info() -> dict:
    """Whether the extension is in use here, its path, and why not."""
    path = library_path()
    return {"in_use": _STATE.get("module") is not None, "built": bool(path and path.is_file()),
            "path": None if path is None else str(path), "why_not": why_unavailable()}


if __name__ == "__main__":
    try:
        info = build()
    except cpu_build.BuildError as e:
        print(f"ropelab: the CPU fast path was not built: {e}", file=sys.stderr)
        raise SystemExit(0 if os.environ.get("ROPELAB_REQUIRE_FAST") != "1" else 1) from None
    state = "cached" if info["from_cache"] else f"built in {info['seconds']:.1f} s"
    print(f"ropelab: the CPU fast path ({SOURCE.name}) {state}: {info['path']}")
