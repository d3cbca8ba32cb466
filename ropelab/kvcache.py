r"""Decoding with a KV cache under length-dependent RoPE scalings, with four cache policies.

With dynamic NTK scaling (``rope_type="dynamic"``) the base depends on the current length L,

.. math::  b(L) = b\,\big(s L / L_0 - (s - 1)\big)^{r/(r-2)} \quad (L > L_0),

so the frequencies :math:`\omega_i(L) = b(L)^{-2i/r}` move at every decoding step past :math:`L_0`.
Hugging Face rotates a key once, when it enters the cache, with the frequencies of *that* step; the
query at step L uses :math:`\omega(L)`. The score of query (position L - 1) and a key written at step
:math:`L_m` (position m) then carries the phase error
:math:`\varepsilon_i(m, L) = m\,(\omega_i(L) - \omega_i(L_m))` on pair i (see the NormXU / gante thread,
huggingface/transformers issue #25104, https://github.com/huggingface/transformers/issues/25104).

Policies (``POLICIES``, a registry of :class:`CachePolicy` objects by name):

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
  registers as it loads it. It lives with the kernel (``ropelab.kernels.decode_policy``) and registers
  itself when ``ropelab.kernels`` is imported; its PyTorch path runs where triton cannot.

Adding a policy is one small class: subclass :class:`CachePolicy`, set ``name``, implement ``store`` (what
enters the cache for this step's keys) and, if its cached keys are not in the current frame, ``attend``;
count any extra pass over the cached keys with ``cache.traffic.count(...)``; decorate it with
:func:`register_policy`. ``decode`` and ``RotaryKVCache`` then accept its name. What a policy needs is
declared on its class, and every caller asks the class: ``rotated`` (are cached keys stored after RoPE) and
``bucket_growth`` (the schedule it runs on, :func:`schedule_for`). No module outside this one names a policy.

The decoder is driven through a small adapter (``ropelab.adapters.TinyLMAdapter`` for ``TinyLM``,
``ropelab.adapters.HFLlamaAdapter`` for a Hugging Face ``LlamaForCausalLM``), so the same cache code runs both.
Staleness analytics (the phase error of stale keys, the drift probe) are in ``ropelab.staleness``.
Note what a KV cache means for any policy: the keys and values of *deeper* layers were computed from
hidden states of earlier steps, so only the first layer's cache equals a full forward at the current
base; the policies differ in the positional frame of the cached keys, which is what they control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

import torch

from .attention import attend, attend_scores, grouped_scores
from .core import check_positions, cos_sin, rotate
from .scaling import length_threshold, ntk_base
from .spec import RopeSpec

__all__ = [
    "POLICIES",
    "BUILTIN_POLICIES",
    "CachePolicy",
    "register_policy",
    "schedule_for",
    "PostRope",
    "Recompute",
    "Bucketed",
    "RopeOnLoad",
    "RopeSchedule",
    "KeyTraffic",
    "Frame",
    "GrowableBuffer",
    "RotaryKVCache",
    "Decoded",
    "decode",
    "full_forward",
    "run_step",
]


@dataclass(frozen=True)
class RopeSchedule:
    """The frequencies a model uses at current length L, with optional geometric buckets.

    ``spec`` is the model's RoPE, ``head_dim`` its head size. ``bucket_growth=g`` snaps every length past
    :math:`L_0` up to the next :math:`\\lceil L_0 g^k\\rceil`, so a length-dependent scaling changes only
    :math:`\\log_g(L/L_0)` times. ``angle_dtype`` is the dtype of the angles :math:`m\\,\\omega_i`.

    Args:
        spec: the model's RoPE (a :class:`ropelab.spec.RopeSpec`; anything else raises ValueError).
        head_dim: the model's head size d.
        bucket_growth: g > 1, the growth of the length buckets, or None for no buckets (the frequencies move
            at every length past :math:`L_0`). Needs the spec's ``max_position_embeddings`` (:math:`L_0`).
        angle_dtype: the dtype the angles are formed in (float64 by default; float32 mimics Hugging Face).
    """

    spec: RopeSpec
    head_dim: int
    bucket_growth: float | None = None
    angle_dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if not isinstance(self.spec, RopeSpec):
            raise ValueError(f"spec must be a ropelab.spec.RopeSpec, got {type(self.spec).__name__}.")
        if self.bucket_growth is not None and self.bucket_growth <= 1:
            raise ValueError(f"bucket_growth must be > 1 (e.g. 2 for doubling buckets), got {self.bucket_growth}.")
        if self.bucket_growth is not None and self.threshold is None:
            raise ValueError("bucket_growth needs max_position_embeddings (the length where buckets start).")

    @classmethod
    def of(cls, adapter: Any, *, bucket_growth: float | None = None, **changes: Any) -> RopeSchedule:
        """The schedule of a model behind an adapter (``adapter.rope``, ``adapter.head_dim``), with any
        RopeSpec field changed: ``RopeSchedule.of(adapter, scaling={"rope_type": "dynamic", "factor": 4.0})``.

        Args:
            adapter: a decoder adapter (:mod:`ropelab.adapters`) with ``rope`` (its RopeSpec) and ``head_dim``.
            bucket_growth: as in :class:`RopeSchedule`.
            **changes: RopeSpec fields to replace in ``adapter.rope`` (``dataclasses.replace``; an unknown
                field raises TypeError).
        """
        return cls(replace(adapter.rope, **changes), adapter.head_dim, bucket_growth)

    @property
    def style(self) -> str:
        """The spec's pairing style."""
        return self.spec.style

    @property
    def threshold(self) -> int | None:
        """:math:`L_0`: where a length-dependent scaling starts to move."""
        return length_threshold(self.spec.scaling, self.spec.max_position_embeddings)

    def effective_length(self, length: int) -> int:
        """The length whose frequencies are used at current length ``length``.

        Args:
            length: the current length L (tokens in the sequence so far).

        Returns L itself without buckets or up to :math:`L_0`; else the bucket's end
        :math:`\\lceil L_0 g^k\\rceil \\ge L`.
        """
        l0 = self.threshold
        if self.bucket_growth is None or l0 is None or length <= l0:
            return int(length)
        k = math.ceil(math.log(length / l0) / math.log(self.bucket_growth) - 1e-12)
        return int(math.ceil(l0 * self.bucket_growth**k))

    def at(self, length: int) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` at current length ``length`` (float64).

        Args:
            length: the current length L; the frequencies are those of :meth:`effective_length` (L).
        """
        return self.spec.frequencies(self.head_dim, seq_len=self.effective_length(length))

    def base_at(self, length: int) -> float:
        """Dynamic NTK's base :math:`b(L)` (the plain base for other types).

        Args:
            length: the current length L (bucketed as :meth:`effective_length` says).
        """
        if self.spec.rope_type != "dynamic":
            return self.spec.base
        r = self.spec.rotary_dim or self.head_dim
        return ntk_base(self.spec.base, r, self.effective_length(length), self.spec.max_position_embeddings,
                        float(self.spec.scaling["factor"]))


def _rope(x: torch.Tensor, positions: torch.Tensor, inv: torch.Tensor, af: float, style: str, angle_dtype):
    """RoPE on [b, h, s, d] with given frequencies (positions along s)."""
    c, s = cos_sin(positions, inv, af, dtype=torch.promote_types(x.dtype, torch.float32), angle_dtype=angle_dtype)
    return rotate(x, c[None, None], s[None, None], style=style)


class GrowableBuffer:
    """A growable [b, h, capacity, d] buffer along the sequence axis; ``view()`` is the filled part, ``n`` its
    length (capacity doubles, so appending one position at a time is amortised O(1))."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.n = 0

    def append(self, x: torch.Tensor) -> None:
        """Append x [b, h, s, d] after the filled part.

        Args:
            x: [b, h, s, d] positions to append; b, h and d must match what the buffer holds, and the first
                append sets its dtype and device.
        """
        if x.dim() != 4:
            raise ValueError(f"append takes x of shape [b, h, s, d]; got {x.dim()} dims {tuple(x.shape)}")
        b, h, s, d = x.shape
        if self.buf is not None:
            held = (self.buf.shape[0], self.buf.shape[1], self.buf.shape[3])
            if (b, h, d) != held:
                # Slice assignment below would broadcast a batch or head of 1 over the buffer without a word.
                raise ValueError(
                    f"append: x has (b, h, d) = {(b, h, d)} but the buffer holds {held}; append tensors of the "
                    "buffer's batch, heads and head dim (start a new buffer for another shape)"
                )
            if x.dtype != self.buf.dtype or x.device != self.buf.device:
                raise ValueError(
                    f"append: x is {x.dtype} on {x.device} but the buffer holds {self.buf.dtype} on "
                    f"{self.buf.device}; convert x first (x.to(...)) so nothing is cast silently"
                )
        if self.buf is None or self.n + s > self.buf.shape[2]:
            cap = max(2 * (self.buf.shape[2] if self.buf is not None else 0), self.n + s, 16)
            new = torch.empty(b, h, cap, d, dtype=x.dtype, device=x.device)
            if self.buf is not None:
                new[:, :, : self.n] = self.buf[:, :, : self.n]
            self.buf = new
        self.buf[:, :, self.n : self.n + s] = x
        self.n += s

    def view(self) -> torch.Tensor:
        """The filled part [b, h, n, d] (a view, not a copy)."""
        return self.buf[:, :, : self.n]


@dataclass
class KeyTraffic:
    """Bytes of cached keys read and written (values are the same for every policy and not counted).

    Args:
        bytes_read: bytes of cached keys read so far (starts at 0).
        bytes_written: bytes of cached keys written so far (starts at 0).
    """

    bytes_read: int = 0
    bytes_written: int = 0

    def count(self, positions_read: int, positions_written: int, bytes_per_position: int) -> None:
        """Add a pass that read and wrote that many cached key positions.

        Args:
            positions_read: how many cached key positions the pass read.
            positions_written: how many it wrote.
            bytes_per_position: the bytes of one cached position (:meth:`RotaryKVCache.key_bytes`).
        """
        self.bytes_read += positions_read * bytes_per_position
        self.bytes_written += positions_written * bytes_per_position


class Frame(NamedTuple):
    """The current step's frequencies: ``(inv_freq, attention_factor)`` at current length ``length``.

    Args:
        inv: the r/2 frequencies :math:`\\omega_i` at this step (float64), :meth:`RopeSchedule.at`'s first.
        af: the attention factor at this step (its second).
        length: the current length L they belong to (what :meth:`RotaryKVCache.rope_cached` keys its table on).
    """

    inv: torch.Tensor
    af: float
    length: int


# --------------------------------------------------------------------------------------------------
# Policies: how cached keys are stored and brought into the current frame
# --------------------------------------------------------------------------------------------------


class CachePolicy:
    """One way of caching keys under a length-dependent RoPE. Subclasses set ``name``, ``rotated``
    (whether cached keys are stored after RoPE) and ``bucket_growth`` (None: the model's own schedule, whose
    frequencies move at every step past :math:`L_0`; g: a schedule bucketed at :math:`L_0 g^k`, which
    :meth:`schedule` builds and ``decode`` insists on), implement :meth:`store`, and override :meth:`attend`
    when the stored keys are not in the current frame. Every step reads all cached keys once and writes this
    step's keys once (``RotaryKVCache.step`` counts that); a policy counts any extra pass itself."""

    name: ClassVar[str] = ""
    rotated: ClassVar[bool] = True
    bucket_growth: ClassVar[float | None] = None

    @classmethod
    def schedule(cls, spec: RopeSpec, head_dim: int, **kw: Any) -> RopeSchedule:
        """The schedule this policy runs on for a model's RoPE ``spec`` (``kw``: other ``RopeSchedule``
        fields, e.g. ``angle_dtype``).

        Args:
            spec: the model's RoPE.
            head_dim: the model's head size d.
            **kw: other :class:`RopeSchedule` fields (``angle_dtype``); ``bucket_growth`` is the policy's own.
        """
        return RopeSchedule(spec, head_dim, bucket_growth=cls.bucket_growth, **kw)

    def store(self, cache: RotaryKVCache, layer: int, k: torch.Tensor, positions: torch.Tensor,
              frame: Frame) -> torch.Tensor:
        """What enters the cache for this step's keys ``k`` (before RoPE): rotated or as they are.

        Args:
            cache: the cache being written (its ``rope`` rotates, its ``traffic`` counts extra passes).
            layer: the layer's index.
            k: this step's keys [b, hkv, s, d], before RoPE.
            positions: their positions [s].
            frame: this step's frequencies.

        Returns the [b, hkv, s, d] tensor the cache appends.
        """
        return cache.rope(k, positions, frame.inv, frame.af) if self.rotated else k

    def attend(self, cache: RotaryKVCache, layer: int, q_rot: torch.Tensor, positions: torch.Tensor,
               frame: Frame) -> torch.Tensor:
        """Attention of the rotated queries over the layer's cache (which already holds this step's keys).

        Args:
            cache: the cache to read.
            layer: the layer's index.
            q_rot: this step's queries [b, hq, s, d], rotated in ``frame``.
            positions: the queries' positions [s] (the causal mask compares them with the keys' 0 .. n - 1).
            frame: this step's frequencies.

        Returns the attention output [b, hq, s, d].
        """
        K, V = cache.k[layer], cache.v[layer]
        return attend(q_rot, K.view(), V.view(), positions, torch.arange(K.n))


POLICIES: dict[str, type[CachePolicy]] = {}


def register_policy(cls: type[CachePolicy]) -> type[CachePolicy]:
    """Class decorator: make a :class:`CachePolicy` available by its ``name`` (``POLICIES[name]``).

    Args:
        cls: a :class:`CachePolicy` subclass with a ``name`` not yet registered (ValueError otherwise); returned
            unchanged.
    """
    if not cls.name or cls.name in POLICIES:
        raise ValueError(f"a policy needs a new, non-empty name; got {cls.name!r} (taken: {sorted(POLICIES)}).")
    POLICIES[cls.name] = cls
    return cls


@register_policy
class PostRope(CachePolicy):
    """Cache rotated keys, each with the frequencies of its own step (Hugging Face; inconsistent)."""

    name = "post_rope"


@register_policy
class Recompute(CachePolicy):
    """Cache keys before RoPE; every step rotate all of them into a rotated copy (consistent; O(L))."""

    name = "recompute"
    rotated = False

    def attend(self, cache, layer, q_rot, positions, frame):
        """Rotate every cached key into the current frame (a copy), then attend.

        Args:
            cache: as in :meth:`CachePolicy.attend`.
            layer: as there.
            q_rot: as there.
            positions: as there.
            frame: as there.
        """
        K, V = cache.k[layer], cache.v[layer]
        keys = cache.rope_cached(K.view(), frame)  # the rotated copy is written, then read
        cache.traffic.count(K.n, K.n, cache.key_bytes(keys))
        return attend(q_rot, keys, V.view(), positions, torch.arange(K.n))


@register_policy
class Bucketed(CachePolicy):
    """Cache rotated keys; when the (bucketed) frequencies change, re-rotate the cached keys in place by the
    angle difference first (consistent at every step)."""

    name = "bucketed"
    bucket_growth = 2.0  # doubling buckets: log2(L / L0) re-rotations in a decode to L

    def store(self, cache, layer, k, positions, frame):
        """Re-rotate the cache in place if the frame moved, then store k rotated in the current frame.

        Args:
            cache: as in :meth:`CachePolicy.store`.
            layer: as there.
            k: as there.
            positions: as there.
            frame: as there; when its frequencies differ from the layer's cached frame, the cached keys are
                re-rotated first (:meth:`RotaryKVCache.rerotate`, counted as one read and write of each).
        """
        old = cache.frame[layer]
        n = cache.k[layer].n
        if old is not None and n and not torch.equal(old[0], frame.inv):
            cache.rerotate(layer, frame.inv, frame.af)
            cache.traffic.count(n, n, cache.key_bytes(k))
        cache.frame[layer] = (frame.inv, frame.af)
        return super().store(cache, layer, k, positions, frame)


@register_policy
class RopeOnLoad(CachePolicy):
    """Cache keys before RoPE; rotate them chunk by chunk as attention reads them, never writing them back."""

    name = "rope_on_load"
    rotated = False

    def attend(self, cache, layer, q_rot, positions, frame):
        """Scores chunk by chunk, each chunk of raw keys rotated into the current frame as it is read.

        Args:
            cache: as in :meth:`CachePolicy.attend`; its ``chunk`` is the number of keys per chunk.
            layer: as there.
            q_rot: as there.
            positions: as there.
            frame: as there.
        """
        keys, values = cache.k[layer].view(), cache.v[layer].view()
        scores = []
        for start in range(0, keys.shape[2], cache.chunk):
            kc = cache.rope_cached(keys[:, :, start : start + cache.chunk], frame, start, keys.shape[2])
            scores.append(grouped_scores(q_rot, kc))
        return attend_scores(torch.cat(scores, dim=-1), values, positions, torch.arange(keys.shape[2]))


# The four PyTorch policies above, whatever else registers later. What a study evaluates is its own explicit
# tuple (notebook 05's: ropelab.lm.CACHE_POLICIES), so a new policy joins no study by registering.
BUILTIN_POLICIES = tuple(POLICIES)


def _policy(policy: str | CachePolicy) -> CachePolicy:
    if isinstance(policy, CachePolicy):
        return policy
    if policy not in POLICIES:
        hint = " (import ropelab.kernels to register the kernel policies)" if policy.startswith("kernel_") else ""
        raise ValueError(f"policy must be one of {tuple(POLICIES)}, got {policy!r}{hint}.")
    return POLICIES[policy]()


def schedule_for(policy: str | CachePolicy, spec: RopeSpec, head_dim: int, **kw: Any) -> RopeSchedule:
    """The schedule ``policy`` (a name in ``POLICIES`` or a :class:`CachePolicy`) runs on for a model's RoPE
    ``spec`` and head size ``head_dim``: :meth:`CachePolicy.schedule` (bucketed where the policy's
    ``bucket_growth`` says so).

    Args:
        policy: a name in ``POLICIES`` (ValueError otherwise, naming them) or a :class:`CachePolicy`.
        spec: the model's RoPE.
        head_dim: the model's head size d.
        **kw: other :class:`RopeSchedule` fields (``angle_dtype``).
    """
    return _policy(policy).schedule(spec, head_dim, **kw)


# --------------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------------


class RotaryKVCache:
    """Per-layer key/value cache under one policy (a name in ``POLICIES`` or a :class:`CachePolicy`).

    ``step(layer, q, k, v, positions, length)`` takes this step's queries, keys and values *before* RoPE
    ([b, heads, s, d]; keys and values may have fewer heads: grouped-query attention), appends to the
    cache, and returns the attention output [b, q_heads, s, d]. ``traffic`` counts the bytes of cached
    keys read and written. :meth:`fill` loads keys and values directly (a benchmark's steady state).

    Args:
        schedule: the frequencies at each length (:class:`RopeSchedule`); checked at construction.
        policy: a name in ``POLICIES`` (ValueError otherwise) or a :class:`CachePolicy`.
        n_layers: how many layers the cache holds.
        chunk: keys per chunk for policies that rotate as they read (``rope_on_load``).
    """

    def __init__(self, schedule: RopeSchedule, policy: str | CachePolicy, n_layers: int, *, chunk: int = 1024):
        self.schedule, self.policy, self.chunk = schedule, _policy(policy), chunk
        self.k = [GrowableBuffer() for _ in range(n_layers)]  # rotated (policy.rotated) or raw keys
        self.v = [GrowableBuffer() for _ in range(n_layers)]
        self.frame: list[tuple[torch.Tensor, float] | None] = [None] * n_layers  # cached keys' (inv, af)
        self.traffic = KeyTraffic()
        schedule.at(schedule.threshold or 1)  # checks base and scaling values now, not at the first step
        self.rerotations = 0
        self._memo: tuple | None = None  # (length, n, cos, sin): the whole cache's table at this step

    @property
    def bytes_read(self) -> int:
        """Bytes of cached keys read so far."""
        return self.traffic.bytes_read

    @property
    def bytes_written(self) -> int:
        """Bytes of cached keys written so far."""
        return self.traffic.bytes_written

    def __len__(self) -> int:
        return self.k[0].n if self.k else 0

    @staticmethod
    def key_bytes(k: torch.Tensor) -> int:
        """Bytes per cached position of keys shaped like ``k`` [b, h, s, d].

        Args:
            k: keys [b, h, s, d]; the result is b * h * d * its element size (s does not count).
        """
        return k.element_size() * k.shape[0] * k.shape[1] * k.shape[3]

    def fill(self, layer: int, keys: torch.Tensor, values: torch.Tensor, *, frame_length: int | None = None,
             spare: int = 0) -> None:
        """Load ``keys`` and ``values`` [b, hkv, n, d] into an empty layer as the policy stores them (rotated
        keys for a rotated policy, raw keys otherwise; the caller's tensors are copied, not rotated), with
        room for ``spare`` more positions. ``frame_length``: the length whose frequencies the rotated keys
        are in (default n).

        Args:
            layer: the layer's index; it must be empty (ValueError otherwise).
            keys: [b, hkv, n, d], as the policy stores them (rotated for a rotated policy).
            values: the same shape as ``keys`` (ValueError otherwise).
            frame_length: the length L whose frequencies rotated keys are in; None: n. Unused for a policy
                that stores raw keys.
            spare: extra capacity allocated past n (positions), so that appends do not reallocate.
        """
        if self.k[layer].n or self.v[layer].n:
            raise ValueError(f"layer {layer} of the cache is not empty; fill() loads an empty layer.")
        if keys.shape != values.shape or keys.ndim != 4:
            raise ValueError(f"keys and values must have one shape [b, h, n, d], got {tuple(keys.shape)} "
                             f"and {tuple(values.shape)}.")
        b, h, n, d = keys.shape
        for store, src in ((self.k[layer], keys), (self.v[layer], values)):
            store.buf = torch.empty(b, h, n + spare, d, dtype=src.dtype, device=src.device)
            store.buf[:, :, :n] = src
            store.n = n
        if self.policy.rotated:
            self.frame[layer] = self.schedule.at(n if frame_length is None else frame_length)

    def rope(self, x: torch.Tensor, positions: torch.Tensor, inv: torch.Tensor, af: float) -> torch.Tensor:
        """RoPE on [b, h, s, d] at ``positions`` with frequencies ``inv`` and factor ``af``.

        Args:
            x: [b, h, s, d] to rotate (the schedule's style; the angles in its ``angle_dtype``).
            positions: [s] positions along s.
            inv: the r/2 frequencies.
            af: the attention factor multiplying cos and sin.

        Returns a new tensor of x's shape and dtype.
        """
        return _rope(x, positions, inv, af, self.schedule.style, self.schedule.angle_dtype)

    def rope_cached(self, keys: torch.Tensor, frame: Frame, start: int = 0, total: int | None = None) -> torch.Tensor:
        """Rotate cached keys [b, h, n, d] at positions start .. start + n - 1 into ``frame``.

        The table for all ``total`` cached positions is computed once per step and shared by the layers
        and chunks, as a model computes its cos/sin once per forward.

        Args:
            keys: cached raw keys [b, h, n, d] (before RoPE).
            frame: the frequencies to rotate them with.
            start: the position of the first of them.
            total: how many cached positions the step's table should cover (at least start + n; None: that).

        Returns the rotated keys, a new tensor.
        """
        n = start + keys.shape[2]
        total = max(n, total or 0)
        if self._memo is None or self._memo[0] != frame.length or self._memo[1] < n:
            dtype = torch.promote_types(keys.dtype, torch.float32)
            c, s = cos_sin(torch.arange(total), frame.inv, frame.af, dtype=dtype,
                           angle_dtype=self.schedule.angle_dtype)
            self._memo = (frame.length, total, c, s)
        c, s = self._memo[2][start:n], self._memo[3][start:n]
        return rotate(keys, c[None, None], s[None, None], style=self.schedule.style)

    def rerotate(self, layer: int, inv: torch.Tensor, af: float) -> None:
        r"""Move a layer's rotated keys from their frame ``self.frame[layer]`` to ``(inv, af)`` in place: a
        rotation by the angle difference :math:`m(\omega_{new} - \omega_{old})` scaled by the factor *ratio*
        (applying ``af`` itself again would scale the keys twice).

        Args:
            layer: the layer's index; its keys must be rotated (a frame recorded).
            inv: the new frequencies.
            af: the new attention factor.
        """
        old_inv, old_af = self.frame[layer]
        K = self.k[layer]
        K.buf[:, :, : K.n] = self.rope(K.view(), torch.arange(K.n), inv - old_inv, af / old_af)
        self.frame[layer] = (inv, af)
        self.rerotations += 1

    def step(self, layer: int, q, k, v, positions: torch.Tensor, length: int) -> torch.Tensor:
        """Append this step's k, v (before RoPE) to ``layer`` and return the attention output of q.

        Args:
            layer: the layer's index.
            q: this step's queries [b, hq, s, d], before RoPE.
            k: this step's keys [b, hkv, s, d], before RoPE (hkv divides hq: grouped-query attention).
            v: this step's values, k's shape.
            positions: the tokens' positions [s] (finite numbers; ValueError otherwise).
            length: the current length L, whose frequencies (:meth:`RopeSchedule.at`) this step uses.

        Returns the attention output [b, hq, s, d].
        """
        positions = check_positions(positions, "positions")
        inv, af = self.schedule.at(length)
        frame = Frame(inv, af, length)
        q_rot = self.rope(q, positions, inv, af)
        self.k[layer].append(self.policy.store(self, layer, k, positions, frame))
        self.v[layer].append(v)
        esize = self.key_bytes(k)
        self.traffic.count(self.k[layer].n, k.shape[2], esize)  # write this step's keys, read all cached
        return self.policy.attend(self, layer, q_rot, positions, frame)


# --------------------------------------------------------------------------------------------------
# Drivers
# --------------------------------------------------------------------------------------------------


def run_step(adapter, cache: RotaryKVCache, ids: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """One forward of tokens ``ids`` at ``positions`` through every layer of ``adapter``, attending through
    ``cache`` at current length ``length``; returns the logits.

    Args:
        adapter: a decoder adapter (:mod:`ropelab.adapters`): ``embed``, ``layer_qkv``, ``layer_out``, ``head``,
            ``n_layers``.
        cache: the cache every layer attends through (and appends to).
        ids: token ids [b, s].
        positions: their positions [s].
        length: the current length L (after these tokens), whose frequencies the step uses.

    Returns the logits [b, s, vocab].
    """
    h = adapter.embed(ids)
    for i in range(adapter.n_layers):
        q, k, v = adapter.layer_qkv(i, h)
        h = adapter.layer_out(i, h, cache.step(i, q, k, v, positions, length))
    return adapter.head(h)


class Decoded(NamedTuple):
    """What :func:`decode` returns: the logits [b, T, vocab] and the cache (byte counters, re-rotations).

    Args:
        logits: [b, T, vocab], the logits at every position as cached decoding computed them.
        cache: the cache after the last step.
    """

    logits: torch.Tensor
    cache: RotaryKVCache


@torch.no_grad()
def decode(adapter, ids: torch.Tensor, schedule: RopeSchedule, policy: str | CachePolicy, *,
           prompt_len: int = 1, cache: RotaryKVCache | None = None) -> Decoded:
    """Teacher-forced cached decoding: a prefill of ``prompt_len`` tokens, then one token per step.

    Returns :class:`Decoded`: the logits at every position, as generation would see them, and the cache.
    ``cache`` may be given (a subclass that measures something, e.g. ``ropelab.staleness.DriftProbe``).

    Args:
        adapter: a decoder adapter (:mod:`ropelab.adapters`).
        ids: token ids [b, T]; token t is fed at step t whatever the model predicted (teacher forcing).
        schedule: the frequencies at each length; a policy with ``bucket_growth`` needs a bucketed one
            (ValueError otherwise, saying how to build it: :func:`schedule_for`).
        policy: a name in ``POLICIES`` or a :class:`CachePolicy`.
        prompt_len: how many tokens the prefill takes at once, 1 .. T (ValueError otherwise).
        cache: an empty cache of this policy and schedule to decode into (ValueError otherwise); None: a new
            :class:`RotaryKVCache`.
    """
    if not 1 <= prompt_len <= ids.shape[1]:
        raise ValueError(f"prompt_len must be in 1..{ids.shape[1]}, got {prompt_len}.")
    pol = _policy(policy)
    if pol.bucket_growth is not None and schedule.bucket_growth is None:
        raise ValueError(
            f"policy {pol.name!r} needs a bucketed schedule: schedule_for({pol.name!r}, spec, head_dim), or "
            f"RopeSchedule(..., bucket_growth={pol.bucket_growth:g}) (RopeSchedule.of(adapter, bucket_growth="
            f"{pol.bucket_growth:g})); without buckets it would re-rotate at every step."
        )
    if cache is None:
        cache = RotaryKVCache(schedule, policy, adapter.n_layers)
    elif cache.policy.name != pol.name or cache.schedule != schedule or len(cache):
        raise ValueError("the cache given to decode must be empty and have this policy and schedule.")
    out = [run_step(adapter, cache, ids[:, :prompt_len], torch.arange(prompt_len), prompt_len)]
    for t in range(prompt_len, ids.shape[1]):
        out.append(run_step(adapter, cache, ids[:, t : t + 1], torch.tensor([t]), t + 1))
    return Decoded(torch.cat(out, dim=1), cache)


@torch.no_grad()
def full_forward(adapter, ids: torch.Tensor, schedule: RopeSchedule, *, length: int | None = None) -> torch.Tensor:
    """One forward over the whole sequence with the frequencies of ``length`` (default: its length), as a
    perplexity evaluation does.

    Args:
        adapter: a decoder adapter (:mod:`ropelab.adapters`).
        ids: token ids [b, n].
        schedule: the frequencies at each length.
        length: the length L whose frequencies are used; None: n.

    Returns the logits [b, n, vocab].
    """
    n = ids.shape[1]
    cache = RotaryKVCache(schedule, "recompute", adapter.n_layers)
    return run_step(adapter, cache, ids, torch.arange(n), n if length is None else length)
