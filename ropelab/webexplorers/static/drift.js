// Dynamic NTK's stale cached keys at current length L (ropelab.staleness.ntk_drift; ropelab.explorers.DriftExplorer,
// notebook 05). Key m entered the cache at length m + 1 and was rotated with omega(b(m + 1)); the query at L uses
// omega(b(L)), b(L) = b (s L / L0 - (s - 1))^(d / (d - 2)) past L0: the phase error m (omega_i(L) - omega_i(m + 1)).
import { checkBase, checkEvenInt, checkInt, colorBar, COLORS, defaultInvFreq, fmtG, heatAxes, heatFrame, heatMap, lineChart, newSvg,
  ntkBase, scaffold, wrapped } from "./common.js";

export const NAME = "drift";
export const DEFAULTS = { length: 1024, head_dim: 64, base: 10000.0, original_length: 256, factor: 4.0 };

// phase_error and wrapped: Float64Array [length * d/2], row m = key, column i = pair.
export function compute({ length, head_dim, base, original_length, factor }) {
  checkInt("length", length, 1, 1 << 16);
  checkEvenInt("head_dim", head_dim, 2, 1024);
  checkInt("original_length", original_length, 1, Number.MAX_SAFE_INTEGER);
  checkBase(base);
  if (!(typeof factor === "number" && factor >= 1)) throw new Error(`factor must be a number >= 1, got ${factor}`);
  const half = head_dim / 2;
  const inv = (L) => defaultInvFreq(head_dim, ntkBase(base, head_dim, L, original_length, factor));
  const now = inv(length);
  const phase = new Float64Array(length * half), wrap = new Float64Array(length * half);
  let over = 0;
  let then = null, thenBase = NaN;
  for (let m = 0; m < length; m++) {
    const b = ntkBase(base, head_dim, m + 1, original_length, factor);
    if (b !== thenBase) { then = inv(m + 1); thenBase = b; }
    for (let i = 0; i < half; i++) {
      const e = m * (now[i] - then[i]);
      phase[m * half + i] = e;
      const w = wrapped(e);
      wrap[m * half + i] = w;
      if (w > Math.PI / 2) over++;
    }
  }
  return { phase_error: phase, wrapped: wrap, base_now: ntkBase(base, head_dim, length, original_length, factor),
    frac_over_half_pi: over / (length * half), rows: length, cols: half };
}

export function summary(p, out = compute(p)) {
  return { base_now: out.base_now, frac_over_half_pi: out.frac_over_half_pi,
    text: `L = ${p.length} (L0 = ${p.original_length}, s = ${fmtG(p.factor)}): b(L) = ${fmtG(out.base_now, 4)}\n`
      + `${(100 * out.frac_over_half_pi).toFixed(1)} % of (key, pair) phases turned by > π/2` };
}

const CONTROLS = [
  { name: "length", label: "current length L", kind: "range", min: 1, max: 1024, step: 1 },
  { name: "factor", label: "factor s", kind: "range", min: 1, max: 16, step: 0.5 },
];

export function render({ model, el }) {
  let canvas = null, svg = null, bar = null, caption = null;
  const lengthInput = () => el.querySelector('input[data-trait="length"]');
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    if (!canvas) {
      const box = document.createElement("div");
      box.style.cssText = "display:flex;flex-direction:column;font:12px sans-serif;min-width:0;max-width:100%";
      caption = document.createElement("span");
      box.append(caption);
      canvas = document.createElement("canvas");
      canvas.className = "drift";
      canvas.style.cssText = "width:440px;height:240px;image-rendering:pixelated;border:1px solid #333";
      const row = document.createElement("div");
      row.style.cssText = "display:flex;gap:4px;align-items:flex-start";
      row.append(heatFrame(canvas, { width: 440, height: 240 }));
      box.append(row, Object.assign(document.createElement("span"), {
        textContent: "colour: |phase error| wrapped, 0 .. π (scale at the right); past 512 keys each column is the "
          + "largest over a block of keys" }));
      figure.append(box);
      bar = newSvg(row, "colorbar");
      colorBar(bar, { vmin: 0, vmax: Math.PI, cmap: "magma", label: "|phase error|, wrapped (rad)", height: 242,
        tickValues: [{ v: 0, label: "0" }, { v: Math.PI / 2, label: "π/2" }, { v: Math.PI, label: "π" }] });
      svg = newSvg(figure, "worst");
    }
    lengthInput().max = String(4 * p.original_length);
    const out = compute(p), s = summary(p, out), half = out.cols;
    readout.textContent = s.text;
    caption.textContent = s.text.split("\n")[0];
    // Drawn at most 512 key columns wide, the maximum over each block of keys (as the Python explorer does).
    const block = Math.ceil(p.length / 512), cols = Math.ceil(p.length / block);
    const img = new Float64Array(half * cols);
    for (let m = 0; m < p.length; m++) {
      const c = Math.floor(m / block);
      for (let i = 0; i < half; i++) img[i * cols + c] = Math.max(img[i * cols + c], out.wrapped[m * half + i]);
    }
    heatMap(canvas, img, half, cols, { vmin: 0, vmax: Math.PI, cmap: "magma", originLower: true });
    heatAxes(canvas, { xlim: [0, cols * block], ylim: [half - 0.5, -0.5], xlabel: "cached key position m",
      ylabel: "pair i" });
    const worst = new Array(half).fill(0);
    for (let m = 0; m < p.length; m++) for (let i = 0; i < half; i++) {
      worst[i] = Math.max(worst[i], Math.abs(out.phase_error[m * half + i]));
    }
    lineChart(svg, {
      width: 340, height: 280, ylog: true, xlim: [-0.5, half - 0.5], ylim: [1e-12, Math.max(10, 3 * Math.max(...worst))],
      xlabel: "pair i", ylabel: "largest |phase error| over keys (rad)", title: s.text.split("\n")[1],
      hlines: [{ y: Math.PI / 2, color: COLORS[3] }],
      series: [{ x: worst.map((_, i) => i), y: worst.map((w) => Math.max(w, 1e-12)), color: COLORS[0], marker: true, width: 1 }],
    });
  }, ["head_dim", "base", "original_length"]);
}

export default { render };
