r"""Published ``config.json`` files (``data/configs``, each with the repository, path and commit it was read from in
``manifest.json``) read by ``RopeSpec.per_layer`` and checked against transformers twice:

- **its config class** (:func:`class_reading`): ``AutoConfig.for_model(**config)`` standardizes the RoPE keys of
  either schema into ``rope_parameters``; per layer, ropelab's base, rope type, scaling values and rotary share must
  be the ones that class holds;
- **its model** (:func:`compare_config`): the config at a tiny width (:func:`shrink`: the same depth, layer
  pattern, head size and every RoPE key; two heads, small MLPs, experts and vocabulary, none of which RoPE reads)
  runs one forward of transformers' own code, recorded as the sweep records it (``running.run_transformers``), and
  each layer's calls are compared with ``apply_rope`` under ropelab's spec for that layer
  (``records.compare_layers``, within ``compare.bound``).

A config ``per_layer`` refuses is not compared; its refusal is the row's result. ``python -m
ropelab.conformance.corpus`` runs the whole corpus and prints one line per config and the time;
``tests/test_hf_corpus.py`` runs a subset in CI.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import time
from collections.abc import Mapping
from typing import Any

from ..spec import RopeSpec, head_dim_of, text_part

__all__ = ["CORPUS_DIR", "load_corpus", "shrink", "class_reading", "compare_config", "main"]

CORPUS_DIR = pathlib.Path(__file__).resolve().parents[2] / "data" / "configs"

# Keys of a config.json that have nothing to do with the decoder's shapes and that a tiny model cannot honour
# (a quantized checkpoint's scheme; the vision and audio towers of a composite config, whose text part is read).
_DROPPED = ("quantization_config", "compression_config", "vision_config", "audio_config", "auto_map")


def load_corpus() -> list[tuple[dict, dict]]:
    """[(manifest entry, config dict)] of every corpus file, in the manifest's order."""
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    return [(m, json.loads((CORPUS_DIR / m["file"]).read_text())) for m in manifest["configs"]]


def _class_of(model_type: str):
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def _aliased(d: Mapping[str, Any], config_cls) -> dict:
    amap = getattr(config_cls, "attribute_map", None) or {}
    return {**d, **{k: d[v] for k, v in amap.items() if v in d and k not in d}}


