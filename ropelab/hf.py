"""A Hugging Face Llama-family model driven layer by layer, for ``ropelab.kvcache.decode``.

``HFLlamaAdapter`` follows the adapter protocol of ``ropelab.models.TinyLMAdapter`` (``n_layers``,
``head_dim``, ``rope``, ``embed``, ``layer_qkv``, ``layer_out``, ``head``) with the model's weights used as
they are; its RoPE is read from the config by ``RopeSpec.from_hf_config`` (transformers v4 or v5 schema).
transformers itself is not imported here: pass a loaded model.
"""

from __future__ import annotations

import torch

from .spec import RopeSpec, head_dim_of

__all__ = ["HFLlamaAdapter"]


class HFLlamaAdapter:
    """Drive a Hugging Face ``LlamaForCausalLM`` (or a model with its module names) layer by layer."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.n_layers = model.config.num_hidden_layers
        self.head_dim = head_dim_of(model.config)
        self.rope = RopeSpec.from_hf_config(model.config)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [b, s, hidden]."""
        return self.model.model.embed_tokens(ids)

    def layer_qkv(self, i: int, h: torch.Tensor):
        """Layer i's q, k, v [b, heads, s, head_dim], before RoPE."""
        layer = self.model.model.layers[i]
        x = layer.input_layernorm(h)
        b, s, _ = x.shape
        att = layer.self_attn

        def proj(p):
            return p(x).view(b, s, -1, self.head_dim).transpose(1, 2)

        return proj(att.q_proj), proj(att.k_proj), proj(att.v_proj)

    def layer_out(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after layer i, given its attention output [b, heads, s, head_dim]."""
        layer = self.model.model.layers[i]
        b, _, s, _ = attn.shape
        h = h + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from the last hidden states (final norm, then the LM head)."""
        return self.model.lm_head(self.model.model.norm(h))
