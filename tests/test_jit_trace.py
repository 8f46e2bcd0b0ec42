"""torch.jit.trace of code that calls the library (README "TorchScript and torch.jit.trace").

A trace records the ops that run and replays them. What the library computes from a config alone
(frequencies, axis masks, ALiBi slopes) enters it as a constant, the same in every trace, so
torch's sanity check (a second trace, compared) passes and the trace follows new positions and
lengths as eager does, checked here against the float64 reference. What a trace cannot follow, an
int handed to a custom op (torch records ints as constants) or a regime picked by sequence length,
is named in a TracerWarning instead of being kept silently.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch

import posenc_native as pn
from posenc_native import reference

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated",  # (2.13: a DeprecationWarning)
                                        "ignore:`torch.jit.trace_method` is deprecated")

GEN = torch.Generator().manual_seed(27)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 128}


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN, dtype=torch.float64).float()


def qkp(S: int):
    """q, k [2, S, heads, 64] and positions [2, S] at a random start."""
    start = int(torch.randint(0, 5000, (1,), generator=GEN))
    return randn(2, S, 4, 64), randn(2, S, 2, 64), torch.arange(start, start + S).expand(2, S).contiguous()


def trace_quietly(fn, inputs):
    """torch.jit.trace with its sanity check (a second trace must give the same graph), any
    TracerWarning an error: nothing of the call was turned into a constant unseen."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        return torch.jit.trace(fn, inputs)


def graph_of(traced) -> str:
    return str(traced.inlined_graph if isinstance(traced, torch.jit.ScriptModule) else traced.graph)


class Module(torch.nn.Module):
    """fn(self.inner, *inputs) as a module (a trace keeps a module's parameters as parameters)."""

    def __init__(self, fn, inner: torch.nn.Module):
        super().__init__()
        self.fn, self.inner = fn, inner

    def forward(self, *inputs):
        return self.fn(self.inner, *inputs)


def rope_case(make_config, call):
    """A fresh config per case: the trace fills its frequency cache, the check trace reads it."""
    def case():
        cfg = make_config()

        def want(q, k, pos):
            return reference.apply_rope(q.double(), k.double(), pos, cfg)
        return call(cfg), qkp, want
    return case


ROPE_CASES = {
    "apply_rope yarn": rope_case(lambda: pn.RopeConfig(head_dim=64, scaling=YARN),
                                 lambda cfg: lambda q, k, p: pn.apply_rope(q, k, p, config=cfg)),
    "apply_rope_ llama3": rope_case(lambda: pn.RopeConfig(head_dim=64, base=500000.0, scaling=LLAMA3),
                                    lambda cfg: lambda q, k, p: pn.apply_rope_(q.clone(), k.clone(), p, config=cfg)),
    "RotaryEmbedding yarn interleaved": rope_case(lambda: pn.RopeConfig(head_dim=64, scaling=YARN, interleaved=True),
                                                  lambda cfg: pn.RotaryEmbedding(cfg)),
    "apply_rope mrope": rope_case(lambda: pn.RopeConfig(head_dim=64, mrope_section=(8, 12, 12)),
                                  lambda cfg: lambda q, k, p: pn.apply_rope(q, k, p, config=cfg)),
}


@pytest.mark.parametrize("name", list(ROPE_CASES))
def test_traced_rope_follows_new_positions_and_lengths(name):
    fn, inputs, want = ROPE_CASES[name]()
    traced = trace_quietly(fn, inputs(8))
    assert re.search(r"posenc::rope_?\(", graph_of(traced)), "the op is recorded"
    assert "aten::pow" not in graph_of(traced), "the frequencies are a constant, not recomputed per call"
    for S in (8, 21):
        q, k, pos = inputs(S)
        got = traced(q, k, pos)
        for g, w in zip(got, want(q, k, pos)):
            assert g.shape == w.shape
            torch.testing.assert_close(g.double(), w, rtol=0, atol=2e-5)


def test_traced_rope_of_inv_freq_and_q_alone_follow_new_inputs():
    inv = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    cfg = pn.RopeConfig(head_dim=64, scaling=YARN)
    traced = trace_quietly(lambda q, k, p: (pn.apply_rope(q, k, p, inv_freq=inv.float(), attention_factor=1.25)[1],
                                            pn.apply_rope(q, None, p, config=cfg)[0]), qkp(8))
    q, k, pos = qkp(13)
    got_k, got_q = traced(q, k, pos)
    torch.testing.assert_close(got_k.double(), reference.apply_rope(
        k.double(), None, pos, inv_freq=inv.float().double(), attention_factor=1.25)[0], rtol=0, atol=2e-5)
    torch.testing.assert_close(got_q.double(), reference.apply_rope(q.double(), None, pos, cfg)[0], rtol=0, atol=2e-5)


