r"""MLX's RoPE in ropelab's terms: ``mlx.core.fast.rope``'s arguments and mlx-lm's rope modules <-> :class:`RopeSpec`.

``mx.fast.rope(x, dims, *, traditional, base, scale, offset, freqs)`` rotates the first ``dims`` dims of the
last axis of ``x`` (``(B, *, T, D)``) at positions :math:`\text{scale}\,(\text{offset} + t)`. Measured on mlx
0.32.4 (``tests/test_engines_mlx.py`` asserts each):

- ``traditional=True`` pairs (2i, 2i + 1) (ropelab's ``"interleaved"``); ``False`` pairs (i, i + dims/2) (``"half"``);
- with ``base`` the frequencies are :math:`\omega_i = \text{base}^{-2i/\text{dims}}`;
- ``freqs`` are *periods* :math:`1/\omega_i` (one per pair), not ``inv_freq``: an infinite period is a pair that
  does not turn; exactly one of ``base`` and ``freqs`` is None;
- ``scale`` multiplies the positions, so ``scale = 1/s`` is linear interpolation by s.

mlx-lm (0.32.2) builds every layer's rope with ``mlx_lm.models.rope_utils.initialize_rope`` or a model's own
choice of its classes. What each is in ropelab's terms (:func:`spec_from_mlx_rope`):

============================  =========================================================================
``mlx.nn.RoPE``               default (``scale == 1``) or linear (factor ``1/scale``); also mlx-lm's ``mrope``
                              (the sections dropped: exact for text, where every axis has the same position)
``DynamicNTKScalingRoPE``     dynamic (its ``base``, ``factor``, ``max_position_embeddings``)
``Llama3RoPE``                llama3, periods in ``_freqs``
``YarnRoPE``                  yarn (also ``deepseek_yarn``, ``telechat3-yarn``); ``mscale`` multiplies
                              ``x[..., :dims]`` before the rotation (ropelab's attention_factor)
``SuScaledRoPE``              longrope (and Phi-3's ``su``) with **long_factor at every length**: its
                              ``short_factor`` is never used; ``_scale`` is the attention factor; always "half"
``ProportionalRoPE``          proportional (infinite periods for the pairs that do not turn)
``smollm3.NoPE``              a layer without RoPE (``RopeSpec.nope()``)
============================  =========================================================================

Not expressible on one side:

- by one ``fast.rope`` call (:func:`fast_rope_kwargs` raises): an attention factor other than 1 (yarn, longrope;
  mlx-lm multiplies ``x`` first), the length-dependent types (dynamic, longrope) without a ``seq_len``, a layer
  without RoPE, multi-axis RoPE (M-RoPE, vision); a rotary slice that is not the leading dims;
- in mlx-lm's classes: longrope's switch to ``short_factor`` below the original length, and an interleaved longrope
  (SuScaledRoPE is always ``"half"``); yarn's ``truncate=False`` and ``attention_factor`` keys (YarnRoPE always
  floors/ceils and derives its input scale from ``mscale`` / ``mscale_all_dim``); M-RoPE's sections (mlx-lm's
  ``mrope`` is a 1D ``nn.RoPE``; ropelab's sections live in :mod:`ropelab.multiaxis`);
- in ropelab: nothing of what mlx-lm's classes compute (each is one of its rope types; an input scale is the
  attention factor), except ``Llama3RoPE``'s defaults for keys a config leaves out, which live in its body and
  cannot be read: such a config is a :class:`ReadError` naming the pair that differs.

Measured disagreements between mlx-lm 0.32.2 and transformers on the same ``config.json`` (the tests assert each):
Phi-3's longrope below the original length (long_factor everywhere); yarn with ``mscale`` but no
``mscale_all_dim`` (mlx-lm scales by 0.1 mscale ln s + 1, transformers by 0.1 ln s + 1); yarn without
``original_max_position_embeddings`` (mlx-lm 4096, transformers ``max_position_embeddings``); DeepSeek-V3's
``rope_interleave: false`` (mlx-lm rotates interleaved pairs always); Llama configs written by transformers 5
(``rope_parameters``: mlx-lm's llama, qwen2 and gemma3_text read ``rope_theta`` / ``rope_scaling`` /
``rope_local_base_freq`` only, so they run their own default bases, unscaled; its qwen3 reads ``rope_parameters``);
Qwen2's ``head_dim`` (mlx-lm takes ``hidden_size // num_attention_heads``).

:func:`read_mlx` builds the mlx-lm model from ``config.json`` as ``mlx_lm.utils.load_model`` does
(``_get_classes``, ``ModelArgs.from_dict``, ``Model(args)``; no weights: MLX arrays are lazy) and reads every
layer's rope module, so the :class:`Reading` is mlx-lm's interpretation of the config. Each module's spec is
built from its attributes and the config's rope keys, then *checked* against the module's own frequency array
(float32 bounds): a spec that does not reproduce mlx-lm's frequencies is a :class:`ReadError`, never a guess.

Arrays cross between torch and MLX in :func:`to_mx` and :func:`to_torch` only (:func:`torch_callable` wraps an
MLX function for ``ropelab.diagnose``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..precision import UNIT_ROUNDOFF
from ..scaling import LENGTH_DEPENDENT
from ..spec import RopeSpec
from .reading import ReadError, Reading, class_runs

__all__ = [
    "to_mx",
    "to_torch",
    "torch_callable",
    "is_mlx_function",
    "fast_rope_kwargs",
    "spec_from_fast_rope",
    "spec_from_mlx_rope",
    "mlx_rope_from_spec",
    "MLX_LM_ROPE_CLASSES",
    "yarn_defaults",
    "read_mlx",
    "is_mlx_model_dir",
]

_U32 = UNIT_ROUNDOFF[torch.float32]
# The mlx-lm rope classes read_mlx maps (rope_utils' classes; nn.RoPE is mlx's own; NoPE is SmolLM3's no-op).
MLX_LM_ROPE_CLASSES = ("RoPE", "DynamicNTKScalingRoPE", "Llama3RoPE", "YarnRoPE", "SuScaledRoPE", "ProportionalRoPE",
                       "NoPE")
# The config keys that say something about RoPE (copied into Reading.declared; a key mlx-lm's ModelArgs does not
# take is named in Reading.notes).
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "rotary_dim", "rotary_pct",
              "head_dim", "qk_rope_head_dim", "rope_local_base_freq", "layer_types", "sliding_window_pattern",
              "no_rope_layers", "no_rope_layer_interval", "rope_interleave", "rope_traditional",
              "max_position_embeddings")


def _mlx():
    try:
        import mlx.core as mx
    except ImportError as e:  # pragma: no cover - the engines extra installs it on Linux and macOS arm64
        raise ImportError('MLX is not installed: pip install "ropelab[engines]" (mlx[cpu] on Linux, mlx on macOS '
                          "arm64).") from e
    return mx


# --------------------------------------------------------------------------------------------------
# The array boundary: the only place torch tensors and mx.arrays convert
# --------------------------------------------------------------------------------------------------

_TORCH_TO_MX = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.bool: "bool_"}


def to_mx(t: torch.Tensor):
    """The torch tensor as an ``mx.array`` of the same dtype and values (bfloat16 through float32, exactly)."""
    mx = _mlx()
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"to_mx takes a torch.Tensor, got {type(t).__name__}.")
    if t.dtype not in _TORCH_TO_MX:
        raise ValueError(f"to_mx: dtype {t.dtype} has no MLX counterpart here (one of {list(_TORCH_TO_MX)}).")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every bfloat16 value
        return mx.array(t.float().numpy(), dtype=mx.float32).astype(mx.bfloat16)
    # mx.array(numpy float64) would give float32 unless told: the dtype is passed explicitly.
    return mx.array(t.contiguous().numpy(), dtype=getattr(mx, _TORCH_TO_MX[t.dtype]))


def to_torch(a) -> torch.Tensor:
    """The ``mx.array`` as a torch tensor of the same dtype and values (a copy)."""
    mx = _mlx()
    if not isinstance(a, mx.array):
        raise ValueError(f"to_torch takes an mx.array, got {type(a).__name__}.")
    if a.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(a.astype(mx.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def is_mlx_function(fn: Any) -> bool:
    """True when ``fn`` (a function, a ``functools.partial`` of one, or a module instance) is defined in MLX or
    mlx-lm: ``diagnose`` then converts its arrays at the boundary."""
    for _ in range(8):  # unwrap partials
        inner = getattr(fn, "func", None)
        if inner is None or inner is fn:
            break
        fn = inner
    module = getattr(fn, "__module__", None) or type(fn).__module__ or ""
    if not isinstance(module, str) or module in ("builtins", ""):
        module = type(fn).__module__
    return module.split(".")[0] in ("mlx", "mlx_lm")


def torch_callable(fn: Callable) -> Callable:
    """``fn`` (mx.array -> mx.array) as a torch function: tensor arguments go in through :func:`to_mx`, an
    ``mx.array`` result comes out through :func:`to_torch` (anything else is returned as it is, for the caller
    to refuse)."""
    mx = _mlx()

    def wrapped(*args):
        y = fn(*[to_mx(a) if isinstance(a, torch.Tensor) else a for a in args])
        return to_torch(y) if isinstance(y, mx.array) else y

    wrapped.__name__ = wrapped.__qualname__ = getattr(fn, "__qualname__", None) or type(fn).__name__
    return wrapped


# --------------------------------------------------------------------------------------------------
# mx.fast.rope <-> RopeSpec
# --------------------------------------------------------------------------------------------------


def _check_head_dim(head_dim: Any) -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}.")
    return head_dim


def _periods_tolerance(base: float) -> float:
    """Relative error of a float32 period base**(2i/d) (the exponent's rounding amplified by ln(base)) and of the
    ladder arithmetic around it, with room: 16 (ln(base) + 4) u32 (about 1e-5 at base 1e4)."""
    return 16 * (math.log(max(base, math.e)) + 4) * _U32


def fast_rope_kwargs(spec: RopeSpec, head_dim: int, *, seq_len: int | None = None) -> dict:
    """The keyword arguments of ``mx.fast.rope`` (``dims``, ``traditional``, ``base``, ``scale``, ``freqs``) that
    rotate like ``apply_rope(x, spec=spec)`` on a head of ``head_dim`` dims; ``offset`` is the caller's.

    default is ``base``; linear is ``base`` with ``scale = 1/factor``; llama3, yarn, longrope, proportional and
    dynamic are ``freqs`` (periods :math:`1/\\omega_i` in float32, infinite where a pair does not turn).

    Raises ValueError for what one call cannot express: a NoPE spec, an attention factor other than 1 (yarn,
    longrope: multiply ``x[..., :dims]`` by it first, as mlx-lm does), a length-dependent type (dynamic,
    longrope) without ``seq_len`` (the current length that fixes its frequencies).
    """
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec must be a ropelab.RopeSpec, got {type(spec).__name__}.")
    head_dim = _check_head_dim(head_dim)
    if spec.is_nope:
        raise ValueError("spec is a layer without RoPE (RopeSpec.nope()): mx.fast.rope always rotates; do not call "
                         "it for this layer.")
    rope_type = spec.rope_type
    if rope_type in LENGTH_DEPENDENT and seq_len is None:
        raise ValueError(f"rope_type {rope_type!r} depends on the current length and fast.rope's frequencies are "
                         "fixed per call: pass seq_len= (the length the call runs at).")
    dims = spec.rotary_dim or head_dim
    if dims > head_dim:
        raise ValueError(f"spec.rotary_dim={dims} exceeds head_dim={head_dim}.")
    inv, attention_factor = spec.frequencies(head_dim, seq_len=seq_len)
    if abs(attention_factor - 1.0) > 0:
        raise ValueError(f"rope_type {rope_type!r} scales cos and sin by attention_factor={attention_factor:.6g}, "
                         "which mx.fast.rope cannot (it has no output scale): multiply x[..., :dims] by it before "
                         "the call, as mlx-lm's YarnRoPE and SuScaledRoPE do, and pass the kwargs of the spec with "
                         "scaling={..., 'attention_factor': 1.0}.")
    kwargs = {"dims": dims, "traditional": spec.style == "interleaved", "base": None, "scale": 1.0, "freqs": None}
    if rope_type == "default":
        kwargs["base"] = spec.base
    elif rope_type == "linear":
        kwargs["base"], kwargs["scale"] = spec.base, 1.0 / float(spec.scaling["factor"])
    else:
        with np.errstate(divide="ignore"):
            periods = 1.0 / inv.numpy()  # float64; 1/0 = inf: the pair does not turn
        kwargs["freqs"] = to_mx(torch.from_numpy(periods.astype(np.float32)))
    return kwargs


def _as_periods(freqs: Any) -> torch.Tensor:
    if isinstance(freqs, torch.Tensor):
        return freqs.detach().double()
    mx = _mlx()
    if isinstance(freqs, mx.array):
        return to_torch(freqs.astype(mx.float32) if freqs.dtype == mx.bfloat16 else freqs).double()
    return torch.as_tensor(np.asarray(freqs, dtype=np.float64))


def _ladder_mismatch(inv_measured: torch.Tensor, inv_spec: torch.Tensor, tol: float) -> tuple[int, float] | None:
    """(pair, relative difference) of the worst pair when the two inverse-frequency ladders differ by more than
    ``tol`` relative (a pair that does not turn must not turn in both), else None."""
    if inv_measured.shape != inv_spec.shape:
        return -1, math.inf
    zero_m, zero_s = inv_measured == 0, inv_spec == 0
    if bool((zero_m != zero_s).any()):
        return int(torch.nonzero(zero_m != zero_s)[0]), math.inf
    rel = ((inv_measured - inv_spec).abs() / inv_spec.abs().clamp_min(1e-300)).masked_fill(zero_s, 0.0)
    worst = int(rel.argmax())
    return (worst, float(rel[worst])) if float(rel[worst]) > tol else None


def spec_from_fast_rope(dims: int, traditional: bool, base: float | None, scale: float, freqs: Any,
                        head_dim: int, *, rope_parameters: Mapping[str, Any] | None = None,
                        max_position_embeddings: int | None = None, seq_len: int | None = None) -> RopeSpec:
    """The :class:`RopeSpec` of ``mx.fast.rope(x, dims, traditional=, base=, scale=, freqs=)`` on a head of
    ``head_dim`` dims (the inverse of :func:`fast_rope_kwargs`).

    With ``base``: default, or linear with factor ``1/scale``. With ``freqs`` (periods): a geometric ladder
    :math:`p_i = c\\,b^{2i/\\text{dims}}` is read as default / linear (factor ``c/scale``) with base b; any other
    ladder (llama3, yarn, longrope, proportional) needs ``rope_parameters``, a rope dict with ``rope_theta`` and
    the type's keys (``RopeSpec.from_rope_dict``), which is checked against the periods (float32 bounds) at
    ``seq_len``: a dict that does not reproduce them raises.
    """
    head_dim = _check_head_dim(head_dim)
    if isinstance(dims, bool) or not isinstance(dims, int) or dims <= 0 or dims % 2 or dims > head_dim:
        raise ValueError(f"dims must be a positive even int <= head_dim={head_dim}, got {dims!r}.")
    if not isinstance(traditional, bool):
        raise ValueError(f"traditional must be a bool, got {traditional!r}.")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"scale must be a positive finite number (it multiplies the positions), got {scale!r}.")
    if (base is None) == (freqs is None):
        raise ValueError("exactly one of base and freqs must be given (mx.fast.rope's rule); got "
                         f"{'neither' if base is None else 'both'}.")
    style = "interleaved" if traditional else "half"
    rotary_dim = None if dims == head_dim else dims
    scale = float(scale)
    if freqs is None:
        if rope_parameters is not None:
            raise ValueError("rope_parameters checks a freqs ladder; with base= the call is default or linear.")
        scaling = None if scale == 1.0 else {"rope_type": "linear", "factor": 1.0 / scale}
        return RopeSpec(style=style, base=float(base), rotary_dim=rotary_dim, scaling=scaling,
                        max_position_embeddings=max_position_embeddings)
    periods = _as_periods(freqs)
    if periods.ndim != 1 or periods.numel() != dims // 2:
        raise ValueError(f"freqs must hold dims/2 = {dims // 2} periods, got shape {list(periods.shape)}.")
    if not bool((periods > 0).all()):
        raise ValueError("freqs must be positive periods 1/omega (mx.fast.rope takes periods, not inv_freq).")
    inv_measured = scale / periods  # 0 where the period is infinite
    if rope_parameters is None:
        if not bool(torch.isfinite(periods).all()) or periods.numel() < 2:
            raise ValueError("freqs with an infinite period (or one pair) is not a geometric ladder; pass "
                             "rope_parameters= (e.g. the proportional dict with rope_theta) to check it.")
        c = float(periods[0])
        b = float(periods[-1] / periods[0]) ** (dims / (2 * (periods.numel() - 1)))
        if not b > 1:
            raise ValueError(f"freqs fit a base of {b:.6g} (<= 1): periods must grow along the pairs.")
        factor = c / scale
        scaling = None if abs(factor - 1.0) <= _periods_tolerance(b) else {"rope_type": "linear", "factor": factor}
        spec = RopeSpec(style=style, base=b, rotary_dim=rotary_dim, scaling=scaling,
                        max_position_embeddings=max_position_embeddings)
        what = "freqs is not a geometric ladder c * base**(2i/dims) (a llama3, yarn or longrope ladder?)"
        fix = "pass rope_parameters= (the rope dict with rope_theta) and ropelab checks the periods against it"
    else:
        spec = RopeSpec.from_rope_dict(rope_parameters, head_dim=head_dim, style=style,
                                       max_position_embeddings=max_position_embeddings)
        if (spec.rotary_dim or head_dim) != dims:
            raise ValueError(f"rope_parameters rotate {spec.rotary_dim or head_dim} dims, the call rotates {dims}.")
        what = f"rope_parameters {dict(rope_parameters)} do not give these periods"
        fix = "fix the dict (a key the engine reads differently, or a default it fills in)"
    inv_spec, _ = spec.frequencies(head_dim, seq_len=seq_len)
    bad = _ladder_mismatch(inv_measured, inv_spec, _periods_tolerance(spec.base))
    if bad is not None:
        raise ValueError(f"{what}: pair {bad[0]} differs by {bad[1]:.3g} relative; {fix}.")
    return spec


# --------------------------------------------------------------------------------------------------
# mlx-lm's rope modules -> RopeSpec
# --------------------------------------------------------------------------------------------------


def _rope_dict(scaling_config: Mapping[str, Any] | None, base: float) -> dict:
    """A v5-style rope dict from an mlx-lm scaling config (v4 ``rope_scaling``, ``type`` or ``rope_type``)."""
    d = {k: v for k, v in dict(scaling_config or {}).items() if k not in ("type", "rope_type")}
    rope_type = (scaling_config or {}).get("type") or (scaling_config or {}).get("rope_type", "default")
    return {"rope_type": rope_type, **d, "rope_theta": float(base)}


def _scaling_keys(d: dict, rope_type: str) -> dict:
    from ..scaling import ROPE_TYPES, SCALING_KEYS

    keep = set(SCALING_KEYS[rope_type]) | {"rope_theta"} | ({"partial_rotary_factor"} if not
                                                         ROPE_TYPES[rope_type].whole_head else set())
    return {k: v for k, v in d.items() if k in keep or k == "rope_type"}


def yarn_defaults(cls: type | None = None) -> dict:
    """The defaults mlx-lm's ``YarnRoPE`` takes for the yarn keys a config leaves out (read from its signature:
    ``original_max_position_embeddings`` 4096 in mlx-lm 0.32.2, where transformers takes
    ``max_position_embeddings``)."""
    if cls is None:
        from mlx_lm.models.rope_utils import YarnRoPE as cls
    params = inspect.signature(cls).parameters
    return {k: params[k].default for k in ("original_max_position_embeddings", "beta_fast", "beta_slow")
            if k in params and params[k].default is not inspect.Parameter.empty}


def spec_from_mlx_rope(module: Any, *, head_dim: int, base: float | None = None,
                       scaling_config: Mapping[str, Any] | None = None,
                       max_position_embeddings: int | None = None) -> RopeSpec:
    """The :class:`RopeSpec` of one mlx-lm rope module (see the module docstring's table), read from its
    attributes; ``base`` and ``scaling_config`` (the config's ``rope_theta`` and ``rope_scaling`` as the model
    handed them to ``initialize_rope``) name the type's parameters where the module keeps only its periods
    (``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE``, ``ProportionalRoPE``), and the spec is checked against those
    periods and the module's input scale: a disagreement raises ValueError naming it."""
    head_dim = _check_head_dim(head_dim)
    name = type(module).__name__
    if name == "NoPE":
        return RopeSpec.nope(max_position_embeddings)
    if name == "RoPE":
        return spec_from_fast_rope(int(module.dims), bool(module.traditional), float(module.base),
                                   float(module.scale), None, head_dim, max_position_embeddings=max_position_embeddings)
    if name == "DynamicNTKScalingRoPE":
        dims = int(module.dims)
        return RopeSpec(style="interleaved" if module.traditional else "half", base=float(module.base),
                        rotary_dim=None if dims == head_dim else dims,
                        scaling={"rope_type": "dynamic", "factor": float(module.factor)},
                        max_position_embeddings=int(module.max_position_embeddings))
    if name not in ("Llama3RoPE", "YarnRoPE", "SuScaledRoPE", "ProportionalRoPE"):
        raise ValueError(f"mlx-lm rope class {type(module).__module__}.{name} is not one ropelab maps "
                         f"({', '.join(MLX_LM_ROPE_CLASSES)}).")
    if base is None:
        raise ValueError(f"{name} keeps only its periods: pass base= (the config's rope_theta as mlx-lm read it).")
    d = _rope_dict(scaling_config, base)
    if name == "SuScaledRoPE":
        dims, traditional, input_scale = int(module.dim), False, float(module._scale)
        # mlx-lm applies long_factor at every length: the spec says so with short_factor = long_factor.
        d = {**d, "rope_type": "longrope", "short_factor": list(d.get("long_factor", [])),
             "original_max_position_embeddings": int(module.original_max_position_embeddings)}
    else:
        dims, traditional = int(module.dims), bool(module.traditional)
        input_scale = float(getattr(module, "mscale", 1.0))
    if name == "Llama3RoPE":
        d["rope_type"] = "llama3"
    elif name == "YarnRoPE":
        d["rope_type"] = "yarn"  # also deepseek_yarn, telechat3-yarn: one class
        # initialize_rope passes only the keys the config has; YarnRoPE's own defaults fill the rest.
        d = {**yarn_defaults(type(module)), **d}
    elif name == "ProportionalRoPE":
        d["rope_type"] = "proportional"
    d = _scaling_keys(d, d["rope_type"])
    if d["rope_type"] != "proportional" and dims != head_dim:
        d["partial_rotary_factor"] = dims / head_dim
    spec = spec_from_fast_rope(dims, traditional, None, 1.0, module._freqs, head_dim, rope_parameters=d,
                               max_position_embeddings=max_position_embeddings, seq_len=None)
    _, attention_factor = spec.frequencies(head_dim)
    if abs(attention_factor - input_scale) > 8 * _U32 * max(1.0, input_scale):
        # The module's own input scale is the truth (mlx-lm's mscale / long_mscale rule); say it explicitly.
        spec = spec_from_fast_rope(dims, traditional, None, 1.0, module._freqs, head_dim,
                                   rope_parameters={**d, "attention_factor": input_scale},
                                   max_position_embeddings=max_position_embeddings)
    return spec


def mlx_rope_from_spec(spec: RopeSpec, head_dim: int, *, max_position_embeddings: int | None = None):
    """The mlx-lm rope module for ``spec`` on a head of ``head_dim`` dims: ``initialize_rope(dims, base,
    traditional, scaling_config, max_position_embeddings)`` with the spec's settings, checked to compute what the
    spec computes (frequencies and attention factor at length 1, the trained length and four times it). Raises
    ValueError naming what mlx-lm's class does instead, for what it cannot express (a NoPE layer; longrope's short
    factors or an interleaved longrope; a yarn ``attention_factor`` or ``truncate=False`` it does not read)."""
    if not isinstance(spec, RopeSpec):
        raise ValueError(f"spec must be a ropelab.RopeSpec, got {type(spec).__name__}.")
    head_dim = _check_head_dim(head_dim)
    if spec.is_nope:
        raise ValueError("spec is a layer without RoPE: mlx-lm has no rope module for it (SmolLM3 swaps in a no-op).")
    from mlx_lm.models.rope_utils import initialize_rope

    from ..scaling import ROPE_TYPES

    rope_type = spec.rope_type
    dims = head_dim if rope_type != "default" and ROPE_TYPES[rope_type].whole_head else spec.rotary_dim or head_dim
    scaling = None if spec.scaling is None else dict(spec.scaling)
    max_pos = spec.max_position_embeddings or max_position_embeddings
    try:
        module = initialize_rope(dims, spec.base, spec.style == "interleaved", scaling_config=scaling,
                                 max_position_embeddings=max_pos)
    except (ValueError, KeyError) as e:
        raise ValueError(f"mlx-lm's initialize_rope refuses rope_type {rope_type!r}: {type(e).__name__}: {e}.") from e
    read = spec_from_mlx_rope(module, head_dim=head_dim, base=spec.base, scaling_config=scaling,
                              max_position_embeddings=max_pos)
    if read.style != spec.style:
        raise ValueError(f"mlx-lm's {type(module).__name__} rotates {read.style!r} pairs only; the spec's are "
                         f"{spec.style!r}.")
    for seq_len in dict.fromkeys((1, max_pos, 4 * max_pos) if max_pos else (None,)):
        (inv_a, af_a), (inv_b, af_b) = read.frequencies(head_dim, seq_len=seq_len), spec.frequencies(head_dim,
                                                                                                   seq_len=seq_len)
        bad = _ladder_mismatch(inv_a, inv_b, _periods_tolerance(spec.base))
        if bad is not None or abs(af_a - af_b) > 8 * _U32 * max(1.0, af_b):
            what = (f"pair {bad[0]}'s frequency differs by {bad[1]:.3g} relative" if bad is not None else
                    f"its attention factor is {af_a:.6g}, the spec's {af_b:.6g}")
            raise ValueError(f"mlx-lm's {type(module).__name__} cannot express this {rope_type} spec: at length "
                             f"{seq_len} {what} (it reads {read.scaling and dict(read.scaling)}).")
    return module


# --------------------------------------------------------------------------------------------------
# MLX model directories
# --------------------------------------------------------------------------------------------------


def _safetensors_metadata(path: Path) -> dict | None:
    """The ``__metadata__`` of a safetensors file's header (8-byte little-endian length, then JSON), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                return None
            n = struct.unpack("<Q", head)[0]
            if n > 100_000_000:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else None


def is_mlx_model_dir(path: str | Path) -> bool:
    """True for a directory mlx-lm wrote: a ``config.json`` and safetensors whose header metadata says
    ``format: mlx`` (``mlx_lm.utils.save_model`` writes it; transformers writes ``format: pt``; a bare
    ``mx.save_safetensors`` writes no metadata, measured on mlx 0.32.4)."""
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").is_file():
        return False
    return any((_safetensors_metadata(f) or {}).get("format") == "mlx" for f in sorted(p.glob("*.safetensors")))


def _load_config(source: str | Path | Mapping[str, Any]) -> tuple[dict, str]:
    if isinstance(source, Mapping):
        return dict(source), "<config>"
    p = Path(source)
    if p.is_dir():
        path = p / "config.json"
        if not path.is_file():
            raise ReadError(f"{p}: no config.json in this directory; mlx-lm builds a model from it.")
        from mlx_lm.utils import load_config

        try:
            return load_config(p), str(p)
        except (OSError, ValueError) as e:
            raise ReadError(f"{path}: not a readable JSON config ({e}).") from e
    if p.is_file():
        try:
            return json.loads(p.read_text()), str(p)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise ReadError(f"{p}: not a readable JSON config ({e}).") from e
    raise ReadError(f"{p}: no such file or directory.")


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _head_dim_of(attn: Any, dims: int) -> int:
    for key in ("qk_rope_head_dim", "head_dim"):
        v = getattr(attn, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return dims


def _rope_guard(attn: Any, rope_name: str) -> str | None:
    """The attribute that decides whether ``attn`` (an mlx-lm attention module) applies its rope module
    ``self.<rope_name>``, read from the source of its class's ``__call__``: ``X`` when every call of
    ``self.<rope_name>`` there sits under ``if self.X:`` (mlx-lm's cohere2: ``if self.use_sliding_window:``,
    models/cohere2.py:76); None when a call is unguarded or the source cannot be read."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(attn).__call__)))
    except (OSError, TypeError, SyntaxError):
        return None

    def is_self_attr(node, name=None):
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and (name is None or node.attr == name))

    def calls(nodes):
        return [n for node in nodes for n in ast.walk(node)
                if isinstance(n, ast.Call) and is_self_attr(n.func, rope_name)]

    every = calls(tree.body)
    if not every:
        return None
    guards, guarded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and is_self_attr(node.test) and not calls(node.orelse):
            inner = calls(node.body)
            if inner:
                guards.add(node.test.attr)
                guarded.update(map(id, inner))
    if len(guards) != 1 or guarded != set(map(id, every)):
        return None
    return guards.pop()


