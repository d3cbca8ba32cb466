"""Multi-axis RoPE (ropelab.multiaxis): M-RoPE and axial RoPE against transformers and rotary-embedding-torch."""

import pytest
import torch
from _helpers import assert_rotations_agree

import ropelab
from ropelab import multiaxis
from ropelab.multiaxis import MultiAxis, apply_multiaxis_rope, flat_positions, grid_positions
from ropelab.precision import UNIT_ROUNDOFF

F32 = UNIT_ROUNDOFF[torch.float32]


def _mrope_positions(b: int, s: int, seed: int = 0) -> torch.Tensor:
    """(3, b, s): text tokens (all axes equal), then a 2 x 3 x 4 video grid, then text again."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.zeros(3, b, s, dtype=torch.long)
    for i in range(b):
        start = int(torch.randint(0, 50, (1,), generator=g))
        grid = grid_positions(2, 3, 4) + start
        n = grid.shape[1]
        pos[:, i, :5] = torch.arange(5)
        pos[:, i, 5 : 5 + n] = grid + 5
        tail = int(pos[:, i, : 5 + n].max()) + 1
        pos[:, i, 5 + n :] = torch.arange(tail, tail + s - 5 - n)
    return pos


def _hf_qwen(version: str, sections, head_dim: int = 128):
    if version == "2":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig as C
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as R
        from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb as apply
    else:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig as C
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as R
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb as apply
    cfg = C(hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=2, head_dim=head_dim,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(sections)})
    return R(cfg), apply


@pytest.mark.parametrize("version, sections, interleaved", [("2", (16, 24, 24), False), ("3", (24, 20, 20), True)])
def test_mrope_matches_transformers(version, sections, interleaved):
    rot, apply = _hf_qwen(version, sections)
    b, h, s, d = 2, 2, 40, 128
    q = torch.randn(b, h, s, d, dtype=torch.float64)
    pos = _mrope_positions(b, s)
    cos, sin = rot(q.float(), pos)
    ref, _ = apply(q, q, cos.double(), sin.double())
    spec = MultiAxis.mrope(sections, interleaved=interleaved)
    ours = ropelab.apply_rope(q, pos, layout="b h s d", sections=spec)
    # transformers forms the angle in float32 (positions and inv_freq in float32): error ~ angle * eps32
    bound = 8 * float(pos.max()) * F32 * q.abs().max()
    assert (ours - ref).abs().max() <= bound
    assert spec.axis_of_pair().bincount().tolist() == list(sections)


def test_interleaved_layout_is_qwen3s():
    a = MultiAxis.mrope((24, 20, 20), interleaved=True).axis_of_pair()
    assert a[:6].tolist() == [0, 1, 2, 0, 1, 2] and a[60:].tolist() == [0, 0, 0, 0]
    assert MultiAxis.mrope((16, 24, 24)).axis_of_pair()[15:17].tolist() == [0, 1]


@pytest.mark.parametrize("interleaved", [False, True])
def test_text_positions_equal_1d_rope(interleaved):
    q = torch.randn(2, 30, 3, 64)
    p1 = torch.arange(7, 37)
    pos = p1.expand(3, 2, 30)
    spec = MultiAxis.mrope((12, 10, 10), interleaved=interleaved)
    ours = ropelab.apply_rope(q, pos, layout="b s h d", sections=spec)
    # the same angles through other tables' shapes ([3, 2, 30] positions against [30]): equal to rounding
    assert_rotations_agree(ours, ropelab.apply_rope(q, p1, layout="b s h d"), q, 64, "half")


def test_axial_matches_qwen3_vision_rotary():
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding, apply_rotary_pos_emb_vision

    d = 64
    cfg = Qwen3VLVisionConfig(hidden_size=2 * d, num_heads=2,
                              rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    rot = Qwen3VLVisionRotaryEmbedding(cfg)
    pos = grid_positions(5, 7)  # (2, 35): rows, columns
    x = torch.randn(35, 2, d, dtype=torch.float64)
    cos, sin = rot(x.float(), pos[None])
    ref, _ = apply_rotary_pos_emb_vision(x, x, cos[0].double(), sin[0].double())
    ours = ropelab.apply_rope(x, pos, layout="s h d", sections=MultiAxis.axial_dims((d // 2, d // 2)))
    assert (ours - ref).abs().max() <= 8 * 7 * F32 * x.abs().max()


def test_axial_matches_rotary_embedding_torch():
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

    per_axis = 16
    rot = RotaryEmbedding(dim=per_axis, freqs_for="lang", theta=10000)
    freqs = rot.get_axial_freqs(4, 6, offsets=None)  # (4, 6, 2 * per_axis)
    x = torch.randn(1, 4, 6, 2 * per_axis, dtype=torch.float64)
    ref = apply_rotary_emb(freqs.double(), x).reshape(1, 24, 2 * per_axis)
    ours = ropelab.apply_rope(x.reshape(1, 24, 2 * per_axis), grid_positions(4, 6), layout="b s d",
                              style="interleaved", sections=MultiAxis.axial_dims((per_axis, per_axis)))
    assert (ours - ref).abs().max() <= 8 * 6 * F32 * x.abs().max()


def test_axial_3d_matches_diffusers_flux_pos_embed():
    """FLUX.1 (diffusers' FluxTransformer2DModel: axes_dims_rope (16, 56, 56), head dim 128): per-axis ids
    (index, row, column), each axis its own ladder over its own dims, pairs interleaved; imported, not copied.
    diffusers forms the angles in float64 and rotates in float32: the bound is float32 rounding of x, cos,
    sin and the two products (8u, independent of the position)."""
    pytest.importorskip("diffusers")
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    axes = (16, 56, 56)
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randint(0, 4, (50,), generator=g), torch.randint(0, 128, (50,), generator=g),
                       torch.randint(0, 128, (50,), generator=g)], -1)  # [s, 3], as FLUX passes them
    x = torch.randn(2, 50, 3, 128, generator=g)  # [b, s, h, d]: FLUX applies it with sequence_dim=1
    ref = apply_rotary_emb(x, FluxPosEmbed(theta=10000, axes_dim=list(axes))(ids), sequence_dim=1)
    spec = MultiAxis.axial_dims(axes)
    assert spec.sections == (8, 28, 28)
    ours = ropelab.apply_rope(x.double(), ids.T, layout="b s h d", style="interleaved", sections=spec)
    assert (ours - ref.double()).abs().max() <= 8 * F32 * x.abs().max()


def test_axial_3d_matches_diffusers_cogvideox():
    """CogVideoX 1.5 (diffusers' get_3d_rotary_pos_embed with grid_type "slice", head dim 64): t, h, w get
    dims D/4, 3D/8, 3D/8 = 16, 24, 24, each its own ladder, pairs interleaved. It forms the angles in float32,
    so the bound grows with the largest angle (the position, as omega_0 = 1)."""
    pytest.importorskip("diffusers")
    from diffusers.models.embeddings import apply_rotary_emb, get_3d_rotary_pos_embed

    T, Hg, Wg = 3, 6, 10
    cos, sin = get_3d_rotary_pos_embed(embed_dim=64, crops_coords=None, grid_size=(Hg, Wg), temporal_size=T,
                                       grid_type="slice", max_size=(Hg, Wg))
    x = torch.randn(1, 2, T * Hg * Wg, 64, generator=torch.Generator().manual_seed(1))  # [b, h, s, d]
    ref = apply_rotary_emb(x, (cos, sin))
    ours = ropelab.apply_rope(x.double(), grid_positions(T, Hg, Wg), layout="b h s d", style="interleaved",
                              sections=MultiAxis.axial_dims((16, 24, 24)))
    assert (ours - ref.double()).abs().max() <= 8 * F32 * (1 + max(T, Hg, Wg)) * x.abs().max()


def test_axial_3d_relative_in_each_axis():
    """Axial scores depend only on the offset along each axis (float64)."""
    spec = MultiAxis.axial_dims((8, 12, 12))
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)

    def score(pq, pk):
        rq = apply_multiaxis_rope(q[None], torch.tensor(pq)[:, None], spec, layout="s d")
        rk = apply_multiaxis_rope(k[None], torch.tensor(pk)[:, None], spec, layout="s d")
        return float((rq * rk).sum())

    assert score([1, 2, 3], [4, 0, 5]) == pytest.approx(score([3, 7, 0], [6, 5, 2]), abs=1e-12)
    assert abs(score([1, 2, 3], [4, 0, 5]) - score([1, 2, 3], [4, 5, 0])) > 1e-3


def test_flat_positions_and_grid():
    assert grid_positions(2, 3).tolist() == [[0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]]
    assert flat_positions(2, 3, start=4).tolist() == [4, 5, 6, 7, 8, 9]


def test_bad_input_raises():
    q = torch.randn(1, 10, 2, 64)
    spec = MultiAxis.mrope((12, 10, 10))
    with pytest.raises(ValueError, match="make the sections sum to 32"):
        ropelab.apply_rope(q, torch.zeros(3, 10), layout="b s h d", sections=MultiAxis.mrope((10, 10, 10)))
    with pytest.raises(ValueError, match="2 axes"):
        ropelab.apply_rope(q, torch.zeros(2, 10), layout="b s h d", sections=spec)
    with pytest.raises(ValueError, match="shape"):
        ropelab.apply_rope(q, torch.zeros(3, 9), layout="b s h d", sections=spec)
    with pytest.raises(ValueError, match="shape"):
        ropelab.apply_rope(q, torch.zeros(10), layout="b s h d", sections=spec)
    with pytest.raises(ValueError, match="NaN"):
        ropelab.apply_rope(q, torch.full((3, 10), float("nan")), layout="b s h d", sections=spec)
    with pytest.raises(ValueError, match="cannot be realised"):
        MultiAxis.mrope((2, 10, 10), interleaved=True)
    with pytest.raises(ValueError, match="even"):
        MultiAxis.axial_dims((7, 9))
    with pytest.raises(ValueError, match="offset"):
        ropelab.apply_rope(q, torch.zeros(3, 10), layout="b s h d", sections=spec, offset=3)
    with pytest.raises(ValueError, match="mrope_section"):
        MultiAxis.from_hf_config({"rope_parameters": {"rope_theta": 1e4}})


def test_from_hf_config():
    spec = MultiAxis.from_hf_config({"rope_parameters": {"rope_theta": 1e6, "mrope_section": [16, 24, 24]}})
    assert spec == MultiAxis((16, 24, 24))
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    cfg = Qwen3VLTextConfig(rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20]})
    assert MultiAxis.from_hf_config(cfg) == MultiAxis((24, 20, 20), interleaved=True)


@pytest.mark.parametrize("segments", [(4, (1, 4, 8), 20), (3, (1, 6, 2), 5, (1, 3, 3), 2)])
def test_mrope_positions_number_tokens_as_transformers_get_rope_index(segments):
    """Text, images, text: multiaxis.mrope_positions against Qwen2VLModel.get_rope_index (imported, not copied)."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    fake = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=1)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2VLModel.get_vision_position_ids(fake, *a, **k)
    mm = torch.tensor([sum(([0] * s if isinstance(s, int) else [1] * (s[1] * s[2]) for s in segments), [])])
    grids = torch.tensor([list(s) for s in segments if not isinstance(s, int)])
    pos, _ = Qwen2VLModel.get_rope_index(fake, torch.zeros_like(mm), mm, image_grid_thw=grids)
    assert torch.equal(pos[:, 0], multiaxis.mrope_positions(*segments))


def test_mrope_positions_rejects_bad_segments():
    for bad in [(), (0,), ((2, 3),), (True,)]:
        with pytest.raises(ValueError, match="segment"):
            multiaxis.mrope_positions(*bad)
