r"""Interactive explorers for the notebooks: sliders over the package's own functions, with a static figure.

Each explorer is three layers, so that what it shows is tested like the rest of the package:

- a pure compute function that returns the numbers drawn, next to its domain (this module holds widgets only):
  :func:`ropelab.precision.ladder`, :func:`ropelab.decay.decay_view`, :func:`ropelab.staleness.ntk_drift`,
  :func:`ropelab.extend.extension_ratios`, :func:`ropelab.cope.cope_gates` and
  :func:`ropelab.kernels.traffic.bytes_view`;
- an :class:`Explorer` that owns one matplotlib figure (Agg, never pyplot, so nothing is shown twice) and
  redraws it from the compute function: ``update(**params)`` returns the PNG bytes;
- ``widget()``: ipywidgets controls and an ``ipywidgets.Image`` holding that PNG. It needs a live kernel;
  ``save(figures_dir)`` writes the default view as ``NN_explore_*.png`` / ``.svg`` so a notebook can show
  it in a Markdown cell when no kernel is running (on a web page, or before Run All).

In a notebook::

    from ropelab import explorers
    ex = explorers.LadderExplorer()
    ex.save(FIGURES_DIR)        # the static figure, for readers without a kernel
    ex.widget()                 # sliders: base, head_dim, position, dtype

An update (compute, draw, PNG) aims at well under 200 ms on two CPU cores at the sizes the sliders allow;
``python -m ropelab.bench explorers`` measures it (the tests check what an update draws, not its time).
"""

from __future__ import annotations

import html
import io
import os
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .cope import COUNT_RULES, cope_gates
from .decay import decay_view
from .extend import extension_ratios, ratio_table
from .kernels.traffic import BYTES_DTYPES, bytes_view
from .machine import one_thread
from .precision import LADDER_DTYPES, ladder
from .staleness import ntk_drift

__all__ = [
    "DTYPES",
    "Explorer",
    "LadderExplorer",
    "DecayExplorer",
    "DriftExplorer",
    "ExtensionExplorer",
    "CoPEExplorer",
    "BytesExplorer",
]

DTYPES = LADDER_DTYPES  # the ladder explorer's dtype menu

# The compute functions lived here until they moved next to their domains; these names keep old code working.
decay = decay_view




# --------------------------------------------------------------------------------------------------
# Figures and widgets
# --------------------------------------------------------------------------------------------------


