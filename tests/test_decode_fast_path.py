"""The decode fast path of apply_rope / apply_rope_ with config= (ops.py, _rope_direct): when it
is taken the results and torch's in-place rules are those of the general path, and it steps aside
whenever something must record or intercept the call (grad mode, modes, the profiler, inference
tensors)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posenc_native as pn
from posenc_native import ops, reference

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
GEN = torch.Generator().manual_seed(9)


def _config(interleaved: bool = False, partial: bool = False) -> pn.RopeConfig:
    return pn.RopeConfig(head_dim=64, base=500000.0, max_position_embeddings=131072, scaling=LLAMA3,
                         interleaved=interleaved, rotary_dim=32 if partial else None)


def _decode_inputs(B: int = 3, dtype=torch.float32):
    q = torch.randn(B, 1, 4, 64, generator=GEN, dtype=torch.float64).to(dtype)
    k = torch.randn(B, 1, 2, 64, generator=GEN, dtype=torch.float64).to(dtype)
    pos = torch.randint(0, 100_000, (B, 1), generator=GEN)
    return q, k, pos


def _warm(config: pn.RopeConfig) -> None:
    """A config's first call takes the general path and caches its CPU frequencies."""
    q, k, pos = _decode_inputs()
    pn.apply_rope(q, k, pos, config=config)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_matches_reference(interleaved, partial, dtype):
    config = _config(interleaved, partial)
    _warm(config)
    q, k, pos = _decode_inputs(dtype=dtype)
    assert ops._rope_direct(q.clone(), k.clone(), pos, config, "bshd", 7, True) is not None  # the path under test
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config, offset=7)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    got_q, got_k = pn.apply_rope(q, k, pos, config=config, offset=7)
    assert got_q.dtype == dtype and not torch.equal(got_q, q)
    torch.testing.assert_close(got_q.double(), want_q, atol=tol, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=tol, rtol=0)
    q2, k2 = q.clone(), k.clone()
    out_q, out_k = pn.apply_rope_(q2, k2, pos, config=config, offset=7)
    assert out_q is q2 and out_k is k2
    assert torch.equal(q2, got_q) and torch.equal(k2, got_k)  # the same kernel, in place


def test_fast_path_bumps_versions_and_stale_backward_is_caught():
    config = _config()
    _warm(config)
    x = torch.randn(2, 1, 4, 64, generator=GEN, requires_grad=True)
    y = x * 2
    z = y.sin()
    k = torch.randn(2, 1, 2, 64, generator=GEN)
    pos = torch.tensor([[5], [9]])
    vy, vk = y._version, k._version
    with torch.no_grad():
        assert ops._rope_direct(y.clone(), k.clone(), pos, config, "bshd", 0, True) is not None  # the path under test
        pn.apply_rope_(y, k, pos, config=config)
    assert y._version > vy and k._version > vk
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_fast_path_steps_aside_for_grad_and_inference_tensors():
    config = _config()
    _warm(config)
    leaf = torch.randn(1, 1, 4, 64, generator=GEN, requires_grad=True)
    k = torch.randn(1, 1, 2, 64, generator=GEN)
    pos = torch.tensor([[3]])
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        pn.apply_rope_(leaf, k, pos, config=config)
    assert torch.equal(leaf.detach(), before)
    # a non-leaf under grad mode is recorded: its gradient is the inverse rotation
    w = leaf * 1.0
    pn.apply_rope_(w, k.clone(), pos, config=config)
    g = torch.randn(w.shape, generator=GEN)
    (w * g).sum().backward()
    # d/dx <R x, g> = R^T g (R orthogonal: llama3 has attention factor 1), so R of the gradient is g
    back, _ = pn.apply_rope(leaf.grad, None, pos, config=config)
    torch.testing.assert_close(back, g, atol=1e-5, rtol=0)
    with torch.inference_mode():
        t = torch.randn(1, 1, 4, 64)
        kt = torch.randn(1, 1, 2, 64)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        pn.apply_rope_(t, kt, pos, config=config)
    with torch.inference_mode():
        got, _ = pn.apply_rope_(t.clone(), kt.clone(), pos, config=config)
    want, _ = reference.apply_rope(t.double(), None, pos, config)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("in_place", [False, True])
def test_fast_path_steps_aside_for_modes_and_profiler(in_place):
    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    call = pn.apply_rope_ if in_place else pn.apply_rope
    name = "posenc.rope_.default" if in_place else "posenc.rope.default"
    with _Seen() as mode:
        call(q.clone(), k.clone(), pos, config=config)
    assert name in mode.ops
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call(q.clone(), k.clone(), pos, config=config)
    assert any(e.name == name.rsplit(".", 1)[0].replace(".", "::") for e in prof.events())


def test_module_fast_path_matches_reference_and_leaves_inputs():
    config = _config()
    module = pn.RotaryEmbedding(config)
    _warm(config)
    q, k, pos = _decode_inputs()
    q0, k0 = q.clone(), k.clone()
    assert ops._rope_direct(q, k, pos, config, "bshd", 0) is not None  # the path under test
    got_q, got_k = module(q, k, pos)
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # out of place
    with _Seen() as mode:  # a mode sees the op
        module(q, k, pos)
    assert "posenc.rope.default" in mode.ops


@pytest.mark.parametrize("plain_first", [False, True])
def test_fast_path_mrope_uses_the_axis_frequencies(plain_first):
    """An MRoPE config caches two CPU frequency forms (1-D inv_freq_on, the ops' [axes, pairs]); the
    fast path must take the latter, whichever was filled first, so per-axis positions work there."""
    config = pn.RopeConfig(head_dim=64, base=1000000.0, mrope_section=(8, 12, 12))
    if plain_first:
        config.inv_freq_on("cpu")
    q = torch.randn(2, 1, 4, 64, generator=GEN, dtype=torch.float64).float()
    k = torch.randn(2, 1, 2, 64, generator=GEN, dtype=torch.float64).float()
    pos = torch.randint(0, 5000, (3, 2, 1), generator=GEN)  # time, height, width ids differ
    pn.apply_rope(q, k, pos, config=config)  # the first call caches; then the fast path is taken
    assert ops._rope_direct(q.clone(), k.clone(), pos, config, "bshd", 0, True) is not None
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    q2, k2 = q.clone(), k.clone()
    pn.apply_rope_(q2, k2, pos, config=config)
    torch.testing.assert_close(q2.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(k2.double(), want_k, atol=2e-6, rtol=0)
