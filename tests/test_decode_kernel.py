"""The Triton decode-attention kernel (ropelab.kernels.decode_attention) on CPU under TRITON_INTERPRET=1.

Every comparison is against the float64 oracle within ``error_bound``, which is derived from the dtypes
(unit roundoffs, the in-kernel angle's error, the dot lengths), and each test also shows that an error the
kernel could make (the other style, a stale frame, no rotation) breaks that bound: the tests can fail.
"""

from __future__ import annotations

import os

# Triton decides at import whether its own library functions (tl.max, tl.sum, ...) are interpreted, so this
# must precede the first import of triton in the process (ropelab imports it only with ropelab.kernels).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed: the decode kernel's interpreter tests need it")

import importlib  # noqa: E402
import json  # noqa: E402

from ropelab import ROPE_TYPES, frequencies  # noqa: E402
from ropelab.kernels.decode_attention import (  # noqa: E402
    ANGLE_ERROR,
    decode_attention,
    decode_attention_oracle,
    error_bound,
    fp32_angle_error,
)
from ropelab.scaling import EXAMPLE_HEAD_DIM, EXAMPLE_MAX_POSITION_EMBEDDINGS, LENGTH_DEPENDENT  # noqa: E402

da = importlib.import_module("ropelab.kernels.decode_attention")  # the module (the package exports the function)


@pytest.fixture(autouse=True)
def kernel_runs_here():
    reason = da.kernel_available()
    if reason and not torch.cuda.is_available():
        pytest.fail(f"the decode kernel cannot run in this test process: {reason}")


# scripts/gpu_check_decode.sh runs this file with TRITON_INTERPRET=0 on a GPU: then the tensors live there.
DEVICE = "cuda" if os.environ["TRITON_INTERPRET"] == "0" and torch.cuda.is_available() else "cpu"


