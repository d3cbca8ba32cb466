"""GPU kernels (Triton), each with a PyTorch path that runs anywhere.

``decode_attention``: flash-decoding attention for one query token per sequence that rotates pre-RoPE
cached keys as it loads them (``ropelab.kernels.decode_attention``); the KV-cache policy built on it is in
``ropelab.kernels.decode_policy``, its GPU benchmark in ``ropelab.kernels.decode_bench``.
Importing this package never imports triton's kernels eagerly: they are jitted on first use.
"""

from .decode_attention import MODES, decode_attention, decode_attention_oracle, kernel_available

__all__ = ["MODES", "decode_attention", "decode_attention_oracle", "kernel_available"]
