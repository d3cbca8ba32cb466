r"""llama.cpp's own converter, ``convert_hf_to_gguf.py``, run on a Hugging Face model directory.

The converter is vendored, pure Python, in the llama-cpp-python sdist on PyPI (``vendor/llama.cpp``). This
module gets that sdist once into a cache (``build/engines/`` by default), extracts only what the converter
needs, and runs it as a subprocess:

- ``convert_hf_to_gguf.py`` and ``conversion/`` (its model classes);
- ``gguf-py/``: the converter puts its vendored ``gguf`` first on ``sys.path`` (unless ``NO_LOCAL_GGUF``), and it
  needs it: with PyPI's ``gguf`` 0.19.0 instead (``NO_LOCAL_GGUF=1``) it fails at import with
  ``AttributeError: DFLASH`` (a ``MODEL_ARCH`` member newer than that release; measured on 0.3.36);
- ``src/`` and ``gguf-py/gguf/constants.py`` are also what :mod:`ropelab.engines.llamacpp_table` is generated from.

The llama.cpp commit is the sdist's submodule ``HEAD`` (``.git/modules/vendor/llama.cpp/HEAD``, which the
sdist ships): :func:`llama_cpp_commit`.

``ROPELAB_LLAMA_CPP_SDIST`` may point at a downloaded ``llama_cpp_python-<version>.tar.gz`` (then nothing is
downloaded); otherwise ``pip download --no-binary :all: --no-deps llama-cpp-python==<LLAMA_CPP_PYTHON>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

from ..paths import BUILD_DIR

__all__ = ["LLAMA_CPP_PYTHON", "ConversionError", "CACHE", "sdist_path", "converter_dir", "llama_cpp_commit",
           "convert", "convert_many", "locked"]

# The pinned llama-cpp-python release whose vendored llama.cpp the tests convert with.
LLAMA_CPP_PYTHON = "0.3.36"
# Where the sdist and its extracted parts live (CI downloads once per run).
CACHE = BUILD_DIR / "engines"
# The parts of vendor/llama.cpp the converter and the table generator read.
_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "src/llama-arch.cpp", "src/llama-model.cpp",
          "src/llama-hparams.h", "src/models/")


class ConversionError(RuntimeError):
    """The converter failed on a model: the message holds the command and the tail of its output."""


def sdist_path(version: str = LLAMA_CPP_PYTHON, cache: Path = CACHE) -> Path:
    """The llama-cpp-python sdist: ``$ROPELAB_LLAMA_CPP_SDIST``, else the cached one, else ``pip download``."""
    env = os.environ.get("ROPELAB_LLAMA_CPP_SDIST")
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"ROPELAB_LLAMA_CPP_SDIST={env} is not a file; point it at a downloaded "
                                    f"llama_cpp_python-{version}.tar.gz or unset it.")
        return path
    name = f"llama_cpp_python-{version}.tar.gz"
    path = cache / name
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--disable-pip-version-check",
           "-q", "-d", str(cache), f"llama-cpp-python=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode or not path.is_file():
        raise ConversionError(f"could not download llama-cpp-python {version}'s sdist ({' '.join(cmd)}):\n"
                              f"{_tail(proc.stdout + proc.stderr)}\nSet ROPELAB_LLAMA_CPP_SDIST to a local copy.")
    return path


def converter_dir(version: str = LLAMA_CPP_PYTHON, cache: Path = CACHE) -> Path:
    """The extracted parts of the sdist (a directory with ``vendor/llama.cpp/convert_hf_to_gguf.py``, the sdist's
    ``PKG-INFO`` and its submodule ``HEAD``), extracted once from :func:`sdist_path`. Processes that ask at the same
    time (pytest-xdist workers) wait for one another on a lock file, so the download and extraction happen once."""
    root = cache / f"llama_cpp_python-{version}"
    if (root / ".extracted").is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with locked(cache / ".lock"):
        return _extract(root, version, cache)


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive ``flock`` on the file ``path`` for the ``with`` block: processes that fill one cache under
    ``build/engines/`` (pytest-xdist workers) wait for one another."""
    import fcntl

    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _extract(root: Path, version: str, cache: Path) -> Path:
    done = root / ".extracted"
    if done.is_file():
        return root
    sdist = sdist_path(version, cache)
    top = f"llama_cpp_python-{version}/"
    wanted = [top + "PKG-INFO", top + ".git/modules/vendor/llama.cpp/HEAD"]
    prefixes = tuple(top + "vendor/llama.cpp/" + p for p in _PARTS)
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if (m.name in wanted or m.name.startswith(prefixes)) and (m.isfile() or m.isdir())]
        if not any(m.name.endswith("convert_hf_to_gguf.py") for m in members):
            raise ConversionError(f"{sdist} holds no vendor/llama.cpp/convert_hf_to_gguf.py; is it llama-cpp-python's "
                                  "sdist?")
        tar.extractall(cache, members=members, filter="data")
    done.write_text(str(sdist))
    return root


