r"""The conformance record of one model type: each config variant, each layer, transformers' calls against
``RopeSpec.per_layer`` (the design: ``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

import torch

from ..spec import RopeSpec, head_dim_of, text_part
from .compare import compare_call
from .convention import config_conventions, ignored_slice_keys, measure_calls, table_entry
from .discovery import tiny_kwargs, variants
from .probe import diagnose_probe
from .running import SWEEP_CANNOT, InputsRefused, SweepCannot, error_text, rotated_pairs, run_transformers

__all__ = ["sweep_model_type", "compare_layers", "SWEEP_CANNOT"]


def sweep_model_type(model_type: str, info: dict, *, only_default: bool = False, diagnose: bool = True) -> dict:
    """The conformance record of one model type (see ``ropelab.conformance``); ``diagnose=False`` skips the
    diagnose probes (the v4 variant, the same rotary as the v5 linear one, is never probed)."""
    from transformers import CONFIG_MAPPING

    row: dict[str, Any] = {"module": info["module"]}
    config_cls = CONFIG_MAPPING[model_type]
    subs = _sub_config_types(config_cls)
    composite = any(t in CONFIG_MAPPING for t in subs.values()) or _has_sub_model(config_cls)
    if composite:
        from .composite import text_key

        row["sub_config_types"], row["text_config_key"] = subs, text_key(config_cls)
        if row["text_config_key"] is not None:
            return _sweep_composite(model_type, row, config_cls, only_default=only_default, diagnose=diagnose)
        # The decoder is the top config itself (Chameleon's, DBRX's, an audio encoder's CTC head): run as a plain
        # model type, its sub-configs shrunk too (``composite.tiny_composite``).
    # No sub-config is a model type of its own (DBRX's attn_config, ESM's esmfold_config): the RoPE is read from
    # this config, so the model type is run as it is.
    try:
        module = modeling_module(model_type, info["module"])
    except Exception as e:  # noqa: BLE001 - the reason goes into the table
        return {**row, "status": "not covered", "reason": f"modeling module does not import: {error_text(e)}"}
    try:
        if composite:
            from .composite import tiny_composite

            kw = tiny_composite(config_cls)[0]
        else:
            kw = tiny_kwargs(config_cls)
        runs = variants(config_cls, kw)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "not covered", "reason": f"tiny config cannot be built: {error_text(e)}"}
    _note_fitted_head(row, config_cls)
    if composite and not isinstance(getattr(config_cls(**json.loads(json.dumps(kw))), "num_hidden_layers", None), int):
        from .composite import token_failure
        from .vision import vision_composite_reason

        config = config_cls(**json.loads(json.dumps(kw)))
        seen = vision_composite_reason(config, module, row["sub_config_types"])
        if seen is not None:
            return {**row, "status": "not covered", "reason": seen[0], "inputs": seen[1]}
        return {**row, "status": "not covered", "reason": token_failure(config, module)}
    switched = False
    for _attempt in range(4):
        if only_default:
            runs = {"default": runs["default"]}
        row["variants"] = {}
        measured = config_conventions(config_cls, kw)
        for name, kwargs in runs.items():
            row["variants"][name] = _sweep_variant(model_type, config_cls, module, kwargs,
                                                   measured if name == "default" else None,
                                                   probe=diagnose and "v4" not in name)
            if name == "default" and row["variants"][name].get("reason", "").startswith((_NO_ROPE, _CANNOT_RUN)):
                break
        reason = row["variants"]["default"].get("reason", "")
        fix = (_repair(config_cls, kw, reason) or _sub_config_repair(config_cls, kw, reason)
               or _clip_repair(config_cls, kw, reason) if reason.startswith(_CANNOT_RUN) else None)
        if fix:  # the model needs a value its config class does not give (below); every variant runs with it
            kw = {**kw, **fix}
            row["added_to_config"] = {**row.get("added_to_config", {}), **fix}
            runs = variants(config_cls, kw)
            continue
        switch = _rope_switch(config_cls, module) if not switched else None
        flag = _rope_flag(config_cls) if not switched else None
        if not reason.startswith(_NO_ROPE) or (switch is None and flag is None):
            break
        switched = True
        # The default config opts out of RoPE (GraniteMoeHybrid's position_embedding_type=None, Zamba2's
        # use_mem_rope=False): the model's own switch, read from its modeling code or its config class, turns it
        # on, and every variant runs with it.
        if switch is not None:
            kw = {**kw, "position_embedding_type": switch}
            row["position_embedding_type"] = switch
        else:
            kw = {**kw, flag: True}
            row["rope_switch"] = flag
        runs = variants(config_cls, kw)
    default = row["variants"]["default"]
    if default.get("reason", "").startswith(_CANNOT_RUN):
        tiny = default["reason"][len(_CANNOT_RUN) + 2:]
        failure = default_rotary_failure(config_cls, module)
        if failure is not None and failure.split(": ", 1)[-1].split(":")[0] != tiny.split(":")[0]:
            failure = None  # the default's rotary fails otherwise (another exception): it says nothing of this one
        built = default_build_failure(config_cls, module) if failure is None else None
        if failure is not None:
            default["reason"] = f"{_DEFAULT_FAILS}, before any tiny size ({failure}); on the tiny config: " + \
                default["reason"][len(_CANNOT_RUN) + 2:]
        elif built is not None and built == tiny:
            default["reason"] = f"{_DEFAULT_BUILD_FAILS}, before any tiny size: {built}"
    for name, v in row["variants"].items():
        v5 = row["variants"].get(name.replace(" (v4 schema)", ""))
        if (name.endswith("(v4 schema)") and v.get("reason", "").startswith(_CANNOT_RUN) and v5 is not None
                and v5["status"] in ("agree", "disagree")):
            # The same scaling ran in the v5 schema: the class does not carry the v4 keys (rope_theta and
            # rope_scaling at the top) into the rope dicts its code reads (one per layer type: KeyError).
            v["reason"] = (f"{_V4_FAILS} (the same scaling in rope_parameters runs): "
                           + v["reason"][len(_CANNOT_RUN) + 2:])
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



def _sweep_composite(model_type: str, row: dict, config_cls, *, only_default: bool, diagnose: bool) -> dict:
    """A composite config run whole on token ids (``composite``): a tiny config of each sub-config, its variants on
    the text sub-config, each compared per layer of the text sub-model against ``RopeSpec.per_layer`` of the
    composite's dict. A composite that cannot be run so is not covered, with the reason."""
    from .composite import composite_variants, tiny_composite

    try:
        module = modeling_module(model_type, row["module"])
    except Exception as e:  # noqa: BLE001 - the reason goes into the table
        return {**row, "status": "not covered", "reason": f"modeling module does not import: {error_text(e)}"}
    try:
        kw, key = tiny_composite(config_cls)
        runs = composite_variants(config_cls, kw, key)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "not covered", "reason": f"tiny config cannot be built: {error_text(e)}"}
    _note_fitted_head(row, type(getattr(config_cls(**json.loads(json.dumps(kw))), key)))
    if only_default:
        runs = {"default": runs["default"]}
    row["variants"] = {}
    for name, kwargs in runs.items():
        row["variants"][name] = _sweep_variant(model_type, config_cls, module, kwargs, None,
                                               probe=diagnose and "v4" not in name, key=key)
        reason = row["variants"]["default"].get("reason", "")
        fix = _text_repair(config_cls, kw, key, reason) if name == "default" else None
        top_fix = _top_repair(config_cls, kw, reason) if name == "default" and not fix else None
        if fix or top_fix:  # a value the text sub-config (the plain types' ``_repair``) or the top config (Emu3's
            # vocabulary_map) needs: every variant runs with it
            kw = {**kw, key: {**kw[key], **fix}} if fix else {**kw, **top_fix}
            row["added_to_config"] = {key: fix} if fix else top_fix
            runs = composite_variants(config_cls, kw, key)
            if only_default:
                runs = {"default": runs["default"]}
            return _rerun_composite(model_type, row, config_cls, module, runs, key, diagnose)
        if row["variants"]["default"]["status"] == "not covered":
            break  # the row is not covered whatever the scalings give: their runs (a big tower built again) spared
    return _composite_status(row)