def test_traced_sinusoidal_entries_follow_new_lengths():
    pe_module = pn.SinusoidalPositionalEncoding(64, max_len=128)
    learned = pn.LearnablePositionalEncoding(64, max_len=128)
    traced = {
        "add_sinusoidal": trace_quietly(lambda x: pn.add_sinusoidal(x, x_scale=2.0), (randn(2, 8, 64),)),
        "sinusoidal_table": trace_quietly(lambda p: pn.sinusoidal_table(p, 64), (torch.arange(3, 11),)),
        "module": trace_quietly(pe_module, (randn(2, 8, 64),)),
        "learnable": trace_quietly(learned, (randn(2, 8, 64),)),
    }
    x = randn(2, 19, 64)
    torch.testing.assert_close(traced["add_sinusoidal"](x).double(), reference.add_sinusoidal(x.double(), x_scale=2.0),
                               rtol=0, atol=2e-6)
    torch.testing.assert_close(traced["module"](x).double(), reference.add_sinusoidal(x.double()), rtol=0, atol=2e-6)
    positions = torch.randint(0, 10**6, (30,), generator=GEN)
    torch.testing.assert_close(traced["sinusoidal_table"](positions).double(),
                               reference.sinusoidal_table(positions, 64), rtol=0, atol=2e-6)
    with torch.no_grad():
        torch.testing.assert_close(traced["learnable"](x), x + learned.position_embeddings.weight[:19], rtol=0, atol=0)


def test_traced_patched_transformers_model_matches_unpatched():
    """A patched Hugging Face model traced whole (as ONNX/TorchScript export does) follows a new
    length, and matches the unpatched model there. Before the frequency cache was made untraced, the
    sanity check failed on every config= call."""
    transformers = pytest.importorskip("transformers")
    from posenc_native.integrations import transformers as integration

    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                      rope_parameters={"rope_theta": 10000.0, **YARN}, torchscript=True)
    torch.manual_seed(27)
    model = transformers.LlamaForCausalLM(config).eval()
    logits = Module(lambda m, ids: m(ids, use_cache=False, return_dict=False)[0], model)
    ids = torch.randint(0, 100, (1, 12), generator=GEN)
    new_ids = torch.randint(0, 100, (1, 29), generator=GEN)  # (transformers under a trace keeps the batch)
    with torch.no_grad():
        want = logits(new_ids)
        integration.patch(model)
        with warnings.catch_warnings(record=True) as seen:  # transformers' own code warns under a trace
            warnings.simplefilter("always")
            traced = torch.jit.trace(logits, (ids,))
        integration.unpatch(model)
        got = traced(new_ids)
    assert not [w for w in seen if "posenc" in str(w.message)]
    assert "posenc::rope" in graph_of(traced)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def _trace_warnings(fn, inputs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        traced = torch.jit.trace(fn, inputs, check_trace=False)
    return traced, [str(w.message) for w in seen if issubclass(w.category, torch.jit.TracerWarning)]


KEPT = {  # (what the warning names, module of x -> result, x)
    "offset=8 (apply_rope)": (lambda x: pn.apply_rope(x, None, offset=x.shape[1], config=pn.RopeConfig(head_dim=64))[0],
                              lambda: randn(2, 8, 4, 64)),
    "offset=8 (add_sinusoidal)": (lambda x: pn.add_sinusoidal(x, offset=x.shape[1]), lambda: randn(2, 8, 64)),
    "positions=8": (lambda x: pn.sinusoidal_table(x.shape[1], 64) + x, lambda: randn(2, 8, 64)),
    "query_length=8": (lambda x: pn.alibi_bias(pn.alibi_slopes(4), x.shape[1], 5) + x.sum(), lambda: randn(2, 8, 4)),
    "key_length=8": (lambda x: pn.alibi_bias(pn.alibi_slopes(4), 5, x.shape[1]) + x.sum(), lambda: randn(2, 8, 4)),
    "query_offset=8": (lambda x: pn.alibi_bias(pn.alibi_slopes(4), 3, 5, query_offset=x.shape[1]) + x.sum(),
                       lambda: randn(2, 8, 4)),
}


@pytest.mark.parametrize("name", list(KEPT))
def test_trace_names_an_int_it_keeps(name):
    """An int read from a traced shape reaches a custom op as a constant (a torch limitation): the
    warning names it and its value, and the trace reproduces eager at the traced sizes."""
    fn, make = KEPT[name]
    x = make()
    traced, messages = _trace_warnings(fn, (x,))
    kept = name.split()[0]
    assert any(f"this trace keeps {kept} and will not follow other values" in m for m in messages), messages
    torch.testing.assert_close(traced(x), fn(x), rtol=0, atol=0)


def test_trace_of_bias_modules_names_the_lengths_it_keeps():
    t5 = pn.T5RelativePositionBias(num_heads=4)
    alibi = pn.ALiBi(num_heads=4)
    for module in (t5, alibi):
        wrapped = Module(lambda m, x: m(x.shape[1], x.shape[1] + 2), module)
        x = randn(2, 8, 4)
        traced, messages = _trace_warnings(wrapped, (x,))
        assert any("this trace keeps query_length=8" in m for m in messages), messages
        assert any("this trace keeps key_length=10" in m for m in messages), messages
        with torch.no_grad():
            want = (reference.relative_position_bias(t5.relative_attention_bias.weight.double(), 8, 10)
                    if module is t5 else reference.alibi_bias(reference.alibi_slopes(4), 8, 10))
            torch.testing.assert_close(traced(x).double(), want, rtol=0, atol=1e-6)


def test_trace_names_a_regime_picked_by_length():
    """Dynamic NTK picks its frequencies by sequence length; a trace keeps those of its own length
    and says so (the trace is right at that length)."""
    cfg = pn.RopeConfig(head_dim=64, max_position_embeddings=16, scaling={"rope_type": "dynamic", "factor": 2.0})
    q, k, _ = qkp(24)
    pos = torch.arange(24).expand(2, 24).contiguous()  # past max_position_embeddings: the scaled regime
    traced, messages = _trace_warnings(lambda q, k, p: pn.apply_rope(q, k, p, config=cfg), (q, k, pos))
    assert any("this trace keeps the dynamic frequencies of sequence length 24" in m for m in messages), messages
    for g, w in zip(traced(q, k, pos), reference.apply_rope(q.double(), k.double(), pos, cfg)):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=2e-5)


