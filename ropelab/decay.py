r"""Does RoPE's attention logit decay with distance? The envelope, the actual logits, and Men et al.'s bound.

RoFormer (Su et al. 2021, arXiv 2104.09864, Section 3.4.3) writes the score of a query q and a key k at
relative distance r, pair by pair, as :math:`\mathrm{Re}\sum_{i} h_i\,e^{\mathrm i r\theta_i}` with
:math:`h_i = \bar q_{[2i:2i+1]}\,k_{[2i:2i+1]}` and bounds it by Abel summation:

.. math::
    \Big|\sum_{i=0}^{d/2-1} h_i e^{\mathrm i r\theta_i}\Big|
    \le \Big(\max_i |h_{i+1} - h_i|\Big) \sum_{j=1}^{d/2} |S_j|,
    \qquad S_j = \sum_{i=0}^{j-1} e^{\mathrm i r\theta_i},

and plots :math:`\frac{1}{d/2}\sum_j |S_j|` against r (its Figure 2: d = 128, base 10000). At r = 0,
:math:`S_j = j` and the envelope is :math:`\frac{1}{64}\sum_{j=1}^{64} j = 32.5`. The envelope bounds
the logit only up to the factor :math:`\max|h_{i+1}-h_i|`, which depends on q and k; it is an upper
bound, not the logit.

The logit itself, :math:`\ell(r) = \langle R_r q, k\rangle` (query r tokens after the key), depends on q
and k. For all-ones vectors every pair contributes :math:`2\cos r\theta_i`, so
:math:`\ell(r) = 2 B_r` with

.. math::
    B_r = \sum_{i=0}^{d/2-1} \cos(r\,\theta_i)

(Men et al. 2024, "Base of RoPE Bounds Context Length", arXiv 2405.14591), which is also
:math:`\mathbb E\,\ell(r)/2` for a similar key :math:`k = q + \varepsilon` with
:math:`q \sim \mathcal N(0, I)` and independent noise. Men et al. ask that :math:`B_r \ge 0` for every
r up to the context length, which sets a smallest base. For independent Gaussian q and k,
:math:`\mathbb E\,\ell(r) = 0` at every distance and :math:`\mathrm{Var}\,\ell(r) = d`: no decay at all
(Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings useful?",
arXiv 2410.06205).

Frequencies: :math:`\theta_i = b^{-2i/d}` from :func:`ropelab.frequencies`. Everything is float64.

``plot_logits_vs_distance`` and ``plot_base_scan`` draw notebook 03's figures of these quantities.
"""

from __future__ import annotations

import functools
import math

import torch

from .core import cos_sin, rotate
from .scaling import frequencies
from .scaling.checks import check_base, check_int

__all__ = [
    "decay_envelope",
    "rope_logits",
    "similarity_bound",
    "min_similarity_bound",
    "base_scan",
    "smallest_nonnegative_base",
    "decay_view",
    "first_negative",
    "plot_logits_vs_distance",
    "plot_base_scan",
]


def _distances(distances) -> torch.Tensor:
    r = torch.as_tensor(distances)
    if r.dtype == torch.bool or r.is_complex() or r.ndim != 1:
        raise ValueError(
            f"distances must be a 1-D tensor of relative distances (ints or floats), got "
            f"{r.dtype}, shape {tuple(r.shape)}; e.g. torch.arange(257)."
        )
    return r.to(torch.float64)


def _inv_freq(head_dim: int, base: float) -> torch.Tensor:
    if not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even int >= 2 (RoPE rotates pairs), got {head_dim!r}.")
    if not base > 1:
        raise ValueError(f"base must be > 1 (the frequencies are base^(-2i/d)), got {base!r}.")
    return frequencies(head_dim, float(base))[0].to(torch.float64)


def decay_envelope(distances, head_dim: int = 128, base: float = 10000.0) -> torch.Tensor:
    r"""RoFormer's long-term-decay envelope :math:`\frac{1}{d/2}\sum_{j=1}^{d/2} |S_j|` at each distance.

    Args:
        distances: a 1-D tensor (or list) of relative distances r, ints or floats (ValueError otherwise).
        head_dim: d, an even int >= 2 (ValueError otherwise).
        base: RoPE's base b > 1 (ValueError otherwise); the frequencies are :math:`b^{-2i/d}`.

    Returns a float64 tensor [len(distances)].
    """
    r = _distances(distances)
    theta = _inv_freq(head_dim, base)
    phase = torch.polar(torch.ones(r.numel(), theta.numel(), dtype=torch.float64), r[:, None] * theta[None, :])
    return phase.cumsum(dim=-1).abs().mean(dim=-1)  # cumsum over i gives S_1 .. S_{d/2}


