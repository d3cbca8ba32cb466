r"""GGUF files as llama.cpp reads them: :func:`read_gguf` (GGUF -> :class:`Reading`) and :func:`write_gguf`.

The file format is the ``gguf`` package's (llama.cpp's own, on PyPI). The semantics are llama.cpp's, read
from its source into :mod:`ropelab.engines.llamacpp_table` (generated; file and commit cited there):

- **rope type** from ``general.architecture`` (``llama_model_rope_type``): NORM pairs (2i, 2i + 1)
  (ropelab's ``"interleaved"``); NEOX, MROPE and IMROPE pair (i, i + n_rot/2) (``"half"``); NONE: no RoPE
  in any layer. MROPE / IMROPE take ``{arch}.rope.dimension_sections`` (4 ints, trailing zeros dropped) as
  :class:`~ropelab.multiaxis.MultiAxis` sections, contiguous / interleaved.
- **q/k permutation**: for NORM architectures whose Hugging Face counterparts pair (i, i + d/2), the
  converter permutes the q/k rows (``LlamaModel.permute``) so that NORM on the stored weights equals the
  Hugging Face model: :attr:`Reading.qk_permuted` is True and :meth:`Reading.effective_specs` is ``"half"``.
- ``{arch}.rope.dimension_count`` (n_rot, default the head dim ``attention.key_length`` else
  ``embedding_length / head_count``) -> ``rotary_dim``; ``dimension_count_swa`` for sliding-window layers.
- ``rope.freq_base`` (default 10000) -> ``base``; ``freq_base_swa`` on sliding-window layers when the
  architecture reads it (else what its ``load_arch_hparams`` sets: the full layers' base, or 10000).
- ``rope.scaling.type`` (default ``"linear"``; ``none``, ``linear``, ``yarn``, ``longrope``) and
  ``rope.scaling.factor`` (llama.cpp's ``freq_scale`` is its inverse; 0 or absent means 1) -> a Hugging Face
  scaling dict: ``linear``; ``yarn`` with ``original_max_position_embeddings`` =
  ``scaling.original_context_length`` (default ``context_length``) and the ``beta_fast`` / ``beta_slow``
  llama.cpp uses (the ``yarn_*`` keys only where the architecture reads them, else 32 / 1). llama.cpp's yarn
  attention factor (``llama_context``: :math:`(0.1\ln s + 1)`, or with ``yarn_log_multiplier`` m
  :math:`(0.1\,m' \ln s + 1)/(0.1\,m \ln s + 1)` with :math:`m' = 1` except DeepSeek-V2's :math:`m' = m`),
  times ``rope.scaling.attn_factor``, becomes the dict's ``mscale`` / ``mscale_all_dim`` /
  ``attention_factor``.
- the ``rope_freqs`` tensor (llama3's ladder, written by the converter instead of metadata): ggml divides
  pair i's frequency by ``rope_freqs[i]``. The llama3 parameters (factor, low/high frequency factors, L0)
  cannot be recovered in general (the ladder depends on L0/low and L0/high only, and a small head has too
  few pairs in the transition band), so it is represented exactly as a ``longrope`` dict with
  ``short_factor = long_factor = rope_freqs`` and ``attention_factor = 1``: the same frequencies, pair for pair.
  Given :math:`L_0` from elsewhere (the transformers config), :func:`llama3_from_rope_freqs` recovers the
  llama3 dict when two or more pairs lie in the transition band.
  ``rope_factors_long`` / ``rope_factors_short`` (Phi-3's longrope; llama.cpp uses them whatever
  ``scaling.type`` says) become that dict's two lists, with ``rope.scaling.attn_factor`` as its attention factor.
  llama.cpp picks one set for every position by the *allocated* context (``llama_model::get_rope_factors``: the
  long factors when ``n_ctx_seq`` exceeds ``original_context_length``), transformers by the current sequence
  length: the reading holds the set the context picks (``read_gguf(path, n_ctx=...)``, default the file's
  ``context_length``, padded to a multiple of 256 as ``llama_context`` does), as both lists.
- sliding-window layers: ``attention.sliding_window_pattern`` (a bool per layer, or a period), else the
  architecture's own period (``load_swa_pattern(ml, n)``) when ``attention.sliding_window`` > 0. The converter
  does not write the pattern for every architecture (Gemma 3), so llama.cpp's default period decides.
- multi-head latent attention (``attention.key_length_mla`` present: DeepSeek-V2/V3): the RoPE head is the
  separate ``rope.dimension_count``-wide slice llama.cpp rotates (q_pe, k_pe), as transformers'
  ``qk_rope_head_dim``; ``attention.key_length`` (kv_lora_rank + n_rot) is not the RoPE head.
- NoPE layers: no key says them; each architecture's graph decides (``use_rope``: SmolLM3 and Llama 4 skip
  every ``n_no_rope_layer_step``-th layer, EXAONE 4 its full-attention layers): :func:`uses_rope`.
- keys in the file that the architecture's ``load_arch_hparams`` does not read (the converter writes
  ``yarn_beta_fast`` for any architecture; llama.cpp's qwen2 never reads it) are ignored, as llama.cpp does, with
  a note in :attr:`Reading.notes`.

Every bad input raises :class:`~ropelab.engines.reading.ReadError` naming the file and the key: a file that is
missing, truncated or not GGUF, a missing required key, a key of the wrong type, an architecture or a rope
scaling type llama.cpp does not know.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..multiaxis import MultiAxis
from ..scaling import yarn_mscale
from ..spec import RopeSpec
from . import llamacpp_table as table
from . import llamacpp_types
from .gguf_file import GGUFFile, open_gguf
from .reading import ReadError, Reading

__all__ = ["read_gguf", "allocated_context", "CTX_PAD", "write_gguf", "rope_type_of", "uses_rope",
           "llama3_from_rope_freqs", "STYLE_OF_ROPE_TYPE"]

# ggml's rope modes in ropelab's pairing: NORM rotates (2i, 2i+1), the others (i, i + n_rot/2).
STYLE_OF_ROPE_TYPE = {"NORM": "interleaved", "NEOX": "half", "MROPE": "half", "IMROPE": "half"}
# The rope keys llama_model_base::load_hparams reads for every architecture (src/llama-model.cpp); the others
# only where the architecture's load_arch_hparams reads them (llamacpp_table.ARCHS[arch]["reads"]).
_GENERIC = ("LLM_KV_ROPE_FREQ_BASE", "LLM_KV_ROPE_SCALING_TYPE", "LLM_KV_ROPE_SCALING_FACTOR",
            "LLM_KV_ROPE_SCALE_LINEAR", "LLM_KV_ROPE_SCALING_ATTN_FACTOR", "LLM_KV_ROPE_SCALING_ALPHA",
            "LLM_KV_ROPE_SCALING_ORIG_CTX_LEN", "LLM_KV_ROPE_SCALING_FINETUNED", "LLM_KV_ROPE_DIMENSION_COUNT",
            "LLM_KV_ROPE_DIMENSION_COUNT_SWA")
_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES, src/llama-model.cpp
# The architectures whose n_rot llama_model_base::load_hparams requires to equal the head dim (src/llama-model.cpp
# at the converter's commit, lines 1450-1454: `arch == LLM_ARCH_LLAMA || arch == LLM_ARCH_DECI || arch ==
# LLM_ARCH_FALCON || arch == LLM_ARCH_LLAMA_EMBED`); tests/test_engines_llamacpp.py checks the refusal by running.
_FULL_ROT_ARCHS = ("llama", "deci", "falcon", "llama-embed")
# llama_model_base::load_hparams asserts 0 < n_layer <= LLAMA_MAX_LAYERS, and no per-layer array llama.cpp holds is
# longer: the longest array ropelab decodes.
_ARRAY_MAX = llamacpp_types.LIMITS["LLAMA_MAX_LAYERS"]


def _key(kv: str, arch: str) -> str:
    return table.KEYS[kv] % arch


def rope_type_of(arch: str, *, has_sections: bool = False, where: str = "") -> str:
    """llama.cpp's rope type for GGUF architecture ``arch`` (``llama_model_rope_type``): NONE, NORM, NEOX,
    MROPE, IMROPE or VISION. ``has_sections``: the file has nonzero ``rope.dimension_sections``."""
    entry = table.ARCHS.get(arch)
    if entry is None:
        raise ReadError(f"{where}general.architecture {arch!r} is not an architecture llama.cpp "
                        f"{table.LLAMA_CPP_COMMIT[:12]} knows ({len(table.ARCHS)} in ropelab.engines.llamacpp_table); "
                        "check the spelling, or regenerate the table from a newer llama.cpp with "
                        "`python -m ropelab.engines.llamacpp_table --source DIR`.")
    rule = entry["rope_type"]
    if isinstance(rule, Mapping):
        return rule["sections"] if has_sections else rule["else"]
    if rule is None:
        raise ReadError(f"{where}architecture {arch!r}: llama.cpp computes its rope type from other hyperparameters "
                        "(see llama_model_rope_type in src/llama-model.cpp); ropelab does not model that case.")
    return rule


# Integer GGUF types, and the largest string ropelab decodes to compare with llama.cpp's names (architectures,
# scaling types: a few dozen bytes; a longer one is unknown to llama.cpp whatever it holds).
_INTS = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")
_NAME_BYTES = 4096


class _Fields:
    """Typed access to a GGUF file's key-value fields (:class:`~ropelab.engines.gguf_file.GGUFFile`).

    Two checks per key. ropelab's own (can the value be read as what ropelab needs, a number, an array of
    ints ...): a failure is a ReadError naming the key. llama.cpp's (the type ``llama_model_loader`` demands,
    :data:`ropelab.engines.llamacpp_types.KEY_TYPES`): a refusal is one of :attr:`problems`, in llama.cpp's own
    words, and the value is still read when ropelab can (so the rest of the file is checked too). An array
    longer than llama.cpp's limit for the key is never decoded."""

    def __init__(self, g: GGUFFile, where: str):
        self.g, self.where, self.fields = g, where, g.fields
        self.problems: list[str] = []
        self.kv_of: dict[str, str] = {}

    def set_arch(self, arch: str) -> None:
        self.kv_of = {_key(kv, arch): kv for kv in table.KEYS}

    def has(self, key: str) -> bool:
        return key in self.fields

    def _type(self, key: str) -> str:
        return self.fields[key].type

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def _value(self, key: str) -> Any:
        f = self.fields[key]
        if f.is_array and f.count > _ARRAY_MAX:
            return f"<{f.count} {f.elem} values>"  # never decoded (no key ropelab reads is that long)
        if f.type == "STRING" and self.g.string_length(key) > _NAME_BYTES:
            return f"<a string of {self.g.string_length(key)} bytes>"
        return self.g.value(key)

    def _ways(self, key: str) -> list[dict]:
        return llamacpp_types.KEY_TYPES.get(self.kv_of.get(key, ""), [])

    def check_llama_cpp(self, key: str, n: int | None = None) -> None:
        """Record llama.cpp's refusal of ``key``'s type or length (``llama_model_loader``), if any.
        ``n``: the length ``get_key_or_arr`` is called with (the layer count, 4 for the sections)."""
        f, ways = self.fields[key], self._ways(key)
        if not ways:
            return
        if not f.is_array:
            want = sorted({w["gguf"] for w in ways if w.get("gguf")})
            if want and f.type not in want:
                self._problem(f"llama.cpp refuses {key}: it is {f.type}, and llama_model_loader reads it as "
                              f"{' or '.join(want)} (\"key {key} has wrong type {f.type} but expected type "
                              f"{want[0]}\"); write it as {want[0]}.")
            return
        arrays = [w for w in ways if "elems" in w]
        if not arrays:
            want = sorted({w["gguf"] for w in ways if w.get("gguf")})
            self._problem(f"llama.cpp refuses {key}: it is an array, and llama_model_loader reads one "
                          f"{' or '.join(want)}; write a single value.")
            return
        w = arrays[0]
        if f.elem not in w["elems"]:
            self._problem(f"llama.cpp refuses {key}: an array of {f.elem} (\"{key} has wrong array element type "
                          f"{f.elem}\"); llama.cpp reads {', '.join(w['elems'])} elements.")
        if w["max"] is not None and f.count > w["max"]:
            self._problem(f"llama.cpp refuses {key}: {f.count} elements (\"array length {f.count} for key {key} "
                          f"exceeds max {w['max']}\").")
        elif n is not None and w["call"] == "get_key_or_arr" and f.count != n:
            self._problem(f"llama.cpp refuses {key}: {f.count} elements (\"key {key} has wrong array length; "
                          f"expected {n}, got {f.count}\").")

    def get(self, key: str, kind: str, default: Any = None, required: bool = False, n: int | None = None) -> Any:
        """kind: 'str', 'int', 'float', 'bool', 'ints' (array of ints), 'bools' (array of bools)."""
        if key not in self.fields:
            if required:
                raise ReadError(f"{self.where}has no {key!r}, which llama.cpp requires; the file is incomplete "
                                "(rewrite it with llama.cpp's convert_hf_to_gguf.py).")
            return default
        f = self.fields[key]
        t = f.type
        ok = {"str": t == "STRING", "int": t in _INTS, "float": t in ("FLOAT32", "FLOAT64") or t in _INTS,
              "bool": t == "BOOL"}
        if kind in ("ints", "bools"):
            good = f.is_array and (f.elem in _INTS if kind == "ints" else f.elem in ("BOOL", *_INTS))
        else:
            good = ok[kind]
        if not good:
            want = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a bool",
                    "ints": "an array of integers", "bools": "an array of bools"}[kind]
            name = f"ARRAY of {f.elem}" if f.is_array else t
            raise ReadError(f"{self.where}key {key!r} is {name}, but llama.cpp reads it as {want}; fix the writer.")
        self.check_llama_cpp(key, n)
        if f.is_array and f.count > _ARRAY_MAX:
            raise ReadError(f"{self.where}key {key!r} is an array of {f.count} elements; llama.cpp holds at most "
                            f"LLAMA_MAX_LAYERS = {_ARRAY_MAX} (one per layer) and refuses the file.")
        if kind == "str" and self.g.string_length(key) > _NAME_BYTES:
            raise ReadError(f"{self.where}key {key!r} is a string of {self.g.string_length(key)} bytes, not a name "
                            "llama.cpp knows.")
        v = self.g.value(key)
        if kind == "int":
            return int(v)
        if kind == "float":
            return float(v)
        if kind == "bool":
            return bool(v)
        if kind in ("ints", "bools"):
            return [int(x) for x in v] if kind == "ints" else [bool(x) for x in v]
        return str(v)


