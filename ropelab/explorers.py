r"""Interactive explorers for the notebooks: sliders over the package's own functions, with a static figure.

Each explorer is three layers, so that what it shows is tested like the rest of the package:

- a pure compute function (``ladder``, ``decay``, ``ntk_drift``, ``extension_ratios``, ``cope_gates``) that returns
  the numbers drawn, from :mod:`ropelab.scaling`, :mod:`ropelab.precision`, :mod:`ropelab.decay`,
  :mod:`ropelab.kvcache`, :mod:`ropelab.extend` and :mod:`ropelab.cope`;
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

An update (compute, draw, PNG) takes well under 200 ms on two CPU cores at the sizes the sliders allow
(``tests/test_explorers.py`` measures it).
"""

from __future__ import annotations

import functools
import html
import io
import math
import os
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .cope import CoPE
from .decay import decay_envelope, rope_logits, similarity_bound
from .extend import out_of_range_pairs, ratio_table
from .kvcache import RopeSchedule
from .machine import one_thread
from .precision import PRECISION_DTYPES, perturbed_angle, wrap_angle
from .precision import phase_error as precision_phase_error
from .scaling import check_base, critical_pair, frequencies
from .spec import RopeSpec
from .staleness import stale_phase_error

__all__ = [
    "DTYPES",
    "COUNT_RULES",
    "ladder",
    "decay",
    "ntk_drift",
    "extension_ratios",
    "cope_gates",
    "Explorer",
    "LadderExplorer",
    "DecayExplorer",
    "DriftExplorer",
    "ExtensionExplorer",
    "CoPEExplorer",
]

DTYPES = ("float64", "float32", "bfloat16", "float16")
_TORCH_DTYPES = {"float32": PRECISION_DTYPES["fp32"], "bfloat16": PRECISION_DTYPES["bf16"],
                 "float16": PRECISION_DTYPES["fp16"]}




