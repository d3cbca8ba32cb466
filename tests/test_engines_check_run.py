"""``ropelab-check --run CONFIG``: the engines run on a tiny model of CONFIG's architecture (ropelab.engines.check_run).

Cheap cases: the shrinking (no engine), bad input (exit 2, one line, no traceback), one published config run
through llama.cpp and mlx-lm (the engines .venv has; about 30 s together, per layer for both), an engine-code bug
injected into mlx-lm in-process (its RoPE base doubled) that --run must catch in the logits and in every layer, and
vLLM (only when `make vllm` built its environment; skipped naming it otherwise, as tests/test_engines_vllm.py). The
M-RoPE families read by mlx-lm (text positions only) agree with transformers, as mlx-lm's run does.
"""

from __future__ import annotations

import json
import os

import pytest

from ropelab.engines import check, check_run
from ropelab.paths import DATA_DIR

transformers = pytest.importorskip("transformers")

QWEN25 = DATA_DIR / "configs" / "Qwen--Qwen2.5-1.5B.json"


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


needs_mlx = pytest.mark.skipif(not (_has("mlx") and _has("mlx_lm")), reason="mlx / mlx-lm not installed (make setup)")


def _llamacpp_ready() -> bool:
    from ropelab.engines import llamacpp_run

    return llamacpp_run.available()


needs_llamacpp = pytest.mark.skipif(not _llamacpp_ready(), reason="llama-cpp-py-sync not installed (make setup)")

try:
    from ropelab.engines import vllm as _V

    _V.vllm_python()
    _NO_VLLM = None
except Exception as _e:  # VLLMUnavailable: skip naming `make vllm`
    if os.environ.get("ROPELAB_REQUIRE_VLLM") == "1":
        raise
    _NO_VLLM = str(_e)
needs_vllm = pytest.mark.skipif(_NO_VLLM is not None, reason=_NO_VLLM or "")


# --------------------------------------------------------------------------------------------------
# The tiny model's config
# --------------------------------------------------------------------------------------------------


