r"""Decoding with a KV cache under length-dependent RoPE scalings, with four cache policies.

With dynamic NTK scaling (``rope_type="dynamic"``) the base depends on the current length L,

.. math::  b(L) = b\,\big(s L / L_0 - (s - 1)\big)^{r/(r-2)} \quad (L > L_0),

so the frequencies :math:`\omega_i(L) = b(L)^{-2i/r}` move at every decoding step past :math:`L_0`.
Hugging Face rotates a key once, when it enters the cache, with the frequencies of *that* step; the
query at step L uses :math:`\omega(L)`. The score of query (position L - 1) and a key written at step
:math:`L_m` (position m) then carries the phase error
:math:`\varepsilon_i(m, L) = m\,(\omega_i(L) - \omega_i(L_m))` on pair i (see the NormXU / gante thread,
transformers issue #25104; ``shared/seeds/dynamic-ntk-cache-inconsistency.txt``).

Policies (``POLICIES``, and ``KERNEL_POLICIES``):

- ``post_rope``: cache rotated keys, each with the frequencies of its own step (Hugging Face; inconsistent).
- ``recompute``: cache keys before RoPE; at every step rotate all of them with :math:`\omega(L)` into a
  rotated copy (consistent; O(L) extra reads and writes per step).
- ``bucketed``: the schedule only changes at geometric length buckets :math:`L_0 g^k`
  (:class:`RopeSchedule` with ``bucket_growth=g``): cache rotated keys, and at a bucket boundary
  re-rotate the cached keys in place by the *difference* of angles, a pure rotation
  :math:`R(m(\omega_{new} - \omega_{old}))` (consistent at every step; amortised O(1) keys per step).
- ``rope_on_load``: cache keys before RoPE and rotate them chunk by chunk as attention reads them,
  never writing them back (consistent; reads like ``post_rope``, pays the rotation arithmetic).
- ``kernel_rope_on_load``: the same cache, attended by the Triton decode kernel that rotates each key in
  registers as it loads it (``ropelab.kernels.decode_policy``; its PyTorch path where triton cannot run).

The decoder is driven through a small adapter (:class:`TinyLMAdapter` for ``ropelab.models.TinyLM``,
:class:`HFLlamaAdapter` for a Hugging Face ``LlamaForCausalLM``), so the same cache code runs both.
Note what a KV cache means for any policy: the keys and values of *deeper* layers were computed from
hidden states of earlier steps, so only the first layer's cache equals a full forward at the current
base; the policies differ in the positional frame of the cached keys, which is what they control.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .attention import kl_divergence
from .core import check_style, cos_sin, pair_indices, rotate
from .scaling import frequencies, ntk_base

__all__ = [
    "POLICIES",
    "KERNEL_POLICIES",
    "RopeSchedule",
    "RotaryKVCache",
    "TinyLMAdapter",
    "HFLlamaAdapter",
    "decode",
    "full_forward",
    "phase_error",
    "effective_position",
    "pair_energy",
    "write_lengths",
    "DriftProbe",
    "drift_probe",
]

POLICIES = ("post_rope", "recompute", "bucketed", "rope_on_load")
KERNEL_POLICIES = ("kernel_rope_on_load",)  # on the Triton decode kernel (ropelab.kernels.decode_policy)


@dataclass
class RopeSchedule:
    """The frequencies a model uses at current length L, with optional geometric buckets.

    ``bucket_growth=g`` snaps every length past :math:`L_0` up to the next :math:`\\lceil L_0 g^k\\rceil`,
    so a length-dependent scaling changes only :math:`\\log_g(L/L_0)` times.
    """

    head_dim: int
    base: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int | None = None
    rotary_dim: int | None = None
    style: str = "half"
    bucket_growth: float | None = None
    angle_dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        check_style(self.style)
        if self.bucket_growth is not None and self.bucket_growth <= 1:
            raise ValueError(f"bucket_growth must be > 1 (e.g. 2 for doubling buckets), got {self.bucket_growth}.")
        if self.bucket_growth is not None and self.threshold is None:
            raise ValueError("bucket_growth needs max_position_embeddings (the length where buckets start).")

    @property
    def threshold(self) -> int | None:
        """:math:`L_0`: where a length-dependent scaling starts to move."""
        sc = self.rope_scaling or {}
        if sc.get("rope_type", sc.get("type")) == "longrope":
            return sc.get("original_max_position_embeddings") or self.max_position_embeddings
        return self.max_position_embeddings

    def effective_length(self, length: int) -> int:
        """The length whose frequencies are used at current length ``length``."""
        l0 = self.threshold
        if self.bucket_growth is None or l0 is None or length <= l0:
            return int(length)
        k = math.ceil(math.log(length / l0) / math.log(self.bucket_growth) - 1e-12)
        return int(math.ceil(l0 * self.bucket_growth**k))

    def at(self, length: int) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` at current length ``length`` (float64)."""
        return frequencies(
            self.head_dim,
            self.base,
            rotary_dim=self.rotary_dim,
            rope_scaling=self.rope_scaling,
            seq_len=self.effective_length(length),
            max_position_embeddings=self.max_position_embeddings,
        )

    def base_at(self, length: int) -> float:
        """Dynamic NTK's base :math:`b(L)` (the plain base for other types)."""
        sc = self.rope_scaling or {}
        if sc.get("rope_type", sc.get("type")) != "dynamic":
            return float(sc.get("rope_theta", self.base))
        r = self.rotary_dim or self.head_dim
        return ntk_base(sc.get("rope_theta", self.base), r, self.effective_length(length),
                        self.max_position_embeddings, float(sc["factor"]))


