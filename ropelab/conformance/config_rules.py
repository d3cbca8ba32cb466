r"""How each transformers config class reads a ``config.json``'s RoPE keys, measured by instantiating the class
(``python -m ropelab.conformance.config_rules``, seconds: no model runs), written into ``hf_config_rules``, the
table ``RopeSpec.per_layer`` reads for a config without ``rope_parameters``.

A published ``config.json`` often predates transformers 5's ``rope_parameters``: it says its base as
``rope_theta`` (Llama), ``rotary_emb_base`` (GPT-NeoX, Pythia) or not at all, its rotary share as
``partial_rotary_factor`` or ``rotary_pct``, its scaling as ``rope_scaling``, its hybrid layer pattern as a list
of attention-layer indices (Bamba), and a vision-language model keeps its decoder in ``text_config``. Each config
class turns these into ``rope_parameters`` its own way (``convert_rope_params_to_dict``). Per model type:

- ``theta_keys`` / ``fraction_keys``: the top-level keys the class reads as ``rope_theta`` /
  ``partial_rotary_factor``, first the one that wins when several are given. Candidates are every quoted name
  in the class's configuration source, ``modeling_rope_utils`` and ``configuration_utils`` (and the class's own
  fields) that looks like a RoPE key; each is set to a sentinel value no config uses, and a key is read when its
  sentinel arrives in the class's ``rope_parameters``. No key list is typed here.
- ``scaled``: where they differ, the keys and the default base / rotary share when the config also has a
  ``rope_scaling`` dict, which replaces the class's default rope dict (Bamba's default dict holds a rotary share,
  so a top-level ``partial_rotary_factor`` is read only beside ``rope_scaling``).
- ``default``: the flat rope dict the class gives a config with none of these keys (its ``default_theta``, its
  default rotary share, a default scaling).
- ``layer_indices``: a list-of-layer-indices key from which the class derives its layer types (Bamba's
  ``attn_layer_indices``), with the layer type of a listed layer and of the others.

- ``periodic``: a per-layer list the class derives when the config has none, every k-th layer from an int key
  (Llama 4's ``no_rope_layers`` from ``no_rope_layer_interval``, Qwen3-Next's ``layer_types`` from
  ``full_attention_interval``).

- ``layer_count``: where the class derives ``num_hidden_layers`` from another int key, as ``per`` times it
  (LongCat-Flash stores ``num_layers`` decoder layers of two attention sublayers each): measured by building the
  class from the key alone at two values and reading ``num_hidden_layers`` back.
- ``cycled``: where the class derives its ``layer_types`` by cycling a list key of block kinds (RecurrentGemma's
  ``block_types``), the key, each kind's layer type (``kinds``) and the most times the class repeats the list
  (``max_repeats``; the class refuses more layers): measured on probe lists of the class's own kinds at 5 layers.

``PER_LAYER_TYPE_DEFAULTS``: the model types whose class, given a config without RoPE keys, builds its rope dict per
layer type from defaults of its own (MiMo-V2-Flash's, Step-3.5's, Gemma 3's): the layer types it fills
(``types``) and those into which a top-level ``rope_theta`` arrives (``theta_types``; MiMo-V2-Flash's class
ignores it). A legacy config of such a type whose base for some layer type would come from the class's own
default (not from the config) is refused by ``per_layer``: ropelab does not hold those defaults.

``TEXT_CONFIGS``: for a composite config class (its ``sub_configs`` hold a ``text_config``), the model type of
that text sub-config (``type``), and whether the class builds a ``text_config`` dict as the type the dict names
(``dict_type``) or always as its own: the decoder ``per_layer`` reads from the config's ``text_config``.
"""

from __future__ import annotations

import inspect
import json
import pathlib
import re
from typing import Any

__all__ = ["RULES_PATH", "measure_rules", "measure_all", "write_rules", "main"]

RULES_PATH = pathlib.Path(__file__).with_name("hf_config_rules.py")

_THETA, _FRACTION = 12345.0, 0.375  # values no config holds: where they arrive, the key was read
_RoPE_NAME = re.compile(r"rope|rotary|theta|partial|pct|base_freq")
_PERIOD_NAME = re.compile(r"interval|step|pattern|every|period")  # an int key a layer pattern may repeat by
_QUOTED = re.compile(r"""["']([a-z][a-z0-9_]*)["']""")
_NOT_CANDIDATES = {"rope_parameters", "rope_scaling", "rope_type", "rope_theta_local"}


