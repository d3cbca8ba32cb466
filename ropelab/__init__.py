"""ropelab: learn, check and speed up attention position encodings.

The core API::

    inv_freq, attention_factor = ropelab.frequencies(head_dim, base, rope_scaling=...)
    q = ropelab.apply_rope(q, layout="b s h d", style="half")

Submodules, each with one job: ``scaling`` (frequency ladders), ``core`` (tables, rotation,
``apply_rope``, float64 oracles), ``convert`` (between the two styles), ``diagnosis`` (the black-box
checker ``diagnose`` and ``compare``, its zoo, and the ``ropelab-diagnose`` command), ``figures``
(notebook runner and plot helpers), ``bench`` (benchmarks).
"""

from . import attention, convert, cope, decay, diagnosis, precision, scaling, tasks
from .cope import CoPE
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
from .diagnosis import Comparison, Diagnosis, compare, diagnose
from .scaling import ROPE_TYPES, frequencies

__version__ = "0.1.0"

__all__ = [
    "CoPE",
    "Comparison",
    "Diagnosis",
    "compare",
    "diagnose",
    "STYLES",
    "ROPE_TYPES",
    "Layout",
    "apply_rope",
    "attention",
    "convert",
    "cope",
    "cos_sin",
    "decay",
    "diagnosis",
    "frequencies",
    "pair_indices",
    "precision",
    "parse_layout",
    "reference_complex",
    "reference_matrix",
    "resolve_positions",
    "rotate",
    "rotation_matrix",
    "scaling",
    "tasks",
    "varlen_positions",
]
