r"""The notebooks' explorers as browser widgets: the compute in JavaScript, so they respond with no kernel.

Each explorer is one plain ES module under ``static/`` (no library, no network) holding

- ``compute(params)``: the Python package's closed form, in float64 (``Math.fround`` and an exact bit-level
  rounding stand in for float32, bfloat16 and float16 where the explorer holds an angle in them);
- ``summary(params)``: the number the Python explorer prints in its titles;
- ``default.render({model, el})``: sliders, an SVG (or canvas) figure and that printed number, redrawn on every
  slider input. ``model`` is anywidget's (``get``, ``set``, ``on``, ``save_changes``).

The seven explorers, by name (the JS file is ``static/<name>.js``; all import ``static/common.js``):

========== ============================================= ================================================
name       what it draws                                 the Python compute it mirrors
========== ============================================= ================================================
ladder     frequency ladder, four pairs, dtype rounding  :func:`ropelab.precision.ladder`
rotation   one pair's rotation, q at m and k at n        :func:`ropelab.reference_matrix` on one pair
decay      decay envelope and :math:`2B_r`               :func:`ropelab.decay.decay_view`
drift      dynamic NTK's stale-key phase                 :func:`ropelab.staleness.ntk_drift`
extension  per-pair extension ratios                     :func:`ropelab.extend.extension_ratios`
cope       CoPE's gates with hand-set q and k            :func:`ropelab.cope.cope_gates`
bytes      bytes per RoPE implementation, in copies      :func:`ropelab.kernels.traffic.bytes_view`
========== ============================================= ================================================

Two ways to show one:

- in JupyterLab (a kernel, ``anywidget`` from the ``notebooks`` extra): ``LadderWidget(position=500)``; its
  traitlets are the slider state, synced both ways, and ``compute()`` runs the Python package on that state;
- on a static page (no kernel): ``embed_html("ladder", base_url="_static/explorers/", position=500)`` returns a
  ``<div>`` and a ``<script type="module">`` that imports ``<base_url>ladder.js`` and renders it with a small
  local model; copy :func:`static_files` to ``base_url`` (the site build does). A page opened from disk
  (``file://``) cannot import modules in Chromium: ``embed_html(..., inline=True)`` puts the module in the
  snippet instead, and needs no file beside it.

The one exception to "the same numbers": the decay explorer's Gaussian band is the closed form
(mean 0, spread :math:`\sqrt d`) rather than the Python explorer's seeded sample of 64 pairs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

__all__ = ["NAMES", "STATE", "WIDGETS", "static_dir", "static_files", "esm", "embed_html", "widget"]

STATIC = Path(__file__).parent / "static"

# Every explorer's state (the traitlets, the JS module's DEFAULTS): name -> {trait: default}. The traitlet type
# follows the default's Python type (float, int, str, list of two floats).
STATE: dict[str, dict] = {
    "ladder": {"base": 10000.0, "head_dim": 64, "position": 100, "dtype": "bfloat16"},
    "rotation": {"theta": 0.3, "position": 0, "distance": 5, "q": [1.0, 0.3], "k": [0.2, 1.0]},
    "decay": {"base": 10000.0, "head_dim": 128, "distance": 4096},
    "drift": {"length": 1024, "head_dim": 64, "base": 10000.0, "original_length": 256, "factor": 4.0},
    "extension": {"factor": 4.0, "head_dim": 32, "base": 10000.0, "original_length": 256},
    "cope": {"text": "a b  c   d e", "count": "symbols (not blanks or punctuation)", "sharpness": 6.0},
    "bytes": {"batch": 1, "heads_q": 32, "heads_k": 8, "seq": 2048, "head_dim": 128, "dtype": "bfloat16"},
}
NAMES = tuple(STATE)
WIDGETS = {"ladder": "LadderWidget", "rotation": "RotationWidget", "decay": "DecayWidget", "drift": "DriftWidget",
           "extension": "ExtensionWidget", "cope": "CoPEWidget", "bytes": "BytesWidget"}


def _check_name(name: str) -> None:
    if name not in STATE:
        raise ValueError(f"name must be one of {list(NAMES)} (an explorer), got {name!r}.")


def static_dir() -> Path:
    """The folder holding the JS modules (shipped in the wheel as package data)."""
    return STATIC


def static_files() -> list[Path]:
    """Every file a page needs next to it, at ``base_url``: the explorers' modules and ``common.js``."""
    return sorted(STATIC.glob("*.js"))


