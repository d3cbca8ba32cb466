r"""The browser explorers (ropelab.webexplorers): the JS numbers are the Python package's, and the pages respond
with no kernel.

(a) Numbers. Each JS module's ``compute`` runs in Chromium at a set of slider values and is compared with the
Python compute at the same values. Tolerances come from float64's unit roundoff :math:`u = 2^{-53}` and the
operations between the inputs and the value (Higham's :math:`\gamma_n \approx n u` for a sum of n terms):

- An IEEE basic operation (+, -, *, /, fmod) on the same inputs gives the same bits in V8 and in torch; only
  the library functions (pow, cos, sin, exp, log) may differ, each by at most one ulp (:math:`2u` relative)
  on each side. So where the inputs agree bit for bit, what follows from basic operations alone is
  compared exactly (the ladder's held angle and phase error: ``Math.fround`` and a bit-level rounding to
  bf16 / fp16, subnormals and overflow included, emulate torch's ``.to(dtype)`` exactly), and the
  rounding emulation is also checked bit for bit against torch on values chosen to hit ties, subnormals and
  overflow.
- Elsewhere each quantity gets the bound written next to its check, doubled because both sides err.

(b) Interaction. A static page per explorer, built with ``embed_html`` and served by ``http.server`` from a
temporary folder holding ``static_files()``: moving a slider (Playwright ``fill`` / ``press`` on the input)
must change the figure (SVG markup or canvas pixels) and the printed number, with no console error and no
request outside that folder (no kernel, no CDN).

One Chromium for the module. Skipped when Chromium or Playwright is missing, unless
``ROPELAB_REQUIRE_BROWSER=1`` (as ``tests/test_lab.py``).
"""

from __future__ import annotations

import functools
import http.server
import math
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from _browser import chromium, jupyterlab, missing

from ropelab import webexplorers
from ropelab.cope import COUNT_RULES
from ropelab.decay import similarity_bound
from ropelab.scaling import default_inv_freq

U = 2.0**-53  # float64 unit roundoff

_missing = missing()
browser_only = pytest.mark.skipif(_missing is not None, reason=_missing or "")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------------------------------
# Python side: the package, its data and the widgets (no browser)
# --------------------------------------------------------------------------------------------------


def test_static_files_are_the_modules_and_ship_in_the_wheel():
    names = {p.name for p in webexplorers.static_files()}
    assert names == {f"{n}.js" for n in webexplorers.NAMES} | {"common.js"}
    text = Path(webexplorers.__file__).parents[2].joinpath("pyproject.toml").read_text()
    assert '"ropelab.webexplorers" = ["static/*.js"]' in text
    assert '"anywidget>=' in text.split("[project.optional-dependencies]")[1].split("dev = [")[0]
    for p in webexplorers.static_files():  # no network: nothing imported but the sibling module
        src = p.read_text()
        imports = [line for line in src.splitlines() if line.startswith("import ")]
        assert all('from "./common.js"' in line or line.startswith("import {") for line in imports), p
        assert "http" not in "".join(line for line in src.splitlines() if "from " in line), p


@pytest.mark.parametrize("name", webexplorers.NAMES)
def test_widget_traits_are_the_js_state(name):
    """Each anywidget class constructs, its synced traits are exactly the JS module's DEFAULTS (read from the
    file), with the same defaults, and it carries the self-contained module."""
    pytest.importorskip("anywidget")
    import json
    import re

    src = (webexplorers.static_dir() / f"{name}.js").read_text()
    js = json.loads(re.sub(r"(\w+):", r'"\1":', re.search(r"export const DEFAULTS = (\{.*?\});", src).group(1)))
    cls = getattr(webexplorers, webexplorers.WIDGETS[name])
    w = cls()
    own = {t for t in w.trait_names(sync=True) if not t.startswith("_")} - set(
        cls.__mro__[1]().trait_names(sync=True))
    assert own == set(js) == set(webexplorers.STATE[name])
    assert {k: getattr(w, k) for k in js} == js
    assert 'from "./common.js"' not in w._esm and "export function roundTo" in w._esm
    assert "export default" in w._esm
    w2 = webexplorers.widget(name, **{k: v for k, v in js.items()})
    w2.compute()  # the Python package runs on the trait state


