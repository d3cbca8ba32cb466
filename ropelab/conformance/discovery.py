r"""Finding the model types by reading the installed transformers, and a tiny config of each from its own
config class (the design: ``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

__all__ = ["N_LAYERS", "N_HEADS", "SMALL_INTS", "discover", "tiny_kwargs", "variants", "config_value", "mrope_fit",
           "fitted_head", "main_rope_dict"]

N_LAYERS = 8  # enough for the layer patterns of transformers' configs (every 4th, 6th layer ...)
N_HEADS = 2

_ROT_FN = re.compile(r"^def (\w*(?:rotary|rope)\w*)\(", re.M)
_ROT_CLS = re.compile(r"^class (\w*Rotary\w*)\(", re.M)


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

SMALL_INTS = {"vocab_size": 128, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
               "num_experts_per_tok": 2, "moe_topk": 2, "n_shared_experts": 1, "num_shared_experts": 1,
               "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 16}


_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")


def _rotary_share(d) -> float:
    """The rotary share of the head in a default config (its flat rope dict's partial_rotary_factor, else 1)."""
    params = getattr(d, "rope_parameters", None)
    share = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    share = share if share is not None else getattr(d, "partial_rotary_factor", None)
    return float(share) if isinstance(share, (int, float)) and not isinstance(share, bool) else 1.0


def _get(d, key: str):
    """``d.key``, or the stored value where a per-layer config refuses the global read (Gemma 4's head_dim raises
    AmbiguousGlobalPerLayerAttributeError): the tiny sizes shrink the stored default."""
    try:
        return getattr(d, key, None)
    except RuntimeError:
        return vars(d).get(key)


def tiny_kwargs(config_cls) -> dict[str, Any]:
    """Keyword arguments that shrink ``config_cls()``: N_LAYERS layers, N_HEADS heads of the default head size,
    small MLPs, experts and vocabulary. RoPE fields (theta, scaling, partial rotary, layer patterns) untouched.
    Where the default head size cannot hold the M-RoPE sections the rotary splits, the head that does
    (:func:`mrope_fit`)."""
    kw = _shrunk(config_cls)
    return {**kw, **(mrope_fit(config_cls, kw) or {})}


def fitted_head(config_cls) -> dict[str, int] | None:
    """What :func:`tiny_kwargs` changed to fit the M-RoPE sections (:func:`mrope_fit`), None where nothing."""
    return mrope_fit(config_cls, _shrunk(config_cls))


def _shrunk(config_cls) -> dict[str, Any]:
    d = config_cls()
    kw: dict[str, Any] = {}
    heads = _get(d, "num_attention_heads")
    hidden = _get(d, "hidden_size")
    if isinstance(_get(d, "num_hidden_layers"), int):
        kw["num_hidden_layers"] = min(_get(d, "num_hidden_layers"), N_LAYERS)
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        head_dim = _get(d, "head_dim") or hidden // heads
        if not _get(d, "head_dim") and (hidden % heads or int(head_dim * _rotary_share(d)) % 2):
            # The default sizes give no valid head (GLM-4.5's 4096 / 96 heads) or an odd rotary slice (42 * 0.5):
            # the next multiple of 16 keeps every rotary share of transformers' configs (1/4, 1/2, 1) even.
            head_dim = -(-head_dim // 16) * 16
            if "head_dim" in vars(d):
                kw["head_dim"] = head_dim
        elif "head_dim" in vars(d) and _get(d, "head_dim") is None:
            kw["head_dim"] = head_dim  # the class leaves it None and its attention computes head_dim ** -0.5
        kw["num_attention_heads"] = N_HEADS
        kw["hidden_size"] = N_HEADS * head_dim
        kv = _get(d, "num_key_value_heads")
        if isinstance(kv, int) or (kv is None and "num_key_value_heads" in vars(d)):
            kw["num_key_value_heads"] = 1 if kv == 1 else N_HEADS  # None: Nemotron's attention divides by it
    for key in ("pad_token_id", "padding_idx"):
        if isinstance(_get(d, key), int) and _get(d, key) >= SMALL_INTS["vocab_size"]:
            kw[key] = 0  # an embedding of 128 rows needs its padding row inside
    # A size stored under another name than the one SMALL_INTS knows (BailingHybrid stores n_group as
    # num_expert_group, num_experts_per_tok as num_experts_per_token): the class's attribute_map says which.
    small = {**SMALL_INTS, **{stored: SMALL_INTS[alias] for alias, stored in
                              (getattr(config_cls, "attribute_map", None) or {}).items()
                              if alias in SMALL_INTS and stored not in SMALL_INTS}}
    for key, value in vars(d).items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if "intermediate_size" in key or key in ("ffn_hidden_size", "n_inner", "ffn_dim"):
            kw[key] = 32
        elif key in small and value > small[key]:
            kw[key] = small[key]
        elif key.startswith("vocab_size_") and value > SMALL_INTS["vocab_size"]:
            kw[key] = SMALL_INTS["vocab_size"]  # Gemma 3n's per-layer embedding table (262144 rows per layer)
        elif (key in ("embedding_size", "projection_dim") or key.endswith("_groups")) and value == hidden \
                and "hidden_size" in kw:
            # The embedding's width is the model's (Qwen2.5-Omni's talker adds them); a depthwise convolution's
            # groups are its channels (Mimi's upsample_groups); CLVP sizes its rotary from projection_dim / heads:
            # each follows the tiny width.
            kw[key] = kw["hidden_size"]
        elif (key.startswith("num_") and key.endswith("_layers") and key != "num_hidden_layers"
              and isinstance(kw.get("num_hidden_layers"), int) and value >= kw["num_hidden_layers"]
              and isinstance(_get(d, "num_hidden_layers"), int) and _get(d, "num_hidden_layers") > value):
            # A count of some of the layers (Gemma 3n's 15 of 35 that share their KV cache) that the tiny depth
            # cannot hold: the same share of the tiny depth, at least one.
            kw[key] = max(1, round(value * kw["num_hidden_layers"] / _get(d, "num_hidden_layers")))
    if "vocab_size" in vars(d) and _get(d, "vocab_size") is None:
        kw["vocab_size"] = SMALL_INTS["vocab_size"]  # ESM leaves it None and its embedding needs a size
    # A MoE whose default leaves the routing size None (DeepSeek-V2's num_experts_per_tok): its router calls
    # topk(k=None). Filled only where the other size is set, so a None that means "dense" stays None.
    # A MoE whose default leaves every size None but whose layers build their experts whatever the config says
    # (Dots1, DiffusionGemma's router: no boolean switch such as Gemma 4's enable_moe_block): a small MoE.
    switch = any(isinstance(v, bool) and ("moe" in k or "expert" in k) for k, v in vars(d).items())
    none_sizes = [k for k in (*_EXPERT_COUNTS, "top_k_experts", "moe_intermediate_size", "n_shared_experts")
                  if k in vars(d) and _get(d, k) is None]
    if none_sizes and not switch and not any(isinstance(_get(d, k), int) for k in _EXPERT_COUNTS):
        for k in none_sizes:
            kw[k] = {"moe_intermediate_size": 32, "top_k_experts": SMALL_INTS["num_experts_per_tok"],
                     "n_shared_experts": SMALL_INTS["n_shared_experts"]}.get(k, SMALL_INTS["num_experts"])
    experts = [k for k in _EXPERT_COUNTS if isinstance(kw.get(k, _get(d, k)), int)]
    if experts and "num_experts_per_tok" in vars(d) and _get(d, "num_experts_per_tok") is None:
        kw["num_experts_per_tok"] = SMALL_INTS["num_experts_per_tok"]
    # Hybrid models whose default has no attention layer at all (Bamba's attn_layer_indices=None: every layer is
    # Mamba) run no RoPE: the odd layers become attention layers, the layer pattern of the published ones.
    for key, value in vars(d).items():
        if value is None and key.endswith("layer_indices") and "attn" in key and "num_hidden_layers" in kw:
            kw[key] = list(range(1, kw["num_hidden_layers"], 2))
    # The same for a default of linear-attention layers only (GraniteMoeHybrid's layer_types): odd layers attend.
    types = vars(d).get("layer_types")
    if (isinstance(types, list) and types and set(types) == {"linear_attention"}
            and isinstance(kw.get("num_hidden_layers"), int)):
        kw["layer_types"] = ["full_attention" if i % 2 else "linear_attention" for i in range(kw["num_hidden_layers"])]
    # A per-layer list the class leaves None and its model indexes (LFM2-MoE's layer_types, DeepSeek-OCR-2's
    # mlp_layer_types): odd layers attend (the rule above), even ones take the other type the modeling code names
    # (``layer_types[i] != "conv"``); MLP types as DeepSeek's first_k_dense_replace lays them out.
    if isinstance(kw.get("num_hidden_layers"), int):
        n = kw["num_hidden_layers"]
        built = _built(config_cls, kw)
        if "layer_types" in vars(d) and built is not None and getattr(built, "layer_types", 0) is None:
            names = re.findall(r"layer_types\[\w+\]\s*[!=]=\s*[\"'](\w+)[\"']", _modeling_source(config_cls))
            other = sorted({x for x in names if "attention" not in x})
            if len(other) == 1:
                kw["layer_types"] = ["full_attention" if i % 2 else other[0] for i in range(n)]
        if "mlp_layer_types" in vars(d) and built is not None and getattr(built, "mlp_layer_types", 0) is None:
            k = kw.get("first_k_dense_replace", _get(d, "first_k_dense_replace"))
            k = k if isinstance(k, int) else 1
            kw["mlp_layer_types"] = ["dense" if i < k else "sparse" for i in range(n)]
    # transformers rebuilds per-layer lists (layer_types, no_rope_layers, ...) from num_hidden_layers when they
    # are not given: drop the defaults' lists so the class derives them for the tiny depth, as it would.
    if _built(config_cls, kw) is None:
        kw = _accepted(config_cls, d, kw)
    return kw


def _fails(rotary) -> bool:
    """Whether a text rotary module raises on 9 positions (GLM-4.1V's ``split_with_sizes`` of its sections)."""
    import torch

    try:
        rotary(torch.zeros(1, 9, 8), torch.arange(9)[None])
    except RuntimeError:
        return True
    except Exception:  # noqa: BLE001 - another failure: not the sections' to fit
        return False
    return False


def mrope_fit(config_cls, kw: dict) -> dict[str, int] | None:
    """The head size whose rotary slice holds exactly the pairs the M-RoPE sections split, where the tiny config's
    does not and its rotary module raises for it: {"head_dim": h} or {"hidden_size": N_HEADS * h}; else None.

    The sections are read from the modeling code's rotary module built on the tiny config (its ``mrope_section``:
    the config's, else the module's default, GLM-4.1V's [8, 12, 12], 32 pairs); h = 2 * sum(sections) /
    partial_rotary_factor, an even integer. GLM-4.1V's class default (a 128 head rotated whole: 64 pairs) fails in
    transformers' own rotary; the published checkpoints rotate half of a 128 head (64 dims, 32 pairs), which a 64
    head rotated whole reproduces. No RoPE key changes; the row records the fit (``records``)."""
    import importlib
    import inspect

    config = _built(config_cls, kw)
    if config is None or not isinstance(kw.get("hidden_size"), int):
        return None
    try:
        module = importlib.import_module(config_cls.__module__.replace(".configuration_", ".modeling_"))
    except Exception:  # noqa: BLE001 - no modeling module next to the config: nothing to fit
        return None
    for name, cls in sorted(vars(module).items()):
        if not (inspect.isclass(cls) and "Rotary" in name and cls.__module__ == module.__name__):
            continue
        annotation = getattr(inspect.signature(cls.__init__).parameters.get("config"), "annotation", None)
        if getattr(annotation, "__name__", annotation) != config_cls.__name__:
            continue
        try:
            rotary = cls(config)
        except Exception:  # noqa: BLE001 - a rotary that does not build on the tiny config: reported when run
            continue
        section = getattr(rotary, "mrope_section", None)
        inv = getattr(rotary, "inv_freq", None)
        if not (isinstance(section, (list, tuple)) and section and all(isinstance(x, int) for x in section)
                and inv is not None and inv.numel() != sum(section) and _fails(rotary)):
            continue  # sections that need not fill the slice (Qwen3's interleaved ones) run as they are
        params = getattr(config, "rope_parameters", None) or {}
        share = params.get("partial_rotary_factor", 1.0) if isinstance(params, dict) else 1.0
        head = 2 * sum(section) / float(share or 1.0)
        if head != int(head) or int(head) % 2:
            return None
        fit = {"head_dim": int(head)} if "head_dim" in kw or isinstance(_get(config, "head_dim"), int) else \
            {"hidden_size": N_HEADS * int(head)}
        fitted = _built(config_cls, {**kw, **fit})
        try:
            ok = fitted is not None and cls(fitted).inv_freq.numel() == sum(section)
        except Exception:  # noqa: BLE001
            ok = False
        return fit if ok else None
    return None


def _accepted(config_cls, d, kw: dict) -> dict:
    """``kw`` adjusted where the class refuses it for a tie between sizes (the class's validators): a default
    per-layer list the class keeps at the default depth (Zamba2's 54 layers_block_type) cut to the tiny depth's
    first layers, with its lists of layer indices; a size that the default ties to hidden_size (dots.3's
    adapter_input_size, its vision tower's adapter_in_dim) set to the tiny one; a token id outside the tiny
    vocabulary (a CTC blank) moved inside it; else (no sub-config to tie it to: ``composite``) the default width
    and heads. Each only if the class then accepts."""
    n_default, hidden = _get(d, "num_hidden_layers"), _get(d, "hidden_size")
    fixes: list[dict] = []
    if isinstance(kw.get("num_hidden_layers"), int) and isinstance(n_default, int):
        n = kw["num_hidden_layers"]
        lists = {k: v for k, v in vars(d).items() if isinstance(v, list) and "layer" in k and k not in kw}
        fixes.append({**{k: v[:n] for k, v in lists.items() if len(v) == n_default},
                      **{k: [i for i in v if i < n] for k, v in lists.items()  # Zamba2's hybrid_layer_ids
                         if len(v) != n_default and v and all(isinstance(i, int) for i in v)}})
    if isinstance(hidden, int) and "hidden_size" in kw:
        fixes.append({k: kw["hidden_size"] for k, v in vars(d).items()
                      if k.endswith(("_size", "_dim")) and k != "hidden_size" and v == hidden
                      and not isinstance(v, bool)})
    vocab = kw.get("vocab_size")
    if isinstance(vocab, int):
        fixes.append({k: vocab - 1 for k, v in vars(d).items()
                      if k.endswith("_token_id") and isinstance(v, int) and not isinstance(v, bool) and v >= vocab})
    if isinstance(hidden, int) and "hidden_size" in kw and not getattr(config_cls, "sub_configs", None):
        # A width the class ties to a list of stage widths (EfficientLoFTR's hidden_size == out_features[-1]), which
        # its backbone's other lists repeat: the default width and heads (their head size is the default's anyway).
        fixes.append({k: _get(d, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
                      if k in kw and isinstance(_get(d, k), int)})
    out = dict(kw)
    for fix in fixes:
        if fix and _built(config_cls, out) is None:
            out.update(fix)
    return out if _built(config_cls, out) is not None else kw


def _built(config_cls, kw: dict):
    try:
        return config_cls(**json.loads(json.dumps(kw)))
    except Exception:  # noqa: BLE001 - the sweep reports a config the class refuses
        return None


def _modeling_source(config_cls) -> str:
    """The source of the modeling module next to ``config_cls``'s configuration module ('' where none)."""
    import importlib
    import inspect

    name = config_cls.__module__.replace(".configuration_", ".modeling_")
    try:
        return inspect.getsource(importlib.import_module(name))
    except Exception:  # noqa: BLE001 - a config-only folder, a module needing a package not installed
        return ""


def _main_rope_dict(params: dict) -> tuple[dict, str | None]:
    """The rope dict a scaling variant replaces: the flat dict, or the full-attention entry of a nested one."""
    if "rope_type" in params or "rope_theta" in params:
        return params, None
    key = "full_attention" if "full_attention" in params else sorted(params)[0]
    return params[key], key


def _builds(config_cls, kw: dict) -> bool:
    try:
        config_cls(**json.loads(json.dumps(kw)))
    except Exception:  # noqa: BLE001 - a config the class refuses: another variant is tried
        return False
    return True


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
    if not _builds(config_cls, out["linear"]) and not _builds(config_cls, out["yarn"]):
        # A class that accepts no linear or yarn scaling (Phi-3's validate_rope: only 'longrope'): its own
        # scaling, per-pair factors over the rotary half (short ones 1, long ones rising), the long ones in use
        # past a quarter of the context.
        head = base.head_dim if isinstance(getattr(base, "head_dim", None), int) else \
            base.hidden_size // base.num_attention_heads
        half = int(head * float(main.get("partial_rotary_factor") or 1.0)) // 2
        longrope = {"rope_type": "longrope", "short_factor": [1.0] * half,
                    "long_factor": [1.0 + 3.0 * i / max(half - 1, 1) for i in range(half)],
                    "original_max_position_embeddings": max(max_pos // 4, 16)}
        new = json.loads(json.dumps(params))
        if key is None:
            new = {**keep, **longrope}
        else:
            new[key] = {**keep, **longrope}
        cand = {**kw, "rope_parameters": new}
        if "original_max_position_embeddings" in vars(base):  # Phi-3 reads its top-level key, not the dict's
            cand["original_max_position_embeddings"] = longrope["original_max_position_embeddings"]
        if _builds(config_cls, cand):
            del out["linear"], out["yarn"]
            out["longrope"] = cand
    v4 = {**kw, "rope_theta": main.get("rope_theta"), "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    if "partial_rotary_factor" in main:
        v4["partial_rotary_factor"] = main["partial_rotary_factor"]
    if "longrope" in out:
        v4["rope_scaling"] = {k: v for k, v in out["longrope"]["rope_parameters"].items() if k not in keep}
        if "original_max_position_embeddings" in out["longrope"]:
            v4["original_max_position_embeddings"] = out["longrope"]["original_max_position_embeddings"]
        out["longrope (v4 schema)"] = v4
        return out
    out["linear (v4 schema)"] = v4
    return out


# A config's value by attribute or key (records reads the tiny config's sizes with it).
config_value = _get


main_rope_dict = _main_rope_dict  # the study of notebook 09 reads which dict the sweep scales by the same rule
