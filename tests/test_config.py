"""RopeConfig: frequencies and attention factors of every rope type.

Checked three ways: against transformers' own functions (installed package, tiny configs built
here, no downloads), against float64 formulas written out independently in this file, and by the
validation errors. Also from_hf's input forms, the presets and `posenc config`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import warnings
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc_native
from posenc_native import cli, reference
from posenc_native.config import (
    PRESETS,
    ROPE_TYPES,
    DefaultScaling,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    ProportionalScaling,
    RopeConfig,
    YarnScaling,
    describe_config,
    hf_layer_types,
    mscale,
)

# ------------------------------------------------------------------------------------------------
# Parity with transformers


def _tf():
    return pytest.importorskip("transformers")


def _llama(rope_parameters=None, *, head_dim=32, max_pos=2048, hidden=128, heads=4, **kw):
    tf = _tf()
    if rope_parameters is not None:
        kw["rope_parameters"] = rope_parameters
    return tf.LlamaConfig(hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim,
                          max_position_embeddings=max_pos, **kw)


def _llama3_boundary_config():
    """Lo and low_freq_factor chosen so that pair 12's wavelength sits 0.1% below Lo/high_freq_factor
    (kept) and pair 15's 0.1% above Lo/low_freq_factor (interpolated): both edges of the band."""
    head_dim, base = 64, 500000.0
    w = [2 * math.pi * base ** (2 * i / head_dim) for i in range(head_dim // 2)]
    lo_len = int(round(w[12] * 4 * 1.001))
    low = lo_len * 1.001 / w[15]
    return _llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": low, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": lo_len, "rope_theta": base},
                  head_dim=head_dim, max_pos=lo_len * 8)


def _phi3(partial=None, **rope):
    tf = _tf()
    n = int(32 * (partial or 1.0)) // 2
    short = [1.0 + 0.02 * i for i in range(n)]
    long_ = [1.0 + 1.5 * i for i in range(n)]
    extra = {} if partial is None else {"partial_rotary_factor": partial}
    return tf.Phi3Config(hidden_size=128, num_attention_heads=4, max_position_embeddings=8192,
                         original_max_position_embeddings=512,
                         rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long_, **rope},
                         **extra)


def _gemma3(full):
    tf = _tf()
    return tf.Gemma3TextConfig(hidden_size=128, num_attention_heads=4, head_dim=32, num_hidden_layers=2,
                               layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096,
                               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                "full_attention": full})


def _gemma4():
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    return Gemma4TextConfig(hidden_size=128, num_attention_heads=4, head_dim=16, num_hidden_layers=2,
                            layer_types=["sliding_attention", "full_attention"], global_head_dim=48)


def _deepseek(mscale_, mscale_all_dim):
    tf = _tf()
    return tf.DeepseekV3Config(hidden_size=128, num_attention_heads=4, qk_rope_head_dim=32, qk_nope_head_dim=32,
                               v_head_dim=32, max_position_embeddings=163840,
                               rope_scaling={"type": "yarn", "factor": 40, "mscale": mscale_,
                                             "mscale_all_dim": mscale_all_dim, "original_max_position_embeddings": 4096,
                                             "beta_fast": 32, "beta_slow": 1})


DYN_LENS = [None, 100, 2048, 2049, 3000, 16384]
LONG_LENS = [None, 64, 512, 513, 8192]

# (id, transformers config factory, layer_type, seq_lens)
PARITY_CASES = [
    ("default", lambda: _llama(), None, [None]),
    ("default-4.x-theta", lambda: _llama(None, head_dim=128, rope_theta=500000.0), None, [None]),
    ("default-partial-phi", lambda: _tf().PhiConfig(hidden_size=320, num_attention_heads=4, partial_rotary_factor=0.4),
     None, [None]),
    ("default-gpt-neox-rotary-pct", lambda: _tf().GPTNeoXConfig(hidden_size=256, num_attention_heads=4,
                                                                 rotary_pct=0.25, rotary_emb_base=20000), None, [None]),
    ("linear", lambda: _llama({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}), None, [None]),
    ("linear-4.x-type-alias", lambda: _llama(None, rope_scaling={"type": "linear", "factor": 2.5}, rope_theta=5e5),
     None, [None]),
    ("linear-partial", lambda: _llama({"rope_type": "linear", "factor": 3.0, "rope_theta": 1e4,
                                       "partial_rotary_factor": 0.75}, head_dim=64), None, [None]),
    ("dynamic", lambda: _llama({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), None, DYN_LENS),
    ("dynamic-4.x-partial", lambda: _llama(None, rope_scaling={"type": "dynamic", "factor": 8.0},
                                           partial_rotary_factor=0.5, head_dim=64), None, DYN_LENS),
    ("yarn", lambda: _llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                             "rope_theta": 1e4}, head_dim=128, max_pos=16384), None, [None]),
    ("yarn-qwen2-4.x", lambda: _tf().Qwen2Config(hidden_size=256, num_attention_heads=2, max_position_embeddings=32768,
                                                 rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0,
                                                                               "original_max_position_embeddings": 32768}),
     None, [None]),
    ("yarn-truncate-false-gpt-oss", lambda: _tf().GptOssConfig(hidden_size=128, num_attention_heads=2, head_dim=64,
                                                               num_hidden_layers=2, num_local_experts=4,
                                                               num_experts_per_tok=2),
     None, [None]),
    ("yarn-explicit-attention-factor", lambda: _llama({"rope_type": "yarn", "factor": 8.0, "attention_factor": 0.8,
                                                       "original_max_position_embeddings": 1024, "rope_theta": 1e4},
                                                      max_pos=8192), None, [None]),
    ("yarn-mscale-all-dim", lambda: _deepseek(1.0, 0.8), None, [None]),
    ("yarn-deepseek-mscale-equal", lambda: _deepseek(1.0, 1.0), None, [None]),
    ("yarn-factor-none-derived", lambda: _llama({"rope_type": "yarn", "factor": None,
                                                 "original_max_position_embeddings": 2048, "rope_theta": 1e4},
                                                max_pos=16384), None, [None]),
    ("yarn-partial-betas", lambda: _llama({"rope_type": "yarn", "factor": 16.0, "beta_fast": 16, "beta_slow": 2,
                                           "original_max_position_embeddings": 2048, "rope_theta": 5e5,
                                           "partial_rotary_factor": 0.5}, head_dim=128, max_pos=32768), None, [None]),
    ("longrope-phi3", lambda: _phi3(), None, LONG_LENS),
    ("longrope-partial-phi4-mini", lambda: _phi3(partial=0.75), None, LONG_LENS),
    ("longrope-explicit-factor-attention", lambda: _phi3(factor=4.0, attention_factor=1.1), None, LONG_LENS),
    ("llama3", lambda: _llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
                              head_dim=128, max_pos=131072), None, [None]),
    ("llama3-3.2-factor32", lambda: _llama({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                            "rope_theta": 500000.0}, head_dim=64, max_pos=131072), None, [None]),
    ("llama3-near-boundaries", _llama3_boundary_config, None, [None]),
    ("proportional", lambda: _llama({"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
                                    head_dim=64), None, [None]),
    ("proportional-factor", lambda: _llama({"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0,
                                            "rope_theta": 1e4}, head_dim=32), None, [None]),
    ("per-layer-5.x-sliding", lambda: _gemma3({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}),
     "sliding_attention", [None]),
    ("per-layer-5.x-full-linear", lambda: _gemma3({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}),
     "full_attention", [None]),
    ("per-layer-5.x-full-yarn", lambda: _gemma3({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                 "original_max_position_embeddings": 1024}), "full_attention", [None]),
    ("per-layer-5.x-full-dynamic", lambda: _gemma3({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}),
     "full_attention", [None, 5000, 9000]),
    ("per-layer-gemma4-proportional", _gemma4, "full_attention", [None]),
    ("per-layer-gemma4-sliding", _gemma4, "sliding_attention", [None]),
]


