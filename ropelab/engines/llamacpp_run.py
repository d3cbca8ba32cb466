r"""llama.cpp itself, running: a GGUF file loaded by llama.cpp's C library, a context of ``n_ctx`` allocated, a
token sequence decoded in one batch, every position's logits returned.

The runtime is PyPI's ``llama-cpp-py-sync`` (:data:`LLAMA_CPP_PY_SYNC`, pinned in pyproject's ``engines`` extra):
a prebuilt wheel carrying llama.cpp :data:`RUNTIME_TAG` (commit :data:`RUNTIME_COMMIT`)'s CPU ``libllama.so`` and
ggml libraries, with the C API of ``include/llama.h`` declared to CFFI in ABI mode (its
``llama_cpp_py_sync._cffi_bindings``). Only that ``ffi`` (the declarations) is used here, not the package's
``Llama`` class: the model is loaded with ``llama_model_load_from_file``, the context made with
``llama_init_from_model`` from ``llama_context_default_params()`` with ``n_ctx``, ``n_batch = n_ubatch`` the
sequence length, one sequence, float32 K and V caches (the default float16 cache would round every key and value
to :math:`2^{-11}`) and flash attention off; a ``llama_batch`` of the tokens at positions ``0 .. n-1`` (sequence
0, every position's logits requested) goes through one ``llama_decode``, and ``llama_get_logits_ith`` gives each
row. So what comes back is llama.cpp's own float32 forward, RoPE included (ggml's ``ggml_rope_ext``), of the
file as llama.cpp's loader reads it, at the allocated context: Phi-3's LongRoPE, for one, picks its long or
short factors by that context (``llama_model::get_rope_factors``), not by the sequence length.

Two llama.cpp versions are involved, as for users: the converter's (the llama-cpp-python sdist,
:data:`ropelab.engines.converter.LLAMA_CPP_PYTHON`, commit :func:`~ropelab.engines.converter.llama_cpp_commit`)
writes the file, this runtime's reads and runs it. :func:`versions` records both.

**Isolation.** llama.cpp refuses a file it cannot load (``llama_model_load_from_file`` returns NULL and logs the
reason, e.g. ``invalid n_rot: 8, expected 16``), but a ``GGML_ASSERT`` in graph construction aborts the whole
process. So every run is a child process (the script ``llamacpp_worker.py`` beside this module, which imports
only numpy and the wheel's CFFI declarations; JSON on stdin, the logits as a ``.npy`` file), bounded by a timeout
and an address-space limit (:data:`MAX_MEMORY`); the parent turns the outcome into :class:`LoaderRefusal` (the
file is refused: a :class:`~ropelab.engines.reading.ReadError` carrying llama.cpp's own message) or
:class:`RunError` (anything else: the exit status or signal and the tail of llama.cpp's log), never a traceback or
a crash of the caller.

**glibc.** The wheel is tagged ``manylinux2014`` (glibc 2.17) but its libraries require the symbol version
``GLIBC_2.38`` for four C23 entry points only (``__isoc23_strtol``, ``__isoc23_strtoul``, ``__isoc23_strtoull``,
``__isoc23_sscanf``; measured with ``objdump -T`` on 0.11739). On an older glibc (Debian 12 has 2.36) the
dynamic loader refuses them. :func:`runtime_dir` then makes a copy of the wheel's libraries under
``build/engines/`` in which those version requirements are marked weak (``VER_FLG_WEAK`` in ``.gnu.version_r``,
which glibc's loader accepts when the version is missing) and compiles a shim (``gcc``) that defines the four
symbols by calling their C17 counterparts (``strtol`` ...; they differ only on C23's ``0b`` binary prefix,
which nothing llama.cpp parses from a GGUF file uses), loaded first with ``RTLD_GLOBAL``. On glibc >= 2.38 the
wheel's own directory is used unchanged.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..paths import BUILD_DIR
from .reading import ReadError

__all__ = ["LLAMA_CPP_PY_SYNC", "RUNTIME_TAG", "RUNTIME_COMMIT", "LoaderRefusal", "RunError", "RunResult",
           "available", "runtime_dir", "run", "logits", "load", "versions"]

# The pinned runtime: llama-cpp-py-sync's version is llama.cpp's build number.
LLAMA_CPP_PY_SYNC = "0.11739"
RUNTIME_TAG = "b11739"
RUNTIME_COMMIT = "0ce8cd11416c8840498e6701bcbe39ad4b858c2b"
# Bounds on what a run may ask for: the tiny models' sizes with a wide margin (a run allocates n_ctx x layers of
# K/V cache and n_tokens x n_vocab of logits).
MAX_TOKENS = 4096
MAX_CTX = 1 << 17
MAX_LOGITS = 1 << 26  # floats: 256 MiB
# The child's address space (RLIMIT_AS): a file whose sizes would make llama.cpp allocate more fails to allocate there.
MAX_MEMORY = 8 << 30

_GLIBC_NEEDED = (2, 38)
_SHIM = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list ap; va_start(ap, f); int r = vsscanf(s, f, ap); va_end(ap); return r;
}
"""
_SHIM_NAME = "libropelab_isoc23.so"


