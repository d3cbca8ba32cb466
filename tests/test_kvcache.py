"""KV-cache policies under dynamic NTK (and longrope): Hugging Face parity, consistency, pure re-rotation."""

from __future__ import annotations

import pytest
import torch
from _helpers import tiny_llama as _tiny_llama

from ropelab import apply_rope
from ropelab.adapters import HFLlamaAdapter
from ropelab.attention import attend as ropelab_attend
from ropelab.kvcache import (
    BUILTIN_POLICIES,
    POLICIES,
    CachePolicy,
    GrowableBuffer,
    RopeSchedule,
    RotaryKVCache,
    decode,
    full_forward,
    register_policy,
)
from ropelab.spec import RopeSpec

transformers = pytest.importorskip("transformers")

L0, PROMPT, T = 32, 8, 80


def tiny_llama(layers: int, seed: int = 0, rope=None):
    return _tiny_llama(layers, seed, rope, l0=L0)


def hf_cached_logits(model, ids, prompt_len):
    with torch.no_grad():
        out = model(ids[:, :prompt_len], use_cache=True)
        logits, cache = [out.logits], out.cache
        for t in range(prompt_len, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            logits.append(out.logits)
            cache = out.cache
    return torch.cat(logits, dim=1)


@pytest.fixture(scope="module")
def llama2():
    model = tiny_llama(2)
    ids = torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_post_rope_reproduces_hf_dynamic_ntk_cached_decoding(llama2):
    model, ids = llama2
    hf = hf_cached_logits(model, ids, PROMPT)
    ad = HFLlamaAdapter(model)
    mine = decode(ad, ids, RopeSchedule.of(ad), "post_rope", prompt_len=PROMPT).logits
    per_step = (mine - hf).abs().amax(dim=(0, 2))
    assert per_step.max() < 1e-5, per_step
    # The consistent policies do not reproduce it past L0, by far more than the tolerance: the test can fail.
    consistent = decode(ad, ids, RopeSchedule.of(ad), "recompute", prompt_len=PROMPT).logits
    gap = (consistent - hf).abs().amax(dim=(0, 2))
    assert gap[:L0].max() < 1e-5 and gap[L0 + 1 :].min() > 1e-5 and gap.max() > 1e-4


def test_consistent_policies_match_a_full_forward_at_the_current_base():
    """One layer: the cache then holds exactly what a full forward computes, so a consistent cache must
    give, at every step L, the last-token logits of Hugging Face's own full forward over L tokens
    (which uses b(L) for every position)."""
    model = tiny_llama(1)
    ids = torch.randint(0, 97, (1, T), generator=torch.Generator().manual_seed(2))
    ad = HFLlamaAdapter(model)
    with torch.no_grad():
        full = torch.stack([model(ids[:, :n]).logits[:, -1] for n in range(PROMPT, T + 1)], dim=1)
    for policy in ("recompute", "rope_on_load"):
        got = decode(ad, ids, RopeSchedule.of(ad), policy, prompt_len=PROMPT).logits[:, PROMPT - 1 :]
        assert (got - full).abs().max() < 1e-5, policy
    post = decode(ad, ids, RopeSchedule.of(ad), "post_rope", prompt_len=PROMPT).logits[:, PROMPT - 1 :]
    assert (post - full).abs()[:, L0 + 1 - PROMPT :].amax(dim=(0, 2)).min() > 1e-5  # inconsistent past L0


def test_bucketed_matches_a_full_forward_with_the_bucketed_schedule():
    model = tiny_llama(1)
    ids = torch.randint(0, 97, (1, T), generator=torch.Generator().manual_seed(3))
    ad = HFLlamaAdapter(model)
    sched = RopeSchedule.of(ad, bucket_growth=2.0)
    assert [sched.effective_length(n) for n in (20, 32, 33, 64, 65, 80)] == [20, 32, 64, 64, 128, 128]
    got, cache = decode(ad, ids, sched, "bucketed", prompt_len=PROMPT)
    want = torch.stack([full_forward(ad, ids[:, :n], sched)[:, -1] for n in range(PROMPT, T + 1)], dim=1)
    assert (got[:, PROMPT - 1 :] - want).abs().max() < 1e-5
    assert cache.rerotations == 2  # at L = 33 (-> 64) and L = 65 (-> 128), one layer
    # and it is not the unbucketed schedule
    plain = decode(ad, ids, RopeSchedule.of(ad), "recompute", prompt_len=PROMPT).logits
    assert (plain - got).abs()[:, L0:].max() > 1e-4


def test_multilayer_consistent_policies_agree(llama2):
    model, ids = llama2
    ad = HFLlamaAdapter(model)
    a = decode(ad, ids, RopeSchedule.of(ad), "recompute", prompt_len=PROMPT).logits
    b = decode(ad, ids, RopeSchedule.of(ad), "rope_on_load", prompt_len=PROMPT).logits
    assert (a - b).abs().max() < 1e-5


def test_rerotation_is_a_pure_rotation():
    """longrope switches from short to long factors past L0 with attention factor a != 1. Re-rotating the
    cached keys must apply the angle difference only: applying a again would scale keys by a^2."""
    rope = {"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
            "short_factor": [1.0] * 8, "long_factor": [1.0 + 0.7 * i for i in range(8)]}
    sched = RopeSchedule(RopeSpec(scaling=rope, max_position_embeddings=64), 16, bucket_growth=2.0)
    _, af = sched.at(40)
    assert af > 1.05
    cache = RotaryKVCache(sched, "bucketed", n_layers=1)
    gen = torch.Generator().manual_seed(4)
    raw = torch.randn(1, 2, 40, 16, generator=gen, dtype=torch.float64)
    for t in range(40):  # decode one key at a time, crossing L0 = 16 at t = 16
        q = torch.randn(1, 2, 1, 16, generator=gen, dtype=torch.float64)
        cache.step(0, q, raw[:, :, t : t + 1], raw[:, :, t : t + 1], torch.tensor([t]), t + 1)
    assert cache.rerotations == 1  # short -> long factors once, at L = 17 (bucket 32); 32 -> 64 changes nothing
    inv, af = sched.at(40)
    want = apply_rope(raw, layout="b h s d", rope_scaling=rope, max_position_embeddings=64, seq_len=64)
    assert torch.allclose(cache.k[0].view(), want, atol=1e-12)
    assert torch.allclose(cache.k[0].view().norm(dim=-1), af * raw.norm(dim=-1), rtol=1e-12)


def test_byte_counters_and_errors():
    model = tiny_llama(1)
    ad = HFLlamaAdapter(model)
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(5))
    traffic = {}
    for policy in BUILTIN_POLICIES:
        sched = RopeSchedule.of(ad, bucket_growth=2.0) if policy == "bucketed" else RopeSchedule.of(ad)
        _, cache = decode(ad, ids, sched, policy, prompt_len=8)
        traffic[policy] = (cache.bytes_read, cache.bytes_written)
    per_key = 2 * 16 * 4  # kv heads * head_dim * float32
    n_reads = sum(range(8, 41))  # the prefill reads its 8 keys, then each step all keys so far: 9, 10, ..., 40
    assert traffic["post_rope"] == (n_reads * per_key, 40 * per_key)
    assert traffic["rope_on_load"] == traffic["post_rope"]
    assert traffic["recompute"] == (2 * n_reads * per_key, (40 + n_reads) * per_key)
    assert traffic["post_rope"][0] < traffic["bucketed"][0] < traffic["recompute"][0]
    with pytest.raises(ValueError, match="bucket_growth"):
        decode(ad, ids, RopeSchedule.of(ad), "bucketed")
    with pytest.raises(ValueError, match="policy must be one of"):
        RotaryKVCache(RopeSchedule.of(ad), "lazy", 1)
    used = decode(ad, ids[:, :9], RopeSchedule.of(ad), "post_rope", prompt_len=8).cache
    with pytest.raises(ValueError, match="must be empty"):
        decode(ad, ids, RopeSchedule.of(ad), "post_rope", cache=used)
    with pytest.raises(ValueError, match="this policy"):
        decode(ad, ids, RopeSchedule.of(ad), "recompute", cache=RotaryKVCache(RopeSchedule.of(ad), "post_rope", 1))


