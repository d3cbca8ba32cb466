r"""The conformance sweep itself (the design: ``ropelab.conformance``'s docstring)."""

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

from ..core import pair_indices
from ..rope import apply_rope
from ..spec import HF_KEYS, RopeSpec, head_dim_of

__all__ = ["discover", "tiny_kwargs", "variants", "positions_for", "run_transformers", "bound", "compare_call",
           "measure_convention", "diagnose_probe", "sweep_model_type", "table_entry", "sweep", "reason_class",
           "REASON_CLASSES", "summarise", "readme_paragraph", "conventions_of", "write_conventions", "main"]

U32, U64 = 2.0**-24, 2.0**-53
N_LAYERS = 8  # enough for the layer patterns of transformers' configs (every 4th, 6th layer ...)
N_HEADS = 2
TABLE_PATH = pathlib.Path(__file__).with_name("hf_table.py")
DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "data" / "conformance"

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
    rotary = []  # (module, position_ids, output) of every call of a *Rotary* module: the positions it really saw

    def seen(m, args, kwargs, out):
        p = args[1] if len(args) > 1 else kwargs.get("position_ids")
        rotary.append((m, args, kwargs, out, p))

    for m in model.modules():
        if "Rotary" in type(m).__name__:
            hooks.append(m.register_forward_hook(seen, with_kwargs=True))
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
    # A model may replace the positions it is given (CSM's depth decoder numbers its codebooks 0, 1, 2, ... and
    # ignores position_ids): compare at the positions its rotary module was called with.
    used = {tuple(p.reshape(-1, p.shape[-1])[0].tolist()) for *_, p in rotary
            if isinstance(p, torch.Tensor) and p.dim() in (1, 2) and p.shape[-1] == len(positions)}
    if len(used) == 1 and list(next(iter(used))) != positions:
        positions = list(next(iter(used)))
    return {"calls": rec.calls, "ran": sorted(set(rec.ran)), "positions": positions, "dtype": str(dtype),
            "rotary": rotary}


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


def sweep_model_type(model_type: str, info: dict, *, only_default: bool = False, diagnose: bool = True) -> dict:
    """The conformance record of one model type (see ``ropelab.conformance``); ``diagnose=False`` skips the
    diagnose probes (the v4 variant, the same rotary as the v5 linear one, is never probed)."""
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
                                               measured if name == "default" else None,
                                               probe=diagnose and "v4" not in name)
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
    from .hf_table import CONVENTIONS

    entry = table_entry(row.get("convention"))
    if entry is not None:  # this run's measurement against the committed table the comparison used
        committed = CONVENTIONS.get(model_type)
        row["table"] = ("absent" if committed is None else
                        "matches" if json.loads(json.dumps(committed)) == json.loads(json.dumps(entry)) else "differs")
    probes = [pr for v in row["variants"].values() for pr in (v.get("diagnose") or {}).get("probes", [])]
    if probes:
        probed = [pr for pr in probes if pr["status"] != "not probed"]
        fields = sorted({f for pr in probed for f, ok in pr["fields"].items() if not ok})
        row["diagnose"] = ("not probed" if not probed else "mismatch: " + ", ".join(fields) if fields else "match")
    return row


def table_entry(conv: dict | None) -> dict | None:
    """The convention-table entry of a measured convention (None where nothing was measured)."""
    if not conv or "style" not in conv:
        return None
    return {k: v for k, v in conv.items() if k != "call_dim"}


def _config_conventions(config_cls, kw: dict) -> dict:
    """What the config class itself does with the keys ropelab reads: its aliases (``attribute_map``), and how a
    v4 ``rope_theta`` / ``rope_scaling`` reaches each layer type of a nested ``rope_parameters``, or whether the
    class drops them (Cohere2-MoE declares ``rope_scaling`` as a field of its own and never converts it)."""
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
    elif params and not nested:
        # A key is dropped when the class's rope dict holds something else in its place (a dict without
        # rope_theta at all says nothing: the modeling code may still read the attribute).
        ignored = [k for k, read in (("rope_theta", params.get("rope_theta", theta) == theta),
                                     ("rope_scaling", params.get("rope_type") == "linear")) if not read]
        if ignored:
            out["v4"] = {"ignored_keys": ignored}
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