def test_embed_html_checks_its_arguments():
    with pytest.raises(ValueError, match="name must be one of"):
        webexplorers.embed_html("nope")
    with pytest.raises(ValueError, match="unknown state"):
        webexplorers.embed_html("ladder", head=64)
    with pytest.raises(ValueError, match="head_dim must be a int"):
        webexplorers.embed_html("ladder", head_dim="64")
    with pytest.raises(ValueError, match="base_url"):
        webexplorers.embed_html("ladder", base_url="static")
    assert 'from "./static/ladder.js"' in webexplorers.embed_html("ladder", base_url="static/")  # not a bare name
    assert "import " not in webexplorers.embed_html("ladder", inline=True)
    snippet = webexplorers.embed_html("cope", text="x</script><b>")
    assert "</script><b>" not in snippet and snippet == webexplorers.embed_html("cope", text="x</script><b>")


# --------------------------------------------------------------------------------------------------
# The browser
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder served on 127.0.0.1: explorers/ (static_files), one page per explorer, and a page importing
    every module for the number checks."""
    root = tmp_path_factory.mktemp("webx")
    (root / "explorers").mkdir()
    for p in webexplorers.static_files():
        shutil.copy(p, root / "explorers" / p.name)
    imports = "\n".join(f'import * as {n} from "./explorers/{n}.js";' for n in webexplorers.NAMES)
    common = 'import * as common from "./explorers/common.js";'
    head = '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
    (root / "numbers.html").write_text(
        f'{head}<script type="module">\n{imports}\n{common}\n'
        f'window.mods = {{{", ".join(webexplorers.NAMES)}, common}}; window.ready = true;\n</script>\n')
    (root / "pages").mkdir()
    for n in webexplorers.NAMES:  # served, one folder down as a site's pages are; and inline, opened from disk
        (root / "pages" / f"{n}.html").write_text(
            f'{head}<title>{n}</title></head><body>\n'
            + webexplorers.embed_html(n, base_url="../explorers/") + "</body></html>\n")
        (root / f"{n}-inline.html").write_text(
            f'{head}<title>{n}</title></head><body>\n' + webexplorers.embed_html(n, inline=True) + "</body></html>\n")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "root": root}
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript"}

    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


class _Page:
    """A page with every module imported: ``call(module, function, *args)`` calls an export and returns its
    result (typed arrays as lists; Playwright's serialisation keeps float64 bits, inf and NaN);
    ``eval(expression, arg)`` evaluates ``(arg) => ...`` with ``mods`` in scope."""

    PLAIN = """const plain = (v) => ArrayBuffer.isView(v) ? Array.from(v) : Array.isArray(v) ? v.map(plain)
      : v && typeof v === 'object' ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)])) : v;"""

    def __init__(self, page):
        self.page = page

    def call(self, module, fn, *args):
        return self.page.evaluate(f"([m, f, args]) => {{ {self.PLAIN} return plain(window.mods[m][f](...args)); }}",
                                  [module, fn, list(args)])

    def eval(self, expression, arg=None):
        body = f"{self.PLAIN} const mods = window.mods; return plain(await ({expression})(arg));"
        return self.page.evaluate(f"async (arg) => {{ {body} }}", arg)


@pytest.fixture(scope="module")
def js(browser, site):
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{site['url']}/numbers.html")
    page.wait_for_function("window.ready === true", timeout=20000)
    yield _Page(page)
    assert not errors, errors
    page.close()


def _close(a, b, tol, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = ~(np.abs(a - b) <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} beyond tolerance, e.g. {a[bad][:3]} vs {b[bad][:3]}"


# --------------------------------------------------------------------------------------------------
# (a) numbers
# --------------------------------------------------------------------------------------------------


@browser_only
def test_rounding_emulation_is_torchs_bit_for_bit(js):
    """common.roundTo(dtype, x) == torch's x.to(dtype) bit for bit: random values over each format's whole range
    (subnormals included), the ties between neighbouring representable values, overflow and the edges."""
    g = torch.Generator().manual_seed(0)
    for name, dt in DTYPES.items():
        fi = torch.finfo(dt)
        nmant = {"float32": 23, "bfloat16": 7, "float16": 10}[name]  # explicit significand bits
        lo, hi = math.log2(fi.smallest_normal) - nmant - 2, math.log2(fi.max) + 1
        x = torch.exp2(torch.empty(4000, dtype=torch.float64).uniform_(lo, hi, generator=g))
        x = x * torch.randint(0, 2, (4000,), generator=g).mul(2).sub(1).double()
        held = x.to(dt)
        up = torch.nextafter(held, torch.full_like(held, math.inf)).double()
        ties = ((held.double() + up) / 2)[torch.isfinite(up) & torch.isfinite(held)]  # exact: a bit more than dt holds
        edges = [0.0, -0.0, fi.max, -fi.max, fi.tiny, fi.tiny / 2, fi.tiny * 2.0 ** -nmant,
                 fi.tiny * 2.0 ** -(nmant + 1), fi.max * (1 + 2.0 ** -(nmant + 1)), 3.5e38, 65520.0, 65519.99,
                 1.0 + 2.0 ** -(nmant + 1), 1.0 + 3 * 2.0 ** -(nmant + 1), 100.0, 8192.0, 2049.0, 257.0]
        values = torch.cat([x, ties, torch.tensor(edges, dtype=torch.float64)])
        got = torch.tensor(js.eval("([d, xs]) => xs.map((x) => mods.common.roundTo(d, x))", [name, values.tolist()]),
                           dtype=torch.float64)
        want = values.to(dt).double()
        same = (got == want) & (torch.signbit(got) == torch.signbit(want))
        assert bool(same.all()), (name, values[~same][:4].tolist(), got[~same][:4].tolist(), want[~same][:4].tolist())
        # and a product formed in the dtype, as ladder() holds m * omega: both factors held, one rounding
        a, b = values[:2000].to(dt), values[2000:4000].abs().to(dt)
        prod = js.eval("([d, a, b]) => a.map((x, i) => mods.common.mulIn(d, x, b[i]))",
                       [name, a.double().tolist(), b.double().tolist()])
        want = (a * b).double()
        got = torch.tensor(prod, dtype=torch.float64)
        assert bool(((got == want) | (torch.isnan(got) & torch.isnan(want))).all()), name


LADDER_CASES = [(10000.0, 64, 100), (10000.0, 64, 8192), (500000.0, 128, 2049), (1e7, 256, 8192), (123.4, 16, 0),
                (10000.0, 256, 70000), (1e6, 32, 65519), (2.0**0.5 * 1e3, 64, 1 << 24)]


@browser_only
def test_ladder_numbers(js):
    """ladder(): the frequencies within the pow/division bound; the held angle and its phase error exactly
    torch's wherever the two pow agree bit for bit (the rest: +-*/ and rounding on equal inputs), and
    exactly what torch's rounding gives from the JS frequencies everywhere."""
    from ropelab.precision import ladder

    agree = total = 0
    for base, d, m in LADDER_CASES:
        for dtype in ("float64", "float32", "bfloat16", "float16"):
            py = ladder(base, d, m, dtype)
            got = js.call("ladder", "compute", {"base": base, "head_dim": d, "position": m, "dtype": dtype})
            inv = np.array(got["inv_freq"])
            # inv = 1 / pow(b, 2i/d): the exponent is one division (the same bits), pow is within one ulp (2u) and
            # the reciprocal within u on each side: relative 6u; the wavelength and angle add one rounding (u).
            _close(inv, py["inv_freq"], 6 * U * py["inv_freq"], "inv_freq")
            _close(got["wavelength"], py["wavelength"], 8 * U * py["wavelength"], "wavelength")
            _close(got["angle"], py["angle"], 8 * U * py["angle"], "angle")
            same = inv == py["inv_freq"]
            agree, total = agree + int(same.sum()), total + same.size
            for key in ("angle", "angle_dtype", "phase_error"):
                assert np.array_equal(np.array(got[key])[same], py[key][same]), (base, d, m, dtype, key)
            assert np.array_equal(np.array(got["turned"])[same], py["turned"][same])
            if dtype != "float64":  # the JS pipeline on its own frequencies, against torch on the same numbers
                dt = DTYPES[dtype]
                inv_t = torch.tensor(inv, dtype=torch.float64)
                held = (torch.tensor([float(m)], dtype=torch.float64).to(dt) * inv_t.to(dt)).double()
                assert torch.equal(torch.tensor(got["angle_dtype"], dtype=torch.float64), held), (base, d, m, dtype)
            s = js.call("ladder", "summary", {"base": base, "head_dim": d, "position": m, "dtype": dtype})
            turned = int(py["turned"].sum())
            assert s["turned"] == turned and f"{turned} pairs turned once" in s["text"]
            assert f"max {py['phase_error'].max():.2g} rad" in s["text"]
    # Most frequencies must agree bit for bit, or the exact checks above would test almost nothing.
    assert agree >= 0.9 * total, f"Math.pow and torch.pow agree on only {agree} of {total} frequencies"


