r"""The zoo: RoPE implementations, correct and broken, as a table of rows, for ``diagnose``, its tests and
notebook 02.

Every row is a black box ``fn(x)`` (``fn(x, cu_seqlens)`` for a ``t`` layout) returning x rotated, with
positions 0, 1, 2, ... along the sequence axis of its ``layout``, and what ``diagnose`` must find: ``ok``
for a correct one (``finding`` None), else the Diagnosis code that names the bug. ``Row.fn`` builds a
fresh callable on every access, so a module that caches its tables by length (rotary-embedding-torch)
starts empty in every diagnosis.

The correct rows: ropelab's own (each style, layout and scaling, also at non-default yarn / llama3
parameters); Hugging Face's code from the installed transformers (Llama default / yarn / llama3, also
at non-default parameters; Mistral; Qwen2 with yarn; GPT-NeoX with partial rotary; GPT-J interleaved;
Gemma 3's local and global layers; Phi-3 longrope; gpt-oss's yarn x32 at base 1.5e5 without truncation;
DeepSeek-V3's trailing rotary slice, with and without ``rope_interleave``; ESM); Meta's Llama reference;
rotary-embedding-torch with its cache on; ESM's old module called the right way. The broken rows: the
bugs of ``ropelab.diagnosis.specimens``, the seed's ESM calls, rotary-embedding-torch on bf16 input with
its cache on, and xPos (not a plain rotation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import specimens as sp
from . import thirdparty as tp
from .specimens import *  # noqa: F403 - the factories are part of the zoo's surface
from .thirdparty import *  # noqa: F403

__all__ = ["Row", "ROWS", "ZOO", "correct", "broken", *sp.__all__, *tp.__all__]

_TF, _RET = "transformers", "rotary_embedding_torch"


@dataclass(frozen=True)
class Row:
    """One implementation: ``make()`` builds ``fn``; ``finding`` is None for a correct one, else the code
    ``diagnose`` must report; ``expect``/``sizes``/``dtype`` are passed to ``diagnose``; ``needs`` names the
    third-party package it imports; ``reads`` what ``diagnose`` must read out (``base``, ``rope_type`` and
    the scaling parameters that the ladder determines)."""

    name: str
    make: Callable[[], Callable] = field(repr=False)
    layout: str
    finding: str | None
    about: str
    expect: dict | None = None
    sizes: dict | None = None
    dtype: torch.dtype = torch.float32
    needs: str | None = None
    reads: dict | None = None  # what diagnose must read out: base, rope_type and scaling parameters

    @property
    def correct(self) -> bool:
        return self.finding is None

    @property
    def fn(self) -> Callable:
        """A freshly built implementation (no table cache carried over from an earlier call)."""
        return self.make()


def _hf(family: str, d: int, h: int = 4, layer_type: str | None = None, **cfg) -> Callable[[], Callable]:
    """A row maker for ``thirdparty.hf_rope`` with hidden_size = h * d, h heads and head_dim d."""
    base = {"hidden_size": h * d, "num_attention_heads": h}
    if family == "deepseek_v3":
        base.update(num_key_value_heads=h)
    elif family not in ("gpt_neox",):
        base.update(head_dim=d, num_key_value_heads=h)
    return lambda: tp.hf_rope(family, layer_type=layer_type, **{**base, **cfg})


def _reads(sc: dict) -> dict:
    """What diagnose reads out of ropelab's own ladder for ``sc`` at base 10000 (a longrope ladder of random
    factors is no known type: unrecognised, and no base)."""
    if sc["rope_type"] == "longrope":
        return {"base": None, "rope_type": None, "scaling": "unrecognised"}
    return {"base": 10000.0, "rope_type": sc["rope_type"], "factor": sc.get("factor")}


def _rp(**params) -> dict:
    return {"rope_parameters": params}


YARN_CUSTOM = {
    "rope_type": "yarn",
    "factor": 8.0,
    "beta_fast": 16.0,
    "beta_slow": 2.0,
    "truncate": False,
    "original_max_position_embeddings": 3000,
}
LLAMA3_CUSTOM = {
    "rope_type": "llama3",
    "factor": 16.0,
    "low_freq_factor": 2.0,
    "high_freq_factor": 8.0,
    "original_max_position_embeddings": 6000,
}
GPT_OSS = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
DEEPSEEK_V3 = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
# Gemma 3's per-layer-type rope_parameters (v5 schema): local layers at base 1e4, global ones linear x8 at 1e6.
GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
}
_DS = {"qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "max_position_embeddings": 163840}
_HF64 = {"h": 4, "d": 64}
_HF32 = {"h": 4, "d": 32}

ROWS: list[Row] = [
    # ---- ropelab's own: every style and layout, every scaling --------------------------------------------
    *[
        Row(
            f"ropelab_{st}_{lay.replace(' ', '')}",
            (lambda lay=lay, st=st: sp.ropelab_rope(lay, st)),
            lay,
            None,
            f"ropelab.apply_rope, style {st}, layout '{lay}'",
            expect={"style": st},
        )
        for st in ("half", "interleaved")
        for lay in ("b s h d", "b h s d", "s h d", "t h d", "h s d")
    ],
    *[
        Row(
            f"ropelab_{nm}",
            (lambda sc=sc: sp.ropelab_rope("b s h d", rope_scaling=sc)),
            "b s h d",
            None,
            f"ropelab.apply_rope with {nm} scaling",
            reads=_reads(sc),
        )
        for nm, sc in (
            ("linear", sp.LINEAR),
            ("yarn", sp.YARN),
            ("llama3", sp.LLAMA3),
            ("longrope", sp.longrope_params()),
            ("proportional", sp.PROPORTIONAL),
            ("yarn_custom", YARN_CUSTOM),
            ("llama3_custom", LLAMA3_CUSTOM),
        )
    ],
    Row(
        "ropelab_dynamic",
        lambda: sp.ropelab_rope("b s h d", rope_scaling=sp.DYNAMIC, max_position_embeddings=2048),
        "b s h d",
        None,
        "ropelab.apply_rope with dynamic NTK (L0 = 2048)",
    ),
    Row(
        "ropelab_partial",
        lambda: sp.ropelab_rope("b s h d", rotary_dim=16),
        "b s h d",
        None,
        "ropelab.apply_rope rotating 16 of 32 dims",
        expect={"rotary_dim": 16},
    ),
    Row(
        "ropelab_base_500k",
        lambda: sp.ropelab_rope("b s h d", base=500000.0),
        "b s h d",
        None,
        "ropelab.apply_rope, base 500000 (Llama 3)",
        expect={"base": 500000.0},
    ),
    Row(
        "ropelab_base_12345",
        lambda: sp.ropelab_rope("b s h d", base=12345.678),
        "b s h d",
        None,
        "ropelab.apply_rope, base 12345.678 (no round number)",
        expect={"base": 12345.678},
        reads={"base": 12345.678, "rope_type": None},
    ),
    # ---- Hugging Face transformers 5.x, configs built in code -----------------------------------------
    Row(
        "hf_llama",
        _hf("llama", 32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "b h s d",
        None,
        "transformers Llama",
        expect={"style": "half", "base": 10000.0},
        sizes=_HF32,
        needs=_TF,
    ),
    Row(
        "hf_llama_llama3",
        _hf("llama", 32, **_rp(**sp.LLAMA3, rope_theta=500000.0), max_position_embeddings=65536),
        "b h s d",
        None,
        "transformers Llama, llama3 scaling (Llama 3.1)",
        sizes=_HF32,
        needs=_TF,
        reads={"base": 500000.0, "rope_type": "llama3", "factor": 8.0},
    ),
    Row(
        "hf_llama_yarn",
        _hf("llama", 32, **_rp(**sp.YARN, rope_theta=10000.0), max_position_embeddings=8192),
        "b h s d",
        None,
        "transformers Llama, yarn scaling",
        sizes=_HF32,
        needs=_TF,
        reads={"base": 10000.0, "rope_type": "yarn", "factor": 4.0},
    ),
    Row(
        "hf_llama_yarn_custom",
        _hf("llama", 64, **_rp(**YARN_CUSTOM, rope_theta=10000.0), max_position_embeddings=24000),
        "b h s d",
        None,
        "transformers Llama, yarn with beta_fast 16, beta_slow 2, truncate False, L0 3000",
        sizes=_HF64,
        needs=_TF,
        reads={"base": 10000.0, "rope_type": "yarn", "factor": 8.0},
    ),
    Row(
        "hf_llama_llama3_custom",
        _hf("llama", 64, **_rp(**LLAMA3_CUSTOM, rope_theta=500000.0), max_position_embeddings=96000),
        "b h s d",
        None,
        "transformers Llama, llama3 with low/high freq factors 2/8, L0 6000",
        sizes=_HF64,
        needs=_TF,
        reads={"base": 500000.0, "rope_type": "llama3", "factor": 16.0},
    ),
    Row(
        "hf_mistral",
        _hf("mistral", 32, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        "b h s d",
        None,
        "transformers Mistral, base 1e6",
        expect={"base": 1e6},
        sizes=_HF32,
        needs=_TF,
        reads={"base": 1e6, "rope_type": None},
    ),
    Row(
        "hf_qwen2_yarn",
        _hf(
            "qwen2",
            64,
            **_rp(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768),
            max_position_embeddings=131072,
        ),
        "b h s d",
        None,
        "transformers Qwen2 (Qwen2.5 long context: yarn x4, base 1e6)",
        sizes=_HF64,
        needs=_TF,
        reads={"base": 1e6, "rope_type": "yarn", "factor": 4.0},
    ),
    Row(
        "hf_gpt_neox",
        _hf("gpt_neox", 64, **_rp(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)),
        "b h s d",
        None,
        "transformers GPT-NeoX, rotary on 16 of 64 dims (rotary_pct 0.25)",
        expect={"rotary_dim": 16, "style": "half"},
        sizes=_HF64,
        needs=_TF,
        reads={"base": 10000.0, "rope_type": None},
    ),
    Row(
        "hf_gemma3_local",
        _hf(
            "gemma3",
            32,
            layer_type="sliding_attention",
            num_hidden_layers=6,
            rope_parameters=GEMMA3_ROPE,
        ),
        "b h s d",
        None,
        "transformers Gemma 3, a sliding-window layer (base 1e4)",
        expect={"base": 10000.0},
        sizes=_HF32,
        needs=_TF,
        reads={"base": 10000.0, "rope_type": None},
    ),
    Row(
        "hf_gemma3_global",
        _hf(
            "gemma3",
            32,
            layer_type="full_attention",
            num_hidden_layers=6,
            rope_parameters=GEMMA3_ROPE,
        ),
        "b h s d",
        None,
        "transformers Gemma 3, a global layer (linear x8, base 1e6)",
        expect={"base": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        sizes=_HF32,
        needs=_TF,
        reads={"base": 1e6, "rope_type": "linear", "factor": 8.0},
    ),
    Row(
        "hf_phi3_longrope",
        _hf(
            "phi3",
            32,
            **_rp(**{**sp.longrope_params(32, seed=2), "rope_theta": 10000.0}),
            max_position_embeddings=8192,
            original_max_position_embeddings=2048,
        ),
        "b h s d",
        None,
        "transformers Phi-3, longrope (per-frequency factors)",
        sizes=_HF32,
        needs=_TF,
        reads={"base": None, "rope_type": None, "scaling": "unrecognised"},
    ),
    Row(
        "hf_gpt_oss",
        _hf("gpt_oss", 64, rope_parameters=GPT_OSS, max_position_embeddings=131072),
        "b h s d",
        None,
        "transformers gpt-oss: yarn x32 at base 1.5e5, truncate False",
        sizes=_HF64,
        needs=_TF,
        reads={"base": 150000.0, "rope_type": "yarn", "factor": 32.0},
    ),
    Row(
        "hf_deepseek_v3",
        _hf("deepseek_v3", 48, rope_parameters=DEEPSEEK_V3, rope_interleave=True, **_DS),
        "b h s d",
        None,
        "transformers DeepSeek-V3: RoPE on the trailing 16 of 48 dims, rope_interleave",
        sizes={"h": 4, "d": 48},
        needs=_TF,
        reads={
            "base": 10000.0,
            "rope_type": "yarn",
            "factor": 40.0,
            "style": "interleaved",
            "rotary_dim": 16,
            "rotary_start": 32,
        },
    ),
    Row(
        "hf_deepseek_v3_half",
        _hf("deepseek_v3", 48, rope_parameters=DEEPSEEK_V3, rope_interleave=False, **_DS),
        "b h s d",
        None,
        "transformers DeepSeek-V3: RoPE on the trailing 16 of 48 dims, half style",
        sizes={"h": 4, "d": 48},
        needs=_TF,
        reads={
            "base": 10000.0,
            "rope_type": "yarn",
            "factor": 40.0,
            "style": "half",
            "rotary_dim": 16,
            "rotary_start": 32,
        },
    ),
    Row(
        "hf_gptj",
        lambda: tp.hf_gptj(),
        "b s h d",
        None,
        "transformers GPT-J (interleaved, partial)",
        expect={"style": "interleaved", "rotary_dim": 16},
        needs=_TF,
    ),
    Row("hf_esm", lambda: tp.hf_esm(), "b h s d", None, "transformers 5 ESM", needs=_TF),
    Row(
        "meta_llama_complex",
        lambda: tp.meta_llama_complex(),
        "b s h d",
        None,
        "Meta's Llama reference (complex multiply, float32)",
        expect={"style": "interleaved"},
    ),
    # ---- rotary-embedding-torch, cache on (its default) -------------------------------------------------
    Row(
        "rotary_embedding_torch",
        lambda: tp.rotary_embedding_torch(),
        "b h s d",
        None,
        "rotary-embedding-torch, cache on",
        expect={"style": "interleaved"},
        needs=_RET,
    ),
    Row(
        "rotary_embedding_torch_partial",
        lambda: tp.rotary_embedding_torch(0.5),
        "b h s d",
        None,
        "rotary-embedding-torch on 16 of 32 dims, cache on",
        expect={"rotary_dim": 16},
        needs=_RET,
    ),
    Row("esm_old", lambda: tp.esm_old(), "b h s d", None, "transformers 4.x ESM RotaryEmbedding on [b, h, s, d]"),
    Row(
        "esm_old_unpadded_fixed",
        lambda: tp.esm_old_unpadded_fixed(),
        "t h d",
        None,
        "old ESM module on each unpadded sequence, transposed to [1, h, s, d]",
    ),
    # ---- broken ---------------------------------------------------------------------------------------
    Row(
        "esm_old_unpadded",
        lambda: tp.esm_old_unpadded(),
        "t h d",
        "seq_axis",
        "the seed's call: old ESM module on [tokens, heads, head_dim] (rotates along heads)",
    ),
    Row(
        "esm_old_on_bshd",
        lambda: tp.esm_old(),
        "b s h d",
        "seq_axis",
        "a [b, h, s, d] module (seq_dimension=-2) fed [b, s, h, d]: the xformers bug",
    ),
    Row(
        "varlen_no_restart",
        sp.varlen_no_restart,
        "t h d",
        "varlen",
        "packed positions continue across cu_seqlens boundaries",
    ),
    Row(
        "decode_without_offset",
        sp.decode_without_offset,
        "b s h d",
        "restart",
        "decode steps rotated at position 0 (offset forgotten)",
    ),
    Row("positions_bf16", sp.positions_bf16, "b s h d", "precision", "positions held in bfloat16"),
    Row("inv_freq_bf16", sp.inv_freq_bf16, "b s h d", "inv_freq_precision", "inv_freq held in bfloat16"),
    *[
        Row(
            f"rounded_ladder_{route}_{tag}_d{d}",
            (lambda route=route, dt=dt, b=b: sp.rounded_ladder(route, dt, b)),
            "b s h d",
            "inv_freq_precision",
            f"inv_freq rounded to {tag}, base {b:g}: {sp.ROUNDED_ROUTES[route]}",
            sizes={"d": d},
        )
        for route, tag, dt, d, b in [
            ("native", "bf16", torch.bfloat16, 64, 1e4),
            ("native", "fp16", torch.float16, 128, 1e4),
            ("cast", "fp16", torch.float16, 64, 5e5),
            ("denominator", "bf16", torch.bfloat16, 128, 1e6),
            ("exponent", "bf16", torch.bfloat16, 96, 5e5),
        ]
    ],
    Row("tables_bf16", sp.tables_bf16, "b s h d", "precision", "cos/sin stored in bfloat16, float32 activations"),
    Row(
        "esm_old_bf16",
        lambda: tp.esm_old(torch.bfloat16),
        "b h s d",
        "inv_freq_precision",
        "old ESM module after .to(torch.bfloat16): inv_freq and positions in bf16",
    ),
    Row(
        "rotary_embedding_torch_bf16",
        lambda: tp.rotary_embedding_torch(),
        "b h s d",
        "precision",
        "rotary-embedding-torch on bf16 input, cache on: positions in x.dtype",
        dtype=torch.bfloat16,
        needs=_RET,
    ),
    Row(
        "rotary_embedding_torch_xpos",
        lambda: tp.rotary_embedding_torch(xpos=True),
        "b h s d",
        "norm_scale",
        "rotary-embedding-torch xPos: q scaled by a factor growing with position",
        needs=_RET,
    ),
    Row(
        "mixed_tables",
        sp.mixed_tables,
        "b s h d",
        "tables",
        "rotate_half with interleaved (repeat_interleave) cos/sin tables",
    ),
    Row(
        "hidden_size_base",
        sp.hidden_size_base,
        "b s h d",
        "base",
        "inv_freq exponent over the hidden size, not the head dim",
        expect={"base": 10000.0},
    ),
    Row("reversed_direction", sp.reversed_direction, "b s h d", "direction", "sin with the wrong sign"),
    Row(
        "attention_factor_twice",
        sp.attention_factor_twice,
        "b s h d",
        "attention_factor",
        "yarn attention factor applied twice",
    ),
    Row("rope_applied_twice", sp.rope_applied_twice, "b s h d", "twice", "RoPE applied twice: angles doubled"),
    Row("positions_from_one", sp.positions_from_one, "b s h d", "positions", "positions start at 1"),
    Row(
        "batch_flattened_positions",
        sp.batch_flattened_positions,
        "b s h d",
        "batch",
        "positions counted over the flattened batch",
    ),
    Row(
        "heads_flattened_positions",
        sp.heads_flattened_positions,
        "b s h d",
        "seq_axis",
        "positions s * H + h (heads folded into the sequence)",
    ),
    Row(
        "per_head_frequencies",
        sp.per_head_frequencies,
        "b s h d",
        "heads",
        "heads turn at different rates (per-head tables)",
    ),
    Row("permuted_pairs", sp.permuted_pairs, "b s h d", "style", "rotating pairs in a scrambled dim order"),
    Row("bf16_compute", sp.bf16_compute, "b s h d", "dtype", "computes and returns bf16 for any input"),
    Row(
        "mrope_behind_1d",
        sp.mrope_behind_1d,
        "b s h d",
        "not_single_axis",
        "M-RoPE (8, 4, 4) of a grid 8 wide behind 1D input: h, w drive only low-frequency pairs",
    ),
    *[
        Row(
            f"mrope_behind_1d_width{w}",
            (lambda w=w: sp.mrope_behind_1d(w)),
            "b s h d",
            "not_single_axis",
            f"M-RoPE (8, 4, 4) of a grid {w} wide behind 1D input: narrower than the 6-token structure probe",
        )
        for w in (2, 4)
    ],
    Row(
        "qwen2vl_image_behind_1d",
        sp.qwen2vl_image_behind_1d,
        "b s h d",
        "not_single_axis",
        "Qwen2-VL's M-RoPE (16, 24, 24), base 1e6, t = 0 and h, w of a grid 8 wide behind 1D input",
        sizes={"d": 128},
    ),
    Row(
        "qwen2vl_text_then_image",
        sp.qwen2vl_text_then_image,
        "b s h d",
        "not_single_axis",
        "Qwen2-VL positions of 4 text tokens, a 4 x 8 image, then text (get_rope_index), behind 1D input",
        sizes={"d": 128},
    ),
    Row(
        "interleaved_for_half",
        lambda: sp.ropelab_rope("b s h d", "interleaved"),
        "b s h d",
        "style",
        "interleaved RoPE where half (Llama) is expected",
        expect={"style": "half"},
    ),
    Row(
        "full_for_partial",
        lambda: sp.ropelab_rope("b s h d"),
        "b s h d",
        "rotary_dim",
        "all 32 dims rotated where 16 should be",
        expect={"rotary_dim": 16},
    ),
    Row(
        "linear_for_yarn",
        lambda: sp.ropelab_rope("b s h d", rope_scaling=sp.LINEAR),
        "b s h d",
        "scaling",
        "linear scaling where yarn is expected",
        expect={"rope_scaling": sp.YARN},
    ),
]

ZOO: dict[str, Row] = {r.name: r for r in ROWS}
if len(ZOO) != len(ROWS):
    raise RuntimeError("two zoo rows share a name")


def correct() -> list[Row]:
    """The rows ``diagnose`` must pass."""
    return [r for r in ROWS if r.correct]


def broken() -> list[Row]:
    """The rows ``diagnose`` must name by ``finding``."""
    return [r for r in ROWS if not r.correct]
