r"""Run a trained ``TinyLM``'s weights under another RoPE style, two ways: as they are, or converted.

A model trained with one style (say interleaved, as Meta trained Llama) produces q, k in that style's order
of the head dims. Running it with the other style (Hugging Face's ``rotate_half``) rotates the wrong pairs:
``restyled``. Permuting the rows of :math:`W_q`, :math:`W_k` head by head with the style permutation
:math:`P` (``ropelab.convert.permute_qkv_weight``: the Meta-to-Hugging-Face Llama conversion) gives the
same model in the other style, since :math:`R^{\text{half}}_m = P R^{\text{int}}_m P^\top`: ``permuted``.
``rotated_qk`` returns one block's rotated q and k as its attention forms them, to compare the logits of
the same inputs under each.

Notebook 01, section 3, measures what mixing costs with these.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..convert import permute_qkv_weight
from ..core import STYLES, apply_rope
from ..models import TinyLM, masked_loss

__all__ = ["restyled", "permuted", "rotated_qk", "loss_in_dtype"]


def _check(model: TinyLM, style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}.")
    if "rope" not in model.cfg.pe:
        raise ValueError(f"the model has no RoPE (pe={model.cfg.pe!r}); a style only applies to pe='rope' models.")


def restyled(model: TinyLM, style: str) -> TinyLM:
    """The same weights, run with RoPE style ``style`` (the "mixed" model when ``style`` is not the trained
    one). A new model in eval mode; ``model`` is untouched."""
    _check(model, style)
    new = TinyLM(replace(model.cfg, rope=replace(model.cfg.rope, style=style)))
    new.load_state_dict(model.state_dict())
    return new.eval()


def permuted(model: TinyLM, style: str) -> TinyLM:
    """The same model in style ``style``: the q and k row blocks of every packed qkv ``Linear`` permuted head
    by head from the trained style to ``style`` (v and everything else unchanged). A new model in eval mode."""
    _check(model, style)
    cfg = model.cfg
    state = {name: t.clone() for name, t in model.state_dict().items()}
    for name, t in state.items():
        if name.endswith("attn.qkv.weight"):
            state[name] = permute_qkv_weight(t, cfg.n_heads, src=cfg.rope.style, dst=style)
    new = TinyLM(replace(cfg, rope=replace(cfg.rope, style=style)))
    new.load_state_dict(state)
    return new.eval()


@torch.no_grad()
def rotated_qk(model: TinyLM, idx: torch.Tensor, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q and k [b, h, s, head_dim] of block ``layer`` for token ids ``idx`` [b, s], formed as the
    block's attention forms them (``Attention.project`` on the block's normed input, then ``apply_rope`` in
    the model's style, base and scaling)."""
    cfg = model.cfg
    if "rope" not in cfg.pe:
        raise ValueError(f"the model has no RoPE (pe={cfg.pe!r}); there is no rotated q, k to return.")
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer must be in [0, {cfg.n_layers}), got {layer}.")
    positions = torch.arange(idx.shape[1])
    h = model.embed(idx)
    for block in model.blocks[:layer]:
        h, _ = block(h, positions)
    q, k, _ = model.blocks[layer].attn.project(model.blocks[layer].ln1(h))
    return (apply_rope(q, positions, layout="b h s d", spec=cfg.rope),
            apply_rope(k, positions, layout="b h s d", spec=cfg.rope))


@torch.no_grad()
def loss_in_dtype(model: TinyLM, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None,
                  dtype: torch.dtype = torch.float32) -> float:
    """Masked cross-entropy of ``model`` on (x, y) with every weight cast to ``dtype`` (float64 shrinks the
    round-off; the rotation code is the same). The model is cast back to float32 afterwards."""
    try:
        return float(masked_loss(model.to(dtype)(x), y, mask))
    finally:
        model.to(torch.float32)
