r"""Real-world RoPE code for the zoo, imported from the installed libraries (never copied), called as
their models call it, on configs built in code (no downloads).

- Hugging Face ``transformers`` 5.x: :func:`hf_rope` builds a family's ``<Family>RotaryEmbedding`` from
  its config class and applies the family's own ``apply_rotary_pos_emb`` (Llama, GPT-NeoX with partial
  rotary, Gemma 3 per layer type, Qwen2, Phi-3 longrope, gpt-oss, DeepSeek-V3 with its trailing rotary
  slice and ``rope_interleave``); :func:`hf_gptj` and :func:`hf_esm` for the families whose call differs.
- lucidrains' ``rotary-embedding-torch`` with its length cache on (its default), and its xPos.
- Meta's Llama reference (``llama/model.py``), whose few lines are reproduced as written there.

``OldEsmRotaryEmbedding`` is the one exception to "imported": it re-implements the rotary module of ESM
as Hugging Face shipped it in transformers 4.x (``transformers.models.esm.modeling_esm.RotaryEmbedding``,
e.g. commit 0220b9db of ``src/transformers/models/esm/modeling_esm.py``), which the FAESM-vs-ESM2 thread
called. transformers 5 replaced it by ``EsmRotaryEmbedding(config)``, so the old class no longer exists
there; it is copied line for line.

Both libraries are dev extras: they are imported when a member is first called.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

__all__ = [
    "HF_FAMILIES",
    "hf_rope",
    "hf_gptj",
    "hf_esm",
    "rotary_embedding_torch",
    "meta_llama_complex",
    "OldEsmRotaryEmbedding",
    "esm_old",
    "esm_old_unpadded",
    "esm_old_unpadded_fixed",
]


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    return fn


# family -> (model module, config class, prefix of its RotaryEmbedding class)
HF_FAMILIES = {
    "llama": ("llama", "LlamaConfig", "Llama"),
    "mistral": ("mistral", "MistralConfig", "Mistral"),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2"),
    "gpt_neox": ("gpt_neox", "GPTNeoXConfig", "GPTNeoX"),
    "gemma3": ("gemma3", "Gemma3TextConfig", "Gemma3"),
    "phi3": ("phi3", "Phi3Config", "Phi3"),
    "gpt_oss": ("gpt_oss", "GptOssConfig", "GptOss"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3Config", "DeepseekV3"),
}


def _modeling(family: str):
    return importlib.import_module(f"transformers.models.{HF_FAMILIES[family][0]}.modeling_{HF_FAMILIES[family][0]}")


@functools.lru_cache(maxsize=64)
def _hf_rotary(family: str, config_items: tuple):
    import transformers

    mod, cfg_cls, prefix = HF_FAMILIES[family]
    cfg = getattr(transformers, cfg_cls)(**{k: _thaw(v) for k, v in config_items})
    return getattr(_modeling(family), f"{prefix}RotaryEmbedding")(cfg), cfg


def _freeze(v):
    if isinstance(v, dict):
        return ("__dict__", tuple(sorted((k, _freeze(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("__list__", tuple(v))
    return v


def _thaw(v):
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "__dict__":
        return {k: _thaw(x) for k, x in v[1]}
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "__list__":
        return list(v[1])
    return v


def hf_rope(family: str, *, layer_type: str | None = None, name: str | None = None, **config) -> Callable:
    """``fn(x)`` on layout ``b h s d``: the family's rotary module built from ``<Config>(**config)`` and its
    ``apply_rotary_pos_emb``, as its attention layer calls them (positions 0 .. S-1).

    ``layer_type`` selects Gemma 3's per-layer-type tables (``"sliding_attention"``/``"full_attention"``).
    For DeepSeek-V3 the head is ``qk_nope_head_dim`` pass-through dims followed by ``qk_rope_head_dim``
    rotary dims (``torch.split`` then ``torch.cat`` as ``DeepseekV3Attention.forward`` does), rotated by
    ``apply_rotary_pos_emb_interleave`` when ``rope_interleave`` is set.
    """
    if family not in HF_FAMILIES:
        raise ValueError(f"family must be one of {sorted(HF_FAMILIES)}, got {family!r}.")
    key = tuple(sorted((k, _freeze(v)) for k, v in config.items()))

    def fn(x):
        rot, cfg = _hf_rotary(family, key)
        m = _modeling(family)
        B, H, S, D = x.shape
        pos = torch.arange(S)[None].expand(B, S)
        cos, sin = rot(x, pos) if layer_type is None else rot(x, pos, layer_type)
        if family == "deepseek_v3":
            q_pass, q_rot = torch.split(x, [cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
            apply = m.apply_rotary_pos_emb_interleave if cfg.rope_interleave else m.apply_rotary_pos_emb
            return torch.cat((q_pass, apply(q_rot, q_rot, cos, sin)[0]), dim=-1)
        return m.apply_rotary_pos_emb(x, x, cos, sin)[0]

    return _named(fn, name or f"hf_{family}")


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


def rotary_embedding_torch(rotary_fraction: float = 1.0, *, cache: bool = True, xpos: bool = False) -> Callable:
    """lucidrains' ``rotary-embedding-torch`` (interleaved) on ``b h s d``: ``rotate_queries_or_keys``, or
    with ``xpos`` the query of ``rotate_queries_and_keys`` (xPos scales q by a per-pair factor that grows
    with position, Sun et al. 2022, arXiv 2212.10554). ``cache`` is its ``cache_if_possible`` (on by
    default there): the module keeps the table of the longest length it has seen and reuses it for every
    shorter call, whatever that call's dtype. Every call of this factory builds fresh modules.
    """
    mods: dict[int, torch.nn.Module] = {}

    def fn(x):
        from rotary_embedding_torch import RotaryEmbedding

        r = int(x.shape[-1] * rotary_fraction)
        if r not in mods:
            mods[r] = RotaryEmbedding(dim=r, cache_if_possible=cache, use_xpos=xpos)
        if xpos:
            return mods[r].rotate_queries_and_keys(x, x)[0]
        return mods[r].rotate_queries_or_keys(x)

    return _named(fn, "rotary_embedding_torch" + ("_xpos" if xpos else ""))


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


