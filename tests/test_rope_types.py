"""The rope-type records of ropelab.scaling: a toy type registered in one call runs everywhere, and every
dict is validated the same way by frequencies and RopeSpec, as strictly as transformers' own
modeling_rope_utils and no more (its functions are called here, never copied)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from ropelab import apply_rope, diagnose, frequencies, reference_matrix
from ropelab.kvcache import RopeSchedule, RotaryKVCache
from ropelab.scaling import (
    EXAMPLE_HEAD_DIM,
    EXAMPLE_MAX_POSITION_EMBEDDINGS,
    FLAG,
    LENGTH_DEPENDENT,
    POSITIVE,
    POSITIVE_LIST,
    ROPE_TYPES,
    SCALING_KEYS,
    default_inv_freq,
    register_rope_type,
    unregister_rope_type,
)
from ropelab.spec import RopeSpec

D, L0 = EXAMPLE_HEAD_DIM, EXAMPLE_MAX_POSITION_EMBEDDINGS


# --------------------------------------------------------------------------------------------------
# A toy type, registered in one call
# --------------------------------------------------------------------------------------------------


def _zigzag(rotary_dim, base, params, seq_len, max_pos, dtype):
    """Past L0, every odd pair slows down by ``factor``: a ladder no known type reproduces."""
    inv = default_inv_freq(rotary_dim, base)
    original = params.get("original_max_position_embeddings") or max_pos
    s = float(params["factor"]) if (seq_len and seq_len > original) else 1.0
    odd = torch.arange(rotary_dim // 2) % 2 == 1
    return torch.where(odd, inv / s, inv).to(dtype), 1.0


@pytest.fixture
def zigzag():
    rec = register_rope_type(
        "zigzag", _zigzag, keys={"factor": POSITIVE, "original_max_position_embeddings": POSITIVE},
        required={"factor"}, length_dependent=True, original_key="original_max_position_embeddings",
        example={"factor": 3.0, "original_max_position_embeddings": 16},
    )
    yield rec
    unregister_rope_type("zigzag")
    assert "zigzag" not in ROPE_TYPES and "zigzag" not in LENGTH_DEPENDENT


def test_a_toy_type_registered_in_one_call_runs_everywhere(zigzag):
    sc = dict(zigzag.example)
    spec = RopeSpec(scaling=sc, max_position_embeddings=64)
    assert spec.rope_type == "zigzag" and "zigzag" in LENGTH_DEPENDENT
    assert SCALING_KEYS["zigzag"] == {"factor", "original_max_position_embeddings"}
    with pytest.raises(ValueError, match="factr"):
        RopeSpec(scaling={**sc, "factr": 2.0}, max_position_embeddings=64)
    with pytest.raises(ValueError, match="'factor'"):
        RopeSpec(scaling={"rope_type": "zigzag"}, max_position_embeddings=64)

    # apply_rope: the length-dependent seq_len is max(position) + 1 = 40 > L0 = 16, so odd pairs slow down.
    x = torch.randn(2, 40, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    inv, _ = spec.frequencies(16, seq_len=40)
    assert torch.equal(inv[1::2], default_inv_freq(16, 10000.0)[1::2] / 3.0)
    want = reference_matrix(x.permute(0, 2, 1, 3), torch.arange(40), inv).permute(0, 2, 1, 3)
    for backend in ("torch", "compile", "triton"):
        got = apply_rope(x.float(), layout="b s h d", spec=spec, backend=backend).double()
        # float32 rotation of float64-exact angles: a few float32 roundings of |x| each.
        bound = 16 * 2.0**-24 * float(x.abs().max()) * (1 + 40 * float(inv.max()))
        assert float((got - want).abs().max()) <= bound, backend

    # RotaryKVCache: the schedule's L0 is the record's original key (16), not max_position_embeddings (64).
    sched = RopeSchedule(spec, 16, bucket_growth=2.0)
    assert sched.threshold == 16
    cache = RotaryKVCache(sched, "bucketed", n_layers=1)
    gen = torch.Generator().manual_seed(1)
    raw = torch.randn(1, 2, 40, 16, generator=gen, dtype=torch.float64)
    for t in range(40):
        q = torch.randn(1, 2, 1, 16, generator=gen, dtype=torch.float64)
        cache.step(0, q, raw[:, :, t : t + 1], raw[:, :, t : t + 1], torch.tensor([t]), t + 1)
    assert cache.rerotations == 1  # L0 = 16 crossed once; the factor set does not move again
    want = apply_rope(raw, layout="b h s d", spec=spec, seq_len=sched.effective_length(40))
    assert torch.allclose(cache.k[0].view(), want, atol=1e-12)

    # diagnose sees a ladder none of its known types reproduces: "unrecognised" is the right answer.
    rep = diagnose(lambda t: apply_rope(t, layout="b s h d", spec=spec, seq_len=40), layout="b s h d",
                   sizes={"d": 16}, max_position=256)
    assert rep.scaling.startswith("unrecognised"), rep.scaling


def test_the_registry_refuses_what_would_not_work(zigzag):
    with pytest.raises(ValueError, match="already registered"):
        register_rope_type("zigzag", _zigzag, keys={"factor": POSITIVE}, required={"factor"},
                           example={"factor": 2.0})
    with pytest.raises(ValueError, match="not registered"):  # its example misses a required key
        register_rope_type("broken", _zigzag, keys={"factor": POSITIVE}, required={"factor"})
    assert "broken" not in ROPE_TYPES
    with pytest.raises(ValueError, match="built in"):
        unregister_rope_type("linear")
    with pytest.raises(ValueError, match="kind"):
        register_rope_type("odd", _zigzag, keys={"factor": "a number"})


def test_every_record_is_consistent_and_its_example_runs():
    for name, rec in ROPE_TYPES.items():
        assert rec.example["rope_type"] == name and rec.required <= set(rec.keys)
        inv, af = frequencies(D, rope_scaling=dict(rec.example), max_position_embeddings=L0)
        assert inv.shape == (D // 2,) and math.isfinite(af)
        spec = RopeSpec(scaling={k: v for k, v in rec.example.items()}, max_position_embeddings=L0)
        assert torch.equal(spec.frequencies(D)[0], inv)
        assert rec.positive_keys == {k for k, v in rec.keys.items() if v == POSITIVE} | {"rope_theta"}


# --------------------------------------------------------------------------------------------------
# Validation: one rule per test, then a sweep through frequencies and RopeSpec together
# --------------------------------------------------------------------------------------------------

REQUIRED = [(name, key) for name, rec in ROPE_TYPES.items() for key in sorted(rec.required)] + [("yarn", "factor")]


@pytest.mark.parametrize("rope_type, key", REQUIRED, ids=[f"{t}-{k}" for t, k in REQUIRED])
def test_a_missing_required_key_raises_at_construction_naming_it(rope_type, key):
    sc = {k: v for k, v in ROPE_TYPES[rope_type].example.items() if k != key}
    with pytest.raises(ValueError, match=f"needs the key '{key}'"):
        RopeSpec(scaling=sc, max_position_embeddings=L0)
    with pytest.raises(ValueError, match=f"needs the key '{key}'"):
        frequencies(D, rope_scaling=sc, max_position_embeddings=L0)


def _bad_values(kind):
    if kind == POSITIVE_LIST:
        return [True, 2.0, "1.0", [True] * (D // 2), []]
    if kind == FLAG:
        return [1, "False"]
    return [True, False, "2.0", [2.0], math.nan, math.inf]


NON_NUMERIC = [(name, key, v) for name, rec in ROPE_TYPES.items() for key, kind in rec.keys.items()
               for v in _bad_values(kind)]


@pytest.mark.parametrize("rope_type, key, value", NON_NUMERIC, ids=[f"{t}-{k}-{v!r}"[:60] for t, k, v in NON_NUMERIC])
def test_a_value_of_the_wrong_type_names_the_key_and_the_type(rope_type, key, value):
    sc = {**ROPE_TYPES[rope_type].example, key: value}
    for check in (lambda: RopeSpec(scaling=sc, max_position_embeddings=L0),
                  lambda: frequencies(D, rope_scaling=sc, max_position_embeddings=L0)):
        with pytest.raises(ValueError, match=rf"\['{key}'\] must be .*got {type(value).__name__}"):
            check()


def test_a_length_is_needed_only_where_transformers_needs_it():
    yarn = {"rope_type": "yarn", "factor": 4.0}  # L0 falls back to max_position_embeddings
    assert torch.equal(frequencies(D, rope_scaling=yarn, max_position_embeddings=64)[0],
                       frequencies(D, rope_scaling={**yarn, "original_max_position_embeddings": 64})[0])
    for sc, match in [(yarn, "original_max_position_embeddings"),
                      ({"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings"),
                      ({**ROPE_TYPES["longrope"].example, "factor": None}, "factor"),
                      ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 16}, "factor")]:
        with pytest.raises(ValueError, match=match):
            RopeSpec(scaling=sc)
        with pytest.raises(ValueError, match=match):
            frequencies(D, rope_scaling=sc)


def _sweep() -> list[dict]:
    """Every record's example, each with one key dropped, set to None, or set to a bad or borderline value,
    an unknown key, and a proportional dict carrying yarn keys."""
    out = []
    for rec in ROPE_TYPES.values():
        ex = dict(rec.example)
        out.append(ex)
        out += [{k: v for k, v in ex.items() if k != key} for key in rec.keys]
        for key, kind in rec.keys.items():
            values = _bad_values(kind) + [None]
            values += [[1.0] * (D // 2 - 1)] if kind == POSITIVE_LIST else [0, 0.0, -1.0, 1, 0.5] * (kind != FLAG)
            out += [{**ex, key: v} for v in values]
        out.append({**ex, "factr": 2.0})
    out.append({"rope_type": "proportional", "partial_rotary_factor": 0.5, "beta_fast": 32.0, "truncate": False})
    return out


SWEEP = _sweep()


def _accepts(make) -> bool:
    try:
        make()
    except ValueError:
        return False
    return True  # any other exception fails the test: bad input must be a ValueError


@pytest.mark.parametrize("max_pos", [None, 4 * L0])
def test_frequencies_and_rope_spec_accept_and_reject_the_same_dicts(max_pos):
    disagree = []
    for sc in SWEEP:
        rd = None if ROPE_TYPES[sc["rope_type"]].whole_head else D
        a = _accepts(lambda sc=sc: frequencies(D, rope_scaling=sc, max_position_embeddings=max_pos))
        b = _accepts(lambda sc=sc, rd=rd: RopeSpec(scaling=sc, rotary_dim=rd, max_position_embeddings=max_pos))
        if a != b:
            disagree.append((sc, a, b))
    assert not disagree, disagree[:5]
    assert sum(map(_accepts, [lambda sc=sc: frequencies(D, rope_scaling=sc, max_position_embeddings=max_pos)
                              for sc in SWEEP])) > len(ROPE_TYPES)  # the sweep holds valid dicts too


# --------------------------------------------------------------------------------------------------
# Parity with transformers' own validation and fallbacks
# --------------------------------------------------------------------------------------------------

HF_MAX_POS = 4 * L0  # > every example's L0, so transformers' llama3/yarn length checks stay quiet


def _hf(sc: dict):
    """What transformers makes of ``sc`` (plus rope_theta) in a Llama config: ("raises" | "fails" | "warns" |
    "clean", (inv_freq, attention_factor) or None). "fails": its compute raises or gives a non-finite number."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers.modeling_rope_utils")
    logger.addHandler(handler)
    try:
        try:
            config = transformers.LlamaConfig(
                hidden_size=4 * D, num_attention_heads=4, num_key_value_heads=4, head_dim=D,
                max_position_embeddings=HF_MAX_POS, rope_parameters={**sc, "rope_theta": 10000.0})
        except Exception:
            return "raises", None
        try:
            if sc["rope_type"] == "default":
                return ("warns" if records else "clean"), None
            inv, af = ROPE_INIT_FUNCTIONS[sc["rope_type"]](config, None, seq_len=None)
            finite = bool(torch.isfinite(inv).all()) and math.isfinite(float(af))
        except Exception:
            return "fails", None
        if not finite:
            return "fails", None
        return ("warns" if records else "clean"), (inv, float(af))
    finally:
        logger.removeHandler(handler)


