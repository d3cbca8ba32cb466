r"""A tiny decoder-only transformer with a pluggable position encoding, and its training loop.

Small and readable on purpose: the notebooks train it on two CPU cores. Position encodings
(``ModelConfig.pe``):

- ``"none"``: NoPE, causal masking alone (Kazemnejad et al. 2023, arXiv 2305.19466);
- ``"learned"``: a learned absolute embedding added to the tokens (GPT-2);
- ``"sinusoidal"``: the fixed absolute encoding of Vaswani et al. 2017 (arXiv 1706.03762);
- ``"rope"``: rotary embedding of q and k, any style, base or scaling (``ModelConfig.rope``, a
  :class:`ropelab.spec.RopeSpec`, applied by ``ropelab.apply_rope``);
- ``"alibi"``: a linear distance penalty per head, slopes :math:`2^{-8h/H}` (Press et al. 2021, arXiv 2108.12409);
- ``"cope"``: Contextual Position Encoding (Golovneva et al. 2024, arXiv 2405.18719; ``ropelab.cope``);
- ``"cope+rope"``: both.

Attention is computed explicitly (no fused kernel) so notebooks can read the attention maps
(:meth:`TinyLM.forward_with_attention`). :class:`ropelab.adapters.TinyLMAdapter` drives the model layer by layer for
``ropelab.kvcache.decode``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .cope import CoPE
from .rope import apply_rope
from .spec import RopeSpec

__all__ = [
    "PE_TYPES",
    "ModelConfig",
    "Attention",
    "Block",
    "TinyLM",
    "LMOutput",
    "alibi_slopes",
    "sinusoidal_table",
    "masked_loss",
    "train",
    "save_checkpoint",
    "checkpoint_dict",
    "from_checkpoint_dict",
    "load_checkpoint",
]

PE_TYPES = ("none", "learned", "sinusoidal", "rope", "alibi", "cope", "cope+rope")


# The flat RoPE fields of checkpoints written before ModelConfig.rope existed (data/lm/*.pt), and where
# each now lives in RopeSpec. Read by ModelConfig.from_dict; nothing writes them any more.
_LEGACY_ROPE_KEYS = {"rope_style": "style", "rope_base": "base", "rope_scaling": "scaling",
                     "max_position_embeddings": "max_position_embeddings"}


@dataclass(frozen=True)
class ModelConfig:
    """The model's sizes and its position encoding ``pe`` (one of ``PE_TYPES``); ``rope`` is the RoPE of
    every layer when ``pe`` has RoPE. Frozen: another RoPE is ``dataclasses.replace(cfg, rope=...)``.

    Args:
        vocab_size: the number of token ids.
        d_model: the width of the residual stream; a multiple of ``n_heads``.
        n_layers: the number of blocks.
        n_heads: attention heads per block; head_dim = d_model / n_heads (even with RoPE).
        d_ff: the MLP's hidden width; None: 4 * d_model.
        pe: the position encoding, one of :data:`PE_TYPES` (ValueError otherwise).
        max_len: the rows of the learned or sinusoidal table: positions must stay below it.
        rope: the RoPE of every layer (a :class:`ropelab.spec.RopeSpec`) when ``pe`` has RoPE.
        cope_npos_max: CoPE's table rows (positions clamped at npos_max - 1).
        cope_per_head: one CoPE table per head (True) or one shared by the heads (False).
        cope_scale: ``"after"`` or ``"before"``: where CoPE's position term enters (:class:`ropelab.cope.CoPE`).
        dropout: the dropout after attention and after the MLP (training only).

    ValueError names a field that does not fit (pe, a head count that does not divide d_model, an odd head dim
    with RoPE, a rope that is not a RopeSpec).
    """

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None  # default 4 * d_model
    pe: str = "rope"
    max_len: int = 1024  # table size for learned / sinusoidal
    rope: RopeSpec = field(default_factory=RopeSpec)
    cope_npos_max: int = 64
    cope_per_head: bool = False
    cope_scale: str = "after"  # position term added after the 1/sqrt(d) scaling (paper's listing)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.pe not in PE_TYPES:
            raise ValueError(f"pe must be one of {PE_TYPES}, got {self.pe!r}.")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}.")
        if (self.d_model // self.n_heads) % 2 and "rope" in self.pe:
            raise ValueError("RoPE needs an even head dim; change d_model or n_heads.")
        if not isinstance(self.rope, RopeSpec):
            raise ValueError(f"rope must be a ropelab.spec.RopeSpec, got {type(self.rope).__name__}.")

    @property
    def head_dim(self) -> int:
        """d_model / n_heads."""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        """Plain types only (what a checkpoint stores); ``ModelConfig.from_dict`` reads it back."""
        # not asdict(self): it would deep-copy the RopeSpec, whose scaling dict is a read-only mappingproxy
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rope"}
        out["rope"] = self.rope.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; also reads checkpoints written with the earlier flat RoPE fields
        (``rope_style``, ``rope_base``, ``rope_scaling``, ``max_position_embeddings``; an ``extra`` dict, unused
        by any model, must be empty).

        Args:
            d: a mapping as :meth:`to_dict` writes it (or with the legacy flat fields; both at once raises
                ValueError).
        """
        d = dict(d)
        if d.pop("extra", None):
            raise ValueError("this checkpoint's config has a non-empty 'extra' dict, which ModelConfig no longer has.")
        legacy = {new: d.pop(old) for old, new in _LEGACY_ROPE_KEYS.items() if old in d}
        if legacy and "rope" in d:
            raise ValueError(f"config has both 'rope' and the flat fields {sorted(legacy)}; keep one.")
        rope = d.pop("rope", legacy)
        return cls(**d, rope=RopeSpec(**rope))


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    r"""Vaswani et al. 2017: :math:`PE_{m, 2i} = \sin(m / 10000^{2i/d})`,
    :math:`PE_{m, 2i+1} = \cos(m / 10000^{2i/d})`.

    Args:
        n_positions: the table's rows, positions 0 .. n_positions - 1.
        d_model: the table's width d (even).

    Returns a float32 tensor [n_positions, d_model] (computed in float64).
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table.float()


def alibi_slopes(n_heads: int) -> torch.Tensor:
    r"""ALiBi's head slopes: the geometric sequence :math:`2^{-8h/H}`, h = 1..H, for H a power of two;
    otherwise the closest power of two's slopes plus every other slope of the next (Press et al. 2021).

    Args:
        n_heads: H, the number of heads (a positive int).

    Returns a float32 tensor [H].
    """

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest])


class Attention(nn.Module):
    """Multi-head causal self-attention with the position encoding of ``cfg.pe``.

    Args:
        cfg: the model's configuration (sizes, ``pe``, ``rope``, CoPE's settings).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.cope = None
        if cfg.pe in ("cope", "cope+rope"):
            self.cope = CoPE(
                cfg.cope_npos_max,
                cfg.head_dim,
                n_heads=cfg.n_heads if cfg.cope_per_head else None,
                scale=cfg.cope_scale,
            )
        if cfg.pe == "alibi":
            self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of shape [b, h, s, head_dim], before any rotation (the KV cache and notebooks start here).

        Args:
            x: the (normed) residual stream [b, s, d_model].
        """
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.cfg.n_heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        """Attention output [b, h, s, head_dim] -> the residual stream's [b, s, d_model], through ``out``.

        Args:
            y: the heads' attention output [b, h, s, head_dim].
        """
        b, _, s, _ = y.shape
        return self.out(y.transpose(1, 2).reshape(b, s, self.cfg.d_model))

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                rope: RopeSpec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [b, s, d_model], attention [b, h, s, s]) for x [b, s, d_model]; ``rope`` overrides
        ``cfg.rope`` for this call.

        Args:
            x: the (normed) residual stream [b, s, d_model].
            positions: the tokens' positions [s], used by RoPE and ALiBi (the absolute tables are added in TinyLM).
            rope: a RopeSpec to use instead of ``cfg.rope`` for this call; None: ``cfg.rope``. Ignored without
                RoPE.
        """
        cfg = self.cfg
        s = x.shape[1]
        q, k, v = self.project(x)
        if "rope" in cfg.pe:
            spec = cfg.rope if rope is None else rope
            q, k = (apply_rope(t, positions, layout="b h s d", spec=spec) for t in (q, k))
        qk = q @ k.transpose(-1, -2)  # [b h s s], unscaled
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        if self.cope is not None:
            logits = self.cope(q, qk, mask)
        else:
            logits = qk / math.sqrt(cfg.head_dim)
            if cfg.pe == "alibi":
                dist = (positions[..., :, None] - positions[..., None, :]).to(logits.dtype)  # i - j
                logits = logits - self.slopes[:, None, None] * dist
            logits = logits.masked_fill(~mask, float("-inf"))
        attn = logits.softmax(dim=-1)
        return self.merge(attn @ v), attn


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1 x), then + mlp(ln2 x).

    Args:
        cfg: the model's configuration.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, d_ff), nn.GELU(), nn.Linear(d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, positions, rope: RopeSpec | None = None):
        """(hidden states, this block's attention [b, h, s, s]).

        Args:
            x: the residual stream [b, s, d_model].
            positions: the tokens' positions [s], used by RoPE and ALiBi (the absolute tables are added in TinyLM).
            rope: a RopeSpec to use instead of ``cfg.rope`` for this call; None: ``cfg.rope``. Ignored without
                RoPE.
        """
        a, attn = self.attn(self.ln1(x), positions, rope)
        x = x + self.drop(a)
        x = x + self.drop(self.mlp(self.ln2(x)))
        return x, attn


