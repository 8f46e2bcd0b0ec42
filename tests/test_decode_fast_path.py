"""The decode fast path of apply_rope / apply_rope_ with config= and RotaryEmbedding (ops.py,
_rope): when it is taken the results and torch's in-place rules are those of the general path, it
refuses exactly the calls the general path refuses, and it steps aside whenever something must
record or intercept the call (grad, modes, the profiler, inference tensors outside inference mode)."""
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


def _watch_fast_path():
    """A function that returns the fast path's kernel runs since now, per op ({"rope_": 1}; the
    _direct extension counts them)."""
    start = ops._FAST.taken()

    def runs() -> dict:
        now = ops._FAST.taken()
        return {op: n - start[op] for op, n in now.items() if n != start[op]}
    return runs


@pytest.fixture(params=["as built", "redispatch"])
def kernel_way(request):
    """The fast path's way to the kernel: as this torch allows (the direct entry from 2.14), and the
    op's redispatch, which older torches get (bound to no op library's entry for the test): the
    redispatch coerces what the direct entry declines (an int for a bool), so the extension's own
    type tests must keep the two ways alike."""
    fast = ops._FAST  # (a test may switch ops._FAST off)
    if request.param == "redispatch":
        assert fast.bind("/nonexistent/libposenc_ops.so", ops._FAST_PATH_OBJECTS) is False
        try:
            yield request.param
        finally:
            fast.bind(pn.build_info()["library"], ops._FAST_PATH_OBJECTS)
    else:
        yield request.param


def _refusals_on_both_paths(call, monkeypatch) -> list:
    """The (type, message's first line) of the error ``call()`` raises with the fast path on, then
    off (:func:`_both_paths`): a bad call must raise the same on both."""
    errors, _ = _both_paths(monkeypatch, call)
    for error in errors:
        assert isinstance(error, tuple) and isinstance(error[0], type) and issubclass(
            error[0], (TypeError, ValueError, RuntimeError)), f"not refused: {error!r}"
    return errors


def _python_calls(call) -> set:
    """The names of the Python functions call() runs (sys.setprofile): whether module_call ran a
    module's forward or nn.Module.__call__, or neither."""
    import sys
    names = set()
    sys.setprofile(lambda frame, event, arg: names.add(frame.f_code.co_name) if event == "call" else None)
    try:
        call()
    finally:
        sys.setprofile(None)
    return names


def _each_hook_runs(module: torch.nn.Module, call, want: torch.Tensor) -> None:
    """Each forward (pre-)hook, the module's own or global, registered on its own, runs when call()
    calls the module (module_call notices every one), and call() still gives want."""
    seen = []
    registers = (lambda: module.register_forward_pre_hook(lambda m, args: seen.append(1)),
                 lambda: module.register_forward_hook(lambda m, args, out: seen.append(1)),
                 lambda: torch.nn.modules.module.register_module_forward_pre_hook(lambda m, args: seen.append(1)),
                 lambda: torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(1)))
    for register in registers:
        handle = register()
        got = call()
        handle.remove()
        assert seen == [1]
        seen.clear()
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)
    call()
    assert seen == []


def _bad_calls_raise_as_nn_module_does(module: torch.nn.Module, calls) -> None:
    """Each (args, kwargs) of calls raises the TypeError nn.Module.__call__ raises for it (module_call
    declines what forward would not bind)."""
    for args, kwargs in calls:
        errors = []
        for call in (module, lambda *a, **kw: torch.nn.Module.__call__(module, *a, **kw)):
            with pytest.raises(TypeError) as e:
                call(*args, **kwargs)
            errors.append(str(e.value))
        assert errors[0] == errors[1]


def _warm(config: pn.RopeConfig) -> None:
    """A config's first call takes the general path and caches its CPU frequencies."""
    q, k, pos = _decode_inputs()
    pn.apply_rope(q, k, pos, config=config)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_matches_reference(interleaved, partial, dtype, monkeypatch):
    config = _config(interleaved, partial)
    _warm(config)
    q, k, pos = _decode_inputs(dtype=dtype)
    calls = _watch_fast_path()
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config, offset=7)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    got_q, got_k = pn.apply_rope(q, k, pos, config=config, offset=7)
    assert calls() == {"rope": 1}  # the path under test
    assert got_q.dtype == dtype and not torch.equal(got_q, q)
    torch.testing.assert_close(got_q.double(), want_q, atol=tol, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=tol, rtol=0)
    q2, k2 = q.clone(), k.clone()
    out_q, out_k = pn.apply_rope_(q2, k2, pos, config=config, offset=7)
    assert calls() == {"rope": 1, "rope_": 1}
    assert out_q is q2 and out_k is k2
    assert torch.equal(q2, got_q) and torch.equal(k2, got_k)  # the same kernel, in place


def test_fast_path_bumps_versions_and_stale_backward_is_caught(monkeypatch):
    config = _config()
    _warm(config)
    x = torch.randn(2, 1, 4, 64, generator=GEN, requires_grad=True)
    y = x * 2
    z = y.sin()
    k = torch.randn(2, 1, 2, 64, generator=GEN)
    pos = torch.tensor([[5], [9]])
    vy, vk = y._version, k._version
    calls = _watch_fast_path()
    with torch.no_grad():
        pn.apply_rope_(y.detach(), k, pos, config=config)  # (y itself requires grad: the general path)
    assert calls() == {"rope_": 1}  # the path under test
    assert y._version > vy and k._version > vk
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_fast_path_steps_aside_for_grad_and_inference_tensors(monkeypatch):
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
    calls = _watch_fast_path()
    with torch.inference_mode():  # inside inference mode, inference tensors may be written: the fast path
        got, _ = pn.apply_rope_(t.clone(), kt.clone(), pos, config=config)
    assert calls() == {"rope_": 1}
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


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_jit_trace_records_the_op_of_every_entry():
    """torch.jit.trace records ops through the dispatcher, so the fast path steps aside while a
    tracer is active: each entry's trace holds the posenc op and reruns on new inputs as eager does."""
    config = _config()
    _warm(config)
    module = pn.RotaryEmbedding(config)
    angles = lambda pos: torch.cat((pos[..., None] * config.inv_freq().double(),) * 2, -1)  # noqa: E731
    entries = {
        "posenc::rope": lambda q, k, pos: pn.apply_rope(q, k, pos, config=config),
        "posenc::rope_": lambda q, k, pos: pn.apply_rope_(q.clone(), k.clone(), pos, config=config),
        "module posenc::rope": lambda q, k, pos: module(q, k, pos),
        "posenc::rope_cos_sin": lambda q, k, pos: pn.apply_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), angles(pos).cos().float(), angles(pos).sin().float()),
    }
    for name, entry in entries.items():
        traced = torch.jit.trace(entry, _decode_inputs())  # (its sanity check: a second trace, the same graph)
        assert name.split()[-1] in str(traced.graph), name
        q, k, pos = _decode_inputs()
        for got, want in zip(traced(q, k, pos), entry(q, k, pos)):
            assert not torch.equal(got, q if got.shape[-2] == 4 else k)
            torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_module_call_holds_config_and_layout_for_the_call_and_no_longer():
    """module_call takes its own references to the module's config and layout for the call (a
    q-only call runs Python in the middle, where another thread could rebind them and free the
    borrowed objects), and releases them: the reference counts are unchanged after many calls."""
    import sys
    module = pn.RotaryEmbedding(_config())
    q, k, pos = _decode_inputs()
    for call in (lambda: module(q, k, pos), lambda: module(q), lambda: module(q, None, pos, 3)):
        call()
        before = sys.getrefcount(module.config), sys.getrefcount(module.layout)
        for _ in range(100):
            call()
        assert (sys.getrefcount(module.config), sys.getrefcount(module.layout)) == before


def test_module_call_is_nn_modules_call(monkeypatch):
    """RotaryEmbedding.__call__ (the extension's module_call) skips nn.Module.__call__'s Python only
    where that would call forward straight away: hooks of the module's or global ones still run,
    a subclass's forward is called, keyword arguments work, bad calls raise forward's TypeError,
    and module.compile() is honoured."""
    config = _config()
    _warm(config)
    module = pn.RotaryEmbedding(config)
    q, k, pos = _decode_inputs()
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config, offset=3)
    calls = _watch_fast_path()
    for got in (module(q, k, pos, 3), module(q, k=k, positions=pos, offset=3), module(q, k, offset=3, positions=pos)):
        torch.testing.assert_close(got[0].double(), want_q, atol=2e-6, rtol=0)
        torch.testing.assert_close(got[1].double(), want_k, atol=2e-6, rtol=0)
    assert calls() == {"rope": 3}
    for call in (lambda: module(q, k, pos, 3), lambda: module(q, k, pos), lambda: module(q, k=k, positions=pos),
                 lambda: module(q, positions=pos), lambda: module(q=q, k=k, positions=pos)):  # forward's defaults too
        assert not _python_calls(call) & {"forward", "_call_impl", "_wrapped_call_impl"}
    got_q, none = module(q, positions=pos, offset=3)
    assert none is None  # (q alone: the general path)
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)

    _each_hook_runs(module, lambda: module(q, k, pos, 3)[0], want_q)
    doubled = module.register_forward_hook(lambda m, args, out: (out[0] * 2, out[1]))  # a hook's result counts
    torch.testing.assert_close(module(q, k, pos, 3)[0].double(), 2 * want_q, atol=4e-6, rtol=0)
    doubled.remove()

    patched = pn.RotaryEmbedding(config)
    patched.forward = lambda q, k=None, positions=None, offset=0, cu_seqlens=None: ("patched", offset)
    assert patched(q, k, pos, 3) == ("patched", 3)  # a forward set on the instance is the one called
    original = pn.RotaryEmbedding.forward
    monkeypatch.setattr(pn.RotaryEmbedding, "forward", lambda self, *args: ("class", len(args)))
    assert module(q, k, pos, 3) == ("class", 4)  # and one set on the class
    monkeypatch.setattr(pn.RotaryEmbedding, "forward", original)

    class Scaled(pn.RotaryEmbedding):
        def forward(self, q, k=None, positions=None, offset=0, cu_seqlens=None):
            out_q, out_k = super().forward(q, k, positions, offset, cu_seqlens)
            return out_q * 3, out_k
    torch.testing.assert_close(Scaled(config)(q, k, pos, 3)[0].double(), 3 * want_q, atol=6e-6, rtol=0)

    _bad_calls_raise_as_nn_module_does(module, (((), {}), ((q, k, pos), {"bogus": 1}), ((q, k, pos, 0, None, 1), {}),
                                                ((q,), {"q": q})))

    module.compile(backend="eager")
    torch.testing.assert_close(module(q, k, pos, 3)[0].double(), want_q, atol=2e-6, rtol=0)
    assert module._compiled_call_impl is not None