def _hf_type(hf_cfg, layer_type):
    params = hf_cfg.rope_parameters if layer_type is None else hf_cfg.rope_parameters[layer_type]
    return params["rope_type"]


def _hf_inv_freq(hf_cfg, layer_type, seq_len):
    """transformers' own computation: ROPE_INIT_FUNCTIONS, or the model's default-rope method."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = _hf_type(hf_cfg, layer_type)
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    if rope_type == "default":  # not in ROPE_INIT_FUNCTIONS: each model's rotary class computes it
        import importlib

        module = {"llama": "llama", "phi": "phi", "gpt_neox": "gpt_neox", "gemma3_text": "gemma3",
                  "gemma4_text": "gemma4"}[
            hf_cfg.model_type]
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        rotary_cls = [v for k, v in vars(modeling).items() if k.endswith("RotaryEmbedding") and
                      hasattr(v, "compute_default_rope_parameters") and "Vision" not in k][0]
        cfg = hf_cfg.per_layer_config[layer_type] if layer_type and hf_cfg.is_heterogeneous else hf_cfg
        return rotary_cls.compute_default_rope_parameters(cfg, **kwargs)
    fn = ROPE_INIT_FUNCTIONS[rope_type]
    return fn(hf_cfg, None, seq_len=seq_len, **kwargs)


def _rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    theirs = theirs.to(torch.float64)
    assert ours.shape == theirs.shape
    denom = theirs.abs().clamp_min(1e-300)
    err = torch.where(theirs == 0, ours.abs(), (ours - theirs).abs() / denom)
    return float(err.max())


def _case(case_id):
    return next(c for c in PARITY_CASES if c[0] == case_id)[1]()


def test_parity_cases_cover_every_type():
    types = set()
    for _, make, layer_type, _ in PARITY_CASES:
        types.add(RopeConfig.from_hf(make(), layer_type=layer_type).rope_type)
    assert len(PARITY_CASES) >= 25
    assert types == set(ROPE_TYPES)


@pytest.mark.parametrize("case_id,make,layer_type,seq_lens", PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
def test_parity_with_transformers(case_id, make, layer_type, seq_lens):
    hf_cfg = make()
    cfg = RopeConfig.from_hf(hf_cfg, layer_type=layer_type)
    assert cfg.rope_type == _hf_type(hf_cfg, layer_type)
    seen = set()
    for seq_len in seq_lens:
        theirs, their_af = _hf_inv_freq(hf_cfg, layer_type, seq_len)
        ours = cfg.inv_freq(seq_len=seq_len)
        assert ours.dtype == torch.float64 and ours.device.type == "cpu"
        assert ours.shape == (cfg.rotary_dim // 2,)
        assert _rel_err(ours, theirs) <= 1e-6, (case_id, seq_len)
        assert abs(cfg.attention_factor - float(their_af)) <= 1e-9, (case_id, seq_len)
        seen.add(tuple(ours.tolist()))
    if cfg.rope_type in ("dynamic", "longrope"):
        assert cfg.needs_seq_len and len(seen) >= 2  # the lengths did switch the frequencies

    # the same config as a config.json dict gives the same frequencies
    from_dict = RopeConfig.from_hf(hf_cfg.to_dict(), layer_type=layer_type)
    assert torch.equal(from_dict.inv_freq(seq_lens[-1]), cfg.inv_freq(seq_lens[-1]))
    assert from_dict.attention_factor == cfg.attention_factor


def _random_llama_rope(rng: random.Random):
    """A LlamaConfig with random rope parameters of a random type, and the lengths to ask for."""
    hd = rng.choice([16, 32, 64, 80, 96, 128, 256])
    maxpos = rng.choice([2048, 8192, 32768, 131072])
    orig = rng.choice([512, 1024, 2048])
    rt = rng.choice(["linear", "dynamic", "yarn", "yarn", "longrope", "llama3", "proportional"])
    p = {"rope_type": rt, "rope_theta": 10 ** rng.uniform(3, 7)}
    if rng.random() < 0.4:
        p["partial_rotary_factor"] = rng.choice([0.25, 0.5, 0.75, 1.0])
    if rt in ("linear", "dynamic", "proportional"):
        p["factor"] = rng.uniform(1.0, 32.0)
    elif rt == "yarn":
        p["factor"] = rng.choice([rng.uniform(1.0, 64.0), float(rng.randint(1, 64))])
        optional = dict(original_max_position_embeddings=orig, beta_fast=rng.uniform(4, 64),
                        beta_slow=rng.uniform(0.5, 3), mscale=rng.uniform(0.1, 2), mscale_all_dim=rng.uniform(0, 2),
                        attention_factor=rng.uniform(0.5, 2), truncate=rng.random() < 0.5)
        p.update({k: v for k, v in optional.items() if rng.random() < 0.4})
    elif rt == "llama3":
        lo = rng.uniform(0.5, 4)
        p.update(factor=rng.uniform(1.0, 64.0), low_freq_factor=lo, high_freq_factor=lo * rng.uniform(1.01, 8),
                 original_max_position_embeddings=orig)
    elif rt == "longrope":
        half = int(hd * p.get("partial_rotary_factor", 1.0)) // 2
        p.update(short_factor=[rng.uniform(1, 3) for _ in range(half)],
                 long_factor=[rng.uniform(1, 60) for _ in range(half)], original_max_position_embeddings=orig)
        if rng.random() < 0.3:
            p["factor"] = rng.uniform(1, 32)
        if rng.random() < 0.2:
            p["attention_factor"] = rng.uniform(0.5, 2)
    lens = [None]
    if rt in ("dynamic", "longrope"):
        lens += [orig, orig + 1, maxpos, maxpos + 1, rng.randint(1, 4 * maxpos)]
    return _llama(p, head_dim=hd, max_pos=maxpos, hidden=4 * hd), lens


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_configs_equal_transformers_formulas_in_float64(seed):
    """Random rope parameters of every scaled type: our float64 frequencies equal transformers' own
    formulas evaluated in float64 to 1e-12 (the fixed cases above hold 1e-6, the precision of
    transformers' float32 evaluation). Its functions name their dtypes as torch.float / torch.float32;
    bound to float64 for the call, they compute the same expressions in float64. LongRoPE's exponents
    go through `.float()`, which stays float32, so it is held to 2e-6."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg, lens = _random_llama_rope(random.Random(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = RopeConfig.from_hf(hf_cfg)
    rope_type = hf_cfg.rope_parameters["rope_type"]
    for seq_len in lens:
        with mock.patch.object(torch, "float32", torch.float64), mock.patch.object(torch, "float", torch.float64):
            theirs, their_af = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, None, seq_len=seq_len)
        tol = 2e-6 if rope_type == "longrope" else 1e-12
        assert _rel_err(cfg.inv_freq(seq_len=seq_len), theirs) <= tol, (hf_cfg.rope_parameters, seq_len)
        assert math.isclose(cfg.attention_factor, float(their_af), rel_tol=1e-12), (hf_cfg.rope_parameters, seq_len)


