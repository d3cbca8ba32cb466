r"""ggml's RoPE itself: run a GGUF file through llama.cpp (via llama-cpp-python) and return its logits.

llama-cpp-python compiles llama.cpp, so it is not a pure-Python dependency: ``make ggml`` builds it for the
CPU from the sdist with the flags of ``scripts/build_llama_cpp.sh`` (portable, ``GGML_NATIVE=OFF``, no BLAS,
no OpenMP, no llamafile sgemm, no multimodal library) into a wheel cached by version and flags, and installs
it into the project's venv. :func:`llama_cpp` raises an :class:`ImportError` naming that target when the
package is missing.

:func:`logits` evaluates a token sequence in one batch at positions ``0 .. n-1`` and returns every
position's logits (``logits_all``). llama.cpp's defaults that would round below float32 are switched off:
the KV cache is float32 (its default is float16, a relative error of :math:`2^{-11}` on every key and
value) and flash attention is off (its CPU kernel accumulates in float16 for a float16 cache). What
remains is float32 arithmetic throughout: ggml's RoPE (``ggml_rope_ext``, angles
:math:`\theta_i = p\,\text{freq\_base}^{-2i/n}` formed in float32 by repeated multiplication), the
matmuls, RMSNorm, softmax.

:func:`convert_hf_to_gguf` runs llama.cpp's own converter (``convert_hf_to_gguf.py``, vendored in the
llama-cpp-python sdist) as a subprocess on a Hugging Face model directory. The converter's source tree
is found at ``ROPELAB_LLAMA_CPP_SRC`` when set, else under ``build/`` where ``make ggml`` extracts the
sdist (:func:`llama_cpp_source`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from ..paths import BUILD_DIR

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "MAKE_TARGET", "llama_cpp", "llama_cpp_source", "convert_hf_to_gguf", "logits"]

# The llama-cpp-python release `make ggml` builds (scripts/build_llama_cpp.sh reads it from the Makefile).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
MAKE_TARGET = "make ggml"


def llama_cpp():
    """The ``llama_cpp`` module; an :class:`ImportError` naming ``make ggml`` when it is not installed."""
    try:
        import llama_cpp as module
    except ImportError as e:
        raise ImportError(
            f"llama_cpp (llama-cpp-python) is not installed: run `{MAKE_TARGET}`, which builds "
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} for the CPU (cached under build/wheels) and installs it "
            f"into the project's venv. ({e})"
        ) from e
    return module


def llama_cpp_source() -> Path:
    """llama.cpp's source tree (the sdist's ``vendor/llama.cpp``), holding ``convert_hf_to_gguf.py``.

    ``ROPELAB_LLAMA_CPP_SRC`` when set, else ``build/llama_cpp_python-<version>/vendor/llama.cpp``, which
    ``make ggml`` extracts. A :class:`FileNotFoundError` names both when neither holds the converter.
    """
    env = os.environ.get("ROPELAB_LLAMA_CPP_SRC")
    root = Path(env) if env else BUILD_DIR / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
    if not (root / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(
            f"llama.cpp's converter is not at {root / 'convert_hf_to_gguf.py'}: run `{MAKE_TARGET}` (extracts the "
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist under build/) or set ROPELAB_LLAMA_CPP_SRC to a "
            "llama.cpp source tree."
        )
    return root


def convert_hf_to_gguf(model_dir, outfile, *, outtype: str = "f32", source=None, timeout: float = 600) -> Path:
    """Run llama.cpp's ``convert_hf_to_gguf.py`` on a Hugging Face model directory; returns ``outfile``.

    The converter puts its vendored ``gguf-py`` first on its own path (unless ``NO_LOCAL_GGUF`` is set), so
    the file format is the one that llama.cpp release ships, whatever ``gguf`` is installed. A failed
    conversion raises :class:`RuntimeError` with the converter's last output lines.
    """
    model_dir, outfile = Path(model_dir), Path(outfile)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"model_dir must be a Hugging Face model directory with a config.json, got {model_dir}.")
    if outtype not in ("f32", "f16", "bf16", "q8_0"):
        raise ValueError(f"outtype must be one of f32, f16, bf16, q8_0, got {outtype!r}.")
    root = Path(source) if source is not None else llama_cpp_source()
    proc = subprocess.run(
        [sys.executable, str(root / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(outfile),
         "--outtype", outtype],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if proc.returncode != 0 or not outfile.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {model_dir} (exit {proc.returncode}):\n{tail}")
    return outfile


def logits(
    gguf_path,
    tokens: Sequence[int],
    *,
    n_threads: int,
    n_ctx: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """llama.cpp's logits for ``tokens`` at positions ``0 .. len(tokens) - 1``, shape ``(len(tokens), n_vocab)``.

    Args:
        gguf_path: a GGUF model file.
        tokens: the token ids, evaluated as given (no BOS added).
        n_threads: ggml's CPU threads (the caller decides; tests pass 1).
        n_ctx: the context size, at least ``len(tokens)``; default ``len(tokens)``.
        seed: llama.cpp's sampling seed (logits do not depend on it; fixed so the run is reproducible).
        dtype: float32 (what llama.cpp computes) or float64 (the same values, widened exactly).
    """
    path = Path(gguf_path)
    if not path.is_file():
        raise ValueError(f"gguf_path must be an existing GGUF file, got {path}.")
    tokens = list(tokens)
    if not tokens or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ValueError(f"tokens must be a non-empty sequence of ints, got {tokens!r}.")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive int, got {n_threads!r}.")
    n_ctx = len(tokens) if n_ctx is None else n_ctx
    if not isinstance(n_ctx, int) or n_ctx < len(tokens):
        raise ValueError(f"n_ctx must be an int >= len(tokens) = {len(tokens)}, got {n_ctx!r}.")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}.")
    lc = llama_cpp()
    llm = lc.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=n_threads,
        n_threads_batch=n_threads, seed=seed, logits_all=True, n_gpu_layers=0, flash_attn=False,
        type_k=lc.GGML_TYPE_F32, type_v=lc.GGML_TYPE_F32, verbose=False,
    )
    try:
        n_vocab = llm.n_vocab()
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise ValueError(f"tokens must lie in [0, n_vocab = {n_vocab}), got {bad[:5]}.")
        llm.eval(tokens)
        out = torch.from_numpy(llm.scores[: len(tokens)].copy())
    finally:
        llm.close()
    return out.to(dtype)
