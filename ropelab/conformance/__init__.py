r"""Conformance with transformers: ``RopeSpec.per_layer`` against transformers' own modeling code, every RoPE
model type of the installed transformers.

- ``sweep``: the sweep (``python -m ropelab.conformance``, ``make conformance``); it writes
  ``data/conformance/transformers-<version>.json`` and, from its measurements, ``hf_table``. It runs the modules
  of each job and re-exports their names: ``discovery`` (the model types, their tiny configs and variants),
  ``running`` (one recorded forward of transformers' code), ``compare`` (``apply_rope`` against a recorded call,
  the bound), ``convention`` (the conventions measured on transformers' rotation, the table writer), ``probe``
  (``diagnose`` on the real rotary), ``records`` (one model type's record) and ``report`` (counts, reasons, the
  paragraph of ``docs/guides/conformance.md``);
- ``hf_table``: the generated convention table ``RopeSpec.per_layer`` reads (pairing, rotary slice, NoPE layer
  types, key aliases, keys the code ignores, v4 rules per model type). This ``__init__`` imports nothing, so
  ``spec`` reads ``hf_table`` without loading transformers; only ``sweep`` imports it;
- ``config_rules`` (``python -m ropelab.conformance.config_rules``) and its generated ``hf_config_rules``: how each
  config class reads a ``config.json`` without ``rope_parameters`` (the keys of its base and rotary share, its
  defaults, derived layer patterns, composite text configs), measured by instantiating the classes;
- ``corpus`` (``python -m ropelab.conformance.corpus``): the published configs of ``data/configs`` against
  transformers' config class and, at a tiny width, its model per layer.

For each model type:

1. **Found by reading the library.** Every model type of ``CONFIG_MAPPING_NAMES`` whose modeling source
   defines a ``*Rotary*`` class or a module-level function whose name holds ``rotary`` / ``rope``, or whose
   configuration source mentions ``rope_parameters`` / ``rope_theta``. No list of model types is typed here.
2. **A tiny model from its own config class**: a few layers, two heads of the default head size, small
   vocabulary and MLPs; every RoPE field as the class sets it. Variants: the same config with a ``linear``
   and a ``yarn`` scaling in the v5 schema (``rope_parameters``), and the ``linear`` one written the v4 way
   (``rope_theta`` and ``rope_scaling`` at the top, as an old ``config.json`` holds them).
3. **transformers' own code per layer.** The module-level rotation functions of the modeling module
   (``apply_rotary_pos_emb`` and kin) are wrapped to record their inputs and outputs, the whole tiny model
   runs one float64 forward on 9 tokens at positions up to 4095, and each call is attributed to the decoder
   layer that made it. A layer that ran but made no call applies no RoPE (NoPE, or no attention at all). The
   positions compared are those the model's ``*Rotary*`` module was called with (CSM's depth decoder ignores
   the ``position_ids`` it is given).
   A model whose forward takes no tokens gets tiny seeded float64 inputs built from its signature and config
   (``running.model_inputs``): a vision tower taking patches and ``grid_thw`` two frames of 4 x 4 patches;
   a pixel-only ViT an image of 4 x 4 patches, or its ``image_size``; an audio encoder 100 frames of features
   (either axis order) or samples; a second stage what its first stage makes (DeepSeek-OCR 2's encoder: 9
   embeddings, the first 4 patches, ``num_patches``; a CLIP stage: ``patch_embeds``); a tower whose grid counts
   merged tokens (Inkling2) one merged block per token; the first candidate the model accepts is run. A composite
   vision config without a decoder (``vision``) is run whole on pixels, its reason measured from that run (no RoPE
   applied, or the sub-configs whose sub-models made every call). Its positions are read from
   its rotary module's call too: ``position_ids`` of one axis, or one row per axis (each patch's (row, column)),
   each token's matched to the rotation call by its cos row (Qwen2.5-VL reorders tokens into windows after the
   rotary module). Layers are ``num_hidden_layers``, or a vision tower's ``depth``.
   Audio, speech and encoder-decoder models get what their signature asks for (``sequence_inputs``): a codec
   decoder's ``latents``, a decoder's ``encoder_hidden_states`` (its config's encoder width), an encoder-decoder's
   ``decoder_input_ids``, one id per channel or codebook, BLT's byte patches, features with their lengths. In an
   encoder-decoder the layers attributed are its decoder's (those ``per_layer`` describes): a call from its encoder
   is no layer's, and leaves the row not covered. A tower that prepends tokens
   its rotary module never numbered (MLCD's class token, rotated by a learned angle ``class_pos_emb``) is compared
   on the numbered patches only, the row saying how many tokens were left out (``prefix_not_compared``). A 1D call
   on other tokens than the sequence (Qwen4-Exp's QSA indexer rotates each block's pooled key by its first token's
   cos row) has each token's position read from its cos row, matched to the rotary module's table.
4. **ropelab on the same input**: ``apply_rope(q, positions, spec=RopeSpec.per_layer(config_dict)[layer])``
   in float64, on every recorded query/key, compared element by element. A multi-axis rotation (a vision
   tower's 2D RoPE) is compared as ``apply_rope(q, positions [A, s], spec=spec, sections=sections)`` with
   ``(spec, sections) = ropelab.multiaxis.per_layer_axes(config_dict)[layer]``, the bound with each pair's angle
   :math:`p_{a(i)}\omega_i`.
5. **diagnose on the same rotary**: ``ropelab.diagnose`` probes, as a black box ``x -> rotated x`` in the
   recorded layout, transformers' rotation function fed by its rotary module's cos/sin at positions
   0 .. s-1 (first layer of each distinct spec); the row records whether its reading (style, base,
   rotary_dim, scaling type, and the scaling's parameters by their effect on the outputs: ``probe``) matches the
   spec.

Why the comparison is not circular. The convention table is measured: transformers' rotation function, called with
basis vectors at the recorded cos/sin, gives each position's matrix; the coupled dims give the pairing (``half``
(i, i + r/2) or ``interleaved`` (2i, 2i + 1)), the rotary slice :math:`r/d`, the direction and an output
permutation. But the comparison of step 4 never uses this run's measurement: ``per_layer`` reads the *committed*
``hf_table`` (generated by a previous run and reviewed as a diff), and the output permutation undone before
comparing comes from it too. A multi-axis rotation is measured the same way at each token's recorded (row, column):
each pair's angle, fitted by one axis at a time, must follow one axis's position within float32 rounding; the axis
of each pair and its frequencies give the table's ``axes`` (sections, and whether each axis has its own ladder:
axial), which ``per_layer_axes`` reads. This run's measurement is recorded per row and checked against the
committed entry (``table``: ``matches`` / ``differs`` / ``absent``); where it differs, the sweep rewrites the
table, says so and exits 2, and those rows must be rerun (``python -m ropelab.conformance TYPE ...``) to be
compared against the new table. ``tests/test_conformance.py`` reruns one model type per convention class and
requires both: agreement with transformers, and a fresh measurement equal to the committed table.

A new transformers release: rerun ``make conformance``. A model type it has never seen is ``absent`` from the
table, so ``per_layer`` raises for it ("not in ropelab's convention table") and its row is not covered; the
sweep writes its measured entry, and the rerun of that model type compares it.

Tolerance. transformers forms ``inv_freq`` and the angles :math:`m\omega_i` in float32 and rounds cos/sin to
float32 (then casts them to the model's float64). ``inv_freq = b ** (2i/r)`` in float32 has relative error up
to :math:`(\ln b + 8)u` (:math:`u = 2^{-24}`; the exponent's rounding is amplified by :math:`\ln b`, the
scalings add a few roundings), the angle one more, cos/sin one each. So a rotated pair of norm
:math:`\rho` may move by :math:`a\rho\,(|m\omega_i|(\ln b + 9) + 4)u` (a the attention factor), and a dim that
passes through not at all (float64 copies: :math:`16 u_{64}|x|`). The bound is formed per element from
ropelab's own spec; a layer agrees when every element is within it. A wrong pairing, base, scaling or
rotary slice moves elements by a fraction of their size, many orders above the bound.

Composite configs (``composite``). A config class with sub-configs (a vision-language model's ``text_config``
and towers) is run whole: each sub-config shrunk as step 2 shrinks a plain config (the text one by the same
sizes, every RoPE key kept; a tower also to two layers, where its class accepts it), the variants applied to the
text sub-config, and the whole model (AutoModel, else its ``*Model`` class) runs on token ids only, its text path.
The rotation functions of its modeling module and of every module its text sub-model's classes come from are
recorded, each call attributed to the layers of the sub-model built on ``text_config`` (a call elsewhere, from an
encoder or a tower, leaves the row not covered). An M-RoPE model (Qwen2-VL) numbers text tokens with every axis
equal: the positions compared are those its rotary module saw. ``per_layer`` reads the composite's whole dict, as
it reads a composite ``config.json`` (its ``text_config``, with the text model type's committed conventions). A
composite whose decoder is the top config (Chameleon, DBRX) runs as a plain model type with its sub-configs
shrunk; one with neither (a speech or vision model whose RoPE lives in an encoder) is run on token ids to record
what it needs instead.

Stated limits. Where the attention hands the rotation function only the rotary slice of the head (GPT-J, CodeGen:
``q[..., :rotary_dim]`` before the call), only the slice width is compared, not where the slice sits or that the
rest passes through unchanged. Rotations inlined in the attention (no module-level ``apply_*`` function), models
that need inputs the sweep does not build (or refuse the tiny ones it builds), and models whose positions are
computed inside the rotary module (never passed to it, so not read) are not covered, each row saying why; so are
rotations called with their tensors as keyword arguments only, unless made inside another recorded rotation call
(Gemma 4's vision tower: ``apply_multidimensional_rope(x, cos, sin, position_ids)`` calls
``apply_rotary_pos_emb(x=...)`` per axis; the outer call is compared), and rotations inlined in a method of the
attention (the conformer encoders' ``_apply_rotary_embedding``, whose rotary module takes no positions either). An
M-RoPE text model whose rope dict holds ``mrope_section`` (``per_layer`` refuses it) is compared through
``ropelab.engines.hf.read_config`` where its rotary module saw every axis equal (text tokens): the ladder, base and
pairing, not the sections. A layer calling two rotation functions that pair differently (DeepSeek-V3.2's
sparse-attention indexer and main attention: the table's ``rotations``) is compared per function, against
``per_layer(config, style=)`` of that function's measured pairing and its own measured output order
(``rotation_permutations``). ``proportional`` RoPE (the half pairing over the whole head, its tail pairs at
frequency 0) is measured as ``half`` with ``zero_frequency_pairs``.
A vision tower's rotation is compared on two frames of a 4 x 4 grid of patches (positions up to 4 on each axis): its
ladder and pairing are checked there, not at large positions; the ``diagnose`` probe is not run on multi-axis
rotations. Multi-axis rotations ropelab's ``MultiAxis`` cannot hold (Pixtral's: the column axis takes the odd
frequencies of one ladder, so its ladder is not its own; Kimi-K2.5's: axial ladders whose pairs alternate between
the axes, the column's first) are refused with the measured layout named. A composite's towers are built and never
run on its text path (they are compared as their own model types where the sweep builds their inputs).
"""

__all__: list[str] = []  # the names live in the submodules: ``sweep`` (heavy) and ``hf_table`` (data)
