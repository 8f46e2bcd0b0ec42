"""torch.func transforms over the ops (posenc_native/_functorch.py). vmap of RoPE: every vmapped slice
against the float64 reference run on that slice alone, on fresh random inputs; the shared-positions
case in one op call (no per-slice fallback), the others slice by slice. grad / vjp / jacrev of every
differentiable entry (they failed before: torch's register_autograd kernel is no torch.func
Function) against autograd through the float64 reference; per-sample gradients through vmap(grad)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posenc_native as pn
from posenc_native import reference

V, B, S, H, KV, D = 3, 2, 9, 4, 2, 32


def _config(**kw) -> pn.RopeConfig:
    return pn.RopeConfig(head_dim=D, base=10000.0, **kw)


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _positions(*shape, seed):
    return torch.randint(0, 5000, shape, generator=torch.Generator().manual_seed(seed))


def _shape(layout, heads):
    return (B, S, heads, D) if layout == "bshd" else (B, heads, S, D)


def _check(got, want, atol=2e-6):
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)


class _OpCalls(TorchDispatchMode):
    """Counts the calls of one op that reach the kernels (below vmap: a per-slice fallback calls it
    once per slice)."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op, self.n = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is self.op
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("positions", ["rows", "one row", "shared", "none"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_vmapped_q_and_k_match_each_slice_in_one_call(layout, positions, interleaved):
    """q and k vmapped (an ensemble), the positions shared: each slice as its own call gives it, and
    torch runs no per-slice fallback (it warns when it does)."""
    cfg = _config(interleaved=interleaved,
                  scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024))
    q = _randn(V, *_shape(layout, H), seed=1)
    k = _randn(V, *_shape(layout, KV), seed=2)
    pos = {"rows": _positions(B, S, seed=3), "one row": _positions(1, S, seed=3), "shared": _positions(S, seed=3),
           "none": None}[positions]
    with _OpCalls(torch.ops.posenc.rope.default) as calls:
        got_q, got_k = torch.func.vmap(lambda a, b: pn.apply_rope(a, b, pos, config=cfg, layout=layout))(q, k)
    assert calls.n == 1
    for i in range(V):
        want_q, want_k = reference.apply_rope(q[i].double(), k[i].double(), pos, cfg, layout=layout)
        _check(got_q[i], want_q)
        _check(got_k[i], want_k)
        # folded into one call, each slice gets the bits of its own call (the kernels are batch invariant)
        alone_q, alone_k = pn.apply_rope(q[i], k[i], pos, config=cfg, layout=layout)
        assert torch.equal(got_q[i], alone_q) and torch.equal(got_k[i], alone_k)


@pytest.mark.parametrize("tables", ["per row", "shared", "gathered by position_ids"])
@pytest.mark.parametrize("captured", [None, "q", "k"])
def test_vmapped_cos_sin_rotation_matches_each_slice_in_one_call(tables, captured):
    """apply_rotary_pos_emb (the op of cos/sin tables) vmapped: folded into one call like the
    frequency op (it ran once per slice, with torch's warning), every slice its own call's bits."""
    cfg = _config(scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024))
    q = _randn(V, B, H, S, D, seed=41)  # transformers' [B, H, S, D]
    k = _randn(V, B, KV, S, D, seed=42)
    pos = _positions(B, S, seed=43)
    cos, sin = (t.float() for t in reference.rope_tables(pos, cfg))  # [B, S, D]
    position_ids = None
    if tables == "shared":
        cos, sin = cos[0], sin[0]  # [S, D]: the rows of batch row 0 for every row
        pos = pos[:1].expand(B, S)
    elif tables == "gathered by position_ids":
        position_ids = pos
        cos, sin = (t.float() for t in reference.rope_tables(torch.arange(5000)[None], cfg))
        cos, sin = cos[0], sin[0]  # [5000, D], indexed by position_ids

    def rotate(a, b):
        return pn.apply_rotary_pos_emb(a, b, cos, sin, position_ids)
    fn = {None: rotate, "q": lambda b: rotate(q[0], b), "k": lambda a: rotate(a, k[0])}[captured]
    args = {None: (q, k), "q": (k,), "k": (q,)}[captured]
    with _OpCalls(torch.ops.posenc.rope_cos_sin.default) as calls:
        got_q, got_k = torch.func.vmap(fn)(*args)
    assert calls.n == (1 if captured is None else 2)  # one call folded (and the captured tensor's own)
    for i in range(V):
        qi, ki = q[0 if captured == "q" else i], k[0 if captured == "k" else i]
        want_q, want_k = reference.apply_rope(qi.double(), ki.double(), pos, cfg, layout="bhsd")
        _check(got_q[i], want_q)
        _check(got_k[i], want_k)
        alone_q, alone_k = rotate(qi, ki)
        assert torch.equal(got_q[i], alone_q) and torch.equal(got_k[i], alone_k)