def test_sinusoidal_module_call_is_nn_modules_call(monkeypatch):
    """SinusoidalPositionalEncoding.__call__ is module_call too: a plain module with no hooks adds
    the encoding on the fast path (reference values, positional and keyword offsets, the default);
    hooks, a forward set on the instance or the class, a subclass, a bad call, a wrong d_model, a
    d_model that is no int, and module.compile() all take nn.Module.__call__ as before."""
    module = pn.SinusoidalPositionalEncoding(32)
    x = torch.randn(2, 1, 32, generator=GEN)
    calls = _watch_fast_path()
    for got, offset in ((module(x, 7), 7), (module(x, offset=7), 7), (module(x=x, offset=7), 7), (module(x), 0)):
        torch.testing.assert_close(got.double(), reference.add_sinusoidal(x.double(), offset=offset), atol=2e-6, rtol=0)
    assert calls() == {"add_sinusoidal": 4}
    for call in (lambda: module(x, 7), lambda: module(x), lambda: module(x=x)):  # the path under test
        assert not _python_calls(call) & {"forward", "_call_impl", "_wrapped_call_impl"}
    with torch.no_grad():  # (grad mode is no hook: the same path)
        assert "forward" not in _python_calls(lambda: module(x, 7))
    assert "forward" in _python_calls(lambda: module(x.requires_grad_(), 7))  # declined: nn.Module.__call__
    x.requires_grad_(False)
    want = reference.add_sinusoidal(x.double(), offset=7)

    _each_hook_runs(module, lambda: module(x, 7), want)
    doubled = module.register_forward_hook(lambda m, args, out: out * 2)  # a hook's result counts
    torch.testing.assert_close(module(x, 7).double(), 2 * want, atol=4e-6, rtol=0)
    doubled.remove()

    patched = pn.SinusoidalPositionalEncoding(32)
    patched.forward = lambda x, offset=0: ("patched", offset)
    assert patched(x, 3) == ("patched", 3)
    monkeypatch.setattr(pn.SinusoidalPositionalEncoding, "forward", lambda self, *args: ("class", len(args)))
    assert module(x, 3) == ("class", 2)
    monkeypatch.undo()

    class Scaled(pn.SinusoidalPositionalEncoding):
        def forward(self, x, offset=0):
            return super().forward(x, offset) * 3
    torch.testing.assert_close(Scaled(32)(x, 7).double(), 3 * want, atol=6e-6, rtol=0)

    _bad_calls_raise_as_nn_module_does(module, (((), {}), ((x,), {"bogus": 1}), ((x, 0, 1), {}), ((x,), {"x": x})))
    calls = _watch_fast_path()
    with pytest.raises(ValueError, match="x's last dim must be d_model=32"):
        module(torch.randn(2, 1, 16, generator=GEN))
    odd = pn.SinusoidalPositionalEncoding(32)
    odd.d_model = 32.0  # not an int: forward's own check decides (and passes: 32 == 32.0)
    torch.testing.assert_close(odd(x, 7).double(), want, atol=2e-6, rtol=0)
    assert calls() == {"add_sinusoidal": 1}  # forward's own call of the op, not module_call's

    module.compile(backend="eager")
    torch.testing.assert_close(module(x, 7).double(), want, atol=2e-6, rtol=0)
    assert module._compiled_call_impl is not None


def test_module_fast_path_matches_reference_and_leaves_inputs(monkeypatch):
    config = _config()
    module = pn.RotaryEmbedding(config)
    _warm(config)
    q, k, pos = _decode_inputs()
    q0, k0 = q.clone(), k.clone()
    calls = _watch_fast_path()
    got_q, got_k = module(q, k, pos)
    assert calls() == {"rope": 1}  # the path under test
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # out of place
    with _Seen() as mode:  # a mode sees the op
        module(q, k, pos)
    assert "posenc.rope.default" in mode.ops


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_q_alone_takes_the_fast_path(interleaved, dtype):
    """q without k (k=None) takes the fast path on every entry and gives the reference and the
    general path's results: None for k, q rotated (in place: q itself, its version bumped)."""
    config = _config(interleaved)
    _warm(config)
    module = pn.RotaryEmbedding(config)
    q, _, pos = _decode_inputs(dtype=dtype)
    want_q, _ = reference.apply_rope(q.double(), None, pos, config, offset=3)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    calls = _watch_fast_path()
    got_q, got_k = pn.apply_rope(q, None, pos, config=config, offset=3)
    mod_q, mod_k = module(q, positions=pos, offset=3)
    assert calls() == {"rope": 2}  # the path under test
    assert got_k is None and mod_k is None
    torch.testing.assert_close(got_q.double(), want_q, atol=tol, rtol=0)
    assert torch.equal(mod_q, got_q)
    q2 = q.clone()
    version = q2._version
    out_q, out_k = pn.apply_rope_(q2, None, pos, config=config, offset=3)
    assert calls() == {"rope": 2, "rope_": 1}
    assert out_q is q2 and out_k is None and q2._version > version
    assert torch.equal(q2, got_q)
    general_q, _ = ops._rope(False, q, None, pos, config, None, None, None, "bshd", 3, None, None, None, None)
    assert torch.equal(general_q, got_q)  # ops._rope is the general path: no fast path inside


def test_q_alone_after_inference_mode_keeps_the_fast_path():
    """The zero-head k kept for q-only calls is an ordinary tensor even when first made in
    inference mode, so later in-place calls outside it still take the fast path, with the same
    results."""
    config = _config()
    _warm(config)
    q, _, pos = _decode_inputs()
    ops._EMPTY_KS.clear()
    with torch.inference_mode():
        q_inf = q.clone()
        pn.apply_rope_(q_inf, None, pos, config=config)
    calls = _watch_fast_path()
    q2 = q.clone()
    pn.apply_rope_(q2, None, pos, config=config)
    assert calls() == {"rope_": 1}
    assert torch.equal(q2, q_inf)
    want, _ = reference.apply_rope(q.double(), None, pos, config)
    torch.testing.assert_close(q2.double(), want, atol=2e-6, rtol=0)


def test_q_alone_under_vmap_leaves_no_wrapped_k_for_later_calls(capfd):
    """A q-only call under vmap takes the general path without making the fast path's kept zero-head
    k from the vmapped q: a wrapped k kept there reached every later plain call of that shape (the
    op refused it there, printing a C++ exception report each time, and the general path took over)."""
    config = _config()
    _warm(config)
    q, _, pos = _decode_inputs()
    ops._EMPTY_KS.clear()
    qs = torch.stack([q, q.flip(-1), 2 * q])
    got = torch.func.vmap(lambda a: pn.apply_rope(a, None, pos, config=config)[0])(qs)
    assert not any(torch._C._functorch.is_functorch_wrapped_tensor(k) for k in ops._EMPTY_KS.values())
    calls = _watch_fast_path()
    for i in range(3):
        plain, _ = pn.apply_rope(qs[i], None, pos, config=config)
        want, _ = reference.apply_rope(qs[i].double(), None, pos, config)
        torch.testing.assert_close(plain.double(), want, atol=2e-6, rtol=0)
        assert torch.equal(got[i], plain)
    assert calls() == {"rope": 3}
    assert "Exception" not in capfd.readouterr().err