def test_a_registered_policy_runs_by_name():
    """Registering a policy is one class: here one that caches raw keys and rotates them all every step
    (recompute's arithmetic without its byte count), which must give recompute's logits."""

    class RotateAll(CachePolicy):
        name = "test_rotate_all"
        rotated = False

        def attend(self, cache, layer, q_rot, positions, frame):
            K, V = cache.k[layer], cache.v[layer]
            keys = cache.rope_cached(K.view(), frame)
            return ropelab_attend(q_rot, keys, V.view(), positions, torch.arange(K.n))

    register_policy(RotateAll)
    try:
        model = tiny_llama(1)
        ad = HFLlamaAdapter(model)
        ids = torch.randint(0, 97, (1, 48), generator=torch.Generator().manual_seed(6))
        mine = decode(ad, ids, RopeSchedule.of(ad), "test_rotate_all", prompt_len=8)
        ref = decode(ad, ids, RopeSchedule.of(ad), "recompute", prompt_len=8)
        # exact on every CPU: the policy runs recompute's ops on the same values in one process
        assert torch.equal(mine.logits, ref.logits)
        assert mine.cache.bytes_read < ref.cache.bytes_read  # its traffic is what it counts
        with pytest.raises(ValueError, match="new, non-empty name"):
            register_policy(RotateAll)
    finally:
        POLICIES.pop("test_rotate_all")