def rope_logits(q: torch.Tensor, k: torch.Tensor, distances, *, base: float = 10000.0, style: str = "half"):
    r""":math:`\ell(r) = \langle R_r q, k\rangle` for each distance r: the RoPE score of q at position
    m and k at position m - r. q and k are [..., d] with equal shapes; returns [..., len(distances)] in
    float64.

    Args:
        q: the queries [..., d] (any leading dims; computed in float64).
        k: the keys, q's shape exactly (ValueError otherwise: nothing is broadcast).
        distances: a 1-D tensor (or list) of relative distances r, ints or floats (ValueError otherwise).
        base: RoPE's base b > 1; d is q's last dim (even).
        style: the pairing, ``"half"`` or ``"interleaved"``.
    """
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor) or q.shape != k.shape:
        raise ValueError(
            f"q and k must be tensors of the same shape [..., d], got {getattr(q, 'shape', q)} and "
            f"{getattr(k, 'shape', k)}; broadcast them explicitly first."
        )
    r = _distances(distances)
    d = q.shape[-1]
    inv_freq = _inv_freq(d, base)
    cos, sin = cos_sin(r, inv_freq, dtype=torch.float64)  # [R, d/2]
    lead = q.shape[:-1]
    shape = (1,) * len(lead) + cos.shape
    qr = rotate(q.to(torch.float64)[..., None, :].expand(*lead, r.numel(), d), cos.reshape(shape),
                sin.reshape(shape), style=style)
    return (qr * k.to(torch.float64)[..., None, :]).sum(-1)


def similarity_bound(distances, head_dim: int = 128, base: float = 10000.0) -> torch.Tensor:
    r"""Men et al.'s :math:`B_r = \sum_{i=0}^{d/2-1}\cos(r\,\theta_i)` at each distance (float64).

    Args:
        distances: a 1-D tensor (or list) of relative distances r, ints or floats (ValueError otherwise).
        head_dim: d, an even int >= 2 (ValueError otherwise).
        base: RoPE's base b > 1 (ValueError otherwise); the frequencies are :math:`b^{-2i/d}`.

    Returns a float64 tensor [len(distances)].
    """
    r = _distances(distances)
    theta = _inv_freq(head_dim, base)
    out = torch.empty(r.numel(), dtype=torch.float64)
    for start in range(0, r.numel(), 1 << 15):  # chunks keep the [R, d/2] angle matrix small
        chunk = r[start : start + (1 << 15)]
        out[start : start + chunk.numel()] = torch.cos(chunk[:, None] * theta[None, :]).sum(-1)
    return out


def _nonnegative_up_to(context_length: int, head_dim: int, base: float, chunk: int = 2048) -> bool:
    """Whether B_r >= 0 for r = 0 .. context_length; stops at the first chunk with a negative value."""
    for start in range(0, context_length + 1, chunk):
        r = torch.arange(start, min(start + chunk, context_length + 1))
        if bool((similarity_bound(r, head_dim, base) < 0).any()):
            return False
    return True


