"""Decoders driven layer by layer for ``ropelab.kvcache.decode``: the :class:`DecoderAdapter` protocol and
its two implementations.

- :class:`TinyLMAdapter`: ropelab's own ``TinyLM`` (``ropelab.models``, pe='rope');
- :class:`HFLlamaAdapter`: a Hugging Face Llama-family model with its weights used as they are; its RoPE is
  read from the config by ``RopeSpec.from_hf_config`` (transformers v4 or v5 schema). transformers itself is
  not imported here: pass a loaded model.

The cache code sees only the protocol, so the same decoding runs both.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .models import TinyLM
from .spec import RopeSpec, head_dim_of

__all__ = ["DecoderAdapter", "HFLlamaAdapter", "TinyLMAdapter"]


@runtime_checkable
class DecoderAdapter(Protocol):
    """What ``ropelab.kvcache.decode`` needs of a decoder: its depth, head size and RoPE, and the model's
    computation cut at the rotation (q and k come out before RoPE, the attention output goes back in)."""

    n_layers: int
    head_dim: int
    rope: RopeSpec

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [b, s] -> hidden states [b, s, hidden].

        Args:
            ids: token ids [b, s] (int64).
        """
        ...

    def layer_qkv(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's q, k, v [b, heads, s, head_dim] before RoPE (k and v with the key/value heads).

        Args:
            i: the layer's index, 0 .. n_layers - 1.
            h: the residual stream entering layer i, [b, s, hidden].
        """
        ...

    def layer_out(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after layer i, given its attention output [b, heads, s, head_dim].

        Args:
            i: the layer's index.
            h: the residual stream entering layer i, [b, s, hidden].
            attn: layer i's attention output [b, q_heads, s, head_dim] (before the output projection).
        """
        ...

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from the last hidden states.

        Args:
            h: the residual stream after the last layer, [b, s, hidden].

        Returns logits [b, s, vocab].
        """
        ...


class TinyLMAdapter:
    """Drives a ``TinyLM`` (pe='rope') layer by layer for ``ropelab.kvcache.decode``: the adapter protocol is
    ``n_layers``, ``head_dim``, ``rope`` (the model's :class:`RopeSpec`), ``embed(ids)``, ``layer_qkv(i, h)`` ->
    q, k, v [b, heads, s, d] before RoPE, ``layer_out(i, h, attention_output)`` and ``head(h)`` -> logits.

    Args:
        model: a :class:`ropelab.models.TinyLM` with ``pe="rope"`` (ValueError otherwise).
    """

    def __init__(self, model: TinyLM):
        if model.cfg.pe != "rope":
            raise ValueError(f"TinyLMAdapter needs a model with pe='rope', got {model.cfg.pe!r}.")
        self.model, self.cfg = model, model.cfg
        self.n_layers, self.head_dim, self.rope = model.cfg.n_layers, model.cfg.head_dim, model.cfg.rope

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [b, s, d_model] (the model's ``embed``).

        Args:
            ids: token ids [b, s].
        """
        return self.model.embed(ids)

    def layer_qkv(self, i: int, h: torch.Tensor):
        """Block i's q, k, v [b, h, s, head_dim], before RoPE.

        Args:
            i: the block's index.
            h: the residual stream entering block i, [b, s, d_model] (normed here by the block's ``ln1``).
        """
        block = self.model.blocks[i]
        return block.attn.project(block.ln1(h))

    def layer_out(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after block i, given its attention output [b, h, s, head_dim].

        Args:
            i: the block's index.
            h: the residual stream entering block i, [b, s, d_model].
            attn: block i's attention output [b, h, s, head_dim]; merged, added to h, then the MLP's residual.
        """
        block = self.model.blocks[i]
        h = h + block.attn.merge(attn)
        return h + block.mlp(block.ln2(h))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from the last hidden states (the model's ``logits``).

        Args:
            h: the residual stream after the last block, [b, s, d_model].
        """
        return self.model.logits(h)



class HFLlamaAdapter:
    """Drive a Hugging Face ``LlamaForCausalLM`` (or a model with its module names) layer by layer.

    Args:
        model: a loaded model with ``config`` (its RoPE read by ``RopeSpec.from_hf_config``, whose errors it
            raises), ``model.embed_tokens``, ``model.layers[i]`` (``input_layernorm``, ``self_attn.q_proj`` /
            ``k_proj`` / ``v_proj`` / ``o_proj``, ``post_attention_layernorm``, ``mlp``), ``model.norm`` and
            ``lm_head``. Its weights are used as they are.
    """

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.n_layers = model.config.num_hidden_layers
        self.head_dim = head_dim_of(model.config)
        self.rope = RopeSpec.from_hf_config(model.config)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [b, s, hidden].

        Args:
            ids: token ids [b, s].
        """
        return self.model.model.embed_tokens(ids)

    def layer_qkv(self, i: int, h: torch.Tensor):
        """Layer i's q, k, v [b, heads, s, head_dim], before RoPE.

        Args:
            i: the layer's index.
            h: the residual stream entering layer i, [b, s, hidden] (normed here by ``input_layernorm``).
        """
        layer = self.model.model.layers[i]
        x = layer.input_layernorm(h)
        b, s, _ = x.shape
        att = layer.self_attn

        def proj(p):
            return p(x).view(b, s, -1, self.head_dim).transpose(1, 2)

        return proj(att.q_proj), proj(att.k_proj), proj(att.v_proj)

    def layer_out(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after layer i, given its attention output [b, heads, s, head_dim].

        Args:
            i: the layer's index.
            h: the residual stream entering layer i, [b, s, hidden].
            attn: layer i's attention output [b, q_heads, s, head_dim], before ``o_proj``.
        """
        layer = self.model.model.layers[i]
        b, _, s, _ = attn.shape
        h = h + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from the last hidden states (final norm, then the LM head).

        Args:
            h: the residual stream after the last layer, [b, s, hidden].
        """
        return self.model.lm_head(self.model.model.norm(h))
