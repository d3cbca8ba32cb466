"""Notebook 04's figures: the learning-rate sweep, the test errors per split, the training curves and CoPE's
gates; and the two figures notebook 03 draws from notebook 04's results file (``nb04_results``): CoPE's learned
position logits and the measured positions of the sources. Each helper draws into the axes it is given; the
notebook saves the figure."""

from __future__ import annotations

from .nb04_selective_copy import BLANK, SelectiveCopy

__all__ = ["plot_lr_sweep", "plot_selective_copy_errors", "plot_training_curves", "plot_cope_gates",
           "plot_cope_position_logits", "plot_cope_source_positions"]

_STYLES, _HEAD_C = ["-", "--", "-.", ":"], ["C0", "C1", "C2", "C4"]  # per CoPE head; colorblind palette, no red


def plot_lr_sweep(ax, selected: dict, lrs, labels: dict, style: dict, n_seeds: int, steps: int,
                  per_seed: dict | None = None) -> None:
    """Validation error against learning rate per encoding, the selected one circled (notebook 04, section 1).
    ``per_seed``, ``{pe: {lr: [validation error % of each seed]}}`` (from
    :func:`~ropelab.studies.nb04_selective_copy.learning_rate_sensitivity`), adds every seed as a small dot, so that
    a mean hiding one failed seed shows it."""
    for k, (pe, sel) in enumerate(selected.items()):
        sweep = sel["sweep"]
        ax.plot(lrs, [sweep[lr]["sequence_error"] for lr in lrs], label=labels[pe], ms=6, **style[pe])
        ax.plot([sel["lr"]], [sweep[sel["lr"]]["sequence_error"]], "o", ms=13, mfc="none", mec=style[pe]["color"])
        for lr, errors in (per_seed or {}).get(pe, {}).items():
            ax.plot([lr * 1.04 ** (k - 1.5)] * len(errors), errors, ".", ms=4, alpha=0.6, color=style[pe]["color"])
    dots = "dots: each seed; " if per_seed else ""
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="validation error (% of sequences)", ylim=(-3, 103),
           title=f"learning-rate sweep, {steps} steps: mean of {n_seeds} seeds\n({dots}circled: selected)")
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))


