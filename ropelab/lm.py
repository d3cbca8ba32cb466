"""A small byte-level causal LM trained here on a real corpus, for the context-extension study (notebook 05).

The corpus is the Python Language Reference as CPython ships it for ``pydoc`` (``pydoc_data/topics.py``,
PSF License 2.0; about 465 kB of English technical prose), written to ``data/corpus/`` by
``build_corpus``. The model is ``ropelab.models.TinyLM`` with RoPE, trained at context ``L0 = 256``. Its commands::

    python -m ropelab.lm corpus       # (re)build data/corpus/python_reference.txt
    python -m ropelab.lm train        # train and write data/lm/tinylm_rope_L256.pt (+ history JSON)
    python -m ropelab.lm eval         # per-position loss to 4 x L0 under every scheme, on every disjoint
                                      # validation window -> data/lm/eval_schemes.pt (notebook 05 reads it)

``make lm`` runs all three.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch

from .adapters import TinyLMAdapter
from .extend import method_spec, methods
from .kvcache import decode, schedule_for
from .models import ModelConfig, TinyLM, load_checkpoint, masked_loss, save_checkpoint, train
from .paths import BUILD_DIR, DATA_DIR
from .scaling import ntk_aware_base
from .spec import RopeSpec

__all__ = [
    "CORPUS",
    "CHECKPOINT",
    "LM_DIR",
    "L0",
    "SCALE",
    "build_corpus",
    "load_corpus",
    "model_config",
    "train_lm",
    "load_lm",
    "val_windows",
    "disjoint_windows",
    "static_ntk_base",
    "bootstrap_means",
    "band_intervals",
    "span_means",
    "paired_intervals",
    "METHODS",
    "CACHE_POLICIES",
    "Scheme",
    "neighbour_intervals",
    "order_text",
    "smooth_positions",
    "plot_band_panels",
    "schemes",
    "per_position_loss",
    "evaluate_schemes",
    "EVAL_RESULTS",
    "save_scheme_losses",
    "load_or_evaluate_schemes",
    "summarize",
    "plot_attention_drift",
    "plot_decode_cost",
    "main",
]

CORPUS = DATA_DIR / "corpus" / "python_reference.txt"
LM_DIR = DATA_DIR / "lm"
CHECKPOINT = LM_DIR / "tinylm_rope_L256.pt"
L0 = 256
SCALE = 4.0  # extend L0 -> 4 L0
# Notebook 05's schemes: its label -> the method of ropelab.extend.methods, one full forward each; and the cache
# policies it decodes dynamic NTK with. Explicit, so a policy or method registered elsewhere joins no evaluation.
METHODS = {"no scaling": "no scaling", "linear (PI)": "PI", "NTK-aware": "NTK-aware", "YaRN": "YaRN",
           "dynamic NTK, full sequence": "dynamic NTK"}
CACHE_POLICIES = ("post_rope", "recompute", "bucketed", "rope_on_load")
EVAL_RESULTS = LM_DIR / "eval_schemes.pt"  # notebook 05's 45-window evaluation, written by `python -m ropelab.lm eval`


def build_corpus(out: Path = CORPUS) -> Path:
    """Write the Python Language Reference topics (CPython's ``pydoc_data``) as one UTF-8 text file.

    Args:
        out: the file to write (its folder is created); returned.
    """
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k].strip() for k in sorted(topics.topics))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
    return out


def load_corpus(path: Path = CORPUS) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) byte tensors: the first 90 % and the last 10 % of the corpus.

    Args:
        path: the corpus file (:func:`build_corpus` writes it); its bytes become int64 token ids 0 .. 255.
    """
    data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()
    cut = int(0.9 * data.numel())
    return data[:cut], data[cut:]


def model_config(**overrides) -> ModelConfig:
    """The LM's architecture: 4 layers, d_model 128, 4 heads, RoPE (half style, base 1e4, L0 = 256).

    Args:
        **overrides: :class:`ropelab.models.ModelConfig` fields to change (``vocab_size`` is 256: bytes).
    """
    kw = dict(vocab_size=256, d_model=128, n_layers=4, n_heads=4, pe="rope",
              rope=RopeSpec(style="half", base=10000.0, max_position_embeddings=L0))
    kw.update(overrides)
    return ModelConfig(**kw)


def train_lm(steps: int = 1500, batch: int = 16, seed: int = 0, out: Path = CHECKPOINT, progress: bool = True,
             **cfg_overrides) -> tuple[TinyLM, list[dict]]:
    """Train TinyLM at context L0 on random windows of the training split; save a float32 checkpoint.

    AdamW at peak lr 3e-3 with 100 warm-up steps (:func:`ropelab.models.train`); the validation loss on 16
    windows every 250 steps goes into the history. Returns ``(model, history)``.

    Args:
        steps: optimiser steps.
        batch: windows of L0 + 1 bytes per step.
        seed: seeds the weights' initialisation (``torch.manual_seed``) and the window sampling.
        out: the checkpoint to write, with its training record next to it (``.json``).
        progress: show a progress bar.
        **cfg_overrides: :func:`model_config` overrides.
    """
    torch.manual_seed(seed)
    train_data, val_data = load_corpus()
    cfg = model_config(**cfg_overrides)
    model = TinyLM(cfg)

    def sample(gen):
        starts = torch.randint(0, train_data.numel() - L0 - 1, (batch,), generator=gen)
        window = torch.stack([train_data[s : s + L0 + 1] for s in starts.tolist()])
        return window[:, :-1], window[:, 1:], None

    def evaluate(m):
        ids = val_windows(val_data, 16, L0, seed=1)
        with torch.no_grad():
            return {"val_loss": float(masked_loss(m(ids[:, :-1]), ids[:, 1:]))}

    t0 = time.perf_counter()
    history = train(model, sample, steps=steps, lr=3e-3, warmup=100, seed=seed, log_every=50, evaluate=evaluate,
                    eval_every=250, progress=progress, desc="train LM")
    seconds = time.perf_counter() - t0
    meta = {"steps": steps, "batch": batch, "context": L0, "seed": seed, "train_seconds": round(seconds, 1),
            "threads": torch.get_num_threads(), "parameters": sum(p.numel() for p in model.parameters()),
            "history": history}
    save_checkpoint(model, out, meta=meta)
    return model, history


def load_lm(path: Path = CHECKPOINT) -> TinyLM:
    """The trained LM from its checkpoint, in eval mode (``models.load_checkpoint``).

    Args:
        path: the checkpoint (FileNotFoundError, saying how to make it, when missing).
    """
    return load_checkpoint(path)


def val_windows(val_data: torch.Tensor, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """``n`` evenly spaced windows of ``length + 1`` bytes from the validation split (deterministic).

    Args:
        val_data: the validation split (:func:`load_corpus`' second), at least ``length + 1`` bytes (ValueError
            otherwise).
        n: how many windows; they overlap when n exceeds :func:`disjoint_windows`.
        length: tokens per window (each holds length + 1 bytes: inputs and the next-byte targets).
        seed: shifts every start by this many bytes (clamped at the split's end); not random.

    Returns int64 [n, length + 1].
    """
    if val_data.numel() < length + 1:
        raise ValueError(f"validation split has {val_data.numel()} bytes, fewer than a window of {length + 1}.")
    starts = torch.linspace(0, val_data.numel() - length - 1, n).long() + seed
    starts = starts.clamp(max=val_data.numel() - length - 1)
    return torch.stack([val_data[s : s + length + 1] for s in starts.tolist()])


def disjoint_windows(val_data: torch.Tensor, length: int) -> int:
    """How many windows of ``length + 1`` bytes fit in the validation split without overlapping: the most
    ``val_windows`` can return as independent samples (45 at length 1024).

    Args:
        val_data: the validation split.
        length: tokens per window.
    """
    return val_data.numel() // (length + 1)


def static_ntk_base(base: float, rotary_dim: int, alpha: float) -> float:
    """Deprecated: ``ropelab.scaling.ntk_aware_base`` (the same formula; notebook 05's "NTK-aware" scheme is
    ``ropelab.extend.methods``' at alpha = s).

    Args:
        base: as in ``ropelab.scaling.ntk_aware_base``.
        rotary_dim: as there.
        alpha: as there.
    """
    warnings.warn("ropelab.lm.static_ntk_base is deprecated; use ropelab.scaling.ntk_aware_base (same arguments).",
                  DeprecationWarning, stacklevel=2)
    return ntk_aware_base(base, rotary_dim, alpha)


class Scheme(NamedTuple):
    """One evaluated scheme: a method's RoPE (a ``RopeSpec`` of ``ropelab.extend.methods``) and the cache policy
    it decodes with (None: one full forward).

    Args:
        rope: the method's RopeSpec (its base and scaling go onto the model's RoPE).
        policy: a cache policy's name (``ropelab.kvcache.POLICIES``), or None for one full forward.
    """

    rope: RopeSpec
    policy: str | None = None


def schemes(head_dim: int) -> dict[str, Scheme]:
    """Notebook 05's schemes at s = ``SCALE``: ``METHODS`` of ``ropelab.extend.methods`` under their labels, one
    full forward each, then dynamic NTK decoded under each of ``CACHE_POLICIES`` ("dynamic NTK, cache <policy>").

    "NTK-aware" is static NTK-aware scaling at alpha = s (base 4.39 b at s = 4, r = 32). "dynamic NTK, full
    sequence" evaluates Hugging Face's dynamic formula at the full length: at L = 4 L0 its alpha is 13
    (base 15.4 b).

    Args:
        head_dim: the model's head size d (NTK-aware's base depends on it).
    """
    table = methods(SCALE, head_dim, base=10000.0, original=L0)
    out = {label: Scheme(table[name]) for label, name in METHODS.items()}
    out.update({f"dynamic NTK, cache {policy}": Scheme(table["dynamic NTK"], policy) for policy in CACHE_POLICIES})
    return out


def _scheme(scheme: Scheme | RopeSpec | Mapping) -> tuple[RopeSpec | Mapping, str | None]:
    """(the method, for ``extend.method_spec``; the cache policy or None)."""
    if isinstance(scheme, Scheme):
        return scheme.rope, scheme.policy
    if isinstance(scheme, RopeSpec):
        return scheme, None
    if isinstance(scheme, Mapping):  # {"base", "scaling"} and optionally "policy"
        return scheme, scheme.get("policy")
    raise ValueError(f"scheme must be a lm.Scheme, a RopeSpec or a mapping with 'base' and 'scaling' (and "
                     f"optionally 'policy'), got {type(scheme).__name__}.")


@torch.no_grad()
def per_position_loss(model: TinyLM, ids: torch.Tensor, scheme: Scheme | RopeSpec | Mapping,
                      prompt_len: int = L0) -> torch.Tensor:
    """Cross-entropy at every position [n, T] for windows ``ids`` [n, T + 1] under one scheme: a :class:`Scheme`,
    a method's ``RopeSpec`` (one full forward), or a mapping ``{"base", "scaling"[, "policy"]}``. The model's RoPE
    takes the scheme's base and scaling (``extend.method_spec``); cached schemes prefill ``prompt_len`` tokens and
    then decode one token per step on the schedule their policy asks for (``kvcache.schedule_for``).

    Args:
        model: a TinyLM with RoPE.
        ids: windows of token ids [n, T + 1] (:func:`val_windows`).
        scheme: a :class:`Scheme`, a RopeSpec or a mapping as above (ValueError otherwise).
        prompt_len: the prefill's length for a cached scheme, 1 .. T.

    Returns float32 [n, T] losses in nats.
    """
    inputs, targets = ids[:, :-1], ids[:, 1:]
    rope, policy = _scheme(scheme)
    spec = method_spec(model.cfg.rope, rope)
    if policy is None:
        logits = model(inputs, rope=spec)
    else:
        sched = schedule_for(policy, spec, model.cfg.head_dim)
        logits = decode(TinyLMAdapter(model), inputs, sched, policy, prompt_len=prompt_len).logits
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


def evaluate_schemes(model: TinyLM, n: int = 8, length: int = int(SCALE * L0), progress: bool = True,
                     names: list[str] | None = None) -> dict:
    """Mean per-position loss for every scheme (or those in ``names``) on ``n`` validation windows of
    ``length`` tokens.

    Args:
        model: the trained LM.
        n: validation windows (:func:`val_windows`).
        length: tokens per window (default 4 L0).
        progress: show a progress bar over the schemes.
        names: the schemes' labels to evaluate (of :func:`schemes`); None: all.

    Returns ``{"n_windows", "length", "L0", "scale", "loss": name -> mean loss per position,
    "window_loss": name -> [window][position] losses}``.
    """
    _, val_data = load_corpus()
    ids = val_windows(val_data, n, length)
    result = {"n_windows": n, "length": length, "L0": L0, "scale": SCALE, "loss": {}}
    items = [(k, v) for k, v in schemes(model.cfg.head_dim).items() if names is None or k in names]
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="schemes", leave=False)
    result["window_loss"] = {}
    for name, scheme in items:
        loss = per_position_loss(model, ids, scheme)
        result["loss"][name] = loss.mean(0).tolist()
        result["window_loss"][name] = loss.tolist()  # [window, position]: what the bootstrap resamples
    return result


def _checkpoint_sha256(path: Path = CHECKPOINT) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def save_scheme_losses(result: dict, path: str | Path = EVAL_RESULTS) -> Path:
    """Write :func:`evaluate_schemes`' result for the committed checkpoint: every window's per-position loss as
    float32 tensors (the losses are float32, so nothing is rounded), with the settings and the checkpoint's
    SHA-256, so :func:`load_or_evaluate_schemes` can tell whether the file answers a request.

    Args:
        result: :func:`evaluate_schemes`' result (of the committed checkpoint :data:`CHECKPOINT`, whose hash is
            recorded).
        path: the file to write (its folder is created); returned.
    """
    meta = {k: result[k] for k in ("n_windows", "length", "L0", "scale")}
    meta.update(checkpoint=CHECKPOINT.name, checkpoint_sha256=_checkpoint_sha256(), command="python -m ropelab.lm eval",
                schemes=list(result["window_loss"]))
    blob = {"meta": meta, "window_loss": {k: torch.tensor(v, dtype=torch.float32)
                                          for k, v in result["window_loss"].items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blob, path)
    return path


def load_or_evaluate_schemes(model: TinyLM, n: int, length: int, names: list[str], path: str | Path = EVAL_RESULTS,
                             checkpoint: str | Path = CHECKPOINT) -> dict:
    """:func:`evaluate_schemes` for ``names``, read from ``path`` when it holds them for the same ``n`` windows,
    ``length``, L0, scale and checkpoint (``model`` must be the committed ``checkpoint``, as :func:`load_lm`
    gives); computed otherwise (minutes: every cached scheme decodes token by token). The numbers are the same
    either way: the file stores the float32 losses themselves.

    Args:
        model: the LM to evaluate when the file does not answer.
        n: validation windows.
        length: tokens per window.
        names: the schemes wanted.
        path: the saved results (:func:`save_scheme_losses`).
        checkpoint: the checkpoint whose SHA-256 the file must record.

    The result is :func:`evaluate_schemes`', with ``"source"``: the file's path or ``"computed"``.
    """
    path = Path(path)
    if path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        meta = blob["meta"]
        if (meta["n_windows"], meta["length"], meta["L0"], meta["scale"]) == (n, length, L0, SCALE) and set(
                names) <= set(blob["window_loss"]) and meta["checkpoint_sha256"] == _checkpoint_sha256(checkpoint):
            wl = {k: v for k, v in blob["window_loss"].items() if k in names}  # in schemes() order, as computed
            return {"n_windows": n, "length": length, "L0": L0, "scale": SCALE, "source": str(path),
                    "loss": {k: v.mean(0).tolist() for k, v in wl.items()},
                    "window_loss": {k: v.tolist() for k, v in wl.items()}}
    return {**evaluate_schemes(model, n, length, names=names), "source": "computed"}


def summarize(result: dict, edges=(0, 256, 512, 768, 1024)) -> dict[str, list[float]]:
    """Mean loss (nats per byte) per position band [edges[i], edges[i+1]).

    Args:
        result: :func:`evaluate_schemes`' result; its ``"loss"`` (scheme -> mean loss per position) is read.
        edges: the bands' edges, ascending; a band starting past the evaluated positions is left out.

    Returns scheme -> one mean per band.
    """
    out = {}
    for name, curve in result["loss"].items():
        c = torch.tensor(curve)
        out[name] = [float(c[a:b].mean()) for a, b in zip(edges[:-1], edges[1:]) if a < c.numel()]
    return out


def bootstrap_means(per_window: torch.Tensor, n_boot: int = 2000, seed: int = 0, level: float = 0.95):
    """Mean over windows of ``per_window`` [n, ...] and its percentile bootstrap interval (windows resampled
    with replacement, ``n_boot`` times, fixed seed): three tensors of shape [...].

    Args:
        per_window: [n, ...], one row per window, n >= 2 (ValueError otherwise); computed in float64.
        n_boot: bootstrap resamples of the windows.
        seed: the resampling generator's seed (fixed: the intervals are reproducible).
        level: the interval's coverage (0.95: the 2.5 % and 97.5 % percentiles).

    Returns ``(mean, low, high)``, float64.
    """
    if per_window.ndim < 1 or per_window.shape[0] < 2:
        raise ValueError(f"need at least 2 windows to bootstrap, got shape {tuple(per_window.shape)}.")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, per_window.shape[0], (n_boot, per_window.shape[0]), generator=g)
    means = per_window.double()[idx].mean(1)
    a = (1 - level) / 2
    lo, hi = torch.quantile(means, torch.tensor([a, 1 - a], dtype=torch.float64), dim=0)
    return per_window.double().mean(0), lo, hi


def band_intervals(result: dict, edges=(0, 256, 512, 768, 1024), reference: str | None = None,
                   n_boot: int = 2000, seed: int = 0) -> dict[str, list[tuple[float, float, float]]]:
    """Per scheme and band [edges[i], edges[i+1]): (mean, low, high) of the loss in nats per byte, a 95 %
    bootstrap interval over the evaluation windows. With ``reference``, of the paired difference
    scheme - reference (the same windows resampled for both), which is what a claimed ordering rests on.

    Args:
        result: :func:`evaluate_schemes`' (or :func:`load_or_evaluate_schemes`') result; its ``"window_loss"``
            (scheme -> [window, position] losses) is read.
        edges: the bands' edges (positions), ascending.
        reference: a scheme's name (ValueError if not evaluated), or None for the losses themselves.
        n_boot: bootstrap resamples of the windows.
        seed: the resampling generator's seed (fixed: the intervals are reproducible).
    """
    wl = {k: torch.tensor(v, dtype=torch.float64) for k, v in result["window_loss"].items()}
    if reference is not None and reference not in wl:
        raise ValueError(f"reference {reference!r} is not among the evaluated schemes {sorted(wl)}.")
    out = {}
    for name, w in wl.items():
        if reference is not None:
            w = w - wl[reference]
        bands = torch.stack([w[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:]) if a < w.shape[1]], 1)
        m, lo, hi = bootstrap_means(bands, n_boot, seed)
        out[name] = [(float(x), float(y), float(z)) for x, y, z in zip(m, lo, hi)]
    return out


