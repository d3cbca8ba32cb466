r"""Multi-axis RoPE: each rotary pair is driven by one of several position axes.

A token carries A positions (temporal, height, width for a video patch; row, column for an image
patch) instead of one. Pair i rotates by :math:`p_{a(i)}\,\omega_i`, where :math:`a(i)` is the axis that
drives pair i; everything else (the rotation, the styles, the tables' precision) is 1D RoPE's.
Two families differ in :math:`a(i)` and :math:`\omega_i`:

- **M-RoPE** (one frequency ladder across the head, split between the axes): Qwen2-VL's
  ``mrope_section`` gives each axis a *contiguous* run of pairs, e.g. ``[16, 24, 24]``: pairs 0-15 by t,
  16-39 by h, 40-63 by w (``Qwen2VLRotaryEmbedding.recomposition_frequencies`` in transformers'
  ``models/qwen2_vl/modeling_qwen2_vl.py``). Qwen3-VL *interleaves* them (``Qwen3VLTextRotaryEmbedding``
  in ``models/qwen3_vl/modeling_qwen3_vl.py``, sections ``[24, 20, 20]``): pair i goes to axis
  k >= 1 when :math:`i \bmod 3 = k` and :math:`i < 3 s_k`, to axis 0 otherwise, so every axis sees
  high and low frequencies. With all axes equal (a text token) both are exactly 1D RoPE.
- **Axial RoPE** (each axis its own full ladder over its 2 s_k dims): ViTs and diffusion transformers,
  e.g. Qwen3-VL's vision tower (``Qwen3VLVisionRotaryEmbedding``: ladder :math:`b^{-2j/(d/2)}` for rows,
  the same for columns), rotary-embedding-torch's ``get_axial_freqs``, FLUX's ``axes_dims_rope``.

``apply_rope(x, positions, layout=..., sections=MultiAxis(...))`` calls :func:`multiaxis_rope` with its
settings as one :class:`ropelab.spec.RopeSpec`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .core import Layout, check_positions, pair_indices, parse_layout, rotate, tables_for
from .scaling import frequencies
from .spec import RopeSpec

__all__ = ["MultiAxis", "per_layer_axes", "apply_multiaxis_rope", "multiaxis_rope", "axis_angles", "grid_positions",
           "flat_positions", "mrope_positions", "plot_axis_of_pair", "plot_positions"]


@dataclass(frozen=True)
class MultiAxis:
    r"""Which rotary pairs each position axis drives.

    ``sections[k]`` is the number of pairs axis k drives (they sum to the rotary pairs r/2);
    ``interleaved`` spreads them Qwen3-VL's way (pair i to axis i mod A while that axis has pairs left)
    instead of Qwen2-VL's contiguous runs; ``axial`` gives each axis its own frequency ladder
    :math:`b^{-2j/(2 s_k)}`, j < s_k (ViT / DiT axial RoPE) instead of one ladder across the head.
    ``blockwise`` (axial only, half pairing) lays axis k's pairs out in a contiguous block of its own
    :math:`2 s_k` dims, pair j of the block being dims :math:`(o_k + j, o_k + s_k + j)`, :math:`o_k = 2\sum_{l<k}
    s_l` (Gemma 4's vision tower: ``apply_multidimensional_rope`` splits the head into one block per axis and
    applies ``rotate_half`` to each), instead of the half pairing :math:`(i, i + r/2)` across the head.
    ``order`` (contiguous runs only) is the order of the axes' runs along the head, e.g. ``(1, 0)``: the column's
    run of pairs first, then the row's (Step3p5's vision tower flips (row, column) to (column, row) before laying
    out its angles); None is ``(0, 1, ...)``. ``sections[k]`` stays axis k's count.
    """

    sections: tuple[int, ...]
    interleaved: bool = False
    axial: bool = False
    blockwise: bool = False
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        s = self.sections
        if not isinstance(s, tuple) or not s or not all(isinstance(v, int) and v >= 0 for v in s):
            raise ValueError(f"sections must be a non-empty tuple of pair counts (ints >= 0), got {s!r}.")
        if self.order is not None:
            if not isinstance(self.order, tuple) or sorted(self.order) != list(range(len(s))):
                raise ValueError(f"order must be a tuple ordering the axes 0 .. {len(s) - 1} (e.g. (1, 0)), got "
                                 f"{self.order!r}.")
            if self.interleaved:
                raise ValueError("order lays out contiguous runs of pairs; interleaved sections have none.")
            if self.order == tuple(range(len(s))):
                object.__setattr__(self, "order", None)  # the default: one spelling per layout
        if self.interleaved and self.axial:
            raise ValueError("an axial spec has one ladder per axis; interleaving its pairs is not defined.")
        if self.blockwise and not self.axial:
            raise ValueError("blockwise lays out each axis' own ladder in a block of its own: give axial=True too.")
        if self.interleaved:
            # Qwen3-VL's rule gives axis k >= 1 the pairs k, k + A, ... below A s_k, axis 0 the rest: it
            # realises the sections only when every such pair exists.
            got = torch.bincount(self.axis_of_pair(), minlength=len(s)).tolist()
            if got != list(s):
                raise ValueError(f"interleaved sections {s} cannot be realised (pairs per axis would be {got}); "
                                 f"each sections[k] for k >= 1 needs {len(s)} * sections[k] <= sum(sections).")

    @classmethod
    def mrope(cls, sections: Sequence[int], *, interleaved: bool = False) -> MultiAxis:
        """M-RoPE from a config's ``mrope_section`` (Qwen2-VL contiguous; Qwen3-VL ``interleaved=True``)."""
        return cls(tuple(int(v) for v in sections), interleaved=interleaved)

    @classmethod
    def axial_dims(cls, dims: Sequence[int]) -> MultiAxis:
        """Axial RoPE with ``dims[k]`` head dims (even) per axis, e.g. FLUX's ``axes_dims_rope=(16, 56, 56)``."""
        if any(int(d) % 2 for d in dims):
            raise ValueError(f"each axis rotates pairs, so every axial dim must be even, got {tuple(dims)}.")
        return cls(tuple(int(d) // 2 for d in dims), axial=True)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> MultiAxis:
        """Read ``mrope_section`` (and ``mrope_interleaved``) from ``rope_parameters`` or ``rope_scaling``.

        transformers' Qwen3-VL code interleaves whatever ``mrope_interleaved`` says (it only lists the key
        among those it ignores), so a ``qwen3_vl*`` / ``qwen3_omni*`` ``model_type`` means interleaved too.
        """
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        params = get("rope_parameters") or get("rope_scaling") or {}
        if "mrope_section" not in params:
            raise ValueError("the config's rope_parameters/rope_scaling has no 'mrope_section'; not an M-RoPE model.")
        qwen3 = str(get("model_type") or "").startswith(("qwen3_vl", "qwen3_omni"))
        return cls.mrope(params["mrope_section"], interleaved=qwen3 or bool(params.get("mrope_interleaved", False)))

    @property
    def n_axes(self) -> int:
        """The number of position axes A."""
        return len(self.sections)

    @property
    def n_pairs(self) -> int:
        """The rotary pairs r/2 the sections cover."""
        return sum(self.sections)

    def axis_of_pair(self) -> torch.Tensor:
        """a(i) for every pair i: the axis whose position rotates pair i (int64, length r/2)."""
        a = len(self.sections)
        if not self.interleaved:
            runs = self._runs()
            return torch.repeat_interleave(torch.tensor(runs), torch.tensor([self.sections[k] for k in runs]))
        i = torch.arange(self.n_pairs)
        out = torch.zeros_like(i)
        for k in range(1, a):
            out[(i % a == k) & (i < a * self.sections[k])] = k
        return out

    def _runs(self) -> tuple[int, ...]:
        """The axes in the order of their runs of pairs along the head."""
        return self.order if self.order is not None else tuple(range(len(self.sections)))

    def pair_dims(self, rotary_dim: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The dims (a_i, b_i) of every pair i of a head whose first ``rotary_dim`` dims rotate: the style's pairing
        (``ropelab.core.pair_indices``), or, ``blockwise``, pair j of axis k at :math:`(o_k + j, o_k + s_k + j)`."""
        if not self.blockwise:
            return pair_indices(rotary_dim, style)
        if style != "half" or rotary_dim != 2 * self.n_pairs:
            raise ValueError(f"blockwise sections {self.sections} pair half within each axis' block of the "
                             f"{2 * self.n_pairs} rotating dims; got style {style!r}, rotary_dim {rotary_dim}.")
        sizes = [self.sections[k] for k in self._runs()]
        offsets = [2 * sum(sizes[:k]) for k in range(len(sizes))]
        a = torch.cat([o + torch.arange(n) for o, n in zip(offsets, sizes)])
        return a, a + torch.repeat_interleave(torch.tensor(sizes), torch.tensor(sizes))

    def inv_freq(self, base: float = 10000.0) -> torch.Tensor:
        r"""Per-pair frequencies (float64) of an axial spec: axis k's ladder :math:`b^{-2j/(2 s_k)}`."""
        if not self.axial:
            raise ValueError("only an axial spec has its own ladders; M-RoPE uses the head's one ladder.")
        return torch.cat([frequencies(2 * self.sections[k], base)[0].to(torch.float64) for k in self._runs()
                          if self.sections[k]])


def per_layer_axes(config: Mapping[str, Any] | Any) -> tuple[tuple[RopeSpec, MultiAxis], ...]:
    """One ``(RopeSpec, MultiAxis)`` per layer of a vision tower's config (a ``PretrainedConfig`` or its
    ``to_dict()``) whose RoPE is multi-axis: ``apply_rope(x, positions [A, s], spec=spec, sections=sections)``
    rotates as transformers' code does, at each patch's (row, column) or (frame, row, column).

    Read: ``rope_parameters``' ``rope_theta`` (the base; its ``rope_type`` must be ``axial``, the vision towers'
    own, or ``default``), the layers (``num_hidden_layers``, else ``depth``), the head
    (``head_dim``, else ``embed_dim`` or ``hidden_size`` over ``num_heads`` or ``num_attention_heads``). What the
    config does not say, the pairing and which pairs each axis drives, is the convention table's entry of its
    ``model_type`` (``ropelab.conformance.hf_table``, measured on transformers' code by ``python -m
    ropelab.conformance``: its ``axes``), its sections scaled from the measured head to this one, and its layer
    types without RoPE (``nope_layer_types``: those layers get ``(RopeSpec.nope(), None)``). A model type
    measured as 1D RoPE, or not in the table, raises ValueError."""
    from .spec import measured_conventions

    config, conv = measured_conventions(config)

    def _get(c, key):
        return c.get(key) if isinstance(c, Mapping) else getattr(c, key, None)

    def _need(c, key):
        if _get(c, key) is None:
            raise ValueError(f"the vision config has no {key!r}; a vision tower's config states it.")
        return _get(c, key)

    axes = conv.get("axes")
    if axes is None:
        raise ValueError(f"model type {_get(config, 'model_type')!r} rotates by one position axis in transformers' "
                         "code (measured): read it with RopeSpec.per_layer.")
    params = _get(config, "rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_parameters must be a dict such as {{'rope_type': 'axial', 'rope_theta': 1e4}}, got "
                         f"{type(params).__name__}.")
    kind = params.get("rope_type", "default")
    if kind not in ("axial", "default"):
        raise ValueError(f"rope_type {kind!r}: a vision tower's multi-axis RoPE is read for 'axial' (or 'default') "
                         "only; transformers' vision rotaries refuse a scaling too.")
    base = params.get("rope_theta", _get(config, "rope_theta"))
    if base is None:
        base = conv.get("fixed_base", conv.get("measured_base"))
    n_layers = _get(config, "num_hidden_layers") or _need(config, "depth")
    head_dim = _get(config, "head_dim")
    if head_dim is None:
        width = _get(config, "embed_dim") or _need(config, "hidden_size")
        heads = _get(config, "num_heads") or _need(config, "num_attention_heads")
        for key, v in (("width", width), ("heads", heads), ("layers", n_layers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"the vision config's {key} must be an int >= 1, got {v!r}.")
        if width % heads:
            raise ValueError(f"the vision width {width} is not a multiple of its {heads} heads; give head_dim.")
        head_dim = width // heads
    for key, v in (("head_dim", head_dim), ("layers", n_layers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"the vision config's {key} must be an int >= 1, got {v!r}.")
    measured = list(axes["sections"])
    pairs = int(head_dim * conv.get("rotary_fraction", 1.0)) // 2
    scaled = [k * pairs / sum(measured) for k in measured]
    if any(v != int(v) for v in scaled):
        raise ValueError(f"the measured sections {measured} of model type {_get(config, 'model_type')!r} do not "
                         f"scale to {pairs} pairs (head_dim {head_dim}).")
    sections = MultiAxis(tuple(int(v) for v in scaled), interleaved=bool(axes.get("interleaved")),
                         axial=bool(axes.get("axial")), blockwise=bool(axes.get("blockwise")),
                         order=tuple(axes["order"]) if axes.get("order") is not None else None)
    spec = RopeSpec(style=conv["style"], base=float(base), rotary_dim=None if 2 * pairs == head_dim else 2 * pairs)
    # Layer types without RoPE (LFM3-VL's vision "conv" layers: measured, no rotation call there)
    types = _get(config, "layer_types")
    nope_types = set(conv.get("nope_layer_types", ()))
    if types is not None and (isinstance(types, (str, bytes, Mapping)) or not isinstance(types, Sequence)
                              or len(types) != n_layers):
        raise ValueError(f"layer_types must be a list of {n_layers} layer type names, got {types!r}.")
    return tuple((RopeSpec.nope(), None) if types is not None and types[i] in nope_types else (spec, sections)
                 for i in range(n_layers))


def _positions(positions: Any, sections: MultiAxis, sizes: dict[str, int]) -> torch.Tensor:
    p = check_positions(positions)
    a, s, b = sections.n_axes, sizes["s"], sizes.get("b")
    fits = p.ndim == 2 and p.shape == (a, s) or p.ndim == 3 and b is not None and p.shape == (a, b, s)
    if p.ndim in (2, 3) and p.shape[0] != a:
        raise ValueError(
            f"positions have {p.shape[0]} axes (dim 0) but the sections {sections.sections} name {a}; give one "
            f"row of positions per axis, shape ({a}, s) or ({a}, b, s)."
        )
    if not fits:
        want = f"({a}, {s})" + (f" or ({a}, {b}, {s})" if b is not None else "")
        raise ValueError(f"multi-axis positions must have shape {want} (axis, [batch,] seq), got {tuple(p.shape)}.")
    return p


def axis_angles(positions: torch.Tensor, sections: MultiAxis, inv_freq: torch.Tensor, *,
                angle_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    r"""Angles :math:`p_{a(i)}\,\omega_i`, shape ``positions.shape[1:] + [r/2]``, in ``angle_dtype``."""
    if inv_freq.numel() != sections.n_pairs:
        raise ValueError(
            f"the sections {sections.sections} sum to {sections.n_pairs} pairs but RoPE rotates {inv_freq.numel()} "
            f"pairs here (rotary_dim / 2); make the sections sum to {inv_freq.numel()}."
        )
    picked = positions.to(angle_dtype)[sections.axis_of_pair()].movedim(0, -1)  # [..., s, r/2]
    return picked * inv_freq.to(device=positions.device, dtype=angle_dtype)


def multiaxis_rope(
    x: torch.Tensor,
    layout: Layout,
    positions: Any,
    sections: MultiAxis,
    spec: RopeSpec,
    *,
    angle_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    r"""``apply_rope(x, positions, sections=..., spec=...)`` once x's layout is parsed: pair i of x rotates
    by :math:`p_{a(i)}\,\omega_i`.

    ``positions`` is [A, s] or [A, b, s] (A = ``sections.n_axes``); the layout must have an ``s`` axis. The
    ladder is the head's (``spec.frequencies``) for M-RoPE, or ``sections.inv_freq(spec.base)`` for an
    axial spec (then ``spec.rotary_dim`` is None or 2 * sections.n_pairs, and ``spec.scaling`` None). The
    sections must sum to the rotary pairs.
    """
    if not isinstance(sections, MultiAxis):
        raise ValueError(f"sections must be a ropelab.multiaxis.MultiAxis, got {type(sections).__name__}.")
    if "s" not in layout.axes:
        raise ValueError(f"multi-axis positions run along a sequence axis 's'; layout '{layout}' has none.")
    sizes = {a: x.shape[layout.index(a)] for a in layout.axes}
    p = _positions(positions, sections, sizes)
    d = sizes["d"]
    if sections.axial:
        if spec.scaling is not None:
            raise ValueError("rope_scaling applies to one ladder; an axial spec has its own ladders (give None).")
        inv_freq, factor = sections.inv_freq(spec.base), 1.0
        if spec.rotary_dim not in (None, 2 * sections.n_pairs) or 2 * sections.n_pairs > d:
            raise ValueError(f"the axial sections {sections.sections} rotate {2 * sections.n_pairs} dims; head dim "
                             f"{d}, rotary_dim {spec.rotary_dim}.")
    else:
        inv_freq, factor = spec.frequencies(d)
    angles = axis_angles(p, sections, inv_freq, angle_dtype=angle_dtype)  # [s, r/2] or [b, s, r/2]
    cdt = torch.promote_types(x.dtype, torch.float32)
    cos, sin = (torch.cos(angles) * factor).to(cdt), (torch.sin(angles) * factor).to(cdt)
    cos, sin = tables_for(x, layout, cos, sin, ("b", "s") if p.ndim == 3 else ("s",))
    d_idx = layout.index("d")
    xd = x.movedim(d_idx, -1)
    if not sections.blockwise:
        return rotate(xd, cos, sin, style=spec.style).movedim(-1, d_idx)
    # Blockwise: gather each pair's dims into the half layout (a_i, then b_i), rotate, and scatter back.
    a, b = sections.pair_dims(2 * sections.n_pairs, spec.style)
    perm = torch.cat([a, b, torch.arange(2 * sections.n_pairs, d)]).to(x.device)
    out = torch.empty_like(xd)
    out[..., perm] = rotate(xd[..., perm], cos, sin, style="half")
    return out.movedim(-1, d_idx)


def apply_multiaxis_rope(
    x: torch.Tensor,
    positions: Any,
    sections: MultiAxis,
    *,
    layout: str,
    style: str = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    angle_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    r"""RoPE with multi-axis positions: pair i of x rotates by :math:`p_{a(i)}\,\omega_i`.

    ``positions`` is [A, s] or [A, b, s] (A = ``sections.n_axes``); ``layout`` names x's axes and must have an
    ``s`` axis. The ladder is the head's (``base``, ``rotary_dim``, ``rope_scaling`` as in
    :func:`ropelab.apply_rope`) for M-RoPE, or ``sections.inv_freq(base)`` for axial sections (then
    ``rotary_dim`` defaults to 2 * sections.n_pairs). The sections must sum to the rotary pairs.
    The keyword form of :func:`multiaxis_rope`; ``apply_rope(..., sections=sections)`` is the same call.
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}.")
    lay = parse_layout(layout, x.ndim)
    rope = RopeSpec.from_keywords(x.shape[lay.index("d")], style=style, base=base, rotary_dim=rotary_dim,
                                  rope_scaling=rope_scaling)
    return multiaxis_rope(x, lay, positions, sections, rope, angle_dtype=angle_dtype)


def grid_positions(*sizes: int, start: int = 0) -> torch.Tensor:
    """Positions of a row-major grid of patches, [len(sizes), prod(sizes)]: (frame, row, column) or (row, column)."""
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"grid sizes must be ints >= 1, got {sizes!r}.")
    mesh = torch.meshgrid(*[torch.arange(n) for n in sizes], indexing="ij")
    return torch.stack([m.reshape(-1) for m in mesh]) + start


def flat_positions(*sizes: int, start: int = 0) -> torch.Tensor:
    """The 1D positions start, start + 1, ... a flattened grid would get, shape [prod(sizes)]."""
    return grid_positions(*sizes).new_tensor(range(start, start + int(torch.tensor(sizes).prod())))


def mrope_positions(*segments: int | Sequence[int]) -> torch.Tensor:
    """M-RoPE's (t, h, w) positions, [3, s], for a sequence of text runs (an int: that many tokens) and images or
    videos (a (frames, rows, columns) grid), numbered as Qwen2-VL's ``get_rope_index`` numbers them (transformers'
    ``Qwen2VLModel.get_rope_index``, a test holds the two equal): a text token gets its index on all three axes;
    a grid starting at index ``start`` gets ``start`` + (frame, row, column); whatever follows starts at the
    largest position so far + 1, so text after an image of w columns resumes at ``start + max(rows, columns)``,
    not at ``start`` + the image's token count. (Videos: Qwen2-VL spaces frames by its ``tokens_per_second``;
    here frames are 1 apart.)"""
    if not segments:
        raise ValueError("give at least one segment: an int (text tokens) or a (frames, rows, columns) grid.")
    parts, start = [], 0
    for seg in segments:
        if isinstance(seg, int) and not isinstance(seg, bool):
            if seg < 1:
                raise ValueError(f"a text segment needs at least 1 token, got {seg}.")
            part = torch.arange(start, start + seg).expand(3, -1)
        elif isinstance(seg, Sequence) and len(seg) == 3:
            part = grid_positions(*(int(n) for n in seg)) + start
        else:
            raise ValueError(f"a segment is an int (text tokens) or a (frames, rows, columns) grid, got {seg!r}.")
        parts.append(part)
        start = int(part.max()) + 1
    return torch.cat(parts, 1)


def _palette(n: int) -> list:
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]  # setup() sets seaborn's colour-blind palette
    return colors[:n]


def plot_axis_of_pair(ax, sections: MultiAxis, names: Sequence[str], title: str = "") -> None:
    """A strip of which axis drives each pair of ``sections``, one cell per pair, in the colour-blind palette that
    ``figures.setup()`` sets, with the axis name written in every cell (colour is never the only cue)."""
    from matplotlib.colors import ListedColormap

    if len(names) != sections.n_axes:
        raise ValueError(f"names has {len(names)} entries for {sections.n_axes} axes; give one name per axis.")
    axes = sections.axis_of_pair()
    ax.imshow(axes[None], cmap=ListedColormap(_palette(sections.n_axes)), aspect="auto", vmin=0,
              vmax=sections.n_axes - 1)
    for i, a in enumerate(axes.tolist()):
        ax.text(i, 0, names[a], ha="center", va="center", color="white", fontweight="bold",
                fontsize=7 if sections.n_pairs > 40 else 9)
    ax.grid(False)
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)


def plot_positions(axes, positions: torch.Tensor, names: Sequence[str] = ("t", "h", "w")) -> None:
    """One row per axis of ``positions`` [A, s] (e.g. :func:`mrope_positions`): each token's position on that axis
    against its index in the sequence, markers and colours per axis (colour-blind palette)."""
    if len(axes) != positions.shape[0] or len(names) != positions.shape[0]:
        raise ValueError(f"need one axes and one name per position axis ({positions.shape[0]}), got {len(axes)} "
                         f"axes and {len(names)} names.")
    idx = torch.arange(positions.shape[1])
    for ax, row, name, color, marker in zip(axes, positions, names, _palette(len(names)), "os^"):
        ax.plot(idx, row, marker, color=color, ms=3, label=name)
        ax.plot(idx, idx, color="0.6", lw=0.8, ls=":")  # where 1D RoPE would put the token
        ax.set_ylabel(f"{name} position")
    axes[0].legend(["M-RoPE", "1D position (token index)"], fontsize=7, loc="upper left")
    axes[-1].set_xlabel("token index in the sequence")