def read_mlx(source: str | Path | Mapping[str, Any]) -> Reading:
    """The RoPE of every decoder layer as mlx-lm (the installed version) builds the model from ``config.json``.

    ``source`` is a model directory (an MLX one or a transformers one: mlx-lm reads the same ``config.json``),
    a ``config.json`` path, or the config dict. The model is built as ``mlx_lm.utils.load_model`` builds it,
    without weights, and each layer's rope module is read with :func:`spec_from_mlx_rope`. Raises
    :class:`ReadError` for a missing or bad config, a model type mlx-lm does not have, a config its
    ``ModelArgs`` or ``Model`` refuses, or a rope module ropelab cannot map.
    """
    config, where = _load_config(source)
    if not isinstance(config, dict) or "model_type" not in config:
        raise ReadError(f"{where}: the config has no 'model_type', which mlx-lm needs to pick its model code.")
    from mlx_lm.utils import _get_classes

    try:
        model_class, args_class = _get_classes(config)
    except ValueError as e:
        raise ReadError(f"{where}: mlx-lm has no model code for model_type {config['model_type']!r} ({e}).") from e
    module_name = model_class.__module__.rsplit(".", 1)[-1]
    taken = set(inspect.signature(args_class).parameters)
    try:
        args = args_class.from_dict(config)
        model = model_class(args)
    except Exception as e:  # mlx-lm's own checks (missing fields, asserts, KeyErrors): the config is the problem
        raise ReadError(f"{where}: mlx-lm's {module_name} refuses this config: {type(e).__name__}: {e}.") from e
    layers = list(getattr(model, "layers", []) or [])
    if not layers:
        raise ReadError(f"{where}: mlx-lm's {module_name} model has no decoder layers to read.")
    ropes: dict[int, tuple[str, Any]] = {}
    for path, mod in model.named_modules():
        m = _LAYER.search(path)
        if m is None or type(mod).__name__ not in MLX_LM_ROPE_CLASSES or not callable(mod):
            continue
        if type(mod).__name__ == "RoPE" and type(mod).__module__.split(".")[0] != "mlx":
            continue
        i = int(m.group(1))
        if i in ropes and ropes[i][0].count(".") <= path.count("."):
            continue  # the outermost rope module of a layer (a nested one is a sub-module's)
        ropes[i] = (path, mod)
    base_default = getattr(args, "rope_theta", None)
    scaling = getattr(args, "rope_scaling", None)
    max_pos = getattr(args, "max_position_embeddings", None) or config.get("max_position_embeddings")
    max_pos = int(max_pos) if isinstance(max_pos, (int, float)) and not isinstance(max_pos, bool) else None
    local_base = getattr(args, "rope_local_base_freq", None)
    specs, head_dims, classes, unrotated = [], set(), [], []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None) or layer
        if i in ropes:  # a rope module the attention calls only `if self.X:` does not turn this layer when X is False
            guard = _rope_guard(attn, ropes[i][0].rsplit(".", 1)[-1])
            if guard is not None and not getattr(attn, guard, True):
                unrotated.append((i, f"{type(attn).__name__}.{guard}"))
                specs.append(RopeSpec.nope(max_pos))
                classes.append("none")
                continue
        if i not in ropes:
            specs.append(RopeSpec.nope(max_pos))
            classes.append("none")
            continue
        path, mod = ropes[i]
        dims = int(getattr(mod, "dims", getattr(mod, "dim", 0)) or 0)
        head_dim = _head_dim_of(attn, dims)
        head_dims.add(head_dim)
        # The base this layer's module was built with: a sliding layer of Gemma 3 takes rope_local_base_freq.
        base = local_base if getattr(attn, "is_sliding", False) and local_base is not None else base_default
        try:
            spec = spec_from_mlx_rope(mod, head_dim=head_dim, base=base,
                                      scaling_config=None if getattr(attn, "is_sliding", False) else scaling,
                                      max_position_embeddings=max_pos)
        except ValueError as e:
            raise ReadError(f"{where}: layer {i} ({path}, mlx-lm {type(mod).__name__}): {e}") from e
        specs.append(spec)
        classes.append(type(mod).__name__)
    if len(head_dims) > 1:
        raise ReadError(f"{where}: mlx-lm's layers use different head dims {sorted(head_dims)}; a Reading has one.")
    declared = {k: config[k] for k in _ROPE_KEYS if k in config}
    notes = [f"mlx-lm {_version()} models.{module_name}; rope classes per layer: {class_runs(classes)}"]
    ignored = [k for k in declared if k not in taken]
    if ignored:
        notes.append(f"mlx-lm's {module_name}.ModelArgs does not read {ignored} (the model runs without them)")
    if unrotated:
        notes.append(f"mlx-lm's {module_name} calls its rope module only when the attention's flag is set: layers "
                     f"{[i for i, _ in unrotated]} without RoPE ({unrotated[0][1]} False)")
    if "SuScaledRoPE" in classes:
        notes.append("mlx-lm's SuScaledRoPE applies long_factor at every length (short_factor unused)")
    if "YarnRoPE" in classes and isinstance(scaling, Mapping):
        filled = {k: v for k, v in yarn_defaults().items() if k not in scaling}
        if filled:
            notes.append(f"mlx-lm's YarnRoPE takes its defaults {filled} for keys the config leaves out")
    if isinstance(scaling, Mapping) and (scaling.get("type") or scaling.get("rope_type")) == "mrope":
        notes.append("mlx-lm's mrope is nn.RoPE: the sections are dropped (exact for text positions)")
    text_only = _takes_token_ids_only(model)
    if text_only and _declares_sections(config):
        notes.append(f"mlx-lm's {module_name} runs token ids only ({type(model).__name__}.__call__ takes no position "
                     "ids): every axis of M-RoPE at the same position, where its sections rotate as 1D RoPE")
    return Reading(source=where, format="mlx", architecture=module_name,
                   head_dim=head_dims.pop() if head_dims else _config_head_dim(config, where),
                   layers=tuple(specs), declared=declared, notes=tuple(notes), text_only=text_only)