@pytest.mark.parametrize("plain_first", [False, True])
def test_fast_path_mrope_uses_the_axis_frequencies(plain_first, monkeypatch):
    """An MRoPE config caches two CPU frequency forms (1-D inv_freq_on, the ops' [axes, pairs]); the
    fast path must take the latter, whichever was filled first, so per-axis positions work there."""
    config = pn.RopeConfig(head_dim=64, base=1000000.0, mrope_section=(8, 12, 12))
    if plain_first:
        config.inv_freq_on("cpu")
    q = torch.randn(2, 1, 4, 64, generator=GEN, dtype=torch.float64).float()
    k = torch.randn(2, 1, 2, 64, generator=GEN, dtype=torch.float64).float()
    pos = torch.randint(0, 5000, (3, 2, 1), generator=GEN)  # time, height, width ids differ
    pn.apply_rope(q, k, pos, config=config)  # the first call caches; then the fast path is taken
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    q2, k2 = q.clone(), k.clone()
    calls = _watch_fast_path()
    pn.apply_rope_(q2, k2, pos, config=config)
    assert calls() == {"rope_": 1}
    torch.testing.assert_close(q2.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(k2.double(), want_k, atol=2e-6, rtol=0)


def _bad_decode_calls():
    """Calls the fast path would take if they were valid (warm config, plain CPU tensors, no grad)."""
    q = torch.randn(2, 1, 4, 64, generator=GEN)
    k = torch.randn(2, 1, 2, 64, generator=GEN)
    pos = torch.tensor([[5], [9]])
    return [
        ("mrope_section with config", lambda f, c: f(q.clone(), k.clone(), pos, config=c, mrope_section=(8, 12, 12))),
        ("mrope_interleaved with config", lambda f, c: f(q.clone(), k.clone(), pos, config=c, mrope_interleaved=True)),
        ("inv_freq with config", lambda f, c: f(q.clone(), k.clone(), pos, config=c, inv_freq=c.inv_freq())),
        # a config carries its own factor and pairing: given again, they were once silently ignored
        ("attention_factor with config", lambda f, c: f(q.clone(), k.clone(), pos, config=c, attention_factor=2.0)),
        ("interleaved with config", lambda f, c: f(q.clone(), k.clone(), pos, config=c, interleaved=True)),
        ("rotary_dim disagrees", lambda f, c: f(q.clone(), k.clone(), pos, config=c, rotary_dim=32)),
        ("head_dim disagrees", lambda f, c: f(q[..., :32].clone(), k[..., :32].clone(), pos, config=c)),
        ("bad layout", lambda f, c: f(q.clone(), k.clone(), pos, config=c, layout="bsdh")),
        ("k of another rank", lambda f, c: f(q.clone(), k[0].clone(), pos, config=c)),
        ("q alone, bad layout", lambda f, c: f(q.clone(), None, pos, config=c, layout="bsdh")),
        ("q alone of another rank", lambda f, c: f(q[0].clone(), None, pos, config=c)),
        ("q alone, positions of another batch", lambda f, c: f(q.clone(), None, pos[:1].expand(3, 1), config=c)),
        ("q and k of another rank", lambda f, c: f(q[0].clone(), k[0].clone(), pos, config=c)),  # the op refuses
        ("offset past int64", lambda f, c: f(q.clone(), k.clone(), pos, config=c, offset=2 ** 63)),
        ("offset a float", lambda f, c: f(q.clone(), k.clone(), pos, config=c, offset=1.5)),
        ("positions a list", lambda f, c: f(q.clone(), k.clone(), [[5], [9]], config=c)),
        ("float positions", lambda f, c: f(q.clone(), k.clone(), pos.float(), config=c)),  # the op's check
        ("positions of another batch", lambda f, c: f(q.clone(), k.clone(), pos[:1].expand(3, 1), config=c)),
        ("k of another dtype", lambda f, c: f(q.clone(), k.double(), pos, config=c)),  # the op's check
        # inv_freq= calls take the fast path too
        ("inv_freq too long", lambda f, c: f(q.clone(), k.clone(), pos, inv_freq=torch.rand(40, dtype=torch.float64))),
        ("inv_freq of ints", lambda f, c: f(q.clone(), k.clone(), pos, inv_freq=torch.arange(32))),
        ("attention_factor a string", lambda f, c: f(q.clone(), k.clone(), pos, inv_freq=c.inv_freq(),
                                                     attention_factor="2")),
        ("interleaved an int", lambda f, c: f(q.clone(), k.clone(), pos, inv_freq=c.inv_freq(), interleaved=2)),
        ("rotary_dim disagrees with inv_freq", lambda f, c: f(q.clone(), k.clone(), pos, inv_freq=c.inv_freq(),
                                                              rotary_dim=32)),
    ]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("case", range(len(_bad_decode_calls())))
def test_fast_and_general_path_refuse_the_same_calls(case, in_place, monkeypatch, kernel_way):
    """Each bad call raises the same error with the fast path enabled (its eligibility met) as on
    the general path alone (ops._FAST off), and writes nothing."""
    config = _config()
    _warm(config)
    name, call = _bad_decode_calls()[case]
    fn = pn.apply_rope_ if in_place else pn.apply_rope
    errors = _refusals_on_both_paths(lambda: call(fn, config), monkeypatch)
    assert errors[0] == errors[1], name
    if in_place:  # a refused call writes nothing: the checks run before the kernel on either path
        q = torch.randn(2, 1, 4, 64, generator=GEN)
        before = q.clone()
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            pn.apply_rope_(q, None, torch.tensor([[1], [2]]), config=config, mrope_section=(8, 12, 12))
        assert torch.equal(q, before)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_inv_freq_fast_path_matches_reference(interleaved, dtype, monkeypatch):
    """apply_rope(inv_freq=) takes the fast path too (its factor and pairing of their exact types)."""
    q, k, pos = _decode_inputs(B=5, dtype=dtype)
    inv = _config().inv_freq().double()
    calls = _watch_fast_path()
    got_q, got_k = pn.apply_rope(q, k, pos, inv_freq=inv, attention_factor=1.25, interleaved=interleaved, offset=3)
    q2, k2 = q.clone(), k.clone()
    pn.apply_rope_(q2, k2, pos, inv_freq=inv, attention_factor=1.25, interleaved=interleaved, offset=3)
    assert calls() == {"rope": 1, "rope_": 1}
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, inv_freq=inv, attention_factor=1.25,
                                          interleaved=interleaved, offset=3)
    atol, rtol = (2e-6 * 1.25, 0.0) if dtype == torch.float32 else (1e-2, 1e-2)  # 16-bit: |values| up to ~6
    torch.testing.assert_close(got_q.double(), want_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_k.double(), want_k, atol=atol, rtol=rtol)
    assert torch.equal(q2, got_q) and torch.equal(k2, got_k)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_repeated_positions_reuse_nothing_stale(interleaved, dtype):
    """Decode batches whose rows share positions (the CPU stream reuses a row's sin/cos for the next
    row at the same position, csrc/cpu/sincos_stream.h) and runs of consecutive positions, against
    the float64 reference: a row left from another position, or from an earlier call of another
    size (the rows live in per-thread buffers), would show here."""
    runs = torch.tensor([5] * 20 + [9] * 20 + [5] * 30 + list(range(70, 150)) + [149] * 3 + [150_000] * 2)
    for pairs, positions in ((32, runs[:, None]), (4, runs[:9, None]), (32, runs.flip(0)[:, None])):
        head_dim = 2 * pairs
        inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        q = torch.randn(len(positions), 1, 3, head_dim, generator=GEN, dtype=torch.float64).to(dtype)
        k = torch.randn(len(positions), 1, 2, head_dim, generator=GEN, dtype=torch.float64).to(dtype)
        got_q, got_k = pn.apply_rope(q, k, positions, inv_freq=inv, attention_factor=0.75, interleaved=interleaved)
        want_q, want_k = reference.apply_rope(q.double(), k.double(), positions, inv_freq=inv, attention_factor=0.75,
                                              interleaved=interleaved)
        atol, rtol = (2e-6, 0.0) if dtype == torch.float32 else (1e-2, 1e-2)
        torch.testing.assert_close(got_q.double(), want_q, atol=atol, rtol=rtol)
        torch.testing.assert_close(got_k.double(), want_k, atol=atol, rtol=rtol)


def test_apply_rotary_pos_emb_fast_path_matches_transformers_and_refuses_alike(monkeypatch, kernel_way):
    """The transformers drop-in skips the dispatcher too when nothing intercepts the call: the same
    results as transformers' own function, and the same errors as the general path."""
    from transformers.models.llama import modeling_llama

    q = torch.randn(2, 4, 3, 64, generator=GEN)
    k = torch.randn(2, 2, 3, 64, generator=GEN)
    angles = torch.randint(0, 5000, (2, 3), generator=GEN)[..., None] * _config().inv_freq().double()
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().float(), emb.sin().float()
    calls = _watch_fast_path()
    got_q, got_k = pn.apply_rotary_pos_emb(q, k, cos, sin)
    assert calls() == {"rope_cos_sin": 1}
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(got_q, want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k, want_k, atol=2e-6, rtol=0)
    bad = [lambda: pn.apply_rotary_pos_emb(q, k, cos[..., :63], sin[..., :63]),  # odd rotary dim
           lambda: pn.apply_rotary_pos_emb(q, k.double(), cos, sin),
           lambda: pn.apply_rotary_pos_emb(q, k, cos, sin[:1]),
           # the Python checks, which run after the fast path declined
           lambda: pn.apply_rotary_pos_emb(q, k, cos, sin.tolist()),
           lambda: pn.apply_rotary_pos_emb(q, k, cos, sin, position_ids=[[0, 1, 2]] * 2),  # ignored, yet checked
           lambda: pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=True),
           lambda: pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3),
           lambda: pn.apply_rotary_pos_emb(q.tolist(), k, cos, sin)]
    for call in bad:
        errors = _refusals_on_both_paths(call, monkeypatch)
        assert errors[0] == errors[1]
    assert calls() == {"rope_cos_sin": 1}  # none of them ran a kernel on the fast path