def test_q_alone_vmapped_and_a_vmapped_dim_not_first():
    """k shared by every slice (captured, not vmapped), q vmapped over its dim 2: q folded, k rotated
    once and handed back unbatched (vmap broadcasts it: one tensor, stride 0 over the slices)."""
    cfg = _config()
    q = _randn(B, S, V, H, D, seed=4)
    k = _randn(B, S, KV, D, seed=5)
    pos = _positions(B, S, seed=6)
    with _OpCalls(torch.ops.posenc.rope.default) as calls:
        got_q, got_k = torch.func.vmap(lambda a: pn.apply_rope(a, k, pos, config=cfg), in_dims=2)(q)
    assert calls.n == 2  # q folded, k once
    assert got_k.shape == (V, *k.shape) and got_k.stride(0) == 0
    want_k = reference.apply_rope(k.double(), None, pos, cfg)[0]
    for i in range(V):
        _check(got_q[i], reference.apply_rope(q[:, :, i].double(), None, pos, cfg)[0])
        _check(got_k[i], want_k)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_k_alone_vmapped_with_a_captured_q(layout):
    """The other way round: q captured, k vmapped (per-slice positions rows repeated as when both are)."""
    cfg = _config(scaling=dict(rope_type="linear", factor=2.0))
    q = _randn(*_shape(layout, H), seed=38)
    k = _randn(V, *_shape(layout, KV), seed=39)
    pos = _positions(B, S, seed=40)
    with _OpCalls(torch.ops.posenc.rope.default) as calls:
        got_q, got_k = torch.func.vmap(lambda b: pn.apply_rope(q, b, pos, config=cfg, layout=layout))(k)
    assert calls.n == 2  # k folded, q once
    assert got_q.shape == (V, *q.shape) and got_q.stride(0) == 0
    for i in range(V):
        want_q, want_k = reference.apply_rope(q.double(), k[i].double(), pos, cfg, layout=layout)
        _check(got_q[i], want_q)
        _check(got_k[i], want_k)


