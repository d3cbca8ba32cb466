"""diagnosis.axes: multi-axis probing, and 'not single-axis RoPE' instead of a wrong fix."""

import pytest
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
        assert rep.sections == spec and rep.style == style, (spec, rep)


def test_not_multiaxis_rope():
    rep = diagnose_axes(lambda x, pos: x.flip(-1), n_axes=2, head_dim=16)
    assert rep.sections is None and "not multi-axis RoPE" in rep.verdict


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
    assert rep.sections == MultiAxis((24, 20, 20), interleaved=True) and rep.style == "half"


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


NEW_ROWS = ("mrope_behind_1d_width2", "mrope_behind_1d_width4", "qwen2vl_image_behind_1d", "qwen2vl_text_then_image")
FIXES = ("Permute", "float32", "offset", "transpose", "Pass positions", "layout it expects", "Drop the")


@pytest.mark.parametrize("name", NEW_ROWS)
@pytest.mark.parametrize("max_position", [64, 4096])
def test_narrow_grids_and_qwen2vl_sizes_are_not_single_axis(name, max_position):
    """A grid narrower than the 6-token structure probe, and Qwen2-VL's sizes whose w pairs turn by less than
    the probe's angle tolerance in 6 tokens, used to get a sequence-axis, positions, style or no-rotation fix.
    The pairs of one token read different positions (measured spread 0.64 to 1.0 against 0.013 at most for a
    single-axis RoPE with 16-bit tables)."""
    from ropelab.diagnosis import zoo
    from ropelab.diagnosis.axes import SPREAD_TOL

    row = zoo.ZOO[name]
    rep = ropelab.diagnose(row.fn, layout=row.layout, sizes=row.sizes, max_position=max_position)
    assert rep.codes == ["not_single_axis"], rep
    text = rep.problems[0]
    assert "diagnose_axes" in text and not any(f in text for f in FIXES), text
    assert rep.position_spread > 2 * SPREAD_TOL and rep.positions_ok is None, rep.position_spread


def test_single_axis_rows_read_one_position_per_token():
    """Every zoo row without a multi-axis finding, and 16-bit tables / angles, read one position per token:
    the spread stays below SPREAD_TOL / 8 (measured: at most 0.013, bf16 tables and ESM after .to(bf16))."""
    from ropelab.core import parse_layout
    from ropelab.diagnosis import zoo
    from ropelab.diagnosis.axes import SPREAD_TOL, position_spread
    from ropelab.diagnosis.probes import one_thread, probe_sizes

    cases = [(r.name, r.fn, r.layout, r.sizes) for r in zoo.broken() if r.finding != "not_single_axis" and not r.needs]
    cases += [(n, zoo.ZOO[n].fn, zoo.ZOO[n].layout, None) for n in ("ropelab_half_bshd", "ropelab_interleaved_thd")]
    cases += [(f"{w}_{dt}", _tables16(w, dt), "b s h d", None)
              for w in ("tables", "angle", "all", "inv_freq") for dt in (torch.bfloat16, torch.float16)]
    for name, fn, layout, sizes in cases:
        lay = parse_layout(layout)
        sz = probe_sizes(lay, sizes)
        pairs = ropelab.diagnose(fn, layout=layout, sizes=sizes, max_position=8).pairs
        with one_thread():
            sp = position_spread(fn, lay, sz, length=1025, pairs=pairs)
        assert sp is None or sp.spread < SPREAD_TOL / 8, (name, sp)


def test_qwen2vl_specimen_numbers_positions_as_transformers_get_rope_index():
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    from ropelab.diagnosis.specimens import qwen2vl_positions

    text, rows, width, tail = 4, 4, 8, 20
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=1)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2VLModel.get_vision_position_ids(fake, *a, **k)
    mm = torch.tensor([[0] * text + [1] * rows * width + [0] * tail])
    grid = torch.tensor([[1, rows, width]])
    pos, _ = Qwen2VLModel.get_rope_index(fake, torch.zeros_like(mm), mm, image_grid_thw=grid)
    # exact on every CPU: integer positions
    assert torch.equal(pos[:, 0], qwen2vl_positions(mm.shape[1], text, rows, width))


@pytest.mark.parametrize("text", [16, 1000, 2000, 4000])
def test_image_after_long_text_gets_no_precision_fix(text):
    """Past 6 text tokens the structure probe sees 1D RoPE; the image's phase error then exceeds 16-bit
    rounding's envelope up to ~1500 text tokens (ratio 1.9 at 1000, 0.97 at 2000: measured). Beyond, no
    16-bit cause reproduces its pattern, so diagnose cannot decide and says so: never a precision fix."""
    from ropelab.diagnosis import zoo

    rep = ropelab.diagnose(zoo.qwen2vl_text_then_image(text), layout="b s h d", sizes={"d": 128}, max_position=4096)
    assert rep.codes == ["not_single_axis"] and "float32" not in rep.problems[0], rep
    assert rep.phase_cause == "unexplained"


def test_multi_axis_past_the_probe_is_out_of_reach():
    """Limit: an image that starts after max_position, or a grid wider than it, is a 1D RoPE over every position
    diagnose looks at (measured: OK, resp. a style finding)."""
    from ropelab.diagnosis import zoo

    assert ropelab.diagnose(zoo.qwen2vl_text_then_image(300), layout="b s h d", sizes={"d": 128},
                            max_position=256).ok
    wide = ropelab.diagnose(zoo.qwen2vl_image_behind_1d(300), layout="b s h d", sizes={"d": 128}, max_position=256)
    assert "not_single_axis" not in wide.codes


def test_axial_and_mrope_readings_check_each_axis_frequencies():
    """Pairs that turn one axis each are no axial or M-RoPE reading unless their frequencies are its ladder:
    axis 1 at base 100 next to axis 0 at base 10000 (axial), or every frequency of an M-RoPE ladder off by 1e-3
    past pair 8, fits neither; the verdict says which pair and by how much. Correct ones keep their base."""
    from ropelab.core import rotate
    from ropelab.diagnosis.axes import _axis_rtol
    from ropelab.multiaxis import axis_angles

    def custom(spec, inv_freq):
        def fn(x, pos):
            th = axis_angles(pos, spec, inv_freq)
            return rotate(x, th.cos(), th.sin(), style="half")
        return fn

    axial = MultiAxis.axial_dims((32, 32))
    good = diagnose_axes(custom(axial, axial.inv_freq(10000.0)), n_axes=2, head_dim=64)
    assert good.sections == axial and good.base == 10000.0
    two_bases = torch.cat([MultiAxis.axial_dims((32,)).inv_freq(10000.0), MultiAxis.axial_dims((32,)).inv_freq(100.0)])
    rep = diagnose_axes(custom(axial, two_bases), n_axes=2, head_dim=64)
    assert rep.sections is None and rep.verdict.startswith("unmatched")
    assert "no axial reading: pair 31 (axis 1)" in rep.verdict  # the worst pair, the slowest of axis 1

    mrope = MultiAxis.mrope((8, 12, 12))
    ladder = ropelab.frequencies(64, 10000.0)[0].double()
    ok = diagnose_axes(custom(mrope, ladder), n_axes=3, head_dim=64)
    assert ok.sections == mrope and ok.base == 10000.0
    bent = ladder * torch.where(torch.arange(32) >= 8, 1 + 1e-3, 1.0)  # still decreasing, off its ladder
    assert 1e-3 > 10 * _axis_rtol(10000.0)
    rep = diagnose_axes(custom(mrope, bent), n_axes=3, head_dim=64)
    assert rep.sections is None and "no M-RoPE reading" in rep.verdict, rep.verdict