class LoaderRefusal(ReadError):
    """llama.cpp's loader refused the file; the message carries llama.cpp's own reason."""


class RunError(RuntimeError):
    """llama.cpp did not run to the end (no runtime, a crash, a timeout, a failed decode); the message says what."""


def _package_dir() -> Path:
    try:
        import llama_cpp_py_sync
    except ImportError as e:
        raise RunError(f"llama-cpp-py-sync is not installed: `pip install llama-cpp-py-sync=={LLAMA_CPP_PY_SYNC}` "
                       f"(pyproject's `engines` extra, which `make setup` installs). ({e})") from e
    return Path(llama_cpp_py_sync.__file__).parent


def available() -> bool:
    """True when the pinned llama-cpp-py-sync is installed (it need not have been loaded yet)."""
    import importlib.metadata as md

    try:
        return md.version("llama-cpp-py-sync") == LLAMA_CPP_PY_SYNC
    except md.PackageNotFoundError:
        return False


def _glibc() -> tuple[int, int] | None:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (ValueError, OSError, AttributeError):
        return None
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) if name == "glibc" else None


def _weaken_versions(data: bytearray, versions: set[bytes]) -> int:
    """Mark the ELF64 little-endian file's ``.gnu.version_r`` requirements named in ``versions`` weak (the
    ``vna_flags`` bit ``VER_FLG_WEAK`` = 2); returns how many entries it marked."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise RunError("not an ELF64 little-endian library")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    marked = 0
    for _, sh_type, _, _, offset, _, link, info, _, _ in sections:
        if sh_type != 0x6FFFFFFE:  # SHT_GNU_verneed
            continue
        strings = sections[link][4]
        entry = offset
        for _ in range(info):
            _, count, _, aux, nxt = struct.unpack_from("<HHIII", data, entry)
            a = entry + aux
            for _ in range(count):
                _, flags, _, name, anext = struct.unpack_from("<IHHII", data, a)
                start = strings + name
                if bytes(data[start:data.index(0, start)]) in versions:
                    struct.pack_into("<H", data, a + 4, flags | 2)
                    marked += 1
                a += anext
            entry += nxt
    return marked


def runtime_dir(cache: Path | None = None) -> Path:
    """The directory whose ``libllama.so`` a run loads: the wheel's own on glibc >= 2.38, else a copy made
    loadable here (see the module docstring), made once under ``build/engines/``."""
    src = _package_dir()
    glibc = _glibc()
    if glibc is None or glibc >= _GLIBC_NEEDED:
        return src
    cache = Path(cache) if cache is not None else BUILD_DIR / "engines"
    root = cache / f"llama_cpp_py_sync-{LLAMA_CPP_PY_SYNC}-glibc{glibc[0]}.{glibc[1]}"
    if (root / ".done").is_file():
        return root
    from .converter import locked

    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / ".lock-llamacpp-run"):
        if (root / ".done").is_file():
            return root
        root.mkdir(parents=True, exist_ok=True)
        for lib in sorted(src.glob("lib*.so*")):
            data = bytearray(lib.read_bytes())
            _weaken_versions(data, {f"GLIBC_2.{m}".encode() for m in range(glibc[1] + 1, 100)})
            (root / lib.name).write_bytes(bytes(data))
        (root / "shim.c").write_text(_SHIM)
        cmd = [os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-shared", "-fPIC", "-o", str(root / _SHIM_NAME),
               str(root / "shim.c")]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RunError(f"could not compile the glibc {glibc[0]}.{glibc[1]} shim for llama.cpp's libraries "
                           f"({' '.join(cmd)}): {e}. Install gcc, or use a system with glibc >= 2.38.") from e
        if proc.returncode:
            raise RunError(f"could not compile the glibc shim ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
        (root / ".done").write_text(str(src))
    return root


class RunResult:
    """One llama.cpp run: ``logits`` (float32, ``(n_tokens, n_vocab)``) and what the loaded model reports
    (``info``: ``n_ctx`` as allocated, ``n_ctx_train``, ``n_layer``, ``n_embd``, ``n_head``, ``n_head_kv``,
    ``rope_type``, ``rope_freq_scale_train``, ``n_vocab``, the runtime's versions)."""

    def __init__(self, logits: np.ndarray, info: dict):
        self.logits = logits
        self.info = info
        self.rope: dict[int, tuple] | None = None

    def __repr__(self) -> str:
        return f"RunResult(logits {self.logits.shape}, n_ctx {self.info.get('n_ctx')})"


def _check_args(path, tokens, n_ctx, n_threads):
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"gguf_path must be an existing GGUF file, got {path}.")
    tokens = list(tokens)
    if not tokens or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tokens):
        raise ValueError(f"tokens must be a non-empty sequence of ints, got {tokens[:8]!r}.")
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"tokens must hold at most {MAX_TOKENS} ids (one batch), got {len(tokens)}.")
    n_ctx = len(tokens) if n_ctx is None else n_ctx
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or not (n_ctx == 0 or len(tokens) <= n_ctx <= MAX_CTX):
        raise ValueError(f"n_ctx must be 0 (llama.cpp's default: the file's context_length) or an int in "
                         f"[len(tokens) = {len(tokens)}, {MAX_CTX}], got {n_ctx!r}.")
    if not isinstance(n_threads, int) or isinstance(n_threads, bool) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive int, got {n_threads!r}.")
    return path, [int(t) for t in tokens], n_ctx


