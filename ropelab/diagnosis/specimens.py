r"""The zoo's own specimens: ropelab's ``apply_rope`` as a black box, and one broken implementation per
classic bug (each a factory returning ``fn(x)``, ``fn(x, cu_seqlens)`` for a ``t`` layout, laid out
``b s h d`` unless said). The bugs: a rotation along the heads; varlen positions that do not restart;
a decode step without its offset; 16-bit positions, ``inv_freq`` or cos/sin tables; ``inv_freq``
rounded to bf16/fp16 by four routes (``rounded_ladder``: natively, by a cast, in its denominator or its
exponent); tables in the other style's layout; a wrong base; a reversed sign; RoPE or its attention factor
applied twice;
M-RoPE behind 1D input (a grid of any width; Qwen2-VL's sizes with t constant; a text-then-image
sequence as Qwen2-VL numbers it); ...
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core import cos_sin, rotate
from ..multiaxis import MultiAxis
from ..rope import apply_rope
from ..scaling import frequencies

__all__ = [
    "YARN",
    "LLAMA3",
    "LINEAR",
    "DYNAMIC",
    "PROPORTIONAL",
    "longrope_params",
    "ropelab_rope",
    "varlen_no_restart",
    "decode_without_offset",
    "positions_bf16",
    "inv_freq_bf16",
    "tables_bf16",
    "ROUNDED_ROUTES",
    "rounded_ladder",
    "mixed_tables",
    "hidden_size_base",
    "reversed_direction",
    "attention_factor_twice",
    "rope_applied_twice",
    "positions_from_one",
    "batch_flattened_positions",
    "heads_flattened_positions",
    "per_head_frequencies",
    "permuted_pairs",
    "bf16_compute",
    "mrope_behind_1d",
    "QWEN2_VL",
    "qwen2vl_image_behind_1d",
    "qwen2vl_text_then_image",
    "qwen2vl_positions",
]

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LINEAR = {"rope_type": "linear", "factor": 2.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
PROPORTIONAL = {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 1.0}


def longrope_params(d: int = 32, seed: int = 1) -> dict:
    """A longrope dict with random per-frequency factors (short in [1, 2), long in [2, 6))."""
    g = torch.Generator().manual_seed(seed)
    short = (1 + torch.rand(d // 2, generator=g)).tolist()
    long = (2 + 4 * torch.rand(d // 2, generator=g)).tolist()
    return {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
    }


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    return fn


def ropelab_rope(layout: str, style: str = "half", **kw) -> Callable:
    """``ropelab.apply_rope`` for ``layout`` (varlen: restarting at ``cu_seqlens``)."""
    if "t" in layout.split():
        return _named(lambda x, cu: apply_rope(x, layout=layout, style=style, cu_seqlens=cu, **kw), f"ropelab_{style}")
    return _named(lambda x: apply_rope(x, layout=layout, style=style, **kw), f"ropelab_{style}")


def _tables(S: int, inv_freq: torch.Tensor, positions: torch.Tensor | None = None, dtype=torch.float32):
    pos = torch.arange(S) if positions is None else positions
    cos, sin = cos_sin(pos, inv_freq, dtype=dtype)
    return cos[None, :, None, :], sin[None, :, None, :]  # [1, s, 1, r/2] for b s h d


def varlen_no_restart() -> Callable:
    """Packed ``t h d`` with positions 0 .. T-1 over the whole packing (cu_seqlens ignored)."""
    return _named(lambda x, cu: apply_rope(x, torch.arange(x.shape[0]), layout="t h d"), "varlen_no_restart")


def positions_bf16() -> Callable:
    """Positions held in bfloat16 (exact only up to 256)."""
    return _named(
        lambda x: apply_rope(x, torch.arange(x.shape[1]).to(torch.bfloat16), layout="b s h d"), "positions_bf16"
    )


def inv_freq_bf16() -> Callable:
    """``inv_freq`` held in bfloat16 (what ``model.to(torch.bfloat16)`` does to a persistent buffer)."""

    def fn(x):
        inv, _ = frequencies(x.shape[-1], 10000.0)
        cos, sin = _tables(x.shape[1], inv.to(torch.bfloat16), dtype=torch.promote_types(x.dtype, torch.float32))
        return rotate(x, cos, sin, style="half")

    return _named(fn, "inv_freq_bf16")


# The routes by which inv_freq ends up a 16-bit rounding of its ladder (r the rotary dim, b the base):
ROUNDED_ROUTES = {
    "native": "1 / b ** (arange(0, r, 2, dtype=dt) / r): base, power and reciprocal each rounded in dt",
    "cast": "computed in float32, then .to(dt) (a persistent buffer after model.to(dt))",
    "denominator": "b ** (arange(0, r, 2) / r) formed in dt, inverted in float32",
    "exponent": "arange(0, r, 2, dtype=dt) / r rounded in dt (exact only for a power-of-two r), the rest in float32",
}
DTYPE_TAGS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def rounded_ladder(route: str, dtype: torch.dtype = torch.bfloat16, base: float = 10000.0) -> Callable:
    """A half-style RoPE whose inv_freq is rounded to ``dtype`` by ``route`` (a key of ``ROUNDED_ROUTES``),
    then used in float32 as Hugging Face does (angles m * inv_freq and cos/sin in float32)."""
    if route not in ROUNDED_ROUTES:
        raise ValueError(f"route must be one of {sorted(ROUNDED_ROUTES)}, got {route!r}.")
    if dtype not in DTYPE_TAGS:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}.")

    def fn(x):
        r = x.shape[-1]
        i = torch.arange(0, r, 2)
        if route == "native":
            inv = 1.0 / (base ** (i.to(dtype) / r))
        elif route == "cast":
            inv = (1.0 / base ** (i.float() / r)).to(dtype)
        elif route == "denominator":
            inv = 1.0 / (base ** (i.float() / r)).to(dtype).float()
        else:
            inv = 1.0 / base ** (i.to(dtype) / r).float()
        fr = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv.float()
        cdt = torch.promote_types(x.dtype, torch.float32)
        cos, sin = fr.cos().to(cdt)[None, :, None, :], fr.sin().to(cdt)[None, :, None, :]
        return rotate(x, cos, sin, style="half")

    return _named(fn, f"rounded_ladder_{route}_{DTYPE_TAGS[dtype]}")


def mixed_tables() -> Callable:
    """rotate_half (pairs (i, i+d/2)) with cos/sin built by repeat_interleave (the interleaved layout)."""

    def fn(x):
        inv, _ = frequencies(x.shape[-1], 10000.0, dtype=torch.float32)
        freqs = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv
        emb = freqs.repeat_interleave(2, -1)[None, :, None, :]
        x1, x2 = x.chunk(2, -1)
        return x * emb.cos() + torch.cat((-x2, x1), -1) * emb.sin()

    return _named(fn, "mixed_tables")


def hidden_size_base() -> Callable:
    """inv_freq = base^(-2i/D) over the hidden size D = heads * head_dim instead of the head dim."""

    def fn(x):
        H, D = x.shape[2], x.shape[3]
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / (H * D)))
        cos, sin = _tables(x.shape[1], inv, dtype=torch.promote_types(x.dtype, torch.float32))
        return rotate(x, cos, sin, style="half")

    return _named(fn, "hidden_size_base")


def reversed_direction() -> Callable:
    """sin with the wrong sign: a rotation by -m*theta."""
    return _named(lambda x: apply_rope(x, -torch.arange(x.shape[1]), layout="b s h d"), "reversed_direction")


def attention_factor_twice() -> Callable:
    """yarn with its attention factor applied in cos/sin and again on the output."""

    def fn(x):
        _, af = frequencies(x.shape[-1], 10000.0, rope_scaling=YARN)
        return apply_rope(x, layout="b s h d", rope_scaling=YARN) * af

    return _named(fn, "attention_factor_twice")


def positions_from_one() -> Callable:
    """Positions 1, 2, 3, ... (ESM's learned-embedding position ids, padding_idx + 1, reused for RoPE)."""
    return _named(lambda x: apply_rope(x, layout="b s h d", offset=1), "positions_from_one")


def batch_flattened_positions() -> Callable:
    """Positions counted over the flattened batch: b * S + s."""

    def fn(x):
        B, S = x.shape[:2]
        return apply_rope(x, torch.arange(B * S).reshape(B, S), layout="b s h d")

    return _named(fn, "batch_flattened_positions")


def heads_flattened_positions() -> Callable:
    """Positions s * H + h: a [b, s * h, d] view of the heads taken as the sequence."""

    def fn(x):
        B, S, H, D = x.shape
        return apply_rope(x.reshape(B, S * H, D), layout="b s d").reshape(B, S, H, D)

    return _named(fn, "heads_flattened_positions")


def per_head_frequencies() -> Callable:
    """Tables built per head with base 10000 * (h + 1): heads turn at different rates."""

    def fn(x):
        S, H, D = x.shape[1], x.shape[2], x.shape[3]
        cdt = torch.promote_types(x.dtype, torch.float32)
        tabs = [cos_sin(torch.arange(S), frequencies(D, 10000.0 * (h + 1))[0], dtype=cdt) for h in range(H)]
        cos = torch.stack([c for c, _ in tabs], 1)[None]  # [1, s, h, d/2]
        sin = torch.stack([s for _, s in tabs], 1)[None]
        return rotate(x, cos, sin, style="half")

    return _named(fn, "per_head_frequencies")


def permuted_pairs() -> Callable:
    """A half-style rotation applied to head dims in a scrambled order: pairs neither half nor interleaved."""
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(3))
    inv = torch.argsort(perm)

    def fn(x):
        if x.shape[-1] != 32:
            raise ValueError("permuted_pairs is built for head_dim 32")
        return apply_rope(x[..., perm], layout="b s h d")[..., inv]

    return _named(fn, "permuted_pairs")


