r"""``ropelab-check PATH [PATH ...]``: the RoPE each source implies, per layer, side by side, and what every
disagreement costs.

Each PATH is a transformers ``config.json`` or model directory, a ``.gguf`` file, or an MLX model directory;
a prefix ``hf:`` / ``transformers:``, ``gguf:`` or ``mlx:`` forces the reader. Every source becomes a
:class:`~ropelab.engines.reading.Reading` (:data:`READERS`, one place that maps a format to its reader, imported
lazily), and the sources after the first are compared with the first, layer by layer, on their
:meth:`~ropelab.engines.reading.Reading.effective_specs` (so a GGUF's NORM rotation of q/k rows that
llama.cpp's converter permuted agrees with the original model's half pairing, with a note).

Two layers agree when they rotate the same pairs by the same angles with the same attention factor: same
style and rotary_dim, and inverse frequencies and attention factor equal within :data:`REL_TOL` (four float32
unit roundoffs, relative: GGUF stores its numbers in float32) at every length where a length-dependent type could
switch. Layers that agree but are declared differently (yarn's ``attention_factor`` given vs derived) agree.

What a mismatch costs, at the stated position m (``--position``, default the last trained position
``max_position_embeddings - 1``):

- the phase error :math:`\max_i |\theta^a_i - \theta^b_i|` in radians, unwrapped, with
  :math:`\theta_i = m\,\omega_i` (:math:`\max_i |\Delta\omega_i|\,m` for 1D RoPE; all of
  :math:`m\,\omega_i` against a NoPE layer; for two M-RoPE layouts, pair i at the token whose axis k sits at
  :math:`\lfloor m/(k+1)\rfloor`). Not defined when the two pair different dims (style or rotary_dim);
- the change in attention on a small model of that geometry: seeded random q, k (float64, ``--heads`` heads
  of the head dim) at ``--samples`` positions spread evenly over [0, m], rotated by each spec
  (:func:`ropelab.apply_rope`), causal attention rows over those positions (:mod:`ropelab.attention`):
  the largest KL divergence of a row, :math:`\max_m \mathrm{KL}(p^a_m \| p^b_m)`, and the largest change of one
  attention probability, :math:`\max |p^a - p^b|`.

With one PATH, the check is the source's internal consistency: :attr:`Reading.problems` (the reader's) and
:func:`consistency` (what holds for every format). Sources with a layer that has no frequencies for the head
are not compared.

``--ctx N`` is the context a user will allocate: llama.cpp picks Phi-3's LongRoPE factor set by it (the GGUF
reader's ``n_ctx``, :func:`ropelab.engines.gguf.read_gguf`), and no sequence is longer, so the frequencies are
compared only at lengths up to N and the default position is ``min(max_position_embeddings, N) - 1``.

``--run`` (one PATH, a transformers ``config.json``; ``--engines llamacpp,vllm,mlx``, default all): the engines
themselves run a tiny random-weight model of the config's architecture (RoPE keys, layer pattern and head geometry
kept) beside transformers' float64 forward of the same weights, and each engine's verdict is agree / differ /
unclear (its float32 logits within :func:`ropelab.engines.parity.logit_bound`; per layer, where the engine's q/k
after RoPE can be seen: llama.cpp, mlx-lm and vLLM), refused, failed or not installed (with its make target).
Exit 0 when every engine that ran agrees, 1 when one differs, is unclear or failed, 2 when none could run. See
:mod:`ropelab.engines.check_run`.

Exit codes: 0 all sources agree (and none has a problem), 1 a mismatch or a problem, 2 a usage error or a
source that cannot be read (one line on stderr naming it; never a traceback). ``--json`` prints the result as
JSON for other tools; ``--write-config OUT`` writes the first source's RoPE as a transformers config, over the
config of the first transformers source after it (else the first source's own config, when it is one): the other
source's config, fixed (``--schema v5`` or ``v4``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..attention import causal_logits, kl_divergence
from ..core import parse_layout
from ..multiaxis import MultiAxis, multiaxis_rope
from ..precision import UNIT_ROUNDOFF
from ..rope import apply_rope
from ..scaling import LENGTH_DEPENDENT, ROPE_TYPES, parse_scaling
from ..spec import RopeSpec
from .reading import FORMATS, ReadError, Reading

__all__ = ["READERS", "PREFIXES", "REL_TOL", "read", "detect", "compare_layers", "cost", "consistency", "check",
           "render", "main"]

# format -> (module, function): the one place a format finds its reader (imported only when a source needs it).
READERS: dict[str, tuple[str, str]] = {
    "transformers": ("ropelab.engines.hf", "read_config"),
    "gguf": ("ropelab.engines.gguf", "read_gguf"),
    "mlx": ("ropelab.engines.mlx", "read_mlx"),
    "vllm": ("ropelab.engines.vllm", "read_vllm"),
}
# PATH prefixes that force a reader.
PREFIXES = {"hf": "transformers", "transformers": "transformers", "gguf": "gguf", "mlx": "mlx", "vllm": "vllm"}
# Two frequencies (or attention factors) agree within this relative difference: GGUF stores float32.
REL_TOL = 4 * UNIT_ROUNDOFF[torch.float32]


# The largest --position: the cost's positions are float64 (exact integers up to 2^53) and int64 tensors.
MAX_POSITION = 2 ** 53
# The memory the attention cost may take: ropelab-check runs in other people's CI next to their jobs, so it is
# bounded whatever --heads, --samples or a source's head_dim say (the contract: under 1 GiB in all).
COST_BYTES = 256 * 2 ** 20
# A list longer than this is summarised in --json (its length, min, max, first and last values), never echoed per
# layer: longer than any rope factor list of a head of up to 1024 dims.
ECHO_MAX = 512


class UsageError(Exception):
    """A mistake on the command line or a source that cannot be read (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, so that --json gets its JSON error too."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(f"{message} (see --help)")


def cost_bytes(head_dim: int, heads: int, samples: int) -> int:
    """An upper estimate of the float64 memory :func:`cost` takes: q, k and their rotations by two specs
    (with apply_rope's temporaries, 16 copies of [samples, heads, head_dim]) and the two specs' logits, softmax and
    differences (8 copies of [heads, samples, samples])."""
    return 8 * (16 * samples * heads * head_dim + 8 * heads * samples * samples)


def _max_under(f: Callable[[int], int], lo: int) -> int:
    """The largest v >= lo with f(v) <= COST_BYTES (f increasing), or lo - 1 when f(lo) is over."""
    if f(lo) > COST_BYTES:
        return lo - 1
    hi = lo
    while f(hi * 2) <= COST_BYTES:
        hi *= 2
    top = hi * 2
    while top - hi > 1:
        mid = (hi + top) // 2
        hi, top = (mid, top) if f(mid) <= COST_BYTES else (hi, mid)
    return hi


def _check_budget(readings: Sequence[Reading], heads: int, samples: int, position: int) -> None:
    """UsageError with the ranges that fit :data:`COST_BYTES`, when --heads, --samples or a head_dim do not."""
    n = min(samples, position + 1)
    for r in readings:
        d = r.head_dim
        if cost_bytes(d, heads, n) <= COST_BYTES:
            continue
        if cost_bytes(d, 1, 2) > COST_BYTES:
            raise UsageError(f"{_clip(r.source)}: head_dim {d} is too large to check within {COST_BYTES >> 20} MiB "
                             f"(the attention cost alone needs {cost_bytes(d, 1, 2) >> 20} MiB at one head and two "
                             "positions); it is not a real model's head dim.")
        h_max = _max_under(lambda h, d=d: cost_bytes(d, h, n), 1)
        s_max = _max_under(lambda m, d=d: cost_bytes(d, heads, m), 2)
        parts = [f"--heads in 1..{h_max}"] if h_max >= 1 else []
        parts += [f"--samples in 2..{s_max}"] if s_max >= 2 else []
        raise UsageError(f"--heads {heads} and --samples {samples} at head_dim {d} need "
                         f"{cost_bytes(d, heads, n) >> 20} MiB for the attention cost, over ropelab-check's "
                         f"{COST_BYTES >> 20} MiB; use {' or '.join(parts) or 'fewer heads and samples'}.")


# --------------------------------------------------------------------------------------------------
# Reading a PATH
# --------------------------------------------------------------------------------------------------

# The engines --run knows (ropelab.engines.check_run.ENGINES; named here so that --help needs no import of it).
_RUN_ENGINES = ("llamacpp", "vllm", "mlx")
# A config.json larger than this is not a model config (--run reads it whole).
_MAX_CONFIG_BYTES = 16 << 20


def _reader(fmt: str, path: Path) -> Callable[[Path], Reading]:
    module, name = READERS[fmt]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ReadError(f"{path}: reading {fmt} needs {module}.{name}, which cannot be imported here ({e}); "
                        "install ropelab with its engines extra.") from e


def _is_mlx_dir(path: Path) -> bool:
    try:
        module = importlib.import_module(READERS["mlx"][0])
    except ImportError:
        return False
    probe = getattr(module, "is_mlx_model_dir", None)
    return bool(probe(path)) if probe is not None else False


def detect(text: str) -> tuple[str, Path]:
    """``(format, path)`` of one PATH argument: a forcing prefix, else the suffix, the GGUF magic, or what a
    directory holds (an MLX model directory, a ``config.json``, one ``.gguf`` file). ReadError otherwise.

    Args:
        text: the argument as typed: a path, or ``hf:`` / ``transformers:`` / ``gguf:`` / ``mlx:`` / ``vllm:``
            and a path.
    """
    fmt = None
    head, sep, tail = text.partition(":")
    if sep and head in PREFIXES:
        fmt, text = PREFIXES[head], tail
    try:
        path = Path(text)
        exists = path.exists()
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        raise ReadError(f"{_clip(text)}: cannot be a path here ({_os_words(e)}).") from None
    if not exists:
        raise ReadError(f"{_clip(text)}: no such file or directory.")
    if fmt is not None:
        return fmt, path
    if path.is_dir():
        if _is_mlx_dir(path):
            return "mlx", path
        if (path / "config.json").is_file():
            return "transformers", path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        what = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no config.json and no .gguf file"
        raise ReadError(f"{path}: a directory with {what}; give a model directory with a config.json, an MLX "
                        "model directory, or a .gguf file.")
    if path.suffix == ".gguf":
        return "gguf", path
    if path.suffix == ".json":
        return "transformers", path
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ReadError(f"{path}: cannot be read ({e}).") from e
    if magic == b"GGUF":
        return "gguf", path
    raise ReadError(f"{path}: neither a config.json, a .gguf file nor a model directory; prefix it with hf:, gguf: "
                    "or mlx: to say which it is.")


def _clip(text: str, limit: int = 300) -> str:
    """``text`` if short, else its start and end around the count of characters left out (a hostile path of
    5,000 characters, a message quoting a 50 MB list): one readable line."""
    text = str(text).replace("\n", " ")
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}...({len(text) - 2 * keep} characters)...{text[-keep:]}"