def run(gguf_path, tokens: Sequence[int] | None = None, *, n_ctx: int | None = None, n_threads: int = 1,
        timeout: float = 120.0, record_rope: bool = False) -> RunResult:
    """Load ``gguf_path`` in llama.cpp, allocate a context of ``n_ctx`` (default ``len(tokens)``; 0: llama.cpp's
    own default, the file's ``context_length``; llama.cpp pads it to a multiple of 256) and decode
    ``tokens`` (no BOS added) at positions ``0 .. n-1`` in one batch; every position's logits.

    ``tokens=None`` only loads the model and allocates the context (``logits`` is then empty): what the loader
    accepts. Raises :class:`LoaderRefusal` when llama.cpp refuses the file, :class:`RunError` when it fails
    otherwise, ``ValueError`` on bad arguments.

    ``record_rope``: the context's ``cb_eval`` (ggml's eval callback) records every tensor the graph names
    ``Qcur-<layer>`` / ``Kcur-<layer>`` (q and k after each step: projection, reshape, RoPE) as it is computed;
    ``RunResult.rope`` is then ``{layer: (q_pre, k_pre, q_post, k_post)}``, float32 ``(n_tokens, heads, head_dim)``
    in the stored weights' dim order, for each layer whose q and k went through a ``ROPE`` op."""
    if tokens is None:
        path, toks, n_ctx = _check_args(gguf_path, [0], n_ctx if n_ctx is not None else 1, n_threads)
        toks = []
    else:
        path, toks, n_ctx = _check_args(gguf_path, tokens, n_ctx, n_threads)
    lib_dir = runtime_dir()
    with tempfile.TemporaryDirectory(prefix="ropelab-llamacpp-") as tmp:
        out = Path(tmp) / "logits.npy"
        request = {"path": str(path.resolve()), "tokens": toks, "n_ctx": n_ctx, "n_threads": n_threads,
                   "lib_dir": str(lib_dir), "out": str(out), "version": LLAMA_CPP_PY_SYNC, "shim": _SHIM_NAME,
                   "max_logits": MAX_LOGITS, "max_ctx": MAX_CTX,
                   "record": str(Path(tmp) / "rope.npz") if record_rope and toks else None}
        env = {**os.environ, "OMP_NUM_THREADS": str(n_threads)}
        # The worker is a plain script (numpy and cffi only): no ropelab or torch import in the child.
        cmd = [sys.executable, "-I", str(Path(__file__).with_name("llamacpp_worker.py"))]
        try:
            proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, timeout=timeout,
                                  env=env, preexec_fn=_limit_memory)
        except subprocess.TimeoutExpired as e:
            raise RunError(f"llama.cpp ran past {timeout} s on {path}.") from e
        log = proc.stderr
        status = _last_json(proc.stdout)
        if proc.returncode == EXIT_REFUSED and status:
            raise LoaderRefusal(f"{path}: llama.cpp {RUNTIME_TAG} refuses it: {_reason(log) or status['error']}")
        if proc.returncode or status is None or "error" in status:
            what = (f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}")
            msg = status["error"] if status and "error" in status else "no result"
            raise RunError(f"llama.cpp {RUNTIME_TAG} failed on {path} ({what}): {msg}\n{_tail(log)}")
        arr = np.load(out) if toks else np.zeros((0, status["n_vocab"]), np.float32)
        rope = _rope_records(Path(request["record"]), len(toks)) if request["record"] else None
    result = RunResult(arr, {**status, "runtime": RUNTIME_TAG, "runtime_commit": RUNTIME_COMMIT})
    result.rope = rope
    return result


