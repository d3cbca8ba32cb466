"""ropelab.staleness: the phase error and warp of stale post-RoPE keys, and the drift probe."""

from __future__ import annotations

import pytest
import torch
from _helpers import tiny_llama

from ropelab import frequencies
from ropelab.adapters import HFLlamaAdapter
from ropelab.kvcache import RopeSchedule
from ropelab.spec import RopeSpec
from ropelab.staleness import drift_probe, effective_position, pair_energy, stale_phase_error

L0, PROMPT, T = 32, 8, 80


@pytest.fixture(scope="module")
def llama2():
    pytest.importorskip("transformers")
    model = tiny_llama(2, l0=L0)
    ids = torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_stale_phase_error_and_warp_against_a_direct_computation():
    sched = RopeSchedule(RopeSpec(scaling={"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=32), 16)
    eps = stale_phase_error(sched, 100, prompt_len=10)
    warp = effective_position(sched, 100, prompt_len=10)
    inv = lambda n: frequencies(16, rope_scaling=sched.spec.scaling, seq_len=n, max_position_embeddings=32)[0]
    for m in (0, 5, 9, 10, 31, 32, 60, 99):
        written = max(10, m + 1)
        assert torch.allclose(eps[m], m * (inv(100) - inv(written)), atol=1e-15)
        assert torch.allclose(warp[m], m * inv(written) / inv(100))
    assert eps[0].abs().max() == 0 and eps[99].abs().max() == 0  # position 0, and the newest key, never drift
    assert eps[60].abs().max() > 0.1


def test_drift_probe_sees_no_drift_below_l0_and_some_above(llama2):
    model, ids = llama2
    ad = HFLlamaAdapter(model)
    probe = drift_probe(ad, ids, RopeSchedule.of(ad), prompt_len=PROMPT)
    kl = torch.tensor(probe.kl)  # [layers, steps]; step j is the forward at length PROMPT + j
    assert kl.shape == (2, T - PROMPT + 1)
    assert kl[:, : L0 - PROMPT + 1].abs().max() < 1e-9
    assert kl[:, L0 - PROMPT + 2 :].min() > 0


def test_pair_energy_is_the_mean_pair_norm():
    x = torch.zeros(3, 4)
    x[:, 0], x[:, 2] = 3.0, 4.0  # half style: dims 0 and 2 form pair 0
    assert torch.equal(pair_energy(x), torch.tensor([5.0, 0.0], dtype=torch.float64))
    assert torch.equal(pair_energy(x, "interleaved"), torch.tensor([3.0, 4.0], dtype=torch.float64))