def _open(path: Path) -> GGUFFile:
    if not path.is_file():
        raise ReadError(f"{path}: no such file; pass a .gguf file.")
    return open_gguf(path)


def read_gguf(path: str | Path, *, n_ctx: int | None = None) -> Reading:
    """The RoPE of every layer of the GGUF file ``path``, as llama.cpp reads it (see the module docstring), in a
    context of ``n_ctx`` tokens allocated (:func:`allocated_context`; default llama.cpp's own, the file's
    ``context_length``): Phi-3's LongRoPE factors are chosen by it.

    Args:
        path: the ``.gguf`` file.
        n_ctx: the context llama.cpp allocates (``--ctx``), a positive int; None for the file's
            ``context_length``.
    """
    if n_ctx is not None and (not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 1):
        raise ValueError(f"n_ctx must be a positive int (the context llama.cpp allocates), got {n_ctx!r}.")
    path = Path(path)
    with _open(path) as g:
        return _read(g, path, n_ctx)


# llama_context pads the requested context to a multiple of 256 (src/llama-context.cpp at the converter's commit,
# `cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)`; the runtime b11739 reports 256 for a request of 24, measured).
CTX_PAD = 256


def allocated_context(n_ctx: int | None, context_length: int) -> int:
    """The context llama.cpp allocates for a request of ``n_ctx`` tokens (0 or None: the file's
    ``context_length``, llama_context's default), padded up to a multiple of :data:`CTX_PAD`."""
    n = context_length if not n_ctx else n_ctx
    return -(-n // CTX_PAD) * CTX_PAD


def _read(g: GGUFFile, path: Path, n_ctx: int | None = None) -> Reading:
    where = f"{path}: "
    f = _Fields(g, where)
    arch = f.get("general.architecture", "str", required=True)
    f.set_arch(arch)
    entry = table.ARCHS.get(arch)
    rope_type_of(arch, where=where)  # an unknown architecture raises here
    k = lambda kv: _key(kv, arch)  # noqa: E731
    reads = set(_GENERIC) | set(entry["reads"])
    notes: list[str] = []
    declared = {key: f._value(key) for key in f.fields
                if key.startswith(f"{arch}.rope.") or key in (k("LLM_KV_ATTENTION_SLIDING_WINDOW"),
                                                              k("LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN"))}
    for kv in table.KEYS:
        if kv.startswith("LLM_KV_ROPE_") and kv not in reads and f.has(k(kv)):
            notes.append(f"{k(kv)} is in the file, but llama.cpp's {arch!r} does not read it "
                         f"({entry['class']}::load_arch_hparams); ignored, as llama.cpp does.")

    for kv in sorted(reads):  # the rope keys llama.cpp reads for this architecture, whether ropelab needs them
        if f.has(k(kv)):
            f.check_llama_cpp(k(kv))
    n_layers = f.get(k("LLM_KV_BLOCK_COUNT"), "int", required=True)
    ctx = f.get(k("LLM_KV_CONTEXT_LENGTH"), "int", required=True)
    if not 0 < n_layers <= _ARRAY_MAX:
        raise ReadError(f"{where}{k('LLM_KV_BLOCK_COUNT')}={n_layers}: llama.cpp asserts 0 < n_layer <= "
                        f"LLAMA_MAX_LAYERS = {_ARRAY_MAX} (src/llama-model.cpp) and aborts on this file.")
    if ctx <= 0:
        raise ReadError(f"{where}{k('LLM_KV_CONTEXT_LENGTH')}={ctx} must be positive.")
    head_dim = f.get(k("LLM_KV_ATTENTION_KEY_LENGTH"), "int")
    if head_dim is None:
        n_embd = f.get(k("LLM_KV_EMBEDDING_LENGTH"), "int", required=True)
        n_head = _head_count(f, k("LLM_KV_ATTENTION_HEAD_COUNT"), n_layers)
        if n_head <= 0:
            raise ReadError(f"{where}{k('LLM_KV_ATTENTION_HEAD_COUNT')}={n_head} and no "
                            f"{k('LLM_KV_ATTENTION_KEY_LENGTH')}: llama.cpp has no head dim for a model without "
                            "attention heads.")
        head_dim = n_embd // n_head
    if not 0 < head_dim or head_dim % 2:
        raise ReadError(f"{where}the head dim {head_dim} ({k('LLM_KV_ATTENTION_KEY_LENGTH')}, else "
                        f"{k('LLM_KV_EMBEDDING_LENGTH')} / {k('LLM_KV_ATTENTION_HEAD_COUNT')}) must be a positive even "
                        "number (RoPE rotates pairs).")
    head_dim_swa = f.get(k("LLM_KV_ATTENTION_KEY_LENGTH_SWA"), "int", head_dim)
    if head_dim_swa != head_dim:
        raise ReadError(f"{where}sliding-window layers have head dim {head_dim_swa}, the others {head_dim}; a Reading "
                        "holds one head_dim, so ropelab cannot compare this model yet.")
    sections = f.get(k("LLM_KV_ROPE_DIMENSION_SECTIONS"), "ints", n=4) if "LLM_KV_ROPE_DIMENSION_SECTIONS" in reads \
        else None
    rtype = rope_type_of(arch, has_sections=bool(sections and any(sections)), where=where)
    if rtype == "NONE":
        return Reading(source=str(path), format="gguf", architecture=arch, head_dim=head_dim,
                       layers=(RopeSpec.nope(ctx),) * n_layers, declared=declared, problems=tuple(f.problems),
                       notes=(*notes, f"llama.cpp's {arch!r} uses no RoPE (rope type NONE)."))
    if rtype not in STYLE_OF_ROPE_TYPE:
        raise ReadError(f"{where}architecture {arch!r} has rope type {rtype}, which ropelab's GGUF reader does not "
                        "map to a decoder's RoPE (VISION is a vision tower's).")
    style = STYLE_OF_ROPE_TYPE[rtype]
    multi = None
    if rtype in ("MROPE", "IMROPE"):
        if not sections or not any(sections):
            raise ReadError(f"{where}architecture {arch!r} has rope type {rtype} but no nonzero "
                            f"{k('LLM_KV_ROPE_DIMENSION_SECTIONS')}; llama.cpp needs the sections.")
        trimmed = list(sections)
        while trimmed and trimmed[-1] == 0:
            trimmed.pop()
        try:
            multi = MultiAxis.mrope(trimmed, interleaved=rtype == "IMROPE")
        except ValueError as e:
            raise ReadError(f"{where}{k('LLM_KV_ROPE_DIMENSION_SECTIONS')}={sections}: {e}") from e

    n_rot = f.get(k("LLM_KV_ROPE_DIMENSION_COUNT"), "int", head_dim)
    n_rot_swa = f.get(k("LLM_KV_ROPE_DIMENSION_COUNT_SWA"), "int", n_rot)
    for name, r in (("LLM_KV_ROPE_DIMENSION_COUNT", n_rot), ("LLM_KV_ROPE_DIMENSION_COUNT_SWA", n_rot_swa)):
        if not 0 < r <= head_dim or r % 2:
            raise ReadError(f"{where}{k(name)}={r} must be an even count of rotated dims in 1..{head_dim} (the head).")
    mla = f.get(k("LLM_KV_ATTENTION_KEY_LENGTH_MLA"), "int")
    if mla is not None:
        # Multi-head latent attention (DeepSeek-V2/V3, Kimi, GLM-4.7 Lite): llama.cpp's deepseek2 graph rotates a
        # separate n_rot-wide slice of each q/k head (q_pe, k_pe, src/models/deepseek2.cpp) beside key_length_mla -
        # n_rot unrotated dims; key_length is kv_lora_rank + n_rot, the absorbed form it computes in. The rotated
        # slice is the RoPE head, as transformers' qk_rope_head_dim (ropelab.spec).
        if not 0 < n_rot < mla:
            raise ReadError(f"{where}{k('LLM_KV_ATTENTION_KEY_LENGTH_MLA')}={mla} with "
                            f"{k('LLM_KV_ROPE_DIMENSION_COUNT')}={n_rot}: multi-head latent attention rotates a slice "
                            "narrower than the head.")
        notes.append(f"multi-head latent attention: {k('LLM_KV_ATTENTION_KEY_LENGTH_MLA')}={mla} per q/k head, of "
                     f"which {k('LLM_KV_ROPE_DIMENSION_COUNT')}={n_rot} rotate as a separate slice (q_pe, k_pe); read "
                     f"as a RoPE head of {n_rot} ({k('LLM_KV_ATTENTION_KEY_LENGTH')}={head_dim} is the absorbed "
                     "kv_lora_rank + n_rot).")
        head_dim = n_rot
    if arch in _FULL_ROT_ARCHS and n_rot != head_dim:
        # llama_model_base::load_hparams: `throw std::runtime_error(format("invalid n_rot: %u, expected %u", ...))`
        f._problem(f"{k('LLM_KV_ROPE_DIMENSION_COUNT')}={n_rot} with a {head_dim}-wide head: llama.cpp refuses to "
                   f"load a {arch!r} file whose n_rot is not the head dim (\"invalid n_rot: {n_rot}, expected "
                   f"{head_dim}\", src/llama-model.cpp); rewrite the key to {head_dim} or reconvert.")
    if multi is not None and multi.n_pairs != n_rot // 2:
        raise ReadError(f"{where}{k('LLM_KV_ROPE_DIMENSION_SECTIONS')} covers {multi.n_pairs} pairs, but "
                        f"{k('LLM_KV_ROPE_DIMENSION_COUNT')}={n_rot} rotates {n_rot // 2}.")

    base = f.get(k("LLM_KV_ROPE_FREQ_BASE"), "float")
    if base is None:
        base = 10000.0
        notes.append(f"{k('LLM_KV_ROPE_FREQ_BASE')} is absent: llama.cpp uses 10000.")
    rope_tensors = _rope_tensors(f.g, n_rot, k, where)
    for name, values in rope_tensors.items():
        declared[f"tensor {name}"] = values.tolist()
    scaling = _scaling(f, k, arch, entry, reads, head_dim, n_rot, ctx, base, rope_tensors, notes,
                       allocated_context(n_ctx, ctx))

    swa = _swa_layers(f, k, entry, n_layers, where)
    full = swa_spec = _spec(style, base, n_rot, head_dim, scaling, ctx, where)
    if any(swa):
        base_swa = _swa_base(f, k, entry, base, reads, notes)
        own = entry["swa_scale"]  # what load_arch_hparams sets rope_freq_scale_train_swa to
        scaling_swa = scaling if own == "inherit" else (
            None if own in ("default", 1.0) else {"rope_type": "linear", "factor": 1 / own})
        if scaling is not None and scaling.get("rope_type") == "longrope" and entry["swa_scale"] != "inherit":
            scaling_swa = scaling  # rope_freqs / rope factors apply to every layer (llama_model::get_rope_factors)
        swa_spec = _spec(style, base_swa, n_rot_swa, head_dim, scaling_swa, ctx, where)
    layers = tuple(swa_spec if s else full for s in swa)
    uses = _uses_rope(f, k, arch, entry, n_layers, swa, where)
    if not all(uses):
        layers = tuple(s if u else RopeSpec.nope(ctx) for s, u in zip(layers, uses))
        notes.append(f"llama.cpp's {arch!r} graph skips RoPE where not ({entry['use_rope']['cpp']}): layers "
                     f"{[i for i, u in enumerate(uses) if not u]}.")
    qk_permuted = False
    if rtype == "NORM":
        conv = entry["converter"]
        qk_permuted = any(conv.values())
        kept = sorted(a for a, p in conv.items() if not p)
        if qk_permuted and kept:
            notes.append(f"llama.cpp's converter permutes q/k for {arch!r} (NORM on the stored weights equals the "
                         f"Hugging Face model's rotate_half), except for {', '.join(kept)}.")
    return Reading(source=str(path), format="gguf", architecture=arch, head_dim=head_dim, layers=layers,
                   sections=multi, qk_permuted=qk_permuted, declared=declared, notes=tuple(notes),
                   problems=tuple(f.problems))


def _head_count(f: _Fields, key: str, n_layers: int) -> int:
    if f.has(key) and f.fields[key].is_array:
        counts = set(f.get(key, "ints", n=n_layers))
        if len(counts) != 1:
            raise ReadError(f"{f.where}{key} differs per layer {sorted(counts)}; give attention.key_length.")
        return counts.pop()
    return f.get(key, "int", required=True)


def _spec(style, base, n_rot, head_dim, scaling, ctx, where) -> RopeSpec:
    try:
        return RopeSpec(style=style, base=base, rotary_dim=None if n_rot == head_dim else n_rot, scaling=scaling,
                        max_position_embeddings=ctx)
    except ValueError as e:
        raise ReadError(f"{where}the rope keys do not make a valid RoPE: {e}") from e


def _rope_tensors(g: GGUFFile, n_rot: int, k, where: str) -> dict[str, np.ndarray]:
    """The rope tensors (``rope_freqs``, ``rope_factors_long`` / ``_short``) by name, each checked to hold one
    entry per rotated pair before its data is read."""
    out = {}
    for name, t in g.tensors.items():
        if name.startswith(("rope_freqs", "rope_factors")):
            if t.n_elements != n_rot // 2:
                raise ReadError(f"{where}tensor {name.split('.')[0]} has {t.n_elements} entries, but "
                                f"{k('LLM_KV_ROPE_DIMENSION_COUNT')}={n_rot} has {n_rot // 2} pairs.")
            out[name] = g.tensor_values(name)
    return out


def _scaling(f, k, arch, entry, reads, head_dim, n_rot, ctx, base, tensors, notes, n_ctx) -> dict | None:
    where = f.where
    stype = f.get(k("LLM_KV_ROPE_SCALING_TYPE"), "str", "linear")
    if stype not in _SCALING_TYPES:
        raise ReadError(f"{where}{k('LLM_KV_ROPE_SCALING_TYPE')}={stype!r} is not a rope scaling type llama.cpp knows "
                        f"({', '.join(_SCALING_TYPES)}); llama.cpp aborts on it.")
    factor = f.get(k("LLM_KV_ROPE_SCALING_FACTOR"), "float")
    if factor is None:
        factor = f.get(k("LLM_KV_ROPE_SCALE_LINEAR"), "float", 0.0)
    factor = 1.0 if factor == 0.0 else factor
    if stype == "none":
        factor = 1.0  # llama_context: "never scale if scaling type is none"
    attn = f.get(k("LLM_KV_ROPE_SCALING_ATTN_FACTOR"), "float", 1.0)
    orig = f.get(k("LLM_KV_ROPE_SCALING_ORIG_CTX_LEN"), "int", ctx)
    freqs = tensors.get("rope_freqs.weight")
    long_f, short_f = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    for name, t in (("rope_freqs", freqs), ("rope_factors_long", long_f), ("rope_factors_short", short_f)):
        if t is not None and t.size != n_rot // 2:
            raise ReadError(f"{where}tensor {name} has {t.size} entries, but {k('LLM_KV_ROPE_DIMENSION_COUNT')}="
                            f"{n_rot} has {n_rot // 2} pairs.")
    if freqs is not None:
        if stype == "yarn" or factor != 1.0 or long_f is not None:
            raise ReadError(f"{where}rope_freqs together with {stype} scaling (factor {factor}) or rope factors: "
                            "ropelab does not model that combination.")
        if not np.all(freqs > 0):
            raise ReadError(f"{where}tensor rope_freqs has entries <= 0; ggml divides the frequencies by them.")
        notes.append("rope_freqs (llama3's ladder as per-pair divisors) is read as longrope with "
                     "short_factor = long_factor = rope_freqs and attention_factor 1 (the same frequencies).")
        return {"rope_type": "longrope", "short_factor": freqs.tolist(), "long_factor": freqs.tolist(),
                "factor": 1.0, "attention_factor": attn, "original_max_position_embeddings": orig}
    if long_f is not None or short_f is not None:
        # llama_model::get_rope_factors uses these tensors whatever scaling.type says: rope_long when the context
        # size n_ctx_seq exceeds original_context_length, else rope_short.
        if long_f is None or short_f is None:
            raise ReadError(f"{where}has only one of the tensors rope_factors_long / rope_factors_short; llama.cpp "
                            "needs both.")
        if stype == "yarn" or factor != 1.0:
            raise ReadError(f"{where}rope factors together with {stype} scaling (factor {factor}): ropelab does not "
                            "model that combination.")
        # One factor set for every position: the one the allocated context picks (transformers switches by the
        # current sequence length; engines keep one set because keys already in the KV cache were rotated with it).
        chosen, which = (long_f, "long") if n_ctx > orig else (short_f, "short")
        notes.append(f"rope_factors_long / _short: llama.cpp picks one set by the allocated context, not by the "
                     f"sequence length (llama_model::get_rope_factors: long when n_ctx_seq > original_context_length "
                     f"{orig}); at n_ctx {n_ctx} it runs the {which} factors at every position.")
        return {"rope_type": "longrope", "short_factor": chosen.tolist(), "long_factor": chosen.tolist(),
                "factor": ctx / orig, "attention_factor": attn, "original_max_position_embeddings": orig}
    if stype == "longrope":
        raise ReadError(f"{where}scaling type longrope needs the tensors rope_factors_long and rope_factors_short.")
    if stype == "yarn" and factor != 1.0:
        def read(kv, default):
            if kv in reads:
                return f.get(k(kv), "float", default)
            return default
        d = table.DEFAULTS
        out = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
               "beta_fast": read("LLM_KV_ROPE_SCALING_YARN_BETA_FAST", d["yarn_beta_fast"]),
               "beta_slow": read("LLM_KV_ROPE_SCALING_YARN_BETA_SLOW", d["yarn_beta_slow"])}
        ext = read("LLM_KV_ROPE_SCALING_YARN_EXT_FACTOR", None)
        if ext is not None and ext != 1.0:
            raise ReadError(f"{where}{k('LLM_KV_ROPE_SCALING_YARN_EXT_FACTOR')}={ext}: ropelab's yarn ramps with "
                            "extrapolation factor 1 only.")
        log_mul = read("LLM_KV_ROPE_SCALING_YARN_LOG_MUL", 0.0)
        # llama_context's cparams.yarn_attn_factor, times the 1 + 0.1 ln s that ggml's rope_yarn multiplies back.
        mscale = log_mul if (arch == "deepseek2" and log_mul not in (0.0, 1.0)) else 1.0
        if log_mul:
            af = yarn_mscale(factor, mscale) / yarn_mscale(factor, log_mul)
        else:
            af = yarn_mscale(factor, 1.0)
        out["attention_factor"] = af * attn
        return out
    if attn != 1.0:
        raise ReadError(f"{where}{k('LLM_KV_ROPE_SCALING_ATTN_FACTOR')}={attn} scales llama.cpp's cos/sin, but with "
                        f"scaling type {stype!r} ropelab has no attention factor to put it in.")
    if stype == "yarn":
        notes.append(f"{k('LLM_KV_ROPE_SCALING_TYPE')} is yarn with factor 1: llama.cpp's yarn is then plain RoPE.")
        return None
    if factor != 1.0:
        return {"rope_type": "linear", "factor": factor}
    return None


