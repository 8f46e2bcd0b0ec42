"""Adversarial inputs (issue 8): no silent wrong answers. Each class of bad input either gives the
float64 reference's result or a clear error naming the argument, and an error leaves every tensor
unchanged. Classes: 1 aliasing/overlap, 2 strided metadata, 3 in-place autograd, 5 integer overflow
and the position domain, 7 error quality, 8 reference/op agreement on add_sinusoidal's offset.
(Thread-count determinism, class 4, and thread safety, class 6, have their own tests.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import posenc_native as pn
from posenc_native import reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
HYP = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
MAX_POSITION = 2 ** 48


def inv_freq(rot: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)


def rel_err(out: torch.Tensor, truth: torch.Tensor) -> float:
    return float((out.double().cpu() - truth.double().cpu()).norm() / truth.double().cpu().norm().clamp_min(1e-300))


def addresses(t: torch.Tensor) -> set[int]:
    """Byte addresses of every element of t (brute force, for small tensors)."""
    if t.numel() == 0:
        return set()
    item = t.element_size()
    idx = torch.zeros(t.shape, dtype=torch.int64)
    for d in range(t.dim()):
        shape = [1] * t.dim()
        shape[d] = t.shape[d]
        idx = idx + torch.arange(t.shape[d]).view(shape) * t.stride(d)
    base = t.data_ptr()
    return {base + int(i) * item + b for i in idx.flatten() for b in range(item)}


def self_overlaps(t: torch.Tensor) -> bool:
    n = t.numel()
    return len(addresses(t)) < n * t.element_size()


# ------------------------------------------------------------------------------------------------
# 1. Overlap and aliasing


@st.composite
def packed_views(draw):
    """q and k as as_strided views ([T, H, D], thd) of one float64 buffer: disjoint, interleaved,
    partially overlapping or self-overlapping, decided by the strides drawn."""
    T, D = draw(st.integers(1, 4)), draw(st.sampled_from([4, 8]))

    def view():
        H = draw(st.integers(1, 3))
        sh = draw(st.sampled_from([D, 2 * D, D + 3, max(1, D // 2), 1]))
        st_ = draw(st.sampled_from([H * sh, H * sh + 5, 2 * H * sh, max(1, sh - 1), D]))
        off = draw(st.integers(0, 120))
        return (T, H, D), (st_, sh, 1), off

    return view(), view(), draw(st.booleans())


@HYP
@given(case=packed_views())
def test_inplace_overlap_decided_exactly(case):
    """rope_ and rope_cos_sin_ reject exactly the q/k that share a byte (each other or themselves),
    including the non-dense overlaps torch calls TooHard; everything else is rotated correctly.
    rope_in_place_check (compiled code's check before a copy-back) decides alike."""
    (qs, qst, qo), (ks, kst, ko), use_table = case
    buf = torch.randn(1024, dtype=torch.float64, generator=torch.Generator().manual_seed(qo * 131 + ko))
    q, k = buf.as_strided(qs, qst, qo), buf.as_strided(ks, kst, ko)
    aq, ak = addresses(q), addresses(k)
    overlapping = bool(aq & ak) or self_overlaps(q) or self_overlaps(k)
    before = buf.clone()
    inv = inv_freq(qs[-1])
    pos = torch.randint(0, 1000, (qs[0],), generator=torch.Generator().manual_seed(7))
    cos, sin = reference.rope_angles(pos, inv).cos().repeat(1, 2), reference.rope_angles(pos, inv).sin().repeat(1, 2)
    q_ref, k_ref = reference.apply_rope(q.clone(), k.clone(), pos, layout="thd", inv_freq=inv)

    def run():
        if use_table:
            torch.ops.posenc.rope_cos_sin_(q, k, cos, sin, None, "thd", False)
        else:
            pn.apply_rope_(q, k, pos, inv_freq=inv, layout="thd")

    def check():  # what compiled apply_rope_ checks before it copies a rotation back (ops.py)
        checked = torch.ops.posenc.rope_in_place_check(q, k, inv)
        assert torch.equal(checked, inv) and checked.data_ptr() != inv.data_ptr()

    if overlapping:
        for refused in (check, run):
            with pytest.raises(RuntimeError, match="share memory|elements that share memory"):
                refused()
        assert torch.equal(buf, before), "a rejected call wrote"
    else:
        check()
        run()
        assert rel_err(q, q_ref) <= 1e-12 and rel_err(k, k_ref) <= 1e-12


@pytest.mark.parametrize("device", DEVICES)
def test_issue_example_nondense_overlap_rejected(device):
    b = torch.randn(2, 4, 8, 8, device=device)
    before = b.clone()
    inv = inv_freq(8).to(device)
    with pytest.raises(RuntimeError, match="q and k must not share memory"):
        pn.apply_rope_(b[:, :, 0:4], b[:, :, 2:6], inv_freq=inv)
    cos, sin = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    with pytest.raises(RuntimeError, match="q and k must not share memory"):
        torch.ops.posenc.rope_cos_sin_(b[:, :, 0:4], b[:, :, 2:6], cos, sin, None, "bshd", False)
    assert torch.equal(b, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
def test_fused_qkv_views_accepted_in_place(device, layout):
    """Interleaved but disjoint: views of one qkv projection rotate in place, v untouched."""
    g = torch.Generator().manual_seed(3)
    if layout == "thd":
        qkv = torch.randn(9, 3, 4, 16, generator=g, dtype=torch.float64).to(device)
        q, k, v = qkv[:, 0], qkv[:, 1, :2], qkv[:, 2]
        pos = torch.randint(0, 500, (9,), generator=g).to(device)
    else:
        qkv = torch.randn(2, 7, 3, 4, 16, generator=g, dtype=torch.float64).to(device)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1, :2], qkv[:, :, 2]
        if layout == "bhsd":
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        pos = torch.randint(0, 500, (2, 7), generator=g).to(device)
    inv = inv_freq(12).to(device)
    q_ref, k_ref = reference.apply_rope(q.cpu(), k.cpu(), pos.cpu(), layout=layout, inv_freq=inv.cpu())
    v0 = v.clone()
    pn.apply_rope_(q, k, pos, inv_freq=inv, layout=layout)
    assert rel_err(q, q_ref) <= 1e-12 and rel_err(k, k_ref) <= 1e-12
    assert torch.equal(v, v0)


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_output_rejected_in_place_but_fine_out_of_place(device):
    q = torch.randn(1, 1, 2, 8, dtype=torch.float64, device=device).expand(3, 5, 2, 8)
    inv = inv_freq(8).to(device)
    with pytest.raises(RuntimeError, match="q must not have elements that share memory"):
        pn.apply_rope_(q, inv_freq=inv)
    out, _ = pn.apply_rope(q, inv_freq=inv)
    ref, _ = reference.apply_rope(q.cpu(), inv_freq=inv.cpu())
    assert rel_err(out, ref) <= 1e-12
    # a self-overlapping as_strided view that is not an expand (rows overlap by half)
    buf = torch.randn(100, dtype=torch.float64, device=device)
    with pytest.raises(RuntimeError, match="q must not have elements that share memory"):
        pn.apply_rope_(buf.as_strided((1, 6, 1, 8), (48, 4, 8, 1)), inv_freq=inv)



def _empty_strided_operands(device):
    """q or k with no elements whose last dim is not contiguous: a GQA k of 0 heads made by slicing or
    broadcasting, the .imag of an empty complex tensor. torch counts them contiguous whatever their
    strides (once, the op recursed forever making one of them row-major: a stack overflow)."""
    return {
        "sliced": torch.randn(1, 4, 0, 16, device=device)[..., ::2],
        "expanded": torch.randn(1, 4, 1, 1, device=device).expand(1, 4, 0, 8),
        "imag": torch.randn(1, 4, 0, 8, dtype=torch.complex64, device=device).imag,
    }


@pytest.mark.parametrize("in_place", [False, True])
def test_no_heads_at_all_rotates_nothing_and_still_checks_positions(in_place):
    """q and k with no heads (a shard of zero heads): nothing to rotate, so no angle is formed for
    the tokens (their angle loop ran: 270 ms for 10^7 tokens of no elements), and positions outside
    the domain are still refused."""
    q, k = torch.randn(1, 10**6, 0, 64), torch.randn(1, 10**6, 0, 64)
    rotate = pn.apply_rope_ if in_place else pn.apply_rope
    out_q, out_k = rotate(q, k, inv_freq=inv_freq(64))
    assert out_q.shape == q.shape and out_k.shape == k.shape
    bad = torch.zeros(1, 10**6, dtype=torch.int64)
    bad[0, -1] = MAX_POSITION + 1
    with pytest.raises(RuntimeError, match=r"positions \+ offset must lie in"):
        rotate(q, k, bad, inv_freq=inv_freq(64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sliced", "expanded", "imag"])
@pytest.mark.parametrize("which", ["q", "k"])
@pytest.mark.parametrize("form", ["apply_rope", "apply_rope_", "cos_sin", "backward"])
def test_empty_operand_with_any_strides(device, kind, which, form):
    empty = _empty_strided_operands(device)[kind]
    full = torch.randn(1, 4, 3, 8, device=device)
    q, k = (empty, full) if which == "q" else (full, empty)
    inv = inv_freq(8).to(device)
    ref_q, ref_k = reference.apply_rope(q.cpu(), k.cpu(), inv_freq=inv.cpu())
    if form == "apply_rope_":
        q, k = q.clone() if which == "k" else q, k.clone() if which == "q" else k
        out_q, out_k = pn.apply_rope_(q, k, inv_freq=inv)
        assert out_q is q and out_k is k
    elif form == "cos_sin":
        cos, sin = reference.rope_tables(torch.arange(4), pn.RopeConfig(head_dim=8))
        ref_q, ref_k = reference.apply_rope(q.cpu(), k.cpu(), config=pn.RopeConfig(head_dim=8))
        out_q, out_k = pn.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[None].float().to(device),
                                               sin[None].float().to(device))
        out_q, out_k = out_q.transpose(1, 2), out_k.transpose(1, 2)
    else:
        if form == "backward":
            q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
        out_q, out_k = pn.apply_rope(q, k, inv_freq=inv)
        if form == "backward":
            (out_q.sum() + out_k.sum()).backward()
            assert q.grad.shape == q.shape and k.grad.shape == k.shape
            g = k.grad if which == "q" else q.grad  # the gradient of the non-empty one: the inverse rotation of ones
            ones = torch.ones_like(full, dtype=torch.float64).cpu()
            g_ref = reference.apply_rope(ones, inv_freq=-inv.cpu())[0]
            assert rel_err(g, g_ref) <= 1e-6
    assert out_q.shape == q.shape and out_k.shape == k.shape
    assert rel_err(out_q.detach(), ref_q) <= 1e-6 and rel_err(out_k.detach(), ref_k) <= 1e-6

def _aliased_inputs(device):
    """q/k carved from one float64 buffer, and inputs that are views of the same memory."""
    buf = torch.randn(512, dtype=torch.float64, device=device)
    q = buf[:160].view(1, 5, 4, 8)
    k = buf[160:240].view(1, 5, 2, 8)
    as_int = buf.view(torch.int64)
    return buf, q, k, as_int


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["positions", "inv_freq", "cos", "sin", "cu_seqlens"])
def test_input_aliasing_an_in_place_output_rejected(device, which):
    buf, q, k, as_int = _aliased_inputs(device)
    inv = inv_freq(8).to(device)
    with torch.no_grad():
        if which == "positions":
            pos = as_int[150:155]  # inside q
            as_int[150:155] = torch.arange(5, device=device)
        else:
            pos = torch.arange(5, device=device)
    before = buf.clone()
    with pytest.raises(RuntimeError, match=f"{which} must not share memory with q"):
        if which == "positions":
            pn.apply_rope_(q, k, pos, inv_freq=inv)
        elif which == "inv_freq":
            buf[0:4] = inv
            before = buf.clone()
            pn.apply_rope_(q, k, inv_freq=buf[0:4])
        elif which == "cu_seqlens":
            qt, kt = q.view(5, 4, 8), k.view(5, 2, 8)
            as_int[0] = 0
            as_int[1] = 5
            before = buf.clone()
            pn.apply_rope_(qt, kt, inv_freq=inv, layout="thd", cu_seqlens=as_int[0:2])
        else:
            cos, sin = torch.randn(5, 8, dtype=torch.float64, device=device), torch.randn(5, 8, dtype=torch.float64,
                                                                                          device=device)
            table = buf[8:48].view(5, 8)  # inside q
            args = dict(cos=cos, sin=sin)
            args[which] = table
            torch.ops.posenc.rope_cos_sin_(q, k, args["cos"], args["sin"], None, "bshd", False)
    assert torch.equal(buf, before)


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_input_converted_to_a_copy_may_live_in_q(device):
    """A float32 inv_freq stored inside float32 q: the op reads its float64 copy, made before any
    write, so the rotation is the reference's with the values it had (README, "Aliasing")."""
    g = torch.Generator().manual_seed(21)
    q = torch.randn(1, 5, 4, 8, generator=g).to(device)
    q.view(-1)[:4] = inv_freq(8).float().to(device)  # inv_freq lives in q's first head
    inv, q0 = q.view(-1)[:4], q.clone()
    pn.apply_rope_(q, None, inv_freq=inv)
    want, _ = reference.apply_rope(q0.double().cpu(), inv_freq=q0.view(-1)[:4].double().cpu())
    assert rel_err(q, want) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_place_reads_aliased_inputs_correctly(device):
    """Out of place the outputs are fresh: q, k and the inputs may share memory freely."""
    buf, q, k, as_int = _aliased_inputs(device)
    inv = inv_freq(8).to(device)
    k2 = buf[8:168].view(1, 5, 4, 8)  # overlaps q
    q_out, k_out = pn.apply_rope(q, k2, inv_freq=inv, offset=3)
    rq, rk = reference.apply_rope(q.cpu(), k2.cpu(), inv_freq=inv.cpu(), offset=3)
    assert rel_err(q_out, rq) <= 1e-12 and rel_err(k_out, rk) <= 1e-12
    cos, sin = buf[0:40].view(5, 8), buf[40:80].view(5, 8)
    q_out, _ = pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    c, s = cos.cpu()[None, :, None], sin.cpu()[None, :, None]
    expected = q.cpu() * c + reference.rotate_half(q.cpu()) * s
    assert rel_err(q_out, expected) <= 1e-12


# ------------------------------------------------------------------------------------------------
# 2. Strided metadata: every index tensor honoured with its strides


def strided(t: torch.Tensor, step: int, fill) -> torch.Tensor:
    """The same values as t (1-D or 2-D), stored with a step between them (and transposed storage
    for 2-D), the gaps filled with junk that would be read if strides were ignored."""
    if t.dim() == 1:
        big = torch.full((t.shape[0] * step,), fill, dtype=t.dtype, device=t.device)
        big[::step] = t
        return big[::step]
    big = torch.full((t.shape[1], t.shape[0] * step), fill, dtype=t.dtype, device=t.device)
    big[:, ::step] = t.T
    return big.T[::step] if step == 1 else big[:, ::step].T


@pytest.mark.parametrize("device", DEVICES)
def test_issue_example_strided_cu_seqlens(device):
    cu = torch.tensor([0, 99, 2, 99, 6], device=device)[::2]
    q = torch.randn(6, 2, 8, dtype=torch.float64, device=device)
    a, _ = pn.apply_rope(q, None, inv_freq=inv_freq(8).to(device), layout="thd", cu_seqlens=cu)
    b, _ = pn.apply_rope(q, None, inv_freq=inv_freq(8).to(device), layout="thd", cu_seqlens=cu.contiguous())
    assert torch.equal(a, b)
    ref, _ = reference.apply_rope(q.cpu(), inv_freq=inv_freq(8), layout="thd", cu_seqlens=cu.cpu())
    assert rel_err(a, ref) <= 1e-12


@HYP
@given(seed=st.integers(0, 2 ** 16), step=st.integers(1, 4), layout=st.sampled_from(["bshd", "bhsd", "thd"]),
       pos_kind=st.sampled_from(["none", "1d", "2d", "2d_bcast", "cu"]), int32=st.booleans(),
       inplace=st.booleans())
def test_rope_strided_metadata_matches_reference(seed, step, layout, pos_kind, int32, inplace):
    g = torch.Generator().manual_seed(seed)
    B, S, H, D = (1 if layout == "thd" else 2), 7, 3, 16
    shape = {"bshd": (B, S, H, D), "bhsd": (B, H, S, D), "thd": (S, H, D)}[layout]
    q = torch.randn(*shape, generator=g, dtype=torch.float64)
    k = torch.randn(*shape, generator=g, dtype=torch.float64)[..., :D]
    inv = strided(inv_freq(12), step, 1e6)  # junk frequencies in the gaps
    idx = torch.int32 if int32 else torch.int64
    positions = cu = None
    if pos_kind == "cu" and layout == "thd":
        cu = strided(torch.tensor([0, 2, 2, 7], dtype=idx), step, 99)
    elif pos_kind == "1d" or (pos_kind != "none" and layout == "thd"):
        positions = strided(torch.randint(0, 10 ** 6, (S,), generator=g, dtype=idx), step, 10 ** 9)
    elif pos_kind == "2d":
        positions = strided(torch.randint(0, 10 ** 6, (B, S), generator=g, dtype=idx), step, 10 ** 9)
    elif pos_kind == "2d_bcast":
        positions = torch.randint(0, 10 ** 6, (1, S), generator=g, dtype=idx).expand(B, S)
    rq, rk = reference.apply_rope(q, k, positions, layout=layout, inv_freq=inv.contiguous(), cu_seqlens=cu, offset=5)
    if inplace:
        qo, ko = q.clone(), k.clone()
        pn.apply_rope_(qo, ko, positions, inv_freq=inv, layout=layout, cu_seqlens=cu, offset=5)
    else:
        qo, ko = pn.apply_rope(q, k, positions, inv_freq=inv, layout=layout, cu_seqlens=cu, offset=5)
    assert rel_err(qo, rq) <= 1e-12 and rel_err(ko, rk) <= 1e-12


@HYP
@given(seed=st.integers(0, 2 ** 16), cos_step=st.integers(1, 3), sin_step=st.integers(1, 3),
       gather=st.booleans(), last_dim_strided=st.booleans(), inplace=st.booleans())
def test_rope_cos_sin_strided_tables_match_reference(seed, cos_step, sin_step, gather, last_dim_strided, inplace):
    g = torch.Generator().manual_seed(seed)
    B, S, H, D = 2, 6, 2, 8
    q = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, S, D, generator=g, dtype=torch.float64)
    rows = 40 if gather else S
    cos = torch.randn(rows, D, generator=g, dtype=torch.float64)
    sin = torch.randn(rows, D, generator=g, dtype=torch.float64)
    pos = strided(torch.randint(0, rows, (B, S), generator=g), 2, 10 ** 6) if gather else None

    def stored(t, step):
        big = torch.full((t.shape[0] * step, t.shape[1] * (2 if last_dim_strided else 1)), 1e6, dtype=t.dtype)
        view = big[::step, ::2] if last_dim_strided else big[::step]
        view.copy_(t)
        return view

    cs, ss = stored(cos, cos_step), stored(sin, sin_step)
    c = cos[pos] if gather else cos[None].expand(B, S, D)
    s = sin[pos] if gather else sin[None].expand(B, S, D)
    c, s = c[:, None], s[:, None]  # over heads
    rq, rk = q * c + reference.rotate_half(q) * s, k * c + reference.rotate_half(k) * s
    if inplace:
        qo, ko = q.clone(), k.clone()
        torch.ops.posenc.rope_cos_sin_(qo, ko, cs, ss, pos, "bhsd", False)
    else:
        qo, ko = pn.apply_rotary_pos_emb(q, k, cs, ss, position_ids=pos)
    assert rel_err(qo, rq) <= 1e-12 and rel_err(ko, rk) <= 1e-12


