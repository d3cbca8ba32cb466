r"""transformers ``config.json``, both directions: :func:`read_config` (a config as a :class:`Reading`) and
:func:`write_config` (a :class:`Reading` as a config, v5 or v4 schema).

Reading is :meth:`ropelab.spec.RopeSpec.per_layer` (the keys of both schemas, the pairing and rotary fraction
transformers' code fixes per model type, measured into ``ropelab.conformance.hf_table``), plus what it leaves
out: the M-RoPE keys ``mrope_section`` / ``mrope_interleaved`` (:meth:`ropelab.multiaxis.MultiAxis.from_hf_config`)
and the ``text_config`` of a vision-language config.

Writing produces the keys transformers reads:

- v5: ``rope_parameters``, one dict (``rope_type``, ``rope_theta``, ``partial_rotary_factor`` and the type's
  keys) or one dict per layer type of ``layer_types`` (Gemma 3's ``full_attention`` / ``sliding_attention``);
- v4: ``rope_theta``, ``rope_scaling`` and ``partial_rotary_factor`` at the top level, and for the models whose
  config class has a v4 rule for per-layer-type RoPE (``hf_table``'s ``v4``: Gemma 3's ``rope_local_base_freq``
  for its sliding layers) that rule.

A reading a schema cannot express (different RoPE in two layers of one layer type, a pairing the model type's
code fixes otherwise, a NoPE layer where the config has no switch for it, axial sections) raises ValueError
saying what and why. Every written config is read back with ``RopeSpec.per_layer`` and must give the reading's
:meth:`~ropelab.engines.reading.Reading.effective_specs` exactly, else ValueError: nothing is written that
transformers would read otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..multiaxis import MultiAxis
from ..spec import RopeSpec, head_dim_of, hf_config_notes
from .reading import ReadError, Reading

__all__ = ["read_config", "write_config", "load_config", "SCHEMAS"]

SCHEMAS = ("v5", "v4")

# Keys of a rope dict that say M-RoPE, which RopeSpec does not hold (the sections are Reading.sections).
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
# Top-level RoPE keys a written config replaces (what per_layer reads for the base, scaling and rotary slice).
_ROPE_TOP_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "rope_local_base_freq")
# The keys shown as a reading's ``declared`` (the raw RoPE keys as written).
_DECLARED = ("model_type", "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor", "rotary_dim",
             "rotary_pct", "rope_local_base_freq", "rope_interleave", "layer_types", "sliding_window_pattern",
             "no_rope_layers", "head_dim", "qk_rope_head_dim", "hidden_size", "num_attention_heads",
             "num_hidden_layers", "max_position_embeddings")


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def load_config(source: str | Path | Mapping[str, Any]) -> tuple[dict, str]:
    """``(config dict, label)`` from a ``config.json`` path, a model directory holding one, a dict, or a
    transformers ``PretrainedConfig`` (its ``to_dict()``).

    ReadError (a ValueError) for a path that does not exist, a directory without ``config.json``, a file that
    is not JSON, or JSON that is not an object."""
    if isinstance(source, Mapping):
        return dict(source), "<config dict>"
    if callable(getattr(source, "to_dict", None)) and hasattr(source, "model_type"):  # a PretrainedConfig
        return source.to_dict(), f"<{type(source).__name__}>"
    if not isinstance(source, (str, Path)):
        raise ReadError(f"a transformers config is a path or a dict, got {type(source).__name__}.")
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ReadError(f"{path}: a directory with no config.json; give the model directory a transformers "
                            "config.json, or name the config file (or a .gguf file) directly.")
        path = path / "config.json"
    if not path.is_file():
        raise ReadError(f"{path}: no such file or directory.")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReadError(f"{path}: not a readable JSON file ({e}); a transformers config.json is a JSON object.") from e
    if not isinstance(config, dict):
        raise ReadError(f"{path}: the JSON holds a {type(config).__name__}, not an object; not a config.json.")
    return config, str(path)


def _text_part(config: dict) -> tuple[dict, list[str]]:
    """The decoder's config: a vision-language config's ``text_config``, or a flat VL config renamed to its text
    model type (``qwen2_vl`` -> ``qwen2_vl_text``, the type the convention table holds)."""
    from ..conformance.hf_table import CONVENTIONS

    notes = []
    text = config.get("text_config")
    if isinstance(text, Mapping):
        merged = dict(text)
        if merged.get("model_type") is None and isinstance(config.get("model_type"), str):
            merged["model_type"] = f"{config['model_type']}_text"
        notes.append(f"read the decoder's RoPE from text_config (model_type {merged.get('model_type')!r}).")
        return merged, notes
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type not in CONVENTIONS and f"{model_type}_text" in CONVENTIONS:
        notes.append(f"model_type {model_type!r} read as its text model {model_type}_text.")
        return {**config, "model_type": f"{model_type}_text"}, notes
    return config, notes


def _without_mrope(config: dict) -> tuple[dict, MultiAxis | None, list[str]]:
    """(config without the M-RoPE keys, its sections, notes). A v4 ``{"type": "mrope"}`` is default RoPE with
    sections (transformers' Qwen2-VL config turns it into ``default``)."""
    notes: list[str] = []
    sections = None
    params = config.get("rope_parameters") if config.get("rope_parameters") is not None else config.get("rope_scaling")
    if isinstance(params, Mapping) and "mrope_section" in params:
        sec = params["mrope_section"]
        if (isinstance(sec, (str, bytes, Mapping)) or not isinstance(sec, Sequence) or not sec
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sec)):
            raise ValueError(f"mrope_section must be a list of ints >= 0 (rotary pairs per position axis, e.g. "
                             f"[16, 24, 24]), got {sec!r}.")
        sections = MultiAxis.from_hf_config(config)
    config = dict(config)
    for key in ("rope_parameters", "rope_scaling"):
        d = config.get(key)
        if not isinstance(d, Mapping) or not any(k in d for k in (*_MROPE_KEYS, "type", "rope_type")):
            continue
        d = {k: v for k, v in d.items() if k not in _MROPE_KEYS}
        for tk in ("rope_type", "type"):
            if d.get(tk) == "mrope":
                d[tk] = "default"
                notes.append(f"{key}: rope type 'mrope' is default RoPE with sections (transformers' reading).")
        if key == "rope_scaling" and set(d) <= {"rope_type", "type"} and all(v == "default" for v in d.values()):
            d = None  # v4 "no scaling"
        config[key] = d
    return config, sections, notes


