r"""llama.cpp's logits against transformers' float64 forward of the same weights, within a bound derived from float32.

:func:`compare` runs a GGUF file in llama.cpp (:func:`ropelab.engines.llamacpp_run.run`) and the Hugging Face model
directory it was converted from in transformers, in float64, on the same token ids at positions ``0 .. n-1``, and
says whether they agree: the largest logit difference against :func:`logit_bound`.

**The bound.** llama.cpp computes in float32 (``llamacpp_run`` keeps the K/V cache in float32 and flash attention
off). Every value is a dot product or sum of at most K rounded terms, K = hidden + intermediate + n_tokens (a
projection, the MLP's down projection, the attention average), so each block adds a relative error of at most
:math:`\gamma_K = K u / (1 - K u)` (Higham; :math:`u = 2^{-24}`) along the residual stream, which RMSNorm keeps
relative. To first order the logit error is then at most

.. math:: (L + 1)\,(\gamma_K + u_{\rm act})\,S, \qquad S = \max_v \sum_j |W_{\rm out}[v, j]|\,|h_L[j]|

(:math:`h_L` the oracle's final normed hidden state, times the model's logit scale where it has one; a final soft
cap :math:`c \tanh(z/c)` (Gemma 2) is 1-Lipschitz, and adds its own rounding :math:`(S + 5c)\,u`): the largest
sum of |terms| of the output projection, L the layer count. :math:`u_{\rm act} = 0` except for GELU: ggml's CPU
GELU reads a float16 table (``ggml/src/ggml-cpu/vec.h``: ``#define GGML_GELU_FP16``, line 46, and
``ggml_vec_gelu_f32``, lines 1000-1013, at the converter's llama.cpp 0c1e570): its input is rounded to float16 and so
is its output, :math:`|{\rm error}| \le (\max|{\rm gelu}'| + 1)\,|x|\,u_{16} \le 2.2\,|x|\,2^{-11}`, so
:math:`u_{\rm act} = 2.2 \cdot 2^{-11}` for the GELU families (Gemma 3). A wrong RoPE (a base changed, a layer's
scaling lost, the other LongRoPE factor set) moves the logits of the tiny models by 0.1 to 1, orders of magnitude
above the bound (about 3e-4, 5e-2 with GELU); measured llama.cpp errors on agreeing families are 3e-3 to 0.13 of
it (tests/test_engines_llamacpp.py prints each).

A difference is "differ" only past :data:`DIFFER_FACTOR` bounds; in between is "unclear" (neither rounding nor
clearly a different model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["U32", "U16", "DIFFER_FACTOR", "GELU_ACTIVATIONS", "N_TOKENS", "token_ids", "hf_forward", "logit_bound",
           "compare", "compare_logits"]

U32 = 2.0 ** -24
U16 = 2.0 ** -11
# A logit difference this many bounds above float32 rounding is a different model.
DIFFER_FACTOR = 3.0
# The activations ggml's CPU backend evaluates through its float16 GELU table.
GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# The run's length: one batch of this many tokens at positions 0 .. N_TOKENS - 1.
N_TOKENS = 24


def token_ids(vocab_size: int, n: int = N_TOKENS, seed: int = 7) -> list[int]:
    """``n`` seeded token ids in ``[3, vocab_size)`` (past unk, bos, eos)."""
    import torch

    return torch.randint(3, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _text(config):
    return getattr(config, "text_config", None) or config


def hf_forward(model_dir: str | Path, ids: Sequence[int], changes: Mapping[str, Any] | None = None, *,
               watch: Callable[[Any], Any] | None = None):
    """transformers' float64 logits ``(n, vocab)`` of the saved model, S of :func:`logit_bound`, and its text config.

    ``changes``: config changes before the model is built (``rope_parameters``: keys merged into it; any other key
    set on the text config), to run the model as an engine reads it. ``watch``: called with the built model, returns
    a context manager the forward runs in (``ropelab.engines.check_run`` records each layer's RoPE with it)."""
    import contextlib

    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    # Mixture-of-experts layers: the eager loop over experts (the grouped matmul kernel takes no float64).
    config._experts_implementation = "eager"
    text = _text(config)
    for key, value in (changes or {}).items():
        if key == "rope_parameters":
            text.rope_parameters = {**text.rope_parameters, **value}
        else:
            setattr(text, key, value)
    cls = (transformers.AutoModelForImageTextToText if hasattr(config, "vision_config")
           else transformers.AutoModelForCausalLM)
    model = cls.from_pretrained(model_dir, config=config, dtype=torch.float64).eval()
    with torch.no_grad(), (watch(model) if watch is not None else contextlib.nullcontext()):
        out = model(torch.tensor([list(ids)]), output_hidden_states=True)
        logits = out.logits[0]
        h = out.hidden_states[-1][0]  # the final normed hidden state
        w = model.get_output_embeddings().weight
        scale = float(getattr(text, "logit_scale", None) or 1.0)
        cap = getattr(text, "final_logit_softcapping", None)
        z = scale * h @ w.T
        if cap:  # Gemma 2's soft cap c tanh(z / c): 1-Lipschitz, so S of z bounds it too (logit_bound adds its own)
            z = cap * torch.tanh(z / cap)
        if not torch.allclose(z, logits, rtol=1e-9, atol=1e-9):
            raise ValueError(f"{model_dir}: the logits are not the output projection of the last hidden state (a "
                             "soft cap or another head?); the bound's S does not apply.")
        s = float(((h.abs() @ w.abs().T) * abs(scale)).amax())
    return logits, s, text


def logit_bound(text_config, s: float, n_tokens: int = N_TOKENS, *, float16_gelu: bool = True) -> float:
    """The bound of the module docstring for a model of ``text_config`` (a transformers config) and S = ``s``.

    ``float16_gelu``: the GELU families' :math:`u_{\rm act}` (ggml's float16 GELU table); False for an engine that
    evaluates GELU in float32 (MLX: :math:`u_{\rm act} = 0`)."""
    import torch

    from ..precision import UNIT_ROUNDOFF

    cfg = text_config.to_dict()
    inter = max((v for k, v in cfg.items() if k.endswith("intermediate_size") and isinstance(v, int)), default=0)
    k = text_config.hidden_size + inter + n_tokens
    u = UNIT_ROUNDOFF[torch.float32]
    gamma = k * u / (1 - k * u)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or ""
    u_act = 2.2 * U16 if float16_gelu and act in GELU_ACTIVATIONS else 0.0
    bound = (text_config.num_hidden_layers + 1) * (gamma + u_act) * s
    cap = cfg.get("final_logit_softcapping")
    if cap:  # c tanh(z / c) in float32: z / c (|z| u), tanh (<= 4 ulp of a value <= 1, times c), times c (c u)
        bound += (s + 5 * cap) * u
    return bound


def compare(model_dir: str | Path, gguf_path: str | Path, *, n_ctx: int | None = None, ids: Sequence[int] | None = None,
            changes: Mapping[str, Any] | None = None, run=None) -> dict:
    """llama.cpp's run of ``gguf_path`` against transformers' float64 forward of ``model_dir`` (changed by
    ``changes``): ``{"status": "agree" | "differ" | "unclear", "max_err", "bound", "ratio", "n_tokens", "n_ctx"
    (as llama.cpp allocated it), "max_abs_logit"}``. ``run``: a :class:`~ropelab.engines.llamacpp_run.RunResult`
    of the same ids to reuse. Raises what :func:`ropelab.engines.llamacpp_run.run` raises."""
    from . import llamacpp_run

    if ids is None:
        import transformers

        ids = token_ids(_text(transformers.AutoConfig.from_pretrained(model_dir)).vocab_size)
    ids = list(ids)
    if run is None:
        run = llamacpp_run.run(gguf_path, ids, n_ctx=n_ctx)
    return {**compare_logits(model_dir, run.logits, ids, changes=changes), "n_ctx": run.info["n_ctx"]}


def compare_logits(model_dir: str | Path, logits, ids: Sequence[int], *, changes: Mapping[str, Any] | None = None,
                   float16_gelu: bool = True, engine: str = "llama.cpp") -> dict:
    """An engine's float32 ``logits`` ``(len(ids), vocab)`` of ``ids`` at positions ``0 .. n-1`` against
    transformers' float64 forward of ``model_dir`` (changed by ``changes``) within :func:`logit_bound`
    (``float16_gelu`` as there): ``{"status", "max_err", "bound", "ratio", "n_tokens", "max_abs_logit"}``."""
    import numpy as np

    ids = list(ids)
    ref, s, text = hf_forward(model_dir, ids, changes)
    got = np.asarray(logits, dtype=np.float64)
    if got.shape != tuple(ref.shape):
        raise ValueError(f"{engine}'s logits have shape {got.shape}, transformers' {tuple(ref.shape)}: not the same "
                         "model (vocabulary).")
    err = float(np.abs(got - ref.numpy()).max())
    b = logit_bound(text, s, len(ids), float16_gelu=float16_gelu)
    status = "agree" if err <= b else "differ" if err > DIFFER_FACTOR * b else "unclear"
    return {"status": status, "max_err": err, "bound": b, "ratio": err / b, "n_tokens": len(ids),
            "max_abs_logit": float(ref.abs().max())}
