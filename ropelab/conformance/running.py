r"""Running transformers' own code on a tiny model, recording each call of its module-level rotation functions
and of its rotary modules (the design: ``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import inspect
import re
import sys

import torch

__all__ = ["error_text", "positions_for", "run_transformers", "rotated_pairs", "layout_of"]


def error_text(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:300]


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
    own = [(name, cls) for name, cls in sorted(vars(module).items())
           if inspect.isclass(cls) and issubclass(cls, PreTrainedModel) and getattr(cls, "config_class", None)
           is type(config) and not name.endswith("PreTrainedModel")]
    for name, cls in own:
        if name.endswith("Model"):
            return cls(config)
    # A component's own network (T5Gemma's encoder and decoder on T5GemmaModuleConfig, BLT's local encoder):
    # the one class built on exactly this config class, where there is one without a task head.
    bare = [cls for name, cls in own if not re.search(r"For[A-Z]", name)]
    if len(bare) == 1:
        return bare[0](config)
    raise LookupError(f"no AutoModel and no *Model class for {type(config).__name__} in {module.__name__}")


def run_transformers(config, module, text=None) -> dict:
    """:func:`_run` in float64, or in float32 where the model's kernels refuse float64 (grouped MoE matmuls).
    ``text``: the text sub-config of a composite ``config`` (its decoder's layers are the ones attributed)."""
    try:
        return _run(config, module, torch.float64, text)
    except RuntimeError as e:
        if "Float" not in str(e) and "Double" not in str(e) and "dtype" not in str(e):
            raise
        return _run(config, module, torch.float32, text)


def _rotation_names(module) -> list[str]:
    return [n for n, f in vars(module).items()
            if inspect.isfunction(f) and re.search(r"rotary|rope", n) and n.startswith("apply")]


def _text_model(model, text):
    """The sub-model of a composite ``model`` built on its text sub-config ``text`` (a config of that class, with a
    ModuleList of ``text.num_hidden_layers`` layers), the outermost one; None if there is none."""
    for _, m in model.named_modules():
        c = getattr(m, "config", None)
        if type(c) is type(text) and m is not model and _layer_list(m, text.num_hidden_layers) is not None:
            return m
    return None


def _run(config, module, dtype, text=None) -> dict:
    """One float64 forward of a tiny model of ``config`` with every module-level rotation function of ``module``
    recorded. Returns {"calls", "ran", "positions"} or raises with the reason.

    A composite (``text`` its text sub-config): the whole model runs on token ids, the rotation functions of its
    module and of every module its text sub-model's classes come from are recorded, and calls are attributed to the
    layers of that text sub-model."""
    rec = _Recorder()
    if text is None and not _rotation_names(module):
        raise LookupError(f"no module-level rotation function (apply_*rotary*/apply_*rope*) in {module.__name__}; "
                          "the rotation is inlined")
    torch.manual_seed(0)
    model = _base_model(config, module).to(dtype).eval()
    top = model
    modules = [module]
    if text is not None:
        model = _text_model(top, text)
        if model is None:
            raise LookupError(f"no sub-model of {type(top).__name__} on its text config {type(text).__name__} with "
                              f"its {text.num_hidden_layers} layers")
        config = text
        modules += [m for m in dict.fromkeys(sys.modules.get(type(s).__module__) for s in model.modules())
                    if m is not None and m is not module]
    wrapped = [(m, n) for m in modules for n in _rotation_names(m)]
    if not wrapped:
        raise LookupError(f"no module-level rotation function (apply_*rotary*/apply_*rope*) in "
                          f"{', '.join(m.__name__ for m in modules)}; the rotation is inlined")
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
        if text is not None:  # a composite: a call after a text layer (an encoder-decoder's other half) is no layer's
            hooks.append(layer.register_forward_hook(lambda *_: setattr(rec, "layer", None)))
    rotary = []  # (module, position_ids, output) of every call of a *Rotary* module: the positions it really saw

    def seen(m, args, kwargs, out):
        p = args[1] if len(args) > 1 else kwargs.get("position_ids")
        rotary.append((m, args, kwargs, out, p))

    for m in model.modules():
        if "Rotary" in type(m).__name__:
            hooks.append(m.register_forward_hook(seen, with_kwargs=True))
    saved = {(m, n): getattr(m, n) for m, n in wrapped}
    positions = positions_for(getattr(config, "max_position_embeddings", None))
    ids = torch.randint(0, min(getattr(config, "vocab_size", 128) or 128, 100), (1, len(positions)))
    pos = torch.tensor([positions])
    try:
        for (m, n), fn in saved.items():
            setattr(m, n, rec.wrap(fn))
        with torch.no_grad():
            try:
                top(input_ids=ids, position_ids=pos, use_cache=False)
            except TypeError as e:
                if "position_ids" not in str(e) and "use_cache" not in str(e):
                    raise
                positions = list(range(len(positions)))
                pos = torch.tensor([positions])
                top(input_ids=ids)
    finally:
        for (m, n), fn in saved.items():
            setattr(m, n, fn)
        for h in hooks:
            h.remove()
    # A model may replace the positions it is given (CSM's depth decoder numbers its codebooks 0, 1, 2, ... and
    # ignores position_ids): compare at the positions its rotary module was called with. An M-RoPE model's text
    # positions ([axes, batch, s], Qwen2-VL's) count where every axis holds the same positions.
    used = {tuple(p.reshape(-1, p.shape[-1])[0].tolist()) for *_, p in rotary
            if isinstance(p, torch.Tensor) and p.shape[-1] == len(positions) and (p.dim() in (1, 2) or (
                p.dim() == 3 and bool((p.reshape(-1, p.shape[-1]) == p.reshape(-1, p.shape[-1])[:1]).all())))}
    if len(used) == 1 and list(next(iter(used))) != positions:
        positions = list(next(iter(used)))
    return {"calls": rec.calls, "ran": sorted(set(rec.ran)), "positions": positions, "dtype": str(dtype),
            "rotary": rotary}


def rotated_pairs(call) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) tensor pairs of one rotation call: the leading tensor arguments matched to the outputs."""
    out = call["out"]
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    ins = [a for a in call["args"] if isinstance(a, torch.Tensor)]
    return [(i, o) for i, o in zip(ins, outs) if isinstance(o, torch.Tensor) and o.shape == i.shape]


def layout_of(shape: tuple[int, ...], s: int) -> str:
    if shape[-1] == s or list(shape).count(s) != 1:
        raise LookupError(f"cannot tell the sequence axis of a tensor of shape {list(shape)} ({s} tokens)")
    names = []
    for i, n in enumerate(shape[:-1]):
        names.append("s" if n == s else ("b" if i == 0 else "h"))
    if names.count("h") > 1:
        raise LookupError(f"tensor of shape {list(shape)} has more than one heads-like axis")
    return " ".join(names + ["d"])