def _problems(config: dict) -> list[str]:
    """Contradictions inside one config: v4 keys beside ``rope_parameters`` that say otherwise (transformers 5
    reads ``rope_parameters`` only). What holds for a Reading of any format is ``check.consistency``'s."""
    out = []
    params = config.get("rope_parameters")
    if isinstance(params, Mapping):
        flat = params if ("rope_type" in params or "type" in params) else None
        theta = config.get("rope_theta")
        if theta is not None and flat is not None and flat.get("rope_theta") not in (None, theta):
            out.append(f"rope_theta={theta} (v4) and rope_parameters['rope_theta']={flat.get('rope_theta')} (v5) "
                       "disagree; transformers 5 reads rope_parameters and ignores rope_theta.")
        scaling = config.get("rope_scaling")
        if isinstance(scaling, Mapping) and flat is not None:
            differ = sorted(k for k, v in scaling.items() if k not in _MROPE_KEYS and k != "type"
                            and k in flat and flat[k] != v)
            st = scaling.get("rope_type", scaling.get("type"))
            if st is not None and st != flat.get("rope_type", flat.get("type")):
                differ.insert(0, "rope_type")
            if differ:
                out.append(f"rope_scaling (v4) and rope_parameters (v5) disagree on {differ}; transformers 5 reads "
                           "rope_parameters.")
    return out


def _aliased(config: dict) -> dict:
    """The config with its class's own key names (GPT-J's ``n_embd``) also under the standard ones."""
    from ..conformance.hf_table import CONVENTIONS

    aliases = CONVENTIONS.get(config.get("model_type"), {}).get("aliases", {})
    return {**config, **{k: config[v] for k, v in aliases.items() if v in config and k not in config}}


