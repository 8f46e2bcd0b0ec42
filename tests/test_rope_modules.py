"""RoPEPositionalEncoding and YaRNPositionalEncoding (the seed articles' names) against the float64
reference and the seed's formulas."""
from __future__ import annotations

import math

import pytest
import torch

import posenc_native
from posenc_native import modules, reference
from posenc_native.modules import RoPEPositionalEncoding, YaRNPositionalEncoding

GEN = torch.Generator().manual_seed(99)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN, dtype=torch.float64).to(dtype)


def _seed_angles(seq_len: int, dim: int, base: float) -> torch.Tensor:
    """The seed: inv_freq = 1/(base**(arange(0,dim,2)/dim)), freqs = outer(t, inv_freq), cat(freqs, freqs)
    (here in float64)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return torch.cat((freqs, freqs), dim=-1)


def _seed_apply(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_exported():
    assert posenc_native.RoPEPositionalEncoding is RoPEPositionalEncoding
    assert posenc_native.YaRNPositionalEncoding is YaRNPositionalEncoding
    assert {"RoPEPositionalEncoding", "YaRNPositionalEncoding"} <= set(posenc_native.__all__)


def test_rope_forward_is_the_seed_angle_matrix():
    rope = RoPEPositionalEncoding(64, base=10000)
    emb = rope(300)
    assert emb.shape == (300, 64) and emb.dtype == torch.float32
    expected = _seed_angles(300, 64, 10000.0)
    torch.testing.assert_close(emb.double(), expected, rtol=1e-7, atol=0)
    torch.testing.assert_close(rope.inv_freq.double(), expected[1, :32], rtol=1e-7, atol=0)
    # far positions: the angle is rounded once, to float32
    far = rope(70000)[-1].double()
    inv = 1.0 / (1e4 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    torch.testing.assert_close(far, 69999 * torch.cat([inv, inv]), rtol=6e-8, atol=0)
    assert rope(0).shape == (0, 64)


@pytest.mark.parametrize("shape", [(2, 3, 10, 64), (2, 10, 64), (10, 64)], ids=["bhsd", "bsd", "sd"])
def test_apply_rotary_emb_matches_seed_formula_and_reference(shape, monkeypatch):
    rope = RoPEPositionalEncoding(64)
    emb = rope(10)
    cos, sin = emb.cos(), emb.sin()
    x = _randn(*shape)
    calls = []
    fused = modules.ops.apply_rotary_pos_emb
    monkeypatch.setattr(modules.ops, "apply_rotary_pos_emb", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    out = RoPEPositionalEncoding.apply_rotary_emb(x, cos, sin)
    assert len(calls) == (1 if x.dim() >= 3 else 0)  # [B,H,S,D] and [B,S,D] run as the fused kernel
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _rel(out, _seed_apply(x.double(), cos.double(), sin.double())) <= 1e-6
    # and the float64 reference rotation of the same positions
    x4 = x.reshape(-1, 1, 10, 64) if x.dim() < 4 else x
    ref, _ = reference.apply_rope(x4.double(), None, None, rope.config, layout="bhsd")
    assert _rel(out.reshape(x4.shape), ref) <= 1e-6


def test_apply_rotary_emb_broadcast_fallback_and_grad():
    rope = RoPEPositionalEncoding(32)
    emb = rope(6)
    cos, sin = emb.cos(), emb.sin()
    # [B, S, H, D] with cos [S, 1, D]: not the fused op's shape; the seed formula's broadcasting
    x = _randn(2, 6, 3, 32)
    out = rope.apply_rotary_emb(x, cos[:, None, :], sin[:, None, :])
    torch.testing.assert_close(out, _seed_apply(x, cos[:, None, :], sin[:, None, :]))
    # gradients flow through the fused path like through the formula
    xa = _randn(1, 2, 6, 32).requires_grad_()
    xb = xa.detach().clone().requires_grad_()
    w = _randn(1, 2, 6, 32)
    (rope.apply_rotary_emb(xa, cos, sin) * w).sum().backward()
    (_seed_apply(xb, cos, sin) * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)
    # cos/sin that want a gradient take the formula (the fused op differentiates q and k only)
    c = cos.clone().requires_grad_()
    rope.apply_rotary_emb(x.transpose(1, 2), c, sin).sum().backward()
    assert c.grad is not None and float(c.grad.abs().sum()) > 0


@pytest.mark.parametrize("x_shape,table_rows", [((2, 2, 6, 32), 2), ((3, 2, 6, 32), 2), ((2, 3, 6, 32), 1),
                                                  ((3, 6, 32), 3), ((3, 6, 32), 1), ((1, 4, 6, 32), 4)])
def test_apply_rotary_emb_three_dim_tables_broadcast_as_the_formula(x_shape, table_rows):
    """A [N,S,D] table broadcasts against x's dim -3: the heads of a 4-D x (per-head tables, which
    the fused op does not take), the batch of a 3-D one; the result is the formula's either way."""
    rope = RoPEPositionalEncoding(32)
    emb = rope(6 + table_rows)
    rows = torch.stack([emb[r:r + 6] for r in range(table_rows)])  # a different position offset per row
    cos, sin = rows.cos(), rows.sin()
    x = _randn(*x_shape)
    out = rope.apply_rotary_emb(x, cos, sin)
    assert out.shape == x.shape
    assert _rel(out, _seed_apply(x.double(), cos.double(), sin.double())) <= 1e-6