def test_shrink_keeps_rope_pattern_and_geometry():
    layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * 7
    config = {"model_type": "gemma3_text", "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
              "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 42, "vocab_size": 262208,
              "layer_types": layer_types, "max_position_embeddings": 131072,
              "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}
    tiny, changed = check_run.shrink_config(config)
    assert tiny["rope_parameters"] == config["rope_parameters"]  # RoPE keys untouched
    assert tiny["max_position_embeddings"] == 131072
    assert tiny["head_dim"] == 256 and tiny["num_attention_heads"] == 4 and tiny["num_key_value_heads"] == 2
    assert tiny["hidden_size"] == 4 * 256
    assert tiny["num_hidden_layers"] == 6 and tiny["layer_types"] == layer_types[:6]  # one period of the pattern
    assert tiny["vocab_size"] < 1000 and changed["vocab_size"] == [262208, tiny["vocab_size"]]
    assert "rope_parameters" not in changed


def test_shrink_derives_head_dim_and_keeps_nope_period():
    config = {"model_type": "smollm3", "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 2048,
              "num_hidden_layers": 36, "no_rope_layers": [1, 1, 1, 0] * 9, "rope_theta": 5e6}
    tiny, _ = check_run.shrink_config(config)
    assert tiny["head_dim"] == 128 and tiny["hidden_size"] == 4 * 128
    assert tiny["num_hidden_layers"] == 4 and tiny["no_rope_layers"] == [1, 1, 1, 0]
    assert tiny["rope_theta"] == 5e6


@pytest.mark.parametrize("config, words", [
    ({"num_attention_heads": 4}, "model_type"),
    ({"model_type": "llama", "num_attention_heads": "8", "num_hidden_layers": 2}, "num_attention_heads"),
    ({"model_type": "llama", "num_attention_heads": 8, "hidden_size": 100, "num_hidden_layers": 2}, "head dim"),
    ({"model_type": "llama", "num_attention_heads": 8, "head_dim": 64, "num_hidden_layers": 10 ** 9},
     "num_hidden_layers"),
])
def test_shrink_refuses_with_words(config, words):
    with pytest.raises(check_run.RunRefused, match=words):
        check_run.shrink_config(config)


# --------------------------------------------------------------------------------------------------
# The command: bad input
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, args, words", [
    ('{"model_type": "qwen2", "num_attention_heads": [1]}', [], "num_attention_heads"),
    ("[1, 2", [], "not a readable JSON"),
    ('{"model_type": "no-such-model", "num_attention_heads": 4, "head_dim": 64, "num_hidden_layers": 2}', [],
     "no model_type"),
    ("[" * 100000 + "]" * 100000, [], "cannot be read"),
    ('{"model_type": "llama", "num_attention_heads": 4, "head_dim": 64, "num_hidden_layers": 2, "rope_parameters": '
     '{"rope_type": "yarn", "factor": "x"}}', [], "cannot build model_type"),
    ("{}", ["--engines", "llamacpp,foo"], "--engines must name"),
    ("{}", ["extra.json"], "one PATH"),
])
def test_bad_input_exit_2(tmp_path, capsys, content, args, words):
    path = tmp_path / "config.json"
    path.write_text(content)
    if "extra.json" in args:
        (tmp_path / "extra.json").write_text("{}")
        args = [str(tmp_path / "extra.json")]
    code = check.main(["--run", str(path), *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    assert words in err and "Traceback" not in err
    assert json.loads(out)["exit_code"] == 2


def test_engines_without_run_is_usage_error(capsys):
    assert check.main(["--engines", "mlx", str(QWEN25)]) == 2
    assert "--engines goes with --run" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# The engines
# --------------------------------------------------------------------------------------------------


@needs_mlx
@needs_llamacpp
def test_run_qwen25_agrees_json(capsys):
    code = check.main(["--run", str(QWEN25), "--engines", "llamacpp,mlx", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == result["exit_code"] == 0 and result["ok"] is True
    assert set(result["engines"]) == {"llamacpp", "mlx"}
    assert result["tiny"]["head_dim"] == 128 and result["reference"]["rope_layers"] == [0, 1]
    for name, cell in result["engines"].items():
        assert cell["status"] == "agree", (name, cell)
        lg = cell["logits"]
        assert lg["max_err"] <= lg["bound"] and lg["n_tokens"] == 24
        print(name, "logits", lg["max_err"], "bound", lg["bound"])
    assert "cb_eval" in result["engines"]["llamacpp"]["layers_note"]
    for name in ("llamacpp", "mlx"):  # llama.cpp through ggml's eval callback, mlx-lm through its rope modules
        layers = result["engines"][name]["layers"]
        assert [row["layer"] for row in layers] == [0, 1], name
        assert all(row["status"] == "agree" and row["max_err"] <= row["bound"] for row in layers), (name, layers)


@needs_mlx
def test_injected_mlx_rope_bug_is_caught(monkeypatch, capsys):
    """mlx-lm's RoPE with its base doubled (an engine-code bug no config file shows): --run says differ, per layer."""
    import mlx.core as mx
    import mlx.nn as nn

    def wrong(self, x, offset=0):
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=2 * self.base, scale=self.scale,
                            offset=offset)

    monkeypatch.setattr(nn.RoPE, "__call__", wrong)
    code = check.main(["--run", str(QWEN25), "--engines", "mlx"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "mlx-lm: DIFFER" in out and "layer 0: differ" in out and "layer 1: differ" in out


@needs_mlx
def test_mrope_text_only_reading_agrees(tmp_path):
    """mlx-lm's qwen2_vl / qwen3_vl take token ids only: the reader says so, and agrees with transformers as the
    run does (the matrix's qwen2_vl / qwen3_vl rows)."""
    from ropelab.engines import hf, tiny
    from ropelab.engines.mlx import read_mlx

    for family in ("qwen2_vl", "qwen3_vl"):
        d = tiny.save_tiny_model(family, tmp_path / family)
        reading = read_mlx(d)
        assert reading.text_only and any("token ids only" in n for n in reading.notes)
        result = check.check([hf.read_config(d), reading])
        assert result["ok"], result["mismatches"]
        assert any("not compared" in a["detail"] for a in result["agreements"])


def test_text_only_still_compares_frequencies(tmp_path):
    """A text-only engine is spared the sections only: another base is still a mismatch."""
    import dataclasses

    from ropelab.engines import hf, tiny

    d = tiny.save_tiny_model("qwen2_vl", tmp_path / "m")
    ref = hf.read_config(d)
    other = dataclasses.replace(ref, sections=None, text_only=True, format="mlx",
                                layers=tuple(dataclasses.replace(s, base=s.base * 2) for s in ref.layers))
    result = check.check([ref, other])
    assert not result["ok"] and all("sections" not in m["kinds"] for m in result["mismatches"])


@needs_vllm
def test_run_vllm_per_layer(capsys):
    """vLLM (its own environment): logits and each layer's rotary call against transformers (about 90 s)."""
    code = check.main(["--run", str(QWEN25), "--engines", "vllm", "--json"])
    result = json.loads(capsys.readouterr().out)
    cell = result["engines"]["vllm"]
    assert code == 0 and cell["status"] == "agree", cell
    assert [row["layer"] for row in cell["layers"]] == [0, 1]
    assert all(row["max_err"] <= row["bound"] for row in cell["layers"])