def test_fast_path_leaves_tensor_subclasses_to_the_general_path():
    """A Tensor subclass may intercept through __torch_function__, so the fast path takes plain
    tensors only, in every tensor argument (cos and sin too), and the results are the general path's."""
    class Tagged(torch.Tensor):
        pass

    q = torch.randn(2, 4, 3, 64, generator=GEN)
    k = torch.randn(2, 2, 3, 64, generator=GEN)
    angles = torch.randint(0, 5000, (2, 3), generator=GEN)[..., None] * _config().inv_freq().double()
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().float(), emb.sin().float()
    want_q, want_k = pn.apply_rotary_pos_emb(q, k, cos, sin)
    calls = _watch_fast_path()
    got_q, got_k = pn.apply_rotary_pos_emb(q, k, cos, sin.as_subclass(Tagged))
    got_q2, got_k2 = pn.apply_rotary_pos_emb(q, k, cos.as_subclass(Tagged), sin)
    assert calls() == {}
    for got in (got_q, got_q2):
        torch.testing.assert_close(got.as_subclass(torch.Tensor), want_q, atol=0, rtol=0)
    for got in (got_k, got_k2):
        torch.testing.assert_close(got.as_subclass(torch.Tensor), want_k, atol=0, rtol=0)


def _negative_view(values: torch.Tensor, public: bool = False) -> torch.Tensor:
    """A tensor equal to ``values`` whose storage holds their negation (the negative bit set): what
    ``x.conj().imag`` gives (``public``: that route, whose last stride is 2), else contiguous."""
    if public:
        complex_dtype = torch.complex128 if values.dtype == torch.float64 else torch.complex64
        view = torch.complex(torch.zeros_like(values), -values).to(complex_dtype).conj().imag
    else:
        view = torch._neg_view(-values)
    assert view.is_neg() and torch.equal(view, values)
    return view


def test_fast_path_reads_negative_views_as_their_values(monkeypatch):
    """A negative view's storage holds the negated values. Out of place, and for frequencies or
    cos/sin tables, the fast path leaves such tensors to the dispatcher (which resolves them); q and
    k rotated in place stay on it, because rotation is linear: the storage rotated gives the view
    rotated. Every result is the reference's."""
    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    calls = _watch_fast_path()
    for public in (False, True):
        got_q, got_k = pn.apply_rope(_negative_view(q, public), _negative_view(k, public), pos, config=config)
        assert calls() == {}
        torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    nq, nk = _negative_view(q), _negative_view(k)
    pn.apply_rope_(nq, nk, pos, config=config)
    assert calls() == {"rope_": 1} and nq.is_neg()
    torch.testing.assert_close(nq.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(nk.double(), want_k, atol=2e-6, rtol=0)

    inv = config.inv_freq().double()
    want_q, want_k = pn.apply_rope(q, k, pos, inv_freq=inv)
    calls = _watch_fast_path()
    for in_place in (False, True):
        got = (pn.apply_rope_ if in_place else pn.apply_rope)(q.clone(), k.clone(), pos, inv_freq=_negative_view(inv))
        torch.testing.assert_close(got[0], want_q, atol=0, rtol=0)
        torch.testing.assert_close(got[1], want_k, atol=0, rtol=0)
    assert calls() == {}

    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    angles = torch.cat((pos[..., None] * inv,) * 2, -1)
    cos, sin = angles.cos().float(), angles.sin().float()
    want_q, want_k = pn.apply_rotary_pos_emb(qt, kt, cos, sin)
    calls = _watch_fast_path()
    got_q, got_k = pn.apply_rotary_pos_emb(_negative_view(qt), kt, cos, _negative_view(sin))
    assert calls() == {}
    torch.testing.assert_close(got_q, want_q, atol=0, rtol=0)
    torch.testing.assert_close(got_k, want_k, atol=0, rtol=0)


def test_angle_inputs_that_want_a_gradient_are_refused_on_every_path():
    """Frequencies or cos/sin that require grad with q and k that do not (learned frequencies on a
    frozen model): the fast path leaves the call to the general path, which refuses it before any
    write, as the raw ops do (the gradient was silently dropped: no error, an output without grad)."""
    config = _config()
    q, k, pos = _decode_inputs()
    inv = config.inv_freq().double()
    pn.apply_rope(q, k, pos, inv_freq=inv)  # the fast path takes this call
    cos, sin = (t.float() for t in reference.rope_tables(pos, config))
    learned = inv.clone().requires_grad_()
    args = (pos, None, learned, 1.0, False, "bshd", 0, False)
    for call in (lambda: pn.apply_rope(q, k, pos, inv_freq=learned),
                 lambda: pn.apply_rope_(q, k, pos, inv_freq=learned),
                 lambda: torch.ops.posenc.rope(q, k, *args),
                 lambda: torch.ops.posenc.rope_(q, k, *args),
                 lambda: pn.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos.requires_grad_(), sin),
                 lambda: torch.ops.posenc.rope_cos_sin_(q, k, cos, sin, None, "bshd", False)):
        before = q.clone(), k.clone()
        with pytest.raises(RuntimeError, match="requires grad, but gradients flow only to q and k"):
            call()
        assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    for in_place in (False, True):  # compiled: refused while tracing (torch wraps the error)
        rotate = pn.apply_rope_ if in_place else pn.apply_rope
        before = q.clone(), k.clone()
        with pytest.raises(Exception, match="inv_freq requires grad, but gradients flow only to q and k"):
            torch.compile(lambda q, k: rotate(q, k, pos, inv_freq=learned), fullgraph=True)(q, k)
        assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    with torch.no_grad():  # no gradient wanted: rotated as with the same values
        got = pn.apply_rope(q, k, pos, inv_freq=learned)
    want = pn.apply_rope(q, k, pos, inv_freq=inv)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_negative_views_rotate_in_place_off_the_fast_path():
    """Where the fast path does not take an in-place call (a gradient to record, the raw ops), the
    ops' Negative-key kernel rotates a negative view as stored (torch's own fallback failed: "Expected
    Tensor but got None" for q alone, "more than one mutable tensors" for q and k) and resolves
    negative frequencies and cos/sin tables. Values and gradients are the reference's."""
    config = _config()
    q = torch.randn(3, 3, 4, 64, generator=GEN, dtype=torch.float64)
    k = torch.randn(3, 3, 2, 64, generator=GEN, dtype=torch.float64)
    pos = torch.randint(0, 100_000, (3, 3), generator=GEN)
    want_q, want_k = reference.apply_rope(q, k, pos, config)

    base = q.clone().requires_grad_()
    nq = _negative_view(base * 1.0)  # a non-leaf: its gradient is recorded, so the general path runs
    pn.apply_rope_(nq, None, pos, config=config)
    torch.testing.assert_close(nq.detach(), want_q, atol=1e-12, rtol=0)
    weights = torch.randn(q.shape, generator=GEN, dtype=torch.float64)
    (nq * weights).sum().backward()
    plain = q.clone().requires_grad_()
    (pn.apply_rope(plain, None, pos, config=config)[0] * weights).sum().backward()
    torch.testing.assert_close(base.grad, plain.grad, atol=1e-12, rtol=0)

    inv = config.inv_freq().double()
    args = (pos, None, inv, config.attention_factor, False, "bshd", 0, False)
    nq, nk = _negative_view(q), _negative_view(k)
    torch.ops.posenc.rope_(nq, nk, *args)
    torch.testing.assert_close(nq, want_q, atol=1e-12, rtol=0)
    torch.testing.assert_close(nk, want_k, atol=1e-12, rtol=0)
    got_q, got_k = q.clone(), k.clone()
    torch.ops.posenc.rope_(got_q, got_k, pos, None, _negative_view(inv), *args[3:])
    torch.testing.assert_close(got_q, want_q, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_k, want_k, atol=1e-12, rtol=0)

    cos, sin = reference.rope_tables(pos, config)  # [B, S, D]
    got_q, got_k = _negative_view(q), k.clone()
    torch.ops.posenc.rope_cos_sin_(got_q, got_k, _negative_view(cos), _negative_view(sin), None, "bshd", False)
    torch.testing.assert_close(got_q, want_q, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_k, want_k, atol=1e-12, rtol=0)


def test_fast_path_leaves_zero_tensors_to_the_dispatcher(monkeypatch):
    """A ZeroTensor (torch._efficientzerotensor) has no data: the fast path declines it (it crashed
    the fast path once). In place both paths raise the same error; out of place torch's fallback
    materializes it and both paths rotate it: q zero, k rotated as with a real q."""
    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    zero = torch._efficientzerotensor(q.shape)
    errors, outputs = [], []
    for fast in (ops._FAST, None):
        monkeypatch.setattr(ops, "_FAST", fast)
        with pytest.raises(RuntimeError) as e:
            pn.apply_rope_(zero, k.clone(), pos, config=config)
        errors.append(str(e.value))
        outputs.append(pn.apply_rope(zero, k, pos, config=config))
        monkeypatch.undo()
    assert errors[0] == errors[1]
    want_k = pn.apply_rope(q, k, pos, config=config)[1]
    for got_q, got_k in outputs:
        assert not got_q.any() and torch.equal(got_k, want_k)
    # zero frequencies are a valid input: no rotation at all, on the general path
    calls = _watch_fast_path()
    got_q, got_k = pn.apply_rope(q, k, pos, inv_freq=torch._efficientzerotensor((32,), dtype=torch.float64))
    assert calls() == {}
    assert torch.equal(got_q, q) and torch.equal(got_k, k)


