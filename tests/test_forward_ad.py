"""Forward-mode AD (torch.func.jvp, torch.autograd.forward_ad): torch drops a custom op's tangents
silently, so the public entries carry them (_forward_ad.py). Tangents are checked against
torch.func.jvp of the float64 reference implementations (plain torch, differentiated by torch)."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import posenc_native as pn
from posenc_native import reference

GEN = torch.Generator().manual_seed(31)
YARN = pn.RopeConfig(head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})


def _randn(*shape):
    return torch.randn(*shape, generator=GEN, dtype=torch.float64)


def _assert_tangents(got, want, atol):
    for g, w in zip(got, want):
        assert w.abs().max() > 0.1  # a real tangent, not zeros
        torch.testing.assert_close(g.double(), w, atol=atol, rtol=0)


@pytest.mark.parametrize("entry", ["apply_rope", "module", "apply_rotary_pos_emb"])
def test_rope_jvp_matches_the_reference(entry):
    q, k = _randn(2, 3, 4, 64), _randn(2, 3, 2, 64)
    tq, tk = _randn(2, 3, 4, 64), _randn(2, 3, 2, 64)
    pos = torch.randint(0, 4000, (2, 3), generator=GEN)
    want = torch.func.jvp(lambda a, b: reference.apply_rope(a, b, pos, YARN), (q, k), (tq, tk))
    if entry == "apply_rope":
        fn = lambda a, b: pn.apply_rope(a.float(), b.float(), pos, config=YARN)  # noqa: E731
    elif entry == "module":
        module = pn.RotaryEmbedding(YARN)
        fn = lambda a, b: module(a.float(), b.float(), pos)  # noqa: E731
    else:
        cos, sin = (t.float() for t in reference.rope_tables(pos, YARN))
        fn = lambda a, b: tuple(t.transpose(1, 2) for t in pn.apply_rotary_pos_emb(  # noqa: E731
            a.float().transpose(1, 2), b.float().transpose(1, 2), cos, sin))
    primal, tangent = torch.func.jvp(fn, (q, k), (tq, tk))
    _assert_tangents(primal, want[0], atol=2e-6)
    _assert_tangents(tangent, want[1], atol=2e-6)


def test_dual_tensors_outside_functorch_take_the_general_path():
    """A dual level without a functorch transform: the decode fast path steps aside (it would drop
    the tangent) and the tangent comes out rotated; in place is refused before any write."""
    q, k = _randn(1, 1, 4, 64).float(), _randn(1, 1, 2, 64).float()
    tq = _randn(1, 1, 4, 64).float()
    pos = torch.tensor([[5000]])
    pn.apply_rope(q, k, pos, config=YARN)  # cached frequencies: the fast path would take the call
    want = reference.apply_rope(tq.double(), None, pos, YARN)[0]
    with fwAD.dual_level():
        out_q, out_k = pn.apply_rope(fwAD.make_dual(q, tq), k, pos, config=YARN)
        torch.testing.assert_close(fwAD.unpack_dual(out_q).tangent.double(), want, atol=2e-6, rtol=0)
        assert torch.equal(out_k, pn.apply_rope(q, k, pos, config=YARN)[1])
        dual = fwAD.make_dual(q.clone(), tq)
        before = fwAD.unpack_dual(dual).primal.clone()
        with pytest.raises(NotImplementedError, match="in place"):
            pn.apply_rope_(dual, k.clone(), pos, config=YARN)
        assert torch.equal(fwAD.unpack_dual(dual).primal, before)


def test_sinusoidal_and_bias_jvp_match_the_reference():
    x, tx = _randn(2, 5, 16), _randn(2, 5, 16)
    want = torch.func.jvp(lambda a: reference.add_sinusoidal(a, x_scale=3.0, offset=7), (x,), (tx,))
    got = torch.func.jvp(lambda a: pn.add_sinusoidal(a, x_scale=3.0, offset=7), (x,), (tx,))
    _assert_tangents(got, want, atol=1e-12)
    w, tw = _randn(32, 4), _randn(32, 4)
    want = torch.func.jvp(lambda a: reference.relative_position_bias(a, 5, 9, bidirectional=False), (w,), (tw,))
    got = torch.func.jvp(lambda a: pn.relative_position_bias(a, 5, 9, bidirectional=False), (w,), (tw,))
    _assert_tangents(got, want, atol=0)
    s, ts = pn.alibi_slopes(6).double(), _randn(6)
    want = torch.func.jvp(lambda a: reference.alibi_bias(a, 5, 9, query_offset=3), (s,), (ts,))
    got = torch.func.jvp(lambda a: pn.alibi_bias(a, 5, 9, query_offset=3), (s,), (ts,))
    _assert_tangents(got, want, atol=1e-12)


def test_tangents_on_other_inputs_are_refused():
    q, k = _randn(1, 3, 4, 64), _randn(1, 3, 2, 64)
    pos = torch.arange(3)[None]
    cos, sin = reference.rope_tables(pos, YARN)
    inv = YARN.inv_freq()
    cases = {
        "cos": lambda: torch.func.jvp(lambda c: pn.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), c, sin),
                                      (cos,), (cos,)),
        "inv_freq": lambda: torch.func.jvp(lambda f: pn.apply_rope(q, k, pos, inv_freq=f), (inv,), (inv,)),
        "positions": lambda: torch.func.jvp(lambda p: pn.sinusoidal_table(p, 16), (pos[0].double(),),
                                            (pos[0].double(),)),
    }
    for name, call in cases.items():
        with pytest.raises(NotImplementedError, match=f"with respect to {name}"):
            call()


def _entries():
    """(name, our function, the reference's, its float64 inputs): each public entry with formulas."""
    pos = torch.randint(0, 4000, (2, 3), generator=GEN)
    cos, sin = reference.rope_tables(pos, YARN)
    k = _randn(2, 3, 2, 64)
    return [
        ("apply_rope", lambda q: pn.apply_rope(q, k, pos, config=YARN)[0],
         lambda q: reference.apply_rope(q, k, pos, YARN)[0], _randn(2, 3, 4, 64)),
        ("apply_rotary_pos_emb", lambda q: pn.apply_rotary_pos_emb(q, k.transpose(1, 2), cos, sin)[0],
         lambda q: reference.apply_rope(q.transpose(1, 2), k, pos, YARN)[0].transpose(1, 2), _randn(2, 4, 3, 64)),
        ("add_sinusoidal", lambda x: pn.add_sinusoidal(x, x_scale=3.0, offset=7),
         lambda x: reference.add_sinusoidal(x, x_scale=3.0, offset=7), _randn(2, 5, 16)),
        ("relative_position_bias", lambda w: pn.relative_position_bias(w, 5, 9, bidirectional=False),
         lambda w: reference.relative_position_bias(w, 5, 9, bidirectional=False), _randn(32, 4)),
        ("alibi_bias", lambda s: pn.alibi_bias(s, 5, 9, query_offset=3),
         lambda s: reference.alibi_bias(s, 5, 9, query_offset=3), _randn(6)),
    ]


@pytest.mark.parametrize("index", range(5), ids=[e[0] for e in _entries()])
def test_hessian_and_jacfwd_match_the_reference(index):
    """Forward over reverse (torch.func.hessian = jacfwd(jacrev)): the backward's ops carry
    tangents too (their jvp formulas), and jacfwd (vmap of jvp) batches them."""
    _, ours, ref, x = _entries()[index]
    weights = _randn(*ours(x).shape)
    loss = lambda f: lambda t: (weights * f(t) ** 2).sum()  # noqa: E731  (quadratic: a non-zero Hessian)
    small = x.flatten()[:40].clone()  # the Hessian of the first 40 entries keeps the test fast

    def on_small(f):
        return lambda s: loss(f)(torch.cat([s, x.flatten()[40:]]).view(x.shape))
    want = torch.func.hessian(on_small(ref))(small)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(torch.func.hessian(on_small(ours))(small), want, atol=1e-9, rtol=0)
    torch.testing.assert_close(torch.func.jacfwd(ours)(x), torch.func.jacfwd(ref)(x), atol=1e-9, rtol=0)


@pytest.mark.parametrize("index", range(5), ids=[e[0] for e in _entries()])
def test_gradcheck_with_every_check(index):
    """torch.autograd.gradcheck's forward-mode and batched checks (vmap over make_dual tangents,
    what OpInfo-based suites enable) and gradgradcheck's, against finite differences."""
    _, ours, _, x = _entries()[index]
    x.requires_grad_()
    checks = dict(check_forward_ad=True, check_backward_ad=True, check_batched_grad=True,
                  check_batched_forward_grad=True, check_undefined_grad=True, fast_mode=True)
    assert torch.autograd.gradcheck(ours, (x,), **checks)
    assert torch.autograd.gradgradcheck(ours, (x,), check_fwd_over_rev=True, check_rev_over_rev=True,
                                        check_batched_grad=True, fast_mode=True)


def test_tangents_through_the_backward_outside_torch_func():
    """Forward over reverse with torch.autograd alone (a dual level, then autograd.grad without
    create_graph): the backward's ops carry the tangent, a Hessian-vector product as the reference's.
    Their tangents were dropped (the backward ran the ops below autograd)."""
    k, pos = _randn(2, 3, 2, 64), torch.randint(0, 4000, (2, 3), generator=GEN)
    weights = _randn(2, 3, 4, 64)
    q, tq = _randn(2, 3, 4, 64), _randn(2, 3, 4, 64)

    def hvp(rotate):
        with fwAD.dual_level():
            x = fwAD.make_dual(q.clone(), tq).requires_grad_()
            g, = torch.autograd.grad((weights * rotate(x) ** 2).sum(), x)
            return fwAD.unpack_dual(g).tangent

    want = hvp(lambda x: reference.apply_rope(x, k, pos, YARN)[0])
    assert want.abs().max() > 0.1
    torch.testing.assert_close(hvp(lambda x: pn.apply_rope(x, k, pos, config=YARN)[0]), want, atol=1e-9, rtol=0)

    def weights_tangent(rotate):  # the tangent on the loss's weights; q rotated in place (a non-leaf)
        with fwAD.dual_level():
            x = q.clone().requires_grad_()
            g, = torch.autograd.grad((fwAD.make_dual(weights, tq) * rotate(x * 1.0) ** 2).sum(), x)
            return fwAD.unpack_dual(g).tangent

    want = weights_tangent(lambda x: reference.apply_rope(x, k, pos, YARN)[0])
    assert want.abs().max() > 0.1
    torch.testing.assert_close(weights_tangent(lambda x: pn.apply_rope_(x, k.clone(), pos, config=YARN)[0]), want,
                               atol=1e-9, rtol=0)
    w, tw, bias_weights = _randn(32, 4), _randn(32, 4), _randn(1, 4, 5, 9)

    def bias_hvp(bias):
        with fwAD.dual_level():
            x = fwAD.make_dual(w.clone(), tw).requires_grad_()
            g, = torch.autograd.grad((bias_weights * bias(x) ** 2).sum(), x)
            return fwAD.unpack_dual(g).tangent
    want = bias_hvp(lambda a: reference.relative_position_bias(a, 5, 9))
    assert want.abs().max() > 0.1
    torch.testing.assert_close(bias_hvp(lambda a: pn.relative_position_bias(a, 5, 9)), want, atol=1e-9, rtol=0)


def test_module_rotation_with_a_tangent_on_cos():
    """RoPEPositionalEncoding.apply_rotary_emb with a tangent on cos: the plain formula runs (the fused
    op is linear in q and k only), as it does for a cos that requires grad."""
    x, cos, sin, t = _randn(2, 2, 3, 8), _randn(3, 8), _randn(3, 8), _randn(3, 8)
    rotate = pn.RoPEPositionalEncoding.apply_rotary_emb
    want = torch.func.jvp(lambda c: x * c + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin, (cos,), (t,))
    got = torch.func.jvp(lambda c: rotate(x, c, sin), (cos,), (t,))
    _assert_tangents(got, want, atol=1e-12)
