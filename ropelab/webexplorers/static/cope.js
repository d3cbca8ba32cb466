// CoPE's gates and contextual positions on a typed sequence with hand-set (untrained) q and k
// (ropelab.cope.cope_gates; ropelab.explorers.CoPEExplorer, notebook 04). Key j is k_j = (f_j, 1) with f_j = 1 when
// character j matches the count rule; every query is q = sqrt(2) s (2, -1); the gate is
// g_ij = sigmoid(q . k_j / sqrt(2)) (0 above the diagonal) and p_ij = sum_{k=j..i} g_ik, clamped at npos_max - 1.
import { COLORS, colorBar, heatAxes, heatFrame, heatMap, lineChart, newSvg, scaffold } from "./common.js";

export const NAME = "cope";
export const DEFAULTS = { text: "a b  c   d e", count: "symbols (not blanks or punctuation)", sharpness: 6.0 };

// ropelab.cope.COUNT_RULES, with Python's str methods on one code point: isalnum (letters and numbers),
// isspace (Unicode white space), and c.lower() in "aeiou".
const SPACE = /^[\s\u001c-\u001f\u0085]$/u;
export const COUNT_RULES = {
  "symbols (not blanks or punctuation)": (c) => /^[\p{L}\p{N}]$/u.test(c),
  vowels: (c) => "aeiou".includes(c.toLowerCase()),
  "spaces (word boundaries)": (c) => SPACE.test(c) && c !== "\ufeff",
  "every token": () => true,
};

export function compute({ text, count, sharpness, npos_max = 64 }) {
  if (typeof text !== "string" || !text) throw new Error("text must be a non-empty string (one token per character), e.g. 'a b  c'.");
  const tokens = Array.from(text); // code points, as Python iterates a str
  if (tokens.length > 256) throw new Error(`text must be at most 256 characters, got ${tokens.length}.`);
  if (!(count in COUNT_RULES)) throw new Error(`count must be one of ${Object.keys(COUNT_RULES).join(", ")}, got ${count}.`);
  if (!(typeof sharpness === "number" && sharpness >= 0 && sharpness <= 50)) {
    throw new Error(`sharpness must be a number in [0, 50] (0: every gate is 1/2), got ${sharpness}.`);
  }
  const s = tokens.length, f = tokens.map((c) => (COUNT_RULES[count](c) ? 1.0 : 0.0));
  const q0 = Math.sqrt(2) * sharpness * 2.0, q1 = Math.sqrt(2) * sharpness * -1.0, root = Math.sqrt(2);
  const gates = new Float64Array(s * s), positions = new Float64Array(s * s), dist = new Float64Array(s * s);
  for (let i = 0; i < s; i++) {
    let acc = 0;
    for (let j = s - 1; j >= 0; j--) { // reverse cumulative sum over the keys
      const g = j <= i ? 1 / (1 + Math.exp(-((q0 * f[j] + q1 * 1.0) / root))) : 0.0;
      gates[i * s + j] = g;
      acc += g;
      positions[i * s + j] = Math.min(acc, npos_max - 1);
      dist[i * s + j] = j <= i ? i - j + 1 : 0;
    }
  }
  return { tokens, gates, positions, token_distance: dist, size: s };
}

export function summary(p, out = compute(p)) {
  const s = out.size, counted = out.positions[(s - 1) * s];
  return { counted, text: `seen from the last token: ${counted.toFixed(2)} counted, ${s} tokens` };
}

const CONTROLS = [
  { name: "text", label: "sequence", kind: "text", maxlength: 256 },
  { name: "count", kind: "select", options: Object.keys(COUNT_RULES) },
  { name: "sharpness", label: "gate sharpness", kind: "range", min: 0, max: 20, step: 0.5 },
];

export function render({ model, el }) {
  let svg = null, canvas = null, caption = null, bar = null;
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    if (!svg) {
      svg = newSvg(figure, "gates");
      const box = document.createElement("div");
      box.style.cssText = "display:flex;flex-direction:column;font:12px sans-serif;min-width:0;max-width:100%";
      caption = document.createElement("span");
      canvas = document.createElement("canvas");
      canvas.className = "positions";
      canvas.style.cssText = "width:280px;height:280px;image-rendering:pixelated;border:1px solid #333";
      const row = document.createElement("div");
      row.style.cssText = "display:flex;gap:4px;align-items:flex-start";
      row.append(heatFrame(canvas, { width: 280, height: 280 }));
      box.append(caption, row, Object.assign(document.createElement("span"),
        { textContent: "query i (rows) × key j (columns); colour: p_ij (scale at the right); blank above the diagonal" }));
      figure.append(box);
      bar = newSvg(row, "colorbar");
    }
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    const out = compute(p), s = out.size, sm = summary(p, out), x = Array.from({ length: s }, (_, k) => k);
    readout.textContent = sm.text;
    const last = (a) => Array.from(a.slice((s - 1) * s, s * s));
    const g = last(out.gates);
    const stepsX = [], stepsY = []; // drawstyle="steps-mid"
    g.forEach((v, k) => { stepsX.push(k - 0.5, k + 0.5); stepsY.push(v, v); });
    const labels = s <= 40 ? out.tokens.map((c, k) => ({ x: k, label: c === " " ? "␣" : c })) : [];
    lineChart(svg, { width: 480, height: 300, xlim: [-0.5, s - 0.5], ylim: [0, Math.max(s, 1) * 1.25], xlabel: "key",
      xticks: labels,
      title: sm.text, legend: true, series: [
        { x: stepsX, y: stepsY, color: COLORS[0], label: "gate g of the last query" },
        { x, y: last(out.positions), color: COLORS[1], marker: true, label: "CoPE position p" },
        { x, y: last(out.token_distance), color: "#666", dash: "1 2", label: "token distance" },
      ] });
    const shown = out.positions.map((v, k) => (k % s <= Math.floor(k / s) ? v : NaN));
    const vmax = Math.max(...shown.filter((v) => !Number.isNaN(v)), 1e-9);
    heatMap(canvas, shown, s, s, { vmin: 0, vmax });
    heatAxes(canvas, { xlim: [-0.5, s - 0.5], ylim: [-0.5, s - 0.5], xlabel: "key j", ylabel: "query i" });
    colorBar(bar, { vmin: 0, vmax, label: "CoPE position p_ij", height: 282 });
    caption.textContent = `contextual positions, counting ${p.count}`;
  });
}

export default { render };