@pytest.mark.parametrize("first_use", ["export", "fake", "vmap", "jvp"])
def test_a_config_first_used_under_a_transform_caches_plain_frequencies(first_use):
    """The config's frequency cache is filled only outside modes and transforms: a config first
    used under torch.export (a FakeTensor) or a functorch transform (a wrapper) once cached that
    tensor, and every later eager call of the config read it (garbage results after export)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = _config()
    q, k, pos = _decode_inputs()
    if first_use == "export":
        torch.export.export(pn.RotaryEmbedding(config), (q, k, pos))
    elif first_use == "fake":
        with FakeTensorMode() as mode:
            pn.apply_rope(mode.from_tensor(q), mode.from_tensor(k), mode.from_tensor(pos), config=config)
    elif first_use == "vmap":
        torch.func.vmap(lambda x: pn.apply_rope(x, k, pos, config=config)[0])(q[None])
    else:
        torch.func.jvp(lambda x: pn.apply_rope(x, k, pos, config=config)[0], (q,), (q,))
    calls = _watch_fast_path()
    for _ in range(2):  # the first eager call fills the cache, the second reads it on the fast path
        got_q, got_k = pn.apply_rope(q, k, pos, config=config)
        want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
        torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
        torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    assert calls() == {"rope": 1}
    assert type(config._frequencies.cpu_plain[0]) is torch.Tensor


def test_fast_path_reaches_the_kernel_as_this_torch_allows():
    """The _direct extension is built and bound: through the op library's direct entry where torch
    has the Python interop shims (2.14 on), else through the op's redispatch."""
    direct = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 14)
    assert ops._FAST is not None
    assert pn.build_info()["fast_path"] == ("direct entry" if direct else "redispatch")


def test_fast_path_keeps_reference_counts():
    """The extension's reference counting (C): inputs, config and results hold no extra references
    after many calls, taken or declined."""
    import sys

    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    inv = config.inv_freq().double()
    angles = pos[..., None] * inv
    cos, sin = torch.cat((angles, angles), -1).cos().float(), torch.cat((angles, angles), -1).sin().float()
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    module = pn.RotaryEmbedding(config)
    objects = (q, k, pos, config, inv, cos, sin, module)
    before = [sys.getrefcount(o) for o in objects]
    calls = _watch_fast_path()
    for _ in range(50):
        out = pn.apply_rope(q, k, pos, config=config)
        assert all(sys.getrefcount(t) == 3 for t in out)  # the tuple's, out's element and the argument
        pn.apply_rope_(q, k, pos, config=config)
        pn.apply_rope(q, k, pos, inv_freq=inv, attention_factor=0.5)
        pn.apply_rotary_pos_emb(qt, kt, cos, sin)
        out = module(q, k=k, positions=pos)
        assert all(sys.getrefcount(t) == 3 for t in out)
        module(q, k, pos, 1, None)
        out = module(q, positions=pos)  # q alone
        assert sys.getrefcount(out[0]) == 3 and out[1] is None
        pn.apply_rope_(q, None, pos, config=config)
        with pytest.raises(TypeError):  # declined by module_call: nn.Module.__call__ raises
            module(q, k, pos, bogus=1)
        with pytest.raises(RuntimeError):  # declined by the op, refused by the general path
            pn.apply_rope_(q, k, pos.float(), config=config)
        with pytest.raises(ValueError):  # declined by the fast path's own test
            pn.apply_rope_(q, k, pos, config=config, rotary_dim=32)
    assert calls() == {"rope": 250, "rope_": 100, "rope_cos_sin": 50}
    del out
    assert [sys.getrefcount(o) for o in objects] == before


def test_fast_path_declines_other_devices_and_subclasses():
    """Tensors on another device (here meta) or of a Tensor subclass take the general path, and
    give its results."""
    class Tagged(torch.Tensor):
        pass

    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    calls = _watch_fast_path()
    mq, mk = pn.apply_rope(q.to("meta"), k.to("meta"), pos.to("meta"), config=config)
    assert mq.device.type == "meta" and mq.shape == q.shape and mk.shape == k.shape
    got_q, got_k = pn.apply_rope(q.as_subclass(Tagged), k, pos, config=config)
    assert calls() == {}
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    with pytest.raises(RuntimeError) as fast:  # positions elsewhere: declined, the general path's error
        pn.apply_rope(q, k, pos.to("meta"), config=config)
    assert calls() == {}
    assert "positions" in str(fast.value) or "device" in str(fast.value)


def test_large_calls_from_threads_match_reference():
    """Calls large enough that the direct entry releases the GIL while the kernel runs, from four
    Python threads at once (each thread has its own stream rows): every result is the reference's."""
    import threading

    config = _config(interleaved=True)
    _warm(config)
    inputs = [(torch.randn(1, 512, 4, 64, generator=GEN), torch.randn(1, 512, 2, 64, generator=GEN),
               torch.randint(0, 100_000, (1, 512), generator=GEN)) for _ in range(4)]
    wants = [reference.apply_rope(q.double(), k.double(), pos, config) for q, k, pos in inputs]
    results = [None] * 4
    calls = _watch_fast_path()

    def work(i):
        q, k, pos = inputs[i]
        for _ in range(20):
            q2, k2 = q.clone(), k.clone()
            pn.apply_rope_(q2, k2, pos, config=config)
        results[i] = (q2, k2)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls() == {"rope_": 80}
    for (got_q, got_k), (want_q, want_k) in zip(results, wants):
        torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
        torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# add_sinusoidal: a sinusoidal model's decode step takes the fast path too.

def _sinusoidal_calls():
    """add_sinusoidal calls the fast path takes: (name, x, positions, keyword arguments)."""
    g = torch.Generator().manual_seed(21)
    x3 = torch.randn(3, 1, 48, generator=g, dtype=torch.float64)
    x2 = torch.randn(5, 33, generator=g, dtype=torch.float64)  # [seq, dim], odd dim
    return [
        ("decode step at an offset", x3, None, dict(offset=1000)),
        ("per-row int32 positions", x3, torch.randint(0, 9000, (3, 1), generator=g, dtype=torch.int32), {}),
        ("int64 positions and an offset", x2, torch.randint(0, 500, (5,), generator=g), dict(offset=-7, x_scale=2.5)),
        ("float positions", x2, torch.rand(5, generator=g, dtype=torch.float64) * 50,
         dict(interleaved=False, freq_shift=1.0, angle_scale=3.0, cos_first=True, base=100)),
        ("a strided x", torch.randn(2, 4, 70, generator=g, dtype=torch.float64)[:, :, 3:67], None, dict(offset=5)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("case", range(len(_sinusoidal_calls())))
def test_add_sinusoidal_fast_path_matches_reference_and_general_path(case, dtype, monkeypatch, kernel_way):
    name, x64, pos, kw = _sinusoidal_calls()[case]
    x = x64.to(dtype)
    want = reference.add_sinusoidal(x.double(), pos, **kw)
    calls = _watch_fast_path()
    got = pn.add_sinusoidal(x, pos, **kw)
    assert calls() == {"add_sinusoidal": 1}, name  # the path under test
    assert got.dtype == dtype and got.shape == x.shape
    tol = {torch.float64: 1e-12, torch.float32: 2e-6}.get(dtype, 1e-2 * (1 + float(x64.abs().max())))
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)
    monkeypatch.setattr(ops, "_FAST", None)
    assert torch.equal(pn.add_sinusoidal(x, pos, **kw), got), name  # the general path's bits


def test_add_sinusoidal_fast_path_steps_aside_for_grad_modes_and_negative_views():
    g = torch.Generator().manual_seed(22)
    x = torch.randn(2, 1, 16, generator=g, dtype=torch.float64)
    want = reference.add_sinusoidal(x, offset=40, x_scale=3.0)
    calls = _watch_fast_path()
    # x that wants a gradient: recorded by autograd, d/dx = x_scale
    leaf = x.clone().requires_grad_()
    out = pn.add_sinusoidal(leaf, offset=40, x_scale=3.0)
    out.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.full_like(x, 3.0))
    torch.testing.assert_close(out.detach(), want, atol=1e-12, rtol=0)
    # float positions that want a gradient: refused, as on the general path
    with pytest.raises(RuntimeError, match="positions"):
        pn.add_sinusoidal(x, torch.tensor([40.0], dtype=torch.float64, requires_grad=True), x_scale=3.0)
    # a mode and the profiler see the op
    with _Seen() as mode:
        pn.add_sinusoidal(x, offset=40, x_scale=3.0)
    assert "posenc.add_sinusoidal.default" in mode.ops
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pn.add_sinusoidal(x, offset=40, x_scale=3.0)
    assert any(e.name == "posenc::add_sinusoidal" for e in prof.events())
    # a negative view's storage holds the negated values: the dispatcher resolves it
    got = pn.add_sinusoidal(_negative_view(x), offset=40, x_scale=3.0)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    pos = torch.tensor([40.0, 41.5], dtype=torch.float64)
    got = pn.add_sinusoidal(x.view(2, 16), _negative_view(pos), x_scale=3.0)
    torch.testing.assert_close(got, reference.add_sinusoidal(x.view(2, 16), pos, x_scale=3.0), atol=1e-12, rtol=0)
    # other devices
    meta = pn.add_sinusoidal(x.to("meta"), offset=40)
    assert meta.device.type == "meta" and meta.shape == x.shape
    assert calls() == {}
    with torch.inference_mode():  # nothing to record: the fast path
        got = pn.add_sinusoidal(x, offset=40, x_scale=3.0)
    assert calls() == {"add_sinusoidal": 1}
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def _bad_sinusoidal_calls():
    x = torch.randn(2, 3, 16, generator=GEN)
    return [
        ("positions of another length", lambda: pn.add_sinusoidal(x, torch.arange(4))),
        ("positions of another batch", lambda: pn.add_sinusoidal(x, torch.zeros(3, 3, dtype=torch.long))),
        ("positions a list", lambda: pn.add_sinusoidal(x, [0, 1, 2])),
        ("positions + offset past the domain", lambda: pn.add_sinusoidal(x, torch.tensor([0, 1, 2 ** 48]), offset=1)),
        ("offset past the domain", lambda: pn.add_sinusoidal(x, offset=2 ** 50)),
        ("offset past the domain, positions bringing the sum back",  # (in float64 the positions rounded first)
         lambda: pn.add_sinusoidal(x, torch.tensor([2 ** 60 + 1, 2 ** 60 + 2, 2 ** 60 + 3]), offset=-2 ** 60)),
        ("offset past int64", lambda: pn.add_sinusoidal(x, offset=2 ** 63)),
        ("offset a float", lambda: pn.add_sinusoidal(x, offset=1.5)),
        ("offset a bool", lambda: pn.add_sinusoidal(x, offset=True)),
        ("x_scale a string", lambda: pn.add_sinusoidal(x, x_scale="2")),
        ("x_scale not finite", lambda: pn.add_sinusoidal(x, x_scale=float("nan"))),
        ("base 1", lambda: pn.add_sinusoidal(x, base=1.0)),
        ("interleaved an int", lambda: pn.add_sinusoidal(x, interleaved=2)),
        ("x 1-D", lambda: pn.add_sinusoidal(x[0, 0])),
        ("x of ints", lambda: pn.add_sinusoidal(x.long())),
        ("positions elsewhere", lambda: pn.add_sinusoidal(x, torch.arange(3, device="meta"))),
    ]