@browser_only
def test_rotation_numbers(js):
    """One pair's rotation: q and k rotated with cos, sin (one ulp each) and two products and a sum per
    component, so each component is within 2 (2u + u)(|x| + |y|) + u of the oracle's on each side; the
    score (two more products and a sum) within 16u |q|_1 |k|_1."""
    cases = [(0.3, 0, 5, [1.0, 0.3], [0.2, 1.0]), (0.3, 37, -12, [1.0, 0.3], [0.2, 1.0]),
             (2.9, 40, 20, [-3.0, 0.5], [4.0, -2.5]), (1e-3, 7, 1, [1e3, -1e-3], [0.0, 1.0])]
    for theta, m, dist, q, k in cases:
        state = {"theta": theta, "position": m, "distance": dist, "q": q, "k": k}
        py = webexplorers.widget("rotation", **state).compute() if _have_anywidget() else webexplorers._python_compute(
            "rotation", state)
        got = js.call("rotation", "compute", state)
        q1, k1 = sum(map(abs, q)), sum(map(abs, k))
        _close(got["q_rot"], py["q_rot"], 2 * (6 * U * q1 + U), "q_rot")
        _close(got["k_rot"], py["k_rot"], 2 * (6 * U * k1 + U), "k_rot")
        _close(got["score"], py["score"], 16 * U * q1 * k1, "score")
        _close(got["relative"], py["score"], 32 * U * q1 * k1, "relative")  # the relative-position property
        assert f"{py['score']:.6f}" in js.call("rotation", "summary", state)["text"]