def _ropelab_accepts(sc: dict) -> bool:
    return _accepts(lambda: frequencies(D, rope_scaling=sc, max_position_embeddings=HF_MAX_POS))


HF_SWEEP = [sc for sc in SWEEP if sc["rope_type"] != "default" and "zigzag" not in sc["rope_type"]]


def test_what_transformers_refuses_or_cannot_compute_ropelab_refuses():
    let_through = [sc for sc in HF_SWEEP if _hf(sc)[0] in ("raises", "fails") and _ropelab_accepts(sc)]
    assert not let_through, let_through[:5]


# Dicts transformers computes, each through a fallback it makes (a few with a logged warning: yarn's factor None,
# longrope's missing factor, llama3's L0 equal to max_position_embeddings): ropelab takes them and gives the same
# numbers (what the fallback means is in ropelab.scaling.check_scaling's docstring).
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
TRANSFORMERS_FALLBACKS = {
    "yarn: original_max_position_embeddings from max_position_embeddings": {"rope_type": "yarn", "factor": 4.0},
    "yarn: factor None is max_position_embeddings / L0": {**YARN, "factor": None},
    "yarn: mscale_all_dim 0 is not set": {**YARN, "mscale": 0.707, "mscale_all_dim": 0},
    "yarn: mscale 0 is not set": {**YARN, "mscale": 0.0, "mscale_all_dim": 1.0},
    "yarn: beta_fast / beta_slow 0 are 32 / 1": {**YARN, "beta_fast": 0, "beta_slow": 0},
    "yarn: beta_fast None is 32": {**YARN, "beta_fast": None},
    "longrope: no factor is max_position_embeddings / L0": {
        k: v for k, v in ROPE_TYPES["longrope"].example.items() if k != "factor"},
    "llama3: original_max_position_embeddings from max_position_embeddings": {
        k: v for k, v in ROPE_TYPES["llama3"].example.items() if k != "original_max_position_embeddings"},
    "proportional: no factor is 1": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
}


