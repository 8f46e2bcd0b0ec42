"""Multi-axis RoPE: MRoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) against transformers' own rotary classes
and apply_rotary_pos_emb, axial RoPE against a float64 Flux EmbedND written here from its
definition, and the op paths (layouts, pairings, in place, partial rotary, autograd, compile,
opcheck, CPU paths, thread counts, bad input) against the float64 reference."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import posenc_native as pn
from posenc_native import reference
from posenc_native.config import RopeConfig

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}


def rel_err(out: torch.Tensor, truth: torch.Tensor) -> float:
    truth = truth.double().cpu()
    return float((out.double().cpu() - truth).norm() / truth.norm().clamp_min(1e-300))


def unit_pairs(shape, interleaved: bool, gen) -> torch.Tensor:
    """float64 [..., D] whose every rotary pair has norm 1 (so an absolute error is a relative one)."""
    ang = torch.rand(*shape[:-1], shape[-1] // 2, generator=gen, dtype=torch.float64) * 6.283185307179586
    if interleaved:
        return torch.stack([ang.cos(), ang.sin()], dim=-1).flatten(-2)
    return torch.cat([ang.cos(), ang.sin()], dim=-1)


def vl_positions(batch: int, text: int, grid: tuple[int, int, int], text_after: int) -> torch.Tensor:
    """[3, B, S] ids shaped like a Qwen-VL prompt (transformers' get_rope_index): text tokens (the
    same id on every axis), one image/video grid (t, h, w ids from where the text stopped), then text
    again from one past the grid's largest id; each batch row shifted differently."""
    t, h, w = grid
    first = torch.arange(text).expand(3, text)
    gt, gh, gw = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack([gt.flatten(), gh.flatten(), gw.flatten()]) + text
    after = torch.arange(text_after).expand(3, text_after) + text + max(grid)
    one = torch.cat([first, image, after], dim=1)
    return torch.stack([one + 7 * b for b in range(batch)], dim=1)


def random_axis_positions(batch: int, seq: int, gen, high: int = 1 << 24) -> torch.Tensor:
    """[3, B, S] ids that differ on every axis."""
    return torch.randint(0, high, (3, batch, seq), generator=gen)


# ------------------------------------------------------------------------------------------------
# transformers' Qwen-VL rotary classes


def hf_rotary(family: str, head_dim: int, theta: float, section):
    if family == "qwen2_vl":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig as Config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as Rotary
        from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb
        params = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(section)}
    elif family == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig as Config
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding as Rotary
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb
        params = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(section)}
    else:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig as Config
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb
        params = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(section),
                  "mrope_interleaved": True}
    cfg = Config(hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
                 rope_parameters=params)
    return Rotary(cfg), apply_rotary_pos_emb


HF_CASES = [("qwen2_vl", 128, 1e6, (16, 24, 24)), ("qwen2_5_vl", 128, 1e6, (16, 24, 24)),
            ("qwen2_vl", 64, 1e4, (8, 12, 12)), ("qwen3_vl", 128, 5e6, (24, 20, 20)),
            ("qwen3_vl", 64, 1e6, (12, 10, 10))]


def our_config(family: str, head_dim: int, theta: float, section) -> RopeConfig:
    return RopeConfig(head_dim=head_dim, base=theta, mrope_section=section, mrope_interleaved=family == "qwen3_vl")


def hf_float64(rotary, apply_hf, q, k, position_ids, head_dim, theta):
    """transformers' MRoPE in float64: its own recomposition (the pair -> axis map) and its
    apply_rotary_pos_emb; only the angles are formed in float64 (the class forms them in float32,
    off by up to 6e-2 rad at 2^20), from the frequencies of its compute_default_rope_parameters."""
    inv64 = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    torch.testing.assert_close(inv64.float(), rotary.inv_freq, rtol=2e-7, atol=0)  # the class's frequencies
    freqs = position_ids.expand(3, -1, -1).to(torch.float64)[..., None] * inv64
    cos, sin = rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin())
    return apply_hf(q.double(), k.double(), cos, sin)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,head_dim,theta,section", HF_CASES)
