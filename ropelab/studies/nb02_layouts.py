"""Notebook 02's figures: a RoPE module told the wrong sequence axis. The helper draws into the figure and axes
it is given; the notebook measures what it shows and saves it."""

from __future__ import annotations

__all__ = ["plot_seq_dim_bug"]


def plot_seq_dim_bug(fig, axes, ang_good, ang_bad, scores: dict, *, pair: int = 4, head: int = 1) -> None:
    """The angle of pair ``pair`` at every (position, head) of the correct and the buggy module (``ang_good``,
    ``ang_bad`` [s, h], heat maps on a shared colour bar), and one query/key pair's score in head ``head``
    against distance for each (``scores``: name -> [s]) (notebook 02, section 1; three axes)."""
    for ax, ang, title in [
        (axes[0], ang_good, "correct: angle varies along s"),
        (axes[1], ang_bad, "seq_dimension=-2: along h"),
    ]:
        im = ax.imshow(ang.T.numpy(), aspect="auto", cmap="twilight", vmin=-3.1416, vmax=3.1416,
                       interpolation="nearest")
        ax.set(xlabel="position index s", ylabel="head h", title=title)
        ax.grid(False)
    fig.colorbar(im, ax=axes[:2], label=f"angle of pair {pair} (rad)", shrink=0.9)
    for ax in axes[:2]:
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.yaxis.get_major_locator().set_params(integer=True)
    for (name, sc), ls in zip(scores.items(), ["-", "--"]):
        axes[2].plot(sc, label=name, lw=1.6, ls=ls)
    axes[2].set(xlabel="key position n (query at 0)", ylabel=f"score, head {head}", title="score vs distance")
    axes[2].legend(frameon=False)