def test_apply_rotary_emb_refuses_tables_the_formula_cannot_broadcast():
    rope = RoPEPositionalEncoding(32)
    rows = torch.stack([rope(8)[r:r + 6] for r in range(2)])
    x = _randn(2, 3, 6, 32)  # [B=2, H=3, S, D] against [2, S, D]: the table's 2 rows meet 3 heads
    with pytest.raises(RuntimeError, match="size of tensor"):
        _seed_apply(x, rows.cos(), rows.sin())
    with pytest.raises(RuntimeError, match="size of tensor"):
        rope.apply_rotary_emb(x, rows.cos(), rows.sin())


def test_rope_rotate_fused_matches_reference():
    rope = RoPEPositionalEncoding(64, base=500000)
    q, k = _randn(2, 4, 12, 64), _randn(2, 2, 12, 64)
    pos = torch.randint(0, 100000, (2, 12), generator=GEN)
    oq, ok = rope.rotate(q, k, pos)
    rq, rk = reference.apply_rope(q.double(), k.double(), pos, rope.config, layout="bhsd")
    assert _rel(oq, rq) <= 1e-5 and _rel(ok, rk) <= 1e-5


def test_yarn_forward_matches_reference_and_formulas():
    dim, base, lo_len, s = 128, 10000, 4096, 4.0
    yarn = YaRNPositionalEncoding(dim, base=base, original_max_position_embeddings=lo_len, scaling_factor=s)
    assert yarn.config.scaling.correction_range(yarn.config) == (20, 46)
    assert yarn.attention_factor == pytest.approx(0.1 * math.log(4) + 1, abs=1e-15)
    cos, sin = yarn(500)
    assert cos.shape == sin.shape == (500, dim) and cos.dtype == torch.float32
    rc, rs = reference.rope_tables(500, yarn.config)
    torch.testing.assert_close(cos.double(), rc, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), rs, rtol=0, atol=1e-6)
    # independent: YaRN frequencies written out, cos(angle) * attention factor, half-split layout
    inv = []
    for i in range(dim // 2):
        d_i = 1.0 / base ** (2 * i / dim)
        ramp = min(max((i - 20) / 26, 0.0), 1.0)
        inv.append(d_i / s * ramp + d_i * (1 - ramp))
    p = 321
    expected = [math.cos(p * f) * (0.1 * math.log(4) + 1) for f in inv]
    torch.testing.assert_close(cos[p, :64].double(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(cos[p, 64:], cos[p, :64], rtol=0, atol=0)
    # not the seed's "YaRN" (NTK base and positions / s): YaRN keeps the fastest pair, divides the slowest
    assert float(yarn.inv_freq[0]) == 1.0
    assert float(yarn.inv_freq[-1]) == pytest.approx(1.0 / base ** (126 / 128) / s, rel=1e-6)


def test_yarn_matches_transformers_rotary_module():
    tf = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    yarn = YaRNPositionalEncoding(64, base=10000, original_max_position_embeddings=2048, scaling_factor=8.0)
    hf_cfg = tf.LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=16384,
                            rope_parameters={"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0,
                                             "original_max_position_embeddings": 2048})
    hc, hs = LlamaRotaryEmbedding(hf_cfg)(torch.zeros(1, dtype=torch.float32), torch.arange(300)[None])
    cos, sin = yarn(300)
    torch.testing.assert_close(cos, hc[0], rtol=0, atol=1e-4)  # transformers forms float32 angles
    torch.testing.assert_close(sin, hs[0], rtol=0, atol=1e-4)


def test_yarn_factor_one_is_plain_rope_and_rotate():
    plain = YaRNPositionalEncoding(32)  # the seed's defaults: scaling_factor 1.0
    emb = RoPEPositionalEncoding(32)(50)
    cos, sin = plain(50)
    torch.testing.assert_close(cos, emb.cos(), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, emb.sin(), rtol=0, atol=1e-6)
    assert plain.attention_factor == 1.0

    yarn = YaRNPositionalEncoding(64, original_max_position_embeddings=1024, scaling_factor=16.0)
    q, k = _randn(2, 3, 20, 64), _randn(2, 1, 20, 64)
    oq, ok = yarn.rotate(q, k, offset=5000)
    rq, rk = reference.apply_rope(q.double(), k.double(), None, yarn.config, layout="bhsd", offset=5000)
    assert _rel(oq, rq) <= 1e-5 and _rel(ok, rk) <= 1e-5
    # apply_rotary_emb with the module's (cos, sin) is the same rotation at positions 0..S-1
    c, s = yarn(20)
    via_cos_sin = yarn.apply_rotary_emb(q, c, s)
    r0, _ = reference.apply_rope(q.double(), None, None, yarn.config, layout="bhsd")
    assert _rel(via_cos_sin, r0) <= 1e-5
    bshd, _ = yarn.rotate(q.transpose(1, 2).contiguous(), None, layout="bshd")
    assert _rel(bshd.transpose(1, 2), r0) <= 1e-5
    # interleaved: forward's tables are paired (2i, 2i+1), and apply_rotary_emb pairs them so (it
    # paired them half-split: pair norms scaled 0.06..16 instead of by the attention factor)
    gptj = YaRNPositionalEncoding(64, original_max_position_embeddings=1024, scaling_factor=16.0, interleaved=True)
    r0, _ = reference.apply_rope(q.double(), None, None, gptj.config, layout="bhsd")
    assert _rel(gptj.apply_rotary_emb(q, *gptj(20)), r0) <= 1e-5
    assert _rel(gptj.rotate(q)[0], r0) <= 1e-5


def test_modules_survive_half_and_validate():
    yarn = YaRNPositionalEncoding(64, original_max_position_embeddings=1024, scaling_factor=4.0).half()
    cos, _ = yarn(10)  # frequencies kept in float64 outside the buffers
    rc, _ = reference.rope_tables(10, yarn.config)
    torch.testing.assert_close(cos.double(), rc, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="'factor' must be >= 1"):
        YaRNPositionalEncoding(64, scaling_factor=0.5)
    with pytest.raises(ValueError, match="'rotary_dim' must be even"):
        RoPEPositionalEncoding(63)


@pytest.mark.parametrize("preset,layer_type", [
    ("llama3-8b-instruct-like", None), ("llama2-dynamic-ntk", None), ("qwen2-yarn", None), ("gpt-oss-like", None),
    ("phi3-longrope", None), ("deepseek-v3-like", None), ("gptj-6b-like", None),
    ("gemma4-like", "full_attention"), ("gemma4-like", "sliding_attention"),
])
def test_rotary_embedding_from_hf_presets_match_reference(preset, layer_type):
    """The fused module built by from_hf (the interface ops.apply_rope reads from RopeConfig)."""
    from posenc_native.modules import RotaryEmbedding

    rot = RotaryEmbedding.from_hf(preset, layer_type=layer_type, layout="bshd")
    d = rot.config.head_dim
    q, k = _randn(1, 6, 2, d), _randn(1, 6, 1, d)
    cfg = rot.config
    far = (cfg.max_position_embeddings or 8192) - 10  # past the original context: long/scaled regimes
    for pos in (torch.arange(6), torch.tensor([0, 5, 17, 300, 2000, far])):
        oq, ok = rot(q, k, pos)
        rq, rk = reference.apply_rope(q.double(), k.double(), pos, cfg)
        assert _rel(oq, rq) <= 1e-5 and _rel(ok, rk) <= 1e-5


def _seed_modules():
    return {"sinusoidal": lambda: posenc_native.SinusoidalPositionalEncoding(24, max_len=300),
            "rope": lambda: RoPEPositionalEncoding(32, base=500.0),
            "yarn": lambda: YaRNPositionalEncoding(32, original_max_position_embeddings=64, scaling_factor=8.0)}


def _seed_buffer_truth(name: str, module) -> dict[str, torch.Tensor]:
    """The documented float32 buffers, from the float64 reference (and the seed's formula)."""
    if name == "sinusoidal":
        return {"pe": reference.sinusoidal_table(300, 24)[None]}
    inv = 1.0 / (500.0 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32)) if name == "rope" else None
    if name == "yarn":  # YaRN's frequencies: the angles of position 1 in the reference's tables
        inv = torch.atan2(*reversed(reference.rope_tables(torch.tensor([1]), module.config)))[0, :16]
    return {"inv_freq": inv}


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "yarn"])
@pytest.mark.parametrize("move", ["meta, to_empty", "half", "bfloat16", "double"])
def test_seed_buffers_keep_their_values_through_every_move(name, move):
    """The seed classes' buffers (``pe``, ``inv_freq``) are functions of the constructor's arguments:
    a module built on the meta device and materialized with ``to_empty`` (nothing refills a
    non-persistent buffer) or cast to another dtype holds them exact and in float32, as documented."""
    if move == "meta, to_empty":
        with torch.device("meta"):
            module = _seed_modules()[name]()
        assert all(b.is_meta for b in module.buffers())
        module = module.to_empty(device="cpu")
    else:
        module = _seed_modules()[name]().to({"half": torch.float16, "bfloat16": torch.bfloat16,
                                             "double": torch.float64}[move])
    for buffer, truth in _seed_buffer_truth(name, module).items():
        got = getattr(module, buffer)
        assert got.dtype == torch.float32, buffer
        # within the kernels' cos/sin bound (~2e-7 absolute, docs/architecture.md; the table's rows
        # past an anchor are rotated in float32), after every move
        torch.testing.assert_close(got.double(), truth, rtol=0, atol=2e-7)
    if name != "sinusoidal":  # and what forward computes from the frequencies
        angles = module(7) if name == "rope" else None
        if angles is not None:
            torch.testing.assert_close(angles.double(), _seed_angles(7, 32, 500.0), rtol=0, atol=2e-6)
        else:
            rc, rs = reference.rope_tables(7, module.config)
            cos, sin = module(7)
            torch.testing.assert_close(cos.double(), rc, rtol=0, atol=2e-6)
            torch.testing.assert_close(sin.double(), rs, rtol=0, atol=2e-6)