@pytest.mark.parametrize("positions_kind", ["random", "vl_prompt", "text_2d"])
def test_matches_transformers_mrope_fp32_unit_pairs(device, family, head_dim, theta, section, positions_kind):
    """fp32 within 2e-6 of transformers' float64 MRoPE (unit-norm pairs, ids below 2^24, different per axis)."""
    gen = torch.Generator().manual_seed(hash((family, head_dim, positions_kind)) % 2**31)
    rotary, apply_hf = hf_rotary(family, head_dim, theta, section)
    B, S = 2, 40
    if positions_kind == "random":
        pos = random_axis_positions(B, S, gen)
        pos[:, 0, :4] = torch.tensor([0, (1 << 24) - 1, 1 << 20, 131071])
    elif positions_kind == "vl_prompt":
        pos = vl_positions(B, 5, (2, 3, 4), S - 5 - 24)
    else:
        pos = torch.randint(0, 1 << 24, (B, S), generator=gen)  # text: transformers expands to 3 rows
    q64 = unit_pairs((B, 4, S, head_dim), False, gen)
    k64 = unit_pairs((B, 2, S, head_dim), False, gen)
    want_q, want_k = hf_float64(rotary, apply_hf, q64, k64, pos, head_dim, theta)
    cfg = our_config(family, head_dim, theta, section)
    for inplace in (False, True):
        q, k = q64.float().to(device), k64.float().to(device)
        fn = pn.apply_rope_ if inplace else pn.apply_rope
        got_q, got_k = fn(q, k, pos.to(device), config=cfg, layout="bhsd")
        assert (got_q.double().cpu() - want_q).abs().max().item() <= 2e-6
        assert (got_k.double().cpu() - want_k).abs().max().item() <= 2e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,head_dim,theta,section", HF_CASES[:1] + HF_CASES[3:4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_transformers_mrope_16bit(device, family, head_dim, theta, section, dtype):
    gen = torch.Generator().manual_seed(3)
    rotary, apply_hf = hf_rotary(family, head_dim, theta, section)
    pos = random_axis_positions(2, 33, gen, high=1 << 20)
    q = torch.randn(2, 4, 33, head_dim, generator=gen).to(dtype)
    k = torch.randn(2, 1, 33, head_dim, generator=gen).to(dtype)
    want_q, want_k = hf_float64(rotary, apply_hf, q, k, pos, head_dim, theta)
    got_q, got_k = pn.apply_rope(q.to(device), k.to(device), pos.to(device), config=our_config(family, head_dim, theta,
                                                                                                  section),
                                 layout="bhsd")
    assert got_q.dtype == dtype
    assert rel_err(got_q, want_q) <= TOL[dtype] and rel_err(got_k, want_k) <= TOL[dtype]


@pytest.mark.parametrize("family,head_dim,theta,section", HF_CASES)
def test_matches_transformers_rotary_class_forward(family, head_dim, theta, section):
    """The classes' own float32 forward + apply_rotary_pos_emb, end to end, at ids below 2^11: equal
    within the class's float32 angle error (ids * inv_freq rounded in float32: < 2.5e-4 rad here)."""
    gen = torch.Generator().manual_seed(4)
    rotary, apply_hf = hf_rotary(family, head_dim, theta, section)
    pos = random_axis_positions(2, 24, gen, high=1 << 11)
    q = unit_pairs((2, 3, 24, head_dim), False, gen).float()
    k = unit_pairs((2, 1, 24, head_dim), False, gen).float()
    cos, sin = rotary(q, pos)
    want_q, want_k = apply_hf(q, k, cos, sin)
    got_q, got_k = pn.apply_rope(q, k, pos, config=our_config(family, head_dim, theta, section), layout="bhsd")
    assert (got_q - want_q).abs().max().item() <= 5e-4
    assert (got_k - want_k).abs().max().item() <= 5e-4


# ------------------------------------------------------------------------------------------------
# Flux: EmbedND + its apply_rope, written in float64 from their definitions
# (flux/math.py rope() and apply_rope(), flux/modules/layers.py EmbedND).


