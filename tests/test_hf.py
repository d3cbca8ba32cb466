"""ropelab.adapters: the Hugging Face Llama adapter runs the model's own weights layer by layer."""

from __future__ import annotations

import pytest
import torch
from _helpers import tiny_llama

from ropelab.adapters import HFLlamaAdapter
from ropelab.kvcache import RopeSchedule, full_forward
from ropelab.spec import RopeSpec

pytest.importorskip("transformers")


@pytest.mark.parametrize("rope", [None, {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}])
def test_adapter_full_forward_equals_the_model(rope):
    model = tiny_llama(2, rope=rope)
    ad = HFLlamaAdapter(model)
    assert ad.rope == RopeSpec.from_hf_config(model.config) and ad.head_dim == 16
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    got = full_forward(ad, ids, RopeSchedule.of(ad))
    assert (got - want).abs().max() < 1e-5
