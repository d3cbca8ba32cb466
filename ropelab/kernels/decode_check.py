"""Correctness of the decode kernel at model sizes on a GPU, without pytest (the GPU machine may lack it).

    python -m ropelab.kernels.decode_check        (exit status 1 if any case leaves its bound)

Each case compares ``decode_attention`` (backend="triton") with the float64 oracle within ``error_bound``
(derived from the dtypes), at Llama-3-8B heads (32 q / 8 kv, d = 128) and 4k-128k cached tokens, both modes,
both styles, fp32 / fp16 / bf16, partial rotary, other head dims and groupings, dynamic NTK frequencies. The
interpreter tests (tests/test_decode_kernel.py) cover the same features at toy sizes on CPU.
"""

from __future__ import annotations

import sys

import torch

from ..scaling import frequencies
from .decode_attention import MODES, decode_attention, decode_attention_oracle, error_bound, kernel_available


def _case(name, batch, hq, hkv, d, rotary_dim, lengths, dtype, mode, style, device, seed=0) -> tuple[str, float]:
    g = torch.Generator(device=device).manual_seed(seed)
    cap = max(lengths)
    q = torch.randn(batch, hq, d, generator=g, device=device).to(dtype)
    k = torch.randn(batch, hkv, cap, d, generator=g, device=device).to(dtype)
    v = torch.randn(batch, hkv, cap, d, generator=g, device=device).to(dtype)
    L = torch.tensor(lengths)
    inv, af = frequencies(d, base=500000.0, rotary_dim=rotary_dim, rope_scaling={"rope_type": "dynamic", "factor": 8.0},
                          seq_len=cap, max_position_embeddings=4096)
    kw = dict(mode=mode, style=style, inv_freq=inv if mode == "rope_on_load" else None, attention_factor=af)
    if mode == "post_rope":
        kw.pop("attention_factor")
    got = decode_attention(q, k, v, L, backend="triton", **kw)
    ref = decode_attention_oracle(q, k, v, L, **kw)
    bound = error_bound(q, k, v, L, **kw)
    return name, float(((got.double() - ref).abs() / bound).max())


def cases(device: str = "cuda"):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for mode in MODES:
            for style in ("half", "interleaved"):
                yield (f"{str(dtype)[6:]:8s} {mode:12s} {style:11s} 32/8 d128 L=1,4095,32768", 3, 32, 8, 128, 128,
                       [1, 4095, 32768], dtype, mode, style, device)
    for d, r in ((64, 64), (80, 80), (96, 48), (256, 256), (128, 64)):
        yield (f"bfloat16 rope_on_load half        32/8 d{d} r{r} L=8192,100", 2, 32, 8, d, r, [8192, 100],
               torch.bfloat16, "rope_on_load", "half", device)
    for hq, hkv in ((32, 32), (28, 4), (64, 1)):
        yield (f"bfloat16 rope_on_load interleaved {hq}/{hkv} d128 L=5000", 1, hq, hkv, 128, 128, [5000],
               torch.bfloat16, "rope_on_load", "interleaved", device)
    yield ("bfloat16 rope_on_load half        32/8 d128 L=131072 (batch 2)", 2, 32, 8, 128, 128, [131072, 131072],
           torch.bfloat16, "rope_on_load", "half", device)


def main() -> int:
    reason = kernel_available()
    if reason or not torch.cuda.is_available():
        print(f"decode_check needs a CUDA GPU with triton: {reason or 'no CUDA device'}")
        return 1
    worst = 0.0
    for args in cases():
        name, ratio = _case(*args)
        worst = max(worst, ratio)
        print(f"{'ok  ' if ratio < 1 else 'FAIL'} {name:62s} max |kernel - oracle| / bound = {ratio:.3g}")
    print(f"worst ratio {worst:.3g}: {'all within the derived bounds' if worst < 1 else 'SOME CASES LEFT THEIR BOUND'}")
    return 0 if worst < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