def _have_anywidget():
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True


DECAY_CASES = [(10000.0, 128, 4096), (500000.0, 64, 32768), (100.0, 16, 64), (1e7, 256, 2048), (25000.0, 32, 8192)]


@browser_only
def test_decay_numbers(js):
    r"""decay_view(): the distance grid exactly (float32 linspace, rounded half to even), and with n = d/2 pairs
    at distance r: each term e^{i r theta} within 2u (cos, sin) plus the effect of theta differing by one
    ulp, |r dtheta| <= 2u r; S_j sums j of them ((j + 2) u j); so the envelope (a mean of |S_j|) is within
    2 [(n + 2) n u + 2 n u r] + u |env| of the oracle's and 2 B_r within twice that. first_negative equal, or
    both B_r within their bound of 0."""
    from ropelab.decay import decay_view

    for base, d, dist in DECAY_CASES:
        py = decay_view(base, d, dist)
        got = js.call("decay", "compute", {"base": base, "head_dim": d, "distance": dist})
        assert np.array_equal(np.array(got["r"]), py["r"]), (base, d, dist)
        n, r = d // 2, py["r"].astype(np.float64)
        tol = 2 * ((n + 2) * n * U + 2 * n * U * r)
        _close(got["envelope"], py["envelope"], tol + U * np.abs(py["envelope"]), "envelope")
        _close(got["aligned"], py["aligned"], 4 * tol, "aligned")
        assert got["gaussian_std"] == math.sqrt(d)
        np.testing.assert_allclose(py["gaussian_mean"], 0, atol=4 * math.sqrt(d / 64))  # 4 sigma of a 64-pair mean
        neg_js, neg_py = got["first_negative"], py["first_negative"]
        if neg_js != neg_py:
            at = torch.tensor([x for x in (neg_js, neg_py) if x is not None])
            bound = 2 * ((n + 2) * n * U + 2 * n * U * float(at.max()))
            assert bool((similarity_bound(at, d, base).abs() <= bound).all()), (base, d, dist, neg_js, neg_py)
        summary = js.call("decay", "summary", {"base": base, "head_dim": d, "distance": dist})
        assert summary["first_negative"] == neg_js and f"base {base:.3g}, d = {d}" in summary["text"]


DRIFT_CASES = [(1024, 64, 10000.0, 256, 4.0), (1, 64, 10000.0, 256, 4.0), (200, 64, 10000.0, 256, 4.0),
               (700, 32, 500000.0, 256, 16.0), (513, 128, 10000.0, 256, 1.0), (1000, 16, 1e6, 128, 2.5)]