def _os_words(e: BaseException) -> str:
    return f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}"


def read(text: str, *, n_ctx: int | None = None) -> Reading:
    """The :class:`Reading` of one PATH argument (see :func:`detect`); ReadError for anything unreadable.
    ``n_ctx``: the context llama.cpp allocates, for a GGUF source (see :func:`ropelab.engines.gguf.read_gguf`).

    Every failure on the way is one ReadError naming the path: the reader's own, an OS error (a name too long, a
    permission), a recursion or memory error on a hostile file (JSON nested 100,000 deep), an overflow.

    Args:
        text: one PATH argument of ``ropelab-check``, as :func:`detect` takes it.
        n_ctx: the context llama.cpp allocates (``--ctx``); None for the file's own ``context_length``.
    """
    fmt = None
    try:
        fmt, path = detect(text)
        reader = _reader(fmt, path)
        reading = reader(path, n_ctx=n_ctx) if fmt == "gguf" and n_ctx is not None else reader(path)
    except ReadError as e:
        if _clip(text) in str(e) or (fmt is not None and str(path) in str(e)):
            raise
        raise ReadError(f"{_clip(text)}: {e}") from e
    except Exception as e:  # noqa: BLE001 - a crash on a malformed file (or path) is still an unreadable source
        what = f" as {fmt}" if fmt else ""
        raise ReadError(f"{_clip(text)}: cannot be read{what} ({type(e).__name__}: {_clip(str(e))}).") from None
    if not isinstance(reading, Reading) or reading.format not in FORMATS:
        raise ReadError(f"{path}: the {fmt} reader returned {type(reading).__name__}, not a Reading.")
    return reading