def write_lengths(length: int, prompt_len: int = 1) -> torch.Tensor:
    """:math:`L_m`, the length at which the key at position m entered the cache: the prompt's keys all
    enter at ``prompt_len``, each decoded key at m + 1."""
    return torch.arange(length).add(1).clamp(min=prompt_len)


def _inv_at_lengths(schedule: RopeSchedule, lengths: torch.Tensor) -> torch.Tensor:
    cache: dict[int, torch.Tensor] = {}
    rows = []
    for n in lengths.tolist():
        if n not in cache:
            cache[n] = schedule.at(n)[0]
        rows.append(cache[n])
    return torch.stack(rows)


def phase_error(schedule: RopeSchedule, length: int, prompt_len: int = 1) -> torch.Tensor:
    r"""Phase error of every post-RoPE cached key against the current query's frame at length L,
    :math:`\varepsilon_i(m, L) = m\,(\omega_i(L) - \omega_i(L_m))`, shape [L, r/2] (key position, pair), float64."""
    inv_now, _ = schedule.at(length)
    inv_then = _inv_at_lengths(schedule, write_lengths(length, prompt_len))
    m = torch.arange(length, dtype=torch.float64)[:, None]
    return m * (inv_now[None, :] - inv_then)


def effective_position(schedule: RopeSchedule, length: int, prompt_len: int = 1) -> torch.Tensor:
    r"""The position each pair *sees* for an old key in the current frame, :math:`m_i^{eff} = m\,
    \omega_i(L_m) / \omega_i(L)`, shape [L, r/2]: the warp a stale key undergoes (m itself when consistent)."""
    inv_now, _ = schedule.at(length)
    inv_then = _inv_at_lengths(schedule, write_lengths(length, prompt_len))
    return torch.arange(length, dtype=torch.float64)[:, None] * inv_then / inv_now[None, :]


def pair_energy(x: torch.Tensor, style: str = "half") -> torch.Tensor:
    """Mean norm of each rotary pair of ``x`` [..., d] over all leading dims, shape [d/2]."""
    a, b = pair_indices(x.shape[-1], style)
    return torch.sqrt(x[..., a].double() ** 2 + x[..., b].double() ** 2).reshape(-1, a.numel()).mean(0)


def _rope(x: torch.Tensor, positions: torch.Tensor, inv: torch.Tensor, af: float, style: str, angle_dtype):
    """RoPE on [b, h, s, d] with given frequencies (positions along s)."""
    c, s = cos_sin(positions, inv, af, dtype=torch.promote_types(x.dtype, torch.float32), angle_dtype=angle_dtype)
    return rotate(x, c[None, None], s[None, None], style=style)


