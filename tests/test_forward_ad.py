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
