r"""The frequency ladder of RoPE and its context-extension scalings, one pure function per name.

Every function here returns ``(inv_freq, attention_factor)``: the ``rotary_dim / 2`` inverse
frequencies :math:`\omega_i` (the angle of pair ``i`` at position ``m`` is :math:`m\,\omega_i`) and the
factor that multiplies cos and sin (a norm scale, 1.0 for most types). They are computed in
float64 (``dtype`` selects float32 to mimic an implementation that holds them in float32).

``frequencies`` reads a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict as it is, so the
numbers can be checked against ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (the tests do).
This module imports nothing from the rest of ropelab: it is the bottom of the import graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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
    if max_pos is None:
        raise ValueError(
            "rope_type 'dynamic' needs max_position_embeddings (the length L0 past which the base grows); "
            "pass max_position_embeddings=... (Hugging Face reads it from the model config)."
        )
    length = max_pos if seq_len is None else seq_len
    new_base = ntk_base(base, rotary_dim, length, max_pos, factor)
    return default_inv_freq(rotary_dim, new_base, dtype), 1.0


def _original_and_factor(params: ScalingParams, max_pos: int | None) -> tuple[int, float]:
    """The pretraining context :math:`L_0` and the extension factor s of yarn / longrope: the dict's
    ``original_max_position_embeddings`` (else ``max_position_embeddings``) and ``factor`` (else
    ``max_position_embeddings / L_0``), as Hugging Face resolves them."""
    original = params.get("original_max_position_embeddings") or max_pos
    if original is None:
        raise ValueError(
            f"rope_type {params.rope_type!r} needs original_max_position_embeddings (the pretraining context); "
            "add it to the dict or pass max_position_embeddings=..."
        )
    factor = params.get("factor")
    if factor is None:
        if max_pos is None:
            raise ValueError(
                f"rope_type {params.rope_type!r} needs 'factor' (or max_position_embeddings to derive it)."
            )
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
    if len(long_factor) != rotary_dim // 2 or len(short_factor) != rotary_dim // 2:
        raise ValueError(
            f"rope_type 'longrope' needs long_factor and short_factor of length rotary_dim/2 = {rotary_dim // 2}, "
            f"got {len(long_factor)} and {len(short_factor)}."
        )
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
    if original is None:
        raise ValueError("rope_type 'llama3' needs original_max_position_embeddings; add it to the dict.")
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
    remaining pairs; here ``rotary_dim`` is the full head dim d (Hugging Face's ``proportional`` type).
    """
    head_dim = params["_head_dim"]
    factor = float(params.get("factor", 1.0))
    n_rot = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
    exponent = torch.arange(0, 2 * n_rot, 2, dtype=torch.float64) / head_dim
    inv = torch.cat([1.0 / (float(base) ** exponent), torch.zeros(head_dim // 2 - n_rot, dtype=torch.float64)])
    return (inv / factor).to(dtype), 1.0


ROPE_TYPES: dict[str, Callable[..., tuple[torch.Tensor, float]]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
    "proportional": _proportional,
}


def parse_scaling(rope_scaling: Mapping[str, Any] | None) -> ScalingParams:
    """A Hugging Face rope dict (or None) as :class:`ScalingParams` with its ``rope_type`` resolved from the key
    ``rope_type`` or the legacy ``type``; ValueError for a non-dict or an unknown type."""
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
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"unknown rope_type {rope_type!r}; ropelab knows {sorted(ROPE_TYPES)}. "
            "Check the spelling (Hugging Face uses the key 'rope_type', older configs 'type')."
        )
    params.rope_type = rope_type
    check_scaling_values(params)
    return params


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
            ``int(d * partial_rotary_factor)`` when the dict has that key.
        rope_scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, as it is: key
            ``rope_type`` (or ``type``) in default, linear, dynamic, yarn, longrope, llama3,
            proportional, with that type's keys. None means default.
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
    if params.get("rope_theta") is not None:
        base = float(params["rope_theta"])
    if not (isinstance(head_dim, int) and head_dim > 0):
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}.")
    if rotary_dim is None:
        rotary_dim = int(head_dim * float(params.get("partial_rotary_factor", 1.0)))
    check_rotary_dim(rotary_dim, head_dim)
    check_base(base)
    if params.rope_type == "proportional":
        params["_head_dim"] = head_dim
    fn = ROPE_TYPES[params.rope_type]
    inv_freq, attention_factor = fn(rotary_dim, float(base), params, seq_len, max_position_embeddings, dtype)
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


# --------------------------------------------------------------------------------------------------
# The rope-type lookup and the checks on numbers a config carries
# --------------------------------------------------------------------------------------------------

# Types whose frequencies depend on the current length L (callers pass seq_len = max(position) + 1).
LENGTH_DEPENDENT = frozenset({"dynamic", "longrope"})

# Keys of a scaling dict that must be finite and > 0 when present (partial_rotary_factor also <= 1).
_POSITIVE_KEYS = (
    "factor",
    "rope_theta",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "partial_rotary_factor",
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


def check_scaling_values(params: Mapping[str, Any]) -> None:
    """Raise ValueError naming the key when a number of a scaling dict is not finite and positive
    (a NaN or zero factor would otherwise give NaN or infinite frequencies silently)."""
    for key in _POSITIVE_KEYS:
        v = params.get(key)
        if v is None:
            continue
        if not _is_real(v) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"rope_scaling[{key!r}] must be a finite number > 0, got {v!r}.")
    if params.get("partial_rotary_factor") is not None and params["partial_rotary_factor"] > 1:
        got = params["partial_rotary_factor"]
        raise ValueError(f"rope_scaling['partial_rotary_factor'] must be in (0, 1], got {got}.")
    for key in ("long_factor", "short_factor"):
        v = params.get(key)
        if v is not None and not all(_is_real(f) and math.isfinite(f) and f > 0 for f in v):
            raise ValueError(f"rope_scaling[{key!r}] must hold finite numbers > 0, got {list(v)[:4]}...")
