r"""How stale post-RoPE cached keys are under a length-dependent scaling, and what it does to attention.

A cache that rotates each key once, when it enters (Hugging Face's, the ``post_rope`` policy of
``ropelab.kvcache``), keeps the key written at step :math:`L_m` (position m) in the frame of
:math:`\omega(L_m)` while the query at current length L uses :math:`\omega(L)`. The score then carries the
phase error :math:`\varepsilon_i(m, L) = m\,(\omega_i(L) - \omega_i(L_m))` on pair i (the NormXU / gante
thread, transformers issue #25104, "Dynamic NTK RoPE scaling cache inconsistency").

- :func:`stale_phase_error`: :math:`\varepsilon_i(m, L)` for every cached key and pair;
- :func:`effective_position`: the position each pair sees, :math:`m\,\omega_i(L_m)/\omega_i(L)`;
- :func:`pair_energy`: each rotary pair's mean norm, to weight the error by what the model puts there;
- :class:`DriftProbe` / :func:`drift_probe`: decode with the stale cache and measure, at every step and layer,
  the KL divergence and logit error against the consistent frame for the same queries and keys.
"""

from __future__ import annotations

import math

import torch

from .attention import grouped_scores, kl_divergence
from .core import pair_indices
from .kvcache import Frame, GrowableBuffer, RopeSchedule, RotaryKVCache, decode
from .precision import wrap_angle
from .scaling.checks import check_base, check_int
from .spec import RopeSpec

__all__ = ["write_lengths", "stale_phase_error", "effective_position", "pair_energy", "DriftProbe", "drift_probe",
           "ntk_drift"]


def write_lengths(length: int, prompt_len: int = 1) -> torch.Tensor:
    """:math:`L_m`, the length at which the key at position m entered the cache: the prompt's keys all
    enter at ``prompt_len``, each decoded key at m + 1.

    Args:
        length: L, how many keys (positions 0 .. L - 1).
        prompt_len: the prefill's length.

    Returns int64 [L].
    """
    return torch.arange(length).add(1).clamp(min=prompt_len)


def _inv_at_lengths(schedule: RopeSchedule, lengths: torch.Tensor) -> torch.Tensor:
    cache: dict[int, torch.Tensor] = {}
    rows = []
    for n in lengths.tolist():
        if n not in cache:
            cache[n] = schedule.at(n)[0]
        rows.append(cache[n])
    return torch.stack(rows)


def stale_phase_error(schedule: RopeSchedule, length: int, prompt_len: int = 1) -> torch.Tensor:
    r"""Phase error of every post-RoPE cached key against the current query's frame at length L,
    :math:`\varepsilon_i(m, L) = m\,(\omega_i(L) - \omega_i(L_m))`, shape [L, r/2] (key position, pair), float64.
    (Not wrapped: ``ropelab.precision.phase_error`` is the different, rounding error of one angle.)

    Args:
        schedule: the model's frequencies at each length (:class:`ropelab.kvcache.RopeSchedule`).
        length: the current length L; keys at positions 0 .. L - 1 are cached.
        prompt_len: the prefill's length: keys 0 .. prompt_len - 1 were all written at length ``prompt_len``.
    """
    inv_now, _ = schedule.at(length)
    inv_then = _inv_at_lengths(schedule, write_lengths(length, prompt_len))
    m = torch.arange(length, dtype=torch.float64)[:, None]
    return m * (inv_now[None, :] - inv_then)


def effective_position(schedule: RopeSchedule, length: int, prompt_len: int = 1) -> torch.Tensor:
    r"""The position each pair *sees* for an old key in the current frame, :math:`m_i^{eff} = m\,
    \omega_i(L_m) / \omega_i(L)`, shape [L, r/2]: the warp a stale key undergoes (m itself when consistent).

    Args:
        schedule: the model's frequencies at each length (:class:`ropelab.kvcache.RopeSchedule`).
        length: the current length L; keys at positions 0 .. L - 1 are cached.
        prompt_len: the prefill's length: keys 0 .. prompt_len - 1 were all written at length ``prompt_len``.
    """
    inv_now, _ = schedule.at(length)
    inv_then = _inv_at_lengths(schedule, write_lengths(length, prompt_len))
    return torch.arange(length, dtype=torch.float64)[:, None] * inv_then / inv_now[None, :]


def pair_energy(x: torch.Tensor, style: str = "half") -> torch.Tensor:
    """Mean norm of each rotary pair of ``x`` [..., d] over all leading dims, shape [d/2].

    Args:
        x: keys or queries [..., d] (every dim rotates; computed in float64).
        style: which dims form a pair: ``"half"`` or ``"interleaved"``.
    """
    a, b = pair_indices(x.shape[-1], style)
    return torch.sqrt(x[..., a].double() ** 2 + x[..., b].double() ** 2).reshape(-1, a.numel()).mean(0)


