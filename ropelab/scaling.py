r"""The frequency ladder of RoPE and its context-extension scalings, one pure function per name.

Every function here returns ``(inv_freq, attention_factor)``: the ``rotary_dim / 2`` inverse
frequencies :math:`\omega_i` (the angle of pair ``i`` at position ``m`` is :math:`m\,\omega_i`) and the
factor that multiplies cos and sin (a norm scale, 1.0 for most types). They are computed in
float64 (``dtype`` selects float32 to mimic an implementation that holds them in float32).

``frequencies`` reads a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict as it is, so the
numbers can be checked against ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (the tests do).
Each type is one :class:`RopeType` record in the open registry ``ROPE_TYPES``: its function, the keys it
reads and what they hold, which are required, whether it depends on the length, which key is its
original length, and an example. ``RopeSpec``'s key lists, ``LENGTH_DEPENDENT``, the KV-cache schedule's
threshold and the tests all read the records, so a new type is one ``register_rope_type(...)`` call.
:func:`check_scaling` holds the validation rule, read against transformers' own.
This module imports nothing from the rest of ropelab: it is the bottom of the import graph.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "frequencies",
    "default_inv_freq",
    "ntk_base",
    "ntk_aware_base",
    "pair_at_turns",
    "critical_pair",
    "ROPE_TYPES",
    "RopeType",
    "register_rope_type",
    "unregister_rope_type",
    "SCALING_KEYS",
    "COMMON_KEYS",
    "EXAMPLE_HEAD_DIM",
    "EXAMPLE_MAX_POSITION_EMBEDDINGS",
    "length_threshold",
    "check_scaling",
    "ScalingParams",
    "parse_scaling",
    "check_rotary_dim",
    "LENGTH_DEPENDENT",
    "rope_type_of",
    "check_base",
    "check_scaling_values",
]


def default_inv_freq(rotary_dim: int, base: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    r"""RoFormer's ladder :math:`\omega_i = b^{-2i/r}` for :math:`i = 0 .. r/2 - 1`.

    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", eq. (15).
    The exponent is formed in float64 before the power so float32 results are correctly rounded.
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return (1.0 / (float(base) ** exponent)).to(dtype)


def ntk_aware_base(base: float, rotary_dim: int, alpha: float) -> float:
    r"""NTK-aware scaling as a change of base (bloc97): :math:`b' = b\,\alpha^{r / (r - 2)}`, which keeps the
    lowest frequency's wavelength :math:`\alpha` times longer. Static NTK-aware scaling uses :math:`\alpha = s`."""
    return float(base) * float(alpha) ** (rotary_dim / (rotary_dim - 2))


def pair_at_turns(rotary_dim: int, base: float, original: int, turns: float) -> float:
    r"""The (fractional) pair index whose frequency completes ``turns`` full rotations over the trained context
    :math:`L_0`: pair i turns :math:`L_0\,\omega_i / 2\pi = L_0 b^{-2i/r} / 2\pi` times, so
    :math:`i(\beta) = r \ln(L_0 / 2\pi\beta) / (2 \ln b)`. Pairs above it turn fewer times. YaRN's correction
    range is :math:`[i(\beta_{fast}), i(\beta_{slow})]` (Peng et al. 2023, arXiv 2309.00071, section 3.2)."""
    return (rotary_dim * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))


