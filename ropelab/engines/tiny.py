r"""Tiny Hugging Face models built and saved in code, one per RoPE family, for the engine parity tests.

:func:`save_tiny_model` writes a model directory that llama.cpp's converter (``convert_hf_to_gguf.py``) accepts
(tests/test_engines_gguf.py converts every family): a small decoder (2 layers; Gemma 3 6, SmolLM3 4, for their
layer patterns) with seeded random weights (``config.json`` + ``model.safetensors``; matrices N(0, 1/fan_in), so that
attention depends on position and a wrong RoPE shows in the logits: tests/test_engines_llamacpp.py) and a
tiny sentencepiece tokenizer (``tokenizer.model``) trained in code on :data:`TEXT`, so nothing is downloaded.
The converter only accepts tokenizers it recognises; a sentencepiece model goes through its
``_set_vocab_sentencepiece`` path for every family here (a BPE ``tokenizer.json`` would need a pre-tokenizer
hash the converter knows).

:data:`FAMILIES` maps a family name to the transformers config it builds. They span what a GGUF file must
carry: NORM and NEOX rope types, partial rotary, NoPE layers (SmolLM3), yarn, llama3 (the converter writes a
``rope_freqs`` tensor), linear scaling on the global layers only with a second base on the sliding-window
layers (Gemma 3), and M-RoPE in both layouts (Qwen2-VL contiguous, Qwen3-VL interleaved); and the families the
engines run for their own sake (tests/test_engines_llamacpp.py, tests/test_engines_mlx_run.py): Mistral, Gemma 2
(final logit soft cap), OLMo 2, StableLM and GLM-4 (partial rotary), gpt-oss (yarn ``truncate: false``), Llama 4
(text; NoPE every 4th layer).

Every family's RoPE is what its config says; :meth:`ropelab.spec.RopeSpec.per_layer` reads it. Overrides go
into the config (``save_tiny_model("llama", path, rope_parameters={...})``).
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "BPE_VOCAB", "TEXT", "VOCAB_SIZE", "save_tiny_model", "tiny_config", "tokenizer_model",
           "config_dict", "head_dim_overrides", "save_random_model", "vision_config"]

# The text the tokenizer is trained on: short, and with every lowercase letter so that any ASCII word encodes.
TEXT = (
    "the quick brown fox jumps over the lazy dog.",
    "rotary position embeddings turn each pair of query and key dims by an angle that grows with position.",
    "a model declares its rotary settings again at every boundary it crosses.",
    "every engine has its own words for the same base, the same pairs and the same scaling.",
    "pack my box with five dozen liquor jugs, then zip a very quick wax job.",
    "one two three four five six seven eight nine ten.",
)
# The tokenizer's vocabulary: small, and it is the models' vocab_size.
VOCAB_SIZE = 96

_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, vocab_size=VOCAB_SIZE,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)

# family -> (transformers config class name, config kwargs). head_dim = 16 unless said; max_position_embeddings
# 256 is the trained context L0 of the length-dependent scalings.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # NORM in llama.cpp: the converter permutes q/k (Hugging Face's Llama pairs (i, i + d/2)).
    "llama": ("LlamaConfig", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    # llama3's frequency ladder: the converter writes it as the rope_freqs tensor, not as metadata. head_dim 64
    # puts 3 of the 32 pairs in the transition band, enough to recover the llama3 parameters from the tensor.
    "llama3": ("LlamaConfig", {"head_dim": 64, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    # NEOX, no permutation.
    "qwen2": ("Qwen2Config", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    # yarn on a NEOX architecture (Qwen2.5's long-context setting).
    "qwen2_yarn": ("Qwen2Config", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 64}}),
    # partial rotary (Phi-4-mini's 0.75): 12 of 16 head dims rotate.
    "phi3": ("Phi3Config", {"num_key_value_heads": 4, "partial_rotary_factor": 0.75,
                            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.75}}),
    # longrope (Phi-3's short / long factor sets) on a partial rotary head: the converter writes the factors as
    # rope_factors_short / _long tensors and the attention factor as rope.scaling.attn_factor.
    "phi3_longrope": ("Phi3Config", {"num_key_value_heads": 4, "original_max_position_embeddings": 64,
                                      "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0], "long_factor": [1.0, 1.5, 2.0, 4.0, 6.0, 8.0],
        "original_max_position_embeddings": 64}}),
    # sliding-window layers with their own base, linear scaling on the global layers only (Gemma 3 4B's), in
    # Gemma 3's 5:1 layer pattern: llama.cpp assumes that pattern (load_swa_pattern(ml, 6)), the converter does
    # not write it, so a model with another layer_types is misread (see tests/test_engines_gguf.py).
    # query_pre_attn_scalar = head_dim as in Gemma 3 1B-12B (256 = 256): llama.cpp scales q by 1/sqrt(head_dim)
    # whatever the config says (llama_model_gemma3::load_arch_hparams, f_attention_scale), and transformers' default
    # 256 on this 16-wide head would differ in the attention scale, not in RoPE.
    "gemma3": ("Gemma3TextConfig", {
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 32, "num_hidden_layers": 6,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}}),
    # NoPE layers: SmolLM3 skips RoPE on every 4th layer (no_rope_layers); llama.cpp hard-codes the same step
    # (llama_model_smollm3: n_no_rope_layer_step = 4) and the converter writes nothing for it.
    "smollm3": ("SmolLM3Config", {"num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0], "rope_parameters": {
        "rope_type": "default", "rope_theta": 2000000.0}}),
    # M-RoPE, contiguous sections (t, h, w) over the 8 pairs.
    "qwen2_vl": ("Qwen2VLConfig", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                                       "mrope_section": [2, 3, 3]}}),
    # M-RoPE, interleaved (llama.cpp's IMROPE).
    "qwen3_vl": ("Qwen3VLConfig", {"head_dim": 16, "rope_parameters": {
        "rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}}),
    # Command R7B: 3 sliding-window layers with RoPE, then a full-attention layer without it (transformers'
    # Cohere2 and llama.cpp's cohere2 graph, which rotates only `if (is_swa)`, src/models/cohere2.cpp:89);
    # interleaved pairs; the output tied to the embeddings (llama.cpp's cohere2 always uses them). The converter
    # reads the key rotary_pct (conversion/command_r.py:47), which transformers 5 no longer writes (a KeyError
    # without it), and a BPE vocabulary (tokenizer.json, BPE_VOCAB below).
    "cohere2": ("Cohere2Config", {"num_hidden_layers": 4, "sliding_window": 32, "tie_word_embeddings": True,
                                  "rotary_pct": 1.0, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
    # Multi-head latent attention (DeepSeek-V3): RoPE on an 8-wide slice of each 24-wide q/k head (qk_rope_head_dim)
    # beside 16 unrotated dims (qk_nope_head_dim), k's rotated slice shared by the heads; the converter writes
    # attention.key_length_mla = 24 and rope.dimension_count = 8. One dense layer, then a MoE layer. The converter
    # asserts num_key_value_heads == num_attention_heads (it splits kv_b_proj per head), as in DeepSeek-V3's own
    # config, and reads a BPE vocabulary. scoring_func "sigmoid" as DeepSeek-V3's own config.json has it:
    # transformers 5 does not save the key, the converter then writes no expert_gating_func (conversion/base.py:
    # 1530-1536) and llama.cpp's deepseek2 routes the experts by softmax (src/models/deepseek2.cpp:22-31), where
    # transformers uses sigmoid: measured, logits differ by 0.77 from position 0 (not RoPE: with no MoE layer the
    # two agree to 1e-6).
    "deepseek_v3": ("DeepseekV3Config", {"scoring_func": "sigmoid",
        "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "head_dim": 8, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
        "topk_group": 1, "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_shared_experts": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    # Mistral (v0.3's base 1e6, no sliding window): llama.cpp converts it as llama (NORM, q/k permuted).
    "mistral": ("MistralConfig", {"head_dim": 16, "sliding_window": None,
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    # Gemma 2: sliding and full layers alternating, both at base 10000 (its converter writes no rope.freq_base:
    # conversion/gemma.py:84-103 sets no rope key, and llama.cpp's default is 10000); attention and final logit
    # soft caps as Gemma 2's own config (50, 30); query_pre_attn_scalar = head_dim as gemma3's above. The output
    # tied to the embeddings as in Gemma 2: the converter drops lm_head.weight (conversion/gemma.py:110-113) and
    # mlx-lm's gemma2 has no lm_head (it refuses the tensor).
    "gemma2": ("Gemma2Config", {"head_dim": 16, "tie_word_embeddings": True, "query_pre_attn_scalar": 16,
                                "sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"],
                                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    # OLMo 2: q/k RMSNorm over the whole projection before RoPE, base 500000; a BPE vocabulary.
    "olmo2": ("Olmo2Config", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    # StableLM: partial rotary, 4 of 16 head dims (partial_rotary_factor 0.25), NEOX; LayerNorm; a BPE vocabulary.
    "stablelm": ("StableLmConfig", {"partial_rotary_factor": 0.25, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}),
    # GLM-4: half the head dims rotate (partial_rotary_factor 0.5), in interleaved pairs (transformers' Glm4), which
    # the converter reorders to NEOX (conversion/glm.py:54-85, normal_to_neox); a BPE vocabulary.
    "glm4": ("Glm4Config", {"head_dim": 16, "partial_rotary_factor": 0.5, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    # gpt-oss: yarn with truncate: false as gpt-oss's own config (transformers keeps the ramp's correction range
    # unrounded; ggml floors / ceils it always), attention sinks, sliding and full layers alternating, a small MoE
    # (4 experts, 2 per token); a BPE vocabulary.
    "gpt_oss": ("GptOssConfig", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32,
                                 "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 64}}),
    # Llama 4 (text): llama3 frequencies in interleaved pairs, every 4th layer without RoPE (no_rope_layers; llama.cpp
    # hard-codes the step 4, as for SmolLM3), q/k L2 norm on the RoPE layers, MoE on every 2nd layer; Scout's
    # attention chunk 8192 (past the 24-token run); a BPE vocabulary.
    "llama4": ("Llama4TextConfig", {"head_dim": 16, "num_hidden_layers": 4, "num_local_experts": 2,
                                    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "intermediate_size": 64,
                                    "intermediate_size_mlp": 128, "no_rope_layers": [1, 1, 1, 0],
                                    "attention_chunk_size": 8192, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}),
}

# Families whose converter class reads a BPE vocabulary (tokenizer.json) rather than tokenizer.model: the saved
# model gets the same tokenizer as a tokenizer.json too, and ropelab.engines.converter.convert_many needs
# unknown_bpe_pre for them (the converter knows only real models' BPE pre-tokenizers).
BPE_VOCAB = ("cohere2", "deepseek_v3", "olmo2", "stablelm", "glm4", "gpt_oss", "llama4")

# The multimodal families nest the text model's keys under text_config; their vision tower is tiny too.
_VISION = {
    "Qwen2VLConfig": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
    "Qwen3VLConfig": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
                      "num_position_embeddings": 16, "deepstack_visual_indexes": []},
}


def tiny_config(family: str, **overrides: Any):
    """The transformers config of ``family`` (a key of :data:`FAMILIES`), with ``overrides`` set on it (on
    ``text_config`` for the multimodal families)."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}.")
    cls_name, kwargs = FAMILIES[family]
    text = {**_SMALL, **copy.deepcopy(kwargs), **overrides}
    cls = getattr(transformers, cls_name)
    if cls_name in _VISION:
        return cls(text_config=text, vision_config=dict(_VISION[cls_name]), tie_word_embeddings=False)
    return cls(**text)