def test_add_sinusoidal_fast_path_keeps_reference_counts():
    import sys

    x = torch.randn(2, 1, 32, generator=GEN)
    pos = torch.tensor([[5], [9]])
    module = pn.SinusoidalPositionalEncoding(32)
    objects = (x, pos, module, module.d_model)
    before = [sys.getrefcount(o) for o in objects]
    calls = _watch_fast_path()
    for _ in range(50):
        out = pn.add_sinusoidal(x, pos, x_scale=2.0)
        assert sys.getrefcount(out) == 2  # out's and the argument's
        out = module(x, 3)  # module_call
        assert sys.getrefcount(out) == 2
        module(x=x)
        pn.add_sinusoidal(x, offset=7)
        with pytest.raises(RuntimeError):  # declined by the op, refused by the general path
            pn.add_sinusoidal(x, pos[:, :0])
    assert calls() == {"add_sinusoidal": 200}
    del out
    assert [sys.getrefcount(o) for o in objects] == before


# The relative biases: a T5 or ALiBi decode step's bias (one query row) takes the fast path too.

def _bias_calls():
    """Bias calls the fast path takes: (name, function, table, positional arguments, keyword arguments)."""
    g = torch.Generator().manual_seed(31)
    weight = torch.randn(32, 6, generator=g, dtype=torch.float64)
    slopes = pn.alibi_slopes(6)
    return [
        ("T5 decode row", pn.relative_position_bias, weight, (1, 130), dict(query_offset=129, bidirectional=False)),
        ("T5 bidirectional block", pn.relative_position_bias, weight, (5, 9), {}),
        ("T5 16 buckets, max_distance 20, offset", pn.relative_position_bias, weight[:16], (3, 40),
         dict(num_buckets=16, max_distance=20, query_offset=7)),
        ("ALiBi decode row", pn.alibi_bias, slopes, (1, 300), dict(query_offset=299)),
        ("ALiBi block, negative offset", pn.alibi_bias, slopes, (4, 6), dict(query_offset=-3)),
    ]


def _bias_reference(fn, table, args, kw, dtype):
    """The float64 reference rounded as the op documents: T5 gathers the weight (exact); ALiBi's
    product, formed in float64, rounded once (16-bit outputs through float32)."""
    kw = {k: v for k, v in kw.items() if k not in ("num_buckets", "dtype")}
    if fn is pn.relative_position_bias:
        return reference.relative_position_bias(table.to(dtype), *args, **kw)
    want = reference.alibi_bias(table, *args, **kw)
    return want.to(torch.float32).to(dtype) if dtype in (torch.float16, torch.bfloat16) else want.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("case", range(len(_bias_calls())))
def test_bias_fast_path_matches_reference_and_general_path(case, dtype, monkeypatch, kernel_way):
    name, fn, table, args, kw = _bias_calls()[case]
    op = fn.__name__
    if fn is pn.alibi_bias:
        kw = dict(kw, dtype=dtype)  # the slopes stay float32, as alibi_slopes gives them
    else:
        table = table.to(dtype)
    want = _bias_reference(fn, table, args, kw, dtype)
    calls = _watch_fast_path()
    got = fn(table, *args, **kw)
    assert calls() == {op: 1}, name  # the path under test
    assert got.dtype == dtype and torch.equal(got, want), name
    if fn is pn.alibi_bias and dtype == torch.float32:  # the slopes' dtype by default
        calls = _watch_fast_path()
        assert torch.equal(fn(table, *args, **{k: v for k, v in kw.items() if k != "dtype"}), want)
        assert calls() == {op: 1}, name
    monkeypatch.setattr(ops, "_FAST", None)
    assert torch.equal(fn(table, *args, **kw), got), name  # the general path's bits


def test_t5_decode_bias_fast_path_matches_transformers():
    """A T5 decoder's bias at a decode step, from the module under no_grad (its weight a Parameter
    that requires grad: nothing is recorded, so the fast path), equals transformers' compute_bias."""
    T5Config = pytest.importorskip("transformers").T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    torch.manual_seed(32)
    cfg = T5Config(d_model=64, d_kv=8, num_heads=8, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=True)
    attn = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    module = pn.T5RelativePositionBias(num_heads=8, bidirectional=False)
    module.load_state_dict({"relative_attention_bias.weight": attn.relative_attention_bias.weight.detach()})
    calls = _watch_fast_path()
    with torch.no_grad():
        for step in (0, 1, 63, 200):
            got = module(1, step + 1, query_offset=step)
            assert not got.requires_grad
            assert torch.equal(got, attn.compute_bias(1, step + 1, past_seen_tokens=step))
    assert calls() == {"relative_position_bias": 4}


def test_bias_module_calls_are_nn_modules_call(monkeypatch):
    """T5RelativePositionBias.__call__ and ALiBi.__call__ are module_call too: a plain module with no
    hooks and nothing to record runs the op on the fast path (the reference's bits, positional and
    keyword arguments, the defaults, the module's current weight and output dtype); hooks, a
    forward set on the instance or the class, a subclass, a table that is no plain Embedding, a
    weight that wants a gradient, a bad call and module.compile() take nn.Module.__call__ as before."""
    t5 = pn.T5RelativePositionBias(6, bidirectional=False)
    torch.nn.init.normal_(t5.relative_attention_bias.weight, generator=GEN)
    alibi = pn.ALiBi(6)
    t5_want = lambda *a, **kw: reference.relative_position_bias(  # noqa: E731
        t5.relative_attention_bias.weight.detach().double(), *a, bidirectional=False, **kw).float()
    alibi_want = lambda *a, dtype=torch.float32, **kw: reference.alibi_bias(  # noqa: E731
        alibi.slopes, *a, **kw).to(torch.float32).to(dtype)
    for module, want in ((t5, t5_want), (alibi, alibi_want)):
        with torch.no_grad():  # (T5's weight is a Parameter that requires grad: nothing to record under no_grad)
            calls = _watch_fast_path()
            for got, expected in ((module(1, 130, 129), want(1, 130, query_offset=129)),
                                  (module(1, 130, query_offset=129), want(1, 130, query_offset=129)),
                                  (module(query_length=3, key_length=9, query_offset=-2), want(3, 9, query_offset=-2)),
                                  (module(4, 7), want(4, 7))):
                assert torch.equal(got, expected) and not got.requires_grad
            assert calls() == {_op_of(module): 4}
            for call in (lambda: module(1, 130, 129), lambda: module(4, 7), lambda: module(key_length=7, query_length=4)):
                assert not _python_calls(call) & {"forward", "_call_impl", "_wrapped_call_impl"}
            _each_hook_runs(module, lambda: module(1, 50, 49), want(1, 50, query_offset=49).double())
            _bad_calls_raise_as_nn_module_does(module, (((), {}), ((1,), {}), ((1, 8), {"bogus": 1}),
                                                        ((1, 8, 0, None, 1), {}), ((1,), {"query_length": 1})))
            patched = type(module)(6)
            patched.forward = lambda query_length, key_length, query_offset=0: ("patched", query_offset)
            assert patched(1, 8, 3) == ("patched", 3)  # a forward set on the instance is the one called
            monkeypatch.setattr(type(module), "forward", lambda self, *args: ("class", len(args)))
            assert module(1, 8, 3) == ("class", 3)  # and one set on the class
            monkeypatch.undo()

            class Scaled(type(module)):
                def forward(self, *args, **kwargs):
                    return super().forward(*args, **kwargs) * 3
            scaled = Scaled(6, bidirectional=False) if module is t5 else Scaled(6)
            scaled.load_state_dict(module.state_dict())
            assert torch.equal(scaled(1, 50, 49), 3 * want(1, 50, query_offset=49))

    with torch.no_grad():
        calls = _watch_fast_path()
        bf16 = alibi(1, 300, 299, dtype=torch.bfloat16)  # dtype given, and the module's output_dtype after a cast
        half = pn.ALiBi(6).half()(1, 300, query_offset=299)
        assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, alibi_want(1, 300, query_offset=299, dtype=torch.bfloat16))
        assert half.dtype == torch.float16 and torch.equal(half, alibi_want(1, 300, query_offset=299, dtype=torch.float16))
        new_weight = torch.randn(32, 6, generator=GEN)
        t5.relative_attention_bias.weight = torch.nn.Parameter(new_weight)  # read per call
        assert torch.equal(t5(1, 40, 39), reference.relative_position_bias(new_weight, 1, 40, bidirectional=False,
                                                                            query_offset=39))
        assert calls() == {"alibi_bias": 2, "relative_position_bias": 1}

        class Table(torch.nn.Embedding):  # no plain Embedding: forward's own call of the function
            pass
        t5.relative_attention_bias = Table(32, 6, _weight=new_weight.clone())
        assert "forward" in _python_calls(lambda: t5(1, 40, 39))
        assert torch.equal(t5(1, 40, 39), reference.relative_position_bias(new_weight, 1, 40, bidirectional=False,
                                                                            query_offset=39))
    # a weight that wants a gradient: nn.Module.__call__, forward, the general path, and the gradient
    assert "forward" in _python_calls(lambda: t5(1, 40, 39))
    out = t5(1, 40, 39)
    out.sum().backward()
    assert out.requires_grad and t5.relative_attention_bias.weight.grad.abs().sum() > 0
    t5.compile(backend="eager")
    assert torch.equal(t5(1, 40, 39).detach(), out.detach())
    assert t5._compiled_call_impl is not None


