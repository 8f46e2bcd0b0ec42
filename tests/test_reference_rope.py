"""reference.rope_tables / reference.apply_rope: against transformers' rotations (Llama half-split,
GPT-NeoX partial, GPT-J interleaved), the relative-position property in float64, layouts, partial
rotary and the attention factor."""
from __future__ import annotations

import math

import pytest
import torch

import posenc_native
from posenc_native import reference
from posenc_native.config import LongRopeScaling, RopeConfig, YarnScaling

GEN = torch.Generator().manual_seed(1234)


def _randn(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=GEN, dtype=dtype)


def _hf_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float):
    """What transformers' rotary modules return, written out here in float64:
    emb = cat(freqs, freqs); cos = emb.cos() * attention_scaling."""
    freqs = positions.to(torch.float64)[..., None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


YARN = RopeConfig(head_dim=64, base=10000.0, max_position_embeddings=16384,
                  scaling=YarnScaling(factor=8.0, original_max_position_embeddings=2048))
CONFIGS = {
    "default": RopeConfig(head_dim=64),
    "yarn": YARN,
    "partial-yarn": RopeConfig(head_dim=64, partial_rotary_factor=0.5, max_position_embeddings=16384,
                               scaling=YarnScaling(factor=8.0, original_max_position_embeddings=2048)),
}


@pytest.mark.parametrize("name", ["default", "yarn"])
def test_matches_transformers_llama_apply_rotary_pos_emb(name):
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cfg = CONFIGS[name]
    b, h, s, d = 2, 3, 11, cfg.head_dim
    q, k = _randn(b, h, s, d), _randn(b, 2, s, d)
    pos = torch.randint(0, 50000, (b, s), generator=GEN)
    cos, sin = _hf_cos_sin(pos, cfg.inv_freq(), cfg.attention_factor)
    hq, _ = apply_rotary_pos_emb(q, q, cos, sin)
    _, hk = apply_rotary_pos_emb(k, k, cos, sin)
    rq, rk = reference.apply_rope(q, k, pos, cfg, layout="bhsd")
    torch.testing.assert_close(rq, hq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rk, hk, rtol=1e-12, atol=1e-12)
    # rope_cos_sin is transformers' (cos, sin) layout for half-split configs
    c2, s2 = reference.rope_tables(pos, cfg)
    torch.testing.assert_close(c2, cos, rtol=0, atol=1e-14)
    torch.testing.assert_close(s2, sin, rtol=0, atol=1e-14)


def test_matches_transformers_gpt_neox_partial():
    pytest.importorskip("transformers")
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    cfg = CONFIGS["partial-yarn"]
    q, k = _randn(2, 4, 9, 64), _randn(2, 4, 9, 64)
    pos = torch.arange(9) + 3000
    cos, sin = _hf_cos_sin(pos[None], cfg.inv_freq(), cfg.attention_factor)  # [1, S, R] as transformers
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    rq, rk = reference.apply_rope(q, k, pos, cfg, layout="bhsd")
    torch.testing.assert_close(rq, hq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rk, hk, rtol=1e-12, atol=1e-12)
    assert torch.equal(rq[..., 32:], q[..., 32:])  # pass-through dims untouched, bit for bit


def test_end_to_end_with_transformers_rotary_module_yarn():
    """transformers' LlamaRotaryEmbedding (its own float32 inv_freq and YaRN attention scaling) and
    apply_rotary_pos_emb in float32, against the float64 reference from RopeConfig.from_hf."""
    tf = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hf_cfg = tf.LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=8192,
                            rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                             "original_max_position_embeddings": 2048})
    rot = LlamaRotaryEmbedding(hf_cfg)
    pos = torch.arange(0, 64, dtype=torch.long)[None] * 97  # up to ~6000
    q, k = _randn(1, 4, 64, 64), _randn(1, 4, 64, 64)
    cos, sin = rot(q.to(torch.float32), pos)
    hq, hk = apply_rotary_pos_emb(q.float(), k.float(), cos, sin)
    rq, rk = reference.apply_rope(q, k, pos, RopeConfig.from_hf(hf_cfg), layout="bhsd")
    assert rot.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    torch.testing.assert_close(hq.double(), rq, rtol=0, atol=2e-3)  # float32 angles at ~6000: ~5e-4 rad
    torch.testing.assert_close(hk.double(), rk, rtol=0, atol=2e-3)


