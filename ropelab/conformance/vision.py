r"""Vision models the sweep runs on pixels rather than tokens, where the plain and composite paths do not reach: a
composite vision config without a decoder of its own (DeepSeek-OCR 2's and Unlimited-OCR's vision models: a SAM
stage, then an encoder), run whole on the inputs ``running.model_inputs`` builds, to say where its RoPE is applied
(the design: ``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import sys

import torch

__all__ = ["vision_composite_reason"]


def _sub_config_pixels(config, sub_config_types: dict) -> list[dict]:
    """Images at each sub-config's sizes (a composite's top config states none: the SAM stage's patch_size and
    image_size are its ``sam_config``'s): 4 x 4 patches, then its ``image_size`` (learned absolute positions that
    need exactly it), seeded, float64."""
    from .running import GRID_THW
    from .running import first_int as _first_int

    g = torch.Generator().manual_seed(0)
    out = []
    for k in sub_config_types:
        sub = getattr(config, k, None)
        patch, image = _first_int(sub, "patch_size"), _first_int(sub, "image_size")
        ch = _first_int(sub, "num_channels", "in_channels", default=3)
        for side in ([GRID_THW[1] * patch] if patch else []) + ([image] if image and image <= 1024 else []):
            out.append({"pixel_values": torch.randn(1, ch, side, side, generator=g, dtype=torch.float64)})
    return out


def vision_composite_reason(config, module, sub_config_types: dict) -> tuple[str, dict] | None:
    """:func:`_composite_run` on the tiny composite; where the model refuses every input built there (its stages'
    widths shrunk apart: DeepSeek-OCR 2's SAM stage ends at 896 channels, its encoder's tiny width is 256), again
    on its sub-configs at their default widths and at most ``TOWER_LAYERS`` layers each, the reason saying so."""
    from .composite import TOWER_LAYERS

    first = _composite_run(config, module, sub_config_types)
    if first is None or not first[0].startswith(_REFUSED):
        return first
    kw = {}
    for k in sub_config_types:
        sub = getattr(config, k, None)
        n = getattr(sub, "num_hidden_layers", None)
        if hasattr(sub, "to_dict") and isinstance(n, int):
            kw[k] = {"model_type": sub.model_type, "num_hidden_layers": min(type(sub)().num_hidden_layers,
                                                                               TOWER_LAYERS)}
    try:
        wide = type(config)(**kw)
    except Exception:  # noqa: BLE001 - the tiny run's reason then
        return first
    second = _composite_run(wide, module, sub_config_types)
    if second is None:
        return first
    at = f"at its sub-configs' default widths, {TOWER_LAYERS} layers each"
    if second[0].startswith(_REFUSED):
        return (f"{first[0][:-1]}; {at} too: {second[0].split('the last one: ', 1)[-1]}", first[1])
    return (f"{second[0]} ({at}; at the tiny widths: {first[0].split('the last one: ', 1)[-1][:-1]})", second[1])


_REFUSED = "transformers' model refuses the inputs the sweep builds for it"


def _composite_run(config, module, sub_config_types: dict) -> tuple[str, dict] | None:
    """(reason, inputs) for a composite config with no ``num_hidden_layers`` whose model takes pixels, read from one
    float64 run on the first of ``model_inputs`` it accepts, with every module-level rotation function of the
    modules its sub-models come from recorded and each call attributed to the outermost sub-model built on one of
    its sub-configs; None where the model takes tokens, or refuses every input built (``token_failure`` then says
    why). The reason is measured: no rotary module ran and no rotation function was called (the model applies no
    RoPE), or every call came from sub-models on sub-configs whose model types are compared as their own (the RoPE
    lives in a sub-config), or the calls are named where they came from."""
    from .running import base_model as _base_model
    from .running import error_text, model_inputs
    from .running import rotation_names as _rotation_names

    torch.manual_seed(0)
    try:
        model = _base_model(config, module).double().eval()
    except Exception:  # noqa: BLE001 - token_failure says it
        return None
    inputs = model_inputs(model, config, torch.float64)
    if not inputs:
        return None
    inputs += _sub_config_pixels(config, sub_config_types)
    subs = {id(getattr(config, k)): k for k in sub_config_types if hasattr(getattr(config, k, None), "to_dict")}
    owner: list[str | None] = [None]
    calls: list[str | None] = []
    ran: list[str] = []
    hooks = []
    for _, m in model.named_modules():
        key = subs.get(id(getattr(m, "config", None)))
        if key is not None and m is not model:
            hooks.append(m.register_forward_pre_hook(lambda *_, k=key: owner.__setitem__(0, owner[0] or k)))
            hooks.append(m.register_forward_hook(lambda *_, k=key: owner.__setitem__(0, None if owner[0] == k
                                                                                     else owner[0])))
        if "Rotary" in type(m).__name__:
            hooks.append(m.register_forward_hook(lambda m, *_: ran.append(type(m).__name__)))
    modules = [m for m in dict.fromkeys(sys.modules.get(type(s).__module__) for s in model.modules()) if m]
    wrapped = {(m, n): getattr(m, n) for m in modules for n in _rotation_names(m)}

    def wrap(fn):
        def recorded(*a, **k):
            calls.append(owner[0])
            return fn(*a, **k)
        return recorded

    used, err = None, None
    try:
        for (m, n), fn in wrapped.items():
            setattr(m, n, wrap(fn))
        with torch.no_grad():
            for kw in inputs:
                calls.clear()
                ran.clear()
                try:
                    model(**kw)
                except Exception as e:  # noqa: BLE001 - the next candidate
                    err = e
                    continue
                used = kw
                break
    finally:
        for (m, n), fn in wrapped.items():
            setattr(m, n, fn)
        for h in hooks:
            h.remove()
    if used is None:
        keys = ", ".join(sorted(inputs[-1]))
        return None if err is None else (f"{_REFUSED} (tiny "
                                         f"pixels, patches and grid, features or samples: {keys}; the last one: "
                                         f"{error_text(err)})", {})
    shapes = {k: list(v.shape) if isinstance(v, torch.Tensor) else v for k, v in used.items()}
    said = ", ".join(f"{k} {v}" for k, v in shapes.items())
    if not calls and not ran:
        names = ", ".join(f"apply_* in {m.__name__}" for m in dict.fromkeys(m for m, _ in wrapped)) or "none"
        return (f"the model applies no RoPE on this config: no rotary module ran and no rotation function was called "
                f"when run on {said} (functions wrapped: {names})", shapes)
    keys = sorted({c for c in calls if c is not None})
    if calls and None not in calls:
        types = ", ".join(f"{k} ({sub_config_types.get(k)})" for k in keys)
        return (f"composite config: its RoPE lives in a sub-config: every rotation call of the whole model run on "
                f"{said} came from the sub-model on its {types}, a model type with a row of its own", shapes)
    return None