def tokenizer_model(text: tuple[str, ...] = TEXT, vocab_size: int = VOCAB_SIZE) -> bytes:
    """A sentencepiece BPE model (the bytes of ``tokenizer.model``) trained on ``text``: unk 0, bos 1, eos 2.

    Training is single-threaded on a fixed text, so the same bytes come back every call."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=out, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, byte_fallback=False, num_threads=1, hard_vocab_limit=False,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )
    return out.getvalue()


def save_tiny_model(family: str, path: str | Path, *, seed: int = 0, head_dim: int | None = None,
                    **overrides: Any) -> Path:
    """Build ``family``'s tiny model with seeded random weights and save it to the directory ``path``
    (``config.json``, ``model.safetensors``, ``tokenizer.model``, ``tokenizer_config.json``); returns ``path``.

    ``head_dim`` widens the heads (:func:`head_dim_overrides`: vLLM's CPU attention takes 32, 64, ... but not 16);
    ``overrides`` are config keys (e.g. ``rope_parameters=``, ``num_hidden_layers=``) and win over it."""
    if head_dim is not None:
        overrides = {**head_dim_overrides(family, head_dim), **overrides}
    config = tiny_config(family, **overrides)
    return save_random_model(config, path, seed=seed, bpe_vocab=family in BPE_VOCAB)


def save_random_model(config, path: str | Path, *, seed: int = 0, bpe_vocab: bool = False) -> Path:
    """Build the transformers model of ``config`` (a ``PretrainedConfig``; a vision-language one when it has a
    ``vision_config``) with seeded random weights (:func:`_scale_weights`) in float32 and save it to ``path`` with
    the tiny tokenizer (``tokenizer.model``; with ``bpe_vocab`` also as ``tokenizer.json``, for the converter classes
    that read a BPE vocabulary); returns ``path``. :func:`save_tiny_model` and ``ropelab-check --run`` build with it."""
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model_cls = (transformers.AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None
                 else transformers.AutoModelForCausalLM)
    model = model_cls.from_config(config, dtype=torch.float32)
    _scale_weights(model, seed)
    model.save_pretrained(path)
    (path / "tokenizer.model").write_bytes(tokenizer_model())
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "add_eos_token": False}, indent=2))
    if bpe_vocab:  # the same tokenizer as transformers' fast one: tokenizer.json with its BPE merges
        transformers.AutoTokenizer.from_pretrained(path).save_pretrained(path)
    names = _SPECIAL_NAMES.get(getattr(config, "model_type", None))
    if names:
        _rename_special_tokens(path, names)
    return path


def vision_config(model_type: str, vision: Mapping[str, Any], text_hidden: int) -> dict:
    """A one-block vision tower for a vision-language ``model_type`` whose text model is ``text_hidden`` wide: the
    tiny families' (:data:`_VISION`) for Qwen2-VL / Qwen3-VL, else ``vision`` with its depth, widths and heads cut
    (a text-only run never calls it; transformers and the converter need one)."""
    kind = str(model_type)
    if kind.startswith(("qwen2", "qwen3")):
        out = {**{k: v for k, v in vision.items() if k == "model_type"},
               **_VISION["Qwen3VLConfig" if kind.startswith("qwen3") else "Qwen2VLConfig"]}
        out["hidden_size" if kind.startswith("qwen2") else "out_hidden_size"] = text_hidden
        return out
    out = dict(vision)
    for key, value in (("depth", 1), ("num_hidden_layers", 1), ("hidden_size", 32), ("embed_dim", 32),
                       ("intermediate_size", 64), ("num_heads", 2), ("num_attention_heads", 2),
                       ("out_hidden_size", text_hidden), ("deepstack_visual_indexes", [])):
        if key in out:
            out[key] = value
    return out


# Families whose converter looks up special tokens by their real model's names (GLM-4's: conversion/glm.py:41-44
# reads "<|endoftext|>" and "<|user|>" from the added vocabulary, a KeyError without them): the tiny tokenizer's
# own special tokens renamed so, ids unchanged.
_SPECIAL_NAMES = {"glm4": {"</s>": "<|endoftext|>", "<unk>": "<|user|>"}}


def _rename_special_tokens(path: Path, names: Mapping[str, str]) -> None:
    """Rename special tokens in a saved fast tokenizer (``tokenizer.json``, ``tokenizer_config.json``, the special
    tokens map), keeping their ids."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        f = path / name
        if f.is_file():
            text = f.read_text()
            for old, new in names.items():
                text = text.replace(json.dumps(old), json.dumps(new))
            f.write_text(text)


def _scale_weights(model, seed: int) -> None:
    """Redraw the weights so that attention depends on position strongly enough for a wrong RoPE to show in the
    logits (transformers' default std 0.02 leaves attention nearly uniform): every matrix N(0, 1/fan_in)
    (embeddings N(0, 1)), every vector its default plus N(0, 0.1^2) (norm weights stay near their neutral 1, or 0
    for the (1 + w) norms; biases near 0). Seeded: the same weights every call."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                std = 1.0 if "embed" in name else p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def config_dict(path: str | Path) -> Mapping[str, Any]:
    """The saved ``config.json`` of a model directory, as a dict."""
    return json.loads((Path(path) / "config.json").read_text())


def head_dim_overrides(family: str, head_dim: int) -> dict[str, Any]:
    """The config overrides that give ``family``'s tiny model heads of ``head_dim`` dims, RoPE otherwise unchanged:
    ``head_dim``, ``hidden_size = num_attention_heads * head_dim`` (so a model that derives its head dim from the
    hidden size gets the same one), and LongRoPE factor lists resampled (linearly, end points kept) to the new
    number of rotary pairs, which they must match."""
    import numpy as np

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}.")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}.")
    kwargs = {**_SMALL, **FAMILIES[family][1]}
    out: dict[str, Any] = {"head_dim": head_dim, "hidden_size": kwargs["num_attention_heads"] * head_dim}
    params = kwargs.get("rope_parameters")
    if isinstance(params, Mapping) and "long_factor" in params:
        pairs = int(head_dim * params.get("partial_rotary_factor", 1.0)) // 2
        resized = dict(params)
        for key in ("short_factor", "long_factor"):
            old = np.asarray(params[key], dtype=np.float64)
            resized[key] = np.interp(np.linspace(0, len(old) - 1, pairs), np.arange(len(old)), old).tolist()
        out["rope_parameters"] = resized
    return out