def make(batch=3, hq=8, hkv=2, cap=200, d=64, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, hq, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(batch, hkv, cap, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(batch, hkv, cap, d, generator=g).to(DEVICE, dtype)
    return q, k, v


def within(got, q, k, v, lengths, **kw):
    """(largest |got - oracle| / bound, bound): below 1 means within the derived bound."""
    ref = decode_attention_oracle(q, k, v, lengths, **kw)
    bound = error_bound(q, k, v, lengths, **kw)
    return float(((got.double() - ref).abs() / bound).max()), bound


DYNAMIC = {"rope_type": "dynamic", "factor": 4.0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("mode", ["post_rope", "rope_on_load"])
def test_both_modes_match_the_oracle_gqa_varlen_partial_rotary(mode, style, dtype):
    """GQA 8/2, three sequences of lengths 1, 37, 150 over up to three splits, d = 80 with rotary_dim 48."""
    q, k, v = make(batch=3, cap=150, d=80, dtype=dtype)
    lengths = torch.tensor([1, 37, 150])
    inv, af = frequencies(80, rotary_dim=48, rope_scaling=DYNAMIC, seq_len=200, max_position_embeddings=64)
    kw = dict(mode=mode, style=style, inv_freq=inv if mode == "rope_on_load" else None)
    got = decode_attention(q, k, v, lengths, split_len=64, backend="triton", **kw)
    assert got.dtype == dtype and got.shape == q.shape
    ratio, bound = within(got, q, k, v, lengths, **kw)
    assert ratio < 1, ratio
    torch_path = decode_attention(q, k, v, lengths, backend="torch", **kw)
    assert within(torch_path, q, k, v, lengths, **kw)[0] < 1
    if mode == "rope_on_load":  # the other style is at least 10x farther from the oracle (and, in float32,
        # 10x past the bound; the worst-case bound of 16-bit operands is too wide to tell styles apart)
        other = "interleaved" if style == "half" else "half"
        ref = decode_attention_oracle(q, k, v, lengths, **kw)
        wrong = decode_attention_oracle(q, k, v, lengths, mode=mode, style=other, inv_freq=inv)
        assert (wrong - ref).abs().max() > 10 * (got.double() - ref).abs().max()
        if dtype == torch.float32:
            assert float(((wrong - got.double()).abs() / bound).max()) > 10


@pytest.mark.parametrize("hq,hkv", [(4, 4), (32, 8), (6, 1), (12, 4)])
def test_any_grouping(hq, hkv):
    q, k, v = make(batch=2, hq=hq, hkv=hkv, cap=96, d=64)
    lengths = torch.tensor([96, 50])
    inv, _ = frequencies(64)
    got = decode_attention(q, k, v, lengths, inv_freq=inv, split_len=64, backend="triton")
    assert within(got, q, k, v, lengths, inv_freq=inv)[0] < 1


@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_head_dims(d):
    q, k, v = make(batch=2, hq=4, hkv=2, cap=70, d=d, dtype=torch.float16)
    lengths = torch.tensor([70, 3])
    inv, af = frequencies(d, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    kw = dict(inv_freq=inv, attention_factor=af, style="interleaved")
    got = decode_attention(q, k, v, lengths, backend="triton", **kw)
    assert within(got, q, k, v, lengths, **kw)[0] < 1


def test_every_length_dependent_scaling_in_the_kernel():
    """Which rope types move with the current length L is read off ropelab.scaling (not assumed); for each
    of them the kernel, fed the frequencies of L, matches the oracle at L, and the frame of L0 is far off."""
    d, l0 = EXAMPLE_HEAD_DIM, EXAMPLE_MAX_POSITION_EMBEDDINGS  # the sizes the records' examples are valid at
    moving = []
    for name, rec in ROPE_TYPES.items():
        sc = dict(rec.example)
        a = frequencies(d, rope_scaling=sc, seq_len=l0, max_position_embeddings=l0)
        b = frequencies(d, rope_scaling=sc, seq_len=5 * l0, max_position_embeddings=l0)
        if not torch.equal(a[0], b[0]) or a[1] != b[1]:
            moving.append(name)
    assert sorted(moving) == sorted(LENGTH_DEPENDENT)  # the records' flags say which types move, and they do
    q, k, v = make(batch=2, hq=4, hkv=2, cap=5 * l0, d=d)
    lengths = torch.tensor([5 * l0, 4 * l0])
    for name in moving:
        sc = dict(ROPE_TYPES[name].example)
        inv, af = frequencies(d, rope_scaling=sc, seq_len=5 * l0, max_position_embeddings=l0)
        kw = dict(inv_freq=inv, attention_factor=af)
        got = decode_attention(q, k, v, lengths, split_len=64, backend="triton", **kw)
        ratio, bound = within(got, q, k, v, lengths, **kw)
        assert ratio < 1, (name, ratio)
        inv0, af0 = frequencies(d, rope_scaling=sc, seq_len=l0, max_position_embeddings=l0)
        stale = decode_attention_oracle(q, k, v, lengths, inv_freq=inv0, attention_factor=af0)
        assert float(((stale - got.double()).abs() / bound).max()) > 10, name


def test_angles_stay_accurate_at_128k_positions():
    """At 131072 cached positions a float32 angle errs by more than 1e-3 rad; the kernel's fixed-point turns
    keep it within ANGLE_ERROR, so one head over 128k keys still meets the float32 bound."""
    n = 131072
    inv, _ = frequencies(64, base=500000.0)
    assert fp32_angle_error(inv, n) > 1e-3 > 1e3 * ANGLE_ERROR
    positions = [*range(0, n, 331), *range(n - 64, n)]
    assert da.kernel_table_error(inv, positions) < ANGLE_ERROR
    q, k, v = make(batch=1, hq=1, hkv=1, cap=n, d=64, seed=3)
    lengths = torch.tensor([n])
    got = decode_attention(q, k, v, lengths, inv_freq=inv, split_len=32768, block_n=4096, backend="triton")
    ratio, bound = within(got, q, k, v, lengths, inv_freq=inv)
    assert ratio < 1, ratio
    # and the oracle with float32 angles (what an in-kernel float32 angle would compute) is not as close
    # to the float64 answer as the kernel is
    exact = decode_attention_oracle(q, k, v, lengths, inv_freq=inv).double().cpu()
    m = torch.arange(n, dtype=torch.float32)[:, None] * inv.float()[None, :]
    kc = k[0, 0].double().cpu()
    c, s = torch.cos(m.double()), torch.sin(m.double())
    r = kc.clone()
    r[:, :32], r[:, 32:] = kc[:, :32] * c - kc[:, 32:] * s, kc[:, 32:] * c + kc[:, :32] * s
    p = (r @ q[0, 0].double().cpu() / 8).softmax(0)
    fp32_angles = p @ v[0, 0].double().cpu()
    assert (fp32_angles - exact[0, 0]).abs().max() > 10 * (got.double().cpu() - exact).abs().max()


def test_bad_input_names_the_fix():
    q, k, v = make(batch=2, hq=8, hkv=2, cap=32, d=64)
    inv, _ = frequencies(64)
    L = torch.tensor([32, 10])
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        decode_attention(q[:, :7], k, v, L, inv_freq=inv)
    with pytest.raises(ValueError, match="lengths past the cache"):
        decode_attention(q, k, v, torch.tensor([33, 10]), inv_freq=inv)
    with pytest.raises(ValueError, match=">= 1"):
        decode_attention(q, k, v, torch.tensor([0, 10]), inv_freq=inv)
    with pytest.raises(ValueError, match="one entry|one per row"):
        decode_attention(q, k, v, torch.tensor([3]), inv_freq=inv)
    with pytest.raises(ValueError, match="needs inv_freq"):
        decode_attention(q, k, v, L)
    with pytest.raises(ValueError, match="drop inv_freq"):
        decode_attention(q, k, v, L, mode="post_rope", inv_freq=inv)
    with pytest.raises(ValueError, match="larger than the head dim"):
        decode_attention(q, k, v, L, inv_freq=frequencies(128)[0])
    with pytest.raises(ValueError, match="one dtype"):
        decode_attention(q, k, v.half(), L, inv_freq=inv)
    with pytest.raises(ValueError, match="floating-point"):
        decode_attention(q.int(), k, v, L, inv_freq=inv)
    with pytest.raises(ValueError, match="backend='torch'"):
        decode_attention(q.double(), k.double(), v.double(), L, inv_freq=inv, backend="triton")
    with pytest.raises(ValueError, match=r"q\[:, :, 0\]"):
        decode_attention(q[:, :, None], k, v, L, inv_freq=inv)
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention(q[..., :32], k, v, L, inv_freq=inv)
    with pytest.raises(ValueError, match="rows must lie"):
        decode_attention(q, k, v, L, inv_freq=inv, rows=torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="mode must be"):
        decode_attention(q, k, v, L, mode="pre_rope")
    with pytest.raises(ValueError, match="style must be"):
        decode_attention(q, k, v, L, inv_freq=inv, style="neox")
    with pytest.raises(ValueError, match="multiple of block_n"):
        decode_attention(q, k, v, L, inv_freq=inv, split_len=40, backend="triton")
    # float64 runs on the PyTorch path, which auto picks
    out = decode_attention(q.double(), k.double(), v.double(), L, inv_freq=inv)
    assert out.dtype == torch.float64


def test_without_triton_the_torch_path_runs_and_triton_says_why(monkeypatch):
    q, k, v = make(batch=2, hq=4, hkv=2, cap=20, d=32)
    L = torch.tensor([20, 5])
    inv, _ = frequencies(32)
    monkeypatch.setattr(da, "triton", None)
    assert "triton is not installed" in da.kernel_available()
    out = decode_attention(q, k, v, L, inv_freq=inv)
    assert within(out, q, k, v, L, inv_freq=inv)[0] < 1
    with pytest.raises(ValueError, match="triton is not installed"):
        decode_attention(q, k, v, L, inv_freq=inv, backend="triton")


# --------------------------------------------------------------------------------------------------
# The KV-cache policy on a (tiny, random) Hugging Face Llama
# --------------------------------------------------------------------------------------------------

L0, PROMPT, T = 16, 4, 32


def tiny_llama(rope):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=L0, rope_parameters=rope,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": L0, "factor": 4.0,
     "short_factor": [1.0] * 8, "long_factor": [1.0 + 0.7 * i for i in range(8)]},
], ids=["dynamic", "longrope"])
def test_kernel_policy_equals_the_full_forward_over_every_prefix(rope, monkeypatch):
    """One layer, so the cache holds exactly what a full forward computes: at every step L the kernel
    policy must give Hugging Face's full-forward logits over L tokens (threshold of the recompute test in
    tests/test_kvcache.py), agree with the PyTorch rope_on_load policy, and post_rope must not."""
    from ropelab.adapters import HFLlamaAdapter
    from ropelab.kvcache import RopeSchedule, decode

    calls = []
    real = da._kernels
    monkeypatch.setattr(da, "_kernels", lambda: calls.append(1) or real())
    model = tiny_llama(rope).to(DEVICE)
    ids = torch.randint(0, 97, (1, T), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ad = HFLlamaAdapter(model)
    with torch.no_grad():
        full = torch.stack([model(ids[:, :n]).logits[:, -1] for n in range(PROMPT, T + 1)], dim=1)
    got = decode(ad, ids, RopeSchedule.of(ad), "kernel_rope_on_load", prompt_len=PROMPT).logits
    assert len(calls) == T - PROMPT + 1  # the Triton kernel ran at every step (prefill included)
    got = got[:, PROMPT - 1 :]
    assert (got - full).abs().max() < 1e-5
    torch_policy = decode(ad, ids, RopeSchedule.of(ad), "rope_on_load", prompt_len=PROMPT).logits[:, PROMPT - 1 :]
    assert (got - torch_policy).abs().max() < 1e-5
    post = decode(ad, ids, RopeSchedule.of(ad), "post_rope", prompt_len=PROMPT).logits[:, PROMPT - 1 :]
    assert (post - full).abs()[:, L0 + 1 - PROMPT :].amax(dim=(0, 2)).min() > 1e-5


# --------------------------------------------------------------------------------------------------
# The GPU benchmark's code path, dry on CPU, and the notebook reader
# --------------------------------------------------------------------------------------------------


def test_gpu_bench_code_runs_dry_and_the_reader_says_when_nothing_was_measured(tmp_path):
    """The benchmark's own code, at a toy size on CPU (its times are not GPU numbers and the JSON says so):
    every method and policy runs, the goal check reads the rows, and the notebook helpers either report the
    rows or say plainly that no GPU measurement exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ropelab.kernels import decode_bench as db
    from ropelab.kvcache import POLICIES

    result = db.bench_decode_gpu(lengths=(96,), batches=(1, 2), heads=(4, 2), head_dim=32, dtype=torch.float32,
                                 repeats=2, l0=64, token_budget=100, device="cpu", warmup=0,
                                 partial_out=tmp_path / "partial.json")
    assert "dry run" in result["machine"]["device"] and result["complete"]
    partial = json.loads((tmp_path / "partial.json").read_text())  # written after each configuration
    assert partial["complete"] is False and partial["rows"] == result["rows"]
    methods = [r["method"] for r in result["rows"]]
    assert methods == [*db.KERNEL_MODES, "sdpa post_rope", *(f"policy {p}" for p in POLICIES)]
    assert result["skipped"] == [{"batch": 2, "cached_tokens": 96, "why": "192 cached tokens > token_budget 100"}]
    by = {r["method"]: r for r in result["rows"]}
    assert by["kernel rope_on_load"]["key_bytes_per_step"] == 1 * 2 * 96 * 32 * 4
    assert by["policy recompute"]["key_bytes_per_step"] > by["policy post_rope"]["key_bytes_per_step"]
    assert "boundary_ms" in by["policy bucketed"]
    assert all(r["median_ms"] <= r["p99_ms"] <= r["max_ms"] for r in result["rows"])
    assert db.goal_check(result, length=96) and db.goal_check(result) == []
    assert db.gpu_decode_summary(result, length=96).count("\n") == len(methods)  # a header, one line per row
    assert db.load_gpu_decode(tmp_path / "absent.json") is None
    missing = db.gpu_decode_summary(result=None) if db.load_gpu_decode() is None else db.NO_GPU
    assert missing.startswith(db.NO_GPU)
    fig, ax = plt.subplots()
    db.plot_gpu_decode(ax, result, batch=1)
    assert len(ax.get_lines()) >= len(methods)
    plt.close(fig)
