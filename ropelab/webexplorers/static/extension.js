// What each context-extension method does to each pair at factor s (ropelab.extend.extension_ratios;
// ropelab.explorers.ExtensionExplorer, notebook 07): omega'_i / omega_i per method, evaluated at s L0, and the
// pairs that meet angles never trained on (right of the critical pair, s omega'_i / omega_i > 1).
import { COLORS, checkBase, checkEvenInt, checkInt, criticalPair, defaultInvFreq, fmtG, lineChart, newSvg, ntkAwareBase,
  ntkBase, pairAtTurns, scaffold } from "./common.js";

export const NAME = "extension";
export const DEFAULTS = { factor: 4.0, head_dim: 32, base: 10000.0, original_length: 256 };
export const METHODS = ["no scaling", "PI", "NTK-aware", "dynamic NTK", "YaRN", "Llama 3"];

// Each method's frequencies (ropelab.scaling.rope_types: linear, dynamic, yarn with beta_fast 32, beta_slow 1,
// truncate; llama3 with low_freq_factor 1, high_freq_factor 4) and attention factor.
function frequencies(name, s, d, base, L0, seqLen) {
  const inv = defaultInvFreq(d, base), n = inv.length;
  if (name === "no scaling") return [inv, 1.0];
  if (name === "PI") return [inv.map((w) => w / s), 1.0];
  if (name === "NTK-aware") return [defaultInvFreq(d, ntkAwareBase(base, d, s)), 1.0];
  if (name === "dynamic NTK") return [defaultInvFreq(d, ntkBase(base, d, seqLen, L0, s)), 1.0];
  if (name === "YaRN") {
    let low = Math.floor(pairAtTurns(d, base, L0, 32)), high = Math.ceil(pairAtTurns(d, base, L0, 1));
    low = Math.max(low, 0);
    high = Math.min(high, d - 1);
    if (low === high) high += 0.001;
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      const ramp = Math.min(Math.max((i - low) / (high - low), 0), 1), extrapolation = 1.0 - ramp;
      out[i] = (inv[i] / s) * (1 - extrapolation) + inv[i] * extrapolation;
    }
    return [out, s <= 1 ? 1.0 : 0.1 * Math.log(s) + 1.0];
  }
  if (name === "Llama 3") {
    const lowF = 1.0, highF = 4.0, lowWl = L0 / lowF, highWl = L0 / highF, out = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      const wl = (2 * Math.PI) / inv[i];
      const scaled = wl > lowWl ? inv[i] / s : inv[i];
      const smooth = (L0 / wl - lowF) / (highF - lowF);
      const smoothed = ((1 - smooth) * scaled) / s + smooth * scaled;
      out[i] = wl >= highWl && wl <= lowWl ? smoothed : scaled;
    }
    return [out, 1.0];
  }
  throw new Error(`unknown method ${name}`);
}

export function compute({ factor, head_dim, base, original_length }) {
  checkEvenInt("head_dim", head_dim, 4, 1024);
  checkInt("original_length", original_length, 8, Number.MAX_SAFE_INTEGER);
  checkBase(base);
  if (!(typeof factor === "number" && factor >= 1 && factor <= 1024)) {
    throw new Error(`factor must be a number in [1, 1024] (the extension factor s), got ${factor}`);
  }
  const seqLen = Math.trunc(factor * original_length), ref = defaultInvFreq(head_dim, base);
  const crit = criticalPair(head_dim, base, original_length);
  const ratio = {}, attention = {}, outOfRange = {};
  for (const name of METHODS) {
    const [inv, att] = frequencies(name, factor, head_dim, base, original_length, seqLen);
    ratio[name] = inv.map((w, i) => w / ref[i]);
    attention[name] = att;
    outOfRange[name] = [];
    for (let i = crit; i < head_dim / 2; i++) if (factor * ratio[name][i] > 1 + 1e-9) outOfRange[name].push(i);
  }
  return { ratio, attention_factor: attention, out_of_range: outOfRange, critical: crit };
}

export function summary(p, out = compute(p)) {
  const bad = METHODS.filter((n) => n !== "no scaling" && out.out_of_range[n].length);
  return { out_of_range: bad, critical: out.critical,
    text: `s = ${fmtG(p.factor)}, d = ${p.head_dim}, b = ${fmtG(p.base, 3)}, L0 = ${p.original_length}: critical pair ${out.critical}\n`
      + (bad.length ? "out of range: " + bad.join(", ") : "no method leaves a pair out of range") };
}

const CONTROLS = [
  { name: "factor", label: "factor s", kind: "range", min: 1, max: 32, step: 0.5 },
  { name: "original_length", label: "trained L0", kind: "select", options: [256, 2048, 4096, 8192] },
  { name: "base", kind: "range", log: true, min: 100, max: 1e7, step: 0.1 },
  { name: "head_dim", kind: "select", options: [16, 32, 64, 128, 256] },
];
const DASH = ["none", "6 3", "6 2 1 2", "1 2", "5 1", "1 1"];

export function render({ model, el }) {
  let svgs = null;
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    if (!svgs) svgs = [newSvg(figure, "ratio"), newSvg(figure, "reach")];
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    const out = compute(p), s = summary(p, out), n = p.head_dim / 2, i = Array.from({ length: n }, (_, k) => k);
    readout.textContent = s.text;
    const lo = Math.min(...METHODS.map((m) => Math.min(...out.ratio[m])));
    const lines = (scale) => METHODS.map((m, j) => ({ x: i, y: Array.from(out.ratio[m], (r) => scale * r), color: COLORS[j],
      dash: DASH[j], marker: true, width: 1.3, label: m }));
    const crit = [{ x: out.critical - 0.5 }];
    lineChart(svgs[0], { width: 400, height: 300, ylog: true, xlim: [-0.5, n - 0.5], ylim: [lo / 1.5, 1.5], legend: "bottom",
      xlabel: "pair i", ylabel: "ω'_i / ω_i", vlines: crit, series: lines(1),
      title: `s = ${fmtG(p.factor)}, d = ${p.head_dim}, b = ${fmtG(p.base, 3)}, L0 = ${p.original_length}` });
    lineChart(svgs[1], { width: 400, height: 300, ylog: true, xlim: [-0.5, n - 0.5], ylim: [lo / 1.5, p.factor * 1.5],
      xlabel: "pair i", ylabel: "largest angle at s·L0 / largest trained", vlines: crit, hlines: [{ y: 1, color: COLORS[3] }],
      series: lines(p.factor), title: "> 1 right of the dotted line: angles never trained on\n" + s.text.split("\n")[1] });
  });
}

export default { render };
