"""Fused RoPE kernels, a decode-attention kernel that applies RoPE as it loads keys, and the byte model they
are measured against (the benchmarks themselves are in :mod:`ropelab.bench`).

- :mod:`ropelab.kernels.rope_triton`: the Triton program (math and memory access only);
- :mod:`ropelab.kernels.fused_rope`: its launch, ``autograd.Function`` and the checks only the kernel needs
  (positions, offsets and ``cu_seqlens`` are checked by :func:`ropelab.core.check_position_args`); :func:`rope`
  is the entry point, ``ropelab.apply_rope(..., backend="triton")`` the same kernel behind the usual API;
- :mod:`ropelab.kernels.cpu_rope`: the C/OpenMP CPU kernel (``cpu_rope.c``) behind ``apply_rope``'s default
  ``backend="auto"`` on a CPU, built and cached by :mod:`ropelab.kernels.cpu_build`; its tables come from
  :mod:`ropelab.kernels.tables` (a small LRU cache by positions' content) and its large outputs from
  :mod:`ropelab.kernels.cpu_buffers` (a pool that a freed result hands back);
- :mod:`ropelab.kernels.compiled`: ``backend="compile"``, ``torch.compile`` of one single-pass formula
  (the CPU path at the memory floor);
- :mod:`ropelab.kernels.qk_norm_rope`: QK-RMSNorm + RoPE + the KV-cache write as one op (``ropelab.qk_norm_rope``):
  its checks, the torch reference, ``torch.compile`` of it, the C/OpenMP CPU kernel (``cpu_qk_norm_rope.c``,
  built by :mod:`ropelab.kernels.cpu_build`) and the launch of :mod:`ropelab.kernels.qk_norm_rope_triton`;
- :mod:`ropelab.kernels.traffic`: the bytes each implementation moves, counted op by op (a model);
- :mod:`ropelab.kernels.decode_attention`: flash-decoding attention for one query token per sequence that
  rotates pre-RoPE cached keys as it loads them (modes ``post_rope`` and ``rope_on_load``): the Triton programs
  and their launcher; :mod:`ropelab.kernels.decode_reference` holds its checks, PyTorch path, float64 oracle
  and error bound;
- :mod:`ropelab.kernels.decode_policy`: the ``kernel_rope_on_load`` policy of :mod:`ropelab.kvcache`
  built on it (registered when this package is imported).

Importing this package never needs triton; :func:`rope` and :func:`decode_attention` say clearly when the
kernel cannot run (the decode kernel falls back to its PyTorch path with ``backend="auto"``).
"""

from . import decode_policy  # noqa: F401 - registers the kernel_rope_on_load cache policy
from .decode_attention import MODES, decode_attention, decode_attention_oracle, kernel_available
from .fused_rope import as_bshd, available, rope, why_unavailable

__all__ = ["rope", "available", "why_unavailable", "as_bshd", "MODES", "decode_attention",
           "decode_attention_oracle", "kernel_available"]

