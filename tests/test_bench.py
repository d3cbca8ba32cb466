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
