"""ropelab.studies.nb10_engines: the public boundary bugs as spec maps, and their damage on the trained TinyLMs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ropelab.models import ModelConfig, TinyLM
from ropelab.multiaxis import MultiAxis
from ropelab.precision import unit_roundoff
from ropelab.spec import RopeSpec
from ropelab.studies import nb10_engines as e

YARN = RopeSpec(base=1e4, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256},
                max_position_embeddings=256)
LONG = RopeSpec(base=1e4, max_position_embeddings=1024, scaling={
    "rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 256,
    "long_factor": [1.0 + i for i in range(8)], "short_factor": [1.0] * 8})


def _changed(a: RopeSpec, b: RopeSpec) -> set[str]:
    da, db = a.to_dict(), b.to_dict()
    return {k for k in da if da[k] != db[k]}


def test_boundary_bugs_are_complete_and_cover_every_class():
    bugs = e.boundary_bugs()
    assert {b["class"] for b in bugs} == set(e.BUG_CLASSES)
    for b in bugs:
        assert b["url"].startswith(f"https://github.com/{b['repository']}/") and b["url"].endswith(f"/{b['number']}")
    cited = {(b["repository"], b["number"]) for b in bugs}
    assert {("ggml-org/llama.cpp", 19443), ("ggml-org/llama.cpp", 22612), ("Blaizzy/mlx-vlm", 1709),
            ("ml-explore/mlx-lm", 660)} <= cited  # the four issue 22 names


def test_boundary_bugs_rejects_a_bad_file(tmp_path):
    good = json.loads(e.BUGS_JSON.read_text())
    broken = {"bugs": [{**good["bugs"][0], "quote": ""}]}
    (tmp_path / "b.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="lacks \\['quote'\\]"):
        e.boundary_bugs(tmp_path / "b.json")
    (tmp_path / "c.json").write_text(json.dumps({"bugs": [{**good["bugs"][0], "class": "made_up"}]}))
    with pytest.raises(ValueError, match="unknown class"):
        e.boundary_bugs(tmp_path / "c.json")


def test_each_bug_changes_exactly_what_it_claims():
    partial = RopeSpec(rotary_dim=16)
    assert _changed(partial, e.drop_partial_rotary(partial)) == {"rotary_dim"}
    assert e.drop_partial_rotary(partial).rotary_dim is None
    assert _changed(RopeSpec(), e.impose_partial_rotary(RopeSpec(), 8)) == {"rotary_dim"}
    assert _changed(RopeSpec(), e.neox_as_interleaved(RopeSpec())) == {"style"}
    assert e.neox_as_interleaved(RopeSpec()).style == "interleaved"
    assert _changed(YARN, e.ignore_rope_scaling(YARN)) == {"scaling"} and e.ignore_rope_scaling(YARN).scaling is None
    assert e.identity(YARN) is YARN


def test_drop_yarn_attention_factor_keeps_the_frequencies():
    bad = e.drop_yarn_attention_factor(YARN)
    assert _changed(YARN, bad) == {"scaling"}
    assert {k: v for k, v in bad.scaling.items() if k != "attention_factor"} == dict(YARN.scaling)
    (inv_good, f_good), (inv_bad, f_bad) = YARN.frequencies(32), bad.frequencies(32)
    assert torch.equal(inv_good, inv_bad)  # the same computation on the same inputs
    assert f_bad == 1.0 and abs(f_good - (0.1 * math.log(2.0) + 1)) < 1e-15


def test_longrope_always_long_uses_the_long_set_within_l0():
    bad = e.longrope_always_long(LONG)
    assert _changed(LONG, bad) == {"scaling"}
    assert list(bad.scaling["short_factor"]) == list(LONG.scaling["long_factor"])
    short_good, _ = LONG.frequencies(16, seq_len=200)
    short_bad, _ = bad.frequencies(16, seq_len=200)
    long_good, _ = LONG.frequencies(16, seq_len=1000)
    assert torch.equal(short_bad, long_good) and not torch.equal(short_bad, short_good)


def test_mrope_bugs():
    sec = MultiAxis.mrope((6, 5, 5), interleaved=True)
    contiguous = e.mrope_as_contiguous(sec)
    assert contiguous.sections == sec.sections and not contiguous.interleaved
    assert not torch.equal(contiguous.axis_of_pair(), sec.axis_of_pair())
    flat = e.mrope_as_1d(sec)
    assert flat.n_pairs == sec.n_pairs and int(flat.axis_of_pair().max()) == 0


@pytest.mark.parametrize("call, match", [
    (lambda: e.drop_partial_rotary(RopeSpec()), "partial rotary_dim"),
    (lambda: e.impose_partial_rotary(RopeSpec(rotary_dim=8), 4), "whole head"),
    (lambda: e.impose_partial_rotary(RopeSpec(), 3), "positive even int"),
    (lambda: e.neox_as_interleaved(RopeSpec(style="interleaved")), "style='half'"),
    (lambda: e.ignore_rope_scaling(RopeSpec()), "scaling=None"),
    (lambda: e.drop_yarn_attention_factor(LONG), "yarn spec"),
    (lambda: e.longrope_always_long(YARN), "longrope spec"),
    (lambda: e.longrope_always_long(e.longrope_always_long(LONG)), "already equals"),
    (lambda: e.mrope_as_contiguous(MultiAxis.mrope((6, 5, 5))), "interleaved MultiAxis"),
    (lambda: e.mrope_as_1d(MultiAxis((16,))), "two or more axes"),
    (lambda: e.neox_as_interleaved({"style": "half"}), "takes a ropelab.RopeSpec"),
    (lambda: e.per_layer(e.identity, [RopeSpec()] * 2, layers=[2]), "not layers of a 2-layer model"),
    (lambda: e.per_layer(e.identity, []), "non-empty sequence"),
    (lambda: e.run_case("no_such_case"), "no case"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_per_layer_touches_only_the_chosen_layers():
    specs = e.per_layer(e.neox_as_interleaved, [RopeSpec()] * 4, layers=[1, 3])
    assert [s.style for s in specs] == ["half", "interleaved", "half", "interleaved"]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return TinyLM(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2)).double().eval()


def test_forward_per_layer_is_the_models_forward(tiny):
    ids = torch.randint(0, 32, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = tiny(ids)
    got = e.forward_per_layer(tiny, ids, [tiny.cfg.rope] * 2).logits
    # The same operations in the same order; a bound in float64 round-off (a few thousand operations per logit,
    # each within u of exact) rather than bit equality.
    assert float((got - want).abs().max()) <= 4096 * unit_roundoff(torch.float64) * float(want.abs().max())
    with pytest.raises(ValueError, match="one spec per layer"):
        e.forward_per_layer(tiny, ids, [tiny.cfg.rope])
    with pytest.raises(ValueError, match="LongTensor"):
        e.model_damage(tiny, ids.float(), [tiny.cfg.rope] * 2, [tiny.cfg.rope] * 2)
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="one shape"):
        e.qk_damage(q, q[:, :1], torch.arange(4), RopeSpec(), RopeSpec())


@pytest.fixture(scope="module")
def results():
    return e.run_all(smoke=True)


def test_identity_costs_nothing_and_every_bug_costs_something(results):
    assert set(results) == set(e.CASES)
    for name, r in results.items():
        ctl, dmg = r["control"], r["damage"]
        # the control runs the same computation twice: zero to within float64 round-off
        assert ctl["kl"] <= 1e-12 and ctl["cosine"] >= 1 - 1e-12 and ctl["first_flip"] is None, (name, ctl)
        assert ctl["flip_rate"] == 0.0
        # every bug: KL and 1 - cosine many orders above that, and a greedy (or attention) argmax that changes
        assert dmg["kl"] > 1e-3 and dmg["cosine"] < 1 - 1e-4 and dmg["first_flip"] is not None, (name, dmg)


def test_mrope_read_contiguous_is_harmless_on_text_only(results):
    r = results["mrope_interleaved_as_other"]
    assert r["text_only"]["kl"] <= 1e-12 and r["text_only"]["first_flip"] is None  # MNN#4133's observation
    assert r["as_1d"]["kl"] > 1e-3  # and read as 1D RoPE (llama.cpp#19443) it costs on the image


def test_damage_is_deterministic():
    a, b = e.run_case("longrope_switch_wrong", smoke=True), e.run_case("longrope_switch_wrong", smoke=True)
    assert a["damage"] == b["damage"]


@pytest.fixture(scope="module")
def caught(tmp_path_factory):
    pytest.importorskip("gguf")
    return e.catch_all(tmp_path_factory.mktemp("catch"))


def test_ropelab_check_catches_every_bug_and_passes_the_identity(caught):
    assert set(caught) == set(e.CHECK_CASES) == set(e.BUG_CLASSES)
    want = {"partial_rotary_dropped": {"rotary_dim"}, "partial_rotary_imposed": {"rotary_dim"},
            "neox_read_as_interleaved": {"style"}, "rope_scaling_ignored": {"frequencies"},
            "yarn_settings_dropped": {"frequencies", "attention_factor"},
            "yarn_attention_factor_dropped": {"attention_factor"}, "longrope_switch_wrong": {"frequencies"},
            "mrope_interleaved_as_other": {"sections"}}
    for name, r in caught.items():
        assert r["exit_code"] == 1, (name, r)
        assert set(r["kinds"]) == want[name], (name, r["kinds"])
        assert r["max_kl"] > 1e-3, (name, r["max_kl"])  # the attention change is real at the stated position
        ctl = r["control"]
        assert ctl["exit_code"] == 0 and ctl["kinds"] == [] and ctl["problems"] == [], (name, ctl)
    # pairs of different dims have no phase error; frequency bugs do
    assert caught["neox_read_as_interleaved"]["phase_error"] is None
    assert caught["rope_scaling_ignored"]["phase_error"] > 1.0
    assert caught["yarn_attention_factor_dropped"]["phase_error"] == 0.0  # same angles, other attention scale
    assert caught["longrope_switch_wrong"]["position"] == 63 and caught["longrope_switch_wrong"]["phase_error"] > 0
    assert caught["neox_read_as_interleaved"]["file"] == "buggy/command-r.gguf"


def test_write_bug_rejects_an_unknown_case(tmp_path):
    with pytest.raises(ValueError, match="no check case"):
        e.write_bug("made_up", tmp_path)


def test_every_report_says_where_the_bug_lived(tmp_path):
    bugs = e.boundary_bugs()
    where = e.classes_by_where(bugs)
    assert set(where) == set(e.WHERE) and where["file"] | where["engine code"] == set(e.BUG_CLASSES)
    # the converter reports are the file ones (llama.cpp#13322, #22612, ik_llama.cpp#2003)
    assert {b["number"] for b in bugs if b["where"] == "file"} == {13322, 22612, 2003}
    good = json.loads(e.BUGS_JSON.read_text())
    (tmp_path / "w.json").write_text(json.dumps({"bugs": [{**good["bugs"][0], "where": "somewhere"}]}))
    with pytest.raises(ValueError, match="where='somewhere'"):
        e.boundary_bugs(tmp_path / "w.json")


def test_spread_summarises_windows_and_is_seeded():
    s = e.spread([3.0, 1.0, None, 2.0])
    assert (s["median"], s["lo"], s["hi"], s["mean"], s["missing"], s["n"]) == (2.0, 1.0, 3.0, 2.0, 1, 4)
    assert 1.0 <= s["ci"][0] <= 2.0 <= s["ci"][1] <= 3.0
    assert e.spread([3.0, 1.0, 2.0]) == e.spread([3.0, 1.0, 2.0])  # the bootstrap is seeded
    with pytest.raises(ValueError, match="at least one"):
        e.spread([None])


def test_window_damage_matches_the_pooled_measure(tiny):
    ids = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(2))
    correct = [tiny.cfg.rope] * 2
    buggy = e.per_layer(e.neox_as_interleaved, correct)
    w = e.window_damage(tiny, ids, correct, buggy)
    pooled = e.model_damage(tiny, ids, correct, buggy)
    # equal windows: the pooled mean KL is the mean of the per-window means (float64 round-off apart)
    assert abs(sum(w["kl"]) / 3 - pooled.kl) <= 1e-12 * max(1.0, pooled.kl)
    assert abs(sum(w["flip_rate"]) / 3 - pooled.flip_rate) <= 1e-12
    same = e.window_damage(tiny, ids, correct, correct)
    assert same["kl"] == [0.0] * 3 and same["dnll"] == [0.0] * 3 and same["first_flip"] == [None] * 3


def test_results_carry_the_spread(results):
    for name, r in results.items():
        w = r["per_window"]
        assert len(w["kl"]) == r["windows"] and min(w["kl"]) > 0, name
        assert ("dnll" in w) == (r["measure"] == "model"), name
