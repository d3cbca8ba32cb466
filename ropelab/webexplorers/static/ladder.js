// The frequency ladder and the rotation of four pairs at one position, with the angle held in a low-precision
// dtype (ropelab.precision.ladder; ropelab.explorers.LadderExplorer, notebook 00).
import { TAU, checkBase, checkEvenInt, checkInt, defaultInvFreq, fmtG, lineChart, mulIn, newSvg, roundTo, scaffold,
  wrapped, COLORS } from "./common.js";

export const NAME = "ladder";
export const DEFAULTS = { base: 10000.0, head_dim: 64, position: 100, dtype: "bfloat16" };
export const DTYPES = ["float64", "float32", "bfloat16", "float16"];

// ropelab.precision.ladder: per pair i, inv_freq b^(-2i/d), wavelength 2 pi / omega, angle m omega (float64),
// angle_dtype (m and omega held in dtype, multiplied in it), phase_error (wrapped distance to the exact angle,
// pi when the held angle is not finite) and turned (m omega >= 2 pi).
export function compute({ base, head_dim, position, dtype }) {
  checkBase(base);
  checkEvenInt("head_dim", head_dim, 2, 4096);
  checkInt("position", position, 0, 1 << 24);
  if (!DTYPES.includes(dtype)) throw new Error(`dtype must be one of ${DTYPES.join(", ")}, got ${dtype}`);
  const inv = defaultInvFreq(head_dim, base), n = inv.length;
  const out = { inv_freq: inv, wavelength: new Float64Array(n), angle: new Float64Array(n),
    angle_dtype: new Float64Array(n), phase_error: new Float64Array(n), turned: new Array(n) };
  const mHeld = roundTo(dtype, position);
  for (let i = 0; i < n; i++) {
    out.wavelength[i] = TAU / inv[i];
    const a = position * inv[i];
    out.angle[i] = a;
    const h = dtype === "float64" ? a : mulIn(dtype, mHeld, roundTo(dtype, inv[i]));
    out.angle_dtype[i] = h;
    out.phase_error[i] = dtype === "float64" ? 0 : wrapped(h - a);
    out.turned[i] = a >= TAU;
  }
  return out;
}

// The numbers the Python explorer prints in its titles.
export function summary(params, out = compute(params)) {
  const turned = out.turned.filter(Boolean).length;
  const maxErr = Math.max(...out.phase_error);
  return {
    turned, max_phase_error: maxErr,
    text: `ladder: base ${fmtG(params.base, 3)}, d = ${params.head_dim}, ${turned} pairs turned once\n`
      + `${params.dtype} angle vs float64: max ${fmtG(maxErr, 2)} rad`,
  };
}

const CONTROLS = [
  { name: "base", kind: "range", log: true, min: 100, max: 1e7, step: 0.1 },
  { name: "head_dim", kind: "select", options: [16, 32, 64, 128, 256] },
  { name: "position", kind: "range", min: 0, max: 8192, step: 1 },
  { name: "dtype", kind: "select", options: DTYPES },
];

export function render({ model, el }) {
  let svgs = null;
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    if (!svgs) svgs = [newSvg(figure, "ladder"), newSvg(figure, "circle"), newSvg(figure, "error")];
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    const out = compute(p), s = summary(p, out), n = out.inv_freq.length;
    const i = Array.from({ length: n }, (_, k) => k);
    const wl = Array.from(out.wavelength), pos = Math.max(p.position, 1);
    readout.textContent = s.text;
    lineChart(svgs[0], {
      width: 380, height: 280, ylog: true, xlim: [-0.5, n - 0.5],
      ylim: [Math.min(...wl, pos) / 2, Math.max(...wl, p.position) * 2], xlabel: "pair i", ylabel: "positions per turn",
      title: `ladder: base ${fmtG(p.base, 3)}, d = ${p.head_dim}, ${s.turned} pairs turned once`, legend: true,
      series: [{ x: i, y: wl, color: COLORS[0], marker: true, width: 1, label: "2π/ω_i" },
        { x: [0, n - 1], y: [pos, pos], color: COLORS[3], dash: "5 3", width: 1, label: "position" }],
    });
    const t = Array.from({ length: 101 }, (_, k) => (TAU * k) / 100);
    const series = [{ x: t.map(Math.cos), y: t.map(Math.sin), color: "#ccc", width: 1 }];
    const pairs = [0, Math.floor(p.head_dim / 8), Math.floor(p.head_dim / 4), p.head_dim / 2 - 1];
    ["0", "d/8", "d/4", "d/2-1"].forEach((label, k) => {
      const a = out.angle[pairs[k]], h = out.angle_dtype[pairs[k]];
      series.push({ x: [0, Math.cos(a)], y: [0, Math.sin(a)], color: COLORS[k], width: 2.5, label: `pair ${label}` });
      series.push({ x: [0, Math.cos(h)], y: [0, Math.sin(h)], color: COLORS[k], width: 1.5, dash: "2 2" });
    });
    lineChart(svgs[1], { width: 260, height: 280, xlim: [-1.15, 1.15], ylim: [-1.15, 1.15], noTicks: true, legend: "bottom",
      title: `pairs at position ${p.position}\n(dotted: angle in ${p.dtype})`, series });
    lineChart(svgs[2], {
      width: 380, height: 280, ylog: true, xlim: [-0.5, n - 0.5], ylim: [1e-17, 10], xlabel: "pair i",
      ylabel: "phase error (rad)", title: `${p.dtype} angle vs float64: max ${fmtG(s.max_phase_error, 2)} rad`,
      hlines: [{ y: 0.1 }],
      series: [{ x: i, y: Array.from(out.phase_error, (e) => Math.max(e, 1e-17)), color: COLORS[3], marker: true, line: false }],
    });
  });
}

export default { render };