def smallest_nonnegative_base(
    context_length: int,
    head_dim: int = 128,
    *,
    lo: float = 100.0,
    hi: float = 1e12,
    grid_ratio: float = 1.02,
    rel_tol: float = 1e-3,
) -> float:
    r"""The smallest base b with :math:`B_r(b) \ge 0` for every integer r in 0 .. ``context_length``.

    This is **not** a threshold above which every base passes: the set of passing bases is not closed
    upward (d = 128, 4096 tokens: about 2.86e4 passes, 4e4 fails with min :math:`B_r` about -2.1).
    :func:`base_scan` gives the base above which every base passes. This function scans upward from
    ``lo`` on a geometric grid of ratio ``grid_ratio`` for the first
    base that passes, then bisects on :math:`\log b` between it and the grid point below (which fails)
    to a relative tolerance ``rel_tol``. A passing window narrower than one grid step could be missed.

    Args:
        context_length: L, a positive int: distances 0 .. L are checked.
        head_dim: d, an even int >= 2.
        lo: where the scan starts, > 1; it must fail (ValueError otherwise: lower it).
        hi: where the scan gives up, > lo (ValueError when no grid base up to it passes: raise it).
        grid_ratio: the scan's geometric step, > 1.
        rel_tol: the bisection's relative tolerance on b, > 0.

    Returns the base (float), within ``rel_tol`` above the true smallest passing base of that window.
    """
    if not isinstance(context_length, int) or context_length < 1:
        raise ValueError(f"context_length must be a positive int, got {context_length!r}.")
    if not (grid_ratio > 1 and rel_tol > 0 and 1 < lo < hi):
        raise ValueError(f"need grid_ratio > 1, rel_tol > 0 and 1 < lo < hi, got {grid_ratio}, {rel_tol}, {lo}, {hi}.")
    if _nonnegative_up_to(context_length, head_dim, lo):
        raise ValueError(f"B_r is already non-negative up to {context_length} at base lo={lo:g}; lower lo.")
    prev = lo
    while True:
        b = prev * grid_ratio
        if b > hi:
            raise ValueError(f"B_r goes negative before {context_length} at every base up to hi={hi:g}; raise hi.")
        if _nonnegative_up_to(context_length, head_dim, b):
            break
        prev = b
    a, c = math.log(prev), math.log(b)
    while c - a > math.log1p(rel_tol):
        mid = 0.5 * (a + c)
        if _nonnegative_up_to(context_length, head_dim, math.exp(mid)):
            c = mid
        else:
            a = mid
    return math.exp(c)


def min_similarity_bound(context_length: int, head_dim: int, bases) -> torch.Tensor:
    r""":math:`\min_{0 \le r \le L} B_r(b)` for each base b in ``bases`` (float64, one value per base):
    Men et al.'s criterion holds for b up to context length L exactly when this is :math:`\ge 0`.

    Args:
        context_length: L, a positive int: every integer r in 0 .. L is checked.
        head_dim: d, an even int >= 2.
        bases: a non-empty 1-D list or tensor of bases, each > 1 (ValueError otherwise).
    """
    if not isinstance(context_length, int) or context_length < 1:
        raise ValueError(f"context_length must be a positive int, got {context_length!r}.")
    b = torch.as_tensor(bases, dtype=torch.float64)
    if b.ndim != 1 or b.numel() == 0 or not bool((b > 1).all()):
        raise ValueError(f"bases must be a non-empty 1-D list of numbers > 1, got shape {tuple(b.shape)}.")
    r = torch.arange(context_length + 1, dtype=torch.float64)
    out = torch.empty(b.numel(), dtype=torch.float64)
    for i, base in enumerate(b.tolist()):
        theta = _inv_freq(head_dim, base)
        lowest = math.inf
        for start in range(0, r.numel(), 1 << 13):  # chunks keep the [R, d/2] angle matrix small
            chunk = r[start : start + (1 << 13)]
            lowest = min(lowest, float(torch.cos(chunk[:, None] * theta[None, :]).sum(-1).min()))
        out[i] = lowest
    return out


def base_scan(
    context_length: int, head_dim: int = 128, *, lo: float = 1e3, hi: float = 1e7, points_per_decade: int = 50
) -> dict:
    r"""Pass/fail of Men et al.'s criterion (:math:`B_r \ge 0` for every r in 0 .. L) on a geometric grid
    of bases from ``lo`` to ``hi``.

    Returns ``{"bases", "min_bound", "passes", "first_pass", "all_pass_above", "last_fail"}``: the grid,
    :func:`min_similarity_bound` and pass/fail at each grid base, the smallest passing grid base, the
    smallest grid base from which **every** grid base up to ``hi`` passes (None if ``hi`` fails), and the
    largest failing grid base (None if none fails). Only grid points are tested: a failing window narrower
    than one grid step (a factor :math:`10^{1/\text{points\_per\_decade}}`) could be missed.

    Args:
        context_length: L, a positive int.
        head_dim: d, an even int >= 2.
        lo: the grid's smallest base, > 1.
        hi: the grid's largest base, > lo.
        points_per_decade: grid points per factor of 10 (a positive int); the grid has
            round(log10(hi / lo) * points_per_decade) + 1 points, both ends included.
    """
    if not (1 < lo < hi) or not isinstance(points_per_decade, int) or points_per_decade < 1:
        raise ValueError(f"need 1 < lo < hi and points_per_decade a positive int; got {lo}, {hi}, {points_per_decade}.")
    n = int(round(math.log10(hi / lo) * points_per_decade)) + 1
    bases = torch.logspace(math.log10(lo), math.log10(hi), n, dtype=torch.float64)
    low = min_similarity_bound(context_length, head_dim, bases)
    passes = low >= 0
    fails = (~passes).nonzero().flatten()
    last_fail = int(fails[-1]) if fails.numel() else None
    all_pass_above = None
    if bool(passes[-1]):
        all_pass_above = float(bases[0]) if last_fail is None else float(bases[last_fail + 1])
    first = passes.nonzero().flatten()
    return {
        "bases": bases,
        "min_bound": low,
        "passes": passes,
        "first_pass": float(bases[int(first[0])]) if first.numel() else None,
        "all_pass_above": all_pass_above,
        "last_fail": float(bases[last_fail]) if last_fail is not None else None,
    }


