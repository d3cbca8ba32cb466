r"""A small cache of RoPE tables: the float32 cos/sin of one (spec, positions, angle dtype), formed once.

:func:`cached_tables` returns :func:`ropelab.core.cos_sin`'s tables, angles in ``angle_dtype`` (float64 by
default) rounded once to float32, of shape ``positions.shape + [r/2]``, and keeps the last :data:`MAX_ENTRIES`
of them (least recently used out). A model calls RoPE with the same positions for q and k and for every layer:
the float64 trigonometry runs once, not per call.

Keyed safely: by the spec (frozen, hashable), the head dim, the current length of a length-dependent scaling,
the angle dtype, and the positions' device, dtype, shape and *content* (their bytes), so a positions tensor
mutated in place never gets the old tables back. Reading the content costs a copy of the positions (8 bytes a
token: 32 KiB at 4096 tokens, against the 4 MiB of one [32, 4096, 128] head tensor in float32). The returned
tables are shared between callers: read them, never write them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..core import cos_sin

__all__ = ["MAX_ENTRIES", "cached_tables", "cached_tables_for", "cached_frequencies", "clear", "cache_info"]

MAX_ENTRIES = 16
_TABLES: OrderedDict = OrderedDict()
_FREQS: OrderedDict = OrderedDict()
_STATS = {"hits": 0, "misses": 0}


def cached_frequencies(spec, head_dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """``spec.frequencies(head_dim, seq_len=seq_len)``, kept (a spec is frozen: the same inputs, the same
    float64 frequencies)."""
    key = (spec, head_dim, seq_len)
    hit = _FREQS.get(key)
    if hit is None:
        hit = _FREQS[key] = spec.frequencies(head_dim, seq_len=seq_len)
        if len(_FREQS) > MAX_ENTRIES:
            _FREQS.popitem(last=False)
    else:
        _FREQS.move_to_end(key)
    return hit


def cached_tables(spec, head_dim: int, p: torch.Tensor, seq_len: int | None,
                  angle_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 cos and sin ``p.shape + [r/2]`` for ``spec`` at positions ``p`` (module docstring), from the
    cache when these positions (by content) were seen with these settings."""
    return _entry(spec, head_dim, p, seq_len, angle_dtype)[:2]


def _entry(spec, head_dim: int, p: torch.Tensor, seq_len: int | None, angle_dtype: torch.dtype) -> tuple:
    # the bytes, whatever the dtype (numpy has no bfloat16: view them as uint8)
    content = p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    key = (spec, head_dim, seq_len, angle_dtype, p.device, p.dtype, tuple(p.shape), content)
    hit = _TABLES.get(key)
    if hit is not None:
        _TABLES.move_to_end(key)
        _STATS["hits"] += 1
        return hit
    _STATS["misses"] += 1
    inv_freq, attention_factor = cached_frequencies(spec, head_dim, seq_len)
    cos, sin = cos_sin(p, inv_freq, attention_factor, dtype=torch.float32, angle_dtype=angle_dtype)
    hit = _TABLES[key] = (cos.contiguous(), sin.contiguous(), {})
    if len(_TABLES) > MAX_ENTRIES:
        _TABLES.popitem(last=False)
    return hit


def cached_tables_for(spec, x: torch.Tensor, layout, p: torch.Tensor, p_axes: tuple[str, ...],
                      seq_len: int | None,
                      angle_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cached_tables` shaped for ``x.movedim(d, -1)`` by :func:`ropelab.core.tables_for` (views of the
    cached tables, kept with them per layout and x's sizes)."""
    from ..core import tables_for

    cos, sin, shaped = _entry(spec, x.shape[layout.index("d")], p, seq_len, angle_dtype)
    key = (layout.axes, p_axes, tuple(x.shape))
    hit = shaped.get(key)
    if hit is None:
        hit = shaped[key] = tables_for(x, layout, cos, sin, p_axes)
    return hit


def clear() -> None:
    """Empty the caches (tables and frequencies) and reset the hit counts."""
    _TABLES.clear()
    _FREQS.clear()
    _STATS.update(hits=0, misses=0)


def cache_info() -> dict:
    """``hits``, ``misses`` and the number of ``entries`` held (at most :data:`MAX_ENTRIES`)."""
    return {**_STATS, "entries": len(_TABLES)}