@pytest.mark.parametrize("what", list(TRANSFORMERS_FALLBACKS))
def test_every_fallback_transformers_makes_is_made_the_same(what):
    sc = TRANSFORMERS_FALLBACKS[what]
    verdict, hf = _hf(sc)
    assert verdict in ("clean", "warns"), verdict  # measured: transformers computes it (some with a logged warning)
    spec = RopeSpec(scaling=sc, max_position_embeddings=HF_MAX_POS)
    inv, af = spec.frequencies(D)
    rtol = (math.log(10000.0) + 8) * 2.0**-24  # transformers' float32 ladder (see test_hf_parity)
    torch.testing.assert_close(hf[0].double(), inv, rtol=rtol, atol=0)
    assert af == pytest.approx(hf[1], rel=1e-12)


# Where ropelab is stricter than transformers, on purpose; each measured: transformers computes it silently.
STRICTER = {
    "a bool is not a number (transformers takes True as 1)": {**YARN, "factor": True},
    "infinity is not a factor (transformers makes every frequency 0)": {"rope_type": "linear", "factor": math.inf},
    "an attention_factor of 0 would zero every rotated vector": {**YARN, "attention_factor": 0.0},
    "a negative mscale is not a temperature": {**YARN, "mscale": -1.0},
    "a string is not a flag (transformers truncates on 'False')": {**YARN, "truncate": "False"},
    "an L0 of 0 (ropelab's `or` would read it as unset)": {**ROPE_TYPES["llama3"].example,
                                                          "original_max_position_embeddings": 0},
}