def test_bias_module_calls_hold_their_tables_for_the_call_and_no_longer():
    """The bias modules' module_call holds the weight or slopes, and the settings, for the call (the
    fast path may run Python, where another thread could rebind them) and releases them: reference
    counts are unchanged after many calls, declined ones included."""
    import sys
    t5, alibi = pn.T5RelativePositionBias(4), pn.ALiBi(4)
    weight, slopes = t5.relative_attention_bias.weight, alibi.slopes
    held = (weight, slopes, alibi.output_dtype, torch.bfloat16)
    with torch.no_grad():
        calls = (lambda: t5(1, 20, 19), lambda: alibi(1, 20, 19), lambda: alibi(1, 20, 19, torch.bfloat16),
                 lambda: t5(1, 20.0, 19), lambda: alibi(1, 20, 19, "bf16"))  # (the last two: declined, then refused)
        for call in calls:
            try:
                call()
            except (RuntimeError, TypeError):
                pass
        before = [sys.getrefcount(o) for o in held]
        for _ in range(100):
            for call in calls:
                try:
                    call()
                except (RuntimeError, TypeError):
                    pass
        assert [sys.getrefcount(o) for o in held] == before


def _op_of(module: torch.nn.Module) -> str:
    return "relative_position_bias" if isinstance(module, pn.T5RelativePositionBias) else "alibi_bias"


def test_bias_fast_path_steps_aside_for_grad_modes_and_negative_views():
    g = torch.Generator().manual_seed(33)
    weight = torch.randn(32, 4, generator=g, dtype=torch.float64)
    slopes = torch.rand(4, generator=g, dtype=torch.float64)
    t5_want = reference.relative_position_bias(weight, 1, 50, query_offset=49)
    alibi_want = reference.alibi_bias(slopes, 1, 50, query_offset=49)
    calls = _watch_fast_path()
    # a table that wants a gradient: recorded by autograd (T5: the bias gradient summed per bucket)
    leaf = weight.clone().requires_grad_()
    out = pn.relative_position_bias(leaf, 1, 50, query_offset=49)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    out.backward(grad)
    buckets = reference.t5_relative_position_bucket(torch.arange(50) - 49)
    want_grad = torch.zeros_like(weight).index_add_(0, buckets, grad[0, :, 0].T)
    torch.testing.assert_close(leaf.grad, want_grad, atol=1e-12, rtol=0)
    assert torch.equal(out.detach(), t5_want)
    leaf = slopes.clone().requires_grad_()
    pn.alibi_bias(leaf, 1, 50, query_offset=49).backward(grad)
    torch.testing.assert_close(leaf.grad, (grad[0, :, 0] * (torch.arange(50) - 49)).sum(-1), atol=1e-9, rtol=0)
    # a mode, the profiler and the jit tracer see the op
    with _Seen() as mode:
        pn.relative_position_bias(weight, 1, 50, query_offset=49)
        pn.alibi_bias(slopes, 1, 50, query_offset=49)
    assert "posenc.relative_position_bias.default" in mode.ops and "posenc.alibi_bias.default" in mode.ops
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pn.alibi_bias(slopes, 1, 50, query_offset=49)
    assert any(e.name == "posenc::alibi_bias" for e in prof.events())
    traced = torch.jit.trace(lambda w: pn.relative_position_bias(w, 1, 50, query_offset=49), (weight,),
                             check_trace=False)  # (the check reruns the function untraced: the fast path)
    assert "posenc::relative_position_bias" in str(traced.graph)
    # a negative view's storage holds the negated values: the dispatcher resolves it
    assert torch.equal(pn.relative_position_bias(_negative_view(weight), 1, 50, query_offset=49), t5_want)
    assert torch.equal(pn.alibi_bias(_negative_view(slopes), 1, 50, query_offset=49), alibi_want)
    # other devices, a tensor offset (read on the host by the general path), a subclass
    meta = pn.alibi_bias(slopes.to("meta"), 1, 50, query_offset=49)
    assert meta.device.type == "meta" and meta.shape == (1, 4, 1, 50)
    assert torch.equal(pn.alibi_bias(slopes, 1, 50, query_offset=torch.tensor(49)), alibi_want)
    assert torch.equal(pn.relative_position_bias(torch.nn.Parameter(weight), 1, 50, query_offset=49).detach(),
                       t5_want)

    class Seen(torch.Tensor):  # a subclass may intercept: the general path, where it sees the op
        ops = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.ops.append(str(func))
            return super().__torch_function__(func, types, args, kwargs)

    got = pn.alibi_bias(slopes.as_subclass(Seen), 1, 50, query_offset=49)
    assert torch.equal(got.as_subclass(torch.Tensor), alibi_want) and "posenc.alibi_bias" in Seen.ops
    assert calls() == {}
    with torch.no_grad():  # a table that requires grad, with nothing to record: the fast path
        got = pn.relative_position_bias(weight.clone().requires_grad_(), 1, 50, query_offset=49)
        assert not got.requires_grad and torch.equal(got, t5_want)
    with torch.inference_mode():
        assert torch.equal(pn.alibi_bias(slopes, 1, 50, query_offset=49), alibi_want)
    assert calls() == {"relative_position_bias": 1, "alibi_bias": 1}


def _bad_bias_calls():
    weight = torch.randn(32, 4, generator=GEN)
    slopes = pn.alibi_slopes(4)
    return [
        ("weight 1-D", lambda: pn.relative_position_bias(weight[:, 0], 1, 8)),
        ("num_buckets not the weight's", lambda: pn.relative_position_bias(weight, 1, 8, num_buckets=16)),
        ("odd bidirectional buckets", lambda: pn.relative_position_bias(weight[:31], 1, 8)),
        ("max_distance too small", lambda: pn.relative_position_bias(weight, 1, 8, max_distance=4)),
        ("negative query_length", lambda: pn.relative_position_bias(weight, -1, 8)),
        ("key_length a float", lambda: pn.relative_position_bias(weight, 1, 8.0)),
        ("query_offset past int64", lambda: pn.relative_position_bias(weight, 1, 8, query_offset=2 ** 63)),
        ("an int weight", lambda: pn.relative_position_bias(weight.long(), 1, 8)),
        ("slopes 2-D", lambda: pn.alibi_bias(slopes[None], 1, 8)),
        ("negative key_length", lambda: pn.alibi_bias(slopes, 1, -8)),
        ("int slopes", lambda: pn.alibi_bias(slopes.long(), 1, 8)),
        ("dtype an int type", lambda: pn.alibi_bias(slopes, 1, 8, dtype=torch.int32)),
        ("dtype a string", lambda: pn.alibi_bias(slopes, 1, 8, dtype="float32")),
        ("query_offset a float", lambda: pn.alibi_bias(slopes, 1, 8, query_offset=0.5)),
    ]


@pytest.mark.parametrize("case", range(len(_bad_sinusoidal_calls() + _bad_bias_calls())))
def test_add_sinusoidal_and_bias_fast_and_general_path_refuse_the_same_calls(case, monkeypatch, kernel_way):
    name, call = (_bad_sinusoidal_calls() + _bad_bias_calls())[case]
    errors = _refusals_on_both_paths(call, monkeypatch)
    assert errors[0] == errors[1], name