def _rope_records(path: Path, n: int) -> dict[int, tuple]:
    """``{layer: (q_pre, k_pre, q_post, k_post)}`` from the worker's ``Qcur...-<layer>`` / ``Kcur...-<layer>``
    records: post is the tensor a ``ROPE`` op wrote, pre the one recorded last before it for the same q or k and
    layer (``Qcur-3`` after a reshape, ``Qcur_normed-3`` after a q norm)."""
    import re

    pattern = re.compile(r"^([QK])cur[A-Za-z_]*-(\d+)$")
    if not path.is_file():
        return {}
    with np.load(path) as z:
        items = sorted((int(k.split(":", 1)[0]), k.split(":")[1], k.split(":")[2], z[k]) for k in z.files)
    keyed = [(pattern.match(name), op, a) for _, name, op, a in items]
    pairs: dict[tuple[str, int], tuple] = {}
    for j, (m, op, a) in enumerate(keyed):
        if m is None or op != "ROPE":
            continue
        key = (m.group(1), int(m.group(2)))
        before = [x[2] for x in keyed[:j] if x[0] is not None and (x[0].group(1), int(x[0].group(2))) == key]
        if key not in pairs and before and before[-1].size == a.size and a.size % n == 0:
            pairs[key] = (before[-1].reshape(n, -1, a.shape[-1]), a.reshape(n, -1, a.shape[-1]))
    return {i: (q[0], pairs[("K", i)][0], q[1], pairs[("K", i)][1]) for (w, i), q in sorted(pairs.items())
            if w == "Q" and ("K", i) in pairs}


def logits(gguf_path, tokens: Sequence[int], *, n_ctx: int | None = None, n_threads: int = 1,
           timeout: float = 120.0) -> np.ndarray:
    """llama.cpp's float32 logits for ``tokens`` at positions ``0 .. n-1``, shape ``(len(tokens), n_vocab)``,
    with a context of ``n_ctx`` allocated (default ``len(tokens)``); see :func:`run`."""
    return run(gguf_path, tokens, n_ctx=n_ctx, n_threads=n_threads, timeout=timeout).logits


def load(gguf_path, *, n_ctx: int = 1, timeout: float = 60.0) -> dict:
    """Load ``gguf_path`` in llama.cpp and allocate a context, decoding nothing: the model's numbers as llama.cpp
    reads them (:class:`RunResult` ``info``). Raises :class:`LoaderRefusal` when llama.cpp refuses the file."""
    return run(gguf_path, None, n_ctx=n_ctx, timeout=timeout).info


def versions() -> dict[str, str]:
    """Both pinned llama.cpp versions: the converter's (the llama-cpp-python sdist) and the runtime's."""
    from .converter import LLAMA_CPP_PYTHON, llama_cpp_commit

    try:
        converter_commit = llama_cpp_commit()
    except Exception:  # the sdist not downloaded: say so rather than fail a version listing
        converter_commit = None
    return {"llama-cpp-python (converter sdist)": LLAMA_CPP_PYTHON, "converter llama.cpp commit": converter_commit,
            "llama-cpp-py-sync (runtime)": LLAMA_CPP_PY_SYNC, "runtime llama.cpp tag": RUNTIME_TAG,
            "runtime llama.cpp commit": RUNTIME_COMMIT}


def _limit_memory() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MAX_MEMORY, MAX_MEMORY))


def _last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _reason(log: str) -> str | None:
    """llama.cpp's own reason for a refusal, from its log (``llama_model_load: error loading model: ...``)."""
    for line in log.splitlines():
        if "error loading model:" in line:
            return line.split("error loading model:", 1)[1].strip()
    for line in log.splitlines():
        if "failed to" in line or "error" in line.lower():
            return line.strip()
    return None


def _tail(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# The worker's exit status when llama.cpp refuses the file or the context (llamacpp_worker.py).
EXIT_REFUSED = 3