_IMPORT_COMMON = re.compile(r'^import\s*\{[^}]*\}\s*from\s*"\./common\.js";\s*$', re.MULTILINE | re.DOTALL)


@functools.cache
def esm(name: str) -> str:
    """The explorer's module as one self-contained ES module (``common.js`` inlined in place of its import):
    anywidget loads ``_esm`` from a string, where a relative import has nothing to resolve against.

    Args:
        name: an explorer's name, a key of :data:`STATE` (ValueError otherwise).
    """
    _check_name(name)
    src = (STATIC / f"{name}.js").read_text(encoding="utf-8")
    common = (STATIC / "common.js").read_text(encoding="utf-8")
    body, n = _IMPORT_COMMON.subn("", src)
    if n != 1:
        raise RuntimeError(f"static/{name}.js must import from ./common.js exactly once (found {n}).")
    return common + "\n" + body


def _checked_state(name: str, state: dict) -> dict:
    _check_name(name)
    unknown = set(state) - set(STATE[name])
    if unknown:
        raise ValueError(f"unknown state {sorted(unknown)} for explorer {name!r}; it takes {sorted(STATE[name])}.")
    out = dict(STATE[name])
    for key, value in state.items():
        default = out[key]
        if isinstance(default, float) and isinstance(value, int | float) and not isinstance(value, bool):
            value = float(value)
        elif isinstance(default, list):
            if not (isinstance(value, list | tuple) and len(value) == len(default)
                    and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
                raise ValueError(f"{key} must be a pair of numbers like {default}, got {value!r}.")
            value = [float(v) for v in value]
        elif type(value) is not type(default):
            raise ValueError(f"{key} must be a {type(default).__name__} like {default!r}, got {value!r}.")
        out[key] = value
    return out


# The stand-in for anywidget's model on a page with no kernel: get/set/on/off/save_changes over a plain object;
# set() fires "change:<name>" at once (as anywidget's model does locally), save_changes() has nowhere to send.
_STANDIN = """\
const state = {state};
const listeners = new Map();
const model = {{
  get: (k) => state[k],
  set: (k, v) => {{
    if (state[k] === v) return;
    state[k] = v;
    for (const cb of listeners.get(`change:${{k}}`) || []) cb();
  }},
  on: (ev, cb) => {{ if (!listeners.has(ev)) listeners.set(ev, []); listeners.get(ev).push(cb); }},
  off: (ev, cb) => {{ const l = listeners.get(ev) || []; const i = l.indexOf(cb); if (i >= 0) l.splice(i, 1); }},
  save_changes: () => {{}},
}};
const el = [...document.querySelectorAll('[id="{id}"]')].find((e) => !e.dataset.rendered);
el.dataset.rendered = "1";
widget.render({{ model, el }});
"""


def embed_html(name: str, *, base_url: str = "_static/explorers/", inline: bool = False, element_id: str | None = None,
               **state) -> str:
    """A self-contained HTML snippet showing explorer ``name`` with no kernel: a ``<div>`` and a
    ``<script type="module">`` importing ``<base_url><name>.js`` (where :func:`static_files` must be copied;
    relative to the page, or absolute) with a local stand-in for anywidget's model. ``inline=True`` puts the
    module itself in the script instead (about 20 kB, no file to copy): the form that also works on a page
    opened from disk (``file://``), where Chromium refuses to import modules. ``state`` overrides the defaults
    (:data:`STATE`); an unknown name or a value of the wrong type is a ValueError. The element id defaults to
    one derived from the name and state, so the same call gives the same bytes.

    Args:
        name: an explorer's name, a key of :data:`STATE` (ValueError otherwise).
        base_url: the folder the modules are served from, ending in ``/`` (ValueError otherwise); a bare
            relative folder gets ``./`` prepended. Unused with ``inline``.
        inline: put the module in the script instead of importing it.
        element_id: the host ``<div>``'s id (letters, digits, ``_`` or ``-``, starting with a letter); None:
            derived from the name and state.
        **state: the explorer's controls to set, by name (``STATE[name]`` lists them and their types).
    """
    full = _checked_state(name, state)
    blob = json.dumps(full, sort_keys=True, ensure_ascii=True)
    if element_id is None:
        element_id = f"ropelab-{name}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"
    if not re.fullmatch(r"[A-Za-z][\w-]*", element_id):
        raise ValueError(f"element_id must be letters, digits, '_' or '-', starting with a letter; got {element_id!r}.")
    # JSON inside <script>: escape "<" so no "</script>" in a text value can close the element early.
    standin = _STANDIN.format(state=blob.replace("<", "\\u003c"), id=element_id)
    if inline:
        code = esm(name)
        if "</script" in code.lower() or "<!--" in code:
            raise RuntimeError(f"static/{name}.js holds '</script' or '<!--' and cannot be inlined in a <script>.")
        # the module's own render, then the stand-in in a block of its own (no name clashes with the module)
        script = f"{code}\nconst widget = {{ render }};\n{{\n{standin}}}\n"
    else:
        if not isinstance(base_url, str) or not base_url.endswith("/"):
            raise ValueError(f"base_url must be a str ending in '/' (the folder holding {name}.js), got {base_url!r}.")
        if not re.match(r"(\.{0,2}/|[A-Za-z][A-Za-z0-9+.-]*:)", base_url):
            base_url = "./" + base_url  # a module specifier must be a URL or start with /, ./ or ../
        script = f"import widget from {json.dumps(base_url + name + '.js')};\n{standin}"
    return (f'<div class="ropelab-webexplorer-host" id="{element_id}" data-explorer="{name}"></div>\n'
            f'<script type="module">\n{script}</script>\n')


def _python_compute(name: str, s: dict):
    """The Python package's compute at state ``s`` (what the JS module's ``compute`` mirrors)."""
    if name == "ladder":
        from ..precision import ladder
        return ladder(s["base"], s["head_dim"], s["position"], s["dtype"])
    if name == "rotation":
        import torch

        from ..core import reference_matrix
        inv = torch.tensor([s["theta"]], dtype=torch.float64)
        q = reference_matrix(torch.tensor([s["q"]], dtype=torch.float64), [s["position"]], inv)[0]
        k = reference_matrix(torch.tensor([s["k"]], dtype=torch.float64), [s["position"] + s["distance"]], inv)[0]
        return {"q_rot": q.numpy(), "k_rot": k.numpy(), "score": float(q @ k)}
    if name == "decay":
        from ..decay import decay_view
        return decay_view(s["base"], s["head_dim"], s["distance"])
    if name == "drift":
        from ..staleness import ntk_drift
        return ntk_drift(s["length"], s["head_dim"], s["base"], s["original_length"], s["factor"])
    if name == "extension":
        from ..extend import extension_ratios
        return extension_ratios(s["factor"], s["head_dim"], s["base"], s["original_length"])
    if name == "bytes":
        from ..kernels.traffic import bytes_view
        return bytes_view(s["batch"], s["heads_q"], s["heads_k"], s["seq"], s["head_dim"], s["dtype"])
    from ..cope import cope_gates
    return cope_gates(s["text"], s["count"], s["sharpness"])


def _trait(default):
    import traitlets

    if isinstance(default, bool):  # pragma: no cover - no explorer has one
        raise TypeError("no bool state")
    if isinstance(default, float):
        return traitlets.Float(default)
    if isinstance(default, int):
        return traitlets.Int(default)
    if isinstance(default, str):
        return traitlets.Unicode(default)
    return traitlets.List(traitlets.Float(), default_value=list(default), minlen=2, maxlen=2)


@functools.cache
def _widget_class(name: str):
    import anywidget  # the notebooks extra; only the kernel-side widget needs it

    def compute(self):
        return _python_compute(name, {k: getattr(self, k) for k in STATE[name]})

    compute.__doc__ = "The Python package's numbers for the current slider state (what the JS module computes)."
    body = {k: _trait(v).tag(sync=True) for k, v in STATE[name].items()}
    doc = f"The {name} explorer as an anywidget: traitlets {list(STATE[name])}, compute in static/{name}.js."
    body.update(_esm=esm(name), compute=compute, explorer=name, __module__=__name__, __doc__=doc)
    return type(WIDGETS[name], (anywidget.AnyWidget,), body)


def widget(name: str, **state):
    """The anywidget of explorer ``name`` with ``state`` set (needs ``anywidget``, in the ``notebooks`` extra).

    Args:
        name: an explorer's name, a key of :data:`STATE` (ValueError otherwise).
        **state: the controls to set, as in :func:`embed_html`.
    """
    return _widget_class(name)(**_checked_state(name, state))


_CLASSES = {cls: name for name, cls in WIDGETS.items()}


def __getattr__(attr: str):
    # LadderWidget, DecayWidget, ...: built on first use, so that embed_html works without anywidget installed.
    if attr in _CLASSES:
        return _widget_class(_CLASSES[attr])
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def __dir__():
    return sorted(list(globals()) + list(_CLASSES))
