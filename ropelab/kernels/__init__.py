"""Fused RoPE kernels and what they are measured against.

- :mod:`ropelab.kernels.rope_triton`: the Triton program (math and memory access only);
- :mod:`ropelab.kernels.fused_rope`: its checks, launch and ``autograd.Function``; :func:`rope` is the entry
  point, ``ropelab.apply_rope(..., backend="triton")`` the same kernel behind the usual API;
- :mod:`ropelab.kernels.compiled`: ``backend="compile"``, ``torch.compile`` of one single-pass formula
  (the CPU path at the memory floor);
- :mod:`ropelab.kernels.traffic`: the bytes each implementation moves, counted op by op (a model);
- :mod:`ropelab.kernels.bench_gpu`: ``python -m ropelab.bench gpu``.

Importing this package never needs triton; :func:`rope` says clearly when it cannot run.
"""

from .fused_rope import as_bshd, available, rope, why_unavailable

__all__ = ["rope", "available", "why_unavailable", "as_bshd"]
