r"""The conventions of transformers' rotation, measured from its own code (pairing, rotary slice, direction,
output order, NoPE layer types, aliases, v4 rules), and the generated table ``hf_table`` that holds them."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import torch

from ..core import pair_indices
from ..spec import HF_KEYS
from .running import layout_of, rotated_pairs

__all__ = ["TABLE_PATH", "measure_convention", "measure_axes", "measure_calls", "config_conventions",
           "ignored_slice_keys", "table_entry", "conventions_of", "write_conventions"]

TABLE_PATH = pathlib.Path(__file__).with_name("hf_table.py")


def _matrices(call, positions) -> torch.Tensor:
    """[s, d_out, d_in]: transformers' rotation at each recorded position, column a its output for e_a."""
    x, _ = rotated_pairs(call)[0]
    k = (call.get("prefix") or {}).get("tokens", 0)  # leading tokens not numbered by the rotary (running)
    layout = layout_of(tuple(x.shape), len(positions) + k).split()
    d = x.shape[-1]
    tensor_args = [i for i, a in enumerate(call["args"]) if isinstance(a, torch.Tensor)]
    n_rot = len(rotated_pairs(call))
    cols = []
    for a in range(d):
        args = list(call["args"])
        for i in tensor_args[:n_rot]:
            e = torch.zeros_like(args[i])
            e[..., a] = 1.0
            args[i] = e
        out = call["fn"](*args, **call["kwargs"])
        out = out[0] if isinstance(out, (tuple, list)) else out
        idx = [0 if ax != "s" else slice(None) for ax in layout[:-1]] + [slice(None)]
        cols.append(out[tuple(idx)].double()[k:])  # [s, d]
    return torch.stack(cols, dim=-1)


