// Shared pieces of ropelab's browser explorers: the RoPE formulas in float64, exact emulation of rounding to
// float32 / bfloat16 / float16, and a small SVG / canvas plotting kit. Plain ES module, no dependencies.
// Each explorer module imports it as "./common.js"; ropelab.webexplorers inlines it for anywidget.

export const TAU = 2 * Math.PI;

// ---------------------------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------------------------

const _f64 = new Float64Array(1);
const _u32 = new Uint32Array(_f64.buffer);

// The binary exponent e of a finite nonzero x with 2^e <= |x| < 2^(e+1), read from its bits (exact).
function exponentOf(x) {
  _f64[0] = x;
  const biased = (_u32[1] >>> 20) & 0x7ff;
  if (biased === 0) return Math.floor(Math.log2(Math.abs(x))); // float64 subnormal: far below any target format
  return biased - 1023;
}

function roundHalfEven(y) {
  const f = Math.floor(y);
  const d = y - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

// Binary formats: p significand bits (implicit bit included), emin the smallest normal exponent,
// max the largest finite value.
export const FORMATS = {
  float32: { p: 24, emin: -126, max: (2 - 2 ** -23) * 2 ** 127 },
  bfloat16: { p: 8, emin: -126, max: (2 - 2 ** -7) * 2 ** 127 },
  float16: { p: 11, emin: -14, max: 65504 },
};

// x (a float64) rounded to nearest, ties to even, in `dtype` ("float64" returns x): what torch's
// x.to(dtype) does. Subnormals keep the quantum 2^(emin - p + 1); past the largest finite value the result
// is +-Infinity (a tie with 2^(emax+1) rounds to it, as IEEE 754 says).
export function roundTo(dtype, x) {
  if (dtype === "float64") return x;
  const fmt = FORMATS[dtype];
  if (!fmt) throw new Error(`dtype must be one of float64, ${Object.keys(FORMATS).join(", ")}; got ${dtype}`);
  if (!Number.isFinite(x) || x === 0) return x;
  const e = Math.max(exponentOf(x), fmt.emin);
  const quantum = 2 ** (e - fmt.p + 1);
  // On |x| (round to nearest even is symmetric), both steps exact: scaling by powers of two. The sign goes back
  // on afterwards, so a negative value that underflows is -0 as in torch.
  const r = roundHalfEven(Math.abs(x) / quantum) * quantum;
  const held = r > fmt.max ? Infinity : r;
  return x < 0 ? -held : held;
}

// a * b computed in `dtype` as torch does on the CPU for two values already held in it: the exact product
// (it fits a float64 for these formats: at most 2 x 24 significand bits) rounded once.
export function mulIn(dtype, a, b) {
  return roundTo(dtype, a * b);
}

// torch.remainder(x, y) for floats: fmod (exact), moved into the sign of y.
export function remainder(x, y) {
  let m = x % y;
  if (m !== 0 && (y < 0) !== (m < 0)) m += y;
  return m;
}

// ropelab.precision.wrap_angle: x folded onto [-pi, pi).
export function wrapAngle(x) {
  return remainder(x + Math.PI, TAU) - Math.PI;
}

// ropelab.precision's wrapped error: |wrap_angle(d)|, and pi for a non-finite d.
export function wrapped(d) {
  return Number.isFinite(d) ? Math.abs(wrapAngle(d)) : Math.PI;
}

// ropelab.scaling.default_inv_freq in float64: omega_i = 1 / b^(2i/r), i = 0 .. r/2 - 1.
export function defaultInvFreq(rotaryDim, base) {
  const out = new Float64Array(rotaryDim / 2);
  for (let i = 0; i < out.length; i++) out[i] = 1.0 / Math.pow(base, (2 * i) / rotaryDim);
  return out;
}

// ropelab.scaling.ntk_aware_base: b * alpha^(r / (r - 2)).
export function ntkAwareBase(base, rotaryDim, alpha) {
  return base * Math.pow(alpha, rotaryDim / (rotaryDim - 2));
}

// ropelab.scaling.ntk_base: dynamic NTK's b(L), the base itself up to L0.
export function ntkBase(base, rotaryDim, seqLen, maxPos, factor) {
  const L = Math.max(seqLen, maxPos);
  return ntkAwareBase(base, rotaryDim, (factor * L) / maxPos - (factor - 1));
}

// ropelab.scaling.pair_at_turns and critical_pair.
export function pairAtTurns(rotaryDim, base, original, turns) {
  return (rotaryDim * Math.log(original / (turns * 2 * Math.PI))) / (2 * Math.log(base));
}

export function criticalPair(rotaryDim, base, original) {
  return Math.min(Math.max(Math.ceil(pairAtTurns(rotaryDim, base, original, 1.0)), 0), rotaryDim / 2);
}

export function checkEvenInt(name, v, lo, hi) {
  if (!Number.isInteger(v) || v < lo || v > hi || v % 2) throw new Error(`${name} must be an even integer in [${lo}, ${hi}], got ${v}`);
  return v;
}

export function checkInt(name, v, lo, hi) {
  if (!Number.isInteger(v) || v < lo || v > hi) throw new Error(`${name} must be an integer in [${lo}, ${hi}], got ${v}`);
  return v;
}

export function checkBase(base) {
  if (!(typeof base === "number" && Number.isFinite(base) && base > 1)) throw new Error(`base must be a finite number > 1, got ${base}`);
  return base;
}

// Python's format(x, ".Ng") (enough of it for titles: no '#' flag, finite or not).
export function fmtG(x, n = 6) {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  const exp = Math.floor(Math.log10(Math.abs(Number(x.toPrecision(n)))));
  if (exp < -4 || exp >= n) {
    let [m, e] = x.toExponential(n - 1).split("e");
    if (m.includes(".")) m = m.replace(/0+$/, "").replace(/\.$/, "");
    const ei = parseInt(e, 10);
    return `${m}e${ei < 0 ? "-" : "+"}${String(Math.abs(ei)).padStart(2, "0")}`;
  }
  let s = x.toFixed(Math.max(n - 1 - exp, 0));
  if (s.includes(".")) s = s.replace(/0+$/, "").replace(/\.$/, "");
  return s;
}

// ---------------------------------------------------------------------------------------------
// Drawing: controls, a line chart in SVG, a heat map on a canvas
// ---------------------------------------------------------------------------------------------

export const COLORS = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494"];
const SVGNS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs = {}, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function ticks(lo, hi, log) {
  if (log) {
    const a = Math.ceil(Math.log10(lo)), b = Math.floor(Math.log10(hi));
    const step = Math.max(1, Math.ceil((b - a + 1) / 6));
    const out = [];
    for (let e = a; e <= b; e += step) out.push(10 ** e);
    return out;
  }
  const span = hi - lo || 1;
  const raw = span / 5, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * span; t += step) out.push(Math.abs(t) < 1e-12 * span ? 0 : t);
  return out;
}