def test_matches_transformers_gptj_interleaved():
    pytest.importorskip("transformers")
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    cfg = RopeConfig.from_hf({"model_type": "gptj", "n_embd": 128, "n_head": 4, "rotary_dim": 16})
    assert cfg.interleaved and (cfg.head_dim, cfg.rotary_dim) == (32, 16)
    b, s, h, d, r = 2, 7, 4, 32, 16
    q, k = _randn(b, s, h, d), _randn(b, s, h, d)
    pos = torch.randint(0, 2000, (b, s), generator=GEN)
    # GPT-J's attention: sincos rows gathered by position, split in sin | cos, applied to the first
    # rotary_dim dims with rotate_every_two (float64 angles from the same frequencies)
    angles = pos.to(torch.float64)[..., None] * cfg.inv_freq()
    sin, cos = torch.sin(angles), torch.cos(angles)

    def gptj(x):
        return torch.cat([apply_rotary_pos_emb(x[..., :r], sin, cos), x[..., r:]], dim=-1)

    rq, rk = reference.apply_rope(q, k, pos, cfg, layout="bshd")
    torch.testing.assert_close(rq, gptj(q), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rk, gptj(k), rtol=1e-12, atol=1e-12)
    # GPT-J's own float32 table (base 10000 hard-coded there) agrees with our frequencies
    table = create_sinusoidal_positions(2000, r)
    sin32, cos32 = torch.split(table[pos], r // 2, dim=-1)
    torch.testing.assert_close(sin32.double(), sin, rtol=0, atol=5e-4)
    torch.testing.assert_close(cos32.double(), cos, rtol=0, atol=5e-4)
    # rope_cos_sin for an interleaved config repeats each pair's value twice
    c, sn = reference.rope_tables(pos, cfg)
    assert c.shape == (b, s, r)
    torch.testing.assert_close(c, cos.repeat_interleave(2, dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(sn, sin.repeat_interleave(2, dim=-1), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# Properties, in float64


def _rotate_single(x: torch.Tensor, position: int, cfg: RopeConfig) -> torch.Tensor:
    out, _ = reference.apply_rope(x[None, None, None, :], None, torch.tensor([position]), cfg)
    return out[0, 0, 0]


@pytest.mark.parametrize("cfg", [
    RopeConfig(head_dim=64),
    YARN,
    RopeConfig(head_dim=48, interleaved=True, partial_rotary_factor=0.5, max_position_embeddings=32768,
               scaling=YarnScaling(factor=16.0, original_max_position_embeddings=2048, truncate=False)),
], ids=["default", "yarn", "yarn-interleaved-partial"])
def test_relative_position_property(cfg):
    q, k = _randn(cfg.head_dim), _randn(cfg.head_dim)
    af2 = cfg.attention_factor ** 2
    r = cfg.rotary_dim
    for dist in (0, 1, 7, 300, 5000):
        scores = [float(_rotate_single(q, m, cfg) @ _rotate_single(k, m + dist, cfg))
                  for m in (0, 1, 13, 1000, 40000, 123456)]
        for sc in scores[1:]:
            assert sc == pytest.approx(scores[0], rel=1e-9, abs=1e-9)
        if dist == 0:  # no rotation left: af^2 on the rotated dims, plain on the rest
            expected = af2 * float(q[:r] @ k[:r]) + float(q[r:] @ k[r:])
            assert scores[0] == pytest.approx(expected, rel=1e-12)
    # and the score does change with the distance
    s1 = float(_rotate_single(q, 0, cfg) @ _rotate_single(k, 1, cfg))
    s2 = float(_rotate_single(q, 0, cfg) @ _rotate_single(k, 50, cfg))
    assert abs(s1 - s2) > 1e-3


def test_rotation_preserves_pair_norms_times_attention_factor():
    cfg = CONFIGS["partial-yarn"]
    q = _randn(1, 5, 2, 64)
    pos = torch.tensor([0, 1, 100, 10000, 1 << 20])
    out, _ = reference.apply_rope(q, None, pos, cfg)
    half = cfg.rotary_dim // 2
    norm_in = q[..., :half] ** 2 + q[..., half:cfg.rotary_dim] ** 2
    norm_out = out[..., :half] ** 2 + out[..., half:cfg.rotary_dim] ** 2
    torch.testing.assert_close(norm_out, norm_in * cfg.attention_factor ** 2, rtol=1e-12, atol=0)
    assert torch.equal(out[..., cfg.rotary_dim:], q[..., cfg.rotary_dim:])
    # position 0: the rotated dims are only scaled
    torch.testing.assert_close(out[:, 0, :, :32], q[:, 0, :, :32] * cfg.attention_factor, rtol=1e-15, atol=0)


def test_pair_rotation_formula():
    # (a, b) -> (a cos t - b sin t, a sin t + b cos t), written out for one pair of each pairing
    inv = torch.tensor([0.3, 0.01], dtype=torch.float64)
    x = _randn(1, 1, 1, 6)
    t0, t1 = 5 * 0.3, 5 * 0.01
    for interleaved, pairs in ((False, [(0, 2), (1, 3)]), (True, [(0, 1), (2, 3)])):
        out, _ = reference.apply_rope(x, None, torch.tensor([5]), inv_freq=inv, attention_factor=1.5,
                                      interleaved=interleaved)
        for (ia, ib), t in zip(pairs, (t0, t1)):
            a, b = float(x[0, 0, 0, ia]), float(x[0, 0, 0, ib])
            assert float(out[0, 0, 0, ia]) == pytest.approx(1.5 * (a * math.cos(t) - b * math.sin(t)), rel=1e-14)
            assert float(out[0, 0, 0, ib]) == pytest.approx(1.5 * (a * math.sin(t) + b * math.cos(t)), rel=1e-14)
        assert torch.equal(out[..., 4:], x[..., 4:])


# ------------------------------------------------------------------------------------------------
# Layouts, positions, k, dtypes


def test_layouts_agree():
    cfg = YARN
    b, s, hq, hk, d = 2, 6, 4, 2, 64
    q, k = _randn(b, s, hq, d), _randn(b, s, hk, d)
    pos = torch.randint(0, 9000, (b, s), generator=GEN)
    q1, k1 = reference.apply_rope(q, k, pos, cfg, layout="bshd")
    q2, k2 = reference.apply_rope(q.transpose(1, 2), k.transpose(1, 2), pos, cfg, layout="bhsd")
    torch.testing.assert_close(q2.transpose(1, 2), q1, rtol=0, atol=0)
    torch.testing.assert_close(k2.transpose(1, 2), k1, rtol=0, atol=0)
    # thd: tokens of the batch packed, positions [T]
    q3, k3 = reference.apply_rope(q.reshape(b * s, hq, d), k.reshape(b * s, hk, d), pos.reshape(-1), cfg, layout="thd")
    torch.testing.assert_close(q3.reshape(b, s, hq, d), q1, rtol=0, atol=0)
    torch.testing.assert_close(k3.reshape(b, s, hk, d), k1, rtol=0, atol=0)


def test_default_positions_offset_cu_seqlens_and_k_none():
    cfg = RopeConfig(head_dim=32)
    q = _randn(1, 5, 2, 32)
    a, none_k = reference.apply_rope(q, None, None, cfg)
    assert none_k is None
    b, _ = reference.apply_rope(q, None, torch.arange(5), cfg)
    assert torch.equal(a, b)
    c, _ = reference.apply_rope(q, None, None, cfg, offset=7)
    d_, _ = reference.apply_rope(q, None, torch.arange(5) + 7, cfg)
    assert torch.equal(c, d_)
    # packed sequences of lengths 2 and 3: positions restart at each start
    t = _randn(5, 2, 32)
    e, _ = reference.apply_rope(t, None, None, cfg, layout="thd", cu_seqlens=torch.tensor([0, 2, 5]))
    f, _ = reference.apply_rope(t, None, torch.tensor([0, 1, 0, 1, 2]), cfg, layout="thd")
    assert torch.equal(e, f)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        reference.apply_rope(t, None, None, cfg, layout="thd", cu_seqlens=torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="layout must be one of"):
        reference.apply_rope(q, None, None, cfg, layout="sbhd")
    with pytest.raises(ValueError, match="q must be 4-D"):
        reference.apply_rope(t, None, None, cfg)


def test_seq_len_dependent_configs_use_max_position():
    short, long_ = [1.0] * 8, [4.0] * 8
    cfg = RopeConfig(head_dim=16, max_position_embeddings=4096,
                     scaling=LongRopeScaling(short_factor=short, long_factor=long_, original_max_position_embeddings=100))
    q = _randn(1, 3, 1, 16)
    near, _ = reference.apply_rope(q, None, torch.tensor([0, 50, 99]), cfg)   # max + 1 = 100 -> short
    far, _ = reference.apply_rope(q, None, torch.tensor([0, 50, 100]), cfg)   # 101 -> long
    explicit, _ = reference.apply_rope(q, None, torch.tensor([0, 50, 99]), cfg, seq_len=5000)
    short_ref, _ = reference.apply_rope(q, None, torch.tensor([0, 50, 99]), inv_freq=cfg.inv_freq(None),
                                        attention_factor=cfg.attention_factor)
    long_ref, _ = reference.apply_rope(q, None, torch.tensor([0, 50, 99]), inv_freq=cfg.inv_freq(101),
                                       attention_factor=cfg.attention_factor)
    assert torch.equal(near, short_ref) and torch.equal(explicit, long_ref)
    assert not torch.allclose(far[:, 1], near[:, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_keep_dtype(dtype):
    q = _randn(2, 4, 3, 64)
    ref, _ = reference.apply_rope(q, None, None, YARN)
    out, _ = reference.apply_rope(q.to(dtype), None, None, YARN)
    assert out.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert float((out.double() - ref).norm() / ref.norm()) <= tol


def test_rope_cos_sin_int_positions_and_dtype():
    c, s = reference.rope_tables(5, YARN, dtype=torch.float32)
    assert c.shape == (5, 64) and c.dtype == torch.float32
    torch.testing.assert_close(c[0], torch.full((64,), YARN.attention_factor, dtype=torch.float32))
    assert float(s[0].abs().max()) == 0.0
    angles = reference.rope_angles(torch.tensor([1 << 20]), YARN.inv_freq())
    assert angles.dtype == torch.float64
    assert float(angles[0, 0]) == float(1 << 20)  # inv_freq[0] is 1: the product is exact in float64


def test_renamed_reference_names_warn_and_agree():
    """reference.rope_cos_sin (now rope_tables) and apply_rope(cfg=) (now config=) still work, with a warning."""
    cfg = RopeConfig(head_dim=8, scaling=YarnScaling(factor=4.0, original_max_position_embeddings=16))
    pos = torch.randint(0, 100, (2, 5))
    with pytest.warns(DeprecationWarning, match="rope_tables"):
        old = reference.rope_cos_sin(pos, cfg)
    new = reference.rope_tables(pos, cfg)
    assert all(torch.equal(a, b) for a, b in zip(old, new))
    q = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="config="):
        old_q, _ = reference.apply_rope(q, None, pos, cfg=cfg)
    assert torch.equal(old_q, reference.apply_rope(q, None, pos, config=cfg)[0])
    assert torch.equal(old_q, reference.apply_rope(q, None, pos, cfg)[0])


@pytest.mark.parametrize("which", ["q", "k", "none"])
def test_out_of_place_gradients_whichever_input_requires_grad(which):
    """The wrappers skip the autograd kernel only when no input requires grad; a gradient asked for
    on q alone or on k alone still arrives, equal to the reference's (the transposed rotation)."""
    cfg = RopeConfig(head_dim=8, scaling=YarnScaling(factor=4.0, original_max_position_embeddings=16))
    pos = torch.randint(0, 100, (5,))
    q = torch.randn(2, 5, 3, 8, dtype=torch.float64, requires_grad=which == "q")
    k = torch.randn(2, 5, 1, 8, dtype=torch.float64, requires_grad=which == "k")
    out_q, out_k = posenc_native.apply_rope(q, k, pos, config=cfg)
    ref_q, ref_k = reference.apply_rope(q, k, pos, cfg)
    torch.testing.assert_close(out_q, ref_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_k, ref_k, rtol=1e-12, atol=1e-12)
    if which == "none":
        assert out_q.grad_fn is None and out_k.grad_fn is None
        return
    leaf = q if which == "q" else k
    weight_q, weight_k = torch.randn_like(out_q), torch.randn_like(out_k)
    (got,) = torch.autograd.grad((out_q * weight_q).sum() + (out_k * weight_k).sum(), leaf)
    (expected,) = torch.autograd.grad((ref_q * weight_q).sum() + (ref_k * weight_k).sum(), leaf)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
