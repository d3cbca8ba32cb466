"""ropelab: learn, check and speed up attention position encodings.

The core API::

    inv_freq, attention_factor = ropelab.frequencies(head_dim, base, rope_scaling=...)
    q = ropelab.apply_rope(q, layout="b s h d", style="half")
    spec = ropelab.RopeSpec.from_hf_config(config)          # or RopeSpec.per_layer(config)
    q = ropelab.apply_rope(q, layout="b s h d", spec=spec)

Modules, each with one job (its public names are its ``__all__``; the names below are also importable from
``ropelab`` itself). Imports flow one way: ``core``, ``scaling`` <- ``spec`` <- ``multiaxis``, ``kernels``
<- ``rope`` <- the rest; no module imports the runner ``figures``.

- ``scaling``: the frequency ladder and every Hugging Face scaling, one record per type (``frequencies``,
  ``ROPE_TYPES``, ``register_rope_type``);
- ``core``: the primitives: layouts, positions, cos/sin tables, the rotation and two float64 oracles
  (``rotate``, ``cos_sin``, ``pair_indices``, ``parse_layout``, ``Layout``, ``STYLES``, ``resolve_positions``,
  ``varlen_positions``, ``rotation_matrix``, ``reference_matrix``, ``reference_complex``);
- ``spec``: one RoPE setting, validated once, read from a Hugging Face config (``RopeSpec``);
- ``context_parallel``: context parallelism's load-balanced layout (rank r holds chunks r and 2 cp - 1 - r of
  every sequence, as Transformer Engine and Megatron-LM split it): each rank's global positions and its slice,
  packed batches too (``cp_positions``, ``cp_varlen``, ``cp_slice``, ``cp_gather``);
- ``rope``: ``apply_rope``, the one call from keywords or a ``RopeSpec`` to the rotation on any backend
  (auto, the CPU kernel, torch, compile, triton, multi-axis), above the modules it dispatches to;
  ``apply_rope_qk`` (q and k in one call), ``rope_path`` (which backend a call takes, and why);
- ``conformance``: the conformance sweep against transformers' own modeling code, a package (``sweep``, and
  ``hf_table``, the convention table it generates and ``spec`` reads; ``python -m ropelab.conformance``);
- ``engines``: a model's RoPE as each engine reads it (transformers configs, GGUF as llama.cpp reads it, MLX and
  mlx-lm), one ``Reading`` per source, compared layer by layer (the ``ropelab-check`` command);
- ``convert``: the permutation between the two styles, for vectors and q/k weights;
- ``multiaxis``: multi-axis positions: M-RoPE (contiguous and interleaved sections) and 2D/3D axial RoPE;
- ``mla``: MLA's decoupled RoPE: absorption, KV-cache bytes, DeepSeek-V3's rotary part;
- ``prope``: p-RoPE, rotating only the highest-frequency fraction p of the pairs;
- ``diagnosis``: the black-box checker, a package (``diagnose``, ``compare``, ``Diagnosis``, ``Comparison``;
  its zoo of real and deliberately wrong implementations; the ``ropelab-diagnose`` command);
- ``diagnose`` (the module): the old name of ``diagnosis``, a deprecated alias (``python -m ropelab.diagnose``);
- ``precision``: the phase error of RoPE held in bf16 / fp16 / fp32, unit roundoff, phase wrapping;
- ``attention``: causal logits, attention rows and their comparisons; the decoder's grouped-query attention;
- ``cope``: Contextual Position Encoding (``CoPE``);
- ``decay``: RoPE's decay envelopes;
- ``models``: a tiny decoder-only transformer with a pluggable position encoding, its training loop and its
  checkpoints (``save_checkpoint``, ``load_checkpoint``);
- ``kvcache``: KV-cache decoding under length-dependent scalings: the schedule, the cache, its policies
  (a registry) and ``decode``;
- ``staleness``: how stale post-RoPE cached keys are, and the attention drift that follows;
- ``adapters``: decoders driven layer by layer for ``kvcache`` (the ``DecoderAdapter`` protocol, ``TinyLMAdapter``,
  ``HFLlamaAdapter``);
- ``studies``: one module per notebook study, named for its notebook: ``nb01_restyle`` (a trained TinyLM in another
  RoPE style), ``nb02_layouts`` (notebook 02's figures), ``nb04_selective_copy`` (the CoPE paper's Selective Copy
  and notebook 04's sweep; ``nb04_results``, ``nb04_plots``), ``nb08_gridtask`` (notebook 08's 2D task, axial vs
  flattened RoPE);
- ``extend``: the one table of context-extension methods (name -> ``RopeSpec``) and what each does per pair;
  pure (no training; L0 and the base passed in);
- ``lm``: the byte-level LM trained for notebook 05 (corpus, training, evaluation of schemes);
- ``extension``: notebook 07's context-extension study (the retrieval probe, the same fine-tune at 2 L0 per
  method, a small LongRoPE search; ``extend``'s table at this study's L0);
- ``paths``: where the repository, data, build and figure directories are (works from an installed package);
- ``figures``: the notebook runner, the ``setup`` / ``save`` / ``answer`` helpers notebooks call, and the run record;
- ``manifest``: the notebooks and their figures: order, source hashes, footers, the figure manifest;
- ``explorers``: the notebooks' interactive explorers (ipywidgets over pure compute functions);
- ``webexplorers``: the same explorers with their compute in JavaScript: anywidgets in JupyterLab, and
  ``embed_html`` snippets that respond on a static page with no kernel;
- ``nbclean``: keeps notebook outputs out of git (Jupyter pre-save hook, nbstripout filter);
- ``site``: the static site of the executed notebooks (``make site``: Sphinx with myst-nb; the notebook map, one
  page per notebook, the API reference from these docstrings, the guides under ``docs/``);
- ``kernels``: a fused Triton RoPE (forward and backward), ``backend="compile"`` for the CPU, the decode kernel,
  the fused QK-RMSNorm + RoPE + KV-cache write (``qk_norm_rope``) and the byte model; ``apply_rope`` imports
  them on first use, ``core`` never;
- ``machine``: the CPU, threads and library versions a measurement ran on;
- ``bench``: benchmarks that print ratios measured in one run, one file per benchmark (``cpu``, ``decode``,
  ``explorers``, ``gpu``, ``gpu_decode``); nothing in the package imports them.
"""

