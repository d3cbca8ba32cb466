r"""ggml's RoPE itself: a GGUF file run through llama.cpp (via llama-cpp-python), and ggml's RoPE op alone.

llama-cpp-python compiles llama.cpp, so it is not a pure-Python dependency: ``make ggml`` builds it for the
CPU from the sdist with the flags of ``scripts/build_llama_cpp.sh`` (portable, ``GGML_NATIVE=OFF``, no BLAS,
no OpenMP, no llamafile sgemm, no multimodal or common library) into a wheel cached by version and flags, and installs
it into the project's venv. :func:`llama_cpp` raises an :class:`ImportError` naming that target when the
package is missing.

:func:`logits` evaluates a token sequence in one batch at positions ``0 .. n-1`` and returns every
position's logits (``logits_all``). llama.cpp's defaults that would round below float32 are switched off:
the KV cache is float32 (its default is float16, a relative error of :math:`2^{-11}` on every key and
value) and flash attention is off (the attention path these float32 bounds were checked on). What
remains is float32 arithmetic throughout: ggml's RoPE (``ggml_rope_ext``, angles
:math:`\theta_i = p\,\text{freq\_base}^{-2i/n}` formed in float32 by repeated multiplication), the
matmuls, RMSNorm, softmax.

:func:`rope` calls ggml's RoPE op itself, ``ggml_rope_ext`` (``ggml/include/ggml.h``), on the CPU through ctypes
on the libraries the wheel ships (or, without it, those of the prebuilt ``llama-cpp-py-sync`` wheel:
:func:`ggml_libraries`), on a ``[n_tokens, n_heads, head_dim]`` float32 tensor.

The GGUF files come from llama.cpp's own converter, :func:`ropelab.engines.converter.convert` (the one home of
running ``convert_hf_to_gguf.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import torch

from .converter import LLAMA_CPP_PYTHON

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "MAKE_TARGET", "ROPE_MODES", "llama_cpp", "ggml_libraries", "logits", "rope"]

# The llama-cpp-python release `make ggml` builds: the one whose converter ropelab.engines.converter runs (pyproject's
# `ggml` extra pins it; the Makefile reads it from converter.py).
LLAMA_CPP_PYTHON_VERSION = LLAMA_CPP_PYTHON
MAKE_TARGET = "make ggml"
# ggml.h's GGML_ROPE_TYPE_*: NORM rotates adjacent pairs (2i, 2i + 1), NEOX pairs (i, i + n_dims/2); MROPE
# (Qwen2-VL) and IMROPE (Qwen3-VL, interleaved sections) drive each pair by one of the t, h, w positions, in NEOX order.
ROPE_MODES = {"norm": 0, "neox": 2, "mrope": 8, "imrope": 40}
_MULTI = ("mrope", "imrope")
_GGML_TYPE_F32, _GGML_TYPE_I32 = 0, 26


def llama_cpp():
    """The ``llama_cpp`` module; an :class:`ImportError` naming ``make ggml`` when it is not installed."""
    try:
        import llama_cpp as module
    except ImportError as e:
        raise ImportError(
            f"llama_cpp (llama-cpp-python) is not installed: run `{MAKE_TARGET}`, which builds "
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} for the CPU once (the wheel is cached in "
            "~/.cache/ropelab/wheels) and installs it "
            f"into the project's venv. ({e})"
        ) from e
    return module


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


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


_GGML = None


def ggml_libraries() -> tuple[Path, Path, str]:
    """The ggml libraries :func:`rope` loads (libggml-base, libggml-cpu) and which build they come from: the
    llama-cpp-python wheel ``make ggml`` builds, else the prebuilt CPU wheel ``llama-cpp-py-sync`` of the
    ``engines`` extra (in the copy :func:`ropelab.engines.llamacpp_run.runtime_dir` makes loadable on an older
    glibc). An :class:`ImportError` naming both when neither is installed."""
    try:
        lib_dir = Path(llama_cpp().__file__).parent / "lib"
        return lib_dir / "libggml-base.so", lib_dir / "libggml-cpu.so", f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}"
    except ImportError as e:
        from . import llamacpp_run

        if not llamacpp_run.available():
            raise ImportError(f"{e} Or install llama-cpp-py-sync (pip install -e '.[engines]'), whose prebuilt CPU "
                              "libraries carry ggml too.") from e
        lib_dir = llamacpp_run.runtime_dir()
        shim = lib_dir / llamacpp_run._SHIM_NAME
        if shim.is_file():  # the glibc shim the copied libraries need, loaded first (llamacpp_run's docstring)
            ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
        return (lib_dir / "libggml-base.so.0", lib_dir / "libggml-cpu.so.0",
                f"llama-cpp-py-sync {llamacpp_run.LLAMA_CPP_PY_SYNC}")


def _ggml():
    """ggml's C API (libggml-base, libggml-cpu: :func:`ggml_libraries`), the few functions :func:`rope` calls."""
    global _GGML
    if _GGML is None:
        base_path, cpu_path, _ = ggml_libraries()
        base = ctypes.CDLL(str(base_path))
        cpu = ctypes.CDLL(str(cpu_path))
        p, i64, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        for lib, name, res, args in [
            (base, "ggml_init", p, [_InitParams]),
            (base, "ggml_free", None, [p]),
            (base, "ggml_new_tensor_1d", p, [p, ctypes.c_int, i64]),
            (base, "ggml_new_tensor_3d", p, [p, ctypes.c_int, i64, i64, i64]),
            (base, "ggml_get_data", p, [p]),
            (base, "ggml_rope_ext", p, [p, p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int, f, f, f, f, f, f]),
            (base, "ggml_rope_multi", p, [p, p, p, p, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                          ctypes.c_int, f, f, f, f, f, f]),
            (base, "ggml_new_graph", p, [p]),
            (base, "ggml_build_forward_expand", None, [p, p]),
            (cpu, "ggml_graph_compute_with_ctx", ctypes.c_int, [p, p, ctypes.c_int]),
        ]:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _GGML = (base, cpu)
    return _GGML


def rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    n_dims: int,
    mode: str,
    freq_base: float = 10000.0,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    n_ctx_orig: int = 0,
    freq_factors: torch.Tensor | None = None,
    sections: Sequence[int] | None = None,
    n_threads: int = 1,
) -> torch.Tensor:
    r"""ggml's ``ggml_rope_ext`` (``ggml_rope_multi`` for M-RoPE) on the CPU: ``x`` of shape
    ``[n_tokens, n_heads, head_dim]``, float32.

    The arguments are ggml's own (``ggml.h``): the first ``n_dims`` dims rotate by
    :math:`\theta_i = p\,\text{freq\_base}^{-2i/n}` divided by ``freq_factors[i]`` (llama3's ``rope_freqs``),
    interpolated by ``freq_scale`` (1 / factor) and, with ``ext_factor`` > 0, blended back to extrapolation
    over the YaRN ramp ``beta_fast .. beta_slow`` of ``n_ctx_orig``, with cos/sin scaled by ``attn_factor``
    (times :math:`1 + 0.1 \ln(1/\text{freq\_scale})` when ``ext_factor`` > 0). ``mode`` is ``"norm"`` or
    ``"neox"`` with ``positions`` of shape ``(n_tokens,)``, or ``"mrope"`` / ``"imrope"`` with ``positions`` of
    shape ``(3, n_tokens)`` (t, h, w) and ``sections``, the pairs each axis drives (up to 4 ints, ggml's
    ``sections[GGML_MROPE_SECTIONS]``). Returns float32.
    """
    if mode not in ROPE_MODES:
        raise ValueError(f"mode must be one of {sorted(ROPE_MODES)}, got {mode!r}.")
    if x.ndim != 3 or not x.is_floating_point():
        raise ValueError(f"x must be a float [n_tokens, n_heads, head_dim] tensor, got shape {tuple(x.shape)}.")
    n_tokens, n_heads, head_dim = x.shape
    if not isinstance(n_dims, int) or n_dims <= 0 or n_dims % 2 or n_dims > head_dim:
        raise ValueError(f"n_dims must be a positive even int <= head_dim = {head_dim}, got {n_dims!r}.")
    multi = mode in _MULTI
    want = (3, n_tokens) if multi else (n_tokens,)
    if positions.shape != want or positions.is_floating_point():
        raise ValueError(f"positions must be an int tensor of shape {want} for mode {mode!r}, got {positions.dtype} "
                         f"{tuple(positions.shape)}.")
    if multi != (sections is not None):
        raise ValueError(f"sections must be given for mode 'mrope' or 'imrope' and only then (mode {mode!r}).")
    if multi:
        sections = list(sections)
        if not 1 <= len(sections) <= 4 or not all(isinstance(k, int) and k >= 0 for k in sections):
            raise ValueError(f"sections must be 1 to 4 non-negative ints (pairs per axis), got {sections!r}.")
        sections = sections + [0] * (4 - len(sections))
    if freq_factors is not None and freq_factors.shape != (n_dims // 2,):
        raise ValueError(f"freq_factors must have shape ({n_dims // 2},), got {tuple(freq_factors.shape)}.")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ValueError(f"n_threads must be a positive int, got {n_threads!r}.")
    base, cpu = _ggml()
    xs = x.detach().to("cpu", torch.float32).contiguous()
    pos = positions.to("cpu", torch.int32)
    if multi:  # ggml reads 4 rows (t, h, w, e), each n_tokens long
        pos = torch.cat([pos, torch.zeros(1, n_tokens, dtype=torch.int32)]).reshape(-1)
    pos = pos.contiguous()
    ff = None if freq_factors is None else freq_factors.to("cpu", torch.float32).contiguous()
    nbytes = 3 * xs.numel() * 4 + pos.numel() * 4 + (0 if ff is None else ff.numel() * 4)
    ctx = base.ggml_init(_InitParams(nbytes + (64 << 20), None, False))  # + graph, work buffer, tensor headers
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        a = base.ggml_new_tensor_3d(ctx, _GGML_TYPE_F32, head_dim, n_heads, n_tokens)  # ne0 fastest
        b = base.ggml_new_tensor_1d(ctx, _GGML_TYPE_I32, pos.numel())
        c = None
        ctypes.memmove(base.ggml_get_data(a), xs.data_ptr(), xs.numel() * 4)
        ctypes.memmove(base.ggml_get_data(b), pos.data_ptr(), pos.numel() * 4)
        if ff is not None:
            c = base.ggml_new_tensor_1d(ctx, _GGML_TYPE_F32, ff.numel())
            ctypes.memmove(base.ggml_get_data(c), ff.data_ptr(), ff.numel() * 4)
        scalars = (n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
        if multi:
            out = base.ggml_rope_multi(ctx, a, b, c, n_dims, (ctypes.c_int * 4)(*sections), ROPE_MODES[mode], *scalars)
        else:
            out = base.ggml_rope_ext(ctx, a, b, c, n_dims, ROPE_MODES[mode], *scalars)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        status = cpu.ggml_graph_compute_with_ctx(ctx, graph, n_threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx failed with status {status}")
        y = torch.empty_like(xs)
        ctypes.memmove(y.data_ptr(), base.ggml_get_data(out), y.numel() * 4)
    finally:
        base.ggml_free(ctx)
    return y
