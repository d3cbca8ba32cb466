"""ropelab: learn, check and speed up attention position encodings.

The core API::

    inv_freq, attention_factor = ropelab.frequencies(head_dim, base, rope_scaling=...)
    q = ropelab.apply_rope(q, layout="b s h d", style="half")

Submodules, each with one job: ``scaling`` (frequency ladders), ``core`` (tables, rotation,
``apply_rope``, float64 oracles), ``convert`` (between the two styles), ``figures`` (notebook runner
and plot helpers), ``bench`` (benchmarks).
"""

from . import attention, convert, cope, decay, precision, scaling, tasks
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
from .scaling import ROPE_TYPES, frequencies

__version__ = "0.1.0"

# ropelab.diagnose is a callable module (the checker and its command); imported on first use so that
# `python -m ropelab.diagnose` does not find it already loaded.
_LAZY = {"diagnose": None, "compare": "compare", "Diagnosis": "Diagnosis", "Comparison": "Comparison"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(".diagnose", __name__)
        return module if _LAZY[name] is None else getattr(module, _LAZY[name])
    raise AttributeError(f"module 'ropelab' has no attribute {name!r}")

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
