"""ropelab: learn, check and speed up attention position encodings.

The core API::

    inv_freq, attention_factor = ropelab.frequencies(head_dim, base, rope_scaling=...)
    q = ropelab.apply_rope(q, layout="b s h d", style="half")

Submodules, each with one job: ``scaling`` (frequency ladders), ``core`` (tables, rotation,
``apply_rope``, float64 oracles), ``convert`` (between the two styles), ``figures`` (notebook runner
and plot helpers), ``bench`` (benchmarks).
"""

from . import convert, scaling
from .core import (
    STYLES,
    Layout,
    apply_rope,
    cos_sin,
    pair_indices,
    parse_layout,
    reference_complex,
    reference_matrix,
    resolve_positions,
    rotate,
    rotation_matrix,
    varlen_positions,
)
from .scaling import ROPE_TYPES, frequencies

__version__ = "0.1.0"

__all__ = [
    "STYLES",
    "ROPE_TYPES",
    "Layout",
    "apply_rope",
    "convert",
    "cos_sin",
    "frequencies",
    "pair_indices",
    "parse_layout",
    "reference_complex",
    "reference_matrix",
    "resolve_positions",
    "rotate",
    "rotation_matrix",
    "scaling",
    "varlen_positions",
]