@HYP
@given(seed=st.integers(0, 2 ** 16), step=st.integers(1, 4), two_d=st.booleans(), floating=st.booleans())
def test_sinusoidal_strided_positions_match_reference(seed, step, two_d, floating):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 9, 12, generator=g, dtype=torch.float64)
    pos = (torch.rand(3 if two_d else 1, 9, generator=g, dtype=torch.float64) * 1000 if floating
           else torch.randint(0, 10 ** 6, (3 if two_d else 1, 9), generator=g))
    pos = pos if two_d else pos[0]
    sp = strided(pos, step, 1e9 if floating else 10 ** 9)
    out = pn.add_sinusoidal(x, sp, offset=3)
    assert rel_err(out, reference.add_sinusoidal(x, pos, offset=3)) <= 1e-12
    if not two_d:
        table = pn.sinusoidal_table(sp, 12, dtype=torch.float64)
        assert rel_err(table, reference.sinusoidal_table(pos, 12)) <= 1e-12


# ------------------------------------------------------------------------------------------------
# 3. In-place autograd: torch's rules (mul_ is the model)


def _rope_inplace_calls(inv):
    """(name, call(q)) for every way to rotate q in place."""
    cos = torch.randn(5, 8, dtype=torch.float64)
    sin = torch.randn(5, 8, dtype=torch.float64)
    empty = lambda q: q.new_empty(q.shape[0], q.shape[1], 0, q.shape[3])  # noqa: E731
    return [
        ("apply_rope_", lambda q: pn.apply_rope_(q, inv_freq=inv)),
        ("rope_", lambda q: torch.ops.posenc.rope_(q, empty(q), None, None, inv, 1.0, False, "bshd", 0, False)),
        ("rope_cos_sin_", lambda q: torch.ops.posenc.rope_cos_sin_(q, empty(q), cos, sin, None, "bshd", False)),
    ]


