"""ropelab.extension: the context-extension methods, the retrieval probe, the committed study checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ropelab import extension as ext
from ropelab import lm
from ropelab.models import TinyLM
from ropelab.scaling import critical_pair, default_inv_freq, frequencies, pair_at_turns
from ropelab.spec import RopeSpec


def test_key_markers_never_occur_in_the_corpus_but_their_bytes_do():
    data = lm.CORPUS.read_bytes()
    assert ext.KEY_OPEN not in data and ext.KEY_CLOSE not in data
    # every byte of a key block is one the LM was trained on (untrained bytes were not learned: see KEY_OPEN)
    assert all(bytes([b]) in data for b in (*ext.KEY_OPEN, *ext.KEY_CLOSE, *ext.KEY_ALPHABET))


@pytest.mark.parametrize("r, base, L0", [(32, 1e4, 256), (128, 1e4, 4096), (64, 5e5, 8192), (16, 100.0, 64)])
def test_critical_pair_is_the_first_pair_whose_wavelength_exceeds_l0(r, base, L0):
    wave = 2 * math.pi / default_inv_freq(r, base)
    first = next((i for i in range(r // 2) if wave[i] > L0), r // 2)
    assert critical_pair(r, base, L0) == first
    # pair_at_turns(beta) is where pairs complete beta turns over L0 (continuous in i)
    i = pair_at_turns(r, base, L0, 3.0)
    assert abs(L0 * base ** (-2 * i / r) / (2 * math.pi) - 3.0) < 1e-9


@pytest.mark.parametrize("scale", [2.0, 4.0, 8.0])
def test_out_of_range_pairs_match_a_brute_force_angle_check(scale):
    r, base, L0 = 32, 1e4, 256
    ref = default_inv_freq(r, base)
    # positions span [0, L0) in training and [0, s L0) when extended (the suprema, as in the PI paper)
    trained_max = L0 * ref                                    # the angles each pair saw: [0, L0 w_i)
    turns = L0 * ref >= 2 * math.pi                           # pairs that saw every angle
    for name, row in ext.ratio_table(scale, r).items():
        ratio = torch.tensor(row["ratio"], dtype=torch.float64)
        reached = scale * L0 * ref * ratio                    # the angles reached at length s L0
        brute = [i for i in range(r // 2) if not turns[i] and reached[i] > trained_max[i] * (1 + 1e-9)]
        assert ext.out_of_range_pairs(ratio, scale, r) == brute, name


@pytest.mark.parametrize("scale", [2.0, 4.0, 16.0])
def test_ntk_alpha_in_range_is_the_smallest_alpha_that_keeps_every_pair_in_range(scale):
    r, base = 32, 1e4
    alpha = ext.ntk_alpha_in_range(scale, r, base)
    assert alpha > scale  # the YaRN paper's "s has to be set higher than the expected scale"

    def out(a):
        inv, _ = frequencies(r, base * a ** (r / (r - 2)))
        return ext.out_of_range_pairs(inv / default_inv_freq(r, base), scale, r, base)

    assert out(alpha * (1 + 1e-6)) == [] and out(alpha * (1 - 1e-3)) == [critical_pair(r, base, lm.L0)]


def test_ratio_table_shapes_of_the_methods():
    t = ext.ratio_table(4.0, 32)
    assert set(t) == {"no scaling", "PI", "NTK-aware", "dynamic NTK", "YaRN", "Llama 3"}
    assert all(abs(x - 0.25) < 1e-15 for x in t["PI"]["ratio"])
    assert t["NTK-aware"]["ratio"][0] == 1.0 and abs(t["NTK-aware"]["ratio"][-1] - 0.25) < 1e-12
    assert t["YaRN"]["ratio"][0] == 1.0 and abs(t["YaRN"]["ratio"][-1] - 0.25) < 1e-15
    assert abs(t["YaRN"]["attention_factor"] - (0.1 * math.log(4) + 1)) < 1e-15
    # dynamic NTK at L = s L0 is NTK-aware at alpha = s^2 - s + 1 = 13
    assert abs(t["dynamic NTK"]["ratio"][-1] - 13.0 ** -1) < 1e-12
    lr = ext.ratio_table(4.0, 32, longrope={"long_factor": [2.0] * 16, "short_factor": [1.0] * 16})["LongRoPE"]
    assert lr["ratio"] == [0.5] * 16
    assert abs(lr["attention_factor"] - math.sqrt(1 + math.log(4) / math.log(256))) < 1e-12
    factors = {"long_factor": [2.0] * 16, "short_factor": [1.0] * 16}
    short = ext.ratio_table(4.0, 32, seq_len=200, longrope=factors)
    assert short["LongRoPE"]["ratio"] == [1.0] * 16  # within L0 the short factors apply


def test_plant_keys_writes_both_copies_and_rejects_overlap():
    w = torch.full((2, 40), ord(" "))
    keys = torch.tensor([[ord(c) for c in "ABCDE"], [ord(c) for c in "VWXYZ"]])
    out = ext.plant_keys(w, keys, torch.tensor([0, 3]), torch.tensor([20, 30]))
    assert bytes(out[0, 0:9].tolist()) == b"##ABCDE%%" == bytes(out[0, 20:29].tolist())
    assert bytes(out[1, 3:12].tolist()) == b"##VWXYZ%%" == bytes(out[1, 30:39].tolist())
    assert (w == ord(" ")).all()  # a copy
    with pytest.raises(ValueError, match="without overlap"):
        ext.plant_keys(w, keys, torch.tensor([0, 3]), torch.tensor([5, 30]))
    with pytest.raises(ValueError, match="without overlap"):
        ext.plant_keys(w, keys, torch.tensor([0, 3]), torch.tensor([20, 32]))
    with pytest.raises(ValueError, match="need keys"):
        ext.plant_keys(w, keys[:1], torch.tensor([0, 3]), torch.tensor([20, 30]))


def test_probe_sample_plants_keys_and_copies_weighs_them_and_is_seeded():
    data = torch.full((5000,), ord("x"))
    sample = ext.probe_sample(data, 64, 100, p_key=0.5, p_copy=0.25)
    x1, y1, w1 = sample(torch.Generator().manual_seed(0))
    x2, _, w2 = sample(torch.Generator().manual_seed(0))
    # exact on every CPU: byte tokens and weights drawn from the same seed by the same code
    assert torch.equal(x1, x2) and torch.equal(w1, w2) and x1.shape == w1.shape == (64, 100)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    full = torch.cat([x1, y1[:, -1:]], 1)
    keyed = torch.tensor([bytes(r.tolist()).count(ext.KEY_OPEN) == 2 for r in full])
    copied = (w1 == ext.COPY_WEIGHT).any(1)
    plain = ~keyed & ~copied
    assert 10 < int(keyed.sum()) < 54 and 4 < int(copied.sum()) < 30 and int(plain.sum()) > 4
    assert not bool((keyed & copied).any())
    # a keyed window weighs exactly its five retrieved letters, and they are the key's letters
    for r in keyed.nonzero().flatten().tolist():
        heavy = (w1[r] == ext.KEY_WEIGHT).nonzero().flatten()
        assert heavy.numel() == ext.KEY_LEN
        opener = bytes(full[r].tolist()).rindex(ext.KEY_OPEN)
        assert heavy.tolist() == list(range(opener + 1, opener + 1 + ext.KEY_LEN))
        # exact on every CPU: integer byte tokens
        assert torch.equal(y1[r, heavy], full[r, opener + 2: opener + 2 + ext.KEY_LEN])
    # a copy window's heavy targets repeat letters written earlier in the window
    for r in copied.nonzero().flatten().tolist():
        heavy = (w1[r] == ext.COPY_WEIGHT).nonzero().flatten()
        assert all(chr(int(y1[r, t])) in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" for t in heavy)
    assert bool((w1[plain] == 1).all())


def test_half_checkpoint_round_trip(tmp_path):
    model = TinyLM(lm.model_config(n_layers=1, d_model=32, n_heads=2))
    ext.save_half(model, tmp_path / "m.pt", {"note": 1})
    back = ext.load_model(tmp_path / "m.pt")
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        # exact on every CPU: float16 -> float32 is exact, so the round trip is a conversion, not a computation
        assert b.dtype == torch.float32 and torch.equal(a.half().float(), b), k
    assert json.loads((tmp_path / "m.json").read_text()) == {"note": 1}
    with pytest.raises(FileNotFoundError, match="make lm"):
        ext.load_model(tmp_path / "missing.pt")


def test_retrieval_is_chance_for_an_untrained_model_and_checks_lengths():
    torch.manual_seed(0)
    model = TinyLM(lm.model_config(n_layers=1, d_model=32, n_heads=2)).eval()
    w = torch.full((4, 60), ord("x"))
    hits = ext.retrieval(model, model.cfg.rope, [20, 30], w, key_pos=2)
    assert set(hits) == {20, 30} and not any(h.any() for h in hits.values())
    with pytest.raises(ValueError, match="needs windows"):
        ext.retrieval(model, model.cfg.rope, [60], w)


def test_temperature_study_pairs_windows_and_matches_the_sweep():
    """Per-window losses whose means are temperature_sweep's, eq. 22's point included, and a paired summary."""
    torch.manual_seed(0)
    model = TinyLM(lm.model_config(n_layers=1, d_model=32, n_heads=2)).eval()
    w = torch.randint(0, 256, (3, 2 * lm.L0 + 1))
    study = ext.temperature_study(model, w, scales=(2.0,), factors=(1.0, 1.2), progress=False)
    row = study["scales"]["2.0"]
    assert study["n_windows"] == 3 and row["length"] == 2 * lm.L0 and row["formula"] == 0.1 * math.log(2) + 1
    means = [sum(row["window_loss"][k]) / 3 for k in ("1.0", "1.2")]
    sweep = ext.temperature_sweep(model, w, 2.0, [1.0, 1.2, row["formula"]])
    for a, b in zip([*means, sum(row["formula_window_loss"]) / 3], sweep):
        assert abs(a - b) <= 1e-5 * abs(b)  # float32 losses averaged in another order
    t = ext.temperature_summary(study)[2.0]
    m, lo, hi = t["formula_minus_best"]
    assert t["best"] in (1.0, 1.2) and lo <= m <= hi
    with pytest.raises(ValueError, match="needs windows"):
        ext.temperature_study(model, w, scales=(4.0,), factors=(1.0,), progress=False)


def test_wilson_interval_edges():
    lo, hi = ext.wilson(45, 45)
    assert hi == 1.0 and abs(lo - 45 / (45 + 1.96 ** 2)) < 1e-12  # k = n: the lower end is n / (n + z^2)
    lo, hi = ext.wilson(0, 10)
    assert lo == 0.0 and 0 < hi < 0.35
    with pytest.raises(ValueError, match="0 <= k <= n"):
        ext.wilson(3, 2)


def test_committed_temperature_study_is_the_probe_models_on_45_windows():
    study = json.loads(ext.TEMPERATURE_RESULTS.read_text())
    assert study["checkpoint"] == ext.PROBE_CHECKPOINT.name and study["n_windows"] == 45
    assert study["factors"] == list(ext.TEMPERATURE_FACTORS)
    for s, row in study["scales"].items():
        assert row["length"] == int(float(s) * lm.L0) and len(row["formula_window_loss"]) == 45
        assert all(len(v) == 45 for v in row["window_loss"].values())


# ---- the committed study models (written by `make lm`) --------------------------------------------------------

@pytest.fixture(scope="module")
def probe_model():
    return ext.load_model(ext.PROBE_CHECKPOINT)


def test_probe_model_retrieves_within_l0(probe_model):
    _, val = lm.load_corpus()
    w = lm.val_windows(val, 16, lm.L0)
    hits = ext.retrieval(probe_model, probe_model.cfg.rope, [64, 200], w)
    acc = {d: float(h.float().mean()) for d, h in hits.items()}
    assert all(a >= 0.75 for a in acc.values()), acc


@pytest.mark.parametrize("method", ext.FINETUNED)
def test_finetuned_checkpoints_carry_their_method(method):
    model = ext.load_model(ext.finetuned_checkpoint(method))
    m = ext.methods(ext.FT_SCALE, model.cfg.head_dim)[method]
    assert model.cfg.rope.base == m.base and model.cfg.rope.scaling == m.scaling
    assert ext.method_spec(model.cfg.rope, m) == model.cfg.rope
    meta = json.loads(ext.finetuned_checkpoint(method).with_suffix(".json").read_text())
    assert meta["steps"] == ext.FT_STEPS and meta["context"] == ext.FT_LENGTH and meta["method"] == method


def test_finetuned_models_share_one_budget():
    metas = [json.loads(ext.finetuned_checkpoint(m).with_suffix(".json").read_text()) for m in ext.FINETUNED]
    keys = ("steps", "batch", "context", "lr", "seed", "p_key", "from")
    assert all({k: m[k] for k in keys} == {k: metas[0][k] for k in keys} for m in metas)


def test_longrope_factors_obey_the_constraints_and_beat_their_seeds():
    f = json.loads(ext.LONGROPE_FACTORS.read_text())
    lam = torch.tensor(f["long_factor"])
    assert lam.numel() == 16 and bool((lam >= 1).all()) and bool((lam[1:] >= lam[:-1]).all())
    assert f["short_factor"] == [1.0] * 16
    assert f["history"][-1]["best_loss"] <= min(f["seed_losses"].values())


def test_finetune_and_probe_training_run(tmp_path):
    h = ext.finetune("YaRN", steps=2, out=tmp_path / "ft.pt", progress=False)
    assert len(h) == 1 and math.isfinite(h[0]["loss"])
    with pytest.raises(ValueError, match="fine-tune one of"):
        ext.finetune("Llama 3", steps=1, out=tmp_path / "x.pt", progress=False)


def test_the_study_table_is_extends_at_this_studys_l0():
    """ropelab.extension's methods and analytics are ropelab.extend's with base 10000 and L0 = lm.L0 as defaults:
    the calls notebook 07 makes, positional and keyword, give what extend gives with both passed in."""
    from ropelab import extend

    got, want = ext.methods(4.0, 32), extend.methods(4.0, 32, base=10000.0, original=lm.L0)
    assert got == want and all(m.max_position_embeddings == lm.L0 for m in got.values())
    assert ext.ratio_table(4.0, 32) == extend.ratio_table(4.0, 32, base=10000.0, original=lm.L0)
    assert ext.ratio_table(2.0, 16, original=64, base=500.0) == extend.ratio_table(2.0, 16, base=500.0, original=64)
    ratio = got["NTK-aware"].frequencies(32, seq_len=4 * lm.L0)[0] / default_inv_freq(32, 1e4)
    assert ext.out_of_range_pairs(ratio, 4.0, 32, 1e4) == extend.out_of_range_pairs(ratio, 4.0, 32, 1e4, lm.L0)
    assert ext.ntk_alpha_in_range(2.0, 128, 10000.0, 4096) == extend.ntk_alpha_in_range(2.0, 128, 10000.0, 4096)
    assert ext.ntk_alpha_in_range(4.0, 32, 1e4) == extend.ntk_alpha_in_range(4.0, 32, 1e4, lm.L0)
    with pytest.raises(TypeError):
        extend.methods(4.0, 32)  # the pure table takes the model's base and L0 from its caller


def test_extend_is_pure():
    """ropelab.extend trains nothing: it imports no study, model or training module (explorers rely on it)."""
    import ast
    from pathlib import Path

    from ropelab import extend

    tree = ast.parse(Path(extend.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
    assert {m.split(".")[0] for m in imported} <= {"scaling", "spec"}, imported


def test_method_spec_keeps_the_models_rope_and_rejects_what_is_not_a_method():
    spec = RopeSpec(style="interleaved", base=500.0, rotary_dim=16, max_position_embeddings=64)
    yarn = ext.methods(4.0, 32)["YaRN"]
    out = ext.method_spec(spec, yarn)
    assert (out.style, out.rotary_dim, out.max_position_embeddings) == ("interleaved", 16, 64)
    assert out.base == yarn.base and out.scaling == yarn.scaling
    assert ext.method_spec(spec, {"base": yarn.base, "scaling": dict(yarn.scaling)}) == out
    with pytest.raises(ValueError, match="method must be"):
        ext.method_spec(spec, {"scaling": None})


def test_list_prints_the_finetuned_methods(capsys):
    assert ext.main(["list"]) == 0
    assert capsys.readouterr().out.splitlines() == list(ext.FINETUNED)


@pytest.mark.parametrize("path", sorted(lm.LM_DIR.glob("tinylm_*.pt")), ids=lambda p: p.stem)  # the model checkpoints
def test_committed_checkpoints_load_bit_identically_through_the_one_reader(path):
    """models.load_checkpoint gives exactly the tensors the two readers it replaced gave (their code, kept here):
    lm.load_lm's (float32 as stored) and extension.load_model's (float16 cast to float32)."""
    from ropelab.models import ModelConfig, load_checkpoint

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    old = TinyLM(ModelConfig.from_dict(ckpt["config"]))
    if path == lm.CHECKPOINT:
        old.load_state_dict(ckpt["state_dict"])
    else:
        old.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()})
    new = load_checkpoint(path)
    assert new.cfg == old.cfg and not new.training
    a, b = old.state_dict(), new.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_make_lm_reads_the_finetuned_methods_from_the_package():
    """One list of fine-tuned methods (FINETUNED): the Makefile asks `python -m ropelab.extension list` for it."""
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "-m ropelab.extension list" in makefile
    assert not any(f'"{m}"' in makefile or f" {m} " in makefile for m in ext.FINETUNED)


def test_mcnemar_exact_counts_discordant_windows():
    a = torch.tensor([True] * 45)
    b = torch.tensor([True] * 40 + [False] * 5)
    r = ext.mcnemar_exact(a, b)
    assert (r["only_a"], r["only_b"]) == (5, 0) and r["p_value"] == pytest.approx(2 * 0.5 ** 5)
    assert ext.mcnemar_exact(a, a)["p_value"] == 1.0
    # 6 against 2 discordant: two-sided exact p = 2 * P(X <= 2), X ~ Bin(8, 1/2)
    c = torch.tensor([True] * 6 + [False] * 2 + [True] * 2)
    d = torch.tensor([False] * 6 + [True] * 2 + [True] * 2)
    assert ext.mcnemar_exact(c, d)["p_value"] == pytest.approx(2 * (1 + 8 + 28) / 256)
    with pytest.raises(ValueError, match="same windows"):
        ext.mcnemar_exact(a, b[:3])


def test_table1_comparison_pairs_rises_and_points_per_window():
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(30, 1024, generator=g, dtype=torch.float64) * 0.3
    pos = torch.arange(1024, dtype=torch.float64)
    # each method's loss rises past 512 at its own slope, on the same windows' noise
    slopes = {"no scaling": 0.0, "PI": 1e-3, "NTK-aware": 2e-3, "YaRN": 1.5e-3}
    ft = {"window_loss": {k: noise + 1.0 + v * (pos - 512).clamp_min(0) for k, v in slopes.items()}}
    c = ext.table1_comparison(ft, 512)
    assert c["points"] == {1.25: 640, 1.5: 768, 2.0: 1024}
    # the shared noise cancels in every paired difference: the intervals have no width beyond round-off
    for k, v in slopes.items():
        # the mean of (pos - 512) over [512, 768) is 127.5; over [256, 512) the rise term is 0
        assert c["rise"][k][0] == pytest.approx(v * 127.5 + float((noise[:, 512:768].mean(1) - noise[:, 256:512]
                                                                    .mean(1)).mean()), abs=1e-9)
        assert c["rise_vs"][k][2] - c["rise_vs"][k][1] < 1e-9
    pi_at_2x = (slopes["PI"] - slopes["YaRN"]) * float((pos[960:1024] - 512).mean())
    assert c["at"][2.0]["PI"][0] == pytest.approx(pi_at_2x) and set(c["widths"]) == {32, 64, 128}