def decay_view(base: float = 10000.0, head_dim: int = 128, distance: int = 4096, n_points: int = 256, n_pairs: int = 64,
          seed: int = 0) -> dict:
    r"""RoFormer's decay envelope against what the logit actually does, over distances 0 .. ``distance``.

    Returns numpy arrays over the distances ``r`` (int64: ``n_points`` evenly spaced from 0 to ``distance``,
    rounded, duplicates dropped), float64 for the rest: ``envelope``
    (:func:`ropelab.decay.decay_envelope`), ``aligned`` (:math:`2B_r`, the logit of all-ones q = k and the
    mean logit of a key similar to its query, :func:`ropelab.decay.similarity_bound` times 2), and for
    ``n_pairs`` independent standard-normal q, k (seeded) the ``gaussian_mean`` and ``gaussian_std`` of
    :math:`\langle R_r q, k\rangle` (:func:`ropelab.decay.rope_logits`): mean 0 and spread
    :math:`\sqrt d` at every distance, no decay. ``first_negative`` is the first integer distance
    :math:`r \le` ``distance`` where :math:`B_r < 0` (None if none), found on every integer, not on the
    plotted grid (whose step would miss a short dip: at base 1e4, d = 128 the first is 1707).

    Args:
        base: RoPE's base b (a finite number > 1).
        head_dim: d, an even int in [2, 1024].
        distance: the largest distance, an int in [1, 2**20].
        n_points: plotted distances, an int in [2, 10000].
        n_pairs: Gaussian (q, k) pairs, an int in [2, 4096].
        seed: the seed of the generator the pairs are drawn from.

    ValueError names an argument out of range.
    """
    check_base(base)
    base = float(base)
    head_dim = check_int("head_dim", head_dim, 2, 1024, even=True)
    distance = check_int("distance", distance, 1, 1 << 20)
    n_points = check_int("n_points", n_points, 2, 10000)
    n_pairs = check_int("n_pairs", n_pairs, 2, 4096)
    r = torch.unique(torch.linspace(0, distance, n_points).round().long())
    env = decay_envelope(r, head_dim, base)
    bound = similarity_bound(r, head_dim, base)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_pairs, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(n_pairs, head_dim, generator=g, dtype=torch.float64)
    logits = rope_logits(q, k, r, base=base)  # [n_pairs, len(r)]
    return {
        "r": r.numpy(),
        "envelope": env.numpy(),
        "aligned": (2 * bound).numpy(),
        "gaussian_mean": logits.mean(0).numpy(),
        "gaussian_std": logits.std(0).numpy(),
        "first_negative": first_negative(base, head_dim, distance),
    }


@functools.lru_cache(maxsize=256)
def first_negative(base: float, head_dim: int, distance: int, chunk: int = 4096) -> int | None:
    """The first integer r <= ``distance`` with :math:`B_r < 0` (None if none), scanned in chunks that stop at
    the first hit. Results are cached (``functools.lru_cache``, 256 entries).

    Args:
        base: RoPE's base b > 1.
        head_dim: d, an even int >= 2.
        distance: the largest distance checked (int).
        chunk: distances per chunk, which bounds memory, not the result.
    """
    for start in range(0, distance + 1, chunk):
        b = similarity_bound(torch.arange(start, min(start + chunk, distance + 1)), head_dim, base)
        neg = (b < 0).nonzero()
        if neg.numel():
            return start + int(neg[0, 0])
    return None


