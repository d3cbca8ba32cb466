"""ropelab.models: causality for every position encoding, ALiBi slopes, tables, training works."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ropelab.models import PE_TYPES, ModelConfig, TinyLM, alibi_slopes, masked_loss, sinusoidal_table, train
from ropelab.spec import RopeSpec


@pytest.mark.parametrize("pe", PE_TYPES)
def test_causal_for_every_position_encoding(pe):
    """Changing token t changes no logit before t."""
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=11, d_model=32, n_heads=4, n_layers=2, pe=pe, cope_npos_max=8))
    for p in model.parameters():  # CoPE's table starts at zero: give every parameter some weight
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randint(0, 11, (2, 12))
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % 11
    a, b = model(x), model(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-4


def test_alibi_slopes_follow_the_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    s6 = alibi_slopes(6)  # not a power of two: 4 from the 4-head set, then every other one of the 8-head set
    assert torch.allclose(s6, torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))


def test_sinusoidal_table():
    t = sinusoidal_table(50, 16).double()
    m, i = 37, 3
    assert t[m, 2 * i] == pytest.approx(torch.sin(torch.tensor(m / 10000 ** (2 * i / 16))).item(), abs=1e-6)
    assert t[m, 2 * i + 1] == pytest.approx(torch.cos(torch.tensor(m / 10000 ** (2 * i / 16))).item(), abs=1e-6)


def test_config_errors():
    with pytest.raises(ValueError, match="pe must be one of"):
        ModelConfig(vocab_size=5, pe="rotary")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        ModelConfig(vocab_size=5, d_model=30, n_heads=4)
    model = TinyLM(ModelConfig(vocab_size=5, pe="learned", max_len=8))
    with pytest.raises(ValueError, match="past the absolute table"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_training_learns_a_copy_task():
    """Predict the token 4 places back: needs position; RoPE learns it within 300 steps."""
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=8, d_model=32, n_heads=2, n_layers=1, pe="rope"))

    def sample(gen):
        x = torch.randint(0, 8, (16, 24), generator=gen)
        y = torch.roll(x, 4, dims=1)
        mask = torch.zeros_like(x, dtype=torch.bool)
        mask[:, 4:] = True
        return x, y, mask

    history = train(model, sample, steps=300, lr=1e-2, warmup=20, progress=False)
    assert history[0]["loss"] > 1.5 and history[-1]["loss"] < 0.3
    x, y, mask = sample(torch.Generator().manual_seed(9))
    with torch.no_grad():
        assert float(masked_loss(model(x), y, mask)) < 0.3


def test_config_round_trips_and_reads_the_flat_legacy_layout():
    cfg = ModelConfig(vocab_size=7, rope=RopeSpec(style="interleaved", base=500.0, max_position_embeddings=64))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    legacy = {k: v for k, v in cfg.to_dict().items() if k != "rope"}
    legacy.update(rope_style="interleaved", rope_base=500.0, rope_scaling=None, max_position_embeddings=64, extra={})
    assert ModelConfig.from_dict(legacy) == cfg
    with pytest.raises(ValueError, match="both"):
        ModelConfig.from_dict({**cfg.to_dict(), "rope_base": 2.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rope = RopeSpec()


def test_forward_rope_override_equals_a_model_built_with_that_spec():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=11, d_model=32, n_heads=4, n_layers=2, pe="rope")
    model = TinyLM(cfg)
    spec = RopeSpec(style="interleaved", base=100.0)
    other = TinyLM(dataclasses.replace(cfg, rope=spec))
    other.load_state_dict(model.state_dict())
    x = torch.randint(0, 11, (2, 9))
    assert torch.equal(model(x, rope=spec), other(x))
    out = model.forward_with_attention(x)
    assert torch.equal(out.logits, model(x)) and len(out.attention) == 2 and out.attention[0].shape == (2, 4, 9, 9)


def test_checkpoint_round_trip_in_float32_and_float16(tmp_path):
    """save_checkpoint / load_checkpoint: float32 comes back exactly, float16 as the float16 value in float32; the
    training record lands beside the weights; the config (a RoPE with a scaling dict) round-trips."""
    import json

    from ropelab.models import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    rope = RopeSpec(scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16},
                    max_position_embeddings=16)
    model = TinyLM(ModelConfig(vocab_size=11, d_model=32, n_heads=2, n_layers=1, rope=rope))
    for dtype in (torch.float32, torch.float16):
        path = save_checkpoint(model, tmp_path / f"m_{dtype}.pt", dtype=dtype, meta={"dtype": str(dtype)})
        back = load_checkpoint(path)
        assert back.cfg == model.cfg and not back.training
        assert json.loads(path.with_suffix(".json").read_text()) == {"dtype": str(dtype)}
        got = back.state_dict()
        for k, v in model.state_dict().items():
            assert got[k].dtype == torch.float32 and torch.equal(got[k], v.to(dtype).float()), k
    assert save_checkpoint(model, tmp_path / "no_meta.pt").exists() and not (tmp_path / "no_meta.json").exists()
    with pytest.raises(ValueError, match="dtype must be"):
        save_checkpoint(model, tmp_path / "x.pt", dtype=torch.int8)
    with pytest.raises(FileNotFoundError, match="make lm"):
        load_checkpoint(tmp_path / "missing.pt")
