r"""A zoo of RoPE implementations, correct and broken, for ``ropelab.diagnose``, its tests and notebook 02.

Every member is a black box ``fn(x)`` (``fn(x, cu_seqlens)`` for a ``t`` layout) returning x rotated, with
positions 0, 1, 2, ... along the sequence axis of its ``layout``. The correct ones are ropelab's own
(each style, layout and scaling), Hugging Face's Llama, GPT-J and ESM rotary code called through
``transformers`` (imported lazily: it is a dev extra), Meta's Llama reference (complex form) and
``rotary-embedding-torch``. The broken ones
are the bugs the seeds describe (a rotation along the heads; varlen positions that do not restart) and
the other classics (16-bit positions or ``inv_freq``, cos/sin tables in the other style's layout, a wrong
base, a reversed sign, an attention factor applied twice, ...). ``ZOO`` maps a name to a :class:`Member`
that records what ``diagnose`` must find.

``OldEsmRotaryEmbedding`` re-implements the rotary module of ESM as Hugging Face shipped it in
transformers 4.x (``transformers.models.esm.modeling_esm.RotaryEmbedding``, e.g. commit 0220b9db of
``src/transformers/models/esm/modeling_esm.py``), which the FAESM-vs-ESM2 seed called. transformers 5
replaced it by ``EsmRotaryEmbedding(config)`` (``forward(x, position_ids) -> (cos, sin)``), so the old
class no longer exists there; it is copied here line for line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .core import apply_rope, cos_sin, rotate
from .scaling import frequencies

__all__ = [
    "Member",
    "ZOO",
    "correct",
    "broken",
    "OldEsmRotaryEmbedding",
    "ropelab_rope",
    "hf_llama",
    "hf_gptj",
    "hf_esm",
    "meta_llama_complex",
    "rotary_embedding_torch",
    "esm_old",
    "esm_old_unpadded",
    "esm_old_unpadded_fixed",
    "varlen_no_restart",
    "positions_bf16",
    "inv_freq_bf16",
    "mixed_tables",
    "hidden_size_base",
    "reversed_direction",
    "attention_factor_twice",
    "positions_from_one",
    "batch_flattened_positions",
    "heads_flattened_positions",
    "per_head_frequencies",
    "permuted_pairs",
    "bf16_compute",
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


def _longrope(d: int = 32) -> dict:
    g = torch.Generator().manual_seed(1)
    short = (1 + torch.rand(d // 2, generator=g)).tolist()
    long = (2 + 4 * torch.rand(d // 2, generator=g)).tolist()
    return {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
    }


@dataclass(frozen=True)
class Member:
    """One implementation: ``fn`` with its ``layout``; ``correct``, or the ``finding`` (a Diagnosis code)
    that must name it; ``expect``/``sizes``/``dtype`` to pass to ``diagnose``."""

    name: str
    fn: Callable
    layout: str
    correct: bool
    finding: str | None = None
    description: str = ""
    sizes: dict | None = None
    expect: dict | None = None
    dtype: torch.dtype = torch.float32
    extra: dict = field(default_factory=dict)


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    return fn


# --------------------------------------------------------------------------------------------------
# ropelab's own
# --------------------------------------------------------------------------------------------------


def ropelab_rope(layout: str, style: str = "half", **kw) -> Callable:
    """``ropelab.apply_rope`` for ``layout`` (varlen: restarting at ``cu_seqlens``)."""
    if "t" in layout.split():
        return _named(lambda x, cu: apply_rope(x, layout=layout, style=style, cu_seqlens=cu, **kw), f"ropelab_{style}")
    return _named(lambda x: apply_rope(x, layout=layout, style=style, **kw), f"ropelab_{style}")


# --------------------------------------------------------------------------------------------------
# Hugging Face (transformers is a dev extra: imported when a member is called)
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _llama_rotary(heads: int, head_dim: int, base: float, scaling: tuple | None):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", "rope_theta": base}
    if scaling:
        params.update(dict(scaling))
    cfg = LlamaConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        head_dim=head_dim,
        rope_parameters=params,
        max_position_embeddings=params.get("original_max_position_embeddings", 2048) * int(params.get("factor", 1)),
    )
    return LlamaRotaryEmbedding(cfg)


def hf_llama(base: float = 10000.0, rope_scaling: dict | None = None) -> Callable:
    """Hugging Face Llama: ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb``, layout ``b h s d``."""
    key = tuple(sorted(rope_scaling.items())) if rope_scaling else None

    def fn(x):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        B, H, S, D = x.shape
        rot = _llama_rotary(H, D, base, key)
        cos, sin = rot(x, torch.arange(S)[None].expand(B, S))
        return apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)[0]

    return _named(fn, "hf_llama" + (f"_{rope_scaling['rope_type']}" if rope_scaling else ""))


@functools.lru_cache(maxsize=32)
def _gptj_rotary(rotary_dim: int, n_positions: int):
    from transformers import GPTJConfig
    from transformers.models.gptj.modeling_gptj import GPTJRotaryEmbedding

    return GPTJRotaryEmbedding(GPTJConfig(n_embd=rotary_dim, n_head=1, rotary_dim=rotary_dim, n_positions=n_positions))


def hf_gptj(rotary_fraction: float = 0.5) -> Callable:
    """Hugging Face GPT-J (interleaved, partial rotary as GPT-J's 64 of 256), layout ``b s h d``; mirrors
    ``GPTJAttention.forward``."""

    def fn(x):
        from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

        B, S, H, D = x.shape
        r = int(D * rotary_fraction)
        rot = _gptj_rotary(r, max(2048, 1 << (S - 1).bit_length()))
        sin, cos = rot(x, torch.arange(S)[None].expand(B, S))
        return torch.cat([apply_rotary_pos_emb(x[..., :r], sin, cos), x[..., r:]], dim=-1)

    return _named(fn, "hf_gptj")


@functools.lru_cache(maxsize=8)
def _esm_rotary(heads: int, head_dim: int):
    from transformers import EsmConfig
    from transformers.models.esm.modeling_esm import EsmRotaryEmbedding

    cfg = EsmConfig(
        vocab_size=33, hidden_size=heads * head_dim, num_attention_heads=heads, position_embedding_type="rotary"
    )
    return EsmRotaryEmbedding(cfg)


def hf_esm() -> Callable:
    """Hugging Face ESM as of transformers 5 (``EsmRotaryEmbedding``), layout ``b h s d``."""

    def fn(x):
        from transformers.models.esm.modeling_esm import apply_rotary_pos_emb

        B, H, S, D = x.shape
        cos, sin = _esm_rotary(H, D)(x, torch.arange(S)[None].expand(B, S))
        return apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=1)[0]

    return _named(fn, "hf_esm")


def rotary_embedding_torch(rotary_fraction: float = 1.0) -> Callable:
    """lucidrains' ``rotary-embedding-torch`` (interleaved), ``rotate_queries_or_keys`` on ``b h s d``.

    Caching is off: its cache (float32, shared across calls) would otherwise hide how positions are held.
    """
    cache: dict[int, torch.nn.Module] = {}

    def fn(x):
        from rotary_embedding_torch import RotaryEmbedding

        r = int(x.shape[-1] * rotary_fraction)
        if r not in cache:
            cache[r] = RotaryEmbedding(dim=r, cache_if_possible=False)
        return cache[r].rotate_queries_or_keys(x)

    return _named(fn, "rotary_embedding_torch")


def meta_llama_complex(base: float = 10000.0) -> Callable:
    r"""Meta's Llama reference (``llama/model.py``: ``precompute_freqs_cis``, ``apply_rotary_emb``): pairs
    (2i, 2i+1) as complex numbers times :math:`e^{i m \omega}`, computed in float32, layout ``b s h d``."""

    def fn(x):
        B, S, H, D = x.shape
        freqs = 1.0 / (base ** (torch.arange(0, D, 2)[: (D // 2)].float() / D))
        t = torch.arange(S, device=freqs.device, dtype=torch.float32)
        freqs = torch.outer(t, freqs)
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        out = torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
        return out.type_as(x)

    return _named(fn, "meta_llama_complex")


# --------------------------------------------------------------------------------------------------
# ESM's rotary module of transformers 4.x, as the FAESM-vs-ESM2 seed used it
# --------------------------------------------------------------------------------------------------


def _old_esm_rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _old_esm_apply_rotary_pos_emb(x, cos, sin):
    cos = cos[:, :, : x.shape[-2], :]
    sin = sin[:, :, : x.shape[-2], :]

    return (x * cos) + (_old_esm_rotate_half(x) * sin)


class OldEsmRotaryEmbedding(torch.nn.Module):
    """transformers 4.x ``models/esm/modeling_esm.py: RotaryEmbedding``, copied (see the module docstring).

    It expects [batch, heads, seq, head_dim]: the tables are cached as [1, 1, seq, dim] from
    ``k.shape[-2]`` (``seq_dimension=-2``) and broadcast against q and k. ``inv_freq`` is a persistent
    buffer, so ``model.to(torch.bfloat16)`` casts it, and the positions (``type_as(inv_freq)``) with it.
    """

    def __init__(self, dim: int):
        super().__init__()
        # Generate and save the inverse frequency buffer (non trainable)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq)

        self._seq_len_cached = None
        self._cos_cached = None
        self._sin_cached = None

    def _update_cos_sin_tables(self, x, seq_dimension=2):
        seq_len = x.shape[seq_dimension]

        # Reset the tables if the sequence length has changed,
        # or if we're on a new device (possibly due to tracing for instance)
        if seq_len != self._seq_len_cached or self._cos_cached.device != x.device:
            self._seq_len_cached = seq_len
            t = torch.arange(x.shape[seq_dimension], device=x.device).type_as(self.inv_freq)
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1).to(x.device)

            self._cos_cached = emb.cos()[None, None, :, :]
            self._sin_cached = emb.sin()[None, None, :, :]

        return self._cos_cached, self._sin_cached

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._cos_cached, self._sin_cached = self._update_cos_sin_tables(k, seq_dimension=-2)

        return (
            _old_esm_apply_rotary_pos_emb(q, self._cos_cached, self._sin_cached).to(dtype=q.dtype),
            _old_esm_apply_rotary_pos_emb(k, self._cos_cached, self._sin_cached).to(dtype=k.dtype),
        )


def esm_old(buffer_dtype: torch.dtype = torch.float32) -> Callable:
    """The old ESM module on its own layout ``b h s d`` (q of ``module(q, k)``); ``buffer_dtype`` mimics
    ``model.to(dtype)``."""
    mods: dict[int, OldEsmRotaryEmbedding] = {}

    def fn(x):
        d = x.shape[-1]
        if d not in mods:
            mods[d] = OldEsmRotaryEmbedding(d).to(buffer_dtype)
        return mods[d](x, x)[0]

    return _named(fn, "esm_old" + ("" if buffer_dtype == torch.float32 else f"_{str(buffer_dtype)[6:]}"))


def esm_old_unpadded() -> Callable:
    """The seed's call: the old ESM module on each unpadded sequence ``[tokens, heads, head_dim]`` of a
    ``t h d`` packing, ``q_i, _ = esm_rot(q[c_i:c_{i+1}], k[c_i:c_{i+1}])``, results joined along tokens.

    With three dims, ``seq_dimension=-2`` is the heads axis, and the [1, 1, heads, dim] tables broadcast
    the output to [1, tokens, heads, head_dim].
    """
    mods: dict[int, OldEsmRotaryEmbedding] = {}

    def fn(x, cu_seqlens):
        d = x.shape[-1]
        if d not in mods:
            mods[d] = OldEsmRotaryEmbedding(d)
        cu = [int(c) for c in cu_seqlens]
        parts = [mods[d](x[s:e], x[s:e])[0] for s, e in zip(cu[:-1], cu[1:])]
        return torch.cat(parts, dim=-3)

    return _named(fn, "esm_old_unpadded")


def esm_old_unpadded_fixed() -> Callable:
    """The right way to call the old ESM module on unpadded sequences: each [tokens, heads, head_dim]
    slice transposed to the [1, heads, tokens, head_dim] it expects, and back."""
    mods: dict[int, OldEsmRotaryEmbedding] = {}

    def fn(x, cu_seqlens):
        d = x.shape[-1]
        if d not in mods:
            mods[d] = OldEsmRotaryEmbedding(d)
        cu = [int(c) for c in cu_seqlens]
        parts = []
        for s, e in zip(cu[:-1], cu[1:]):
            q = x[s:e].transpose(0, 1)[None]  # [1, heads, tokens, head_dim]
            parts.append(mods[d](q, q)[0][0].transpose(0, 1))
        return torch.cat(parts, dim=0)

    return _named(fn, "esm_old_unpadded_fixed")


# --------------------------------------------------------------------------------------------------
# Broken implementations, one bug each (layout b s h d unless said)
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------------------------------


def _build() -> dict[str, Member]:
    z: list[Member] = []
    for style in ("half", "interleaved"):
        for layout in ("b s h d", "b h s d", "s h d", "t h d", "h s d"):
            z.append(
                Member(
                    f"ropelab_{style}_{layout.replace(' ', '')}",
                    ropelab_rope(layout, style),
                    layout,
                    True,
                    description=f"ropelab.apply_rope, style {style}, layout '{layout}'",
                    expect={"pairing": style},
                )
            )
    for nm, sc in (
        ("linear", LINEAR),
        ("yarn", YARN),
        ("llama3", LLAMA3),
        ("longrope", _longrope()),
        ("proportional", PROPORTIONAL),
    ):
        z.append(
            Member(
                f"ropelab_{nm}",
                ropelab_rope("b s h d", rope_scaling=sc),
                "b s h d",
                True,
                description=f"ropelab.apply_rope with {nm} scaling",
                extra={"rope_scaling": sc},
            )
        )
    z.append(
        Member(
            "ropelab_dynamic",
            ropelab_rope("b s h d", rope_scaling=DYNAMIC, max_position_embeddings=2048),
            "b s h d",
            True,
            description="ropelab.apply_rope with dynamic NTK (L0 = 2048)",
            extra={"rope_scaling": DYNAMIC},
        )
    )
    z.append(
        Member(
            "ropelab_partial",
            ropelab_rope("b s h d", rotary_dim=16),
            "b s h d",
            True,
            description="ropelab.apply_rope rotating 16 of 32 dims",
            expect={"rotary_dim": 16},
        )
    )
    z.append(
        Member(
            "ropelab_base_500k",
            ropelab_rope("b s h d", base=500000.0),
            "b s h d",
            True,
            description="ropelab.apply_rope, base 500000 (Llama 3)",
            expect={"base": 500000.0},
        )
    )
    z.append(
        Member(
            "hf_llama",
            hf_llama(),
            "b h s d",
            True,
            description="transformers Llama rotary code",
            expect={"pairing": "half", "base": 10000.0},
        )
    )
    z.append(
        Member(
            "hf_llama_llama3",
            hf_llama(500000.0, LLAMA3),
            "b h s d",
            True,
            description="transformers Llama rotary code, llama3 scaling",
            extra={"rope_scaling": LLAMA3},
        )
    )
    z.append(
        Member(
            "hf_llama_yarn",
            hf_llama(10000.0, YARN),
            "b h s d",
            True,
            description="transformers Llama rotary code, yarn scaling",
            extra={"rope_scaling": YARN},
        )
    )
    z.append(
        Member(
            "hf_gptj",
            hf_gptj(),
            "b s h d",
            True,
            description="transformers GPT-J rotary code (partial)",
            expect={"pairing": "interleaved", "rotary_dim": 16},
        )
    )
    z.append(
        Member(
            "meta_llama_complex",
            meta_llama_complex(),
            "b s h d",
            True,
            description="Meta's Llama reference code (complex multiply, float32)",
            expect={"pairing": "interleaved"},
        )
    )
    z.append(Member("hf_esm", hf_esm(), "b h s d", True, description="transformers 5 ESM rotary code"))
    z.append(
        Member(
            "rotary_embedding_torch",
            rotary_embedding_torch(),
            "b h s d",
            True,
            description="rotary-embedding-torch (lucidrains)",
            expect={"pairing": "interleaved"},
        )
    )
    z.append(
        Member(
            "esm_old",
            esm_old(),
            "b h s d",
            True,
            description="transformers 4.x ESM RotaryEmbedding on [b, h, s, d], as ESM calls it",
        )
    )
    z.append(
        Member(
            "esm_old_unpadded_fixed",
            esm_old_unpadded_fixed(),
            "t h d",
            True,
            description="old ESM module on each unpadded sequence, transposed to [1, h, s, d]",
        )
    )
    # broken
    z.append(
        Member(
            "esm_old_unpadded",
            esm_old_unpadded(),
            "t h d",
            False,
            "seq_axis",
            description="the seed's call: old ESM module on [tokens, heads, head_dim] (rotates along heads)",
        )
    )
    z.append(
        Member(
            "esm_old_on_bshd",
            esm_old(),
            "b s h d",
            False,
            "seq_axis",
            description="a [b, h, s, d] module (seq_dimension=-2) fed [b, s, h, d]: the xformers bug",
        )
    )
    z.append(
        Member(
            "varlen_no_restart",
            varlen_no_restart(),
            "t h d",
            False,
            "varlen",
            description="packed positions continue across cu_seqlens boundaries",
        )
    )
    z.append(
        Member(
            "positions_bf16", positions_bf16(), "b s h d", False, "precision", description="positions held in bfloat16"
        )
    )
    z.append(
        Member(
            "inv_freq_bf16",
            inv_freq_bf16(),
            "b s h d",
            False,
            "inv_freq_precision",
            description="inv_freq held in bfloat16",
        )
    )
    z.append(
        Member(
            "esm_old_bf16",
            esm_old(torch.bfloat16),
            "b h s d",
            False,
            "inv_freq_precision",
            description="old ESM module after .to(torch.bfloat16): inv_freq and positions in bf16",
        )
    )
    z.append(
        Member(
            "rotary_embedding_torch_bf16",
            rotary_embedding_torch(),
            "b h s d",
            False,
            "precision",
            dtype=torch.bfloat16,
            description="rotary-embedding-torch on bf16 input: positions in x.dtype",
        )
    )
    z.append(
        Member(
            "mixed_tables",
            mixed_tables(),
            "b s h d",
            False,
            "tables",
            description="rotate_half with interleaved (repeat_interleave) cos/sin tables",
        )
    )
    z.append(
        Member(
            "hidden_size_base",
            hidden_size_base(),
            "b s h d",
            False,
            "base",
            expect={"base": 10000.0},
            description="inv_freq exponent over the hidden size, not the head dim",
        )
    )
    z.append(
        Member(
            "reversed_direction",
            reversed_direction(),
            "b s h d",
            False,
            "direction",
            description="sin with the wrong sign",
        )
    )
    z.append(
        Member(
            "attention_factor_twice",
            attention_factor_twice(),
            "b s h d",
            False,
            "attention_factor",
            description="yarn attention factor applied twice",
        )
    )
    z.append(
        Member(
            "positions_from_one",
            positions_from_one(),
            "b s h d",
            False,
            "positions",
            description="positions start at 1",
        )
    )
    z.append(
        Member(
            "batch_flattened_positions",
            batch_flattened_positions(),
            "b s h d",
            False,
            "batch",
            description="positions counted over the flattened batch",
        )
    )
    z.append(
        Member(
            "heads_flattened_positions",
            heads_flattened_positions(),
            "b s h d",
            False,
            "seq_axis",
            description="positions s * H + h (heads folded into the sequence)",
        )
    )
    z.append(
        Member(
            "per_head_frequencies",
            per_head_frequencies(),
            "b s h d",
            False,
            "heads",
            description="heads turn at different rates (per-head tables)",
        )
    )
    z.append(
        Member(
            "permuted_pairs",
            permuted_pairs(),
            "b s h d",
            False,
            "pairing",
            description="rotating pairs in a scrambled dim order",
        )
    )
    z.append(
        Member(
            "bf16_compute",
            bf16_compute(),
            "b s h d",
            False,
            "dtype",
            description="computes and returns bf16 for any input",
        )
    )
    z.append(
        Member(
            "interleaved_for_half",
            ropelab_rope("b s h d", "interleaved"),
            "b s h d",
            False,
            "pairing",
            expect={"pairing": "half"},
            description="interleaved RoPE where half (Llama) is expected",
        )
    )
    z.append(
        Member(
            "full_for_partial",
            ropelab_rope("b s h d"),
            "b s h d",
            False,
            "rotary_dim",
            expect={"rotary_dim": 16},
            description="all 32 dims rotated where 16 should be",
        )
    )
    z.append(
        Member(
            "linear_for_yarn",
            ropelab_rope("b s h d", rope_scaling=LINEAR),
            "b s h d",
            False,
            "scaling",
            expect={"rope_scaling": YARN},
            description="linear scaling where yarn is expected",
        )
    )
    return {m.name: m for m in z}


ZOO: dict[str, Member] = _build()


def correct() -> list[Member]:
    """The members ``diagnose`` must pass."""
    return [m for m in ZOO.values() if m.correct]


def broken() -> list[Member]:
    """The members ``diagnose`` must name by ``finding``."""
    return [m for m in ZOO.values() if not m.correct]
