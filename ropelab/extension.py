r"""The context-extension study of notebook 07: every Hugging Face scaling at one extension factor, a retrieval
probe trained into notebook 05's language model, and the same short fine-tune at :math:`2L_0` for each method.

The models are siblings of ``ropelab.lm``'s byte-level LM (:math:`L_0 = 256`):

* **probe model** (``tinylm_probe_L256``): notebook 05's checkpoint trained on for ``PROBE_STEPS`` more steps at
  :math:`L_0` on the same corpus, with a key planted in half of the windows: ``KEY_OPEN`` + five random uppercase
  letters + ``KEY_CLOSE`` early, and the same nine bytes again later (:func:`probe_sample`). After the second
  ``KEY_OPEN`` the five letters can only come from attention to the first copy, so the model learns to retrieve
  within :math:`L_0`.
* **fine-tuned models** (``tinylm_probe_ft512_<method>``): the probe model trained ``FT_STEPS`` more steps at
  :math:`2L_0` with each method at :math:`s = 2` (no scaling, PI, NTK-aware, YaRN), same data, seed, batch of
  tokens and learning rate for each: the protocol of YaRN's Table 1 (Peng et al. 2023, arXiv 2309.00071), which
  fine-tunes Llama 2 at 8k with s = 2 and evaluates past 8k.

Checkpoints are stored in float16 (half the bytes; the notebook evaluates what is stored, cast to float32).

    python -m ropelab.extension probe          # data/lm/tinylm_probe_L256.pt
    python -m ropelab.extension finetune PI    # data/lm/tinylm_probe_ft512_pi.pt (one per method)
    python -m ropelab.extension longrope       # data/lm/longrope_factors.json (searched on the training split)
    python -m ropelab.extension list           # the fine-tuned methods (FINETUNED), one per line

``make lm`` runs them after notebook 05's model.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from . import extend
from .extend import method_spec
from .lm import CHECKPOINT, L0, LM_DIR, disjoint_windows, load_corpus, load_lm, per_position_loss, val_windows
from .models import TinyLM, load_checkpoint, masked_loss, save_checkpoint, train
from .scaling import default_inv_freq
from .spec import RopeSpec

__all__ = [
    "KEY_OPEN",
    "KEY_CLOSE",
    "KEY_ALPHABET",
    "KEY_LEN",
    "SPAN",
    "COPY_WEIGHT",
    "PROBE_LR",
    "KEY_WEIGHT",
    "PROBE_CHECKPOINT",
    "PROBE_STEPS",
    "FT_LENGTH",
    "FT_SCALE",
    "FT_STEPS",
    "FINETUNED",
    "LONGROPE_FACTORS",
    "finetuned_checkpoint",
    "methods",
    "method_spec",
    "ratio_table",
    "out_of_range_pairs",
    "ntk_alpha_in_range",
    "temperature_sweep",
    "TEMPERATURE_RESULTS",
    "TEMPERATURE_FACTORS",
    "temperature_study",
    "random_keys",
    "plant_keys",
    "probe_sample",
    "train_probe_model",
    "finetune",
    "save_half",
    "load_model",
    "retrieval",
    "wilson",
    "retrieval_curves",
    "plot_retrieval",
    "temperature_summary",
    "plot_ramp",
    "plot_temperature",
    "longrope_search",
    "mcnemar_exact",
    "longrope_train_vs_val",
    "table1_comparison",
    "longrope_training_windows",
    "longrope_rope",
    "longrope_seed_factors",
    "main",
]

# The key block is KEY_OPEN + KEY_LEN letters of KEY_ALPHABET + KEY_CLOSE. Every byte of it is one the LM was trained
# on: measured, bytes the corpus never contains (control bytes) keep embeddings the pretraining pushed aside, and
# neither a copy of them nor a marker made of them was learned in 800 steps. The two markers never occur as
# pairs in the corpus (a test checks); uppercase letters are rare in it (1.7 % of bytes), so the key's letters
# are nearly unique in a window and the model can find the next one by matching the current one.
KEY_OPEN, KEY_CLOSE = b"##", b"%%"
KEY_ALPHABET = tuple(range(ord("A"), ord("Z") + 1))
KEY_LEN = 5  # 26^5 keys, so a right answer is retrieval, not a guess
SPAN = len(KEY_OPEN) + KEY_LEN + len(KEY_CLOSE)
KEY_WEIGHT = 20.0  # the loss weight of the retrieved letters (see probe_sample)
COPY_WEIGHT = 5.0  # the loss weight of a copy segment's second copy
PROBE_CHECKPOINT = LM_DIR / "tinylm_probe_L256.pt"
PROBE_STEPS = 2500
PROBE_LR = 2e-3
FT_LENGTH = 2 * L0
FT_SCALE = 2.0
FT_STEPS = 300
FINETUNED = ("no scaling", "PI", "NTK-aware", "YaRN")
LONGROPE_FACTORS = LM_DIR / "longrope_factors.json"
TEMPERATURE_RESULTS = LM_DIR / "yarn_temperature.json"
TEMPERATURE_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4)  # the grid of sqrt(1/t); eq. 22's value is added


def finetuned_checkpoint(method: str) -> Path:
    """Where the model fine-tuned at :math:`2L_0` with ``method`` (one of ``FINETUNED``) is stored.

    Args:
        method: a name of :data:`FINETUNED` (ValueError otherwise).
    """
    if method not in FINETUNED:
        raise ValueError(f"no fine-tuned model for {method!r}; the fine-tuned methods are {FINETUNED}.")
    slug = {"no scaling": "none", "PI": "pi", "NTK-aware": "ntk", "YaRN": "yarn"}[method]
    return LM_DIR / f"tinylm_probe_ft512_{slug}.pt"


def _at_study(fn):
    """``fn`` of :mod:`ropelab.extend` (which takes the model's base and :math:`L_0` from its caller) with this
    study's model as the default: base 10000 and ``original = lm.L0`` (notebook 07 calls ``ext.ratio_table(S, D)``)."""
    defaults = {"base": 10000.0, "original": L0}
    sig = inspect.signature(fn)
    sig = sig.replace(parameters=[p.replace(default=defaults[p.name]) if p.name in defaults else p
                                  for p in sig.parameters.values()])

    @functools.wraps(fn)
    def at_study(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return fn(*bound.args, **bound.kwargs)

    at_study.__signature__ = sig
    return at_study


# The one table of methods and its analytics live in ropelab.extend; here they default to this study's model.
methods = _at_study(extend.methods)
ratio_table = _at_study(extend.ratio_table)
out_of_range_pairs = _at_study(extend.out_of_range_pairs)
ntk_alpha_in_range = _at_study(extend.ntk_alpha_in_range)


@torch.no_grad()
def temperature_sweep(model: TinyLM, windows: torch.Tensor, scale: float, factors, *,
                      original: int = L0) -> list[float]:
    r"""Mean loss of YaRN at ``scale`` on ``windows`` [n, T + 1] for each attention factor :math:`\sqrt{1/t}` in
    ``factors`` (Hugging Face's ``attention_factor`` key overrides :math:`0.1\ln s + 1`): the experiment behind
    YaRN's eq. 22, which fits the loss-minimising :math:`\sqrt{1/t}` against s on LLaMA without fine-tuning.

    Args:
        model: a TinyLM with RoPE.
        windows: token ids [n, T + 1].
        scale: YaRN's factor s.
        factors: the attention factors to try (numbers).
        original: the trained context :math:`L_0` (YaRN's ``original_max_position_embeddings``).

    Returns one mean loss (nats per byte) per factor, in order.
    """
    out = []
    for f in factors:
        m = replace(model.cfg.rope, scaling={"rope_type": "yarn", "factor": float(scale),
                                             "original_max_position_embeddings": original,
                                             "attention_factor": float(f)})
        out.append(float(per_position_loss(model, windows, m).mean()))
    return out


@torch.no_grad()
def temperature_study(model: TinyLM, windows: torch.Tensor, scales=(2.0, 4.0), factors=TEMPERATURE_FACTORS, *,
                      original: int = L0, progress: bool = True) -> dict:
    r"""YaRN's temperature sweep (:func:`temperature_sweep`) per window, for pairing: for each scale s in
    ``scales``, the mean loss of every window (its first :math:`sL_0 + 1` bytes of ``windows`` [n, >= sL_0 + 1])
    at each attention factor of ``factors`` and at eq. 22's :math:`0.1\ln s + 1`. Returns a JSON-ready dict:
    ``{"factors": [...], "scales": {str(s): {"formula": f, "window_loss": {str(factor): [n floats]},
    "formula_window_loss": [n floats]}}}``; a difference between two factors is then paired over the same
    windows (``lm.bootstrap_means`` of it gives its interval). The dict also holds ``"n_windows"``, ``"L0"``
    and each scale's ``"length"``.

    Args:
        model: a TinyLM with RoPE.
        windows: token ids [n, >= s L0 + 1] for the largest s (ValueError otherwise).
        scales: YaRN's factors s to sweep.
        factors: the attention factors to try at each scale.
        original: the trained context :math:`L_0`.
        progress: show a progress bar.
    """
    out = {"factors": [float(f) for f in factors], "n_windows": int(windows.shape[0]), "L0": original, "scales": {}}
    todo = [(float(s), f) for s in scales for f in [*factors, None]]
    if progress:
        from tqdm.auto import tqdm

        todo = tqdm(todo, desc="temperature", leave=False)
    for s, f in todo:
        length = int(s * original)
        if windows.shape[1] < length + 1:
            raise ValueError(f"scale {s:g} needs windows of {length + 1} bytes; these have {windows.shape[1]}.")
        row = out["scales"].setdefault(str(s), {"length": length, "formula": 0.1 * math.log(s) + 1,
                                                 "window_loss": {}})
        factor = row["formula"] if f is None else float(f)
        m = {"base": model.cfg.rope.base, "scaling": {"rope_type": "yarn", "factor": s,
                                                      "original_max_position_embeddings": original,
                                                      "attention_factor": factor}}
        loss = per_position_loss(model, windows[:, : length + 1], m).mean(1).tolist()
        if f is None:
            row["formula_window_loss"] = loss
        else:
            row["window_loss"][str(float(f))] = loss
    return out


# ---- the retrieval probe -------------------------------------------------------------------------------------

def random_keys(n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` keys of ``KEY_LEN`` symbols drawn uniformly from ``KEY_ALPHABET``, [n, KEY_LEN] int64.

    Args:
        n: how many keys.
        gen: the torch generator they are drawn from.
    """
    alphabet = torch.tensor(KEY_ALPHABET)
    return alphabet[torch.randint(0, len(KEY_ALPHABET), (n, KEY_LEN), generator=gen)]


def plant_keys(windows: torch.Tensor, keys: torch.Tensor, key_pos: torch.Tensor,
               query_pos: torch.Tensor) -> torch.Tensor:
    """A copy of ``windows`` [n, T] with ``KEY_OPEN key KEY_CLOSE`` written at ``key_pos`` and again at
    ``query_pos`` (per row). The key's letters after the second ``KEY_OPEN`` are what the probe scores.

    Args:
        windows: token ids [n, T] (not modified).
        keys: [n, KEY_LEN] key letters (:func:`random_keys`).
        key_pos: [n], where each row's first block starts (>= 0).
        query_pos: [n], where its second block starts: at least ``key_pos + SPAN`` and at most ``T - SPAN``.

    ValueError names a shape or a position that does not fit.
    """
    n, t = windows.shape
    span = SPAN
    if keys.shape != (n, KEY_LEN) or key_pos.shape != (n,) or query_pos.shape != (n,):
        raise ValueError(f"need keys [n, {KEY_LEN}] and positions [n] for n = {n} windows; got {tuple(keys.shape)}, "
                         f"{tuple(key_pos.shape)}, {tuple(query_pos.shape)}.")
    if bool((key_pos < 0).any()) or bool((query_pos < key_pos + span).any()) or bool((query_pos + span > t).any()):
        raise ValueError(f"the key must lie in the window before the query without overlap: need 0 <= key_pos, "
                         f"key_pos + {span} <= query_pos and query_pos + {span} <= T = {t}.")
    out = windows.clone()
    opener, closer = torch.tensor(list(KEY_OPEN)), torch.tensor(list(KEY_CLOSE))
    block = torch.cat([opener.expand(n, -1), keys, closer.expand(n, -1)], 1).to(out.dtype)
    offs = torch.arange(span)
    rows = torch.arange(n)[:, None]
    out[rows, key_pos[:, None] + offs] = block
    out[rows, query_pos[:, None] + offs] = block
    return out


def probe_sample(data: torch.Tensor, batch: int, length: int, p_key: float = 0.5, p_copy: float = 0.0,
                 key_weight: float = KEY_WEIGHT, copy_weight: float = COPY_WEIGHT):
    """The training sampler: random windows of ``length + 1`` bytes of ``data``. A fraction ``p_key`` carries a
    key block (:func:`plant_keys`; key uniform in the window's first half, query uniform after it); a fraction
    ``p_copy`` of all windows (from those without a key) carries a copy segment instead: 16-48 random
    ``KEY_ALPHABET`` letters early, and the same letters again later at a random distance. Returns
    ``sample(gen) -> (inputs, targets, weights)`` for ``models.train``: every target weighs 1 except the key's
    letters after the second ``KEY_OPEN`` (``key_weight``) and the second copy's letters (``copy_weight``). Why:
    five letters in a window of hundreds of bytes are too small a share of the loss, and matching a letter to its
    earlier copy (an induction circuit) is a skill the text-only LM does not have (measured: it copies a repeated
    random string at chance).

    Args:
        data: the byte tensor to draw windows from (the training split).
        batch: windows per sample.
        length: tokens per window, at least 4 * SPAN (and 64 with copy segments; ValueError otherwise).
        p_key: the fraction of windows with a key block.
        p_copy: the fraction of windows with a copy segment; p_key + p_copy <= 1.
        key_weight: the loss weight of a key's letters.
        copy_weight: the loss weight of the second copy's letters.
    """
    span = SPAN
    alphabet = torch.tensor(KEY_ALPHABET)
    if length < 4 * span or (p_copy > 0 and length < 64):
        raise ValueError(f"length {length} is too short for a key block ({span} bytes, twice, in the first half) "
                         "and a copy segment (16 letters, twice); use length >= 64.")

    def sample(gen: torch.Generator):
        starts = torch.randint(0, data.numel() - length - 1, (batch,), generator=gen)
        w = torch.stack([data[s: s + length + 1] for s in starts.tolist()])
        keys = random_keys(batch, gen)
        key_pos = (torch.rand(batch, generator=gen) * (length // 2 - span)).long()
        room = (length + 1 - span) - (key_pos + span)  # query_pos in [key_pos + span, length + 1 - span]
        query_pos = key_pos + span + (torch.rand(batch, generator=gen) * (room + 1)).long().clamp(max=room)
        planted = plant_keys(w, keys, key_pos, query_pos)
        u = torch.rand(batch, generator=gen)
        use = u < p_key
        copy = (u >= p_key) & (u < p_key + p_copy)
        w = torch.where(use[:, None], planted, w).clone()
        weights = torch.ones(batch, length)
        # target index t predicts byte t + 1: the letters follow the opener's last byte
        letters = query_pos[:, None] + len(KEY_OPEN) - 1 + torch.arange(KEY_LEN)
        weights[torch.arange(batch)[:, None], letters] = torch.where(use, key_weight, 1.0)[:, None]
        for b in copy.nonzero().flatten().tolist():
            k = int(torch.randint(16, min(48, length // 4) + 1, (1,), generator=gen))  # 16-48 at length >= 192
            first = int(torch.randint(0, length // 4, (1,), generator=gen))
            second = int(torch.randint(first + k, length + 1 - k, (1,), generator=gen))
            text = alphabet[torch.randint(0, len(alphabet), (k,), generator=gen)]
            w[b, first: first + k] = text
            w[b, second: second + k] = text
            weights[b, second: second + k - 1] = copy_weight  # targets second + 1 .. second + k - 1
        return w[:, :-1], w[:, 1:], weights

    return sample


def save_half(model: TinyLM, path: Path, meta: dict) -> None:
    """A float16 checkpoint (``load_model`` reads it back as float32) and its training record ``path.json``
    (``models.save_checkpoint`` in float16).

    Args:
        model: the model.
        path: the checkpoint file.
        meta: the training record, written as JSON to ``path`` with the suffix ``.json``.
    """
    save_checkpoint(model, path, dtype=torch.float16, meta=meta)


load_model = load_checkpoint  # a checkpoint of this study (float16 weights) as a float32 TinyLM in eval mode


def _probe_eval(length: int, progress: bool):
    _, val_data = load_corpus()
    ids = val_windows(val_data, 16, length, seed=1)
    probe = val_windows(val_data, 32, length, seed=2)
    distances = (length // 8, length // 2, length - SPAN - 17)

    def evaluate(m):
        with torch.no_grad():
            out = {"val_loss": float(masked_loss(m(ids[:, :-1]), ids[:, 1:]))}
        hits = retrieval(m, m.cfg.rope, distances, probe, seed=11)
        out.update({f"retrieval_{d}": float(h.float().mean()) for d, h in hits.items()})
        if progress:
            from tqdm.auto import tqdm

            tqdm.write(json.dumps(out))
        return out

    return evaluate


def train_probe_model(steps: int = PROBE_STEPS, batch: int = 16, seed: int = 0, lr: float = PROBE_LR,
                      out: Path = PROBE_CHECKPOINT, progress: bool = True) -> list[dict]:
    """Notebook 05's LM trained ``steps`` more at :math:`L_0`: half the windows carry a key, a quarter a copy
    segment, a quarter are plain text (:func:`probe_sample`).

    Args:
        steps: optimiser steps.
        batch: windows per step.
        seed: seeds the initialisation's randomness (``torch.manual_seed``) and the sampler's generator.
        lr: the peak learning rate (:func:`ropelab.models.train`).
        out: the float16 checkpoint to write (with its training record).
        progress: show a progress bar and print each evaluation.

    Returns the training history (:func:`ropelab.models.train`).
    """
    torch.manual_seed(seed)
    model = load_lm(CHECKPOINT)
    train_data, _ = load_corpus()
    t0 = time.perf_counter()
    history = train(model, probe_sample(train_data, batch, L0, p_key=0.5, p_copy=0.25), steps=steps, lr=lr,
                    warmup=50, seed=seed, log_every=50, evaluate=_probe_eval(L0, progress), eval_every=250,
                    progress=progress, desc="probe")
    meta = {"from": CHECKPOINT.name, "steps": steps, "batch": batch, "context": L0, "lr": lr, "seed": seed,
            "p_key": 0.5, "p_copy": 0.25, "key_weight": KEY_WEIGHT, "copy_weight": COPY_WEIGHT,
            "train_seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
            "command": "python -m ropelab.extension probe", "history": history}
    save_half(model, out, meta)
    return history


def finetune(method: str, steps: int = FT_STEPS, batch: int = 8, seed: int = 0, lr: float = 1e-3,
             out: Path | None = None, progress: bool = True) -> list[dict]:
    """The probe model trained ``steps`` more at :math:`2L_0` under ``method`` at :math:`s = 2`; ``batch`` 8 at
    512 is the same 4096 tokens per step as 16 at :math:`L_0`.

    Args:
        method: a name of :data:`FINETUNED` (ValueError otherwise).
        steps: optimiser steps.
        batch: windows per step.
        seed: seeds the initialisation's randomness (``torch.manual_seed``) and the sampler's generator.
        lr: the peak learning rate (:func:`ropelab.models.train`).
        out: the float16 checkpoint to write; None: :func:`finetuned_checkpoint` (method).
        progress: show a progress bar and print each evaluation.

    Returns the training history.
    """
    base = load_model(PROBE_CHECKPOINT)
    m = methods(FT_SCALE, base.cfg.head_dim)[method] if method in FINETUNED else None
    if m is None:
        raise ValueError(f"fine-tune one of {FINETUNED}, got {method!r}.")
    cfg = replace(base.cfg, rope=method_spec(base.cfg.rope, m))
    model = TinyLM(cfg)
    model.load_state_dict(base.state_dict())
    torch.manual_seed(seed)
    train_data, _ = load_corpus()
    t0 = time.perf_counter()
    history = train(model, probe_sample(train_data, batch, FT_LENGTH, p_key=0.5, p_copy=0.25), steps=steps, lr=lr,
                    warmup=20, seed=seed, log_every=50, evaluate=_probe_eval(FT_LENGTH, progress), eval_every=150,
                    progress=progress, desc=f"fine-tune {method}")
    out = finetuned_checkpoint(method) if out is None else out
    meta = {"from": PROBE_CHECKPOINT.name, "method": method, "scale": FT_SCALE, "rope": cfg.rope.to_dict(),
            "steps": steps, "batch": batch, "context": FT_LENGTH, "lr": lr, "seed": seed, "p_key": 0.5,
            "p_copy": 0.25, "key_weight": KEY_WEIGHT, "copy_weight": COPY_WEIGHT,
            "train_seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
            "command": f"python -m ropelab.extension finetune {method!r}", "history": history}
    save_half(model, out, meta)
    return history


@torch.no_grad()
def retrieval(model: TinyLM, spec: RopeSpec, distances, windows: torch.Tensor, key_pos: int = 16,
              seed: int = 0) -> dict[int, torch.Tensor]:
    """Exact-match retrieval per distance: for each ``d`` in ``distances``, a key at ``key_pos`` and its query at
    ``key_pos + d`` in every row of ``windows`` [n, >= key_pos + d + SPAN + 1] (validation text; fresh random
    keys, seeded). Returns d -> bool [n], True where the greedy prediction of all ``KEY_LEN`` letters after the
    second ``KEY_OPEN`` is right (teacher-forced, one forward).

    Args:
        model: a TinyLM.
        spec: the RoPE to run it with (``model(..., rope=spec)``).
        distances: the key-to-query distances d (ints); a window too short for one raises ValueError.
        windows: token ids [n, T] (validation text).
        key_pos: where the key block starts in every row.
        seed: the seed of the keys' generator (one draw of n keys per distance, in order).
    """
    n = windows.shape[0]
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for d in distances:
        d = int(d)
        end = key_pos + d + SPAN
        if end + 1 > windows.shape[1]:
            raise ValueError(f"distance {d} needs windows of {end + 1} bytes; these have {windows.shape[1]}.")
        keys = random_keys(n, gen)
        w = plant_keys(windows[:, : end + 1], keys, torch.full((n,), key_pos), torch.full((n,), key_pos + d))
        q = key_pos + d + len(KEY_OPEN) - 1  # the second opener's last byte; logits q .. q + KEY_LEN - 1: the key
        logits = model(w[:, : q + KEY_LEN], rope=spec)[:, q: q + KEY_LEN]
        out[d] = (logits.argmax(-1) == keys).all(1)
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (95 % at ``z`` = 1.96) for ``k`` successes in ``n`` trials: unlike the normal
    approximation it stays inside [0, 1] and is not empty at k = 0 or k = n.

    Args:
        k: successes, 0 <= k <= n.
        n: trials, >= 1 (ValueError otherwise).
        z: the normal quantile of the interval's coverage.

    Returns ``(low, high)``.
    """
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k = {k}, n = {n}.")
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def mcnemar_exact(hits_a: torch.Tensor, hits_b: torch.Tensor) -> dict:
    """McNemar's exact test of two paired sets of hits (the same windows and keys under two settings): the windows
    only ``a`` gets right, the windows only ``b`` gets right, and the two-sided p-value of that split under the
    hypothesis that either is as likely (a binomial test with p = 1/2 on the discordant windows; 1 when none).

    Args:
        hits_a: bools (or 0/1), one per window, under setting a (flattened).
        hits_b: the same windows under setting b, the same shape (ValueError otherwise).

    Returns ``{"only_a", "only_b", "p_value"}``.
    """
    a, b = torch.as_tensor(hits_a).bool().flatten(), torch.as_tensor(hits_b).bool().flatten()
    if a.shape != b.shape:
        raise ValueError(f"paired hits need the same windows: got {tuple(a.shape)} and {tuple(b.shape)}.")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2 ** n if n else 1.0
    return {"only_a": only_a, "only_b": only_b, "p_value": min(1.0, 2 * tail) if n else 1.0}


def retrieval_curves(models_specs: dict, distances, windows: torch.Tensor, seed: int = 7) -> dict:
    """:func:`retrieval` for each name -> (model, spec): name -> {distance: (hits, windows)}.

    Args:
        models_specs: name -> (TinyLM, RopeSpec).
        distances: as in :func:`retrieval`.
        windows: as in :func:`retrieval`.
        seed: as in :func:`retrieval`; one seed for every model, so all see the same keys.
    """
    out = {}
    for name, (m, spec) in models_specs.items():
        hits = retrieval(m, spec, distances, windows, seed=seed)
        out[name] = {d: (int(h.sum()), h.numel()) for d, h in hits.items()}
    return out


def plot_retrieval(ax, curves: dict, title: str, original: int = L0) -> None:
    """Exact retrieval against distance for each curve of :func:`retrieval_curves`, with Wilson 95 % bars and
    :math:`L_0` dotted.

    Args:
        ax: the matplotlib Axes.
        curves: :func:`retrieval_curves`' result.
        title: the Axes' title.
        original: the trained context :math:`L_0`, drawn dotted.
    """
    for j, (name, row) in enumerate(curves.items()):
        dist = list(row)
        acc = [k / n for k, n in row.values()]
        lo, hi = zip(*(wilson(k, n) for k, n in row.values()))
        ax.errorbar(dist, acc, yerr=[[a - b for a, b in zip(acc, lo)], [b - a for a, b in zip(acc, hi)]],
                    marker="os^Dv<>"[j % 7], ls=["-", "--", "-.", ":"][j % 4], capsize=2, label=name)
    ax.axvline(original, color="0.5", ls=":")
    ax.set(xlabel="distance key -> question (bytes)", ylabel="exact retrieval", ylim=(-0.03, 1.03), title=title)
    ax.legend(fontsize=7)


def temperature_summary(study: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    r"""From :func:`temperature_study`'s dict, per scale: the grid's loss-minimising factor (``best``), eq. 22's
    (``formula``), the mean loss at every grid factor (``means``), and paired 95 % bootstrap intervals over the
    windows of loss(formula) - loss(best) (``formula_minus_best``) and loss(formula) - loss(1)
    (``formula_minus_one``), each (mean, low, high).

    Args:
        study: :func:`temperature_study`'s dict (its grid must include the factor 1.0).
        n_boot: bootstrap resamples of the windows.
        seed: the resampling's seed.

    Returns scale -> that summary (also ``formula_loss``, the mean loss at eq. 22's factor).
    """
    from .lm import bootstrap_means

    out = {}
    for s, row in study["scales"].items():
        wl = {float(f): torch.tensor(v, dtype=torch.float64) for f, v in row["window_loss"].items()}
        means = {f: float(v.mean()) for f, v in wl.items()}
        best = min(means, key=means.get)
        fw = torch.tensor(row["formula_window_loss"], dtype=torch.float64)
        pair = {}
        for key, other in (("formula_minus_best", wl[best]), ("formula_minus_one", wl[1.0])):
            m, lo, hi = bootstrap_means(fw - other, n_boot, seed)
            pair[key] = (float(m), float(lo), float(hi))
        out[float(s)] = {"best": best, "formula": row["formula"], "means": means,
                         "formula_loss": float(fw.mean()), **pair}
    return out


def plot_ramp(ax, turns, gamma, gamma_paper, scale: float) -> None:
    r"""NTK-by-parts' ramp :math:`\gamma_i` against the turns :math:`\rho_i` within :math:`L_0`: the code's (linear in
    pair index) and the paper's eq. 18 (linear in turns), with :math:`\alpha = 1` and :math:`\beta = 32` marked.

    Args:
        ax: the matplotlib Axes (log x).
        turns: :math:`\rho_i` per pair, the turns within :math:`L_0`.
        gamma: the code's ramp per pair.
        gamma_paper: the paper's eq. 18 ramp per pair.
        scale: the factor s, in the title.
    """
    ax.semilogx(turns, gamma, "o-", label="code: linear in pair index")
    ax.semilogx(turns, gamma_paper, "s--", label="paper eq. 18: linear in turns")
    for beta, name in ((1, r"$\alpha$ = beta_slow = 1"), (32, r"$\beta$ = beta_fast = 32")):
        ax.axvline(beta, color="0.5", ls=":")
        ax.text(beta * 0.9, 0.05 if beta == 1 else 0.3, name, fontsize=8, ha="right")
    ax.set(xlabel=r"turns within $L_0$, $\rho_i$ (pair 0 at the right)", ylabel=r"$\gamma_i$ (1 = kept)",
           title=f"NTK-by-parts ramp at s = {scale:g}")
    ax.legend(fontsize=8, loc="upper left")


def plot_temperature(ax, study: dict) -> None:
    r"""Per scale of :func:`temperature_study`: the loss at every attention factor :math:`\sqrt{1/t}` of the grid
    minus the loss at the grid's best, paired over the same windows, with a 95 % bootstrap band (zero at the best
    point by construction; a band clear of zero is a measured difference), and eq. 22's value dotted. Paired,
    because the windows' own spread, shared by every factor, would hide differences of a few hundredths.

    Args:
        ax: the matplotlib Axes.
        study: :func:`temperature_study`'s dict.
    """
    from .lm import bootstrap_means

    for j, (s, row) in enumerate(study["scales"].items()):
        wl = {float(f): torch.tensor(v, dtype=torch.float64) for f, v in row["window_loss"].items()}
        best = min(wl, key=lambda f: float(wl[f].mean()))
        fs = list(wl)
        stats = [bootstrap_means(wl[f] - wl[best]) for f in fs]
        line, = ax.plot(fs, [float(m) for m, _, _ in stats], ["o-", "s--"][j % 2],
                        label=f"s = {float(s):g} (length {row['length']}), best {best:.2f}")
        ax.fill_between(fs, [float(lo) for _, lo, _ in stats], [float(hi) for _, _, hi in stats],
                        color=line.get_color(), alpha=0.15, lw=0)
        ax.axvline(row["formula"], color=line.get_color(), ls=":", lw=1)
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set(xlabel=r"attention factor $\sqrt{1/t}$ (dotted: $0.1\ln s + 1$)",
           ylabel="loss minus the grid's best (nats/byte)",
           title=f"YaRN without fine-tuning, {study['n_windows']} windows, paired (95 % CI)")
    ax.legend(fontsize=8)


# ---- LongRoPE's search, small --------------------------------------------------------------------------------

def longrope_training_windows(scale: float = 4.0, n_windows: int = 6) -> torch.Tensor:
    """The ``n_windows`` windows of :math:`sL_0 + 1` bytes of the *training* split that :func:`longrope_search`
    scores factors on, evenly spaced through the split: [n_windows, sL_0 + 1].

    Args:
        scale: the factor s.
        n_windows: how many windows.
    """
    length = int(scale * L0)
    train_data, _ = load_corpus()
    starts = torch.linspace(0, train_data.numel() - length - 1, n_windows).long()
    return torch.stack([train_data[s: s + length + 1] for s in starts.tolist()])


def longrope_rope(rope: RopeSpec, long_factor, scale: float = 4.0) -> RopeSpec:
    r"""``rope`` with Hugging Face's ``longrope`` scaling at ``scale``: ``long_factor`` past :math:`L_0`,
    ``short_factor`` all ones (the trained ladder within :math:`L_0`), and longrope's default attention factor.

    Args:
        rope: the model's RoPE (its other fields kept).
        long_factor: the per-pair factors :math:`\lambda_i`, r/2 numbers.
        scale: the factor s.
    """
    lam = [float(x) for x in long_factor]
    return replace(rope, scaling={"rope_type": "longrope", "factor": scale, "original_max_position_embeddings": L0,
                                  "long_factor": lam, "short_factor": [1.0] * len(lam)})


def longrope_seed_factors(name: str, scale: float, head_dim: int, base: float) -> torch.Tensor:
    r"""The per-pair factors :math:`\lambda_i = \omega_i/\omega_i'` of method ``name`` (PI, NTK-aware or YaRN) at
    :math:`L = sL_0`, made monotone and bounded as the search keeps them: the search's seeds. Run through
    :func:`longrope_rope` they use longrope's attention factor, not the seed method's own.

    Args:
        name: ``"PI"``, ``"NTK-aware"`` or ``"YaRN"`` (a method of :func:`methods`).
        scale: the factor s.
        head_dim: the model's head size d.
        base: the model's base.

    Returns float64 [d/2], each in [1, 4 s].
    """
    length = int(scale * L0)
    ref = default_inv_freq(head_dim, base)
    inv, _ = methods(scale, head_dim, base=base)[name].frequencies(head_dim, seq_len=length)
    return _longrope_project((ref / inv).clamp_min(1.0), scale)


def _longrope_project(lam: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.cummax(lam.clamp(1.0, 4.0 * scale), 0).values  # monotone, bounded


@torch.no_grad()
def longrope_search(model: TinyLM, scale: float = 4.0, *, n_windows: int = 6, generations: int = 16,
                    population: int = 12, seed: int = 0, progress: bool = True) -> dict:
    r"""LongRoPE's evolutionary search of per-pair rescale factors :math:`\lambda_i` (Ding et al. 2024,
    arXiv 2402.13753, section 3.2), at toy size: the population starts from PI's, NTK-aware's and YaRN's factors
    at ``scale`` (:func:`longrope_seed_factors`), keeps the paper's monotonic constraint (:math:`\lambda_i`
    non-decreasing from high to low frequency, :math:`1 \le \lambda_i`), mutates the best by log-normal noise, and
    scores by the mean loss over every position of ``n_windows`` windows of :math:`sL_0` bytes of the *training*
    split (:func:`longrope_training_windows`; the notebook evaluates on the validation split). ``short_factor`` is
    all ones: within :math:`L_0` the model keeps its trained ladder. The paper's other parts (keeping the first
    tokens unscaled, progressive extension) are left out.

    Args:
        model: the TinyLM whose factors are searched.
        scale: the factor s.
        n_windows: training windows scored (:func:`longrope_training_windows`).
        generations: rounds of mutation; each keeps the best 8 and breeds from the best 4.
        population: children per generation.
        seed: the mutations' generator seed.
        progress: show a progress bar.

    Returns a JSON-ready dict: ``long_factor``, ``short_factor``, the best loss per generation (``history``), the
    seeds' losses and the settings.
    """
    head_dim = model.cfg.head_dim
    length = int(scale * L0)
    ids = longrope_training_windows(scale, n_windows)

    def score(lam: torch.Tensor) -> float:
        return float(per_position_loss(model, ids, longrope_rope(model.cfg.rope, lam.tolist(), scale)).mean())

    seeds = {k: longrope_seed_factors(k, scale, head_dim, model.cfg.rope.base) for k in ("PI", "NTK-aware", "YaRN")}
    pool = list(seeds.values())
    scored = sorted(((score(lam), i, lam) for i, lam in enumerate(pool)), key=lambda t: t[:2])
    gen = torch.Generator().manual_seed(seed)
    history = [{"generation": 0, "best_loss": scored[0][0]}]
    counter = len(pool)
    bar = range(1, generations + 1)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(bar, desc="LongRoPE search", leave=False)
    for g in bar:
        parents = [lam for _, _, lam in scored[:4]]
        children = []
        for k in range(population):
            p = parents[k % len(parents)]
            noise = torch.exp(0.15 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            children.append(_longrope_project(p * noise, scale))
        for lam in children:
            scored.append((score(lam), counter, lam))
            counter += 1
        scored = sorted(scored, key=lambda t: t[:2])[:8]
        history.append({"generation": g, "best_loss": scored[0][0]})
    best = scored[0][2]
    return {"scale": scale, "L0": L0, "head_dim": head_dim, "n_windows": n_windows, "length": length,
            "long_factor": best.tolist(), "short_factor": [1.0] * (head_dim // 2), "history": history,
            "seed_losses": {k: score(lam) for k, lam in seeds.items()},
            "command": "python -m ropelab.extension longrope"}


def longrope_train_vs_val(model: TinyLM, longrope: dict, val_windows: torch.Tensor, scale: float = 4.0,
                          spans=((0, 1024), (768, 1024))) -> dict:
    """The searched LongRoPE factors against YaRN's, compared as :func:`longrope_search` scored them (YaRN's
    factors run through ``longrope``, so both use longrope's attention factor; the same positions), on the search's
    training windows and on ``val_windows``: ``{(split, span): (mean, low, high)}`` of searched minus YaRN's, a
    paired 95 % bootstrap interval over the windows (:func:`ropelab.lm.paired_intervals`).

    Args:
        model: the TinyLM searched.
        longrope: :func:`longrope_search`'s dict (``long_factor``, ``n_windows``).
        val_windows: validation token ids [n, >= the largest span's end + 1].
        scale: the factor s.
        spans: position spans [start, stop) to compare over.
    """
    from .lm import paired_intervals, span_means

    specs = {"searched": longrope_rope(model.cfg.rope, longrope["long_factor"], scale),
             "YaRN's factors": longrope_rope(model.cfg.rope, longrope_seed_factors(
                 "YaRN", scale, model.cfg.head_dim, model.cfg.rope.base), scale)}
    sets = {"training": longrope_training_windows(scale, longrope["n_windows"]), "validation": val_windows}
    out = {}
    for split, ids in sets.items():
        losses = {"window_loss": {k: per_position_loss(model, ids, m) for k, m in specs.items()}}
        for span in spans:
            out[split, tuple(span)] = paired_intervals(span_means(losses, *span),
                                                       reference="YaRN's factors")["searched"]
    return out


def table1_comparison(finetuned: dict, finetuned_length: int, methods=("PI", "NTK-aware", "YaRN"),
                      reference: str = "YaRN", width: int = 64, widths=(32, 64, 128)) -> dict:
    r"""The models fine-tuned at ``finetuned_length`` compared as the YaRN paper's Table 1 compares its three methods,
    from per-position losses (``finetuned["window_loss"]``), every comparison paired per window with a 95 % bootstrap
    interval (:func:`ropelab.lm.paired_intervals`):

    - ``rise``: each model's rise just past the fine-tuned length, the loss over :math:`[L, 1.5L)` minus that over
      :math:`[L/2, L)` in the same window; ``rise_vs``: that rise minus ``reference``'s;
    - ``points``: Table 1's lengths as multiples of the fine-tuned length (1.25, and the published CSV's 1.5 and 2);
      ``at``: at each, the loss over the ``width`` positions before it, ``methods`` minus ``reference``;
    - ``widths``: at 1.25 times, the first method minus ``reference`` for each band width in ``widths``, to show
      how much the point comparison depends on it.

    Args:
        finetuned: a result with ``"window_loss"`` (name -> [window, position] losses) for every fine-tuned model,
            evaluated to at least 2 L.
        finetuned_length: L, the length they were fine-tuned at.
        methods: the methods compared at the points (the first also across ``widths``).
        reference: the method every difference is taken against.
        width: positions per point comparison.
        widths: the band widths of the ``widths`` comparison.
    """
    from .lm import paired_intervals, span_means

    n = finetuned_length
    rise = {k: span_means(finetuned, n, n * 3 // 2)[k] - span_means(finetuned, n // 2, n)[k]
            for k in finetuned["window_loss"]}
    points = {f: int(f * n) for f in (1.25, 1.5, 2.0)}

    def before(end: int, w: int) -> dict:
        return paired_intervals({k: span_means(finetuned, end - w, end)[k] for k in methods}, reference=reference)

    return {"rise": paired_intervals(rise), "rise_vs": paired_intervals(rise, reference=reference), "points": points,
            "at": {f: before(end, width) for f, end in points.items()}, "width": width,
            "widths": {w: before(points[1.25], w)[methods[0]] for w in widths}}


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.extension probe | finetune METHOD | longrope | temperature | list``.

    Args:
        argv: the command-line arguments; None: ``sys.argv[1:]``.

    Returns the exit status, 0 (a missing finetune method exits through argparse with status 2).
    """
    parser = argparse.ArgumentParser(prog="python -m ropelab.extension", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["probe", "finetune", "longrope", "temperature", "list"],
                        help="list: print the fine-tuned methods, one per line (what `make lm` fine-tunes)")
    parser.add_argument("method", nargs="?", help=f"for finetune: one of {FINETUNED}")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="for finetune: the data and init seed")
    parser.add_argument("--out", type=Path, help="for finetune: write here instead of data/lm/")
    args = parser.parse_args(argv)
    if args.what == "list":
        print("\n".join(FINETUNED))
        return 0
    torch.set_num_threads(args.threads)
    if args.what == "probe":
        history = train_probe_model(steps=args.steps or PROBE_STEPS)
        print(f"final: {history[-1]}; wrote {PROBE_CHECKPOINT}")
    elif args.what == "finetune":
        if args.method not in FINETUNED:
            parser.error(f"finetune needs a method, one of {FINETUNED}")
        out = args.out or finetuned_checkpoint(args.method)
        history = finetune(args.method, steps=args.steps or FT_STEPS, seed=args.seed, out=out)
        print(f"final: {history[-1]}; wrote {out}")
    elif args.what == "temperature":
        _, val_data = load_corpus()
        length = int(4 * L0)
        ids = val_windows(val_data, disjoint_windows(val_data, length), length)  # notebook 07's 45 windows
        t0 = time.perf_counter()
        result = temperature_study(load_model(PROBE_CHECKPOINT), ids)
        result.update({"checkpoint": PROBE_CHECKPOINT.name, "seconds": round(time.perf_counter() - t0, 1),
                       "threads": torch.get_num_threads(), "command": "python -m ropelab.extension temperature"})
        TEMPERATURE_RESULTS.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {TEMPERATURE_RESULTS} in {result['seconds']} s")
    else:
        result = longrope_search(load_model(PROBE_CHECKPOINT))
        LONGROPE_FACTORS.write_text(json.dumps(result, indent=1) + "\n")
        print(f"best loss {result['history'][-1]['best_loss']:.4f} (seeds {result['seed_losses']}); "
              f"wrote {LONGROPE_FACTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