import sys
import types

from . import _aliases, attention, context_parallel, convert, cope, decay, diagnosis, precision, scaling, spec
from .context_parallel import CPVarlen, cp_gather, cp_positions, cp_slice, cp_varlen
from .cope import CoPE
from .core import (
    STYLES,
    Layout,
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
from .kernels.qk_norm_rope import qk_norm_rope
from .rope import RopePath, apply_rope, apply_rope_qk, rope_path
from .scaling import ROPE_TYPES, frequencies
from .spec import RopeSpec

__version__ = "0.1.0"

__all__ = [
    "CoPE",
    "CPVarlen",
    "Comparison",
    "Diagnosis",
    "compare",
    "diagnose",
    "STYLES",
    "ROPE_TYPES",
    "RopeSpec",
    "Layout",
    "apply_rope",
    "apply_rope_qk",
    "rope_path",
    "RopePath",
    "attention",
    "context_parallel",
    "convert",
    "cope",
    "cp_gather",
    "cp_positions",
    "cp_slice",
    "cp_varlen",
    "cos_sin",
    "decay",
    "diagnosis",
    "frequencies",
    "pair_indices",
    "precision",
    "parse_layout",
    "qk_norm_rope",
    "reference_complex",
    "reference_matrix",
    "resolve_positions",
    "rotate",
    "rotation_matrix",
    "scaling",
    "spec",
    "varlen_positions",
]


_aliases.install()


def __getattr__(name: str):
    # `from ropelab import tasks` and the like: a moved module under its old name, with a DeprecationWarning.
    if f"ropelab.{name}" in _aliases.MOVED:
        return _aliases.load_moved(f"ropelab.{name}")
    raise AttributeError(f"module 'ropelab' has no attribute {name!r}")


class _Package(types.ModuleType):
    """ropelab's module type. Importing the deprecated module ``ropelab.diagnose`` (the old name of
    ``ropelab.diagnosis``) would bind it over the function ``ropelab.diagnose``; the function stays."""

    def __setattr__(self, name: str, value) -> None:
        if name == "diagnose" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