@browser_only
def test_drift_numbers(js):
    r"""ntk_drift(): the base b(L) = b alpha^{r/(r-2)} (alpha from the same +-*/: equal bits) within 2(2u + u),
    hence each omega_i = 1/b(L)^{2i/r} within 2(6u + 2u + u) relative; the phase error m (omega_now -
    omega_then) within m * 18u (omega_now + omega_then) + 2u |err|, and its wrapped size (1-Lipschitz, plus
    two roundings of at most u (|err| + pi)) within that + 4u (|err| + pi). The fraction over pi/2 may differ
    only by the entries within that bound of pi/2."""
    from ropelab.staleness import ntk_drift

    for case in DRIFT_CASES:
        length, d, base, l0, s = case
        py = ntk_drift(*case)
        got = js.call("drift", "compute", dict(zip(("length", "head_dim", "base", "original_length", "factor"), case)))
        half = d // 2
        err = np.array(got["phase_error"]).reshape(length, half)
        m = np.arange(length, dtype=np.float64)[:, None]
        inv_now = default_inv_freq(d, py["base_now"]).numpy()[None, :]
        inv_then = inv_now - py["phase_error"] / np.maximum(m, 1)  # omega_then = omega_now - err / m (m > 0)
        tol = m * 18 * U * (np.abs(inv_now) + np.abs(inv_then)) + 2 * U * np.abs(py["phase_error"])
        _close(err, py["phase_error"], tol, f"phase_error {case}")
        tol_w = tol + 4 * U * (np.abs(py["phase_error"]) + math.pi)
        _close(np.array(got["wrapped"]).reshape(length, half), py["wrapped"], tol_w, f"wrapped {case}")
        _close(got["base_now"], py["base_now"], 6 * U * py["base_now"], "base_now")
        edge = int((np.abs(py["wrapped"] - math.pi / 2) <= tol_w).sum())
        assert abs(got["frac_over_half_pi"] - py["frac_over_half_pi"]) * length * half <= edge + 1e-6, case
        text = js.call("drift", "summary", dict(zip(("length", "head_dim", "base", "original_length", "factor"), case)))
        if edge == 0:  # no entry near pi/2: the fraction is the same count, printed the same
            assert f"{100 * py['frac_over_half_pi']:.1f} % of (key, pair)" in text["text"], case
        assert f"b(L) = {py['base_now']:.4g}" in text["text"], case


EXTENSION_CASES = [(4.0, 32, 10000.0, 256), (1.0, 32, 10000.0, 256), (7.5, 128, 500000.0, 8192),
                   (32.0, 16, 100.0, 2048), (2.5, 256, 1e6, 4096), (16.0, 64, 10000.0, 4096)]


@browser_only
def test_extension_numbers(js):
    r"""extension_ratios(): each ratio omega'/omega is a quotient of two frequencies, each a pow (one ulp) of a
    base that is itself a pow (NTK-aware, dynamic) times at most a few +-*/ (the ramps): 12u relative on each,
    so 2 (12u + 12u + u) relative on the ratio; the branch points (YaRN's floor / ceil of a log, Llama 3's
    wavelength thresholds, the 1e-9 slack of out_of_range) sit far from these values, so the lists, the
    critical pair and the attention factors are equal."""
    from ropelab.extend import extension_ratios

    for case in EXTENSION_CASES:
        py = extension_ratios(*case)
        state = dict(zip(("factor", "head_dim", "base", "original_length"), case))
        got = js.call("extension", "compute", state)
        assert set(got["ratio"]) == set(py["ratio"]), case
        for name, ratio in py["ratio"].items():
            _close(got["ratio"][name], ratio, 50 * U * ratio, f"{name} {case}")
            assert got["out_of_range"][name] == py["out_of_range"][name], (name, case)
            _close(got["attention_factor"][name], py["attention_factor"][name], 4 * U, f"attention {name}")
        assert got["critical"] == py["critical"], case
        text = js.call("extension", "summary", state)["text"]
        bad = [n for n, p in py["out_of_range"].items() if p and n != "no scaling"]
        assert ("out of range: " + ", ".join(bad) if bad else "no method leaves a pair out of range") in text, case


