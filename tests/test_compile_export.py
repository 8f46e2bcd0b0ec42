"""torch.compile, torch.export and AOTInductor with the posenc ops inside real models.

A small attention block (fused qkv projection, RoPE on q/k views of it, scaled_dot_product_attention,
out projection) and a tiny language model that also adds sinusoidal encodings to its input
embeddings. Every check compares against the same module run eagerly on fresh random inputs.
Shapes are tiny: inductor compiles on two CPU cores.
"""
from __future__ import annotations

import copy
import math
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import posenc_native
from posenc_native import reference

DEVICES = ["cpu"]
if torch.cuda.is_available() and posenc_native.build_info()["cuda"]:
    DEVICES.append("cuda")

D_MODEL, HEADS, VOCAB = 32, 4, 64


def default_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


class RopeAttention(nn.Module):
    """qkv projection -> RoPE on q and k (strided views of the fused qkv) -> SDPA -> out projection."""

    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS, attention_factor: float = 1.0) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.attention_factor = attention_factor
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.register_buffer("inv_freq", default_inv_freq(self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        q, k = posenc_native.apply_rope(q, k, inv_freq=self.inv_freq, attention_factor=self.attention_factor)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, s, -1))


class TinyLM(nn.Module):
    """Token embedding * sqrt(d) + sinusoidal encoding (fused op), then a RoPE attention block."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.block = RopeAttention(attention_factor=1.1)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = posenc_native.add_sinusoidal(self.embed(tokens), x_scale=math.sqrt(D_MODEL))
        h = h + self.block(h)
        return self.head(self.norm(h))


def make(model_name: str, device: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return {"attention": RopeAttention, "lm": TinyLM}[model_name]().to(device)


def make_input(model_name: str, batch: int, seq: int, device: str) -> torch.Tensor:
    if model_name == "lm":
        return torch.randint(0, VOCAB, (batch, seq), device=device)
    return torch.randn(batch, seq, D_MODEL, device=device)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, device: str) -> None:
    assert expected.abs().max() > 0.1  # a real output, not zeros
    tol = 1e-6 if device == "cpu" else 1e-5
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=tol)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# torch.compile


@pytest.mark.parametrize("model_name", ["attention", "lm"])
def test_no_graph_breaks(model_name):
    model = make(model_name, "cpu")
    explanation = torch._dynamo.explain(model)(make_input(model_name, 2, 7, "cpu"))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    code = explanation.graphs[0].code
    assert "posenc.rope" in code  # the op is in the graph as one node, not traced through
    if model_name == "lm":
        assert "posenc.add_sinusoidal" in code


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_fullgraph_matches_eager(device):
    from torch._inductor.utils import run_and_get_code

    model = make("lm", device)
    tokens = make_input("lm", 2, 9, device)
    with torch.no_grad():
        expected = model(tokens)
        compiled = torch.compile(model, fullgraph=True)
        actual, codes = run_and_get_code(compiled, tokens)
    assert_matches(actual, expected, device)
    generated = "\n".join(codes)
    # inductor calls our kernels (extern ops), it does not replace them
    assert "torch.ops.posenc.rope.default" in generated
    assert "torch.ops.posenc.add_sinusoidal.default" in generated
    # fresh inputs on the same compiled artifact
    tokens = make_input("lm", 2, 9, device)
    with torch.no_grad():
        assert_matches(compiled(tokens), model(tokens), device)


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_dynamic_shapes_one_compile(device):
    model = make("lm", device)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        tokens = make_input("lm", 2, 5, device)
        assert_matches(compiled(tokens), model(tokens), device)
        compiles = counter.frame_count
        # Sizes >= 2 (torch specializes dims of size 0 and 1 unless marked unbacked).
        for batch, seq in ((3, 12), (2, 17), (5, 2)):
            tokens = make_input("lm", batch, seq, device)
            assert_matches(compiled(tokens), model(tokens), device)
    assert counter.frame_count == compiles  # one symbolic graph serves every batch and sequence length


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_overhead(device):
    """On CUDA this records and replays a CUDA graph; on CPU inductor skips graphs and just runs."""
    model = make("attention", device)
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replay
            x = make_input("attention", 2, 8, device)
            actual = compiled(x).clone()  # CUDA-graph outputs are overwritten by the next replay
            assert_matches(actual, model(x), device)


@pytest.mark.parametrize("device", DEVICES)
def test_training_loss_curve_matches_eager(device):
    eager = make("lm", device)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    # SGD: the update is linear in the gradient, so parameters stay comparable (Adam's normalisation
    # would amplify rounding differences of near-zero gradients).
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    losses_e, losses_c = [], []
    for _ in range(4):
        tokens = torch.randint(0, VOCAB, (2, 10), generator=g).to(device)
        targets = torch.randint(0, VOCAB, (2, 10), generator=g).to(device)
        for model, fn, opt, losses in ((eager, eager, opt_e, losses_e), (compiled_model, compiled, opt_c, losses_c)):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fn(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses_e[-1] < losses_e[0]  # it trains: gradients flow through both ops
    # CPU: inductor keeps eager's reduction order here; CUDA: generated kernels may reorder sums.
    rtol, atol = (1e-5, 1e-6) if device == "cpu" else (1e-4, 1e-5)
    torch.testing.assert_close(torch.tensor(losses_c), torch.tensor(losses_e), rtol=rtol, atol=atol)
    for (name, p_c), p_e in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p_c, p_e, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dynamic", [False, True])
def test_inplace_rope_compiles_without_breaks(dynamic):
    """apply_rope_ on q/k views of a fused qkv buffer, functionalized by torch.compile. With dynamic
    shapes inductor lost a mutated view's symbolic storage offset (k = qkv[:, :, 1] alone had
    qkv[:, :, 0] rotated instead), and in training the traced in-place autograd gave the views wrong
    gradients (static shapes too): those are rotated out of place and copied back."""
    inv_freq = default_inv_freq(8)

    def rotate_in_place(qkv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, _ = qkv.unbind(2)
        posenc_native.apply_rope_(q, k, positions, inv_freq=inv_freq, attention_factor=1.25)
        return qkv

    def rotate_k_alone(qkv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        posenc_native.apply_rope_(qkv[:, :, 1], None, positions, inv_freq=inv_freq, attention_factor=1.25)
        return qkv

    qkv = torch.randn(2, 6, 3, 4, 8)
    positions = torch.tensor([3, 9, 10, 11, 40, 41])
    expected_q, expected_k = posenc_native.apply_rope(qkv[:, :, 0], qkv[:, :, 1], positions, inv_freq=inv_freq,
                                                      attention_factor=1.25)
    counter = CompileCounterWithBackend("inductor")
    buffer = qkv.clone()
    with torch.inference_mode():
        torch.compile(rotate_in_place, backend=counter, fullgraph=True, dynamic=dynamic)(buffer, positions)
    assert counter.frame_count == 1
    # the caller's buffer was rotated in place, as in eager mode
    assert_matches(buffer[:, :, 0], expected_q, "cpu")
    assert_matches(buffer[:, :, 1], expected_k, "cpu")
    assert torch.equal(buffer[:, :, 2], qkv[:, :, 2])  # v untouched

    buffer = qkv.clone()
    torch.compile(rotate_k_alone, fullgraph=True, dynamic=dynamic)(buffer, positions)
    assert torch.equal(buffer[:, :, 0], qkv[:, :, 0]) and torch.equal(buffer[:, :, 2], qkv[:, :, 2])
    assert_matches(buffer[:, :, 1], expected_k, "cpu")

    # training: the rotated slices of a non-leaf (unbind's views autograd cannot rebase), gradients as eager's
    def rotate_slices(qkv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        posenc_native.apply_rope_(qkv[:, :, 0], qkv[:, :, 1], positions, inv_freq=inv_freq, attention_factor=1.25)
        return qkv

    weights = torch.randn(qkv.shape)
    grads = []
    for fn in (rotate_slices, torch.compile(rotate_slices, fullgraph=True, dynamic=dynamic)):
        leaf = qkv.clone().requires_grad_()
        (fn(leaf * 1.0, positions) * weights).sum().backward()
        grads.append(leaf.grad)
    assert_matches(grads[1], grads[0], "cpu")


def _assert_refused(call, message: str) -> None:
    """call() raises, and ``message`` (a regex) is in its error or one it was raised in handling (dynamo
    reports an error raised while it traces, in a fake kernel or a nonstrict_trace function, as the
    context of its own)."""
    with pytest.raises(Exception) as refusal:
        call()
    chain = [refusal.value]
    while chain[-1].__context__ is not None:
        chain.append(chain[-1].__context__)
    assert any(re.search(message, str(e)) for e in chain), [str(e) for e in chain]


# q and k that eager's in-place rotation refuses (fn(buffer) -> (q, k), message): the compiled
# copy-back paths (with a gradient wanted, or a symbolic storage offset) copied the rotation back
# into such views with no check, the second copy overwriting the first where q and k meet
_REFUSED_IN_PLACE = {
    "same tensor": (lambda y: (y, y), "q and k must not share memory"),
    "overlapping views": (lambda y: (y[:, :-1], y[:, 1:]), "q and k must not share memory"),
    "expanded k": (lambda y: (y[:, 1:], y[:, :1].expand(-1, y.shape[1] - 1, -1, -1)),  # (torch's copy_
                   # refuses it while tracing the copy-back paths, in its own words)
                   "k must not have elements that share memory|more than one element of the written-to tensor"),
}


@pytest.mark.parametrize("case", list(_REFUSED_IN_PLACE))
@pytest.mark.parametrize("grad, dynamic", [(True, False), (True, True), (False, True), (False, False)])
def test_compiled_inplace_rope_refuses_what_eager_refuses(case, grad, dynamic):
    views, message = _REFUSED_IN_PLACE[case]
    inv_freq = default_inv_freq(4)

    def rotate(y: torch.Tensor) -> torch.Tensor:
        q, k = views(y)
        posenc_native.apply_rope_(q, k, inv_freq=inv_freq)
        return y * 2.0

    leaf = torch.randn(2, 7, 3, 4, requires_grad=grad)
    buffer = leaf.detach().clone() if not grad else leaf * 1.0  # (a non-leaf: in place is allowed with grad)
    before = buffer.detach().clone()
    with pytest.raises(RuntimeError, match=message):
        rotate(buffer)
    torch._dynamo.reset()
    _assert_refused(lambda: torch.compile(rotate, fullgraph=True, dynamic=dynamic)(buffer), message)
    assert torch.equal(buffer.detach(), before)  # refused before any write


@pytest.mark.parametrize("grad, dynamic", [(True, False), (True, True), (False, True), (False, False)])
def test_compiled_inplace_rope_on_views_of_a_pointwise_intermediate(grad, dynamic):
    """Views of a pointwise result inductor never materializes: it computed q and k into separate
    buffers, so overlapping ones passed the run-time checks (eager refuses them); they are refused
    while tracing now, and views apart (q and k heads of one buffer) still match eager, gradients too."""
    inv_freq = default_inv_freq(8)

    def rotate(x: torch.Tensor, k_heads: slice) -> torch.Tensor:
        t = x * 2.0 + 1.0
        posenc_native.apply_rope_(t[:, :, 0:2], t[:, :, k_heads], inv_freq=inv_freq)
        return t.sin()

    x = torch.randn(2, 5, 4, 8, requires_grad=grad)
    torch._dynamo.reset()
    _assert_refused(lambda: torch.compile(rotate, fullgraph=True, dynamic=dynamic)(x, slice(1, 3)),  # head 1 in both
                    "q and k must not share memory")
    torch._dynamo.reset()
    got = torch.compile(rotate, fullgraph=True, dynamic=dynamic)(x, slice(2, 4))
    want = rotate(x, slice(2, 4))
    assert_matches(got, want, "cpu")
    if grad:
        weights = torch.randn(want.shape)
        (got_grad,) = torch.autograd.grad((got * weights).sum(), x)
        (want_grad,) = torch.autograd.grad((want * weights).sum(), x)
        assert_matches(got_grad, want_grad, "cpu")


def test_compiled_inplace_rope_checks_memory_under_no_grad_with_a_parameter_inv_freq():
    """A learnable inv_freq evaluated under no_grad: the copy-back path skipped its check for an
    inv_freq that requires grad (which the rotation refuses only when autograd records it)."""
    inv_freq = nn.Parameter(default_inv_freq(4))

    def rotate(y: torch.Tensor) -> torch.Tensor:
        posenc_native.apply_rope_(y[:, :-1], y[:, 1:], inv_freq=inv_freq)
        return y * 2.0

    buffer = torch.randn(2, 7, 3, 4)
    before = buffer.clone()
    with torch.no_grad():
        for fn in (rotate, torch.compile(rotate, fullgraph=True, dynamic=True, backend="aot_eager")):
            _assert_refused(lambda: fn(buffer), "q and k must not share memory")
    assert torch.equal(buffer, before)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_vmap_of_inplace_rope_on_fused_views(backend):
    """torch.compile(vmap(f)) with dynamic shapes, f rotating q and k views of a fused qkv in place:
    every slice as apply_rope gives it, gradients too; views that share memory across slices are
    refused, the input unchanged. (The check op once had no vmap rule: torch's per-slice fallback
    lost the symbolic shapes, and the retrace met rope_, which has none either.)"""
    inv_freq = default_inv_freq(8)

    def rotate(t: torch.Tensor) -> torch.Tensor:
        t = t * 1.5
        posenc_native.apply_rope_(t[:, :, 0], t[:, :, 1], inv_freq=inv_freq)
        return t

    leaf = torch.randn(3, 2, 5, 3, 2, 8, requires_grad=True)
    weights = torch.randn(leaf.shape)
    got = torch.compile(torch.func.vmap(rotate), backend=backend, fullgraph=True, dynamic=True)(leaf)
    (got * weights).sum().backward()
    want = [rotate(leaf[i]) for i in range(3)]
    expected = torch.stack(want)
    assert_matches(got, expected, "cpu")
    grad, leaf.grad = leaf.grad, None
    (expected * weights).sum().backward()
    assert_matches(grad, leaf.grad, "cpu")

    def across_slices(t: torch.Tensor) -> torch.Tensor:  # k of slice i is q of slice i + 1
        posenc_native.apply_rope_(t[0], t[1], inv_freq=inv_freq)
        return t * 2.0

    buffer = torch.randn(4, 2, 5, 2, 8)
    before = buffer.clone()
    _assert_refused(lambda: torch.compile(torch.func.vmap(across_slices, in_dims=1), backend=backend, fullgraph=True,
                                          dynamic=True)(buffer.unfold(0, 2, 1).movedim(-1, 0)), "share memory")
    assert torch.equal(buffer, before)


class ModuleAttention(nn.Module):
    """RopeAttention with the rotation as a RotaryEmbedding submodule (whose __call__ is the decode
    fast path's C method: torch.compile and torch.export trace nn.Module.__call__ in its place)."""

    def __init__(self, config: posenc_native.RopeConfig) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.rotary = posenc_native.RotaryEmbedding(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, D_MODEL // HEADS).unbind(2)
        q, k = self.rotary(q, k, positions=positions)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


def test_rotary_module_compiles_and_exports_without_breaks():
    torch.manual_seed(0)
    config = posenc_native.RopeConfig(head_dim=D_MODEL // HEADS, scaling={"rope_type": "yarn", "factor": 4.0,
                                                                         "original_max_position_embeddings": 64})
    model = ModuleAttention(config).eval()
    x, positions = torch.randn(2, 7, D_MODEL), torch.arange(3, 10).expand(2, 7)
    with torch.no_grad():
        expected = model(x, positions)
        counter = CompileCounterWithBackend("inductor")
        assert_matches(torch.compile(model, backend=counter, fullgraph=True)(x, positions), expected, "cpu")
        assert counter.frame_count == 1
        explanation = torch._dynamo.explain(model)(x, positions)
        assert explanation.graph_break_count == 0 and "posenc.rope" in explanation.graphs[0].code
        ep = torch.export.export(model, (x, positions))
        assert _posenc_targets(ep) == {"posenc.rope.default"}
        x2 = torch.randn(2, 7, D_MODEL)
        assert_matches(ep.module()(x2, positions), model(x2, positions), "cpu")


class EncodedLinear(nn.Module):
    """A linear layer on sinusoidally encoded inputs: SinusoidalPositionalEncoding's __call__ is the
    fast path's C method too."""

    def __init__(self) -> None:
        super().__init__()
        self.pe = posenc_native.SinusoidalPositionalEncoding(D_MODEL, max_len=16)
        self.proj = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self.proj(self.pe(x, offset))


def test_sinusoidal_module_compiles_and_exports_without_breaks():
    torch.manual_seed(0)
    model = EncodedLinear().eval()
    x = torch.randn(2, 7, D_MODEL)
    with torch.no_grad():
        expected = model(x, 20)  # (past max_len: computed on the fly)
        want = model.proj(reference.add_sinusoidal(x.double(), offset=20).float())
        assert_matches(expected, want, "cpu")
        counter = CompileCounterWithBackend("inductor")
        assert_matches(torch.compile(model, backend=counter, fullgraph=True)(x, 20), expected, "cpu")
        assert counter.frame_count == 1
        explanation = torch._dynamo.explain(model)(x, 20)
        assert explanation.graph_break_count == 0 and "posenc.add_sinusoidal" in explanation.graphs[0].code
        ep = torch.export.export(model, (x, 20))
        assert _posenc_targets(ep) == {"posenc.add_sinusoidal.default"}
        x2 = torch.randn(2, 7, D_MODEL)
        assert_matches(ep.module()(x2, 20), model(x2, 20), "cpu")


LENGTH_SCALINGS = {
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "longrope": {"rope_type": "longrope", "factor": 8.0, "original_max_position_embeddings": 32,
                 "short_factor": [1.0 + 0.1 * i for i in range(4)], "long_factor": [2.0 + 0.5 * i for i in range(4)]},
}


@pytest.mark.parametrize("scheme", sorted(LENGTH_SCALINGS))
def test_schemes_that_follow_the_length_compile_fullgraph_and_export(scheme):
    """Dynamic NTK and LongRoPE frequencies follow the sequence length (the largest position + 1).
    Compiled with fullgraph=True (positions as data, or none with dynamic sizes) and exported, the
    graph computes them from the length (RopeConfig.op_inv_freq_of_length): no host read of the
    positions, no graph break, and the float64 reference's result on both sides of the original
    context (it failed on a data-dependent guard or assume_constant_result before)."""
    config = posenc_native.RopeConfig(head_dim=8, max_position_embeddings=32, scaling=LENGTH_SCALINGS[scheme])
    g = torch.Generator().manual_seed(7)

    def rotate(q, positions=None):
        return posenc_native.apply_rope(q, None, positions, config=config)[0]

    with_positions = torch.compile(rotate, fullgraph=True)
    sized = torch.compile(lambda q: rotate(q), fullgraph=True, dynamic=True)
    model = ModuleAttention(config).eval()
    ep = torch.export.export(model, (torch.randn(1, 20, D_MODEL), torch.arange(20)[None]),
                             dynamic_shapes=({1: torch.export.Dim("s", min=2, max=512)},
                                             {1: torch.export.Dim("s", min=2, max=512)}))
    for length in (20, 90):  # below and past max_position_embeddings / the original context
        q = torch.randn(2, length, 3, 8, generator=g)
        positions = torch.randint(0, length, (2, length), generator=g)
        positions[0, -1] = length - 1  # the length the frequencies follow
        want, _ = reference.apply_rope(q.double(), None, positions, config)
        torch.testing.assert_close(with_positions(q, positions).double(), want, atol=2e-6, rtol=0)
        want, _ = reference.apply_rope(q.double(), None, None, config)
        torch.testing.assert_close(sized(q).double(), want, atol=2e-6, rtol=0)
        x, pos = torch.randn(1, length, D_MODEL, generator=g), torch.arange(length)[None]
        with torch.no_grad():
            assert_matches(ep.module()(x, pos), model(x, pos), "cpu")
    assert _posenc_targets(ep) == {"posenc.rope.default"}


def test_several_configs_in_one_compiled_graph():
    """Layers with different configs in one graph (Gemma's sliding and full attention, a vision tower
    and its decoder): each config's frequencies are a graph constant of its own name. Inductor
    refused two constants of one name ("source ConstantSource(source_name='get') already in
    seen_sources"), so such a model did not compile at all."""
    configs = [posenc_native.RopeConfig(head_dim=8), posenc_native.RopeConfig(head_dim=8, base=500.0),
               posenc_native.RopeConfig(head_dim=8, scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 16})]
    g = torch.Generator().manual_seed(8)
    q, positions = torch.randn(2, 9, 3, 8, generator=g), torch.randint(0, 5000, (2, 9), generator=g)

    def layers(q, positions):
        return [posenc_native.apply_rope(q, None, positions, config=c)[0] for c in configs]

    counter = CompileCounterWithBackend("inductor")
    for got, eager, c in zip(torch.compile(layers, backend=counter, fullgraph=True)(q, positions), layers(q, positions),
                             configs):
        assert torch.equal(got, eager)
        torch.testing.assert_close(got.double(), reference.apply_rope(q.double(), None, positions, c)[0],
                                   atol=2e-6, rtol=0)
    assert counter.frame_count == 1


