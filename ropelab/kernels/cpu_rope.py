r"""The CPU RoPE kernel (``cpu_rope.c``, C and OpenMP): one pass over x at the memory floor of a copy.

For every row of x (every token of every head of every batch element) the kernel reads the row once, rotates
its pairs with the float32 table row of that token's position and writes the row once:

.. math::
    y_a = x_a c - x_b s, \qquad y_b = x_a s + x_b c, \qquad y_{r:} = x_{r:},

pairs (i, i + r/2) (``"half"``) or (2i, 2i + 1) (``"interleaved"``). Numerics are :func:`ropelab.rotate`'s:
the tables are the caller's (angles in float64 or float32, rounded once to float32), x is widened to float32
exactly (bfloat16 by a 16-bit shift), the products and sums are float32 (a fused multiply-add, where the CPU
has one, removes a rounding), and the result is rounded once to x's dtype (bfloat16 to nearest even, NaN
kept; on a CPU with AVX512-BF16, rows of style half with r/2 a multiple of 16 round with the CPU's instruction,
redone in software for subnormal lanes, which the instruction flushes: the same bits, tested). So
:func:`ropelab.apply_rope`'s bound holds: per pair
:math:`|y_a - y_a^{exact}| \le 4u_{32}(|x_a| + |x_b|) + u\,|y_a^{exact}|`.

What it takes (:func:`supported` says which and why not): a CPU tensor of float32, bfloat16 or float16 with a
contiguous head dim (any other strides), at most 3 other axes, r/2 <= 2048 pairs; tables of x's axes in layout
order (:func:`ropelab.core.tables_for`), each 1 (repeated) or x's size, float32, contiguous pairs; ``out`` of x's
shape and dtype with a contiguous head dim, which may be x itself (in place: each row is read whole before any
of it is written). Threads: ``torch.get_num_threads()``, fewer for small work (a decode step runs on one).

The library is built on first use by :mod:`ropelab.kernels.cpu_build` (about half a second with gcc, then cached
on disk); :func:`build_info` reports that time apart.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from . import cpu_build

__all__ = ["LIBRARY", "SOURCE", "DTYPES", "MAX_PAIRS", "available", "why_unavailable", "build_info", "supported",
           "rotate_cpu", "pack", "launch_packed", "packed_address"]

LIBRARY = "cpu_rope"
SOURCE = Path(__file__).with_name("cpu_rope.c")
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
MAX_PAIRS = 2048  # ROPELAB_MAX_HALF in cpu_rope.c: the row buffers on the stack

_FN: list = []


def _lib():
    """The kernel's C function (ctypes), built or loaded on first use; raises cpu_build.BuildError."""
    if not _FN:
        lib = cpu_build.load_library(LIBRARY, SOURCE)
        fn = lib.ropelab_rope
        i64, p = ctypes.c_int64, ctypes.c_void_p
        fn.restype = ctypes.c_int
        fn.argtypes = [p, p, p, p] + [i64] * 14 + [ctypes.c_int] * 3
        lib.ropelab_has_f16.restype = ctypes.c_int
        packed = lib.ropelab_rope_packed
        packed.restype = ctypes.c_int
        packed.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        _FN.extend([fn, bool(lib.ropelab_has_f16()), packed])
    return _FN[0]


def why_unavailable() -> str | None:
    """None when the kernel builds and loads here, else why not (no C compiler, a compile error...)."""
    try:
        _lib()
    except cpu_build.BuildError as e:
        return str(e)
    return None


def available() -> bool:
    """Whether the kernel builds and loads on this machine (builds it on first call)."""
    return why_unavailable() is None


def build_info() -> dict | None:
    """The first load's cost: ``seconds`` compiling (0.0 when ``from_cache``), the library's ``path``, compiler
    and flags (:func:`ropelab.kernels.cpu_build.build_info`); None before the kernel was first used."""
    return cpu_build.build_info(LIBRARY)


def supported(x: torch.Tensor, half: int, d_index: int = -1) -> str | None:
    """None when the kernel takes x (rotating ``half`` pairs of the axis ``d_index``), else the reason."""
    if x.device.type != "cpu":
        return f"x is on {x.device.type}, the kernel runs on the CPU"
    if x.dtype not in DTYPES:
        return f"x is {x.dtype}; the kernel takes float32, bfloat16 and float16"
    if x.ndim > 4 or x.ndim < 1:
        return f"x has {x.ndim} dims; the kernel takes 1 to 4"
    if half > MAX_PAIRS:
        return f"{half} rotary pairs; the kernel takes at most {MAX_PAIRS}"
    if x.shape[d_index] > 1 and x.stride(d_index) != 1:
        return f"x's head dim is not contiguous (stride {x.stride(d_index)}); the kernel needs stride 1"
    if x.dtype == torch.float16:
        reason = why_unavailable()
        if reason is None and not _FN[1]:
            return "this compiler has no _Float16: float16 runs on the torch path"
        return reason
    return why_unavailable()


