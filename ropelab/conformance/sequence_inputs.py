r"""Inputs for the audio, speech and encoder-decoder models whose forward needs more than token ids (the design:
``ropelab.conformance``'s docstring; the vision towers' inputs are built in ``running.model_inputs``).

Everything is read from the forward's signature and the config: a codec decoder's ``latents`` (``hidden_size``
channels), a decoder's ``encoder_hidden_states`` (``cross_hidden_size`` or ``hidden_size`` wide), an
encoder-decoder's ``decoder_input_ids``, an audio encoder's per-clip lengths next to its features (``feature_lens``
in frames, ``chunk_sample_lengths`` in samples: frames x ``hop_length``), multi-channel token ids
(``num_channels``, ``num_codebooks``), a tensor the layers take through the model's ``**kwargs``. Each function
returns candidates, seeded, tried in order by ``running`` (the token ones only after the forward on tokens alone
failed, whose error stands if none runs); the first the model accepts is run, and the positions compared are still
those its rotary module is called with. A layer whose rotated tensors come out all zero is not compared
(``records.compare_layers``)."""

from __future__ import annotations

import inspect

import torch

__all__ = ["N_LATENTS", "N_CONTEXT", "sequence_inputs", "token_candidates", "decoder_layers"]

# Latent frames of a codec decoder (upsampled 2x or 16x by the tiny configs: 10 or 80 tokens, never the head size)
N_LATENTS = 5
# Tokens of the encoder states a decoder cross-attends to (never the 9 tokens, so no axis is mistaken for another)
N_CONTEXT = 7