def assert_decode_loop_compiles_once(step) -> None:
    """Decode steps at cache lengths 5, 6, ...: after the second step (when torch.compile turns the
    int into a symbol) no further compiles may happen."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    compiles = None
    for cache_len in range(5, 13):
        q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 2, 8)
        for a, e in zip(compiled(q, k, cache_len), step(q, k, cache_len)):
            assert_matches(a, e, "cpu")
        if cache_len == 6:
            compiles = counter.frame_count
    assert counter.frame_count == compiles, f"recompiled: {counter.frame_count} compiles for 8 steps"


def test_decode_loop_with_position_tensor_does_not_recompile():
    """A decode step whose positions come in as a tensor compiles once (plus one dynamic recompile)."""
    inv_freq = default_inv_freq(8)

    def step(q, k, cache_len: int):
        positions = torch.arange(q.shape[1]) + cache_len
        return posenc_native.apply_rope(q, k, positions, inv_freq=inv_freq)

    assert_decode_loop_compiles_once(step)


def test_decode_loop_with_int_offset_does_not_recompile():
    inv_freq = default_inv_freq(8)

    def step(q, k, cache_len: int):
        return posenc_native.apply_rope(q, k, inv_freq=inv_freq, offset=cache_len)

    assert_decode_loop_compiles_once(step)


# ------------------------------------------------------------------------------------------------
# torch.export and AOTInductor


def _posenc_targets(ep) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function" and "posenc" in str(n.target)}


@pytest.mark.parametrize("model_name", ["attention", "lm"])
def test_export_matches_eager(model_name, tmp_path):
    model = make(model_name, "cpu").eval()
    example = make_input(model_name, 2, 8, "cpu")
    seq = torch.export.Dim("seq", min=2, max=512)
    arg = "x" if model_name == "attention" else "tokens"
    ep = torch.export.export(model, (example,), dynamic_shapes={arg: {1: seq}})
    expected_ops = {"posenc.rope.default"} | ({"posenc.add_sinusoidal.default"} if model_name == "lm" else set())
    assert _posenc_targets(ep) == expected_ops

    # decompositions to the core ATen opset keep our ops as single nodes
    decomposed = ep.run_decompositions()
    assert _posenc_targets(decomposed) == expected_ops

    path = tmp_path / "model.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path)
    with torch.no_grad():
        for seq_len in (8, 13, 3):  # other lengths than the example: the seq dim is symbolic
            x = make_input(model_name, 2, seq_len, "cpu")
            expected = model(x)
            for program in (ep, decomposed, loaded):
                assert_matches(program.module()(x), expected, "cpu")


def test_aoti_package_cpu(tmp_path):
    model = make("lm", "cpu").eval()
    seq = torch.export.Dim("seq", min=2, max=512)
    with torch.no_grad():
        ep = torch.export.export(model, (make_input("lm", 2, 8, "cpu"),), dynamic_shapes={"tokens": {1: seq}})
        package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "lm.pt2"))
        runner = torch._inductor.aoti_load_package(package)
        for seq_len in (8, 21):
            tokens = make_input("lm", 2, seq_len, "cpu")
            assert_matches(runner(tokens), model(tokens), "cpu")


_IMPORT_ORDER_SCRIPT = """
import sys
import torch
if sys.argv[1] == "dynamo_first":
    import torch._dynamo