def critical_pair(rotary_dim: int, base: float, original: int) -> int:
    r"""The first pair whose wavelength :math:`2\pi/\omega_i` exceeds :math:`L_0`, i.e. that never completes a
    turn within the trained context: :math:`\lceil i(1) \rceil` of :func:`pair_at_turns` (clamped to
    ``[0, rotary_dim / 2]``; ``rotary_dim / 2`` means every pair turns). Pairs at or above it only ever saw the
    angles :math:`[0, L_0\omega_i)`, so past :math:`L_0` they meet angles they were never trained on."""
    return min(max(math.ceil(pair_at_turns(rotary_dim, base, original, 1.0)), 0), rotary_dim // 2)


def ntk_base(base: float, rotary_dim: int, seq_len: float, max_position_embeddings: int, factor: float) -> float:
    r"""The dynamic-NTK base :math:`b(L) = b\,(s L / L_0 - (s - 1))^{r / (r - 2)}` for :math:`L > L_0`, else b:
    :func:`ntk_aware_base` at :math:`\alpha(L) = sL/L_0 - (s - 1)`, which reaches :math:`s^2 - s + 1` at
    :math:`L = sL_0` (Hugging Face's ``_compute_dynamic_ntk_parameters``)."""
    seq_len = max(float(seq_len), float(max_position_embeddings))
    return ntk_aware_base(base, rotary_dim, factor * seq_len / max_position_embeddings - (factor - 1))


class ScalingParams(dict):
    """The parsed scaling dict: a plain dict with ``need(key)`` that raises a helpful ValueError."""

    rope_type: str = "default"

    def need(self, key: str) -> Any:
        """``self[key]``, or a ValueError naming the key and the rope_type that needs it."""
        if self.get(key) is None:
            raise ValueError(
                f"rope_scaling of type {self.rope_type!r} needs the key {key!r}; add it to the dict "
                f"(Hugging Face configs keep it in rope_scaling / rope_parameters)."
            )
        return self[key]


# --------------------------------------------------------------------------------------------------
# One function per rope_type. Signature: (rotary_dim, base, params, seq_len, max_pos, dtype).
# --------------------------------------------------------------------------------------------------


def _default(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""default: :math:`\omega_i = b^{-2i/r}` (RoFormer, Su et al. 2021). attention_factor = 1."""
    return default_inv_freq(rotary_dim, base, dtype), 1.0


def _linear(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""linear (position interpolation): :math:`\omega_i = b^{-2i/r} / s`.

    Chen et al. 2023, "Extending Context Window of Large Language Models via Positional
    Interpolation" (arXiv 2306.15595); kaiokendev's SuperHOT. Equivalent to positions m / s.
    """
    factor = float(params.need("factor"))
    return default_inv_freq(rotary_dim, base, torch.float64).div(factor).to(dtype), 1.0


def _dynamic(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""dynamic (dynamic NTK-aware): the base grows with the current length L past :math:`L_0`.

    :math:`b(L) = b\,(s L / L_0 - (s - 1))^{r/(r-2)}` for :math:`L > L_0`, and b otherwise;
    :math:`\omega_i = b(L)^{-2i/r}`. :math:`L_0` is ``max_position_embeddings`` (Hugging Face reads it
    from the model config, not from the dict). bloc97 and emozilla (2023, Reddit r/LocalLLaMA);
    Peng et al. 2023, "YaRN" (arXiv 2309.00071) section 3.3. ``seq_len`` None means :math:`L = L_0`.
    """
    factor = float(params.need("factor"))
    length = max_pos if seq_len is None else seq_len
    new_base = ntk_base(base, rotary_dim, length, max_pos, factor)
    return default_inv_freq(rotary_dim, new_base, dtype), 1.0


def _original_and_factor(params: ScalingParams, max_pos: int | None) -> tuple[int, float]:
    """The pretraining context :math:`L_0` and the extension factor s of yarn / longrope: the dict's
    ``original_max_position_embeddings`` (else ``max_position_embeddings``) and ``factor`` (else
    ``max_position_embeddings / L_0``), as Hugging Face resolves them (``standardize_rope_params`` and
    ``_compute_yarn_parameters`` / ``_compute_longrope_parameters``). :func:`check_scaling` has made sure
    both can be resolved."""
    original = params.get("original_max_position_embeddings") or max_pos
    factor = params.get("factor")
    if factor is None:
        factor = max_pos / original
    return original, float(factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""yarn: NTK-by-parts interpolation plus an attention temperature.

    With :math:`L_0` the original context and the number of rotations of pair i over it,
    :math:`\rho_i = L_0 \omega_i / 2\pi`, the correction dims are
    :math:`d(\beta) = r \ln(L_0 / (2\pi\beta)) / (2 \ln b)` for :math:`\beta` = beta_fast (32) and
    beta_slow (1) (floored / ceiled when ``truncate``, the default). A linear ramp
    :math:`\gamma_i` in [0, 1] between them blends
    :math:`\omega_i = (1-\gamma_i)\,\omega_i^{b}/s + \gamma_i\,\omega_i^{b}` (high frequencies keep
    their values, low frequencies are interpolated). attention_factor (the paper's
    :math:`\sqrt{1/t}`) is :math:`0.1 \ln s + 1`, or
    :math:`(0.1\,m \ln s + 1) / (0.1\,m_{all} \ln s + 1)` with mscale / mscale_all_dim (DeepSeek-V2).
    Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient Context Window Extension of Large Language
    Models" (arXiv 2309.00071), eqs. (17)-(23).
    """
    original, factor = _original_and_factor(params, max_pos)
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    low, high = (pair_at_turns(rotary_dim, base, original, beta) for beta in (beta_fast, beta_slow))
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # the ramp would divide by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1.0 - ramp
    inv = default_inv_freq(rotary_dim, base, torch.float64)
    inv_freq = (inv / factor) * (1 - extrapolation) + inv * extrapolation
    return inv_freq.to(dtype), float(attention_factor)


def _longrope(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""longrope: searched per-frequency rescale factors, a short set and a long set.

    :math:`\omega_i = b^{-2i/r} / \lambda_i` with :math:`\lambda` = short_factor while the current
    length L is at most the original context :math:`L_0`, and long_factor beyond it.
    attention_factor :math:`= \sqrt{1 + \ln s / \ln L_0}` with :math:`s = L_{max} / L_0` unless given.
    Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens"
    (arXiv 2402.13753); Phi-3's configs.
    """
    long_factor, short_factor = params.need("long_factor"), params.need("short_factor")
    original, factor = _original_and_factor(params, max_pos)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = long_factor if (seq_len and seq_len > original) else short_factor
    ext = torch.as_tensor(ext, dtype=torch.float64)
    return (default_inv_freq(rotary_dim, base, torch.float64) / ext).to(dtype), float(attention_factor)


def _llama3(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""llama3: wavelength-dependent interpolation (Llama 3.1).

    With wavelength :math:`\lambda_i = 2\pi/\omega_i`, :math:`L_0` = original_max_position_embeddings,
    :math:`\lambda_{hi} = L_0/\text{high\_freq\_factor}`, :math:`\lambda_{lo} = L_0/\text{low\_freq\_factor}`:
    :math:`\omega_i` stays for :math:`\lambda_i < \lambda_{hi}`, becomes :math:`\omega_i/s` for
    :math:`\lambda_i > \lambda_{lo}`, and in between :math:`(1-\mu)\omega_i/s + \mu\,\omega_i` with
    :math:`\mu = (L_0/\lambda_i - \text{low}) / (\text{high} - \text{low})`.
    Meta 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783); reference code in llama-models.
    """
    factor = float(params.need("factor"))
    low_f, high_f = float(params.need("low_freq_factor")), float(params.need("high_freq_factor"))
    original = params.get("original_max_position_embeddings") or max_pos
    inv = default_inv_freq(rotary_dim, base, torch.float64)
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low_f, original / high_f
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled).to(dtype), 1.0


def _proportional(rotary_dim, base, params, seq_len, max_pos, dtype):
    r"""proportional: only the first :math:`p \cdot d/2` pairs rotate, with exponents over the full head dim.

    :math:`\omega_i = b^{-2i/d} / s` for :math:`i < \lfloor p d / 2 \rfloor`, and 0 (no rotation) for the
    remaining pairs; here ``rotary_dim`` is the full head dim d (Hugging Face's ``proportional`` type; its
    record says ``whole_head``).
    """
    head_dim = rotary_dim
    factor = float(params.get("factor", 1.0))
    n_rot = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
    exponent = torch.arange(0, 2 * n_rot, 2, dtype=torch.float64) / head_dim
    inv = torch.cat([1.0 / (float(base) ** exponent), torch.zeros(head_dim // 2 - n_rot, dtype=torch.float64)])
    return (inv / factor).to(dtype), 1.0


# --------------------------------------------------------------------------------------------------
# One record per rope_type: its function, the keys it reads and their checks, in one open registry
# (transformers keeps ROPE_INIT_FUNCTIONS and the _validate_<type>_rope_parameters methods side by side
# in modeling_rope_utils.py; here they are one row).
# --------------------------------------------------------------------------------------------------

# What a key holds. A value of None is refused unless the record lists the key as ``nullable``: transformers
# reads most keys with ``.get(key, default)`` or ``[key]``, where an explicit None crashes its compute.
POSITIVE = "a finite number > 0"
NONNEGATIVE = "a finite number >= 0"  # 0 means "not set": transformers tests these keys for truth
FRACTION = "a number in (0, 1]"
POSITIVE_LIST = "a list of finite numbers > 0"
FLAG = "True or False"
_KINDS = (POSITIVE, NONNEGATIVE, FRACTION, POSITIVE_LIST, FLAG)

# Keys every type reads in a v5 rope_parameters dict: the base and the partial rotary factor
# (transformers' _check_received_keys adds partial_rotary_factor to every type's optional keys).
COMMON_KEYS: Mapping[str, str] = types.MappingProxyType({"rope_theta": POSITIVE, "partial_rotary_factor": FRACTION})

# The size the records' examples are valid at (a longrope example's lists have EXAMPLE_HEAD_DIM / 2 entries).
EXAMPLE_HEAD_DIM = 32
EXAMPLE_MAX_POSITION_EMBEDDINGS = 32


@dataclass(frozen=True, eq=False)
class RopeType:
    r"""One rope_type: how its frequencies are computed and what its dict may hold.

    Args:
        name: the ``rope_type`` string of the dict.
        compute: ``(rotary_dim, base, params, seq_len, max_pos, dtype) -> (inv_freq, attention_factor)``
            with ``inv_freq`` of length ``rotary_dim // 2``; called only on a dict :func:`check_scaling` passed.
        keys: every key it reads besides ``rope_type`` / ``type`` and :data:`COMMON_KEYS`, each with what it
            holds (:data:`POSITIVE`, :data:`NONNEGATIVE`, :data:`FRACTION`, :data:`POSITIVE_LIST`, :data:`FLAG`).
        required: the keys that must be present and not None (transformers' ``required_keys``).
        length_dependent: whether the frequencies move with the current length L (then callers pass
            ``seq_len``, and a KV cache's rotated keys go stale).
        original_key: the key holding the pretraining context :math:`L_0`; when absent it falls back to
            ``max_position_embeddings``, as transformers' ``standardize_rope_params`` sets it.
        example: a valid dict of this type (``rope_type`` included) at :data:`EXAMPLE_HEAD_DIM` and
            :data:`EXAMPLE_MAX_POSITION_EMBEDDINGS`; the tests run every type through it.
        nullable: the keys whose value None means "not set", because transformers' compute tests them for
            None or truth (yarn's ``attention_factor``, ``beta_fast``, ...); any other None is refused.
        validate: ``(params, rotary_dim, max_pos) -> None``, the type's own checks beyond the keys' kinds
            (``rotary_dim`` and ``max_pos`` may be None when not known yet); raises ValueError.
        whole_head: ``compute`` receives the whole head dim as ``rotary_dim`` and reads
            ``partial_rotary_factor`` itself (proportional).

    A record is called like its function: ``ROPE_TYPES["linear"](rotary_dim, base, params, ...)``.
    """

    name: str
    compute: Callable[..., tuple[torch.Tensor, float]]
    keys: Mapping[str, str] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    length_dependent: bool = False
    original_key: str | None = None
    example: Mapping[str, Any] = field(default_factory=dict)
    nullable: frozenset[str] = frozenset()
    validate: Callable[[ScalingParams, int | None, int | None], None] | None = None
    whole_head: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", types.MappingProxyType(dict(self.keys)))
        object.__setattr__(self, "required", frozenset(self.required))
        object.__setattr__(self, "nullable", frozenset(self.nullable))
        object.__setattr__(self, "example", types.MappingProxyType({"rope_type": self.name, **self.example}))
        if not (isinstance(self.name, str) and self.name) or not callable(self.compute):
            raise ValueError(f"a RopeType needs a name (a non-empty str) and a callable compute, got {self.name!r}.")
        bad = {k: v for k, v in self.keys.items() if v not in _KINDS}
        if bad:
            raise ValueError(f"RopeType {self.name!r}: keys {sorted(bad)} hold an unknown kind; use one of {_KINDS}.")
        stray = sorted((self.required | self.nullable | {self.original_key} - {None}) - set(self.keys))
        if stray:
            raise ValueError(f"RopeType {self.name!r}: required / nullable / original_key {stray} are not its keys.")

    def __call__(self, *args: Any) -> tuple[torch.Tensor, float]:
        return self.compute(*args)

    @property
    def positive_keys(self) -> frozenset[str]:
        """The keys that must be finite and > 0 (the common ``rope_theta`` included)."""
        return frozenset(k for k, v in {**COMMON_KEYS, **self.keys}.items() if v == POSITIVE)

    @property
    def list_keys(self) -> frozenset[str]:
        """The keys holding a list of factors, one per rotated pair."""
        return frozenset(k for k, v in self.keys.items() if v == POSITIVE_LIST)


def _need_max_pos(rope_type: str, what: str) -> ValueError:
    return ValueError(
        f"rope_type {rope_type!r} needs max_position_embeddings ({what}); pass max_position_embeddings=... "
        "(Hugging Face reads it from the model config)."
    )


def _validate_dynamic(params: ScalingParams, rotary_dim: int | None, max_pos: int | None) -> None:
    """transformers' ``_compute_dynamic_ntk_parameters`` reads :math:`L_0` from ``config.max_position_embeddings``."""
    if max_pos is None:
        raise _need_max_pos("dynamic", "the length L0 past which the base grows")


def _validate_yarn(params: ScalingParams, rotary_dim: int | None, max_pos: int | None) -> None:
    """``factor`` must be present (``_validate_yarn_rope_parameters`` lists it as required); a ``factor`` of
    None is derived as ``max_position_embeddings / original_max_position_embeddings``, as
    ``_compute_yarn_parameters`` does (DeepSeek-V3's convention)."""
    if "factor" not in params:
        raise ValueError(
            "rope_scaling of type 'yarn' needs the key 'factor' (transformers' _validate_yarn_rope_parameters "
            "requires it); add it to the dict."
        )
    if params["factor"] is None and max_pos is None:
        raise _need_max_pos("yarn", "a factor of None is max_position_embeddings / original_max_position_embeddings")


def _validate_longrope(params: ScalingParams, rotary_dim: int | None, max_pos: int | None) -> None:
    """A missing ``factor`` is ``max_position_embeddings / original_max_position_embeddings`` (Phi-3's
    convention, ``_compute_longrope_parameters``); the factor lists hold one entry per rotated pair
    (transformers broadcasts a list of one entry silently; ropelab does not)."""
    if params.get("factor") is None and max_pos is None:
        raise ValueError(
            "rope_type 'longrope' needs 'factor' (or max_position_embeddings to derive it as "
            "max_position_embeddings / original_max_position_embeddings)."
        )
    original = params.get("original_max_position_embeddings") or max_pos
    factor = params.get("factor") or (max_pos / original if original and max_pos else None)
    if params.get("attention_factor") is None and original is not None and original <= 1 and (factor or 0) > 1:
        raise ValueError(
            f"rope_type 'longrope' divides by ln(original_max_position_embeddings) for its attention factor; "
            f"got original_max_position_embeddings={original}: give a length > 1 or an attention_factor."
        )
    if rotary_dim is not None:
        lengths = {k: len(params[k]) for k in ("long_factor", "short_factor")}
        if set(lengths.values()) != {rotary_dim // 2}:
            raise ValueError(
                f"rope_type 'longrope' needs long_factor and short_factor of length rotary_dim/2 = {rotary_dim // 2}, "
                f"got {lengths['long_factor']} and {lengths['short_factor']}."
            )


# The keys each type reads and what is required are transformers' own (the required_keys / optional_keys of
# RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters in transformers/modeling_rope_utils.py, 5.x);
# rope_theta, required by llama3 and proportional there, is ropelab's ``base`` argument.
_YARN_KEYS = {"factor": POSITIVE, "original_max_position_embeddings": POSITIVE, "attention_factor": POSITIVE,
              "beta_fast": NONNEGATIVE, "beta_slow": NONNEGATIVE, "mscale": NONNEGATIVE,
              "mscale_all_dim": NONNEGATIVE, "truncate": FLAG}
_BUILTIN = (
    RopeType("default", _default),
    RopeType("linear", _linear, {"factor": POSITIVE}, {"factor"}, example={"factor": 4.0}),
    RopeType("dynamic", _dynamic, {"factor": POSITIVE}, {"factor"}, length_dependent=True,
             example={"factor": 4.0}, validate=_validate_dynamic),
    RopeType("yarn", _yarn, _YARN_KEYS, original_key="original_max_position_embeddings",
             nullable={"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
             example={"factor": 4.0, "original_max_position_embeddings": 32}, validate=_validate_yarn),
    RopeType("longrope", _longrope,
             {"factor": POSITIVE, "original_max_position_embeddings": POSITIVE, "attention_factor": POSITIVE,
              "short_factor": POSITIVE_LIST, "long_factor": POSITIVE_LIST},
             {"short_factor", "long_factor"}, length_dependent=True, original_key="original_max_position_embeddings",
             nullable={"factor", "attention_factor"},
             example={"factor": 4.0, "original_max_position_embeddings": 32, "short_factor": [1.0] * 16,
                      "long_factor": [1.0 + 0.3 * i for i in range(16)]},
             validate=_validate_longrope),
    RopeType("llama3", _llama3,
             {"factor": POSITIVE, "original_max_position_embeddings": POSITIVE, "low_freq_factor": POSITIVE,
              "high_freq_factor": POSITIVE},
             {"factor", "low_freq_factor", "high_freq_factor"}, original_key="original_max_position_embeddings",
             example={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32}),
    # proportional keeps partial_rotary_factor among its own keys: it reads exponents over the whole head.
    RopeType("proportional", _proportional, {"factor": POSITIVE, "partial_rotary_factor": FRACTION},
             example={"factor": 2.0, "partial_rotary_factor": 0.5}, whole_head=True),
)
_BUILTIN_NAMES = frozenset(t.name for t in _BUILTIN)

# The open registry: rope_type -> its record (see register_rope_type).
ROPE_TYPES: dict[str, RopeType] = {t.name: t for t in _BUILTIN}


def register_rope_type(name: str, compute: Callable[..., tuple[torch.Tensor, float]], **fields: Any) -> RopeType:
    """Add a rope type in one call: ``register_rope_type("mine", fn, keys={"factor": POSITIVE},
    required={"factor"}, example={"factor": 2.0})`` (the fields of :class:`RopeType`).

    Everything else reads the record: ``frequencies``, ``RopeSpec`` (its keys), ``LENGTH_DEPENDENT``,
    the KV-cache schedule's threshold, and the tests. The example is checked and computed once here, so a
    record whose example fails is refused. Returns the record; :func:`unregister_rope_type` removes it."""
    if name in ROPE_TYPES:
        raise ValueError(f"rope_type {name!r} is already registered; unregister_rope_type({name!r}) first.")
    rec = RopeType(name, compute, **fields)
    ROPE_TYPES[name] = rec
    try:
        inv, _ = frequencies(EXAMPLE_HEAD_DIM, rope_scaling=dict(rec.example),
                             max_position_embeddings=EXAMPLE_MAX_POSITION_EMBEDDINGS)
        if inv.shape != (EXAMPLE_HEAD_DIM // 2,):
            raise ValueError(f"its compute returned inv_freq of shape {tuple(inv.shape)} for a head of "
                             f"{EXAMPLE_HEAD_DIM} dims; it must be ({EXAMPLE_HEAD_DIM // 2},).")
    except Exception as err:
        del ROPE_TYPES[name]
        raise ValueError(f"rope_type {name!r} not registered: its example {dict(rec.example)} fails: {err}") from err
    return rec


def unregister_rope_type(name: str) -> None:
    """Remove a rope type added by :func:`register_rope_type` (the built-in types stay)."""
    if name in _BUILTIN_NAMES:
        raise ValueError(f"rope_type {name!r} is built in; only registered types can be removed.")
    if name not in ROPE_TYPES:
        raise ValueError(f"rope_type {name!r} is not registered.")
    del ROPE_TYPES[name]


class _LengthDependent(Set):
    """The names of the length-dependent types, read from the registry at each use (a live set)."""

    def __contains__(self, name: object) -> bool:
        rec = ROPE_TYPES.get(name) if isinstance(name, str) else None
        return rec is not None and rec.length_dependent

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, rec in ROPE_TYPES.items() if rec.length_dependent])

    def __len__(self) -> int:
        return sum(rec.length_dependent for rec in ROPE_TYPES.values())

    def __repr__(self) -> str:
        return f"LENGTH_DEPENDENT({sorted(self)})"


class _ScalingKeys(Mapping):
    """rope_type -> the keys a ``RopeSpec``'s scaling may hold besides ``rope_type`` / ``type`` (a live view)."""

    def __getitem__(self, name: str) -> frozenset[str]:
        return frozenset(ROPE_TYPES[name].keys)

    def __iter__(self) -> Iterator[str]:
        return iter(list(ROPE_TYPES))

    def __len__(self) -> int:
        return len(ROPE_TYPES)


# Types whose frequencies depend on the current length L (callers pass seq_len = max(position) + 1).
LENGTH_DEPENDENT: Set[str] = _LengthDependent()
# The keys each type reads, read off the records (ropelab.spec re-exports it).
SCALING_KEYS: Mapping[str, frozenset[str]] = _ScalingKeys()


# --------------------------------------------------------------------------------------------------
# Reading and checking a dict
# --------------------------------------------------------------------------------------------------


def parse_scaling(rope_scaling: Mapping[str, Any] | None) -> ScalingParams:
    """A Hugging Face rope dict (or None) as :class:`ScalingParams` with its ``rope_type`` resolved from the key
    ``rope_type`` or the legacy ``type``, its keys and values checked (:func:`check_scaling_values`);
    ValueError for a non-dict, an unknown type, a key the type does not read, a bad value or a missing
    required key."""
    if rope_scaling is None:
        params = ScalingParams()
        params.rope_type = "default"
        return params
    if not isinstance(rope_scaling, Mapping):
        raise ValueError(
            f"rope_scaling must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got "
            f"{type(rope_scaling).__name__}."
        )
    params = ScalingParams(rope_scaling)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise ValueError(
            f"unknown rope_type {rope_type!r}; ropelab knows {sorted(ROPE_TYPES)}. "
            "Check the spelling (Hugging Face uses the key 'rope_type', older configs 'type')."
        )
    params.rope_type = rope_type
    check_scaling_values(params)
    return params


def check_scaling(
    rope_scaling: Mapping[str, Any] | None,
    *,
    rotary_dim: int | None = None,
    max_position_embeddings: int | None = None,
) -> ScalingParams:
    r"""Every check of a rope dict, the ones :func:`frequencies` and ``RopeSpec`` share: :func:`parse_scaling`,
    then what needs the lengths: :math:`L_0` (the type's ``original_key``, else ``max_position_embeddings``)
    and the type's own ``validate`` (dynamic needs ``max_position_embeddings``; longrope's lists have
    ``rotary_dim / 2`` entries). ``rotary_dim`` or ``max_position_embeddings`` None skips what needs it only
    where the caller cannot know it yet (a ``RopeSpec`` without ``rotary_dim``).

    The rule, read against transformers' ``modeling_rope_utils.py`` (``RotaryEmbeddingConfigMixin``:
    ``standardize_rope_params``, ``_validate_<type>_rope_parameters``, ``_check_received_keys``, and the
    ``_compute_<type>_parameters`` functions): a key transformers requires raises when missing; a
    fallback transformers makes is made here too (``original_max_position_embeddings`` from
    ``max_position_embeddings``; yarn's ``factor`` None and longrope's missing ``factor`` as
    ``max_position_embeddings / L_0``; beta_fast / beta_slow of 0 or None as 32 / 1, mscale /
    mscale_all_dim of 0 as not set, truncate absent as True), and no other. Where transformers only logs
    a warning that its compute then turns into a crash, NaN or a silent broadcast (a string or list where
    a number belongs, a wrong-length factor list, an unknown key), ropelab raises. Two rules are stricter
    than transformers on purpose: a bool is not a number (transformers takes True as 1), and
    ``attention_factor`` must be > 0 (0 would zero every rotated vector).
    """
    params = parse_scaling(rope_scaling)
    rec = ROPE_TYPES[params.rope_type]
    if rec.original_key is not None and params.get(rec.original_key) is None and max_position_embeddings is None:
        raise ValueError(
            f"rope_type {params.rope_type!r} needs {rec.original_key} (the pretraining context); add it to the "
            "dict or pass max_position_embeddings=... (transformers' standardize_rope_params falls back to it)."
        )
    if rec.validate is not None:
        rec.validate(params, rotary_dim, max_position_embeddings)
    return params


def length_threshold(rope_scaling: Mapping[str, Any] | None, max_position_embeddings: int | None) -> int | None:
    r""":math:`L_0`, the length past which a length-dependent type moves: its ``original_key``'s value, else
    ``max_position_embeddings`` (longrope switches factor sets past ``original_max_position_embeddings``;
    dynamic NTK reads ``max_position_embeddings``). For the other types, ``max_position_embeddings``."""
    params = parse_scaling(rope_scaling)
    rec = ROPE_TYPES[params.rope_type]
    if rec.length_dependent and rec.original_key is not None:
        return params.get(rec.original_key) or max_position_embeddings
    return max_position_embeddings


def frequencies(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, float]:
    r"""Inverse frequencies and attention factor for a head of ``head_dim`` dims.

    Returns ``(inv_freq, attention_factor)`` with ``inv_freq`` of length ``rotary_dim // 2``. The angle
    of pair i at position m is :math:`\theta_{m,i} = m\,\omega_i`; cos and sin are multiplied by
    ``attention_factor``.

    Args:
        head_dim: d, the size of one attention head.
        base: b (``rope_theta``); a ``rope_theta`` key in ``rope_scaling`` overrides it.
        rotary_dim: r, how many leading dims rotate (even, at most d). Default d, or
            ``int(d * partial_rotary_factor)`` when the dict has that key. A ``whole_head`` type
            (proportional) rotates over d and takes no rotary_dim other than d.
        rope_scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, as it is: key
            ``rope_type`` (or ``type``) naming one of ``ROPE_TYPES`` (default, linear, dynamic, yarn,
            longrope, llama3, proportional and any registered one), with that type's keys
            (checked by :func:`check_scaling`, as ``RopeSpec`` checks them). None means default.
        seq_len: the current length L, for the length-dependent types (dynamic, longrope).
        max_position_embeddings: what Hugging Face reads from the model config: the dynamic-NTK
            threshold :math:`L_0`, and the fallback for original_max_position_embeddings.
        dtype: float64 (default) or float32.

    Each type's formula and paper is in the docstring of its function in ``ROPE_TYPES``.
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"frequencies are computed in float32 or float64, got {dtype}; low-precision frequencies are "
            "the bug ropelab.diagnose looks for. Cast the cos/sin tables instead."
        )
    params = parse_scaling(rope_scaling)
    rec = ROPE_TYPES[params.rope_type]
    if params.get("rope_theta") is not None:
        base = float(params["rope_theta"])
    if not (isinstance(head_dim, int) and head_dim > 0):
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}.")
    if rec.whole_head:
        if rotary_dim not in (None, head_dim):
            raise ValueError(
                f"rope_type {rec.name!r} rotates over the whole head ({head_dim} dims) and reads "
                f"partial_rotary_factor from the dict; got rotary_dim={rotary_dim!r}. Leave rotary_dim unset."
            )
        rotary_dim = head_dim
    elif rotary_dim is None:
        rotary_dim = int(head_dim * float(params.get("partial_rotary_factor", 1.0)))
    check_rotary_dim(rotary_dim, head_dim)
    check_base(base)
    check_scaling(params, rotary_dim=rotary_dim, max_position_embeddings=max_position_embeddings)
    inv_freq, attention_factor = rec(rotary_dim, float(base), params, seq_len, max_position_embeddings, dtype)
    return inv_freq, float(attention_factor)


def check_rotary_dim(rotary_dim: int, head_dim: int) -> None:
    """Raise ValueError unless 0 < rotary_dim <= head_dim and rotary_dim is even."""
    if not isinstance(rotary_dim, int) or rotary_dim <= 0:
        raise ValueError(f"rotary_dim must be a positive int, got {rotary_dim!r}.")
    if rotary_dim % 2:
        raise ValueError(
            f"rotary_dim must be even (RoPE rotates pairs of dims), got {rotary_dim}; use {rotary_dim - 1} "
            f"or {rotary_dim + 1}."
        )
    if rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim={rotary_dim} is larger than the head dim {head_dim}; it must be at most {head_dim} "
            "(dims past rotary_dim pass through unrotated)."
        )


def rope_type_of(rope_scaling: Mapping[str, Any] | None) -> str:
    """The rope type a scaling dict names (``rope_type``, or the legacy ``type``); "default" for None."""
    return parse_scaling(rope_scaling).rope_type


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_base(base: Any) -> None:
    """Raise ValueError naming ``base`` unless it is a finite real number > 1."""
    if not _is_real(base) and not (isinstance(base, torch.Tensor) and base.numel() == 1):
        raise ValueError(
            f"base must be > 1, a number (RoPE's rope_theta, usually 10000), got {type(base).__name__} {base!r}."
        )
    if not (math.isfinite(float(base)) and float(base) > 1):
        raise ValueError(f"base must be > 1 and finite (RoPE's rope_theta, usually 10000), got {float(base)}.")


def _value_ok(kind: str, v: Any) -> bool:
    if kind == FLAG:
        return isinstance(v, bool)
    if kind == POSITIVE_LIST:
        return (isinstance(v, Sequence) and not isinstance(v, (str, bytes)) and len(v) > 0
                and all(_value_ok(POSITIVE, f) for f in v))
    if not _is_real(v) or not math.isfinite(v):
        return False
    if kind == NONNEGATIVE:
        return v >= 0
    return v > 0 and (kind != FRACTION or v <= 1)


def check_scaling_values(params: Mapping[str, Any]) -> None:
    """Raise ValueError naming the key: for a key its type does not read, a value that is not what the key
    holds (the record's kind: a NaN, zero or string factor, a bool where a number or a list belongs, None
    for a key that is not ``nullable``), or a required key that is missing or None. ``params`` is a
    :class:`ScalingParams` or a plain dict."""
    rope_type = getattr(params, "rope_type", None) or params.get("rope_type", params.get("type", "default"))
    rec = ROPE_TYPES[rope_type]
    kinds = {**COMMON_KEYS, **rec.keys}
    unknown = sorted(set(params) - {"rope_type", "type"} - set(kinds))
    if unknown:
        raise ValueError(
            f"scaling key(s) {unknown} are not read by rope_type {rope_type!r} (it reads "
            f"{sorted(rec.keys)}, and rope_theta / partial_rotary_factor); check the spelling."
        )
    for key in sorted(rec.required):
        if params.get(key) is None:
            raise ValueError(
                f"rope_scaling of type {rope_type!r} needs the key {key!r}; add it to the dict "
                f"(Hugging Face configs keep it in rope_scaling / rope_parameters)."
            )
    for key, kind in kinds.items():
        v = params.get(key)
        if v is None and (key not in params or key in rec.nullable):
            continue
        if not _value_ok(kind, v):
            shown = list(v)[:4] if isinstance(v, (list, tuple)) else v
            raise ValueError(f"rope_scaling[{key!r}] must be {kind}, got {type(v).__name__} {shown!r}.")
