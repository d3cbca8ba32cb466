r"""mlx-lm running a Hugging Face model directory: its float32 logits, to compare with transformers' float64 forward.

:func:`logits` loads a saved transformers model (``config.json`` + ``model.safetensors``) the way mlx-lm loads any
model, ``mlx_lm.utils.load_model`` (its ``_get_classes`` picks the model code by ``model_type``, its ``ModelArgs``
read the config, its ``sanitize`` maps the weight names, ``load_weights`` strict), and runs one forward of the token
ids at positions ``0 .. n-1`` in float32 on whatever device MLX has (the CPU build here). Nothing of ropelab enters
the model: what comes out is what mlx-lm computes from the config, RoPE included.

:func:`compare` puts those logits beside transformers' float64 forward of the same weights
(:func:`ropelab.engines.parity.compare_logits`) within the float32 bound of :mod:`ropelab.engines.parity`, without
its float16 GELU term: MLX evaluates GELU in float32 (``mlx.nn.gelu_approx`` is the tanh formula, computed in the
input's dtype), so :math:`u_{\rm act} = 0`.

A model mlx-lm refuses (a model type it has no code for, a config its ``ModelArgs`` or ``Model`` rejects, weights
that do not fit) is a :class:`MlxRefusal` (a :class:`~ropelab.engines.reading.ReadError`) carrying mlx-lm's own
message, as :func:`ropelab.engines.mlx.read_mlx` reports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .reading import ReadError

__all__ = ["MlxRefusal", "MlxRunError", "logits", "compare"]

# At most this many tokens in one forward (the tiny models' runs take 24).
MAX_TOKENS = 4096


class MlxRefusal(ReadError):
    """mlx-lm refused the model; the message carries mlx-lm's own reason. ``stage``: ``"config"`` when mlx-lm cannot
    build the model from its ``config.json`` (what :func:`ropelab.engines.mlx.read_mlx` sees too), ``"weights"`` when
    it builds it but refuses the saved weights, ``None`` otherwise (no weights, no readable config)."""

    def __init__(self, message: str, *, stage: str | None = None):
        super().__init__(message)
        self.stage = stage


def _builds(config: dict) -> bool:
    """Whether mlx-lm builds its model from ``config`` (as ``load_model`` does before it reads weights)."""
    from mlx_lm.utils import _get_classes

    try:
        model_class, args_class = _get_classes(config)
        model_class(args_class.from_dict(config))
    except Exception:  # any refusal of the config: the caller reports load_model's own
        return False
    return True


class MlxRunError(RuntimeError):
    """mlx-lm loaded the model but its forward failed; the message carries the exception and the innermost line of
    mlx-lm's source it came from."""


def _where(exc: BaseException) -> str:
    """``mlx_lm/<file>:<line>`` of the innermost traceback frame in mlx-lm's code (or of the last frame)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/mlx_lm/" in f.filename.replace("\\", "/")] or frames[-1:]
    if not ours:
        return "?"
    f = ours[-1]
    name = f.filename.replace("\\", "/")
    return f"{name[name.rindex('/mlx_lm/') + 1:] if '/mlx_lm/' in name else Path(name).name}:{f.lineno}"


def _vocab_size(config: Mapping[str, Any]) -> int | None:
    for c in (config, config.get("text_config") or {}):
        v = c.get("vocab_size") if isinstance(c, Mapping) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _check(model_dir, ids) -> tuple[Path, list[int], dict]:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ValueError(f"model_dir must be a model directory with a config.json, got {path}.")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise MlxRefusal(f"{path / 'config.json'}: not a readable JSON config ({e}).") from e
    if not isinstance(config, dict):
        raise MlxRefusal(f"{path / 'config.json'}: the config is not a JSON object.")
    ids = list(ids)
    if not ids or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"ids must be a non-empty sequence of ints, got {ids[:8]!r}.")
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"ids must hold at most {MAX_TOKENS} tokens (one forward), got {len(ids)}.")
    vocab = _vocab_size(config)
    if vocab is None:
        raise MlxRefusal(f"{path / 'config.json'}: no vocab_size; the token ids cannot be checked against it.")
    bad = [int(t) for t in ids if not 0 <= int(t) < vocab]
    if bad:  # MLX's embedding gather does not check its indices: an id past the table reads other memory
        raise ValueError(f"ids must lie in [0, vocab_size = {vocab}), got {bad[:8]}.")
    return path, [int(t) for t in ids], config


def logits(model_dir: str | Path, ids: Sequence[int], *, watch: Callable[[Any], Any] | None = None) -> np.ndarray:
    """mlx-lm's float32 logits ``(len(ids), vocab)`` of the model saved in ``model_dir`` for ``ids`` at positions
    ``0 .. n-1`` (one forward, no cache). Raises :class:`MlxRefusal` when mlx-lm refuses the model,
    :class:`MlxRunError` when its forward fails, ValueError on
    bad arguments, and when a weight or the logits are not float32 (the comparison's bound is float32's).
    ``watch``: called with the loaded model, returns a context manager the forward runs in (``ropelab-check --run``
    records each layer's rope module with it)."""
    path, ids, config = _check(model_dir, ids)
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(path, strict=True)
    except FileNotFoundError as e:
        raise MlxRefusal(f"{path}: mlx-lm finds no weights ({e}).") from e
    except Exception as e:  # mlx-lm's own checks (unknown model_type, ModelArgs asserts, weight names): its words
        stage = "weights" if _builds(config) else "config"
        raise MlxRefusal(f"{path}: mlx-lm refuses this model ({stage}): {type(e).__name__}: {e}", stage=stage) from e
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})
    if dtypes != ["mlx.core.float32"]:
        raise ValueError(f"{path}: mlx-lm loaded weights of dtypes {dtypes}; the comparison needs float32 weights "
                         "(save the model in float32).")
    import contextlib

    try:
        with watch(model) if watch is not None else contextlib.nullcontext():
            out = model(mx.array([ids], dtype=mx.int32))
            mx.eval(out)
    except Exception as e:  # a bug or an unmet assumption in mlx-lm's forward: say which and where, no traceback
        raise MlxRunError(f"{path}: mlx-lm's forward fails: {type(e).__name__}: {e} ({_where(e)}).") from e
    if out.dtype != mx.float32:
        raise ValueError(f"{path}: mlx-lm's logits are {out.dtype}, not float32.")
    arr = np.array(out)[0]
    if not np.isfinite(arr).all():
        raise ValueError(f"{path}: mlx-lm's logits are not all finite.")
    return arr


def compare(model_dir: str | Path, *, ids: Sequence[int] | None = None, changes: Mapping[str, Any] | None = None,
            run: np.ndarray | None = None) -> dict:
    """mlx-lm's float32 logits of ``model_dir`` (or ``run``, logits of the same ids to reuse) against transformers'
    float64 forward of the same weights (changed by ``changes``: the model as mlx-lm reads it, for a named cause):
    :func:`ropelab.engines.parity.compare_logits`'s dict, float32 bound without the float16 GELU term."""
    from . import parity

    if ids is None:
        _, _, config = _check(model_dir, [0])
        ids = parity.token_ids(_vocab_size(config))
    got = logits(model_dir, ids) if run is None else run
    return parity.compare_logits(model_dir, got, ids, changes=changes, float16_gelu=False, engine="mlx-lm")