def read_config(source: str | Path | Mapping[str, Any], *, style: str | None = None) -> Reading:
    """The RoPE of every layer of a transformers config (a ``config.json``, a model directory, a dict or a
    ``PretrainedConfig``).

    ``style`` overrides the pairing (as in :meth:`RopeSpec.per_layer`; needed for a model type the convention
    table does not hold). A config ``per_layer`` refuses raises :class:`ReadError` with its message.

    Args:
        source: a ``config.json`` path, a model directory holding one, the config's dict, or a
            ``PretrainedConfig``.
        style: ``"half"`` or ``"interleaved"`` to override the pairing; None reads it from the convention table.
    """
    config, label = load_config(source)
    text, notes = _text_part(config)
    try:
        clean, sections, mnotes = _without_mrope(text)
        layers = RopeSpec.per_layer(clean, style=style)
        head_dim = head_dim_of(_aliased(clean))
        notes += list(hf_config_notes(clean, style=style))
    except ValueError as e:
        raise ReadError(f"{label}: {e}") from e
    return Reading(source=label, format="transformers", architecture=str(text.get("model_type")), head_dim=head_dim,
                   layers=layers, sections=sections,
                   declared={k: v for k, v in _aliased(text).items() if k in _DECLARED and v is not None},
                   notes=tuple(notes + mnotes), problems=tuple(_problems(text)))


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def _canonical(spec: RopeSpec) -> RopeSpec:
    """The spec with its scaling's legacy ``type`` key spelled ``rope_type`` (the same RoPE)."""
    if spec.scaling is None or "type" not in spec.scaling:
        return spec
    d = dict(spec.scaling)
    t = d.pop("type")
    d.setdefault("rope_type", t)
    return dataclasses.replace(spec, scaling=d)


def _rope_dict(spec: RopeSpec, head_dim: int, *, with_partial: bool = True) -> dict:
    """The v5 dict of one spec: rope_type, rope_theta, partial_rotary_factor (when not the whole head), the rest."""
    d: dict[str, Any] = {"rope_type": spec.rope_type, "rope_theta": spec.base}
    if spec.scaling is not None:
        d.update({k: copy.deepcopy(v) for k, v in spec.scaling.items() if k not in ("type", "rope_type")})
    if with_partial and spec.rotary_dim not in (None, head_dim):
        d["partial_rotary_factor"] = _fraction(spec.rotary_dim, head_dim)
    return d


def _fraction(rotary_dim: int, head_dim: int) -> float:
    """rotary_dim / head_dim, nudged up by ulps until ``int(head_dim * f) == rotary_dim`` (transformers floors)."""
    f = rotary_dim / head_dim
    while int(head_dim * f) < rotary_dim:
        f = math.nextafter(f, 2.0)
    return f


def write_config(reading: Reading, base_config: Mapping[str, Any] | None = None, schema: str = "v5") -> dict:
    """A transformers config (a dict for ``config.json``) whose RoPE is ``reading``'s effective specs.

    Args:
        reading: the RoPE to write (any format; :meth:`Reading.effective_specs`, so a GGUF's permuted q/k
            are written as the original model's pairing).
        base_config: the config to write into (its other keys are kept, its RoPE keys replaced; a
            ``text_config`` is written into). Without it the config holds only the keys RoPE needs, and the
            reading's ``architecture`` must be a transformers model type ropelab's convention table holds.
        schema: ``"v5"`` (``rope_parameters``) or ``"v4"`` (``rope_theta`` / ``rope_scaling`` /
            ``partial_rotary_factor``).

    ValueError when the schema cannot express the reading (what and why), or the base config is another
    model's (layer count, head_dim)."""
    from ..conformance.hf_table import CONVENTIONS

    if not isinstance(reading, Reading):
        raise ValueError(f"reading must be a ropelab.engines.Reading, got {type(reading).__name__}.")
    if schema not in SCHEMAS:
        raise ValueError(f"schema must be one of {SCHEMAS} (transformers 5's rope_parameters, or 4's rope_theta / "
                         f"rope_scaling), got {schema!r}.")
    if base_config is not None and not isinstance(base_config, Mapping):
        raise ValueError(f"base_config must be a config dict (json.load of a config.json), got "
                         f"{type(base_config).__name__}.")
    base = copy.deepcopy(dict(base_config or {}))
    if isinstance(base.get("text_config"), Mapping):
        base["text_config"] = write_config(reading, base["text_config"], schema)
        return base
    model_type = base.get("model_type") or (reading.architecture if reading.architecture in CONVENTIONS else None)
    if model_type is None:
        raise ValueError(f"write_config needs base_config= (the model's config.json): the reading's architecture "
                         f"{reading.architecture!r} is not a transformers model type ropelab's convention table "
                         "holds, so which model class reads the config is unknown.")
    conv = CONVENTIONS.get(model_type) or CONVENTIONS.get(f"{model_type}_text") or {}
    out = {**base, "model_type": model_type}
    out, aliases_used = _resolve_aliases(out, conv)
    specs = tuple(_canonical(s) for s in reading.effective_specs())
    _check_geometry(out, reading)
    out["num_hidden_layers"] = reading.n_layers
    if _head_dim_or_none(out) is None:
        out["head_dim"] = reading.head_dim
    maxes = sorted({s.max_position_embeddings for s in specs if s.max_position_embeddings is not None})
    if len(maxes) > 1:
        raise ValueError(f"the reading's layers hold different max_position_embeddings {maxes}; a transformers "
                         "config has one.")
    if maxes:
        out["max_position_embeddings"] = maxes[0]
    if out.get("max_position_embeddings") is None:
        raise ValueError("the reading has no max_position_embeddings and base_config gives none; pass a "
                         "base_config with it (transformers needs the trained context).")
    max_pos = out["max_position_embeddings"]
    specs = tuple(dataclasses.replace(s, max_position_embeddings=max_pos) for s in specs)

    _write_style(out, specs, conv, model_type)
    rope_layers = _write_nope(out, specs, conv, model_type)
    for k in _ROPE_TOP_KEYS:
        out.pop(k, None)
    _write_sections_check(reading)
    by_type = _group_by_layer_type(out, specs, rope_layers, model_type)
    if schema == "v5":
        _write_v5(out, by_type, reading.head_dim, conv, base)
    else:
        _write_v4(out, by_type, reading.head_dim, conv, model_type)
    if reading.sections is not None:
        _add_sections(out, reading.sections, schema)
    for alias, key in aliases_used.items():  # write back under the config class's own names
        out[key] = out.pop(alias)
    _verify(out, specs, reading.sections, schema, model_type)
    return out