@pytest.mark.parametrize("idx", range(3))
def test_version_counter_bumped_and_stale_backward_caught(idx):
    inv = inv_freq(8)
    name, call = _rope_inplace_calls(inv)[idx]
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    y = x * 2
    z = y.sin()
    v0 = y._version
    with torch.no_grad():
        call(y)
    assert y._version > v0, name
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    # in inference mode a normal tensor's counter is bumped too
    w = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    v0 = w._version
    with torch.inference_mode():
        call(w)
    assert w._version > v0


@pytest.mark.parametrize("idx", range(3))
def test_leaf_requiring_grad_refused_under_grad_mode(idx):
    name, call = _rope_inplace_calls(inv_freq(8))[idx]
    leaf = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad is being used in an in-place operation"):
        call(leaf)
    assert torch.equal(leaf.detach(), before)
    with pytest.raises(RuntimeError, match="view of a leaf Variable"):
        call(leaf[:, :, :1])
    assert torch.equal(leaf.detach(), before)
    with torch.no_grad():  # as torch: allowed without grad mode
        call(leaf)
    assert not torch.equal(leaf.detach(), before)


@pytest.mark.parametrize("idx", range(3))
def test_inference_tensor_outside_inference_mode_refused(idx):
    name, call = _rope_inplace_calls(inv_freq(8))[idx]
    with torch.inference_mode():
        t = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    before = t.clone()
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        call(t)
    assert torch.equal(t, before)
    with torch.inference_mode():  # all-inference arguments carry no autograd keys: refused by the op itself
        inv, empty = inv_freq(8), torch.empty(1, 5, 0, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        torch.ops.posenc.rope_(t, empty, None, None, inv, 1.0, False, "bshd", 0, False)
    with torch.inference_mode():
        call(t)
    assert not torch.equal(t, before)


@HYP
@given(seed=st.integers(0, 2 ** 16), layout=st.sampled_from(["bshd", "bhsd"]), table=st.booleans(),
       k_grad=st.booleans(), interleaved=st.booleans())
def test_non_leaf_in_place_gradient_matches_out_of_place(seed, layout, table, k_grad, interleaved):
    """Views of one fused qkv projection (non-leaf), rotated in place under grad mode: the gradient
    of the projection weights equals the out-of-place op's."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 3 * 4 * 8, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 5, 16, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 10 ** 5, (2, 5), generator=g)
    cos, sin = torch.randn(2, 5, 8, generator=g, dtype=torch.float64), torch.randn(2, 5, 8, generator=g,
                                                                                   dtype=torch.float64)
    weights = torch.randn(2, 5, 3, 4, 8, generator=g, dtype=torch.float64)
    inv = inv_freq(8)

    def rotate(q, k, in_place):
        t = (lambda v: v.transpose(1, 2)) if layout == "bhsd" else (lambda v: v)
        q, k = t(q), t(k)
        if in_place and table:
            torch.ops.posenc.rope_cos_sin_(q, k, cos, sin, None, layout, False)
        elif in_place:
            pn.apply_rope_(q, k, pos, inv_freq=inv, layout=layout, interleaved=interleaved, offset=7)
        elif table:
            q, k = pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1 if layout == "bhsd" else 2)
        else:
            q, k = pn.apply_rope(q, k, pos, inv_freq=inv, layout=layout, interleaved=interleaved, offset=7)
        return t(q), t(k)

    def loss(in_place):
        qkv = (x @ w).view(2, 5, 3, 4, 8)
        q = qkv[:, :, 0]
        k = qkv[:, :, 1] if k_grad else qkv[:, :, 1].detach().clone()
        qr, kr = rotate(q, k, in_place)
        buffer = qkv if in_place else torch.stack([qr, kr if k_grad else qkv[:, :, 1], qkv[:, :, 2]], 2)
        return (buffer * weights).sum() + (qr.sin() * weights[:, :, 0]).sum() + (kr.pow(2) * weights[:, :, 1]).sum()

    g_in, = torch.autograd.grad(loss(True), w)
    g_out, = torch.autograd.grad(loss(False), w)
    assert rel_err(g_in, g_out) <= 1e-12


def test_in_place_gradcheck_and_double_backward():
    inv = inv_freq(8)

    def f(a, c):
        q, k = a * 1.0, c * 1.0
        pn.apply_rope_(q, k, inv_freq=inv, offset=3, attention_factor=1.2)
        return q, k

    args = (torch.randn(1, 3, 2, 8, dtype=torch.float64, requires_grad=True),
            torch.randn(1, 3, 1, 8, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_multi_output_view_refused_before_any_write():
    qkv = torch.randn(2, 5, 3, 4, 8, requires_grad=True) * 1.0
    q, k, _ = qkv.unbind(2)
    before = qkv.detach().clone()
    with pytest.raises(RuntimeError, match="view that autograd cannot modify in place"):
        pn.apply_rope_(q, k, inv_freq=inv_freq(8))
    assert torch.equal(qkv.detach(), before)
    # a view made under no_grad (also a leaf for autograd): named as such, not as a leaf
    with torch.no_grad():
        q = qkv[:, :, 0]
    with pytest.raises(RuntimeError, match=r"q is a view that autograd cannot modify in place \(CreationMeta.NO_GRAD_MODE"):
        pn.apply_rope_(q, None, inv_freq=inv_freq(8))
    assert torch.equal(qkv.detach(), before)


def test_in_place_with_grad_compiles_fullgraph():
    from torch._dynamo.testing import CompileCounterWithBackend

    inv = inv_freq(8)

    def f(x, w, pos):
        qkv = (x @ w).view(2, 5, 3, 4, 8)
        pn.apply_rope_(qkv[:, :, 0], qkv[:, :, 1], pos, inv_freq=inv)
        return (qkv.sin() * 3).sum()

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 5, 16, generator=g), torch.randn(16, 96, generator=g, requires_grad=True)
    pos = torch.randint(0, 99, (5,), generator=g)
    expected, = torch.autograd.grad(f(x, w, pos), w)
    counter = CompileCounterWithBackend("aot_eager")
    got, = torch.autograd.grad(torch.compile(f, backend=counter, fullgraph=True)(x, w, pos), w)
    assert counter.frame_count == 1
    assert rel_err(got, expected) <= 1e-6


# ------------------------------------------------------------------------------------------------
# 5. Integer overflow and the position domain


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [2 ** 32, 2 ** 31, -(2 ** 31) - 5, 2 ** 40 + 3, MAX_POSITION - 10])
def test_int32_positions_plus_large_offset_do_not_wrap(device, offset):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 6, 2, 8, generator=g, dtype=torch.float64)
    p32 = torch.randint(0, 10, (6,), generator=g, dtype=torch.int32)
    out, _ = pn.apply_rope(q.to(device), None, p32.to(device), inv_freq=inv_freq(8).to(device), offset=offset)
    ref, _ = reference.apply_rope(q, None, p32.long(), inv_freq=inv_freq(8), offset=offset)
    assert rel_err(out, ref) <= 1e-9
    x = torch.randn(6, 8, generator=g, dtype=torch.float64)
    got = pn.add_sinusoidal(x.to(device), p32.to(device), offset=offset)
    # the op's and the reference's float64 frequencies may differ by an ulp: angle error ~ offset * 2^-52
    assert rel_err(got, reference.add_sinusoidal(x, p32, offset=offset)) <= max(1e-12, abs(offset) * 1e-15)
    if abs(offset) > 2 ** 31:
        assert not torch.allclose(got.cpu(), reference.add_sinusoidal(x, p32)), "offset lost"


# Positions (plus offset) just outside the domain, int64 wrap-arounds included. On the CPU they raise
# before any write; on the GPU the kernel stops (test_cuda_values_outside_the_contract_stop_the_kernel).
BAD_POSITIONS = [
    ([2 ** 48 + 1], 0), ([-(2 ** 48) - 1], 0), ([1], 2 ** 63 - 1), ([2 ** 62], 2 ** 62), ([-(2 ** 63)], -1),
    ([2 ** 63 - 1], 1), ([0], -(2 ** 63)), ([2 ** 60], 0), ([5], MAX_POSITION),
]


@pytest.mark.parametrize("positions, offset", BAD_POSITIONS)
def test_positions_outside_domain_raise(positions, offset):
    q = torch.randn(1, 1, 2, 8)
    before = q.clone()
    pos = torch.tensor(positions)
    with pytest.raises(RuntimeError, match=r"positions \+ offset must lie in \[-2\^48, 2\^48\]"):
        pn.apply_rope(q, None, pos, inv_freq=inv_freq(8), offset=offset)
    with pytest.raises(RuntimeError, match=r"positions \+ offset must lie in \[-2\^48, 2\^48\]"):
        pn.apply_rope_(q, None, pos, inv_freq=inv_freq(8), offset=offset)
    assert torch.equal(q, before)
    # add_sinusoidal's op adds the offset too: its message names what was given, not a wrapped sum
    x = torch.randn(1, 1, 8)
    if abs(offset) > MAX_POSITION:
        with pytest.raises(ValueError, match="offset must lie in"):
            pn.add_sinusoidal(x, pos, offset=offset)
    else:
        with pytest.raises(RuntimeError, match=re.escape(f"got positions in [{positions[0]}, {positions[0]}] and offset {offset}")):
            pn.add_sinusoidal(x, pos, offset=offset)


@pytest.mark.parametrize("positions, offset", [([2 ** 48], 0), ([-(2 ** 48)], 0), ([2 ** 62], -(2 ** 62) + 7),
                                               ([-(2 ** 63)], 2 ** 63 - 1), ([2 ** 63 - 1], -(2 ** 63) + 1)])
@pytest.mark.parametrize("device", DEVICES)
def test_positions_at_the_domain_edge_rotate(device, positions, offset):
    """The edge of the domain, reached through offsets that would wrap if added carelessly: accepted
    on both devices (the kernel's bounds are the host's), and rotated as the reference does."""
    g = torch.Generator().manual_seed(12)
    q = torch.randn(1, 1, 2, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor(positions)
    out, _ = pn.apply_rope(q.to(device), None, pos.to(device), inv_freq=torch.full((4,), 2.0 ** -3, dtype=torch.float64,
                           device=device), offset=offset)
    total = positions[0] + offset  # Python ints: no wrap
    angle = torch.tensor(float(total) * 2.0 ** -3, dtype=torch.float64)  # exact: a power of two times an int
    c, s = torch.cos(angle), torch.sin(angle)
    a, b = q[..., :4], q[..., 4:]
    assert rel_err(out, torch.cat([a * c - b * s, b * c + a * s], -1)) <= 1e-9


@pytest.mark.parametrize("device", DEVICES)
def test_offset_out_of_domain_without_positions(device):
    q = torch.randn(1, 4, 2, 8, device=device)
    with pytest.raises(RuntimeError, match=r"must lie in \[-2\^48, 2\^48\]"):
        pn.apply_rope(q, inv_freq=inv_freq(8).to(device), offset=MAX_POSITION - 2)  # last token at 2^48 + 1
    with pytest.raises(RuntimeError, match=r"must lie in \[-2\^48, 2\^48\]"):
        pn.apply_rope(q.view(4, 2, 8), inv_freq=inv_freq(8).to(device), layout="thd",
                      cu_seqlens=torch.tensor([0, 4], device=device), offset=2 ** 63 - 2)
    with pytest.raises(ValueError, match="offset must lie in"):
        pn.add_sinusoidal(torch.randn(4, 8, device=device), offset=2 ** 50)
    x = torch.randn(4, 8, device=device)
    for offset in (MAX_POSITION - 2, 2 ** 63 - 2, -(2 ** 63)):  # (the op itself: no Python check before it)
        with pytest.raises(RuntimeError, match=re.escape(f"positions (0 .. seq-1) + offset must lie in [-2^48, 2^48] "
                                                         f"(the supported position domain), got positions in [0, 3] "
                                                         f"and offset {offset}")):
            torch.ops.posenc.add_sinusoidal(x, None, 1.0, 10000.0, True, 0.0, 1.0, False, offset)


def test_angle_domain_checks_the_frequencies():
    q = torch.randn(1, 2, 2, 8)
    big = torch.full((4,), 2.0 ** 10, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"position \* inv_freq must stay within 2\^50"):
        pn.apply_rope(q, None, torch.tensor([0, 2 ** 45]), inv_freq=big)
    with pytest.raises(RuntimeError, match="inv_freq must be finite"):
        pn.apply_rope(q, inv_freq=torch.tensor([1.0, float("nan"), 0.1, 0.01]))
    with pytest.raises(RuntimeError, match=r"within 2\^50"):
        pn.sinusoidal_table(torch.tensor([2.0 ** 45]), 8, angle_scale=1000.0)


@pytest.mark.parametrize("where", range(6))
def test_angle_domain_finds_the_largest_frequency_anywhere(where):
    """The CPU's scan of one axis of frequencies keeps four partial maxima: the largest (or a
    non-finite) frequency is found at every index, whatever its sign."""
    g = torch.Generator().manual_seed(where)
    q = torch.randn(1, 2, 2, 12, generator=g)
    inv = torch.rand(6, generator=g, dtype=torch.float64)  # all below 1
    pos = torch.tensor([0, 2 ** 45])
    for sign in (1.0, -1.0):
        inv[where] = sign * 2.0 ** 10  # 2^55 rad at 2^45
        with pytest.raises(RuntimeError, match=r"position \* inv_freq must stay within 2\^50"):
            pn.apply_rope(q, None, pos, inv_freq=inv)
        inv[where] = sign * 2.0 ** 4  # 2^49 rad: inside
        out, _ = pn.apply_rope(q, None, pos, inv_freq=inv)
        # position 0 exactly as the reference; 2^45 is past the accuracy contract, still a rotation
        ref, _ = reference.apply_rope(q.double(), None, pos, inv_freq=inv)
        assert torch.allclose(out[:, 0].double(), ref[:, 0], atol=1e-6)
        norm = lambda x: x[..., :6].double() ** 2 + x[..., 6:].double() ** 2  # noqa: E731
        assert torch.allclose(norm(out), norm(q), rtol=1e-5, atol=1e-5)
    for bad in (float("inf"), float("-inf"), float("nan")):
        inv[where] = bad
        with pytest.raises(RuntimeError, match=f"inv_freq must be finite, got .* at index {where}"):
            pn.apply_rope(q, None, pos, inv_freq=inv)


def test_sinusoidal_frequencies_that_overflow_raise():
    """base 1e-300 with freq_shift 3.9 (dim 8) makes the last frequency exp(~2e4): refused, even for
    positions that are all zero (0 * inf would be a NaN table)."""
    for positions in ([0.0], [0.0, 1.0]):
        with pytest.raises(RuntimeError, match="frequencies must be finite"):
            pn.sinusoidal_table(torch.tensor(positions), 8, base=1e-300, freq_shift=3.9)


BAD_FLOAT_POSITIONS = [1e18, -1e18, float("inf"), float("nan"), 2.0 ** 48 * 1.5]


@pytest.mark.parametrize("bad", BAD_FLOAT_POSITIONS)
def test_sinusoidal_float_positions_outside_domain_raise(bad):
    x = torch.randn(2, 8)
    before = x.clone()
    lo, hi = (min(0.0, bad), max(0.0, bad)) if bad == bad else (bad, bad)  # (a NaN leaves the range undefined)
    with pytest.raises(RuntimeError, match=re.escape(f"positions must be finite and lie in [-2^48, 2^48] (the supported "
                                                     f"position domain), got positions in [{lo:g}, {hi:g}]")):
        pn.sinusoidal_table(torch.tensor([0.0, bad]), 8)
    with pytest.raises(RuntimeError, match=re.escape("positions + offset must be finite and lie in [-2^48, 2^48]")):
        pn.add_sinusoidal(x, torch.tensor([1.0, bad]))
    lo, hi = (min(1.0, bad), max(1.0, bad)) if bad == bad else (bad, bad)
    with pytest.raises(RuntimeError, match=re.escape(f"got positions in [{lo:g}, {hi:g}] and offset 3")):
        pn.add_sinusoidal(x, torch.tensor([1.0, bad]), offset=3)
    assert torch.equal(x, before)


def test_cos_sin_positions_must_index_the_table():
    """position_ids select rows of 2-D cos/sin tables: one past the end (or negative) is refused,
    naming the table's rows, never clamped to the last row."""
    g = torch.Generator().manual_seed(13)
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    cos, sin = reference.rope_tables(5, pn.RopeConfig(head_dim=8))
    for bad in ([0, 1, 5], [0, -1, 2]):
        with pytest.raises(RuntimeError, match=r"positions must be in \[0, 5\) to index cos/sin"):
            pn.apply_rotary_pos_emb(q, k, cos, sin, position_ids=torch.tensor([bad]))
    out, _ = pn.apply_rotary_pos_emb(q, k, cos, sin, position_ids=torch.tensor([[0, 4, 2]]))
    ref, _ = reference.apply_rope(q.double(), None, torch.tensor([[0, 4, 2]]), inv_freq=inv_freq(8), layout="bhsd")
    assert rel_err(out, ref) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_largest_positions_still_rotate(device, dtype):
    """Inside the domain but past the accuracy contract (2^24): every result is still a rotation
    (each pair keeps its norm, |PE| <= 1), never the 1e15 of an unreduced angle."""
    g = torch.Generator().manual_seed(11)
    pos = torch.tensor([2 ** 48, -(2 ** 48), 2 ** 47 + 12345, 2 ** 30 + 1, 3], device=device)
    q = torch.randn(1, 5, 2, 16, generator=g).to(device, dtype)
    out, _ = pn.apply_rope(q, None, pos, inv_freq=inv_freq(16).to(device))
    a, b = out.double()[..., :8], out.double()[..., 8:]
    a0, b0 = q.double()[..., :8], q.double()[..., 8:]
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float64: 1e-12}[dtype]
    assert torch.allclose(a * a + b * b, a0 * a0 + b0 * b0, rtol=tol * 4, atol=tol * 4)
    table = pn.sinusoidal_table(pos.to(torch.float64), 16, dtype=dtype)
    assert float(table.double().abs().max()) <= 1.0 + tol
    pairs = table.double().view(5, 8, 2)
    assert torch.allclose(pairs.pow(2).sum(-1), torch.ones(5, 8, dtype=torch.float64, device=device), atol=tol * 4)