def _top_repair(config_cls, kw: dict, reason: str) -> dict | None:
    """:func:`_none_mapping` on a composite's top config (Emu3's ``vocabulary_map``: ``.get``; Granite 4 Vision's
    ``deepstack_layer_map``: ``len``), where the run on tokens failed on it; None otherwise."""
    if not reason.startswith(_CANNOT_RUN):
        return None
    if "'NoneType' object has no attribute 'get'" in reason:
        return _none_mapping(config_cls, kw)
    if "object of type 'NoneType' has no len()" in reason:
        return _none_mapping(config_cls, kw, list)
    return None


def _text_repair(config_cls, kw: dict, key: str, reason: str) -> dict | None:
    """:func:`_repair` on a composite's text sub-config (Step-3.7's Step-3.5 decoder: its sliding window)."""
    if not reason.startswith(_CANNOT_RUN):
        return None
    text_cls = type(getattr(config_cls(**json.loads(json.dumps(kw))), key))
    text_kw = {k: v for k, v in kw[key].items() if k != "model_type"}
    try:
        return _repair(text_cls, text_kw, reason)
    except Exception:  # noqa: BLE001 - no repair then
        return None


def _rerun_composite(model_type, row, config_cls, module, runs, key, diagnose) -> dict:
    """The composite's variants run again on the repaired config (``_text_repair``), the default first."""
    row["variants"] = {}
    for name, kwargs in runs.items():
        row["variants"][name] = _sweep_variant(model_type, config_cls, module, kwargs, None,
                                               probe=diagnose and "v4" not in name, key=key)
        if row["variants"]["default"]["status"] == "not covered":
            break
    return _composite_status(row)


def _composite_status(row: dict) -> dict:
    """The composite row's status and reason from its variants, and its diagnose summary."""
    default = row["variants"]["default"]
    statuses = [v["status"] for v in row["variants"].values()]
    if default["status"] == "not covered":
        row["status"], row["reason"] = "not covered", default["reason"]
    else:
        row["status"] = "disagree" if "disagree" in statuses else "agree"
    probes = [pr for v in row["variants"].values() for pr in (v.get("diagnose") or {}).get("probes", [])]
    if probes:
        probed = [pr for pr in probes if pr["status"] != "not probed"]
        fields = sorted({f for pr in probed for f, ok in pr["fields"].items() if not ok})
        row["diagnose"] = ("not probed" if not probed else "mismatch: " + ", ".join(fields) if fields else "match")
    return row


def _sub_config_types(config_cls) -> dict[str, str | None]:
    """{sub-config key: its model type} of a composite config class, read from its default instance (an
    AutoConfig sub-config, Mistral3's text_config, has its model type only there); {} for a plain config."""
    subs = getattr(config_cls, "sub_configs", None) or {}
    if not subs:
        return {}
    try:
        inst = config_cls()
    except Exception:  # noqa: BLE001 - the class's own model types then
        inst = None
    out = {}
    for key, cls in subs.items():
        sub = getattr(inst, key, None) if inst is not None else None
        out[key] = getattr(sub, "model_type", None) or getattr(cls, "model_type", None) or None
    return out