function tickLabel(t, log) {
  if (log) return `1e${Math.round(Math.log10(t))}`;
  return fmtG(t, 4);
}

// Draw into `svg` (an <svg> element, cleared first) a chart: opts = {width, height, title, xlabel, ylabel,
// xlim, ylim, xlog, ylog, series: [{x, y, color, dash, width, marker, label, fill: y2, opacity (of a fill)}], hlines: [{y, color,
// dash}], vlines: [...], legend: true | "bottom", xticks: [{x, label}] (instead of automatic ones), noTicks}.
export function lineChart(svg, opts) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = opts.width || 420, H = opts.height || 300;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  if (opts.title) svg.setAttribute("aria-label", opts.title);  // what a screen reader says for the plot
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  const m = { l: opts.ylabel ? 62 : 20, r: 12, t: opts.title ? 36 : 12, b: opts.xlabel ? 42 : 16 };
  const pw = W - m.l - m.r, ph = H - m.t - m.b;
  const [x0, x1] = opts.xlim, [y0, y1] = opts.ylim;
  const fx = opts.xlog ? (v) => (Math.log10(v) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0))
    : (v) => (v - x0) / (x1 - x0);
  const fy = opts.ylog ? (v) => (Math.log10(v) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0))
    : (v) => (v - y0) / (y1 - y0);
  const X = (v) => m.l + pw * fx(v), Y = (v) => m.t + ph * (1 - fy(v));
  const clipId = `c${Math.random().toString(36).slice(2)}`;
  const defs = svgEl("defs");
  const clip = svgEl("clipPath", { id: clipId });
  clip.appendChild(svgEl("rect", { x: m.l, y: m.t, width: pw, height: ph }));
  defs.appendChild(clip);
  svg.appendChild(defs);
  svg.appendChild(svgEl("rect", { x: m.l, y: m.t, width: pw, height: ph, fill: "white", stroke: "#333" }));
  if (!opts.noTicks) {
    const xt = opts.xticks || ticks(x0, x1, opts.xlog).map((t) => ({ x: t, label: tickLabel(t, opts.xlog) }));
    for (const { x: t, label } of xt) {
      svg.appendChild(svgEl("line", { x1: X(t), x2: X(t), y1: m.t + ph, y2: m.t + ph + 4, stroke: "#333" }));
      svg.appendChild(svgEl("text", { x: X(t), y: m.t + ph + 16, "text-anchor": "middle", "font-size": 10 }, label));
    }
    for (const t of ticks(y0, y1, opts.ylog)) {
      svg.appendChild(svgEl("line", { x1: m.l - 4, x2: m.l, y1: Y(t), y2: Y(t), stroke: "#333" }));
      svg.appendChild(svgEl("text", { x: m.l - 6, y: Y(t) + 3, "text-anchor": "end", "font-size": 10 }, tickLabel(t, opts.ylog)));
    }
  }
  if (opts.title) {
    opts.title.split("\n").forEach((line, n, all) => svg.appendChild(
      svgEl("text", { x: m.l + pw / 2, y: m.t - 8 - 13 * (all.length - 1 - n), "text-anchor": "middle", "font-size": 12,
        class: "title" }, line)));
  }
  if (opts.xlabel) svg.appendChild(svgEl("text", { x: m.l + pw / 2, y: H - 8, "text-anchor": "middle", "font-size": 11 }, opts.xlabel));
  if (opts.ylabel) {
    svg.appendChild(svgEl("text", { x: 14, y: m.t + ph / 2, "text-anchor": "middle", "font-size": 11,
      transform: `rotate(-90 14 ${m.t + ph / 2})` }, opts.ylabel));
  }
  const g = svgEl("g", { "clip-path": `url(#${clipId})` });
  svg.appendChild(g);
  const ok = (x, y) => Number.isFinite(X(x)) && Number.isFinite(Y(y));
  for (const h of opts.hlines || []) {
    g.appendChild(svgEl("line", { x1: m.l, x2: m.l + pw, y1: Y(h.y), y2: Y(h.y), stroke: h.color || "#777",
      "stroke-dasharray": h.dash || "4 3" }));
  }
  for (const v of opts.vlines || []) {
    g.appendChild(svgEl("line", { x1: X(v.x), x2: X(v.x), y1: m.t, y2: m.t + ph, stroke: v.color || "#999",
      "stroke-dasharray": v.dash || "2 2" }));
  }
  for (const s of opts.series) {
    const pts = [];
    for (let i = 0; i < s.x.length; i++) if (ok(s.x[i], s.y[i])) pts.push(`${X(s.x[i]).toFixed(2)},${Y(s.y[i]).toFixed(2)}`);
    if (s.fill) {
      const lower = [];
      for (let i = s.x.length - 1; i >= 0; i--) if (ok(s.x[i], s.fill[i])) lower.push(`${X(s.x[i]).toFixed(2)},${Y(s.fill[i]).toFixed(2)}`);
      g.appendChild(svgEl("polygon", { points: pts.concat(lower).join(" "), fill: s.color, "fill-opacity": s.opacity ?? 0.2, stroke: "none" }));
      continue;
    }
    if (s.line !== false) {
      g.appendChild(svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: s.color, "stroke-width": s.width || 1.5,
        "stroke-dasharray": s.dash || "none", "data-label": s.label || "" }));
    }
    if (s.marker) for (const p of pts) {
      const [cx, cy] = p.split(",");
      g.appendChild(svgEl("circle", { cx, cy, r: 1.8, fill: s.color }));
    }
  }
  if (opts.legend) {
    const items = opts.series.filter((s) => s.label);
    items.forEach((s, n) => {
      const y = opts.legend === "bottom" ? m.t + ph - 10 - 13 * (items.length - 1 - n) : m.t + 12 + 13 * n;
      svg.appendChild(svgEl("line", { x1: m.l + 8, x2: m.l + 28, y1: y, y2: y, stroke: s.color, "stroke-width": 2,
        "stroke-dasharray": s.dash || "none" }));
      svg.appendChild(svgEl("text", { x: m.l + 32, y: y + 3, "font-size": 9 }, s.label));
    });
  }
  return { X, Y };
}