@pytest.mark.parametrize("seed_class", ["RoPEPositionalEncoding", "YaRNPositionalEncoding"])
def test_traced_seed_article_attention_follows_new_lengths(seed_class):
    """The seed articles' pattern: tables of ``q.shape[2]`` positions, then ``apply_rotary_emb``;
    traced without a TracerWarning (the fused-or-formula choice is made on the trace's shapes), and
    right at another length."""
    if seed_class == "RoPEPositionalEncoding":
        rope = pn.RoPEPositionalEncoding(64)
        tables = lambda m, q: (lambda f: (f.cos(), f.sin()))(m(q.shape[2]))  # noqa: E731
    else:
        rope = pn.YaRNPositionalEncoding(64, original_max_position_embeddings=64, scaling_factor=4.0)
        tables = lambda m, q: m(q.shape[2])  # noqa: E731
    attention = Module(lambda m, q: m.apply_rotary_emb(q, *tables(m, q)), rope)
    traced = trace_quietly(attention, (randn(2, 4, 8, 64),))
    q = randn(2, 4, 37, 64)
    want, _ = reference.apply_rope(q.double(), None, None, rope.config, layout="bhsd")
    torch.testing.assert_close(traced(q).double(), want, rtol=0, atol=2e-5)


def test_trace_of_a_patched_dynamic_ntk_model_names_the_frequencies_it_keeps():
    """A patched model's dynamic NTK follows the longest sequence seen (transformers' state): a trace
    keeps the traced call's frequencies, and now says so in the library's words (torch's generic
    'converting a tensor to a Python integer' was all it got); the trace is right at its own length."""
    transformers = pytest.importorskip("transformers")
    from posenc_native.integrations import transformers as integration

    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                      rope_parameters={"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0},
                                      torchscript=True)
    torch.manual_seed(28)
    model = transformers.LlamaForCausalLM(config).eval()
    logits = Module(lambda m, ids: m(ids, use_cache=False, return_dict=False)[0], model)
    ids = torch.randint(0, 100, (1, 24), generator=GEN)  # past max_position_embeddings: the scaled regime
    with torch.no_grad():
        want = logits(ids)
        integration.patch(model)
        traced, messages = _trace_warnings(logits, (ids,))
        got = traced(ids)
        integration.unpatch(model)
    assert any("this trace keeps the dynamic NTK frequencies of sequence length 24" in m for m in messages), messages
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
