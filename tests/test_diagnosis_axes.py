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
