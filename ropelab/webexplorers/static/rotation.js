// One pair's rotation (notebook 00, section 1): q at position m and k at m + distance, each rotated by its
// position times theta, R(a) = [[cos a, -sin a], [sin a, cos a]]; their dot product depends on the distance
// alone, <R(m t) q, R(n t) k> = q . R((n - m) t) k (ropelab.reference_matrix on one pair).
import { COLORS, checkInt, fmtG, lineChart, newSvg, scaffold } from "./common.js";

export const NAME = "rotation";
export const DEFAULTS = { theta: 0.3, position: 0, distance: 5, q: [1.0, 0.3], k: [0.2, 1.0] };

function rotate([x, y], a) {
  const c = Math.cos(a), s = Math.sin(a);
  return [c * x - s * y, s * x + c * y];
}

function pair(name, v) {
  if (!Array.isArray(v) || v.length !== 2 || !v.every(Number.isFinite)) {
    throw new Error(`${name} must be a pair of two finite numbers, e.g. [1, 0.3]; got ${JSON.stringify(v)}`);
  }
  return v;
}

// q_rot = R(m theta) q, k_rot = R((m + distance) theta) k, score = q_rot . k_rot, and relative = q . R(distance
// theta) k (the same number by the relative-position property, up to round-off).
export function compute({ theta, position, distance, q, k }) {
  if (!Number.isFinite(theta)) throw new Error(`theta must be a finite number (radians per position), got ${theta}`);
  checkInt("position", position, 0, 1 << 20);
  checkInt("distance", distance, -(1 << 20), 1 << 20);
  pair("q", q);
  pair("k", k);
  const qRot = rotate(q, position * theta), kRot = rotate(k, (position + distance) * theta);
  const kRel = rotate(k, distance * theta);
  return { q_rot: qRot, k_rot: kRot, score: qRot[0] * kRot[0] + qRot[1] * kRot[1], relative: q[0] * kRel[0] + q[1] * kRel[1] };
}

export function summary(params, out = compute(params)) {
  return { score: out.score, text: `score at m = ${params.position}, distance ${params.distance}: ${out.score.toFixed(6)}`
    + ` (q · R(${params.distance}θ) k = ${out.relative.toFixed(6)})` };
}

const CONTROLS = [
  { name: "theta", label: "θ (rad per position)", kind: "range", min: 0, max: 3.14, step: 0.01 },
  { name: "position", label: "m (q's position)", kind: "range", min: 0, max: 40, step: 1 },
  { name: "distance", label: "n − m", kind: "range", min: -20, max: 20, step: 1 },
];

export function render({ model, el }) {
  let svg = null;
  return scaffold(model, el, CONTROLS, ({ readout, figure }) => {
    if (!svg) svg = newSvg(figure, "rotation");
    const p = Object.fromEntries(Object.keys(DEFAULTS).map((k) => [k, model.get(k)]));
    const out = compute(p);
    readout.textContent = summary(p, out).text;
    const t = Array.from({ length: 101 }, (_, n) => (2 * Math.PI * n) / 100);
    const r = Math.max(Math.hypot(...p.q), Math.hypot(...p.k)) * 1.04;
    const lim = 1.35 * r;
    lineChart(svg, {
      width: 360, height: 380, xlim: [-lim, lim], ylim: [-lim, lim], noTicks: true, legend: true, // a square plot area
      title: `q at m = ${p.position}, k at m + ${p.distance}: one angle between them`,
      series: [
        { x: t.map((a) => r * Math.cos(a)), y: t.map((a) => r * Math.sin(a)), color: "#ccc", width: 1 },
        { x: [0, p.q[0]], y: [0, p.q[1]], color: "#aaa", width: 1, dash: "2 2", label: "q, k unrotated" },
        { x: [0, p.k[0]], y: [0, p.k[1]], color: "#aaa", width: 1, dash: "2 2" },
        { x: [0, out.q_rot[0]], y: [0, out.q_rot[1]], color: COLORS[0], width: 2.5, label: `q rotated by ${p.position}θ` },
        { x: [0, out.k_rot[0]], y: [0, out.k_rot[1]], color: COLORS[1], width: 2.5, dash: "6 3",
          label: `k rotated by ${p.position + p.distance}θ` },
      ],
    });
    svg.querySelector(".title").textContent += `  (θ = ${fmtG(p.theta, 3)})`;
  }, ["q", "k"]);
}

export default { render };
