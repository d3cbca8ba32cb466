r"""The ``kernel_rope_on_load`` KV-cache policy: pre-RoPE keys, rotated on load by the Triton decode kernel.

``ropelab.kvcache.RotaryKVCache`` stores this policy's keys before RoPE (as for ``rope_on_load``) and hands
the attention to :func:`kernel_attend`, which maps the step's queries onto
:func:`ropelab.kernels.decode_attention.decode_attention` in mode ``rope_on_load`` with the current
step's frequencies :math:`\omega(L)` and attention factor a. The query at position p is one kernel row that
reads the cache row of its sequence with length p + 1, so a prefill of s tokens (causal) and a decode step
(s = 1) are the same call. On a machine where the kernel cannot run (no triton, or a CPU without
``TRITON_INTERPRET=1``) the launcher's PyTorch path computes the same attention.
"""

from __future__ import annotations

import torch

from ..kvcache import CachePolicy, register_policy
from .decode_attention import decode_attention

__all__ = ["KERNEL_POLICIES", "KernelRopeOnLoad", "kernel_attend"]


def kernel_attend(q_rot: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor,
                  inv_freq: torch.Tensor, attention_factor: float, style: str, *,
                  backend: str = "auto") -> torch.Tensor:
    """Causal attention of rotated queries [b, H_q, s, d] (at positions ``q_pos`` [s]) over pre-RoPE keys and
    values [b, H_kv, n, d] at positions 0 .. n - 1, rotating the keys with ``(inv_freq, attention_factor)``
    as they load. Returns [b, H_q, s, d] in the values' dtype."""
    b, hq, s, d = q_rot.shape
    n = keys.shape[2]
    if q_pos.shape != (s,):
        raise ValueError(f"q_pos must hold one position per query token, shape [{s}], got {tuple(q_pos.shape)}.")
    if s and int(q_pos.max()) >= n:
        top = int(q_pos.max())
        raise ValueError(f"a query at position {top} needs {top + 1} cached keys, the cache has {n}.")
    q_rows = q_rot.permute(0, 2, 1, 3).reshape(b * s, hq, d)
    # rows and lengths stay on the host: the launcher validates them there without a device sync
    rows = torch.arange(b).repeat_interleave(s)
    lengths = (q_pos.cpu() + 1).repeat(b)
    out = decode_attention(q_rows, keys, values, lengths, rows=rows, mode="rope_on_load", inv_freq=inv_freq,
                           attention_factor=attention_factor, style=style, backend=backend)
    return out.view(b, s, hq, d).permute(0, 2, 1, 3)


@register_policy
class KernelRopeOnLoad(CachePolicy):
    """Cache keys before RoPE; the Triton decode kernel rotates each one with the current frequencies as it
    loads it (consistent, never written back). Traffic: one read of every cached key, like ``post_rope``."""

    name = "kernel_rope_on_load"
    rotated = False

    def attend(self, cache, layer, q_rot, positions, frame):
        """The kernel over the layer's raw keys, rotated on load into ``frame``."""
        keys, values = cache.k[layer].view(), cache.v[layer].view()
        return kernel_attend(q_rot, keys, values, positions, frame.inv, frame.af, cache.schedule.style)


KERNEL_POLICIES = (KernelRopeOnLoad.name,)  # the cache policies that run on a kernel of this package