def measure_convention(call, positions) -> dict:
    """Pairing, rotary slice, direction and output order of transformers' rotation function, from its matrices
    at the recorded tables (position 0 must be among the positions)."""
    M = _matrices(call, positions)
    d = M.shape[-1]
    out: dict[str, Any] = {"call_dim": d}
    P = M[positions.index(0)]
    perm = P.abs().argmax(dim=0)  # output dim of each input dim at angle 0
    if sorted(perm.tolist()) == list(range(d)) and perm.tolist() != list(range(d)):
        out["output_permutation"] = perm.tolist()  # the same for q and k: q.k unchanged
        M = M[:, perm, :]  # (R x)[a] = y[perm[a]]
    eye = torch.eye(d, dtype=M.dtype)
    moving = [a for a in range(d) if float((M[..., a] - eye[a]).abs().max()) > 1e-9]
    r = len(moving)
    out["rotating_dims"] = r
    if r == 0:
        return {**out, "style": None}
    last = int(torch.tensor(positions).argmax())
    partner = {}
    for a in moving:
        col = M[last, :, a].abs().clone()
        col[a] = 0
        partner[a] = int(col.argmax())
    if moving != list(range(r)) and _half_over_the_head(moving, partner, d):
        # ``proportional`` (Gemma 4's, LFM3's full-attention layers): rope_utils' inv_freq spans the whole head with
        # zeros past the rotated share, so the pairs (i, i + d/2) turn for the leading i and stand still after: the
        # half pairing of the whole head (the share is the rope dict's, which per_layer reads).
        out["zero_frequency_pairs"] = d // 2 - r // 2
        r = out["rotating_dims"] = d
    if moving != list(range(r)) and "zero_frequency_pairs" not in out:
        return {**out, "style": f"other: rotating dims {moving[:4]}... of {d}"}
    if all(partner[a] == (a + r // 2) % r for a in moving):
        style = "half"
    elif all(partner[a] == a ^ 1 for a in moving):
        style = "interleaved"
    else:
        return {**out, "style": "other: pairs " + str([(a, partner[a]) for a in moving[:4]])}
    # y_b = x_a sin(m w) + x_b cos(m w) for a counter-clockwise RoPE (Su et al.): M[b, a] > 0 at small m w.
    a, b = (0, r // 2) if style == "half" else (0, 1)
    m1 = positions.index(1)
    out["direction"] = 1 if float(M[m1, b, a]) > 0 else -1
    # The base, for configs that carry none (the modeling code fixes it): the ladder w_i = b^(-2i/r) read at
    # position 1, log w_i fitted linearly in i; kept to 5 significant digits (float32 tables resolve ~1e-6).
    pa, pb = pair_indices(r, style)
    w = torch.atan2(M[m1, pb, pa] - M[m1, pa, pb], M[m1, pa, pa] + M[m1, pb, pb]).abs()
    i = torch.arange(r // 2, dtype=torch.float64)
    if bool((w > 0).all()) and r >= 4:
        slope = float(((i - i.mean()) * (w.log() - w.log().mean())).sum() / ((i - i.mean()) ** 2).sum())
        base = math.exp(-slope * r / 2)
        out["measured_base"] = float(f"{base:.5g}")
    return {**out, "style": style}



def _half_blocks(partner: dict[int, int], r: int) -> list[int] | None:
    """The pair counts of contiguous blocks that each pair half within themselves (dim o + j with o + h + j, block
    [o, o + 2h)) and cover the r rotating dims, or None (Gemma 4's vision tower: one block per position axis)."""
    blocks, o = [], 0
    while o < r:
        h = partner.get(o, o) - o
        if h <= 0 or o + 2 * h > r or any(partner.get(o + j) != o + h + j or partner.get(o + h + j) != o + j
                                          for j in range(h)):
            return None
        blocks.append(h)
        o += 2 * h
    return blocks if len(blocks) > 1 else None


def _half_over_the_head(moving: list[int], partner: dict[int, int], d: int) -> bool:
    """Whether the dims that move are the leading k of each half of the head, each paired with the one d/2 after
    it: the half pairing over the whole head, its last d/2 - k pairs at frequency 0 (``proportional``)."""
    k = len(moving) // 2
    return (0 < k < d // 2 and moving == [*range(k), *range(d // 2, d // 2 + k)]
            and all(partner[a] == (a + d // 2) % d for a in moving))


def measure_axes(call) -> dict:
    r"""Pairing, rotary slice, direction and the position axes of a multi-axis rotation (a vision tower's), from its
    matrices at the recorded tables and each token's positions ``call["positions"]`` [A, s] (its rotary module's):
    each pair's angle, fitted over the tokens as :math:`\sum_k p_k W_{k,i}`, must move with one axis only; the
    axis of each pair and its frequencies give a :class:`~ropelab.multiaxis.MultiAxis` (contiguous, interleaved
    or axial, as ``ropelab.diagnosis.axes`` tells them apart) and its base."""
    from ..diagnosis.axes import ladder_check
    from ..multiaxis import MultiAxis

    pos = call["positions"].to(torch.float64)  # [A, s]
    s = pos.shape[1]
    M = _matrices(call, list(range(s)))
    d = M.shape[-1]
    out: dict[str, Any] = {"call_dim": d}
    zero = [n for n in range(s) if float(pos[:, n].abs().max()) == 0]
    # The output order is read at angle 0; a grid numbered from 1 (MuseSpark's) has no such token, and its
    # permutation, if any, shows as pairs no pairing explains.
    perm = M[zero[0]].abs().argmax(dim=0) if zero else torch.arange(d)
    if sorted(perm.tolist()) == list(range(d)) and perm.tolist() != list(range(d)):
        out["output_permutation"] = perm.tolist()
        M = M[:, perm, :]
    eye = torch.eye(d, dtype=M.dtype)
    moving = [a for a in range(d) if float((M[..., a] - eye[a]).abs().max()) > 1e-9]
    r = len(moving)
    out["rotating_dims"] = r
    if r == 0:
        return {**out, "style": None}
    if moving != list(range(r)):
        return {**out, "style": f"other: rotating dims {moving[:4]}... of {d}"}
    last = int(pos.sum(0).argmax())  # the token furthest along every axis: every pair turns there
    partner = {}
    for a in moving:
        col = M[last, :, a].abs().clone()
        col[a] = 0
        partner[a] = int(col.argmax())
    blocks = None
    if all(partner[a] == (a + r // 2) % r for a in moving):
        style = "half"
    elif all(partner[a] == a ^ 1 for a in moving):
        style = "interleaved"
    elif (blocks := _half_blocks(partner, r)) is not None:
        style = "half"  # within each block (Gemma 4's vision tower); the blocks are the axes' sections, below
    else:
        return {**out, "style": "other: pairs " + str([(a, partner[a]) for a in moving[:4]])}
    if blocks is not None:
        blocked = MultiAxis(tuple(blocks), axial=True, blockwise=True)
        pa, pb = blocked.pair_dims(r, "half")
    else:
        pa, pb = pair_indices(r, style)
    theta = torch.atan2(M[:, pb, pa] - M[:, pa, pb], M[:, pa, pa] + M[:, pb, pb])  # [s, r/2]
    # Each pair fitted by one axis at a time, theta = p_k w: the axis that fits within the float32 tables' rounding
    # (cos/sin rounded once, the angle in float32: far below 2^-21 (1 + |theta|)) drives it; a pair that another
    # axis fits too (an axis all of whose positions are 0) or that none fits is no single-axis pair.
    # Axis k's frequency of each pair is read at the token with k's least positive position (1 on these grids,
    # so |angle| < pi there), the fit checked modulo 2 pi on every token (MuseSpark's grid is numbered from 1:
    # its fastest pairs turn past pi).
    W = torch.zeros(pos.shape[0], theta.shape[1], dtype=torch.float64)
    for k in range(pos.shape[0]):
        pk = torch.where(pos[k] > 0, pos[k], torch.inf)
        if bool(torch.isfinite(pk).any()):
            n1 = int(pk.argmin())
            W[k] = theta[n1] / pos[k, n1]
    diff = pos.T[:, None, :] * W.T[None, :, :] - theta[:, :, None]  # [s, r/2, A]
    resid = (torch.remainder(diff + math.pi, 2 * math.pi) - math.pi).abs().amax(0)  # [r/2, A]
    tol = 2.0**-21 * (1 + theta.abs().amax(0))  # [r/2]
    fits = resid <= tol[:, None]
    if not bool((fits.sum(1) == 1).all()):
        bad = int((fits.sum(1) != 1).nonzero()[0])
        return {**out, "style": f"other: pair {bad}'s angles are not one axis's position times a frequency "
                f"(residuals {resid[bad].tolist()})"}
    axis = fits.float().argmax(1)
    w = W.T.gather(1, axis[:, None])[:, 0]
    out["direction"] = 1 if bool((w > 0).all()) else -1 if bool((w < 0).all()) else 0
    counts = tuple(int((axis == k).sum()) for k in range(pos.shape[0]))
    # The order of the axes' runs along the head (Step3p5's vision tower: the column's first)
    runs = tuple(dict.fromkeys(axis.tolist()))
    order = runs if len(runs) == pos.shape[0] and runs != tuple(range(pos.shape[0])) else None
    kinds = (({"axial": True, "blockwise": True},) if blocks is not None
             else ({"axial": True}, {}, {"interleaved": True}))
    for kw in kinds:
        kw = {**kw, "order": order} if order is not None and "interleaved" not in kw else kw
        try:
            cand = MultiAxis(counts, **kw)
        except ValueError:
            continue
        if cand.axis_of_pair().tolist() != axis.tolist():
            continue
        base, _why = ladder_check(cand, w.abs())
        if base is not None:
            out["axes"] = {"sections": list(counts), "axial": cand.axial, "interleaved": cand.interleaved,
                           **({"blockwise": True} if cand.blockwise else {}),
                           **({"order": list(cand.order)} if cand.order is not None else {})}
            out["measured_base"] = float(f"{base:.5g}")
            break
    else:
        return {**out, "style": f"other: pair axes {axis.tolist()[:8]}... fit no contiguous, interleaved or axial "
                "sections with one ladder"}
    return {**out, "style": style}


def table_entry(conv: dict | None) -> dict | None:
    """The convention-table entry of a measured convention (None where nothing was measured)."""
    if not conv or "style" not in conv:
        return None
    return {k: v for k, v in conv.items() if k != "call_dim"}


def config_conventions(config_cls, kw: dict) -> dict:
    """What the config class itself does with the keys ropelab reads: its aliases (``attribute_map``), and how a
    v4 ``rope_theta`` / ``rope_scaling`` reaches each layer type of a nested ``rope_parameters``, or whether the
    class drops them (Cohere2-MoE declares ``rope_scaling`` as a field of its own and never converts it)."""
    out: dict[str, Any] = {}
    aliases = {k: v for k, v in (getattr(config_cls, "attribute_map", None) or {}).items() if k in HF_KEYS}
    if aliases:
        out["aliases"] = dict(sorted(aliases.items()))
    theta = 12345.0  # a base no config defaults to: the layer types that carry it took the top-level rope_theta
    try:
        cfg = config_cls(**{**kw, "rope_theta": theta, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    except Exception:  # noqa: BLE001 - a class without the v4 keys has no v4 rule
        return out
    params = getattr(cfg, "rope_parameters", None) or {}
    nested = {t: p for t, p in params.items() if isinstance(p, dict)}
    if nested and set(nested) <= set(getattr(cfg, "layer_types", None) or []) | set(nested):
        out["v4"] = {"scaled_layer_types": sorted(t for t, p in nested.items() if p.get("rope_type") == "linear"),
                     "default_theta": {t: p.get("rope_theta") for t, p in sorted(nested.items())
                                       if p.get("rope_theta") != theta}}
    elif params and not nested:
        # A key is dropped when the class's rope dict holds something else in its place (a dict without
        # rope_theta at all says nothing: the modeling code may still read the attribute).
        ignored = [k for k, read in (("rope_theta", params.get("rope_theta", theta) == theta),
                                     ("rope_scaling", params.get("rope_type") == "linear")) if not read]
        if ignored:
            out["v4"] = {"ignored_keys": ignored}
    return out



def measure_calls(calls, positions) -> dict:
    """The convention of each rotation function the layers called (first call of each, in call order): the
    first one's, plus ``rotations`` {function: style} where functions of one layer pair differently (the
    DeepSeek-V3.2 indexer: half; its main attention: interleaved), and ``rotation_permutations`` {function: its
    output order} for those that permute their output."""
    by_fn: dict[str, dict] = {}
    for c in calls:
        name = c["fn"].__name__
        if name not in by_fn:
            by_fn[name] = measure_axes(c) if c.get("positions") is not None else measure_convention(c, positions)
    first = dict(next(iter(by_fn.values())))
    kinds = {(m.get("style"), m.get("rotating_dims"), tuple(m.get("output_permutation") or ())) for m in by_fn.values()}
    if len(kinds) > 1:
        first["rotations"] = {n: m.get("style") for n, m in by_fn.items()}
        perms = {n: m["output_permutation"] for n, m in by_fn.items() if m.get("output_permutation")}
        if perms:  # each function's own output order (the entry's is the first function's)
            first["rotation_permutations"] = perms
    return first


_SLICE_KEYS = ("rotary_dim", "rotary_pct", "partial_rotary_factor")


def ignored_slice_keys(d: dict, conv: dict, head_dim: int, sliced: bool) -> list[str]:
    """Top-level rotary-slice keys of the config dict that transformers' code does not read: the slice it rotates
    (measured) is not the one the key says (MiniMax-M3 declares ``rotary_dim`` and rotates by its rope dict)."""
    params = d.get("rope_parameters") or {}
    if not isinstance(params, dict) or "partial_rotary_factor" in params or "rotating_dims" not in conv:
        return []
    r = conv["rotating_dims"] if not sliced else conv["call_dim"]
    out = []
    for key in _SLICE_KEYS:
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        says = int(v) if key == "rotary_dim" else int(head_dim * float(v))
        if says != r:
            out.append(key)
    return out



def conventions_of(rows: dict) -> dict[str, dict]:
    """{model_type: its convention-table entry} measured on transformers' own rotation (default variant)."""
    return {mt: table_entry(row.get("convention")) for mt, row in sorted(rows.items())
            if table_entry(row.get("convention")) is not None}


def write_conventions(conventions: dict, version: str, path: pathlib.Path = TABLE_PATH) -> None:
    """Write ``ropelab/conformance/hf_table.py``, the table ``RopeSpec.per_layer`` reads."""
    lines = ["# ruff: noqa: E501",
             f'"""The conventions of every model type, measured on transformers {version}\'s own rotation',
             "functions by ``python -m ropelab.conformance`` (generated: do not edit; rerun ``make conformance``).",
             "",
             "``style``: ``half`` pairs (i, i + r/2), ``interleaved`` (2i, 2i + 1). ``rotary_fraction``: r / head_dim",
             "in the default config of that model type (``RopeSpec.per_layer`` uses it only when the config names",
             'no fraction). The other keys are described in ``ropelab.conformance``."""',
             "", '__all__ = ["TRANSFORMERS_VERSION", "CONVENTIONS"]', "",
             f"TRANSFORMERS_VERSION = {version!r}", "", "CONVENTIONS: dict[str, dict] = {"]
    for mt, c in sorted(conventions.items()):
        lines.append(f"    {mt!r}: {c!r},")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