def test_parity_config_objects_details():
    # values transformers' configs carry that the parity above relies on
    neox = RopeConfig.from_hf(_case("default-gpt-neox-rotary-pct"))
    assert (neox.head_dim, neox.rotary_dim, neox.base) == (64, 16, 20000.0)
    g4 = RopeConfig.from_hf(_gemma4(), layer_type="full_attention")
    assert (g4.head_dim, g4.rotary_dim, g4.rope_type) == (48, 48, "proportional")
    assert int((g4.inv_freq() > 0).sum()) == int(0.25 * 48 // 2)
    assert RopeConfig.from_hf(_gemma4(), layer_type="sliding_attention").head_dim == 16
    ds = RopeConfig.from_hf(_deepseek(1.0, 1.0))
    assert ds.head_dim == 32 and ds.interleaved and ds.attention_factor == 1.0
    oss = RopeConfig.from_hf(_case("yarn-truncate-false-gpt-oss"))
    assert oss.scaling.truncate is False and not oss.interleaved


def test_llama3_boundary_case_is_at_the_edges():
    cfg = RopeConfig.from_hf(_llama3_boundary_config())
    s = cfg.scaling
    w = (2 * math.pi / cfg.default_inv_freq()).tolist()
    lo_len = s.original_max_position_embeddings
    assert 0 < (lo_len / s.high_freq_factor) / w[12] - 1 < 2e-3
    assert 0 < w[15] / (lo_len / s.low_freq_factor) - 1 < 2e-3
    regimes = s.regimes(cfg)
    assert (regimes[12], regimes[13], regimes[14], regimes[15]) == ("kept", "blended", "blended", "interpolated")


def test_deepseek_softmax_scale_matches_transformers():
    tf = _tf()
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    for ms, msa in ((1.0, 1.0), (1.0, 0.8), (0.707, 0.707)):
        hf_cfg = _deepseek(ms, msa)
        cfg = RopeConfig.from_hf(hf_cfg)
        assert cfg.softmax_scale_multiplier == pytest.approx(yarn_apply_mscale(hf_cfg.rope_parameters, 1.0), abs=1e-12)
        assert cfg.softmax_scale_multiplier == pytest.approx((0.1 * msa * math.log(40) + 1) ** 2, abs=1e-12)
    assert RopeConfig.from_hf(_llama()).softmax_scale_multiplier == 1.0
    del tf


# ------------------------------------------------------------------------------------------------
# Independent float64 formulas (written out here, element by element)


def _default_list(base, d):
    return [1.0 / base ** (2 * i / d) for i in range(d // 2)]


def _close(t: torch.Tensor, expected: list, rel=1e-13):
    assert t.dtype == torch.float64 and len(expected) == t.shape[0]
    for a, b in zip(t.tolist(), expected):
        assert abs(a - b) <= rel * abs(b) + 1e-300, (a, b)


def test_yarn_worked_example():
    cfg = RopeConfig(head_dim=128, base=10000.0, scaling=YarnScaling(factor=4.0, original_max_position_embeddings=4096))
    assert cfg.scaling.correction_range(cfg) == (20, 46)
    assert cfg.attention_factor == pytest.approx(0.1 * math.log(4) + 1, abs=1e-15)
    expected = []
    for i, inv in enumerate(_default_list(1e4, 128)):
        ramp = min(max((i - 20) / (46 - 20), 0.0), 1.0)
        expected.append(inv / 4 * ramp + inv * (1 - ramp))
    _close(cfg.inv_freq(), expected)
    assert float(cfg.inv_freq()[20]) == float(cfg.default_inv_freq()[20])  # kept
    assert float(cfg.inv_freq()[46]) == pytest.approx(float(cfg.default_inv_freq()[46]) / 4, rel=1e-15)  # interpolated
    assert 0 < float(cfg.scaling.ramp(cfg)[33]) < 1  # blended


def test_yarn_truncate_false_and_mscale_formulas():
    d, base, lo_len = 64, 150000.0, 4096
    cfg = RopeConfig(head_dim=d, base=base, scaling=YarnScaling(factor=32.0, original_max_position_embeddings=lo_len,
                                                                truncate=False))

    def cdim(r):
        return d * math.log(lo_len / (2 * math.pi * r)) / (2 * math.log(base))

    lo, hi = cdim(32), cdim(1)
    assert cfg.scaling.correction_range(cfg) == pytest.approx((lo, hi), abs=1e-12)
    assert lo != int(lo) and hi != int(hi)
    expected = [inv / 32 * min(max((i - lo) / (hi - lo), 0), 1) + inv * (1 - min(max((i - lo) / (hi - lo), 0), 1))
                for i, inv in enumerate(_default_list(base, d))]
    _close(cfg.inv_freq(), expected)
    assert cfg.attention_factor == pytest.approx(0.1 * math.log(32) + 1, abs=1e-15)

    ds = RopeConfig(head_dim=64, max_position_embeddings=163840,
                    scaling=YarnScaling(factor=40.0, original_max_position_embeddings=4096, mscale=1.0,
                                        mscale_all_dim=0.8))
    assert ds.attention_factor == pytest.approx((0.1 * math.log(40) + 1) / (0.08 * math.log(40) + 1), abs=1e-15)
    explicit = dataclasses.replace(ds, scaling=dataclasses.replace(ds.scaling, attention_factor=0.5))
    assert explicit.attention_factor == 0.5
    only_mscale = dataclasses.replace(ds, scaling=dataclasses.replace(ds.scaling, mscale_all_dim=None))
    assert only_mscale.attention_factor == pytest.approx(0.1 * math.log(40) + 1, abs=1e-15)
    assert mscale(1.0, 5.0) == 1.0 and mscale(0.5) == 1.0


def test_yarn_lo_equals_hi_nudge():
    # betas equal: lo == hi after truncation -> hi += 0.001, a step at lo
    cfg = RopeConfig(head_dim=64, scaling=YarnScaling(factor=2.0, original_max_position_embeddings=4096,
                                                      beta_fast=8.0, beta_slow=8.0, truncate=False))
    lo, hi = cfg.scaling.correction_range(cfg)
    assert lo == hi
    ramp = cfg.scaling.ramp(cfg)
    assert set(ramp.tolist()) <= {0.0, 1.0} or all(0 <= r <= 1 for r in ramp.tolist())
    assert ramp[0] == 0 and ramp[-1] == 1


def test_linear_dynamic_formulas():
    lin = RopeConfig(head_dim=64, base=5e5, scaling=LinearScaling(factor=4.0))
    _close(lin.inv_freq(), [x / 4 for x in _default_list(5e5, 64)])

    d, big_l, f = 48, 2048, 3.0
    dyn = RopeConfig(head_dim=64, partial_rotary_factor=0.75, max_position_embeddings=big_l,
                     scaling=DynamicNTKScaling(factor=f))
    assert dyn.rotary_dim == d and dyn.needs_seq_len
    for seq_len in (None, 10, 2048, 2049, 10000):
        s = big_l if seq_len is None else max(seq_len, big_l)
        base2 = 1e4 * (f * s / big_l - (f - 1)) ** (d / (d - 2))
        _close(dyn.inv_freq(seq_len), _default_list(base2, d))
    assert torch.equal(dyn.inv_freq(100), dyn.default_inv_freq())
    for seq_len in (10, 10000):  # a 0-d tensor length (what compiled code passes) read as its int in eager
        base2 = 1e4 * (f * max(seq_len, big_l) / big_l - (f - 1)) ** (d / (d - 2))
        _close(dyn.op_inv_freq_on("cpu", torch.tensor(seq_len)), _default_list(base2, d))


def test_longrope_formulas():
    short = [1.0 + 0.1 * i for i in range(16)]
    long_ = [2.0 + i for i in range(16)]
    cfg = RopeConfig(head_dim=32, max_position_embeddings=16384,
                     scaling=LongRopeScaling(short_factor=short, long_factor=long_, original_max_position_embeddings=1024))
    base = _default_list(1e4, 32)
    for seq_len, ext in ((None, short), (1, short), (1024, short), (1025, long_), (100000, long_)):
        _close(cfg.inv_freq(seq_len), [b / e for b, e in zip(base, ext)])
    assert cfg.attention_factor == pytest.approx(math.sqrt(1 + math.log(16) / math.log(1024)), abs=1e-15)
    no_ext = dataclasses.replace(cfg, max_position_embeddings=1024)
    assert no_ext.attention_factor == 1.0


def test_llama3_formula_and_boundaries():
    base, d = 500000.0, 128
    cfg = RopeConfig(head_dim=d, base=base, scaling=Llama3Scaling())  # Meta's defaults 8, 1, 4, 8192
    expected, regimes = [], []
    for inv in _default_list(base, d):
        w = 2 * math.pi / inv
        if w < 8192 / 4:
            expected.append(inv)
            regimes.append("kept")
        elif w > 8192 / 1:
            expected.append(inv / 8)
            regimes.append("interpolated")
        else:
            s = (8192 / w - 1) / (4 - 1)
            expected.append((1 - s) * inv / 8 + s * inv)
            regimes.append("blended")
    _close(cfg.inv_freq(), expected)
    assert cfg.scaling.regimes(cfg) == regimes
    assert {"kept", "blended", "interpolated"} == set(regimes)
    # continuity at the band edges: the smoothing meets both sides
    for edge_s in (0.0, 1.0):
        inv = 1.0
        assert (1 - edge_s) * inv / 8 + edge_s * inv == pytest.approx(inv if edge_s else inv / 8)


def test_proportional_formula():
    cfg = RopeConfig(head_dim=64, base=1e6, partial_rotary_factor=0.25, scaling=ProportionalScaling(factor=2.0))
    assert cfg.rotary_dim == 64
    n_rot = int(0.25 * 64 // 2)
    expected = [1.0 / 1e6 ** (2 * i / 64) / 2 for i in range(n_rot)] + [0.0] * (32 - n_rot)
    _close(cfg.inv_freq(), expected)
    assert ProportionalScaling().rotated_pairs(cfg) == 8


def test_default_and_partial():
    cfg = RopeConfig(head_dim=80, partial_rotary_factor=0.4)
    assert cfg.rotary_dim == 32 and cfg.attention_factor == 1.0 and not cfg.needs_seq_len
    _close(cfg.inv_freq(), _default_list(1e4, 32))
    assert RopeConfig(head_dim=80, rotary_dim=32).partial_rotary_factor == 0.4
    # the placeholder's positional order (head_dim, base, interleaved) still works
    old = RopeConfig(64, 5e5, True)
    assert old.interleaved and old.base == 5e5 and old.rotary_dim == 64 and old.rope_type == "default"
    assert isinstance(RopeConfig(64).scaling, DefaultScaling)
    assert hash(RopeConfig(64, scaling={"rope_type": "linear", "factor": 2})) == hash(
        RopeConfig(64, scaling=LinearScaling(2)))


@pytest.mark.parametrize("scheme", [
    DefaultScaling(), LinearScaling(2.0), DynamicNTKScaling(4.0),
    YarnScaling(factor=8.0, original_max_position_embeddings=1024, beta_fast=16, mscale=1.0, mscale_all_dim=0.5,
                truncate=False),
    LongRopeScaling(short_factor=[1.0] * 16, long_factor=[3.0] * 16, original_max_position_embeddings=256),
    Llama3Scaling(factor=16.0), ProportionalScaling(factor=2.0),
], ids=lambda s: s.rope_type)
def test_scheme_dict_round_trip(scheme):
    cfg = RopeConfig(32, max_position_embeddings=4096, partial_rotary_factor=None, scaling=scheme)
    again = RopeConfig(32, max_position_embeddings=4096, scaling=scheme.to_dict())
    assert again == cfg and torch.equal(again.inv_freq(5000), cfg.inv_freq(5000))


# ------------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("make,match", [
    (lambda: RopeConfig(64, scaling=LinearScaling(factor=0.5)), r"'factor' must be >= 1"),
    (lambda: RopeConfig(64, max_position_embeddings=100, scaling=DynamicNTKScaling(factor=0.9)), r"'factor' must be >= 1"),
    (lambda: RopeConfig(64, scaling=YarnScaling(factor=0.25, original_max_position_embeddings=10)), r"'factor'"),
    (lambda: RopeConfig(64, scaling=YarnScaling(factor=4, original_max_position_embeddings=4096, beta_fast=1,
                                                beta_slow=32)), r"'beta_fast' \(1\) must be >= 'beta_slow' \(32\)"),
    (lambda: RopeConfig(64, scaling=YarnScaling(factor=4, original_max_position_embeddings=4096, beta_slow=-1)),
     r"'beta_slow' must be a finite number > 0"),
    (lambda: RopeConfig(64, scaling=YarnScaling(factor=4, original_max_position_embeddings=4096,
                                                attention_factor=-1.0)), r"'attention_factor'"),
    (lambda: RopeConfig(64, scaling=YarnScaling(factor=4)), r"'original_max_position_embeddings' is required"),
    (lambda: RopeConfig(64, scaling=YarnScaling(original_max_position_embeddings=4096)), r"'factor' is required"),
    (lambda: RopeConfig(64, max_position_embeddings=8192, scaling=LongRopeScaling(
        short_factor=[1.0] * 31, long_factor=[1.0] * 32, original_max_position_embeddings=1024)),
     r"'short_factor' must have rotary_dim // 2 = 32 entries, got 31"),
    (lambda: RopeConfig(64, partial_rotary_factor=0.5, max_position_embeddings=8192, scaling=LongRopeScaling(
        short_factor=[1.0] * 16, long_factor=[1.0] * 32, original_max_position_embeddings=1024)),
     r"'long_factor' must have rotary_dim // 2 = 16 entries, got 32"),
    (lambda: RopeConfig(64, max_position_embeddings=8192, scaling=LongRopeScaling(
        short_factor=[1.0] * 32, long_factor=[0.0] * 32, original_max_position_embeddings=1024)), r"'long_factor' entry"),
    (lambda: RopeConfig(64, max_position_embeddings=100, scaling=LongRopeScaling(
        short_factor=[1.0] * 32, long_factor=[1.0] * 32, original_max_position_embeddings=1024)),
     r"'factor \(max_position_embeddings / original_max_position_embeddings\)' must be >= 1"),
    (lambda: RopeConfig(64, scaling=Llama3Scaling(low_freq_factor=4.0, high_freq_factor=4.0)),
     r"'high_freq_factor' \(4.0\) must be > 'low_freq_factor' \(4.0\)"),
    (lambda: RopeConfig(64, scaling=Llama3Scaling(factor=0.5)), r"'factor' must be >= 1"),
    (lambda: RopeConfig(64, scaling=ProportionalScaling(factor=0.5)), r"'factor' must be >= 1"),
    (lambda: RopeConfig(64, scaling=DynamicNTKScaling(factor=2.0)), r"'max_position_embeddings' is required"),
    (lambda: RopeConfig(2, max_position_embeddings=10, scaling=DynamicNTKScaling(factor=2.0)), r"'rotary_dim' must be > 2"),
    (lambda: RopeConfig(10, partial_rotary_factor=0.5), r"'rotary_dim' must be even"),
    (lambda: RopeConfig(64, rotary_dim=33), r"'rotary_dim' must be even"),
    (lambda: RopeConfig(64, rotary_dim=128), r"'rotary_dim' must be even and in \[2, head_dim=64\]"),
    (lambda: RopeConfig(64, rotary_dim=32, partial_rotary_factor=0.25), r"'rotary_dim'=32 disagrees"),
    (lambda: RopeConfig(64, partial_rotary_factor=1.5), r"'partial_rotary_factor' must be in \(0, 1\]"),
    (lambda: RopeConfig(0), r"'head_dim' must be a positive int"),
    (lambda: RopeConfig(64, base=1.0), r"'base' \(rope_theta\) must be"),
    (lambda: RopeConfig(64, rotary_dim=32, scaling=ProportionalScaling()), r"proportional rope: 'rotary_dim'"),
    (lambda: RopeConfig(64, scaling={"rope_type": "ntk-by-parts", "factor": 2}), r"unknown 'rope_type' 'ntk-by-parts'"),
    (lambda: RopeConfig(64, scaling={"rope_type": "linear"}), r"rope_type 'linear' is missing required key\(s\) 'factor'"),
    (lambda: RopeConfig(64, scaling={"type": "llama3", "factor": 8}),
     r"rope_type 'llama3' is missing required key\(s\) 'low_freq_factor', 'high_freq_factor'"),
    (lambda: RopeConfig(64, scaling={"type": "longrope", "long_factor": [1.0] * 32}),
     r"missing required key\(s\) 'short_factor'"),
    (lambda: RopeConfig(64, scaling={"type": "yarn", "original_max_position_embeddings": 10}),
     r"'yarn' is missing required key\(s\) 'factor'"),
    (lambda: RopeConfig(64).inv_freq(seq_len=-1), r"'seq_len' must be an int >= 0"),
])
def test_validation_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_from_hf_validation_errors():
    base = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096}
    with pytest.raises(ValueError, match=r"unknown 'rope_type' 'bogus'"):
        RopeConfig.from_hf({**base, "rope_scaling": {"type": "bogus", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"'factor' must be >= 1"):
        RopeConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 0.5}})
    with pytest.raises(ValueError, match=r"'beta_fast' \(2\) must be >= 'beta_slow' \(4\)"):
        RopeConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 2, "beta_slow": 4}})
    with pytest.raises(ValueError, match=r"'short_factor' must have rotary_dim // 2 = 32 entries, got 3"):
        RopeConfig.from_hf({**base, "original_max_position_embeddings": 1024,
                            "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1], "long_factor": [1] * 32}})
    with pytest.raises(ValueError, match=r"'rotary_dim' must be even"):
        RopeConfig.from_hf({"hidden_size": 40, "num_attention_heads": 4, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match=r"cannot determine 'head_dim'"):
        RopeConfig.from_hf({"rope_theta": 10000.0})
    nested = {**base, "rope_parameters": {"full_attention": {"rope_type": "default"},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                          "chunked_attention": None}}
    with pytest.raises(ValueError, match=r"per layer type \(full_attention, sliding_attention, chunked_attention\): "
                                         r"pass layer_type="):
        RopeConfig.from_hf(nested)
    with pytest.raises(ValueError, match=r"layer_type 'local' not in rope_parameters"):
        RopeConfig.from_hf(nested, layer_type="local")
    with pytest.raises(ValueError, match=r"layer_type 'chunked_attention' has no RoPE"):
        RopeConfig.from_hf(nested, layer_type="chunked_attention")
    with pytest.raises(FileNotFoundError, match=r"neither a config.json"):
        RopeConfig.from_hf("/nonexistent/dir/for/posenc")


# ------------------------------------------------------------------------------------------------
# from_hf input forms (config.json dicts as checkpoints ship them)


def test_from_hf_forms(tmp_path):
    llama31 = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 4, "max_position_embeddings": 131072,
               "rope_theta": 500000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}}
    v4 = RopeConfig.from_hf(llama31)
    assert (v4.head_dim, v4.rotary_dim, v4.base, v4.rope_type, v4.interleaved) == (128, 128, 5e5, "llama3", False)
    # 5.x form: rope_parameters holds rope_theta
    v5 = RopeConfig.from_hf({k: v for k, v in llama31.items() if k not in ("rope_theta", "rope_scaling")}
                            | {"rope_parameters": {**llama31["rope_scaling"], "rope_theta": 500000.0}})
    assert v5 == v4
    # "type" alias
    alias = dict(llama31, rope_scaling={**{k: v for k, v in llama31["rope_scaling"].items() if k != "rope_type"},
                                        "type": "llama3"})
    assert RopeConfig.from_hf(alias) == v4
    # path to config.json and directory holding one
    (tmp_path / "config.json").write_text(json.dumps(llama31))
    assert RopeConfig.from_hf(tmp_path) == v4
    assert RopeConfig.from_hf(str(tmp_path / "config.json")) == v4
    # an explicit head_dim wins over hidden_size // heads
    assert RopeConfig.from_hf(dict(llama31, head_dim=64)).head_dim == 64
    # rope_theta absent everywhere -> 10000
    assert RopeConfig.from_hf({"hidden_size": 64, "num_attention_heads": 2}).base == 10000.0
    # llama3 without original_max_position_embeddings: transformers' default is max_position_embeddings
    no_lo = dict(llama31, rope_scaling={k: v for k, v in llama31["rope_scaling"].items()
                                        if k != "original_max_position_embeddings"})
    assert RopeConfig.from_hf(no_lo).scaling.original_max_position_embeddings == 131072


def test_from_hf_model_families():
    phi3 = RopeConfig.from_hf(PRESETS["phi3-longrope"])
    assert (phi3.head_dim, phi3.rotary_dim, phi3.rope_type) == (96, 96, "longrope")
    assert phi3.scaling.original_max(phi3) == 4096
    # Phi-3: a top-level original_max_position_embeddings wins over the one in rope_scaling
    phi4mini = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 24, "partial_rotary_factor": 0.75,
                "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
                                 "original_max_position_embeddings": 999}}
    c = RopeConfig.from_hf(phi4mini)
    assert (c.head_dim, c.rotary_dim, c.scaling.original_max(c)) == (128, 96, 4096)
    neox = RopeConfig.from_hf({"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8,
                               "rotary_pct": 0.25, "rotary_emb_base": 10000})
    assert (neox.head_dim, neox.rotary_dim, neox.interleaved) == (64, 16, False)
    neox_default = RopeConfig.from_hf({"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8})
    assert neox_default.rotary_dim == 16  # GPTNeoXConfig's rotary_pct default 0.25
    gptj = RopeConfig.from_hf(PRESETS["gptj-6b-like"])
    assert (gptj.head_dim, gptj.rotary_dim, gptj.interleaved, gptj.max_position_embeddings) == (256, 64, True, 2048)
    assert RopeConfig.from_hf(PRESETS["gptj-6b-like"], interleaved=False).interleaved is False
    assert RopeConfig.from_hf(PRESETS["llama3-8b-instruct-like"], interleaved=True).interleaved is True
    qwen3 = RopeConfig.from_hf({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128,
                                "rope_theta": 1000000, "max_position_embeddings": 40960, "rope_scaling": None})
    assert (qwen3.head_dim, qwen3.base, qwen3.rope_type) == (128, 1e6, "default")
    mistral = RopeConfig.from_hf({"model_type": "mistral", "hidden_size": 5120, "num_attention_heads": 32,
                                  "head_dim": 128, "rope_theta": 1000000.0})
    assert mistral.head_dim == 128
    ds = RopeConfig.from_hf(PRESETS["deepseek-v3-like"])
    assert (ds.head_dim, ds.rotary_dim, ds.interleaved, ds.rope_type) == (64, 64, True, "yarn")
    assert ds.attention_factor == 1.0 and ds.softmax_scale_multiplier == pytest.approx((0.1 * math.log(40) + 1) ** 2)
    assert RopeConfig.from_hf(dict(PRESETS["deepseek-v3-like"], rope_interleave=False)).interleaved is False
    # MLA with a partial factor that maps the full head onto the rope slice (Mistral 4 style)
    m4 = RopeConfig.from_hf({"model_type": "mistral4", "hidden_size": 1024, "num_attention_heads": 8, "head_dim": 128,
                             "qk_rope_head_dim": 64, "partial_rotary_factor": 0.5})
    assert (m4.head_dim, m4.rotary_dim) == (64, 64)
    oss = RopeConfig.from_hf(PRESETS["gpt-oss-like"])
    assert oss.scaling.truncate is False and oss.attention_factor == pytest.approx(0.1 * math.log(32) + 1)
    # Gemma 3 in the 4.x form: rope_local_base_freq serves the sliding layers
    gemma3 = {"model_type": "gemma3_text", "hidden_size": 1152, "num_attention_heads": 4, "head_dim": 256,
              "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear",
                                                                                        "factor": 8.0}}
    assert RopeConfig.from_hf(gemma3, layer_type="sliding_attention").rope_type == "default"
    assert RopeConfig.from_hf(gemma3, layer_type="sliding_attention").base == 1e4
    assert RopeConfig.from_hf(gemma3, layer_type="full_attention").scaling == LinearScaling(8.0)
    assert RopeConfig.from_hf(gemma3).base == 1e6
    # composite (multimodal) configs: the text model's rope
    assert RopeConfig.from_hf({"model_type": "llava", "text_config": PRESETS["qwen2-yarn"]}).rope_type == "yarn"


def test_from_hf_per_layer_dict():
    g4 = PRESETS["gemma4-like"]
    assert hf_layer_types(g4) == ["sliding_attention", "full_attention"]
    full = RopeConfig.from_hf(g4, layer_type="full_attention")
    assert (full.head_dim, full.rotary_dim, full.rope_type, full.base) == (512, 512, "proportional", 1e6)
    sliding = RopeConfig.from_hf(g4, layer_type="sliding_attention")
    assert (sliding.head_dim, sliding.rope_type, sliding.base) == (256, "default", 1e4)
    # a top-level rope_theta is the default of each per-layer dict
    nested = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 5e5,
              "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}
    only = RopeConfig.from_hf(nested)  # one layer type: no layer_type needed
    assert only.base == 5e5 and only.rope_type == "linear"
    assert hf_layer_types(PRESETS["qwen2-yarn"]) == []
    # a flat dict serves every layer type
    assert RopeConfig.from_hf(PRESETS["qwen2-yarn"], layer_type="full_attention").rope_type == "yarn"


# ------------------------------------------------------------------------------------------------
# Presets, `posenc config`, `posenc plot rope`


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_load(name):
    kinds = hf_layer_types(PRESETS[name]) or [None]
    for kind in kinds:
        cfg = RopeConfig.from_hf(name, layer_type=kind)
        inv = cfg.inv_freq(cfg.max_position_embeddings)
        assert inv.shape == (cfg.rotary_dim // 2,) and bool(torch.isfinite(inv).all())
    text = describe_config(name)
    assert "rope type" in text and "attention factor" in text


def test_cli_config_yarn_preset(capsys):
    assert cli.main(["config", "qwen2-yarn"]) == 0
    out = capsys.readouterr().out
    assert "rope type          yarn" in out
    assert "rotary dim         128" in out
    af = 0.1 * math.log(4) + 1
    assert f"attention factor   {af:.10g}" in out
    # Qwen2: d=128, base 1e6, Lo=32768 -> floor(cdim(32)) = 23, ceil(cdim(1)) = 40
    d, base, lo_len = 128, 1e6, 32768
    lo = math.floor(d * math.log(lo_len / (2 * math.pi * 32)) / (2 * math.log(base)))
    hi = math.ceil(d * math.log(lo_len / (2 * math.pi * 1)) / (2 * math.log(base)))
    assert f"lo={lo} hi={hi}" in out
    assert f"kept 0-{lo}, blended {lo + 1}-{hi - 1}, interpolated {hi}-63" in out
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    by_pair = {int(r[0]): r for r in rows}
    assert {0, 1, 2, 3, lo, lo + 1, hi - 1, hi, 60, 61, 62, 63} <= set(by_pair)
    assert by_pair[0][-1] == "kept" and by_pair[lo + 1][-1] == "blended" and by_pair[63][-1] == "interpolated"
    default63 = 1.0 / base ** (126 / 128)
    assert float(by_pair[63][1]) == pytest.approx(default63, rel=1e-6)
    assert float(by_pair[63][2]) == pytest.approx(default63 / 4, rel=1e-6)


def test_cli_config_path_and_errors(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["deepseek-v3-like"]))
    assert cli.main(["config", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "interleaved" in out and "softmax scale" in out
    assert cli.main(["config", "no-such-preset-or-file"]) == 2
    assert "neither a config.json" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2,
                                                 "rope_scaling": {"type": "yarn", "factor": 0.5}}))
    assert cli.main(["config", str(bad)]) == 2
    assert "'factor' must be >= 1" in capsys.readouterr().err


