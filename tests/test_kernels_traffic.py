"""ropelab.kernels.traffic (the byte model) and the GPU benchmark's CPU fallback, at tiny sizes."""

from __future__ import annotations

import json

import pytest
import torch

from ropelab.bench import gpu as bench_gpu
from ropelab.kernels import traffic


def test_distinct_bytes_counts_broadcast_once():
    t = torch.zeros(4, 8)
    assert traffic.distinct_bytes(t) == 4 * 8 * 4
    assert traffic.distinct_bytes(t[:1].expand(100, 8)) == 8 * 4
    assert traffic.distinct_bytes(t[:, ::2]) == 4 * 4 * 4


def test_eager_traffic_and_fused_model():
    counts = {t.name: t for t in traffic.rope_traffic((1, 4, 16, 32), heads_k=2, dtype=torch.bfloat16,
                                                     compile=False)}
    q_bytes, k_bytes = 4 * 16 * 32 * 2, 2 * 16 * 32 * 2
    copy = counts["copy of q and k (floor)"]
    assert copy.read == copy.written == q_bytes + k_bytes
    fused = counts["fused Triton kernel (ropelab.kernels)"]
    assert fused.written == copy.written and fused.read == copy.read + 2 * 16 * 16 * 4
    hf = counts["HF apply_rotary_pos_emb, eager"]
    # rotate_half: per tensor mul, neg, cat, mul, add: ten ops that move data, none of them a view
    assert [o.op for o in hf.ops] == ["mul", "neg", "cat", "mul", "add"] * 2
    assert hf.total > 4 * fused.total


def test_compiled_traffic_reads_inductor_buffers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 1, 8, 16)
    cos, sin = torch.randn(1, 8, 16), torch.randn(1, 8, 16)
    try:
        t = traffic.count_compiled("hf", apply_rotary_pos_emb, q, k, cos, sin)
    except Exception as e:  # no C++ toolchain for Inductor
        pytest.skip(f"torch.compile unavailable: {type(e).__name__}")
    outputs = [o for o in t.ops if "(output)" in o.op]
    assert len(outputs) == 2 and sum(o.written for o in outputs) == (q.numel() + k.numel()) * 4
    assert t.ops[0].read == (q.numel() + k.numel() + cos.numel() + sin.numel()) * 4


def test_gpu_bench_cpu_fallback_table(tmp_path):
    result = bench_gpu.run("cpu", shapes=[("padded", "tiny", 1, 8, 32), ("decode", "decode", 3, 1, 32)],
                           compile=False)
    names = {r["implementation"] for r in result["rows"]}
    assert {"copy (ceiling)", "ropelab apply_rope (torch)", "HF eager"} <= names
    for r in result["rows"]:
        assert r["median_ms"] > 0 and r["bytes"] > 0
        if r["max_abs_diff_vs_ropelab"] is not None:
            assert r["max_abs_diff_vs_ropelab"] < 1e-5  # HF's tables come from ropelab's here
    bench_gpu.print_rows(result)
    # a CPU fallback file is not a GPU measurement: the notebook's section 4 ignores it
    (tmp_path / "gpu-bench-cpu-fallback.json").write_text(json.dumps(result))
    assert bench_gpu.load_gpu_results(tmp_path) == []
    series = bench_gpu.bandwidth_series(result, "fwd", head_dim=32)
    assert set(series) == {n for n in names}