// A viridis-like ramp (5 stops) and a magma-like one, for heat maps.
const RAMPS = {
  viridis: [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
  magma: [[0, 0, 4], [81, 18, 124], [183, 55, 121], [252, 137, 97], [252, 253, 191]],
};

function ramp(name, t) {
  const stops = RAMPS[name];
  const u = Math.min(Math.max(t, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(u), stops.length - 2), f = u - i;
  return stops[i].map((c, k) => Math.round(c + f * (stops[i + 1][k] - c)));
}

// Paint `values` (rows x cols, row-major, NaN = blank) onto `canvas` scaled to [vmin, vmax].
// Row 0 is drawn at the top unless originLower.
export function heatMap(canvas, values, rows, cols, { vmin, vmax, cmap = "viridis", originLower = false }) {
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  for (let r = 0; r < rows; r++) {
    const rr = originLower ? rows - 1 - r : r;
    for (let c = 0; c < cols; c++) {
      const v = values[r * cols + c], o = 4 * (rr * cols + c);
      if (Number.isNaN(v)) { img.data[o + 3] = 0; continue; }
      const [R, G, B] = ramp(cmap, (v - vmin) / (vmax - vmin || 1));
      img.data[o] = R; img.data[o + 1] = G; img.data[o + 2] = B; img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}

// Axes for a heat map that heatMap paints on `canvas` (shown at `width` x `height` CSS px): ticks with numbers and an
// axis label in an SVG to its left and one below it, as the notebooks' matplotlib heat maps have. heatFrame(canvas,
// {width, height}) wraps the canvas once and returns the wrapper to place; heatAxes(canvas, opts) (re)draws the
// ticks for opts = {xlim, ylim, xlabel, ylabel}: xlim the data values at the canvas's left and right edges, ylim
// those at its top and bottom edges (so [-0.5, n - 0.5] for row 0 at the top, [n - 0.5, -0.5] with originLower).
// Only integer ticks are drawn: the axes count tokens, keys and pairs.
const AXIS_W = 46, AXIS_H = 34;

export function heatFrame(canvas, { width, height }) {
  // On a narrow page (a phone) the frame shrinks as a whole: the canvas keeps its aspect ratio, and each axis SVG
  // scales with it (its viewBox), so the ticks stay on the cells they name.
  const grid = document.createElement("div");
  grid.className = "ropelab-heat-frame";
  grid.style.cssText = `display:grid;grid-template-columns:${AXIS_W}px minmax(0,${width + 2}px);`
    + `grid-template-rows:auto auto;flex:0 1 auto;min-width:0;width:${AXIS_W + width + 2}px;max-width:100%`;
  canvas.style.width = "100%";
  canvas.style.height = "auto";
  canvas.style.aspectRatio = `${width + 2} / ${height + 2}`;
  canvas.style.boxSizing = "border-box";
  const yAxis = svgEl("svg", { class: "ropelab-heat-axis ropelab-heat-yaxis", viewBox: `0 0 ${AXIS_W} ${height + 2}`,
    preserveAspectRatio: "xMaxYMin meet", "aria-hidden": "true" });
  yAxis.style.cssText = "width:100%;height:0;min-height:100%;overflow:visible";  // the canvas alone sets the row
  const xAxis = svgEl("svg", { class: "ropelab-heat-axis ropelab-heat-xaxis", viewBox: `0 0 ${width + 2} ${AXIS_H}`,
    "aria-hidden": "true" });
  xAxis.style.cssText = "width:100%;height:auto;overflow:visible";  // a tick label at an edge is not cut in half
  grid.append(yAxis, canvas, document.createElement("span"), xAxis);
  canvas.ropelabAxes = { xAxis, yAxis, width, height };
  return grid;
}

export function heatAxes(canvas, { xlim, ylim, xlabel = "", ylabel = "" }) {
  const { xAxis, yAxis, width, height } = canvas.ropelabAxes;
  for (const s of [xAxis, yAxis]) while (s.firstChild) s.removeChild(s.firstChild);
  const marks = (a, b) => ticks(Math.min(a, b), Math.max(a, b), false)
    .map((v) => Math.round(v)).filter((v, k, all) => all.indexOf(v) === k && v >= Math.min(a, b) && v <= Math.max(a, b));
  // +1: the canvas's 1 px border; a tick sits at the data value's place on the painted area
  const X = (v) => 1 + width * (v - xlim[0]) / (xlim[1] - xlim[0]);
  const Y = (v) => 1 + height * (v - ylim[0]) / (ylim[1] - ylim[0]);
  for (const v of marks(xlim[0], xlim[1])) {
    xAxis.appendChild(svgEl("line", { x1: X(v), x2: X(v), y1: 0, y2: 4, stroke: "#333" }));
    xAxis.appendChild(svgEl("text", { x: X(v), y: 14, "text-anchor": "middle", "font-size": 10 }, String(v)));
  }
  if (xlabel) xAxis.appendChild(svgEl("text", { x: 1 + width / 2, y: AXIS_H - 4, "text-anchor": "middle", "font-size": 11 }, xlabel));
  for (const v of marks(ylim[0], ylim[1])) {
    yAxis.appendChild(svgEl("line", { x1: AXIS_W - 4, x2: AXIS_W, y1: Y(v), y2: Y(v), stroke: "#333" }));
    yAxis.appendChild(svgEl("text", { x: AXIS_W - 6, y: Y(v) + 3, "text-anchor": "end", "font-size": 10 }, String(v)));
  }
  if (ylabel) {
    yAxis.appendChild(svgEl("text", { x: 10, y: 1 + height / 2, "text-anchor": "middle", "font-size": 11,
      transform: `rotate(-90 10 ${1 + height / 2})` }, ylabel));
  }
}

// A vertical colour bar for a heat map drawn by heatMap: into `svg` (cleared first), the ramp `cmap` from vmin (bottom)
// to vmax (top), with ticks (automatic, or `tickValues`, each {v, label}) and a `label` along its side. A reader
// can then read a colour as a number, as the notebooks' matplotlib colour bars allow.
export function colorBar(svg, { vmin, vmax, cmap = "viridis", label = "", tickValues = null, height = 240 }) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = 74, H = height, m = { t: 8, b: 8 }, bw = 14, x0 = 4, ph = H - m.t - m.b;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("aria-label", `colour scale: ${label}, ${fmtG(vmin, 3)} to ${fmtG(vmax, 3)}`);
  const id = `g${Math.random().toString(36).slice(2)}`;
  const grad = svgEl("linearGradient", { id, x1: 0, y1: 1, x2: 0, y2: 0 });
  const stops = RAMPS[cmap];
  stops.forEach((c, k) => grad.appendChild(svgEl("stop", { offset: k / (stops.length - 1), "stop-color": `rgb(${c.join(",")})` })));
  const defs = svgEl("defs");
  defs.appendChild(grad);
  svg.appendChild(defs);
  svg.appendChild(svgEl("rect", { x: x0, y: m.t, width: bw, height: ph, fill: `url(#${id})`, stroke: "#333" }));
  const Y = (v) => m.t + ph * (1 - (v - vmin) / (vmax - vmin || 1));
  const marks = tickValues || ticks(vmin, vmax, false).map((v) => ({ v, label: tickLabel(v, false) }));
  for (const { v, label: text } of marks) {
    svg.appendChild(svgEl("line", { x1: x0 + bw, x2: x0 + bw + 4, y1: Y(v), y2: Y(v), stroke: "#333" }));
    svg.appendChild(svgEl("text", { x: x0 + bw + 6, y: Y(v) + 3, "font-size": 10 }, text));
  }
  if (label) {
    svg.appendChild(svgEl("text", { x: W - 6, y: m.t + ph / 2, "text-anchor": "middle", "font-size": 10,
      transform: `rotate(-90 ${W - 6} ${m.t + ph / 2})` }, label));
  }
}

// Build the page structure every explorer shares: a controls row, a printed-number line, a figure row.
// `spec` = [{name, label, kind: "range"|"select"|"text", min, max, step, options, log}] bound to model traits.
// Returns {controls, readout, figure, onChange(cb)}; a control's input event writes the trait (model.set +
// save_changes) and a trait change (from Python, or from the control) calls the redraw.
export function scaffold(model, el, spec, redraw, extra = []) {
  el.classList.add("ropelab-webexplorer");
  const controls = document.createElement("div");
  controls.className = "ropelab-controls";
  controls.style.cssText = "display:flex;flex-wrap:wrap;gap:6px 18px;font:13px sans-serif;margin-bottom:4px";
  const readout = document.createElement("pre");
  readout.className = "ropelab-readout";
  readout.setAttribute("aria-live", "polite");  // a screen reader hears the new numbers when a control moves
  readout.style.cssText = "font:13px monospace;margin:4px 0;white-space:pre-wrap";
  const error = document.createElement("div");
  error.className = "ropelab-error";
  error.setAttribute("role", "alert");
  error.style.cssText = "color:#b00;font:12px sans-serif";
  const figure = document.createElement("div");
  figure.className = "ropelab-figure";
  figure.style.cssText = "display:flex;flex-wrap:wrap;gap:6px;align-items:flex-start";
  el.append(controls, readout, error, figure);
  const inputs = {};
  for (const c of spec) {
    const label = document.createElement("label");
    label.style.cssText = "display:flex;align-items:center;gap:6px";
    label.append(document.createTextNode(c.label || c.name));
    let input;
    const show = document.createElement("span");
    show.style.cssText = "min-width:4em;font-family:monospace";
    if (c.kind === "select") {
      input = document.createElement("select");
      for (const o of c.options) {
        const opt = document.createElement("option");
        opt.value = String(o);
        opt.textContent = String(o);
        input.append(opt);
      }
    } else if (c.kind === "text") {
      input = document.createElement("input");
      input.type = "text";
      input.size = 24;
      if (c.maxlength) input.maxLength = c.maxlength;  // the browser stops the typing there; compute() still checks
    } else {
      input = document.createElement("input");
      input.type = "range";
      input.min = c.log ? Math.log10(c.min) : c.min;
      input.max = c.log ? Math.log10(c.max) : c.max;
      input.step = c.step;
    }
    input.name = c.name;
    input.dataset.trait = c.name;
    const toTrait = () => {
      if (c.kind === "text") return input.value;
      if (c.kind === "select") return c.options.find((o) => String(o) === input.value);
      const v = Number(input.value);
      return c.log ? 10 ** v : v;
    };
    const fromTrait = () => {
      const v = model.get(c.name);
      if (c.kind === "range") input.value = String(c.log ? Math.log10(v) : v);
      else input.value = String(v);
      show.textContent = c.kind === "range" ? fmtG(v, 4) : "";
    };
    input.addEventListener("input", () => {
      model.set(c.name, toTrait());
      model.save_changes();
    });
    input.addEventListener("change", () => {
      model.set(c.name, toTrait());
      model.save_changes();
    });
    inputs[c.name] = { input, fromTrait };
    label.append(input);
    if (c.kind === "range") label.append(show);
    controls.append(label);
    fromTrait();
  }
  const update = () => {
    for (const { fromTrait } of Object.values(inputs)) fromTrait();
    try {
      error.textContent = "";
      redraw({ readout, figure });
      figure.style.opacity = "";
      figure.removeAttribute("aria-hidden");
      el.classList.remove("ropelab-stale");
    } catch (e) {
      // The figure and the number still show the last valid input: say so, and grey the figure out, rather than
      // let them pass for the input now in the controls.
      error.textContent = String(e.message || e);
      readout.textContent = "No result for this input: the figure below is the last valid one.";
      figure.style.opacity = "0.3";
      figure.setAttribute("aria-hidden", "true");
      el.classList.add("ropelab-stale");
    }
  };
  // A drag fires many input events: redraw once per animation frame, from the latest state.
  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; update(); });
  };
  const names = new Set(spec.map((c) => c.name).concat(extra));
  const handlers = [];
  for (const n of names) {
    const h = () => schedule();
    model.on(`change:${n}`, h);
    handlers.push([n, h]);
  }
  update();
  return () => {
    if (model.off) for (const [n, h] of handlers) model.off(`change:${n}`, h);
  };
}

export function newSvg(parent, cls) {
  // Prefixed: a page's own CSS must not style the plot (the site's theme ships Bootstrap, whose .ratio stretched
  // notebook 07's "ratio" plot to the column and moved its frame).
  const s = svgEl("svg", { class: `ropelab-plot ropelab-plot-${cls}`, role: "img", "aria-label": `${cls} plot` });
  parent.append(s);
  return s;
}