def test_plot_rope(tmp_path):
    pytest.importorskip("matplotlib")
    from posenc_native.plots import plot_rope

    out = plot_rope("qwen2-yarn", str(tmp_path / "rope.png"))
    assert out == str(tmp_path / "rope.png")
    data = (tmp_path / "rope.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_cli_plot_rope_per_layer_preset(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "g4.png"
    assert cli.main(["plot", "rope", "--config", "gemma4-like", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("scheme", ["dynamic", "longrope"])
def test_negative_positions_use_the_short_sequence_frequencies(scheme):
    """Positions below 0 (or a negative offset) make max(position) + 1 <= 0: the frequencies of a
    short sequence (dynamic NTK's unscaled ones, LongRoPE's short factors), as transformers gives
    them; the op refused such a call with "'seq_len' must be an int >= 0", a length never passed."""
    short = [1.0 + 0.1 * i for i in range(4)]
    scaling = (DynamicNTKScaling(factor=4.0) if scheme == "dynamic" else
               LongRopeScaling(short_factor=short, long_factor=[3.0] * 4, original_max_position_embeddings=32))
    cfg = RopeConfig(head_dim=8, max_position_embeddings=128, scaling=scaling)
    inv = torch.tensor(_default_list(1e4, 8), dtype=torch.float64)
    if scheme == "longrope":
        inv = inv / torch.tensor(short, dtype=torch.float64)
    g = torch.Generator().manual_seed(17)
    q = torch.randn(1, 3, 2, 8, generator=g)
    for positions, offset in ((torch.tensor([-4, -3, -2]), 0), (None, -10), (torch.tensor([5, 6, 7]), -20)):
        got, _ = posenc_native.apply_rope(q, None, positions, config=cfg, offset=offset)
        pos = (torch.arange(3) if positions is None else positions) + offset
        want, _ = reference.apply_rope(q.double(), None, pos, inv_freq=inv, attention_factor=cfg.attention_factor)
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


def test_every_rotary_dim_survives_a_replace():
    """A config keeps rotary_dim / head_dim as its partial_rotary_factor; for 2256 (head_dim,
    rotary_dim) pairs up to 512 (44 and 30 among them) head_dim * that factor rounds below
    rotary_dim, and dataclasses.replace (a copy with another base, from_hf adding an axis layout)
    refused the config's own factor as disagreeing with its rotary_dim."""
    for head_dim in range(2, 513, 6):
        for rotary_dim in range(2, head_dim + 1, 2):
            cfg = RopeConfig(head_dim=head_dim, rotary_dim=rotary_dim)
            copy = dataclasses.replace(cfg, base=5000.0)
            assert (copy.rotary_dim, copy.head_dim) == (rotary_dim, head_dim)
            _close(copy.inv_freq(), _default_list(5000.0, rotary_dim))