def _measure_calls(calls, positions) -> dict:
    """The convention of each rotation function the layers called (first call of each, in call order): the
    first one's, plus ``rotations`` {function: style} where functions of one layer pair differently (the
    DeepSeek-V3.2 indexer: half; its main attention: interleaved)."""
    by_fn: dict[str, dict] = {}
    for c in calls:
        name = c["fn"].__name__
        if name not in by_fn:
            by_fn[name] = measure_convention(c, positions)
    first = dict(next(iter(by_fn.values())))
    kinds = {(m.get("style"), m.get("rotating_dims"), tuple(m.get("output_permutation") or ())) for m in by_fn.values()}
    if len(kinds) > 1:
        first["rotations"] = {n: m.get("style") for n, m in by_fn.items()}
    return first


_SLICE_KEYS = ("rotary_dim", "rotary_pct", "partial_rotary_factor")


def _ignored_slice_keys(d: dict, conv: dict, head_dim: int, sliced: bool) -> list[str]:
    """Top-level rotary-slice keys of the config dict that transformers' code does not read: the slice it rotates
    (measured) is not the one the key says (MiniMax-M3 declares ``rotary_dim`` and rotates by its rope dict)."""
    params = d.get("rope_parameters") or {}
    if not isinstance(params, dict) or "partial_rotary_factor" in params or "rotating_dims" not in conv:
        return []
    r = conv["rotating_dims"] if not sliced else conv["call_dim"]
    out = []
    for key in _SLICE_KEYS:
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        says = int(v) if key == "rotary_dim" else int(head_dim * float(v))
        if says != r:
            out.append(key)
    return out


def _sweep_variant(model_type, config_cls, module, kwargs, measure: dict | None, probe: bool = True) -> dict:
    """One config variant: transformers' calls per layer against ``RopeSpec.per_layer`` of its dict.

    ``per_layer`` reads the committed convention table (a previous run's measurement); this run's measurement
    (``measure`` is not None for the default variant) is only recorded, never used in the comparison."""
    from .hf_table import CONVENTIONS

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
    try:
        head_dim = head_dim_of({**d, **{k: d[v] for k, v in getattr(config_cls, "attribute_map", {}).items()
                                        if v in d and k not in d}})
    except Exception as e:  # noqa: BLE001
        return {**out, "status": "not covered", "reason": f"ropelab: {_error(e)}"}
    call_dim = _pairs(run["calls"][0])[0][0].shape[-1]
    sliced = call_dim < head_dim  # the attention hands the function only the rotary slice (GPT-J)
    if measure is not None:
        try:
            conv = _measure_calls(run["calls"], run["positions"])
        except Exception as e:  # noqa: BLE001
            conv = {"error": _error(e)}
        types = list(getattr(config, "layer_types", None) or [])
        called = {c["layer"] for c in run["calls"]}
        if len(types) == config.num_hidden_layers:
            silent = [i in run["ran"] and i not in called for i in range(len(types))]
            conv["nope_layer_types"] = sorted(t for t in set(types)
                                              if all(s for s, u in zip(silent, types) if u == t))
        if "style" in conv:
            conv.update(measure)
            if d.get("rope_theta") is None and not d.get("rope_parameters") and "measured_base" in conv:
                conv["fixed_base"] = conv["measured_base"]  # no key holds it: the modeling code fixes it
            if "rotating_dims" in conv:
                conv["rotary_fraction"] = conv["rotating_dims"] / head_dim
            ignored = _ignored_slice_keys(d, conv, head_dim, sliced)
            if ignored:
                conv["ignored_keys"] = ignored
        out["convention"] = conv
    committed = CONVENTIONS.get(model_type) or {}
    perm = committed.get("output_permutation")  # transformers' output order, from the committed table
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
    elif out["status"] == "agree" and probe:
        out["diagnose"] = diagnose_probe(run, specs, layers, sliced, head_dim)
    return out


