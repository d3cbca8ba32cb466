r"""Conformance sweep: ``RopeSpec.per_layer`` against transformers' own modeling code, every RoPE model type.

``python -m ropelab.conformance`` (``make conformance``) writes ``data/conformance/transformers-<version>.json``
and the convention table ``ropelab/hf_conventions.py`` it measures. For each model type of the installed
transformers:

1. **Found by reading the library.** Every model type of ``CONFIG_MAPPING_NAMES`` whose modeling source
   defines a ``*Rotary*`` class or a module-level function whose name holds ``rotary`` / ``rope``, or whose
   configuration source mentions ``rope_parameters`` / ``rope_theta``. No list of model types is typed here.
2. **A tiny model from its own config class**: a few layers, two heads of the default head size, small
   vocabulary and MLPs; every RoPE field as the class sets it. Variants: the same config with a ``linear``
   and a ``yarn`` scaling in the v5 schema (``rope_parameters``), and the ``linear`` one written the v4 way
   (``rope_theta`` and ``rope_scaling`` at the top, as an old ``config.json`` holds them).
3. **transformers' own code per layer.** The module-level rotation functions of the modeling module
   (``apply_rotary_pos_emb`` and kin) are wrapped to record their inputs and outputs, the whole tiny model
   runs one float64 forward on 9 tokens at positions up to 4095, and each call is attributed to the decoder
   layer that made it. A layer that ran but made no call applies no RoPE (NoPE, or no attention at all).
4. **ropelab on the same input**: ``apply_rope(q, positions, spec=RopeSpec.per_layer(config_dict)[layer])``
   in float64, on every recorded query/key, compared element by element.

Tolerance. transformers forms ``inv_freq`` and the angles :math:`m\omega_i` in float32 and rounds cos/sin to
float32 (then casts them to the model's float64). ``inv_freq = b ** (2i/r)`` in float32 has relative error up
to :math:`(\ln b + 8)u` (:math:`u = 2^{-24}`; the exponent's rounding is amplified by :math:`\ln b`, the
scalings add a few roundings), the angle one more, cos/sin one each. So a rotated pair of norm
:math:`\rho` may move by :math:`a\rho\,(|m\omega_i|(\ln b + 9) + 4)u` (a the attention factor), and a dim that
passes through not at all (float64 copies: :math:`16 u_{64}|x|`). The bound is formed per element from
ropelab's own spec; a layer agrees when every element is within it. A wrong pairing, base, scaling or
rotary slice moves elements by a fraction of their size, many orders above the bound.

Conventions measured (``ropelab/hf_conventions.py``): transformers' rotation function, called with basis
vectors at the recorded cos/sin, gives each position's matrix; the coupled dims give the pairing (``half``
(i, i + r/2) or ``interleaved`` (2i, 2i + 1)) and the rotary slice :math:`r/d`. ``RopeSpec.per_layer`` reads
the pairing there; the fraction only when the config names none (the modeling code fixes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import math
import pathlib
import re
import time
import traceback
from typing import Any

import torch

from .core import apply_rope, pair_indices
from .hf_conventions import CONVENTIONS
from .spec import HF_KEYS, RopeSpec, head_dim_of

__all__ = ["discover", "sweep_model_type", "sweep", "measure_convention", "write_conventions", "main"]

U32, U64 = 2.0**-24, 2.0**-53
N_LAYERS = 8  # enough for the layer patterns of transformers' configs (every 4th, 6th layer ...)
N_HEADS = 2
CONVENTIONS_PATH = pathlib.Path(__file__).with_name("hf_conventions.py")
DATA_DIR = pathlib.Path(__file__).resolve().parent.parent / "data" / "conformance"

_ROT_FN = re.compile(r"^def (\w*(?:rotary|rope)\w*)\(", re.M)
_ROT_CLS = re.compile(r"^class (\w*Rotary\w*)\(", re.M)


# --------------------------------------------------------------------------------------------------
# Finding the model types
# --------------------------------------------------------------------------------------------------


def discover() -> dict[str, dict]:
    """{model_type: {"module", "rotary_classes", "rotation_functions", "config_mentions_rope"}} for every model
    type of the installed transformers whose sources show rotary embeddings."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    root = pathlib.Path(transformers.__file__).parent / "models"
    found = {}
    for model_type in CONFIG_MAPPING_NAMES:
        module = model_type_to_module_name(model_type)
        folder = root / module
        if not folder.is_dir():
            continue
        modeling = "".join(p.read_text() for p in sorted(folder.glob("modeling_*.py")))
        configuration = "".join(p.read_text() for p in sorted(folder.glob("configuration_*.py")))
        classes, functions = _ROT_CLS.findall(modeling), _ROT_FN.findall(modeling)
        mentions = "rope_parameters" in configuration or "rope_theta" in configuration
        if classes or functions or mentions:
            found[model_type] = {"module": module, "rotary_classes": sorted(set(classes)),
                                 "rotation_functions": sorted(set(functions)), "config_mentions_rope": mentions}
    return found


