r"""mlx-lm running (ropelab.engines.mlx_run: mlx_lm.utils.load_model on the saved transformers directory, one float32
forward) every tiny family and matrix variant, against transformers' float64 forward of the same weights within the
float32 bound of ropelab.engines.parity (no float16 GELU term: MLX evaluates GELU in float32).

A row where mlx-lm differs is a finding: ropelab.engines.matrix.MLX_CAUSES names the cause (file and line in mlx-lm
0.32.2's source) with the config changes that make the model mlx-lm runs, and transformers run with them agrees with
mlx-lm's logits. A row mlx-lm does not run names mlx-lm's own error (MLX_FAILURES). The reader
(ropelab.engines.mlx.read_mlx) must predict each verdict at the run's positions.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx_lm")
pytest.importorskip("transformers")

from ropelab.engines import check, matrix, mlx_run, parity, tiny  # noqa: E402
from ropelab.engines.mlx import _rope_guard, read_mlx  # noqa: E402

ROWS = [*tiny.FAMILIES, *matrix.VARIANTS]
IDS = parity.token_ids(tiny.VOCAB_SIZE)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every tiny family and matrix variant saved (no conversion): {name: model dir}."""
    return matrix.models(tmp_path_factory.mktemp("mlx-run"))


_RUNS: dict = {}


def _run(saved, name):
    """mlx-lm's logits of row ``name``, or the exception it raised (cached: the reader test reuses the run)."""
    if name not in _RUNS:
        try:
            _RUNS[name] = mlx_run.logits(saved[name], IDS)
        except (mlx_run.MlxRefusal, mlx_run.MlxRunError) as e:
            _RUNS[name] = e
    return _RUNS[name]


def test_causes_and_failures_name_rows_and_mlx_lm_lines():
    assert set(matrix.MLX_CAUSES) <= set(ROWS) and set(matrix.MLX_FAILURES) <= set(ROWS)
    assert not set(matrix.MLX_CAUSES) & set(matrix.MLX_FAILURES)
    for words in [w for w, _ in matrix.MLX_CAUSES.values()] + list(matrix.MLX_FAILURES.values()):
        assert "mlx_lm/models/" in words and any(c.isdigit() for c in words.split("py:", 1)[-1][:3]), words


@pytest.mark.parametrize("name", ROWS)
def test_mlx_lm_runs_as_transformers_or_as_the_named_cause(saved, name):
    got = _run(saved, name)
    if name in matrix.MLX_FAILURES:
        assert isinstance(got, Exception), (name, "mlx-lm now runs it: drop it from MLX_FAILURES")
        print(f"{name}: {got}")
        return
    assert not isinstance(got, Exception), got
    assert got.shape == (len(IDS), tiny.VOCAB_SIZE) and got.dtype == np.float32
    r = _RUNS[name, "compare"] = mlx_run.compare(saved[name], ids=IDS, run=got)
    print(f"{name}: max |mlx-lm - transformers float64| = {r['max_err']:.3e}, bound {r['bound']:.3e} "
          f"(ratio {r['ratio']:.2e})")
    if name not in matrix.MLX_CAUSES:
        assert r["status"] == "agree", r
        return
    words, changes = matrix.MLX_CAUSES[name]
    assert r["status"] == "differ", (words, r)
    r2 = mlx_run.compare(saved[name], ids=IDS, run=got, changes=changes)
    print(f"  as mlx-lm reads it ({changes}): max err {r2['max_err']:.3e}, bound {r2['bound']:.3e}")
    assert r2["status"] == "agree", (words, r2)