class LMOutput(NamedTuple):
    """What :meth:`TinyLM.forward_with_attention` returns.

    Args:
        logits: [b, s, vocab].
        attention: one [b, h, s, s] tensor of attention probabilities per layer.
    """

    logits: torch.Tensor  # [b, s, vocab]
    attention: list[torch.Tensor]  # one [b, h, s, s] per layer


class TinyLM(nn.Module):
    """Decoder-only transformer: token embedding, pre-LN blocks, tied output head.

    Args:
        cfg: the model's configuration; the weights start random (normal, std 0.02; biases zero).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.pe == "learned":
            self.pos_embed = nn.Embedding(cfg.max_len, cfg.d_model)
        if cfg.pe == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, *,
                rope: RopeSpec | None = None) -> torch.Tensor:
        """Logits [b, s, vocab] for token ids [b, s]. ``rope`` runs the model with another RoPE than
        ``cfg.rope`` for this call (the weights are shared; nothing is mutated).

        Args:
            idx: token ids [b, s].
            positions: the tokens' positions [s]; None: 0 .. s - 1. With a learned or sinusoidal table a
                position >= ``cfg.max_len`` raises ValueError.
            rope: as in :meth:`forward_with_attention`.
        """
        return self.forward_with_attention(idx, positions, rope=rope).logits

    def forward_with_attention(self, idx: torch.Tensor, positions: torch.Tensor | None = None, *,
                               rope: RopeSpec | None = None) -> LMOutput:
        """Logits and every layer's attention probabilities [b, h, s, s] (:class:`LMOutput`).

        Args:
            idx: token ids [b, s].
            positions: the tokens' positions [s]; None: 0 .. s - 1. With a learned or sinusoidal table a
                position >= ``cfg.max_len`` raises ValueError.
            rope: a RopeSpec to use instead of ``cfg.rope`` for this call; None: ``cfg.rope``.
        """
        b, s = idx.shape
        if positions is None:
            positions = torch.arange(s, device=idx.device)
        if self.cfg.pe in ("learned", "sinusoidal") and int(positions.max()) >= self.cfg.max_len:
            raise ValueError(
                f"position {int(positions.max())} is past the absolute table (max_len={self.cfg.max_len}); "
                "raise ModelConfig.max_len."
            )
        x = self.embed(idx)
        if self.cfg.pe == "learned":
            x = x + self.pos_embed(positions)
        elif self.cfg.pe == "sinusoidal":
            x = x + self.pos_table[positions]
        maps = []
        for block in self.blocks:
            x, attn = block(x, positions, rope)
            maps.append(attn)
        return LMOutput(self.logits(x), maps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and the tied output head: hidden states [b, s, d_model] -> logits [b, s, vocab].

        Args:
            h: the residual stream after the last block, [b, s, d_model].
        """
        return self.ln_f(h) @ self.embed.weight.T


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Mean cross-entropy over the positions where ``loss_mask`` is True (all positions when None); a float
    ``loss_mask`` weighs each position (the weighted mean :math:`\sum w_t \ell_t / \sum w_t`).

    Args:
        logits: [..., vocab].
        targets: the target ids, logits' shape without vocab.
        loss_mask: None, or a bool or float tensor of targets' shape; the denominator is clamped at 1, so an
            all-False mask gives 0, not NaN.

    Returns a 0-D tensor (differentiable).
    """
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    if loss_mask is None:
        return ce.mean()
    m = loss_mask.reshape(-1).to(ce.dtype)
    return (ce * m).sum() / m.sum().clamp_min(1)


def train(
    model: TinyLM,
    sample: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
    *,
    steps: int,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    warmup: int = 50,
    seed: int = 0,
    log_every: int = 25,
    evaluate: Callable[[TinyLM], dict] | None = None,
    eval_every: int | None = None,
    progress: bool = True,
    desc: str = "train",
) -> list[dict]:
    """AdamW with linear warm-up and cosine decay; shows a tqdm progress bar.

    ``sample(generator)`` returns ``(inputs, targets, loss_mask)``. Returns the history: one dict per
    ``log_every`` steps with the step and mean training loss, plus ``evaluate(model)``'s dict every
    ``eval_every`` steps.

    Args:
        model: the model to train, in place (left in eval mode).
        sample: ``sample(generator) -> (inputs [b, s], targets [b, s], loss_mask or None)``, drawing from the
            generator seeded with ``seed``.
        steps: the number of optimiser steps.
        lr: the peak learning rate, reached after the warm-up; the cosine decays to 0.1 * lr.
        weight_decay: AdamW's decoupled weight decay (betas 0.9, 0.98; gradients clipped at norm 1).
        warmup: steps of linear warm-up.
        seed: the seed of the sampling generator (the weights' initialisation is the caller's).
        log_every: steps per history entry (and at the last step).
        evaluate: ``evaluate(model) -> dict`` merged into a history entry, run under ``torch.no_grad`` in eval
            mode; None: no evaluation.
        eval_every: evaluate at the logged steps that are multiples of it, and at the last step; None: the
            last step only.
        progress: show a tqdm progress bar.
        desc: the progress bar's label.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * t)) * 0.9 + 0.1

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    history, running = [], []
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(bar, desc=desc, leave=False)
    for step in bar:
        model.train()
        inputs, targets, loss_mask = sample(gen)
        loss = masked_loss(model(inputs), targets, loss_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running.append(loss.item())
        last = step == steps - 1
        if (step + 1) % log_every == 0 or last:
            entry = {"step": step + 1, "loss": sum(running) / len(running)}
            running = []
            if evaluate is not None and (last or (eval_every and (step + 1) % eval_every == 0)):
                model.eval()
                with torch.no_grad():
                    entry.update(evaluate(model))
            history.append(entry)
            if progress:
                bar.set_postfix(loss=f"{entry['loss']:.3f}")
    model.eval()
    return history


def checkpoint_dict(model: TinyLM, dtype: torch.dtype = torch.float32) -> dict:
    """``{"config": model.cfg.to_dict(), "state_dict": ...}`` with floating tensors cast to ``dtype``: the one
    checkpoint format (:func:`save_checkpoint` writes one to a file; notebook 04 keeps several in one file).

    Args:
        model: the model.
        dtype: a floating torch dtype for the floating tensors (ValueError otherwise); other tensors are kept.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (torch.float32, torch.float16), got {dtype!r}.")
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    return {"config": model.cfg.to_dict(), "state_dict": state}


def from_checkpoint_dict(ckpt: Mapping[str, Any]) -> TinyLM:
    """The model of a :func:`checkpoint_dict` (or of the flat-field configs of older ones, see
    :meth:`ModelConfig.from_dict`), as a float32 ``TinyLM`` in eval mode.

    Args:
        ckpt: a mapping with ``"config"`` and ``"state_dict"``.
    """
    model = TinyLM(ModelConfig.from_dict(ckpt["config"]))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()})
    return model.eval()


def save_checkpoint(model: TinyLM, path: str | Path, *, dtype: torch.dtype = torch.float32,
                    meta: Mapping[str, Any] | None = None) -> Path:
    """Write :func:`checkpoint_dict` to ``path`` (float16 halves the bytes; :func:`load_checkpoint` reads
    either back as float32), and ``meta`` (a training record) as JSON to ``path`` with the suffix ``.json``.
    Returns ``path``.

    Args:
        model: the model.
        path: the file to write (its folder is created).
        dtype: the floating tensors' dtype in the file (:func:`checkpoint_dict`).
        meta: a JSON-serialisable mapping written next to it, or None for none.
    """
    ckpt = checkpoint_dict(model, dtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    if meta is not None:
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return path


def load_checkpoint(path: str | Path) -> TinyLM:
    """A checkpoint written by :func:`save_checkpoint`, as :func:`from_checkpoint_dict` reads it.

    Args:
        path: the checkpoint file, read with ``torch.load(..., weights_only=True)`` on the CPU;
            FileNotFoundError (saying how to make it) when it is missing.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; `make lm` writes the study checkpoints in data/lm/ "
                                "(python -m ropelab.lm train, python -m ropelab.extension ...).")
    return from_checkpoint_dict(torch.load(path, map_location="cpu", weights_only=True))


def __getattr__(name: str):
    # TinyLMAdapter moved to ropelab.adapters (a deprecated alias here; see CHANGELOG.md).
    from ._aliases import moved_name

    return moved_name(__name__, name)