def _check_int(name: str, value, low: int, high: int | None = None, even: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low or (high and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {span}, got {value!r}.")
    if even and value % 2:
        raise ValueError(f"{name} must be even (RoPE rotates pairs of dims), got {value}.")
    return int(value)


def _check_base(base) -> float:
    check_base(base)
    return float(base)


# --------------------------------------------------------------------------------------------------
# Pure compute functions
# --------------------------------------------------------------------------------------------------


def ladder(base: float = 10000.0, head_dim: int = 64, position: int = 100, dtype: str = "float32") -> dict:
    r"""The frequency ladder and the rotation of every pair at one position.

    Returns float64 numpy arrays over the pairs i = 0 .. d/2 - 1: ``inv_freq`` :math:`\omega_i = b^{-2i/d}`,
    ``wavelength`` :math:`2\pi/\omega_i` (positions per full turn), ``angle`` :math:`m\,\omega_i` (exact,
    float64), ``angle_dtype`` (the same angle when positions, frequencies and their product are held in
    ``dtype``, :func:`ropelab.precision.phase_error` with ``where="all"``), ``phase_error`` (its wrapped
    distance from the exact angle, rad), and ``turned`` (whether pair i has completed one turn by
    ``position``: :math:`m\,\omega_i \ge 2\pi`).
    """
    base = _check_base(base)
    head_dim = _check_int("head_dim", head_dim, 2, 4096, even=True)
    position = _check_int("position", position, 0, 1 << 24)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
    inv = frequencies(head_dim, base)[0]
    pos = torch.tensor([position])
    angle = (pos.double()[:, None] * inv[None, :])[0]
    if dtype == "float64":
        held, err = angle, torch.zeros_like(angle)
    else:
        held = perturbed_angle(pos, inv, where="all", dtype=_TORCH_DTYPES[dtype])[0]
        err = precision_phase_error(pos, inv, where="all", dtype=_TORCH_DTYPES[dtype])[0]
    return {
        "inv_freq": inv.numpy(),
        "wavelength": (2 * math.pi / inv).numpy(),
        "angle": angle.numpy(),
        "angle_dtype": held.numpy(),
        "phase_error": err.numpy(),
        "turned": (angle >= 2 * math.pi).numpy(),
    }


def decay(base: float = 10000.0, head_dim: int = 128, distance: int = 4096, n_points: int = 256, n_pairs: int = 64,
          seed: int = 0) -> dict:
    r"""RoFormer's decay envelope against what the logit actually does, over distances 0 .. ``distance``.

    Returns float64 numpy arrays over ``n_points`` distances ``r``: ``envelope``
    (:func:`ropelab.decay.decay_envelope`), ``aligned`` (:math:`2B_r`, the logit of all-ones q = k and the
    mean logit of a key similar to its query, :func:`ropelab.decay.similarity_bound` times 2), and for
    ``n_pairs`` independent standard-normal q, k (seeded) the ``gaussian_mean`` and ``gaussian_std`` of
    :math:`\langle R_r q, k\rangle` (:func:`ropelab.decay.rope_logits`): mean 0 and spread
    :math:`\sqrt d` at every distance, no decay. ``first_negative`` is the first integer distance
    :math:`r \le` ``distance`` where :math:`B_r < 0` (None if none), found on every integer, not on the
    plotted grid (whose step would miss a short dip: at base 1e4, d = 128 the first is 1707).
    """
    base = _check_base(base)
    head_dim = _check_int("head_dim", head_dim, 2, 1024, even=True)
    distance = _check_int("distance", distance, 1, 1 << 20)
    n_points = _check_int("n_points", n_points, 2, 10000)
    n_pairs = _check_int("n_pairs", n_pairs, 2, 4096)
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
        "first_negative": _first_negative(base, head_dim, distance),
    }


@functools.lru_cache(maxsize=256)
def _first_negative(base: float, head_dim: int, distance: int, chunk: int = 4096) -> int | None:
    """The first integer r <= distance with B_r < 0, scanned in chunks that stop at the first hit."""
    for start in range(0, distance + 1, chunk):
        b = similarity_bound(torch.arange(start, min(start + chunk, distance + 1)), head_dim, base)
        neg = (b < 0).nonzero()
        if neg.numel():
            return start + int(neg[0, 0])
    return None


def ntk_drift(length: int = 1024, head_dim: int = 64, base: float = 10000.0, original_length: int = 256,
              factor: float = 4.0) -> dict:
    r"""Dynamic NTK's stale keys at current length L (Hugging Face's ``post_rope`` cache, decoding one token
    per step from a prompt of one token).

    Returns ``phase_error`` [L, d/2] (float64, rad): key m rotated at its write length against the query's
    frame at L, :func:`ropelab.staleness.stale_phase_error` (unwrapped: it grows with m); ``wrapped``: its size
    folded onto [0, pi], the angle by which the pair's contribution to the score is actually turned;
    ``base_now`` :math:`b(L)`; and ``frac_over_half_pi``: the fraction of (key, pair) phases whose wrapped
    error exceeds :math:`\pi/2`, i.e. whose :math:`\cos\varepsilon < 0`: the pair's contribution has
    changed sign.
    """
    length = _check_int("length", length, 1, 1 << 16)
    head_dim = _check_int("head_dim", head_dim, 2, 1024, even=True)
    original_length = _check_int("original_length", original_length, 1)
    base = _check_base(base)
    if not isinstance(factor, int | float) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1 (dynamic NTK's scaling factor s), got {factor!r}.")
    spec = RopeSpec(base=base, scaling={"rope_type": "dynamic", "factor": float(factor)},
                    max_position_embeddings=original_length)
    sched = RopeSchedule(spec, head_dim)
    err = stale_phase_error(sched, length)
    wrapped = wrap_angle(err).abs()
    return {
        "phase_error": err.numpy(),
        "wrapped": wrapped.numpy(),
        "base_now": sched.base_at(length),
        "frac_over_half_pi": float((wrapped > math.pi / 2).double().mean()),
    }


def extension_ratios(factor: float = 4.0, head_dim: int = 32, base: float = 10000.0,
                     original_length: int = 256) -> dict:
    r"""Every context-extension method at factor s (:func:`ropelab.extend.ratio_table`, evaluated at
    :math:`sL_0`): ``ratio[name]`` :math:`\omega_i'/\omega_i` per pair (float64 numpy), ``attention_factor[name]``,
    ``out_of_range[name]`` (the pairs that meet angles never trained on,
    :func:`ropelab.extend.out_of_range_pairs`) and ``critical`` (the first pair that never turns within
    :math:`L_0`, :func:`ropelab.scaling.critical_pair`)."""
    head_dim = _check_int("head_dim", head_dim, 4, 1024, even=True)
    original_length = _check_int("original_length", original_length, 8)
    base = _check_base(base)
    if not isinstance(factor, int | float) or not 1 <= factor <= 1024:
        raise ValueError(f"factor must be a number in [1, 1024] (the extension factor s), got {factor!r}.")
    table = ratio_table(float(factor), head_dim, original=original_length, base=base)
    return {
        "ratio": {k: np.asarray(v["ratio"]) for k, v in table.items()},
        "attention_factor": {k: v["attention_factor"] for k, v in table.items()},
        "out_of_range": {k: out_of_range_pairs(v["ratio"], float(factor), head_dim, base, original_length)
                         for k, v in table.items()},
        "critical": critical_pair(head_dim, base, original_length),
    }


def _vowel(c: str) -> bool:
    return c.lower() in "aeiou"


COUNT_RULES = {
    "symbols (not blanks or punctuation)": lambda c: c.isalnum(),
    "vowels": _vowel,
    "spaces (word boundaries)": lambda c: c.isspace(),
    "every token": lambda c: True,
}


def cope_gates(text: str, count: str = "symbols (not blanks or punctuation)", sharpness: float = 6.0,
               npos_max: int = 64) -> dict:
    r"""CoPE's gates and contextual positions on a typed sequence, one token per character.

    The CoPE layer is :class:`ropelab.cope.CoPE` (``positions``); its queries and keys are **set by hand,
    not trained**: every key is :math:`k_j = (f_j, 1)` with :math:`f_j = 1` when character j matches the
    ``count`` rule (:data:`COUNT_RULES`) and 0 otherwise, every query is
    :math:`q = \sqrt 2\,s\,(2, -1)`, so the gate is :math:`\sigma(s\,(2f_j - 1))`: about 1 on the tokens
    counted and about 0 on the others for a large sharpness s. The contextual position of key j seen from
    query i is :math:`p_{ij} = \sum_{k=j}^{i} g_{ik}` (clamped at ``npos_max - 1``).

    Returns ``tokens`` (the characters), ``gates`` and ``positions`` [s, s] (float64, causal: zero above
    the diagonal), and ``token_distance`` [s, s] (:math:`i - j + 1`, what RoPE or an absolute encoding
    would count).
    """
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty string (one token per character), e.g. 'a b  c'.")
    if len(text) > 256:
        raise ValueError(f"text must be at most 256 characters (the plots draw one cell per pair), got {len(text)}.")
    if count not in COUNT_RULES:
        raise ValueError(f"count must be one of {list(COUNT_RULES)}, got {count!r}.")
    if not isinstance(sharpness, int | float) or not 0 <= sharpness <= 50:
        raise ValueError(f"sharpness must be a number in [0, 50] (0: every gate is 1/2), got {sharpness!r}.")
    npos_max = _check_int("npos_max", npos_max, 2, 4096)
    s = len(text)
    f = torch.tensor([float(COUNT_RULES[count](c)) for c in text], dtype=torch.float64)
    keys = torch.stack([f, torch.ones(s, dtype=torch.float64)], dim=-1)  # [s, 2]
    q = (math.sqrt(2) * sharpness * torch.tensor([2.0, -1.0], dtype=torch.float64)).expand(s, 2)
    layer = CoPE(npos_max, head_dim=2).double()
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    with torch.no_grad():
        gates, p = layer.positions(q[None, None], (q @ keys.T)[None, None], mask)
    i, j = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
    return {
        "tokens": list(text),
        "gates": gates[0, 0].numpy(),
        "positions": p[0, 0].numpy(),
        "token_distance": ((i - j + 1) * mask).double().numpy(),
    }


# --------------------------------------------------------------------------------------------------
# Figures and widgets
# --------------------------------------------------------------------------------------------------


class Explorer:
    """One figure redrawn from a compute function. Subclasses set ``name`` (the file stem), ``defaults``
    (the parameters of the static figure) and ``size``, and implement ``build(fig)`` (axes and empty
    artists, once), ``refresh(**params)`` (new data into those artists: far cheaper than new axes, whose
    ticks dominate a redraw) and ``controls()`` (a dict of ipywidgets keyed by parameter name)."""

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
        """Lay out the figure's axes (called once)."""
        raise NotImplementedError

    def refresh(self, **params) -> None:  # pragma: no cover - abstract
        """Redraw the figure for these control values."""
        raise NotImplementedError

    def controls(self) -> dict:  # pragma: no cover - abstract
        """The ipywidgets controls, by parameter name."""
        raise NotImplementedError

    def render(self, **params) -> Figure:
        """Redraw the figure for ``params`` (merged into the current ones) and return it."""
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(f"unknown parameters {sorted(unknown)}; choose from {sorted(self.defaults)}.")
        new = {**self.params, **params}
        with one_thread():
            self.refresh(**new)  # raises ValueError on bad input before self.params changes
        self.params = new
        return self.fig

    def update(self, **params) -> bytes:
        """Redraw and return the figure as PNG bytes (what the widget shows)."""
        self.render(**params)
        buf = io.BytesIO()
        # zlib level 1: the encoder took 40 % of an update at the default level 6; the file is ~1.5x larger
        self.fig.savefig(buf, format="png", pil_kwargs={"compress_level": 1})
        return buf.getvalue()

    def save(self, figures_dir: str | os.PathLike) -> list[Path]:
        """Write the default view as ``<name>.png`` and ``.svg`` into ``figures_dir`` (byte-stable, like
        :func:`ropelab.figures.save`), for readers without a live kernel."""
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
    """The frequency ladder and the rotation of four pairs at one position (notebook 00)."""

    name = "00_explore_ladder"
    defaults = {"base": 10000.0, "head_dim": 64, "position": 100, "dtype": "bfloat16"}
    size = (11.0, 3.5)
    _PAIRS = ("0", "d/8", "d/4", "d/2-1")

    def build(self, fig):
        """Lay out the figure's axes (called once)."""
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
        """Redraw the figure for these control values."""
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
    """RoFormer's envelope against Gaussian and aligned q, k (notebook 03)."""

    name = "03_explore_decay"
    defaults = {"base": 10000.0, "head_dim": 128, "distance": 4096}
    size = (10.0, 3.6)

    def build(self, fig):
        """Lay out the figure's axes (called once)."""
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
        """Redraw the figure for these control values."""
        out = decay(base, head_dim, distance)
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
    """Dynamic-NTK phase error of cached keys at current length L (notebook 05)."""

    name = "05_explore_drift"
    defaults = {"length": 1024, "head_dim": 64, "base": 10000.0, "original_length": 256, "factor": 4.0}
    size = (11.0, 3.6)

    def build(self, fig):
        """Lay out the figure's axes (called once)."""
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
        """Redraw the figure for these control values."""
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
    """What each context-extension method does to each pair at factor s (notebook 07)."""

    name = "07_explore_extension"
    defaults = {"factor": 4.0, "head_dim": 32, "base": 10000.0, "original_length": 256}
    size = (11.0, 3.8)
    _STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (1, 1)))

    def build(self, fig):
        """Lay out the figure's axes (called once)."""
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
        """Redraw the figure for these control values."""
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
    """CoPE's gates and contextual positions on a typed sequence, with hand-set (untrained) q, k (notebook 04)."""

    name = "04_explore_cope"
    defaults = {"text": "a b  c   d e", "count": "symbols (not blanks or punctuation)", "sharpness": 6.0}
    size = (11.0, 3.8)

    def build(self, fig):
        """Lay out the figure's axes (called once)."""
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
        """Redraw the figure for these control values."""
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
