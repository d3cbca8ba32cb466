r"""Structure of a black-box RoPE: each token's matrix, the rotating pairs, the axis the angle runs along,
and each token's integer position."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import AXIS_NAMES, STYLES, Layout, pair_indices, varlen_positions
from ..precision import wrap_angle
from .ladder import Ladder
from .probes import ANGLE_TOL, COUPLE_TOL, STRUCT_TOL, NotATensor, call
from .report import Diagnosis

__all__ = ["Structure", "measure_structure"]

# Tolerance when angles are only 16-bit accurate (cos/sin tables in bf16 err by up to ~2**-8 rad, times the
# few positions of the probe): neighbouring integer positions still differ by >= 0.28 rad on the fastest pair.
LOOSE_ANGLE_TOL = 2.0**-4


@dataclass
class Structure:
    M: torch.Tensor  # [*token_shape, d_out, d_in], float64
    tok_axes: tuple[str, ...]
    theta: torch.Tensor  # [*token_shape, P]: angle of each pair (a < b)
    scale: torch.Tensor  # [*token_shape, P]
    pairs: list[tuple[int, int]]
    pair_order: list[int]  # index into pairs, in style order
    positions: torch.Tensor | None  # [*token_shape] measured integer positions (-1 where none fits)
    omega: torch.Tensor | None  # [P], in the order of ``pairs``
    probe_dtype: torch.dtype
    ladder: Ladder | None = None


def _token_axes(lay: Layout) -> tuple[str, ...]:
    return tuple(a for a in lay.axes if a != "d")


def _probe_matrix(fn, lay, sz, cu, dg) -> tuple[torch.Tensor, torch.dtype] | None:
    """[*token_shape, d, d] float64 matrix of every token, from d calls with e_j at every token."""
    shape = [sz[a] for a in lay.axes]
    d_idx = lay.index("d")
    d = sz["d"]
    last_err = None
    for pdt in (torch.float64, torch.float32):
        cols = []
        try:
            for j in range(d):
                x = torch.zeros(shape, dtype=pdt)
                x.select(d_idx, j).fill_(1.0)
                y = call(fn, x, lay, cu)
                if y.dtype != pdt and pdt == torch.float64:
                    raise TypeError(f"returns {y.dtype} for a float64 input")
                if pdt == torch.float32 and y.dtype in (torch.bfloat16, torch.float16):
                    dg.problem(
                        "dtype",
                        f"fn returns {y.dtype} for a float32 input: it computes in 16 bits whatever it is given, so "
                        "its rotation cannot be measured (nor trusted) to better than 16-bit rounding. Compute in the "
                        "input's dtype (or float32) and cast only the output.",
                    )
                    return None
                if tuple(y.shape) != tuple(shape):
                    if y.numel() != x.numel():
                        dg.output_shape = tuple(y.shape)
                        dg.problem(
                            "shape",
                            f"the output has shape {list(y.shape)} for an input of shape {shape} (layout '{lay}'): "
                            "the cos/sin tables broadcast against the wrong axes. Give them size-1 dims on every "
                            "axis but the sequence and head dim (ropelab.apply_rope(x, layout=...) does).",
                        )
                        return None
                    dg.output_shape = tuple(y.shape)
                    y = y.reshape(shape)
                cols.append(y.to(torch.float64).movedim(d_idx, -1))
        except NotATensor:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the black box is reported, not raised
            last_err = e
            continue
        if pdt == torch.float32:
            dg.notes.append(
                f"fn does not run in float64 ({type(last_err).__name__}: {str(last_err)[:120]}); "
                "the structure was measured in float32."
            )
        return torch.stack(cols, -1), pdt
    dg.problem(
        "error",
        f"fn raised {type(last_err).__name__}: {str(last_err)[:300]} on a float32 input of shape {shape} "
        f"(layout '{lay}'). If it needs particular sizes, pass sizes={{...}} (e.g. sizes={{'h': 20, 'd': 64}}).",
    )
    return None


def _components(C: torch.Tensor) -> list[list[int]]:
    d = C.shape[0]
    parent = list(range(d))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in (C > COUPLE_TOL).nonzero().tolist():
        if i != j:
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(d):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


def _classify_pairs(pairs: list[tuple[int, int]], d: int) -> tuple[str, int | None, list[int], int]:
    """(style, rotary_dim, order, start) if the pairs are a style's on the slice [start, start + rotary_dim)
    of the head (leading dims as in Llama, trailing ones as in DeepSeek's MLA), or a prefix of the full-dim
    style (proportional); else ("other", None, identity order, 0)."""
    S = {p: k for k, p in enumerate(pairs)}
    start = min(min(p) for p in pairs)
    r = 2 * len(pairs)
    if start + r <= d:
        for style in STYLES:
            a, b = pair_indices(r, style)
            P = list(zip((a + start).tolist(), (b + start).tolist()))
            if set(P) == set(S):
                return style, r, [S[p] for p in P], start
    for style in STYLES:  # proportional: the first pairs of the full-dim style rotate, the rest are zero
        a, b = pair_indices(d, style)
        P = list(zip(a.tolist(), b.tolist()))
        k = len(S)
        if set(P[:k]) == set(S):
            return style, d, [S[p] for p in P[:k]], 0
    return "other", None, list(range(len(pairs))), 0


def _output_permutation(M: torch.Tensor, dg: Diagnosis) -> torch.Tensor:
    """Undo a permutation of the output dims: at the first token (position 0) a RoPE is the identity
    (times its norm scale); a permutation matrix there means fn reorders its output, as DeepSeek's
    ``rope_interleave`` does (interleaved pairs in, rotate_half layout out). ``dg.output_permutation[k]``
    is the input dim that output dim k holds; the returned M is in input order."""
    M0 = M.reshape(-1, *M.shape[-2:])[0]
    big = M0.abs() > 0.5
    if not bool((big.sum(0) == 1).all() and (big.sum(1) == 1).all()):
        return M
    if bool((M0.abs() * ~big).amax() > STRUCT_TOL) or bool((M0[big] <= 0).any()):
        return M
    perm = big.to(torch.int8).argmax(1)
    if torch.equal(perm, torch.arange(M0.shape[0])):
        return M
    dg.output_permutation = perm.tolist()
    moved = [k for k in range(len(perm)) if int(perm[k]) != k]
    dg.notes.append(
        f"fn permutes its output dims: output dim k holds input dim perm[k] for k = {moved[0]}..{moved[-1]} "
        f"(perm = {[int(perm[k]) for k in moved][:12]}{' ...' if len(moved) > 12 else ''}). Scores q.k are "
        "unchanged when q and k both pass through fn (DeepSeek's rope_interleave does this: interleaved pairs "
        "in, rotate_half layout out), but outputs compared dim by dim with another implementation differ. "
        "The rotation below is read in input order."
    )
    return M[..., torch.argsort(perm), :]


def measure_structure(fn, lay: Layout, sz, cu, dg: Diagnosis) -> Structure | None:
    got = _probe_matrix(fn, lay, sz, cu, dg)
    if got is None:
        return None
    M, pdt = got
    dg.probe_dtype = pdt
    d = sz["d"]
    tok_axes = _token_axes(lay)
    if dg.output_shape is not None:
        dg.problem(
            "shape",
            f"the output has shape {list(dg.output_shape)} for an input of shape {[sz[a] for a in lay.axes]} "
            f"(layout '{lay}'): the cos/sin tables (e.g. cached as [1, 1, seq, dim]) broadcast against the "
            "input and add or move an axis. Shape the tables for this layout (ropelab.apply_rope(x, layout=...)).",
        )
    # Linearity and locality: a random input must give what the per-token matrices predict.
    g = torch.Generator().manual_seed(0)
    x = torch.randn([sz[a] for a in lay.axes], generator=g, dtype=pdt)
    pred = torch.einsum("...ij,...j->...i", M, x.to(torch.float64).movedim(lay.index("d"), -1))
    try:
        y = call(fn, x, lay, cu).reshape(x.shape).to(torch.float64).movedim(lay.index("d"), -1)
        resid = float((y - pred).abs().max() / (pred.abs().max() + 1e-300))
        if resid > STRUCT_TOL * 4:
            dg.problem(
                "not_linear",
                f"the output at a token depends on other tokens or is not linear in x (relative residual "
                f"{resid:.1e} against the per-token maps): RoPE rotates each token's vector on its own. Check "
                "for a reshape/transpose that mixes tokens.",
            )
    except NotATensor:
        raise
    except Exception:  # noqa: BLE001 - the probe with e_j worked; a failure here is not informative
        pass
    M = _output_permutation(M, dg)
    Mf = M.reshape(-1, d, d)
    C = Mf.abs().amax(0)
    comps = _components(C)
    big = [c for c in comps if len(c) > 2]
    if big:
        dg.style = "other"
        dg.problem(
            "mixing",
            f"dims {big[0]} mix together: RoPE rotates disjoint pairs of dims, each by its own angle. "
            "Check the rotate_half / rotate_every_two helper and the cos/sin layout.",
        )
        return None
    pairs = [(c[0], c[1]) for c in comps if len(c) == 2]
    singles = [c[0] for c in comps if len(c) == 1]
    eye_ok = all(float((Mf[:, j, j] - Mf[0, j, j]).abs().max()) <= STRUCT_TOL for j in singles)
    if not eye_ok:
        bad = [j for j in singles if float((Mf[:, j, j] - Mf[0, j, j]).abs().max()) > STRUCT_TOL]
        dg.problem(
            "not_rotation",
            f"dims {bad[:6]} are scaled by a position-dependent factor but pair with no other dim (a cos term "
            "without its sin term): each dim must rotate with a partner.",
        )
        return None
    if not pairs:
        dg.problem(
            "no_rotation",
            "fn leaves every dim unrotated (no two dims mix at any token): it applies no RoPE along any axis.",
        )
        return None
    a = torch.tensor([p[0] for p in pairs])
    b = torch.tensor([p[1] for p in pairs])
    Maa, Mab, Mba, Mbb = M[..., a, a], M[..., a, b], M[..., b, a], M[..., b, b]
    is_rot = ((Maa - Mbb).abs().amax() <= STRUCT_TOL) and ((Mab + Mba).abs().amax() <= STRUCT_TOL)
    style, r, order, start = _classify_pairs(pairs, d)
    dg.pairs = [pairs[k] for k in order] if style != "other" else pairs
    dg.style = style
    dg.rotary_dim = r
    dg.rotary_start = start
    if not bool(is_rot):
        _explain_not_rotation(M, pairs, a, b, tok_axes, lay, dg)
        return None
    theta = torch.atan2(Mba - Mab, Maa + Mbb)
    scale = torch.hypot(Maa + Mbb, Mba - Mab) / 2
    st = Structure(M, tok_axes, theta, scale, pairs, order, None, None, pdt)
    _positions(st, lay, sz, cu, dg)
    if style == "other":  # after _positions, which orients each pair (a, b) so that b is a turned forward
        dg.problem(
            "style",
            "the rotating pairs (a, b) are "
            + ", ".join(f"({p}, {q})" for p, q in dg.pairs[:8])
            + (", ..." if len(dg.pairs) > 8 else "")
            + ": neither half (i, i+r/2) nor interleaved (2i, 2i+1). Permute the head dims (weights too) "
            "into one of the two styles.",
        )
    return st


def _explain_not_rotation(M, pairs, a, b, tok_axes, lay, dg) -> None:
    """A pair whose two dims turn by different angles: usually tables laid out for the other style."""
    # Row angles at the token one step along the declared sequence axis.
    idx = [0] * len(tok_axes)
    idx[tok_axes.index(lay.seq)] = 1
    Mt = M[tuple(idx)]
    phi_a = torch.atan2(-Mt[a, b], Mt[a, a])
    phi_b = torch.atan2(Mt[b, a], Mt[b, b])
    d = M.shape[-1]
    phi = torch.zeros(d, dtype=torch.float64)
    phi[a], phi[b] = phi_a, phi_b
    worst = int((phi_a - phi_b).abs().argmax())
    p, q = pairs[worst]
    msg = (
        f"pair ({p}, {q}) is not a rotation: at position 1 dim {p} turns by {float(phi_a[worst]):.4g} rad but dim "
        f"{q} by {float(phi_b[worst]):.4g} rad (a rotation turns both by one angle)."
    )
    r = dg.rotary_dim or d
    omega = phi[:r].clone()
    uniq = sorted({round(v, 9) for v in omega.tolist()}, reverse=True)
    w = torch.tensor(uniq, dtype=torch.float64)
    if w.numel() == r // 2 and dg.style in STYLES:
        as_half = torch.cat([w, w])
        as_inter = w.repeat_interleave(2)
        if dg.style == "half" and torch.allclose(omega, as_inter, atol=ANGLE_TOL):
            dg.problem(
                "tables",
                msg + " The cos/sin tables are laid out for interleaved pairs (repeat_interleave) while the "
                "rotation pairs halves (rotate_half): build them with torch.cat((freqs, freqs), -1), or rotate "
                "with rotate_every_two.",
            )
            return
        if dg.style == "interleaved" and torch.allclose(omega, as_half, atol=ANGLE_TOL):
            dg.problem(
                "tables",
                msg + " The cos/sin tables are laid out for half pairs (torch.cat((freqs, freqs), -1)) while "
                "the rotation pairs neighbours (rotate_every_two): build them with "
                "freqs.repeat_interleave(2, -1), or rotate with rotate_half.",
            )
            return
    dg.problem("not_rotation", msg + " Use one cos and one sin per pair for both of its dims.")


def _index_grid(tok_shape, tok_axes) -> dict[str, torch.Tensor]:
    grids = torch.meshgrid(*[torch.arange(n) for n in tok_shape], indexing="ij")
    return dict(zip(tok_axes, grids))


def _positions(st: Structure, lay: Layout, sz, cu, dg: Diagnosis) -> None:
    """Which axis the angle runs along, the unit step omega, and each token's integer position."""
    theta, tok_axes = st.theta, st.tok_axes
    varies = []
    for k, ax in enumerate(tok_axes):
        if theta.shape[k] < 2:
            continue
        diff = wrap_angle(theta - theta.select(k, 0).unsqueeze(k)).abs().amax()
        if float(diff) > ANGLE_TOL:
            varies.append(ax)
    dg.varies_along = tuple(varies)
    grid = _index_grid(theta.shape[:-1], tok_axes)
    if "h" in tok_axes:
        k = tok_axes.index("h")
        dg.heads_alike = bool((st.M - st.M.select(k, 0).unsqueeze(k)).abs().amax() <= STRUCT_TOL)
    if "b" in tok_axes:
        k = tok_axes.index("b")
        dg.batch_alike = bool((st.M - st.M.select(k, 0).unsqueeze(k)).abs().amax() <= STRUCT_TOL)
    if not varies:
        dg.problem(
            "no_rotation",
            "the rotation angle is the same at every token (no axis carries positions): fn applies one fixed "
            f"rotation instead of RoPE. Pass positions 0, 1, 2, ... along '{lay.seq}'.",
        )
        return
    # Heads or batch elements turning at different rates (not just shifted positions) is its own finding.
    if lay.seq in varies:
        ks = tok_axes.index(lay.seq)
        for ax, code, what in (("h", "heads", "head"), ("b", "batch", "batch element")):
            if ax not in tok_axes or ax == lay.seq or sz[ax] < 2:
                continue
            ka = tok_axes.index(ax)

            def at(i_ax, i_seq, ka=ka):
                return theta[tuple(i_ax if j == ka else (i_seq if j == ks else 0) for j in range(len(tok_axes)))]

            steps = torch.stack([wrap_angle(at(i, 1) - at(i, 0)) for i in range(sz[ax])])
            starts = torch.stack([wrap_angle(at(i, 0) - at(0, 0)) for i in range(sz[ax])])
            dev = (steps - steps[0]).abs()
            if float(starts.abs().max()) <= ANGLE_TOL and float(dev.max()) > ANGLE_TOL:
                i, p = divmod(int(dev.argmax()), dev.shape[1])
                a, b = st.pairs[p]
                dg.problem(
                    code,
                    f"{what}s turn at different rates: from position 0 to 1, dims ({a}, {b}) turn by "
                    f"{float(steps[0, p]):.4g} rad in {what} 0 but by {float(steps[i, p]):.4g} rad in {what} {i}. "
                    f"RoPE uses one inv_freq for every {what}: give the cos/sin tables size 1 on axis '{ax}'.",
                )
                return
    # The unit step: index 0 -> 1 along the declared axis if it varies there, else along another axis;
    # the first choice under which every token's angles are an integer multiple of it wins.
    fit = None
    free = dg.style == "other"  # no canonical order (a, b) within a pair: orient each by its own step
    for step_axis in [lay.seq] * (lay.seq in varies) + [a for a in varies if a != lay.seq]:
        fit = _integer_positions(theta, tok_axes, step_axis, free)
        if fit == "fit":  # angles noisier than float32 (16-bit tables): match positions loosely, judge later
            fit = _integer_positions(theta, tok_axes, step_axis, free, tol=LOOSE_ANGLE_TOL)
        if isinstance(fit, tuple):
            break
    if not isinstance(fit, tuple):
        dg.problem(
            "direction" if fit == "direction" else "positions",
            {
                "direction": "some pairs turn forward and others backward with position: the sin term has the wrong "
                "sign on part of the head dim.",
                "step": "the angle does not change between index 0 and 1 of the sequence axis but does further on: "
                "positions are not 0, 1, 2, ...",
                "fit": "at some tokens the angles are not an integer multiple of the step between positions 0 and 1 "
                "(different heads or batch elements get different frequencies?): RoPE turns every token by "
                "m * inv_freq with one inv_freq.",
            }[fit or "fit"],
        )
        return
    pos, omega, sign = fit
    dg.direction = 1 if free else int(sign[0])
    theta = theta * sign
    if free:  # report each pair as (a, b) with b = a rotated forward
        st.pairs = [(a, b) if sg > 0 else (b, a) for (a, b), sg in zip(st.pairs, sign.tolist())]
        dg.pairs = list(st.pairs)
    flat = theta.reshape(-1, theta.shape[-1])
    # Refine omega by least squares over every token (angles unwrapped around m * omega).
    m = pos.reshape(-1).to(torch.float64)
    unw = m[:, None] * omega[None, :] + wrap_angle(flat - m[:, None] * omega[None, :])
    denom = float((m * m).sum())
    if denom > 0:
        omega = (m[:, None] * unw).sum(0) / denom
    st.positions, st.omega = pos, omega
    _judge_positions(st, lay, sz, cu, grid, dg)
    dg.norm_scale = float(st.scale.median())


def _integer_positions(theta: torch.Tensor, tok_axes, step_axis: str, free: bool = False, tol: float = 4 * ANGLE_TOL):
    """(positions, omega, sign) taking index 0 -> 1 along ``step_axis`` as one position step, or the reason
    it does not fit ("step", "direction", "fit"). ``sign`` [P] is the direction of each pair: all +1 or all
    -1, unless ``free`` (pairs without a canonical orientation), where each pair gets its own."""
    k = tok_axes.index(step_axis)
    t0 = theta[(0,) * len(tok_axes)]
    t1 = theta[tuple(1 if i == k else 0 for i in range(len(tok_axes)))]
    omega = wrap_angle(t1 - t0)
    if float(omega.abs().max()) <= ANGLE_TOL:
        return "step"
    # Direction: RoPE turns pair (a, b) by +m*omega (y_b = x_a sin + x_b cos).
    sgn = torch.sign(omega[omega.abs() > ANGLE_TOL])
    if free:
        direction = torch.where(omega < 0, -1.0, 1.0).to(torch.float64)
    elif bool((sgn > 0).all()):
        direction = torch.ones_like(omega)
    elif bool((sgn < 0).all()):
        direction = -torch.ones_like(omega)
    else:
        return "direction"
    omega = omega * direction
    flat = theta.reshape(-1, theta.shape[-1]) * direction
    # Each token's position: the integer m in [-K, K] with theta = m * omega (mod 2 pi) for every pair.
    K = max(flat.shape[0], 16)
    cand = torch.arange(-K, K + 1, dtype=torch.float64)
    pos = torch.empty(flat.shape[0], dtype=torch.long)
    chunk = max(1, 2_000_000 // (cand.numel() * flat.shape[1]))
    for s in range(0, flat.shape[0], chunk):
        res = wrap_angle(flat[s : s + chunk, None, :] - cand[None, :, None] * omega[None, None, :]).abs().amax(-1)
        best, arg = res.min(-1)
        if bool((best > tol).any()):
            return "fit"
        pos[s : s + chunk] = cand[arg].long()
    return pos.reshape(theta.shape[:-1]), omega, direction


def _judge_positions(st: Structure, lay: Layout, sz, cu, grid, dg: Diagnosis) -> None:
    pos = st.positions
    seq = lay.seq
    if seq == "t":
        expected = varlen_positions(cu.long())[grid["t"]]
    else:
        expected = grid[seq]
    # Which single axis the positions run along (index 0, 1, 2, ... of that axis).
    along = [a for a in st.tok_axes if torch.equal(pos, grid[a])]
    if seq == "t" and torch.equal(pos, expected):
        along = ["t"]
    dg.seq_axis = along[0] if along else None
    zero = expected == 0
    dg.identity_at_zero = bool((st.theta[zero].abs() <= ANGLE_TOL).all())
    if torch.equal(pos, expected):
        dg.positions_ok = True
        if seq == "t":
            dg.restarts_at_cu_seqlens = True
        return
    dg.positions_ok = False
    n = {a: sz[a] for a in st.tok_axes}
    if dg.seq_axis is not None and dg.seq_axis != seq:
        ax = dg.seq_axis
        dg.problem(
            "seq_axis",
            f"fn rotates along axis {ax} (size {n[ax]}), not {seq}: it treats the {AXIS_NAMES[ax]} as positions "
            f"(position = index along {ax}). It assumes another layout; transpose x to the layout it expects "
            f"(or tell it the sequence dim of '{lay}'), e.g. ropelab.apply_rope(x, layout='{lay}').",
        )
        return
    if seq == "t":
        if torch.equal(pos, grid["t"]):
            dg.restarts_at_cu_seqlens = False
            dg.seq_axis = "t"
            dg.problem(
                "varlen",
                f"positions do not restart at the cu_seqlens boundaries {cu.tolist()}: packed token t gets "
                "position t, so every sequence after the first is rotated as if it continued the previous one. "
                "Use positions = ropelab.varlen_positions(cu_seqlens) (position - start of its sequence).",
            )
            return
    offset = pos - expected
    if bool((offset == offset.reshape(-1)[0]).all()):
        c = int(offset.reshape(-1)[0])
        dg.seq_axis = seq
        dg.problem(
            "positions",
            f"positions start at {c}, not 0 (position 0 is not the identity): every position is shifted by {c}. "
            "Drop the offset (ESM-style padding_idx + 1 position ids belong to learned embeddings, not RoPE).",
        )
        return
    if "b" in st.tok_axes:
        k = st.tok_axes.index("b")
        per_b = offset.amin(dim=tuple(i for i in range(offset.ndim) if i != k))
        if bool((offset == per_b.reshape([-1 if i == k else 1 for i in range(offset.ndim)])).all()):
            dg.seq_axis = seq
            dg.problem(
                "batch",
                f"batch elements get shifted positions (offsets {per_b.tolist()} for b = 0, 1, ...): positions "
                f"are counted over the flattened batch. Give every sequence positions 0 .. {sz[seq] - 1}.",
            )
            return
    if seq != "t" and _restarts(pos, st.tok_axes.index(seq)):
        ks = st.tok_axes.index(seq)
        line = pos[tuple(slice(None) if j == ks else 0 for j in range(pos.ndim))].tolist()
        at = [i for i in range(1, len(line)) if line[i] == 0]
        dg.seq_axis = seq
        dg.problem(
            "restart",
            f"positions restart at 0 part-way along '{seq}' (positions {line}, restarting at index "
            f"{', '.join(map(str, at))}): each later chunk (a decode step, or a chunk of a chunked prefill) is "
            "rotated as if it began the sequence, so its keys and queries land at the positions of the first "
            "tokens. Pass the number of tokens already cached as the offset: ropelab.apply_rope(x, layout=..., "
            "offset=past_len), or position_ids = past_len + arange(new tokens) (Hugging Face: cache_position).",
        )
        return
    along_each = []
    for i, a in enumerate(st.tok_axes):
        line = pos[tuple(slice(None) if j == i else 0 for j in range(pos.ndim))]
        if not bool((line == line[0]).all()):
            along_each.append(f"along {a} {line.tolist()}")
    dg.problem(
        "seq_axis",
        f"positions depend on more than the '{seq}' axis (with the other indices at 0 they run "
        + "; ".join(along_each)
        + "): fn flattens several axes into one sequence. Pass x in the layout it expects, or name that layout.",
    )




def _restarts(pos: torch.Tensor, k: int) -> bool:
    """Positions the same on every other axis, counting 0, 1, 2, ... along axis k and dropping back to 0
    at least once: chunks (decode steps) rotated without their offset."""
    line = pos[tuple(slice(None) if j == k else 0 for j in range(pos.ndim))]
    shape = [pos.shape[j] if j == k else 1 for j in range(pos.ndim)]
    if not torch.equal(pos, line.reshape(shape).expand_as(pos)) or int(line[0]) != 0:
        return False
    steps = [int(line[i]) for i in range(1, len(line))]
    prev = [int(line[i - 1]) for i in range(1, len(line))]
    ok = all(c == 0 or c == p + 1 for c, p in zip(steps, prev))
    return ok and any(c == 0 for c in steps)