def llama_cpp_commit(root: Path | None = None) -> str | None:
    """The llama.cpp commit vendored in the extracted sdist (its submodule's ``HEAD``)."""
    from .llamacpp_parse import commit_of

    return commit_of(root or converter_dir())


def convert(model_dir: str | Path, out: str | Path, *, outtype: str = "f32", timeout: float = 300) -> Path:
    """Run llama.cpp's ``convert_hf_to_gguf.py`` on ``model_dir`` and write the GGUF file ``out``; returns ``out``.

    Raises :class:`ConversionError` with the converter's output tail when it fails."""
    model_dir, out = Path(model_dir), Path(out)
    if not (model_dir / "config.json").is_file():
        raise ConversionError(f"{model_dir} has no config.json; pass a Hugging Face model directory.")
    script = converter_dir() / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(script), str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    proc = _run(cmd, timeout, model_dir)
    if proc.returncode or not out.is_file():
        raise ConversionError(f"llama.cpp's converter failed on {model_dir} (exit {proc.returncode}):\n"
                              f"  {' '.join(cmd)}\n{_tail(proc.stderr or proc.stdout)}")
    return out


# Runs the converter on several models in one interpreter: torch and the converter's modules import once.
_BATCH = """
import json, os, runpy, sys
script, jobs, unknown_pre = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, os.path.dirname(script))  # as `python convert_hf_to_gguf.py` would
if unknown_pre is not None:
    import conversion.base as base
    known = base.TextModel.get_vocab_base_pre
    def get_vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:  # a BPE tokenizer whose hash the converter does not list
            return unknown_pre
    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
for args in jobs:
    print("ropelab-convert:", args[0], file=sys.stderr, flush=True)
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
"""


def convert_many(jobs: Sequence[tuple[str | Path, str | Path]], *, outtype: str = "f32",
                 timeout: float = 600, unknown_bpe_pre: str | None = None) -> list[Path]:
    """:func:`convert` for each ``(model_dir, out)`` in ``jobs``, in one subprocess (the converter's imports,
    torch's among them, are paid once); the same files and errors as :func:`convert` one by one.

    ``unknown_bpe_pre``: for a BPE tokenizer the converter does not recognise, the ``tokenizer.ggml.pre`` to write
    instead of failing. The converter identifies a BPE pre-tokenizer by a hash of a real model's tokenization of a
    fixed text (``conversion/base.py``, ``get_vocab_base_pre``) and raises ``NotImplementedError`` ("BPE
    pre-tokenizer was not recognized") on any other, such as the tiny models' tokenizer trained in code
    (:mod:`ropelab.engines.tiny`), for the families whose converter class reads a BPE vocabulary (cohere2). Only
    that method is wrapped, and only its refusal replaced: weights and every other key are the converter's."""
    jobs = [(Path(m), Path(o)) for m, o in jobs]
    for m, o in jobs:
        if not (m / "config.json").is_file():
            raise ConversionError(f"{m} has no config.json; pass a Hugging Face model directory.")
        o.parent.mkdir(parents=True, exist_ok=True)
    script = converter_dir() / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    args = [[str(m), "--outtype", outtype, "--outfile", str(o)] for m, o in jobs]
    cmd = [sys.executable, "-c", _BATCH, str(script), json.dumps(args), json.dumps(unknown_bpe_pre)]
    proc = _run(cmd, timeout, jobs[0][0] if len(jobs) == 1 else "the models")
    missing = [str(m) for m, o in jobs if not o.is_file()]
    if proc.returncode or missing:
        current = [ln for ln in proc.stderr.splitlines() if ln.startswith("ropelab-convert:")]
        at = current[-1].split(":", 1)[1].strip() if current else "?"
        raise ConversionError(f"llama.cpp's converter failed on {at} (exit {proc.returncode}):\n"
                              f"  {script} {at} --outtype {outtype}\n{_tail(proc.stderr or proc.stdout)}")
    return [o for _, o in jobs]


def _run(cmd, timeout, what):
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise ConversionError(f"the converter ran past {timeout} s on {what}.") from e


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])