@pytest.mark.parametrize("name", ROWS)
def test_the_mlx_reader_predicts_the_run(saved, name):
    """read_mlx against the transformers config at the run's last position: agree exactly where mlx-lm's logits agree
    (M-RoPE sections aside, which text positions do not show); a model mlx-lm does not run is not read as agreeing."""
    ref = check.read(f"hf:{saved[name]}")
    try:
        reading = read_mlx(saved[name])
    except ValueError as e:
        predicted, reading_cell = "unreadable", {"status": "unreadable", "reason": str(e)}
    else:
        reading_cell = matrix.cell(ref, lambda: reading, position=len(IDS) - 1)
        predicted = matrix.reading_on_text(reading_cell)
    got = _run(saved, name)
    if isinstance(got, Exception):
        assert predicted != "agree", (name, got)
        if isinstance(got, mlx_run.MlxRefusal):  # refused at its config: the reader, which builds the model, too
            assert (predicted == "unreadable") == (got.stage == "config"), (name, got)
        return
    run = _RUNS.get((name, "compare")) or mlx_run.compare(saved[name], ids=IDS, run=got)
    assert predicted == run["status"], (name, reading_cell)


def test_reader_sees_the_guarded_rope_of_cohere2(saved):
    """mlx-lm's cohere2 builds a rope module in every layer but calls it only `if self.use_sliding_window:`; the
    reader reads the guard from the attention's source, so the full-attention layer 3 has no RoPE (as transformers')."""
    reading = read_mlx(saved["cohere2"])
    assert [s.is_nope for s in reading.layers] == [False, False, False, True]
    assert any("use_sliding_window" in n for n in reading.notes)

    class Unguarded:
        def __call__(self, x):
            return self.rope(x)

    class Guarded:
        flag = False

        def __call__(self, x):
            if self.flag:
                x = self.rope(x)
            return x

    assert _rope_guard(Unguarded(), "rope") is None
    assert _rope_guard(Guarded(), "rope") == "flag"


def test_run_errors_are_clear(saved, tmp_path):
    with pytest.raises(ValueError, match="model_dir"):
        mlx_run.logits(tmp_path, IDS)
    with pytest.raises(ValueError, match="ids must be a non-empty"):
        mlx_run.logits(saved["llama"], [])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size = 96\)"):
        mlx_run.logits(saved["llama"], [3, 96])
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 8}')
    with pytest.raises(mlx_run.MlxRefusal, match="mlx-lm finds no weights"):
        mlx_run.logits(tmp_path, [1])
    import json
    import shutil

    other = tmp_path / "other"
    shutil.copytree(saved["llama"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "no_such_model"}))
    with pytest.raises(mlx_run.MlxRefusal, match=r"mlx-lm refuses this model \(config\): ValueError: .*no_such_model"):
        mlx_run.logits(other, [1])
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(mlx_run.MlxRefusal, match="not a readable JSON config"):
        mlx_run.logits(tmp_path, [1])


def test_committed_matrix_mlx_column_is_the_run():
    m = matrix.load()
    for name, row in m["rows"].items():
        c = row["mlx"]
        assert "reading_status" in c, name
        if c["status"] == "unreadable":
            assert "run" not in c and c["reason"], name
            continue
        assert c["status"] == c["run"]["status"] == matrix.reading_on_text({**c, "status": c["reading_status"]})
        assert ("cause" in c) == ("cause_run" in c) == (c["status"] == "differ"), name
        if c["status"] == "differ":
            assert c["run"]["max_err"] > parity.DIFFER_FACTOR * c["run"]["bound"]
            assert c["cause_run"]["status"] == "agree" and c["cause_run"]["max_err"] <= c["cause_run"]["bound"]
        else:
            assert c["run"]["max_err"] <= c["run"]["bound"]


@pytest.mark.parametrize("n", [24, 80])
def test_mlx_longrope_is_the_long_factors_at_every_length(saved, n):
    """Phi-3 LongRoPE as Phi-3's checkpoints spell it (rope_scaling.type): mlx-lm's SuScaledRoPE runs long_factor at
    every length, so it differs from transformers below the original length 64 (24 tokens: short factors there) and
    agrees past it (80 tokens: transformers switches to the long factors too)."""
    ids = parity.token_ids(tiny.VOCAB_SIZE, n=n)
    r = mlx_run.compare(saved["phi3_longrope_v4type_short"], ids=ids)
    print(f"{n} tokens: max err {r['max_err']:.3e}, bound {r['bound']:.3e}")
    assert r["status"] == ("differ" if n <= 64 else "agree"), r
