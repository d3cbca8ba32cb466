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
One job per file: ``ladder`` (the ladder and its closed forms), ``checks`` (what a value may hold),
``registry`` (the records, reading and checking a dict, :func:`frequencies`) and ``rope_types`` (each
built-in type's function beside its record: adding a type there, or one ``register_rope_type`` call
anywhere, is the whole change). This package imports nothing from the rest of ropelab: it is the
bottom of the import graph.
"""

from __future__ import annotations

from . import rope_types  # noqa: F401  (registers the built-in types)
from .checks import COMMON_KEYS, FLAG, FRACTION, NONNEGATIVE, POSITIVE, POSITIVE_LIST, check_base, check_rotary_dim
from .ladder import critical_pair, default_inv_freq, ntk_aware_base, ntk_base, pair_at_turns
from .registry import (
    EXAMPLE_HEAD_DIM,
    EXAMPLE_MAX_POSITION_EMBEDDINGS,
    LENGTH_DEPENDENT,
    ROPE_TYPES,
    SCALING_KEYS,
    RopeType,
    ScalingParams,
    check_scaling,
    check_scaling_values,
    frequencies,
    length_threshold,
    parse_scaling,
    register_rope_type,
    rope_type_of,
    unregister_rope_type,
)
from .rope_types import yarn_mscale

__all__ = [
    "frequencies",
    "yarn_mscale",
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
    "POSITIVE",
    "NONNEGATIVE",
    "FRACTION",
    "POSITIVE_LIST",
    "FLAG",
]