def bf16_compute() -> Callable:
    """Computes in bfloat16 whatever the input dtype, returning bf16."""
    return _named(lambda x: apply_rope(x.to(torch.bfloat16), layout="b s h d"), "bf16_compute")




def decode_without_offset(prompt: int = 3) -> Callable:
    """A decode loop that forgets the cache length: the first ``prompt`` tokens are rotated at positions
    0 .. prompt-1, then each new token alone at position 0 (no ``offset``/``position_ids``)."""

    def fn(x):
        parts = [apply_rope(x[:, :prompt], layout="b s h d")]
        parts += [apply_rope(x[:, t : t + 1], layout="b s h d") for t in range(prompt, x.shape[1])]
        return torch.cat(parts, dim=1)

    return _named(fn, "decode_without_offset")


def rope_applied_twice() -> Callable:
    """RoPE applied twice (e.g. once in the attention layer and once in a fused kernel): angles 2 m omega."""
    return _named(lambda x: apply_rope(apply_rope(x, layout="b s h d"), layout="b s h d"), "rope_applied_twice")


def tables_bf16() -> Callable:
    """cos/sin formed in float32 but stored in bfloat16 (a table cache in the model's dtype), multiplied
    with float32 activations: the output is float32, the rotation only 16-bit accurate."""

    def fn(x):
        inv, _ = frequencies(x.shape[-1], 10000.0)
        c, s = cos_sin(torch.arange(x.shape[1]), inv, dtype=torch.bfloat16)
        c, s = c[None, :, None, :], s[None, :, None, :]
        x1, x2 = x.chunk(2, -1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)

    return _named(fn, "tables_bf16")


