"""The Selective Copy task generates what it claims, and its error measure counts what it claims."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ropelab.tasks import BLANK, SEP, SelectiveCopy, copy_errors, selective_copy_splits


def test_sequences_hold_the_symbols_and_their_copy(gen):
    task = SelectiveCopy(n_symbols=5, n_blanks=11, alphabet=7)
    seq = task.sequences(300, gen)
    c = task.context_len
    assert seq.shape == (300, c + 1 + 5) and seq.dtype == torch.long
    assert bool((seq[:, c] == SEP).all())
    ctx, answer = seq[:, :c], seq[:, c + 1 :]
    assert bool(((ctx == BLANK) | (ctx >= 2)).all()) and bool((ctx < task.vocab_size).all())
    assert bool(((answer >= 2) & (answer < task.vocab_size)).all())
    assert bool(((ctx != BLANK).sum(1) == 5).all())  # exactly n_symbols non-blank tokens
    for row in range(300):
        assert torch.equal(ctx[row][ctx[row] != BLANK], answer[row])  # the answer is them, in order
    assert len({tuple(r.tolist()) for r in seq}) > 290  # not the same sequence over and over


def test_symbol_slots_are_uniform(gen):
    """Each context slot holds a symbol with probability n / c, and every symbol kind is equally likely."""
    task = SelectiveCopy(n_symbols=4, n_blanks=12, alphabet=5)
    n = 20000
    ctx = task.sequences(n, gen)[:, : task.context_len]
    freq = (ctx != BLANK).double().mean(0)
    p = 4 / 16
    assert bool(((freq - p).abs() < 5 * math.sqrt(p * (1 - p) / n)).all()), freq
    kinds = torch.bincount(ctx[ctx != BLANK] - 2, minlength=5).double() / (4 * n)
    assert bool(((kinds - 0.2).abs() < 5 * math.sqrt(0.2 * 0.8 / (4 * n))).all()), kinds


def test_sample_shifts_and_masks_the_answer(gen):
    task = SelectiveCopy(n_symbols=3, n_blanks=6, alphabet=4)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    inputs, targets, mask = task.sample(50, g1)
    seq = task.sequences(50, g2)  # same generator state: the same sequences
    assert torch.equal(inputs, seq[:, :-1]) and torch.equal(targets, seq[:, 1:])
    assert inputs.shape == (50, task.seq_len)
    assert bool((mask.sum(1) == 3).all())
    assert torch.equal(targets[mask].view(50, 3), seq[:, -3:])  # the mask selects exactly the answer
    assert bool((inputs[:, task.context_len] == SEP).all())


def test_splits_change_only_the_blanks():
    s = selective_copy_splits(8, 32, 16, 64)
    assert [t.n_blanks for t in s.values()] == [32, 16, 64]
    assert {t.n_symbols for t in s.values()} == {8} and {t.vocab_size for t in s.values()} == {18}
    assert s["ood_sparse"].seq_len == 8 + 64 + 8
    with pytest.raises(ValueError, match="dense_blanks"):
        selective_copy_splits(8, 32, 40, 64)


class Oracle(nn.Module):
    """Predicts the right answer at every answer position; optionally wrong on the first answer of even rows."""

    def __init__(self, task, sabotage=False):
        super().__init__()
        self.task, self.sabotage = task, sabotage

    def forward(self, inputs):
        b, s = inputs.shape
        c, n = self.task.context_len, self.task.n_symbols
        logits = torch.zeros(b, s, self.task.vocab_size)
        for row in range(b):
            ctx = inputs[row, :c]
            answer = ctx[ctx != BLANK]
            logits[row, torch.arange(c, c + n), answer] = 1.0
            if self.sabotage and row % 2 == 0:
                logits[row, c, answer[0]] = 0.0
                logits[row, c, BLANK] = 1.0
        return logits


def test_copy_errors_counts_tokens_and_sequences():
    task = SelectiveCopy(n_symbols=4, n_blanks=8, alphabet=6)
    assert copy_errors(Oracle(task), task, 100, batch=30) == {"token_error": 0.0, "sequence_error": 0.0}
    e = copy_errors(Oracle(task, sabotage=True), task, 100, batch=30)  # batches of 30: rows 0, 2, ... of each
    wrong_rows = sum(len(range(0, b, 2)) for b in (30, 30, 30, 10))
    assert e["sequence_error"] == wrong_rows / 100 and e["token_error"] == wrong_rows / 400


def test_bad_input_raises():
    with pytest.raises(ValueError, match="n_symbols"):
        SelectiveCopy(n_symbols=0)
    with pytest.raises(ValueError, match="n_blanks"):
        SelectiveCopy(n_blanks=-1)
    with pytest.raises(ValueError, match="batch"):
        SelectiveCopy().sequences(0)


def test_gate_statistics_on_hand_made_gates():
    from ropelab.tasks import gate_statistics

    is_symbol = torch.tensor([True, False, True, False])[None, None, None, :]  # [1, 1, 1, 4]
    gates = torch.tensor([[[[1.0, 0.0, 0.8, 0.02]], [[0.5, 0.5, 0.5, 0.5]]]])  # [1, 2 heads, 1 query, 4 keys]
    sym, blank, stats = gate_statistics(gates, is_symbol)
    assert torch.allclose(sym, torch.tensor([[[0.9], [0.5]]]))
    assert torch.allclose(blank, torch.tensor([[[0.01], [0.5]]]))
    assert stats["queries_with_blank_blind_head"] == 1.0 and stats["blank_blind_rows"] == 0.5
    assert stats["blank_gate_in_blind_rows"] == pytest.approx(0.01)
    assert stats["symbol_gate_in_blind_rows"] == pytest.approx(0.9)
    _, _, none = gate_statistics(torch.full((1, 2, 1, 4), 0.5), is_symbol)
    assert none["queries_with_blank_blind_head"] == 0.0 and none["blank_gate_in_blind_rows"] is None
    with pytest.raises(ValueError, match="gates must be"):
        gate_statistics(torch.zeros(2, 4), is_symbol)