COPE_TEXTS = ["a b  c   d e", "Hello, World! 123 -- ok?", "naïve café ÉTÉ\u3000x\u00a0y\ufeffz\x1c\u2028İ ١٢ Ⅻ 中文"]
COPE_CASES = [(t, c, sh) for t in COPE_TEXTS for c in COUNT_RULES for sh in (0.0, 6.0, 20.0)]
COPE_CASES += [(("on, the mat " * 20)[:200], "vowels", 6.0)]  # a long one: the positions' sums get long


@browser_only
def test_cope_numbers(js):
    r"""cope_gates(): the logit q . k_j / sqrt 2 is formed from the same +-*/ on the same inputs (equal bits),
    the gate 1/(1 + exp(-x)) within 4u relative on each side (exp one ulp, a sum, a division); p_ij sums at
    most s gates <= 1, within (s + 3) s u on each side; token distances are integers (equal). Counting
    rules agree with Python's str.isalnum / isspace / lower on the test's Unicode (accents, CJK,
    Arabic-Indic and Roman numerals, no-break and ideographic spaces, BOM, separators)."""
    from ropelab.cope import cope_gates

    states = [{"text": t, "count": c, "sharpness": sh} for t, c, sh in COPE_CASES]
    outs = js.eval("(states) => states.map((s) => [mods.cope.compute(s), mods.cope.summary(s)])", states)
    for state, (got, summary) in zip(states, outs):
        py = cope_gates(state["text"], state["count"], state["sharpness"])
        s = len(state["text"])
        assert got["tokens"] == list(state["text"])
        _close(np.array(got["gates"]).reshape(s, s), py["gates"], 8 * U * py["gates"], f"gates {state}")
        _close(np.array(got["positions"]).reshape(s, s), py["positions"], 2 * (s + 3) * s * U, f"positions {state}")
        assert np.array_equal(np.array(got["token_distance"]).reshape(s, s), py["token_distance"])
        _close(summary["counted"], py["positions"][-1, 0], 2 * (s + 3) * s * U, "counted")
        assert f"{py['positions'][-1, 0]:.2f} counted, {s} tokens" in summary["text"]


BYTES_CASES = [(1, 32, 8, 2048, 128, "bfloat16"), (1, 1, 1, 16, 64, "float32"), (4, 64, 8, 8192, 256, "float16"),
               (3, 5, 1, 100, 64, "float32"), (16, 40, 40, 1, 128, "bfloat16"), (2, 12, 3, 777, 256, "float32")]


@browser_only
def test_bytes_numbers(js):
    """bytes_view(): the JS closed forms against the package's counts, Hugging Face's from its op-by-op trace (on
    meta tensors) and the fused kernel's table loads from launch_tiles: integers below 2^53, so equal; the
    printed ratios are the Python ones at the printed digits."""
    from ropelab.kernels.traffic import bytes_view

    keys = ("batch", "heads_q", "heads_k", "seq", "head_dim", "dtype")
    for case in BYTES_CASES:
        py, state = bytes_view(*case), dict(zip(keys, case))
        got = js.call("bytes", "compute", state)
        assert set(py) == set(got), case
        for key, value in py.items():
            assert (list(value) if isinstance(value, tuple) else value) == got[key], (key, case)
        copy = sum(py["copy"])
        text = js.call("bytes", "summary", state)["text"]
        assert f"HF eager {sum(py['hf_eager']) / copy:.2f}x a copy" in text, (case, text)
        assert f"({py['table_loads']} loads per row): {sum(py['fused_issued']) / copy:.3f}x" in text, (case, text)


@browser_only
@pytest.mark.parametrize("name", webexplorers.NAMES)
def test_anywidget_module_is_the_same_module(js, name):
    """The self-contained ``_esm`` (common.js inlined) loads as a module from a string, as anywidget loads it,
    and computes what the file module computes."""
    state = dict(webexplorers.STATE[name])
    if name == "drift":
        state["length"] = 64  # keep the payload small
    same = js.eval("""async ([src, name, state]) => {
        const url = URL.createObjectURL(new Blob([src], { type: 'text/javascript' }));
        const m = await import(url);
        const a = JSON.stringify(plain(m.compute(state))), b = JSON.stringify(plain(mods[name].compute(state)));
        return typeof m.default.render === 'function' && a === b;
      }""", [webexplorers.esm(name), name, state])
    assert same is True