# Arguments through which a model's forward could take positions other than 0 .. n-1 on every axis.
_POSITION_ARGS = ("position_ids", "positions", "mrope_position_ids", "image_grid_thw", "video_grid_thw",
                  "pixel_values")


def _takes_token_ids_only(model: Any) -> bool:
    """Whether mlx-lm's model forward takes no multi-axis positions: none of :data:`_POSITION_ARGS` (nor ``**kwargs``)
    in its ``__call__`` (measured, not listed: mlx-lm's qwen2_vl and qwen3_vl take ``inputs, cache,
    input_embeddings``)."""
    try:
        params = inspect.signature(type(model).__call__).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return False
    return not any(name in params for name in _POSITION_ARGS)


def _declares_sections(config: Mapping[str, Any]) -> bool:
    for c in (config, config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}):
        for key in ("rope_parameters", "rope_scaling"):
            d = c.get(key)
            if isinstance(d, Mapping) and ("mrope_section" in d or any(
                    isinstance(v, Mapping) and "mrope_section" in v for v in d.values())):
                return True
    return False


def _config_head_dim(config: Mapping[str, Any], where: str) -> int:
    """The head dim of a model whose layers all go without RoPE (no rope module to read it from)."""
    try:
        from ..spec import head_dim_of

        return head_dim_of(config)
    except (ValueError, TypeError, ZeroDivisionError) as e:
        raise ReadError(f"{where}: no layer has RoPE and the config gives no head dim ({e}).") from e



def _version() -> str:
    try:
        return importlib.import_module("mlx_lm").__version__
    except (ImportError, AttributeError):
        return "?"