def _head_dim_or_none(config: Mapping[str, Any]) -> int | None:
    try:
        return head_dim_of(config)
    except ValueError:
        return None


def _resolve_aliases(out: dict, conv: Mapping[str, Any]) -> tuple[dict, dict]:
    """Rename the config class's own key names (GPT-J's ``n_layer``) to the ones written here; returns the
    renames to undo."""
    used = {}
    for std, own in conv.get("aliases", {}).items():
        if own in out and std not in out:
            out[std] = out.pop(own)
            used[std] = own
    return out, used


def _check_geometry(out: dict, reading: Reading) -> None:
    n = out.get("num_hidden_layers")
    if n is not None and n != reading.n_layers:
        raise ValueError(f"base_config has num_hidden_layers={n} but the reading {reading.n_layers} layers: "
                         "another model's config.")
    hd = _head_dim_or_none(out)
    if hd is not None and hd != reading.head_dim:
        raise ValueError(f"base_config's head dim is {hd} but the reading's {reading.head_dim}: another model's "
                         "config.")


def _write_style(out: dict, specs: tuple[RopeSpec, ...], conv: Mapping[str, Any], model_type: str) -> None:
    styles = {s.style for s in specs if not s.is_nope}
    if len(styles) > 1:
        raise ValueError("the reading's layers pair their dims differently (half and interleaved); a transformers "
                         "config has one pairing for all layers.")
    if not styles:
        return
    style = styles.pop()
    if "rope_interleave" in out:  # the config class reads it (DeepSeek-V3 and kin)
        out["rope_interleave"] = style == "interleaved"
        return
    fixed = conv.get("style")
    if fixed is not None and fixed != style:
        raise ValueError(f"the reading pairs dims as {style!r}, but transformers' code for model type {model_type!r} "
                         f"pairs them as {fixed!r} and its config has no key to change that (no rope_interleave); "
                         "permute the q/k weights instead (ropelab.convert) and write the other pairing.")


def _write_nope(out: dict, specs: tuple[RopeSpec, ...], conv: Mapping[str, Any], model_type: str) -> list[bool]:
    """Which layers rotate; writes ``no_rope_layers`` where the config has it. NoPE by layer type is the model's."""
    layer_types = _layer_types(out)
    nope_types = set(conv.get("nope_layer_types", ()))
    by_type_nope = [layer_types is not None and layer_types[i] in nope_types for i in range(len(specs))]
    for i, s in enumerate(specs):
        if by_type_nope[i] and not s.is_nope:
            raise ValueError(f"layer {i} has RoPE in the reading, but its layer type {layer_types[i]!r} has none in "
                             f"transformers' {model_type!r} code.")
    rotates = [not s.is_nope for s in specs]
    extra = [i for i, s in enumerate(specs) if s.is_nope and not by_type_nope[i]]
    if "no_rope_layers" in out:
        out["no_rope_layers"] = [int(r or t) for r, t in zip(rotates, by_type_nope)]
    elif extra:
        raise ValueError(f"layers {extra} have no RoPE in the reading, but model type {model_type!r}'s config has no "
                         "per-layer switch for it (no_rope_layers) and no layer type without RoPE.")
    return [r for r in rotates]