def plot_logits_vs_distance(axes, dist: torch.Tensor, l_ones: torch.Tensor, l_gauss: torch.Tensor,
                            l_sim: torch.Tensor, B: torch.Tensor) -> None:
    r"""The logit :math:`\langle R_r q, k\rangle` against distance ``dist`` for all-ones q = k (``l_ones``),
    independent Gaussian pairs (``l_gauss`` [pairs, distances]: mean, ±1 std and one pair) and similar keys
    (``l_sim``, with :math:`2B_r` from ``B``), on a symlog distance axis (notebook 03, section 2; three axes).

    Args:
        axes: three matplotlib Axes.
        dist: the distances r [R].
        l_ones: the all-ones logits [R].
        l_gauss: the Gaussian pairs' logits [pairs, R].
        l_sim: the similar keys' logits [pairs, R] (their mean and spread are drawn).
        B: :math:`B_r` [R] (:func:`similarity_bound`), drawn doubled.
    """
    n_pairs = l_gauss.shape[0]
    axes[0].plot(dist, l_ones, lw=1)
    axes[0].set(title=r"all-ones q = k: $\ell(r) = 2B_r$", ylabel=r"logit $\langle R_r q, k\rangle$")
    m, s = l_gauss.mean(0), l_gauss.std(0)
    axes[1].fill_between(dist, m - s, m + s, alpha=0.3, label="mean ± 1 std")
    axes[1].plot(dist, m, lw=1, label=f"mean of {n_pairs} pairs")
    axes[1].plot(dist, l_gauss[0], lw=0.5, color="gray", ls=":", label="one pair")
    axes[1].set(title="independent Gaussian q, k: no decay")
    axes[1].legend(fontsize=7)
    m2, s2 = l_sim.mean(0), l_sim.std(0)
    axes[2].fill_between(dist, m2 - s2, m2 + s2, alpha=0.3)
    axes[2].plot(dist, m2, lw=1.2, label="mean")
    axes[2].plot(dist, 2 * B, "k--", lw=0.8, label=r"$2B_r$")
    axes[2].set(title="similar key k = q + 0.5 noise")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set(xscale="symlog", xlabel="relative distance r")
        ax.axhline(0, color="k", lw=0.5)


def plot_base_scan(axes, scans: dict, refined: dict, contexts: list[int]) -> None:
    r"""Left: :func:`base_scan`'s passing and failing grid bases per context length (``scans``: L -> its result,
    for L in ``contexts``), with the base from which every grid base passes and the refined smallest passing
    base (``refined``: L -> :func:`smallest_nonnegative_base`); right: :math:`\min_{r \le L} B_r` against
    the base at L = 4096 (or the longest context) (notebook 03, section 3; two axes).

    Args:
        axes: two matplotlib Axes.
        scans: context length L -> :func:`base_scan`'s result at L, in the order the rows are drawn.
        refined: L -> :func:`smallest_nonnegative_base` at L.
        contexts: the context lengths, in the order of ``scans``.
    """
    import numpy as np

    for row, s in enumerate(scans.values()):
        b, ok = s["bases"].numpy(), s["passes"].numpy()
        axes[0].scatter(b[ok], np.full(ok.sum(), row), marker="|", s=90, color="C0",
                        label="passes" if row == 0 else None)
        axes[0].scatter(b[~ok], np.full((~ok).sum(), row), marker="x", s=14, color="C1", lw=0.8,
                        label="fails" if row == 0 else None)
        axes[0].plot([s["all_pass_above"]], [row + 0.32], "v", color="k", ms=6,
                     label="every base passes from here" if row == 0 else None)
        axes[0].plot([refined[contexts[row]]], [row - 0.32], "^", color="C2", ms=6,
                     label="smallest passing base" if row == 0 else None)
    axes[0].set_yticks(range(len(scans)), [f"L = {L}" for L in scans])
    axes[0].set(xscale="log", xlabel="RoPE base b (grid of 50 per decade)", ylim=(-0.6, len(scans) - 0.2),
                title=r"$B_r \geq 0$ for every $r \leq L$? (d = 128)")
    axes[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=4, frameon=False)
    L0 = 4096 if 4096 in scans else contexts[-1]
    s0 = scans[L0]
    axes[1].plot(s0["bases"], s0["min_bound"], lw=1, marker=".", ms=3)
    axes[1].axhline(0, color="k", lw=0.6)
    axes[1].axvline(refined[L0], color="C2", ls="--", lw=1, label=f"smallest passing {refined[L0]:.3g}")
    axes[1].axvline(s0["all_pass_above"], color="C4", ls=":", lw=1.2, label=f"all pass from {s0['all_pass_above']:.3g}")
    axes[1].set(xscale="log", xlabel="RoPE base b", ylabel=r"$\min_{r \leq L} B_r$", ylim=(-12, 12),
                title=f"L = {L0}: the minimum over distances")
    axes[1].legend(fontsize=8, loc="lower right")
