r"""One RoPE setting: :class:`RopeSpec`, validated once, read from a Hugging Face config as it is.

A RoPE layer is fixed by five things: the *style* (which dims pair up), the *base* b, the *rotary_dim* r
(how many leading head dims rotate), a *scaling* (a Hugging Face rope dict of a type in
``ropelab.scaling.ROPE_TYPES``: linear, dynamic, yarn, longrope, llama3, proportional, or a registered one)
and, for the length-dependent scalings, the trained context ``max_position_embeddings``. Pair i then turns
at :math:`\omega_i = b^{-2i/r}` before scaling (Su et al. 2021, arXiv 2104.09864; each scaling's formula
is in ``ropelab.scaling``).

Real configs are where users fail: the base or the scaling silently dropped because the config schema
changed. :meth:`RopeSpec.from_hf_config` reads both schemas of ``transformers``:

- v4: ``rope_theta``, ``rope_scaling`` (its type under ``rope_type``, or the legacy key ``type``),
  ``partial_rotary_factor``, ``head_dim`` (else ``hidden_size // num_attention_heads``), and Gemma 3's
  ``rope_local_base_freq`` for its sliding-window layers (which layers slide: ``layer_types``, or the older
  ``sliding_window_pattern``);
- v5: ``rope_parameters``, either one dict or one dict per layer type (``layer_types``; Gemma 3's
  ``full_attention`` / ``sliding_attention``).

Models whose layers use different RoPE have one spec per layer (:meth:`RopeSpec.per_layer`); asking such a
model for a single spec raises. Every key the reader needs and does not find raises ``ValueError``
naming it, and so does every key it does not know: nothing falls back to a default silently.

Switching settings is ``dataclasses.replace(spec, base=...)``: a spec is frozen and shared safely.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .core import check_style
from .scaling import ROPE_TYPES, SCALING_KEYS, check_base, check_rotary_dim, check_scaling, frequencies, parse_scaling

__all__ = ["RopeSpec", "SCALING_KEYS", "INTERLEAVED_MODEL_TYPES", "head_dim_of"]

# Keys of a v5 rope_parameters dict that are not scaling keys: they become base and rotary_dim.
_LIFTED = ("rope_theta", "partial_rotary_factor")
# transformers model types whose attention pairs (2i, 2i + 1) ("rotate_every_two"); every other model with
# RoPE in transformers applies rotate_half. DeepSeek-V3 says so in its config (rope_interleave).
INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "codegen"})


def _lifted(rope_type: str) -> tuple[str, ...]:
    """The v5 keys that become base / rotary_dim: all of _LIFTED but those the type reads itself (proportional
    keeps partial_rotary_factor; ``SCALING_KEYS`` is read off ``ropelab.scaling.ROPE_TYPES``)."""
    return tuple(k for k in _LIFTED if k not in SCALING_KEYS[rope_type])


def _need(config: Any, key: str, where: str = "the config") -> Any:
    value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
    if value is None:
        raise ValueError(f"{where} has no {key!r}, which RoPE needs; set it (ropelab does not guess a default).")
    return value


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


@dataclass(frozen=True)
class RopeSpec:
    r"""The RoPE of one attention layer: style, base, rotary_dim, scaling, max_position_embeddings.

    Args:
        style: ``"half"`` pairs (i, i + r/2) (Llama, GPT-NeoX, Hugging Face's ``rotate_half``);
            ``"interleaved"`` pairs (2i, 2i + 1) (GPT-J, RoFormer, Meta, DeepSeek-V3).
        base: b, Hugging Face's ``rope_theta`` (> 1).
        rotary_dim: r, the leading head dims that rotate (even); None means the whole head.
        scaling: a Hugging Face rope dict with ``rope_type`` (or the legacy ``type``) and that type's keys
            (see ``ropelab.scaling``), or None for the default. It may not hold ``rope_theta`` or
            ``partial_rotary_factor``: those are ``base`` and ``rotary_dim`` here (one home each; use
            :meth:`from_rope_dict` to lift them out of a v5 dict).
        max_position_embeddings: the trained context :math:`L_0` of the length-dependent scalings.

    Validated once, here; frozen, so switching a scheme is ``dataclasses.replace``.
    """

    style: str = "half"
    base: float = 10000.0
    rotary_dim: int | None = None
    scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        check_style(self.style)
        if isinstance(self.base, bool):
            raise ValueError(f"base must be a number > 1 (RoPE's rope_theta, usually 10000), got {self.base!r}.")
        check_base(self.base)
        object.__setattr__(self, "base", float(self.base))
        if self.rotary_dim is not None:
            check_rotary_dim(self.rotary_dim, self.rotary_dim)
        if self.max_position_embeddings is not None and (
            not isinstance(self.max_position_embeddings, int) or self.max_position_embeddings <= 0
        ):
            raise ValueError(f"max_position_embeddings must be a positive int, got {self.max_position_embeddings!r}.")
        if self.scaling is not None:
            params = parse_scaling(self.scaling)  # a Mapping with a known rope_type and known keys, or ValueError
            lifted = [k for k in _lifted(params.rope_type) if k in self.scaling]
            if lifted:
                raise ValueError(
                    f"scaling holds {lifted}: give rope_theta as base= and partial_rotary_factor as rotary_dim= "
                    "(or build the spec with RopeSpec.from_rope_dict, which lifts them out)."
                )
            if self.rotary_dim is not None and ROPE_TYPES[params.rope_type].whole_head:
                raise ValueError(
                    f"rope_type {params.rope_type!r} rotates over the whole head and reads partial_rotary_factor "
                    f"from the scaling dict; leave rotary_dim unset (got {self.rotary_dim})."
                )
            # The checks frequencies makes, now: a missing key or L0 raises at construction, not at first use.
            check_scaling(params, rotary_dim=self.rotary_dim, max_position_embeddings=self.max_position_embeddings)
            object.__setattr__(self, "scaling", types.MappingProxyType(dict(self.scaling)))

    @property
    def rope_type(self) -> str:
        """The scaling's type, ``"default"`` when there is none."""
        return "default" if self.scaling is None else parse_scaling(self.scaling).rope_type

    def frequencies(self, head_dim: int, *, seq_len: int | None = None,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` for a head of ``head_dim`` dims at current length ``seq_len``
        (``ropelab.frequencies`` with this spec's settings)."""
        return frequencies(head_dim, self.base, rotary_dim=self.rotary_dim, rope_scaling=self.scaling,
                           seq_len=seq_len, max_position_embeddings=self.max_position_embeddings, dtype=dtype)

    def to_dict(self) -> dict:
        """Plain types only (for a checkpoint or JSON): the inverse of ``RopeSpec(**d)``."""
        return {"style": self.style, "base": self.base, "rotary_dim": self.rotary_dim,
                "scaling": None if self.scaling is None else dict(self.scaling),
                "max_position_embeddings": self.max_position_embeddings}

    # ----------------------------------------------------------------------------------------------
    # Hugging Face configs
    # ----------------------------------------------------------------------------------------------

    @classmethod
    def from_rope_dict(cls, params: Mapping[str, Any], *, head_dim: int, style: str = "half",
                       max_position_embeddings: int | None = None) -> RopeSpec:
        """A spec from one v5 ``rope_parameters`` dict (or a v4 ``rope_scaling`` dict plus its
        ``rope_theta``): ``rope_theta`` becomes ``base`` (required), ``partial_rotary_factor`` becomes
        ``rotary_dim = int(head_dim * factor)``, the rest is the scaling."""
        if not isinstance(params, Mapping):
            raise ValueError(f"a rope dict must be a Mapping such as {{'rope_type': 'default', 'rope_theta': 1e4}}, "
                             f"got {type(params).__name__}.")
        base = _need(params, "rope_theta", "the rope dict")
        lifted = _lifted(parse_scaling({k: v for k, v in params.items() if k not in _LIFTED}).rope_type)
        factor = params.get("partial_rotary_factor") if "partial_rotary_factor" in lifted else None
        rotary_dim = None
        if factor is not None:
            rotary_dim = int(head_dim * float(factor))
            check_rotary_dim(rotary_dim, head_dim)
        scaling = {k: v for k, v in params.items() if k not in lifted}
        if parse_scaling(scaling).rope_type == "default" and set(scaling) <= {"rope_type", "type"}:
            scaling = None
        if rotary_dim == head_dim:
            rotary_dim = None
        return cls(style=style, base=float(base), rotary_dim=rotary_dim, scaling=scaling,
                   max_position_embeddings=max_position_embeddings)

    @classmethod
    def from_keywords(cls, head_dim: int, *, style: str = "half", base: float = 10000.0,
                      rotary_dim: int | None = None, rope_scaling: Mapping[str, Any] | None = None,
                      max_position_embeddings: int | None = None) -> RopeSpec:
        """The spec that ``apply_rope``'s keywords describe, for a head of ``head_dim`` dims.

        ``rope_scaling`` is read as :func:`ropelab.frequencies` reads it, a Hugging Face dict as it is: its
        ``rope_theta`` replaces ``base``, and its ``partial_rotary_factor`` gives ``rotary_dim =
        int(head_dim * factor)`` unless ``rotary_dim`` is given (proportional keeps the key: it reads
        exponents over the full head dim). The spec then computes the same ``frequencies`` as the keywords."""
        if rope_scaling is not None:
            lifted = _lifted(parse_scaling(rope_scaling).rope_type)  # a non-dict or unknown type: ValueError
            if rope_scaling.get("rope_theta") is not None:
                base = rope_scaling["rope_theta"]
            factor = rope_scaling.get("partial_rotary_factor") if "partial_rotary_factor" in lifted else None
            if rotary_dim is None and factor is not None:
                rotary_dim = int(head_dim * float(factor))
            rope_scaling = {k: v for k, v in rope_scaling.items() if k not in lifted}
        return cls(style=style, base=base, rotary_dim=rotary_dim, scaling=rope_scaling,
                   max_position_embeddings=max_position_embeddings)

    @classmethod
    def per_layer(cls, config: Any) -> tuple[RopeSpec, ...]:
        """One spec per decoder layer of a Hugging Face config (a ``PretrainedConfig`` or its ``to_dict()``),
        v4 or v5 schema; see the module docstring for the keys read."""
        n_layers = _need(config, "num_hidden_layers")
        head_dim = head_dim_of(config)
        style = _style_of(config)
        max_pos = _need(config, "max_position_embeddings")
        layer_types = _get(config, "layer_types")
        pattern = _get(config, "sliding_window_pattern")
        if layer_types is None and pattern is not None:
            # Older Gemma 3 configs give the pattern instead of the list; transformers' own rule
            # (Gemma3TextConfig): every pattern-th layer is global, the others slide.
            layer_types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(n_layers)]
        if layer_types is not None and len(layer_types) != n_layers:
            raise ValueError(f"layer_types has {len(layer_types)} entries for num_hidden_layers={n_layers}.")
        by_type = _rope_dicts(config, layer_types)
        types_ = layer_types if layer_types is not None else [None] * n_layers
        specs = {t: cls.from_rope_dict(d, head_dim=head_dim, style=style, max_position_embeddings=max_pos)
                 for t, d in by_type.items()}
        missing = sorted({t for t in types_ if t not in specs}, key=str)
        if missing:
            raise ValueError(f"rope_parameters has no entry for layer type(s) {missing} (it has {sorted(specs)}).")
        return tuple(specs[t] for t in types_)

    @classmethod
    def from_hf_config(cls, config: Any) -> RopeSpec:
        """The spec of a Hugging Face config whose layers all share one RoPE (Llama, Qwen2, Phi-3, GPT-NeoX,
        DeepSeek-V3, ...). A model with different RoPE per layer (Gemma 3) raises: use :meth:`per_layer`."""
        specs = cls.per_layer(config)
        distinct = list(dict.fromkeys(specs))
        if len(distinct) != 1:
            raise ValueError(
                f"this model's layers use {len(distinct)} different RoPE settings (layer_types "
                f"{sorted(set(_get(config, 'layer_types') or []))}); use RopeSpec.per_layer(config), one spec per "
                "layer."
            )
        return distinct[0]

    def __hash__(self) -> int:
        scaling = None if self.scaling is None else tuple(sorted((k, repr(v)) for k, v in self.scaling.items()))
        return hash((self.style, self.base, self.rotary_dim, scaling, self.max_position_embeddings))


def head_dim_of(config: Any) -> int:
    """The rotated head's size: ``qk_rope_head_dim`` (DeepSeek's MLA rotates a separate slice of that width),
    else ``head_dim``, else ``hidden_size // num_attention_heads``."""
    for key in ("qk_rope_head_dim", "head_dim"):
        if _get(config, key) is not None:
            return int(_get(config, key))
    return int(_need(config, "hidden_size")) // int(_need(config, "num_attention_heads"))


def _style_of(config: Any) -> str:
    if _get(config, "rope_interleave") is not None:
        return "interleaved" if _get(config, "rope_interleave") else "half"
    return "interleaved" if _get(config, "model_type") in INTERLEAVED_MODEL_TYPES else "half"


def _rope_dicts(config: Any, layer_types: Sequence[str] | None) -> dict[str | None, dict]:
    """{layer type (None for all layers): v5-style rope dict with rope_theta} from either schema."""
    params = _get(config, "rope_parameters")
    if params is not None:  # v5
        if not isinstance(params, Mapping):
            raise ValueError(f"rope_parameters must be a dict, got {type(params).__name__}.")
        if layer_types is not None and set(layer_types) <= set(params) and all(
            isinstance(params[t], Mapping) for t in set(layer_types)
        ):
            return {t: dict(params[t]) for t in set(layer_types)}
        if "rope_type" not in params and "type" not in params:
            raise ValueError(
                f"rope_parameters has neither 'rope_type' nor an entry per layer type (keys {sorted(params)}, "
                f"layer_types {sorted(set(layer_types or []))})."
            )
        return {t: dict(params) for t in set(layer_types or [None])}
    # v4: rope_theta at the top, rope_scaling (may be None), partial_rotary_factor at the top.
    theta = _need(config, "rope_theta")
    top = {"rope_theta": theta}
    if _get(config, "partial_rotary_factor") is not None:
        top["partial_rotary_factor"] = _get(config, "partial_rotary_factor")
    scaling = _get(config, "rope_scaling")
    global_dict = {**top, **(dict(scaling) if scaling is not None else {"rope_type": "default"})}
    if layer_types is None:
        return {None: global_dict}
    out = {t: global_dict for t in set(layer_types)}
    if "sliding_attention" in out and str(_get(config, "model_type")).startswith("gemma3"):
        _need(config, "rope_local_base_freq")  # Gemma 3's sliding layers have their own base: never guess it
        # Gemma 3: sliding-window layers use their own base and stay unscaled.
        out["sliding_attention"] = {**top, "rope_theta": _get(config, "rope_local_base_freq"), "rope_type": "default"}
    return out