@browser_only
def test_compute_rejects_bad_input(js):
    """A bad value is an error naming the argument (shown under the controls), never NaN drawn silently."""
    for module, state, word in [("ladder", {**webexplorers.STATE["ladder"], "head_dim": 63}, "head_dim"),
                                ("ladder", {**webexplorers.STATE["ladder"], "dtype": "int8"}, "dtype"),
                                ("decay", {**webexplorers.STATE["decay"], "base": 1.0}, "base"),
                                ("cope", {**webexplorers.STATE["cope"], "text": ""}, "text"),
                                ("rotation", {**webexplorers.STATE["rotation"], "q": [1.0]}, "q")]:
        message = js.eval("([m, s]) => { try { mods[m].compute(s); return null; } catch (e) { return e.message; } }",
                          [module, state])
        assert message and message.startswith(word), (module, message)


# --------------------------------------------------------------------------------------------------
# (b) interaction: a static page per explorer, no kernel
# --------------------------------------------------------------------------------------------------

# explorer -> (how to move one control, what the printed number must become or at least change from)
MOVES = {
    "ladder": lambda p: p.fill('input[data-trait="position"]', "5000"),
    "rotation": lambda p: p.fill('input[data-trait="distance"]', "8"),
    "decay": lambda p: p.fill('input[data-trait="distance"]', "1024"),
    "drift": lambda p: p.fill('input[data-trait="length"]', "200"),
    "extension": lambda p: [p.focus('input[data-trait="factor"]')] + [p.keyboard.press("ArrowRight") for _ in range(3)],
    "cope": lambda p: p.fill('input[data-trait="sharpness"]', "0"),
    "bytes": lambda p: p.fill('input[data-trait="heads_q"]', "1"),
}
FIGURE_JS = """() => {
  const f = document.querySelector('.ropelab-figure');
  const one = (e) => e.tagName === 'CANVAS' ? e.toDataURL() : e.outerHTML;
  return [...f.querySelectorAll('svg, canvas')].map(one).join('|');
}"""


@browser_only
@pytest.mark.parametrize("mode", ["served", "inline from disk"])
@pytest.mark.parametrize("name", webexplorers.NAMES)
def test_page_responds_without_a_kernel(browser, site, name, mode):
    """served: embed_html importing ../explorers/<name>.js over http; inline from disk: embed_html(inline=True)
    opened as a file:// page (where Chromium would refuse a module import)."""
    if mode == "served":
        url, allowed = f"{site['url']}/pages/{name}.html", site["url"] + "/"
    else:
        url = allowed = (site["root"] / f"{name}-inline.html").as_uri()
    page = browser.new_page()
    errors, requests = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    page.wait_for_function("document.querySelector('.ropelab-readout') && "
                           "document.querySelector('.ropelab-readout').textContent.length > 0", timeout=20000)
    before = (page.text_content(".ropelab-readout"), page.evaluate(FIGURE_JS))
    assert page.text_content(".ropelab-error") == "", page.text_content(".ropelab-error")
    MOVES[name](page)
    page.wait_for_function("(t) => document.querySelector('.ropelab-readout').textContent !== t", arg=before[0],
                           timeout=10000)
    after = (page.text_content(".ropelab-readout"), page.evaluate(FIGURE_JS))
    assert after[0] != before[0] and after[1] != before[1], name
    assert page.text_content(".ropelab-error") == ""
    if name == "cope":  # the typed sequence is a control too
        page.fill('input[data-trait="text"]', "aa bb")
        # the redraw runs on the next animation frame: wait for it rather than read the old text (a race)
        page.wait_for_function("() => document.querySelector('.ropelab-readout').textContent.includes('5 tokens')",
                               timeout=10000)
        assert "5 tokens" in page.text_content(".ropelab-readout")
        # An invalid sequence: the error names it, and the figure and number of the last valid one are marked stale
        # (greyed out, the readout says so) rather than left to pass for the new input.
        assert page.get_attribute('input[data-trait="text"]', "maxlength") == "256"
        page.fill('input[data-trait="text"]', "")
        page.wait_for_function("() => document.querySelector('.ropelab-error').textContent.includes('non-empty')",
                               timeout=10000)
        stale = page.evaluate("() => [document.querySelector('.ropelab-readout').textContent, "
                              "getComputedStyle(document.querySelector('.ropelab-figure')).opacity]")
        assert stale[0].startswith("No result for this input") and float(stale[1]) < 0.5, stale
        page.fill('input[data-trait="text"]', "ab")
        page.wait_for_function("() => document.querySelector('.ropelab-readout').textContent.includes('2 tokens')",
                               timeout=10000)
        assert page.text_content(".ropelab-error") == ""
        assert page.evaluate("() => getComputedStyle(document.querySelector('.ropelab-figure')).opacity") == "1"
    if name in ("cope", "drift"):  # a heat map: its colour scale beside it, with numbers on it
        bar = page.locator("svg.ropelab-plot-colorbar")
        assert bar.count() == 1 and len(bar.locator("text").all_text_contents()) >= 3, name
        # and its axes: numbered ticks and a label below and to the left of the canvas
        for axis in ("x", "y"):
            texts = page.locator(f"svg.ropelab-heat-{axis}axis text").all_text_contents()
            assert len(texts) >= 3 and sum(t.strip().lstrip("-").isdigit() for t in texts) >= 2, (name, axis, texts)
    if name == "decay":
        assert "B_r ≥ 0 up to r = 1024" in after[0]
    if name == "drift":
        assert "b(L) = 1e+04" in after[0] and "0.0 %" in after[0]
    assert not errors, errors
    assert all(u.startswith(allowed) for u in requests), requests  # no CDN, no kernel: only the page's own files
    page.close()