def _layer_types(out: Mapping[str, Any]) -> list[str] | None:
    lt = out.get("layer_types")
    if lt is None and out.get("sliding_window_pattern") is not None:
        n, pattern = out["num_hidden_layers"], int(out["sliding_window_pattern"])
        lt = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    return None if lt is None else list(lt)


def _group_by_layer_type(out: dict, specs: tuple[RopeSpec, ...], rotates: list[bool],
                         model_type: str) -> dict[str | None, RopeSpec]:
    """{layer type (None: all layers): its spec}, or ValueError naming two layers of one type that differ."""
    layer_types = _layer_types(out)
    distinct = list(dict.fromkeys(s for s, r in zip(specs, rotates) if r))
    if not distinct:
        return {}
    if layer_types is None:
        if len(distinct) > 1:
            first = next(i for i, s in enumerate(specs) if s != specs[0] and rotates[i])
            raise ValueError(f"layers 0 and {first} have different RoPE, but the config has no layer_types to give "
                             f"each its own rope dict (model type {model_type!r}); a config holds one RoPE per layer "
                             "type.")
        return {None: distinct[0]}
    seen: dict[str, tuple[int, RopeSpec]] = {}
    for i, (t, s, r) in enumerate(zip(layer_types, specs, rotates)):
        if not r:
            continue
        if t in seen and seen[t][1] != s:
            raise ValueError(f"layers {seen[t][0]} and {i} are both {t!r} layers but have different RoPE in the "
                             "reading; a config gives one rope dict per layer type.")
        seen.setdefault(t, (i, s))
    return {t: s for t, (_, s) in seen.items()}


def _write_sections_check(reading: Reading) -> None:
    if reading.sections is not None and reading.sections.axial:
        raise ValueError("the reading has axial sections (a vision tower's own ladder per axis); a transformers "
                         "decoder config has no key for them (mrope_section is M-RoPE: one ladder across the head).")


def _add_sections(out: dict, sections: MultiAxis, schema: str) -> None:
    key = "rope_parameters" if schema == "v5" else "rope_scaling"
    d = out.get(key)
    dicts = [d] if d is None or "rope_type" in d else list(d.values())
    if d is None:
        d = out[key] = {"rope_type": "default"}
        dicts = [d]
    for x in dicts:
        x["mrope_section"] = list(sections.sections)
        if sections.interleaved:
            x["mrope_interleaved"] = True


def _write_v5(out: dict, by_type: dict, head_dim: int, conv: Mapping[str, Any], base: Mapping[str, Any]) -> None:
    if not by_type:  # every layer NoPE: a rope dict is still required by per_layer for the other keys
        return
    values = list(by_type.values())
    per_type = None not in by_type and (len(set(values)) > 1 or conv.get("v4", {}).get("default_theta")
                                        or _was_per_type(base))
    if per_type:
        out["rope_parameters"] = {t: _rope_dict(s, head_dim) for t, s in by_type.items()}
    else:
        out["rope_parameters"] = _rope_dict(values[0], head_dim)
    _write_rotary_key(out, values, head_dim, v5=True)


def _was_per_type(base: Mapping[str, Any]) -> bool:
    p = base.get("rope_parameters")
    return isinstance(p, Mapping) and "rope_type" not in p and "type" not in p and bool(p)


def _write_rotary_key(out: dict, specs: list[RopeSpec], head_dim: int, *, v5: bool) -> None:
    """Where the config says the rotary slice: keep a base config's own key (GPT-J's absolute ``rotary_dim``,
    GPT-NeoX's ``rotary_pct``), updated; v5 puts partial_rotary_factor in the rope dicts otherwise."""
    dims = {s.rotary_dim or head_dim for s in specs if s.scaling is None or "partial_rotary_factor" not in s.scaling}
    own = _class_keys(out.get("model_type"))
    for key in ("rotary_dim", "rotary_pct"):
        if key in out or key in own:
            if len(dims) > 1:
                raise ValueError(f"the config gives one {key} for all layers, the reading rotates {sorted(dims)} dims.")
            r = dims.pop() if dims else head_dim
            out[key] = r if key == "rotary_dim" else _fraction(r, head_dim)
            out.pop("partial_rotary_factor", None)
            if v5:  # the dicts must not say it twice
                p = out.get("rope_parameters", {})
                for d in ([p] if "rope_type" in p else p.values()):
                    d.pop("partial_rotary_factor", None)
            return


