r"""Running transformers' own code on a tiny model, recording each call of its module-level rotation functions
and of its rotary modules (the design: ``ropelab.conformance``'s docstring)."""

from __future__ import annotations

import inspect
import re
import sys

import torch

from .sizes import N_FRAMES, positions_for  # re-exported: the sweep's sizes have their own home

__all__ = ["base_model", "error_text", "positions_for", "run_transformers", "rotated_pairs", "layout_of",
           "model_inputs", "n_layers_of", "InputsRefused", "SweepCannot", "GRID_THW", "N_FRAMES", "first_int",
           "rotation_names", "SWEEP_CANNOT"]


def error_text(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    msg = lines[0] if lines else ""
    if msg.endswith(":") and len(lines) > 1 and "alidat" in msg:  # a strict config's validation: what it says
        msg = f"{msg} {lines[1]}"
    return f"{type(e).__name__}: {msg}"[:300]


class _Recorder:
    def __init__(self):
        self.layer: int | None = None
        self.calls: list[dict] = []
        self.ran: list[int] = []
        self.depth = 0  # how many recorded rotation calls are under way: > 0 inside one (Gemma 4's per-axis calls)

    def wrap(self, fn):
        def recorded(*args, **kwargs):
            depth, self.depth = self.depth, self.depth + 1
            try:
                out = fn(*args, **kwargs)
            finally:
                self.depth = depth
            self.calls.append({"layer": self.layer, "fn": fn, "args": args, "kwargs": kwargs, "out": out,
                               "inside": depth > 0})
            return out

        return recorded


def _layer_list(model, n_layers: int):
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers:
            return m
    return None


def _attention_slots(model, n_layers: int):
    """The attention modules of a decoder whose layers are no ModuleList of ``n_layers``, each numbered by its own
    ``layer_idx`` (its cache slot), where that numbers the model's ``n_layers`` attention invocations: LongCat-Flash's
    two MLA sublayers per decoder layer (layer_idx 2i and 2i + 1 of ``num_hidden_layers = 2 * num_layers``), or
    HRM's two stacks run in cycles, whose attention adds the ``cycle_offset`` it is called with (its cache slot
    ``layer_idx + cycle_offset``, ``num_hidden_layers`` of them). None where neither holds."""
    attn = [m for _, m in model.named_modules() if isinstance(getattr(m, "layer_idx", None), int)
            and re.search(r"Attention|MLA|Attn", type(m).__name__)
            and not any(isinstance(c, type(m)) for c in m.children())]
    if not attn:
        return None
    idx = sorted(m.layer_idx for m in attn)
    if idx == list(range(n_layers)):
        return attn
    cycled = all("cycle_offset" in inspect.signature(m.forward).parameters for m in attn)
    if cycled and set(idx) <= set(range(n_layers)):
        return attn
    return None




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
    # T5Gemma's encoder and decoder both on T5GemmaModuleConfig: the encoder, which runs on tokens alone.
    encoders = [cls for cls in bare if cls.__name__.endswith("Encoder")]
    if len(bare) > 1 and len(encoders) == 1:
        return encoders[0](config)
    # A model that exists only with its task head (EoMT-DINOv3's ForUniversalSegmentation): that one.
    if not bare and len(own) == 1:
        return own[0][1](config)
    # A sub-config's network that the parent model builds from it (T5Gemma's encoder, annotated with the parent
    # T5GemmaConfig, built by T5GemmaModel on its T5GemmaModuleConfig): the one encoder of a parent config class
    # whose sub-configs include this class.
    parents = {cls for cls in vars(module).values() if inspect.isclass(cls)
               and type(config) in (getattr(cls, "sub_configs", None) or {}).values()}
    sub_encoders = [cls for name, cls in sorted(vars(module).items()) if inspect.isclass(cls)
                    and issubclass(cls, PreTrainedModel) and getattr(cls, "config_class", None) in parents
                    and name.endswith("Encoder")]
    if not own and len(sub_encoders) == 1:
        return sub_encoders[0](config)
    raise SweepCannot(f"no AutoModel and no *Model class for {type(config).__name__} in {module.__name__}"
                      f"{_rotary_owners(type(config), module)}")


def _rotary_owners(config_cls, module) -> str:
    """Where no model class is built on ``config_cls``: whether a rotary class of ``module`` takes it (read from
    the classes' ``config`` annotations), else which config classes the module's rotary classes take."""
    owners = {}
    for name, cls in sorted(vars(module).items()):
        if inspect.isclass(cls) and "Rotary" in name and cls.__module__ == module.__name__:
            p = inspect.signature(cls.__init__).parameters.get("config")
            a = getattr(p, "annotation", None) if p is not None else None
            owners[name] = getattr(a, "__name__", None) if a is not None and a is not p.empty else None
    if any(v == config_cls.__name__ for v in owners.values()):
        return ""
    if not owners:
        return f"; {module.__name__} has no rotary class"
    taken = ", ".join(f"{n} takes {c or 'no annotated config'}" for n, c in owners.items())
    return f"; no rotary class takes a {config_cls.__name__} ({taken})"


# Two frames of 4 x 4 patches: each spatial merge (2 x 2) has whole blocks, rows differ from columns, and a tower
# that rotates by the frame too (MiniMax-M3-VL's) sees it change (with one frame its frame pairs never turn).
GRID_THW = (2, 4, 4)


def _first_int(config, *keys, default=None):
    for k in keys:
        v = getattr(config, k, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], int):
            return v[0]
    return default