def _candidates(config_cls, pattern: re.Pattern = _RoPE_NAME) -> list[str]:
    import transformers

    root = pathlib.Path(transformers.__file__).parent
    sources = [inspect.getsourcefile(config_cls), root / "modeling_rope_utils.py", root / "configuration_utils.py"]
    names = set()
    for src in sources:
        try:
            names |= set(_QUOTED.findall(pathlib.Path(src).read_text()))
        except (OSError, TypeError):
            continue
    names |= set(getattr(config_cls, "__dataclass_fields__", {}) or {})
    return sorted(n for n in names if pattern.search(n) and n not in _NOT_CANDIDATES)


def _flat_params(config_cls, kw: dict) -> dict | None:
    """The class's flat rope dict for ``kw`` (None where it raises or nests its dict by layer type)."""
    try:
        cfg = config_cls(**json.loads(json.dumps(kw)))
    except Exception:  # noqa: BLE001 - a value the class refuses reads nothing
        return None
    params = getattr(cfg, "rope_parameters", None)
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        return None
    return params


def _ordered(config_cls, kw: dict, keys: list[str], field: str, sentinel: float) -> list[str]:
    """``keys`` that the class reads into ``rope_parameters[field]``, the winner first when several are given."""
    read = [k for k in keys if (_flat_params(config_cls, {**kw, k: sentinel}) or {}).get(field) == sentinel]
    out = []
    while read:
        values = {k: sentinel + i + 1 if field == "rope_theta" else sentinel / (i + 2) for i, k in enumerate(read)}
        got = (_flat_params(config_cls, {**kw, **values}) or {}).get(field)
        winner = next((k for k, v in values.items() if v == got), None)
        if winner is None:
            out += read  # no single winner measured: keep the order found
            break
        out.append(winner)
        read.remove(winner)
    return out


def _periodic_lists(config_cls, kw: dict) -> dict[str, dict]:
    """Per-layer lists ``per_layer`` reads (``no_rope_layers``, ``layer_types``) that the class derives when the config
    has none, periodically from an int key (Llama 4: every ``no_rope_layer_interval``-th layer has no RoPE; Qwen3-Next:
    every ``full_attention_interval``-th layer attends, the others are linear attention): {list: {"key",
    "default", "in_period", "last"}}, where layer i gets ``last`` if (i + 1) % key == 0 else ``in_period``. Kept only
    where that holds for the class's default and two other values of the key, at 12 layers."""
    out = {}
    base = {**kw, "num_hidden_layers": 12}
    quoted = [n for n in _candidates(config_cls, _PERIOD_NAME)]
    for name in ("no_rope_layers", "layer_types"):
        field = (getattr(config_cls, "__dataclass_fields__", None) or {}).get(name)
        if field is None or getattr(field, "default", None) not in (None, []):
            continue
        for key in quoted:
            rule = None
            for k in (2, 3):
                try:
                    got = list(getattr(config_cls(**{**base, key: k}), name) or [])
                except Exception:  # noqa: BLE001
                    rule = None
                    break
                if len(got) != 12 or got[0] == got[k - 1] or got != [got[k - 1] if (i + 1) % k == 0 else got[0]
                                                                     for i in range(12)]:
                    rule = None
                    break
                rule = {"key": key, "in_period": got[0], "last": got[k - 1]}
            if rule is None:
                continue
            try:  # the class's default period: the one its list without the key repeats by
                got = list(getattr(config_cls(**base), name) or [])
            except Exception:  # noqa: BLE001
                continue
            period = next((k for k in range(1, 13) if got == [rule["last"] if (i + 1) % k == 0 else rule["in_period"]
                                                              for i in range(12)]), None)
            if period is not None:
                out[name] = {**rule, "default": period}
                break
    return out


def _serialized_layout(config_cls, kw: dict) -> dict | None:
    """{"stride": k, "filler": [types]} where the class writes its ``layer_types`` to ``config.json`` with k entries
    per decoder layer (Dory's released configs list each layer's attention block and then an ``mlp`` block, and
    double ``num_hidden_layers``) and reads such a list back as every k-th entry: measured by writing the class's
    ``to_dict()`` and building the class from it again. None for any other class."""
    try:
        cfg = config_cls(**kw)
        d = cfg.to_dict()
        types, written = list(getattr(cfg, "layer_types", None) or []), list(d.get("layer_types") or [])
        n, written_n = cfg.num_hidden_layers, d.get("num_hidden_layers")
    except Exception:  # noqa: BLE001 - a class without layer types has no layout
        return None
    if not types or len(written) <= len(types) or len(written) % len(types):
        return None
    k = len(written) // len(types)
    filler = sorted({t for i, t in enumerate(written) if i % k})
    if written[::k] != types or written_n != k * n or set(filler) & set(types):
        return None
    try:
        again = config_cls(**{**kw, "layer_types": written, "num_hidden_layers": written_n})
    except Exception:  # noqa: BLE001
        return None
    if list(again.layer_types) != types or again.num_hidden_layers != n:
        return None
    return {"stride": k, "filler": filler}


