"""Run inside vLLM's own environment (``make vllm``), not ropelab's: build a model as vLLM builds it, print JSON.

``ropelab.engines.vllm`` starts this file with the vLLM venv's python (``python vllm_runner.py REQUEST OUT``); it
imports nothing from ropelab (that environment has vLLM's pins, not ropelab's). REQUEST is a JSON file::

    {"cases": [{"model": DIR, "max_model_len": N | null, "dtype": "float32", "prompts": [[ids...], ...],
                "rope": true}, ...]}

For each case (one import of vLLM for all of them) it builds ``vllm.LLM`` in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, eager, no prefix cache) with the directory's real weights, then

- ``rope``: for every decoder layer, its rotary module as vLLM constructed it: class, the constructor's settings
  it keeps as attributes, and its cos/sin cache (``cos_sin_cache``; Phi-3 LongRoPE's ``long_short_cos_sin_cache``)
  as float lists; modules shared between layers (``get_rope`` caches them) are sent once;
- ``logits``: for each prompt, the raw logits of every position, over the whole vocabulary:
  ``prompt_logprobs`` gives positions 0 .. n-2 and the first generated token's ``logprobs`` position n-1, both
  under ``logprobs_mode="raw_logits"`` (the model's logits before any processing);
- ``model_class``: the class vLLM built (``TransformersForCausalLM`` and kin: its Transformers backend, which runs
  transformers' own modeling code, the RoPE included, for architectures vLLM has no class of its own for), and
  ``permutes_qk``: whether it permutes the q/k rows as it loads them (Llama 4);
- ``rope_layers_called``: with prompts, the decoder layers whose rotary module was *called* in the forward of the
  prompts
  (forward hooks: a pre-hook on each ``layers.N`` module names the layer, a hook on each rotary module records
  it). A layer can own a module it never calls: Cohere2's attention builds ``rotary_emb`` on every layer and calls
  it only on the sliding ones (``vllm/model_executor/models/commandr.py``, ``if self.v1 or self.sliding_window``);
- ``record_rope``: each decoder layer's rotary call (``forward(positions, query, key)``) on the first prompt's
  positions ``0 .. n-1``: query and key before and after, flattened ``(n, heads * head_size)`` (``rope_calls``);
- ``rotary_embedding._ROPE_DICT`` is cleared before each case: ``get_rope`` caches modules by their settings but
  not by ``max_model_len``, which LongRoPE's factor choice reads.

OUT gets ``{"ok": true, "cases": [{"ok": true, ...} | {"ok": false, "error": "..."}, ...]}`` (or a top-level
``{"ok": false, "error": ...}`` when vLLM does not import): the caller turns an error into a clear
message and never shows a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

_ATTRS = ("head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style", "scaling_factor",
          "scaling_factors", "low_freq_factor", "high_freq_factor", "orig_max_position", "beta_fast", "beta_slow",
          "mscale", "truncate", "short_factor", "long_factor", "original_max_position_embeddings", "short_mscale",
          "long_mscale", "use_long_rope", "mrope_section", "mrope_interleaved", "max_trained_positions",
          "use_fope")
_CACHES = ("cos_sin_cache", "long_short_cos_sin_cache")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _plain(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    try:
        return float(v)
    except (TypeError, ValueError):
        return repr(v)


def _ropes(model) -> dict:
    modules, layers = {}, {}
    for path, mod in model.named_modules(remove_duplicate=False):
        m = _LAYER.search(path)
        if m is None or not _is_rotary(mod):
            continue
        i = int(m.group(1))
        if i in layers and layers[i][1].count(".") <= path.count("."):
            continue  # the outermost rotary module of a layer
        key = str(id(mod))
        if key not in modules:
            cache_name = next(c for c in _CACHES if hasattr(mod, c))
            cache = getattr(mod, cache_name).detach().float().cpu()
            modules[key] = {
                "class": type(mod).__name__, "module": type(mod).__module__,
                "attrs": {a: _plain(getattr(mod, a)) for a in _ATTRS if hasattr(mod, a)},
                "dtype": str(getattr(mod, "dtype", cache.dtype)), "cache_name": cache_name,
                "cache_shape": list(cache.shape), "cache": cache.reshape(-1).tolist(),
            }
        layers[i] = (key, path)
    n_layers = None
    for name in ("model", "language_model"):
        inner = getattr(model, name, None)
        inner = getattr(inner, "model", inner) if inner is not None and not hasattr(inner, "layers") else inner
        if inner is not None and hasattr(inner, "layers"):
            n_layers = len(inner.layers)
            break
    return {"modules": modules, "n_layers": n_layers,
            "layers": {str(i): {"module": k, "path": p} for i, (k, p) in sorted(layers.items())}}


def _is_rotary(mod) -> bool:
    return any(hasattr(mod, c) for c in _CACHES) and hasattr(mod, "rotary_dim")


def _watch(model) -> None:
    """Forward hooks recording, on ``model._ropelab_rope_calls``, each decoder layer whose rotary module runs."""
    calls: set = set()
    current: list = [None]
    handles = []
    for path, mod in model.named_modules():
        m = re.fullmatch(r"(?:.*\.)?layers\.(\d+)", path)
        if m is not None:
            layer = int(m.group(1))
            handles.append(mod.register_forward_pre_hook(lambda _m, _a, i=layer: current.__setitem__(0, i)))
        elif _LAYER.search(path) and _is_rotary(mod):
            handles.append(mod.register_forward_hook(lambda *_: calls.add(current[0])))
    model._ropelab_rope_calls, model._ropelab_handles = calls, handles


def _watched(model) -> list:
    for h in model._ropelab_handles:
        h.remove()
    return sorted(i for i in model._ropelab_rope_calls if i is not None)


def _model_class(model) -> dict:
    """The class vLLM built, and whether it permutes q/k rows when it loads the weights (Llama 4's
    ``permute_qk_weight_for_rotary`` in ``vllm/model_executor/models/llama4.py``: the interleaved pairs of the
    checkpoint become vLLM's NeoX halves)."""
    return {"class": type(model).__name__,
            "permutes_qk": any(hasattr(m, "permute_qk_weight_for_rotary") for m in model.modules())}


_HOOKS: list = []


def _hook_rope(model, record: dict, n: int) -> None:
    """Forward hooks on every decoder layer (which layer runs) and rotary module (its query and key before and
    after), recording into ``record[layer]`` the first call at positions ``0 .. n-1``."""
    import torch

    state = {"layer": None}
    for path, mod in model.named_modules(remove_duplicate=False):
        if re.search(r"(?:^|\.)layers\.(\d+)$", path) and "visual" not in path and "vision" not in path:
            i = int(path.rsplit(".", 1)[-1])
            _HOOKS.append(mod.register_forward_pre_hook(lambda _m, _a, i=i: state.__setitem__("layer", i)))
    seen = set()
    for _, mod in model.named_modules(remove_duplicate=False):
        if id(mod) in seen or not any(hasattr(mod, c) for c in _CACHES) or not hasattr(mod, "rotary_dim"):
            continue
        seen.add(id(mod))

        def pre(m, args, kwargs):
            pos = args[0] if args else kwargs.get("positions")
            q = args[1] if len(args) > 1 else kwargs.get("query")
            k = args[2] if len(args) > 2 else kwargs.get("key")
            i = state["layer"]
            want = torch.arange(n, device=pos.device)
            if i is None or i in record or pos.dim() != 1 or pos.numel() < n or not torch.equal(pos[:n], want):
                m._ropelab_in = None
                return None
            m._ropelab_in = (i, q[:n].detach().float().reshape(n, -1).clone(), k[:n].detach().float().reshape(n, -1)
                             .clone())
            return None

        def post(m, args, kwargs, output):
            got = getattr(m, "_ropelab_in", None)
            if got is None:
                return None
            i, q_in, k_in = got
            q_out, k_out = output[0], output[1]
            hs = int(m.head_size)
            record[i] = {"head_size": hs, "num_heads": q_in.shape[1] // hs, "num_kv_heads": k_in.shape[1] // hs,
                         "q_in": q_in.reshape(-1).tolist(), "k_in": k_in.reshape(-1).tolist(),
                         "q_out": q_out[:n].detach().float().reshape(-1).tolist(),
                         "k_out": k_out[:n].detach().float().reshape(-1).tolist()}
            m._ropelab_in = None
            return None

        _HOOKS.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        _HOOKS.append(mod.register_forward_hook(post, with_kwargs=True))


def _unhook_rope(model) -> None:
    while _HOOKS:
        _HOOKS.pop().remove()


def _vocab_logits(entries, vocab: int) -> list:
    row = [None] * vocab
    for tok, lp in entries.items():
        row[int(tok)] = float(lp.logprob)
    if any(v is None for v in row):
        raise RuntimeError(f"vLLM returned {sum(v is not None for v in row)} of {vocab} logits for a position.")
    return row


def _case(LLM, SamplingParams, TokensPrompt, case: dict) -> dict:
    from vllm.model_executor.layers import rotary_embedding

    # get_rope caches modules by their settings, not by max_model_len, which LongRoPE's factor choice reads:
    # a second model in this process must not get the first one's module.
    rotary_embedding._ROPE_DICT.clear()
    t0 = time.perf_counter()
    kwargs = dict(model=case["model"], tokenizer=case["model"], dtype=case.get("dtype", "float32"),
                  enforce_eager=True, enable_prefix_caching=False, max_logprobs=-1, logprobs_mode="raw_logits",
                  seed=0, skip_tokenizer_init=True)
    if case.get("max_model_len"):
        kwargs["max_model_len"] = int(case["max_model_len"])
    llm = LLM(**kwargs)
    try:
        out: dict = {"ok": True, "build_s": time.perf_counter() - t0,
                     "max_model_len": llm.llm_engine.model_config.max_model_len,
                     **dict(zip(("model_class", "permutes_qk"), llm.apply_model(_model_class)[0].values()))}
        if case.get("rope", True):
            out["rope"] = llm.apply_model(_ropes)[0]
        if case.get("prompts"):
            vocab = llm.llm_engine.model_config.get_vocab_size()
            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=vocab, logprobs=vocab)
            prompts = [TokensPrompt(prompt_token_ids=list(map(int, p))) for p in case["prompts"]]
            llm.apply_model(_watch)
            logits = []
            record = {} if case.get("record_rope") else None
            if record is not None:
                llm.apply_model(lambda model: _hook_rope(model, record, len(case["prompts"][0])))
            try:
                results = llm.generate(prompts, params, use_tqdm=False)
            finally:
                if record is not None:
                    llm.apply_model(_unhook_rope)
            if record is not None:
                out["rope_calls"] = {str(i): c for i, c in sorted(record.items())}
            for r in results:
                rows = [_vocab_logits(e, vocab) for e in r.prompt_logprobs[1:]]
                rows.append(_vocab_logits(r.outputs[0].logprobs[0], vocab))
                logits.append(rows)
            out["logits"] = logits
            out["rope_layers_called"] = llm.apply_model(_watched)[0]
        out["run_s"] = time.perf_counter() - t0
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


def run(req: dict) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's callable stays in-process
    t0 = time.perf_counter()
    import torch
    import transformers
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out: dict = {"ok": True, "vllm_version": vllm.__version__, "torch_version": torch.__version__,
                 "transformers_version": transformers.__version__,
                 "import_s": time.perf_counter() - t0, "cases": []}
    for case in req["cases"]:
        try:
            out["cases"].append(_case(LLM, SamplingParams, TokensPrompt, case))
        except Exception as e:  # this model's error; the next case still runs
            import traceback

            traceback.print_exc(file=sys.stderr)
            out["cases"].append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: vllm_runner.py REQUEST.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        req = json.load(f)
    try:
        out = run(req)
    except Exception as e:  # everything goes back as a message: the caller never shows a traceback
        import traceback

        traceback.print_exc(file=sys.stderr)
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    with open(argv[2], "w") as f:
        json.dump(out, f)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    # This file's directory is ropelab/engines, whose vllm.py would shadow the vllm package (the caller also runs
    # python -P, which leaves the script's directory off sys.path).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.exit(main(sys.argv))