def test_vmapped_positions_or_frequencies_go_slice_by_slice():
    """Positions or frequencies that differ per slice cannot fold: each slice is run on its own."""
    q = _randn(V, B, S, H, D, seed=7)
    k = _randn(V, B, S, KV, D, seed=8)
    pos = _positions(V, B, S, seed=9)
    inv_freq = torch.rand(V, D // 2, generator=torch.Generator().manual_seed(10), dtype=torch.float64) * 0.5 + 1e-3
    got_q, got_k = torch.func.vmap(lambda a, b, p: pn.apply_rope(a, b, p, inv_freq=inv_freq[0]))(q, k, pos)
    for i in range(V):
        want_q, want_k = reference.apply_rope(q[i].double(), k[i].double(), pos[i], inv_freq=inv_freq[0])
        _check(got_q[i], want_q)
        _check(got_k[i], want_k)
    got_q = torch.func.vmap(lambda a, f: pn.apply_rope(a, None, pos[0], inv_freq=f)[0])(q, inv_freq)
    for i in range(V):
        _check(got_q[i], reference.apply_rope(q[i].double(), None, pos[0], inv_freq=inv_freq[i])[0])


def test_length_following_schemes_refuse_vmapped_positions():
    """Dynamic NTK's frequencies follow the positions' maximum, which differs per vmapped slice: a
    clear error (it was torch's "calling .item() under vmap"); shared positions follow their length."""
    cfg = pn.RopeConfig(head_dim=D, max_position_embeddings=16, scaling={"rope_type": "dynamic", "factor": 2.0})
    q = _randn(V, B, S, H, D, seed=12)
    pos = _positions(V, B, S, seed=13) + 40  # past max_position_embeddings: the length matters
    with pytest.raises(ValueError, match="positions tensor vmapped by torch.func.vmap"):
        torch.func.vmap(lambda a, p: pn.apply_rope(a, None, p, config=cfg)[0])(q, pos)
    got = torch.func.vmap(lambda a: pn.apply_rope(a, None, pos[1], config=cfg)[0])(q)
    for i in range(V):
        _check(got[i], reference.apply_rope(q[i].double(), None, pos[1], cfg)[0])


def test_packed_layout_with_cu_seqlens():
    """thd (packed sequences, positions from cu_seqlens) goes slice by slice, each slice exact."""
    cfg = _config()
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    q = _randn(V, 11, H, D, seed=11)
    got_q = torch.func.vmap(lambda a: pn.apply_rope(a, None, None, config=cfg, layout="thd", cu_seqlens=cu)[0])(q)
    for i in range(V):
        _check(got_q[i], reference.apply_rope(q[i].double(), None, None, cfg, layout="thd", cu_seqlens=cu)[0])


def test_mrope_positions_fold():
    """MRoPE positions [3, B, S] shared by the slices are repeated along their batch axis."""
    cfg = _config(mrope_section=(4, 6, 6))
    q = _randn(V, B, S, H, D, seed=12)
    k = _randn(V, B, S, KV, D, seed=13)
    pos = _positions(3, B, S, seed=14)
    got_q, got_k = torch.func.vmap(lambda a, b: pn.apply_rope(a, b, pos, config=cfg))(q, k)
    for i in range(V):
        want_q, want_k = reference.apply_rope(q[i].double(), k[i].double(), pos, cfg)
        _check(got_q[i], want_q)
        _check(got_k[i], want_k)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_half_precision(dtype, atol):
    cfg = _config()
    q = _randn(V, B, S, H, D, seed=15).to(dtype)
    pos = _positions(B, S, seed=16)
    got_q = torch.func.vmap(lambda a: pn.apply_rope(a, None, pos, config=cfg)[0])(q)
    for i in range(V):
        _check(got_q[i], reference.apply_rope(q[i].double(), None, pos, cfg)[0], atol=atol)


def test_per_sample_gradients():
    """vmap(grad): each sample's gradient of a loss through the rotation, against autograd through the
    float64 reference on that sample alone."""
    cfg = _config()
    q = _randn(V, 1, S, H, D, seed=17)
    w = _randn(1, S, H, D, seed=18)
    pos = _positions(1, S, seed=19)

    def loss(x):
        return (pn.apply_rope(x, None, pos, config=cfg)[0] * w).sum()

    got = torch.func.vmap(torch.func.grad(loss))(q)
    for i in range(V):
        x = q[i].double().requires_grad_()
        (reference.apply_rope(x, None, pos, cfg)[0] * w.double()).sum().backward()
        _check(got[i], x.grad)


def _reference_grad(fn, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """d/dx sum(fn(x) * w), by autograd through a float64 implementation."""
    x = x.detach().double().requires_grad_()
    (fn(x) * w.double()).sum().backward()
    return x.grad


def _rotate_half_reference(q, cos, sin):  # transformers' apply_rotary_pos_emb, written out, [B, H, S, D]
    half = q.shape[-1] // 2
    rotated = torch.cat([-q[..., half:], q[..., :half]], -1)
    return q * cos[:, None].double() + rotated * sin[:, None].double()


def test_grad_of_every_differentiable_entry():
    """torch.func.grad of a weighted sum through apply_rope, apply_rotary_pos_emb, add_sinusoidal,
    relative_position_bias, alibi_bias and the bias modules, each against the float64 reference's."""
    cfg = _config(scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024))
    q = _randn(B, S, H, D, seed=20)
    pos = _positions(B, S, seed=21)
    w = _randn(B, S, H, D, seed=22)
    got = torch.func.grad(lambda x: (pn.apply_rope(x, None, pos, config=cfg)[0] * w).sum())(q)
    _check(got, _reference_grad(lambda x: reference.apply_rope(x, None, pos, cfg)[0], q, w))

    angles = pos[..., None].double() * torch.rand(D // 2, generator=torch.Generator().manual_seed(23),
                                                  dtype=torch.float64)
    cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()
    qh, wh = q.transpose(1, 2).contiguous(), w.transpose(1, 2).contiguous()
    got = torch.func.grad(lambda x: (pn.apply_rotary_pos_emb(x, x[:, :1], cos, sin)[0] * wh).sum())(qh)
    _check(got, _reference_grad(lambda x: _rotate_half_reference(x, cos, sin), qh, wh))

    x = _randn(B, S, 64, seed=24)
    wx = _randn(B, S, 64, seed=25)
    got = torch.func.grad(lambda t: (pn.add_sinusoidal(t, x_scale=3.0) * wx).sum())(x)
    _check(got, _reference_grad(lambda t: reference.add_sinusoidal(t, x_scale=3.0), x, wx))

    weight = _randn(32, H, seed=26)
    wb = _randn(1, H, 5, 11, seed=27)
    got = torch.func.grad(lambda t: (pn.relative_position_bias(t, 5, 11, query_offset=3) * wb).sum())(weight)
    _check(got, _reference_grad(lambda t: reference.relative_position_bias(t, 5, 11, query_offset=3), weight, wb),
           atol=1e-5)
    module = pn.T5RelativePositionBias(H)
    got = torch.func.grad(lambda p: (torch.func.functional_call(module, p, (5, 11, 3)) * wb).sum())(
        dict(module.named_parameters()))["relative_attention_bias.weight"]
    want = _reference_grad(lambda t: reference.relative_position_bias(t, 5, 11, query_offset=3),
                           module.relative_attention_bias.weight, wb)
    _check(got, want, atol=1e-5)

    slopes = torch.rand(H, generator=torch.Generator().manual_seed(28))
    got = torch.func.grad(lambda t: (pn.alibi_bias(t, 5, 11, query_offset=2) * wb).sum())(slopes)
    _check(got, _reference_grad(lambda t: reference.alibi_bias(t, 5, 11, query_offset=2), slopes, wb), atol=1e-4)
    module = pn.ALiBi(H)
    got = torch.func.grad(lambda s_: (torch.func.functional_call(module, {"slopes": s_}, (5, 11, 2)) * wb).sum())(
        module.slopes)
    _check(got, _reference_grad(lambda t: reference.alibi_bias(t, 5, 11, query_offset=2), module.slopes, wb),
           atol=1e-4)


def test_vjp_and_jacobian_of_rope():
    """vjp, and the full Jacobian by jacrev: RoPE is a rotation, so its Jacobian is block-diagonal with
    the float64 reference's rotation blocks."""
    cfg = _config()
    q = _randn(1, 3, 2, D, seed=29)
    pos = _positions(1, 3, seed=30)
    out, pullback = torch.func.vjp(lambda x: pn.apply_rope(x, None, pos, config=cfg)[0], q)
    _check(out, reference.apply_rope(q.double(), None, pos, cfg)[0])
    w = _randn(*out.shape, seed=31)
    _check(pullback(w)[0], _reference_grad(lambda x: reference.apply_rope(x, None, pos, cfg)[0], q, w))
    jac = torch.func.jacrev(lambda x: pn.apply_rope(x, None, pos, config=cfg)[0])(q)
    want = torch.autograd.functional.jacobian(lambda x: reference.apply_rope(x, None, pos, cfg)[0], q.double())
    _check(jac, want)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_per_sample_gradients_of_the_bias_weight():
    """vmap(grad) over a batch of bias weights (the fallback runs the bias op per slice): each against
    the reference's gradient for that weight alone."""
    weights = _randn(V, 32, H, seed=32)
    wb = _randn(1, H, 4, 7, seed=33)
    got = torch.func.vmap(torch.func.grad(lambda t: (pn.relative_position_bias(t, 4, 7) * wb).sum()))(weights)
    for i in range(V):
        _check(got[i], _reference_grad(lambda t: reference.relative_position_bias(t, 4, 7), weights[i], wb), atol=1e-5)


def test_in_place_rope_under_vmap_and_grad():
    """apply_rope_ under a transform: the out-of-place op copied back into q and k (the in-place op
    has no torch.func rule; vmap and grad both refused it before)."""
    cfg = _config()
    q = _randn(V, B, S, H, D, seed=34)
    k = _randn(V, B, S, KV, D, seed=35)
    pos = _positions(B, S, seed=36)

    def rotate(a, b):
        a, b = a.clone(), b.clone()
        pn.apply_rope_(a, b, pos, config=cfg)
        return a, b

    got_q, got_k = torch.func.vmap(rotate)(q, k)
    for i in range(V):
        want_q, want_k = reference.apply_rope(q[i].double(), k[i].double(), pos, cfg)
        _check(got_q[i], want_q)
        _check(got_k[i], want_k)
    w = _randn(B, S, H, D, seed=37)
    got = torch.func.grad(lambda a: (rotate(a * 1.0, k[0])[0] * w).sum())(q[0])
    _check(got, _reference_grad(lambda x: reference.apply_rope(x, None, pos, cfg)[0], q[0], w))


def _rotate_views_of(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """apply_rope_ of two overlapping views of a copy of x [B, S + 1, H, D] with inv_freq (what the
    refusal test differentiates with respect to inv_freq)."""
    t = x.clone()
    pn.apply_rope_(t[:, :S], t[:, 1:], _positions(S, seed=41), inv_freq=inv_freq)
    return t


@pytest.mark.parametrize("case", ["q and k overlap", "q and k overlap, grad", "q and k overlap, grad of inv_freq",
                                  "expanded k", "captured k, vmapped positions", "captured k, grad"])
def test_in_place_rope_under_a_transform_refused_before_any_write(case):
    """What eager apply_rope_ refuses (q and k sharing memory, an expanded k), and what torch.func
    cannot write back (a k outside the transform whose rotation varies with it), are refused under a
    transform too, before q is written (the emulation copies q back first)."""
    cfg = _config()
    x = _randn(V, B, S + 1, H, D, seed=38)
    q, k = _randn(V, B, S, H, D, seed=39), _randn(B, S, KV, D, seed=40)
    pos, positions = _positions(S, seed=41), _positions(V, S, seed=42)
    calls = {
        "q and k overlap": (lambda: torch.func.vmap(lambda t: pn.apply_rope_(t[:, :S], t[:, 1:], pos, config=cfg))(x),
                            "q and k must not share memory"),
        "q and k overlap, grad": (lambda: torch.func.grad(lambda t: pn.apply_rope_(t[:, :S], t[:, 1:], pos,
                                                                                   config=cfg)[0].sum())(x[0] * 1.0),
                                  "q and k must not share memory"),
        # (inv_freq wanting a gradient is not threaded through the check, which then takes none)
        "q and k overlap, grad of inv_freq": (lambda: torch.func.grad(lambda f: _rotate_views_of(x[0], f).sum())(
            cfg.inv_freq()), "q and k must not share memory"),
        "expanded k": (lambda: torch.func.vmap(lambda a: pn.apply_rope_(a, k[:, :, :1].expand(B, S, KV, D), pos,
                                                                        config=cfg))(q), "k must not have elements that share"),
        "captured k, vmapped positions": (lambda: torch.func.vmap(lambda a, p: pn.apply_rope_(a, k, p, config=cfg))(
            q, positions), "k is not an input of the torch.func transform"),
        "captured k, grad": (lambda: torch.func.grad(lambda a: pn.apply_rope_(a * 1.0, k, pos, config=cfg)[0].sum())(q[0]),
                             "k is not an input of the torch.func transform"),
    }
    before = [t.clone() for t in (x, q, k)]
    call, message = calls[case]
    with pytest.raises(RuntimeError, match=message):
        call()
    assert all(torch.equal(t, b) for t, b in zip((x, q, k), before))
    # the same q and k out of place: every slice as the reference gives it
    if case == "q and k overlap":
        got_q, got_k = torch.func.vmap(lambda t: pn.apply_rope(t[:, :S], t[:, 1:], pos, config=cfg))(x)
        want_q, want_k = reference.apply_rope(x[1, :, :S].double(), x[1, :, 1:].double(), pos, cfg)
        _check(got_q[1], want_q)
        _check(got_k[1], want_k)


def test_in_place_rope_of_fused_qkv_views_under_a_transform():
    """q and k views of one fused qkv buffer (rows interleaved, no element shared) rotate in place
    under vmap and grad as in eager: the overlap test is the op's exact one (a byte-range test once
    refused them), v untouched, every slice and gradient the reference's."""
    cfg = _config()
    qkv = _randn(V, B, S, 3, H, D, seed=43)
    pos = _positions(S, seed=44)

    def rotate(t):
        t = t.clone()
        pn.apply_rope_(t[:, :, 0], t[:, :, 1], pos, config=cfg)
        return t

    got = torch.func.vmap(rotate)(qkv)
    for i in range(V):
        want_q, want_k = reference.apply_rope(qkv[i, :, :, 0].double(), qkv[i, :, :, 1].double(), pos, cfg)
        _check(got[i, :, :, 0], want_q)
        _check(got[i, :, :, 1], want_k)
        assert torch.equal(got[i, :, :, 2], qkv[i, :, :, 2])
    w = _randn(B, S, H, D, seed=45)
    grad = torch.func.grad(lambda t: (rotate(t)[:, :, 0] * w).sum())(qkv[0])
    _check(grad[:, :, 0], _reference_grad(lambda x: reference.apply_rope(x, None, pos, cfg)[0], qkv[0, :, :, 0], w))
    assert not grad[:, :, 1:].any()


@pytest.mark.parametrize("bias", ["t5", "alibi"])
def test_vmapped_bias_parameters_fold_into_the_heads(bias):
    """The biases vmapped over their parameter (an ensemble of T5 weights or ALiBi slopes; their
    per-sample gradients): one call of the op and of its backward, the vmapped dim folded into the
    heads (each head reads only its own column or slope), every slice its own call's bits."""
    g = torch.Generator().manual_seed(44)
    if bias == "t5":
        params = torch.randn(V, 32, H, generator=g, dtype=torch.float64)
        op, backward = torch.ops.posenc.relative_position_bias.default, torch.ops.posenc.relative_position_bias_backward.default
        fn = lambda p: pn.relative_position_bias(p, 5, 9, bidirectional=False, query_offset=3)  # noqa: E731
        ref = lambda p: reference.relative_position_bias(p, 5, 9, bidirectional=False, query_offset=3)  # noqa: E731
    else:
        params = torch.rand(V, H, generator=g, dtype=torch.float64) + 0.01
        op, backward = torch.ops.posenc.alibi_bias.default, torch.ops.posenc.alibi_bias_backward.default
        fn = lambda p: pn.alibi_bias(p, 5, 9, query_offset=3)  # noqa: E731
        ref = lambda p: reference.alibi_bias(p, 5, 9, query_offset=3)  # noqa: E731
    weights = torch.randn(1, H, 5, 9, generator=g, dtype=torch.float64)
    with _OpCalls(op) as calls:
        got = torch.func.vmap(fn)(params)
    assert calls.n == 1
    loss = lambda f: lambda p: (weights * f(p) ** 2).sum()  # noqa: E731
    with _OpCalls(backward) as calls:
        got_grads = torch.func.vmap(torch.func.grad(loss(fn)))(params)
    assert calls.n == 1
    for i in range(V):
        assert torch.equal(got[i], fn(params[i]))
        torch.testing.assert_close(got[i], ref(params[i]), atol=1e-12, rtol=0)
        torch.testing.assert_close(got_grads[i], torch.func.grad(loss(ref))(params[i]), atol=1e-12, rtol=0)


_SINUSOIDAL_VMAPS = [(rank, positions, at) for rank in (2, 3)
                     for positions in ("none", "shared", "per row", "one row", "vmapped", "vmapped per row")
                     for at in (0, 1, None)
                     if (at is not None or positions.startswith("vmapped"))  # something vmapped
                     and (rank == 3 or positions in ("none", "shared", "vmapped"))]  # [seq, dim] x: [seq] positions


@pytest.mark.parametrize("x_rank, positions, x_vmapped_at", _SINUSOIDAL_VMAPS)
def test_vmapped_add_sinusoidal_folds_into_its_rows(x_rank, positions, x_vmapped_at):
    """add_sinusoidal vmapped over x (an ensemble, per-sample gradients) and/or its positions (a
    batch of timesteps): one call of the op, the vmapped dim folded into its rows, every slice the
    float64 reference's values and its own call's bits."""
    g = torch.Generator().manual_seed(45)
    shape = (B, S, D + 1) if x_rank == 3 else (S, D + 1)  # (an odd dim: its last column is x alone)
    x = torch.randn(V, *shape, generator=g, dtype=torch.float64)
    pos = {"none": None, "shared": torch.randint(0, 5000, (S,), generator=g),
           "per row": torch.randint(0, 5000, (B, S), generator=g), "one row": torch.randint(0, 5000, (1, S), generator=g),
           "vmapped": torch.rand(V, S, generator=g, dtype=torch.float64) * 900,
           "vmapped per row": torch.randint(0, 5000, (V, B, S), generator=g, dtype=torch.int32)}[positions]
    pos_vmapped = positions.startswith("vmapped")
    x_arg = x if x_vmapped_at is None else x.movedim(0, x_vmapped_at)
    x_slice = (lambda i: x[0]) if x_vmapped_at is None else (lambda i: x[i])
    in_dims = (x_vmapped_at, 0 if pos_vmapped else None)
    fn = lambda t, p: pn.add_sinusoidal(t, p, offset=11, x_scale=1.5, interleaved=False)  # noqa: E731
    with _OpCalls(torch.ops.posenc.add_sinusoidal.default) as calls:
        got = torch.func.vmap(fn, in_dims=in_dims)(x_arg if x_vmapped_at is not None else x[0], pos)
    assert calls.n == 1
    for i in range(V):
        p = pos[i] if pos_vmapped else pos
        want = reference.add_sinusoidal(x_slice(i), p, offset=11, x_scale=1.5, interleaved=False)
        torch.testing.assert_close(got[i], want, atol=1e-12, rtol=0)
        assert torch.equal(got[i], fn(x_slice(i), p))


def test_vmapped_sinusoidal_table_is_one_table():
    g = torch.Generator().manual_seed(46)
    timesteps = torch.rand(V, 5, generator=g, dtype=torch.float64) * 1000  # a batch of diffusion timesteps per slice
    fn = lambda t: pn.sinusoidal_table(t, 33, freq_shift=1.0, cos_first=True, dtype=torch.float64)  # noqa: E731
    with _OpCalls(torch.ops.posenc.sinusoidal_table.default) as calls:
        got = torch.func.vmap(fn)(timesteps)
    assert calls.n == 1
    for i in range(V):
        want = reference.sinusoidal_table(timesteps[i], 33, freq_shift=1.0, cos_first=True)
        torch.testing.assert_close(got[i], want, atol=1e-12, rtol=0)
        assert torch.equal(got[i], fn(timesteps[i]))