def test_fill_loads_an_empty_layer_as_the_policy_stores_it():
    sched = RopeSchedule(RopeSpec(scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=8), 16)
    gen = torch.Generator().manual_seed(7)
    keys, values = torch.randn(1, 2, 20, 16, generator=gen), torch.randn(1, 2, 20, 16, generator=gen)
    cache = RotaryKVCache(sched, "post_rope", 1)
    cache.fill(0, keys, values, frame_length=20, spare=4)
    # exact on every CPU: a post-RoPE fill stores the keys as given (a copy); the frame is the same call
    assert len(cache) == 20 and torch.equal(cache.k[0].view(), keys) and cache.k[0].buf.shape[2] == 24
    assert torch.equal(cache.frame[0][0], sched.at(20)[0])
    with pytest.raises(ValueError, match="not empty"):
        cache.fill(0, keys, values)
    raw = RotaryKVCache(sched, "rope_on_load", 1)
    raw.fill(0, keys, values)
    assert raw.frame[0] is None  # raw keys have no frame


def test_a_registered_policy_with_buckets_runs_through_decode_and_lm_with_no_other_edit():
    """A toy policy that needs a bucketed schedule (growth 3) declares it on its class; kvcache.decode refuses a
    schedule without buckets, schedule_for builds the right one, and lm.per_position_loss asks the policy for it.
    Being Bucketed's re-rotation at another growth, it must give recompute's logits on the same bucketed
    schedule (consistent at every step), and not those of the unbucketed schedule."""
    from dataclasses import replace

    from ropelab import lm
    from ropelab.kvcache import Bucketed, schedule_for
    from ropelab.models import TinyLM, TinyLMAdapter

    class Tripling(Bucketed):
        name = "test_tripling"
        bucket_growth = 3.0

    torch.manual_seed(0)
    model = TinyLM(lm.model_config(n_layers=2, d_model=32, n_heads=2, rope=RopeSpec(max_position_embeddings=16)))
    with torch.no_grad():  # sharper attention than at init, so a wrong schedule shows in the logits
        for block in model.blocks:
            block.attn.qkv.weight.mul_(6.0)
    model.eval()
    ad = TinyLMAdapter(model)
    spec = replace(model.cfg.rope, scaling={"rope_type": "dynamic", "factor": 4.0})
    ids = torch.randint(0, 256, (2, 61), generator=torch.Generator().manual_seed(1))
    register_policy(Tripling)
    try:
        sched = schedule_for("test_tripling", spec, model.cfg.head_dim)
        assert sched.bucket_growth == 3.0 and schedule_for("post_rope", spec, 16).bucket_growth is None
        with pytest.raises(ValueError, match="bucket_growth=3"):
            decode(ad, ids, RopeSchedule(spec, 16), "test_tripling")
        mine = decode(ad, ids[:, :-1], sched, "test_tripling", prompt_len=8)
        assert mine.cache.rerotations == 2 * 2  # per layer: at L = 17 (bucket 48) and L = 49 (bucket 144)
        ref = decode(ad, ids[:, :-1], RopeSchedule(spec, 16, bucket_growth=3.0), "recompute", prompt_len=8).logits
        plain = decode(ad, ids[:, :-1], RopeSchedule(spec, 16), "recompute", prompt_len=8).logits
        eps = torch.finfo(torch.float32).eps
        assert (mine.logits - ref).abs().max() < 1e3 * eps < (plain - ref).abs().max()
        loss = lm.per_position_loss(model, ids, lm.Scheme(spec, "test_tripling"), prompt_len=8)
        want = torch.nn.functional.cross_entropy(ref.transpose(1, 2), ids[:, 1:], reduction="none")
        assert (loss - want).abs().max() < 1e3 * eps
        assert "test_tripling" not in " ".join(lm.schemes(16))  # registering joins no study's evaluation
    finally:
        POLICIES.pop("test_tripling")


def test_growable_buffer_refuses_a_shape_it_would_broadcast():
    """A batch-1 append to a batch-2 buffer would broadcast through slice assignment; it is refused instead."""
    buf = GrowableBuffer()
    buf.append(torch.zeros(2, 3, 4, 8))
    with pytest.raises(ValueError, match=r"\(b, h, d\) = \(1, 3, 8\).*holds \(2, 3, 8\)"):
        buf.append(torch.ones(1, 3, 1, 8))
    with pytest.raises(ValueError, match="float64.*holds torch.float32"):
        buf.append(torch.ones(2, 3, 1, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \[b, h, s, d\]"):
        buf.append(torch.ones(2, 3, 8))
    assert buf.n == 4 and torch.equal(buf.view(), torch.zeros(2, 3, 4, 8))
    buf.append(torch.ones(2, 3, 1, 8))
    assert buf.n == 5 and torch.equal(buf.view()[:, :, 4], torch.ones(2, 3, 8))