@pytest.mark.parametrize("what", list(STRICTER))
def test_the_rules_stricter_than_transformers_are_these(what):
    sc = STRICTER[what]
    assert _hf(sc)[0] == "clean"
    assert not _ropelab_accepts(sc)
    assert not _accepts(lambda: RopeSpec(scaling=sc, max_position_embeddings=HF_MAX_POS))


def _wrong_type(kind, v) -> bool:
    if kind == FLAG:
        return not isinstance(v, bool)
    if kind == POSITIVE_LIST:
        return not isinstance(v, list) or not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in v)
    return not isinstance(v, (int, float)) or isinstance(v, bool)


def test_everything_else_transformers_takes_silently_ropelab_takes():
    """Over the whole sweep: a dict transformers validates without a warning and computes finitely is accepted,
    unless it falls under the STRICTER rules: a value of the wrong type (the issue's rule: a bool, string or
    list where a number belongs), a non-finite number, or a number <= 0 (zero attention factor or length,
    negative mscale)."""
    def stricter(sc):
        kinds = {"rope_theta": POSITIVE, **ROPE_TYPES[sc["rope_type"]].keys}
        given = {k: v for k, v in sc.items() if k in kinds and v is not None}
        return any(_wrong_type(kinds[k], v) for k, v in given.items()) or any(
            isinstance(v, float) and not math.isfinite(v) for v in given.values()) or any(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0 for v in given.values())

    refused = [sc for sc in HF_SWEEP if _hf(sc)[0] == "clean" and not stricter(sc) and not _ropelab_accepts(sc)]
    assert not refused, refused[:5]
    # and the sweep does reach such dicts: the stricter rules are not vacuous
    assert any(_hf(sc)[0] == "clean" and stricter(sc) and not _ropelab_accepts(sc) for sc in HF_SWEEP)