def _layer_count(config_cls, kw: dict) -> dict | None:
    """{"key": k, "per": m} where the class's ``num_hidden_layers`` is m times its int field k and the config class
    takes no ``num_hidden_layers`` field of its own (LongCat-Flash: a property, 2 * ``num_layers``): measured by
    building the class from k alone at 3 and 5 and reading ``num_hidden_layers`` back. None for any other class."""
    fields = getattr(config_cls, "__dataclass_fields__", None) or {}
    if "num_hidden_layers" in fields:
        return None
    kw = {k: v for k, v in kw.items() if k != "num_hidden_layers"}
    for key in sorted(fields):
        if "layer" not in key or not isinstance(getattr(fields[key], "default", None), int):
            continue
        try:
            got = [config_cls(**{**kw, key: v}).num_hidden_layers for v in (3, 5)]
        except Exception:  # noqa: BLE001 - a key the class refuses at these values derives nothing
            continue
        if all(isinstance(g, int) and not isinstance(g, bool) for g in got) and got[0] % 3 == 0 and got[0] > 0 \
                and got == [got[0] // 3 * v for v in (3, 5)]:
            return {"key": key, "per": got[0] // 3}
    return None


def _cycled_layer_types(config_cls, kw: dict) -> dict | None:
    """{"key": k, "kinds": {kind: layer type}, "max_repeats": r} where the class derives its ``layer_types`` (a
    property or attribute-map alias, not a field the config sets) by cycling its list field k of block kinds, each
    kind giving one layer type (RecurrentGemma: ``block_types`` ``recurrent`` -> ``linear_attention``,
    ``attention`` -> ``sliding_attention``): measured at 5 layers on each two-kind probe list of the class's default
    kinds, in both orders, and on a three-entry one; ``max_repeats``: the most layers the class accepts with a
    one-kind list (it refuses a config whose cycled list is shorter than its layers; None where it accepts 4096).
    None for any other class."""
    fields = getattr(config_cls, "__dataclass_fields__", None) or {}
    if "layer_types" in fields:
        return None
    base = {**kw, "num_hidden_layers": 5}
    for key in sorted(fields):
        default = getattr(fields[key], "default", None)
        if not isinstance(default, (list, tuple)) or not all(isinstance(x, str) for x in default):
            continue
        kinds = sorted(set(default))
        if len(kinds) < 2:
            continue
        a, b = kinds[0], kinds[1]
        learned: dict[str, str] = {}
        ok = True
        for probe in ([a, b], [b, a], [b, a, a]):
            try:
                got = list(getattr(config_cls(**{**base, key: probe}), "layer_types", None) or [])
            except Exception:  # noqa: BLE001
                ok = False
                break
            want = [probe[i % len(probe)] for i in range(5)]
            if len(got) != 5 or any(learned.setdefault(k, t) != t for k, t in zip(want, got)):
                ok = False
                break
        if not ok or len(set(learned.values())) != len(learned) or set(learned) != set(kinds[:2]):
            continue
        for kind in kinds[2:]:  # the class's other kinds, each beside one already read
            try:
                got = list(getattr(config_cls(**{**base, key: [a, kind]}), "layer_types", None) or [])
            except Exception:  # noqa: BLE001
                ok = False
                break
            if len(got) != 5 or got[::2] != [learned[a]] * 3 or len(set(got[1::2])) != 1:
                ok = False
                break
            learned[kind] = got[1]
        if not ok:
            continue
        def cycles(n, key=key, a=a):  # whether the class accepts n layers of one kind and lists n layer types
            try:
                return len(getattr(config_cls(**{**kw, "num_hidden_layers": n, key: [a]}), "layer_types", None)
                           or []) == n
            except Exception:  # noqa: BLE001 - the class refuses a list shorter than its layers
                return False

        lo, hi = 5, 4096  # the most layers the class accepts: bisected (lo accepted, above hi not asked)
        if cycles(hi):
            return {"key": key, "kinds": learned, "max_repeats": None}
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cycles(mid) else (lo, mid)
        return {"key": key, "kinds": learned, "max_repeats": lo}
    return None


def _text_rule(config_cls) -> dict | None:
    """{"type": the text sub-config's model type, "dict_type": whether a ``text_config`` dict's own ``model_type``
    picks the class instead (measured: a dict saying another type, and the class built from it)}."""
    sub = (getattr(config_cls, "sub_configs", None) or {}).get("text_config")
    if sub is not None and sub.__name__ == "AutoConfig":  # the dict's own model_type picks the class
        return {"type": None, "dict_type": True}
    if sub is None or not isinstance(getattr(sub, "model_type", None), str) or not sub.model_type:
        return None
    other = "llama" if sub.model_type != "llama" else "mistral"
    try:
        got = getattr(config_cls(text_config={"model_type": other}), "text_config", None)
        honours = getattr(got, "model_type", None) == other
    except Exception:  # noqa: BLE001 - a class that refuses another type builds its own
        honours = False
    return {"type": sub.model_type, "dict_type": honours}


def measure_rules(config_cls, kw: dict) -> dict[str, Any]:
    """The reading rules of one config class on the tiny kwargs ``kw`` (``discovery.tiny_kwargs``)."""
    kw = {k: v for k, v in kw.items() if k not in ("rope_parameters", "rope_scaling")}
    out: dict[str, Any] = {}
    layout = _serialized_layout(config_cls, kw)
    default = _flat_params(config_cls, kw)
    if default is None:  # a class nesting its rope dict by layer type (Dory) may still write a block layout
        return {"serialized_layout": layout} if layout else out
    out["default"] = json.loads(json.dumps(default))
    keys = _candidates(config_cls)
    out["theta_keys"] = _ordered(config_cls, kw, keys, "rope_theta", _THETA)
    out["fraction_keys"] = _ordered(config_cls, kw, keys, "partial_rotary_factor", _FRACTION)
    # With a rope_scaling dict the class starts from it instead of its default dict (``rope_scaling or
    # self.rope_parameters``): what it then reads, and its defaults, can differ (Bamba's default dict holds a
    # rotary share, so a top-level partial_rotary_factor is read only beside rope_scaling).
    skw = {**kw, "rope_scaling": {"rope_type": "default"}}
    sdefault = _flat_params(config_cls, skw)
    if sdefault is not None:
        scaled = {"default": {k: v for k, v in sdefault.items() if k in ("rope_theta", "partial_rotary_factor")},
                  "theta_keys": _ordered(config_cls, skw, keys, "rope_theta", _THETA),
                  "fraction_keys": _ordered(config_cls, skw, keys, "partial_rotary_factor", _FRACTION)}
        plain = {"default": {k: v for k, v in default.items() if k in ("rope_theta", "partial_rotary_factor")},
                 "theta_keys": out["theta_keys"], "fraction_keys": out["fraction_keys"]}
        differ = {k: v for k, v in scaled.items() if v != plain[k]}
        if differ:
            out["scaled"] = differ
    n = kw.get("num_hidden_layers")
    if layout:
        out["serialized_layout"] = layout
    count = _layer_count(config_cls, kw)
    if count:
        out["layer_count"] = count
    cycled = _cycled_layer_types(config_cls, kw)
    if cycled:
        out["cycled"] = cycled
    periodic = _periodic_lists(config_cls, kw)
    if periodic:
        out["periodic"] = periodic
    for key, value in sorted(vars(config_cls()).items()):
        if not (key.endswith("layer_indices") and value is None and isinstance(n, int) and n >= 2):
            continue
        try:
            types = list(getattr(config_cls(**{**kw, key: [1]}), "layer_types", None) or [])
        except Exception:  # noqa: BLE001
            continue
        if len(types) == n and len({types[0], types[1]}) == 2:
            out.setdefault("layer_indices", {})[key] = {"listed": types[1], "others": types[0]}
    return out


def per_layer_type_default(config_cls, kw: dict) -> dict | None:
    """Where the class nests the rope dict it builds for ``kw`` without RoPE keys by layer type: ``{"types": its
    layer types, "theta_types": those into which a top-level ``rope_theta`` arrives}`` (measured with a sentinel);
    None where the dict is flat or the class refuses ``kw``."""
    kw = {k: v for k, v in kw.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}

    def nested(extra):
        try:
            params = getattr(config_cls(**json.loads(json.dumps({**kw, **extra}))), "rope_parameters", None)
        except Exception:  # noqa: BLE001 - a value the class refuses reads nothing
            return None
        ok = isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values())
        return params if ok else None

    params = nested({})
    if params is None:
        return None
    with_theta = nested({"rope_theta": _THETA}) or {}
    return {"types": sorted(params),
            "theta_types": sorted(t for t, d in with_theta.items() if isinstance(d, dict) and d.get("rope_theta")
                                  == _THETA)}


def measure_all(log=print) -> tuple[dict[str, dict], dict[str, str]]:
    """(rules per RoPE model type, text sub-config type per composite type) of the installed transformers; the
    per-layer-type defaults (:func:`per_layer_type_default`) go into ``rules`` under the key ``None``."""
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging as hf_logging

    from .discovery import discover, tiny_kwargs

    hf_logging.set_verbosity_error()
    rules, text = {}, {}
    for mt in sorted(CONFIG_MAPPING.keys()):
        try:
            rule = _text_rule(CONFIG_MAPPING[mt])
        except Exception:  # noqa: BLE001 - a class that cannot be imported has no rule
            rule = None
        if rule is not None:
            text[mt] = rule
    nested = {}
    for mt in sorted(discover()):
        config_cls = CONFIG_MAPPING[mt]
        try:
            kw = tiny_kwargs(config_cls)
            types = per_layer_type_default(config_cls, kw)
            if types is not None:
                nested[mt] = types
            r = measure_rules(config_cls, kw)
        except Exception as e:  # noqa: BLE001 - a class that cannot be built has no rules
            if log:
                log(f"{mt}: no rules ({type(e).__name__})")
            continue
        if r:
            rules[mt] = r
    rules[None] = nested
    return rules, text


def not_covered(version: str) -> dict[str, str]:
    """{model type: the sweep's reason} for the types of the committed conformance table it could not compare."""
    table = pathlib.Path(__file__).resolve().parents[2] / "data" / "conformance" / f"transformers-{version}.json"
    if not table.exists():
        return {}
    rows = json.loads(table.read_text())["models"]
    return {mt: row.get("reason", "") for mt, row in sorted(rows.items()) if row.get("status") == "not covered"}


def write_rules(rules: dict, text: dict, version: str, path: pathlib.Path = RULES_PATH) -> None:
    rules = dict(rules)
    nested = rules.pop(None, {})
    lines = ["# ruff: noqa: E501",
             f'"""How transformers {version}\'s config classes read a config.json\'s RoPE keys, measured by',
             "``python -m ropelab.conformance.config_rules`` (generated: do not edit). The keys are described in",
             '``ropelab.conformance.config_rules``."""',
             "", '__all__ = ["TRANSFORMERS_VERSION", "READS", "PER_LAYER_TYPE_DEFAULTS", "TEXT_CONFIGS",',
             '           "MODEL_TYPES", "NOT_COVERED"]', "",
             f"TRANSFORMERS_VERSION = {version!r}", "", "READS: dict[str, dict] = {"]
    lines += [f"    {mt!r}: {r!r}," for mt, r in sorted(rules.items())]
    lines += ["}", "", "PER_LAYER_TYPE_DEFAULTS: dict[str, dict] = {"]
    lines += [f"    {mt!r}: {t!r}," for mt, t in sorted(nested.items())]
    lines += ["}", "", "TEXT_CONFIGS: dict[str, dict] = {"]
    lines += [f"    {mt!r}: {t!r}," for mt, t in sorted(text.items())]
    from transformers import CONFIG_MAPPING

    lines += ["}", "", "# Every model type of transformers, RoPE or not: a type outside it is unknown to transformers.",
              f"MODEL_TYPES: frozenset[str] = frozenset({sorted(CONFIG_MAPPING.keys())!r})", "",
              "# The sweep's reason for each model type it could not compare (data/conformance/transformers-<v>.json).",
              "NOT_COVERED: dict[str, str] = {"]
    lines += [f"    {mt!r}: {r!r}," for mt, r in not_covered(version).items()]
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    import transformers

    rules, text = measure_all()
    write_rules(rules, text, transformers.__version__)
    print(f"{len(rules) - 1} config classes' rules, {len(rules[None])} per-layer-type defaults, {len(text)} composite "
          f"types -> {RULES_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
