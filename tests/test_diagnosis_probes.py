"""ropelab.diagnosis probes: sizes, packings, bad arguments, a failing black box, the usual sanity checks."""

from __future__ import annotations

import pytest
import torch

from ropelab import apply_rope
from ropelab.diagnosis import diagnose, probe_cu_seqlens, probe_sizes, zoo


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"layout": "b s h"}, "no 'd'"),
        ({"layout": "b s h d", "sizes": {"s": 4, "h": 4}}, "same size"),
        ({"layout": "b s h d", "sizes": {"d": 7}}, "even"),
        ({"layout": "b s h d", "sizes": {"t": 7}}, "does not have"),
        ({"layout": "b s h d", "max_position": 1}, "max_position"),
        ({"layout": "b s h d", "expect": {"bse": 1}}, "unknown key"),
        ({"layout": "b s h d", "dtype": torch.int32}, "dtype"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        diagnose(zoo.ropelab_rope("b s h d"), **kwargs)


def test_fn_returning_a_tuple_is_a_clear_error():
    with pytest.raises(ValueError, match="not a tensor"):
        diagnose(lambda x: (x, x), layout="b s h d")


def test_fn_that_fails_is_reported():
    dg = diagnose(lambda x: x.view(-1, 7), layout="b s h d")
    assert dg.codes == ["error"] and "sizes=" in dg.problems[0]


def test_identity_has_no_rotation():
    assert diagnose(lambda x: x.clone(), layout="s h d").codes == ["no_rotation"]


def test_probe_sizes_are_distinct():
    sz = probe_sizes("b s h d", {"h": 6, "d": 64})
    assert sz["h"] == 6 and sz["d"] == 64 and len({sz["b"], sz["s"], sz["h"]}) == 3
    cu = probe_cu_seqlens(12)
    assert cu.tolist()[0] == 0 and cu.tolist()[-1] == 12 and len(cu) == 4


def test_diagnose_leaves_the_thread_count_alone():
    n = torch.get_num_threads()
    diagnose(zoo.ropelab_rope("s h d"), layout="s h d", max_position=64)
    assert torch.get_num_threads() == n


def test_fn_raising_value_error_is_a_finding_not_a_crash():
    def needs_64(x):
        if x.shape[-1] != 64:
            raise ValueError("head_dim must be 64")
        return apply_rope(x, layout="b s h d")

    dg = diagnose(needs_64, layout="b s h d")
    assert dg.codes == ["error"] and "head_dim must be 64" in dg.problems[0]
    assert diagnose(needs_64, layout="b s h d", sizes={"d": 64}, max_position=64).ok


def test_output_with_more_elements_is_a_shape_finding():
    dg = diagnose(lambda x: apply_rope(x, layout="b s h d") * torch.ones(2, 1, 1, 1, 1), layout="b s h d")
    assert dg.codes == ["shape"] and dg.output_shape == (2, *[dg.sizes[a] for a in "bshd"])


def test_rendering():
    row = zoo.ZOO["esm_old_on_bshd"]
    dg = diagnose(row.fn, layout=row.layout, max_position=256)
    text, page = str(dg), dg._repr_html_()
    assert "NOT OK" in text and "sequence axis" in text and "PROBLEM" in text
    assert page.startswith("<div>") and "<table>" in page and "rotates along axis h" in page
    assert "OK: a correct RoPE" in str(diagnose(zoo.ropelab_rope("b s h d"), layout="b s h d", max_position=256))
