"""diagnosis.axes: multi-axis probing, and 'not single-axis RoPE' instead of a wrong fix."""

import torch

import ropelab
from ropelab.diagnosis.axes import diagnose_axes
from ropelab.multiaxis import MultiAxis


def _fn(spec, style="half"):
    return lambda x, pos: ropelab.apply_rope(x, pos, layout="s d", sections=spec, style=style)


def test_reads_contiguous_interleaved_and_axial_specs():
    cases = ((MultiAxis.mrope((8, 12, 12)), "half"), (MultiAxis.mrope((12, 10, 10), interleaved=True), "half"),
             (MultiAxis.axial_dims((32, 32)), "interleaved"), (MultiAxis.axial_dims((16, 24, 24)), "half"))
    for spec, style in cases:
        rep = diagnose_axes(_fn(spec, style), n_axes=spec.n_axes, head_dim=64)
        assert rep.spec == spec and rep.style == style, (spec, rep)


def test_not_multiaxis_rope():
    rep = diagnose_axes(lambda x, pos: x.flip(-1), n_axes=2, head_dim=16)
    assert rep.spec is None and "not multi-axis RoPE" in rep.verdict


def test_flattened_2d_rope_is_not_single_axis_and_gets_no_wrong_fix():
    spec = MultiAxis.axial_dims((16, 16))

    def flat2d(x):  # 2D axial RoPE of a grid 8 wide, positions derived from the 1D token index
        s = x.shape[1]
        pos = torch.stack([torch.arange(s) // 8, torch.arange(s) % 8])
        return ropelab.apply_rope(x, pos, layout="b s h d", sections=spec)

    rep = ropelab.diagnose(flat2d, layout="b s h d", max_position=256)
    assert rep.codes == ["not_single_axis"], rep.codes
    assert "not single-axis RoPE" in str(rep) and "Permute" not in str(rep) and "float64" not in rep.problems[0]


def test_reads_transformers_qwen3_vl_rotary_with_float32_tables():
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding, apply_rotary_pos_emb

    cfg = Qwen3VLTextConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                            rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20]})
    rot = Qwen3VLTextRotaryEmbedding(cfg)

    def fn(x, positions):
        cos, sin = rot(x.float(), positions[:, None])
        return apply_rotary_pos_emb(x[None, None], x[None, None], cos.double(), sin.double())[0][0, 0]

    rep = diagnose_axes(fn, n_axes=3, head_dim=128)
    assert rep.spec == MultiAxis((24, 20, 20), interleaved=True) and rep.style == "half"


def test_mrope_with_low_frequency_extra_axes_is_not_single_axis_not_a_precision_fault():
    # M-RoPE (8, 4, 4) at head dim 32 behind 1D input (t = 0, h = i // 8, w = i % 8): over 64 positions the
    # scores are nearly Toeplitz, as with bf16 tables, so that check alone cannot tell it from rounding.
    from ropelab.diagnosis import zoo
    from ropelab.diagnosis.axes import NOT_SINGLE_AXIS, single_axis_deviation

    fn = zoo.mrope_behind_1d()
    assert single_axis_deviation(fn, layout="b s h d", sizes={"d": 32}) < NOT_SINGLE_AXIS / 10
    rep = ropelab.diagnose(fn, layout="b s h d", max_position=1024)
    assert rep.codes == ["not_single_axis"], rep
    text = rep.problems[0]
    assert "diagnose_axes" in text and "float32" not in text and "Permute" not in text
    # Both pieces of evidence, each far from its threshold (measured: 5.0 and 1.7 at 1024 positions).
    assert rep.roundoff_ratio > 4 and rep.late_turn > 0.1, (rep.roundoff_ratio, rep.late_turn)


def _tables16(where, dt):
    from ropelab.core import rotate
    from ropelab.precision import perturbed_angle
    from ropelab.scaling import frequencies

    def fn(x):
        inv = frequencies(x.shape[-1], 10000.0)[0].double()
        if where == "tables":
            th = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * inv
            c, s = th.cos().to(dt).float(), th.sin().to(dt).float()
        else:
            th = perturbed_angle(torch.arange(x.shape[1]), inv, where=where, dtype=dt).float()
            c, s = th.cos(), th.sin()
        return rotate(x, c[None, :, None], s[None, :, None], style="half")

    return fn


def test_16_bit_rounding_stays_inside_the_roundoff_envelope():
    """Every 16-bit cause errs by at most 3u|theta| + sqrt(2)u, inside 4u(1 + |theta|) (u = u(bf16)): its
    ratio stays below 3/4 and the verdict stays a precision one (measured: at most 0.61)."""
    from ropelab.diagnosis import zoo

    cases = [(n, zoo.ZOO[n].fn, zoo.ZOO[n].dtype, zoo.ZOO[n].layout) for n in
             ("positions_bf16", "inv_freq_bf16", "tables_bf16", "esm_old_bf16")]
    cases += [(f"{w}_{dt}", _tables16(w, dt), torch.float32, "b s h d")
              for w in ("tables", "angle", "all", "positions") for dt in (torch.bfloat16, torch.float16)]
    for name, fn, dtype, layout in cases:
        rep = ropelab.diagnose(fn, layout=layout, dtype=dtype, max_position=4096)
        assert "not_single_axis" not in rep.codes and rep.late_turn == 0.0, (name, rep)
        assert rep.roundoff_ratio is None or rep.roundoff_ratio < 0.75, (name, rep.roundoff_ratio)
        if name != "tables_torch.float16":  # fp16 tables err below float32's allowance: named by the norm probe
            assert {"precision", "inv_freq_precision"} & set(rep.codes), (name, rep.codes)
