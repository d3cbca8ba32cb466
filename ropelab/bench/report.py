"""The benchmark block of ``docs/guides/benchmarks.md`` (:data:`PAGE`), rendered from the committed JSON
(``data/bench/cpu.json``, ``decode.json``), so the guide quotes no speed that the files do not hold.
``python -m ropelab.bench readme`` rewrites the block between :data:`BEGIN` and :data:`END`; a test checks that the
committed block is the rendering of the committed files. Two measurements are called equal within noise when their
interquartile ranges overlap."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from ..paths import DATA_DIR, REPO

__all__ = ["BEGIN", "END", "PAGE", "cpu_markdown", "cpu_cases_markdown", "decode_markdown", "render", "page_with",
           "write_page", "readme_with", "write_readme"]

BEGIN = "<!-- bench:begin (generated from data/bench/*.json by python -m ropelab.bench readme) -->"
END = "<!-- bench:end -->"
PAGE = REPO / "docs" / "guides" / "benchmarks.md"  # the guide that holds the block (it was in the README)


def _machine(r: dict) -> str:
    m = r["machine"]
    load = r.get("load_average_1_5_15_min")
    shared = f", load average {load[0]:.1f} when it ran" if load else ""
    return f"{m['cpu']}, {m['logical_cpus']} logical CPUs, {m['torch_threads']} threads, torch {m['torch']}{shared}"


def cpu_markdown(r: dict) -> str:
    """``python -m ropelab.bench cpu``'s rows as a table (median, IQR, GB/s, ratio to the copy), the orderings the
    IQRs support, and the notes the run recorded."""
    b, h, s, d = r["shape_bhsd"]
    lines = [f"`python -m ropelab.bench cpu` (`data/bench/cpu.json`, {r['date_utc']}): RoPE on q and k of shape "
             f"[{b}, {h}, {s}, {d}] (b h s d), {r['dtype']}, {r['repeats']} round-robin repeats, on {_machine(r)}.",
             "", "| method | median ms | IQR ms | GB/s | x copy |", "|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['method']} | {row['median_ms']:.1f} | {row['q25_ms']:.1f} to {row['q75_ms']:.1f} | "
                     f"{row['gb_per_s']:.2f} | {row['ratio_to_copy']:.2f} |")
    names = [row["method"] for row in r["rows"]]
    ordered = {tuple(p) for p in r["ordering"]}
    ties = [f"{a} and {c}" for i, a in enumerate(names) for c in names[i + 1:]
            if (a, c) not in ordered and (c, a) not in ordered]
    ratios = "; ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items())
    notes = r.get("notes", {})
    lines += ["", f"Ratios of medians in this run: {ratios}. Every ordering of two rows above holds across their "
              "IQRs" + (f" except these pairs, equal within noise: {'; '.join(ties)}" if ties else "") + "."]
    if notes:
        lines.append(f"Compiling is timed apart ({notes.get('compile_seconds_ropelab', float('nan')):.1f} s for "
                     f"ropelab's formula, {notes.get('compile_seconds_hf', float('nan')):.1f} s for Hugging Face's), "
                     "and the two formulas' outputs differ by up to "
                     f"{notes.get('max_abs_diff_ropelab_vs_hf', float('nan')):.1e} (Hugging Face forms its angles in "
                     "float32, ropelab in float64).")
    return "\n".join(lines)


DEFAULT = "ropelab.apply_rope"  # the default call, the row each case is judged by
RIVALS = ("torch.compile(HF apply_rotary_pos_emb)", "ggml_rope_ext (llama.cpp, compute only)")


def _verdict(r: dict, rival: str) -> str:
    names = {row["method"] for row in r["rows"]}
    if rival not in names or DEFAULT not in names:
        return "not timed"
    ordered = {tuple(p) for p in r["ordering"]}
    return ("faster" if (DEFAULT, rival) in ordered else "slower" if (rival, DEFAULT) in ordered
            else "equal within noise")


def cpu_cases_markdown(results: list[dict]) -> str:
    """Every case of ``python -m ropelab.bench cpu --dtypes ... --cases ...`` (``data/bench/cpu*.json``) side by
    side: each method's median as a multiple of the same run's copy, and whether the default call is ahead of
    ``torch.compile`` of Hugging Face's function and of ggml's RoPE op across their IQRs."""
    heads = [f"{r['case']} {r['dtype']} [{', '.join(map(str, r['shape_bhsd']))}]" for r in results]
    methods = list(dict.fromkeys(row["method"] for r in results for row in r["rows"]))
    lines = ["All cases of the same command (`data/bench/cpu*.json`), each method's median as a multiple of its "
             "run's copy:", "", "| method | " + " | ".join(heads) + " |", "|---|" + "---|" * len(results)]
    for m in methods:
        cells = []
        for r in results:
            row = next((x for x in r["rows"] if x["method"] == m), None)
            cells.append("-" if row is None else f"{row['ratio_to_copy']:.2f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for rival in RIVALS:
        lines.append(f"| {DEFAULT} against {rival} (IQRs) | " + " | ".join(_verdict(r, rival) for r in results)
                     + " |")
    return "\n".join(lines)


def _cpu_cases() -> list[dict]:
    order = {("prefill", "float32"): 0, ("prefill", "bfloat16"): 1, ("decode", "float32"): 2, ("decode", "bfloat16"): 3}
    found = [json.loads(f.read_text()) for f in sorted((DATA_DIR / "bench").glob("cpu*.json"))]
    found = [r for r in found if "case" in r]
    return sorted(found, key=lambda r: order.get((r["case"], r["dtype"]), 9))


def decode_markdown(r: dict) -> str:
    """``python -m ropelab.bench decode``'s rows at the longest cache: per batch and policy the median step with its
    IQR, the p99 where there are enough samples, the ratio to ``post_rope`` and whether it is equal within noise,
    and the boundary step of a bucketed schedule with its amortised cost."""
    longest = max(row["cached_tokens"] for row in r["rows"])
    hq, hkv = r["heads_q_kv"]
    lines = [f"`python -m ropelab.bench decode` (`data/bench/decode.json`, {r['date_utc']}): one decoding step of one "
             f"attention layer ({hq} query heads, {hkv} key/value heads, d = {r['head_dim']}), dynamic NTK "
             f"(factor {r['rope_scaling']['factor']:g}, L0 = {r['l0']}), {r['repeats']} timed ordinary steps per "
             "policy, "
             f"on {_machine(r)}. At {longest} cached tokens:", "",
             "| batch | policy | median ms | IQR ms | p99 ms | x post_rope | equal to post_rope within noise |",
             "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        if row["cached_tokens"] != longest or "median_ms" not in row:
            continue
        p99 = f"{row['p99_ms']:.1f}" if row.get("p99_ms") is not None else "-"
        same = "" if row["policy"] == "post_rope" else ("yes" if row.get("equal_to_post_rope_within_noise") else "no")
        lines.append(f"| {row['batch']} | {row['policy']} | {row['median_ms']:.1f} | {row['q25_ms']:.1f} to "
                     f"{row['q75_ms']:.1f} | {p99} | {row['ratio_to_post_rope']:.2f} | {same} |")
    spikes = [row for row in r["rows"] if row["cached_tokens"] == longest and "boundary_step_ms" in row]
    for row in spikes:
        lines.append("")
        lines.append(f"Batch {row['batch']}, {row['policy']}: the boundary step, which re-rotates every cached key, "
                     f"takes {row['boundary_step_ms']:.1f} ms (median of its timed repeats); spread over the steps "
                     f"until the next boundary, a step costs {row['step_ms']:.1f} ms on average "
                     f"({row['ratio_to_post_rope']:.2f}x post_rope's median).")
    return "\n".join(lines)


def render(cpu: dict | None = None, decode: dict | None = None) -> str:
    """The whole block, from the given results or the committed files."""
    cases = _cpu_cases() if cpu is None else []  # the committed cases, when the committed block is rendered
    cpu = cpu if cpu is not None else json.loads((DATA_DIR / "bench" / "cpu.json").read_text())
    decode = decode if decode is not None else json.loads((DATA_DIR / "bench" / "decode.json").read_text())
    parts = [BEGIN, cpu_markdown(cpu)] + (["", cpu_cases_markdown(cases)] if len(cases) > 1 else [])
    return "\n".join(parts + ["", decode_markdown(decode), END])


def page_with(text: str, block: str) -> str:
    """``text`` with its benchmark block replaced by ``block`` (ValueError when the markers are missing)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"the page has no benchmark block; put the lines {BEGIN!r} and {END!r} where it goes.")
    head, rest = text.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def write_page(path: str | os.PathLike | None = None) -> Path:
    """Rewrite the benchmark block of ``path`` (default :data:`PAGE`) from the committed JSON files. Returns the
    path."""
    path = Path(path) if path is not None else PAGE
    path.write_text(page_with(path.read_text(), render()))
    return path


def _renamed(old: str, new: str) -> None:
    warnings.warn(f"ropelab.bench.report.{old} is now {new} (the block moved from the README to "
                  "docs/guides/benchmarks.md); the old name is a deprecated alias.", DeprecationWarning, stacklevel=3)


def readme_with(text: str, block: str) -> str:
    """Deprecated: the old name of :func:`page_with`."""
    _renamed("readme_with", "page_with")
    return page_with(text, block)


def write_readme(path: str | os.PathLike | None = None) -> Path:
    """Deprecated: the old name of :func:`write_page` (its default is now :data:`PAGE`, no longer the README)."""
    _renamed("write_readme", "write_page")
    return write_page(path)
