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

import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..models import ModelConfig, TinyLM, checkpoint_dict, from_checkpoint_dict, train
from .nb04_results import (
    load_selective_copy_models,
    load_selective_copy_results,
    models_path,
)

__all__ = [
    "BLANK",
    "SEP",
    "SelectiveCopy",
    "selective_copy_splits",
    "copy_errors",
    "run_selective_copy",
    "run_selective_copy_sweep",
    "select_learning_rates",
    "selective_copy_protocol",
    "steps_to_error",
    "summarize_runs",
    "gate_statistics",
    "GateStatistics",
    "source_positions",
    "VALIDATION_SEED",
    "TEST_SEED",
    "SelectiveCopySweep",
    "load_or_run_selective_copy",
    "selective_copy_claims",
    "training_machines",
    "learning_rate_sensitivity",
    "cope_gate_analysis",
    "main",
]

BLANK, SEP, FIRST_SYMBOL = 0, 1, 2
# Held-out sequences come from their own generators, never from a training generator (seeded 0, 1, 2 ...):
VALIDATION_SEED = 999  # in-distribution validation set: learning curves and the choice of learning rate
TEST_SEED = 1234  # test sets of every split: only the reported numbers


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
def copy_errors(
    model: torch.nn.Module, task: SelectiveCopy, n: int, *, seed: int = TEST_SEED, batch: int = 250
) -> dict:
    """Test errors of ``model`` on ``n`` fresh sequences of ``task`` (fixed ``seed``, so every model sees the
    same test set).

    Returns ``{"token_error": ..., "sequence_error": ..., "loss": ...}``: the fraction of answer tokens whose
    argmax prediction is wrong (teacher forcing), the fraction of sequences with at least one such token, and
    the mean cross-entropy (nats) on the answer tokens.
    A sequence is right under teacher forcing exactly when greedy decoding reproduces the whole answer
    (each greedy step then sees the true prefix), so the sequence error is the greedy exact-match error.
    """
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    wrong_tokens = wrong_seqs = total = 0
    loss_sum = 0.0
    remaining = n
    while remaining > 0:
        b = min(batch, remaining)
        inputs, targets, mask = task.sample(b, gen)
        logits = model(inputs)
        wrong = (logits.argmax(-1) != targets) & mask
        wrong_tokens += int(wrong.sum())
        wrong_seqs += int(wrong.any(dim=1).sum())
        loss_sum += float(F.cross_entropy(logits[mask].double(), targets[mask], reduction="sum"))
        total += b
        remaining -= b
    model.train(was_training)
    n_tokens = total * task.n_symbols
    return {"token_error": wrong_tokens / n_tokens, "sequence_error": wrong_seqs / total, "loss": loss_sum / n_tokens}


def run_selective_copy(
    pe: str,
    seed: int,
    *,
    splits: dict[str, SelectiveCopy],
    steps: int,
    batch: int = 32,
    lr: float = 3e-3,
    n_test: int = 500,
    n_val: int = 500,
    eval_every: int | None = None,
    n_eval: int = 200,
    progress: bool = True,
    model_kwargs: dict | None = None,
) -> tuple[torch.nn.Module, dict]:
    """Train a :class:`ropelab.models.TinyLM` with position encoding ``pe`` on ``splits["in_dist"]`` and
    measure its validation and test errors.

    Returns ``(model, result)`` where ``result`` has the config, the training history (loss every 25
    steps; in-distribution sequence error on the first ``n_eval`` validation sequences every
    ``eval_every`` steps), the final in-distribution ``validation`` errors on ``n_val`` sequences
    (generator :data:`VALIDATION_SEED`: use these, never the test errors, to choose between runs), the
    final test ``errors`` per split on ``n_test`` sequences (generator :data:`TEST_SEED`), and the
    training wall time in seconds.
    """
    train_task = splits["in_dist"]
    longest = max(t.seq_len for t in splits.values())
    kwargs = dict(d_model=64, n_layers=2, n_heads=4, max_len=max(128, longest), cope_npos_max=64)
    kwargs.update(model_kwargs or {})
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=train_task.vocab_size, pe=pe, **kwargs)
    model = TinyLM(cfg)

    def evaluate(m):
        return {"in_dist_sequence_error": copy_errors(m, train_task, n_eval, seed=VALIDATION_SEED)["sequence_error"]}

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
    validation = copy_errors(model, train_task, n_val, seed=VALIDATION_SEED)
    errors = {name: copy_errors(model, task, n_test, seed=TEST_SEED) for name, task in splits.items()}
    result = {
        "pe": pe,
        "seed": seed,
        "steps": steps,
        "batch": batch,
        "lr": lr,
        "n_test": n_test,
        "config": {k: v for k, v in cfg.to_dict().items() if not isinstance(v, float) or math.isfinite(v)},
        "history": history,
        "validation": validation,
        "errors": errors,
        "train_seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
    }
    return model, result