def test_bias_fast_path_keeps_reference_counts():
    import sys

    weight = torch.randn(32, 4, generator=GEN)
    slopes = pn.alibi_slopes(4)
    t5, alibi = pn.T5RelativePositionBias(num_heads=4).requires_grad_(False), pn.ALiBi(num_heads=4)
    objects = (weight, slopes, torch.bfloat16, t5, alibi)
    before = [sys.getrefcount(o) for o in objects]
    calls = _watch_fast_path()
    for _ in range(50):
        out = pn.relative_position_bias(weight, 1, 20, query_offset=19)
        assert sys.getrefcount(out) == 2  # out's and the argument's
        out = pn.alibi_bias(slopes, 1, 20, query_offset=19, dtype=torch.bfloat16)
        assert sys.getrefcount(out) == 2
        t5(1, 20, 19)
        alibi(1, 20, 19)
        with pytest.raises(RuntimeError):  # declined by the op, refused by the general path
            pn.relative_position_bias(weight, 1, 20, num_buckets=16)
    assert calls() == {"relative_position_bias": 100, "alibi_bias": 100}
    del out
    assert [sys.getrefcount(o) for o in objects] == before


def test_large_biases_from_threads_equal_the_reference():
    """Outputs past the size from which the fast path releases the GIL (their elements counted from
    the sizes: the table itself is small), made from several threads at once."""
    import threading

    g = torch.Generator().manual_seed(34)
    weight = torch.randn(32, 8, generator=g)
    slopes = pn.alibi_slopes(8)
    want_t5 = reference.relative_position_bias(weight, 100, 300, query_offset=5)
    want_alibi = reference.alibi_bias(slopes, 100, 300, query_offset=5).to(torch.float32)
    calls = _watch_fast_path()
    failures = []

    def work():
        for _ in range(5):
            if not torch.equal(pn.relative_position_bias(weight, 100, 300, query_offset=5), want_t5):
                failures.append("t5")
            if not torch.equal(pn.alibi_bias(slopes, 100, 300, query_offset=5), want_alibi):
                failures.append("alibi")
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert calls() == {"relative_position_bias": 20, "alibi_bias": 20}


def test_fast_path_takes_tensors_that_require_grad_where_nothing_is_recorded():
    """Under no_grad nothing is recorded for a q that requires grad (a leaf, a Parameter): the fast
    path takes the call, with the general path's results and version counts."""
    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos, config)
    leaf, param = q.clone().requires_grad_(), torch.nn.Parameter(k.clone())
    calls = _watch_fast_path()
    with torch.no_grad():
        out_q, out_k = pn.apply_rope(leaf, param, pos, config=config)
        assert not out_q.requires_grad and not out_k.requires_grad
        versions = leaf._version, param._version
        got_q, got_k = pn.apply_rope_(leaf, param, pos, config=config)
        assert got_q is leaf and got_k is param
        assert (leaf._version, param._version) == (versions[0] + 1, versions[1] + 1)
    assert calls() == {"rope": 1, "rope_": 1}
    for got, want in ((out_q, want_q), (out_k, want_k), (leaf.detach(), want_q), (param.detach(), want_k)):
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)
    assert torch.equal(out_q, leaf.detach()) and torch.equal(out_k, param.detach())
    # angle inputs that require grad (refused under grad mode: the ops differentiate q and k only)
    inv_freq = config.inv_freq().double().requires_grad_()
    angles = pos[..., None].double() * inv_freq.detach()
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    want_tq, want_tk = pn.apply_rotary_pos_emb(qt, kt, cos.float(), sin.float())
    calls = _watch_fast_path()
    with torch.no_grad():
        got_q, got_k = pn.apply_rope(q, k, pos, inv_freq=inv_freq)
        got_tq, got_tk = pn.apply_rotary_pos_emb(qt, kt, cos.float().requires_grad_(), sin.float())
    assert calls() == {"rope": 1, "rope_cos_sin": 1}
    torch.testing.assert_close(got_q.double(), want_q, atol=2e-6, rtol=0)
    torch.testing.assert_close(got_k.double(), want_k, atol=2e-6, rtol=0)
    assert torch.equal(got_tq, want_tq) and torch.equal(got_tk, want_tk)


def _both_paths(monkeypatch, call):
    """call() on the fast path and on the general one (ops._FAST None, the modules' __call__
    nn.Module's): (result or the exception's type and text) of each, and the fast path's kernel runs."""
    got = []
    calls = _watch_fast_path()
    for fast in (ops._FAST, None):
        monkeypatch.setattr(ops, "_FAST", fast)
        if fast is None:
            for cls in (pn.RotaryEmbedding, pn.SinusoidalPositionalEncoding, pn.T5RelativePositionBias, pn.ALiBi):
                monkeypatch.setattr(cls, "__call__", torch.nn.Module.__call__)
        try:
            got.append(call())
        except Exception as e:  # noqa: BLE001 (compared below)
            got.append((type(e), str(e).split("\n")[0]))
        monkeypatch.undo()
    return got, calls()


def test_fast_path_leaves_non_strided_tensors_to_the_dispatcher(monkeypatch):
    """An MKLDNN tensor is a plain torch.Tensor on the CPU with no strides: the fast path read it as
    strided memory (wrong values, or a crash); the dispatcher refuses it, on both paths now."""
    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    x = torch.randn(1, 4, 16, generator=GEN)
    weight, slopes = torch.randn(32, 4, generator=GEN), pn.alibi_slopes(4)
    calls = [lambda: pn.apply_rope(q.to_mkldnn(), k, pos, config=config),
             lambda: pn.apply_rope(q, k, pos, inv_freq=config.inv_freq().float().to_mkldnn()),
             lambda: pn.apply_rotary_pos_emb(q.transpose(1, 2).to_mkldnn(), k.transpose(1, 2), torch.randn(3, 1, 64),
                                             torch.randn(3, 1, 64)),
             lambda: pn.add_sinusoidal(x.to_mkldnn(), offset=3),
             lambda: pn.SinusoidalPositionalEncoding(16)(x.to_mkldnn(), 3),
             lambda: pn.relative_position_bias(weight.to_mkldnn(), 2, 5),
             lambda: pn.alibi_bias(slopes.to_mkldnn(), 2, 5)]
    for call in calls:
        (fast, general), runs = _both_paths(monkeypatch, call)
        assert runs == {}
        assert fast == general and fast[0] is NotImplementedError and "Mkldnn" in fast[1]


def test_fast_path_leaves_zero_tensor_tables_of_the_biases_to_the_dispatcher(monkeypatch):
    """A ZeroTensor weight or slopes (no data) crashed the biases' fast path; the dispatcher's
    fallback materializes it: a bias of zeros on both paths."""
    for call in (lambda: pn.relative_position_bias(torch._efficientzerotensor((32, 4)), 3, 5, query_offset=2),
                 lambda: pn.alibi_bias(torch._efficientzerotensor((4,)), 3, 5, query_offset=2)):
        (fast, general), runs = _both_paths(monkeypatch, call)
        assert runs == {}
        assert fast.shape == general.shape == (1, 4, 3, 5) and not fast.any() and not general.any()


def test_negative_view_positions_are_read_as_their_values(monkeypatch):
    """Integer positions that are a negative view (torch._neg_view) hold the negated storage: the
    fast path declines them (it read the stored values); both paths rotate at the view's positions."""
    config = _config()
    _warm(config)
    q, k, _ = _decode_inputs()
    pos = _negative_view(torch.randint(0, 100_000, (3, 1), generator=GEN))
    want_q, want_k = reference.apply_rope(q.double(), k.double(), pos.clone(), config)
    (fast, general), runs = _both_paths(monkeypatch, lambda: pn.apply_rope(q, k, pos, config=config))
    assert runs == {}
    for got_q, got_k in (fast, general):
        torch.testing.assert_close(got_q.double(), want_q, rtol=0, atol=2e-6)
        torch.testing.assert_close(got_k.double(), want_k, rtol=0, atol=2e-6)


def test_a_layout_with_a_nul_is_refused_on_both_paths(monkeypatch):
    config = _config()
    _warm(config)
    q, k, pos = _decode_inputs()
    bad = "bshd\x00junk"
    for call in (lambda: pn.apply_rope(q, k, pos, config=config, layout=bad),
                 lambda: pn.apply_rope_(q.clone(), k.clone(), pos, config=config, layout=bad),
                 lambda: pn.RotaryEmbedding(config, layout=bad)(q, k, pos)):
        (fast, general), runs = _both_paths(monkeypatch, call)
        assert runs == {}
        assert fast == general and fast[0] is ValueError and "layout" in fast[1]


def test_fx_tracing_records_the_bias_modules_calls():
    """torch.fx's tracer patches nn.Module.__call__ to record module calls: the modules' C __call__
    leaves every call to it then, so a traced graph reads the module's table, not a constant made
    while tracing (T5 traced through: its weight a get_attr node; ALiBi as a leaf: a call_module)."""

    class Leaf(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, (pn.T5RelativePositionBias, pn.ALiBi)) or super().is_leaf_module(m, name)

    class Scores(torch.nn.Module):
        def __init__(self, bias):
            super().__init__()
            self.b = bias

        def forward(self, s):
            return s + self.b(3, 5)

    for bias, tracer in ((pn.T5RelativePositionBias(4), torch.fx.Tracer()), (pn.T5RelativePositionBias(4), Leaf()),
                         (pn.ALiBi(4), Leaf())):
        model = Scores(bias)
        with torch.no_grad():
            calls = _watch_fast_path()
            gm = torch.fx.GraphModule(model, tracer.trace(model))
            assert calls() == {}
            assert not any(n.op == "get_attr" and n.target.startswith("_tensor_constant") for n in gm.graph.nodes)
            s = torch.randn(1, 4, 3, 5, generator=GEN)
            if isinstance(bias, pn.T5RelativePositionBias):
                bias.relative_attention_bias.weight.copy_(torch.randn(32, 4, generator=GEN))
            torch.testing.assert_close(gm(s), model(s), rtol=0, atol=0)
