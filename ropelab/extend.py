r"""The context-extension methods as one table of :class:`~ropelab.spec.RopeSpec`, and what they do to each pair.

Pure: no model, no training, no data. The trained context :math:`L_0` (``original``) and the base are passed
in, so the same table serves notebook 05 (``ropelab.lm.schemes``), notebook 07 (``ropelab.extension``), the
explorers and any model. A method is a ``RopeSpec``; :func:`method_spec` puts it on a model's RoPE (its style
and rotary_dim kept).

* :func:`methods`: every method at extension factor s, name -> ``RopeSpec``;
* :func:`ratio_table`: per method, :math:`\omega_i'/\omega_i` per pair and the attention factor;
* :func:`out_of_range_pairs`: the pairs that meet angles they were never trained on at :math:`sL_0`;
* :func:`ntk_alpha_in_range`: the smallest NTK-aware :math:`\alpha` that keeps every pair in range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from .scaling import critical_pair, default_inv_freq, ntk_aware_base
from .scaling.checks import check_base, check_int
from .spec import RopeSpec

__all__ = ["methods", "method_spec", "ratio_table", "out_of_range_pairs", "ntk_alpha_in_range", "extension_ratios"]


def methods(scale: float, head_dim: int, *, base: float, original: int,
            longrope: Mapping | None = None) -> dict[str, RopeSpec]:
    r"""Every context-extension method at extension factor ``scale`` for a head of ``head_dim`` dims, base
    ``base`` and trained context ``original`` (:math:`L_0`): name -> the method's ``RopeSpec`` (default style,
    the whole head rotating, ``max_position_embeddings = original``; :func:`method_spec` moves it onto a
    model's RoPE).

    * **no scaling**: the trained RoPE.
    * **PI** (Chen et al. 2023, arXiv 2306.15595): positions divided by s, :math:`\omega_i' = \omega_i / s`.
    * **NTK-aware** (bloc97, 2023): base :math:`b\,s^{r/(r-2)}` (``scaling.ntk_aware_base`` at
      :math:`\alpha = s`).
    * **dynamic NTK**: NTK-aware with :math:`\alpha(L) = sL/L_0 - (s-1)` at the current length L (Hugging
      Face's ``_compute_dynamic_ntk_parameters``); the identity up to :math:`L_0`, :math:`\alpha = s^2 - s + 1`
      at :math:`L = sL_0`.
    * **YaRN** (Peng et al. 2023, arXiv 2309.00071): NTK-by-parts with :math:`\beta_{fast} = 32`,
      :math:`\beta_{slow} = 1` and attention factor :math:`0.1\ln s + 1`.
    * **Llama 3** (Meta 2024): low_freq_factor 1, high_freq_factor 4, Llama 3.1's values.
    * **LongRoPE** (Ding et al. 2024, arXiv 2402.13753): per-pair factors ``longrope["long_factor"]`` past
      :math:`L_0` and ``longrope["short_factor"]`` within it (``ropelab.extension.longrope_search`` finds
      them); left out when ``longrope`` is None.

    Args:
        scale: the extension factor s (the target context is :math:`sL_0`).
        head_dim: the head size d (NTK-aware's base uses it as r: the whole head rotates).
        base: the trained base b.
        original: the trained context :math:`L_0`, every spec's ``max_position_embeddings``.
        longrope: a mapping with ``long_factor`` and ``short_factor`` (d/2 per-pair factors each), or None to
            leave LongRoPE out.
    """
    s = float(scale)

    def spec(new_base: float = base, scaling: dict | None = None) -> RopeSpec:
        return RopeSpec(base=new_base, scaling=scaling, max_position_embeddings=original)

    out = {
        "no scaling": spec(),
        "PI": spec(scaling={"rope_type": "linear", "factor": s}),
        "NTK-aware": spec(ntk_aware_base(base, head_dim, s)),
        "dynamic NTK": spec(scaling={"rope_type": "dynamic", "factor": s}),
        "YaRN": spec(scaling={"rope_type": "yarn", "factor": s, "original_max_position_embeddings": original}),
        "Llama 3": spec(scaling={"rope_type": "llama3", "factor": s, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": original}),
    }
    if longrope is not None:
        out["LongRoPE"] = spec(scaling={"rope_type": "longrope", "factor": s,
                                        "original_max_position_embeddings": original,
                                        "long_factor": list(longrope["long_factor"]),
                                        "short_factor": list(longrope["short_factor"])})
    return out


def method_spec(spec: RopeSpec, method: RopeSpec | Mapping) -> RopeSpec:
    """``spec`` (a model's RoPE) with a method's base and scaling; its style, rotary_dim and :math:`L_0` kept.
    ``method`` is a ``RopeSpec`` (a value of :func:`methods`) or a mapping with ``base`` and ``scaling``.

    Args:
        spec: the model's RoPE.
        method: a ``RopeSpec`` or a mapping with the keys ``base`` and ``scaling``; anything else raises
            ValueError.
    """
    if isinstance(method, RopeSpec):
        base, scaling = method.base, method.scaling
    elif isinstance(method, Mapping) and {"base", "scaling"} <= set(method):
        base, scaling = method["base"], method["scaling"]
    else:
        raise ValueError(f"method must be a RopeSpec (a value of ropelab.extend.methods) or a mapping with 'base' "
                         f"and 'scaling', got {method!r}.")
    return replace(spec, base=base, scaling=scaling)


def ratio_table(scale: float, head_dim: int, *, base: float, original: int, seq_len: int | None = None,
                longrope: Mapping | None = None) -> dict[str, dict]:
    r"""Per method of :func:`methods`: the per-pair frequency ratio :math:`\omega_i' / \omega_i` (float64 list,
    pair 0 = highest frequency) and the attention factor, evaluated at length ``seq_len`` (default
    :math:`sL_0`).

    Args:
        scale: the extension factor s.
        head_dim: the head size d.
        base: the trained base b.
        original: the trained context :math:`L_0`.
        seq_len: the current length L at which length-dependent methods (dynamic NTK, LongRoPE) are
            evaluated; None: ``int(scale * original)``.
        longrope: as in :func:`methods`.

    Returns name -> ``{"ratio": [d/2 floats], "attention_factor": float}``.
    """
    seq_len = int(scale * original) if seq_len is None else seq_len
    ref = default_inv_freq(head_dim, base)
    out = {}
    for name, m in methods(scale, head_dim, base=base, original=original, longrope=longrope).items():
        inv, att = m.frequencies(head_dim, seq_len=seq_len)
        out[name] = {"ratio": (inv / ref).tolist(), "attention_factor": float(att)}
    return out


def out_of_range_pairs(ratio, scale: float, rotary_dim: int, base: float, original: int) -> list[int]:
    r"""The pairs that meet angles they were never trained on at length :math:`sL_0`: those that do not turn within
    :math:`L_0` (``scaling.critical_pair`` and above; the others saw every angle) and whose largest angle
    :math:`sL_0\,\omega_i'` exceeds the largest trained one :math:`L_0\,\omega_i`, i.e.
    :math:`s\,\omega_i'/\omega_i > 1`
    (``ratio`` = :math:`\omega_i'/\omega_i` per pair; a relative slack of 1e-9 absorbs round-off).

    Args:
        ratio: :math:`\omega_i'/\omega_i` per pair, r/2 numbers (a ``ratio_table`` entry's ``"ratio"``).
        scale: the extension factor s.
        rotary_dim: r, the rotated dims.
        base: the trained base b.
        original: the trained context :math:`L_0`.

    Returns the pair indices, ascending.
    """
    crit = critical_pair(rotary_dim, base, original)
    return [i for i in range(crit, rotary_dim // 2) if scale * float(ratio[i]) > 1 + 1e-9]


def ntk_alpha_in_range(scale: float, rotary_dim: int, base: float, original: int) -> float:
    r"""The smallest NTK-aware :math:`\alpha` that keeps every non-turning pair in its trained angle range at
    :math:`sL_0`. NTK-aware divides pair i's frequency by :math:`\alpha^{2i/(r-2)}`; pair :math:`i_c`
    (``scaling.critical_pair``, the fastest of those that never turn) needs :math:`\alpha^{2i_c/(r-2)} \ge s`, so
    :math:`\alpha \ge s^{(r-2)/(2 i_c)}`: above s whenever :math:`i_c < (r-2)/2`. YaRN's "the scale value s has
    to be set higher than the expected scale" (Peng et al. 2023, section 3.1), derived.

    Args:
        scale: the extension factor s.
        rotary_dim: r, the rotated dims.
        base: the trained base b.
        original: the trained context :math:`L_0`.

    Returns 1.0 when every pair turns within :math:`L_0`; ValueError when pair 0 does not (no base change helps).
    """
    crit = critical_pair(rotary_dim, base, original)
    if crit >= rotary_dim // 2:
        return 1.0  # every pair turns within L0: no angle is new
    if crit == 0:
        raise ValueError("pair 0 does not turn within L0: no change of base keeps it in range (its ratio stays 1); "
                         "use interpolation (PI) instead.")
    return float(scale) ** ((rotary_dim - 2) / (2 * crit))


def extension_ratios(factor: float = 4.0, head_dim: int = 32, base: float = 10000.0,
                     original_length: int = 256) -> dict:
    r"""Every context-extension method at factor s (:func:`ropelab.extend.ratio_table`, evaluated at
    :math:`sL_0`): ``ratio[name]`` :math:`\omega_i'/\omega_i` per pair (float64 numpy), ``attention_factor[name]``,
    ``out_of_range[name]`` (the pairs that meet angles never trained on,
    :func:`ropelab.extend.out_of_range_pairs`) and ``critical`` (the first pair that never turns within
    :math:`L_0`, :func:`ropelab.scaling.critical_pair`).

    Args:
        factor: the extension factor s, a number in [1, 1024].
        head_dim: d, an even int in [4, 1024] (the whole head rotates).
        base: the trained base b (a finite number > 1).
        original_length: the trained context :math:`L_0`, an int >= 8.

    ValueError names an argument out of range.
    """
    head_dim = check_int("head_dim", head_dim, 4, 1024, even=True)
    original_length = check_int("original_length", original_length, 8)
    check_base(base)
    base = float(base)
    if not isinstance(factor, int | float) or not 1 <= factor <= 1024:
        raise ValueError(f"factor must be a number in [1, 1024] (the extension factor s), got {factor!r}.")
    table = ratio_table(float(factor), head_dim, original=original_length, base=base)
    return {
        "ratio": {k: np.asarray(v["ratio"]) for k, v in table.items()},
        "attention_factor": {k: v["attention_factor"] for k, v in table.items()},
        "out_of_range": {k: out_of_range_pairs(v["ratio"], float(factor), head_dim, base, original_length)
                         for k, v in table.items()},
        "critical": critical_pair(head_dim, base, original_length),
    }
