r"""Contextual Position Encoding (CoPE) as an attention component, and a slow float64 oracle.

Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual Position Encoding: Learning to Count What's
Important" (arXiv 2405.18719). A position is not a token count but a count of the tokens the query
chooses to count. For query i and key j (causal, :math:`j \le i`):

.. math::
    a_{ij} = q_i \cdot k_j / \sqrt{d}, \qquad
    g_{ij} = \sigma(a_{ij}), \qquad
    p_{ij} = \sum_{k=j}^{i} g_{ik}\quad(\text{a reverse cumulative sum over keys}),

then :math:`p_{ij}` is clamped at ``npos_max - 1`` and the position logit is interpolated between the
two integer positions around it from a learned table :math:`e[0..n-1]` of head-dim vectors:

.. math::
    z_{ij} = w\,q_i\cdot e[\lceil p_{ij}\rceil] + (1 - w)\,q_i\cdot e[\lfloor p_{ij}\rfloor],
    \qquad w = p_{ij} - \lfloor p_{ij}\rfloor .

Only the interpolation weight w carries the gradient to the gates (floor and ceil are integers).
Conventions: masked keys have gate 0, so they never add to a count; with every gate equal to 1 the
position is :math:`p_{ij} = i - j + 1` (the key itself counts, so the current token is at position 1,
and position 0 is reached only when every gate from j to i is 0).

Two conventions for where the position term enters (``scale``), both with gates from the scaled logits:

- ``"after"`` (the paper's listing, Section 3): :math:`\ell_{ij} = q_i\cdot k_j/\sqrt d + z_{ij}`. The
  position term is not divided by :math:`\sqrt d`.
- ``"before"`` (the official code, facebookresearch/RAM ``projects/cope``, default without
  ``--cope-nodiv``): :math:`\ell_{ij} = (q_i\cdot k_j + z_{ij})/\sqrt d`, so the position term is
  scaled like the content term. The two differ only by a factor :math:`\sqrt d` on the table, which
  matters for its learning dynamics (weight decay, Adam step size), not for what it can express.

Masked entries of :math:`\ell` are :math:`-\infty`. The table is shared by the heads of a layer
(``n_heads=None``, the paper's code) or one per head (``n_heads=H``), and starts at zero, so an
untrained CoPE layer is exactly content-only attention.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .scaling.checks import check_int

__all__ = [
    "CoPE",
    "SCALES",
    "contextual_positions",
    "cope_internals",
    "interpolate_position_logits",
    "reference_cope",
    "COUNT_RULES",
    "cope_gates",
]

SCALES = ("after", "before")


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(
            f"scale must be 'after' (position term added after the 1/sqrt(d) scaling, the paper's listing) or "
            f"'before' (added before it, the official repository's default), got {scale!r}."
        )


def contextual_positions(gates: torch.Tensor, npos_max: int | None = None) -> torch.Tensor:
    r"""Positions :math:`p_{ij} = \sum_{k \ge j} g_{ik}` (a reverse cumulative sum over the last axis).

    ``gates`` is [..., s_q, s_k] with zeros at masked keys (so for a causal mask the sum stops at
    k = i). With ``npos_max`` the result is clamped at ``npos_max - 1``, the last row of the table.

    Args:
        gates: a floating tensor [..., s_q, s_k] of gates in [0, 1], 0 at masked keys.
        npos_max: the table's number of rows (>= 2; ValueError otherwise), or None for no clamp.

    Returns a tensor of ``gates``' shape and dtype (differentiable).
    """
    if not isinstance(gates, torch.Tensor) or not gates.dtype.is_floating_point:
        raise ValueError(f"gates must be a floating-point tensor, got {getattr(gates, 'dtype', type(gates))}.")
    if gates.ndim < 2:
        raise ValueError(f"gates must be [..., s_q, s_k], got shape {tuple(gates.shape)}.")
    p = gates.flip(-1).cumsum(-1).flip(-1)
    if npos_max is not None:
        if npos_max < 2:
            raise ValueError(f"npos_max must be at least 2 (positions 0 and 1), got {npos_max}.")
        p = p.clamp(max=npos_max - 1)
    return p


def interpolate_position_logits(int_logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    r"""Linear interpolation of the integer-position logits ``int_logits[..., n]`` (= :math:`q_i\cdot e[n]`,
    shape [..., s_q, npos]) at the fractional positions ``p`` [..., s_q, s_k] (already clamped).

    Args:
        int_logits: [..., s_q, npos], the logit of each query at each integer position.
        p: [..., s_q, s_k], positions in [0, npos - 1] (:func:`contextual_positions` with ``npos_max``); the
            gradient flows through the interpolation weight only.

    Returns [..., s_q, s_k].
    """
    lo = p.detach().floor().long()
    hi = p.detach().ceil().long()
    w = p - lo.to(p.dtype)  # differentiable: the only path from the gates to the loss
    return int_logits.gather(-1, hi) * w + int_logits.gather(-1, lo) * (1 - w)


class CoPE(nn.Module):
    r"""Contextual Position Encoding for one attention layer (see the module docstring for the formulas).

    Args:
        npos_max: number of integer positions in the table; positions are clamped at ``npos_max - 1``.
        head_dim: d, the query/key head dimension.
        n_heads: None for one table shared by the heads (the paper's code), or H for one table per head.
        scale: ``"after"`` (paper's listing) or ``"before"`` (official repository's default).

    ``forward(q, qk, mask)`` takes q [b, h, s, d] (already RoPE-rotated for CoPE+RoPE), the unscaled
    scores qk = q @ k^T [b, h, s, s] and a bool mask [s, s] (True = may attend), and returns the final
    attention logits [b, h, s, s] to be softmaxed, with -inf where the mask is False.
    """

    def __init__(self, npos_max: int, head_dim: int, n_heads: int | None = None, scale: str = "after"):
        super().__init__()
        if not isinstance(npos_max, int) or npos_max < 2:
            raise ValueError(f"npos_max must be an int >= 2 (table rows 0 .. npos_max-1), got {npos_max!r}.")
        if not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}.")
        if n_heads is not None and (not isinstance(n_heads, int) or n_heads < 1):
            raise ValueError(
                f"n_heads must be None (one table shared by the heads) or a positive int, got {n_heads!r}."
            )
        _check_scale(scale)
        self.npos_max, self.head_dim, self.n_heads, self.scale = npos_max, head_dim, n_heads, scale
        shape = (head_dim, npos_max) if n_heads is None else (n_heads, head_dim, npos_max)
        self.pos_emb = nn.Parameter(torch.zeros(shape))  # zero: an untrained layer is content-only attention

    def extra_repr(self) -> str:
        """The sizes shown by ``print(module)``."""
        heads = "shared" if self.n_heads is None else f"per head ({self.n_heads})"
        return f"npos_max={self.npos_max}, head_dim={self.head_dim}, table={heads}, scale={self.scale!r}"

    def _check(self, q: torch.Tensor, qk: torch.Tensor, mask: torch.Tensor) -> None:
        if q.ndim != 4 or q.shape[-1] != self.head_dim:
            raise ValueError(f"q must be [b, h, s, {self.head_dim}] (head_dim={self.head_dim}), got {tuple(q.shape)}.")
        b, h, s, _ = q.shape
        if qk.ndim != 4 or tuple(qk.shape[:3]) != (b, h, s):
            raise ValueError(
                f"qk must be q @ k^T of shape [b, h, s, s_k] = [{b}, {h}, {s}, s_k], got {tuple(qk.shape)}."
            )
        if q.dtype != qk.dtype or q.dtype != self.pos_emb.dtype:
            raise ValueError(
                f"q ({q.dtype}), qk ({qk.dtype}) and the position table ({self.pos_emb.dtype}) must share a dtype; "
                "cast the inputs, or the module with .to(dtype)."
            )
        if self.n_heads is not None and h != self.n_heads:
            raise ValueError(f"this CoPE has a table per head for {self.n_heads} heads but q has {h} heads.")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor (True = may attend), got {getattr(mask, 'dtype', type(mask).__name__)}; "
                "build it with torch.ones(s, s, dtype=torch.bool).tril()."
            )
        if tuple(mask.shape) != tuple(qk.shape[-2:]):
            raise ValueError(
                f"mask must be [s_q, s_k] = {list(qk.shape[-2:])} (one entry per query/key pair), "
                f"got {tuple(mask.shape)}."
            )

    def positions(self, q: torch.Tensor, qk: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The gates :math:`g_{ij}` (0 where masked) and the clamped positions :math:`p_{ij}`, both [b, h, s, s].

        Args:
            q: the queries [b, h, s, d] (d = ``head_dim``; already RoPE-rotated for CoPE+RoPE), of the table's
                dtype.
            qk: the unscaled content scores q @ k^T [b, h, s, s_k], q's dtype.
            mask: a bool [s, s_k] (True = may attend), e.g. ``torch.ones(s, s, dtype=torch.bool).tril()``.

        ValueError names a shape, dtype or head count that does not fit.
        """
        self._check(q, qk, mask)
        gates = torch.sigmoid(qk / math.sqrt(self.head_dim)).masked_fill(~mask, 0.0)
        return gates, contextual_positions(gates, self.npos_max)

    def integer_logits(self, q: torch.Tensor) -> torch.Tensor:
        r""":math:`q_i \cdot e[n]` for every integer position n: [b, h, s, npos_max].

        Args:
            q: the queries [b, h, s, d] (h = ``n_heads`` with a table per head).
        """
        if self.n_heads is None:
            return q @ self.pos_emb
        return torch.einsum("bhsd,hdn->bhsn", q, self.pos_emb)

    def forward(self, q: torch.Tensor, qk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention logits [b, h, s, s]: the content logits ``qk`` plus the interpolated position logits at
        the contextual positions, scaled as ``scale`` says, -inf where ``mask`` is False.

        Args:
            q: the queries [b, h, s, d] (d = ``head_dim``; already RoPE-rotated for CoPE+RoPE), of the table's
                dtype.
            qk: the unscaled content scores q @ k^T [b, h, s, s_k], q's dtype.
            mask: a bool [s, s_k] (True = may attend), e.g. ``torch.ones(s, s, dtype=torch.bool).tril()``.
        """
        _, p = self.positions(q, qk, mask)
        z = interpolate_position_logits(self.integer_logits(q), p)
        root_d = math.sqrt(self.head_dim)
        logits = qk / root_d + z if self.scale == "after" else (qk + z) / root_d
        return logits.masked_fill(~mask, float("-inf"))


@torch.no_grad()
def cope_internals(model: nn.Module, idx: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Run ``model`` on token ids ``idx`` and return, for each :class:`CoPE` layer in order, its ``gates``
    and clamped ``positions`` [b, h, s, s] and ``integer_logits`` [b, h, s, npos_max] (:math:`q_i\\cdot e[n]`),
    read with forward hooks (the model is not changed).

    Args:
        model: a module containing :class:`CoPE` layers (ValueError if none), called as ``model(idx)``; it is
            put in eval mode and left there.
        idx: the token ids the model takes, e.g. [b, s].
    """
    found, handles = [], []

    def hook(module, args, _output):
        q, qk, mask = args
        gates, p = module.positions(q, qk, mask)
        found.append({"gates": gates, "positions": p, "integer_logits": module.integer_logits(q)})

    for m in model.modules():
        if isinstance(m, CoPE):
            handles.append(m.register_forward_hook(hook))
    if not handles:
        raise ValueError("the model has no CoPE layer; build it with ModelConfig(pe='cope') or 'cope+rope'.")
    try:
        model.eval()
        model(idx)
    finally:
        for h in handles:
            h.remove()
    return found


def reference_cope(
    q: torch.Tensor,
    qk: torch.Tensor,
    mask: torch.Tensor,
    pos_emb: torch.Tensor,
    *,
    scale: str = "after",
) -> torch.Tensor:
    """float64 oracle: CoPE's logits with explicit loops over batch, head, query and key (slow; tests only).

    ``pos_emb`` is [d, npos] (shared) or [h, d, npos] (per head); arguments as in :class:`CoPE`.

    Args:
        q: the queries [b, h, s, d].
        qk: the unscaled scores q @ k^T [b, h, s, s_k].
        mask: a bool [s, s_k] (True = may attend).
        pos_emb: the position table, [d, npos] or [h, d, npos].
        scale: ``"after"`` or ``"before"`` (:data:`SCALES`; ValueError otherwise).

    Returns float64 logits [b, h, s, s_k], -inf where masked.
    """
    _check_scale(scale)
    q, qk, pos_emb = q.double(), qk.double(), pos_emb.double()
    b, h, s, d = q.shape
    npos = pos_emb.shape[-1]
    out = torch.full(qk.shape, float("-inf"), dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            table = pos_emb if pos_emb.ndim == 2 else pos_emb[hi]
            for i in range(s):
                gates = [1.0 / (1.0 + math.exp(-float(qk[bi, hi, i, k]) / math.sqrt(d))) if mask[i, k] else 0.0
                         for k in range(qk.shape[-1])]
                for j in range(qk.shape[-1]):
                    if not mask[i, j]:
                        continue
                    p = min(sum(gates[j:]), npos - 1)
                    lo, hi_ = math.floor(p), math.ceil(p)
                    w = p - lo
                    z = w * float(q[bi, hi, i] @ table[:, hi_]) + (1 - w) * float(q[bi, hi, i] @ table[:, lo])
                    a = float(qk[bi, hi, i, j])
                    out[bi, hi, i, j] = a / math.sqrt(d) + z if scale == "after" else (a + z) / math.sqrt(d)
    return out


def _vowel(c: str) -> bool:
    return c.lower() in "aeiou"


COUNT_RULES = {
    "symbols (not blanks or punctuation)": lambda c: c.isalnum(),
    "vowels": _vowel,
    "spaces (word boundaries)": lambda c: c.isspace(),
    "every token": lambda c: True,
}


def cope_gates(text: str, count: str = "symbols (not blanks or punctuation)", sharpness: float = 6.0,
               npos_max: int = 64) -> dict:
    r"""CoPE's gates and contextual positions on a typed sequence, one token per character.

    The CoPE layer is :class:`ropelab.cope.CoPE` (``positions``); its queries and keys are **set by hand,
    not trained**: every key is :math:`k_j = (f_j, 1)` with :math:`f_j = 1` when character j matches the
    ``count`` rule (:data:`COUNT_RULES`) and 0 otherwise, every query is
    :math:`q = \sqrt 2\,s\,(2, -1)`, so the gate is :math:`\sigma(s\,(2f_j - 1))`: about 1 on the tokens
    counted and about 0 on the others for a large sharpness s. The contextual position of key j seen from
    query i is :math:`p_{ij} = \sum_{k=j}^{i} g_{ik}` (clamped at ``npos_max - 1``).

    Returns ``tokens`` (the characters), ``gates`` and ``positions`` [s, s] (float64, causal: zero above
    the diagonal), and ``token_distance`` [s, s] (:math:`i - j + 1`, what RoPE or an absolute encoding
    would count).

    Args:
        text: a non-empty string of at most 256 characters, one token per character.
        count: a name of :data:`COUNT_RULES`: which characters the gates count.
        sharpness: s, a number in [0, 50]; 0 makes every gate 1/2.
        npos_max: the table's rows (positions are clamped at ``npos_max - 1``), an int in [2, 4096].

    ValueError names an argument out of range.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty string (one token per character), e.g. 'a b  c'.")
    if len(text) > 256:
        raise ValueError(f"text must be at most 256 characters (the plots draw one cell per pair), got {len(text)}.")
    if count not in COUNT_RULES:
        raise ValueError(f"count must be one of {list(COUNT_RULES)}, got {count!r}.")
    if not isinstance(sharpness, int | float) or not 0 <= sharpness <= 50:
        raise ValueError(f"sharpness must be a number in [0, 50] (0: every gate is 1/2), got {sharpness!r}.")
    npos_max = check_int("npos_max", npos_max, 2, 4096)
    s = len(text)
    f = torch.tensor([float(COUNT_RULES[count](c)) for c in text], dtype=torch.float64)
    keys = torch.stack([f, torch.ones(s, dtype=torch.float64)], dim=-1)  # [s, 2]
    q = (math.sqrt(2) * sharpness * torch.tensor([2.0, -1.0], dtype=torch.float64)).expand(s, 2)
    layer = CoPE(npos_max, head_dim=2).double()
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    with torch.no_grad():
        gates, p = layer.positions(q[None, None], (q @ keys.T)[None, None], mask)
    i, j = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
    return {
        "tokens": list(text),
        "gates": gates[0, 0].numpy(),
        "positions": p[0, 0].numpy(),
        "token_distance": ((i - j + 1) * mask).double().numpy(),
    }