def _swa_layers(f, k, entry, n_layers, where) -> list[bool]:
    key = k("LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN")
    pat = entry["swa_pattern"]
    if f.has(key) and f.fields[key].is_array:
        flags = f.get(key, "bools")
        if len(flags) != n_layers:
            raise ReadError(f"{where}{key} has {len(flags)} entries for {n_layers} layers.")
        return flags
    window = f.get(k("LLM_KV_ATTENTION_SLIDING_WINDOW"), "int", 0)
    if pat is None or not window:
        return [False] * n_layers
    n = f.get(key, "int", pat["n"]) if pat["key"] else pat["n"]
    if n is None:
        raise ReadError(f"{where}llama.cpp's {entry['class']} computes its sliding-window pattern ({pat['expr']}); "
                        "ropelab does not model it. Write the per-layer pattern into the file.")
    # llama_hparams::set_swa_pattern
    if pat["dense_first"]:
        return [n == 0 or il % n != 0 for il in range(n_layers)]
    return [n == 0 or il % n < n - 1 for il in range(n_layers)]


def _uses_rope(f, k, arch, entry, n_layers, swa, where) -> list[bool]:
    """Which layers rotate: the architecture's graph ``use_rope`` expression (llamacpp_table, translated from
    C++), over ``n_no_rope_layer_step`` (set by load_arch_hparams; ``"n_layer"`` is set in the no-SWA branch of
    llama4 and smallthinker), the sliding-window flags and ``attention.rope_pattern``."""
    key = k("LLM_KV_ATTENTION_ROPE_PATTERN")
    pattern = f.get(key, "bools") if f.has(key) else None
    if pattern is not None and len(pattern) < n_layers:
        raise ReadError(f"{where}{key} has {len(pattern)} entries for {n_layers} layers.")
    try:
        return uses_rope(arch, n_layers, swa, pattern)
    except ValueError as e:
        raise ReadError(f"{where}{e}") from e


