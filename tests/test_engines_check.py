"""ropelab-check (ropelab.engines.check): per-layer comparison, what each mismatch costs (zero when the specs
agree, the float64 phase error |d omega| m when they do not), exit codes 0 / 1 / 2, JSON, --write-config, and
every bad input as one line, never a traceback."""

from __future__ import annotations

import importlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ropelab
from ropelab.engines import Reading
from ropelab.engines import check as chk
from ropelab.engines.check import REL_TOL, check, compare_layers, cost, main
from ropelab.multiaxis import MultiAxis
from ropelab.precision import UNIT_ROUNDOFF
from ropelab.spec import RopeSpec

U64 = UNIT_ROUNDOFF[torch.float64]
D, M, L0 = 64, 4095, 4096


def llama(rope: dict, layers: int = 32, **extra) -> dict:
    return {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": 4 * D, "num_attention_heads": 4,
            "max_position_embeddings": L0, "rope_parameters": rope, **extra}


LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1024}
DEFAULT = {"rope_type": "default", "rope_theta": 5e5}


def write(tmp_path: Path, name: str, config: dict | str) -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


def omega(base: float, rotary_dim: int) -> list[float]:
    """The default ladder b^(-2i/r), in float64 from Python's math."""
    return [base ** (-2 * i / rotary_dim) for i in range(rotary_dim // 2)]


def phase_oracle(wa: list[float], wb: list[float], m: int) -> tuple[float, float]:
    """max_i |wa_i - wb_i| m and its bound: each w within 4 ulps, the product and difference rounded once more."""
    value = max(abs(a - b) * m for a, b in zip(wa, wb))
    return value, m * 8 * U64 * max(a + b for a, b in zip(wa, wb)) + 2 * U64 * value


# --- costs ---------------------------------------------------------------------------------------------------


SPECS = {
    "default": RopeSpec(base=1e4, max_position_embeddings=L0),
    "llama3": RopeSpec(base=5e5, scaling={k: v for k, v in LLAMA3.items() if k != "rope_theta"},
                       max_position_embeddings=L0),
    "yarn": RopeSpec(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
                     max_position_embeddings=L0),
    "dynamic": RopeSpec(scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=1024),
    "partial": RopeSpec(base=1e4, rotary_dim=32, max_position_embeddings=L0),
    "nope": RopeSpec.nope(L0),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_agreeing_specs_cost_exactly_zero(name):
    s = SPECS[name]
    assert compare_layers(s, s, D, M) == []
    c = cost(s, s, D, M, samples=64)
    assert c["phase_error"] == 0.0 and c["max_kl"] == 0.0 and c["max_abs_dprob"] == 0.0


def test_base_mismatch_phase_is_delta_omega_times_m():
    a, b = RopeSpec(base=1e4), RopeSpec(base=5e5)
    (diff,) = compare_layers(a, b, D, M)
    assert diff["kind"] == "frequencies" and "base 10000 vs 500000" in diff["detail"]
    c = cost(a, b, D, M, samples=64)
    want, bound = phase_oracle(omega(1e4, D), omega(5e5, D), M)
    assert abs(c["phase_error"] - want) <= bound and want > 1
    assert c["max_kl"] > 0 and c["max_abs_dprob"] > 0


def test_linear_factor_mismatch_phase():
    a, b = RopeSpec(base=1e4), RopeSpec(base=1e4, scaling={"rope_type": "linear", "factor": 4.0})
    assert [d["kind"] for d in compare_layers(a, b, D, M)] == ["frequencies"]
    want, bound = phase_oracle(omega(1e4, D), [w / 4 for w in omega(1e4, D)], M)
    assert want == pytest.approx(0.75 * M, rel=1e-15)  # pair 0: omega 1, so |d omega| m = (1 - 1/4) m
    assert abs(cost(a, b, D, M)["phase_error"] - want) <= bound


def test_nope_against_rope_costs_all_of_the_rotation():
    a, b = RopeSpec(base=1e4), RopeSpec.nope()
    assert compare_layers(a, b, D, M)[0]["kind"] == "nope"
    c = cost(a, b, D, M)
    assert abs(c["phase_error"] - M) <= 4 * U64 * M  # pair 0 turns at omega_0 = 1
    assert c["max_kl"] > 0


@pytest.mark.parametrize("b, kind", [(RopeSpec(style="interleaved"), "style"), (RopeSpec(rotary_dim=32), "rotary_dim")])
def test_pairing_and_rotary_dim_mismatches_have_no_phase_but_cost_attention(b, kind):
    a = RopeSpec()
    assert [d["kind"] for d in compare_layers(a, b, D, M)] == [kind]
    c = cost(a, b, D, M)
    assert c["phase_error"] is None and c["max_kl"] > 0 and c["max_abs_dprob"] > 0


def test_attention_factor_mismatch_has_no_phase_error():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    a, b = RopeSpec(scaling=yarn), RopeSpec(scaling={**yarn, "attention_factor": 1.0})
    assert [d["kind"] for d in compare_layers(a, b, D, M)] == ["attention_factor"]
    c = cost(a, b, D, M)
    assert c["phase_error"] == 0.0 and c["max_kl"] > 0


def test_declared_differently_or_float32_rounded_agree():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    derived = 0.1 * math.log(4.0) + 1.0
    assert compare_layers(RopeSpec(scaling=yarn), RopeSpec(scaling={**yarn, "attention_factor": derived}), D, M) == []
    base = 123456.789
    f32 = float(torch.tensor(base, dtype=torch.float32))
    assert 0 < abs(f32 - base) / base < REL_TOL
    assert compare_layers(RopeSpec(base=base), RopeSpec(base=f32), D, M) == []
    assert compare_layers(RopeSpec(base=base), RopeSpec(base=base * (1 + 4 * REL_TOL)), D, M) != []


def test_length_dependent_types_are_compared_past_their_threshold():
    """dynamic NTK equals default up to its L0 and moves past it: a check at a short position still sees it."""
    a = RopeSpec(max_position_embeddings=1024)
    b = RopeSpec(scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=1024)
    (diff,) = compare_layers(a, b, D, 100)
    assert diff["kind"] == "frequencies" and "1025" in diff["detail"]


def test_sections_mismatch_phase():
    """M-RoPE against 1D RoPE: pair i of axis k sits at m // (k + 1) instead of m."""
    s = RopeSpec(base=1e4)
    sec = MultiAxis.mrope((8, 12, 12))
    c = cost(s, s, D, M, sections_a=None, sections_b=sec)
    axis = sec.axis_of_pair().tolist()
    w = omega(1e4, D)
    want = max(w[i] * (M - M // (axis[i] + 1)) for i in range(D // 2))
    assert abs(c["phase_error"] - want) <= 8 * U64 * M * max(w) and c["max_kl"] > 0


# --- check() on Readings built directly ----------------------------------------------------------------------


def reading(layers, fmt="transformers", **kw) -> Reading:
    return Reading(kw.pop("source", fmt), fmt, kw.pop("architecture", "llama"), kw.pop("head_dim", D), tuple(layers),
                   **kw)


def test_permuted_norm_agrees_with_half_with_a_note():
    half = RopeSpec(base=5e5, max_position_embeddings=L0)
    gguf = reading([RopeSpec(style="interleaved", base=5e5, max_position_embeddings=L0)] * 4, "gguf",
                   qk_permuted=True, source="m.gguf")
    r = check([reading([half] * 4), gguf])
    assert r["ok"] and not r["mismatches"]
    assert any("permuted" in a["detail"] and "m.gguf" in a["detail"] for a in r["agreements"])
    unpermuted = reading(gguf.layers, "gguf")
    r = check([reading([half] * 4), unpermuted])
    assert not r["ok"] and r["mismatches"][0]["kinds"] == ["style"]


def test_declared_differently_is_an_agreement_naming_the_keys():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    a = RopeSpec(scaling=yarn, max_position_embeddings=L0)
    b = RopeSpec(scaling={**yarn, "attention_factor": 0.1 * math.log(4.0) + 1.0}, max_position_embeddings=2 * L0)
    r = check([reading([a] * 2), reading([b] * 2)], position=100)
    assert r["ok"] and not r["mismatches"]
    (ag,) = r["agreements"]
    assert "max_position_embeddings 4096 vs 8192" in ag["detail"] and "attention_factor None vs 1.13" in ag["detail"]


def test_groups_are_runs_of_identical_layers():
    a, b = RopeSpec(base=1e4), RopeSpec(base=1e6)
    r = check([reading([a, a, b, b, b, a]), reading([a, a, b, b, a, a])], position=100)
    assert [g["layers"] for g in r["groups"]] == [[[0, 1], [5, 5]], [[2, 3]], [[4, 4]]]
    assert [m["layers"] for m in r["mismatches"]] == [[[4, 4]]]


def test_different_models_raise():
    a = RopeSpec()
    with pytest.raises(ValueError, match="different models.*4 layers.*2 layers"):
        check([reading([a] * 4), reading([a] * 2)])
    with pytest.raises(ValueError, match="head_dim 64.*head_dim 128"):
        check([reading([a] * 4), reading([a] * 4, head_dim=128)])


def test_consistency_of_any_reading(tmp_path, capsys):
    short = {"model_type": "qwen2_vl", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 1e6,
             "rope_scaling": {"type": "mrope", "mrope_section": [16, 16, 16]}}
    assert main([write(tmp_path, "q.json", short)]) == 1
    assert "sections [16, 16, 16] cover 48 rotary pairs, but the layers rotate [64]" in capsys.readouterr().out
    wide = reading([RopeSpec(rotary_dim=128)] * 2)  # a GGUF's dimension_count past the head
    r = check([wide, reading([RopeSpec()] * 2)])
    assert not r["ok"] and r["mismatches"] == [] and "layer 0: rotary_dim=128 is larger" in r["problems"][0]["problem"]
    assert chk.consistency(reading([RopeSpec()] * 2)) == []


def test_single_reading_problems_fail():
    r = check([reading([RopeSpec()] * 2, problems=("rope type NORM contradicts qwen2's NEOX",))])
    assert not r["ok"] and r["problems"] == [{"source": 0, "problem": "rope type NORM contradicts qwen2's NEOX"}]
    assert check([reading([RopeSpec()] * 2)])["ok"]


# --- the command ---------------------------------------------------------------------------------------------


def test_agree_and_mismatch_exit_codes(tmp_path, capsys):
    a, b = write(tmp_path, "a.json", llama(LLAMA3)), write(tmp_path, "b.json", llama(DEFAULT))
    assert main([a, "hf:" + a]) == 0
    out = capsys.readouterr().out
    assert "OK: all sources agree" in out and "layers 0-31:" in out and len(out.splitlines()) < 12
    assert main([a, b]) == 1
    out = capsys.readouterr().out
    assert "MISMATCHES (costs at position 4095)" in out and "scaling llama3(" in out and "vs default" in out
    assert re.search(r"phase error [\d.e+]+ rad", out) and "max KL" in out
    assert main([a]) == 0 and "the source is consistent" in capsys.readouterr().out


def test_json_schema(tmp_path, capsys):
    a, b = write(tmp_path, "a.json", llama(LLAMA3)), write(tmp_path, "b.json", llama(DEFAULT))
    assert main([a, b, "--json", "--position", "2000", "--samples", "32"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert set(r) == {"ok", "exit_code", "position", "n_ctx", "n_layers", "head_dim", "sources", "groups", "mismatches",
                      "agreements", "problems", "written"}
    assert r["exit_code"] == 1 and r["ok"] is False and r["position"] == 2000 and r["n_layers"] == 32
    assert r["n_ctx"] is None  # no --ctx: each source's own context
    assert [s["format"] for s in r["sources"]] == ["transformers", "transformers"]
    assert set(r["sources"][0]) >= {"source", "architecture", "head_dim", "layers", "effective_layers", "declared",
                                    "notes", "problems", "qk_permuted", "sections"}
    (mm,) = r["mismatches"]
    assert mm["layers"] == [[0, 31]] and mm["sources"] == [0, 1] and mm["kinds"] == ["frequencies"]
    assert set(mm["cost"]) == {"position", "axis_positions", "phase_error", "max_kl", "max_abs_dprob", "samples",
                               "heads", "seed"}
    assert mm["cost"]["phase_error"] > 0 and mm["cost"]["samples"] == 32
    assert r["groups"][0]["specs"][1]["base"] == 5e5


def test_internal_problem_of_one_source_exits_1(tmp_path, capsys):
    bad = write(tmp_path, "c.json", llama(DEFAULT, rope_theta=1e4))
    assert main([bad]) == 1
    assert "PROBLEM: [1] rope_theta=10000.0 (v4)" in capsys.readouterr().out


def test_write_config_fixes_the_other_source(tmp_path, capsys):
    a, b = write(tmp_path, "a.json", llama(LLAMA3)), write(tmp_path, "b.json", {**llama(DEFAULT), "vocab_size": 7})
    for schema in ("v5", "v4"):
        out = tmp_path / f"fixed_{schema}.json"
        assert main([a, b, "--write-config", str(out), "--schema", schema]) == 1
        assert f"wrote {out}" in capsys.readouterr().out
        fixed = json.loads(out.read_text())
        assert fixed["vocab_size"] == 7  # b's other keys kept
        assert main([a, str(out)]) == 0, capsys.readouterr().out
        capsys.readouterr()
    gemma = {"model_type": "gemma3_text", "num_hidden_layers": 32, "hidden_size": 256, "num_attention_heads": 4,
             "head_dim": D, "max_position_embeddings": L0, "sliding_window_pattern": 6,
             "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}}
    g = write(tmp_path, "g.json", gemma)
    assert main([g, "--write-config", str(tmp_path / "v4.json"), "--schema", "v4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--write-config" in err and "schema='v5'" in err and len(err.splitlines()) == 1


class FakeGGUF:
    """A stand-in reader for .gguf files (the real one is ropelab.engines.gguf): dispatch is by format."""

    @staticmethod
    def read_gguf(path):
        spec = RopeSpec(style="interleaved", base=5e5, max_position_embeddings=L0)
        return Reading(str(path), "gguf", "llama", D, (spec,) * 32, qk_permuted=True)


def test_gguf_paths_dispatch_to_the_gguf_reader(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "fake_gguf_reader", FakeGGUF)
    monkeypatch.setitem(chk.READERS, "gguf", ("fake_gguf_reader", "read_gguf"))
    g = write(tmp_path, "model.gguf", "GGUF")
    b = write(tmp_path, "b.json", llama(DEFAULT))
    assert main([g, b]) == 0
    out = capsys.readouterr().out
    assert "[1] gguf llama" in out and "q/k rows permuted" in out and "interleaved on those weights is half" in out
    (tmp_path / "d").mkdir()
    write(tmp_path / "d", "only.gguf", "GGUF")
    assert chk.detect(str(tmp_path / "d")) == ("gguf", tmp_path / "d" / "only.gguf")
    assert chk.detect("gguf:" + b) == ("gguf", Path(b))


def test_missing_reader_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(chk.READERS, "mlx", ("ropelab_no_such_module", "read_mlx"))
    assert main(["mlx:" + str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "reading mlx needs ropelab_no_such_module.read_mlx" in err and len(err.splitlines()) == 1


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    good = write(tmp_path, "good.json", llama(DEFAULT))
    (tmp_path / "empty").mkdir()
    two = tmp_path / "two"
    two.mkdir()
    for n in ("a", "b"):
        write(two, f"{n}.gguf", "GGUF")
    return [
        ([str(tmp_path / "missing.json")], "no such file"),
        ([str(tmp_path / "empty")], "no config.json and no .gguf"),
        ([str(two)], "2 .gguf files"),
        ([write(tmp_path, "x.json", "{oops")], "not a readable JSON"),
        ([write(tmp_path, "l.json", "[1]")], "not an object"),
        ([write(tmp_path, "u.json", {**llama(DEFAULT), "model_type": "nonesuch"})], "convention table"),
        ([write(tmp_path, "weird.bin", "hello")], "prefix it with hf:"),
        ([good, write(tmp_path, "small.json", llama(DEFAULT, layers=2))], "different models"),
        ([write(tmp_path, "trunc.gguf", "GGU")], "trunc.gguf"),
        ([good, "--position", "0"], "--position"),
        ([good, "--samples", "1"], "--samples"),
    ]


def test_every_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for argv, words in _bad_inputs(tmp_path):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert main([str(tmp_path / "missing.json"), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 2 and "no such file" in out["error"]


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env_root = str(Path(ropelab.__file__).parents[1])
    return subprocess.run([sys.executable, "-m", "ropelab.engines", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": env_root, "PATH": "/usr/bin:/bin"})


def test_runs_as_a_module_without_tracebacks(tmp_path):
    a, b = write(tmp_path, "a.json", llama(LLAMA3)), write(tmp_path, "b.json", llama(DEFAULT))
    r = _run(tmp_path, a, b, "--samples", "16")
    assert r.returncode == 1 and "NOT OK: 1 mismatch(es)" in r.stdout, r.stderr
    r = _run(tmp_path, write(tmp_path, "t.gguf", "GG"), a)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_console_script_entry():
    text = (Path(ropelab.__file__).parents[1] / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    mod, attr = re.search(r'^ropelab-check = "([\w.]+):(\w+)"', scripts, re.M).groups()
    assert getattr(importlib.import_module(mod), attr) is main
