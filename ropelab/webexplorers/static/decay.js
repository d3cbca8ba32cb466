// RoFormer's decay envelope against what the logit does (ropelab.decay.decay_view; ropelab.explorers.DecayExplorer,
// notebook 03). Envelope (1/(d/2)) sum_j |S_j| with S_j = sum_{i<j} e^{i r theta_i}; aligned q = k: 2 B_r with
// B_r = sum_i cos(r theta_i); independent Gaussian q, k: mean 0 and spread sqrt(d) at every distance
// (drawn from that closed form here; the Python explorer draws a seeded sample of 64 pairs).
import { COLORS, checkBase, checkEvenInt, checkInt, defaultInvFreq, fmtG, lineChart, newSvg, scaffold } from "./common.js";

export const NAME = "decay";
export const DEFAULTS = { base: 10000.0, head_dim: 128, distance: 4096 };

// torch.unique(torch.linspace(0, distance, n).round().long()): linspace in float32 as torch's CPU kernel forms
// it (start + step i for the first half, end - step (n - 1 - i) for the second), rounded half to even.
export function distances(distance, n = 256) {
  const f = Math.fround, step = f(f(distance) / f(n - 1)), half = Math.floor(n / 2);
  const out = [];
  for (let i = 0; i < n; i++) {
    const v = i < half ? f(step * i) : f(f(distance) - f(step * (n - 1 - i)));
    const fl = Math.floor(v), d = v - fl;
    const r = d > 0.5 ? fl + 1 : d < 0.5 ? fl : fl % 2 === 0 ? fl : fl + 1;
    if (out.length === 0 || out[out.length - 1] !== r) out.push(r);
  }
  return out;
}

function similarity(r, theta) {
  let b = 0;
  for (let i = 0; i < theta.length; i++) b += Math.cos(r * theta[i]);
  return b;
}

// ropelab.decay.first_negative: the first integer r <= distance with B_r < 0, or null.
export function firstNegative(base, headDim, distance) {
  const theta = defaultInvFreq(headDim, base);
  for (let r = 0; r <= distance; r++) if (similarity(r, theta) < 0) return r;
  return null;
}

export function compute({ base, head_dim, distance, n_points = 256 }) {
  checkBase(base);
  checkEvenInt("head_dim", head_dim, 2, 1024);
  checkInt("distance", distance, 1, 1 << 20);
  const theta = defaultInvFreq(head_dim, base), r = distances(distance, n_points);
  const envelope = new Float64Array(r.length), aligned = new Float64Array(r.length);
  for (let n = 0; n < r.length; n++) {
    let re = 0, im = 0, sum = 0;
    for (let i = 0; i < theta.length; i++) {
      const a = r[n] * theta[i];
      re += Math.cos(a);
      im += Math.sin(a);
      sum += Math.hypot(re, im);
    }
    envelope[n] = sum / theta.length;
    aligned[n] = 2 * similarity(r[n], theta);
  }
  return { r, envelope, aligned, gaussian_mean: 0, gaussian_std: Math.sqrt(head_dim),
    first_negative: firstNegative(base, head_dim, distance) };
}

export function summary(params, out = compute(params)) {
  const neg = out.first_negative;
  const note = neg !== null ? `B_r < 0 first at r = ${neg}` : `B_r ≥ 0 up to r = ${params.distance}`;
  return { first_negative: neg, text: `base ${fmtG(params.base, 3)}, d = ${params.head_dim}: ${note}` };
}

const CONTROLS = [
  { name: "base", kind: "range", log: true, min: 100, max: 1e7, step: 0.1 },
  { name: "head_dim", kind: "select", options: [16, 32, 64, 128, 256] },
  { name: "distance", label: "max distance", kind: "range", min: 64, max: 32768, step: 64 },
];

export function render({ model, el }) {
  let svg = null;
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    if (!svg) svg = newSvg(figure, "decay");
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    const out = compute(p), s = summary(p, out), sd = out.gaussian_std;
    readout.textContent = s.text;
    const env = Array.from(out.envelope), al = Array.from(out.aligned);
    const ymin = Math.min(-sd, ...al, 0), ymax = Math.max(sd, ...al, ...env);
    lineChart(svg, {
      width: 760, height: 300, xlim: [0, p.distance], ylim: [ymin - 0.05 * (ymax - ymin), ymax + 0.3 * (ymax - ymin)],
      xlabel: "relative distance r", ylabel: "logit", title: s.text, legend: true, hlines: [{ y: 0, color: "#444", dash: "none" }],
      series: [
        { x: [0, p.distance], y: [sd, sd], fill: [-sd, -sd], color: COLORS[2] },
        { x: out.r, y: env, color: COLORS[0], label: "RoFormer envelope (1/(d/2)) Σ|S_j|" },
        { x: out.r, y: al, color: COLORS[1], label: "aligned q ≈ k: 2 B_r" },
        { x: [0, p.distance], y: [0, 0], color: COLORS[2], label: "independent Gaussian q, k: mean 0 (band: ± √d)" },
      ],
    });
  });
}

export default { render };