def uses_rope(arch: str, n_layers: int, swa: Sequence[bool] | None = None,
              rope_pattern: Sequence[bool] | None = None) -> list[bool]:
    """For each layer of a GGUF ``arch`` model, whether llama.cpp's graph applies RoPE (False: a NoPE layer)."""
    entry = table.ARCHS[arch]
    rule = entry["use_rope"]
    if rule is None:
        return [True] * n_layers
    if rule["py"] is None:
        raise ValueError(f"llama.cpp decides which {arch!r} layers use RoPE by `{rule['cpp']}`, which ropelab does "
                         "not model.")
    swa = list(swa) if swa is not None else [False] * n_layers
    step = entry["no_rope_step"]
    default = int(table.DEFAULTS["n_no_rope_layer_step"])
    step = (n_layers if not any(swa) else default) if step == "n_layer" else int(step if step is not None else default)
    env = {"n_layer": n_layers, "step": step, "swa": swa,
           "rope_pattern": list(rope_pattern) if rope_pattern is not None else [True] * n_layers}
    return [bool(eval(rule["py"], {"__builtins__": {}, "any": any}, {**env, "il": il}))  # noqa: S307 (a parsed,
            for il in range(n_layers)]                                                  # whitelisted expression)


def _swa_base(f, k, entry, base, reads, notes) -> float:
    key = k("LLM_KV_ROPE_FREQ_BASE_SWA")
    own = {"inherit": base, "default": table.DEFAULTS["rope_freq_base_train_swa"]}.get(entry["swa_base"],
                                                                                    entry["swa_base"])
    if "LLM_KV_ROPE_FREQ_BASE_SWA" in reads and f.has(key):
        return f.get(key, "float")
    if not f.has(key):
        notes.append(f"{key} is absent: llama.cpp's sliding-window layers use base {own}.")
    return own