def _black_box(call, rotary_call, layout: str):
    """``x -> rotated x`` from transformers' own pieces: the rotary module (called with positions 0 .. s-1, in
    x's dtype) and the rotation function, at the recorded call's other arguments."""
    module, r_args, r_kwargs, r_out, _ = rotary_call
    outs = list(r_out) if isinstance(r_out, (tuple, list)) else [r_out]
    where = {i: k for i, a in enumerate(call["args"]) for k, o in enumerate(outs) if a is o}
    n_rot = len(_pairs(call))
    tensor_args = [i for i, a in enumerate(call["args"]) if isinstance(a, torch.Tensor)][:n_rot]
    s_axis = layout.split().index("s")

    def fn(x):
        pos = torch.arange(x.shape[s_axis])[None]
        args = list(r_args)
        args[0] = x
        kw = dict(r_kwargs)
        if len(args) > 1:
            args[1] = pos
        else:
            kw["position_ids"] = pos
        new = module(*args, **kw)
        new = list(new) if isinstance(new, (tuple, list)) else [new]
        call_args = list(call["args"])
        for i in tensor_args:
            call_args[i] = x
        for i, k in where.items():
            call_args[i] = new[k]
        out = call["fn"](*call_args, **call["kwargs"])
        return out[0] if isinstance(out, (tuple, list)) else out

    return fn, bool(where)


def diagnose_probe(run, specs, layers, sliced: bool, head_dim: int) -> dict:
    """``ropelab.diagnose`` on transformers' real rotary of the first layer of each distinct spec, as a black box,
    and whether its reading matches the spec: style, base, rotary_dim, scaling type."""
    from ..diagnosis import diagnose

    probes = []
    seen = set()
    for entry in layers:
        i = entry["layer"]
        spec = specs[i]
        if entry["status"] != "agree" or spec.is_nope or spec in seen:
            continue
        seen.add(spec)
        call = next(c for c in run["calls"] if c["layer"] == i)
        x = _pairs(call)[0][0]
        layout = _layout(tuple(x.shape), len(run["positions"]))
        rotary = [r for r in run["rotary"] if any(a is o for a in call["args"]
                                                  for o in (r[3] if isinstance(r[3], (tuple, list)) else [r[3]]))]
        if not rotary:
            probes.append({"layer": i, "status": "not probed", "reason": "the rotation's cos/sin are not a rotary "
                           "module's outputs as they are (reshaped or sliced on the way)"})
            continue
        fn, _ = _black_box(call, rotary[0], layout)
        d = x.shape[-1]
        r = d if sliced else (spec.rotary_dim or head_dim)
        want = {"style": spec.style, "base": spec.base, "rotary_dim": r, "scaling": spec.rope_type}
        try:
            dg = diagnose(fn, layout=layout, sizes={"d": d}, dtype=torch.float32,
                          max_position=min(4096, spec.max_position_embeddings or 4096))
        except Exception as e:  # noqa: BLE001
            probes.append({"layer": i, "status": "not probed", "reason": f"diagnose raised {_error(e)}"})
            continue
        unrecognised = (dg.scaling or "").startswith("unrecognised")
        got = {"style": dg.style, "base": dg.base, "rotary_dim": dg.rotary_dim,
               "scaling": None if unrecognised or dg.scaling is None else
               (dg.rope_scaling or {}).get("rope_type", (dg.rope_scaling or {}).get("type", "default"))}
        match = {"style": got["style"] == want["style"],
                 "base": got["base"] is not None and abs(got["base"] / want["base"] - 1) < 1e-3,
                 "rotary_dim": got["rotary_dim"] == want["rotary_dim"],
                 "scaling": got["scaling"] == want["scaling"]}
        probes.append({"layer": i, "status": "match" if all(match.values()) else "mismatch", "spec": want,
                       "diagnose": got, "fields": match, "problems": list(dg.codes)})
    return {"probes": probes}


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
    t0, c0 = time.perf_counter(), time.process_time()
    rows = {}
    for mt in chosen:
        t = time.perf_counter()
        try:
            rows[mt] = sweep_model_type(mt, found[mt], only_default=only_default)
            rows[mt]["seconds"] = round(time.perf_counter() - t, 2)  # lets a test pick the quickest per class
        except Exception as e:  # noqa: BLE001 - one family's failure is a row, never the end of the sweep
            rows[mt] = {"module": found[mt]["module"], "status": "not covered",
                        "reason": f"sweep error: {_error(e)}", "trace": traceback.format_exc(limit=3)[-600:]}
        if log:
            log(f"{mt:40s} {rows[mt]['status']:12s} {time.perf_counter() - t:5.2f}s {rows[mt].get('reason', '')[:90]}")
    return summarise(rows, found, transformers.__version__, seconds=time.perf_counter() - t0,
                     cpu_seconds=time.process_time() - c0)