class _Store:
    """A growable [b, h, capacity, d] buffer; ``view()`` is the filled part."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.n = 0

    def append(self, x: torch.Tensor) -> None:
        b, h, s, d = x.shape
        if self.buf is None or self.n + s > self.buf.shape[2]:
            cap = max(2 * (self.buf.shape[2] if self.buf is not None else 0), self.n + s, 16)
            new = torch.empty(b, h, cap, d, dtype=x.dtype, device=x.device)
            if self.buf is not None:
                new[:, :, : self.n] = self.buf[:, :, : self.n]
            self.buf = new
        self.buf[:, :, self.n : self.n + s] = x
        self.n += s

    def view(self) -> torch.Tensor:
        return self.buf[:, :, : self.n]


class RotaryKVCache:
    """Per-layer key/value cache for one of the four ``POLICIES``.

    ``step(layer, q, k, v, positions, length)`` takes this step's queries, keys and values *before* RoPE
    ([b, heads, s, d]; keys and values may have fewer heads: grouped-query attention), appends to the
    cache, and returns the attention output [b, q_heads, s, d]. ``bytes_read`` / ``bytes_written`` count
    the traffic to the cached keys (values are the same for every policy and not counted).
    """

    def __init__(self, schedule: RopeSchedule, policy: str, n_layers: int, *, chunk: int = 1024):
        if policy not in POLICIES + KERNEL_POLICIES:
            raise ValueError(f"policy must be one of {POLICIES + KERNEL_POLICIES}, got {policy!r}.")
        self.schedule, self.policy, self.chunk = schedule, policy, chunk
        self.k = [_Store() for _ in range(n_layers)]  # rotated (post_rope, bucketed) or raw keys
        self.v = [_Store() for _ in range(n_layers)]
        self.frame: list[tuple[torch.Tensor, float] | None] = [None] * n_layers  # bucketed: cached keys' (inv, af)
        self.bytes_read = 0
        self.bytes_written = 0
        self.rerotations = 0
        self._memo: tuple | None = None  # (length, n, cos, sin): the whole cache's table at this step

    def _rope(self, x, positions, inv, af):
        return _rope(x, positions, inv, af, self.schedule.style, self.schedule.angle_dtype)

    def _rope_all(self, keys, length, inv, af, start: int = 0, total: int | None = None):
        """Rotate cached keys [b, h, n, d] at positions start .. start + n - 1 into the frame of ``length``.

        The table for all ``total`` cached positions is computed once per step and shared by the layers
        and chunks, as a model computes its cos/sin once per forward."""
        n = start + keys.shape[2]
        total = max(n, total or 0)
        if self._memo is None or self._memo[0] != length or self._memo[1] < n:
            dtype = torch.promote_types(keys.dtype, torch.float32)
            c, s = cos_sin(torch.arange(total), inv, af, dtype=dtype, angle_dtype=self.schedule.angle_dtype)
            self._memo = (length, total, c, s)
        c, s = self._memo[2][start:n], self._memo[3][start:n]
        return rotate(keys, c[None, None], s[None, None], style=self.schedule.style)

    def rerotate(self, layer: int, inv: torch.Tensor, af: float) -> None:
        r"""Move a layer's rotated keys from their frame ``self.frame[layer]`` to ``(inv, af)`` in place: a
        rotation by the angle difference :math:`m(\omega_{new} - \omega_{old})` scaled by the factor *ratio*
        (applying ``af`` itself again would scale the keys twice)."""
        old_inv, old_af = self.frame[layer]
        K = self.k[layer]
        K.buf[:, :, : K.n] = self._rope(K.view(), torch.arange(K.n), inv - old_inv, af / old_af)
        self.frame[layer] = (inv, af)
        self.rerotations += 1

    def step(self, layer: int, q, k, v, positions: torch.Tensor, length: int) -> torch.Tensor:
        inv, af = self.schedule.at(length)
        K, V = self.k[layer], self.v[layer]
        esize = k.element_size() * k.shape[0] * k.shape[1] * k.shape[3]  # bytes per cached position
        q_rot = self._rope(q, positions, inv, af)
        if self.policy == "post_rope":
            K.append(self._rope(k, positions, inv, af))
        elif self.policy == "bucketed":
            frame = self.frame[layer]
            if frame is not None and K.n and not torch.equal(frame[0], inv):
                self.rerotate(layer, inv, af)
                self.bytes_read += K.n * esize
                self.bytes_written += K.n * esize
            self.frame[layer] = (inv, af)
            K.append(self._rope(k, positions, inv, af))
        else:
            K.append(k)
        self.bytes_written += k.shape[2] * esize
        V.append(v)
        keys, values = K.view(), V.view()
        key_pos = torch.arange(K.n)
        if self.policy == "recompute":
            keys = self._rope_all(keys, length, inv, af)  # the rotated copy is written, then read
            self.bytes_read += K.n * esize
            self.bytes_written += K.n * esize
        if self.policy == "rope_on_load":
            self.bytes_read += K.n * esize
            return self._attend_chunked(q_rot, keys, values, positions, key_pos, length, inv, af)
        if self.policy == "kernel_rope_on_load":
            from .kernels.decode_policy import kernel_attend  # the kernels sit below kvcache: imported on use

            self.bytes_read += K.n * esize
            return kernel_attend(q_rot, keys, values, positions, inv, af, self.schedule.style)
        self.bytes_read += K.n * esize
        return attend(q_rot, keys, values, positions, key_pos)

    def _attend_chunked(self, q, keys, values, q_pos, key_pos, length, inv, af):
        """Attention that rotates raw keys chunk by chunk as it reads them (never stored rotated)."""
        scores = []
        for start in range(0, keys.shape[2], self.chunk):
            kc = self._rope_all(keys[:, :, start : start + self.chunk], length, inv, af, start, keys.shape[2])
            scores.append(_scores(q, kc))
        return _softmax_out(torch.cat(scores, dim=-1), values, q_pos, key_pos)


def _group(q: torch.Tensor, n_kv: int) -> torch.Tensor:
    b, hq, s, d = q.shape
    if hq % n_kv:
        raise ValueError(f"query heads {hq} must be a multiple of key/value heads {n_kv}.")
    return q.view(b, n_kv, hq // n_kv, s, d)


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[b, hkv, g, s, n] scores of grouped queries against keys [b, hkv, n, d], scaled by 1/sqrt(d)."""
    return torch.einsum("bhgsd,bhnd->bhgsn", _group(q, k.shape[1]), k) / math.sqrt(q.shape[-1])


