"""The benchmark command runs and reports what it claims (no timing assertions: ratios are measured
by `python -m ropelab.bench cpu`, not by tests)."""

from __future__ import annotations

import json

from ropelab import bench


def test_bench_cpu_small(tmp_path):
    out = tmp_path / "cpu.json"
    args = ["cpu", "--shape", "1", "2", "64", "16", "--repeats", "2", "--no-compile", "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    names = [r["method"] for r in result["rows"]]
    assert names[:3] == ["clone (floor)", "ropelab.apply_rope", "ropelab.rotate (tables given)"]
    assert "HF apply_rotary_pos_emb (eager)" in names
    assert all(r["median_ms"] > 0 for r in result["rows"])
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
    # 511 ordinary steps of ~1 ms and one boundary step of 50 ms in a window of 512 steps
    d = bench.step_distribution([0.001, 0.0011, 0.0012], [0.05], 512)
    assert abs(d["median_ms"] - 1.1) < 1e-9
    assert abs(d["p99_ms"] - 1.2) < 1e-9 and abs(d["max_ms"] - 50.0) < 1e-9
    # without a boundary the max is the slowest ordinary sample
    assert abs(bench.step_distribution([0.001, 0.003], [], 10)["max_ms"] - 3.0) < 1e-9


def test_bench_decode_reports_the_boundary_spike(tmp_path):
    out = tmp_path / "decode.json"
    args = ["decode", "--lengths", "64", "256", "--batches", "1", "--heads", "4", "2", "--head-dim", "16",
            "--repeats", "2", "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    for r in result["rows"]:
        if r["policy"] != "bucketed (amortised)":
            assert r["median_ms"] <= r["p99_ms"] <= r["max_ms"]
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
