r"""Run a trained ``TinyLM``'s weights under another RoPE style, two ways: as they are, or converted.

A model trained with one style (say interleaved, as Meta trained Llama) produces q, k in that style's order
of the head dims. Running it with the other style (Hugging Face's ``rotate_half``) rotates the wrong pairs:
``restyled``. Permuting the rows of :math:`W_q`, :math:`W_k` head by head with the style permutation
:math:`P` (``ropelab.convert.permute_qkv_weight``: the Meta-to-Hugging-Face Llama conversion) gives the
same model in the other style, since :math:`R^{\text{half}}_m = P R^{\text{int}}_m P^\top`: ``permuted``.
``rotated_qk`` returns one block's rotated q and k as its attention forms them, to compare the logits of
the same inputs under each.

Notebook 01, section 3, measures what mixing costs with these; ``plot_mixing_cost`` and ``plot_loss_restored``
draw its two figures from what it measured.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..convert import permute_qkv_weight
from ..core import STYLES
from ..models import TinyLM, masked_loss
from ..rope import apply_rope

__all__ = ["lag_copy", "restyled", "permuted", "rotated_qk", "loss_in_dtype", "plot_mixing_cost", "plot_loss_restored"]


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


def lag_copy(gen: torch.Generator, batch: int, seq_len: int, vocab: int, lag: int):
    """A task no model solves without position: copy the token seen ``lag`` steps ago in a stream of uniform
    random tokens (chance level ln ``vocab``). Returns ``(x, y, mask)`` [batch, seq_len]: inputs, targets
    ``y[t] = x[t - lag]``, and a mask that drops the first ``lag`` positions (they have no target)."""
    if not 0 < lag < seq_len:
        raise ValueError(f"lag must be in (0, seq_len={seq_len}), got {lag}.")
    x = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    y = torch.roll(x, lag, dims=1)
    mask = (torch.arange(seq_len) >= lag).expand(batch, seq_len)
    return x, y, mask


def plot_mixing_cost(rel: dict, kl: dict):
    """Layer 0's relative logit error (``rel``) and ``|KL|`` of the attention rows (``kl``) against the trained model,
    per query position, for the ``"mixed"`` and ``"converted"`` models, on symlog axes that show round-off
    (1e-16) and order-one errors together. Returns the figure (notebook 01, section 3)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, color, ls in [("mixed", "C1", "-"), ("converted", "C0", "--")]:
        axes[0].plot(rel[name], color=color, ls=ls, label=name)
        axes[1].plot(kl[name].abs(), color=color, ls=ls, label=name)
    for ax, ylabel, title in [(axes[0], "relative logit error", "layer-0 logits vs trained"),
                              (axes[1], "|KL(trained || other)|, nats", "layer-0 attention rows")]:
        ax.set(xlabel="query position m", ylabel=ylabel, title=title)
        ax.set_yscale("symlog", linthresh=1e-16)
        ax.set_ylim(0, 20)
        ax.set_yticks([0, 1e-16, 1e-12, 1e-8, 1e-4, 1])
    axes[0].legend()
    fig.tight_layout()
    return fig


def plot_loss_restored(history: list[dict], l32: dict, keys: list, vocab: int):
    """The training loss of the interleaved model against step (``history``: ``train``'s log), and the held-out
    float32 loss ``l32`` of the trained, mixed and converted models (``keys``, in that order) as labelled dots on
    a log axis, both against chance ln ``vocab``. Returns the figure (notebook 01, section 3)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    steps_logged = [h["step"] for h in history]
    axes[0].semilogy(steps_logged, [h["loss"] for h in history])
    axes[0].axhline(math.log(vocab), color="0.5", ls=":", label=f"chance, ln {vocab} = {math.log(vocab):.2f}")
    axes[0].set(xlabel="step", ylabel="training loss", title="trained in the interleaved style")
    axes[0].legend()
    # Dots on a log axis (bars would start from an arbitrary floor), each labelled with its value.
    labels = ["trained", "mixed", "converted"]
    for j, (k, mk) in enumerate(zip(keys, "os^")):
        axes[1].semilogy([j], [l32[k]], marker=mk, ms=10, ls="none", color=f"C{j}")
        axes[1].annotate(f"{l32[k]:.3g}", (j, l32[k]), textcoords="offset points", xytext=(12, -4), fontsize=9)
    axes[1].axhline(math.log(vocab), color="0.5", ls=":", label=f"chance, ln {vocab} = {math.log(vocab):.2f}")
    axes[1].set(xticks=range(3), xticklabels=labels, xlim=(-0.5, 2.8), ylabel="held-out loss (nats)",
                title="held-out loss, float32")
    axes[1].legend(loc="center right", fontsize=8)
    axes[1].yaxis.set_minor_formatter(plt.NullFormatter())   # labels on the decades only
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    return fig
