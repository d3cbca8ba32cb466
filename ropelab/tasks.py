r"""Synthetic tasks that separate counting tokens from counting *what matters*, with their evaluation.

Selective Copy (Gu & Dao 2023, "Mamba", arXiv 2312.00752; used by Golovneva et al. 2024, CoPE,
arXiv 2405.18719, Section 5): the context holds ``n_symbols`` symbols scattered at random among
``n_blanks`` blank tokens; after a separator the model must emit the symbols in order, blanks
skipped. To emit answer t the model must find "the t-th non-blank token", a position that counts
symbols, not tokens: with a token-count position encoding the offset from the answer to its source
changes with every blank, so a model that learns offsets for one blank density fails at another. The
out-of-distribution splits keep the symbols and change only the number of blanks: *dense* (fewer
blanks, shorter sequences) and *sparse* (more blanks, longer sequences than any seen in training).

Layout of one sequence (vocabulary: 0 blank, 1 separator, 2 .. 2 + alphabet - 1 symbols)::

    x_1 ... x_{n_symbols + n_blanks}  SEP  y_1 ... y_{n_symbols}

Language-model form: inputs are the sequence without its last token, targets the sequence shifted by
one, and the loss mask selects the targets y_1 .. y_n (the answer only, as in the paper).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from .models import ModelConfig, TinyLM, train

__all__ = [
    "BLANK",
    "SEP",
    "SelectiveCopy",
    "selective_copy_splits",
    "copy_errors",
    "run_selective_copy",
    "summarize_runs",
    "gate_statistics",
    "GateStatistics",
    "lag_copy",
]

BLANK, SEP, FIRST_SYMBOL = 0, 1, 2


@dataclass(frozen=True)
class SelectiveCopy:
    """One split of the Selective Copy task: ``n_symbols`` symbols (drawn uniformly, with repetition, from
    ``alphabet`` kinds) at uniformly random places among ``n_symbols + n_blanks`` context slots."""

    n_symbols: int = 8
    n_blanks: int = 32
    alphabet: int = 16

    def __post_init__(self) -> None:
        for name in ("n_symbols", "alphabet"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}.")
        if not isinstance(self.n_blanks, int) or self.n_blanks < 0:
            raise ValueError(f"n_blanks must be an int >= 0, got {self.n_blanks!r}.")

    @property
    def vocab_size(self) -> int:
        """Blank, separator and the ``alphabet`` symbols."""
        return FIRST_SYMBOL + self.alphabet

    @property
    def context_len(self) -> int:
        """Tokens before the separator: symbols and blanks."""
        return self.n_symbols + self.n_blanks

    @property
    def seq_len(self) -> int:
        """Length of the model input (the full sequence minus its last token)."""
        return self.context_len + self.n_symbols

    def sequences(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Full sequences [batch, context_len + 1 + n_symbols]: context, SEP, answer."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}.")
        n, c = self.n_symbols, self.context_len
        symbols = torch.randint(FIRST_SYMBOL, self.vocab_size, (batch, n), generator=generator)
        # n distinct slots per row, in increasing order: the first n of a random permutation, sorted.
        slots = torch.rand(batch, c, generator=generator).argsort(dim=-1)[:, :n].sort(dim=-1).values
        context = torch.full((batch, c), BLANK, dtype=torch.long).scatter(1, slots, symbols)
        sep = torch.full((batch, 1), SEP, dtype=torch.long)
        return torch.cat([context, sep, symbols], dim=1)

    def sample(self, batch: int, generator: torch.Generator | None = None):
        """``(inputs, targets, loss_mask)`` for :func:`ropelab.models.train`; the mask selects the answer."""
        seq = self.sequences(batch, generator)
        inputs, targets = seq[:, :-1], seq[:, 1:]
        loss_mask = torch.zeros_like(targets, dtype=torch.bool)
        loss_mask[:, self.context_len :] = True  # targets from position c on are y_1 .. y_n
        return inputs, targets, loss_mask

    def to_dict(self) -> dict:
        """The split's settings as a plain dict (for JSON)."""
        return asdict(self)

    @staticmethod
    def render(seq: torch.Tensor) -> str:
        """One sequence as text: ``.`` blank, ``|`` separator, ``A``, ``B``, ... symbols."""
        chars = {BLANK: ".", SEP: "|"}
        return "".join(chars.get(t, chr(ord("A") + t - FIRST_SYMBOL)) for t in seq.tolist())


