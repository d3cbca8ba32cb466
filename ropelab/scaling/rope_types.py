r"""The built-in rope types, one record beside its function: default, linear, dynamic, yarn, longrope, llama3,
proportional. Each function's docstring carries its formula and paper; each record says which keys the type
reads, which are required, whether it depends on the length and which key is its original length (the
fields of :class:`~ropelab.scaling.registry.RopeType`). Importing this module registers them."""

from __future__ import annotations

import math

import torch

from .checks import FLAG, FRACTION, NONNEGATIVE, POSITIVE, POSITIVE_LIST
from .ladder import default_inv_freq, ntk_base, pair_at_turns
from .registry import BUILTIN_NAMES, ROPE_TYPES, RopeType, ScalingParams

__all__ = ["BUILTIN", "yarn_mscale"]


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


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    r"""YaRN's attention scaling :math:`0.1\,m \ln s + 1` for :math:`s > 1`, else 1 (Peng et al. 2023,
    arXiv 2309.00071, eq. 22 with :math:`\sqrt{1/t} = 0.1 \ln s + 1`; transformers' ``get_mscale`` inside
    ``_compute_yarn_parameters`` in ``modeling_rope_utils.py``, where DeepSeek's ``mscale`` / ``mscale_all_dim``
    are the m of a ratio of two).

    Args:
        scale: s, the context-extension factor (the dict's ``factor``).
        mscale: m, which multiplies :math:`0.1 \ln s` (1 in YaRN; DeepSeek's ``mscale`` or ``mscale_all_dim``).

    Returns the factor that multiplies cos and sin (1 for :math:`s \le 1`)."""
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
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
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
BUILTIN = (
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

for _rec in BUILTIN:
    ROPE_TYPES[_rec.name] = _rec
    BUILTIN_NAMES.add(_rec.name)