def _sweep_job(job: dict) -> tuple[dict, dict]:
    # Runs in a worker process (or in-process): a fixed thread count, then one training run.
    torch.set_num_threads(job.pop("threads"))
    model, result = run_selective_copy(**job)
    return checkpoint_dict(model), result


def run_selective_copy_sweep(
    pes, lrs, seeds, *, splits: dict[str, SelectiveCopy], steps: int, workers: int = 1, threads: int = 1, **kwargs
) -> tuple[list[dict], dict]:
    """:func:`run_selective_copy` for every (position encoding, learning rate, seed): the same steps, batch
    and data for all, so each encoding gets the same learning-rate sweep.

    Each run trains on ``threads`` threads; ``workers > 1`` runs that many at once in separate processes
    (spawned, so no OpenMP state is inherited). A run's numbers depend on its seed and thread count, not on
    ``workers`` or on the order the runs finish. Returns ``(results, models)``: the results in the order
    (pe, lr, seed) and the trained models keyed by ``(pe, lr, seed)``.
    """
    if not isinstance(workers, int) or workers < 1 or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"workers and threads must be positive ints, got workers={workers!r}, threads={threads!r}.")
    keys = [(pe, float(lr), seed) for pe in pes for lr in lrs for seed in seeds]
    return _run_jobs(keys, splits=splits, steps=steps, workers=workers, threads=threads, **kwargs)