# The classes of not-covered reasons the counts use: (a phrase of the reason, the class), first match wins.
REASON_CLASSES = (
    ("composite config", "composite config: the RoPE lives in a sub-config, swept as its own model type"),
    ("no module-level rotation function", "rotation inlined in the attention (no module-level apply function)"),
    ("made no call to a rotation function", "rotation inlined in the attention (no module-level apply function)"),
    ("no AutoModel and no *Model class", "no model class runs on this config class alone (a component)"),
    ("pair dims differently", "ropelab refuses: two pairings in one layer (a sparse-attention indexer)"),
    ("RopeSpec cannot represent", "ropelab refuses: a rotation RopeSpec cannot represent"),
    ("are not read by rope_type", "ropelab refuses: a RoPE variant ropelab does not have (multimodal, llama4 keys)"),
    ("ropelab:", "ropelab refuses the config it reads (ValueError)"),
    ("missing", "the model needs inputs other than tokens"),
    ("pixel_values", "the model needs inputs other than tokens"),
    ("input_features", "the model needs inputs other than tokens"),
    ("cannot run on tokens", "transformers' model fails on the sweep's tiny config"),
    ("tiny config cannot be built", "the config class rejects the sweep's tiny sizes"),
    ("does not import", "the modeling module needs a package not installed"),
)


def reason_class(reason: str) -> str:
    """The class of a not-covered reason, for the counts (``REASON_CLASSES``; else the text before its colon)."""
    return next((c for phrase, c in REASON_CLASSES if phrase in reason), reason.split(":")[0])


def summarise(rows: dict, found: dict, version: str, *, seconds: float, cpu_seconds: float) -> dict:
    """The JSON table: counts (status, not-covered reasons, convention table check, diagnose), and the rows."""
    counts = {k: sum(r["status"] == k for r in rows.values()) for k in ("agree", "disagree", "not covered")}
    reasons: dict[str, int] = {}
    for r in rows.values():
        if r["status"] == "not covered":
            reasons[reason_class(r["reason"])] = reasons.get(reason_class(r["reason"]), 0) + 1
    table = {k: sorted(mt for mt, r in rows.items() if r.get("table") == k) for k in ("differs", "absent")}
    diag = {"match": 0, "mismatch": 0, "not probed": 0}
    fields: dict[str, int] = {}
    for r in rows.values():
        v = r.get("diagnose")
        if v is None:
            continue
        key = v.split(":")[0]
        diag[key] += 1
        for f in v.split(":")[1].split(",") if ":" in v else []:
            fields[f.strip()] = fields.get(f.strip(), 0) + 1
    return {"transformers": version, "torch": torch.__version__,
            "generated_by": "python -m ropelab.conformance", "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu_seconds, 1),
            "tolerance": "per element: a*rho*(|m w|(ln b + 9) + 4)*2**-24 on rotated pairs, 16*2**-53*|x| elsewhere",
            "counts": counts, "not_covered_by_reason": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
            "convention_table": {"measured_differs_from_committed": table["differs"],
                                 "absent_from_committed": table["absent"]},
            "diagnose": {"model_types": diag, "mismatched_fields": dict(sorted(fields.items()))},
            "discovered": len(found), "conventions": conventions_of(rows), "models": dict(sorted(rows.items()))}


def readme_paragraph(table: dict, load: str = "about 7") -> str:
    """The README's paragraph on the committed table (``tests/test_conformance.py`` requires it there verbatim)."""
    c, d = table["counts"], table["diagnose"]["model_types"]
    fields = ", ".join(f"{f} {n}" for f, n in table["diagnose"]["mismatched_fields"].items()) or "none"
    lines = [
        f"`make conformance` (`python -m ropelab.conformance`) runs transformers' own modeling code for every model "
        f"type of the installed transformers that uses rotary embeddings, found by reading the library "
        f"({table['discovered']} in transformers {table['transformers']}), on a tiny config of its own config class "
        "(default; linear and yarn in the v5 schema; linear in the v4 schema), and compares each layer's rotated "
        "queries and keys with `apply_rope(x, spec=RopeSpec.per_layer(config)[layer])` in float64, element by "
        "element within a float32 rounding bound. `per_layer` takes what the config does not say (pairing, a fixed "
        "rotary fraction, NoPE layer types, aliases, ignored keys, v4 rules) from the convention table "
        "`ropelab/conformance/hf_table.py`, generated by the previous run and checked against a fresh measurement. "
        f"Result (`data/conformance/transformers-{table['transformers']}.json`): **{c['agree']} agree, "
        f"{c['disagree']} disagree and {c['not covered']} not covered**, each with its reason:",
        ""]
    for reason, n in table["not_covered_by_reason"].items():
        lines.append(f"- {reason}: {n}")
    lines += ["",
              f"`diagnose`, probing each covered family's real rotary as a black box, reads the spec's style, base, "
              f"rotary_dim and scaling type for {d['match']} of the {d['match'] + d['mismatch']} model types "
              f"probed; for {d['mismatch']} it does not (fields: {fields}; see \"where it cannot decide\" above); "
              f"{d['not probed']} could not be probed. The sweep took {round(table['seconds'] / 60)} min wall "
              f"({round(table['cpu_seconds'] / 60)} min of CPU) on one thread, on a machine shared with other jobs "
              f"(load average {load}). A new transformers release: rerun `make conformance`; a model type the table "
              "has never seen is not covered (\"not in ropelab's convention table\") until its measured entry, "
              "written by that run, is reviewed and the model type rerun."]
    return "\n".join(lines)