def llama3_from_rope_freqs(freqs: Sequence[float], base: float, rotary_dim: int,
                           original_max_position_embeddings: int, *, rtol: float = 64 * 2.0 ** -24) -> dict | None:
    r"""The llama3 scaling dict whose ladder is ``freqs`` (a ``rope_freqs`` tensor: pair i's frequency divisors),
    given the original context :math:`L_0`; None when no llama3 dict reproduces it or it is not identifiable.

    llama3 blends :math:`\omega_i/s` and :math:`\omega_i` with :math:`\mu_i = \mathrm{clamp}(A/\lambda_i + B, 0, 1)`,
    :math:`A = L_0/(h - l)`, :math:`B = -l/(h - l)` (l, h the low / high frequency factors, :math:`\lambda_i` the
    wavelength). The ladder fixes s (the largest divisor) and, from two or more pairs in the transition band, A
    and B: l and h up to the scale of :math:`L_0`, which the file does not carry (the converter writes no
    ``original_context_length`` for llama3), hence the argument. ``rtol``: the tensor's float32 error (the
    converter computes the ladder in float32). The result is checked by recomputing the ladder."""
    ff = np.asarray(freqs, dtype=np.float64)
    if ff.ndim != 1 or ff.size != rotary_dim // 2 or not np.all(ff > 0):
        raise ValueError(f"freqs must be {rotary_dim // 2} positive divisors (rotary_dim / 2), got shape {ff.shape}.")
    factor = float(ff.max())
    if factor <= 1.0 + rtol:
        return None
    high = np.abs(ff - 1.0) <= rtol
    low = np.abs(ff - factor) <= rtol * factor
    mid = ~(high | low)
    band = np.where(high, 0, np.where(mid, 1, 2))
    if np.any(np.diff(band) < 0) or mid.sum() < 2:
        return None  # not monotone (not llama3), or too few transition pairs to fix l and h
    inv = float(base) ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    x = inv[mid] / (2 * math.pi)  # 1 / wavelength
    mu = (1 / ff[mid] - 1 / factor) / (1 - 1 / factor)
    a, b = np.polyfit(x, mu, 1)
    if a <= 0:
        return None
    l0 = int(original_max_position_embeddings)
    lo = -b * l0 / a
    d = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(lo),
         "high_freq_factor": float(lo + l0 / a), "original_max_position_embeddings": l0}
    try:
        got = RopeSpec(base=float(base), scaling=d, max_position_embeddings=l0).frequencies(rotary_dim)[0].numpy()
    except ValueError:
        return None
    return d if np.allclose(got, inv / ff, rtol=4 * rtol, atol=0) else None