# --------------------------------------------------------------------------------------------------
# Comparing two layers
# --------------------------------------------------------------------------------------------------


def _close(a: torch.Tensor | float, b: torch.Tensor | float) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return bool(((a - b).abs() <= REL_TOL * torch.maximum(a.abs(), b.abs())).all())


def _lengths(a: RopeSpec, b: RopeSpec, position: int, n_ctx: int | None = None) -> list[int]:
    """The current lengths at which two specs' frequencies are compared: 1, the stated position + 1, and either
    side of every threshold a length-dependent type switches at (its L0); none past ``n_ctx``."""
    out = {1, position + 1}
    for s in (a, b):
        if s.scaling is None or s.rope_type not in LENGTH_DEPENDENT:
            continue
        key = ROPE_TYPES[s.rope_type].original_key
        for L0 in (parse_scaling(s.scaling).get(key) if key else None, s.max_position_embeddings):
            if L0:
                out |= {int(L0), int(L0) + 1}
    return sorted(L for L in out if n_ctx is None or L <= n_ctx)


def _scaling_words(s: RopeSpec) -> str:
    if s.scaling is None:
        return "default"
    keys = {k: v for k, v in s.scaling.items() if k not in ("rope_type", "type")}
    return f"{s.rope_type}({', '.join(f'{k}={_short(v)}' for k, v in keys.items())})"


