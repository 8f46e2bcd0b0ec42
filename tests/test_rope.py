"""Fused RoPE ops against an independent float64 rotation written here from the formulas."""
from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

import posenc_native as pn

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}
SEQ_DIM = {"bshd": 1, "bhsd": 2, "thd": 0}
HEAD_DIM = {"bshd": 2, "bhsd": 1, "thd": 1}


def default_inv_freq(rot: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)


def yarn_inv_freq(rot: int, base: float, factor: float, original: int, beta_fast=32.0, beta_slow=1.0):
    """YaRN frequencies and attention factor (docs/architecture.md, "Scaling schemes"), written out independently."""
    inv = default_inv_freq(rot, base)
    cdim = lambda r: rot * math.log(original / (2 * math.pi * r)) / (2 * math.log(base))  # noqa: E731
    lo, hi = max(math.floor(cdim(beta_fast)), 0), min(math.ceil(cdim(beta_slow)), rot - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(rot // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    return (inv / factor) * ramp + inv * (1 - ramp), 0.1 * math.log(factor) + 1.0


def token_positions(layout, batch, seq, positions, offset, cu_seqlens):
    """[B, S] float64 positions of every token, as the op defines them."""
    if positions is not None:
        pos = positions.to(torch.float64).cpu()
        pos = pos.expand(batch, seq) if pos.dim() == 2 else pos[None].expand(batch, seq)
        return pos + offset
    if cu_seqlens is not None:
        cu = cu_seqlens.cpu().tolist()
        pos = torch.empty(seq, dtype=torch.float64)
        for a, b in zip(cu[:-1], cu[1:]):
            pos[a:b] = torch.arange(b - a, dtype=torch.float64)
        return (pos + offset)[None]
    return (torch.arange(seq, dtype=torch.float64) + offset)[None].expand(batch, seq)


def ref_rotate(x, layout, pos_bs, inv_freq, attention_factor, interleaved, inverse=False):
    """Rotate x (any layout) in float64: pairs (i, i + R/2) or (2i, 2i+1); dims past R unchanged."""
    x64 = x.detach().to(torch.float64).cpu()
    if layout == "bhsd":
        x64 = x64.transpose(1, 2)
    if layout == "thd":
        x64 = x64[None]
    rot = 2 * inv_freq.numel()
    ang = pos_bs[..., None] * inv_freq.to(torch.float64).cpu()  # [B, S, R/2]
    if inverse:
        ang = -ang
    c = (torch.cos(ang) * attention_factor)[:, :, None, :]
    s = (torch.sin(ang) * attention_factor)[:, :, None, :]
    out = x64.clone()
    if interleaved:
        a, b = x64[..., 0:rot:2], x64[..., 1:rot:2]
        out[..., 0:rot:2], out[..., 1:rot:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x64[..., : rot // 2], x64[..., rot // 2 : rot]
        out[..., : rot // 2], out[..., rot // 2 : rot] = a * c - b * s, b * c + a * s
    if layout == "thd":
        out = out[0]
    if layout == "bhsd":
        out = out.transpose(1, 2)
    return out


def rel_err(out, truth):
    return float((out.double().cpu() - truth).norm() / truth.norm().clamp_min(1e-300))


def make_qk(layout, batch, seq, hq, hk, head_dim, dtype, device, gen, fused=False):
    """Random q and k; with fused=True they are strided views into one qkv projection output."""
    if fused:  # [B, S, hq + 2*hk, D] like a fused projection; q/k are head slices
        if layout == "thd":
            qkv = torch.randn(seq, hq + 2 * hk, head_dim, generator=gen, dtype=torch.float64)
            q, k = qkv[:, :hq], qkv[:, hq:hq + hk]
        else:
            qkv = torch.randn(batch, seq, hq + 2 * hk, head_dim, generator=gen, dtype=torch.float64)
            q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
            if layout == "bhsd":
                q, k = q.transpose(1, 2), k.transpose(1, 2)
        qkv = qkv.to(device=device, dtype=dtype)
        if layout == "thd":
            return qkv[:, :hq], qkv[:, hq:hq + hk]
        q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
        return (q.transpose(1, 2), k.transpose(1, 2)) if layout == "bhsd" else (q, k)
    shape = {"bshd": lambda h: (batch, seq, h, head_dim), "bhsd": lambda h: (batch, h, seq, head_dim),
             "thd": lambda h: (seq, h, head_dim)}[layout]
    q = torch.randn(shape(hq), generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    k = torch.randn(shape(hk), generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    return q, k


@st.composite
def rope_cases(draw):
    layout = draw(st.sampled_from(["bshd", "bhsd", "thd"]))
    head_dim = draw(st.sampled_from([2, 4, 6, 8, 16, 32, 64, 80, 96, 128]))
    rot = draw(st.sampled_from(sorted({head_dim, max(2, (head_dim // 2) // 2 * 2), 2})))
    return dict(
        layout=layout,
        batch=1 if layout == "thd" else draw(st.integers(1, 3)),
        seq=draw(st.integers(1, 9)),
        hq=draw(st.integers(1, 4)),
        hk=draw(st.integers(0, 3)),
        head_dim=head_dim,
        rot=rot,
        dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64])),
        interleaved=draw(st.booleans()),
        pos_kind=draw(st.sampled_from(["none", "seq", "batch_seq", "packed"])),
        pos_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        offset=draw(st.integers(0, 5000)),
        scaling=draw(st.sampled_from(["default", "linear", "yarn", "float32_inv_freq"])),
        fused=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def inv_freq_for(scaling, rot):
    if scaling == "default":
        return default_inv_freq(rot), 1.0
    if scaling == "linear":
        return default_inv_freq(rot, 500000.0) / 8.0, 1.0
    if scaling == "yarn":
        return yarn_inv_freq(rot, 10000.0, 4.0, 64)
    return default_inv_freq(rot).float(), 1.0


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rope_cases())
def test_rope_matches_float64_reference(device, case):
    gen = torch.Generator().manual_seed(case["seed"])
    layout, seq, batch = case["layout"], case["seq"], case["batch"]
    q, k = make_qk(layout, batch, seq, case["hq"], case["hk"], case["head_dim"], case["dtype"], device, gen,
                   fused=case["fused"])
    positions = cu_seqlens = None
    if case["pos_kind"] == "seq":
        positions = torch.randint(0, 1 << 16, (seq,), generator=gen).to(device, case["pos_dtype"])
    elif case["pos_kind"] == "batch_seq" and layout != "thd":
        positions = torch.randint(0, 1 << 16, (batch, seq), generator=gen).to(device, case["pos_dtype"])
    elif case["pos_kind"] == "packed" and layout == "thd":
        cuts = sorted(torch.randint(0, seq + 1, (2,), generator=gen).tolist())
        cu_seqlens = torch.tensor([0, *cuts, seq], dtype=case["pos_dtype"], device=device)
    inv_freq, attn = inv_freq_for(case["scaling"], case["rot"])
    k_in = k if case["hk"] > 0 else None
    q_before, k_before = q.clone(), k.clone()

    q_out, k_out = pn.apply_rope(q, k_in, positions, inv_freq=inv_freq.to(device), attention_factor=attn,
                                 interleaved=case["interleaved"], layout=layout, offset=case["offset"],
                                 cu_seqlens=cu_seqlens)
    pos_bs = token_positions(layout, batch, seq, positions, case["offset"], cu_seqlens)
    tol = TOL[case["dtype"]]
    assert q_out.dtype == q.dtype and q_out.shape == q.shape
    assert rel_err(q_out, ref_rotate(q, layout, pos_bs, inv_freq, attn, case["interleaved"])) <= tol
    if k_in is not None:
        assert rel_err(k_out, ref_rotate(k, layout, pos_bs, inv_freq, attn, case["interleaved"])) <= tol
    else:
        assert k_out is None
    # Out of place leaves its inputs untouched ...
    assert torch.equal(q, q_before) and torch.equal(k, k_before)
    # ... and in place gives the same bits.
    q2, k2 = q.clone(), k.clone()
    pn.apply_rope_(q2, k2 if k_in is not None else None, positions, inv_freq=inv_freq.to(device),
                   attention_factor=attn, interleaved=case["interleaved"], layout=layout, offset=case["offset"],
                   cu_seqlens=cu_seqlens)
    assert torch.equal(q2, q_out)
    if k_in is not None:
        assert torch.equal(k2, k_out)


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_on_fused_qkv_views_leaves_v_alone(device):
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 7, 4 + 2 + 2, 64, generator=gen).to(device)
    before = qkv.clone()
    q, k, v = qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
    inv = default_inv_freq(64).to(device)
    pn.apply_rope_(q, k, inv_freq=inv)
    pos = token_positions("bshd", 2, 7, None, 0, None)
    assert rel_err(qkv[:, :, :4], ref_rotate(before[:, :, :4], "bshd", pos, inv, 1.0, False)) <= 1e-6
    assert rel_err(qkv[:, :, 4:6], ref_rotate(before[:, :, 4:6], "bshd", pos, inv, 1.0, False)) <= 1e-6
    assert torch.equal(v, before[:, :, 6:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("view", ["transposed", "every_other"])
def test_out_of_place_takes_a_strided_last_dim(device, dtype, view):
    """Out-of-place rotations take q and k whose last dim is not contiguous (transformers' own
    rotation does: ZAYA's q is a transposed conv output); they rotate a row-major copy. In place,
    such a q is refused before anything is written."""
    gen = torch.Generator().manual_seed(11)

    def strided(heads):  # [B, H, S, D] with stride(-1) != 1
        if view == "transposed":
            buf = torch.randn(2, heads, 16, 9, generator=gen, dtype=torch.float64)
            return buf.to(device, dtype).transpose(-1, -2)
        return torch.randn(2, heads, 9, 32, generator=gen, dtype=torch.float64).to(device, dtype)[..., ::2]

    q, k = strided(4), strided(2)
    assert q.stride(-1) != 1 and k.stride(-1) != 1
    inv = default_inv_freq(16).to(device)
    pos = torch.randint(0, 5000, (2, 9), generator=gen).to(device)
    q_out, k_out = pn.apply_rope(q, k, pos, inv_freq=inv, layout="bhsd")
    pos_bs = token_positions("bhsd", 2, 9, pos, 0, None)
    assert rel_err(q_out, ref_rotate(q, "bhsd", pos_bs, inv, 1.0, False)) <= TOL[dtype]
    assert rel_err(k_out, ref_rotate(k, "bhsd", pos_bs, inv, 1.0, False)) <= TOL[dtype]
    assert q_out.is_contiguous() and k_out.is_contiguous()
    q_c, k_c = pn.apply_rope(q.contiguous(), k.contiguous(), pos, inv_freq=inv, layout="bhsd")
    assert torch.equal(q_out, q_c) and torch.equal(k_out, k_c)
    # the cos/sin form (the transformers drop-in) and the fake kernel (torch.compile) agree
    cos, sin = torch.randn(2, 2, 9, 16, generator=gen).to(device)
    got = pn.apply_rotary_pos_emb(q, k, cos, sin)
    want = pn.apply_rotary_pos_emb(q.contiguous(), k.contiguous(), cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    compiled = torch.compile(lambda q, k: pn.apply_rope(q, k, pos, inv_freq=inv, layout="bhsd"), fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(q, k)[0], q_out)
    q_before = q.clone()
    with pytest.raises(RuntimeError, match="q must have a contiguous last dimension"):
        pn.apply_rope_(q, k, pos, inv_freq=inv, layout="bhsd")
    assert torch.equal(q, q_before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_precision_at_long_positions(device, interleaved):
    """float32 output within 2e-6 of float64 truth for positions up to 2^24 (unit-norm pairs)."""
    gen = torch.Generator().manual_seed(11)
    seq, head_dim = 512, 128
    positions = torch.randint(0, 1 << 24, (seq,), generator=gen)
    positions[:4] = torch.tensor([0, (1 << 24) - 1, 1 << 20, 131071])
    ang = torch.rand(1, seq, 2, head_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    q64 = torch.cat([ang.cos(), ang.sin()], dim=-1)  # each (i, i + D/2) pair has unit norm
    if interleaved:
        q64 = torch.stack([ang.cos(), ang.sin()], dim=-1).flatten(-2)
    inv = default_inv_freq(head_dim)
    q = q64.float().to(device)
    q_out, _ = pn.apply_rope(q, positions=positions.to(device), inv_freq=inv.to(device), interleaved=interleaved)
    truth = ref_rotate(q, "bshd", token_positions("bshd", 1, seq, positions, 0, None), inv, 1.0, interleaved)
    assert (q_out.double().cpu() - truth).abs().max().item() <= 2e-6


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("start", [994095, (1 << 23) + 12345])
@pytest.mark.parametrize("by_offset", [True, False])
def test_float64_rows_as_exact_as_their_float64_angles(interleaved, start, by_offset):
    """float64 output against the exact rotation (mpmath, 200 bits, by the binary values of inv_freq):
    within half an ulp of the largest angle, the rounding of ``position * inv_freq`` itself, at
    positions where that exceeds the 1e-12 bound; consecutive positions (float64 rows are each
    evaluated directly on the CPU; the float32 rows past an anchor are rotated from it)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 200
    gen = torch.Generator().manual_seed(start % 1000 + interleaved)
    seq, head_dim = 20, 32
    q = torch.randn(1, seq, 2, head_dim, generator=gen, dtype=torch.float64)
    inv = default_inv_freq(head_dim)
    positions = torch.arange(start, start + seq)
    q_out, _ = (pn.apply_rope(q, offset=start, inv_freq=inv, interleaved=interleaved) if by_offset else
                pn.apply_rope(q, positions=positions, inv_freq=inv, interleaved=interleaved))
    half = head_dim // 2
    pair = ((lambda i: (2 * i, 2 * i + 1)) if interleaved else (lambda i: (i, i + half)))
    exact = torch.empty_like(q)
    for s in range(seq):
        for i in range(half):
            angle = mpmath.mpf(int(positions[s])) * mpmath.mpf(float(inv[i]))
            c, sn = mpmath.cos(angle), mpmath.sin(angle)
            a, b = pair(i)
            for h in range(q.shape[2]):
                x1, x2 = mpmath.mpf(float(q[0, s, h, a])), mpmath.mpf(float(q[0, s, h, b]))
                exact[0, s, h, a], exact[0, s, h, b] = float(x1 * c - x2 * sn), float(x2 * c + x1 * sn)
    err = ((q_out - exact).norm() / exact.norm()).item()
    assert err <= 2.0 ** -53 * (start + seq) + 1e-15, err


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rotary_pos_emb_matches_transformers(device, unsqueeze_dim, dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    gen = torch.Generator().manual_seed(5)
    B, H, Hk, S, D = 2, 4, 2, 9, 64
    shape = (lambda h: (B, h, S, D)) if unsqueeze_dim == 1 else (lambda h: (B, S, h, D))
    q = torch.randn(shape(H), generator=gen).to(device, dtype)
    k = torch.randn(shape(Hk), generator=gen).to(device, dtype)
    pos = torch.randint(0, 4096, (B, S), generator=gen).double()
    freqs = pos[..., None] * default_inv_freq(D)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = (emb.cos() * 1.2).to(device, dtype), (emb.sin() * 1.2).to(device, dtype)
    ours = pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    theirs = hf_apply(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim)
    for o, t in zip(ours, theirs):
        assert o.dtype == dtype
        assert rel_err(o, t.cpu()) <= TOL[dtype]


def test_apply_rotary_pos_emb_cos_sin_with_distinct_halves_and_position_ids():
    """A general table (halves differ) follows transformers' formula; 2-D tables are gathered by
    position_ids (the older transformers convention)."""
    from transformers.models.llama.modeling_llama import rotate_half

    gen = torch.Generator().manual_seed(9)
    B, H, S, D, R = 2, 3, 5, 16, 12
    q = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, 1, S, D, generator=gen, dtype=torch.float64)
    table_cos = torch.randn(40, R, generator=gen, dtype=torch.float64)
    table_sin = torch.randn(40, R, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 40, (B, S), generator=gen)
    q_out, k_out = pn.apply_rotary_pos_emb(q, k, table_cos, table_sin, position_ids=pos)
    cos, sin = table_cos[pos][:, None], table_sin[pos][:, None]
    for x, out in ((q, q_out), (k, k_out)):
        rot = x[..., :R] * cos + rotate_half(x[..., :R]) * sin
        torch.testing.assert_close(out[..., :R], rot, rtol=1e-12, atol=1e-12)
        assert torch.equal(out[..., R:], x[..., R:])


# Every fp16 bit pattern (zeros, subnormals, normals, infinities, NaNs) once as a cos entry and once
# as a q element, on the path this CPU takes and on the portable one (whose loops convert fp16 with
# csrc/core/common.h's to_math). With sin = 0 every product is exact in float32 and float64 alike,
# so the op's fp16 outputs must equal the formula's in float64, rounded once.
_EVERY_FP16 = r"""
import torch, posenc_native as pn
from transformers.models.llama.modeling_llama import rotate_half
g = torch.Generator().manual_seed(11)
every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(1, 512, 128)
other = torch.randn(1, 512, 128, generator=g).half()
sin = torch.zeros(1, 512, 128, dtype=torch.float16)
for q, cos in ((other, every), (every, other)):
    q = q[:, None]  # [batch, heads, seq, head_dim], the tables [batch, seq, head_dim]
    out, _ = pn.apply_rotary_pos_emb(q, q, cos, sin)
    want = (q.double() * cos[:, None].double() + rotate_half(q.double()) * sin[:, None].double()).half()
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
print(pn.build_info()["cpu_isa"])
"""


@pytest.mark.parametrize("path", ["native", "portable"])
def test_every_fp16_value_through_the_table_path(path):
    env = dict(os.environ)
    env.pop("POSENC_CPU_ISA", None)
    if path == "portable":
        env["POSENC_CPU_ISA"] = "portable"
    proc = subprocess.run([sys.executable, "-c", _EVERY_FP16], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert path == "native" or proc.stdout.split()[-1] == "portable"


def test_gradcheck_rope_and_cos_sin():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 5, 3, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 1, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    inv, attn = yarn_inv_freq(8, 10000.0, 4.0, 16)
    for interleaved in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k: pn.apply_rope(q, k, inv_freq=inv, attention_factor=attn, interleaved=interleaved,
                                       offset=3), (q, k))
    cos = torch.randn(2, 5, 12, generator=gen, dtype=torch.float64)
    sin = torch.randn(2, 5, 12, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda q, k: pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2), (q, k))
    # Only q used downstream: k's gradient is zero, q's still right.
    q_out, _ = pn.apply_rope(q, k, inv_freq=inv, attention_factor=attn)
    q_out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))


def _opcheck_samples(device):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 4, 32, generator=gen).to(device)
    k = torch.randn(2, 6, 2, 32, generator=gen).to(device)
    inv = default_inv_freq(24).to(device)
    pos = torch.randint(0, 100, (2, 6), generator=gen).to(device)
    cos = torch.randn(2, 6, 32, generator=gen).to(device)
    sin = torch.randn(2, 6, 32, generator=gen).to(device)
    packed_q = torch.randn(7, 4, 32, generator=gen).to(device)
    packed_k = torch.randn(7, 2, 32, generator=gen).to(device)
    cu = torch.tensor([0, 3, 7], device=device)
    return [
        ("rope", (q, k, pos, None, inv, 1.3, False, "bshd", 0, False)),
        ("rope", (q.transpose(1, 2), k.transpose(1, 2), None, None, inv.float(), 1.0, True, "bhsd", 5, True)),
        ("rope", (packed_q, packed_k, None, cu, inv, 1.0, False, "thd", 0, False)),
        ("rope_", (q.clone(), k.clone(), pos, None, inv, 1.0, False, "bshd", 2, False)),
        ("rope_cos_sin", (q.transpose(1, 2), k.transpose(1, 2), cos, sin, None, "bhsd", False)),
        ("rope_cos_sin_", (q.clone(), k.clone(), cos, sin, None, "bshd", False)),
        # a strided last dim: the out-of-place ops return row-major outputs, as their fake kernels say
        ("rope", (q[..., ::2], k.mT.contiguous().mT[..., :16], pos, None, default_inv_freq(16).to(device), 1.0, False,
                  "bshd", 0, False)),
        ("rope_cos_sin", (q.mT.contiguous().mT, k.mT.contiguous().mT, cos, sin, None, "bshd", False)),
        ("rope_in_place_check", (packed_q[:, :2], packed_q[:, 2:], inv)),  # (q and k apart: a copy of inv)
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for name, args in _opcheck_samples(device):
        op = getattr(torch.ops.posenc, name).default
        torch.library.opcheck(op, args)


# ------------------------------------------------------------------------------------------------
# Bad input: a clear message, and every tensor unchanged.


def _bad_cases():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 5, 4, 16, generator=gen)
    k = torch.randn(2, 5, 2, 16, generator=gen)
    inv = default_inv_freq(16)
    return q, k, inv


@pytest.mark.parametrize("mutate, match", [
    (lambda q, k, inv: dict(k=k.double()), "k must have q's dtype"),
    (lambda q, k, inv: dict(k=k.to("meta")), "k must be on the same device as q"),
    (lambda q, k, inv: dict(k=torch.randn(2, 5, 2, 8)), "k must match q in batch, seq and head_dim"),
    (lambda q, k, inv: dict(inv_freq=default_inv_freq(18)), "inv_freq has 9 frequencies"),
    (lambda q, k, inv: dict(inv_freq=inv.half()), "inv_freq must be float32 or float64"),
    (lambda q, k, inv: dict(positions=torch.arange(4)), r"positions must be \[seq\] = \[5\]"),
    (lambda q, k, inv: dict(positions=torch.arange(5.0)), "positions must be int32 or int64"),
    (lambda q, k, inv: dict(positions=torch.zeros(3, 5, dtype=torch.long)), r"\[batch, seq\] = \[2, 5\]"),
    (lambda q, k, inv: dict(layout="sbhd"), "layout must be one of"),
    (lambda q, k, inv: dict(q=q.int()), "q must be float32, float16, bfloat16 or float64"),
    (lambda q, k, inv: dict(attention_factor=float("nan")), "attention_factor must be finite"),
])
def test_bad_input_message_and_nothing_written(mutate, match):
    q, k, inv = _bad_cases()
    args = dict(q=q, k=k, inv_freq=inv, positions=None, layout="bshd", attention_factor=1.0)
    args.update(mutate(q, k, inv))
    snapshots = {n: v.clone() for n, v in args.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    for fn in (pn.apply_rope, pn.apply_rope_):
        with pytest.raises((RuntimeError, ValueError), match=match):
            fn(args["q"], args["k"], args["positions"], inv_freq=args["inv_freq"], layout=args["layout"],
               attention_factor=args["attention_factor"])
        for n, before in snapshots.items():
            assert torch.equal(args[n], before), f"{n} changed after a rejected call"


@pytest.mark.parametrize("rotary_dim, match", [(7, "rotary_dim must be even"), (18, "rotary_dim must be even"),
                                               (8, "inv_freq has 8 frequencies")])
def test_bad_rotary_dim(rotary_dim, match):
    q, k, inv = _bad_cases()
    with pytest.raises(ValueError, match=match):
        pn.apply_rope(q, k, inv_freq=inv, rotary_dim=rotary_dim)


@pytest.mark.parametrize("cu, match", [
    ([0, 4, 3, 7], "cu_seqlens must be non-decreasing"),
    ([0, 3, 6], "cu_seqlens must end at the number of tokens 7"),
    ([1, 3, 7], "cu_seqlens must start at 0"),
])
def test_bad_cu_seqlens_leaves_packed_tensors_unchanged(cu, match):
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(7, 4, 16, generator=gen)
    k = torch.randn(7, 2, 16, generator=gen)
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(RuntimeError, match=match):
        pn.apply_rope_(q, k, inv_freq=default_inv_freq(16), layout="thd", cu_seqlens=torch.tensor(cu))
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_inplace_rejects_overlapping_q_and_k_and_grad():
    q, _, inv = _bad_cases()
    with pytest.raises(RuntimeError, match="q and k must not share memory"):
        pn.apply_rope_(q, q, inv_freq=inv)
    # torch's rule for in-place ops (issue 8): a leaf that requires grad is refused under grad mode
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad is being used in an in-place operation"):
        pn.apply_rope_(q.clone().requires_grad_(), inv_freq=inv)


def test_rotary_embedding_module_matches_reference():
    gen = torch.Generator().manual_seed(12)
    cfg = pn.RopeConfig(head_dim=32)
    mod = pn.RotaryEmbedding(cfg)
    q = torch.randn(2, 6, 4, 32, generator=gen)
    k = torch.randn(2, 6, 2, 32, generator=gen)
    q_out, k_out = mod(q, k, offset=10)
    pos = token_positions("bshd", 2, 6, None, 10, None)
    inv = cfg.inv_freq()
    assert rel_err(q_out, ref_rotate(q, "bshd", pos, inv, cfg.attention_factor, cfg.interleaved)) <= 1e-5
    assert rel_err(k_out, ref_rotate(k, "bshd", pos, inv, cfg.attention_factor, cfg.interleaved)) <= 1e-5


def _preset_configs():
    """Every scaling type, from the built-in presets (per-layer ones by layer type) plus linear."""
    from posenc_native.config import PRESETS, RopeConfig, hf_layer_types

    out = []
    for name, hf in PRESETS.items():
        for layer_type in (hf_layer_types(hf) or [None]):
            out.append((f"{name}/{layer_type}" if layer_type else name, RopeConfig.from_hf(hf, layer_type=layer_type)))
    out.append(("linear", RopeConfig.from_hf({"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e4,
                                             "partial_rotary_factor": 0.5,
                                             "rope_scaling": {"rope_type": "linear", "factor": 4.0}})))
    return out


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU")
@pytest.mark.parametrize("context", ["plain", "torch.device", "external stream"])
def test_cuda_cached_frequencies_outlive_a_read_queued_on_another_stream(context):
    """Dynamic NTK caches a frequency tensor per sequence length and drops them all at the 17th. A
    rotation queued on a second stream still reads its dropped tensor correctly: the cache recorded
    that stream on it (_tensor_cache.read_from_cache), so its block was not handed out again on the
    stream that made it (which refills it at once here) before the read; a stream that
    torch.cuda.ExternalStream wraps is not recorded (its owner may destroy it first): the drop
    waits for the device instead."""
    cfg = pn.RopeConfig(head_dim=64, max_position_embeddings=8, scaling={"rope_type": "dynamic", "factor": 2.0})
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    q = torch.randn(1, 40, 2, 64, generator=gen)
    k = torch.randn(1, 40, 1, 64, generator=gen)
    want_q, want_k = pn.reference.apply_rope(q.double(), k.double(), config=cfg)  # length 40
    q, k = q.cuda(), k.cuda()
    pn.apply_rope(q, k, config=cfg)  # caches the length-40 frequencies, made on the default stream
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    if context == "external stream":
        side = torch.cuda.ExternalStream(side.cuda_stream)
    with torch.cuda.stream(side), (torch.device("cuda") if context == "torch.device" else contextlib.nullcontext()):
        torch.cuda._sleep(1 << 28)  # about 0.1 s: the rotation below waits behind it
        got_q, got_k = pn.apply_rope(q, k, config=cfg)  # (a torch.device block: a torch function mode)
    for n in range(41, 42 + cfg._frequencies.MAX_ENTRIES):  # new lengths: the cache drops the length-40 entry
        pn.apply_rope(q[:, :1], k[:, :1], config=cfg, offset=n - 1)
    junk = [torch.full((32,), math.nan, dtype=torch.float64, device="cuda") for _ in range(256)]
    side.synchronize()
    assert rel_err(got_q, want_q) <= TOL[torch.float32] and rel_err(got_k, want_k) <= TOL[torch.float32]
    del junk


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU")
def test_cuda_graph_replays_frequencies_its_config_has_dropped():
    """A CUDA graph captured with a dynamic NTK config reads that length's cached frequencies by
    address at every replay: after 17 more lengths drop them from the cache and their block is
    refilled, a replay still gives the reference's result (the cache keeps what a capture read)."""
    cfg = pn.RopeConfig(head_dim=64, max_position_embeddings=8, scaling={"rope_type": "dynamic", "factor": 2.0})
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    q = torch.randn(1, 40, 2, 64, generator=gen)
    want, _ = pn.reference.apply_rope(q.double(), None, config=cfg)
    static_q = q.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up (fills the cache) on a side stream, as torch.cuda.graphs asks
            out, _ = pn.apply_rope(static_q, None, config=cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = pn.apply_rope(static_q, None, config=cfg)
    for n in range(41, 42 + cfg._frequencies.MAX_ENTRIES):  # the length-40 entry is dropped
        pn.apply_rope(static_q[:, :1], None, config=cfg, offset=n - 1)
    with torch.cuda.stream(side):  # the block was the warm-up's, made on side: reused there first
        junk = [torch.full((32,), math.nan, dtype=torch.float64, device="cuda") for _ in range(256)]
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, want) <= TOL[torch.float32]
    del junk


_DESTROYED_EXTERNAL_STREAM = """
import ctypes, gc, sys, torch, posenc_native as pn
torch.cuda.init()
cudart = ctypes.CDLL(next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart.so" in line))
raw = ctypes.c_void_p()
assert cudart.cudaStreamCreate(ctypes.byref(raw)) == 0
cfg = pn.RopeConfig(head_dim=64, max_position_embeddings=8, scaling={"rope_type": "dynamic", "factor": 2.0})
q = torch.randn(1, 40, 2, 64, device="cuda")
pn.apply_rope(q, None, config=cfg)  # caches the length-40 frequencies, made on the default stream
with torch.cuda.stream(torch.cuda.ExternalStream(raw.value)):
    out, _ = pn.apply_rope(q, None, config=cfg)
torch.cuda.synchronize()
want, _ = pn.reference.apply_rope(q.double().cpu(), None, config=cfg)
assert cudart.cudaStreamDestroy(raw) == 0  # its owner is done with it
for n in range(41, 42 + cfg._frequencies.MAX_ENTRIES):  # the cache drops the length-40 tensor
    pn.apply_rope(q[:, :1], None, config=cfg, offset=n - 1)
del cfg
gc.collect()
torch.cuda.synchronize()
print("max error", float((out.cpu().double() - want).abs().max()))
"""


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU")
def test_cuda_cached_frequencies_freed_after_their_external_stream_is_destroyed():
    """A stream wrapped by torch.cuda.ExternalStream belongs to its owner, who may destroy it while
    a config it read still caches the frequencies: their free must not record an event on the dead
    stream (a record_stream on it did: an error inside the allocator's free, which aborts the
    process). Run in a child process, which would abort."""
    package_root = os.path.dirname(os.path.dirname(pn.__file__))  # (the child imports this posenc_native)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _DESTROYED_EXTERNAL_STREAM], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) <= 1e-4, done.stdout  # (absolute, on randn q)


def test_fake_cuda_tensors_trace_on_any_machine():
    """Tracing for a GPU with fake CUDA tensors (as torch.export does for a GPU target, on a machine
    that may have none): the frequencies made for the trace are not cached, and nothing asks the
    CUDA runtime for a stream (the cache's stream record once did, and failed without a GPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = pn.RopeConfig(head_dim=16, max_position_embeddings=8, scaling={"rope_type": "dynamic", "factor": 2.0})
    with FakeTensorMode():
        q = torch.empty(2, 12, 2, 16, device="cuda")
        k = torch.empty(2, 12, 1, 16, device="cuda")
        for kw in (dict(config=cfg), dict(inv_freq=torch.ones(8, dtype=torch.float64, device="cuda"),
                                          mrope_section=(3, 3, 2))):
            q_out, k_out = pn.apply_rope(q, k, **kw)
            assert q_out.device.type == "cuda" and q_out.shape == q.shape and k_out.shape == k.shape
    assert not len(cfg._frequencies._cache)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, cfg", _preset_configs(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
def test_every_scaling_type_matches_reference(device, name, cfg, long):
    """config= path of apply_rope (frequencies, temperature, pairing, partial rotary, seq_len for
    dynamic/longrope) against reference.apply_rope in float64, at short and long positions."""
    gen = torch.Generator().manual_seed(abs(hash(name)) % (2**31))
    seq = 11
    q = torch.randn(2, seq, 4, cfg.head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(2, seq, 2, cfg.head_dim, generator=gen, dtype=torch.float64)
    top = 200_000 if long else 1000  # past original_max_position_embeddings: longrope/dynamic switch
    positions = torch.randint(0, top, (2, seq), generator=gen)
    for dtype in (torch.float32, torch.float64):
        q_out, k_out = pn.apply_rope(q.to(device, dtype), k.to(device, dtype), positions.to(device), config=cfg)
        rq, rk = pn.reference.apply_rope(q.to(dtype), k.to(dtype), positions, cfg)
        assert rel_err(q_out, rq.double()) <= TOL[dtype] * (10 if dtype == torch.float64 else 1)
        assert rel_err(k_out, rk.double()) <= TOL[dtype] * (10 if dtype == torch.float64 else 1)
