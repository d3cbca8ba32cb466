r"""The open registry of rope types: the :class:`RopeType` record, ``ROPE_TYPES``, ``register_rope_type``, the
live views derived from the records (``LENGTH_DEPENDENT``, ``SCALING_KEYS``), and reading and checking a dict
against its record (:func:`check_scaling`) up to :func:`frequencies`. The built-in types and their formulas
are in ``rope_types``, one record beside its function."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import torch

from .checks import COMMON_KEYS, KINDS, POSITIVE, POSITIVE_LIST, check_base, check_rotary_dim, value_ok

__all__ = ["RopeType", "ScalingParams", "ROPE_TYPES", "BUILTIN_NAMES", "register_rope_type", "unregister_rope_type",
           "LENGTH_DEPENDENT", "SCALING_KEYS", "EXAMPLE_HEAD_DIM", "EXAMPLE_MAX_POSITION_EMBEDDINGS", "parse_scaling",
           "check_scaling", "check_scaling_values", "length_threshold", "rope_type_of", "frequencies"]

# The size the records' examples are valid at (a longrope example's lists have EXAMPLE_HEAD_DIM / 2 entries).
EXAMPLE_HEAD_DIM = 32
EXAMPLE_MAX_POSITION_EMBEDDINGS = 32


class ScalingParams(dict):
    """The parsed scaling dict: a plain dict with ``need(key)`` that raises a helpful ValueError."""

    rope_type: str = "default"

    def need(self, key: str) -> Any:
        """``self[key]``, or a ValueError naming the key and the rope_type that needs it.

        Args:
            key: a key of the scaling dict, e.g. ``"factor"``; missing or None raises.
        """
        if self.get(key) is None:
            raise ValueError(
                f"rope_scaling of type {self.rope_type!r} needs the key {key!r}; add it to the dict "
                f"(Hugging Face configs keep it in rope_scaling / rope_parameters)."
            )
        return self[key]


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
        bad = {k: v for k, v in self.keys.items() if v not in KINDS}
        if bad:
            raise ValueError(f"RopeType {self.name!r}: keys {sorted(bad)} hold an unknown kind; use one of {KINDS}.")
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


# The open registry: rope_type -> its record (see register_rope_type).
ROPE_TYPES: dict[str, RopeType] = {}
# The built-in types (``rope_types`` registers them); unregister_rope_type refuses to remove these.
BUILTIN_NAMES: set[str] = set()


def register_rope_type(name: str, compute: Callable[..., tuple[torch.Tensor, float]], **fields: Any) -> RopeType:
    """Add a rope type in one call: ``register_rope_type("mine", fn, keys={"factor": POSITIVE},
    required={"factor"}, example={"factor": 2.0})`` (the fields of :class:`RopeType`).

    Everything else reads the record: ``frequencies``, ``RopeSpec`` (its keys), ``LENGTH_DEPENDENT``,
    the KV-cache schedule's threshold, and the tests. The example is checked and computed once here, so a
    record whose example fails is refused. Returns the record; :func:`unregister_rope_type` removes it.

    Args:
        name: the new ``rope_type`` string; one already registered raises ValueError.
        compute: ``(rotary_dim, base, params, seq_len, max_pos, dtype) -> (inv_freq, attention_factor)``, as
            :class:`RopeType`'s ``compute``.
        **fields: the other fields of :class:`RopeType` (``keys``, ``required``, ``length_dependent``,
            ``original_key``, ``example``, ``nullable``, ``validate``, ``whole_head``).
    """
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
    """Remove a rope type added by :func:`register_rope_type` (the built-in types stay).

    Args:
        name: the ``rope_type`` string it was registered under.
    """
    if name in BUILTIN_NAMES:
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
    required key.

    Args:
        rope_scaling: the dict, or None for the default type."""
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

    Args:
        rope_scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, or None for the default type.
        rotary_dim: how many dims rotate, when known (longrope's factor lists are checked against it).
        max_position_embeddings: the model config's key of that name, when known (dynamic NTK needs it).

    Returns the dict as :class:`ScalingParams`.
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
    dynamic NTK reads ``max_position_embeddings``). For the other types, ``max_position_embeddings``.

    Args:
        rope_scaling: a Hugging Face scaling dict, or None for the default type.
        max_position_embeddings: the model config's trained context, or None when not known.

    Returns :math:`L_0`, or None when neither the dict nor ``max_position_embeddings`` gives one."""
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


def rope_type_of(rope_scaling: Mapping[str, Any] | None) -> str:
    """The rope type a scaling dict names (``rope_type``, or the legacy ``type``); "default" for None.

    Args:
        rope_scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, or None; it is read by
            :func:`parse_scaling`, whose ValueError it raises.
    """
    return parse_scaling(rope_scaling).rope_type


def check_scaling_values(params: Mapping[str, Any]) -> None:
    """Raise ValueError naming the key: for a key its type does not read, a value that is not what the key
    holds (the record's kind: a NaN, zero or string factor, a bool where a number or a list belongs, None
    for a key that is not ``nullable``), or a required key that is missing or None. ``params`` is a
    :class:`ScalingParams` or a plain dict.

    Args:
        params: the scaling dict (:class:`ScalingParams` or a plain mapping) of a registered rope_type; its
            ``rope_type`` (or legacy ``type``, else ``"default"``) picks which keys it may hold.
    """
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
        if not value_ok(kind, v):
            shown = list(v)[:4] if isinstance(v, (list, tuple)) else v
            raise ValueError(f"rope_scaling[{key!r}] must be {kind}, got {type(v).__name__} {shown!r}.")