import posenc_native
from posenc_native import reference
assert ("torch._dynamo" in sys.modules) == (sys.argv[1] == "dynamo_first"), "import posenc_native imported dynamo"

torch.manual_seed(5)
cfg = posenc_native.RopeConfig(head_dim=8, scaling={"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 16})
rotary = posenc_native.RotaryEmbedding(cfg)
positions = torch.tensor([[3, 9, 10, 11, 40, 41]])
qkv = torch.randn(1, 6, 3, 4, 8)
want_q, want_k = reference.apply_rope(qkv[:, :, 0].double(), qkv[:, :, 1].double(), positions, cfg)

def in_place(qkv, positions):  # the C fast path's substitute and the nonstrict-traced in-place op
    q, k, _ = qkv.unbind(2)
    posenc_native.apply_rope_(q, k, positions, config=cfg)
    return qkv

q, k = torch.compile(lambda q, k, p: rotary(q, k, p), fullgraph=True, dynamic=True, backend="aot_eager")(
    qkv[:, :, 0], qkv[:, :, 1], positions)  # the module's C __call__ and its substitute
buffer = torch.compile(in_place, fullgraph=True, dynamic=True, backend="aot_eager")(qkv.clone(), positions)
for got in (q, buffer[:, :, 0]):
    torch.testing.assert_close(got.double(), want_q, rtol=0, atol=2e-6)
for got in (k, buffer[:, :, 1]):
    torch.testing.assert_close(got.double(), want_k, rtol=0, atol=2e-6)
assert torch.equal(buffer[:, :, 2], qkv[:, :, 2])
print("ok")
"""


@pytest.mark.parametrize("order", ["posenc_first", "dynamo_first"])
def test_compile_registrations_whichever_is_imported_first(order):
    """``import posenc_native`` does not import dynamo (1.2 s of import time:
    posenc_native/_dynamo_hooks.py); its registrations with dynamo (the C functions' substitutes, the
    nonstrict-traced in-place op) run when dynamo is imported, or at once where it already was. In a
    fresh process either way, compiled fullgraph calls of each match the float64 reference."""
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ORDER_SCRIPT, order], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