_NO_ROPE = "the model applies no RoPE on this config"
_N_TOKENS = 9  # the sweep's sequence (``running.positions_for``)
_CANNOT_RUN = "transformers' model cannot run on tokens"


def _repair(config_cls, kw: dict, reason: str) -> dict | None:
    """A value the model needs and the tiny config lacks, read from the failure (None: none known). Never a RoPE
    key: the attribute a composite config of the same module sets on this one (T5Gemma 2's decoder reads the
    ``dropout_rate`` its ``T5Gemma2Config`` copies into it), a missing MLP size (Qwen3-Omni's talker reads a
    ``shared_expert_intermediate_size`` its config class never defines: the sweep's MLP size; Moonshine Streaming's
    decoder a ``num_key_value_heads``: the query heads'; Moshi's depth decoder, one token per codebook, as many
    codebooks as the sweep's tokens), or a sliding window the masks require though the class leaves it None
    (Step-3.5): 4096, more than the 9 tokens span; the default vocabulary sizes where a padding id lies past the
    tiny one (Kyutai's); sizes the class's validator requires together (:func:`_required_together`: Qwen4-Exp's QSA
    indexer); the one mapping a class leaves None while its model reads it (:func:`_none_mapping`: Chameleon's
    vocabulary_map)."""
    import re
    import sys

    m = re.search(r"Config' object has no attribute '(\w+)'", reason)
    if m and m.group(1) not in kw and "rope" not in m.group(1):
        key = m.group(1)
        module = sys.modules.get(config_cls.__module__)
        for cls in vars(module).values() if module is not None else []:
            if (isinstance(cls, type) and cls is not config_cls and getattr(cls, "sub_configs", None)
                    and isinstance(getattr(cls, key, None), (int, float)) and not isinstance(getattr(cls, key), bool)):
                return {key: getattr(cls, key)}
        if key.endswith("intermediate_size"):
            return {key: 32}
        if key == "num_key_value_heads" and isinstance(kw.get("num_attention_heads"), int):
            # Moonshine Streaming's decoder layers read it and its config class never defines it: one KV head per
            # query head (plain multi-head attention), what the class's attention then computes
            return {key: kw["num_attention_heads"]}
    if "sliding_window" in reason and "not set" in reason and "sliding_window" not in kw:
        return {"sliding_window": 4096}
    if "Padding_idx must be within num_embeddings" in reason:
        # A padding id past the tiny vocabulary (Kyutai's audio_pad_token_id is the default vocabulary plus every
        # codebook's): the class's default vocabulary sizes, which its padding ids are set for
        default = config_cls()
        fix = {k: getattr(default, k) for k, v in kw.items() if "vocab" in k and getattr(default, k, v) != v}
        return fix or None
    if "'NoneType' object has no attribute 'get'" in reason:
        empty = _none_mapping(config_cls, kw)
        if empty:
            return empty
    if "unsupported operand type(s)" in reason and "'NoneType'" in reason:
        group = _required_together(config_cls, kw)
        if group:
            return group
    codebooks = getattr(config_cls(), "num_codebooks", None)
    if ("IndexError" in reason and "out of range" in reason and "num_codebooks" not in kw
            and isinstance(codebooks, int) and codebooks < _N_TOKENS):
        # Moshi's depth decoder takes one token per codebook (its embeddings are indexed by the token's place):
        # as many codebooks as the sweep's tokens
        return {"num_codebooks": _N_TOKENS}
    from .discovery import N_HEADS
    from .discovery import config_value as _get

    d = config_cls()
    heads, kv = _get(d, "num_attention_heads"), _get(d, "num_key_value_heads")
    if (kw.get("num_key_value_heads") == N_HEADS and isinstance(kv, int) and isinstance(heads, int) and kv < heads
            and "tensor" in reason):
        # Grouped-query attention whose layers widen the KV heads (MiMo-V2-Flash's sliding layers double them, to
        # more KV heads than the tiny config's query heads): one KV head, as the default has fewer than queries.
        return {"num_key_value_heads": 1}
    return None


def _none_mapping(config_cls, kw: dict, kind: type = dict) -> dict | None:
    """The one field typed ``kind`` (dict, list) that a config class of its own (not transformers' base config)
    leaves None while its model reads it as one: an empty one. Chameleon's and Emu3's ``vocabulary_map`` (the
    tokenizer's image-token vocabulary; their ``__init__`` calls ``.get`` on it): no image tokens, the sweep runs
    text tokens; Granite 4 Vision's ``deepstack_layer_map`` (which vision layers feed which text layers; ``len``):
    none. None where there is not exactly one such field, or it is a RoPE key."""
    from transformers import PretrainedConfig

    try:
        d = config_cls(**json.loads(json.dumps(kw)))
    except Exception:  # noqa: BLE001 - nothing to read
        return None
    hints = {k: v for c in reversed(config_cls.__mro__) if not issubclass(PretrainedConfig, c)
             for k, v in vars(c).get("__annotations__", {}).items()}
    keys = [k for k, v in vars(d).items() if v is None and kind.__name__ in str(hints.get(k, "")).split(" | ")[0]
            and "rope" not in k and "config" not in k and k not in kw]
    return {keys[0]: kind()} if len(keys) == 1 else None


