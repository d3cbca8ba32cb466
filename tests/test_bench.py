"""The benchmark command runs and reports what it claims (no timing assertions: ratios are measured
by `python -m ropelab.bench cpu`, not by tests)."""

from __future__ import annotations

import json

import pytest

from ropelab import bench


def test_bench_cpu_small(tmp_path):
    out = tmp_path / "cpu.json"
    args = ["cpu", "--shape", "1", "2", "64", "16", "--repeats", "2", "--no-compile", "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    names = [r["method"] for r in result["rows"]]
    assert names[:3] == [bench.COPY, "ropelab.apply_rope", "ropelab.rotate (tables given)"]
    assert "HF apply_rotary_pos_emb (eager)" in names
    assert all(0 < r["q25_ms"] <= r["median_ms"] <= r["q75_ms"] for r in result["rows"])
    assert result["rows"][0]["ratio_to_copy"] == 1.0
    # an ordering is listed only where the IQRs are disjoint
    by = {r["method"]: r for r in result["rows"]}
    assert all(by[a]["q75_ms"] < by[b]["q25_ms"] for a, b in result["ordering"])
    assert "hf_eager / ropelab.apply_rope" in result["ratios"]
    # ropelab and HF rotate the same way: they differ only by float32 angle rounding at positions < 64
    assert result["notes"]["max_abs_diff_ropelab_vs_hf"] < 1e-4


def test_bench_decode_small(tmp_path):
    out = tmp_path / "decode.json"
    args = ["decode", "--lengths", "64", "200", "--batches", "1", "--heads", "4", "2", "--head-dim", "16",
            "--repeats", "1", "--out", str(out)]
    assert bench.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    policies = {r["policy"] for r in rows}
    assert policies == {"post_rope", "bucketed", "bucketed (amortised)", "recompute", "rope_on_load"}
    by = {(r["cached_tokens"], r["policy"]): r for r in rows}
    # recompute reads the raw keys, writes a rotated copy and reads it: about 3x post_rope's key traffic
    assert by[(200, "recompute")]["key_bytes_per_step"] > 2.5 * by[(200, "post_rope")]["key_bytes_per_step"]
    assert by[(200, "rope_on_load")]["key_bytes_per_step"] == by[(200, "post_rope")]["key_bytes_per_step"]


def test_step_distribution_shows_a_rare_spike_only_in_the_max():
    # 511 ordinary steps of 1.00 to 1.99 ms (100 samples) and one boundary step of 50 ms in a window of 512
    steps = [0.001 + 1e-5 * i for i in range(100)]
    d = bench.step_distribution(steps, [0.05, 0.052, 0.048], 512)
    assert abs(d["median_ms"] - 1.495) < 1e-9 and abs(d["q25_ms"] - 1.2475) < 1e-9 and d["n_steps"] == 100
    # the p99 (nearest rank over the 512 steps, each sample standing for 5.11 of them): the top 1 % of the
    # window is the boundary step and about 4 ordinary steps, i.e. the slowest sample, not the 50 ms spike
    assert abs(d["p99_ms"] - 1.99) < 1e-9
    assert abs(d["max_ms"] - 50.0) < 1e-9 and abs(d["boundary_ms"] - 50.0) < 1e-9 and d["n_boundary"] == 3
    # without a boundary the max is the slowest ordinary sample; under 100 samples there is no p99
    few = bench.step_distribution([0.001, 0.003], [], 10)
    assert abs(few["max_ms"] - 3.0) < 1e-9 and few["p99_ms"] is None and few["boundary_ms"] is None


def test_iqr_overlap_decides_equal_within_noise():
    a = {"q25_ms": 1.0, "q75_ms": 2.0}
    assert bench.iqr_overlap(a, {"q25_ms": 1.9, "q75_ms": 3.0})
    assert not bench.iqr_overlap(a, {"q25_ms": 2.1, "q75_ms": 3.0})


def test_bench_decode_reports_the_boundary_spike(tmp_path):
    out = tmp_path / "decode.json"
    args = ["decode", "--lengths", "64", "256", "--batches", "1", "--heads", "4", "2", "--head-dim", "16",
            "--repeats", "2", "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    for r in result["rows"]:
        if r["policy"] != "bucketed (amortised)":
            assert r["q25_ms"] <= r["median_ms"] <= r["q75_ms"] <= r["max_ms"] and r["p99_ms"] is None
            assert isinstance(r["equal_to_post_rope_within_noise"], bool)
    by = {(r["cached_tokens"], r["policy"]): r for r in result["rows"]}
    assert by[(256, "bucketed")]["window_steps"] == 128 and by[(256, "bucketed (amortised)")]["boundary_step_ms"] > 0
    assert "load_average_1_5_15_min" in result and "note" in result


def test_bench_explorers_times_every_move_of_every_explorer(tmp_path):
    out = tmp_path / "explorers.json"
    assert bench.main(["explorers", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["summary"]) == set(bench.EXPLORER_MOVES)
    assert [(r["explorer"], r["move"]) for r in result["rows"]] == [
        (name, move) for name, moves in bench.EXPLORER_MOVES.items() for move in moves]
    assert all(r["cpu_ms_min"] <= r["cpu_ms_median"] <= r["cpu_ms_max"] for r in result["rows"])
    assert result["machine"]["cpu"] == bench.machine_info()["cpu"] and result["repeats"] == 1


def test_the_readme_benchmark_block_is_rendered_from_the_committed_json():
    """The benchmarks guide quotes only what data/bench/cpu.json and decode.json hold: its block is their rendering
    (`python -m ropelab.bench readme` rewrites it); the README holds no copy of it."""
    from ropelab.bench import report
    from ropelab.paths import REPO

    assert report.PAGE == REPO / "docs" / "guides" / "benchmarks.md"
    text = report.PAGE.read_text()
    block = text[text.index(report.BEGIN): text.index(report.END) + len(report.END)]
    assert block == report.render(), "docs/guides/benchmarks.md's block is stale: python -m ropelab.bench readme"
    assert report.BEGIN not in (REPO / "README.md").read_text()


def test_the_readme_block_needs_its_markers():
    from ropelab.bench import report

    with pytest.raises(ValueError, match="no benchmark block"):
        report.page_with("no markers here\n", "x")


def test_the_old_names_of_the_page_writers_warn_and_still_work(tmp_path):
    from ropelab.bench import report

    page = tmp_path / "page.md"
    page.write_text(f"a\n{report.BEGIN}\nold\n{report.END}\nb\n")
    with pytest.warns(DeprecationWarning, match="page_with"):
        assert report.readme_with("x" + report.BEGIN + "y" + report.END, "B") == "xB"
    with pytest.warns(DeprecationWarning, match="write_page"):
        assert report.write_readme(page) == page
    assert page.read_text() == f"a\n{report.render()}\nb\n"


def test_bench_fused_small(tmp_path):
    """``python -m ropelab.bench fused`` at a tiny shape: every row (norm alone, unfused, fused per backend that
    runs on the CPU) is timed from the same run and carries its ratio to the norm; no time is asserted."""
    out = tmp_path / "fused.json"
    args = ["fused", "--tokens", "8", "--heads", "2", "1", "--head-dim", "32", "--repeats", "2",
            "--backends", "torch", "triton", "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    names = [r["method"] for r in result["rows"]]
    assert names == ["RMSNorm alone (q, k)", "unfused: norm -> apply_rope -> cache write",
                     "fused qk_norm_rope (backend=torch)"]
    assert result["rows"][0]["ratio_to_norm"] == 1.0
    assert all(r["q25_ms"] <= r["median_ms"] <= r["q75_ms"] for r in result["rows"])
    assert "GPU only" in result["notes"]["fused (backend=triton)"]
    model = result["traffic_bytes"]
    assert model["fused qk_norm_rope"] < model["unfused: norm -> RoPE -> cache write"]