# --------------------------------------------------------------------------------------------------
# (c) the same widget in JupyterLab, with a kernel: the traits carry the slider state both ways
# --------------------------------------------------------------------------------------------------

_LAB_CELLS = [
    "from ropelab.webexplorers import LadderWidget\nw = LadderWidget(position=100)\nw",
    # kernel side: a slider move arrives as a trait change; answer it by changing another trait, which the
    # browser must draw (Python -> JS)
    "def answer(change):\n    w.dtype = 'float16'\n\nw.observe(answer, names='position')",
]


@browser_only
@pytest.mark.lab
@pytest.mark.timeout(600)
def test_widget_in_jupyterlab_syncs_both_ways(browser, tmp_path):
    import json

    pytest.importorskip("anywidget")
    pytest.importorskip("jupyterlab")
    root = tmp_path / "root"
    root.mkdir()
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{n}", "metadata": {}, "outputs": [],
                     "source": src} for n, src in enumerate(_LAB_CELLS)],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / "w.ipynb").write_text(json.dumps(nb))
    repo = Path(webexplorers.__file__).parents[2]
    path = os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    page = None
    with jupyterlab(root, tmp_path, {"PYTHONPATH": path}) as server:
        url, token = server["url"], server["token"]
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/lab/tree/w.ipynb?reset&token={token}")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                                   " === 'idle'", timeout=180_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            readout = page.locator(".jp-OutputArea-output .ropelab-readout").first
            readout.wait_for(state="visible", timeout=120_000)
            page.wait_for_function("() => document.querySelector('.jp-OutputArea-output .ropelab-readout')"
                                   ".textContent.includes('10 pairs turned once')", timeout=30_000)
            page.wait_for_function("""() => {  // both cells ran (the observer is registered) and the kernel is idle
                const w = window.jupyterapp.shell.currentWidget;
                return w.sessionContext.session.kernel.status === 'idle'
                  && w.content.widgets.every((c) => c.model.toJSON().execution_count !== null);
              }""", timeout=60_000)
            page.locator('.jp-OutputArea-output input[data-trait="position"]').first.fill("5000")
            # JS -> Python (position) -> the observer -> Python -> JS (dtype): the drop-down and the figure follow
            # (float16, not bfloat16)
            page.wait_for_function("() => document.querySelector('.jp-OutputArea-output .ropelab-readout')"
                                   ".textContent.includes('\\nfloat16 angle vs float64')", timeout=60_000)
            assert page.locator('.jp-OutputArea-output select[data-trait="dtype"]').first.input_value() == "float16"
            want = webexplorers.widget("ladder", position=5000, dtype="float16").compute()  # the Python package
            text = readout.text_content()
            assert f"{int(want['turned'].sum())} pairs turned once" in text, text
            assert f"max {want['phase_error'].max():.2g} rad" in text, text
            assert not errors, errors
        finally:
            if page is not None:
                page.close()
