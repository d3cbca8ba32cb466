"""The 2D 'symbol above' task (ropelab.studies.nb08_gridtask): axial RoPE solves it, flattened 1D
RoPE cannot for all widths."""

import pytest
import torch

from ropelab.studies.nb08_gridtask import GridAttention, grid_accuracy, grid_batch, train_grid


def test_targets_are_the_symbol_above():
    x, y = grid_batch(3, 4, 5, 10, torch.Generator().manual_seed(0))
    grid_x, grid_y = x.reshape(3, 4, 5), y.reshape(3, 4, 5)
    assert torch.all(grid_y[:, 0] == -100) and torch.equal(grid_y[:, 1:], grid_x[:, :-1])


def test_axial_learns_above_and_flat_does_not():
    axial, flat = train_grid("axial", 0, steps=150), train_grid("flat", 0, steps=150)
    acc_a = [grid_accuracy(axial, 6, w, 16) for w in (4, 6, 8)]
    acc_f = [grid_accuracy(flat, 6, w, 16) for w in (4, 6, 8)]
    assert min(acc_a) > 0.9 and sum(acc_f) / 3 < 0.7


def test_bad_input():
    with pytest.raises(ValueError, match="pe must be"):
        GridAttention(8, pe="learned")
    with pytest.raises(ValueError, match="height"):
        grid_batch(2, 1, 4, 8, torch.Generator())
    with pytest.raises(ValueError, match="whole number of rows"):
        GridAttention(8)(torch.zeros(1, 10, dtype=torch.long), 4)
