r"""Output buffers for the CPU kernels that a freed result hands back: no page faults on every call.

A fresh large CPU tensor is fresh memory: glibc serves allocations above its mmap threshold (at most 32 MiB) with
``mmap``, so each new output of a [32, 4096, 128] float32 RoPE (64 MiB) is zero-filled page by page by the
kernel on first touch and unmapped when freed. Measured on this project's 2-core machine that costs more than
the RoPE itself: ``torch.empty_like(q).copy_(q)`` takes about 5x a copy into a preallocated buffer.

:func:`empty` keeps up to :data:`MAX_BLOCKS` blocks of at least :data:`MIN_BYTES` bytes (numpy arrays) and hands
out tensors viewing them (``torch.from_numpy``). A tensor keeps its block alive through its storage, so a block
is reused only when no tensor (nor view) of it is left: its reference count, exact in CPython, is back to the
pool's own. A result lives as long as the caller keeps it; only after it is freed does its memory go to the next
call. Smaller outputs (a decode step) come from ``torch.empty``. ``ROPELAB_CPU_POOL=0`` turns the pool off.

The tensors are ordinary CPU tensors, except that their storage cannot be resized (``resize_`` to a larger size
raises), as for any tensor from numpy.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import torch

__all__ = ["MIN_BYTES", "MAX_BLOCKS", "enabled", "empty", "clear"]

MIN_BYTES = 1 << 20
MAX_BLOCKS = 8
_BLOCKS: list[np.ndarray] = []
# Choosing a free block and taking a view of it must be one step: two threads that both saw a block free between
# the check and the view would get outputs sharing memory.
_LOCK = threading.Lock()


def _free_refs() -> int:
    # The reference count of a block that only the pool's list holds, seen from a loop over that list (the list,
    # the loop variable, getrefcount's argument): measured, not assumed, as the loops below see it.
    probe = [np.empty(1)]
    for block in probe:
        return sys.getrefcount(block)
    raise AssertionError


_FREE_REFS = _free_refs()


def enabled() -> bool:
    """Whether the pool is on (``ROPELAB_CPU_POOL`` unset or not ``0``)."""
    return os.environ.get("ROPELAB_CPU_POOL", "1") != "0"


def empty(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor of ``like``'s shape and dtype (module docstring)."""
    nbytes = like.numel() * like.element_size()
    if nbytes < MIN_BYTES or not enabled():
        return torch.empty(like.shape, dtype=like.dtype)
    with _LOCK:
        for block in _BLOCKS:
            if block.nbytes == nbytes and sys.getrefcount(block) <= _FREE_REFS:
                break
        else:
            block = np.empty(nbytes, dtype=np.uint8)
            if len(_BLOCKS) >= MAX_BLOCKS:  # drop the oldest free block, if any; else serve without pooling
                free = [i for i, b in enumerate(_BLOCKS) if sys.getrefcount(b) <= _FREE_REFS]
                if free:
                    del _BLOCKS[free[0]]
            if len(_BLOCKS) < MAX_BLOCKS:
                _BLOCKS.append(block)
        view = block[:]  # holds the block: no other caller sees it free from here on
    del block
    return torch.from_numpy(view).view(like.dtype).view(like.shape)


def clear() -> None:
    """Forget every pooled block (tensors still using one keep it alive)."""
    with _LOCK:
        _BLOCKS.clear()