def selective_copy_splits(
    n_symbols: int = 8, train_blanks: int = 32, dense_blanks: int = 16, sparse_blanks: int = 64, alphabet: int = 16
) -> dict[str, SelectiveCopy]:
    """The three evaluation splits: ``in_dist`` (the training distribution), ``ood_dense`` and
    ``ood_sparse`` (the same symbols among fewer / more blanks)."""
    if not dense_blanks < train_blanks < sparse_blanks:
        raise ValueError(
            f"need dense_blanks < train_blanks < sparse_blanks, got {dense_blanks}, {train_blanks}, {sparse_blanks}."
        )
    return {
        "in_dist": SelectiveCopy(n_symbols, train_blanks, alphabet),
        "ood_dense": SelectiveCopy(n_symbols, dense_blanks, alphabet),
        "ood_sparse": SelectiveCopy(n_symbols, sparse_blanks, alphabet),
    }


@torch.no_grad()
def copy_errors(model: torch.nn.Module, task: SelectiveCopy, n: int, *, seed: int = 1234, batch: int = 250) -> dict:
    """Test errors of ``model`` on ``n`` fresh sequences of ``task`` (fixed ``seed``, so every model sees the
    same test set).

    Returns ``{"token_error": ..., "sequence_error": ...}``: the fraction of answer tokens whose argmax
    prediction is wrong (teacher forcing), and the fraction of sequences with at least one such token.
    A sequence is right under teacher forcing exactly when greedy decoding reproduces the whole answer
    (each greedy step then sees the true prefix), so the sequence error is the greedy exact-match error.
    """
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    wrong_tokens = wrong_seqs = total = 0
    remaining = n
    while remaining > 0:
        b = min(batch, remaining)
        inputs, targets, mask = task.sample(b, gen)
        pred = model(inputs).argmax(-1)
        wrong = (pred != targets) & mask
        wrong_tokens += int(wrong.sum())
        wrong_seqs += int(wrong.any(dim=1).sum())
        total += b
        remaining -= b
    model.train(was_training)
    return {"token_error": wrong_tokens / (total * task.n_symbols), "sequence_error": wrong_seqs / total}


def run_selective_copy(
    pe: str,
    seed: int,
    *,
    splits: dict[str, SelectiveCopy],
    steps: int,
    batch: int = 32,
    lr: float = 3e-3,
    n_test: int = 500,
    eval_every: int | None = None,
    n_eval: int = 200,
    progress: bool = True,
    model_kwargs: dict | None = None,
) -> tuple[torch.nn.Module, dict]:
    """Train a :class:`ropelab.models.TinyLM` with position encoding ``pe`` on ``splits["in_dist"]`` and
    measure its test errors on every split.

    Returns ``(model, result)`` where ``result`` has the config, the training history (loss every 25
    steps; in-distribution sequence error on ``n_eval`` held-out sequences every ``eval_every`` steps),
    the final errors per split on ``n_test`` sequences, and the training wall time in seconds.
    """
    train_task = splits["in_dist"]
    longest = max(t.seq_len for t in splits.values())
    kwargs = dict(d_model=64, n_layers=2, n_heads=4, max_len=max(128, longest), cope_npos_max=64)
    kwargs.update(model_kwargs or {})
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=train_task.vocab_size, pe=pe, **kwargs)
    model = TinyLM(cfg)

    def evaluate(m):
        return {"in_dist_sequence_error": copy_errors(m, train_task, n_eval, seed=999)["sequence_error"]}

    start = time.perf_counter()
    history = train(
        model,
        lambda g: train_task.sample(batch, g),
        steps=steps,
        lr=lr,
        seed=seed,
        evaluate=evaluate if eval_every else None,
        eval_every=eval_every,
        progress=progress,
        desc=f"{pe} seed {seed}",
    )
    seconds = time.perf_counter() - start
    errors = {name: copy_errors(model, task, n_test) for name, task in splits.items()}
    result = {
        "pe": pe,
        "seed": seed,
        "steps": steps,
        "batch": batch,
        "lr": lr,
        "n_test": n_test,
        "config": {k: v for k, v in cfg.to_dict().items() if not isinstance(v, float) or math.isfinite(v)},
        "history": history,
        "errors": errors,
        "train_seconds": round(seconds, 1),
    }
    return model, result