def conventions_of(rows: dict) -> dict[str, dict]:
    """{model_type: its convention-table entry} measured on transformers' own rotation (default variant)."""
    return {mt: table_entry(row.get("convention")) for mt, row in sorted(rows.items())
            if table_entry(row.get("convention")) is not None}


def write_conventions(conventions: dict, version: str, path: pathlib.Path = TABLE_PATH) -> None:
    """Write ``ropelab/conformance/hf_table.py``, the table ``RopeSpec.per_layer`` reads."""
    lines = ["# ruff: noqa: E501",
             f'"""The conventions of every model type, measured on transformers {version}\'s own rotation',
             "functions by ``python -m ropelab.conformance`` (generated: do not edit; rerun ``make conformance``).",
             "",
             "``style``: ``half`` pairs (i, i + r/2), ``interleaved`` (2i, 2i + 1). ``rotary_fraction``: r / head_dim",
             "in the default config of that model type (``RopeSpec.per_layer`` uses it only when the config names",
             'no fraction). The other keys are described in ``ropelab.conformance``."""',
             "", '__all__ = ["TRANSFORMERS_VERSION", "CONVENTIONS"]', "",
             f"TRANSFORMERS_VERSION = {version!r}", "", "CONVENTIONS: dict[str, dict] = {"]
    for mt, c in sorted(conventions.items()):
        lines.append(f"    {mt!r}: {c!r},")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The conformance sweep: RopeSpec.per_layer against transformers' "
                                 "own modeling code, every RoPE model type (see ropelab.conformance).")
    ap.add_argument("model_types", nargs="*", help="only these model types: their rows replace those of the "
                    "committed JSON (its counts are recomputed, its time is the full sweep's)")
    ap.add_argument("--out", default=None, help="the JSON to write (default data/conformance/transformers-<v>.json)")
    ap.add_argument("--no-table", action="store_true", help="do not rewrite ropelab/conformance/hf_table.py")
    args = ap.parse_args(argv)
    import transformers

    out = pathlib.Path(args.out) if args.out else DATA_DIR / f"transformers-{transformers.__version__}.json"
    table = sweep(args.model_types or None)
    if args.model_types and out.exists():
        old = json.loads(out.read_text())
        rows = {**old["models"], **table["models"]}
        table = {**summarise(rows, discover(), table["transformers"], seconds=old["seconds"],
                             cpu_seconds=old.get("cpu_seconds", float("nan"))),
                 "rerun_after_the_full_sweep": sorted(set(old.get("rerun_after_the_full_sweep", []))
                                                      | set(args.model_types))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    stale = table["convention_table"]
    changed = stale["measured_differs_from_committed"] + stale["absent_from_committed"]
    if not args.no_table and (not args.model_types or changed):
        from .hf_table import CONVENTIONS

        write_conventions({**(CONVENTIONS if args.model_types else {}), **table["conventions"]}, table["transformers"])
    print(f"{table['counts']} of {table['discovered']} model types in {table['seconds']} s -> {out}")
    if changed:
        print(f"the measured conventions of {changed} differ from the committed table (now rewritten): review its "
              "diff, then rerun these model types (`python -m ropelab.conformance " + " ".join(changed) + "`): "
              "their rows compared against the old table")
    return 1 if table["counts"]["disagree"] else (2 if changed else 0)