def flux_embed_nd(ids: torch.Tensor, axes_dim, theta: float) -> torch.Tensor:
    """ids [B, L, A] -> freqs_cis [B, 1, L, D/2, 2, 2]: per axis the rotation matrices
    [[cos, -sin], [sin, cos]] of ids[..., a] * 1 / theta ** (arange(0, d_a, 2) / d_a), concatenated
    over axes along the pair dim."""
    def rope(pos, dim):
        omega = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        out = pos.to(torch.float64)[..., None] * omega
        out = torch.stack([out.cos(), -out.sin(), out.sin(), out.cos()], dim=-1)
        return out.reshape(*out.shape[:-1], 2, 2)

    return torch.cat([rope(ids[..., a], axes_dim[a]) for a in range(ids.shape[-1])], dim=-3).unsqueeze(1)


def flux_apply_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, D]: pairs (2i, 2i+1) times their matrix."""
    x_ = x.double().reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]
    return out.reshape(*x.shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axes_dim,theta", [((16, 56, 56), 10000.0), ((32, 32), 10000.0), ((8, 20, 20, 16), 2000.0)])
def test_axial_matches_flux_embed_nd(device, axes_dim, theta):
    gen = torch.Generator().manual_seed(sum(axes_dim))
    B, L, D = 2, 50, sum(axes_dim)
    ids = torch.randint(0, 1 << 16, (B, L, len(axes_dim)), generator=gen)
    ids[:, :8] = 0  # Flux's text tokens: id 0 on every axis
    ids[0, 8:20, 0] = (1 << 24) - 1
    freqs_cis = flux_embed_nd(ids, axes_dim, theta)
    cfg = RopeConfig.axial(axes_dim=axes_dim, theta=theta)
    assert cfg.interleaved and cfg.rotary_dim == D and cfg.mrope_section == tuple(d // 2 for d in axes_dim)
    q64 = unit_pairs((B, 6, L, D), True, gen)
    k64 = unit_pairs((B, 6, L, D), True, gen)
    want_q, want_k = flux_apply_rope(q64, freqs_cis), flux_apply_rope(k64, freqs_cis)
    positions = ids.permute(2, 0, 1).to(device)  # Flux's [B, L, A] -> [A, B, L]
    got_q, got_k = pn.apply_rope(q64.float().to(device), k64.float().to(device), positions, config=cfg, layout="bhsd")
    assert (got_q.double().cpu() - want_q).abs().max().item() <= 2e-6
    assert (got_k.double().cpu() - want_k).abs().max().item() <= 2e-6
    # the reference agrees with Flux's definition to float64 rounding
    ref_q, _ = reference.apply_rope(q64, None, ids.permute(2, 0, 1), config=cfg, layout="bhsd")
    assert (ref_q - want_q).abs().max().item() <= 1e-9
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(B, 6, L, D, generator=gen).to(dtype)
        got, _ = pn.apply_rope(q.to(device), None, positions, config=cfg, layout="bhsd")
        assert rel_err(got, flux_apply_rope(q, freqs_cis)) <= TOL[dtype]


def test_axial_config_bands_and_validation():
    cfg = RopeConfig.axial(axes_dim=(16, 56, 56), theta=10000.0)
    bands = [1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d) for d in (16, 56, 56)]
    assert torch.equal(cfg.inv_freq_on("cpu"), torch.cat(bands))
    assert cfg.pair_axes == (0,) * 8 + (1,) * 28 + (2,) * 28 and cfg.num_axes == 3
    op = cfg.op_inv_freq_on("cpu")
    assert op.shape == (3, 64) and torch.equal(op.sum(0), torch.cat(bands)) and int((op != 0).sum()) == 64
    for bad in [(16, 55), (), (16, -2), (16, True)]:
        with pytest.raises(ValueError, match="axes_dim"):
            RopeConfig.axial(axes_dim=bad)


# ------------------------------------------------------------------------------------------------
# The op paths against the float64 reference


def _layout_qk(layout, B, S, hq, hk, D, dtype, device, gen):
    shape = {"bshd": lambda h: (B, S, h, D), "bhsd": lambda h: (B, h, S, D), "thd": lambda h: (S, h, D)}[layout]
    q = torch.randn(shape(hq), generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    k = torch.randn(shape(hk), generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    return q, k


PATH_CASES = [
    # layout, head_dim, rotary factor, section, interleaved sections, pairing interleaved, positions kind
    ("bshd", 128, 1.0, (16, 24, 24), False, False, "vl_prompt"),
    ("bshd", 128, 1.0, (24, 20, 20), True, True, "random"),
    ("bhsd", 96, 0.5, (8, 8, 8), False, True, "random"),        # partial rotary: 48 of 96 dims
    ("bhsd", 80, 1.0, (14, 13, 13), True, False, "vl_prompt"),
    ("thd", 64, 0.75, (8, 8, 8), False, False, "random"),
    ("thd", 64, 1.0, (16, 8, 8), True, True, "text_1d"),
    ("bshd", 64, 1.0, (16, 16), False, False, "broadcast_batch"),  # [A, 1, S], two axes
    ("bshd", 32, 1.0, (4, 6, 6), False, True, "text_2d"),
    ("bshd", 32, 1.0, (4, 6, 6), True, False, "none"),          # default positions: arange on every axis
]


def _positions(kind, layout, B, S, gen):
    if kind == "vl_prompt":
        return vl_positions(B, 4, (1, 3, 5), S - 4 - 15)
    if kind == "random":
        pos = random_axis_positions(B, S, gen, high=1 << 20)
        return pos[:, 0] if layout == "thd" else pos
    if kind == "text_1d":
        return torch.randint(0, 5000, (S,), generator=gen)
    if kind == "text_2d":
        return torch.randint(0, 5000, (B, S), generator=gen)
    if kind == "broadcast_batch":
        return torch.randint(0, 5000, (2, 1, S), generator=gen)
    return None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PATH_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[6]}-{'il' if c[5] else 'half'}" for c in PATH_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_paths_match_reference(device, case, dtype):
    layout, D, prf, section, mrope_il, interleaved, kind = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    B = 1 if layout == "thd" else 2
    S = 30
    cfg = RopeConfig(head_dim=D, base=1e6, partial_rotary_factor=prf, interleaved=interleaved,
                     mrope_section=section, mrope_interleaved=mrope_il)
    pos = _positions(kind, layout, B, S, gen)
    q, k = _layout_qk(layout, B, S, 4, 2, D, dtype, device, gen)
    want_q, want_k = reference.apply_rope(q.double().cpu(), k.double().cpu(), pos, config=cfg, layout=layout, offset=3)
    dpos = None if pos is None else pos.to(device)
    got_q, got_k = pn.apply_rope(q, k, dpos, config=cfg, layout=layout, offset=3)
    assert rel_err(got_q, want_q) <= TOL[dtype] and rel_err(got_k, want_k) <= TOL[dtype]
    rot = cfg.rotary_dim
    assert torch.equal(got_q[..., rot:], q[..., rot:])  # pass-through dims copied
    # in place: the same bits as out of place
    q2, k2 = q.clone(), k.clone()
    pn.apply_rope_(q2, k2, dpos, config=cfg, layout=layout, offset=3)
    assert torch.equal(q2, got_q) and torch.equal(k2, got_k)
    # inv_freq= with mrope_section=: the same bits as config=
    via_inv, _ = pn.apply_rope(q, k, dpos, inv_freq=cfg.inv_freq_on(device), interleaved=interleaved, layout=layout,
                               offset=3, mrope_section=section, mrope_interleaved=mrope_il)
    assert torch.equal(via_inv, got_q)
    # the raw op with the axis form of inv_freq, inverse: back to q
    back, _ = torch.ops.posenc.rope(got_q, got_k, dpos, None, cfg.op_inv_freq_on(device), 1.0, interleaved, layout, 3,
                                    True)
    assert rel_err(back, q.double()) <= 2 * TOL[dtype]


def test_inv_freq_with_mrope_section_caches_no_fake_tensor():
    """inv_freq= with mrope_section= keeps its axis mask per (section, device), so that a GPU decode
    loop copies it once: a call under a FakeTensorMode (as torch.export traces) caches nothing, and
    the eager calls after it give the reference's result, on every row of a fresh section."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from posenc_native import ops

    section = (3, 3, 2)  # used by no other test: its mask is made here first
    cfg = RopeConfig(head_dim=16, base=1e4, mrope_section=section)
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(2, 5, 2, 16, generator=gen)
    pos = torch.randint(0, 40, (3, 2, 5), generator=gen)
    with FakeTensorMode() as mode:
        fake_q, fake_pos = mode.from_tensor(q), mode.from_tensor(pos)
        pn.apply_rope(fake_q, None, fake_pos, inv_freq=mode.from_tensor(cfg.inv_freq()), mrope_section=section)
    assert not any(key[0] == section for key in ops._AXIS_MASKS._entries)
    want, _ = reference.apply_rope(q.double(), None, pos, config=cfg)
    for _ in range(2):  # the call that fills the cache, and one that reads it
        got, _ = pn.apply_rope(q, None, pos, inv_freq=cfg.inv_freq(), mrope_section=section)
        assert rel_err(got, want) <= TOL[torch.float32]
    assert all(type(mask) is torch.Tensor and mask.dtype == torch.bool for mask, _ in ops._AXIS_MASKS._entries.values())
    assert any(key[0] == section for key in ops._AXIS_MASKS._entries)


