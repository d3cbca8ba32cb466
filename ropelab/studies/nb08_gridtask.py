r"""A 2D task where axial RoPE and flattened 1D RoPE differ: copy the symbol of the patch above.

Each example is a grid of ``height`` rows and ``width`` columns of random symbols, read row-major as a
sequence. The target at every patch of row >= 1 is the symbol directly above it. Above is the 2D offset
(-1, 0) whatever the width, but the 1D offset -width, which changes from grid to grid: one attention
layer whose queries and keys carry position only (learned constants, rotated) can point at (-1, 0) with
2D axial RoPE, and at one fixed 1D offset with flattened RoPE. Training draws a width per step from
``widths``, so a flattened-RoPE model can at best be right for one width at a time.

The model is one attention head: symbol embeddings give the values; queries and keys are learned vectors
(the same at every patch), rotated by :func:`ropelab.apply_rope` with 1D positions (``pe="flat"``) or
with row/column positions and :class:`ropelab.multiaxis.MultiAxis` (``pe="axial"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..core import apply_rope
from ..machine import one_thread
from ..multiaxis import MultiAxis, flat_positions, grid_positions

__all__ = ["grid_batch", "GridAttention", "train_grid", "grid_accuracy", "PES"]

PES = ("axial", "flat")


def grid_batch(batch: int, height: int, width: int, vocab: int, generator: torch.Generator):
    """(symbols [batch, h*w], targets [batch, h*w] with -100 on row 0): the symbol above each patch."""
    if min(batch, height, width, vocab) < 1 or height < 2:
        raise ValueError(f"need batch, width, vocab >= 1 and height >= 2, got {batch}, {height}, {width}, {vocab}.")
    x = torch.randint(0, vocab, (batch, height * width), generator=generator)
    y = torch.full_like(x, -100)
    y[:, width:] = x[:, :-width]
    return x, y


class GridAttention(nn.Module):
    """One attention head over a grid; position enters only through RoPE on learned q, k vectors."""

    def __init__(self, vocab: int, dim: int = 32, pe: str = "axial", base: float = 100.0):
        super().__init__()
        if pe not in PES:
            raise ValueError(f"pe must be one of {PES}, got {pe!r}.")
        if dim % 4:
            raise ValueError(f"dim must be a multiple of 4 (two axes of pairs), got {dim}.")
        self.pe, self.base, self.dim = pe, base, dim
        self.embed = nn.Embedding(vocab, dim)
        self.q = nn.Parameter(torch.randn(dim) / dim**0.5)
        self.k = nn.Parameter(torch.randn(dim) / dim**0.5)
        self.out = nn.Linear(dim, vocab)
        self.scale = nn.Parameter(torch.tensor(4.0))

    def forward(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """Logits [batch, s, vocab] for symbols x [batch, s] laid out in rows of ``width``."""
        b, s = x.shape
        if s % width:
            raise ValueError(f"the sequence length {s} is not a whole number of rows of width {width}.")
        q = self.q.expand(1, s, self.dim)
        k = self.k.expand(1, s, self.dim)
        if self.pe == "axial":
            pos = grid_positions(s // width, width)
            spec = MultiAxis.axial_dims((self.dim // 2, self.dim // 2))
            q, k = (apply_rope(t, pos, layout="b s d", base=self.base, sections=spec) for t in (q, k))
        else:
            pos = flat_positions(s // width, width)
            q, k = (apply_rope(t, pos, layout="b s d", base=self.base) for t in (q, k))
        att = torch.softmax(self.scale * (q @ k.transpose(-1, -2))[0], dim=-1)  # [s, s], same for the batch
        return self.out(att @ self.embed(x))


def grid_accuracy(model: GridAttention, height: int, width: int, vocab: int, *, seed: int = 123,
                  batch: int = 256) -> float:
    """Fraction of patches (row >= 1) whose above-symbol the model predicts, on fresh grids."""
    g = torch.Generator().manual_seed(seed)
    x, y = grid_batch(batch, height, width, vocab, g)
    with torch.no_grad():
        pred = model(x, width).argmax(-1)
    m = y != -100
    return float((pred[m] == y[m]).float().mean())


def train_grid(pe: str, seed: int, *, widths: Sequence[int] = (4, 5, 6, 7, 8), height: int = 6, vocab: int = 16,
               dim: int = 32, steps: int = 300, batch: int = 32, lr: float = 0.05) -> GridAttention:
    """Train a :class:`GridAttention` with ``pe`` for ``steps`` Adam steps, one random width per step.

    Runs on one thread: the ops are tiny, and on a shared 2-core machine a second thread made training
    about 30x slower (measured: 3 seeds x 2 encodings took 5 s on one thread, 231 s on two), with the
    same accuracies."""
    with one_thread():
        return _train(pe, seed, widths, height, vocab, dim, steps, batch, lr)


def _train(pe, seed, widths, height, vocab, dim, steps, batch, lr) -> GridAttention:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = GridAttention(vocab, dim, pe)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        w = int(widths[int(torch.randint(0, len(widths), (1,), generator=g))])
        x, y = grid_batch(batch, height, w, vocab, g)
        loss = nn.functional.cross_entropy(model(x, w).reshape(-1, vocab), y.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