def span_means(result: dict, start: int, stop: int) -> dict[str, torch.Tensor]:
    """Per scheme of ``result["window_loss"]``: each window's mean loss over positions [start, stop), a float64
    tensor [windows]. Differences of these (a rise from one span to another, one scheme minus another) stay paired
    by window, which is what :func:`paired_intervals` needs.

    Args:
        result: :func:`evaluate_schemes`' (or :func:`load_or_evaluate_schemes`') result; its ``"window_loss"``
            (scheme -> [window, position] losses) is read.
        start: the span's first position.
        stop: one past its last; 0 <= start < stop <= the window's length (ValueError otherwise).
    """
    out = {}
    for name, v in result["window_loss"].items():
        w = torch.as_tensor(v, dtype=torch.float64)
        if not 0 <= start < stop <= w.shape[1]:
            raise ValueError(f"span [{start}, {stop}) is not inside the {w.shape[1]} positions evaluated; "
                             "pass 0 <= start < stop <= the window's length.")
        out[name] = w[:, start:stop].mean(1)
    return out


def paired_intervals(values: dict[str, torch.Tensor], reference: str | None = None, n_boot: int = 2000,
                     seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """(mean, low, high) over windows of one number per window and scheme (e.g. from :func:`span_means`), a 95 %
    percentile bootstrap interval with the windows resampled (:func:`bootstrap_means`). With ``reference``, of the
    paired difference ``values[name] - values[reference]``: the same windows resampled for both.

    Args:
        values: scheme -> a 1-D tensor [windows], every scheme over the same windows (ValueError otherwise).
        reference: a key of ``values`` (ValueError otherwise), or None for the values themselves.
        n_boot: bootstrap resamples of the windows.
        seed: the resampling generator's seed (fixed: the intervals are reproducible).
    """
    if reference is not None and reference not in values:
        raise ValueError(f"reference {reference!r} is not among the schemes {sorted(values)}.")
    n = {k: tuple(v.shape) for k, v in values.items()}
    if len(set(n.values())) != 1 or len(next(iter(n.values()))) != 1:
        raise ValueError(f"need one value per window for every scheme, with the same windows; got shapes {n}.")
    out = {}
    for name, v in values.items():
        d = v.double() - (values[reference].double() if reference is not None else 0)
        m, lo, hi = bootstrap_means(d, n_boot, seed)
        out[name] = (float(m), float(lo), float(hi))
    return out


def neighbour_intervals(result: dict, order: list[str], edges=(0, 256, 512, 768, 1024), band: int = -1,
                        n_boot: int = 2000, seed: int = 0) -> list[tuple[str, str, tuple[float, float, float]]]:
    """For schemes listed in ``order`` (e.g. by mean loss), the paired difference between each and the next in
    one band (``band`` indexes the bands of ``edges``): (this, next, (mean, low, high)) of next - this, a 95 %
    bootstrap interval over the windows. Two neighbours are ordered only where the interval excludes zero, the
    rule every ordering claim in the notebooks follows.

    Args:
        result: :func:`evaluate_schemes`' (or :func:`load_or_evaluate_schemes`') result; its ``"window_loss"``
            (scheme -> [window, position] losses) is read.
        order: the schemes, in the order to compare (each must have been evaluated; ValueError otherwise).
        edges: the bands' edges (positions).
        band: which band (an index into the bands; -1: the last).
        n_boot: bootstrap resamples of the windows.
        seed: the resampling generator's seed (fixed: the intervals are reproducible).
    """
    missing = [k for k in order if k not in result["window_loss"]]
    if missing:
        raise ValueError(f"order names schemes that were not evaluated: {missing}; choose from "
                         f"{sorted(result['window_loss'])}.")
    out = []
    for a, b in zip(order[:-1], order[1:]):
        diff = band_intervals({"window_loss": {b: result["window_loss"][b], a: result["window_loss"][a]}}, edges,
                              reference=a, n_boot=n_boot, seed=seed)[b][band]
        out.append((a, b, diff))
    return out


def order_text(steps: list, values: dict[str, float], fmt: str = "{:.2f}") -> str:
    """An ordering as text from :func:`neighbour_intervals`' ``steps``: "a 1.71 ≈ b 1.73 < c 1.89", with "<" (or ">")
    where the paired interval of next - this lies above (or below) zero and "≈" (equal within noise) where it
    contains zero.

    Args:
        steps: :func:`neighbour_intervals`' list of (this, next, (mean, low, high)); empty gives "".
        values: scheme -> the number printed after its name.
        fmt: the format of those numbers.
    """
    if not steps:
        return ""
    parts = [f"{steps[0][0]} {fmt.format(values[steps[0][0]])}"]
    for _, b, (_, lo, hi) in steps:
        parts.append(("<" if lo > 0 else ">" if hi < 0 else "≈") + f" {b} {fmt.format(values[b])}")
    return " ".join(parts)


def smooth_positions(per_window: torch.Tensor, width: int = 32, stride: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Means of ``width`` consecutive positions every ``stride`` positions of ``per_window`` [n, T]: (the smoothed
    [n, T'] losses, the centre position of each mean [T']).

    Args:
        per_window: losses [n, T] (computed in float64).
        width: positions per mean (at most T).
        stride: positions between consecutive means.
    """
    sm = torch.nn.functional.avg_pool1d(per_window.double()[:, None], width, stride)[:, 0]
    return sm, torch.arange(sm.shape[1]) * stride + width // 2


def plot_band_panels(window_loss: dict, reference: str, *, L0: int = L0, ncol: int = 4, title: str = "",
                     reference_label: str | None = None, width: int = 32, stride: int = 8,
                     legend_in: str | None = None):
    """One panel per scheme of ``window_loss`` (name -> [window, position] losses): its mean loss against position
    (``width``-token means) with a 95 % bootstrap band over windows (:func:`bootstrap_means`), the ``reference``
    scheme's mean drawn dashed in every other panel, and :math:`L_0` dotted. The y range covers every band's upper
    end (no interval is clipped). The legend goes in the upper left of panel ``legend_in`` (default: the first
    panel other than the reference's): name a panel whose curve leaves that corner free. Returns the figure
    (notebooks 05 and 07).

    Args:
        window_loss: scheme -> [window, position] losses (a tensor or nested lists).
        reference: the scheme drawn dashed in the other panels (ValueError if absent).
        L0: the trained context, drawn as a dotted line.
        ncol: panels per row.
        title: the figure's title ("" for none).
        reference_label: the reference's legend label; None: its name.
        width: positions per smoothed mean (:func:`smooth_positions`).
        stride: positions between smoothed means.
        legend_in: the scheme whose panel holds the legend (ValueError if absent); None: the first that is not
            the reference.
    """
    import matplotlib.pyplot as plt

    if reference not in window_loss:
        raise ValueError(f"reference {reference!r} is not among the schemes {sorted(window_loss)}.")
    if legend_in is not None and legend_in not in window_loss:
        raise ValueError(f"legend_in {legend_in!r} is not among the schemes {sorted(window_loss)}.")
    curves = {}
    for name, w in window_loss.items():
        sm, x = smooth_positions(torch.as_tensor(w), width, stride)
        curves[name] = bootstrap_means(sm)
    nrow = math.ceil(len(curves) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.5 * ncol, 2.7 * nrow), sharex=True, sharey=True, squeeze=False)
    for ax, (name, (mean, lo, hi)) in zip(axes.flat, curves.items()):
        if name != reference:
            ax.plot(x, curves[reference][0], color="0.45", lw=1, ls="--", label=reference_label or reference)
        ax.fill_between(x, lo, hi, color="C0", alpha=0.3, lw=0)
        ax.plot(x, mean, color="C0", lw=1.3, label="this scheme, 95 % CI")
        ax.axvline(L0, color="0.5", ls=":")
        ax.set_title(name, fontsize=9)
    for k in range(len(curves), nrow * ncol):
        axes.flat[k].set_visible(False)
        if k >= ncol:  # the panel above a hidden one is the last of its column: it shows the x labels
            axes.flat[k - ncol].tick_params(labelbottom=True)
    low = min(float(c[1].min()) for c in curves.values())
    high = max(float(c[2].max()) for c in curves.values())
    axes[0, 0].set_ylim(max(0.0, low - 0.1), high + 0.1)
    next(ax for ax, name in zip(axes.flat, curves)
         if (name == legend_in if legend_in is not None else name != reference)).legend(fontsize=7, loc="upper left")
    fig.supxlabel("position")
    fig.supylabel(f"loss (nats/byte), {width}-token mean")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- notebook 05's figures

def plot_attention_drift(axes, kl: torch.Tensor, contribution: torch.Tensor, length: int) -> None:
    """KL(consistent || post_rope) per layer against the current length, and the energy-weighted phase error
    per pair of layer 0 (notebook 05, section 4).

    Args:
        axes: two matplotlib Axes.
        kl: [layers, steps], :class:`ropelab.staleness.DriftProbe`'s KL per layer and step, the first step at
            current length :data:`L0`.
        contribution: [pairs], layer 0's energy-weighted phase error per pair.
        length: the current length L the right panel is at (its title).
    """
    for layer in range(kl.shape[0]):
        axes[0].plot(torch.arange(L0, L0 + kl.shape[1]), kl[layer], label=f"layer {layer}",
                     ls=["-", "--", "-.", ":"][layer % 4])
    axes[0].axvline(L0, color="0.5", ls=":")
    axes[0].set(xlabel="current length L", ylabel="KL(consistent || post_rope)", yscale="log", ylim=(1e-6, None),
                title="attention drift, last query")
    axes[0].legend()
    axes[1].plot(torch.arange(contribution.shape[0]), contribution, marker="o")
    axes[1].xaxis.get_major_locator().set_params(integer=True)
    axes[1].set(xlabel="pair i", ylabel=r"$E_i \cdot$ mean $2\sin(|\varepsilon_i|/2)$", title=f"layer 0, L = {length}")


def plot_decode_cost(axes, bench: dict) -> None:
    """``python -m ropelab.bench decode``'s medians per policy against the cached length, one panel per batch,
    with the interquartile range as error bars where the file has one, and the boundary step of every policy
    that has one (a bucketed schedule).

    Args:
        axes: one matplotlib Axes per batch size in the file, in ascending batch order.
        bench: the decode benchmark's JSON as a dict: ``"rows"``, each with ``policy``, ``batch``,
            ``cached_tokens``, ``median_ms`` (and optionally ``q25_ms``, ``q75_ms``, ``boundary_ms``, ``max_ms``).
    """
    rows = bench["rows"]
    # the file's policies with a step-time distribution, in its order (amortised rows carry none)
    policies = list(dict.fromkeys(r["policy"] for r in rows if "median_ms" in r))
    for ax, b in zip(axes, sorted({r["batch"] for r in rows})):
        for j, policy in enumerate(policies):
            pts = sorted((r for r in rows if r["batch"] == b and r["policy"] == policy),
                         key=lambda r: r["cached_tokens"])
            n, med = [r["cached_tokens"] for r in pts], [r["median_ms"] for r in pts]
            err = ([[r["median_ms"] - r["q25_ms"] for r in pts], [r["q75_ms"] - r["median_ms"] for r in pts]]
                   if all("q25_ms" in r for r in pts) else None)
            line = ax.errorbar(n, med, yerr=err, marker="os^Dpx"[j % 6], ls=["-", "--", "-.", ":"][j % 4], capsize=2,
                               label=f"{policy}, median" + (" and IQR" if err else ""))[0]
            if any(r.get("boundary_ms") for r in pts):  # a policy with a boundary step (a bucketed schedule)
                top = [r.get("boundary_ms") or r["max_ms"] for r in pts]
                ax.plot(n, top, marker="v", ls="none", color=line.get_color(), label=f"{policy}, boundary step")
        ax.set(xscale="log", yscale="log", xlabel="cached tokens", title=f"batch {b}")
    axes[0].set_ylabel("ms per decoding step (one layer)")
    axes[0].legend(fontsize=7)


def main(argv: list[str] | None = None) -> int:
    """``python -m ropelab.lm corpus | train | eval``.

    Args:
        argv: the command-line arguments (``what``, ``--steps``, ``--threads``); None: ``sys.argv[1:]``.

    Returns the exit status, 0.
    """
    parser = argparse.ArgumentParser(prog="python -m ropelab.lm", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["corpus", "train", "eval"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.what == "corpus":
        print(f"wrote {build_corpus()}")
    elif args.what == "train":
        _, history = train_lm(steps=args.steps)
        print(f"final: {history[-1]}; wrote {CHECKPOINT}")
    else:
        result = evaluate_schemes(load_lm(), disjoint_windows(load_corpus()[1], int(SCALE * L0)))
        print(f"wrote {save_scheme_losses(result)}")
        result.pop("window_loss")
        out = BUILD_DIR / "lm_eval.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result) + "\n")
        for name, bands in summarize(result).items():
            print(f"{name:40s} " + " ".join(f"{x:6.3f}" for x in bands) + f"   ppl@end {math.exp(bands[-1]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
