r"""Composite configs (a vision-language model's ``text_config`` and its towers) run whole, on token ids: a tiny
config of each sub-config, the model's text path recorded per decoder layer of its text sub-model (the design:
``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import json
import re
from typing import Any

from .discovery import tiny_kwargs, variants

__all__ = ["TOWER_LAYERS", "text_key", "tiny_composite", "composite_variants", "composite_config", "token_failure"]

TOWER_LAYERS = 2  # the towers (vision, audio) are built, never run on tokens: two layers keep them cheap


def _default(config_cls):
    try:
        return config_cls()
    except Exception:  # noqa: BLE001 - a class without a default: nothing to shrink from
        return None


def text_key(config_cls) -> str | None:
    """The key of the decoder's sub-config in a composite config class: the one ``get_text_config(decoder=True)``
    of its default instance returns (transformers' own choice: ``text_config``, ``decoder``, ...), where that is a
    sub-config with a ``num_hidden_layers``; else None."""
    inst = _default(config_cls)
    if inst is None:
        return None
    try:
        text = inst.get_text_config(decoder=True)
    except Exception:  # noqa: BLE001 - ambiguous (several text configs): none chosen
        return None
    if text is inst or not isinstance(getattr(text, "num_hidden_layers", None), int):
        return None
    return next((k for k in (getattr(config_cls, "sub_configs", None) or {}) if getattr(inst, k, None) is text), None)


def _tower_kwargs(sub_cls) -> dict[str, Any]:
    """A tower's tiny sizes: :func:`tiny_kwargs` (the text sizes, heads of their default width) and at most
    ``TOWER_LAYERS`` of its layers / blocks (keys holding ``layers`` or ``depth``); a tower with sub-configs of its
    own (DeepSeek-OCR 2's SAM and encoder) has each shrunk the same way (:func:`_shrunk_subs`)."""
    kw = tiny_kwargs(sub_cls)
    d = _default(sub_cls)
    for key, value in (vars(d).items() if d is not None else ()):
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if (key == "depth" or key.endswith("_layers") or key.endswith("_depth")) and value > TOWER_LAYERS:
            kw[key] = TOWER_LAYERS
    if d is not None:
        kw.update(_shrunk_subs(sub_cls, d))
    return kw


def _shrunk_subs(config_cls, inst, text: str | None = None) -> dict[str, Any]:
    """{key: tiny kwargs} of each sub-config of ``inst``: ``text`` by :func:`tiny_kwargs`, the others (towers) by
    :func:`_tower_kwargs`, else by :func:`tiny_kwargs`, else at their default sizes, the first their class
    accepts; each with its ``model_type`` where it has one (AutoConfig sub-configs are built from it)."""
    kw: dict[str, Any] = {}
    for k in getattr(config_cls, "sub_configs", None) or {}:
        sub = getattr(inst, k, None)
        if sub is None or not hasattr(sub, "to_dict"):
            continue
        if k == text:
            sub_kw = tiny_kwargs(type(sub))
        else:
            sub_kw = next((c for c in (_tower_kwargs(type(sub)), tiny_kwargs(type(sub))) if _builds(type(sub), c)),
                          {})
        if sub_kw:  # nothing to shrink (DBRX's attn_config): the class's own default, as it builds it
            kw[k] = {"model_type": sub.model_type, **sub_kw} if getattr(sub, "model_type", "") else sub_kw
    return kw


def _builds(cls, kw: dict) -> bool:
    try:
        cls(**json.loads(json.dumps(kw)))
    except Exception:  # noqa: BLE001 - sizes the class refuses: a milder shrink is tried
        return False
    return True


def tiny_composite(config_cls) -> tuple[dict[str, Any], str | None]:
    """(keyword arguments of a tiny ``config_cls``, the key of its text sub-config, None where the decoder is the
    top config itself: Chameleon's, DBRX's): each sub-config of the default instance as a dict of its own tiny
    sizes, with its ``model_type`` where the class builds it through AutoConfig. The text one (or the top config)
    by :func:`tiny_kwargs`, every RoPE key kept; a tower by :func:`_tower_kwargs`, else by :func:`tiny_kwargs`,
    else at its default sizes, the first its class accepts."""
    key = text_key(config_cls)
    kw: dict[str, Any] = {}
    if key is None:
        kw = _own_names(config_cls, tiny_kwargs(config_cls))
        # BLT's hash-n-gram embeddings (encoder_hash_byte_group_vocab=500002 rows): a vocabulary the RoPE never reads
        for k, v in vars(config_cls()).items():
            if "vocab" in k and isinstance(v, int) and not isinstance(v, bool) and v > 128 and k not in kw:
                kw[k] = 128
    kw = {**kw, **_shrunk_subs(config_cls, config_cls(), key)}
    if not _builds(config_cls, kw):
        kw = _tied_composite(config_cls, config_cls(), kw, key)
    return kw, key


def _own_names(config_cls, kw: dict) -> dict[str, Any]:
    """``kw`` under the names the class stores (its ``attribute_map``'s targets) where the decoder is the top config
    of a composite: DBRX's ``__post_init__`` copies ``d_model`` into its ``ffn_config`` before the alias
    ``hidden_size`` is applied, so a tiny width given as ``hidden_size`` leaves its experts at the default one."""
    amap = getattr(config_cls, "attribute_map", None) or {}
    fields = vars(_default(config_cls) or object())
    return {amap[k] if k in amap and amap[k] in fields and amap[k] not in kw else k: v for k, v in kw.items()}


_WIDTH_NAME = re.compile(r"hidden|(in|out|condition)_dim$")  # a width, never a count such as a codebook size


def _tied_composite(config_cls, inst, kw: dict, key: str | None) -> dict[str, Any]:
    """``kw`` adjusted where the composite class refuses it for a tie between its sub-configs (its validators), each
    step kept only while the class still refuses: (1) a width the default ties to a width the tiny sizes changed
    (a tower's ``out_hidden_size``, a flow head's ``condition_dim``, a diarization head's ``audio_hidden_size``,
    equal to the text, backbone or audio ``hidden_size`` at the defaults) set to the tiny one; (2) the towers at
    their default depth, at their tiny width (Molmo2's adapter reads tower layers 24 and 18); (3) the text
    vocabulary at its default size (Apertus 1.5's audio and image token ranges lie inside it); the first of
    each step alone, the ties with one other, all three that the class accepts. None of these is a
    RoPE key: the text sub-config's rope keys and head geometry are those of :func:`tiny_kwargs`."""
    subs = [k for k in getattr(config_cls, "sub_configs", None) or {} if hasattr(getattr(inst, k, None), "to_dict")]
    parts = [(None, inst, kw)] + [(k, getattr(inst, k), kw.get(k, {})) for k in subs]
    changed: dict[int, set] = {}
    for _, c, ckw in parts:
        h = getattr(c, "hidden_size", None)
        if isinstance(h, int) and not isinstance(h, bool) and isinstance(ckw.get("hidden_size"), int) \
                and ckw["hidden_size"] != h:
            changed.setdefault(h, set()).add(ckw["hidden_size"])
    tie = {h: next(iter(v)) for h, v in changed.items() if len(v) == 1}  # two tiny widths for one default: no tie

    ties: dict[str | None, dict] = {}
    for k, c, ckw in parts:
        fix = {name: tie[v] for name, v in vars(c).items() if name not in ckw and name != "hidden_size"
               and _WIDTH_NAME.search(name) and isinstance(v, int) and not isinstance(v, bool) and v in tie}
        if fix:
            ties[k] = fix
    deep = {}
    for k, c, ckw in parts[1:]:
        depth = {name: v for name, v in vars(c).items() if isinstance(v, int) and not isinstance(v, bool)
                 and (name == "depth" or name.endswith("_layers") or name.endswith("_depth"))
                 and isinstance(ckw.get(name), int) and ckw[name] < v}
        if depth and k != key:
            deep[k] = depth
    steps = [ties, deep]
    text = getattr(inst, key, None) if key is not None else inst
    vocab = getattr(text, "vocab_size", None)
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        steps.append({key: {"vocab_size": vocab}})

    def applied(chosen):
        out = json.loads(json.dumps(kw))
        for step in chosen:
            for k, fix in step.items():
                if k is None:
                    out.update(fix)
                    continue
                c = getattr(inst, k)
                base = out.get(k) or ({"model_type": c.model_type} if getattr(c, "model_type", "") else {})
                out[k] = {**base, **fix}
        return out

    steps = [s for s in steps if s]
    # each step alone, then the ties with each other step, then all: the fewest changes the class accepts
    for chosen in [[s] for s in steps] + [[steps[0], s] for s in steps[1:]] + [steps]:
        out = applied(chosen)
        if _builds(config_cls, out):
            return out
    return kw


def composite_variants(config_cls, kw: dict, key: str) -> dict[str, dict]:
    """{name: kwargs}: the tiny composite and, where its text sub-config has rope_parameters, the plain types'
    variants (``discovery.variants``: linear / yarn, or longrope, and the v4 one) applied to the text sub-config
    (``key``; None: to the top config, as for a plain model type)."""
    if key is None:
        return variants(config_cls, kw)
    text = getattr(config_cls(**json.loads(json.dumps(kw))), key)
    text_kw = {k: v for k, v in kw[key].items() if k != "model_type"}
    out = {}
    for name, v in variants(type(text), text_kw).items():
        out[name] = {**kw, key: {**({"model_type": kw[key]["model_type"]} if "model_type" in kw[key] else {}), **v}}
    return out


def composite_config(config_cls, kwargs: dict, key: str) -> tuple[Any, dict]:
    """(the transformers config, the dict ropelab reads): ``to_dict()``; for the v4 variant the text sub-config's
    dict holds the v4 keys as an old config.json does (transformers converts them itself)."""
    config = config_cls(**json.loads(json.dumps(kwargs)))
    d = config.to_dict()
    sub = kwargs[key]
    if "rope_scaling" in sub:
        t = d[key]
        t.pop("rope_parameters", None)
        t["rope_theta"], t["rope_scaling"] = sub["rope_theta"], dict(sub["rope_scaling"])
        if "partial_rotary_factor" in sub:
            t["partial_rotary_factor"] = sub["partial_rotary_factor"]
    return config, d


def token_failure(config, module) -> str:
    """Why a composite without a decoder of its own (no text sub-config, no ``num_hidden_layers``: a speech or
    vision model whose RoPE lives in an encoder sub-config) is not compared: the error its model, built on the tiny
    config, raises when run on token ids (``missing ... 'input_features'``), or that it ran and has no decoder
    layers to attribute rotation calls to."""
    import torch

    from .running import SweepCannot, error_text
    from .running import base_model as _base_model

    try:
        torch.manual_seed(0)
        model = _base_model(config, module).double().eval()
        with torch.no_grad():
            model(input_ids=torch.randint(0, 100, (1, 9)))
    except SweepCannot as e:
        from .running import SWEEP_CANNOT as _SWEEP_CANNOT

        return f"{_SWEEP_CANNOT}: {e}"
    except Exception as e:  # noqa: BLE001 - the reason goes into the table
        ran = _runs_on_built_inputs(model, config) if "model" in locals() else None
        if ran is None:
            return f"transformers' model cannot run on tokens: {error_text(e)}"
        return (f"the model runs on the inputs the sweep builds ({', '.join(sorted(ran))}), but it has no text "
                "sub-config and no num_hidden_layers: no decoder layers to attribute rotation calls to")
    return ("the model runs on token ids, but it has no text sub-config and no num_hidden_layers: no decoder "
            "layers to attribute rotation calls to")


def _runs_on_built_inputs(model, config) -> dict | None:
    """The first of ``running.model_inputs``'s candidates a composite without a decoder runs on (a CTC speech
    model on features), None where it takes tokens or refuses them all."""
    import torch

    from .running import model_inputs

    for kw in model_inputs(model, config, torch.float64):
        try:
            with torch.no_grad():
                model(**kw)
        except Exception:  # noqa: BLE001 - the next candidate
            continue
        return kw
    return None