def _required_together(config_cls, kw: dict) -> dict | None:
    """Sizes a config class leaves None while its model computes with them (Qwen4-Exp's QSA indexer: ``None //
    None``), where the class's own validator names them as a group: setting one of its None int fields makes it
    refuse with "missing required fields: [...]". Each is given the smallest value that validator accepts, by its
    name: the sweep's heads (one key/value head), the config's head size, 1 for the others (counts, budgets,
    ratios); None where the class refuses them or names no group. Never a RoPE key."""
    import re

    from .discovery import N_HEADS
    from .discovery import config_value as _get

    try:
        d = config_cls(**json.loads(json.dumps(kw)))
    except Exception:  # noqa: BLE001 - nothing to read
        return None
    hints = {k: v for c in reversed(config_cls.__mro__) for k, v in vars(c).get("__annotations__", {}).items()}
    none_ints = [k for k, v in vars(d).items() if v is None and "int" in str(hints.get(k, "")) and "rope" not in k]
    group = None
    for key in none_ints:
        try:
            config_cls(**json.loads(json.dumps({**kw, key: 1})))
        except Exception as e:  # noqa: BLE001 - the validator's words name the group
            m = re.search(r"missing required fields: \[([^\]]*)\]", str(e))
            if m:
                group = [key] + re.findall(r"'(\w+)'", m.group(1))
                break
    if not group or any("rope" in k for k in group):
        return None
    head_dim = _get(d, "head_dim") or _get(d, "hidden_size") // _get(d, "num_attention_heads")
    fix = {k: (1 if "kv_heads" in k or "key_value" in k else N_HEADS if k.endswith("heads")
               else head_dim if k.endswith("head_dim") else 1) for k in group}
    try:
        config_cls(**json.loads(json.dumps({**kw, **fix})))
    except Exception:  # noqa: BLE001 - values the class refuses: no repair
        return None
    return fix
def _note_fitted_head(row: dict, config_cls) -> None:
    """Record in the row the head size the tiny config took to fit its M-RoPE sections (``discovery.mrope_fit``)."""
    from .discovery import fitted_head

    fit = fitted_head(config_cls)
    if fit:
        row["tiny_head_fits_mrope_section"] = fit


def _sub_config_repair(config_cls, kw: dict, reason: str) -> dict | None:
    """A key the model reads from a sub-config whose class never defines it, where the parent config holds it
    (DBRX's attention stores ``attn_config.rope_theta``, which a published config.json carries and
    ``DbrxAttentionConfig`` does not define, while its rotary reads the parent's ``rope_parameters``): the
    parent's value, so the config stays one with a single theta; {sub-config key: {key: value}}, else None."""
    import re

    m = re.search(r"'(\w+Config)' object has no attribute '(\w+)'", reason)
    if m is None:
        return None
    cls_name, key = m.groups()
    sub = next((k for k, c in (getattr(config_cls, "sub_configs", None) or {}).items()
                if getattr(c, "__name__", "") == cls_name), None)
    if sub is None or key in (kw.get(sub) or {}):
        return None
    parent = config_cls(**json.loads(json.dumps(kw)))
    params = getattr(parent, "rope_parameters", None)
    value = params.get(key) if isinstance(params, dict) else None
    if value is None and not callable(getattr(parent, key, None)):
        value = getattr(parent, key, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return {sub: {**(kw.get(sub) or {}), key: value}}


def _clip_repair(config_cls, kw: dict, reason: str) -> dict | None:
    """A clip bound the class leaves None while its attention clamps by it unconditionally (DBRX's
    ``attn_config.clip_qkv``: ``clamp(min=None, max=None)`` raises): a bound never reached (1e9), which is what
    None means; never a RoPE key. {key: value} or {sub-config key: {key: value}}, else None."""
    if "clamp" not in reason or "must not be None" not in reason:
        return None
    d = config_cls(**json.loads(json.dumps(kw)))
    for sub in [None, *(getattr(config_cls, "sub_configs", None) or {})]:
        c = d if sub is None else getattr(d, sub, None)
        keys = [k for k, v in vars(c).items() if v is None and "clip" in k and "rope" not in k] if c is not None else []
        if len(keys) == 1:
            return {keys[0]: 1e9} if sub is None else {sub: {**(kw.get(sub) or {}), keys[0]: 1e9}}
    return None


_DEFAULT_FAILS = "transformers' rotary module fails on its config class's own default config"


_V4_FAILS = "transformers' model does not run this config class in the v4 schema"
_DEFAULT_BUILD_FAILS = "transformers' model cannot be built on its config class's own default config"


def default_build_failure(config_cls, module) -> str | None:
    """The error of building the model on ``config_cls()`` untouched, on the meta device (no weights are
    allocated, so the full default sizes cost nothing), where it raises; else None. Qwen4-Exp's default leaves its
    QSA indexer sizes None while its attention builds the indexer: ``None // None`` at the default sizes too."""
    import torch

    from .running import base_model as _base_model

    try:
        config = config_cls()
    except Exception:  # noqa: BLE001 - nothing to say about the default then
        return None
    try:
        with torch.device("meta"):
            _base_model(config, module)
    except (LookupError, ImportError):
        # the sweep found no class to build (``running.base_model``), or a package transformers needs for it is not
        # installed here: no failure of transformers' own
        return None
    except Exception as e:  # noqa: BLE001
        return error_text(e)
    return None


def default_rotary_failure(config_cls, module) -> str | None:
    """The error of the modeling module's ``*Rotary*`` class, built on ``config_cls()`` untouched (the class's
    own default sizes, not the sweep's) and called on 9 positions, where it raises; else None. A model whose
    rotary fails there fails for transformers' own reason (GLM-4.1V's default M-RoPE sections [8, 12, 12] span 32
    pairs of a 64-pair head; Cohere Compass's empty default rope_parameters), whatever the tiny sizes."""
    import inspect

    import torch

    try:
        config = config_cls()
    except Exception:  # noqa: BLE001 - nothing to say about the default then
        return None
    for name, cls in sorted(vars(module).items()):
        if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and "Rotary" in name
                and cls.__module__ == module.__name__):
            continue
        annotation = getattr(inspect.signature(cls.__init__).parameters.get("config"), "annotation", None)
        if getattr(annotation, "__name__", annotation) != config_cls.__name__:
            continue  # the rotary of another config (a vision tower's on a text config)
        try:
            rotary = cls(config)
        except TypeError:
            continue  # a rotary built from sizes, not from the config (a vision tower's)
        except Exception as e:  # noqa: BLE001
            return f"{name}(config): {error_text(e)}"
        kinds = [{}]
        if "layer_type" in inspect.signature(cls.forward).parameters:  # Gemma 3's rotary, one call per layer type
            kinds = [{"layer_type": t} for t in sorted(set(getattr(config, "layer_types", None) or []))] or kinds
        for kind in kinds:
            try:
                rotary(torch.zeros(1, 9, 8), torch.arange(9)[None], **kind)
            except Exception as e:  # noqa: BLE001
                return f"{name}.forward: {error_text(e)}"
    return None