def summarize_runs(results: list[dict], metric: str = "sequence_error") -> dict:
    """Per position encoding and split: the mean, sample standard deviation and per-seed values of
    ``metric`` in percent, from :func:`run_selective_copy` results."""
    out: dict = {}
    for r in results:
        for split, errs in r["errors"].items():
            out.setdefault(r["pe"], {}).setdefault(split, []).append(100.0 * errs[metric])
    summary = {}
    for pe, splits in out.items():
        summary[pe] = {}
        for split, vals in splits.items():
            t = torch.tensor(vals, dtype=torch.float64)
            std = float(t.std()) if len(vals) > 1 else 0.0
            summary[pe][split] = {"mean": float(t.mean()), "std": std, "per_seed": vals}
    return summary


class GateStatistics(NamedTuple):
    """What :func:`gate_statistics` returns (a named tuple: ``sym, blank, stats = ...`` still unpacks)."""

    sym: torch.Tensor  # [b, h, queries]: mean gate on symbol keys
    blank: torch.Tensor  # [b, h, queries]: mean gate on blank keys
    stats: dict  # the summary shares and means


def gate_statistics(gates: torch.Tensor, is_symbol: torch.Tensor, threshold: float = 0.05) -> GateStatistics:
    """What CoPE's gates count on Selective Copy.

    ``gates`` [b, h, queries, keys] are one layer's gates of the answer queries over the context keys;
    ``is_symbol`` [b, 1, 1, keys] marks the symbol keys (the rest are blanks). Returns ``GateStatistics``:
    the mean gate of every (sequence, head, query) row on its symbol keys and on its blank keys, and a dict
    with the share of answer queries that have at least one *blank-blind* head (mean blank gate below
    ``threshold``: that head's contextual position counts symbols only), the share of blank-blind rows, and
    the mean blank and symbol gates inside those rows (None when there are none).
    """
    if gates.ndim != 4 or is_symbol.shape[-1] != gates.shape[-1]:
        raise ValueError(
            f"gates must be [b, h, queries, keys] and is_symbol [b, 1, 1, keys]; got {tuple(gates.shape)} and "
            f"{tuple(is_symbol.shape)}."
        )
    sym = (gates * is_symbol).sum(-1) / is_symbol.sum(-1)
    blank = (gates * ~is_symbol).sum(-1) / (~is_symbol).sum(-1)
    blind = blank < threshold
    stats = {
        "queries_with_blank_blind_head": float(blind.any(1).double().mean()),
        "blank_blind_rows": float(blind.double().mean()),
        "blank_gate_in_blind_rows": float(blank[blind].mean()) if blind.any() else None,
        "symbol_gate_in_blind_rows": float(sym[blind].mean()) if blind.any() else None,
    }
    return GateStatistics(sym, blank, stats)


def lag_copy(gen: torch.Generator, batch: int, seq_len: int, vocab: int, lag: int):
    """A task no model solves without position: copy the token seen ``lag`` steps ago in a stream of uniform
    random tokens (chance level ln ``vocab``). Returns ``(x, y, mask)`` [batch, seq_len]: inputs, targets
    ``y[t] = x[t - lag]``, and a mask that drops the first ``lag`` positions (they have no target)."""
    if not 0 < lag < seq_len:
        raise ValueError(f"lag must be in (0, seq_len={seq_len}), got {lag}.")
    x = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    y = torch.roll(x, lag, dims=1)
    mask = (torch.arange(seq_len) >= lag).expand(batch, seq_len)
    return x, y, mask