def _short(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        if len(v) <= 4:
            return "[" + ", ".join(_short(x) for x in v) + "]"
        return f"[{_short(v[0])}, {_short(v[1])}, ... {len(v)} values]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def compare_layers(a: RopeSpec, b: RopeSpec, head_dim: int, position: int, *, n_ctx: int | None = None) -> list[dict]:
    """What differs between two layers' RoPE, each ``{"kind", "detail"}``; empty when they agree.

    Kinds: ``nope`` (one layer has no RoPE), ``style``, ``rotary_dim``, ``frequencies`` (base or scaling: the
    inverse frequencies differ at some current length), ``attention_factor``.

    Args:
        a: the first source's layer.
        b: the other source's same layer.
        head_dim: the attention head dimension both apply to.
        position: the position compared: the frequencies are compared at current lengths 1, ``position + 1``
            and either side of each length-dependent type's threshold :math:`L_0`.
        n_ctx: the allocated context, when a GGUF source's choice depends on it (Phi-3's LongRoPE factors).
    """
    if a.is_nope or b.is_nope:
        if a.is_nope and b.is_nope:
            return []
        which = "first" if a.is_nope else "second"
        return [{"kind": "nope", "detail": f"the {which} source has no RoPE in this layer, the other does"}]
    out = []
    if a.style != b.style:
        out.append({"kind": "style", "detail": f"pairs {a.style} vs {b.style}"})
    ra, rb = a.rotary_dim or head_dim, b.rotary_dim or head_dim
    if ra != rb:
        out.append({"kind": "rotary_dim", "detail": f"rotary_dim {ra} vs {rb} of {head_dim}"})
    if out:
        return out
    freq_at, factor_at = [], []
    lengths = _lengths(a, b, position, n_ctx)
    for L in lengths:
        (ia, fa), (ib, fb) = a.frequencies(head_dim, seq_len=L), b.frequencies(head_dim, seq_len=L)
        if not _close(ia, ib):
            freq_at.append(L)
        if not _close(fa, fb):
            factor_at.append((L, fa, fb))
    if freq_at:
        parts = []
        if not _close(a.base, b.base):
            parts.append(f"base {a.base:g} vs {b.base:g}")
        if _scaling_words(a) != _scaling_words(b):
            parts.append(f"scaling {_scaling_words(a)} vs {_scaling_words(b)}")
        where = "" if len(freq_at) == len(lengths) else f" (at current lengths {freq_at})"
        out.append({"kind": "frequencies", "detail": (", ".join(parts) or "frequencies differ") + where})
    if factor_at:
        L, fa, fb = factor_at[-1]
        out.append({"kind": "attention_factor", "detail": f"attention factor {fa:.6g} vs {fb:.6g} at length {L}"})
    return out


# --------------------------------------------------------------------------------------------------
# What a mismatch costs
# --------------------------------------------------------------------------------------------------


def _axis_positions(positions: torch.Tensor, sections: MultiAxis) -> torch.Tensor:
    """[A, s] positions of tokens whose axis k sits at ``positions // (k + 1)`` (distinct axes)."""
    return torch.stack([positions // (k + 1) for k in range(sections.n_axes)])


def _angles(spec: RopeSpec, head_dim: int, m: int, sections: MultiAxis | None, spread: bool) -> torch.Tensor:
    """Per-pair angles (float64) of the token at position m (multi-axis: axis k at m // (k+1) when ``spread``; the
    ladder at the current length m + 1, except multi-axis RoPE, which ``apply_rope`` runs at its default length)."""
    inv, _ = spec.frequencies(head_dim, seq_len=None if sections is not None else m + 1)
    if sections is None or not spread:
        return inv * m
    pos = _axis_positions(torch.tensor([m]), sections)[:, 0].to(torch.float64)
    return inv * pos[sections.axis_of_pair()]


def _rotate(x: torch.Tensor, spec: RopeSpec, positions: torch.Tensor, m: int, sections: MultiAxis | None,
            spread: bool) -> torch.Tensor:
    if spec.is_nope:
        return x
    if sections is None:
        return apply_rope(x, positions, layout="b s h d", spec=spec, seq_len=m + 1)
    pos = _axis_positions(positions, sections) if spread else positions.expand(sections.n_axes, -1)
    # multiaxis_rope is apply_rope(sections=...) past its keyword checks; it takes the spec's L0 as it is.
    return multiaxis_rope(x, parse_layout("b s h d", x.ndim), pos, sections, spec)


def cost(a: RopeSpec, b: RopeSpec, head_dim: int, position: int, *, sections_a: MultiAxis | None = None,
         sections_b: MultiAxis | None = None, samples: int = 128, heads: int = 4, seed: int = 0) -> dict:
    """What replacing layer RoPE ``a`` by ``b`` costs at position ``position`` (see the module docstring):
    ``{"position", "phase_error" (radians, None when the pairs differ), "max_kl" (nats), "max_abs_dprob",
    "samples", "heads", "seed"}``. Identical specs cost exactly 0 (the same computation twice).

    Args:
        a: the layer's RoPE as one source reads it.
        b: the same layer as another source reads it.
        head_dim: the attention head dimension.
        position: m, the last position (an int >= 1): queries at positions up to m attend to keys up to m.
        sections_a: ``a``'s multi-axis sections (M-RoPE), or None.
        sections_b: ``b``'s multi-axis sections, or None.
        samples: at most this many positions, spread evenly over [0, m] (``--samples``).
        heads: how many random heads of q and k (``--heads``).
        seed: the seed of the random q and k (float64 normal).
    """
    if not (isinstance(position, int) and position >= 1):
        raise ValueError(f"position must be an int >= 1, got {position!r}.")
    spread = sections_a != sections_b
    phase = None
    ra = None if a.is_nope else (a.rotary_dim or head_dim)
    rb = None if b.is_nope else (b.rotary_dim or head_dim)
    if a.is_nope and b.is_nope:
        phase = 0.0
    elif a.is_nope or b.is_nope:
        s, sec = (b, sections_b) if a.is_nope else (a, sections_a)
        phase = float(_angles(s, head_dim, position, sec, spread).abs().max())
    elif a.style == b.style and ra == rb:
        phase = float((_angles(a, head_dim, position, sections_a, spread)
                       - _angles(b, head_dim, position, sections_b, spread)).abs().max())
    gen = torch.Generator().manual_seed(seed)
    n = min(samples, position + 1)
    positions = torch.unique(torch.linspace(0, position, n, dtype=torch.float64).round().long())
    q = torch.randn(1, positions.numel(), heads, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, positions.numel(), heads, head_dim, generator=gen, dtype=torch.float64)
    logits = []
    for spec, sec in ((a, sections_a), (b, sections_b)):
        qr, kr = (_rotate(t, spec, positions, position, sec, spread).transpose(1, 2) for t in (q, k))
        logits.append(causal_logits(qr, kr))
    kl = kl_divergence(logits[0], logits[1])
    dprob = (logits[0].softmax(-1) - logits[1].softmax(-1)).abs()
    axes = None
    if spread:
        n_axes = max(sec.n_axes for sec in (sections_a, sections_b) if sec is not None)
        axes = [position // (k + 1) for k in range(n_axes)]
    return {"position": position, "axis_positions": axes, "phase_error": phase, "max_kl": float(kl.max()),
            "max_abs_dprob": float(dprob.max()), "samples": int(positions.numel()), "heads": heads, "seed": seed}


# --------------------------------------------------------------------------------------------------
# Checking sources
# --------------------------------------------------------------------------------------------------


def _groups(readings: Sequence[Reading]) -> list[list[tuple[int, int]]]:
    """The layers whose effective specs are the same in every source, as runs [start, end] of consecutive layers,
    one list of runs per distinct setting (first-seen order): Gemma 3's five sliding layers to one global
    layer is two groups, however many layers."""
    keys = list(zip(*(r.effective_specs() for r in readings)))
    # Matched by equality, never hashed: a spec's hash reprs its scaling, and a hostile config's factor lists
    # hold millions of values (tuple equality first tries identity, and the readers share one spec object).
    settings: list[tuple[tuple, list[tuple[int, int]]]] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            runs = next((r for k, r in settings if k == keys[start]), None)
            if runs is None:
                runs = []
                settings.append((keys[start], runs))
            runs.append((start, i - 1))
            start = i
    return [runs for _, runs in settings]


def consistency(reading: Reading) -> list[str]:
    """What contradicts itself inside one Reading, whatever its format, beside the reader's own
    :attr:`Reading.problems`: a layer whose spec has no frequencies for the head (a rotary_dim past head_dim,
    longrope factor lists of the wrong length), M-RoPE sections that do not cover the rotary pairs. Either leaves
    nothing to compare (:func:`check` reports it and stops there)."""
    out = []
    seen: list[tuple[RopeSpec, str | None]] = []  # by equality, not hash (see _groups)
    for i, s in enumerate(reading.layers):
        error = next((e for t, e in seen if t is s or t == s), False)
        if error is False:
            try:
                s.frequencies(reading.head_dim, seq_len=1)
                error = None
            except ValueError as e:
                error = str(e)
            seen.append((s, error))
        if error is not None:
            out.append(f"layer {i}: {error}")
    if reading.sections is not None:
        pairs = {(s.rotary_dim or reading.head_dim) // 2 for s in reading.layers if not s.is_nope}
        if pairs and pairs != {reading.sections.n_pairs}:
            out.append(f"sections {list(reading.sections.sections)} cover {reading.sections.n_pairs} rotary pairs, "
                       f"but the layers rotate {sorted(pairs)} pairs (rotary_dim / 2).")
    return out


def _default_position(readings: Sequence[Reading]) -> int:
    for r in readings:
        for s in r.layers:
            if s.max_position_embeddings:
                return max(1, s.max_position_embeddings - 1)
    return 4095


def check(readings: Sequence[Reading], *, position: int | None = None, samples: int = 128, heads: int = 4,
          seed: int = 0, n_ctx: int | None = None) -> dict:
    """The comparison of every source with the first (JSON-ready): ``{"ok", "position", "n_ctx", "n_layers",
    "head_dim", "sources", "groups", "mismatches", "agreements", "problems"}``. ``n_ctx``: the allocated context
    (no length past it is compared; the default position is below it).

    ValueError when the sources are of different models (layer counts or head dims).

    Args:
        readings: the sources' :class:`Reading` objects (:func:`read`); the first is the reference.
        position: the position the frequencies and the cost are compared at; None for the trained context
            minus one (below ``n_ctx`` when given).
        samples: passed to :func:`cost`.
        heads: passed to :func:`cost`.
        seed: passed to :func:`cost`.
        n_ctx: the allocated context (``--ctx``).
    """
    if not readings:
        raise ValueError("check needs at least one Reading.")
    ref = readings[0]
    for i, r in enumerate(readings[1:], 2):
        if (r.n_layers, r.head_dim) != (ref.n_layers, ref.head_dim):
            raise ValueError(f"different models: [1] {ref.source} has {ref.n_layers} layers of head_dim "
                             f"{ref.head_dim}, [{i}] {r.source} has {r.n_layers} layers of head_dim {r.head_dim}.")
    if n_ctx is not None and (not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 2):
        raise ValueError(f"--ctx must be an int >= 2, got {n_ctx!r}.")
    m = _default_position(readings) if position is None else position
    if position is None and n_ctx is not None:
        m = min(m, n_ctx - 1)
    if not (isinstance(m, int) and m >= 1):
        raise ValueError(f"--position must be an int >= 1, got {m!r}.")
    if n_ctx is not None and m >= n_ctx:
        raise ValueError(f"--position {m} lies past a context of --ctx {n_ctx} tokens; pass a position below it.")
    broken = [consistency(r) for r in readings]
    problems = [{"source": i, "problem": p} for i, r in enumerate(readings) for p in (*r.problems, *broken[i])]
    if any(broken):  # a layer without frequencies, sections that do not fit the pairs: nothing to compare
        return {"ok": False, "position": m, "n_ctx": n_ctx, "n_layers": ref.n_layers, "head_dim": ref.head_dim,
                "sources": [_source_dict(r) for r in readings], "groups": [], "mismatches": [], "agreements": [],
                "problems": problems}
    groups = _groups(readings)
    mismatches, agreements = [], []
    for j, other in enumerate(readings[1:], 1):
        sections_differ = ref.sections != other.sections
        # An engine that runs text positions only cannot show sections: M-RoPE on text positions is 1D RoPE.
        text_only = sections_differ and (ref.text_only or other.text_only)
        sections_differ = sections_differ and not text_only
        for group in groups:
            lo, layers = group[0][0], [list(run) for run in group]
            a, b = ref.effective_specs()[lo], other.effective_specs()[lo]
            diffs = compare_layers(a, b, ref.head_dim, m, n_ctx=n_ctx)
            if sections_differ and not (a.is_nope and b.is_nope):
                diffs.append({"kind": "sections", "detail": f"sections {_sections_words(ref.sections)} vs "
                                                            f"{_sections_words(other.sections)}"})
            if diffs:
                mismatches.append({"layers": layers, "sources": [0, j], "kinds": [d["kind"] for d in diffs],
                                   "details": [d["detail"] for d in diffs],
                                   "cost": cost(a, b, ref.head_dim, m, sections_a=ref.sections,
                                                sections_b=other.sections, samples=samples, heads=heads, seed=seed)})
                continue
            if a != b:
                agreements.append({"layers": layers, "sources": [0, j],
                                   "detail": f"declared differently ({_declared_diff(a, b)}), the same rotation "
                                             "within float32 storage"})
            if text_only and not (a.is_nope and b.is_nope):
                who = ref if ref.text_only else other
                agreements.append({"layers": layers, "sources": [0, j],
                                   "detail": f"sections {_sections_words(ref.sections)} vs "
                                             f"{_sections_words(other.sections)} not compared: the {who.format} engine "
                                             "runs token ids only (no multi-axis positions), where M-RoPE is 1D "
                                             "RoPE"})
            if other.qk_permuted != ref.qk_permuted and not a.is_nope:
                who = other if other.qk_permuted else ref
                agreements.append({"layers": layers, "sources": [0, j],
                                   "detail": f"{who.source} stores q/k rows permuted (llama.cpp's converter): "
                                             f"{who.layers[lo].style} on those weights is "
                                             f"{who.effective_specs()[lo].style} on the original ones"})
    return {"ok": not mismatches and not problems, "position": m, "n_ctx": n_ctx, "n_layers": ref.n_layers,
            "head_dim": ref.head_dim, "sources": [_source_dict(r) for r in readings],
            "groups": [{"layers": [list(run) for run in g],
                        "specs": [r.effective_specs()[g[0][0]].to_dict() for r in readings]} for g in groups],
            "mismatches": mismatches, "agreements": agreements, "problems": problems}


def _declared_diff(a: RopeSpec, b: RopeSpec) -> str:
    """The fields (and scaling keys) two specs declare differently, ``key a vs b``."""
    da, db = a.to_dict(), b.to_dict()
    sa, sb = da.pop("scaling") or {}, db.pop("scaling") or {}
    parts = [f"{k} {da[k]} vs {db[k]}" for k in da if da[k] != db[k]]
    parts += [f"{k} {sa.get(k)} vs {sb.get(k)}" for k in dict.fromkeys([*sa, *sb]) if sa.get(k) != sb.get(k)]
    return ", ".join(parts)


def _source_dict(r: Reading) -> dict:
    d = r.to_dict()
    d["effective_layers"] = [s.to_dict() for s in r.effective_specs()]
    return d


def _sections_words(s: MultiAxis | None) -> str:
    if s is None:
        return "none (1D)"
    kind = "axial" if s.axial else ("interleaved M-RoPE" if s.interleaved else "M-RoPE")
    return f"{kind} {list(s.sections)}"


def _spec_words(s: RopeSpec, head_dim: int, m: int) -> str:
    if s.is_nope:
        return "NoPE"
    _, factor = s.frequencies(head_dim, seq_len=m + 1)
    return (f"{s.style} base={s.base:g} rotary_dim={s.rotary_dim or head_dim} {_scaling_words(s)} "
            f"attention_factor={factor:.4g}")


def _layers_words(runs: Sequence[Sequence[int]]) -> str:
    words = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs]
    one = len(runs) == 1 and runs[0][0] == runs[0][1]
    return ("layer " if one else "layers ") + ", ".join(words)


def render(result: dict, readings: Sequence[Reading]) -> str:
    """The text report of :func:`check`'s result.

    Args:
        result: what :func:`check` returned.
        readings: the same readings, in the same order.
    """
    m, d = result["position"], result["head_dim"]
    ctx = f", a context of {result['n_ctx']} tokens" if result.get("n_ctx") else ""
    lines = [f"ropelab-check: {len(readings)} source(s), {result['n_layers']} layers, head_dim {d}{ctx}"]
    for i, r in enumerate(readings, 1):
        extra = ", q/k rows permuted" if r.qk_permuted else ""
        lines.append(f"  [{i}] {r.format} {r.architecture} {r.source}{extra}; sections {_sections_words(r.sections)}")
    lines.append("")
    for g in result["groups"]:
        lo = g["layers"][0][0]
        lines.append(f"{_layers_words(g['layers'])}:")
        for i, r in enumerate(readings, 1):
            lines.append(f"  [{i}] {_spec_words(r.effective_specs()[lo], d, m)}")
    lines.append("")
    if result["mismatches"]:
        lines.append(f"MISMATCHES (costs at position {m}):")
        for mm in result["mismatches"]:
            a, b = (x + 1 for x in mm["sources"])
            lines.append(f"  {_layers_words(mm['layers'])}, [{a}] vs [{b}]: {'; '.join(mm['details'])}")
            c = mm["cost"]
            if c is not None:
                phase = ("undefined (the two rotate different pairs of dims)" if c["phase_error"] is None
                         else f"{c['phase_error']:.4g} rad")
                if c["axis_positions"] is not None:
                    phase += f" (an M-RoPE token at axis positions {c['axis_positions']})"
                lines.append(f"    phase error {phase}; attention over {c['samples']} positions in [0, {m}]: "
                             f"max KL {c['max_kl']:.3g} nats, max |dp| {c['max_abs_dprob']:.3g}")
    for ag in result["agreements"]:
        a, b = (x + 1 for x in ag["sources"])
        lines.append(f"note: {_layers_words(ag['layers'])}, [{a}] vs [{b}] agree: {ag['detail']}")
    for i, r in enumerate(readings, 1):
        for note in r.notes:
            lines.append(f"note: [{i}] {_clip(note, 1000)}")
    for p in result["problems"]:
        lines.append(f"PROBLEM: [{p['source'] + 1}] {_clip(p['problem'], 1000)}")
    if result["ok"]:
        lines.append("OK: " + ("the source is consistent." if len(readings) == 1 else "all sources agree."))
    else:
        n, k = len(result["mismatches"]), len(result["problems"])
        lines.append(f"NOT OK: {n} mismatch(es), {k} problem(s).")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def _write(readings: Sequence[Reading], args: argparse.Namespace) -> str:
    from .hf import load_config, write_config

    # The config to fix: the first transformers source after the first PATH, else the first PATH's own.
    base = next((r for r in (*readings[1:], readings[0]) if r.format == "transformers"), None)
    base_config = None if base is None or base.source.startswith("<") else load_config(base.source)[0]
    try:
        config = write_config(readings[0], base_config, schema=args.schema)
    except ValueError as e:
        raise UsageError(f"--write-config: {e}") from e
    out = Path(args.write_config)
    try:
        out.write_text(json.dumps(config, indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"--write-config: cannot write {out} ({e}).") from e
    return str(out)


def strict_json(value: Any) -> Any:
    """``value`` as strict JSON (RFC 8259): NaN and the infinities become the strings ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"`` (Python's ``json`` would print them bare, which other parsers reject), and a
    list longer than :data:`ECHO_MAX` becomes ``{"length", "min", "max", "first", "last"}``, summarised once
    however many layers share it."""
    memo: dict[int, Any] = {}

    def go(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
            return v
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        if isinstance(v, dict):
            return {str(k): go(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            key = id(v)
            if key not in memo:
                if len(v) > ECHO_MAX:
                    nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)
                            and math.isfinite(x)]
                    memo[key] = {"length": len(v), "min": min(nums) if nums else None,
                                 "max": max(nums) if nums else None, "first": [go(x) for x in v[:4]],
                                 "last": [go(x) for x in v[-4:]]}
                else:
                    memo[key] = [go(x) for x in v]
            return memo[key]
        return _clip(repr(v))

    return go(value)


def _dumps(value: Any) -> str:
    return json.dumps(strict_json(value), indent=2, allow_nan=False)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ropelab-check",
        description="Read a model's RoPE from each source (transformers config.json or model directory, .gguf, "
        "MLX model directory; prefix hf:, gguf: or mlx: to force a reader), per layer, and say where they "
        "disagree and what it costs; with --run, run the engines themselves on a tiny model of one config's "
        "architecture against transformers float64. Exit 0: all agree; 1: a mismatch or a problem (--run: an engine "
        "differs or failed); 2: a usage error or an unreadable source (--run: also no engine could run it).",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="config.json, model directory, .gguf or MLX dir")
    parser.add_argument("--run", action="store_true",
                        help="run the engines themselves: PATH is one transformers config.json (or model directory); "
                             "a tiny random-weight model of its architecture (RoPE keys, layer pattern and head "
                             "geometry kept) runs in each engine and in transformers float64, and each engine's "
                             "logits (and per-layer q/k after RoPE where visible) are compared")
    parser.add_argument("--engines", default=",".join(_RUN_ENGINES), metavar="LIST",
                        help=f"with --run: the engines to run, comma-separated, of {','.join(_RUN_ENGINES)} "
                             "(default all)")
    parser.add_argument("--position", type=int,
                        help="position of the costs, 1..2^53 (default max_position_embeddings - 1)")
    parser.add_argument("--ctx", type=int, metavar="N",
                        help="the context a user will allocate, 2..2^53: llama.cpp picks LongRoPE's factors by it; "
                             "lengths past it are not compared (default: each source's own, for GGUF the file's "
                             "context_length)")
    parser.add_argument("--samples", type=int, default=128,
                        help=f"positions of the attention cost, >= 2 and within {COST_BYTES >> 20} MiB (default 128)")
    parser.add_argument("--heads", type=int, default=4,
                        help=f"random heads of the attention cost, >= 1 and within {COST_BYTES >> 20} MiB (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random q/k, 0..2^64-1 (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--write-config", metavar="OUT", help="write the first source's RoPE as a transformers config")
    parser.add_argument("--schema", choices=("v5", "v4"), default="v5", help="schema of --write-config (default v5)")
    return parser


def _check_args(args: argparse.Namespace) -> None:
    if args.samples < 2:
        raise UsageError(f"--samples must be >= 2, got {args.samples}.")
    if args.heads < 1:
        raise UsageError(f"--heads must be >= 1, got {args.heads}.")
    if args.position is not None and not 1 <= args.position <= MAX_POSITION:
        raise UsageError(f"--position must be in 1..2^53 (float64 positions), got {_clip(str(args.position), 40)}.")
    if args.ctx is not None and not 2 <= args.ctx <= MAX_POSITION:
        raise UsageError(f"--ctx must be in 2..2^53, got {_clip(str(args.ctx), 40)}.")
    if not 0 <= args.seed < 2 ** 64:
        raise UsageError(f"--seed must be in 0..2^64-1, got {_clip(str(args.seed), 40)}.")


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 all agree, 1 a mismatch or a problem, 2 a usage error or an
    unreadable source). No exception escapes but SystemExit from ``--help``; ``--json`` prints strict JSON in
    every case.

    Args:
        argv: the arguments after the command's name (``["config.json", "model.gguf", "--json"]``); None reads
            ``sys.argv``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    want_json = "--json" in argv
    try:
        args = _parser().parse_args(argv)
        want_json = args.json
        _check_args(args)
        if args.run:
            return _run_mode(args)
        if args.engines != ",".join(_RUN_ENGINES):
            raise UsageError("--engines goes with --run (it names the engines to run).")
        try:
            readings = [read(p, n_ctx=args.ctx) for p in args.paths]
            m = _default_position(readings) if args.position is None else args.position
            if args.position is None and args.ctx is not None:
                m = min(m, args.ctx - 1)
            if not 1 <= m <= MAX_POSITION:
                src = next(r.source for r in readings if any(s.max_position_embeddings for s in r.layers))
                raise UsageError(f"{_clip(src)}: max_position_embeddings {_clip(str(m + 1), 40)} puts the default "
                                 "--position past 2^53 (float64 positions); pass --position in 1..2^53.")
            _check_budget(readings, args.heads, args.samples, m)
            result = check(readings, position=m, samples=args.samples, heads=args.heads, seed=args.seed,
                           n_ctx=args.ctx)
        except ValueError as e:  # ReadError, different models
            raise UsageError(str(e)) from e
        written = _write(readings, args) if args.write_config else None
        code = 0 if result["ok"] else 1
        text = _dumps({**result, "exit_code": code, "written": written}) if want_json else render(result, readings)
    except UsageError as e:
        return _fail(_clip(str(e), 2000), want_json)
    except Exception as e:  # noqa: BLE001 - the contract: exit 0, 1 or 2, never a traceback
        return _fail(f"internal error ({type(e).__name__}: {_clip(str(e))}); please report it with the input.",
                     want_json)
    print(text)
    if written and not want_json:
        print(f"wrote {written} ({args.schema} schema): the RoPE of [1].")
    return code


def _run_config(text: str) -> tuple[dict, str]:
    """The config dict of ``--run``'s PATH (a transformers config.json or a model directory), read within
    :data:`_MAX_CONFIG_BYTES`; UsageError naming the problem otherwise."""
    from .hf import load_config

    try:
        fmt, path = detect(text)
    except ReadError as e:
        raise UsageError(str(e)) from None
    if fmt != "transformers":
        raise UsageError(f"{_clip(text)}: --run builds a model from a transformers config.json (or a model directory "
                         f"holding one), not a {fmt} source.")
    try:
        cfg = path / "config.json" if path.is_dir() else path
        size = cfg.stat().st_size
        if size > _MAX_CONFIG_BYTES:
            raise UsageError(f"{cfg}: {size} bytes is not a model config (limit {_MAX_CONFIG_BYTES >> 20} MiB).")
        return load_config(path)
    except UsageError:
        raise
    except ReadError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - JSON nested too deep, an OS error: an unreadable source
        raise UsageError(f"{_clip(text)}: cannot be read ({type(e).__name__}: {_clip(str(e))}).") from None


def _run_mode(args: argparse.Namespace) -> int:
    """``--run``: :func:`ropelab.engines.check_run.run_engines` on the one PATH; prints the report (or JSON)."""
    if len(args.paths) != 1:
        raise UsageError(f"--run takes one PATH (a config.json), got {len(args.paths)}.")
    if args.write_config:
        raise UsageError("--write-config does not go with --run.")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in _RUN_ENGINES]
    if bad or not engines:
        raise UsageError(f"--engines must name some of {','.join(_RUN_ENGINES)} (comma-separated), got "
                         f"{_clip(args.engines, 80)!r}.")
    config, where = _run_config(args.paths[0])
    import contextlib

    from . import check_run

    try:
        import transformers
    except ImportError as e:
        raise UsageError(f"--run needs transformers (the reference) and torch ({e}).") from None
    hf_log = transformers.utils.logging
    # Quiet for the run, and as it was afterwards: main() also runs in-process (the tests, a notebook), where a
    # global verbosity left at "error" would hide transformers' warnings from everything that follows.
    level, bars = hf_log.get_verbosity(), hf_log.is_progress_bar_enabled()
    hf_log.set_verbosity_error()
    hf_log.disable_progress_bar()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # nothing but the report on stdout (--json parses it)
            result = check_run.run_engines(config, list(dict.fromkeys(engines)), where=where, n_ctx=args.ctx,
                                           seed=args.seed)
    except check_run.RunRefused as e:
        raise UsageError(str(e)) from None
    finally:
        hf_log.set_verbosity(level)
        if bars:
            hf_log.enable_progress_bar()
    code = check_run.exit_code(result)
    if code == 2:
        missing = [f"{check_run.NAMES[e]}: {c.get('reason')}" + (f" (install: {c['install']})" if c.get("install")
                   else "") for e, c in result["engines"].items()]
        message = "no engine could run the model: " + "; ".join(missing)
        if args.json:
            print(_dumps({**result, "exit_code": 2, "error": message}))
        print(f"ropelab-check: error: {_clip(message, 2000)}", file=sys.stderr)
        return 2
    print(_dumps({**result, "exit_code": code}) if args.json else check_run.render(result))
    return code


def _fail(message: str, want_json: bool) -> int:
    print(f"ropelab-check: error: {message}", file=sys.stderr)
    if want_json:
        print(json.dumps({"ok": False, "exit_code": 2, "error": message}))
    return 2

if __name__ == "__main__":
    sys.exit(main())