def _rows3(t: torch.Tensor) -> tuple[list[int], list[int]]:
    """Sizes and strides of t's dims but the last, padded to 3 at the front (size 1, stride 0)."""
    sizes, strides = list(t.shape[:-1]), list(t.stride()[:-1])
    strides = [0 if n == 1 else s for n, s in zip(sizes, strides)]
    pad = 3 - len(sizes)
    return [1] * pad + sizes, [0] * pad + strides


def rotate_cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, style: str = "half",
               out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`ropelab.rotate` on the kernel: ``x`` [..., d] (up to 3 leading dims) and float32 tables
    [..., r/2] with x's number of dims, each leading dim 1 or x's; the result in ``out`` (x's shape and dtype,
    may be x) or a new tensor. The caller has checked what :func:`supported` checks; this raises ValueError
    for tables or an out that do not fit."""
    half, d = cos.shape[-1], x.shape[-1]
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != sin.shape or cos.ndim != x.ndim:
        raise ValueError(f"the kernel takes float32 tables of x's {x.ndim} dims, got {cos.dtype} "
                         f"{tuple(cos.shape)} and {sin.dtype} {tuple(sin.shape)}.")
    if any(c not in (1, n) for c, n in zip(cos.shape[:-1], x.shape[:-1])) or 2 * half > d:
        raise ValueError(f"tables {tuple(cos.shape)} do not fit x {tuple(x.shape)}: each dim 1 or x's, "
                         f"2 * pairs <= head dim.")
    if cos.stride() != sin.stride() or (half > 1 and cos.stride(-1) != 1):
        cos, sin = cos.contiguous(), sin.contiguous()
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must have x's shape, dtype and device ({tuple(x.shape)}, {x.dtype}, {x.device}), "
                         f"got {tuple(out.shape)}, {out.dtype}, {out.device}.")
    elif out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"out's head dim must be contiguous (stride 1), got stride {out.stride(-1)}.")
    if x.numel() == 0:
        return out
    return launch(x, cos, sin, style, out)


def launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str, out: torch.Tensor) -> torch.Tensor:
    """The kernel call itself, for arguments :func:`rotate_cpu` (or the caller) has checked: x, out [..., d]
    (same shape and dtype, head dim contiguous), float32 tables [..., r/2] of x's dims with equal strides."""
    half, d = cos.shape[-1], x.shape[-1]
    (n0, n1, n2), xs = _rows3(x)
    _, os_ = _rows3(out)
    _, ts = _rows3(cos)
    status = _lib()(x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), n0, n1, n2, *xs, *os_, *ts,
                    half, d, int(style == "interleaved"), DTYPES[x.dtype], torch.get_num_threads())
    if status != 0:
        raise ValueError(f"the CPU kernel refused its arguments (status {status}): x {x.dtype} "
                         f"{tuple(x.shape)}, {half} pairs.")
    return out


N_PACKED = 21  # ropelab_rope's arguments, in its order, as int64
_PACKED_BYTES = 8 * N_PACKED
_SCRATCH = threading.local()


def pack(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str, out: torch.Tensor) -> ctypes.Array:
    """:func:`launch`'s arguments for views of x's and out's shapes and strides, packed for
    :func:`launch_packed`: the tables' pointers are kept (the caller keeps the tables alive), x's and out's are
    filled per call. Checked as :func:`launch`'s arguments are."""
    _lib()
    half, d = cos.shape[-1], x.shape[-1]
    (n0, n1, n2), xs = _rows3(x)
    _, os_ = _rows3(out)
    _, ts = _rows3(cos)
    return (ctypes.c_int64 * N_PACKED)(0, 0, cos.data_ptr(), sin.data_ptr(), n0, n1, n2, *xs, *os_, *ts, half, d,
                                       int(style == "interleaved"), DTYPES[x.dtype], 1)


def launch_packed(args: ctypes.Array, x_ptr: int, out_ptr: int) -> None:
    """The kernel on ``args`` from :func:`pack` with x's and out's data pointers (tensors of the packed shapes
    and strides) and ``torch.get_num_threads()`` threads: one converted argument, where :func:`launch` converts
    21. The arguments are filled in a per-thread copy, so threads sharing ``args`` do not race."""
    a = getattr(_SCRATCH, "args", None)
    if a is None:
        a = _SCRATCH.args = (ctypes.c_int64 * N_PACKED)()
    ctypes.memmove(a, args, _PACKED_BYTES)
    a[0], a[1], a[20] = x_ptr, out_ptr, torch.get_num_threads()
    if _FN[2](a) != 0:
        raise ValueError(f"the CPU kernel refused its packed arguments: {list(args)[4:]}.")


def packed_address() -> int:
    """The address of the kernel's packed entry (``ropelab_rope_packed``), for :mod:`ropelab.kernels.cpu_fast`
    to call it without ctypes; the library stays loaded for the process (cpu_build keeps it)."""
    _lib()
    return ctypes.cast(_FN[2], ctypes.c_void_p).value
