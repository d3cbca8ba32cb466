"""What a rope dict's values may hold (the kinds a key holds) and the checks of single numbers: the base, the
rotary dim, a value against its kind. Nothing here knows a rope type; ``registry`` applies them per type."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["POSITIVE", "NONNEGATIVE", "FRACTION", "POSITIVE_LIST", "FLAG", "KINDS", "COMMON_KEYS", "check_base",
           "check_rotary_dim", "check_int", "is_real", "value_ok"]

# What a key holds. A value of None is refused unless the record lists the key as ``nullable``: transformers
# reads most keys with ``.get(key, default)`` or ``[key]``, where an explicit None crashes its compute.
POSITIVE = "a finite number > 0"
NONNEGATIVE = "a finite number >= 0"  # 0 means "not set": transformers tests these keys for truth
FRACTION = "a number in (0, 1]"
POSITIVE_LIST = "a list of finite numbers > 0"
FLAG = "True or False"
KINDS = (POSITIVE, NONNEGATIVE, FRACTION, POSITIVE_LIST, FLAG)

# Keys every type reads in a v5 rope_parameters dict: the base and the partial rotary factor
# (transformers' _check_received_keys adds partial_rotary_factor to every type's optional keys).
COMMON_KEYS: Mapping[str, str] = types.MappingProxyType({"rope_theta": POSITIVE, "partial_rotary_factor": FRACTION})


def check_rotary_dim(rotary_dim: int, head_dim: int) -> None:
    """Raise ValueError unless 0 < rotary_dim <= head_dim and rotary_dim is even.

    Args:
        rotary_dim: r, how many leading dims of each head rotate (a positive even int).
        head_dim: d, the size of each head, the largest r allowed.
    """
    if not isinstance(rotary_dim, int) or rotary_dim <= 0:
        raise ValueError(f"rotary_dim must be a positive int, got {rotary_dim!r}.")
    if rotary_dim % 2:
        raise ValueError(
            f"rotary_dim must be even (RoPE rotates pairs of dims), got {rotary_dim}; use {rotary_dim - 1} "
            f"or {rotary_dim + 1}."
        )
    if rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim={rotary_dim} is larger than the head dim {head_dim}; it must be at most {head_dim} "
            "(dims past rotary_dim pass through unrotated)."
        )


def is_real(v: Any) -> bool:
    """A real number: an int or float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_base(base: Any) -> None:
    """Raise ValueError naming ``base`` unless it is a finite real number > 1.

    Args:
        base: RoPE's base (``rope_theta``): an int or float (not a bool), or a one-element tensor.
    """
    if not is_real(base) and not (isinstance(base, torch.Tensor) and base.numel() == 1):
        raise ValueError(
            f"base must be > 1, a number (RoPE's rope_theta, usually 10000), got {type(base).__name__} {base!r}."
        )
    if not (math.isfinite(float(base)) and float(base) > 1):
        raise ValueError(f"base must be > 1 and finite (RoPE's rope_theta, usually 10000), got {float(base)}.")


def value_ok(kind: str, v: Any) -> bool:
    """Whether ``v`` is what a key of ``kind`` holds."""
    if kind == FLAG:
        return isinstance(v, bool)
    if kind == POSITIVE_LIST:
        return (isinstance(v, Sequence) and not isinstance(v, (str, bytes)) and len(v) > 0
                and all(value_ok(POSITIVE, f) for f in v))
    if not is_real(v) or not math.isfinite(v):
        return False
    if kind == NONNEGATIVE:
        return v >= 0
    return v > 0 and (kind != FRACTION or v <= 1)


def check_int(name: str, value, low: int, high: int | None = None, even: bool = False) -> int:
    """``value`` as an int, or a ValueError naming ``name``: an int (not a bool) in [low, high] (``high`` None:
    no upper bound), even when ``even``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low or (high and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {span}, got {value!r}.")
    if even and value % 2:
        raise ValueError(f"{name} must be even (RoPE rotates pairs of dims), got {value}.")
    return int(value)
