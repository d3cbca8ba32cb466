r"""Notebook 10's study: the RoPE bugs public trackers report at engine and format boundaries, each reproduced
as the wrong :class:`~ropelab.spec.RopeSpec` a buggy engine runs, and its damage measured on ropelab's own
trained byte-level TinyLMs.

**The reports** (``data/engines/boundary_bugs.json``, read by :func:`boundary_bugs`; each entry has the
repository, number, title, date, state, what went wrong and a verbatim quote with its author):

- *partial rotary dropped*: mlx-lm#1698 (glm: "``ModelArgs`` had no ``partial_rotary_factor``, so
  ``BaseModelArgs.from_dict`` dropped the key"), maxtext#4615 (the M-RoPE path); its mirror image, a partial
  factor imposed on a head that rotates in full, vllm#41185;
- *NeoX pairing read as interleaved*: sglang#30111 and #30342 (DeepSeek-V3.2's indexer, "the fused kernels
  hardcoding interleave/GPT-J RoPE"), ik_llama.cpp#2290 (39 NEOX architectures returned NORM);
- *a declared rope_scaling ignored*: mlx-vlm#1709 (Gemma 3's linear factor 8), #1710 (ten models), fixed
  by #1927;
- *interleaved M-RoPE read as something else*: llama.cpp#19443 (Qwen3.5 run as NEOX instead of IMROPE),
  MNN#4133 (Qwen3-VL run with contiguous sections: "behaves the same when processing text");
- *LongRoPE's short/long switch wrong*: mlx-lm#660 ("Long factors were always applied regardless of sequence
  length"), llama.cpp#24875 (chosen from the allocated context), vllm#27431;
- *yarn settings dropped or mis-scaled by GGUF writers and readers*: llama.cpp#22612 (Mistral's
  ``apply_scale`` lost, so yarn's attention factor cancelled), #17945 (the attention factor's adjustment),
  #13322 (a Qwen3-MoE yarn block written to no key), ik_llama.cpp#2003 (yarn's factor written into
  ``yarn_ext_factor``).

**The bugs as spec maps.** Each class is a function correct spec -> the spec the buggy engine runs
(:data:`BUG_CLASSES`); each refuses a spec it cannot apply to (a spec without partial rotary has none to
drop). :func:`per_layer` applies one to chosen layers of a model's per-layer specs.

**Damage** (:func:`model_damage`), between the model run with the correct specs and with the buggy ones, on
held-out windows of the corpus: the mean KL divergence of the next-byte distributions
:math:`\mathrm{KL}(p\,\|\,\tilde p)` (nats), the cosine between the correct and the buggy attention logits
:math:`q_m \cdot k_n` (causal entries, per layer, the worst layer reported), and the first position where the
greedy next byte changes. Classes the trained model cannot express (its heads rotate in full; it has one
position axis) are measured on its q and k (:func:`qk_damage`): the same cosine, the KL of the attention rows,
the first query whose most-attended key changes. :data:`CASES` says which model and which measure each class
gets.


**ropelab-check catching each bug** (:data:`CHECK_CASES`, :func:`catch_bug`): each class on a tiny Hugging Face
family it applies to (``ropelab.engines.tiny``): the correct model directory is saved, the buggy reading is written
where an engine reads it (a GGUF file, :func:`ropelab.engines.gguf.write_gguf`, where llama.cpp's keys can say the
bug; else a transformers ``config.json``), and the real ``python -m ropelab.engines model_dir buggy_file --json``
runs as a subprocess: exit code, mismatch kinds, phase error and attention change. The identity map written the
same way is the control (exit 0)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..adapters import TinyLMAdapter
from ..attention import kl_divergence
from ..multiaxis import MultiAxis, mrope_positions
from ..paths import DATA_DIR
from ..rope import apply_rope
from ..spec import RopeSpec

__all__ = ["BUGS_JSON", "BUG_CLASSES", "CASES", "Case", "Damage", "boundary_bugs", "drop_partial_rotary",
           "impose_partial_rotary", "neox_as_interleaved", "ignore_rope_scaling", "drop_yarn_attention_factor",
           "longrope_always_long", "mrope_as_contiguous", "mrope_as_1d", "identity", "per_layer",
           "forward_per_layer", "model_damage", "qk_damage", "held_out_windows", "load_model", "longrope_specs",
           "partial_specs", "MROPE_SECTIONS", "run_case", "run_all", "plot_damage", "window_damage", "spread",
           "WHERE", "classes_by_where", "plot_matrix", "cell_words", "non_agree", "engine_label",
           "CheckCase", "CHECK_CASES",
           "write_reading", "write_bug", "run_check", "catch_bug", "catch_all"]

BUGS_JSON = DATA_DIR / "engines" / "boundary_bugs.json"
_BUG_FIELDS = ("class", "repository", "number", "where", "kind", "title", "date", "state", "url", "what", "quote",
               "quote_by")
# Where a reported bug lived: in a file (a converter wrote a key wrong or not at all; a check of the file sees it), or
# in engine code (the file is right; only running the engine, or building its model, shows it).
WHERE = ("file", "engine code")


def boundary_bugs(path: str | Path = BUGS_JSON) -> list[dict]:
    """The verified public reports (``data/engines/boundary_bugs.json``), each with every field of
    ``_BUG_FIELDS``; a missing field or an unknown class raises ValueError."""
    bugs = json.loads(Path(path).read_text(encoding="utf-8"))["bugs"]
    for b in bugs:
        missing = [f for f in _BUG_FIELDS if not b.get(f)]
        if missing:
            raise ValueError(f"{path}: entry {b.get('repository')}#{b.get('number')} lacks {missing}.")
        if b["class"] not in REPORTED_CLASSES:
            raise ValueError(f"{path}: unknown class {b['class']!r}; known: {sorted(REPORTED_CLASSES)}.")
        if b["where"] not in WHERE:
            raise ValueError(f"{path}: entry {b['repository']}#{b['number']} has where={b['where']!r}; use one of "
                             f"{WHERE}.")
    return bugs


def classes_by_where(bugs: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """``{where: the bug classes with at least one report that lived there}`` (a class may be in both)."""
    out: dict[str, set[str]] = {w: set() for w in WHERE}
    for b in bugs:
        out[b["where"]].add(b["class"])
    return out


# ------------------------------------------------------------------------------------------------------------
# The bug classes: correct spec -> the spec the buggy engine runs
# ------------------------------------------------------------------------------------------------------------


def _check_spec(spec: Any, fn: str) -> None:
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"{fn} takes a ropelab.RopeSpec, got {type(spec).__name__}.")


def identity(spec: RopeSpec) -> RopeSpec:
    """No bug: the spec as it is (the control every damage measure must give zero for)."""
    _check_spec(spec, "identity")
    return spec


def drop_partial_rotary(spec: RopeSpec) -> RopeSpec:
    """Partial rotary dropped (mlx-lm#1698, maxtext#4615): the whole head rotates, ``rotary_dim=None``."""
    _check_spec(spec, "drop_partial_rotary")
    if spec.rotary_dim is None or spec.is_nope:
        raise ValueError(f"drop_partial_rotary needs a spec with a partial rotary_dim (> 0), got "
                         f"rotary_dim={spec.rotary_dim}; there is nothing to drop.")
    return replace(spec, rotary_dim=None)


def impose_partial_rotary(spec: RopeSpec, rotary_dim: int) -> RopeSpec:
    """The mirror image (vllm#41185): a partial factor meant for other layers applied to a head that rotates in
    full, so only the first ``rotary_dim`` dims rotate."""
    _check_spec(spec, "impose_partial_rotary")
    if spec.rotary_dim is not None:
        raise ValueError(f"impose_partial_rotary needs a spec that rotates the whole head (rotary_dim=None), got "
                         f"rotary_dim={spec.rotary_dim}.")
    if not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even int (the dims that still rotate), got {rotary_dim!r}.")
    return replace(spec, rotary_dim=rotary_dim)


def neox_as_interleaved(spec: RopeSpec) -> RopeSpec:
    """NeoX pairing (i, i + r/2) read as interleaved (2i, 2i + 1) (sglang#30111, ik_llama.cpp#2290's NEOX -> NORM)."""
    _check_spec(spec, "neox_as_interleaved")
    if spec.style != "half":
        raise ValueError(f"neox_as_interleaved needs a NeoX (style='half') spec, got style={spec.style!r}.")
    return replace(spec, style="interleaved")


def ignore_rope_scaling(spec: RopeSpec) -> RopeSpec:
    """A declared rope_scaling ignored (mlx-vlm#1709, #1710) or not written (llama.cpp#13322): ``scaling=None``."""
    _check_spec(spec, "ignore_rope_scaling")
    if spec.scaling is None:
        raise ValueError("ignore_rope_scaling needs a spec with a scaling; this one has scaling=None.")
    return replace(spec, scaling=None)


def drop_yarn_attention_factor(spec: RopeSpec) -> RopeSpec:
    r"""yarn's attention factor (:math:`0.1 \ln s + 1`, or its mscale form) cancelled to 1 while its frequencies
    stay (llama.cpp#22612: Mistral's ``apply_scale`` lost on conversion)."""
    _check_spec(spec, "drop_yarn_attention_factor")
    if spec.rope_type != "yarn":
        raise ValueError(f"drop_yarn_attention_factor needs a yarn spec, got rope_type {spec.rope_type!r}.")
    return replace(spec, scaling={**spec.scaling, "attention_factor": 1.0})


def longrope_always_long(spec: RopeSpec) -> RopeSpec:
    """LongRoPE's switch lost (mlx-lm#660 before its fix): the long factors at every length, by making the short
    set the long one."""
    _check_spec(spec, "longrope_always_long")
    if spec.rope_type != "longrope":
        raise ValueError(f"longrope_always_long needs a longrope spec, got rope_type {spec.rope_type!r}.")
    if list(spec.scaling["short_factor"]) == list(spec.scaling["long_factor"]):
        raise ValueError("this spec's short_factor already equals its long_factor: the switch cannot be wrong.")
    return replace(spec, scaling={**spec.scaling, "short_factor": list(spec.scaling["long_factor"])})


def mrope_as_contiguous(sections: MultiAxis) -> MultiAxis:
    """Interleaved M-RoPE (Qwen3-VL) read with contiguous sections (Qwen2-VL's; MNN#4133)."""
    if not isinstance(sections, MultiAxis) or not sections.interleaved:
        raise ValueError("mrope_as_contiguous needs an interleaved MultiAxis (MultiAxis.mrope(..., "
                         f"interleaved=True)), got {sections!r}.")
    return replace(sections, interleaved=False)


def mrope_as_1d(sections: MultiAxis) -> MultiAxis:
    """M-RoPE read as plain 1D RoPE (llama.cpp#19443: NEOX where IMROPE is due): every pair driven by the first
    (temporal) axis."""
    if not isinstance(sections, MultiAxis) or sections.axial or sections.n_axes < 2:
        raise ValueError(f"mrope_as_1d needs an M-RoPE MultiAxis with two or more axes, got {sections!r}.")
    return MultiAxis((sum(sections.sections),) + (0,) * (sections.n_axes - 1))


# The classes the JSON's reports belong to, and the spec map reproducing each.
BUG_CLASSES: dict[str, Callable] = {
    "partial_rotary_dropped": drop_partial_rotary,
    "partial_rotary_imposed": impose_partial_rotary,
    "neox_read_as_interleaved": neox_as_interleaved,
    "rope_scaling_ignored": ignore_rope_scaling,
    "mrope_interleaved_as_other": mrope_as_contiguous,
    "longrope_switch_wrong": longrope_always_long,
    "yarn_attention_factor_dropped": drop_yarn_attention_factor,
    "yarn_settings_dropped": ignore_rope_scaling,
}
REPORTED_CLASSES = frozenset(BUG_CLASSES)


def per_layer(bug: Callable[[RopeSpec], RopeSpec], specs: Sequence[RopeSpec],
              layers: Sequence[int] | None = None) -> tuple[RopeSpec, ...]:
    """The per-layer specs with ``bug`` applied to the layers in ``layers`` (default all), the rest as they are."""
    specs = tuple(specs)
    if not specs or not all(isinstance(s, RopeSpec) for s in specs):
        raise ValueError("specs must be a non-empty sequence of RopeSpec, one per layer.")
    chosen = range(len(specs)) if layers is None else layers
    bad = [i for i in chosen if not isinstance(i, int) or not 0 <= i < len(specs)]
    if bad:
        raise ValueError(f"layers {bad} are not layers of a {len(specs)}-layer model (0 to {len(specs) - 1}).")
    chosen = set(chosen)
    return tuple(bug(s) if i in chosen else s for i, s in enumerate(specs))


# ------------------------------------------------------------------------------------------------------------
# The model run with one spec per layer, and the damage measures
# ------------------------------------------------------------------------------------------------------------


class _Run(NamedTuple):
    logits: torch.Tensor  # [b, s, vocab]
    scores: list[torch.Tensor]  # per layer, the unscaled attention logits q . k [b, h, s, s]


def _rotate(t: torch.Tensor, positions: torch.Tensor, spec: RopeSpec, sections: MultiAxis | None) -> torch.Tensor:
    if sections is None:
        return apply_rope(t, positions, layout="b h s d", spec=spec)
    # sections= takes the spec's keywords (no max_position_embeddings: multi-axis RoPE has no length-dependent type)
    return apply_rope(t, positions, layout="b h s d", style=spec.style, base=spec.base, rotary_dim=spec.rotary_dim,
                      rope_scaling=None if spec.scaling is None else dict(spec.scaling), sections=sections)


@torch.no_grad()
def forward_per_layer(model, ids: torch.Tensor, specs: Sequence[RopeSpec], positions: torch.Tensor | None = None,
                      sections: Sequence[MultiAxis | None] | None = None) -> _Run:
    """TinyLM's forward (``TinyLM.forward_with_attention``'s computation) with layer i rotating by ``specs[i]``,
    driven through :class:`ropelab.adapters.TinyLMAdapter`; ``sections[i]`` (multi-axis positions [A, s]) for
    M-RoPE layers. Returns the logits and every layer's attention logits q . k."""
    ad = TinyLMAdapter(model)
    specs = tuple(specs)
    if len(specs) != ad.n_layers:
        raise ValueError(f"give one spec per layer: the model has {ad.n_layers} layers, got {len(specs)} specs.")
    sections = (None,) * ad.n_layers if sections is None else tuple(sections)
    if len(sections) != ad.n_layers:
        raise ValueError(f"sections must have one entry (a MultiAxis or None) per layer ({ad.n_layers}).")
    s = ids.shape[1]
    if positions is None:
        positions = torch.arange(s)
    h, scores = ad.embed(ids), []
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(ad.n_layers):
        q, k, v = ad.layer_qkv(i, h)
        q, k = (_rotate(t, positions, specs[i], sections[i]) for t in (q, k))
        qk = q @ k.transpose(-1, -2)
        scores.append(qk)
        attn = (qk / math.sqrt(ad.head_dim)).masked_fill(~mask, float("-inf")).softmax(-1)
        h = ad.layer_out(i, h, attn @ v)
    return _Run(ad.head(h), scores)


class Damage(NamedTuple):
    """What a bug costs, correct vs buggy: ``kl`` mean KL(correct || buggy) in nats (of next-byte distributions,
    or of attention rows for a q/k-level measure), ``kl_max`` its largest value at one position, ``cosine`` the
    smallest cosine between correct and buggy attention logits (over layers or heads), ``first_flip`` the first
    position where the argmax changes (None: nowhere), ``flip_rate`` the fraction of positions where it does."""

    kl: float
    kl_max: float
    cosine: float
    first_flip: int | None
    flip_rate: float


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def _flips(a: torch.Tensor, b: torch.Tensor) -> tuple[int | None, float]:
    """(first position where the argmax of a and b differ, over the batch; fraction of positions where it does)
    for scores [..., s, n] whose second-to-last axis is the position."""
    differ = a.argmax(-1) != b.argmax(-1)  # [..., s]
    per_pos = differ.reshape(-1, differ.shape[-1]).any(0)
    idx = torch.nonzero(per_pos)
    return (int(idx[0]) if idx.numel() else None), float(differ.double().mean())


def model_damage(model, ids: torch.Tensor, correct: Sequence[RopeSpec], buggy: Sequence[RopeSpec]) -> Damage:
    """The damage of running ``model`` on token ids [b, s] with the per-layer specs ``buggy`` instead of
    ``correct``: next-byte KL, attention-logit cosine (worst layer), first greedy flip."""
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.dtype != torch.long:
        raise ValueError(f"ids must be a [batch, seq] LongTensor of token ids, got "
                         f"{getattr(ids, 'shape', type(ids).__name__)} {getattr(ids, 'dtype', '')}.")
    good, bad = forward_per_layer(model, ids, correct), forward_per_layer(model, ids, buggy)
    kl = kl_divergence(good.logits, bad.logits)
    mask = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
    cos = min(_cosine(g[..., mask], b[..., mask]) for g, b in zip(good.scores, bad.scores))
    first, rate = _flips(good.logits, bad.logits)
    return Damage(float(kl.mean()), float(kl.max()), cos, first, rate)


@torch.no_grad()
def qk_damage(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, correct: RopeSpec, buggy: RopeSpec,
              sections: MultiAxis | None = None, buggy_sections: MultiAxis | None = None) -> Damage:
    """The damage of one layer's rotation alone, on its q, k [b, h, s, d] (before RoPE): correct vs buggy
    attention logits (their cosine, worst head), causal attention rows (KL), and the first query whose
    most-attended key changes. ``sections`` / ``buggy_sections`` for multi-axis positions [A, s]."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be a [batch, heads, seq, head_dim] tensor, got "
                             f"{getattr(t, 'shape', type(t).__name__)}.")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have one shape (one head each), got {tuple(q.shape)} and {tuple(k.shape)}.")
    s, d = q.shape[2], q.shape[3]
    mask = torch.ones(s, s, dtype=torch.bool).tril()

    def scores(spec, sec):
        qr, kr = (_rotate(t.double(), positions, spec, sec) for t in (q, k))
        return qr @ kr.transpose(-1, -2)

    good, bad = scores(correct, sections), scores(buggy, buggy_sections)
    cos = min(_cosine(good[:, h][..., mask], bad[:, h][..., mask]) for h in range(q.shape[1]))

    def masked(x):
        return (x / math.sqrt(d)).masked_fill(~mask, float("-inf"))

    kl = kl_divergence(masked(good), masked(bad))  # masked keys have p = 0: their terms are 0
    first, rate = _flips(masked(good).log_softmax(-1), masked(bad).log_softmax(-1))
    return Damage(float(kl.mean()), float(kl.max()), cos, first, rate)


def _nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-window mean negative log-likelihood (nats/byte) of the true next byte, [b]."""
    logp = logits[:, :-1].double().log_softmax(-1)
    return -logp.gather(-1, ids[:, 1:, None])[..., 0].mean(-1)


@torch.no_grad()
def window_damage(model, ids: torch.Tensor, correct: Sequence[RopeSpec], buggy: Sequence[RopeSpec]) -> dict:
    r""":func:`model_damage`'s measures window by window (each row of ``ids`` alone), and what the bug costs in
    the loss on the true next byte: :math:`\Delta\mathrm{NLL} = \mathrm{NLL}_{\rm buggy} -
    \mathrm{NLL}_{\rm correct}` (nats/byte, teacher-forced). Lists with one value per window: ``kl``, ``flip_rate``
    (teacher-forced argmax changes), ``first_flip`` (None: none in that window), ``dnll``."""
    out: dict[str, list] = {"kl": [], "flip_rate": [], "first_flip": [], "dnll": []}
    for i in range(ids.shape[0]):
        w = ids[i:i + 1]
        good, bad = forward_per_layer(model, w, correct), forward_per_layer(model, w, buggy)
        first, rate = _flips(good.logits, bad.logits)
        out["kl"].append(float(kl_divergence(good.logits, bad.logits).mean()))
        out["flip_rate"].append(rate)
        out["first_flip"].append(first)
        out["dnll"].append(float(_nll(bad.logits, w) - _nll(good.logits, w)))
    return out


def spread(values: Sequence[float | None], *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Summary of a per-window measure: ``median``, ``lo`` / ``hi`` (the smallest and largest window), ``mean``
    and its 95 % bootstrap interval over windows ``ci`` (``n_boot`` resamples, seeded: the same on a rerun), and
    ``missing`` (windows with None, e.g. no argmax change there, left out)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        raise ValueError("spread needs at least one value that is not None.")
    t = torch.tensor(vals, dtype=torch.float64)
    idx = torch.randint(0, len(vals), (n_boot, len(vals)), generator=torch.Generator().manual_seed(seed))
    means = t[idx].mean(1)
    return {"median": float(t.median()), "lo": float(t.min()), "hi": float(t.max()), "mean": float(t.mean()),
            "ci": (float(means.quantile(0.025)), float(means.quantile(0.975))),
            "missing": len(values) - len(vals), "n": len(values)}


# ------------------------------------------------------------------------------------------------------------
# The cases notebook 10 runs: which model, which correct spec, which bug, which measure
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One bug class reproduced: ``checkpoint`` (under data/lm) and the ``length`` of its windows; ``correct``
    builds the correct per-layer specs from the model; ``bug`` maps a spec (or a MultiAxis for M-RoPE) to the
    buggy one; ``measure`` 'model' (full forward) or 'qk' (one layer's q, k); ``what`` one line for the figure."""

    bug_class: str
    checkpoint: str
    length: int
    bug: Callable
    measure: str
    what: str
    correct: Callable[[Any], tuple[RopeSpec, ...]] = lambda model: (model.cfg.rope,) * model.cfg.n_layers


def longrope_specs(model) -> tuple[RopeSpec, ...]:
    """The probe model's LongRoPE at s = 4 (notebook 07's searched factors, data/lm/longrope_factors.json)."""
    f = json.loads((DATA_DIR / "lm" / "longrope_factors.json").read_text(encoding="utf-8"))
    spec = replace(model.cfg.rope, max_position_embeddings=int(f["scale"] * f["L0"]), scaling={
        "rope_type": "longrope", "factor": f["scale"], "original_max_position_embeddings": f["L0"],
        "long_factor": f["long_factor"], "short_factor": f["short_factor"]})
    return (spec,) * model.cfg.n_layers


def partial_specs(model) -> tuple[RopeSpec, ...]:
    """The model's RoPE with half of each head rotating (the correct spec of the partial-rotary-dropped case)."""
    return (replace(model.cfg.rope, rotary_dim=model.cfg.head_dim // 2),) * model.cfg.n_layers


# Qwen3-VL's interleaved sections [24, 20, 20] (64 pairs) brought to the TinyLM's 16 pairs.
MROPE_SECTIONS = MultiAxis.mrope((6, 5, 5), interleaved=True)

CASES: dict[str, Case] = {
    "neox_read_as_interleaved": Case(
        "neox_read_as_interleaved", "tinylm_rope_L256.pt", 256, neox_as_interleaved, "model",
        "NeoX pairs rotated as interleaved, every layer (sglang#30111, ik_llama.cpp#2290)"),
    "partial_rotary_imposed": Case(
        "partial_rotary_imposed", "tinylm_rope_L256.pt", 256, lambda s: impose_partial_rotary(s, 16), "model",
        "half the head rotated where all of it should (vllm#41185)"),
    "partial_rotary_dropped": Case(
        "partial_rotary_dropped", "tinylm_rope_L256.pt", 256, drop_partial_rotary, "qk",
        "rotary_dim 16 of 32 dropped: the whole head rotated (mlx-lm#1698), layer 0's q, k",
        correct=partial_specs),
    "rope_scaling_ignored": Case(
        "rope_scaling_ignored", "tinylm_probe_ft512_pi.pt", 512, ignore_rope_scaling, "model",
        "linear (PI) s = 2 the model was tuned with, ignored (mlx-vlm#1709)"),
    "yarn_settings_dropped": Case(
        "yarn_settings_dropped", "tinylm_probe_ft512_yarn.pt", 512, ignore_rope_scaling, "model",
        "yarn s = 2 the model was tuned with, written to no key (llama.cpp#13322)"),
    "yarn_attention_factor_dropped": Case(
        "yarn_attention_factor_dropped", "tinylm_probe_ft512_yarn.pt", 512, drop_yarn_attention_factor, "model",
        "yarn's attention factor cancelled to 1, frequencies kept (llama.cpp#22612)"),
    "longrope_switch_wrong": Case(
        "longrope_switch_wrong", "tinylm_probe_L256.pt", 256, longrope_always_long, "model",
        "LongRoPE's long factors at a length within L0 (mlx-lm#660)", correct=longrope_specs),
    "mrope_interleaved_as_other": Case(
        "mrope_interleaved_as_other", "tinylm_rope_L256.pt", 0, mrope_as_contiguous, "qk",
        "interleaved M-RoPE read contiguous (MNN#4133), text + 8x8 image + text, layer 0's q, k"),
}


def held_out_windows(length: int, n: int) -> torch.Tensor:
    """``n`` evenly spaced windows of ``length`` bytes from the corpus' validation split (``lm.val_windows``)."""
    from ..lm import load_corpus, val_windows

    _, val = load_corpus()
    return val_windows(val, n, length - 1)  # length bytes in, next-byte targets unused


def load_model(checkpoint: str):
    """A TinyLM checkpoint under ``data/lm`` (float32, eval mode)."""
    from ..models import load_checkpoint

    model = load_checkpoint(DATA_DIR / "lm" / checkpoint).float().eval()
    return model


@torch.no_grad()
def run_case(name: str, *, smoke: bool = False, n_windows: int | None = None) -> dict:
    """Run one of :data:`CASES` on held-out windows (16, or 2 in smoke mode); the damage of the bug pooled over the
    windows and, as the control, of :func:`identity`; ``per_window`` the same measures window by window (model
    cases also :math:`\\Delta`NLL, :func:`window_damage`), for their spread. Deterministic: the windows are fixed
    slices of the validation split."""
    if name not in CASES:
        raise ValueError(f"no case {name!r}; the cases are {sorted(CASES)}.")
    case = CASES[name]
    n = n_windows or (2 if smoke else 16)
    model = load_model(case.checkpoint)
    if case.measure == "model":
        ids = held_out_windows(case.length, n)
        correct = case.correct(model)
        buggy = per_layer(case.bug, correct)
        dmg = model_damage(model, ids, correct, buggy)
        control = model_damage(model, ids, correct, per_layer(identity, correct))
        return {"case": name, "measure": "model", "what": case.what, "windows": n, "length": ids.shape[1],
                "correct": correct[0].to_dict(), "buggy": buggy[0].to_dict(), "damage": dmg._asdict(),
                "control": control._asdict(), "per_window": window_damage(model, ids, correct, buggy)}
    if name == "mrope_interleaved_as_other":
        text = 24 if smoke else 64
        positions = mrope_positions(text, (1, 8, 8), text)
        ids = held_out_windows(positions.shape[1], n)
    else:
        positions = None
        ids = held_out_windows(case.length, n)
    q, k, _ = TinyLMAdapter(model).layer_qkv(0, model.embed(ids))
    if positions is None:
        positions = torch.arange(ids.shape[1])
        correct = case.correct(model)[0]
        dmg = qk_damage(q, k, positions, correct, case.bug(correct))
        control = qk_damage(q, k, positions, correct, identity(correct))
        per = [qk_damage(q[i:i + 1], k[i:i + 1], positions, correct, case.bug(correct)) for i in range(n)]
        extra = {"correct": correct.to_dict(), "buggy": case.bug(correct).to_dict()}
    else:
        spec, sec = model.cfg.rope, MROPE_SECTIONS
        dmg = qk_damage(q, k, positions, spec, spec, sec, case.bug(sec))
        control = qk_damage(q, k, positions, spec, spec, sec, sec)
        per = [qk_damage(q[i:i + 1], k[i:i + 1], positions, spec, spec, sec, case.bug(sec)) for i in range(n)]
        as_1d = qk_damage(q, k, positions, spec, spec, sec, mrope_as_1d(sec))
        text_only = mrope_positions(positions.shape[1])
        on_text = qk_damage(q, k, text_only, spec, spec, sec, case.bug(sec))
        extra = {"sections": list(sec.sections), "as_1d": as_1d._asdict(), "text_only": on_text._asdict()}
    return {"case": name, "measure": "qk", "what": case.what, "windows": n, "length": ids.shape[1],
            "damage": dmg._asdict(), "control": control._asdict(),
            "per_window": {"kl": [d.kl for d in per], "flip_rate": [d.flip_rate for d in per],
                           "first_flip": [d.first_flip for d in per]}, **extra}


def run_all(*, smoke: bool = False, names: Sequence[str] | None = None) -> dict[str, dict]:
    """:func:`run_case` for every case (or those in ``names``), in :data:`CASES`' order."""
    names = list(CASES) if names is None else list(names)
    return {name: run_case(name, smoke=smoke) for name in names}


# Okabe-Ito's colour-blind-safe pair (blue, orange); every colour also has a marker or hatch that says the same.
BLUE, ORANGE, GREY = "#0072B2", "#E69F00", "#999999"


def _dot_panel(ax, results: Mapping[str, dict], names: Sequence[str], key: str, xlabel: str, log: bool,
               fmt: str) -> None:
    """One measure on one axis: each window a small open circle (blue), the median an orange diamond with its
    value written beside it, cases top to bottom."""
    for i, n in enumerate(names):
        vals = results[n]["per_window"][key]
        vals = [max(v, 1e-6) if log else v for v in vals]
        ax.plot(vals, [i] * len(vals), "o", mfc="none", mec=BLUE, ms=4, alpha=0.8)
        med = spread(vals)["median"]
        ax.plot([med], [i], "D", color=ORANGE, mec="black", ms=6)
        ax.annotate(format(med, fmt), (med, i), xytext=(0, 6), textcoords="offset points", ha="center",
                    fontsize=7)
    ax.set(xlabel=xlabel, yticks=range(len(names)), yticklabels=names, ylim=(len(names) - 0.5, -0.7))
    if log:
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(axis="x", alpha=0.3)


def plot_damage(fig, axes, results: Mapping[str, dict]) -> None:
    """Four panels (``axes``, 2 x 2), one measure each, over the held-out windows (open circles: one window;
    diamond: the median, its value written): the model cases' next-byte KL, their loss change on the true next
    byte (Delta NLL), their teacher-forced argmax-change rate, and, apart, the q/k cases' attention-row KL."""
    model = [n for n in results if results[n]["measure"] == "model"]
    qk = [n for n in results if results[n]["measure"] == "qk"]
    (a, b), (c, d) = axes
    _dot_panel(a, results, model, "kl", "next-byte KL(correct || buggy), nats (log)", True, ".3g")
    _dot_panel(b, results, model, "dnll", "NLL(buggy) - NLL(correct) of the true next byte, nats/byte", False,
               ".3f")
    b.axvline(0, color=GREY, lw=0.8)
    _dot_panel(c, results, model, "flip_rate", "teacher-forced argmax changes, fraction of positions", False,
               ".1%")
    c.set_xlim(0, 1)
    _dot_panel(d, results, qk, "kl", "attention-row KL on layer 0's q, k, nats (log)", True, ".3g")
    for ax, t in zip((a, b, c, d), ("(a) whole model", "(b) whole model", "(c) whole model",
                                   "(d) one layer's q, k (not comparable with a-c)")):
        ax.set_title(t, fontsize=9, loc="left")
    n = results[model[0]]["windows"] if model else results[qk[0]]["windows"]
    fig.suptitle(f"Each boundary bug reproduced on a trained byte-level TinyLM, {n} held-out windows "
                 "(open circle: one window; diamond: median). Identity control: 0 on every measure", fontsize=10)


# ------------------------------------------------------------------------------------------------------------
# ropelab-check catching each bug: the correct tiny model, the buggy reading written out, the real CLI
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckCase:
    """One bug class as a file an engine reads: the tiny family it applies to (``ropelab.engines.tiny``), the
    bug (on every layer's spec, or on the M-RoPE sections when ``on_sections``), and how the buggy reading is
    written: ``gguf_arch`` a GGUF file of that llama.cpp architecture (:func:`ropelab.engines.gguf.write_gguf`),
    None a transformers ``config.json`` (:func:`ropelab.engines.hf.write_config`). ``control_arch`` is where the
    identity control is written (the family's own GGUF architecture, None: a config.json). ``position`` is the
    ``--position`` of the costs (None: the CLI's default, ``max_position_embeddings - 1``)."""

    bug_class: str
    family: str
    bug: Callable
    gguf_arch: str | None
    control_arch: str | None
    what: str
    on_sections: bool = False
    position: int | None = None


CHECK_CASES: dict[str, CheckCase] = {
    "partial_rotary_dropped": CheckCase(
        "partial_rotary_dropped", "phi3", drop_partial_rotary, "phi3", "phi3",
        "Phi-3 (12 of 16 dims rotate) written as a GGUF whose rope.dimension_count is the whole head"),
    "partial_rotary_imposed": CheckCase(
        "partial_rotary_imposed", "qwen2", lambda s: impose_partial_rotary(s, 8), "qwen2", "qwen2",
        "Qwen2 (full rotary) written as a GGUF with rope.dimension_count 8 of 16"),
    "neox_read_as_interleaved": CheckCase(
        "neox_read_as_interleaved", "qwen2", neox_as_interleaved, "command-r", "qwen2",
        "Qwen2's unpermuted NeoX q/k in a GGUF of a NORM architecture the converter does not permute for "
        "(command-r), ik_llama.cpp#2290's NEOX returned as NORM"),
    "rope_scaling_ignored": CheckCase(
        "rope_scaling_ignored", "llama3", ignore_rope_scaling, "llama", "llama",
        "Llama 3's scaling dropped: a llama GGUF without its rope_freqs tensor"),
    "yarn_settings_dropped": CheckCase(
        "yarn_settings_dropped", "qwen2_yarn", ignore_rope_scaling, "qwen2", "qwen2",
        "Qwen2 yarn written to no key (llama.cpp#13322): a qwen2 GGUF without rope.scaling.*"),
    "yarn_attention_factor_dropped": CheckCase(
        "yarn_attention_factor_dropped", "qwen2_yarn", drop_yarn_attention_factor, "qwen2", "qwen2",
        "Qwen2 yarn with its attention factor cancelled to 1: a qwen2 GGUF whose rope.scaling.attn_factor is "
        "1 / (0.1 ln s + 1) (llama.cpp multiplies it into the default)"),
    "longrope_switch_wrong": CheckCase(
        "longrope_switch_wrong", "phi3_longrope", longrope_always_long, "phi3", None,
        "Phi-3 longrope with the long factors at every length: a phi3 GGUF whose rope_freqs is the long set "
        "(costed at position 63, below the original length 64, where the switch matters); the correct model has two "
        "factor sets, which ropelab's GGUF writer does not write, so its control is a config.json", position=63),
    "mrope_interleaved_as_other": CheckCase(
        "mrope_interleaved_as_other", "qwen3_vl", mrope_as_contiguous, "qwen2vl", "qwen3vl",
        "Qwen3-VL's interleaved sections written as a qwen2vl GGUF (MROPE, contiguous sections)", on_sections=True),
}


def _stored(specs: Sequence[RopeSpec], arch: str, converter_permutes: bool) -> tuple[RopeSpec, ...]:
    """The specs in the coordinates of q/k as a GGUF of ``arch`` stores them: llama.cpp's converter permutes q/k
    of a NORM architecture it permutes for, so NeoX pairs are written as NORM (interleaved) there."""
    if not converter_permutes:
        return tuple(specs)
    flip = {"half": "interleaved", "interleaved": "half"}
    return tuple(s if s.is_nope else replace(s, style=flip[s.style]) for s in specs)


def write_reading(reading, out: str | Path, arch: str | None, base_config: Mapping[str, Any] | None) -> Path:
    """Write ``reading`` (a :class:`ropelab.engines.Reading`, specs as the model runs them) where an engine reads it:
    a GGUF of llama.cpp architecture ``arch`` under ``out`` (q/k taken as the converter stores them for that
    architecture), or with ``arch=None`` a transformers ``config.json`` over ``base_config``. Returns the file."""
    from ..engines import gguf, hf
    from ..engines import llamacpp_table as table

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if arch is None:
        path = out / "config.json"
        path.write_text(json.dumps(hf.write_config(reading, base_config), indent=2) + "\n")
        return path
    permutes = gguf.rope_type_of(arch) == "NORM" and any(table.ARCHS[arch]["converter"].values())
    specs = _stored(reading.effective_specs(), arch, permutes)
    return gguf.write_gguf(specs, out / f"{arch}.gguf", architecture=arch, head_dim=reading.head_dim,
                           sections=reading.sections)


def write_bug(name: str, root: str | Path, *, control: bool = False) -> tuple[Path, Path]:
    """For :data:`CHECK_CASES` ``name``: the correct tiny model saved under ``root/name/model`` and the buggy
    reading written (``control``: the identity, under ``root/name/control``); ``(model dir, written file)``."""
    from ..engines import hf, tiny

    if name not in CHECK_CASES:
        raise ValueError(f"no check case {name!r}; the cases are {sorted(CHECK_CASES)}.")
    c = CHECK_CASES[name]
    root = Path(root) / name
    model_dir = root / "model"
    if not (model_dir / "config.json").is_file():
        tiny.save_tiny_model(c.family, model_dir)
    correct = hf.read_config(model_dir)
    if control:
        buggy = correct
    elif c.on_sections:
        buggy = replace(correct, sections=c.bug(correct.sections))
    else:
        buggy = replace(correct, layers=per_layer(c.bug, correct.effective_specs()), qk_permuted=False)
    arch = c.control_arch if control else c.gguf_arch
    return model_dir, write_reading(buggy, root / ("control" if control else "buggy"), arch,
                                    tiny.config_dict(model_dir))


def run_check(paths: Sequence[str | Path], *, position: int | None = None, timeout: float = 300) -> dict:
    """The real ``ropelab-check`` (``python -m ropelab.engines PATH ... --json [--position P]``) as a subprocess:
    ``{"exit_code", "result"}`` with its parsed JSON output."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])  # the checkout ropelab is imported from
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    extra = [] if position is None else ["--position", str(position)]
    proc = subprocess.run([sys.executable, "-m", "ropelab.engines", *map(str, paths), "--json", *extra],
                          capture_output=True, text=True, timeout=timeout, env=env)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"ropelab-check printed no JSON (exit {proc.returncode}):\n{proc.stderr[-2000:]}") from e
    return {"exit_code": proc.returncode, "result": result}


def catch_bug(name: str, root: str | Path, *, control: bool = False) -> dict:
    """Write :data:`CHECK_CASES` ``name`` (:func:`write_bug`) and run ``ropelab-check model_dir written --json``:
    ``{"case", "family", "what", "file" (its name), "exit_code", "kinds", "details", "phase_error", "max_kl",
    "max_abs_dprob", "position"}`` (the first mismatch's; empty lists and None when it agrees)."""
    model_dir, written = write_bug(name, root, control=control)
    out = run_check([model_dir, written], position=CHECK_CASES[name].position)
    res = out["result"]
    mm = res.get("mismatches") or []
    first = mm[0] if mm else None
    return {"case": name, "family": CHECK_CASES[name].family, "what": CHECK_CASES[name].what,
            "file": f"{written.parent.name}/{written.name}", "exit_code": out["exit_code"],
            "kinds": sorted({k for m in mm for k in m["kinds"]}), "details": [d for m in mm for d in m["details"]],
            "layers": [m["layers"] for m in mm], "position": res.get("position"),
            "phase_error": None if first is None else first["cost"]["phase_error"],
            "max_kl": None if first is None else first["cost"]["max_kl"],
            "max_abs_dprob": None if first is None else first["cost"]["max_abs_dprob"],
            "problems": [p["problem"] for p in res.get("problems") or []]}


def catch_all(root: str | Path, names: Sequence[str] | None = None) -> dict[str, dict]:
    """:func:`catch_bug` for every check case (or ``names``), and its identity control under ``"control"``:
    ``{name: {**bug, "control": {...}}}``."""
    names = list(CHECK_CASES) if names is None else list(names)
    return {n: {**catch_bug(n, root), "control": catch_bug(n, root, control=True)} for n in names}


# ------------------------------------------------------------------------------------------------------------
# The conformance matrix (ropelab.engines.matrix, data/engines/matrix.json), as notebook 10 shows it
# ------------------------------------------------------------------------------------------------------------

# agree: blue, plain; differ: orange, hatched, a cross; unreadable / unclear: grey, dotted (Okabe-Ito-like, and a
# cue without colour).
_STATUS_STYLE = {"agree": ("#9ecae1", "", "\u2713"), "differ": ("#f9c97a", "/", "\u2717"),
                 "unreadable": ("#dddddd", "..", "\u2013"), "unclear": ("#dddddd", "..", "?")}
_ENGINE_LABEL = {"gguf": "llama.cpp, run on the GGUF\nits converter wrote",
                 "mlx": "mlx-lm, its model\nbuilt from config.json", "vllm": "vLLM, its model\nbuilt from config.json"}
_ENGINE_SHORT = {"gguf": "llama.cpp", "mlx": "mlx-lm", "vllm": "vLLM"}  # the engines' own names, for the title


def engine_label(engine: str) -> str:
    """A column's header: what the engine is and how its cells were obtained (the key itself when unknown)."""
    return _ENGINE_LABEL.get(engine, engine)


def cell_words(c: Mapping[str, Any]) -> str:
    """One matrix cell in a few words: a symbol and the status, and for a difference what differs and its size:
    the llama.cpp run's largest logit error in float32 bounds where the cell has a run, else the kinds of mismatch."""
    sym = _STATUS_STYLE.get(c["status"], _STATUS_STYLE["unclear"])[2]
    if c["status"] != "differ":
        return f"{sym} {'refuses' if c['status'] == 'unreadable' else c['status']}"  # the title's word for it
    kinds = sorted({k for m in c.get("mismatches", []) for k in m["kinds"]}) or ["problem"]
    run = c.get("run")
    size = f"logits off by {run['ratio']:.3g}x bound" if run else f"at m = {c['position']}"
    return f"{sym} {', '.join(kinds)}\n{size}"


def non_agree(matrix: Mapping[str, Any]) -> list[tuple[str, str, dict]]:
    """``(row, engine, cell)`` of every cell that is not ``agree``, in the matrix's order."""
    return [(name, e, row[e]) for name, row in matrix["rows"].items() for e in matrix["engines"]
            if row[e]["status"] != "agree"]


def plot_matrix(fig, ax, matrix: Mapping[str, Any]) -> None:
    """The matrix as a table (``ax``): one row per family / variant (variants in italics), one column per engine the
    file has, each cell :func:`cell_words` on blue (agree), hatched orange (differ) or dotted grey (unreadable)."""
    import textwrap

    names, engines = list(matrix["rows"]), list(matrix["engines"])
    text = [[n] + [cell_words(matrix["rows"][n][e]) for e in engines] for n in names]
    style = [[("white", "", "")] + [_STATUS_STYLE.get(matrix["rows"][n][e]["status"], _STATUS_STYLE["unclear"])
                                    for e in engines] for n in names]
    ax.axis("off")
    width = 0.7 / len(engines)
    table = ax.table(cellText=text, cellColours=[[st[0] for st in row] for row in style],
                     colLabels=["family / variant"] + [engine_label(e) for e in engines], cellLoc="center",
                     colWidths=[0.3] + [width] * len(engines), bbox=[0.0, 0.0, 1.0, 1.0])
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for (r, col), cell_ in table.get_celld().items():
        if r > 0 and col > 0:
            cell_.set_hatch(style[r - 1][col][1])
            cell_.set_edgecolor("#555555")
        if col == 0 and r > 0 and names[r - 1] in matrix["variants"]:
            cell_.get_text().set_fontstyle("italic")
    v, c = matrix["versions"], matrix["counts"]
    versions = textwrap.fill(", ".join(f"{k} {str(val)[:12]}" for k, val in v.items()) + "; italic rows: variants",
                             150)
    fig.suptitle("Each engine against transformers (\u2713 agree, \u2717 differ, \u2013 refuses): " + "; ".join(
        f"{_ENGINE_SHORT.get(e, e)}: {c[e]['agree']} agree, {c[e]['differ']} differ, {c[e]['unreadable']} refuse"
        for e in engines)
        + "\n" + versions, fontsize=8)
    fig.subplots_adjust(top=1 - 0.75 / fig.get_figheight())  # the table just under the title's three lines
