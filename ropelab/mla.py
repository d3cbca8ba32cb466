r"""Multi-head Latent Attention's decoupled RoPE (DeepSeek-V2/V3): why it exists, what it caches.

MLA caches one latent :math:`c^{KV}_n = W^{DKV} h_n` (``kv_lora_rank`` = :math:`d_c` numbers) per token and
layer; each head's key is :math:`k^C_n = W^{UK} c^{KV}_n`. Without RoPE the score of a query
:math:`q^C_m = W^{UQ} c^Q_m` factorises,

.. math:: {q^C_m}^\top k^C_n = {c^Q_m}^\top \underbrace{{W^{UQ}}^\top W^{UK}}_{\text{fixed}} c^{KV}_n,

so :math:`W^{UK}` is *absorbed* into the query side and keys are never materialised. With RoPE on
those dims the score is :math:`{c^Q_m}^\top {W^{UQ}}^\top R_{n-m} W^{UK} c^{KV}_n`: the rotation sits between
the two matrices and depends on the distance, so no fixed matrix exists (:func:`absorption_error`).
DeepSeek-V2 (arXiv:2405.04434, section 2.1.3, "Decoupled Rotary Position Embedding") therefore adds a
small separate part: per-head rotated queries :math:`q^R_m = R_m W^{QR} c^Q_m` and one key
:math:`k^R_n = R_n W^{KR} h_n` shared by all heads and cached next to the latent, and the score is
:math:`{q^C_m}^\top k^C_n + {q^R_m}^\top k^R_n`: the first term absorbs, the second carries position.

Cache per token, in elements: DeepSeek-V2's Table 1 ("Comparison of the KV cache per token among
different attention mechanisms") gives MHA :math:`2 n_h d_h l`, GQA :math:`2 n_g d_h l`, MQA :math:`2 d_h l`
and MLA :math:`(d_c + d^R_h) l \approx \tfrac92 d_h l`, and under it: "For DeepSeek-V2, d_c is set to 4d_h
and d^R_h is set to d_h/2. So, its KV cache is equal to GQA with only 2.25 groups" (its math
transliterated). :func:`cache_bytes_per_token` evaluates these at a config's sizes and :func:`gqa_equivalent_groups`
the group count; DeepSeek-V3 keeps the same attention sizes (transformers'
``models/deepseek_v3/configuration_deepseek_v3.py`` defaults: 61 layers, 128 heads, ``kv_lora_rank`` 512,
``qk_nope_head_dim`` = ``v_head_dim`` = 128, ``qk_rope_head_dim`` 64), so 4.5 d_h = 576 and 2.25 groups
hold for it too.

In transformers' DeepSeek-V3 the rotary part is ``qk_rope_head_dim`` trailing dims of q and the
``k_pe`` slice of ``kv_a_proj_with_mqa``; ``rope_interleave=True`` reads them as interleaved pairs and
writes them back de-interleaved (``apply_rotary_pos_emb_interleave``): :func:`deepseek_rope`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .core import cos_sin, rotate
from .rope import apply_rope
from .scaling import frequencies

__all__ = ["absorption_error", "cache_bytes_per_token", "gqa_equivalent_groups", "deepseek_rope", "mla_scores"]


def _get(config: Mapping[str, Any] | Any, key: str) -> Any:
    value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
    if value is None:
        raise ValueError(f"the config has no {key!r}; cache_bytes_per_token needs it.")
    return value


def cache_bytes_per_token(config: Mapping[str, Any] | Any, *, bytes_per_element: int = 2,
                          gqa_groups: int = 8) -> dict[str, int]:
    r"""KV-cache bytes per token (all layers) for MHA, GQA with ``gqa_groups`` KV heads, MQA and MLA.

    DeepSeek-V2's Table 1 (arXiv:2405.04434), with :math:`d_h` = ``qk_nope_head_dim`` (the per-head
    dimension of :math:`k^C` and :math:`v^C`; the paper's :math:`d_h`) and values of ``v_head_dim``
    (= :math:`d_h` in V2 and V3): MHA :math:`l\,n_h (d_h + d_v)`, GQA :math:`l\,n_g (d_h + d_v)`, MQA
    :math:`l (d_h + d_v)`, MLA :math:`l (d_c + d^R_h)` elements, times ``bytes_per_element`` (2 for bf16).
    A GQA port that kept MLA's 192-dim keys (:math:`d_h + d^R_h`, RoPE included) would cache
    :math:`l\,n_g (d_h + d^R_h + d_v)` instead: 25% more than the table's :math:`2 n_g d_h l` at V3's sizes.

    Args:
        config: a transformers config object or a dict with ``num_hidden_layers``, ``num_attention_heads``,
            ``qk_nope_head_dim``, ``v_head_dim``, ``kv_lora_rank`` and ``qk_rope_head_dim`` (ValueError names
            a missing one).
        bytes_per_element: bytes of one cached element (2 for bf16/fp16).
        gqa_groups: the GQA baseline's number of KV heads, an int >= 1.

    Returns ``{"MHA", "GQA (g groups)", "MQA", "MLA"}`` -> bytes per token over all layers.
    """
    if not isinstance(gqa_groups, int) or gqa_groups < 1:
        raise ValueError(f"gqa_groups is the number of KV heads of the GQA baseline, an int >= 1; got {gqa_groups!r}.")
    layers, heads = int(_get(config, "num_hidden_layers")), int(_get(config, "num_attention_heads"))
    d_h, d_v = int(_get(config, "qk_nope_head_dim")), int(_get(config, "v_head_dim"))
    mla = int(_get(config, "kv_lora_rank")) + int(_get(config, "qk_rope_head_dim"))
    per = {"MHA": heads * (d_h + d_v), f"GQA ({gqa_groups} groups)": gqa_groups * (d_h + d_v),
           "MQA": d_h + d_v, "MLA": mla}
    return {k: layers * v * bytes_per_element for k, v in per.items()}


def gqa_equivalent_groups(config: Mapping[str, Any] | Any) -> float:
    r"""The GQA group count with MLA's cache: :math:`(d_c + d^R_h) / (d_h + d_v)` (2.25 in DeepSeek-V2's
    Table 1, where :math:`d_c = 4 d_h` and :math:`d^R_h = d_h / 2`).

    Args:
        config: a transformers config object or a dict with ``num_hidden_layers``, ``num_attention_heads``,
            ``qk_nope_head_dim``, ``v_head_dim``, ``kv_lora_rank`` and ``qk_rope_head_dim`` (ValueError names
            a missing one).
    """
    mla = int(_get(config, "kv_lora_rank")) + int(_get(config, "qk_rope_head_dim"))
    return mla / (int(_get(config, "qk_nope_head_dim")) + int(_get(config, "v_head_dim")))


def _rot(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_sin(pos, inv_freq, dtype=torch.float64)
    return rotate(x, cos.reshape(*cos.shape[:-1], *([1] * (x.ndim - cos.ndim)), cos.shape[-1]),
                  sin.reshape(*sin.shape[:-1], *([1] * (x.ndim - sin.ndim)), sin.shape[-1]))


def mla_scores(c_q: torch.Tensor, c_kv: torch.Tensor, h: torch.Tensor, w: Mapping[str, torch.Tensor],
               positions: torch.Tensor, *, absorbed: bool, base: float = 10000.0) -> torch.Tensor:
    r"""Scores [heads, s, s] of MLA with decoupled RoPE, explicit (keys materialised) or absorbed.

    ``c_q`` [s, d_cq], ``c_kv`` [s, d_c], ``h`` [s, d_model]; weights ``w``: ``UQ`` [H, d_nope, d_cq],
    ``UK`` [H, d_nope, d_c], ``QR`` [H, d_rope, d_cq], ``KR`` [d_rope, d_model]. Explicit:
    :math:`q^C\cdot k^C + q^R\cdot k^R`. Absorbed: :math:`c^Q (W^{UQ\top} W^{UK}) c^{KV} + q^R\cdot k^R`,
    reading only the cached :math:`c^{KV}` and :math:`k^R` (float64).

    Args:
        c_q: the query latents [s, d_cq].
        c_kv: the cached KV latents [s, d_c].
        h: the hidden states [s, d_model] the shared rotary key is projected from.
        w: the weights ``UQ``, ``UK``, ``QR``, ``KR`` of the shapes above (float64 for a float64 result).
        positions: the tokens' positions [s] (queries and keys alike).
        absorbed: score through the absorbed matrix :math:`W^{UQ\top} W^{UK}` (True) or with the keys
            materialised (False); the two agree up to roundoff.
        base: RoPE's base for the d_rope rotary dims (default style, pairs (i, i + d_rope/2)).
    """
    inv_freq = frequencies(w["QR"].shape[1], base)[0].to(torch.float64)
    q_r = _rot(torch.einsum("hrc,sc->hsr", w["QR"], c_q).transpose(0, 1), positions, inv_freq)  # [s, H, r]
    k_r = _rot(h @ w["KR"].T, positions, inv_freq)  # [s, r]: one key for all heads, cached
    rope = torch.einsum("qhr,kr->hqk", q_r, k_r)
    if absorbed:
        w_abs = torch.einsum("hnq,hnc->hqc", w["UQ"], w["UK"])  # [H, d_cq, d_c], fixed: computed once
        return torch.einsum("qa,hab,kb->hqk", c_q, w_abs, c_kv) + rope
    q_c = torch.einsum("hnc,sc->hsn", w["UQ"], c_q)
    k_c = torch.einsum("hnc,sc->hsn", w["UK"], c_kv)
    return torch.einsum("hqn,hkn->hqk", q_c, k_c) + rope


def absorption_error(seed: int = 0, *, d_latent: int = 32, d_head: int = 16, seq: int = 24,
                     base: float = 10000.0) -> dict[str, float]:
    r"""Relative error of the absorbed score :math:`c_q^\top (W^{UQ\top} W^{UK}) c_{kv}` (float64).

    ``"no_rope"``: the keys are not rotated (absorption exact, roundoff only). ``"rope"``: RoPE rotates
    :math:`q^C` and :math:`k^C` (a fixed absorbed matrix is wrong by O(1)). ``"rope_fixed_distance_on"`` and
    ``"rope_fixed_distance_off"``: the best fixed matrix, :math:`W^{UQ\top} R_{\Delta} W^{UK}` for one
    distance Δ = 3, is exact on that diagonal (``_on``, roundoff only) and wrong elsewhere (``_off``, the largest
    relative error over the other distances). Each error is the largest absolute difference over the [seq, seq]
    scores divided by the largest explicit score.

    Args:
        seed: the seed of the random weights and latents (standard normal; weights scaled by
            :math:`1/\sqrt{d_{latent}}`).
        d_latent: the latent size (of :math:`c_q` and :math:`c_{kv}` alike).
        d_head: the head size the rotation acts on (even).
        seq: the number of positions 0 .. seq - 1 (at least 4, so that distance 3 occurs).
        base: RoPE's base.
    """
    g = torch.Generator().manual_seed(seed)
    w_uq = torch.randn(d_head, d_latent, generator=g, dtype=torch.float64) / d_latent**0.5
    w_uk = torch.randn(d_head, d_latent, generator=g, dtype=torch.float64) / d_latent**0.5
    c_q = torch.randn(seq, d_latent, generator=g, dtype=torch.float64)
    c_kv = torch.randn(seq, d_latent, generator=g, dtype=torch.float64)
    pos = torch.arange(seq)
    inv_freq = frequencies(d_head, base)[0].to(torch.float64)
    explicit_plain = (c_q @ w_uq.T) @ (c_kv @ w_uk.T).T
    explicit_rope = _rot(c_q @ w_uq.T, pos, inv_freq) @ _rot(c_kv @ w_uk.T, pos, inv_freq).T
    absorbed = c_q @ (w_uq.T @ w_uk) @ c_kv.T
    scale = explicit_rope.abs().max()
    # W^UQ^T R_delta W^UK for delta = 3: absorb the rotation of one distance into the matrix.
    r3 = _rot(w_uk.T, torch.full((d_latent,), 3), inv_freq).T  # R_3 W^UK
    absorbed_3 = c_q @ (w_uq.T @ r3) @ c_kv.T
    dist = pos[None, :] - pos[:, None]
    off = dist != 3
    return {
        "no_rope": float((absorbed - explicit_plain).abs().max() / explicit_plain.abs().max()),
        "rope": float((absorbed - explicit_rope).abs().max() / scale),
        "rope_fixed_distance_on": float((absorbed_3 - explicit_rope)[dist == 3].abs().max() / scale),
        "rope_fixed_distance_off": float((absorbed_3 - explicit_rope)[off].abs().max() / scale),
    }


def deepseek_rope(x: torch.Tensor, positions: Any = None, *, layout: str, interleave: bool,
                  base: float = 10000.0, rope_scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """The rotary part of DeepSeek-V3's attention as transformers runs it, on the rotary slice ``x``.

    ``interleave=False``: rotate_half pairs. ``interleave=True`` (``config.rope_interleave``): pairs
    (2i, 2i+1), and the output de-interleaved (all first members, then all second members), as the
    original DeepSeek code's view/transpose did and ``apply_rotary_pos_emb_interleave`` does.

    Args:
        x: the rotary slice (``qk_rope_head_dim`` dims), laid out as ``layout``.
        positions: as in :func:`ropelab.apply_rope` (None: 0, 1, 2, ...).
        layout: x's axes, einops-style (``"b h s d"``).
        interleave: transformers' ``config.rope_interleave``.
        base: RoPE's base (``rope_theta``).
        rope_scaling: the config's scaling dict (DeepSeek-V3 uses YaRN), or None.

    Returns a tensor of x's shape and dtype.
    """
    if not interleave:
        return apply_rope(x, positions, layout=layout, base=base, rope_scaling=rope_scaling)
    out = apply_rope(x, positions, layout=layout, style="interleaved", base=base, rope_scaling=rope_scaling)
    d = layout.split().index("d")
    out = out.movedim(d, -1)
    return torch.cat([out[..., 0::2], out[..., 1::2]], dim=-1).movedim(-1, d)