def _rope_switch(config_cls, module) -> str | None:
    """The value of ``position_embedding_type`` that the modeling code compares with a rotary name
    (``config.position_embedding_type == "rope"``), where the config class has that key; else None."""
    import inspect
    import re

    if "position_embedding_type" not in vars(config_cls()):
        return None
    values = re.findall(r"position_embedding_type\s*==\s*[\"'](\w+)[\"']", inspect.getsource(module))
    rotary = sorted({v for v in values if "rot" in v or "rope" in v})
    return rotary[0] if len(rotary) == 1 else None


def _rope_flag(config_cls) -> str | None:
    """The boolean key of the config class that turns RoPE on (``use_mem_rope``: a name with ``use_`` and
    ``rope``), where there is exactly one and the default leaves it False; else None."""
    flags = [k for k, v in vars(config_cls()).items() if v is False and k.startswith("use_") and "rope" in k]
    return flags[0] if len(flags) == 1 else None


def _has_sub_model(config_cls) -> bool:
    """Whether a sub-config of the default instance describes a network of its own (an int hidden_size or
    num_hidden_layers: Evolla's protein encoder), which the tiny sizes of the top config would not shrink."""
    try:
        inst = config_cls()
    except Exception:  # noqa: BLE001
        return True
    subs = [getattr(inst, k, None) for k in (getattr(config_cls, "sub_configs", None) or {})]
    return any(isinstance(getattr(c, a, None), int) for c in subs for a in ("hidden_size", "num_hidden_layers"))


def modeling_module(model_type: str, folder: str):
    """The modeling module of ``model_type``: its folder's ``modeling_<folder>``, else (a config-only folder,
    EXAONE's, whose model is Llama's) the module of the class transformers' AutoModel maps it to."""
    try:
        return importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
    except ModuleNotFoundError as e:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        name = MODEL_MAPPING_NAMES.get(model_type)
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is None:
            raise e
        return importlib.import_module(cls.__module__)


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