# ---------------------------------------------------------------------------------------------------------------
# Writing


def write_gguf(source: Reading | Sequence[RopeSpec], path: str | Path, *, architecture: str | None = None,
               head_dim: int | None = None, sections: MultiAxis | None = None) -> Path:
    """Write a minimal GGUF file (metadata only, plus ``rope_freqs`` where needed) whose rope keys say
    ``source``'s RoPE as llama.cpp reads it; :func:`read_gguf` gives the same specs back.

    ``source`` is a :class:`Reading` (its architecture, head_dim and sections are used) or one spec per layer
    in the stored weights' coordinates (then pass ``architecture=`` and ``head_dim=``). The layers may differ
    only as full / sliding-window layers (base, rotary_dim; scaling on the full layers) and the per-layer
    pattern is written as ``attention.sliding_window_pattern``. llama3 is written as the ``rope_freqs`` tensor
    (the converter's ``generate_extra_tensors``), linear and yarn as metadata. Raises ``ValueError`` for a
    spec llama.cpp cannot hold (a style the architecture's rope type does not have, a scaling type it has not).
    """
    import gguf

    if isinstance(source, Reading):
        specs, architecture, head_dim = source.layers, source.architecture, source.head_dim
        sections = source.sections if sections is None else sections
    else:
        specs = tuple(source)
        if architecture is None or head_dim is None:
            raise ValueError("write_gguf(specs, ...) needs architecture= (a GGUF architecture such as 'llama') and "
                             "head_dim=.")
    if not specs or not all(isinstance(s, RopeSpec) for s in specs):
        raise ValueError("source must be a Reading or a non-empty sequence of RopeSpec, one per layer.")
    rtype = rope_type_of(architecture, has_sections=sections is not None)
    all_specs = specs
    nope = [s.is_nope for s in all_specs]
    specs = [s for s in all_specs if not s.is_nope]
    if not specs:
        raise ValueError("every layer is NoPE; a GGUF file of an architecture with RoPE cannot say that.")
    distinct = list(dict.fromkeys(specs))
    if len(distinct) > 2:
        raise ValueError(f"the layers use {len(distinct)} different RoPE settings; a GGUF file holds two (full and "
                         "sliding-window layers).")
    full = next((s for s in specs if s.scaling is not None), specs[-1])
    swa_flags = [s != full and not s.is_nope for s in all_specs]
    swa = next((s for s in specs if s != full), None)
    for s in distinct:
        if not s.is_nope and STYLE_OF_ROPE_TYPE.get(rtype) != s.style:
            raise ValueError(f"architecture {architecture!r} has rope type {rtype}, which pairs dims as "
                             f"{STYLE_OF_ROPE_TYPE.get(rtype)!r}; the spec says {s.style!r} (choose another "
                             "architecture, or permute q/k with ropelab.convert.permute_qk_weight).")
    if swa is not None and swa.scaling is not None and swa.scaling != full.scaling:
        raise ValueError("the sliding-window layers' scaling differs from the full layers'; llama.cpp holds one.")
    if any(nope) or table.ARCHS[architecture]["use_rope"] is not None:
        want = [not n for n in nope]
        got = uses_rope(architecture, len(all_specs), swa_flags)
        if got != want:
            raise ValueError(f"layers {[i for i, n in enumerate(nope) if n]} are NoPE, but llama.cpp's "
                             f"{architecture!r} skips RoPE on layers {[i for i, u in enumerate(got) if not u]} "
                             "(its graph decides; the file has no key for it).")
    path = Path(path)
    w = gguf.GGUFWriter(str(path), architecture)
    k = lambda kv: _key(kv, architecture)  # noqa: E731
    ctx = full.max_position_embeddings or 4096
    w.add_uint32(k("LLM_KV_BLOCK_COUNT"), len(all_specs))
    w.add_uint32(k("LLM_KV_CONTEXT_LENGTH"), ctx)
    w.add_uint32(k("LLM_KV_ATTENTION_KEY_LENGTH"), head_dim)
    w.add_uint32(k("LLM_KV_ROPE_DIMENSION_COUNT"), full.rotary_dim or head_dim)
    w.add_float32(k("LLM_KV_ROPE_FREQ_BASE"), full.base)
    if sections is not None:
        w.add_array(k("LLM_KV_ROPE_DIMENSION_SECTIONS"), [*sections.sections, *[0] * (4 - len(sections.sections))])
    if swa is not None:
        w.add_uint32(k("LLM_KV_ATTENTION_SLIDING_WINDOW"), ctx)
        w.add_array(k("LLM_KV_ATTENTION_SLIDING_WINDOW_PATTERN"), swa_flags)
        w.add_float32(k("LLM_KV_ROPE_FREQ_BASE_SWA"), swa.base)
        w.add_uint32(k("LLM_KV_ROPE_DIMENSION_COUNT_SWA"), swa.rotary_dim or head_dim)
    tensors = {}
    sc = full.scaling
    if sc is not None:
        t = full.rope_type
        if t == "linear":
            w.add_string(k("LLM_KV_ROPE_SCALING_TYPE"), "linear")
            w.add_float32(k("LLM_KV_ROPE_SCALING_FACTOR"), float(sc["factor"]))
        elif t == "yarn":
            w.add_string(k("LLM_KV_ROPE_SCALING_TYPE"), "yarn")
            w.add_float32(k("LLM_KV_ROPE_SCALING_FACTOR"), float(sc["factor"]))
            w.add_uint32(k("LLM_KV_ROPE_SCALING_ORIG_CTX_LEN"),
                         int(sc.get("original_max_position_embeddings") or ctx))
            default_af = yarn_mscale(float(sc["factor"]), 1.0)
            af = sc.get("attention_factor")
            if af is not None and not math.isclose(af, default_af, rel_tol=1e-6):
                w.add_float32(k("LLM_KV_ROPE_SCALING_ATTN_FACTOR"), float(af) / default_af)
            for key in ("mscale", "mscale_all_dim"):
                if sc.get(key):
                    raise ValueError(f"yarn's {key} is written as yarn_log_multiplier, which only some llama.cpp "
                                     "architectures read; ropelab's writer does not write it.")
        elif t in ("llama3", "longrope"):
            inv, af = full.frequencies(head_dim, seq_len=ctx)
            inv0 = RopeSpec(style=full.style, base=full.base, rotary_dim=full.rotary_dim).frequencies(head_dim)[0]
            if t == "longrope" and (sc.get("long_factor") != sc.get("short_factor")):
                raise ValueError("a longrope spec with different short and long factors needs llama.cpp's "
                                 "rope_factors_long / _short, which this writer does not write.")
            tensors["rope_freqs.weight"] = (inv0 / inv).to(dtype=__import__("torch").float32).numpy()
            if not math.isclose(af, 1.0, rel_tol=1e-9):
                w.add_float32(k("LLM_KV_ROPE_SCALING_ATTN_FACTOR"), float(af))
        else:
            raise ValueError(f"scaling type {t!r} has no GGUF form llama.cpp reads (it has linear, yarn, longrope and "
                             "the rope_freqs tensor).")
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
