// The bytes each RoPE implementation moves at one shape, in units of a copy of q and k (a model:
// ropelab.kernels.traffic.bytes_view; ropelab.explorers.BytesExplorer, notebook 06). With Bq, Bk the bytes of q
// [b, hq, s, d] and k [b, hk, s, d] and T = s d e those of one Hugging Face table [1, s, d] (e bytes an element):
// - the copy (the reference) reads and writes Bq + Bk;
// - Hugging Face's eager apply_rotary_pos_emb runs, on q and on k, mul(x, cos), neg(half of x), cat, mul(., sin),
//   add: it reads 5.5 B + 2 T and writes 4.5 B per tensor (the op-by-op trace of count_eager, which the tests
//   compare with this closed form at several shapes);
// - the fused kernel reads q, k and the cos/sin rows (2 s d/2 float32) and writes q, k; "as issued" charges those
//   rows once per program sharing a token block, per sequence (fused_rope.launch_tiles's grid).
import { COLORS, checkEvenInt, checkInt, fmtG, lineChart, newSvg, scaffold } from "./common.js";

export const NAME = "bytes";
export const DEFAULTS = { batch: 1, heads_q: 32, heads_k: 8, seq: 2048, head_dim: 128, dtype: "bfloat16" };
export const ITEMSIZE = { bfloat16: 2, float16: 2, float32: 4 };

const pow2 = (n) => 2 ** Math.max(0, Math.ceil(Math.log2(Math.max(n, 1))));

// ropelab.kernels.fused_rope.launch_tiles: programs per token block (grid[1]) times sequences (grid[2]).
export function tableLoads(batch, heads_q, heads_k, seq, half) {
  const blockS = Math.max(1, Math.min(pow2(Math.max(seq, 1)), Math.floor(2048 / pow2(half))));
  const nBlocks = Math.max(1, Math.ceil(seq / blockS));
  let hpp = 1;
  while (hpp < 8 && nBlocks * batch * Math.ceil((heads_q + heads_k) / (2 * hpp)) >= 1024) hpp *= 2;
  return (Math.ceil(heads_q / hpp) + (heads_k ? Math.ceil(heads_k / hpp) : 0)) * batch;
}

export function compute({ batch, heads_q, heads_k, seq, head_dim, dtype }) {
  checkInt("batch", batch, 1, 1024);
  checkInt("heads_q", heads_q, 1, 1024);
  checkInt("heads_k", heads_k, 1, 1024);
  checkInt("seq", seq, 1, 1 << 20);
  checkEvenInt("head_dim", head_dim, 2, 1024);
  if (!(dtype in ITEMSIZE)) throw new Error(`dtype must be one of ${Object.keys(ITEMSIZE).join(", ")}, got ${dtype}`);
  const e = ITEMSIZE[dtype], half = head_dim / 2;
  const bq = batch * heads_q * seq * head_dim * e, bk = batch * heads_k * seq * head_dim * e, t = seq * head_dim * e;
  const rows = 2 * seq * half * 4, loads = tableLoads(batch, heads_q, heads_k, seq, half);
  return {
    copy: [bq + bk, bq + bk],
    hf_eager: [5.5 * (bq + bk) + 4 * t, 4.5 * (bq + bk)],
    fused: [bq + bk + rows, bq + bk],
    fused_issued: [bq + bk + rows * loads, bq + bk],
    table_loads: loads,
  };
}

const total = (rw) => rw[0] + rw[1];

export function summary(p, out = compute(p)) {
  const copy = total(out.copy), hf = total(out.hf_eager) / copy, fused = total(out.fused) / copy;
  const issued = total(out.fused_issued) / copy;
  return { hf, fused, issued, text: `HF eager ${hf.toFixed(2)}x a copy, ${(hf / fused).toFixed(2)}x the fused kernel; `
    + `fused ${fused.toFixed(3)}x a copy (cos/sin charged once)\n`
    + `fused with cos/sin as issued (${out.table_loads} loads per row): ${issued.toFixed(3)}x a copy; `
    + `a copy of q and k: ${fmtG(copy / 1e6, 4)} MB` };
}

const BARS = [["copy", "copy (reference)"], ["hf_eager", "HF eager"], ["fused", "fused, cos/sin once"],
  ["fused_issued", "fused, as issued"]];

const CONTROLS = [
  { name: "heads_q", label: "q heads", kind: "range", min: 1, max: 64, step: 1 },
  { name: "heads_k", label: "k heads", kind: "range", min: 1, max: 64, step: 1 },
  { name: "batch", kind: "range", min: 1, max: 16, step: 1 },
  { name: "seq", label: "tokens", kind: "range", min: 16, max: 8192, step: 16 },
  { name: "head_dim", kind: "select", options: [64, 128, 256] },
  { name: "dtype", kind: "select", options: Object.keys(ITEMSIZE) },
];

export function render({ model, el }) {
  let svg = null;
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    if (!svg) svg = newSvg(figure, "bytes");
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    const out = compute(p), s = summary(p, out), copy = total(out.copy);
    readout.textContent = s.text;
    const series = [];
    BARS.forEach(([key], k) => {
      const [r, w] = out[key].map((v) => v / copy), x = [k - 0.32, k + 0.32];
      series.push({ x, y: [r, r], fill: [0, 0], color: COLORS[0], opacity: 0.85 });
      series.push({ x, y: [r + w, r + w], fill: [r, r], color: COLORS[1], opacity: 0.85 });
    });
    series.push({ x: [0], y: [0], color: COLORS[0], label: "read", line: false });
    series.push({ x: [0], y: [0], color: COLORS[1], label: "written", line: false });
    const top = Math.max(...BARS.map(([key]) => total(out[key]) / copy));
    lineChart(svg, { width: 520, height: 300, xlim: [-0.6, BARS.length - 0.4], ylim: [0, 1.12 * top],
      xticks: BARS.map(([, label], k) => ({ x: k, label })), xlabel: "implementation",
      ylabel: "bytes moved, in copies of q and k",
      title: `q [${p.batch}, ${p.heads_q}, ${p.seq}, ${p.head_dim}], k with ${p.heads_k} heads, ${p.dtype} (model)`,
      hlines: [{ y: 1, color: "#555" }], legend: true, series });
  });
}

export default { render };
