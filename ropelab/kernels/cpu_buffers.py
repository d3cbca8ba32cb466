r"""Output buffers for the CPU kernels that a freed result hands back: no page faults on every call.

A fresh large CPU tensor is fresh memory: glibc serves allocations above its mmap threshold (at most 32 MiB) with
``mmap``, so each new output of a [32, 4096, 128] float32 RoPE (64 MiB) is zero-filled page by page by the
kernel on first touch and unmapped when freed. Measured on this project's 2-core machine that costs more than
the RoPE itself: ``torch.empty_like(q).copy_(q)`` takes about 5x a copy into a preallocated buffer.

:func:`empty` keeps up to :data:`MAX_BLOCKS` blocks of at least :data:`MIN_BYTES` bytes (numpy arrays) and hands
out tensors viewing them (``torch.from_numpy``). A tensor keeps its block alive through its storage, so a block
is reused only when no tensor (nor view) of it is left: its reference count, exact in CPython, is back to the
pool's own. A result lives as long as the caller keeps it; only after it is freed does its memory go to the next
call. Smaller outputs (a decode step) and larger ones (past :data:`MAX_POOLED_BYTES`, which also bounds what the
pool keeps in all) come from ``torch.empty``. ``ROPELAB_CPU_POOL=0`` turns the pool off.

The tensors are ordinary CPU tensors, except that their storage cannot be resized (``resize_`` to a larger size
raises), as for any tensor from numpy.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import torch

__all__ = ["MIN_BYTES", "MAX_BLOCKS", "MAX_POOLED_BYTES", "enabled", "empty", "clear"]

MIN_BYTES = 1 << 20
MAX_BLOCKS = 8
# What the pool may keep after its results are freed: a one-off huge call must not pin gigabytes for the rest of
# the process (a larger output is an ordinary torch.empty).
MAX_POOLED_BYTES = 1 << 30
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
    if nbytes < MIN_BYTES or nbytes > MAX_POOLED_BYTES or not enabled():
        return torch.empty(like.shape, dtype=like.dtype)
    with _LOCK:
        for block in _BLOCKS:
            if block.nbytes == nbytes and sys.getrefcount(block) <= _FREE_REFS:
                break
        else:
            block = np.empty(nbytes, dtype=np.uint8)
            # drop the oldest free blocks while the pool is full (in count or bytes); else serve without pooling
            while len(_BLOCKS) >= MAX_BLOCKS or sum(b.nbytes for b in _BLOCKS) + nbytes > MAX_POOLED_BYTES:
                free = [i for i, b in enumerate(_BLOCKS) if sys.getrefcount(b) <= _FREE_REFS]
                if not free:
                    break
                del _BLOCKS[free[0]]
            if len(_BLOCKS) < MAX_BLOCKS and sum(b.nbytes for b in _BLOCKS) + nbytes <= MAX_POOLED_BYTES:
                _BLOCKS.append(block)
        view = block[:]  # holds the block: no other caller sees it free from here on
    del block
    return torch.from_numpy(view).view(like.dtype).view(like.shape)


def clear() -> None:
    """Forget every pooled block (tensors still using one keep it alive)."""
    with _LOCK:
        _BLOCKS.clear()