def _softmax_out(scores, values, q_pos, key_pos):
    # causal: a query sees keys at or before its position (positions may live on the host, scores on a GPU)
    mask = (key_pos[None, :] <= q_pos[:, None]).to(scores.device)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhgsn,bhnd->bhgsd", probs, values)
    b, hkv, g, s, d = out.shape
    return out.reshape(b, hkv * g, s, d)


def attend(q, keys, values, q_pos, key_pos) -> torch.Tensor:
    """Causal softmax attention of rotated queries [b, hq, s, d] over rotated keys [b, hkv, n, d]."""
    return _softmax_out(_scores(q, keys), values, q_pos, key_pos)


# --------------------------------------------------------------------------------------------------
# Adapters and drivers
# --------------------------------------------------------------------------------------------------


class DriftProbe(RotaryKVCache):
    """A ``post_rope`` cache that also keeps the raw keys, and at every step and layer measures what the
    consistent frame would have given for the *same* query and keys: the KL divergence
    KL(consistent || post_rope) of the last query's attention and the largest absolute logit error."""

    def __init__(self, schedule: RopeSchedule, n_layers: int):
        super().__init__(schedule, "post_rope", n_layers)
        self.raw = [_Store() for _ in range(n_layers)]
        self.kl: list[list[float]] = [[] for _ in range(n_layers)]
        self.logit_err: list[list[float]] = [[] for _ in range(n_layers)]

    def step(self, layer, q, k, v, positions, length):
        out = super().step(layer, q, k, v, positions, length)
        self.raw[layer].append(k)
        inv, af = self.schedule.at(length)
        q_rot = self._rope(q[:, :, -1:], positions[-1:], inv, af)
        s_stale = _scores(q_rot, self.k[layer].view())
        s_true = _scores(q_rot, self._rope_all(self.raw[layer].view(), length, inv, af))
        self.kl[layer].append(float(kl_divergence(s_true, s_stale).mean()))
        self.logit_err[layer].append(float((s_true - s_stale).abs().max()))
        return out


@torch.no_grad()
def drift_probe(adapter, ids: torch.Tensor, schedule: RopeSchedule, *, prompt_len: int = 1) -> DriftProbe:
    """Run post_rope (Hugging Face's) cached decoding and return the probe with per-layer, per-step KL and
    logit error of the stale frame against the consistent one."""
    probe = DriftProbe(schedule, adapter.n_layers)
    _run(adapter, probe, ids[:, :prompt_len], torch.arange(prompt_len), prompt_len)
    for t in range(prompt_len, ids.shape[1]):
        _run(adapter, probe, ids[:, t : t + 1], torch.tensor([t]), t + 1)
    return probe