def mrope_behind_1d(width: int = 8) -> Callable:
    """An M-RoPE (Qwen2-VL-style contiguous sections (8, 4, 4), head dim 32) behind 1D input: the image
    tokens' positions derived from the token index, t = 0, h = index // width, w = index % width. Its h and w
    axes drive only the 8 lowest-frequency pairs, so over 64 positions the scores are nearly Toeplitz
    (relative deviation 0.003, as small as bf16 tables give); the phase check to 4096 shows it. A width
    below the structure probe's 6 tokens (2, 4) turns h and w pairs inside it instead."""
    spec = MultiAxis.mrope((8, 4, 4))

    def fn(x):
        if x.shape[-1] != 32:
            raise ValueError("mrope_behind_1d is built for head_dim 32 (sections (8, 4, 4))")
        i = torch.arange(x.shape[1])
        pos = torch.stack([torch.zeros_like(i), i // width, i % width])
        return apply_rope(x, pos, layout="b s h d", sections=spec)

    return _named(fn, "mrope_behind_1d")


# Qwen2-VL's rotary sizes: mrope_section [16, 24, 24] (the default of transformers' Qwen2VLRotaryEmbedding,
# models/qwen2_vl/modeling_qwen2_vl.py), rope_theta 1e6 and head dim 8192 / 64 = 128 (Qwen2VLTextConfig's
# default_theta, hidden_size and num_attention_heads, models/qwen2_vl/configuration_qwen2_vl.py).
QWEN2_VL = {"sections": (16, 24, 24), "base": 1e6, "head_dim": 128}


def _qwen2vl(x: torch.Tensor, pos: torch.Tensor, name: str) -> torch.Tensor:
    if x.shape[-1] != QWEN2_VL["head_dim"]:
        raise ValueError(f"{name} is built for head_dim 128 (Qwen2-VL); pass sizes={{'d': 128}}")
    return apply_rope(x, pos, layout="b s h d", sections=MultiAxis.mrope(QWEN2_VL["sections"]), base=QWEN2_VL["base"])


def qwen2vl_image_behind_1d(width: int = 8) -> Callable:
    """Qwen2-VL's M-RoPE (sections (16, 24, 24), head dim 128, base 1e6) on image tokens behind 1D input:
    t = 0, h = index // width, w = index % width. Its w pairs (the 24 lowest frequencies, <= 1.8e-4 rad
    per position) turn by less than the structure probe's angle tolerance within 6 tokens, and its h pairs
    not at all before index ``width``."""

    def fn(x):
        i = torch.arange(x.shape[1])
        return _qwen2vl(x, torch.stack([torch.zeros_like(i), i // width, i % width]), "qwen2vl_image_behind_1d")

    return _named(fn, "qwen2vl_image_behind_1d")


def qwen2vl_text_then_image(text: int = 4, rows: int = 4, width: int = 8) -> Callable:
    """A Qwen2-VL sequence behind 1D input, numbered as transformers' ``Qwen2VLModel.get_rope_index`` does:
    ``text`` text tokens at t = h = w = index; one image of rows x width tokens at t = text, h = text + row,
    w = text + column (``get_vision_position_ids`` with ``start_position`` = text); then text again from
    text + max(rows, width) on every axis. Sections (16, 24, 24), head dim 128, base 1e6."""

    def fn(x):
        return _qwen2vl(x, qwen2vl_positions(x.shape[1], text, rows, width), "qwen2vl_text_then_image")

    return _named(fn, "qwen2vl_text_then_image")


def qwen2vl_positions(length: int, text: int, rows: int, width: int) -> torch.Tensor:
    """The [3, length] (t, h, w) positions of :func:`qwen2vl_text_then_image`'s first ``length`` tokens."""
    n_img = rows * width
    img = torch.stack([torch.zeros(n_img, dtype=torch.long), torch.arange(n_img) // width, torch.arange(n_img) % width])
    after = text + max(rows, width) + torch.arange(max(0, length - text - n_img))
    return torch.cat([torch.arange(text).expand(3, -1), img + text, after.expand(3, -1)], 1)[:, :length]