def shrink(config: Mapping[str, Any]) -> dict:
    """The decoder config of ``config`` (its ``text_config`` for a composite one, as ``RopeSpec.per_layer`` reads
    it) at a tiny width: the sizes ``discovery.tiny_kwargs`` shrinks for its model type (MLPs, experts, vocabulary,
    low-rank projections) and two attention heads, with the config's own head size (``head_dim`` set explicitly),
    depth, layer pattern and RoPE keys kept, so ``per_layer`` reads the same RoPE in it."""
    from .discovery import N_HEADS, SMALL_INTS, tiny_kwargs

    text = {k: v for k, v in text_part(config).items() if k not in _DROPPED}
    config_cls = _class_of(text["model_type"])
    aliased = _aliased(text, config_cls)
    # MLA (DeepSeek-V3) rotates qk_rope_head_dim, a size of its own; the others rotate head_dim or hidden // heads.
    head_dim = aliased.get("head_dim") or aliased["hidden_size"] // aliased["num_attention_heads"]
    out = dict(text)
    amap = getattr(config_cls, "attribute_map", None) or {}
    for key, value in tiny_kwargs(config_cls).items():
        if key in ("num_hidden_layers", "head_dim", "hidden_size", "num_attention_heads", "num_key_value_heads"):
            continue
        if key in text or key not in ("pad_token_id", "padding_idx"):
            out[key] = value
        for alias in (a for a, real in amap.items() if real == key and a in text):
            out[alias] = value  # the config may name the size by the class's alias
    for key, value in text.items():  # sizes the config has and its class does not declare (GLM-5.2's num_experts)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if "intermediate_size" in key:
            out[key] = min(value, 32)
        elif key in SMALL_INTS and value > SMALL_INTS[key]:
            out[key] = SMALL_INTS[key]
    for key in ("pad_token_id", "padding_idx"):
        if isinstance(out.get(key), int) and out[key] >= out.get("vocab_size", 128):
            out[key] = 0
    k, v = text.get("linear_num_key_heads"), text.get("linear_num_value_heads")
    if isinstance(k, int) and isinstance(v, int) and k > 0 and v % k == 0:  # linear-attention layers: no RoPE
        out.update(linear_num_key_heads=min(k, N_HEADS), linear_num_value_heads=min(k, N_HEADS) * (v // k))
    kv = aliased.get("num_key_value_heads")
    out.update(num_attention_heads=N_HEADS, hidden_size=N_HEADS * head_dim)
    if "head_dim" in text:
        out["head_dim"] = head_dim
    if kv is not None:
        out["num_key_value_heads"] = 1 if kv == 1 else N_HEADS
    return out


def class_reading(config: Mapping[str, Any]) -> list[dict | None]:
    """Per decoder layer, the rope dict transformers' config class holds for ``config`` (its text config's
    ``rope_parameters``, the layer type's entry where it is nested), or None where the class gives that layer none."""
    from transformers import AutoConfig

    d = {k: v for k, v in config.items() if k != "model_type"}
    cfg = AutoConfig.for_model(config["model_type"], **json.loads(json.dumps(d)))
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    params = getattr(text, "rope_parameters", None) or {}
    types = list(getattr(text, "layer_types", None) or [])
    n = text.num_hidden_layers
    nested = bool(types) and any(isinstance(params.get(t), Mapping) for t in set(types))
    if not nested:
        return [dict(params)] * n
    return [dict(params[t]) if isinstance(params.get(t), Mapping) else None for t in (types or [None] * n)]


def compare_config(tiny: Mapping[str, Any]) -> dict:
    """transformers' model of the (tiny) config ``tiny`` against ``RopeSpec.per_layer(tiny)``, per layer (the record
    of one sweep variant: ``status``, ``layers``, ``reason``)."""
    from .discovery import discover
    from .hf_table import CONVENTIONS
    from .records import compare_layers
    from .running import error_text, rotated_pairs, run_transformers

    tiny = json.loads(json.dumps(tiny))
    model_type = tiny["model_type"]
    try:
        specs = RopeSpec.per_layer(tiny)
    except ValueError as e:
        return {"status": "refused", "reason": f"ropelab: {e}"}
    config_cls = _class_of(model_type)
    module_name = discover()[model_type]["module"]
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    try:
        config = config_cls(**{k: v for k, v in tiny.items() if k != "model_type"})
        run = run_transformers(config, module)
    except Exception as e:  # noqa: BLE001 - the reason is the record
        return {"status": "not covered", "reason": f"transformers' model cannot run it: {error_text(e)}"}
    if not run["calls"]:
        out = {"status": "agree" if all(s.is_nope for s in specs) else "disagree",
               "reason": "transformers' forward made no rotation call"}
        return out
    head_dim = head_dim_of(_aliased(tiny, config_cls))
    call_dim = rotated_pairs(run["calls"][0])[0][0].shape[-1]
    perm = (CONVENTIONS.get(model_type) or {}).get("output_permutation")
    layers = compare_layers(run, specs, config.num_hidden_layers, head_dim, call_dim, perm)
    st = [e["status"] for e in layers]
    status = "disagree" if "disagree" in st else ("agree" if "agree" in st else "not covered")
    return {"status": status, "layers": layers, "dtype": run["dtype"],
            **({"reason": layers[0].get("reason", "no layer compared")} if status == "not covered" else {})}


def main() -> int:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    t0, c0 = time.perf_counter(), time.process_time()
    counts: dict[str, int] = {}
    for entry, config in load_corpus():
        t = time.perf_counter()
        try:
            RopeSpec.per_layer(config)
        except ValueError as e:
            row = {"status": "refused", "reason": str(e)}
        else:
            row = None
        try:
            row = row or compare_config(shrink(config))
        except Exception as e:  # noqa: BLE001 - one config's failure is a line, never the end of the run
            row = {"status": "not covered", "reason": f"{type(e).__name__}: {e}"}
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        print(f"{entry['file']:58s} {row['status']:11s} {time.perf_counter() - t:5.1f}s {row.get('reason', '')[:110]}")
    print(f"{counts} of {sum(counts.values())} configs in {time.perf_counter() - t0:.0f} s wall, "
          f"{time.process_time() - c0:.0f} s CPU (one thread)")
    return 1 if counts.get("disagree") else 0


if __name__ == "__main__":
    raise SystemExit(main())