class TinyLMAdapter:
    """Drive a ``ropelab.models.TinyLM`` (pe='rope') layer by layer."""

    def __init__(self, model):
        if model.cfg.pe != "rope":
            raise ValueError(f"TinyLMAdapter needs a model with pe='rope', got {model.cfg.pe!r}.")
        self.model, self.cfg = model, model.cfg
        self.n_layers = model.cfg.n_layers

    def schedule(self, **overrides) -> RopeSchedule:
        cfg = self.cfg
        kw = dict(head_dim=cfg.head_dim, base=cfg.rope_base, rope_scaling=cfg.rope_scaling,
                  max_position_embeddings=cfg.max_position_embeddings, style=cfg.rope_style)
        kw.update(overrides)
        return RopeSchedule(**kw)

    def embed(self, ids):
        return self.model.embed(ids)

    def layer_qkv(self, i, h):
        block = self.model.blocks[i]
        return block.attn.project(block.ln1(h))

    def layer_out(self, i, h, attn):
        block = self.model.blocks[i]
        h = h + block.attn.merge(attn)
        return h + block.mlp(block.ln2(h))

    def head(self, h):
        return self.model.logits(h)


class HFLlamaAdapter:
    """Drive a Hugging Face ``LlamaForCausalLM`` layer by layer (weights used as they are)."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.n_layers = model.config.num_hidden_layers
        self.head_dim = getattr(model.config, "head_dim", None) or (
            model.config.hidden_size // model.config.num_attention_heads
        )

    def schedule(self, **overrides) -> RopeSchedule:
        params = dict(self.config.rope_parameters)
        kw = dict(head_dim=self.head_dim, base=params.get("rope_theta", 10000.0), rope_scaling=params,
                  max_position_embeddings=self.config.max_position_embeddings, style="half")
        kw.update(overrides)
        return RopeSchedule(**kw)

    def embed(self, ids):
        return self.model.model.embed_tokens(ids)

    def layer_qkv(self, i, h):
        layer = self.model.model.layers[i]
        x = layer.input_layernorm(h)
        b, s, _ = x.shape
        att = layer.self_attn

        def proj(p):
            return p(x).view(b, s, -1, self.head_dim).transpose(1, 2)

        return proj(att.q_proj), proj(att.k_proj), proj(att.v_proj)

    def layer_out(self, i, h, attn):
        layer = self.model.model.layers[i]
        b, _, s, _ = attn.shape
        h = h + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head(self, h):
        return self.model.lm_head(self.model.model.norm(h))


def _run(adapter, cache: RotaryKVCache, ids: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    h = adapter.embed(ids)
    for i in range(adapter.n_layers):
        q, k, v = adapter.layer_qkv(i, h)
        h = adapter.layer_out(i, h, cache.step(i, q, k, v, positions, length))
    return adapter.head(h)


@torch.no_grad()
def decode(adapter, ids: torch.Tensor, schedule: RopeSchedule, policy: str, *, prompt_len: int = 1,
           return_cache: bool = False):
    """Teacher-forced cached decoding: a prefill of ``prompt_len`` tokens, then one token per step.

    Returns the logits [b, T, vocab] at every position, as generation would see them (and the cache with
    its byte counters when ``return_cache``).
    """
    if not 1 <= prompt_len <= ids.shape[1]:
        raise ValueError(f"prompt_len must be in 1..{ids.shape[1]}, got {prompt_len}.")
    if policy == "bucketed" and schedule.bucket_growth is None:
        raise ValueError(
            "policy 'bucketed' needs a bucketed schedule: RopeSchedule(..., bucket_growth=2.0) (or "
            "adapter.schedule(bucket_growth=2.0)); without buckets it would re-rotate at every step."
        )
    cache = RotaryKVCache(schedule, policy, adapter.n_layers)
    out = [_run(adapter, cache, ids[:, :prompt_len], torch.arange(prompt_len), prompt_len)]
    for t in range(prompt_len, ids.shape[1]):
        out.append(_run(adapter, cache, ids[:, t : t + 1], torch.tensor([t]), t + 1))
    logits = torch.cat(out, dim=1)
    return (logits, cache) if return_cache else logits


@torch.no_grad()
def full_forward(adapter, ids: torch.Tensor, schedule: RopeSchedule, *, length: int | None = None) -> torch.Tensor:
    """One forward over the whole sequence with the frequencies of ``length`` (default: its length), as a
    perplexity evaluation does."""
    n = ids.shape[1]
    cache = RotaryKVCache(schedule, "recompute", adapter.n_layers)
    return _run(adapter, cache, ids, torch.arange(n), n if length is None else length)
