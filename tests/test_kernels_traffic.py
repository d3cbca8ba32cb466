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
    copy = counts["copy of q and k (reference)"]
    assert copy.read == copy.written == q_bytes + k_bytes
    fused = counts["fused Triton kernel (ropelab.kernels)"]
    assert fused.written == copy.written and fused.read == copy.read + 2 * 16 * 16 * 4
    hf = counts["HF apply_rotary_pos_emb, eager"]
    # rotate_half: per tensor mul, neg, cat, mul, add: ten ops that move data, none of them a view
    assert [o.op for o in hf.ops] == ["mul", "neg", "cat", "mul", "add"] * 2
    assert hf.total > 4 * fused.total


def test_qk_norm_rope_model_against_an_independent_count():
    """The fused QK-norm+RoPE model against bytes counted from real tensors: the qkv slices the op reads
    (distinct_bytes), the outputs it returns, and the cache entries it changed (a NaN-filled cache, counted
    after a run of the op); the unfused sequence against the norm + :func:`traffic.count_fused` (the RoPE
    kernel's own model) + a cache copy of k and v."""
    from ropelab import RopeSpec, qk_norm_rope

    T, Hq, Hkv, D, r = 5, 4, 2, 32, 16
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D).to(torch.bfloat16)
    q, k, v = qkv[:, :Hq * D], qkv[:, Hq * D:(Hq + Hkv) * D], qkv[:, (Hq + Hkv) * D:]
    w = torch.ones(D, dtype=torch.bfloat16)
    kc = torch.full((2, 4, Hkv, D), float("nan"), dtype=torch.bfloat16)
    vc = kc.clone()
    oq, ok = qk_norm_rope(qkv, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, q_weight=w, k_weight=w, eps=1e-6,
                          spec=RopeSpec(rotary_dim=r), kv_cache=(kc, vc), slot_mapping=torch.tensor([0, 3, 4, 6, 7]))
    cache_written = int((~kc.isnan()).sum() + (~vc.isnan()).sum()) * 2
    tables = 2 * T * (r // 2) * 4
    norm, unfused, fused = traffic.qk_norm_rope_traffic(T, Hq, Hkv, D, r, itemsize=2)
    qk = sum(traffic.distinct_bytes(t) for t in (q, k))
    assert norm.read == qk + 2 * traffic.distinct_bytes(w) and norm.written == oq.nbytes + ok.nbytes
    assert fused.read == norm.read + traffic.distinct_bytes(v) + tables
    assert fused.written == oq.nbytes + ok.nbytes + cache_written
    rope_pass = traffic.count_fused(oq, ok, T, r // 2)
    assert unfused.total == norm.total + rope_pass.total + 2 * cache_written
    # RoPE fused into the norm: beyond the norm's own pass only the tables and the cache write itself
    assert fused.total - norm.total == tables + traffic.distinct_bytes(v) + cache_written
    no_cache = traffic.qk_norm_rope_traffic(T, Hq, Hkv, D, r, itemsize=2, cache=False)
    assert no_cache[2].total - no_cache[0].total == tables


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


def test_fused_table_loads_follow_the_launch_tiling():
    """The loads the fused kernel issues per cos/sin row are its programs per token block (times sequences), from the
    launch's own tiling; the default count charges the table once."""
    from ropelab.kernels.fused_rope import launch_tiles

    # Llama-3-8B heads at 2048 tokens: 32-token blocks, 2 heads per program, 16 q + 4 k programs per block
    assert launch_tiles(2048, 1, 32, 8, 64) == (32, 64, 2, (64, 20, 1))
    assert traffic.fused_table_loads((1, 32, 2048, 128), 8, 64) == 20
    # batch 3: enough programs to take 4 heads each (8 + 2 per block), and every sequence's programs load their rows
    assert launch_tiles(2048, 3, 32, 8, 64)[2:] == (4, (64, 10, 3))
    assert traffic.fused_table_loads((3, 32, 2048, 128), 8, 64) == 30
    q, k = torch.empty(1, 4, 16, 32, dtype=torch.bfloat16), torch.empty(1, 2, 16, 32, dtype=torch.bfloat16)
    once, issued = traffic.count_fused(q, k, 16, 16), traffic.count_fused(q, k, 16, 16, table_loads=5)
    table = 2 * 16 * 16 * 4
    assert issued.total - once.total == 4 * table and once.ops[1].read == table


def test_reference_rows_carry_the_copy_spread():
    from ropelab.studies import nb06_reference as ref

    times = {"copy": [1e-3, 2e-3, 3e-3, 4e-3, 5e-3], "slow": [10e-3] * 5, "fast": [1e-3] * 5}
    rows = {r["name"]: r for r in ref.reference_rows({"copy": 100, "slow": 200, "fast": 300}, times, "copy")}
    assert rows["slow"]["ref_q25_ms"] == pytest.approx(4.0) and rows["slow"]["ref_q75_ms"] == pytest.approx(8.0)
    assert rows["fast"]["beats_reference"]
    assert not rows["slow"]["beats_reference"] and not rows["copy"]["beats_reference"]
    assert ref.copy_spread(times, "copy") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="byte count"):
        ref.reference_rows({"copy": 100}, times, "copy")
    with pytest.raises(ValueError, match="at least 4"):
        ref.time_round_robin({"a": lambda: None}, 3)


BYTES_SHAPES = [((1, 4, 16, 32), 2, torch.bfloat16, "bfloat16"), ((2, 3, 9, 8), 1, torch.float32, "float32")]


@pytest.mark.parametrize("shape", BYTES_SHAPES)
def test_bytes_view_on_meta_tensors_is_rope_traffic_on_real_ones(shape):
    """notebook 06's explorer counts on meta tensors (no memory at any shape): the same bytes as section 1's count
    on real tensors, for the copy, Hugging Face's eager ops and the fused kernel; 'as issued' charges the table
    fused_table_loads times."""
    q_shape, heads_k, dt, name = shape
    real = {t.name: t for t in traffic.rope_traffic(q_shape, heads_k=heads_k, dtype=dt, compile=False)}
    view = traffic.bytes_view(q_shape[0], q_shape[1], heads_k, q_shape[2], q_shape[3], name)
    assert view["copy"] == (real["copy of q and k (reference)"].read, real["copy of q and k (reference)"].written)
    hf = real["HF apply_rotary_pos_emb, eager"]
    assert view["hf_eager"] == (hf.read, hf.written)
    fused = real["fused Triton kernel (ropelab.kernels)"]
    assert view["fused"] == (fused.read, fused.written)
    loads = traffic.fused_table_loads(q_shape, heads_k, q_shape[3] // 2)
    assert view["table_loads"] == loads > 1
    table = fused.read - view["copy"][0]
    assert view["fused_issued"] == (view["copy"][0] + loads * table, fused.written)
    with pytest.raises(ValueError, match="dtype"):
        traffic.bytes_view(dtype="int8")
    with pytest.raises(ValueError, match="head_dim"):
        traffic.bytes_view(head_dim=7)