def _int(config, *keys, default=None):
    for k in keys:
        v = getattr(config, k, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _params(model):
    return inspect.signature(model.forward).parameters


def _required(model) -> set[str]:
    return {n for n, p in _params(model).items() if p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def sequence_inputs(model, config, dtype, rand) -> list[dict] | None:
    """Candidates for a forward that requires a sequence other than tokens, features or pixels (None: not such a
    forward, ``running.model_inputs`` decides): a codec decoder's ``latents`` [1, C, t] or [1, t, C] with C the
    config's ``hidden_size`` (Mimi's, Pocket TTS's); a code-to-mel DiT's codes, mels and time step
    (:func:`_dit_inputs`); a drafter's noise and context states (:func:`_draft_inputs`); a speech encoder-decoder's
    samples and decoder tokens (:func:`_speech_seq2seq`); an audio encoder's ``input_features`` with the lengths it
    requires next to them (Dots3-Note's ``chunk_sample_lengths``) or accepts (Qwen2.5-Omni's ``feature_lens``)."""
    req, params = _required(model), _params(model)
    hidden = _int(config, "hidden_size", "d_model")
    if "latents" in req and hidden is not None:
        return [{"latents": rand(1, hidden, N_LATENTS)}, {"latents": rand(1, N_LATENTS, hidden)}]
    if {"hidden_states", "quantized_code", "time_step"} <= req:
        return _dit_inputs(config, req, rand)
    if {"noise_embeds", "context_hidden_states"} <= req and hidden is not None:
        return _draft_inputs(model, hidden, rand)
    if "decoder_input_ids" in params and "input_ids" not in params and "input_values" in params:
        return _speech_seq2seq(config, params, rand)
    if "input_features" in params and ("feature_lens" in params or "chunk_sample_lengths" in req):
        return _features_with_lengths(config, rand, req, params)
    return None


def _dit_inputs(config, req, rand) -> list[dict]:
    """A code-to-mel diffusion transformer (Qwen2.5-Omni's token2wav DiT): ``N_LATENTS`` codes (ids below the
    config's ``num_embeds``), each ``repeats`` mel frames of ``mel_dim`` bins, the reference mel it conditions on,
    a speaker embedding of ``enc_emb_dim`` per frame, and one diffusion time step."""
    mel, spk, books = _int(config, "mel_dim"), _int(config, "enc_emb_dim"), _int(config, "num_embeds")
    repeats = _int(config, "repeats", default=1)
    if mel is None or spk is None or books is None or not req <= {"hidden_states", "condition_vector",
                                                                   "speaker_embedding", "quantized_code",
                                                                   "time_step"}:
        return []
    frames = N_LATENTS * repeats
    g = torch.Generator().manual_seed(1)
    return [{"hidden_states": rand(1, frames, mel), "condition_vector": rand(1, frames, mel),
             "speaker_embedding": rand(1, frames, spk),
             "quantized_code": torch.randint(0, min(books, 100), (1, N_LATENTS), generator=g),
             "time_step": torch.tensor(0.5, dtype=rand(1).dtype)}]


def _draft_inputs(model, hidden, rand) -> list[dict]:
    """A block-diffusion drafter (Muse Glimmer's assistant): ``N_CONTEXT`` context states of the target model, as
    as wide as one of its linear layers takes them (the target layers' states side by side: the width is tried,
    not read), and 9 noise embeddings."""
    widths = [hidden] + [m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return [{"noise_embeds": rand(1, 9, hidden), "context_hidden_states": rand(1, N_CONTEXT, w)}
            for w in dict.fromkeys(widths)]


def _speech_seq2seq(config, params, rand) -> list[dict]:
    """A speech encoder-decoder on samples (Moonshine): ``N_FRAMES * 192`` samples to its encoder, 9 tokens to its
    decoder at the sweep's positions (``decoder_position_ids`` where it takes them)."""
    from .sizes import N_FRAMES, positions_for

    positions = positions_for(_int(config, "max_position_embeddings"))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(_int(config, "vocab_size", default=128), 100), (1, len(positions)), generator=g)
    dec = {"decoder_input_ids": ids}
    if "decoder_position_ids" in params:
        dec["decoder_position_ids"] = torch.tensor([positions])
    samples = N_FRAMES * 192
    return [{"input_values": rand(1, samples), **dec}, {"input_values": rand(1, 1, samples), **dec}]


def decoder_layers(model, config, n_layers: int, find):
    """The layers ``per_layer`` describes in an encoder-decoder model (``config.is_encoder_decoder``): its decoder's
    ModuleList of ``n_layers`` (``find(module, n)``), whose calls alone are attributed (an encoder layer's call is
    no decoder layer's); None where the model is not one or has no such decoder."""
    if not getattr(config, "is_encoder_decoder", False) or not hasattr(model, "get_decoder"):
        return None
    try:
        decoder = model.get_decoder()
    except Exception:  # noqa: BLE001 - no decoder to name
        return None
    return find(decoder, n_layers) if decoder is not None and decoder is not model else None


def _features_with_lengths(config, rand, req, params) -> list[dict]:
    from .sizes import N_FRAMES

    mel = _int(config, "num_mel_bins", "feature_size", "n_mels", "input_feat_size", default=128)
    out = []
    for frames in (N_FRAMES, 2 * N_FRAMES):
        for shape in ((mel, frames), (frames, mel)):
            kw = {"input_features": rand(*shape)}
            if "feature_lens" in params:
                kw["feature_lens"] = torch.tensor([frames])  # the Qwen-Omni encoders: [mel, frames], no batch axis
            if "chunk_sample_lengths" in req:  # waveform samples: the frames times the config's hop (Dots3-Note)
                kw["chunk_sample_lengths"] = torch.tensor([frames * _int(config, "hop_length", default=160)])
            out += [kw, {k: (v[None] if k == "input_features" else v) for k, v in kw.items()}]
    return out


def token_candidates(model, config, dtype, ids, pos, error: BaseException, rand) -> list[dict]:
    """Candidates after a forward on ``ids`` alone raised ``error``: what the forward also needs, read from its
    signature (``[]``: nothing known, the error stands). A decoder's ``encoder_hidden_states`` (``N_CONTEXT`` tokens
    of the config's hidden size) or ``context_hidden_states``; an encoder-decoder's ``decoder_input_ids`` (the same
    tokens); multi-channel ids [1, s, channels] where the config has ``num_channels`` (Dia's decoder) or
    ``num_codebooks`` (those, or a text stream and those: Kyutai's); BLT's local models' patches
    (:func:`_patch_candidates`); a tensor its layers take through ``**kwargs`` (:func:`_layer_conditioning`). Each
    with the positions where the forward takes them."""
    params, req = _params(model), _required(model)
    hidden = _int(config, "hidden_size", "d_model")
    with_pos = {"position_ids": pos} if "position_ids" in params else {}
    base: list[dict] = []
    # one id per channel: Dia's num_channels, or a text stream and num_codebooks audio ones (Kyutai's)
    books = _int(config, "num_codebooks")
    channels = [c for c in (_int(config, "num_channels"), books, books + 1 if books else None) if c]
    id_forms = [ids] + [ids[..., None].expand(*ids.shape, c).contiguous() for c in dict.fromkeys(channels)]
    for form in id_forms:
        base.append({"input_ids": form, **with_pos})
    if "patch_embeds" in params:
        return _patch_candidates(config, params, ids, with_pos, hidden, rand)
    # the encoder's width: a key naming it (Dia's cross_hidden_size), else the decoder's own
    widths = list(dict.fromkeys(w for w in (_int(config, "cross_hidden_size", "encoder_hidden_size"), hidden)
                                if w is not None))
    out = [kw for kw in base[1:] if not req - set(kw)]  # multi-channel ids alone
    cond = _layer_conditioning(model, config, params)
    if cond and hidden is not None:
        out += [{**kw, **{k: rand(1, 1, hidden) for k in cond}} for kw in base]
    for kw in base:
        for width in widths:
            extra: dict = {}
            for key in ("encoder_hidden_states", "context_hidden_states"):
                if key in params:
                    extra[key] = rand(1, N_CONTEXT, width)
            if "decoder_input_ids" in params:
                extra["decoder_input_ids"] = kw["input_ids"]
            if extra:
                out.append({**kw, **extra})
    return [kw for kw in out if not req - set(kw)]


# What a decoder layer's forward takes besides its input and what every model passes it (masks, positions, cache)
_LAYER_STANDARD = {"self", "hidden_states", "attention_mask", "position_ids", "position_embeddings", "cache",
                   "past_key_values", "past_key_value", "use_cache", "cache_position", "output_attentions", "kwargs",
                   "encoder_hidden_states", "encoder_attention_mask"}


def _layer_conditioning(model, config, params) -> list[str]:
    """The tensors a decoder layer's forward takes that its model's forward neither names nor builds on tokens
    alone, passed to the layers through the model's ``**kwargs``: Voxtral Realtime's ``t_cond``, the time
    conditioning its audio model computes (given here as one [1, 1, hidden_size] row, broadcast over the tokens)."""
    n = _int(config, "num_hidden_layers")
    layers = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    if not n or layers is None or not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return []
    sig = inspect.signature(layers[0].forward).parameters
    return [k for k, p in sig.items() if k not in _LAYER_STANDARD and k not in params and p.default is None
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and "Tensor" in str(p.annotation)]


def _patch_candidates(config, params, ids, with_pos, hidden, rand) -> list[dict]:
    """BLT's local models, fed by its patcher: the local encoder takes bytes with each one's patch
    (``patch_ids``, ``num_patches``: three patches of three bytes); the local decoder the bytes' embeddings and the
    global model's patch states (``patch_embeds``, ``hidden_size_global`` wide)."""
    s = ids.shape[-1]
    n_patches = 3
    patch_ids = (torch.arange(s) * n_patches // s)[None]
    if "patch_ids" in params:
        return [{"input_ids": ids, "num_patches": n_patches, "patch_ids": patch_ids, **with_pos}]
    width = _int(config, "hidden_size_global", default=hidden)
    if hidden is None or width is None:
        return []
    return [{"inputs_embeds": rand(1, s, hidden), "patch_embeds": rand(1, n_patches, width), **with_pos}]
