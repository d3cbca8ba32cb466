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

A config without ``rope_parameters`` (a published ``config.json`` of before transformers 5) is read as its model
type's config class reads it, by rules measured on the class (``ropelab.conformance.hf_config_rules``): the keys it
takes the base and the rotary share from (GPT-NeoX's ``rotary_emb_base`` and ``rotary_pct``), its defaults where
the config gives none, the layer patterns it derives (Bamba's ``attn_layer_indices``, Qwen3-Next's
``full_attention_interval``, Llama 4's ``no_rope_layer_interval``), and a composite config's ``text_config``.

Models whose layers use different RoPE have one spec per layer (:meth:`RopeSpec.per_layer`); asking such a
model for a single spec raises. Every key the reader needs and does not find raises ``ValueError``
naming it, and so does every key it does not know; the one default it applies is the config class's own where the
config gives no base or rotary share (transformers runs that default; :func:`hf_config_notes` names it).

Switching settings is ``dataclasses.replace(spec, base=...)``: a spec is frozen and shared safely.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .core import check_style
from .scaling import ROPE_TYPES, SCALING_KEYS, check_base, check_rotary_dim, check_scaling, frequencies, parse_scaling
from .scaling.checks import is_real

__all__ = ["RopeSpec", "SCALING_KEYS", "HF_KEYS", "head_dim_of", "hf_config_notes", "text_part", "measured_conventions",
           "MAX_LAYERS",
           "MAX_HEAD_DIM"]

# Bounds on the sizes a config may give (transformers has none: its config classes take any int, and
# 10**12 layers fail later, allocating). Far beyond any published model (the deepest decoders have a few
# hundred layers; llama.cpp caps GGUF files at LLAMA_MAX_LAYERS = 512; head dims are 64 to 512), and small
# enough that a reader's per-layer tuple and a head's frequency table stay within a few MiB.
MAX_LAYERS = 1 << 16
MAX_HEAD_DIM = 1 << 16

# Keys of a v5 rope_parameters dict that are not scaling keys: they become base and rotary_dim.
_LIFTED = ("rope_theta", "partial_rotary_factor")
# The top-level config keys per_layer reads (a config class may name them otherwise: its attribute_map, which
# the conformance sweep records per model type in ropelab.conformance.hf_table).
HF_KEYS = frozenset({"num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim", "qk_rope_head_dim",
                     "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
                     "partial_rotary_factor", "rotary_dim", "rotary_pct", "rotary_emb_base", "layer_types",
                     "no_rope_layers"})


def __getattr__(name: str):
    if name == "INTERLEAVED_MODEL_TYPES":  # the old hand-typed list; the pairing is measured now
        import warnings

        from .conformance.hf_table import CONVENTIONS

        warnings.warn("ropelab.spec.INTERLEAVED_MODEL_TYPES is deprecated: the pairing of each model type is "
                      "measured on transformers' code, see ropelab.conformance.hf_table.CONVENTIONS.",
                      DeprecationWarning, stacklevel=2)
        return frozenset(t for t, c in CONVENTIONS.items() if c.get("style") == "interleaved")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        llama_4_scaling_beta: :math:`\beta` of the query scale some attentions apply *after* the rotation, outside
            it (transformers' Ministral 3 and Mistral 4 read it from their rope dict:
            ``query_states * get_llama_4_attn_scale(position_ids, beta, original_max_position_embeddings)``), or
            None. The rotation does not read it, and ``apply_rope`` does not apply it (it scales the query, not
            the key); :meth:`query_scale` gives the factor :math:`1 + \beta\ln(1 + \lfloor m / L_0\rfloor)`.

    Validated once, here; frozen, so switching a scheme is ``dataclasses.replace``.
    """

    style: str = "half"
    base: float = 10000.0
    rotary_dim: int | None = None
    scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int | None = None
    llama_4_scaling_beta: float | None = None

    def __post_init__(self) -> None:
        check_style(self.style)
        if isinstance(self.base, bool):
            raise ValueError(f"base must be a number > 1 (RoPE's rope_theta, usually 10000), got {self.base!r}.")
        check_base(self.base)
        object.__setattr__(self, "base", float(self.base))
        if self.rotary_dim == 0 and not isinstance(self.rotary_dim, bool):  # a NoPE layer: nothing rotates
            if self.scaling is not None:
                raise ValueError("rotary_dim=0 (a layer without RoPE) takes no scaling; drop scaling=.")
        elif self.rotary_dim is not None:
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
        if self.llama_4_scaling_beta is not None:
            beta = self.llama_4_scaling_beta
            if not is_real(beta) or not math.isfinite(beta):
                raise ValueError(f"llama_4_scaling_beta must be a finite number (the query scale's beta, e.g. 0.1), "
                                 f"got {type(beta).__name__} {beta!r}.")
            object.__setattr__(self, "llama_4_scaling_beta", float(beta))
            self._query_scale_length()  # ValueError now, not at first use, where L0 is missing

    def _query_scale_length(self) -> int:
        """:math:`L_0` of the query scale: the scaling's ``original_max_position_embeddings`` (transformers reads
        ``rope_parameters.get("original_max_position_embeddings")``, which ``standardize_rope_params`` fills from
        ``max_position_embeddings`` for the types whose L0 falls back to it)."""
        if self.is_nope:
            raise ValueError("llama_4_scaling_beta on a layer without RoPE (rotary_dim=0): transformers applies it "
                             "where it rotates; drop it.")
        rec = ROPE_TYPES[self.rope_type]
        original = (self.scaling or {}).get("original_max_position_embeddings")
        if original is None and rec.original_key == "original_max_position_embeddings":
            original = self.max_position_embeddings
        if original is None:
            raise ValueError(f"llama_4_scaling_beta needs L0, the rope dict's original_max_position_embeddings "
                             f"(rope_type {self.rope_type!r} has none here); transformers divides the position by it "
                             "and fails without one. Add it to the rope dict.")
        return original

    def query_scale(self, positions: torch.Tensor | Sequence[int]) -> torch.Tensor:
        r"""The factor the attention multiplies its *rotated query* by at each position m, float64:
        :math:`1 + \beta\ln(1 + \lfloor m / L_0\rfloor)` (Llama 4's attention temperature in the form of
        transformers' ``get_llama_4_attn_scale``, Ministral 3 and Mistral 4; :math:`\beta` =
        ``llama_4_scaling_beta``, :math:`L_0` the rope dict's ``original_max_position_embeddings``), and ones where
        the spec has no ``llama_4_scaling_beta``. ``apply_rope`` does not apply it: multiply the rotated query by
        ``query_scale(positions)[..., None]`` (a head axis between, as the layout needs) to match such a model.

        Args:
            positions: the token positions m (ints >= 0), any shape.
        """
        m = torch.as_tensor(positions)
        if m.is_floating_point() or m.dtype == torch.bool or (m.numel() and int(m.min()) < 0):
            raise ValueError(f"positions must be ints >= 0, got {m.dtype} {m.flatten()[:4].tolist()}.")
        m = m.to(torch.float64)
        if self.llama_4_scaling_beta is None:
            return torch.ones_like(m)
        return 1 + self.llama_4_scaling_beta * torch.log1p(torch.floor(m / self._query_scale_length()))

    @property
    def is_nope(self) -> bool:
        """True for a layer without RoPE (``rotary_dim == 0``): ``apply_rope`` leaves x as it is."""
        return self.rotary_dim == 0

    @property
    def rope_type(self) -> str:
        """The scaling's type, ``"default"`` when there is none."""
        return "default" if self.scaling is None else parse_scaling(self.scaling).rope_type

    def frequencies(self, head_dim: int, *, seq_len: int | None = None,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` for a head of ``head_dim`` dims at current length ``seq_len``
        (``ropelab.frequencies`` with this spec's settings; no frequencies for a NoPE spec).

        Args:
            head_dim: d, the size of one attention head.
            seq_len: the current length L, for the length-dependent types (dynamic, longrope); None otherwise.
            dtype: float64 (default) or float32.
        """
        if self.is_nope:
            return torch.zeros(0, dtype=dtype), 1.0
        return frequencies(head_dim, self.base, rotary_dim=self.rotary_dim, rope_scaling=self.scaling,
                           seq_len=seq_len, max_position_embeddings=self.max_position_embeddings, dtype=dtype)

    def to_dict(self) -> dict:
        """Plain types only (for a checkpoint or JSON): the inverse of ``RopeSpec(**d)``."""
        return {"style": self.style, "base": self.base, "rotary_dim": self.rotary_dim,
                "scaling": None if self.scaling is None else dict(self.scaling),
                "max_position_embeddings": self.max_position_embeddings,
                **({} if self.llama_4_scaling_beta is None else {"llama_4_scaling_beta": self.llama_4_scaling_beta})}

    # ----------------------------------------------------------------------------------------------
    # Hugging Face configs
    # ----------------------------------------------------------------------------------------------

    @classmethod
    def from_rope_dict(cls, params: Mapping[str, Any], *, head_dim: int, style: str = "half",
                       max_position_embeddings: int | None = None) -> RopeSpec:
        """A spec from one v5 ``rope_parameters`` dict (or a v4 ``rope_scaling`` dict plus its
        ``rope_theta``): ``rope_theta`` becomes ``base`` (required), ``partial_rotary_factor`` becomes
        ``rotary_dim = int(head_dim * factor)``, the rest is the scaling.

        Args:
            params: the dict, e.g. ``{"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                "original_max_position_embeddings": 32768}``.
            head_dim: d, the size of one attention head (what ``partial_rotary_factor`` is a fraction of).
            style: ``"half"`` or ``"interleaved"``: a rope dict does not say (the model's code does).
            max_position_embeddings: the model config's key of that name (dynamic NTK's threshold), or None.
        """
        if not isinstance(params, Mapping):
            raise ValueError(f"a rope dict must be a Mapping such as {{'rope_type': 'default', 'rope_theta': 1e4}}, "
                             f"got {type(params).__name__}.")
        base = _need(params, "rope_theta", "the rope dict")
        if not is_real(base):
            hint = " (write the number without quotes)" if isinstance(base, str) else ""
            raise ValueError(f"the rope dict's rope_theta must be a number, got {type(base).__name__} {base!r}{hint}; "
                             "transformers computes rope_theta ** x and fails on anything else.")
        lifted = _lifted(parse_scaling({k: v for k, v in params.items() if k not in _LIFTED}).rope_type)
        factor = params.get("partial_rotary_factor") if "partial_rotary_factor" in lifted else None
        rotary_dim = None
        if factor is not None:
            if not is_real(factor) or not math.isfinite(factor) or not 0 < factor <= 1:
                raise ValueError(f"partial_rotary_factor must be a number in (0, 1] (the rotating share of the head), "
                                 f"got {type(factor).__name__} {factor!r}.")
            rotary_dim = int(head_dim * factor)
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
        exponents over the full head dim). The spec then computes the same ``frequencies`` as the keywords.
        ``rotary_dim=0`` is refused here: a layer without RoPE is said explicitly, with :meth:`nope`.

        Args:
            head_dim: d, the size of one attention head.
            style: ``"half"`` pairs (i, i + r/2) (Llama, GPT-NeoX); ``"interleaved"`` pairs (2i, 2i + 1) (GPT-J).
            base: the RoPE base b (``rope_theta``).
            rotary_dim: how many leading head dims rotate (even, positive); None for all, or
                ``partial_rotary_factor``'s share.
            rope_scaling: a Hugging Face scaling dict (:func:`ropelab.frequencies`), or None.
            max_position_embeddings: the model's trained context (dynamic NTK's threshold), or None.
        """
        if isinstance(rotary_dim, int) and not isinstance(rotary_dim, bool) and rotary_dim <= 0:
            raise ValueError(f"rotary_dim must be a positive int, got {rotary_dim}; for a layer without RoPE pass "
                             "spec=RopeSpec.nope() instead.")
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
    def nope(cls, max_position_embeddings: int | None = None) -> RopeSpec:
        """The spec of a layer without RoPE (NoPE): ``rotary_dim=0``, so ``apply_rope`` returns x unchanged.

        Args:
            max_position_embeddings: the model's trained context, kept for the record (a NoPE layer reads none).
        """
        return cls(rotary_dim=0, max_position_embeddings=max_position_embeddings)

    @classmethod
    def per_layer(cls, config: Any, *, style: str | None = None) -> tuple[RopeSpec, ...]:
        """One spec per decoder layer of a Hugging Face config (a ``PretrainedConfig`` or its ``to_dict()``),
        v4 or v5 schema; see the module docstring for the keys read.

        The config's ``model_type`` selects what transformers' modeling code fixes and the config does not say,
        measured by ``python -m ropelab.conformance`` into ``ropelab.conformance.hf_table``: the pairing (unless the
        config has ``rope_interleave``), a rotary fraction the code fixes, the layer types without RoPE, the
        config class's key aliases, the rotary-slice keys the code does not read, and its v4 rule for
        per-layer-type rope dicts (or the v4 keys it drops, which are not applied either; :func:`hf_config_notes`
        names them, and a class that drops ``rope_theta`` has its base read from ``rotary_emb_base``, as GPT-NeoX's
        config class reads it). A model type the table does not hold raises, unless ``style=`` is given (then no
        family-specific rule applies).

        Values transformers' config classes refuse, or that its code fails on, raise ValueError naming the key
        (a str, float or bool where an int size belongs, a size < 1 or past ``MAX_LAYERS`` / ``MAX_HEAD_DIM``, a
        rope_theta that is not a number, ``layer_types`` that is not a list of names, an odd head that rotates
        whole, LongRoPE factor lists of the wrong length); ``tests/test_spec_strict.py`` drives transformers on the
        same dicts.

        Args:
            config: a transformers ``PretrainedConfig``, or the dict of its ``config.json``; a multimodal config's
                text part is read (:func:`text_part`).
            style: the pairing, ``"half"`` or ``"interleaved"``, for a model type the convention table does not
                hold (then no family-specific rule applies); None reads it from the table.

        Returns a tuple of ``num_hidden_layers`` specs (:meth:`nope` for a layer without RoPE). A multi-axis
        (M-RoPE) config raises ValueError naming the readers that take it."""
        config, conv = _with_conventions(text_part(config), style)
        if "axes" in conv:
            raise ValueError(f"model type {_get(config, 'model_type')!r} rotates each pair by one of several position "
                             f"axes (measured on transformers' code: sections {conv['axes']['sections']}, "
                             f"{'axial' if conv['axes'].get('axial') else 'M-RoPE'}), and a RopeSpec has one position "
                             "axis; read it with ropelab.multiaxis.per_layer_axes (a RopeSpec and a MultiAxis per "
                             "layer).")
        _check_keys(config, set(conv.get("ignored_keys", ())))
        n_layers = _layer_count(config)
        head_dim = head_dim_of(config)
        style = _style_of(config, conv, style)
        # Read where a scaling reads it (dynamic NTK, a missing L0): from_rope_dict raises there. Default RoPE does
        # not (transformers' CLVP and RecurrentGemma configs have no such key).
        max_pos = _get(config, "max_position_embeddings")
        layer_types = _get(config, "layer_types")
        pattern = _get(config, "sliding_window_pattern")
        if layer_types is None and pattern is not None:
            # Older Gemma 3 configs give the pattern instead of the list; transformers' own rule
            # (Gemma3TextConfig): every pattern-th layer is global, the others slide.
            layer_types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(n_layers)]
        if layer_types is None:
            layer_types = (_layer_types_from_indices(config, n_layers) or _periodic(config, "layer_types", n_layers)
                           or _cycled_layer_types(config, n_layers))
        n_layers, layer_types = _as_the_class_reads_layers(config, n_layers, layer_types)
        if layer_types is None:
            _refuse_underived_layer_types(config, conv)
        if layer_types is not None and len(layer_types) != n_layers:
            raise ValueError(f"layer_types has {len(layer_types)} entries for num_hidden_layers={n_layers}.")
        nope_types = set(conv.get("nope_layer_types", ()))
        by_type = _rope_dicts(config, layer_types, conv, skip=nope_types)
        mrope = sorted({k for d in by_type.values() for k in ("mrope_section", "mrope_interleaved") if k in d})
        if mrope:
            raise ValueError(f"this config's RoPE is multi-axis (M-RoPE: {mrope} in its rope dict; each of its pairs "
                             "turns with one of several position axes), and a RopeSpec has one position axis; read "
                             "it with ropelab.engines.hf.read_config (its sections) or "
                             "ropelab.multiaxis.MultiAxis.from_hf_config.")
        types_ = layer_types if layer_types is not None else [None] * n_layers
        specs = {}
        for t, d in by_type.items():
            d, beta = _outside_rotation(d, max_pos)
            spec = cls.from_rope_dict(_with_partial(config, d, head_dim, conv), head_dim=head_dim, style=style,
                                      max_position_embeddings=max_pos)
            specs[t] = spec if beta is None else dataclasses.replace(spec, llama_4_scaling_beta=beta)
        nope = cls.nope(max_pos)
        specs.update({t: nope for t in nope_types})
        missing = sorted({t for t in types_ if t not in specs}, key=str)
        if missing:
            raise ValueError(f"rope_parameters has no entry for layer type(s) {missing} (it has {sorted(specs)}).")
        uses_rope = _get(config, "no_rope_layers")  # transformers (Llama 4, SmolLM3): use_rope = no_rope_layers[i]
        if uses_rope is None:  # the class may derive it (measured): Llama 4's every 4th layer
            uses_rope = _periodic(config, "no_rope_layers", n_layers)
        if uses_rope is not None and len(uses_rope) != n_layers:
            raise ValueError(f"no_rope_layers has {len(uses_rope)} entries for num_hidden_layers={n_layers}.")
        for spec in set(specs.values()):
            _check_against_head(spec, head_dim)
        return tuple(nope if uses_rope is not None and not uses_rope[i] else specs[t] for i, t in enumerate(types_))

    @classmethod
    def from_hf_config(cls, config: Any, *, style: str | None = None) -> RopeSpec:
        """The spec of a Hugging Face config whose layers all share one RoPE (Llama, Qwen2, Phi-3, GPT-NeoX,
        DeepSeek-V3, ...). A model with different RoPE per layer (Gemma 3) raises: use :meth:`per_layer`.

        Args:
            config: a transformers ``PretrainedConfig``, or the dict of its ``config.json``.
            style: the pairing for a model type the convention table does not hold, as in :meth:`per_layer`.
        """
        specs = cls.per_layer(config, style=style)
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
        return hash((self.style, self.base, self.rotary_dim, scaling, self.max_position_embeddings,
                     self.llama_4_scaling_beta))


def head_dim_of(config: Any) -> int:
    """The rotated head's size: ``qk_rope_head_dim`` (DeepSeek's MLA rotates a separate slice of that width),
    else ``head_dim``, else ``hidden_size // num_attention_heads`` (which must divide: transformers' config
    classes refuse a hidden size that is not a multiple of the heads). ValueError for a size that is not an
    int in [1, ``MAX_HEAD_DIM``]."""
    _check_keys({k: _get(config, k) for k in ("qk_rope_head_dim", "head_dim", "hidden_size", "num_attention_heads")})
    for key in ("qk_rope_head_dim", "head_dim"):
        if _get(config, key) is not None:
            return _get(config, key)
    hidden, heads = _need(config, "hidden_size"), _need(config, "num_attention_heads")
    if hidden % heads:
        raise ValueError(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}, so the config does "
                         f"not fix a head size (hidden_size // num_attention_heads = {hidden // heads} leaves "
                         f"{hidden % heads} dims of the hidden size in no head); give head_dim, as the published "
                         "configs of such models do, or fix one of them.")
    if hidden // heads > MAX_HEAD_DIM:
        raise ValueError(f"hidden_size // num_attention_heads = {hidden // heads} is past ropelab's bound "
                         f"MAX_HEAD_DIM = {MAX_HEAD_DIM} (far beyond any published model); check the config.")
    return hidden // heads


def _check_against_head(spec: RopeSpec, head_dim: int) -> None:
    """What a spec can be checked for only once the head is known: its rotary slice fits the head, and its
    scaling's per-pair lists (LongRoPE's factors) have one entry per rotary pair. transformers accepts such a
    config and fails at the model's forward (a shape mismatch); here it is a ValueError at reading."""
    if spec.is_nope:
        return
    if spec.scaling is None or not ROPE_TYPES[spec.rope_type].whole_head:
        check_rotary_dim(spec.rotary_dim or head_dim, head_dim)  # None: the whole head rotates, so it must be even
    check_scaling(spec.scaling, rotary_dim=spec.rotary_dim or head_dim,
                  max_position_embeddings=spec.max_position_embeddings)


# The config's int sizes: (key, least value, bound). transformers' config classes declare them ``int`` and its
# strict dataclass validation (huggingface_hub's ``@strict``) refuses a str, a float or a bool there.
_INT_KEYS = (("num_hidden_layers", 1, MAX_LAYERS), ("num_attention_heads", 1, None), ("hidden_size", 1, None),
             ("head_dim", 1, MAX_HEAD_DIM), ("qk_rope_head_dim", 1, MAX_HEAD_DIM),
             ("max_position_embeddings", 1, None), ("original_max_position_embeddings", 1, None),
             ("sliding_window_pattern", 1, None), ("rotary_dim", 0, MAX_HEAD_DIM))
# The config's numbers: transformers computes ``rope_theta ** x`` and ``int(head_dim * partial_rotary_factor)``
# with them, so a str or a list fails there (a TypeError at the model's construction).
_REAL_KEYS = ("rope_theta", "rope_local_base_freq", "rotary_emb_base", "partial_rotary_factor", "rotary_pct")
_FRACTION_KEYS = ("partial_rotary_factor", "rotary_pct")


def _check_keys(config: Any, ignored: frozenset | set = frozenset()) -> None:
    """ValueError naming the key and the fix for a top-level value transformers refuses or fails on: an int size
    that is a str, a float, a bool, below its least value or past its bound (``MAX_LAYERS``, ``MAX_HEAD_DIM``); a
    number that is not one; a fraction outside (0, 1]; ``layer_types`` that is not a list of str;
    ``rope_parameters`` / ``rope_scaling`` that is not a dict. Keys in ``ignored`` (the model's code never reads
    them, measured) are not checked: transformers runs with whatever they hold."""
    for key, low, high in _INT_KEYS:
        v = _get(config, key)
        if v is None or key in ignored:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            hint = f" (write {v.strip()} without quotes)" if isinstance(v, str) and v.strip().isdigit() else ""
            raise ValueError(f"{key} must be an int, got {type(v).__name__} {v!r}{hint}; transformers' config class "
                             "refuses it too.")
        if v < low:
            raise ValueError(f"{key} must be an int >= {low}, got {v}.")
        if high is not None and v > high:
            raise ValueError(f"{key}={v} is past ropelab's bound {high} (far beyond any published model; the bound "
                             "keeps a reader's memory bounded, transformers has none); check the config.")
    for key in _REAL_KEYS:
        v = _get(config, key)
        if v is None or key in ignored:
            continue
        if not is_real(v):
            hint = " (write the number without quotes)" if isinstance(v, str) else ""
            raise ValueError(f"{key} must be a number, got {type(v).__name__} {v!r}{hint}; transformers computes "
                             "with it and fails on anything else.")
        if not math.isfinite(v):
            raise ValueError(f"{key} must be finite, got {v}.")
        if key in _FRACTION_KEYS and not 0 < v <= 1:
            raise ValueError(f"{key} must be a fraction in (0, 1] (the rotating share of the head), got {v}.")
    for key in ("rope_parameters", "rope_scaling"):
        v = _get(config, key)
        if v is not None and not isinstance(v, Mapping):
            raise ValueError(f"{key} must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}} or null, got "
                             f"{type(v).__name__} {v!r}.")
    for key, kind in (("layer_types", str), ("no_rope_layers", (bool, int))):
        v = _get(config, key)
        if v is None:
            continue
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
            raise ValueError(f"{key} must be a list with one entry per layer, got {type(v).__name__} {v!r}.")
        if len(v) > MAX_LAYERS:
            raise ValueError(f"{key} has {len(v)} entries, past ropelab's bound of {MAX_LAYERS} layers.")
        bad = next((e for e in v if not isinstance(e, kind)), ...)
        if bad is not ...:
            what = "a layer type name such as 'full_attention'" if kind is str else "true or false"
            raise ValueError(f"{key} entries must each be {what}, got {bad!r}; transformers refuses it too.")


def measured_conventions(config: Any) -> tuple[Any, Mapping[str, Any]]:
    """(``config`` with its class's key aliases resolved, the conventions of its ``model_type`` measured on
    transformers' code: its entry of ``ropelab.conformance.hf_table``). ValueError, naming the model type and why,
    where the table has no entry or measured a rotation ``RopeSpec`` cannot represent."""
    return _with_conventions(config, None)


def _with_conventions(config: Any, style: str | None) -> tuple[Any, Mapping[str, Any]]:
    """(config with its class's aliases resolved, the measured conventions of its model type)."""
    from .conformance.hf_table import CONVENTIONS, TRANSFORMERS_VERSION

    model_type = _get(config, "model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"model_type must be a str such as 'llama', got {type(model_type).__name__} {model_type!r}.")
    conv = CONVENTIONS.get(model_type)
    if conv is None:
        if style is not None:
            return config, {}
        from .conformance.hf_config_rules import MODEL_TYPES, NOT_COVERED

        if model_type in NOT_COVERED:
            raise ValueError(
                f"model type {model_type!r} is a transformers {TRANSFORMERS_VERSION} model type, but the conformance "
                f"sweep could not compare its RoPE with transformers' code ({NOT_COVERED[model_type]}), so ropelab's "
                "convention table has no measured pairing for it; pass style='half' / 'interleaved' explicitly."
            )
        if model_type not in MODEL_TYPES:
            raise ValueError(
                f"model type {model_type!r} is not a model type of transformers {TRANSFORMERS_VERSION} (a model that "
                "ships its own code, or a newer transformers), so ropelab's convention table, measured on "
                "transformers' code, has no pairing for it; rerun `make conformance` with a transformers that has it, "
                "or pass style='half' / 'interleaved' explicitly."
            )
        raise ValueError(
            f"model type {model_type!r} is not in ropelab's convention table (measured on transformers "
            f"{TRANSFORMERS_VERSION} by `make conformance`), so its pairing is unknown; rerun `make conformance` "
            "with the transformers that has it, or pass style='half' / 'interleaved' explicitly."
        )
    if conv.get("style") not in ("half", "interleaved"):
        raise ValueError(f"model type {model_type!r}: transformers' rotation pairs its dims as {conv.get('style')!r}, "
                         "which RopeSpec cannot represent (it has style 'half' and 'interleaved').")
    if "rotations" in conv and style is None:
        listed = ", ".join(f"{fn}: {st}" for fn, st in conv["rotations"].items())
        raise ValueError(f"model type {model_type!r}: its layers apply RoPE through functions that pair dims "
                         f"differently ({listed}; in transformers a sparse-attention indexer and the main attention), "
                         "and one RopeSpec per layer holds one pairing; pass style= for the rotation you mean.")
    if conv.get("direction", 1) != 1:
        raise ValueError(f"model type {model_type!r}: transformers rotates by -m*omega (rotate_half with flipped "
                         "signs), which RopeSpec cannot represent (its rotation is counter-clockwise, Su et al.).")
    aliases = conv.get("aliases", {})
    if aliases and isinstance(config, Mapping):
        config = {**config, **{k: config[v] for k, v in aliases.items() if v in config and k not in config}}
    return config, conv


def _reads_of(config: Any) -> Mapping[str, Any] | None:
    """The measured reading rules of the config's model type (``ropelab.conformance.hf_config_rules``), or None."""
    from .conformance.hf_config_rules import READS

    model_type = _get(config, "model_type")
    reads = READS.get(model_type) if isinstance(model_type, str) else None
    return reads if reads is not None and "default" in reads else None  # (an entry may hold a layout only)


def _first(config: Any, keys: Sequence[str]) -> tuple[str | None, Any]:
    for k in keys:
        if _get(config, k) is not None:
            return k, _get(config, k)
    return None, None


def _v4_as_the_class_reads(config: Any, reads: Mapping[str, Any], conv: Mapping[str, Any], dropped: set) -> dict:
    """The one rope dict (v5 form) that the model type's config class makes of a config without
    ``rope_parameters``, by its measured rules (``ropelab.conformance.config_rules``): ``rope_scaling`` when it is a
    dict, else the class's default dict; ``rope_theta`` from the first of the keys the class reads the base from
    (``rotary_emb_base`` for GPT-NeoX), else the class's default; ``partial_rotary_factor`` likewise
    (``rotary_pct``), where the rope dict does not hold one."""
    scaling = None if "rope_scaling" in dropped else _get(config, "rope_scaling")
    if scaling is not None:  # the class starts from rope_scaling, not its default dict: its rules for that case
        reads = {**reads, **reads.get("scaled", {}), "default": {**(reads.get("default") or {}),
                                                               **reads.get("scaled", {}).get("default", {})}}
    default = dict(reads.get("default") or {})
    theta_keys = reads["theta_keys"]
    if scaling is not None:
        d = dict(scaling)
    elif default.get("rope_type", default.get("type", "default")) != "default":
        d = {k: v for k, v in default.items() if k not in _LIFTED}  # the class's own scaling (gpt-oss's yarn)
    else:
        d = {"rope_type": "default"}
    if d.get("rope_theta") is None:
        _, theta = _first(config, theta_keys)
        if theta is None:
            theta = default.get("rope_theta", conv.get("fixed_base"))
        if theta is None:
            keys = " or ".join(repr(k) for k in theta_keys) or "no key at all"
            raise ValueError(f"the config has no RoPE base, and transformers' config class for model type "
                             f"{_get(config, 'model_type')!r} reads it from {keys} and has no default; set "
                             f"{theta_keys[0] if theta_keys else 'rope_parameters'!r}.")
        d["rope_theta"] = theta
        _refuse_unread(config, "rope_theta", theta_keys, theta)
    if d.get("partial_rotary_factor") is None:
        key, factor = _first(config, reads.get("fraction_keys", ()))
        factor = factor if key is not None else default.get("partial_rotary_factor")
        _refuse_unread(config, "partial_rotary_factor", reads.get("fraction_keys", ()), factor)
        if factor is not None:
            d["partial_rotary_factor"] = factor
    return _top_level_original(config, d)


def _refuse_class_defaults(config: Any, rule: Mapping[str, Any] | None, layer_types: Sequence[str] | None,
                           skip: Sequence[str]) -> None:
    """ValueError for a config without ``rope_parameters`` whose config class fills the base of some layer type
    from a per-layer-type default of its own (measured: ``hf_config_rules.PER_LAYER_TYPE_DEFAULTS``), where neither
    the config's ``rope_theta`` reaches that type (``theta_types``) nor the sweep's ``v4`` rule names its base
    (``default_theta``): ropelab does not hold those defaults, and reading ``rope_theta`` there would be a guess
    (MiMo-V2-Flash's class ignores it)."""
    from .conformance.hf_config_rules import PER_LAYER_TYPE_DEFAULTS

    model_type = _get(config, "model_type")
    nested = PER_LAYER_TYPE_DEFAULTS.get(model_type) if isinstance(model_type, str) else None
    if nested is None:
        return
    theta = _get(config, "rope_theta") is not None
    reached = set(nested["theta_types"]) if theta else set()
    reached |= set((rule or {}).get("default_theta") or {})
    if theta and isinstance(_get(config, "rope_scaling"), Mapping):
        # the sweep's v4 rule, measured with rope_theta and rope_scaling both given: the types they reach then
        reached |= set((rule or {}).get("scaled_layer_types") or ())
    used = set(layer_types) - set(skip) if layer_types is not None else set(nested["types"])
    missing = sorted(used - reached)
    if missing:
        raise ValueError(
            f"model type {model_type!r}: the config has no rope_parameters, and transformers' config class then "
            f"takes the RoPE of layer types {missing} from per-layer-type defaults of its own"
            + ("" if _get(config, "rope_theta") is None else " (the config's rope_theta does not reach them)")
            + ", which ropelab does not hold; write rope_parameters with an entry per layer type "
            f"({sorted(nested['types'])}) to say what runs.")


def _refuse_unread(config: Any, field: str, keys: Sequence[str], used: Any) -> None:
    """ValueError where the config says ``field`` only under keys other config classes read for it and this class
    does not (GPT-NeoX's reads ``rotary_emb_base``, not ``rope_theta``), with a value other than the one transformers
    uses (``used``, its default): the config does not mean what it says. Naming the key this class reads is the
    fix. The same value (Bamba's hard-coded rotary share, written out) is what runs, and is read."""
    from .conformance.hf_config_rules import READS

    if _first(config, keys)[0] is not None:
        return
    key_field = "theta_keys" if field == "rope_theta" else "fraction_keys"
    others = sorted({k for r in READS.values() for k in r.get(key_field, ()) if k not in keys})
    said = [k for k in others if _get(config, k) is not None and not (is_real(_get(config, k)) and is_real(used)
                                                                   and float(_get(config, k)) == float(used))]
    if said:
        model_type = _get(config, "model_type")
        fix = f"write it as {keys[0]!r}" if keys else "write it into rope_parameters"
        raise ValueError(f"the config gives {field} as {said} (= {_get(config, said[0])!r}), which transformers' "
                         f"config class for model type {model_type!r} does not read (it reads {list(keys)}); "
                         f"transformers would run its default instead. To mean it, {fix}.")


def _as_the_class_reads_layers(config: Any, n_layers: int, layer_types: Any) -> tuple[int, Any]:
    """(num_hidden_layers, layer_types) as the config class reads a ``config.json`` that lists k blocks per layer (its
    measured ``serialized_layout``, ``hf_config_rules``: Dory's list each attention block, then an ``mlp`` block,
    with ``num_hidden_layers`` doubled; the class keeps every k-th entry and divides the count by k). Unchanged where
    the class has no such rule or the list holds none of its filler types."""
    from .conformance.hf_config_rules import READS

    model_type = _get(config, "model_type")
    rule = (READS.get(model_type) or {}).get("serialized_layout") if isinstance(model_type, str) else None
    if rule is None or not isinstance(layer_types, Sequence) or not set(layer_types) & set(rule["filler"]):
        return n_layers, layer_types
    k = rule["stride"]
    if len(layer_types) != n_layers or n_layers % k:
        raise ValueError(f"layer_types has {len(layer_types)} entries for num_hidden_layers={n_layers}; a config "
                         f"listing {k} blocks per layer (with {rule['filler']}) needs a multiple of {k} of each.")
    return n_layers // k, list(layer_types)[::k]


def _layer_count(config: Any) -> int:
    """``num_hidden_layers`` as the config class reads it: the config's own, or, where the class derives it as
    ``per`` times another key (measured: ``hf_config_rules``' ``layer_count``; LongCat-Flash's ``num_layers``
    decoder layers hold two attention sublayers each, numbered 0 .. 2 * num_layers - 1), from that key. ValueError
    where neither is given, or both are and disagree."""
    from .conformance.hf_config_rules import READS

    model_type = _get(config, "model_type")
    rule = (READS.get(model_type) or {}).get("layer_count") if isinstance(model_type, str) else None
    n = _get(config, "num_hidden_layers")
    if rule is None:
        return _need(config, "num_hidden_layers")
    key, per = rule["key"], rule["per"]
    k = _get(config, key)
    if k is None:
        if n is None:
            raise ValueError(f"the config has neither 'num_hidden_layers' nor {key!r}, which RoPE needs: transformers' "
                             f"config class for model type {model_type!r} derives num_hidden_layers = {per} * {key}; "
                             f"set {key!r} (ropelab does not guess a default).")
        return n
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k * per <= MAX_LAYERS:
        raise ValueError(f"{key} must be an int in [1, {MAX_LAYERS // per}] (transformers' config class for model "
                         f"type {model_type!r} derives num_hidden_layers = {per} * {key}), got {k!r}.")
    if n is not None and n != per * k:
        raise ValueError(f"the config gives num_hidden_layers={n} and {key}={k}, while transformers' config class "
                         f"for model type {model_type!r} derives num_hidden_layers = {per} * {key} = {per * k}; give "
                         f"only {key!r}.")
    return per * k


def _cycled_layer_types(config: Any, n_layers: int) -> list[str] | None:
    """Layer types a config class derives by cycling a list of block kinds (measured: ``hf_config_rules``'
    ``cycled``; RecurrentGemma's ``block_types``, ``recurrent`` -> ``linear_attention`` without RoPE,
    ``attention`` -> ``sliding_attention``): layer i gets the kind of entry i mod len(list). None where the class
    has no such rule or the config does not give the list (ropelab does not guess the class's default)."""
    from .conformance.hf_config_rules import READS

    model_type = _get(config, "model_type")
    rule = (READS.get(model_type) or {}).get("cycled") if isinstance(model_type, str) else None
    if rule is None or _get(config, rule["key"]) is None:
        return None
    key, kinds, blocks = rule["key"], rule["kinds"], _get(config, rule["key"])
    if isinstance(blocks, (str, bytes, Mapping)) or not isinstance(blocks, Sequence) or not blocks or any(
            not isinstance(b, str) for b in blocks):
        raise ValueError(f"{key} must be a non-empty list of block kinds ({sorted(kinds)}), got {blocks!r}.")
    unknown = sorted({b for b in blocks if b not in kinds})
    if unknown:
        raise ValueError(f"{key} holds {unknown}, block kinds ropelab has not measured for model type {model_type!r} "
                         f"(transformers' config class was measured on {sorted(kinds)}); use those, or give "
                         "layer_types.")
    most = rule.get("max_repeats")
    if most is not None and n_layers > most * len(blocks):
        raise ValueError(f"num_hidden_layers={n_layers} is more than transformers' config class for model type "
                         f"{model_type!r} cycles {key} for ({most} times its {len(blocks)} entries), and it refuses "
                         "such a config; give fewer layers or a longer list.")
    return [kinds[blocks[i % len(blocks)]] for i in range(n_layers)]


def _refuse_underived_layer_types(config: Any, conv: Mapping[str, Any]) -> None:
    """ValueError where the config gives no ``layer_types`` (nor its measured alias, e.g. ``layers_block_type``) and
    no rule ropelab reads derives them, while the model type has layer types without RoPE (measured): the class
    derives its list from other keys (RecurrentGemma's ``block_types``, cycled), so which layers rotate is not
    known here, and reading every layer as rotating would be wrong."""
    from .conformance.hf_config_rules import READS

    alias = conv.get("aliases", {}).get("layer_types")
    nope = conv.get("nope_layer_types", ())
    model_type = _get(config, "model_type")
    cycled = (READS.get(model_type) or {}).get("cycled") if isinstance(model_type, str) else None
    if cycled is not None and nope:
        raise ValueError(f"model type {model_type!r}: the config gives no layer_types (nor {alias!r}) and no "
                         f"{cycled['key']!r}, from which transformers' config class derives them (cycled), and its "
                         f"layers of type {sorted(nope)} apply no RoPE, so which layers rotate is not known; give "
                         f"{cycled['key']!r} (ropelab does not guess the class's default) or layer_types.")
    if alias is not None and nope:
        raise ValueError(f"model type {model_type!r}: the config gives no layer_types (nor "
                         f"{alias!r}); transformers' config class derives them from other keys, which ropelab does "
                         f"not read, and its layers of type {sorted(nope)} apply no RoPE, so which layers rotate is "
                         f"not known; give layer_types (one per layer, e.g. the config object's {alias}).")


def _periodic(config: Any, name: str, n_layers: int) -> list | None:
    """The per-layer list ``name`` a config class derives when the config has none, by its measured periodic rule
    (``hf_config_rules``' ``periodic``: layer i gets ``last`` when (i + 1) % k == 0, k the rule's key or its
    default); None where the class has no such rule."""
    rule = ((_reads_of(config) or {}).get("periodic") or {}).get(name)
    if rule is None:
        return None
    k = _get(config, rule["key"])
    k = rule["default"] if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{rule['key']} must be an int >= 1, got {k!r}.")
    return [rule["last"] if (i + 1) % k == 0 else rule["in_period"] for i in range(n_layers)]


def _layer_types_from_indices(config: Any, n_layers: int) -> list[str] | None:
    """Layer types a config class derives from a list of layer indices (Bamba's ``attn_layer_indices``: the listed
    layers attend, the others are Mamba layers), by the measured rule; None where the class has no such key."""
    reads = _reads_of(config)
    for key, rule in ((reads or {}).get("layer_indices") or {}).items():
        listed = _get(config, key)
        if listed is None:
            listed = []
        if isinstance(listed, (str, bytes, Mapping)) or not isinstance(listed, Sequence) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in listed):
            raise ValueError(f"{key} must be a list of layer indices, got {listed!r}.")
        chosen = set(listed)
        return [rule["listed"] if i in chosen else rule["others"] for i in range(n_layers)]
    return None


def text_part(config: Any) -> Any:
    """The decoder's config of a composite (vision-language) config, as transformers builds it: the ``text_config``
    with the model type of the class's text sub-config (measured: ``hf_config_rules.TEXT_CONFIGS``), or the flat
    config read as that type; any other config as it is."""
    from .conformance.hf_config_rules import TEXT_CONFIGS

    if not isinstance(config, Mapping):
        return config
    model_type = config.get("model_type")
    rule = TEXT_CONFIGS.get(model_type) if isinstance(model_type, str) else None
    if rule is None:
        return config
    text = config.get("text_config")
    if isinstance(text, Mapping):
        own = text.get("model_type")
        return {**text, "model_type": own if rule["dict_type"] and isinstance(own, str) and own else rule["type"]}
    return {**config, "model_type": rule["type"]} if rule["type"] else config


def _v4_dropped(config: Any, conv: Mapping[str, Any]) -> list[str]:
    """The v4 keys of the config that its model type's config class drops (measured: ``hf_table``'s
    ``v4.ignored_keys``; the model runs without them), when the config has no ``rope_parameters``."""
    if _get(config, "rope_parameters") is not None:
        return []
    return [k for k in conv.get("v4", {}).get("ignored_keys", ()) if _get(config, k) is not None]


def hf_config_notes(config: Any, *, style: str | None = None) -> tuple[str, ...]:
    """What :meth:`RopeSpec.per_layer` leaves out of a config on purpose, as notes: the keys transformers reads
    none of for this model type (measured into ``ropelab.conformance.hf_table``), which ropelab does not apply
    either. A config ``per_layer`` refuses raises as it does there."""
    config, conv = _with_conventions(text_part(config), style)
    model_type = _get(config, "model_type")
    notes = [f"model type {model_type!r}: transformers' config class does not read the v4 key {k!r} (the model runs "
             "without it), so it is not applied; to use it, write it into rope_parameters."
             for k in _v4_dropped(config, conv)]
    notes += [f"model type {model_type!r}: transformers' modeling code does not read {k!r} (it rotates the slice its "
              "rope dict says), so it is not applied."
              for k in conv.get("ignored_keys", ()) if _get(config, k) is not None]
    reads = _reads_of(config)
    if reads is not None and _get(config, "rope_parameters") is None:
        scaling = _get(config, "rope_scaling")
        if scaling is not None:
            reads = {**reads, **reads.get("scaled", {}), "default": {**(reads.get("default") or {}),
                                                                   **reads.get("scaled", {}).get("default", {})}}
        theta_keys = reads["theta_keys"]
        in_scaling = isinstance(scaling, Mapping) and scaling.get("rope_theta") is not None
        default = (reads.get("default") or {}).get("rope_theta")
        if not in_scaling and _first(config, theta_keys)[0] is None and default is not None:
            notes.append(f"model type {model_type!r}: the config gives no base ({' / '.join(theta_keys) or 'no key'}); "
                         f"transformers' config class uses its default rope_theta={default}, and so does ropelab.")
    params = _get(config, "rope_parameters")
    if ("partial_rotary_factor" in conv.get("ignored_keys", ()) and isinstance(params, Mapping)
            and params.get("partial_rotary_factor") is not None and params.get("rope_type", "default") == "default"):
        notes.append(f"model type {model_type!r}: transformers' default rotation for it does not read "
                     "rope_parameters['partial_rotary_factor'] (it rotates the whole head), so it is not applied.")
    notes += _outside_rotation_notes(model_type, params)
    return tuple(notes)


def _outside_rotation_notes(model_type: Any, params: Any) -> list[str]:
    """The note on a rope dict's ``llama_4_scaling_beta`` (one dict, or one per layer type): recorded on the spec,
    not applied by ``apply_rope`` (see :func:`_outside_rotation`)."""
    dicts = [params] if isinstance(params, Mapping) and not any(isinstance(v, Mapping) for v in params.values()) \
        else [v for v in (params.values() if isinstance(params, Mapping) else ()) if isinstance(v, Mapping)]
    betas = sorted({d["llama_4_scaling_beta"] for d in dicts if d.get("llama_4_scaling_beta") is not None}, key=repr)
    return [f"model type {model_type!r}: rope_parameters['llama_4_scaling_beta']={b!r} scales the query after the "
            "rotation in transformers' attention (by 1 + beta * ln(1 + floor(m / original_max_position_embeddings))); "
            "the rotation does not read it, so the spec records it (RopeSpec.llama_4_scaling_beta) and apply_rope does "
            "not apply it: multiply the rotated query by spec.query_scale(positions)." for b in betas]


def _style_of(config: Any, conv: Mapping[str, Any], style: str | None) -> str:
    if style is not None:
        check_style(style)
        return style
    if _get(config, "rope_interleave") is not None:  # a field transformers reads (DeepSeek-V3 and kin)
        return "interleaved" if _get(config, "rope_interleave") else "half"
    return conv["style"]


def _with_partial(config: Any, params: Mapping[str, Any], head_dim: int, conv: Mapping[str, Any]) -> dict:
    """``params`` with ``partial_rotary_factor`` from wherever the config declares the rotary slice: the rope dict
    or the top level (``partial_rotary_factor``), an absolute ``rotary_dim`` (GPT-J, CodeGen, MiniMax-M2), the
    legacy fraction ``rotary_pct`` (GPT-NeoX), else the fraction transformers' modeling code fixes (measured)."""
    params = dict(params)
    ignored = set(conv.get("ignored_keys", ()))  # declared by the config class, never read by its modeling code
    if "partial_rotary_factor" in ignored and not any(isinstance(v, Mapping) for v in params.values()):
        # Measured: this type's default rotation reads no factor, from its rope dict either (Llama's rotates the
        # whole head), so one there is not applied (transformers moves a top-level one into the rope dict).
        factor = params.get("partial_rotary_factor", _get(config, "partial_rotary_factor"))
        kind = params.get("rope_type", params.get("type", "default"))
        if kind == "default":
            params.pop("partial_rotary_factor", None)
        elif (is_real(factor) and _get(config, "qk_rope_head_dim") == head_dim and is_real(_get(config, "head_dim"))
              and int(_get(config, "head_dim") * float(factor)) == head_dim):
            # The factor is the rotated slice's share of the full head (dots.3: qk_rope_head_dim / head_dim, which
            # its config class sets per layer type): a scaling's inv_freq over head_dim * factor dims covers exactly
            # the slice the attention hands the rotation, the head here, so transformers runs it as it is.
            params.pop("partial_rotary_factor", None)
        elif is_real(factor) and float(factor) != 1.0:
            # A scaling's inv_freq (modeling_rope_utils) does read it: tables for part of the head meet the
            # whole head in the model's apply_rotary_pos_emb, and transformers' forward fails on the shapes.
            raise ValueError(f"partial_rotary_factor={factor!r} with rope_type {kind!r}: this "
                             f"model type's code rotates the whole head while the scaling's frequencies cover "
                             f"part of it, so transformers fails on this config; drop partial_rotary_factor.")
    if "partial_rotary_factor" in params or params.get("rope_type") == "proportional":
        return _factor_of_the_slice(config, params, head_dim)
    for key, value in (("partial_rotary_factor", _get(config, "partial_rotary_factor")),
                       ("rotary_dim", _get(config, "rotary_dim")), ("rotary_pct", _get(config, "rotary_pct"))):
        if value is None or key in ignored:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {type(value).__name__} {value!r}.")
        params["partial_rotary_factor"] = value / head_dim if key == "rotary_dim" else float(value)
        return params
    if conv.get("rotary_fraction", 1.0) < 1.0:
        params["partial_rotary_factor"] = conv["rotary_fraction"]
    return params


def _outside_rotation(d: Mapping[str, Any], max_pos: int | None) -> tuple[dict, Any]:
    """(the rope dict without the keys its rotation does not read, ``llama_4_scaling_beta`` or None).

    transformers' Ministral 3 / Mistral 4 config classes keep two such keys in ``rope_parameters`` and name them in
    ``ignore_keys_at_rope_validation``: ``llama_4_scaling_beta``, which their attention reads to scale the rotated
    query (it goes on the spec, :attr:`RopeSpec.llama_4_scaling_beta`, not dropped), and ``max_position_embeddings``,
    a copy of the config's own, which no rotation reads from the rope dict (yarn reads the config's when its factor
    is None). A copy that differs from the config's is refused: which one was meant is not known."""
    d = dict(d)
    beta = d.pop("llama_4_scaling_beta", None)
    if "max_position_embeddings" in d:
        copy = d.pop("max_position_embeddings")
        if copy is not None and copy != max_pos:
            raise ValueError(f"the rope dict's max_position_embeddings={copy!r} differs from the config's "
                             f"max_position_embeddings={max_pos!r}; transformers' rotation reads only the config's, "
                             "so make them equal or drop the rope dict's copy.")
    return d, beta


def _factor_of_the_slice(config: Any, params: dict, head_dim: int) -> dict:
    """``params`` with its ``partial_rotary_factor`` as a share of the rotated slice ``qk_rope_head_dim`` (``head_dim``
    here), where the config's ``head_dim`` is the full head: transformers' rope functions (``modeling_rope_utils``)
    take ``dim = int(config.head_dim * partial_rotary_factor)``, a share of the full head (Mistral 4: head_dim 128,
    factor 0.5, so the 64 dims of its rotated slice all rotate). Dims past the slice fail transformers' forward on
    the shapes; a ValueError here."""
    full, factor = _get(config, "head_dim"), params.get("partial_rotary_factor")
    if (_get(config, "qk_rope_head_dim") != head_dim or not is_real(full) or full == head_dim or not is_real(factor)
            or params.get("rope_type", params.get("type")) == "proportional"):
        return params
    dims = int(full * float(factor))
    if dims > head_dim:
        raise ValueError(f"partial_rotary_factor={factor!r} of head_dim={full} gives {dims} rotating dims, past the "
                         f"rotated slice qk_rope_head_dim={head_dim}; transformers fails on these shapes. Set "
                         f"partial_rotary_factor to at most qk_rope_head_dim / head_dim = {head_dim / full}.")
    return {**params, "partial_rotary_factor": dims / head_dim}


def _top_level_original(config: Any, d: dict) -> dict:
    """A top-level ``original_max_position_embeddings`` (Phi-3's configs keep it outside the rope dict) takes priority
    over the one-for-all-layers dict's own, for the types that read it: transformers' ``standardize_rope_params``
    ("an exception case where we give priority to `self.original_max_position_embeddings`", for ``llama3``, ``yarn``
    and ``longrope``). Dropping it would read L0 as ``max_position_embeddings``: the attention factor becomes 1 and
    LongRoPE switches to its long factors at the wrong length."""
    top = _get(config, "original_max_position_embeddings")
    rtype = d.get("rope_type", d.get("type"))
    rec = ROPE_TYPES.get(rtype) if isinstance(rtype, str) else None
    if top is not None and rec is not None and rec.original_key == "original_max_position_embeddings":
        d = {**d, "original_max_position_embeddings": top}
    return d


def _rope_dicts(config: Any, layer_types: Sequence[str] | None, conv: Mapping[str, Any] | None = None,
                skip: set | frozenset = frozenset()) -> dict[str | None, dict]:
    """{layer type (None for all layers): v5-style rope dict with rope_theta} from either schema."""
    params = _get(config, "rope_parameters")
    if params is not None:  # v5
        if not isinstance(params, Mapping):
            raise ValueError(f"rope_parameters must be a dict, got {type(params).__name__}.")
        wanted = set(layer_types or []) - set(skip)
        if layer_types is not None and wanted <= set(params) and all(isinstance(params[t], Mapping) for t in wanted):
            return {t: dict(params[t]) for t in wanted}
        if "rope_type" not in params and "type" not in params:
            raise ValueError(
                f"rope_parameters has neither 'rope_type' nor an entry per layer type (keys {sorted(params)}, "
                f"layer_types {sorted(set(layer_types or []))})."
            )
        return {t: _top_level_original(config, dict(params)) for t in set(layer_types or [None])}
    # v4: rope_theta at the top, rope_scaling (may be None), partial_rotary_factor at the top.
    dropped = set(_v4_dropped(config, conv or {}))
    reads = _reads_of(config)
    rule = (conv or {}).get("v4")
    if reads is None:
        _refuse_class_defaults(config, rule, layer_types, skip)
    if reads is not None and not (layer_types is not None and rule and "scaled_layer_types" in rule):
        global_dict = _v4_as_the_class_reads(config, reads, conv or {}, dropped)
        return {t: global_dict for t in (set(layer_types) - set(skip) if layer_types is not None else [None])}
    if "rope_theta" in dropped or (_get(config, "rope_theta") is None
                                   and "rope_theta" in (conv or {}).get("v4", {}).get("ignored_keys", ())):
        # The class reads its base from the legacy key in its place (GPT-NeoX's config class:
        # ``rope_parameters.setdefault("rope_theta", kwargs.pop("rotary_emb_base", self.default_theta))``).
        theta = _need(config, "rotary_emb_base", "the config (its config class reads the base from rotary_emb_base, "
                      "not rope_theta)")
    else:
        theta = _get(config, "rope_theta")
        if theta is None and (conv or {}).get("fixed_base") is not None:
            theta = conv["fixed_base"]  # the config has no key for it: the modeling code fixes the base (measured)
        theta = _need({"rope_theta": theta}, "rope_theta", "the config")
    top = {"rope_theta": theta}
    if _get(config, "partial_rotary_factor") is not None:
        top["partial_rotary_factor"] = _get(config, "partial_rotary_factor")
    scaling = None if "rope_scaling" in dropped else _get(config, "rope_scaling")
    global_dict = {**top, **(dict(scaling) if scaling is not None else {"rope_type": "default"})}
    global_dict = _top_level_original(config, global_dict)
    if layer_types is None:
        return {None: global_dict}
    out = {t: global_dict for t in set(layer_types) - set(skip)}
    rule = (conv or {}).get("v4")
    if rule and "scaled_layer_types" in rule:  # (a rule of dropped keys only has nothing per layer type)
        # The config class's own v4 conversion (measured): rope_scaling reaches only scaled_layer_types; a layer
        # type in default_theta keeps its own base, Gemma 3's rope_local_base_freq when given, else the class's
        # default (transformers' own fallback, e.g. Gemma 3's default_theta["local"] = 10000).
        for t in out:
            d = dict(global_dict) if t in rule["scaled_layer_types"] else {**top, "rope_type": "default"}
            if t in rule["default_theta"]:
                local = _get(config, "rope_local_base_freq")
                d["rope_theta"] = local if local is not None else rule["default_theta"][t]
            out[t] = d
    return out