@pytest.mark.parametrize("how", ["inv_freq=", "config="])
def test_a_fake_tensor_call_after_eager_ones_reads_no_cached_tensor(how):
    """After eager calls have cached a real axis mask (inv_freq= with mrope_section=) or real
    frequencies (config=), the same call under a FakeTensorMode (meta-style shape inference) gives
    a FakeTensor of the right shape: a real cached tensor handed to the fake call was refused ("Please
    convert all Tensors to FakeTensors first"). The eager call after it still matches the reference."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    section = (2, 3, 3) if how == "inv_freq=" else (3, 2, 3)  # (fresh sections: cached here first)
    cfg = RopeConfig(head_dim=16, base=1e4, mrope_section=section)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    q = torch.randn(2, 5, 2, 16, generator=gen)
    pos = torch.randint(0, 40, (3, 2, 5), generator=gen)
    kw = dict(inv_freq=cfg.inv_freq(), mrope_section=section) if how == "inv_freq=" else dict(config=cfg)
    want, _ = reference.apply_rope(q.double(), None, pos, config=cfg)
    got, _ = pn.apply_rope(q, None, pos, **kw)
    assert rel_err(got, want) <= TOL[torch.float32]
    with FakeTensorMode() as mode:
        fake_kw = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out, _ = pn.apply_rope(mode.from_tensor(q), None, mode.from_tensor(pos), **fake_kw)
        assert isinstance(out, FakeTensor) and out.shape == q.shape
    got, _ = pn.apply_rope(q, None, pos, **kw)
    assert rel_err(got, want) <= TOL[torch.float32]


def test_text_positions_equal_on_every_axis():
    """2-D / 1-D positions with an axis layout mean the same id on every axis (transformers' text
    tokens): bit-identical to [A, B, S] with equal rows, and to plain RoPE with the same frequencies."""
    gen = torch.Generator().manual_seed(12)
    cfg = RopeConfig(head_dim=64, base=1e6, mrope_section=(8, 12, 12))
    plain = RopeConfig(head_dim=64, base=1e6)
    q, k = _layout_qk("bshd", 2, 70, 3, 1, 64, torch.bfloat16, "cpu", gen)
    pos = torch.randint(0, 1 << 20, (2, 70), generator=gen)
    pos[:, 10:50] = torch.arange(40) + 1000  # consecutive ids: the CPU stream advances them
    a = pn.apply_rope(q, k, pos, config=cfg)
    b = pn.apply_rope(q, k, pos.expand(3, 2, 70), config=cfg)
    c = pn.apply_rope(q, k, pos, config=plain)
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and torch.equal(x, z)


def test_module_and_reference_tables():
    gen = torch.Generator().manual_seed(13)
    cfg = RopeConfig(head_dim=64, base=1e6, mrope_section=(8, 12, 12), mrope_interleaved=True)
    module = pn.RotaryEmbedding(cfg, layout="bhsd")
    q, k = _layout_qk("bhsd", 2, 9, 3, 1, 64, torch.float32, "cpu", gen)
    pos = random_axis_positions(2, 9, gen, high=9000)
    want = reference.apply_rope(q.double(), k.double(), pos, config=cfg, layout="bhsd")
    for got, want in zip(module(q, k, pos), want):
        assert rel_err(got, want) <= 1e-6


def test_thread_count_does_not_change_bits():
    """The CPU stream evaluates every multi-axis row from its positions alone, so 1 and 2 threads give
    the same bits on a VL prompt (text, image rows, text)."""
    gen = torch.Generator().manual_seed(14)
    cfg = RopeConfig(head_dim=128, base=1e6, mrope_section=(16, 24, 24))
    pos = vl_positions(1, 37, (2, 9, 16), 200)
    S = pos.shape[-1]
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            q, k = _layout_qk("bshd", 1, S, 4, 2, 128, torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
            outs.append(pn.apply_rope(q, k, pos, config=cfg))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    want, _ = reference.apply_rope(q.double(), None, pos, config=cfg)
    assert rel_err(outs[0][0], want) <= TOL[torch.bfloat16]


ISA_SCRIPT = r"""
import sys, torch, posenc_native as pn
from posenc_native.config import RopeConfig
print(pn.build_info()["cpu_isa"])
g = torch.Generator().manual_seed(0)
out = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for section, il, interleaved, D in (((16, 24, 24), False, False, 128), ((14, 11, 11), True, True, 72)):
        cfg = RopeConfig(head_dim=D, base=1e6, mrope_section=section, mrope_interleaved=il, interleaved=interleaved)
        q = torch.randn(2, 40, 4, D, generator=g).to(dtype)
        k = torch.randn(2, 40, 2, D, generator=g).to(dtype)
        pos = torch.randint(0, 1 << 20, (3, 2, 40), generator=g)
        grid = torch.stack([torch.zeros(20, dtype=torch.long), torch.arange(20) // 5, torch.arange(20) % 5])
        pos[:, :, 10:30] = grid[:, None] + 50  # an image: rows of 5 patches
        out += list(pn.apply_rope(q, k, pos, config=cfg))
        q2, k2 = q.clone(), k.clone()
        pn.apply_rope_(q2, k2, pos, config=cfg)
        out += [q2, k2]
torch.save(out, sys.argv[1])
"""


def test_every_cpu_path_gives_the_portable_bits(tmp_path):
    def run(path):
        env = {k: v for k, v in os.environ.items() if k not in ("POSENC_CPU_ISA", "POSENC_CPU_PORTABLE")}
        env["POSENC_CPU_ISA"] = path
        file = tmp_path / f"{path}.pt"
        proc = subprocess.run([sys.executable, "-c", ISA_SCRIPT, str(file)], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.split()[0], torch.load(file)

    taken, portable = run("portable")
    assert taken == "portable"
    ran = 0
    for path in ("avx2", "avx512", "avx512bf16"):
        taken, out = run(path)
        if taken != path:
            continue
        ran += 1
        assert len(out) == len(portable)
        for i, (a, b) in enumerate(zip(out, portable)):
            assert torch.equal(a, b), f"{path}: output {i} ({a.dtype}) differs from portable"
    if ran == 0:
        pytest.skip("no SIMD path on this CPU")


# ------------------------------------------------------------------------------------------------
# Autograd, compile, opcheck


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck(interleaved):
    gen = torch.Generator().manual_seed(15)
    cfg = RopeConfig(head_dim=12, rotary_dim=8, base=100.0, interleaved=interleaved, mrope_section=(2, 1, 1),
                     mrope_interleaved=interleaved)
    q = torch.randn(2, 5, 3, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 1, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    pos = random_axis_positions(2, 5, gen, high=300)
    assert torch.autograd.gradcheck(lambda q, k: pn.apply_rope(q, k, pos, config=cfg, offset=2), (q, k))
    # the backward is the inverse rotation: d(sum(w * rope(q)))/dq = rope^-1(w)
    w = torch.randn(2, 5, 3, 12, generator=gen, dtype=torch.float64)
    out, _ = pn.apply_rope(q, k, pos, config=cfg)
    (grad,) = torch.autograd.grad((out * w).sum(), q)
    back, _ = reference.apply_rope(w, None, -pos, config=cfg)  # the rotation by minus the angles
    torch.testing.assert_close(grad, back, rtol=1e-12, atol=1e-12)


def test_inplace_autograd_on_non_leaf():
    gen = torch.Generator().manual_seed(16)
    cfg = RopeConfig(head_dim=16, base=1e4, mrope_section=(2, 3, 3))
    leaf_q = torch.randn(1, 6, 2, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    leaf_k = torch.randn(1, 6, 1, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    pos = random_axis_positions(1, 6, gen, high=100)
    q, k = leaf_q * 1, leaf_k * 1
    pn.apply_rope_(q, k, pos, config=cfg)
    (q.square() * torch.arange(16.0)).sum().backward()
    gq = leaf_q.grad.clone()
    leaf_q.grad = None
    q2, _ = pn.apply_rope(leaf_q, leaf_k, pos, config=cfg)
    (q2.square() * torch.arange(16.0)).sum().backward()
    torch.testing.assert_close(gq, leaf_q.grad, rtol=1e-12, atol=1e-12)


def test_compile_fullgraph_no_breaks():
    gen = torch.Generator().manual_seed(17)
    cfg = RopeConfig(head_dim=32, base=1e6, mrope_section=(4, 6, 6), mrope_interleaved=True)
    inv_freq = cfg.inv_freq()

    def step(q, k, pos):
        q, k = pn.apply_rope(q, k, pos, config=cfg)
        q2, k2 = q.clone(), k.clone()
        pn.apply_rope_(q2, k2, pos, config=cfg)
        # inv_freq= with mrope_section=: its axis mask (cached for eager calls) is no graph break
        q3, k3 = pn.apply_rope(q, k, pos, inv_freq=inv_freq, mrope_section=(4, 6, 6), mrope_interleaved=True)
        return q + q2 + q3, k + k2 + k3

    q, k = _layout_qk("bshd", 2, 7, 3, 1, 32, torch.float32, "cpu", gen)
    pos = random_axis_positions(2, 7, gen, high=4000)
    for backend in ("aot_eager", "inductor"):
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(step, backend=counter, fullgraph=True)
        for got, want in zip(compiled(q, k, pos), step(q, k, pos)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    gen = torch.Generator().manual_seed(18)
    cfg = RopeConfig(head_dim=32, base=1e4, rotary_dim=24, mrope_section=(4, 4, 4))
    inv = cfg.op_inv_freq_on(device)
    q = torch.randn(2, 6, 4, 32, generator=gen).to(device)
    k = torch.randn(2, 6, 2, 32, generator=gen).to(device)
    pos = random_axis_positions(2, 6, gen, high=100).to(device)
    pq, pk = torch.randn(7, 4, 32, generator=gen).to(device), torch.randn(7, 2, 32, generator=gen).to(device)
    samples = [
        ("rope", (q, k, pos, None, inv, 1.3, False, "bshd", 0, False)),
        ("rope", (q.transpose(1, 2), k.transpose(1, 2), pos[:, :1], None, inv.float(), 1.0, True, "bhsd", 5, True)),
        ("rope", (pq, pk, torch.randint(0, 50, (3, 7), generator=gen).to(device), None, inv, 1.0, False, "thd", 0,
                  False)),
        ("rope_", (q.clone(), k.clone(), pos, None, inv, 1.0, False, "bshd", 2, False)),
        ("rope_", (q.clone(), k.clone(), pos[0], None, inv, 1.0, True, "bshd", 0, False)),
    ]
    for name, args in samples:
        torch.library.opcheck(getattr(torch.ops.posenc, name).default, args)


# ------------------------------------------------------------------------------------------------
# Bad input: a message naming the argument, before anything is written


def _bad_setup():
    gen = torch.Generator().manual_seed(19)
    cfg = RopeConfig(head_dim=16, base=1e4, mrope_section=(2, 3, 3))
    q = torch.randn(2, 5, 4, 16, generator=gen)
    k = torch.randn(2, 5, 2, 16, generator=gen)
    return cfg, q, k


@pytest.mark.parametrize("call, match", [
    (lambda f, cfg, q, k: f(q, k, torch.zeros(2, 2, 5, dtype=torch.long), config=cfg),
     r"positions must have one row per axis of the layout \(3 axes"),
    (lambda f, cfg, q, k: f(q, k, torch.zeros(3, 2, 5, dtype=torch.long), config=RopeConfig(head_dim=16)),
     "positions .* have an axis dim, but the rotation has no axis layout"),
    (lambda f, cfg, q, k: f(q, k, torch.zeros(3, 2, 4, dtype=torch.long), config=cfg),
     r"positions must be \[seq\] = \[5\] or \[batch, seq\] = \[2, 5\] or \[3, batch or 1, seq\]"),
    (lambda f, cfg, q, k: f(q[0], k[0], None, config=cfg, layout="thd", cu_seqlens=torch.tensor([0, 2, 5])),
     "positions are required for layout 'thd' with an axis layout"),
    (lambda f, cfg, q, k: f(q[0], k[0], torch.zeros(2, 5, dtype=torch.long), config=cfg, layout="thd"),
     r"positions must have one row per axis"),
    (lambda f, cfg, q, k: f(q, k, None, inv_freq=cfg.inv_freq(), mrope_section=(2, 2, 2)),
     r"mrope_section \(2, 2, 2\) must be ints >= 0 summing to the pair count"),
    (lambda f, cfg, q, k: f(q, k, None, inv_freq=cfg.inv_freq(), mrope_interleaved=True),
     "mrope_interleaved=True needs mrope_section"),
    (lambda f, cfg, q, k: f(q, k, None, config=cfg, mrope_section=(2, 3, 3)),
     "do not pass mrope_section"),
    (lambda f, cfg, q, k: f(q, k, None, inv_freq=torch.zeros(2, 3, 8, dtype=torch.float64)),
     r"inv_freq must be \[rotary_dim / 2\] or, for an axis layout, \[axes, rotary_dim / 2\]"),
])
def test_bad_input_named_and_nothing_written(call, match):
    cfg, q, k = _bad_setup()
    for f in (pn.apply_rope, pn.apply_rope_):
        q0, k0 = q.clone(), k.clone()
        with pytest.raises((RuntimeError, ValueError), match=match):
            call(f, cfg, q, k)
        assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(mrope_section=(16, 24, 20)), r"'mrope_section' \(16, 24, 20\) sums to 60 pairs, but the rotation has "
                                       r"rotary_dim // 2 = 64 pairs"),
    (dict(mrope_section=(16, 24, 24), partial_rotary_factor=0.5), "sums to 64 pairs, but the rotation has"),
    (dict(mrope_interleaved=True), "'mrope_interleaved' needs 'mrope_section'"),
    (dict(mrope_section=(16, -1, 49)), "'mrope_section' must be a non-empty sequence of ints >= 0"),
    (dict(mrope_section=(16, 24, 24), mrope_interleaved="yes"), "'mrope_interleaved' must be a bool"),
])
def test_bad_config_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RopeConfig(head_dim=128, **kwargs)


def test_pair_axes_maps():
    """The exact maps of transformers' recompositions (checked above numerically), spelled out."""
    qwen2 = RopeConfig(head_dim=128, mrope_section=[16, 24, 24])
    assert qwen2.mrope_section == (16, 24, 24)
    assert qwen2.pair_axes == (0,) * 16 + (1,) * 24 + (2,) * 24
    qwen3 = RopeConfig(head_dim=128, mrope_section=(24, 20, 20), mrope_interleaved=True)
    assert qwen3.pair_axes[:7] == (0, 1, 2, 0, 1, 2, 0) and qwen3.pair_axes[57:] == (0, 1, 2, 0, 0, 0, 0)
    assert [qwen3.pair_axes.count(a) for a in range(3)] == [24, 20, 20]


def test_config_copies_and_cache():
    import copy
    import pickle

    cfg = RopeConfig(head_dim=128, base=5e6, mrope_section=[24, 20, 20], mrope_interleaved=True)
    op = cfg.op_inv_freq_on("cpu")
    assert cfg.op_inv_freq_on("cpu") is op  # cached, shared
    assert op.shape == (3, 64) and torch.equal(op.sum(0), cfg.inv_freq_on("cpu"))
    assert all(op[a, i] != 0 for i, a in enumerate(cfg.pair_axes)) and int((op != 0).sum()) == 64
    for other in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert other == cfg and hash(other) == hash(cfg) and other.pair_axes == cfg.pair_axes
        assert torch.equal(other.op_inv_freq_on("cpu"), op)
    plain = RopeConfig(head_dim=128)
    assert plain.op_inv_freq_on("cpu") is plain.inv_freq_on("cpu")  # no axis layout: the plain frequencies