def _ignores_partial_factor(config_cls, module, kwargs: dict, d: dict, rotating: int, head_dim: int,
                            sliced: bool) -> bool:
    """Whether the default rope type's code reads no ``partial_rotary_factor`` (measured): the type's default
    config run again with the factor set to half its rotating share (in its rope dict, where transformers moves a
    top-level one) still rotates the same dims. LlamaRotaryEmbedding's ``compute_default_rope_parameters``
    rotates the whole head whatever the factor; Phi's reads it. A rope dict per layer type has the factor set in
    each. False where it cannot be measured (a scaled rope dict, a slice too small to halve, a run that fails)."""
    params = d.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        return False
    nested = all(isinstance(v, dict) for v in params.values())  # one dict per layer type (dots.3's MLA layers)
    if any(isinstance(v, dict) for v in params.values()) and not nested:
        return False
    if any(p.get("rope_type", "default") != "default" for p in (params.values() if nested else [params])):
        return False
    probe_dims = (rotating // 2) // 2 * 2
    if probe_dims < 2 or rotating > head_dim:
        return False
    factor = probe_dims / head_dim
    rope = ({k: {**v, "partial_rotary_factor": factor} for k, v in params.items()} if nested
            else {**params, "partial_rotary_factor": factor})
    try:
        config = config_cls(**json.loads(json.dumps({**kwargs, "rope_parameters": rope})))
        run = run_transformers(config, module)
        conv = measure_calls(run["calls"], run["positions"])
    except Exception:  # noqa: BLE001 - nothing measured: say nothing
        return False
    got = rotated_pairs(run["calls"][0])[0][0].shape[-1] if sliced else conv.get("rotating_dims")
    return got == rotating


def _sweep_variant(model_type, config_cls, module, kwargs, measure: dict | None, probe: bool = True,
                   key: str | None = None) -> dict:
    """One config variant: transformers' calls per layer against ``RopeSpec.per_layer`` of its dict.

    ``per_layer`` reads the committed convention table (a previous run's measurement); this run's measurement
    (``measure`` is not None for the default variant) is only recorded, never used in the comparison. ``key``: a
    composite's text sub-config (``composite``), whose decoder layers are compared; ``per_layer`` still reads the
    composite's whole dict, as it reads a composite ``config.json``."""
    from ..spec import text_part
    from .composite import composite_config
    from .hf_table import CONVENTIONS

    try:
        if key is None:
            config, d = _config_dict(config_cls, kwargs, "rope_scaling" in kwargs)
        else:
            config, d = composite_config(config_cls, kwargs, key)
    except Exception as e:  # noqa: BLE001
        return {"status": "not covered", "reason": f"transformers rejects the config: {error_text(e)}"}
    top_d, text = d, None
    if key is not None:  # the text sub-config's class and dict from here on; per_layer reads the whole dict
        text = getattr(config, key)
        config_cls, d = type(text), d[key]
    try:
        run = run_transformers(config, module) if text is None else run_transformers(config, module, text)
        config = text if text is not None else config
    except InputsRefused as e:
        return {"status": "not covered", "reason": f"transformers' model refuses the inputs the sweep builds for it "
                f"(tiny pixels, patches and grid, features or samples: {e})"}
    except SweepCannot as e:
        return {"status": "not covered", "reason": f"{SWEEP_CANNOT}: {e}"}
    except Exception as e:  # noqa: BLE001
        return {"status": "not covered", "reason": f"transformers' model cannot run on tokens: {error_text(e)}"}
    if not run["calls"] and not run["rotary"]:
        return {"status": "not covered", "reason": "the model applies no RoPE on this config: no rotary module ran "
                f"and no rotation function was called (functions wrapped: apply_* in {module.__name__})"}
    if not run["calls"]:
        return {"status": "not covered", "reason": "the forward made no call to a rotation function: RoPE is "
                f"applied elsewhere (functions wrapped: apply_* in {module.__name__})"}
    if any(c["layer"] is None for c in run["calls"]):
        return {"status": "not covered", "reason": "a rotation call outside the decoder layers (e.g. a vision "
                "tower or an encoder); the sweep attributes calls to decoder layers only"}
    # Gemma 4's vision tower: apply_multidimensional_rope calls apply_rotary_pos_emb(x=..., cos=..., sin=...) once
    # per axis, on a slice of the head
    run = _without_inner_keyword_calls(run)
    keyword_only = sorted({c["fn"].__name__ for c in run["calls"] if not rotated_pairs(c)})
    if keyword_only:
        return {"status": "not covered", "inputs": run.get("inputs"), "reason": f"a rotation function was called "
                f"with its tensors as keyword arguments only ({', '.join(keyword_only)}); the sweep reads the tensors "
                "of positional arguments"}
    if any(c.get("positions") is not None for c in run["calls"]):
        return _sweep_axes_variant(model_type, config, d, run, measure)
    short = _shorter_than_positions(run)  # said after ropelab's own reading: a refusal of it comes first
    if run["positions"] is None:
        return {"status": "not covered", "inputs": run.get("inputs"), "reason": "the positions the model rotated by "
                "could not be read: its rotary module was not called with one position_ids tensor of one or several "
                "axes (the sweep reads positions from that call, never re-derives them)"}
    out: dict[str, Any] = {"positions": run["positions"], "dtype": run["dtype"]}
    if "inputs" in run:
        out["inputs"] = run["inputs"]
    for k in ("layers_by", "text_model_alone"):
        if k in run:
            out[k] = run[k]
    try:
        head_dim = head_dim_of({**d, **{k: d[v] for k, v in getattr(config_cls, "attribute_map", {}).items()
                                        if v in d and k not in d}})
    except Exception as e:  # noqa: BLE001
        return {**out, "status": "not covered", "reason": f"ropelab: {error_text(e)}"}
    call_dim = rotated_pairs(run["calls"][0])[0][0].shape[-1]
    sliced = call_dim < head_dim  # the attention hands the function only the rotary slice (GPT-J)
    if measure is not None:
        try:
            conv = measure_calls(run["calls"], run["positions"])
        except Exception as e:  # noqa: BLE001
            conv = {"error": error_text(e)}
        types = list(getattr(config, "layer_types", None) or [])
        called = {c["layer"] for c in run["calls"]}
        if len(types) == run["n_layers"]:
            silent = [i in run["ran"] and i not in called for i in range(len(types))]
            conv["nope_layer_types"] = sorted(t for t in set(types)
                                              if all(s for s, u in zip(silent, types) if u == t))
        if "style" in conv:
            conv.update(measure)
            if d.get("rope_theta") is None and not d.get("rope_parameters") and "measured_base" in conv:
                conv["fixed_base"] = conv["measured_base"]  # no key holds it: the modeling code fixes it
            if "rotating_dims" in conv:
                conv["rotary_fraction"] = conv["rotating_dims"] / head_dim
            ignored = ignored_slice_keys(d, conv, head_dim, sliced)
            if "partial_rotary_factor" not in ignored and _ignores_partial_factor(
                    config_cls, module, kwargs, d, conv["rotating_dims"] if not sliced else call_dim, head_dim,
                    sliced):
                ignored.append("partial_rotary_factor")
            if ignored:
                conv["ignored_keys"] = ignored
        out["convention"] = conv
    read_type = model_type if key is None else (text_part(top_d) or {}).get("model_type")
    committed = CONVENTIONS.get(read_type) or {}
    perm = committed.get("output_permutation")  # transformers' output order, from the committed table
    per_rotation = None
    try:
        specs = RopeSpec.per_layer(top_d)
    except Exception as e:  # noqa: BLE001
        per_rotation = _per_rotation_specs(top_d, committed)
        mrope = None if per_rotation is not None else _mrope_text_read(top_d, run)
        if per_rotation is None and mrope is None:
            # a type the table lacks because its calls could not be measured (shorter than the positions: Muse
            # Glimmer's drafter) keeps that reason, which says why
            absent = short is not None and read_type not in CONVENTIONS
            out.update(status="not covered", reason=short if absent else f"ropelab: {error_text(e)}")
            return out
        if mrope is not None:
            specs, out["mrope"] = mrope
    if short is not None:
        out.update(status="not covered", reason=short)
        return out
    if per_rotation is not None:
        layers, specs = _compare_per_rotation(run, per_rotation, committed, head_dim), None
        out["rotations"] = {fn: st for fn, (st, _) in per_rotation.items()}
    else:
        layers = compare_layers(run, specs, run["n_layers"], head_dim, call_dim, perm)
    out["layers"] = layers
    st = [e["status"] for e in layers]
    out["status"] = "disagree" if "disagree" in st else ("agree" if "agree" in st else "not covered")
    if out["status"] == "not covered":
        out["reason"] = layers[0].get("reason", "no layer compared")
    elif out["status"] == "agree" and probe and specs is not None:
        out["diagnose"] = diagnose_probe(run, specs, layers, sliced, head_dim)
    return out


def _without_inner_keyword_calls(run: dict) -> dict:
    """``run`` without the keyword-only rotation calls made inside another recorded rotation call (Gemma 4's
    ``apply_multidimensional_rope(x, cos, sin, position_ids)`` calls ``apply_rotary_pos_emb(x=..., cos=..., sin=...)``
    on each axis' slice of the head): the outer call, recorded with its whole input and output, is the rotation
    compared. A keyword-only call made on its own stays, and leaves the row not covered."""
    inner = [c for c in run["calls"] if c.get("inside") and not rotated_pairs(c)]
    if not inner:
        return run
    return {**run, "calls": [c for c in run["calls"] if not any(c is i for i in inner)]}


def _per_rotation_specs(top_d: dict, committed: dict) -> dict | None:
    """{rotation function: (its pairing, ``RopeSpec.per_layer(config, style=that pairing)``)} for a model type whose
    layers call rotation functions that pair differently (the committed table's ``rotations``: DeepSeek-V3.2's
    sparse-attention indexer pairs half, its main attention interleaved), which ``per_layer`` without ``style=``
    refuses; None for any other model type, or where ``per_layer`` refuses a pairing too."""
    rotations = committed.get("rotations")
    if not rotations or any(st not in ("half", "interleaved") for st in rotations.values()):
        return None
    try:
        return {fn: (st, RopeSpec.per_layer(top_d, style=st)) for fn, st in rotations.items()}
    except Exception:  # noqa: BLE001 - the row keeps per_layer's own refusal
        return None


def _compare_per_rotation(run: dict, per_rotation: dict, committed: dict, head_dim: int) -> list[dict]:
    """Each layer's calls of each rotation function against ``per_layer(config, style=)`` of that function's
    measured pairing, with that function's committed output order; a layer's entry is its worst function's, with
    each function's status under ``rotations``. A function the layers call that the table does not list leaves the
    layer not covered."""
    perms = committed.get("rotation_permutations", {})
    by_fn: dict[str, list[dict]] = {}
    for fn, (_, specs) in per_rotation.items():
        calls = [c for c in run["calls"] if c["fn"].__name__ == fn]
        if not calls:
            continue
        sub = {**run, "calls": calls}
        call_dim = rotated_pairs(calls[0])[0][0].shape[-1]
        by_fn[fn] = compare_layers(sub, specs, run["n_layers"], head_dim, call_dim, perms.get(fn))
    unknown = sorted({c["fn"].__name__ for c in run["calls"]} - set(per_rotation))
    rank = {"disagree": 2, "not covered": 1, "agree": 0}
    layers = []
    for i in range(run["n_layers"]):
        entries = {fn: ls[i] for fn, ls in by_fn.items()}
        called = {fn: e for fn, e in entries.items() if "max_error" in e or e["status"] != "agree"}
        worst = max(called.values() or entries.values(),
                    key=lambda e: (rank[e["status"]], e.get("error_over_bound", 0.0)))
        entry = {**worst, "rotations": {fn: e["status"] for fn, e in entries.items()}}
        if unknown and any(c["layer"] == i and c["fn"].__name__ in unknown for c in run["calls"]):
            entry.update(status="not covered", reason=f"rotation function(s) {unknown} are not in the table's "
                         "rotations")
        layers.append(entry)
    return layers


def _mrope_text_read(top_d: dict, run: dict):
    """``(specs, sections, note)`` of an M-RoPE text model (``mrope_section`` in its rope dict, which
    ``RopeSpec.per_layer`` refuses) read by ropelab's M-RoPE reader, ``ropelab.engines.hf.read_config`` (the specs of
    the config without its M-RoPE keys, and its ``MultiAxis``); None where the config is not M-RoPE, the reader
    refuses it, or the rotary module did not see every axis equal (text tokens: position_ids [A, batch, s] with one
    row repeated, as Qwen2-VL numbers them). On text tokens each pair turns by the one position whatever axis drives
    it, so ``apply_rope`` with the reading's specs at that position (as Qwen2-VL's text path, whose configs hold no
    sections, is compared) checks the ladder, base and pairing, not the sections themselves; the row says so."""
    from ..engines.hf import read_config

    text = text_part(top_d)
    params = (text or {}).get("rope_parameters") or (text or {}).get("rope_scaling")
    if not isinstance(params, dict) or "mrope_section" not in params:
        return None
    seen = [p for *_, p in run.get("rotary", ()) if isinstance(p, torch.Tensor)]
    if not seen or run["positions"] is None or not all(
            p.dim() == 3 and p.shape[-1] == len(run["positions"])
            and bool((p.reshape(-1, p.shape[-1]) == torch.as_tensor(run["positions"])).all()) for p in seen):
        return None
    try:
        reading = read_config(top_d)
    except Exception:  # noqa: BLE001 - the row keeps per_layer's own refusal
        return None
    if reading.sections is None:
        return None
    return (reading.layers,
            f"M-RoPE (sections {list(reading.sections.sections)}) read by ropelab.engines.hf.read_config; the text "
            f"tokens have every position axis equal, so the ladder, base and pairing are compared, not the sections")
def _shorter_than_positions(run: dict) -> str | None:
    """Why a run cannot be compared where a rotated tensor has no axis as long as the positions read from the
    rotary module (Muse Glimmer's drafter rotates 9 queries against keys over its context and those 9): which of
    the positions such a tensor took is not read from the call; None where every tensor has one."""
    n = len(run["positions"]) if run.get("positions") is not None else None
    if n is None:
        return None
    for c in run["calls"]:
        if c.get("token_positions") is not None:  # its tokens' positions were read from its cos rows
            continue
        for x, _ in rotated_pairs(c):
            if n not in x.shape[:-1]:
                return (f"a rotated tensor of shape {list(x.shape)} has no axis of the {n} positions its rotary "
                        "module was called with (queries fewer than keys); which positions it took is not read "
                        "from the call, so the sweep does not compare it")
    return None


def _nope_layer_types(config, run: dict) -> list[str] | None:
    """The layer types whose layers all ran and made no rotation call (measured), where the config has layer_types."""
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != run["n_layers"]:
        return None
    called = {c["layer"] for c in run["calls"]}
    silent = [i in run["ran"] and i not in called for i in range(len(types))]
    return sorted(t for t in set(types) if all(s for s, u in zip(silent, types) if u == t))


def _sweep_axes_variant(model_type, config, d: dict, run: dict, measure: dict | None) -> dict:
    """A vision tower's variant: each call's positions [A, s] (``running``: read from its rotary module), against
    ``ropelab.multiaxis.per_layer_axes`` of the config dict (the committed table's measured ``axes``); this run's
    measurement (``measure_axes``) is only recorded."""
    from ..multiaxis import per_layer_axes
    from .hf_table import CONVENTIONS

    out: dict[str, Any] = {"positions": "each call's (row, column) per patch, from the rotary module",
                           "inputs": run.get("inputs"), "dtype": run["dtype"]}
    prefix = [c["prefix"] for c in run["calls"] if c.get("prefix")]
    if prefix:  # leading tokens the rotary module did not number (running._prefixed_positions): not compared
        out["prefix_not_compared"] = {"tokens": sorted({p["tokens"] for p in prefix}),
                                      "identity": all(p["identity"] for p in prefix),
                                      "calls": len(prefix), "of_calls": len(run["calls"])}
    if measure is not None:
        try:
            conv = measure_calls(run["calls"], None)
        except Exception as e:  # noqa: BLE001
            conv = {"error": error_text(e)}
        if "style" in conv:
            conv.update(measure)
            if "rotating_dims" in conv:
                conv["rotary_fraction"] = conv["rotating_dims"] / conv["call_dim"]
        nope = _nope_layer_types(config, run)
        if nope is not None:
            conv["nope_layer_types"] = nope
        out["convention"] = conv
    perm = (CONVENTIONS.get(model_type) or {}).get("output_permutation")
    try:
        read = per_layer_axes(d)
    except Exception as e:  # noqa: BLE001
        out.update(status="not covered", reason=f"ropelab: {error_text(e)}")
        return out
    call_dim = rotated_pairs(run["calls"][0])[0][0].shape[-1]
    layers = compare_layers(run, [s for s, _ in read], run["n_layers"], call_dim, call_dim, perm,
                            sections=[a for _, a in read])
    out["layers"] = layers
    st = [e["status"] for e in layers]
    out["status"] = "disagree" if "disagree" in st else ("agree" if "agree" in st else "not covered")
    if out["status"] == "not covered":
        out["reason"] = layers[0].get("reason", "no layer compared")
    return out


def compare_layers(run: dict, specs, n_layers: int, head_dim: int, call_dim: int, perm,
                   sections=None) -> list[dict]:
    """Per decoder layer: transformers' recorded calls (``run_transformers``) against ropelab's ``specs``
    (``RopeSpec.per_layer``), each call element by element within the bound (``compare_call``). ``call_dim`` is the
    width transformers' rotation function was handed (less than ``head_dim`` where the attention slices the rotary
    part first, GPT-J), ``perm`` its measured output order."""
    sliced = call_dim < head_dim
    layers = []
    for i in range(n_layers):
        spec = specs[i] if i < len(specs) else None
        calls = [c for c in run["calls"] if c["layer"] == i]
        axes = sections[i] if sections is not None and i < len(sections) else None
        entry: dict[str, Any] = {"layer": i, "spec": None if spec is None else spec.to_dict()}
        if axes is not None:
            entry["sections"] = dataclasses.asdict(axes)
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
            if all(not bool(x.any()) for c in calls for x, _ in rotated_pairs(c)):
                # every rotated query and key is zero (inputs masked away before the layer): any rotation agrees
                entry.update(status="not covered", reason="the rotated queries and keys are all zero: nothing "
                             "to compare")
                layers.append(entry)
                continue
            try:
                res = [compare_call(c, run["positions"], use, perm, axes) for c in calls]
            except Exception as e:  # noqa: BLE001
                entry.update(status="not covered", reason=f"cannot compare: {error_text(e)}")
            else:
                entry["max_error"] = max(r["max_error"] for r in res)
                entry["error_over_bound"] = max(r["error_over_bound"] for r in res)
                entry["status"] = "agree" if entry["error_over_bound"] <= 1.0 else "disagree"
        layers.append(entry)
    return layers