# --------------------------------------------------------------------------------------------------
# A tiny config from the model type's own config class
# --------------------------------------------------------------------------------------------------

_SMALL_INTS = {"vocab_size": 128, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
               "num_experts_per_tok": 2, "moe_topk": 2, "n_shared_experts": 1, "num_shared_experts": 1,
               "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 16}


def tiny_kwargs(config_cls) -> dict[str, Any]:
    """Keyword arguments that shrink ``config_cls()``: N_LAYERS layers, N_HEADS heads of the default head size,
    small MLPs, experts and vocabulary. RoPE fields (theta, scaling, partial rotary, layer patterns) untouched."""
    d = config_cls()
    kw: dict[str, Any] = {}
    heads = getattr(d, "num_attention_heads", None)
    hidden = getattr(d, "hidden_size", None)
    if isinstance(getattr(d, "num_hidden_layers", None), int):
        kw["num_hidden_layers"] = min(d.num_hidden_layers, N_LAYERS)
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        head_dim = getattr(d, "head_dim", None) or hidden // heads
        kw["num_attention_heads"] = N_HEADS
        kw["hidden_size"] = N_HEADS * head_dim
        if isinstance(getattr(d, "num_key_value_heads", None), int):
            kw["num_key_value_heads"] = 1 if d.num_key_value_heads == 1 else N_HEADS
    for key in ("pad_token_id", "padding_idx"):
        if isinstance(getattr(d, key, None), int) and getattr(d, key) >= _SMALL_INTS["vocab_size"]:
            kw[key] = 0  # an embedding of 128 rows needs its padding row inside
    for key, value in vars(d).items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if "intermediate_size" in key or key in ("ffn_hidden_size", "n_inner", "ffn_dim"):
            kw[key] = 32
        elif key in _SMALL_INTS and value > _SMALL_INTS[key]:
            kw[key] = _SMALL_INTS[key]
    # transformers rebuilds per-layer lists (layer_types, no_rope_layers, ...) from num_hidden_layers when they
    # are not given: drop the defaults' lists so the class derives them for the tiny depth, as it would.
    return kw


def _main_rope_dict(params: dict) -> tuple[dict, str | None]:
    """The rope dict a scaling variant replaces: the flat dict, or the full-attention entry of a nested one."""
    if "rope_type" in params or "rope_theta" in params:
        return params, None
    key = "full_attention" if "full_attention" in params else sorted(params)[0]
    return params[key], key


def variants(config_cls, kw: dict) -> dict[str, dict]:
    """{name: kwargs}: the default config and, where it has rope_parameters, linear / yarn scalings (v5 schema)
    and the linear one in the v4 schema (rope_theta, rope_scaling at the top)."""
    out = {"default": dict(kw)}
    base = config_cls(**kw)
    params = getattr(base, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        return out
    params = json.loads(json.dumps(params))
    main, key = _main_rope_dict(params)
    if not isinstance(main, dict) or main.get("rope_type", "default") != "default":
        return out
    max_pos = getattr(base, "max_position_embeddings", None) or 4096
    keep = {k: v for k, v in main.items() if k in ("rope_theta", "partial_rotary_factor")}
    for name, scaling in [("linear", {"rope_type": "linear", "factor": 2.0}),
                          ("yarn", {"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": max(max_pos // 4, 16)})]:
        new = json.loads(json.dumps(params))
        if key is None:
            new = {**keep, **scaling}
        else:
            new[key] = {**keep, **scaling}
        out[name] = {**kw, "rope_parameters": new}
    v4 = {**kw, "rope_theta": main.get("rope_theta"), "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    if "partial_rotary_factor" in main:
        v4["partial_rotary_factor"] = main["partial_rotary_factor"]
    out["linear (v4 schema)"] = v4
    return out


# --------------------------------------------------------------------------------------------------
# Running transformers' own code, recording each rotation call
# --------------------------------------------------------------------------------------------------


class _Recorder:
    def __init__(self):
        self.layer: int | None = None
        self.calls: list[dict] = []
        self.ran: list[int] = []

    def wrap(self, fn):
        def recorded(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.calls.append({"layer": self.layer, "fn": fn, "args": args, "kwargs": kwargs, "out": out})
            return out

        return recorded


def _layer_list(model, n_layers: int):
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers:
            return m
    return None


def positions_for(max_pos: int | None) -> list[int]:
    """9 distinct positions: small ones (every pair's angle resolved) and large ones up to the context."""
    top = min(max_pos or 4096, 4096)
    pos = sorted({0, 1, 2, 3, 5, 17, top // 4, top // 2, top - 1})
    k = 6
    while len(pos) < 9:
        pos = sorted(set(pos) | {k})
        k += 1
    return pos[:9]


def _base_model(config, module):
    """The base model of ``config``: AutoModel's, else the module's model class built on exactly this config class
    (the text half of a multimodal family has no AutoModel entry)."""
    from transformers import AutoModel, PreTrainedModel

    try:
        return AutoModel.from_config(config)
    except ValueError:
        pass
    for name, cls in sorted(vars(module).items()):
        if (inspect.isclass(cls) and issubclass(cls, PreTrainedModel) and getattr(cls, "config_class", None)
                is type(config) and name.endswith("Model") and not name.endswith("PreTrainedModel")):
            return cls(config)
    raise LookupError(f"no AutoModel and no *Model class for {type(config).__name__} in {module.__name__}")


def run_transformers(config, module) -> dict:
    """:func:`_run` in float64, or in float32 where the model's kernels refuse float64 (grouped MoE matmuls)."""
    try:
        return _run(config, module, torch.float64)
    except RuntimeError as e:
        if "Float" not in str(e) and "Double" not in str(e) and "dtype" not in str(e):
            raise
        return _run(config, module, torch.float32)


def _run(config, module, dtype) -> dict:
    """One float64 forward of a tiny model of ``config`` with every module-level rotation function of ``module``
    recorded. Returns {"calls", "ran", "positions"} or raises with the reason."""
    rec = _Recorder()
    names = [n for n, f in vars(module).items()
             if inspect.isfunction(f) and re.search(r"rotary|rope", n) and n.startswith("apply")]
    if not names:
        raise LookupError(f"no module-level rotation function (apply_*rotary*/apply_*rope*) in {module.__name__}; "
                          "the rotation is inlined")
    torch.manual_seed(0)
    model = _base_model(config, module).to(dtype).eval()
    layers = _layer_list(model, config.num_hidden_layers)
    if layers is None:
        raise LookupError(f"no ModuleList of num_hidden_layers={config.num_hidden_layers} layers in "
                          f"{type(model).__name__}")
    hooks = []
    for i, layer in enumerate(layers):
        def pre(_m, _a, i=i):
            rec.layer = i
            rec.ran.append(i)
        hooks.append(layer.register_forward_pre_hook(pre))
    saved = {n: getattr(module, n) for n in names}
    positions = positions_for(getattr(config, "max_position_embeddings", None))
    ids = torch.randint(0, min(getattr(config, "vocab_size", 128) or 128, 100), (1, len(positions)))
    pos = torch.tensor([positions])
    try:
        for n in names:
            setattr(module, n, rec.wrap(saved[n]))
        with torch.no_grad():
            try:
                model(input_ids=ids, position_ids=pos, use_cache=False)
            except TypeError as e:
                if "position_ids" not in str(e) and "use_cache" not in str(e):
                    raise
                positions = list(range(len(positions)))
                pos = torch.tensor([positions])
                model(input_ids=ids)
    finally:
        for n in names:
            setattr(module, n, saved[n])
        for h in hooks:
            h.remove()
    return {"calls": rec.calls, "ran": sorted(set(rec.ran)), "positions": positions, "dtype": str(dtype)}


def _pairs(call) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) tensor pairs of one rotation call: the leading tensor arguments matched to the outputs."""
    out = call["out"]
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    ins = [a for a in call["args"] if isinstance(a, torch.Tensor)]
    return [(i, o) for i, o in zip(ins, outs) if isinstance(o, torch.Tensor) and o.shape == i.shape]


def _layout(shape: tuple[int, ...], s: int) -> str:
    if shape[-1] == s or list(shape).count(s) != 1:
        raise LookupError(f"cannot tell the sequence axis of a tensor of shape {list(shape)} ({s} tokens)")
    names = []
    for i, n in enumerate(shape[:-1]):
        names.append("s" if n == s else ("b" if i == 0 else "h"))
    if names.count("h") > 1:
        raise LookupError(f"tensor of shape {list(shape)} has more than one heads-like axis")
    return " ".join(names + ["d"])


def bound(x: torch.Tensor, layout: str, positions: list[int], spec: RopeSpec) -> torch.Tensor:
    """The per-element bound of the module docstring, for ropelab's ``spec`` on input ``x``."""
    d_axis = layout.split().index("d")
    s_axis = layout.split().index("s")
    xd = x.movedim(d_axis, -1).movedim(s_axis if s_axis < d_axis else s_axis - 1, -2)  # [..., s, d]
    tol = 16 * (U64 if x.dtype == torch.float64 else U32) * xd.double().abs()
    xd = xd.double()
    if not spec.is_nope:
        d = xd.shape[-1]
        r = spec.rotary_dim or d
        inv, af = spec.frequencies(d, seq_len=max(positions) + 1)
        theta = torch.tensor(positions, dtype=torch.float64)[:, None] * inv[None, :]
        a, b = pair_indices(r, spec.style)
        rho = torch.hypot(xd[..., a], xd[..., b])
        const = 4 if x.dtype == torch.float64 else 12  # float32 models round the products and the sum too
        pair_tol = abs(af) * rho * (theta.abs() * (math.log(spec.base) + 9) + const) * U32 + 16 * U64 * rho
        tol[..., a] = pair_tol
        tol[..., b] = pair_tol
    return tol.movedim(-2, s_axis if s_axis < d_axis else s_axis - 1).movedim(-1, d_axis)


def compare_call(call, positions, spec: RopeSpec, perm: list[int] | None = None) -> dict:
    """Worst error and worst error / bound of ropelab's ``spec`` against one recorded call; ``perm`` is the
    measured output permutation of transformers' function (undone before comparing)."""
    worst_err, worst_ratio = 0.0, 0.0
    for x, y in _pairs(call):
        if perm is not None and len(perm) == y.shape[-1]:
            y = y[..., torch.tensor(perm)]  # undo transformers' output order: (R x)[a] = y[perm[a]]
        layout = _layout(tuple(x.shape), len(positions))
        pos = torch.tensor(positions)
        x64 = x.double()
        ours = x64.clone() if spec.is_nope else apply_rope(x64, pos, layout=layout, spec=spec)
        err = (ours - y.double()).abs()
        tol = bound(x, layout, positions, spec)
        worst_err = max(worst_err, float(err.max()))
        worst_ratio = max(worst_ratio, float((err / tol.clamp_min(1e-300)).max()))
    return {"max_error": worst_err, "error_over_bound": worst_ratio}


def _matrices(call, positions) -> torch.Tensor:
    """[s, d_out, d_in]: transformers' rotation at each recorded position, column a its output for e_a."""
    x, _ = _pairs(call)[0]
    layout = _layout(tuple(x.shape), len(positions)).split()
    d = x.shape[-1]
    tensor_args = [i for i, a in enumerate(call["args"]) if isinstance(a, torch.Tensor)]
    n_rot = len(_pairs(call))
    cols = []
    for a in range(d):
        args = list(call["args"])
        for i in tensor_args[:n_rot]:
            e = torch.zeros_like(args[i])
            e[..., a] = 1.0
            args[i] = e
        out = call["fn"](*args, **call["kwargs"])
        out = out[0] if isinstance(out, (tuple, list)) else out
        idx = [0 if ax != "s" else slice(None) for ax in layout[:-1]] + [slice(None)]
        cols.append(out[tuple(idx)].double())  # [s, d]
    return torch.stack(cols, dim=-1)


def measure_convention(call, positions) -> dict:
    """Pairing, rotary slice, direction and output order of transformers' rotation function, from its matrices
    at the recorded tables (position 0 must be among the positions)."""
    M = _matrices(call, positions)
    d = M.shape[-1]
    out: dict[str, Any] = {"call_dim": d}
    P = M[positions.index(0)]
    perm = P.abs().argmax(dim=0)  # output dim of each input dim at angle 0
    if sorted(perm.tolist()) == list(range(d)) and perm.tolist() != list(range(d)):
        out["output_permutation"] = perm.tolist()  # the same for q and k: q.k unchanged
        M = M[:, perm, :]  # (R x)[a] = y[perm[a]]
    eye = torch.eye(d, dtype=M.dtype)
    moving = [a for a in range(d) if float((M[..., a] - eye[a]).abs().max()) > 1e-9]
    r = len(moving)
    out["rotating_dims"] = r
    if r == 0:
        return {**out, "style": None}
    last = int(torch.tensor(positions).argmax())
    partner = {}
    for a in moving:
        col = M[last, :, a].abs().clone()
        col[a] = 0
        partner[a] = int(col.argmax())
    if moving != list(range(r)):
        return {**out, "style": f"other: rotating dims {moving[:4]}... of {d}"}
    if all(partner[a] == (a + r // 2) % r for a in moving):
        style = "half"
    elif all(partner[a] == a ^ 1 for a in moving):
        style = "interleaved"
    else:
        return {**out, "style": "other: pairs " + str([(a, partner[a]) for a in moving[:4]])}
    # y_b = x_a sin(m w) + x_b cos(m w) for a counter-clockwise RoPE (Su et al.): M[b, a] > 0 at small m w.
    a, b = (0, r // 2) if style == "half" else (0, 1)
    m1 = positions.index(1)
    out["direction"] = 1 if float(M[m1, b, a]) > 0 else -1
    # The base, for configs that carry none (the modeling code fixes it): the ladder w_i = b^(-2i/r) read at
    # position 1, log w_i fitted linearly in i; kept to 5 significant digits (float32 tables resolve ~1e-6).
    pa, pb = pair_indices(r, style)
    w = torch.atan2(M[m1, pb, pa] - M[m1, pa, pb], M[m1, pa, pa] + M[m1, pb, pb]).abs()
    i = torch.arange(r // 2, dtype=torch.float64)
    if bool((w > 0).all()) and r >= 4:
        slope = float(((i - i.mean()) * (w.log() - w.log().mean())).sum() / ((i - i.mean()) ** 2).sum())
        base = math.exp(-slope * r / 2)
        out["measured_base"] = float(f"{base:.5g}")
    return {**out, "style": style}


# --------------------------------------------------------------------------------------------------
# One model type
# --------------------------------------------------------------------------------------------------


def _error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:300]


def sweep_model_type(model_type: str, info: dict, *, only_default: bool = False) -> dict:
    """The conformance record of one model type (see the module docstring)."""
    from transformers import CONFIG_MAPPING

    row: dict[str, Any] = {"module": info["module"]}
    config_cls = CONFIG_MAPPING[model_type]
    subs = getattr(config_cls, "sub_configs", None) or {}
    if subs:
        row["status"] = "not covered"
        row["reason"] = ("composite config (sub-configs " + ", ".join(sorted(subs)) + "): its RoPE lives in a "
                         "sub-config, whose model type is swept on its own")
        return row
    try:
        module = importlib.import_module(f"transformers.models.{info['module']}.modeling_{info['module']}")
    except Exception as e:  # noqa: BLE001 - the reason goes into the table
        return {**row, "status": "not covered", "reason": f"modeling module does not import: {_error(e)}"}
    try:
        kw = tiny_kwargs(config_cls)
        runs = variants(config_cls, kw)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "not covered", "reason": f"tiny config cannot be built: {_error(e)}"}
    if only_default:
        runs = {"default": runs["default"]}
    row["variants"] = {}
    measured = _config_conventions(config_cls, kw)
    for name, kwargs in runs.items():
        row["variants"][name] = _sweep_variant(model_type, config_cls, module, kwargs,
                                               measured if name == "default" else None)
    default = row["variants"]["default"]
    for v in list(row["variants"].values())[1:]:
        v.pop("convention", None)
    if "convention" in default:
        row["convention"] = default.pop("convention")
    statuses = [v["status"] for v in row["variants"].values()]
    if default["status"] == "not covered":
        row["status"], row["reason"] = "not covered", default["reason"]
    elif "disagree" in statuses:
        row["status"] = "disagree"
    else:
        row["status"] = "agree"
    return row


def _config_conventions(config_cls, kw: dict) -> dict:
    """What the config class itself does with the keys ropelab reads: its aliases (``attribute_map``), and how a
    v4 ``rope_theta`` / ``rope_scaling`` reaches each layer type of a nested ``rope_parameters``."""
    out: dict[str, Any] = {}
    aliases = {k: v for k, v in (getattr(config_cls, "attribute_map", None) or {}).items() if k in HF_KEYS}
    if aliases:
        out["aliases"] = dict(sorted(aliases.items()))
    theta = 12345.0  # a base no config defaults to: the layer types that carry it took the top-level rope_theta
    try:
        cfg = config_cls(**{**kw, "rope_theta": theta, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    except Exception:  # noqa: BLE001 - a class without the v4 keys has no v4 rule
        return out
    params = getattr(cfg, "rope_parameters", None) or {}
    nested = {t: p for t, p in params.items() if isinstance(p, dict)}
    if nested and set(nested) <= set(getattr(cfg, "layer_types", None) or []) | set(nested):
        out["v4"] = {"scaled_layer_types": sorted(t for t, p in nested.items() if p.get("rope_type") == "linear"),
                     "default_theta": {t: p.get("rope_theta") for t, p in sorted(nested.items())
                                       if p.get("rope_theta") != theta}}
    return out


def _config_dict(config_cls, kwargs: dict, v4: bool) -> tuple[Any, dict]:
    """(the transformers config, the dict ropelab reads): ``to_dict()``, or for the v4 variant the v4 keys as an
    old config.json holds them (transformers converts them itself)."""
    config = config_cls(**json.loads(json.dumps(kwargs)))
    d = config.to_dict()
    if v4:
        d.pop("rope_parameters", None)
        d["rope_theta"], d["rope_scaling"] = kwargs["rope_theta"], dict(kwargs["rope_scaling"])
        if "partial_rotary_factor" in kwargs:
            d["partial_rotary_factor"] = kwargs["partial_rotary_factor"]
    return config, d


def _sweep_variant(model_type, config_cls, module, kwargs, measure: dict | None) -> dict:
    """One config variant: transformers' calls per layer against ``RopeSpec.per_layer`` of its dict."""
    v4 = "rope_scaling" in kwargs
    try:
        config, d = _config_dict(config_cls, kwargs, v4)
    except Exception as e:  # noqa: BLE001
        return {"status": "not covered", "reason": f"transformers rejects the config: {_error(e)}"}
    try:
        run = run_transformers(config, module)
    except Exception as e:  # noqa: BLE001
        return {"status": "not covered", "reason": f"transformers' model cannot run on tokens: {_error(e)}"}
    if not run["calls"]:
        return {"status": "not covered", "reason": "the forward made no call to a rotation function: RoPE is "
                f"applied elsewhere (functions wrapped: apply_* in {module.__name__})"}
    if any(c["layer"] is None for c in run["calls"]):
        return {"status": "not covered", "reason": "a rotation call outside the decoder layers (e.g. a vision "
                "tower or an encoder); the sweep attributes calls to decoder layers only"}
    out: dict[str, Any] = {"positions": run["positions"], "dtype": run["dtype"]}
    try:  # every variant: the output order (undone before comparing) may depend on the config
        out["convention"] = measure_convention(run["calls"][0], run["positions"])
    except Exception as e:  # noqa: BLE001
        out["convention"] = {"error": _error(e)}
    if measure is not None:
        types = list(getattr(config, "layer_types", None) or [])
        called = {c["layer"] for c in run["calls"]}
        if len(types) == config.num_hidden_layers:
            silent = [i in run["ran"] and i not in called for i in range(len(types))]
            out["convention"]["nope_layer_types"] = sorted(
                t for t in set(types) if all(s for s, u in zip(silent, types) if u == t))
    if measure is not None and "style" in out.get("convention", {}):
        out["convention"].update(measure)
        if d.get("rope_theta") is None and not d.get("rope_parameters") and "measured_base" in out["convention"]:
            out["convention"]["fixed_base"] = out["convention"]["measured_base"]  # no key holds it: code fixes it
    perm = (out.get("convention") or {}).get("output_permutation")
    try:
        head_dim = head_dim_of({**d, **{k: d[v] for k, v in getattr(config_cls, "attribute_map", {}).items()
                                        if v in d and k not in d}})
        if "rotating_dims" in out.get("convention", {}):
            out["convention"]["rotary_fraction"] = out["convention"]["rotating_dims"] / head_dim
    except Exception as e:  # noqa: BLE001
        out.update(status="not covered", reason=f"ropelab: {_error(e)}")
        return out
    if measure is not None and "style" in out.get("convention", {}):
        # The table RopeSpec reads, in step with this run's measurement (written out at the end of the sweep).
        CONVENTIONS[model_type] = {k: v for k, v in out["convention"].items() if k != "call_dim"}
    try:
        specs = RopeSpec.per_layer(d)
    except Exception as e:  # noqa: BLE001
        out.update(status="not covered", reason=f"ropelab: {_error(e)}")
        return out
    layers = []
    for i in range(config.num_hidden_layers):
        spec = specs[i] if i < len(specs) else None
        calls = [c for c in run["calls"] if c["layer"] == i]
        entry: dict[str, Any] = {"layer": i, "spec": None if spec is None else spec.to_dict()}
        if spec is None:
            entry.update(status="disagree", reason=f"ropelab gave {len(specs)} specs for {len(run['ran'])} layers")
        elif i not in run["ran"]:
            entry.update(status="not covered", reason="the layer did not run")
        elif not calls:
            entry["transformers"] = "no rotation call (the layer applies no RoPE)"
            entry["status"] = "agree" if spec.is_nope else "disagree"
        else:
            call_dim = _pairs(calls[0])[0][0].shape[-1]
            sliced = call_dim < head_dim  # the attention hands the function only the rotary slice (GPT-J)
            if sliced and (spec.rotary_dim or head_dim) != call_dim:
                entry.update(status="disagree", reason=f"transformers rotates {call_dim} of {head_dim} dims, ropelab "
                             f"{spec.rotary_dim or head_dim}")
                layers.append(entry)
                continue
            use = dataclasses.replace(spec, rotary_dim=None) if sliced else spec
            try:
                res = [compare_call(c, run["positions"], use, perm) for c in calls]
            except Exception as e:  # noqa: BLE001
                entry.update(status="not covered", reason=f"cannot compare: {_error(e)}")
            else:
                entry["max_error"] = max(r["max_error"] for r in res)
                entry["error_over_bound"] = max(r["error_over_bound"] for r in res)
                entry["status"] = "agree" if entry["error_over_bound"] <= 1.0 else "disagree"
        layers.append(entry)
    out["layers"] = layers
    st = [e["status"] for e in layers]
    out["status"] = "disagree" if "disagree" in st else ("agree" if "agree" in st else "not covered")
    if out["status"] == "not covered":
        out["reason"] = layers[0].get("reason", "no layer compared")
    return out


# --------------------------------------------------------------------------------------------------
# The whole sweep
# --------------------------------------------------------------------------------------------------


def sweep(model_types: list[str] | None = None, *, only_default: bool = False, log=print) -> dict:
    """Run the sweep (all discovered model types, or ``model_types``) and return the table."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    found = discover()
    chosen = sorted(found) if model_types is None else list(model_types)
    t0 = time.perf_counter()
    rows = {}
    for mt in chosen:
        t = time.perf_counter()
        try:
            rows[mt] = sweep_model_type(mt, found[mt], only_default=only_default)
        except Exception as e:  # noqa: BLE001 - one family's failure is a row, never the end of the sweep
            rows[mt] = {"module": found[mt]["module"], "status": "not covered",
                        "reason": f"sweep error: {_error(e)}", "trace": traceback.format_exc(limit=3)[-600:]}
        if log:
            log(f"{mt:40s} {rows[mt]['status']:12s} {time.perf_counter() - t:5.2f}s {rows[mt].get('reason', '')[:90]}")
    counts = {k: sum(r["status"] == k for r in rows.values()) for k in ("agree", "disagree", "not covered")}
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "generated_by": "python -m ropelab.conformance", "seconds": round(time.perf_counter() - t0, 1),
            "tolerance": "per element: a*rho*(|m w|(ln b + 9) + 4)*2**-24 on rotated pairs, 16*2**-53*|x| elsewhere",
            "counts": counts, "discovered": len(found), "conventions": conventions_of(rows), "models": rows}


def conventions_of(rows: dict) -> dict[str, dict]:
    """{model_type: {"style", "rotary_fraction"}} measured on transformers' own rotation (default variant)."""
    out = {}
    for mt, row in sorted(rows.items()):
        conv = row.get("convention")
        if conv and "style" in conv:
            entry = {k: v for k, v in conv.items() if k != "call_dim"}
            out[mt] = entry
    return out


def write_conventions(conventions: dict, version: str, path: pathlib.Path = CONVENTIONS_PATH) -> None:
    """Write ``ropelab/hf_conventions.py``, the table ``RopeSpec.per_layer`` reads."""
    lines = ["# ruff: noqa: E501",
             f'"""The pairing and rotary slice of every model type, measured on transformers {version}\'s own',
             "rotation functions by ``python -m ropelab.conformance`` (generated: do not edit; rerun",
             "``make conformance``).",
             "",
             "``style``: ``half`` pairs (i, i + r/2), ``interleaved`` (2i, 2i + 1). ``rotary_fraction``: r / head_dim",
             "in the default config of that model type (``RopeSpec.per_layer`` uses it only when the config names",
             'no fraction). The other keys are described in ``ropelab.conformance``."""',
             "", f"TRANSFORMERS_VERSION = {version!r}", "", "CONVENTIONS: dict[str, dict] = {"]
    for mt, c in sorted(conventions.items()):
        lines.append(f"    {mt!r}: {c!r},")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_types", nargs="*", help="only these model types (default: every one found)")
    ap.add_argument("--out", default=None, help="the JSON to write (default data/conformance/transformers-<v>.json)")
    ap.add_argument("--no-conventions", action="store_true", help="do not rewrite ropelab/hf_conventions.py")
    args = ap.parse_args(argv)
    table = sweep(args.model_types or None)
    out = pathlib.Path(args.out) if args.out else DATA_DIR / f"transformers-{table['transformers']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    if not args.no_conventions and not args.model_types:
        write_conventions(table["conventions"], table["transformers"])
    print(f"{table['counts']} of {table['discovered']} model types in {table['seconds']} s -> {out}")
    return 1 if table["counts"]["disagree"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