# ------------------------------------------------------------------------------------------------
# 5b. Values that live on the GPU: checked by the kernels, so that no call waits for the device

_GPU_PRELUDE = """
import torch, posenc_native as pn
inv = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64, device="cuda") / 8)
q = torch.randn(1, 3, 2, 8, device="cuda")
"""

# A CUDA graph of one in-place rotation, its positions a static buffer; {fill} is run before the replay.
_GPU_GRAPH = """
pos = torch.zeros(3, dtype=torch.long, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    pn.apply_rope_(q, None, pos, inv_freq=inv)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    pn.apply_rope_(q, None, pos, inv_freq=inv)
{fill}
graph.replay()"""

# (name, statements, the kernel's message): each runs in a process of its own (a device-side
# assertion leaves the CUDA context unusable), then synchronizes.
_GPU_BAD_VALUES = [
    *[(f"rope positions {pos} offset {off}", f"pn.apply_rope(q[:, :1], None, torch.tensor({pos}, device='cuda'), "
       f"inv_freq=inv, offset={off})", "positions + offset must lie in") for pos, off in BAD_POSITIONS],
    ("rope_ in place, position 2^48 + 1", "pn.apply_rope_(q, q.clone()[:, :, :1], torch.tensor([0, 1, 2 ** 48 + 1], "
     "device='cuda'), inv_freq=inv)", "positions + offset must lie in"),
    ("MRoPE, one axis out of the domain", "pos = torch.zeros(3, 1, 3, dtype=torch.long, device='cuda'); pos[2, 0, 1] = "
     "2 ** 50\npn.apply_rope(q, None, pos, inv_freq=inv, mrope_section=[2, 1, 1])", "positions + offset must lie in"),
    ("rope angle past 2^50", "pn.apply_rope(q[:, :2], None, torch.tensor([0, 2 ** 45], device='cuda'), "
     "inv_freq=torch.full((4,), 2.0 ** 10, dtype=torch.float64, device='cuda'))", "must stay within 2^50 rad"),
    ("rope NaN frequency", "pn.apply_rope(q, inv_freq=torch.tensor([1.0, float('nan'), 0.1, 0.01], device='cuda', "
     "dtype=torch.float64))", "must stay within 2^50 rad"),
    ("cos/sin row past the table", "c, s = torch.randn(5, 8, device='cuda'), torch.randn(5, 8, device='cuda')\n"
     "pn.apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), c, s, position_ids=torch.tensor([[0, 1, 5]], "
     "device='cuda'))", "positions must index a row of cos/sin"),
    ("cos/sin negative row", "c, s = torch.randn(5, 8, device='cuda'), torch.randn(5, 8, device='cuda')\n"
     "pn.apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), c, s, position_ids=torch.tensor([[0, -1, 2]], "
     "device='cuda'))", "positions must index a row of cos/sin"),
    *[(f"cu_seqlens {cu}", f"pn.apply_rope_(torch.randn(7, 4, 8, device='cuda'), inv_freq=inv, layout='thd', "
       f"cu_seqlens=torch.tensor({cu}, device='cuda'))", "cu_seqlens must start at 0") for cu in
      ([0, 4, 3, 7], [0, 3, 6], [1, 3, 7], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 7])],
    ("cu_seqlens beside positions", "pn.apply_rope(torch.randn(7, 4, 8, device='cuda'), None, torch.arange(7, "
     "device='cuda'), inv_freq=inv, layout='thd', cu_seqlens=torch.tensor([0, 4, 3, 7], device='cuda'))",
     "cu_seqlens must start at 0"),
    *[(f"sinusoidal_table position {bad}", f"pn.sinusoidal_table(torch.tensor([0.0, float('{bad}')], "
       f"device='cuda'), 8)", "positions must be finite and lie in") for bad in BAD_FLOAT_POSITIONS],
    ("add_sinusoidal NaN position", "pn.add_sinusoidal(torch.randn(2, 8, device='cuda'), torch.tensor([1.0, "
     "float('nan')], device='cuda'))", "positions must be finite and lie in"),
    ("sinusoidal angle past 2^50", "pn.sinusoidal_table(torch.tensor([2.0 ** 45], device='cuda'), 8, "
     "angle_scale=1000.0)", "position * frequency must stay within 2^50 rad"),
    ("a CUDA graph replayed with a position past 2^48", _GPU_GRAPH.format(fill="pos[1] = 2 ** 50"),
     "positions + offset must lie in"),
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_values_outside_the_contract_stop_the_kernel():
    """Every value check the host makes on CPU tensors, made by the kernel on GPU tensors: the call
    returns at once, and the kernel stops with a device-side assertion that names the argument (the
    CUDA error surfaces at the next synchronization, as for torch's own index checks), in a replayed
    CUDA graph too (where the host never sees the values). A valid call and a valid replay run the
    same way finish: the harness tells the two apart."""
    cases = [("valid call (control)", "pn.apply_rope_(q, None, torch.tensor([0, 2 ** 48, -(2 ** 48)], device='cuda'), "
              "inv_freq=inv)", None),
             ("valid CUDA graph replay (control)", _GPU_GRAPH.format(fill="pos.copy_(torch.tensor([5, 2 ** 48, 7]))"),
              None)] + _GPU_BAD_VALUES
    procs = [subprocess.Popen([sys.executable, "-c", _GPU_PRELUDE + stmt + "\ntorch.cuda.synchronize()\nprint('FINISHED')"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _, stmt, _ in cases]
    failures = []
    for (name, _, message), proc in zip(cases, procs):
        out, err = proc.communicate(timeout=300)
        text = out + err
        if message is None:
            ok = proc.returncode == 0 and "FINISHED" in out
        else:
            ok = (proc.returncode != 0 and "FINISHED" not in out and "device-side assert triggered" in text
                  and message in text)
        if not ok:
            failures.append(f"{name}: exit {proc.returncode}\n{text[-1500:]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_calls_never_wait_for_the_device():
    """Positions, cu_seqlens and frequencies on the GPU are never copied to the host: under
    torch.cuda.set_sync_debug_mode("error") every call below runs (each once before, so that caches
    such as a config's frequencies on the device are filled), while a read of a GPU value raises."""
    g = torch.Generator(device="cuda").manual_seed(14)
    dev = "cuda"
    q = torch.randn(2, 6, 4, 16, device=dev, generator=g)
    k = torch.randn(2, 6, 2, 16, device=dev, generator=g)
    pos = torch.randint(0, 1000, (2, 6), device=dev, generator=g)
    inv = inv_freq(16).to(dev)
    packed = torch.randn(6, 4, 16, device=dev, generator=g)
    cu = torch.tensor([0, 2, 6], device=dev, dtype=torch.int32)
    cos, sin = (t.to(dev) for t in reference.rope_tables(1000, pn.RopeConfig(head_dim=16)))
    mpos = torch.randint(0, 50, (3, 2, 6), device=dev, generator=g)
    yarn = pn.RopeConfig.from_hf({"head_dim": 16, "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4,
                                  "max_position_embeddings": 4096,
                                  "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 1024}})
    llama3 = pn.RopeConfig.from_hf({"head_dim": 16, "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5,
                                    "max_position_embeddings": 8192,
                                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 1024}})
    rotary = pn.RotaryEmbedding(yarn).to(dev)
    x = torch.randn(2, 6, 16, device=dev, generator=g)
    calls = {
        "apply_rope [B,S] int64": lambda: pn.apply_rope(q, k, pos, inv_freq=inv),
        "apply_rope_ [S] int32 + offset": lambda: pn.apply_rope_(q, k, pos[0].int(), inv_freq=inv, offset=3),
        "apply_rope thd cu_seqlens": lambda: pn.apply_rope(packed, None, inv_freq=inv, layout="thd", cu_seqlens=cu),
        "apply_rope thd positions + cu_seqlens": lambda: pn.apply_rope(packed, None, pos[0], inv_freq=inv,
                                                                        layout="thd", cu_seqlens=cu),
        "apply_rope config=yarn": lambda: pn.apply_rope(q, k, pos, config=yarn),
        "apply_rope_ config=llama3": lambda: pn.apply_rope_(q, k, pos, config=llama3),
        "RotaryEmbedding(yarn)": lambda: rotary(q, k, pos),
        "MRoPE axis positions": lambda: pn.apply_rope(q, k, mpos, inv_freq=inv, mrope_section=[4, 2, 2]),
        "apply_rotary_pos_emb table + position_ids": lambda: pn.apply_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), cos, sin, position_ids=pos),
        "sinusoidal_table(L)": lambda: pn.sinusoidal_table(64, 16, device=dev),
        "sinusoidal_table(float positions)": lambda: pn.sinusoidal_table(pos[0].double() / 3, 16),
        "add_sinusoidal(x)": lambda: pn.add_sinusoidal(x, offset=5),
        "add_sinusoidal(x, positions)": lambda: pn.add_sinusoidal(x, pos),
    }
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    waited = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            pos.max().item()  # the detector is on
        for name, call in calls.items():
            try:
                call()
            except RuntimeError as e:
                waited.append(f"{name}: {e}")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert not waited, "\n".join(waited)


# ------------------------------------------------------------------------------------------------
# 7. Error quality: ValueError/TypeError/RuntimeError naming the argument, never IndexError


def _dynamic_config():
    return pn.RopeConfig.from_hf({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4,
                                  "max_position_embeddings": 32,
                                  "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})


q4 = torch.randn(1, 3, 2, 16)
BAD_CALLS = [
    ("0-dim q", lambda: pn.apply_rope(torch.tensor(1.0), inv_freq=inv_freq(8)), "q"),
    ("0-dim q in place", lambda: pn.apply_rope_(torch.tensor(1.0), inv_freq=inv_freq(8)), "q"),
    ("1-D q thd", lambda: pn.apply_rope(torch.randn(16), inv_freq=inv_freq(8), layout="thd"), "q"),
    ("3-D k", lambda: pn.apply_rope(q4, torch.randn(3, 2, 16), inv_freq=inv_freq(8)), "k"),
    ("q not a tensor", lambda: pn.apply_rope([[1.0]], inv_freq=inv_freq(8)), "q"),
    ("positions a list", lambda: pn.apply_rope(q4, None, [0, 1, 2], inv_freq=inv_freq(8)), "positions"),
    ("inv_freq a list", lambda: pn.apply_rope(q4, inv_freq=[1.0, 0.1]), "inv_freq"),
    ("offset float", lambda: pn.apply_rope(q4, inv_freq=inv_freq(8), offset=2.5), "offset"),
    ("offset past int64", lambda: pn.apply_rope(q4, inv_freq=inv_freq(8), offset=2 ** 64), "offset"),
    ("rotary_dim float", lambda: pn.apply_rope(q4, inv_freq=inv_freq(8), rotary_dim=8.0), "rotary_dim"),
    ("interleaved str", lambda: pn.apply_rope(q4, inv_freq=inv_freq(8), interleaved="no"), "interleaved"),
    ("attention_factor str", lambda: pn.apply_rope(q4, inv_freq=inv_freq(8), attention_factor="x"),
     "attention_factor"),
    ("config wrong type", lambda: pn.apply_rope(q4, config={"rope_theta": 1}), "config"),
    ("cu_seqlens length 1, dynamic", lambda: pn.apply_rope(torch.randn(3, 4, 16), config=_dynamic_config(),
                                                           layout="thd", cu_seqlens=torch.tensor([3])),
     "cu_seqlens"),
    ("cu_seqlens 2-D, dynamic", lambda: pn.apply_rope(torch.randn(3, 4, 16), config=_dynamic_config(),
                                                      layout="thd", cu_seqlens=torch.tensor([[0, 3]])), "cu_seqlens"),
    ("cu_seqlens length 1", lambda: pn.apply_rope(torch.randn(3, 4, 16), inv_freq=inv_freq(8), layout="thd",
                                                  cu_seqlens=torch.tensor([3])), "cu_seqlens"),
    ("0-dim cos", lambda: pn.apply_rotary_pos_emb(q4, q4, torch.tensor(1.0), torch.tensor(1.0)), "cos"),
    ("1-D cos", lambda: pn.apply_rotary_pos_emb(q4, q4, torch.randn(16), torch.randn(16)), "cos"),
    ("0-dim q cos_sin", lambda: pn.apply_rotary_pos_emb(torch.tensor(1.0), q4, torch.randn(3, 16),
                                                        torch.randn(3, 16)), "q"),
    ("cos not a tensor", lambda: pn.apply_rotary_pos_emb(q4, q4, 1.0, 1.0), "cos"),
    ("unsqueeze_dim 3", lambda: pn.apply_rotary_pos_emb(q4, q4, torch.randn(3, 16), torch.randn(3, 16),
                                                        unsqueeze_dim=3), "unsqueeze_dim"),
    ("1-D x", lambda: pn.add_sinusoidal(torch.randn(8)), "x"),
    ("0-dim x", lambda: pn.add_sinusoidal(torch.tensor(1.0)), "x"),
    ("x not a tensor", lambda: pn.add_sinusoidal([[1.0, 2.0]]), "x"),
    ("x_scale str", lambda: pn.add_sinusoidal(torch.randn(2, 8), x_scale="2"), "x_scale"),
    ("add offset float", lambda: pn.add_sinusoidal(torch.randn(2, 8), offset=1.5), "offset"),
    ("dim float", lambda: pn.sinusoidal_table(4, 8.7), "dim"),
    ("dim str", lambda: pn.sinusoidal_table(4, "8"), "dim"),
    ("dim bool", lambda: pn.sinusoidal_table(4, True), "dim"),
    ("dtype str", lambda: pn.sinusoidal_table(4, 8, dtype="float32"), "dtype"),
    ("base str", lambda: pn.sinusoidal_table(4, 8, base="1e4"), "base"),
    ("positions strings", lambda: pn.sinusoidal_table(["a", "b"], 8), "positions"),
    ("positions 0-dim", lambda: pn.sinusoidal_table(torch.tensor(3), 8), "positions"),
    ("negative length", lambda: pn.sinusoidal_table(-2, 8), "positions"),
]


@pytest.mark.parametrize("name, call, arg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_clear_errors(name, call, arg):
    with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
        call()
    assert not isinstance(info.value, (IndexError, KeyError, AttributeError)), repr(info.value)
    assert arg in str(info.value), f"{name}: message does not name {arg!r}: {info.value}"


def _run_python(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_second_library_path_refused_naming_both(tmp_path):
    from posenc_native import _library

    loaded = _library.load_library()
    other = tmp_path / "libposenc_ops.so"
    shutil.copy(loaded, other)
    r = _run_python(f"""
        import posenc_native, posenc_native._library as L
        try:
            L.load_library({str(other)!r})
        except ImportError as e:
            print("REFUSED", e)
        import torch
        torch.ops.posenc.build_info()  # still alive and usable
        print("ALIVE")
    """)
    assert r.returncode == 0, r.stderr
    assert "REFUSED" in r.stdout and str(other) in r.stdout and os.path.basename(loaded) in r.stdout
    assert "ALIVE" in r.stdout
    # the other way round: torch loaded some posenc library first, then the package asks for another
    r = _run_python(f"""
        import torch
        torch.ops.load_library({str(other)!r})
        import posenc_native
    """, {"POSENC_LIBRARY": loaded})
    assert r.returncode == 1 and "ImportError" in r.stderr
    assert str(other) in r.stderr and loaded in r.stderr


def test_library_that_fails_to_load_names_its_torch(tmp_path):
    from posenc_native import _library

    bad = tmp_path / "libposenc_ops.so"
    bad.write_bytes(b"\x7fELF-not-really\0posenc-built-for-torch=2.99.0\0")
    r = _run_python("import posenc_native", {"POSENC_LIBRARY": str(bad)})
    assert r.returncode == 1
    assert "ImportError" in r.stderr and "built for torch 2.99.0" in r.stderr and torch.__version__ in r.stderr
    assert str(bad) in r.stderr and _library.TORCH_REQUIREMENT in r.stderr and "--no-build-isolation" in r.stderr


def test_built_library_records_its_torch():
    from posenc_native import _library

    assert _library.built_for_torch(_library.load_library()) == pn.build_info()["torch"]


# ------------------------------------------------------------------------------------------------
# 8. One meaning of add_sinusoidal's offset, in the op and the reference


@HYP
@given(seed=st.integers(0, 2 ** 16), offset=st.integers(-(2 ** 30), 2 ** 30),
       kind=st.sampled_from(["none", "int32", "int64", "float32", "float64", "2d"]))
def test_add_sinusoidal_offset_same_in_op_and_reference(seed, offset, kind):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 6, 10, generator=g, dtype=torch.float64)
    if kind == "none":
        pos = None
    elif kind == "2d":
        pos = torch.randint(-1000, 1000, (2, 6), generator=g)
    elif kind.startswith("int"):
        pos = torch.randint(-1000, 1000, (6,), generator=g, dtype=getattr(torch, kind))
    else:
        pos = (torch.rand(6, generator=g, dtype=torch.float64) * 1000).to(getattr(torch, kind))
    out = pn.add_sinusoidal(x, pos, offset=offset)
    truth = reference.add_sinusoidal(x, pos, offset=offset)
    # independent: PE at the shifted positions, formed here in float64
    p = (torch.arange(6, dtype=torch.float64) if pos is None else pos.double()) + offset
    w = torch.exp(-torch.log(torch.tensor(1e4, dtype=torch.float64)) * torch.arange(5, dtype=torch.float64) / 5)
    ang = p[..., None] * w
    pe = torch.stack([ang.sin(), ang.cos()], -1).flatten(-2)
    assert rel_err(truth, x + pe) <= 1e-12
    # angles up to 2^30 rad: the op's and the reference's float64 frequencies may differ by an ulp,
    # which moves an angle by up to 2^30 * 2^-52
    assert rel_err(out, truth) <= 1e-6


def test_angle_inputs_requiring_grad_are_refused_not_ignored():
    """The ops differentiate q and k only: cos/sin/inv_freq that want a gradient get an error."""
    q = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    cos = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    sin = torch.randn(5, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="cos requires grad"):
        pn.apply_rotary_pos_emb(q, q.detach(), cos, sin, unsqueeze_dim=2)
    with pytest.raises(RuntimeError, match="inv_freq requires grad"):
        pn.apply_rope(q, inv_freq=inv_freq(8).requires_grad_())
    with pytest.raises(RuntimeError, match="cos requires grad"):
        torch.ops.posenc.rope_cos_sin_(q * 1.0, q.new_empty(1, 5, 0, 8), cos, sin, None, "bshd", False)
    with torch.no_grad():  # no gradient wanted: fine
        pn.apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=2)


def test_numpy_bools_are_bools():
    """A numpy bool (np.True_; its type is named bool_ in numpy 1, bool in numpy 2) is a bool argument;
    other numpy integers are not (the message named the type 'bool' while refusing np.True_)."""
    np = pytest.importorskip("numpy")
    q = torch.randn(1, 6, 2, 16, generator=torch.Generator().manual_seed(5))
    want = reference.apply_rope(q.double(), inv_freq=inv_freq(16), interleaved=True)[0]
    got = pn.apply_rope(q, inv_freq=inv_freq(16), interleaved=np.True_)[0]
    assert rel_err(got, want) <= 1e-6
    assert torch.equal(got, pn.apply_rope(q, inv_freq=inv_freq(16), interleaved=True)[0])
    with pytest.raises(TypeError, match="interleaved must be a bool, got int64"):
        pn.apply_rope(q, inv_freq=inv_freq(16), interleaved=np.int64(2))


@pytest.mark.parametrize("entry", ["config", "mrope_section", "module"])
def test_first_use_in_inference_mode_then_training(entry):
    """The frequencies (and axis masks) kept across calls are ordinary tensors even when first made
    under torch.inference_mode: a model evaluated there and then trained saved an inference tensor
    for backward ("Inference tensors cannot be saved for backward")."""
    cfg = pn.RopeConfig(head_dim=16, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    g = torch.Generator().manual_seed(44)
    q = torch.randn(2, 7, 3, 16, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 500, (2, 7), generator=g)
    module = pn.RotaryEmbedding(cfg)
    calls = {"config": lambda t: pn.apply_rope(t, None, pos, config=cfg)[0],
             "mrope_section": lambda t: pn.apply_rope(t, None, pos, inv_freq=inv_freq(16), mrope_section=[2, 3, 3])[0],
             "module": lambda t: module(t, None, pos)[0]}
    with torch.inference_mode():
        calls[entry](q)
    leaf = q.clone().requires_grad_()
    w = torch.randn(q.shape, generator=g, dtype=torch.float64)
    (calls[entry](leaf) * w).sum().backward()
    # linear in q: the gradient is the transposed rotation of w, the rotation by -angle
    if entry == "mrope_section":
        want = reference.apply_rope(w, None, pos, inv_freq=-inv_freq(16), mrope_section=[2, 3, 3])[0]
    else:
        att = cfg.attention_factor
        want = reference.apply_rope(w, None, pos, inv_freq=-cfg.inv_freq(), attention_factor=att)[0]
    assert rel_err(leaf.grad, want) <= 1e-12