def plot_selective_copy_errors(ax, summary: dict, splits, labels: dict, style: dict, lrs: dict, steps: int) -> None:
    """Mean test error per encoding and split as bars, each seed a dot (notebook 04, section 2)."""
    import numpy as np

    pes, width = list(summary), 0.2
    n_seeds = len(next(iter(summary.values()))[splits[0]]["per_seed"])
    for k, pe in enumerate(pes):
        x = np.arange(len(splits)) + (k - 1.5) * width
        means = [summary[pe][s]["mean"] for s in splits]
        ax.bar(x, means, width, label=f"{labels[pe]} (lr {lrs[pe]:g})", color=style[pe]["color"],
               hatch=["", "//", "..", "xx"][k % 4], edgecolor="white", linewidth=0)
        for xi, s, m in zip(x, splits, means):
            ax.plot([xi] * n_seeds, summary[pe][s]["per_seed"], "k.", ms=4)
            top = max(m, summary[pe][s]["max"])  # the label goes above the bar and every seed's dot
            ax.annotate(f"{m:.1f}", (xi, top), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks(range(3), ["in distribution\n(32 blanks)", "OOD dense\n(16 blanks)", "OOD sparse\n(64 blanks)"])
    ax.set_ylabel("test error (% of sequences)")
    ax.set_ylim(0, 128)
    ax.set_title(f"Selective Copy: mean of {n_seeds} seeds (dots: each seed), {steps} steps, "
                 "each encoding at its selected learning rate", fontsize=10)
    ax.legend(ncol=2, fontsize=8, loc="upper left")


def plot_training_curves(axes, best: list[dict], labels: dict, style: dict) -> None:
    """Training loss and validation error against step, one line per seed (notebook 04, section 3)."""
    first = {}
    for res in best:
        pe, hist = res["pe"], res["history"]
        st = dict(color=style[pe]["color"], ls=style[pe]["ls"], lw=1)
        axes[0].plot([h["step"] for h in hist], [h["loss"] for h in hist], **st,
                     label=labels[pe] if first.setdefault(pe, res["seed"]) == res["seed"] else None)
        ev = [h for h in hist if "in_dist_sequence_error" in h]
        axes[1].plot([h["step"] for h in ev], [100 * h["in_dist_sequence_error"] for h in ev], **st,
                     marker=style[pe]["marker"], ms=3)
    axes[0].set(yscale="log", xlabel="step", ylabel="training loss (answer tokens, nats)")
    axes[1].axhline(1, color="k", lw=0.8, ls=":")
    axes[1].annotate("1 %", (0, 1), xytext=(2, 3), textcoords="offset points", fontsize=8)
    axes[1].set(xlabel="step", ylabel="validation error % (in distribution)")
    axes[0].legend(fontsize=8)


def plot_cope_gates(fig, axes, gates: dict, task: SelectiveCopy, seeds) -> None:
    """Layer 0's gates of one sequence as a heat map, and every (sequence, head, query) row's mean gate on
    symbols against blanks per seed (notebook 04, section 4; ``gates`` is :func:`cope_gate_analysis`')."""
    import numpy as np

    inputs, first, c = gates["inputs"], gates["first_gates"], task.context_len
    h, n = first.shape[:2]
    im = axes[0].imshow(first.reshape(h * n, -1).numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1,
                        interpolation="nearest")
    axes[0].grid(False)
    sym_cols = np.flatnonzero(inputs[0, :c].numpy() != BLANK)
    axes[0].set_xticks(sym_cols, [task.render(inputs[0, j:j + 1]) for j in sym_cols])
    axes[0].set_yticks([k * n + n / 2 - 0.5 for k in range(h)], [f"head {k}" for k in range(h)])
    for k in range(1, h):
        axes[0].axhline(k * n - 0.5, color="w", lw=1)
    axes[0].set_xlabel("key: symbols labelled, blanks unlabelled; then separator and answers")
    axes[0].set_title(f"layer-0 gates, seed {seeds[0]}, one sequence\nrows: answer queries t = 1..{n} of each "
                      "head", fontsize=10)
    fig.colorbar(im, ax=axes[0], fraction=0.03, label="gate $g_{ij}$")
    for k, seed in enumerate(seeds):
        sym, blank = gates["rows"][seed, 0]
        axes[1].scatter(blank[:50].flatten(), sym[:50].flatten(), s=4, alpha=0.35, color=f"C{[0, 1, 4, 2, 9][k % 5]}",
                        marker="os^Dv"[k % 5], label=f"seed {seed}", rasterized=True)  # raster: a small SVG
    axes[1].axvline(0.05, color="k", ls=":", lw=0.8)
    axes[1].set(xlabel="mean gate on blank keys", ylabel="mean gate on symbol keys", xlim=(-0.02, 1.02),
                ylim=(-0.02, 1.02))
    axes[1].set_title("layer 0: one dot per\n(sequence, head, query)", fontsize=10)
    axes[1].legend(fontsize=8, markerscale=3, loc="lower right")


def plot_cope_position_logits(axes, cope_models: list[dict], n_sym: int) -> None:
    r"""Every CoPE model's learned position logits :math:`q_i \cdot e[n]` (``cope_models``: the results file's
    ``rec["cope"]["models"]``), one panel per (layer, seed) in ``axes`` [layers, seeds], one line per head, the
    source's count ``n_sym + 1`` dotted (notebook 03, section 4)."""
    from matplotlib.ticker import MaxNLocator

    n_layers = len(cope_models[0]["position_logits"])
    for col, m in enumerate(cope_models):
        for layer, heads in enumerate(m["position_logits"]):
            ax = axes[layer, col]
            for head, logit in enumerate(heads):
                ax.plot(range(len(logit)), logit, lw=1.2, ls=_STYLES[head % 4], color=_HEAD_C[head % 4],
                        label=f"head {head}")
            ax.axvline(n_sym + 1, color="k", ls=":", lw=0.8)
            ax.set(xlim=(0, 40), title=f"seed {m['seed']}, layer {layer}")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # few labels: the panels are narrow
        axes[-1, col].set_xlabel("contextual position n")
    for layer in range(n_layers):
        axes[layer, 0].set_ylabel(r"$q_i\cdot e[n]$")
    axes[0, -1].legend(fontsize=7, loc="upper right")


def plot_cope_source_positions(axes, cope_models: list[dict], n_sym: int, centers) -> None:
    """Per seed (``axes`` [1, seeds]), layer 0's histogram of the measured position p at the source key, one step
    line per head (bins centred at ``centers``), each head's position-logit peak a triangle above it, the
    source's count ``n_sym + 1`` dotted (notebook 03, section 4)."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    for col, m in enumerate(cope_models):
        ax = axes[0, col]
        counts0 = np.array(m["source_positions"]["counts"][0])  # layer 0: [head, bin]
        logits0 = m["position_logits"][0]
        for head, cnt in enumerate(counts0):
            frac = cnt / cnt.sum()
            ax.step(centers, frac, where="mid", lw=1.2, ls=_STYLES[head % 4], color=_HEAD_C[head % 4],
                    label=f"head {head}")
            peak = int(np.argmax(logits0[head]))
            ax.plot([peak], [frac.max() * 1.08], "v", color=_HEAD_C[head % 4], ms=6)
        ax.axvline(n_sym + 1, color="k", ls=":", lw=0.8)
        ax.set(xlim=(0, 40), xlabel="measured p (source key)", title=f"seed {m['seed']}, layer 0")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # few labels: the panels are narrow
    axes[0, 0].set_ylabel("share of (sequence, answer) pairs")
    axes[0, -1].legend(fontsize=7)