class Explorer:
    """One figure redrawn from a compute function. Subclasses set ``name`` (the file stem), ``defaults``
    (the parameters of the static figure) and ``size``, and implement ``build(fig)`` (axes and empty
    artists, once), ``refresh(**params)`` (new data into those artists: far cheaper than new axes, whose
    ticks dominate a redraw) and ``controls()`` (a dict of ipywidgets keyed by parameter name).

    Args:
        **params: the view's parameters, overriding the subclass's ``defaults`` (an unknown name raises
            ValueError); the figure is laid out but not drawn until :meth:`render`.
    """

    name = "explore"
    defaults: dict = {}
    size = (10.0, 3.6)

    def __init__(self, **params):
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"unknown parameters {sorted(unknown)}; {type(self).__name__} takes {sorted(self.defaults)}."
            )
        self.params = {**self.defaults, **params}
        self.fig = Figure(figsize=self.size, dpi=72)
        FigureCanvasAgg(self.fig)
        self.build(self.fig)

    def build(self, fig: Figure) -> None:  # pragma: no cover - abstract
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure (Agg canvas).
        """
        raise NotImplementedError

    def refresh(self, **params) -> None:  # pragma: no cover - abstract
        """Redraw the figure for these control values.

        Args:
            **params: every parameter of ``defaults``, by name; a bad value raises ValueError.
        """
        raise NotImplementedError

    def controls(self) -> dict:  # pragma: no cover - abstract
        """The ipywidgets controls, by parameter name."""
        raise NotImplementedError

    def render(self, **params) -> Figure:
        """Redraw the figure for ``params`` (merged into the current ones) and return it.

        Args:
            **params: parameters to change (an unknown name raises ValueError); the current ones change only
                when the redraw succeeds.
        """
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(f"unknown parameters {sorted(unknown)}; choose from {sorted(self.defaults)}.")
        new = {**self.params, **params}
        with one_thread():
            self.refresh(**new)  # raises ValueError on bad input before self.params changes
        self.params = new
        return self.fig

    def update(self, **params) -> bytes:
        """Redraw and return the figure as PNG bytes (what the widget shows).

        Args:
            **params: as in :meth:`render`.
        """
        self.render(**params)
        buf = io.BytesIO()
        # zlib level 1: the encoder took 40 % of an update at the default level 6; the file is ~1.5x larger
        self.fig.savefig(buf, format="png", pil_kwargs={"compress_level": 1})
        return buf.getvalue()

    def save(self, figures_dir: str | os.PathLike) -> list[Path]:
        """Write the default view as ``<name>.png`` and ``.svg`` into ``figures_dir`` (byte-stable, like
        :func:`ropelab.figures.save`), for readers without a live kernel.

        Args:
            figures_dir: the folder to write into (created if missing).

        Returns the two paths written.
        """
        self.render(**self.defaults)
        out = Path(figures_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{self.name}.png", out / f"{self.name}.svg"]
        with matplotlib.rc_context({"svg.hashsalt": "ropelab"}):  # fixed SVG ids, as in ropelab.figures.setup
            self.fig.savefig(paths[0], metadata={"Software": None})
            self.fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
        return paths

    def widget(self):
        """The controls above an image of the figure; moving a control redraws it (needs a live kernel).
        A bad value (an empty sequence, say) shows its error under the controls and keeps the last figure."""
        import ipywidgets as w

        controls = self.widgets = self.controls()  # kept, so a test or a caller can move them
        image = w.Image(value=self.update(**{k: c.value for k, c in controls.items()}), format="png")
        image.add_class("ropelab-explorer-image")
        message = w.HTML("")

        def on_change(_change=None):
            try:
                image.value = self.update(**{k: c.value for k, c in controls.items()})
                message.value = ""
            except ValueError as e:
                message.value = f"<span style='color:#b00'>{html.escape(str(e))}</span>"

        for c in controls.values():
            c.observe(on_change, names="value")
        items = list(controls.values())
        box = w.VBox([w.HBox(items[:2]), w.HBox(items[2:]), message, image])
        box.add_class("ropelab-explorer")
        return box


def _style():
    return {"description_width": "initial"}


def _base_head_dim(params: dict, style: dict) -> dict:
    """The base (log slider) and head_dim (dropdown) controls the ladder and decay explorers share."""
    import ipywidgets as w

    return {
        "base": w.FloatLogSlider(value=params["base"], base=10, min=2, max=7, step=0.1, description="base",
                                 style=style),
        "head_dim": w.Dropdown(options=[16, 32, 64, 128, 256], value=params["head_dim"], description="head_dim",
                               style=style),
    }


def _pad_log(lo: float, hi: float) -> tuple[float, float]:
    return lo / 2, hi * 2


class LadderExplorer(Explorer):
    """The frequency ladder and the rotation of four pairs at one position (notebook 00).

    Args:
        **params: the view's parameters, those of :func:`ropelab.precision.ladder`
            (``defaults`` gives the static figure's).
    """

    name = "00_explore_ladder"
    defaults = {"base": 10000.0, "head_dim": 64, "position": 100, "dtype": "bfloat16"}
    size = (11.0, 3.5)
    _PAIRS = ("0", "d/8", "d/4", "d/2-1")

    def build(self, fig):
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure.
        """
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.15, top=0.84, wspace=0.3)
        self.ax = fig.subplots(1, 3, width_ratios=[1.3, 1, 1.3])
        ax0, ax1, ax2 = self.ax
        (self.wave,) = ax0.semilogy([], [], ".-", lw=1, label="2π/ω_i")
        (self.pos_line,) = ax0.plot([], [], color="C3", lw=1, ls="--", label="position")
        ax0.set(xlabel="pair i", ylabel="positions per turn")
        ax0.legend(loc="upper left", fontsize=8)
        t = np.linspace(0, 2 * np.pi, 100)
        ax1.plot(np.cos(t), np.sin(t), color="0.8", lw=1)
        self.exact = [ax1.plot([], [], color=f"C{n}", lw=2, label=f"pair {p}")[0] for n, p in enumerate(self._PAIRS)]
        self.held = [ax1.plot([], [], color=f"C{n}", lw=1, ls=":")[0] for n in range(len(self._PAIRS))]
        ax1.set(aspect="equal", xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), xticks=[], yticks=[])
        ax1.legend(fontsize=7, loc="lower left")
        (self.err,) = ax2.semilogy([0, 1], [1e-17, 10], ".", color="C3")  # data so autoscale is never singular
        ax2.axhline(0.1, color="0.5", lw=1, ls="--")
        ax2.set(xlabel="pair i", ylabel="phase error (rad)")

    def refresh(self, base, head_dim, position, dtype):
        """Redraw the figure for these control values.

        The numbers are :func:`ropelab.precision.ladder`'s; a bad value raises its ValueError.

        Args:
            base: as in :func:`ropelab.precision.ladder`.
            head_dim: as in :func:`ropelab.precision.ladder`.
            position: as in :func:`ropelab.precision.ladder`.
            dtype: as in :func:`ropelab.precision.ladder`.
        """
        out = ladder(base, head_dim, position, dtype)
        ax0, ax1, ax2 = self.ax
        i = np.arange(head_dim // 2)
        self.wave.set_data(i, out["wavelength"])
        self.pos_line.set_data([0, head_dim // 2 - 1], [max(position, 1)] * 2)
        ax0.set_xlim(-0.5, head_dim // 2 - 0.5)
        ax0.set_ylim(*_pad_log(min(out["wavelength"].min(), max(position, 1)), max(out["wavelength"].max(), position)))
        ax0.set_title(f"ladder: base {base:.3g}, d = {head_dim}, {int(out['turned'].sum())} pairs turned once")
        for n, p in enumerate((0, head_dim // 8, head_dim // 4, head_dim // 2 - 1)):
            a, h = out["angle"][p], out["angle_dtype"][p]
            self.exact[n].set_data([0, np.cos(a)], [0, np.sin(a)])
            self.held[n].set_data([0, np.cos(h)], [0, np.sin(h)])
        ax1.set_title(f"pairs at position {position}\n(dotted: angle in {dtype})", fontsize=10)
        self.err.set_data(i, np.maximum(out["phase_error"], 1e-17))
        ax2.set_ylim(1e-17, 10)
        ax2.set_xlim(-0.5, head_dim // 2 - 0.5)
        ax2.set_title(f"{dtype} angle vs float64: max {out['phase_error'].max():.2g} rad")

    def controls(self):
        """The ipywidgets controls, by parameter name."""
        import ipywidgets as w

        st = _style()
        return {
            **_base_head_dim(self.params, st),
            "position": w.IntSlider(value=self.params["position"], min=0, max=8192, step=1,
                                    description="position", style=st),
            "dtype": w.Dropdown(options=list(DTYPES), value=self.params["dtype"], description="dtype", style=st),
        }


class DecayExplorer(Explorer):
    """RoFormer's envelope against Gaussian and aligned q, k (notebook 03).

    Args:
        **params: the view's parameters, those of :func:`ropelab.decay.decay_view`
            (``defaults`` gives the static figure's).
    """

    name = "03_explore_decay"
    defaults = {"base": 10000.0, "head_dim": 128, "distance": 4096}
    size = (10.0, 3.6)

    def build(self, fig):
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure.
        """
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.9)
        self.ax = ax = fig.subplots()
        (self.env,) = ax.plot([], [], color="C0", label="RoFormer envelope (1/(d/2)) Σ|S_j|")
        (self.aligned,) = ax.plot([], [], color="C1", label="aligned q ≈ k: 2 B_r")
        (self.gauss,) = ax.plot([], [], color="C2", label="independent Gaussian q, k: mean of 64 pairs (band: ± 1 std)")
        self.band = None
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set(xlabel="relative distance r", ylabel="logit")
        ax.legend(fontsize=8, loc="upper right")

    def refresh(self, base, head_dim, distance):
        """Redraw the figure for these control values.

        The numbers are :func:`ropelab.decay.decay_view`'s; a bad value raises its ValueError.

        Args:
            base: as in :func:`ropelab.decay.decay_view`.
            head_dim: as in :func:`ropelab.decay.decay_view`.
            distance: as in :func:`ropelab.decay.decay_view`.
        """
        out = decay_view(base, head_dim, distance)
        r, ax = out["r"], self.ax
        self.env.set_data(r, out["envelope"])
        self.aligned.set_data(r, out["aligned"])
        self.gauss.set_data(r, out["gaussian_mean"])
        if self.band is not None:
            self.band.remove()
        lo, hi = out["gaussian_mean"] - out["gaussian_std"], out["gaussian_mean"] + out["gaussian_std"]
        self.band = ax.fill_between(r, lo, hi, color="C2", alpha=0.2)
        ymin = min(lo.min(), out["aligned"].min(), 0)
        ymax = max(hi.max(), out["aligned"].max(), out["envelope"].max())
        ax.set_xlim(0, distance)
        ax.set_ylim(ymin - 0.05 * (ymax - ymin), ymax + 0.3 * (ymax - ymin))
        neg = out["first_negative"]
        note = f"B_r < 0 first at r = {neg}" if neg is not None else f"B_r ≥ 0 up to r = {distance}"
        ax.set_title(f"base {base:.3g}, d = {head_dim}: {note}")

    def controls(self):
        """The ipywidgets controls, by parameter name."""
        import ipywidgets as w

        st = _style()
        return {
            **_base_head_dim(self.params, st),
            "distance": w.IntSlider(value=self.params["distance"], min=64, max=32768, step=64,
                                    description="max distance", style=st),
        }


class DriftExplorer(Explorer):
    """Dynamic-NTK phase error of cached keys at current length L (notebook 05).

    Args:
        **params: the view's parameters, those of :func:`ropelab.staleness.ntk_drift`
            (``defaults`` gives the static figure's).
    """

    name = "05_explore_drift"
    defaults = {"length": 1024, "head_dim": 64, "base": 10000.0, "original_length": 256, "factor": 4.0}
    size = (11.0, 3.6)

    def build(self, fig):
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure.
        """
        fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.88, wspace=0.25)
        self.ax = fig.subplots(1, 2, width_ratios=[1.4, 1])
        ax0, ax1 = self.ax
        self.im = ax0.imshow(np.zeros((2, 2)), aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=np.pi,
                             interpolation="nearest")
        fig.colorbar(self.im, ax=ax0, label="|phase error|, wrapped (rad)")
        ax0.set(xlabel="cached key position m", ylabel="pair i")
        (self.worst,) = ax1.semilogy([0, 1], [1e-12, 10], ".-", lw=1)
        ax1.axhline(np.pi / 2, color="C3", ls="--", lw=1)
        ax1.set(xlabel="pair i", ylabel="largest |phase error| over keys (rad)")

    def refresh(self, length, head_dim, base, original_length, factor):
        """Redraw the figure for these control values.

        The numbers are :func:`ropelab.staleness.ntk_drift`'s; a bad value raises its ValueError.

        Args:
            length: as in :func:`ropelab.staleness.ntk_drift`.
            head_dim: as in :func:`ropelab.staleness.ntk_drift`.
            base: as in :func:`ropelab.staleness.ntk_drift`.
            original_length: as in :func:`ropelab.staleness.ntk_drift`.
            factor: as in :func:`ropelab.staleness.ntk_drift`.
        """
        out = ntk_drift(length, head_dim, base, original_length, factor)
        ax0, ax1 = self.ax
        err = out["wrapped"]
        # Drawn at most 512 key columns wide (the maximum over each block of keys, so no large error
        # disappears): resampling the full [L, d/2] image cost more than computing it.
        block = -(-length // 512)
        pad = np.pad(err, ((0, (-length) % block), (0, 0)))
        self.im.set_data(pad.reshape(-1, block, err.shape[1]).max(1).T)
        self.im.set_extent((-0.5, length - 0.5, -0.5, head_dim // 2 - 0.5))
        ax0.set_title(f"L = {length} (L0 = {original_length}, s = {factor:g}): b(L) = {out['base_now']:.4g}")
        worst = np.abs(out["phase_error"]).max(0)
        self.worst.set_data(np.arange(head_dim // 2), np.maximum(worst, 1e-12))
        ax1.set_xlim(-0.5, head_dim // 2 - 0.5)
        ax1.set_ylim(1e-12, max(10.0, 3 * float(worst.max())))
        ax1.set_title(f"{100 * out['frac_over_half_pi']:.1f} % of (key, pair) phases turned by > π/2", fontsize=10)

    def controls(self):
        """The ipywidgets controls, by parameter name."""
        import ipywidgets as w

        st = _style()
        l0 = self.params["original_length"]
        return {
            "length": w.IntSlider(value=self.params["length"], min=1, max=int(4 * l0), step=1,
                                  description="current length L", style=st),
            "factor": w.FloatSlider(value=self.params["factor"], min=1, max=16, step=0.5,
                                    description="factor s", style=st),
        }


class ExtensionExplorer(Explorer):
    """What each context-extension method does to each pair at factor s (notebook 07).

    Args:
        **params: the view's parameters, those of :func:`ropelab.extend.extension_ratios`
            (``defaults`` gives the static figure's).
    """

    name = "07_explore_extension"
    defaults = {"factor": 4.0, "head_dim": 32, "base": 10000.0, "original_length": 256}
    size = (11.0, 3.8)
    _STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (1, 1)))

    def build(self, fig):
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure.
        """
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.86, wspace=0.28)
        self.ax = fig.subplots(1, 2)
        ax0, ax1 = self.ax
        names = list(ratio_table(4.0, 8, base=10000.0, original=64))
        self.lines = {n: ax0.semilogy([0, 1], [1, 1], marker=".", ls=self._STYLES[j % 6], lw=1.2, label=n)[0]
                      for j, n in enumerate(names)}
        self.reach = {n: ax1.semilogy([0, 1], [1, 1], marker=".", ls=self._STYLES[j % 6], lw=1.2, label=n)[0]
                      for j, n in enumerate(names)}
        self.crit = [ax.axvline(0, color="0.6", lw=1, ls=":") for ax in self.ax]
        ax1.axhline(1.0, color="C3", lw=1, ls="--")
        ax0.set(xlabel="pair i", ylabel="ω'_i / ω_i")
        ax1.set(xlabel="pair i", ylabel="largest angle at s·L0 / largest trained")
        ax0.legend(fontsize=7, loc="lower left")

    def refresh(self, factor, head_dim, base, original_length):
        """Redraw the figure for these control values.

        The numbers are :func:`ropelab.extend.extension_ratios`'s; a bad value raises its ValueError.

        Args:
            factor: as in :func:`ropelab.extend.extension_ratios`.
            head_dim: as in :func:`ropelab.extend.extension_ratios`.
            base: as in :func:`ropelab.extend.extension_ratios`.
            original_length: as in :func:`ropelab.extend.extension_ratios`.
        """
        out = extension_ratios(factor, head_dim, base, original_length)
        ax0, ax1 = self.ax
        i = np.arange(head_dim // 2)
        for name, line in self.lines.items():
            line.set_data(i, out["ratio"][name])
            self.reach[name].set_data(i, factor * out["ratio"][name])
        for line in self.crit:
            line.set_xdata([out["critical"] - 0.5] * 2)
        lo = min(float(r.min()) for r in out["ratio"].values())
        for ax, top in ((ax0, 1.0), (ax1, float(factor))):
            ax.set_xlim(-0.5, head_dim // 2 - 0.5)
            ax.set_ylim(lo / 1.5, top * 1.5)
        ax0.set_title(f"s = {factor:g}, d = {head_dim}, b = {base:.3g}, L0 = {original_length}", fontsize=10)
        bad = [n for n, p in out["out_of_range"].items() if p and n != "no scaling"]
        ax1.set_title("> 1 right of the dotted line: angles never trained on\n"
                      + ("out of range: " + ", ".join(bad) if bad else "no method leaves a pair out of range"),
                      fontsize=9)

    def controls(self):
        """The ipywidgets controls, by parameter name."""
        import ipywidgets as w

        st = _style()
        return {
            "factor": w.FloatSlider(value=self.params["factor"], min=1, max=32, step=0.5, description="factor s",
                                    style=st),
            "original_length": w.Dropdown(options=[256, 2048, 4096, 8192], value=self.params["original_length"],
                                          description="trained L0", style=st),
            **_base_head_dim(self.params, st),
        }


class CoPEExplorer(Explorer):
    """CoPE's gates and contextual positions on a typed sequence, with hand-set (untrained) q, k (notebook 04).

    Args:
        **params: the view's parameters, those of :func:`ropelab.cope.cope_gates`
            (``defaults`` gives the static figure's).
    """

    name = "04_explore_cope"
    defaults = {"text": "a b  c   d e", "count": "symbols (not blanks or punctuation)", "sharpness": 6.0}
    size = (11.0, 3.8)

    def build(self, fig):
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure.
        """
        fig.subplots_adjust(left=0.05, right=0.98, bottom=0.14, top=0.88, wspace=0.2)
        self.ax = fig.subplots(1, 2, width_ratios=[1.3, 1])
        ax0, ax1 = self.ax
        (self.gate,) = ax0.plot([], [], drawstyle="steps-mid", color="C0", label="gate g of the last query")
        (self.pos,) = ax0.plot([], [], "o-", color="C1", ms=3, label="CoPE position p")
        (self.dist,) = ax0.plot([], [], ":", color="0.4", label="token distance")
        ax0.set(xlabel="key")
        ax0.legend(fontsize=7, loc="upper right")
        self.im = ax1.imshow(np.zeros((2, 2)), cmap="viridis", interpolation="nearest", vmin=0, vmax=1)
        fig.colorbar(self.im, ax=ax1, label="p_ij")
        ax1.set(xlabel="key j", ylabel="query i")

    def refresh(self, text, count, sharpness):
        """Redraw the figure for these control values.

        The numbers are :func:`ropelab.cope.cope_gates`'s; a bad value raises its ValueError.

        Args:
            text: as in :func:`ropelab.cope.cope_gates`.
            count: as in :func:`ropelab.cope.cope_gates`.
            sharpness: as in :func:`ropelab.cope.cope_gates`.
        """
        out = cope_gates(text, count, sharpness)
        s = len(out["tokens"])
        ax0, ax1 = self.ax
        x = np.arange(s)
        self.gate.set_data(x, out["gates"][-1])
        self.pos.set_data(x, out["positions"][-1])
        self.dist.set_data(x, out["token_distance"][-1])
        ax0.set_xlim(-0.5, s - 0.5)
        ax0.set_ylim(0, max(s, 1) * 1.25)
        labels = ["␣" if c == " " else repr(c)[1:-1] for c in out["tokens"]]
        ax0.set_xticks(x if s <= 40 else [], labels if s <= 40 else [], fontsize=8)
        ax0.set_title(f"seen from the last token: {out['positions'][-1, 0]:.2f} counted, {s} tokens")
        p = np.where(np.tril(np.ones((s, s))) > 0, out["positions"], np.nan)
        self.im.set_data(p)
        self.im.set_extent((-0.5, s - 0.5, s - 0.5, -0.5))
        self.im.set_clim(0, max(float(np.nanmax(p)), 1e-9))
        ax1.set_title(f"contextual positions, counting {count}", fontsize=10)

    def controls(self):
        """The ipywidgets controls, by parameter name."""
        import ipywidgets as w

        st = _style()
        return {
            "text": w.Text(value=self.params["text"], description="sequence", style=st),
            "count": w.Dropdown(options=list(COUNT_RULES), value=self.params["count"], description="count", style=st),
            "sharpness": w.FloatSlider(value=self.params["sharpness"], min=0, max=20, step=0.5,
                                       description="gate sharpness", style=st),
        }


class BytesExplorer(Explorer):
    """The bytes each RoPE implementation moves at one shape, in units of a copy of q and k (notebook 06).

    Args:
        **params: the view's parameters, those of :func:`ropelab.kernels.traffic.bytes_view`
            (``defaults`` gives the static figure's).
    """

    name = "06_explore_bytes"
    defaults = {"batch": 1, "heads_q": 32, "heads_k": 8, "seq": 2048, "head_dim": 128, "dtype": "bfloat16"}
    size = (11.0, 3.6)
    _BARS = (("copy", "copy (reference)"), ("hf_eager", "HF eager"), ("fused", "fused, cos/sin once"),
             ("fused_issued", "fused, as issued"))

    def build(self, fig):
        """Lay out the figure's axes (called once).

        Args:
            fig: the explorer's own matplotlib Figure.
        """
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.86)
        self.ax = fig.subplots()
        x = np.arange(len(self._BARS))
        self.read = self.ax.bar(x, np.zeros(len(x)), color="C0", label="read")
        self.written = self.ax.bar(x, np.zeros(len(x)), color="C1", label="written")
        self.ax.axhline(1.0, color="0.3", ls=":", lw=1)
        self.ax.set_xticks(x, [label for _, label in self._BARS])
        self.ax.set(ylabel="bytes moved, in copies of q and k")
        self.ax.legend(loc="upper right")

    def refresh(self, batch, heads_q, heads_k, seq, head_dim, dtype):
        """Redraw the figure for these control values.

        The numbers are :func:`ropelab.kernels.traffic.bytes_view`'s; a bad value raises its ValueError.

        Args:
            batch: as in :func:`ropelab.kernels.traffic.bytes_view`.
            heads_q: as in :func:`ropelab.kernels.traffic.bytes_view`.
            heads_k: as in :func:`ropelab.kernels.traffic.bytes_view`.
            seq: as in :func:`ropelab.kernels.traffic.bytes_view`.
            head_dim: as in :func:`ropelab.kernels.traffic.bytes_view`.
            dtype: as in :func:`ropelab.kernels.traffic.bytes_view`.
        """
        out = bytes_view(batch, heads_q, heads_k, seq, head_dim, dtype)
        copy = sum(out["copy"])
        keys = [k for k, _ in self._BARS]
        if "hf_eager" not in out:
            raise ValueError("the Hugging Face bar needs transformers (the notebooks extra): "
                             "pip install -e '.[notebooks]'")
        for n, key in enumerate(keys):
            r, w = (v / copy for v in out[key])
            self.read[n].set_height(r)
            self.written[n].set_y(r)
            self.written[n].set_height(w)
        self.ax.set_ylim(0, 1.12 * max(sum(out[k]) / copy for k in keys))
        hf, fused = sum(out["hf_eager"]) / copy, sum(out["fused"]) / copy
        self.ax.set_title(f"q [{batch}, {heads_q}, {seq}, {head_dim}], k with {heads_k} heads, {dtype} (model): "
                          f"HF eager {hf:.2f}x a copy, {hf / fused:.2f}x the fused kernel; cos/sin as issued: "
                          f"{out['table_loads']} loads per row", fontsize=10)

    def controls(self):
        """The ipywidgets controls, by parameter name."""
        import ipywidgets as w

        st, p = _style(), self.params
        return {
            "heads_q": w.IntSlider(value=p["heads_q"], min=1, max=64, description="q heads", style=st),
            "heads_k": w.IntSlider(value=p["heads_k"], min=1, max=64, description="k heads", style=st),
            "batch": w.IntSlider(value=p["batch"], min=1, max=16, description="batch", style=st),
            "seq": w.IntSlider(value=p["seq"], min=16, max=8192, step=16, description="tokens", style=st),
            "head_dim": w.Dropdown(options=[64, 128, 256], value=p["head_dim"], description="head_dim", style=st),
            "dtype": w.Dropdown(options=list(BYTES_DTYPES), value=p["dtype"], description="dtype", style=st),
        }