def _class_keys(model_type: Any) -> frozenset[str]:
    """The keys transformers' config class for ``model_type`` holds (its defaults), or none when transformers is
    not installed: a class with its own rotary key (GPT-J's absolute ``rotary_dim``, GPT-NeoX's ``rotary_pct``)
    reads that key, not ``partial_rotary_factor``, so the writer must set it even when the base config omits it."""
    try:
        from transformers import AutoConfig

        return frozenset(AutoConfig.for_model(model_type).to_dict())
    except Exception:  # noqa: BLE001 - no transformers, or a model type it does not have: nothing is known
        return frozenset()


def _write_v4(out: dict, by_type: dict, head_dim: int, conv: Mapping[str, Any], model_type: str) -> None:
    if not by_type:
        return
    rule = conv.get("v4") or {}
    if "ignored_keys" in rule:
        ignored = rule["ignored_keys"]
        raise ValueError(f"model type {model_type!r}'s transformers config class does not read the v4 key(s) "
                         f"{ignored}; its RoPE can only be written in the v5 schema (rope_parameters).")
    values = list(dict.fromkeys(by_type.values()))
    if len(values) == 1 and (None in by_type or not rule):
        spec = values[0]
    elif rule:
        scaled = [t for t in by_type if t in rule["scaled_layer_types"]]
        others = [t for t in by_type if t not in rule["scaled_layer_types"]]
        if len({by_type[t] for t in scaled}) > 1:
            raise ValueError(f"v4 gives the layer types {scaled} of model type {model_type!r} one rope_scaling, but "
                             "the reading's differ; use schema='v5'.")
        spec = by_type[scaled[0]] if scaled else by_type[others[0]]
        for t in others:
            o = by_type[t]
            if o.scaling is not None or o.rotary_dim != spec.rotary_dim:
                raise ValueError(f"v4 gives {model_type!r}'s {t!r} layers default RoPE with the global rotary slice; "
                                 f"the reading gives them {_describe(o)}; use schema='v5'.")
            if t in rule["default_theta"]:
                out["rope_local_base_freq"] = o.base
            elif o.base != spec.base:
                raise ValueError(f"v4 gives {model_type!r}'s {t!r} layers the global rope_theta {spec.base}; the "
                                 f"reading gives them base {o.base}; use schema='v5'.")
    else:
        raise ValueError(f"the reading gives layer types {sorted(by_type)} different RoPE, which model type "
                         f"{model_type!r}'s v4 config cannot say (it has one rope_theta / rope_scaling); use "
                         "schema='v5'.")
    out["rope_theta"] = spec.base
    d = _rope_dict(spec, head_dim, with_partial=False)
    d.pop("rope_theta")
    out["rope_scaling"] = None if set(d) == {"rope_type"} and d["rope_type"] == "default" else d
    if spec.rotary_dim not in (None, head_dim) and "rotary_dim" not in out and "rotary_pct" not in out:
        out["partial_rotary_factor"] = _fraction(spec.rotary_dim, head_dim)
    _write_rotary_key(out, list(by_type.values()), head_dim, v5=False)


def _describe(spec: RopeSpec) -> str:
    return f"{spec.rope_type} RoPE, base {spec.base}, rotary_dim {spec.rotary_dim}"


def _verify(out: dict, specs: tuple[RopeSpec, ...], sections: MultiAxis | None, schema: str, model_type: str) -> None:
    """Read the written config back; it must give exactly the specs and sections (else say which layer differs)."""
    try:
        clean, got_sections, _ = _without_mrope(_text_part(out)[0])
        if got_sections != sections:
            raise ValueError(f"its sections read back as {got_sections}, not {sections}")
        got = tuple(_canonical(s) for s in RopeSpec.per_layer(clean))
    except ValueError as e:
        raise ValueError(f"the {schema} config written for model type {model_type!r} does not read back: {e}") from e
    for i, (g, s) in enumerate(zip(got, specs)):
        if g != s:
            raise ValueError(f"the {schema} schema cannot express layer {i}'s RoPE for model type {model_type!r}: "
                             f"written, it reads back as {g.to_dict()}, not {s.to_dict()}.")