def _run_jobs(keys, *, splits, steps, workers, threads, **kwargs) -> tuple[list[dict], dict]:
    # run_selective_copy for each (pe, lr, seed) in keys, in worker processes when workers > 1
    from ..machine import machine_info

    jobs = [dict(pe=pe, seed=seed, lr=float(lr), splits=splits, steps=steps, threads=threads, progress=False,
                 **kwargs) for pe, lr, seed in keys]
    if workers == 1:
        outputs = [_sweep_job(dict(job)) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            outputs = list(pool.map(_sweep_job, jobs))
    results, models = [], {}
    cpu = machine_info()["cpu"]
    for ckpt, result in outputs:
        models[result["pe"], result["lr"], result["seed"]] = from_checkpoint_dict(ckpt)
        results.append({**result, "cpu": cpu})
    return results, models


def selective_copy_protocol(smoke: bool = False) -> dict:
    """The settings notebook 04 runs (and ``python -m ropelab.studies.nb04_selective_copy`` repeats): every
    encoding, the same
    learning-rate sweep, seeds and steps. ``smoke`` gives tiny sizes for the test suite."""
    if smoke:
        return dict(pes=["none", "learned", "rope", "cope"], lrs=[3e-3], seeds=[0], steps=30, batch=32,
                    n_val=40, n_test=40, eval_every=15, n_eval=20)
    return dict(pes=["none", "learned", "rope", "cope"], lrs=[1e-3, 3e-3, 1e-2], seeds=[0, 1, 2, 3, 4], steps=400,
                batch=64, n_val=500, n_test=500, eval_every=50, n_eval=200)


def select_learning_rates(results: list[dict]) -> dict:
    """For each position encoding, the learning rate with the lowest mean **validation** sequence error over
    seeds (ties broken by the mean validation loss), from :func:`run_selective_copy` results. Test errors
    play no part. Returns ``{pe: {"lr": best, "sweep": {lr: {"sequence_error": %, "loss": nats, "seeds": n}}}}``
    with the mean validation sequence error in percent for every learning rate tried."""
    table: dict = {}
    for r in results:
        if "validation" not in r:
            raise ValueError("results need a 'validation' entry; make them with run_selective_copy (n_val > 0).")
        table.setdefault(r["pe"], {}).setdefault(r["lr"], []).append(r["validation"])
    out = {}
    for pe, by_lr in table.items():
        sweep = {
            lr: {
                "sequence_error": 100.0 * sum(v["sequence_error"] for v in vals) / len(vals),
                "loss": sum(v["loss"] for v in vals) / len(vals),
                "seeds": len(vals),
            }
            for lr, vals in sorted(by_lr.items())
        }
        best = min(sweep, key=lambda lr: (sweep[lr]["sequence_error"], sweep[lr]["loss"]))
        out[pe] = {"lr": best, "sweep": sweep}
    return out


def steps_to_error(history: list[dict], threshold: float) -> int | None:
    """The first training step at which the in-distribution validation sequence error (recorded in the
    history every ``eval_every`` steps) is at most ``threshold`` (a fraction), or None if it never is."""
    return next(
        (h["step"] for h in history if h.get("in_dist_sequence_error") is not None
         and h["in_dist_sequence_error"] <= threshold),
        None,
    )


def summarize_runs(results: list[dict], metric: str = "sequence_error") -> dict:
    """Per position encoding and split: the mean, sample standard deviation, min, max and per-seed values of
    ``metric`` in percent, from :func:`run_selective_copy` results (pass one learning rate's runs)."""
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
            summary[pe][split] = {
                "mean": float(t.mean()), "std": std, "min": float(t.min()), "max": float(t.max()), "per_seed": vals
            }
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


def source_positions(positions: torch.Tensor, inputs: torch.Tensor, task: SelectiveCopy) -> torch.Tensor:
    r"""CoPE's contextual position of each answer's **source** seen from the query that writes it.

    ``positions`` [b, h, s, s] are one layer's :math:`p_{ij} = \sum_{k=j}^{i} g_{ik}` (from
    :func:`ropelab.cope.cope_internals`) for the token ids ``inputs`` [b, s] of ``task``. Answer t (1..n) is
    written by the query at index :math:`c + t - 1` (the separator for t = 1, else answer t - 1) and copies
    the t-th symbol of the context. Returns :math:`p` at (that query, that key), [b, h, n]. Between them lie
    the n - t + 1 symbols from the source on, the separator and t - 1 answers: n + 1 non-blank tokens, so a
    head whose gates are 1 on symbols and 0 on blanks reads n + 1 for every t.
    """
    b, s = inputs.shape
    c, n = task.context_len, task.n_symbols
    if positions.ndim != 4 or positions.shape[0] != b or positions.shape[-2:] != (s, s) or s != task.seq_len:
        raise ValueError(
            f"positions must be [b, h, s, s] for inputs [b, s] of this task (s = {task.seq_len}); got "
            f"{tuple(positions.shape)} and {tuple(inputs.shape)}."
        )
    symbol = inputs[:, :c] != BLANK
    if not bool((symbol.sum(1) == n).all()):
        raise ValueError(f"every row of inputs must hold exactly n_symbols={n} symbols in its context.")
    src = symbol.nonzero()[:, 1].view(b, n)  # nonzero lists row by row, columns ascending: the t-th symbol
    p = positions[:, :, c : c + n, :]  # queries writing answers 1..n: [b, h, n, s]
    return p.gather(-1, src[:, None, :, None].expand(b, p.shape[1], n, 1)).squeeze(-1)


# ---------------------------------------------------------------- notebook 04: reuse a committed sweep

_PROTOCOL_KEYS = ("pes", "lrs", "seeds", "steps", "batch", "n_val", "n_test", "eval_every", "n_eval")


class SelectiveCopySweep(NamedTuple):
    """What :func:`load_or_run_selective_copy` returns."""

    results: list  # every run_selective_copy result, in the order (pe, lr, seed)
    models: dict  # {(pe, lr, seed): TinyLM}: every model when trained here, CoPE's at its selected lr when read
    seconds: float  # the training time of all its runs, one after another (run_selective_copy's train_seconds)
    machine: dict  # {"cpus": the CPU models recorded, "by_seed": which seeds each trained (training_machines)}
    source: str  # "trained", the path read, or the path and how many runs were trained to complete it


def load_or_run_selective_copy(protocol: dict, path: str | os.PathLike, *, splits: dict, workers: int = 1,
                               threads: int = 1) -> SelectiveCopySweep:
    """Notebook 04's sweep, trained only where ``path`` (a :func:`save_selective_copy_results` file) and its
    checkpoint file (:func:`models_path`) do not already hold it.

    Runs of the file made with the same protocol (up to its seeds) and thread count are reused; the runs of
    ``protocol`` it lacks are trained (:func:`run_selective_copy`), and so are the CoPE models at the selected
    learning rate that have no checkpoint. Each run trains on ``threads`` threads from its seed, so a rerun
    on the same kind of CPU gives the same numbers: a retrained CoPE model whose test errors differ from the
    file's raises ``ValueError`` (the file is from another CPU family: retrain it all with ``make cope``)."""
    path = Path(path)
    want = [(pe, float(lr), s) for pe in protocol["pes"] for lr in protocol["lrs"] for s in protocol["seeds"]]
    reused, models, source = [], {}, "trained"
    if path.exists():
        record = load_selective_copy_results(path)
        got = record["protocol"]
        if all(got.get(k) == protocol[k] for k in _PROTOCOL_KEYS if k != "seeds") and got.get(
                "threads_per_run") == threads:
            reused = [r for r in record["runs"] if (r["pe"], r["lr"], r["seed"]) in set(want)]
            if models_path(path).exists():
                models = load_selective_copy_models(models_path(path))
            source = str(path)
    have = {(r["pe"], r["lr"], r["seed"]) for r in reused}
    kw = dict(splits=splits, steps=protocol["steps"], batch=protocol["batch"], n_val=protocol["n_val"],
              n_test=protocol["n_test"], eval_every=protocol["eval_every"], n_eval=protocol["n_eval"],
              workers=workers, threads=threads)
    missing = [k for k in want if k not in have]
    if missing:
        print(f"training {len(missing)} of the sweep's {len(want)} runs ({len(have)} read from {path.name})")
    new, new_models = _run_jobs(missing, **kw) if missing else ([], {})
    models.update(new_models)
    order = {k: i for i, k in enumerate(want)}
    results = sorted(reused + new, key=lambda r: order[r["pe"], r["lr"], r["seed"]])
    lr = select_learning_rates(results)["cope"]["lr"]
    need = [("cope", lr, s) for s in protocol["seeds"] if ("cope", lr, s) not in models]
    if need:
        print(f"training {len(need)} CoPE models again that have no checkpoint (their results are read)")
        again, again_models = _run_jobs(need, **kw)
        by = {(r["pe"], r["lr"], r["seed"]): r for r in results}
        for r in again:
            old = by[r["pe"], r["lr"], r["seed"]]["errors"]  # error counts / set size: exact on one CPU family
            if any(r["errors"][sp][m] != old[sp][m] for sp in old for m in ("sequence_error", "token_error")):
                raise ValueError(f"CoPE seed {r['seed']} retrained here gives other test errors than {path}: the "
                                 "file was made on another kind of CPU; retrain the sweep with `make cope`.")
        models.update(again_models)
    seconds = sum(r["train_seconds"] for r in results)
    cpus = sorted({r["cpu"] for r in results if "cpu" in r})
    return SelectiveCopySweep(results, models, seconds, {"cpus": cpus, "by_seed": training_machines(results)},
                              source if not missing and not need else f"{source}, {len(missing) + len(need)} trained")


def training_machines(results: list[dict]) -> str:
    """Which CPU trained which seeds, as the runs record it (a run made before CPUs were recorded has no ``cpu``
    field), e.g. ``"seeds 0-2: CPU not recorded; seeds 3-4: AMD EPYC"``."""
    by_cpu: dict[str, set] = {}
    for r in results:
        by_cpu.setdefault(r.get("cpu", "CPU not recorded"), set()).add(r["seed"])

    def seeds_text(seeds: set) -> str:
        s = sorted(seeds)
        if s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
            return f"seeds {s[0]}-{s[-1]}"
        return ("seed " if len(s) == 1 else "seeds ") + ", ".join(map(str, s))

    return "; ".join(f"{seeds_text(v)}: {cpu}" for cpu, v in sorted(by_cpu.items(), key=lambda t: min(t[1])))


def learning_rate_sensitivity(results: list[dict], pe: str) -> dict:
    """Per learning rate of the sweep, encoding ``pe``'s per-seed test errors on every split (%, from
    :func:`summarize_runs`), its per-seed validation error (%) and the first step at which its validation error is at
    most 1 % (:func:`steps_to_error`, None if never): what a choice on validation hides about the other rates."""
    runs = [r for r in results if r["pe"] == pe]
    if not runs:
        raise ValueError(f"no runs of encoding {pe!r}; the sweep has {sorted({r['pe'] for r in results})}.")
    out = {}
    for lr in sorted({r["lr"] for r in runs}):
        at = sorted((r for r in runs if r["lr"] == lr), key=lambda r: r["seed"])
        out[lr] = {"seeds": [r["seed"] for r in at],
                   "test": {split: v["per_seed"] for split, v in summarize_runs(at)[pe].items()},
                   "validation": [100 * r["validation"]["sequence_error"] for r in at],
                   "steps_to_1": [steps_to_error(r["history"], 0.01) for r in at]}
    return out


def selective_copy_claims(splits) -> dict:
    """Notebook 04's claims, each a test of a :func:`summarize_runs` summary at the learning rates chosen on
    validation. They are thresholds with room, not the digits of one run; the notebook checks them on the committed
    sweep and on a rerun with two threads per training run when its file exists."""
    token_count = ("learned", "rope")
    return {
        "CoPE: in-distribution error < 10 % for every seed": lambda s: max(s["cope"]["in_dist"]["per_seed"]) < 10,
        "CoPE: dense OOD error < 20 % for every seed": lambda s: max(s["cope"]["ood_dense"]["per_seed"]) < 20,
        "CoPE: mean sparse OOD error < 50 %": lambda s: s["cope"]["ood_sparse"]["mean"] < 50,
        "absolute PE and RoPE: OOD error > 80 % for every seed (both splits)": lambda s: min(
            min(s[pe][sp]["per_seed"]) for pe in token_count for sp in ("ood_dense", "ood_sparse")) > 80,
        "absolute PE and RoPE: in-distribution error > 30 % for every seed (they do not fit the task either)":
            lambda s: min(min(s[pe]["in_dist"]["per_seed"]) for pe in token_count) > 30,
        "CoPE's mean error is the lowest of the four encodings on every split": lambda s: all(
            s["cope"][sp]["mean"] < min(s[pe][sp]["mean"] for pe in ("none", "learned", "rope")) for sp in splits),
    }


def cope_gate_analysis(models: dict, lr: float, seeds, best: list[dict], task: SelectiveCopy, n: int = 200,
                       seed: int = 7) -> dict:
    """Notebook 04's section 4: for every CoPE model ``models["cope", lr, seed]``, the gates of each layer on
    ``n`` in-distribution sequences (generator ``seed``), read with :func:`ropelab.cope.cope_internals`.

    Returns a dict with ``inputs`` [n, s]; ``gate_stats`` (one :func:`gate_statistics` dict per seed and
    layer, for the answer queries over the context keys); ``rows`` ``{(seed, layer): (sym, blank)}``;
    ``records`` (what :func:`save_selective_copy_results` stores per CoPE model: test errors from ``best``,
    the mean position logits per layer and head, the histogram of :func:`source_positions`); and
    ``first_gates`` (layer 0 of the first seed, sequence 0: [h, answers, context + 1 + n_symbols])."""
    import numpy as np

    from ..cope import cope_internals

    c = task.context_len
    inputs, _, _ = task.sample(n, torch.Generator().manual_seed(seed))
    is_symbol = (inputs[:, :c] != BLANK)[:, None, None, :]  # [b, 1, 1, context keys]
    edges = np.arange(0, 64.5, 0.5)
    out = {"inputs": inputs, "gate_stats": [], "rows": {}, "records": [], "first_gates": None}
    for s in seeds:
        internals = cope_internals(models["cope", lr, s], inputs)
        hist = []
        for layer, lay in enumerate(internals):
            sym, blank, st = gate_statistics(lay["gates"][:, :, c:, :c], is_symbol)  # answer queries x context
            out["rows"][s, layer] = (sym, blank)
            out["gate_stats"].append({"seed": s, "layer": layer, **st})
            p_src = source_positions(lay["positions"], inputs, task)  # [b, h, n]
            hist.append([np.histogram(p_src[:, h].numpy(), edges)[0].tolist() for h in range(p_src.shape[1])])
        run = next(r for r in best if r["pe"] == "cope" and r["seed"] == s)
        out["records"].append({
            "seed": s, "lr": lr, "errors": {k: v["sequence_error"] for k, v in run["errors"].items()},
            "position_logits": [lay["integer_logits"][:, :, c:, :].mean((0, 2)).tolist() for lay in internals],
            "source_positions": {"bin_edges": edges.tolist(), "counts": hist},
        })
        if out["first_gates"] is None:
            out["first_gates"] = internals[0]["gates"][0, :, c:, : c + 1 + task.n_symbols]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.studies.nb04_selective_copy --threads N [--workers W] --out PATH``: run notebook 04's
    full sweep (same
    splits, encodings, learning rates, seeds and steps) with N threads per training run, and write the
    selected learning rates, the per-seed test errors at them and every run's validation and test errors.
    Notebook 04 compares its own run against such files to show how far the thread count moves the numbers."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ropelab.studies.nb04_selective_copy",
                                     description=main.__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training run")
    parser.add_argument("--workers", type=int, default=1, help="training runs at once (processes)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args(argv)
    proto = selective_copy_protocol(args.smoke)
    splits = selective_copy_splits(n_symbols=8, train_blanks=32, dense_blanks=16, sparse_blanks=64, alphabet=16)
    start = time.perf_counter()
    results, _ = run_selective_copy_sweep(
        proto["pes"], proto["lrs"], proto["seeds"], splits=splits, steps=proto["steps"], batch=proto["batch"],
        n_val=proto["n_val"], n_test=proto["n_test"], eval_every=proto["eval_every"], n_eval=proto["n_eval"],
        workers=args.workers, threads=args.threads,
    )
    selected = select_learning_rates(results)
    summary = {
        pe: summarize_runs([r for r in results if r["pe"] == pe and r["lr"] == sel["lr"]])[pe]
        for pe, sel in selected.items()
    }
    record = {
        "command": "python -m ropelab.studies.nb04_selective_copy "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "protocol": proto, "threads_per_run": args.threads, "torch": torch.__version__,
        "selected": {
            pe: {"lr": s["lr"], "sweep": {str(k): v for k, v in s["sweep"].items()}} for pe, s in selected.items()
        },
        "summary": summary,
        "runs": [
            {k: r[k] for k in ("pe", "lr", "seed", "validation", "errors", "history", "threads")} for r in results
        ],
        "seconds": round(time.perf_counter() - start, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out} ({record['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