def _required(model) -> list[str]:
    """The forward's parameters without a default (what a call must give)."""
    sig = inspect.signature(model.forward)
    return [n for n, p in sig.parameters.items() if p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def model_inputs(model, config, dtype) -> list[dict]:
    """Candidate inputs (seeded, in ``dtype``) for a model whose forward needs more than tokens, first one that runs
    wins; [] for a model that takes tokens. Vision towers taking flattened patches and ``grid_thw`` get one image of
    ``GRID_THW`` patches; pixel-only ViTs an image of 4 x 4 patches (or the config's image_size); audio encoders
    ``N_FRAMES`` frames of features (both (mel, time) orders) or samples; time series a window of values."""
    params = inspect.signature(model.forward).parameters
    req = set(_required(model))
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    from .sequence_inputs import sequence_inputs  # audio, speech and encoder-decoder models: their own module

    seq = sequence_inputs(model, config, dtype, rand)
    if seq is not None:
        return seq
    if "input_ids" in req or "input_ids" in params or not ({"pixel_values", "input_features", "input_values",
                                                             "past_values", "inputs_embeds", "hidden_states",
                                                             "patch_embeds"} & (req | set(params))):
        return []
    encoder = _vision_encoder_inputs(req, config, rand)
    if encoder is not None:
        return encoder

    ch = _first_int(config, "in_channels", "num_channels", default=3)
    patch = _first_int(config, "patch_size", default=14)
    t, h, w = GRID_THW
    n = h * w  # one image's patches (the pixel-only towers)
    merge = _first_int(config, "spatial_merge_size", default=1)
    extra = {"merge_sizes": torch.tensor([merge])} if "merge_sizes" in req else {}
    grid_key = next((k for k in ("grid_thw", "image_grid_thw") if k in params), None)
    if grid_key is not None:
        out = []
        tps_all = [_first_int(config, "temporal_patch_size", default=1)]
        tps_all += [v for v in (1, 2) if v not in tps_all]
        for frames in (t, 1):  # one frame where a tower refuses two (GLM-4V's temporal merge)
            grid, n = torch.tensor([[frames, h, w]]), frames * h * w
            for key in ("hidden_states", "pixel_values"):
                if key in params:
                    for tps in tps_all:
                        out.append({key: rand(n, ch * tps * patch * patch), grid_key: grid, **extra})
                    out += [{key: rand(n, ch, patch, patch), grid_key: grid, **extra},
                            {key: rand(n, ch, tps_all[0], patch, patch), grid_key: grid, **extra},
                            {key: rand(1, n, ch, patch, patch), grid_key: grid, **extra},
                            {key: rand(1, n, ch * patch * patch), grid_key: grid, **extra}]
        return out + _merged_patch_inputs(params, grid_key, ch, patch, merge, rand)
    if "pixel_position_ids" in req and "pixel_values" in params:
        # Gemma 4's vision tower takes each patch's (column, row) as an input: the grid's, row-major
        grid = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy"), -1).reshape(1, n, 2)
        return [{"pixel_values": rand(1, n, ch * patch * patch), "pixel_position_ids": grid},
                {"pixel_values": rand(1, n, ch * patch * patch), "pixel_position_ids": grid.flip(-1)}]
    if "pixel_values" in params:
        sizes = [h * patch]
        image = _first_int(config, "image_size")
        if image is not None and image != h * patch and image <= 1024:
            sizes.append(image)  # a ViT with learned absolute positions takes exactly its image size
        flat = [n] + ([(image // patch) ** 2] if image is not None and image <= 1024 else [])
        return ([{"pixel_values": rand(1, ch, s, s)} for s in sizes]
                + [{"pixel_values": rand(1, m, ch * patch * patch)} for m in flat])
    mel = _first_int(config, "num_mel_bins", "feature_size", "input_feat_size", "n_mels", default=80)
    if "input_features" in params and ("input_features" in req or "inputs_embeds" in params):
        frames = [N_FRAMES]
        src = _first_int(config, "max_source_positions")
        if src is not None and 2 * src <= 4096:
            frames.append(2 * src)  # Whisper-like encoders take exactly twice their positions
        mels = [mel] + ([128] if mel != 128 else [])  # a class that states no mel bins (Gemma 4's audio): 128
        return [{"input_features": rand(1, *shape)} for m in mels for f in frames for shape in ((m, f), (f, m))]
    if "input_values" in req:
        samples = N_FRAMES * 192  # a multiple of the usual hop lengths (160, 320, 480, 1920 samples)
        return [{"input_values": rand(1, samples)}, {"input_values": rand(1, 1, samples)}]
    if "past_values" in req:
        return [{"past_values": rand(1, 128)}]  # a multiple of the time-series models' patch lengths (32)
    if "inputs_embeds" in req:
        hidden = _first_int(config, "hidden_size", default=64)
        return [{"inputs_embeds": rand(1, 9, hidden)}]
    return []


def _merged_patch_inputs(params, grid_key: str, ch: int, patch: int, merge: int, rand) -> list[dict]:
    """A tower whose grid counts merged tokens and whose pixels come one merged block per token, channels last
    (Inkling2's ``pixel_values`` [tokens, patch * merge, patch * merge, channels], ``image_grid_thw`` in language
    model tokens): one image of ``GRID_THW``'s rows and columns of patches, merged. Tried after the others."""
    _, h, w = GRID_THW
    if "pixel_values" not in params or merge <= 1 or h % merge or w % merge:
        return []
    grid = torch.tensor([[1, h // merge, w // merge]])
    side = patch * merge
    return [{"pixel_values": rand((h // merge) * (w // merge), side, side, ch), grid_key: grid}]


def _vision_encoder_inputs(req: set[str], config, rand) -> list[dict] | None:
    """Inputs of a vision tower's second stage, fed what its first stage makes (None: not such a forward).
    DeepSeek-OCR 2's encoder takes embeddings and ``num_patches``, the number of leading image tokens it attends
    bidirectionally (the rest, its learned queries, causally): 9 embeddings, the first 4 of them patches.
    Unlimited-OCR's CLIP stage takes ``patch_embeds`` [b, hidden, rows, columns]: a 4 x 4 grid, and its
    ``image_size / patch_size`` grid (learned absolute positions that may need exactly it)."""
    hidden = _first_int(config, "hidden_size", default=64)
    if "num_patches" in req and "inputs_embeds" in req:
        return [{"inputs_embeds": rand(1, 9, hidden), "num_patches": 4}]
    if "patch_embeds" in req:
        sides = [GRID_THW[1]]
        image, patch = _first_int(config, "image_size"), _first_int(config, "patch_size")
        if image and patch and image // patch not in sides and image // patch <= 64:
            sides.append(image // patch)
        return [{"patch_embeds": rand(1, hidden, s, s)} for s in sides]
    return None


class _Done(Exception):
    """The run is complete (the text sub-model ran alone): leave the chain of fallbacks."""


def _output_bug(e: BaseException) -> bool:
    """An AttributeError on a model output object (``'...OutputWithPast' object has no attribute``)."""
    return isinstance(e, AttributeError) and re.search(r"Output\w*' object has no attribute", str(e)) is not None


def _conditioning(model, config, s: int, dtype) -> dict:
    """A state a decoder is conditioned on besides its tokens (Moshi's depth decoder projects the main decoder's
    ``last_hidden_state``, ``input_size`` wide, onto each codebook's token): seeded values, one row per token."""
    if "last_hidden_state" not in inspect.signature(model.forward).parameters:
        return {}
    width = _first_int(config, "input_size")
    if width is None:
        return {}
    g = torch.Generator().manual_seed(1)
    return {"last_hidden_state": torch.randn(1, s, width, generator=g, dtype=torch.float64).to(dtype)}


def _embedded(model, ids):
    emb = model.get_input_embeddings()
    return (emb[0] if isinstance(emb, torch.nn.ModuleList) else emb)(ids)


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
    layers of that text sub-model. A model that takes no tokens runs on the inputs :func:`model_inputs` builds."""
    rec = _Recorder()
    if text is None:
        names = _rotation_names(module)
        source = inspect.getsource(module)
        if not names and not any("Rotary" in n for n, c in vars(module).items() if inspect.isclass(c)) \
                and not re.search(r"\.(cos|sin)\(|torch\.(cos|sin)\(", source):
            raise SweepCannot(f"no rotary class, no rotation function and no cos/sin anywhere in {module.__name__}: "
                              "the model's code applies no RoPE (it was found because its configuration file "
                              "mentions rope keys)")
        if not names:
            raise SweepCannot(f"no module-level rotation function (apply_*rotary*/apply_*rope*) in "
                              f"{module.__name__}; the rotation is inlined")
        if not isinstance(getattr(config, "num_hidden_layers", None), int) and not isinstance(
                getattr(config, "depth", None), int):
            raise SweepCannot(f"{type(config).__name__} has no num_hidden_layers: a component without decoder layers "
                              "(an image tokenizer, a vocoder, an audio encoder) to attribute rotation calls to")
    torch.manual_seed(0)
    model = _base_model(config, module).to(dtype).eval()
    top = model
    modules = [module]
    if text is not None:
        model = _text_model(top, text)
        if model is None:
            raise SweepCannot(f"no sub-model of {type(top).__name__} on its text config {type(text).__name__} with "
                              f"its {text.num_hidden_layers} layers")
        config = text
        modules += [m for m in dict.fromkeys(sys.modules.get(type(s).__module__) for s in model.modules())
                    if m is not None and m is not module]
    wrapped = [(m, n) for m in modules for n in _rotation_names(m)]
    if not wrapped:
        raise SweepCannot(f"no module-level rotation function (apply_*rotary*/apply_*rope*) in "
                          f"{', '.join(m.__name__ for m in modules)}; the rotation is inlined")
    n_layers = n_layers_of(config)
    from .sequence_inputs import decoder_layers

    dec_layers = decoder_layers(model, config, n_layers, _layer_list) if text is None else None
    layers = dec_layers if dec_layers is not None else _layer_list(model, n_layers)
    slots = _attention_slots(model, n_layers) if layers is None else None
    if layers is None and slots is None:
        raise SweepCannot(f"no ModuleList of num_hidden_layers={n_layers} layers in {type(model).__name__}, and no "
                          f"attention modules whose layer_idx numbers its {n_layers} layers")
    hooks = []
    for i, layer in enumerate(layers if layers is not None else []):
        def pre(_m, _a, i=i):
            rec.layer = i
            rec.ran.append(i)
        hooks.append(layer.register_forward_pre_hook(pre))
        if text is not None or dec_layers is not None:  # a call after a layer (an encoder-decoder's other half, a
            # composite's tower) is no layer's
            hooks.append(layer.register_forward_hook(lambda *_: setattr(rec, "layer", None)))
    for attn in slots or []:
        def pre_slot(m, _a, kwargs):
            i = m.layer_idx + int(kwargs.get("cycle_offset", 0) or 0)
            rec.layer = i
            rec.ran.append(i)
        hooks.append(attn.register_forward_pre_hook(pre_slot, with_kwargs=True))
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
    inputs = model_inputs(model, config, dtype) if text is None else []
    used_inputs = None
    text_alone = None
    try:
        for (m, n), fn in saved.items():
            setattr(m, n, rec.wrap(fn))
        with torch.no_grad():
            if inputs:
                used_inputs = _run_inputs(model, inputs, rec, rotary)
            else:
                try:
                    positions = _token_forward(top, ids, pos, rec, rotary, _conditioning(top, config, len(positions),
                                                                                         dtype),
                                               text_alone_ok=text is not None and model is not top)
                except _Done as done:
                    text_alone = str(done)
                    model(input_ids=ids, position_ids=pos, use_cache=False)
                except Exception as e:  # noqa: BLE001 - what else the forward needs, else this error stands
                    from .sequence_inputs import token_candidates

                    g = torch.Generator().manual_seed(0)
                    more = token_candidates(top, config, dtype, ids, pos, e, lambda *shape: torch.randn(
                        *shape, generator=g, dtype=torch.float64).to(dtype))
                    if not more:
                        raise
                    try:
                        used_inputs = _run_inputs(top, more, rec, rotary)
                    except Exception:  # noqa: BLE001 - none helps: the forward's own error on tokens stands
                        raise e from None
    finally:
        for (m, n), fn in saved.items():
            setattr(m, n, fn)
        for h in hooks:
            h.remove()
    run = _finish_run(rec, positions, dtype, rotary, n_layers, used_inputs)
    if text_alone is not None:
        run["text_model_alone"] = (f"{type(model).__name__} run alone: the whole model raised after it ran "
                                   f"({text_alone})")
    if slots is not None:
        if not set(run["ran"]) <= set(range(n_layers)):
            raise SweepCannot(f"attention slots {run['ran']} outside the {n_layers} layers of "
                              f"{type(model).__name__}")
        run["layers_by"] = "attention modules' layer_idx (plus the cycle_offset they are called with)"
    return run


def _token_forward(top, ids, pos, rec, rotary, conditioning=None, text_alone_ok=False) -> list[int]:
    """The forward on token ids (``_run``) at ``pos``, with the ``conditioning`` state a decoder takes besides them
    (:func:`_conditioning`); returns the positions given (0 .. s-1 where the model refuses them). Raises
    :class:`_Done`, its message the wrapper's error, where (``text_alone_ok``) a composite's text sub-model ran and
    the wrapper failed building its output afterwards (Llama 4's reads ``image_outputs`` from its language model's
    output, which has none): the caller runs the text sub-model alone, on the same tokens."""
    positions = pos[0].tolist()
    try:
        top(input_ids=ids, position_ids=pos, use_cache=False, **(conditioning or {}))
    except (ValueError, AttributeError) as e:
        if _output_bug(e) and text_alone_ok and rec.calls:
            rec.calls.clear()
            rec.ran.clear()
            rotary.clear()
            raise _Done(error_text(e)) from None
        if "input_ids` is expected to be `None`" not in str(e) and "'embed_tokens'" not in str(e):
            raise
        # A model fed embeddings, not tokens (Qwen3-Omni's talker and its code predictor): the tokens'
        # rows of its own input embedding (the first codebook's where it has one per codebook).
        top(inputs_embeds=_embedded(top, ids), position_ids=pos, use_cache=False)
    except (TypeError, IndexError) as e:
        # A model that takes no position_ids, or whose rotary numbers the tokens 0 .. s-1 itself while its
        # attention indexes that table with the given positions (CLVP): the tokens at 0 .. s-1.
        if "position_ids" not in str(e) and "use_cache" not in str(e) and not (
                isinstance(e, IndexError) and f"with size {len(positions)}" in str(e)):
            raise
        rec.calls.clear()
        rec.ran.clear()
        rotary.clear()
        positions = list(range(len(positions)))
        top(input_ids=ids)
    return positions


def _finish_run(rec, positions, dtype, rotary, n_layers, used_inputs) -> dict:
    run = {"calls": rec.calls, "ran": sorted(set(rec.ran)), "positions": positions, "dtype": str(dtype),
           "rotary": rotary, "n_layers": n_layers}
    if used_inputs is not None:
        run["inputs"] = {k: list(v.shape) if isinstance(v, torch.Tensor) else v for k, v in used_inputs.items()}
        if "grid_thw" in used_inputs:
            run["inputs"]["grid_thw"] = used_inputs["grid_thw"].tolist()
        _positions_from_rotary(run)
        return run
    # A model may replace the positions it is given (CSM's depth decoder numbers its codebooks 0, 1, 2, ... and
    # ignores position_ids): compare at the positions its rotary module was called with. An M-RoPE model's text
    # positions ([axes, batch, s], Qwen2-VL's) count where every axis holds the same positions.
    _token_positions(run)
    used = {tuple(p.reshape(-1, p.shape[-1])[0].tolist()) for *_, p in rotary
            if isinstance(p, torch.Tensor) and p.shape[-1] == len(positions) and (p.dim() in (1, 2) or (
                p.dim() == 3 and bool((p.reshape(-1, p.shape[-1]) == p.reshape(-1, p.shape[-1])[:1]).all())))}
    if len(used) == 1 and list(next(iter(used))) != positions:
        run["positions"] = list(next(iter(used)))
    return run


def n_layers_of(config) -> int:
    """The layer count: ``num_hidden_layers``, else a vision tower's ``depth``."""
    n = getattr(config, "num_hidden_layers", None)
    n = n if isinstance(n, int) else getattr(config, "depth", None)
    if not isinstance(n, int):
        raise SweepCannot(f"{type(config).__name__} has no int num_hidden_layers or depth")
    return n


SWEEP_CANNOT = "the sweep cannot run or read transformers' model on this config (not a failure of transformers')"


class SweepCannot(LookupError):
    """What the sweep itself cannot do with a model (find its class, its decoder layers, its rotation function):
    never transformers' failure, and its row says so (``records``)."""


class InputsRefused(RuntimeError):
    """The model raised on every candidate of ``model_inputs``."""


def _run_inputs(model, inputs: list[dict], rec, rotary) -> dict:
    """Run the first candidate of ``model_inputs`` that the model accepts; the error of the last one else."""
    err = None
    for kw in inputs:
        rec.calls.clear()
        rec.ran.clear()
        rotary.clear()
        try:
            model(**kw)
        except Exception as e:  # noqa: BLE001 - the next candidate; the last error is the reason
            err = e
            continue
        return kw
    if isinstance(err, TypeError) and "required positional argument" in str(err):
        raise err  # an input the sweep does not build (MLlama's aspect_ratio_ids): that is the reason
    raise InputsRefused(f"{', '.join(sorted(inputs[-1]))}; the last one: {error_text(err)}") from err


def _positions_from_rotary(run: dict) -> None:
    """The positions of each recorded call, read from the rotary module's call: its ``position_ids`` ([s] or [b, s]:
    1D; [A, s]: one row per axis, a vision tower's (row, column) or (frame, row, column)), each token's
    matched to the call by its cos row (Qwen2.5-VL reorders the tokens into windows after the rotary module).
    Sets ``run["positions"]`` (1D list, or None) and ``call["positions"]`` ([A, s] tensor) where multi-axis."""
    run["positions"] = None
    recs = [(out, p) for _m, _a, _k, out, p in run["rotary"] if isinstance(p, torch.Tensor)
            and isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], torch.Tensor)]
    if not recs:
        return
    ps = {tuple(p.shape) for _, p in recs}
    if len(ps) != 1:
        return
    out, p = recs[0]
    if p.dim() == 1 or (p.dim() == 2 and p.shape[0] == 1):
        run["positions"] = p.reshape(-1).tolist()
        return
    if (p.dim() == 2 and out[0].dim() == 3 and tuple(out[0].shape[:2]) == tuple(p.shape)
            and bool((p == p[:1]).all())):
        run["positions"] = p[0].tolist()  # a batch of one sequence's positions (a DiT doubled for guidance): [b, s]
        return
    table = out[0].reshape(-1, out[0].shape[-1]).double()  # [s, d]: each token's cos row
    s = table.shape[0]
    if p.dim() == 3 and p.shape[0] == 1:
        p = p[0]  # one image: [1, s, A] (Gemma 4's pixel_position_ids) -> [s, A]
    if p.dim() == 2 and p.shape[0] == s and p.shape[1] <= 4:
        p = p.T  # [s, A] (Qwen2-VL's vision rotary: one (row, column) per token) -> [A, s]
    if p.dim() != 2 or p.shape[0] > 4 or p.shape[1] != s:
        return
    for c in run["calls"]:
        tensors = [a for a in c["args"] if isinstance(a, torch.Tensor)]
        n_rot = len(rotated_pairs(c))  # (q, k, cos, sin, ...) or Gemma 4's (x, cos, sin, position_ids)
        cos = tensors[n_rot] if len(tensors) > n_rot else None
        if cos is None or cos.numel() % table.shape[1] or cos.numel() < table.numel():
            continue
        rows = cos.reshape(-1, table.shape[1]).double()
        eq = (rows[:, None, :] == table[None, :, :]).all(-1)  # [s call, s rotary]
        if rows.shape[0] == s and bool((eq.sum(1) >= 1).all()):
            c["positions"] = p[:, eq.float().argmax(1)]
        elif rows.shape[0] > s:
            _prefixed_positions(c, p, rows, eq, s)


def _prefixed_positions(call: dict, p: torch.Tensor, rows: torch.Tensor, eq: torch.Tensor, s: int) -> None:
    """A vision tower that prepends k tokens (a class token) to the s patches its rotary module numbered: the call's
    cos has k + s rows, the last s of them the rotary module's rows (each matched, as above). MLCD rotates its class
    token by a learned angle (``class_pos_emb``): that is no position, so those k tokens are not compared, and the
    call records it (``prefix``: k, and whether their rows were the identity, cos 1). Sets ``call["positions"]``
    (the patches' [A, s]) and ``call["prefix"]``; a call whose rows match otherwise is left unread."""
    k = rows.shape[0] - s
    if not bool((eq[k:].sum(1) >= 1).all()) or bool((eq[:k].sum(1) >= 1).any()):
        return
    call["positions"] = p[:, eq[k:].float().argmax(1)]
    call["prefix"] = {"tokens": k, "identity": bool((rows[:k] == 1).all())}


def _token_positions(run: dict) -> None:
    """The positions of a 1D call that rotates another set of tokens than the sequence (Qwen4-Exp's QSA indexer
    rotates each block's pooled key by the cos row of the block's first token, ``full_cos.index_select``): each of
    its cos rows matched to one row of the rotary module's table, whose position is that row's. Sets
    ``call["token_positions"]`` where every row matches exactly one position's row; a call whose rows match none
    is left as it is (and is not compared)."""
    recs = [out for _m, _a, _k, out, p in run["rotary"] if isinstance(out, (tuple, list)) and len(out) == 2
            and isinstance(out[0], torch.Tensor) and out[0].shape[-2:-1] == (len(run["positions"]),)]
    if not recs:
        return
    table = recs[0][0].reshape(-1, len(run["positions"]), recs[0][0].shape[-1])[0].double()  # [s, d]
    for c in run["calls"]:
        pairs = rotated_pairs(c)
        if not pairs or len(run["positions"]) in pairs[0][0].shape[:-1]:
            continue
        tensors = [a for a in c["args"] if isinstance(a, torch.Tensor)][len(pairs):]
        cos = tensors[0] if tensors else c["kwargs"].get("cos")
        if not isinstance(cos, torch.Tensor) or cos.shape[-1] != table.shape[1]:
            continue
        rows = cos.reshape(-1, table.shape[1]).double()
        eq = (rows[:, None, :] == table[None, :, :]).all(-1)
        tokens = [n for n in pairs[0][0].shape[:-1] if n == rows.shape[0]]
        if tokens and bool((eq.sum(1) == 1).all()):
            c["token_positions"] = [run["positions"][j] for j in eq.float().argmax(1).tolist()]


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


# The base model of a config (AutoModel's, else its module's *Model class): records and composite build with it.
base_model = _base_model
first_int = _first_int  # what a config says under the first of several names (vision.py reads sizes so)
rotation_names = _rotation_names