class DriftProbe(RotaryKVCache):
    """A ``post_rope`` cache that also keeps the raw keys, and at every step and layer measures what the
    consistent frame would have given for the *same* query and keys: the KL divergence
    KL(consistent || post_rope) of the last query's attention and the largest absolute logit error.

    ``kl[layer]`` and ``logit_err[layer]`` hold one value per step.

    Args:
        schedule: the model's frequencies at each length.
        n_layers: how many layers the cache holds.
    """

    def __init__(self, schedule: RopeSchedule, n_layers: int):
        super().__init__(schedule, "post_rope", n_layers)
        self.raw = [GrowableBuffer() for _ in range(n_layers)]
        self.kl: list[list[float]] = [[] for _ in range(n_layers)]
        self.logit_err: list[list[float]] = [[] for _ in range(n_layers)]

    def step(self, layer, q, k, v, positions, length):
        """The post_rope step, plus this step's KL and logit error of the last query.

        Args:
            layer: as in :meth:`ropelab.kvcache.RotaryKVCache.step`.
            q: as there.
            k: as there (also kept raw, to rotate into the consistent frame).
            v: as there.
            positions: as there.
            length: as there.
        """
        out = super().step(layer, q, k, v, positions, length)
        self.raw[layer].append(k)
        inv, af = self.schedule.at(length)
        q_rot = self.rope(q[:, :, -1:], positions[-1:], inv, af)
        s_stale = grouped_scores(q_rot, self.k[layer].view())
        s_true = grouped_scores(q_rot, self.rope_cached(self.raw[layer].view(), Frame(inv, af, length)))
        self.kl[layer].append(float(kl_divergence(s_true, s_stale).mean()))
        self.logit_err[layer].append(float((s_true - s_stale).abs().max()))
        return out


@torch.no_grad()
def drift_probe(adapter, ids: torch.Tensor, schedule: RopeSchedule, *, prompt_len: int = 1) -> DriftProbe:
    """Run post_rope (Hugging Face's) cached decoding and return the probe with per-layer, per-step KL and
    logit error of the stale frame against the consistent one.

    Args:
        adapter: a decoder adapter (:mod:`ropelab.adapters`).
        ids: token ids [b, T], fed one per step after the prefill (teacher forcing).
        schedule: the model's frequencies at each length (unbucketed: post_rope).
        prompt_len: the prefill's length, 1 .. T.
    """
    return decode(adapter, ids, schedule, "post_rope", prompt_len=prompt_len,
                  cache=DriftProbe(schedule, adapter.n_layers)).cache


def ntk_drift(length: int = 1024, head_dim: int = 64, base: float = 10000.0, original_length: int = 256,
              factor: float = 4.0) -> dict:
    r"""Dynamic NTK's stale keys at current length L (Hugging Face's ``post_rope`` cache, decoding one token
    per step from a prompt of one token).

    Returns ``phase_error`` [L, d/2] (float64, rad): key m rotated at its write length against the query's
    frame at L, :func:`ropelab.staleness.stale_phase_error` (unwrapped: it grows with m); ``wrapped``: its size
    folded onto [0, pi], the angle by which the pair's contribution to the score is actually turned;
    ``base_now`` :math:`b(L)`; and ``frac_over_half_pi``: the fraction of (key, pair) phases whose wrapped
    error exceeds :math:`\pi/2`, i.e. whose :math:`\cos\varepsilon < 0`: the pair's contribution has
    changed sign.

    Args:
        length: the current length L, an int in [1, 65536].
        head_dim: d, an even int in [2, 1024] (the whole head rotates).
        base: the base b (a finite number > 1).
        original_length: the trained context :math:`L_0` (an int >= 1), where dynamic NTK starts.
        factor: dynamic NTK's factor s, a number >= 1.

    ValueError names an argument out of range.
    """
    length = check_int("length", length, 1, 1 << 16)
    head_dim = check_int("head_dim", head_dim, 2, 1024, even=True)
    original_length = check_int("original_length", original_length, 1)
    check_base(base)
    base = float(base)
    if not isinstance(factor, int | float) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1 (dynamic NTK's scaling factor s), got {factor!r}.")
    spec = RopeSpec(base=base, scaling={"rope_type": "dynamic", "factor": float(factor)},
                    max_position_embeddings=original_length)
    sched = RopeSchedule(spec, head_dim)
    err = stale_phase_error(sched, length)
    wrapped = wrap_angle(err).abs()
    return {
        "phase_error": err.numpy(),
        "wrapped": wrapped.numpy(),
        "base_now": sched.base_at(length),
        "frac_over_half_pi": float((wrapped > math.pi / 2).double().mean()),
    }
