"""torch.fx symbolic tracing of models that use the library (python/posenc_native/_fx.py).

fx passes Proxies where the library checks real tensors, so each entry point records itself as one
node of the graph. What must hold: the traced module gives the eager module's bits (and both match
the float64 reference), on shapes other than the ones it was traced with; its checks run when it
runs; a config is the same object in the graph, so its frequency cache is shared.
"""
from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.fx as fx
from torch import nn

import posenc_native as pn
from posenc_native import modules, ops, reference

D, HEADS, KV_HEADS = 64, 4, 2
HEAD_DIM = D // HEADS
YARN = pn.RopeConfig(head_dim=HEAD_DIM, max_position_embeddings=4096,
                     scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})


class EveryEntry(nn.Module):
    """Each public entry point once, with lengths, scales, dtypes and devices read from traced shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.sinusoidal = pn.SinusoidalPositionalEncoding(D, max_len=64)
        self.learned = pn.LearnablePositionalEncoding(D, max_len=64)
        self.qkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        self.rotary = pn.RotaryEmbedding(YARN)
        self.seed_rope = pn.RoPEPositionalEncoding(HEAD_DIM)
        self.seed_yarn = pn.YaRNPositionalEncoding(HEAD_DIM, original_max_position_embeddings=32, scaling_factor=4.0)
        self.alibi = pn.ALiBi(HEADS)
        self.register_buffer("inv_freq", 500000.0 ** -(torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        b, s, _ = x.shape
        out = {"sinusoidal": self.sinusoidal(x, 3), "learned": self.learned(x, 2),
               "added": pn.add_sinusoidal(x, positions, x_scale=x.shape[-1] ** 0.5, freq_shift=1.0),
               "table": pn.sinusoidal_table(x.shape[1], x.shape[-1], dtype=x.dtype, device=x.device)}
        q, k, v = self.qkv(x).view(b, s, HEADS + 2 * KV_HEADS, HEAD_DIM).split([HEADS, KV_HEADS, KV_HEADS], 2)
        out["yarn_q"], out["yarn_k"] = self.rotary(q, k, positions)
        out["freq_q"], out["freq_k"] = pn.apply_rope(q, k, positions, inv_freq=self.inv_freq, attention_factor=1.25,
                                                     interleaved=True, offset=x.shape[1])
        q_, k_ = q.clone(), k.clone()
        pn.apply_rope_(q_, k_, config=YARN)
        out["inplace_q"], out["inplace_k"] = q_, k_
        cos, sin = self.seed_yarn(x.shape[1])
        out["cos_sin_q"], out["cos_sin_k"] = pn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        out["seed_q"], out["seed_k"] = self.seed_rope.rotate(q, k, layout="bshd")
        cos, sin = self.seed_yarn(x.shape[1])
        out["seed_cos_sin_q"] = self.seed_yarn.apply_rotary_emb(q.transpose(1, 2), cos, sin).transpose(1, 2)
        out["alibi"] = self.alibi(x.shape[1], v.shape[1] + 1)  # Lk = Lq + 1: one cached key
        return out


def _inputs(b: int, s: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, D, generator=g), torch.randint(0, 60000, (b, s), generator=g)


def _references(model: EveryEntry, x: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """The float64 reference of each output, from the model's own projection."""
    b, s, _ = x.shape
    with torch.no_grad():
        q, k, _v = model.qkv(x).view(b, s, HEADS + 2 * KV_HEADS, HEAD_DIM).split([HEADS, KV_HEADS, KV_HEADS], 2)
    q, k = q.double(), k.double()
    table = reference.sinusoidal_table(s + 3, D)
    truth = {"sinusoidal": x.double() + table[3:],
             "added": reference.add_sinusoidal(x.double(), positions, x_scale=D ** 0.5, freq_shift=1.0),
             "table": reference.sinusoidal_table(s, D)}
    truth["yarn_q"], truth["yarn_k"] = reference.apply_rope(q, k, positions, YARN)
    truth["freq_q"], truth["freq_k"] = reference.apply_rope(q, k, positions, inv_freq=model.inv_freq,
                                                            attention_factor=1.25, interleaved=True, offset=s)
    truth["inplace_q"], truth["inplace_k"] = reference.apply_rope(q, k, None, YARN)
    truth["seed_q"], truth["seed_k"] = reference.apply_rope(q, k, None, model.seed_rope.config)
    truth["cos_sin_q"], truth["cos_sin_k"] = reference.apply_rope(q, k, None, model.seed_yarn.config)
    truth["seed_cos_sin_q"] = truth["cos_sin_q"]
    truth["alibi"] = reference.alibi_bias(model.alibi.slopes, s, s + 1)
    return truth


def test_traced_model_gives_the_eager_bits_and_the_reference():
    torch.manual_seed(0)
    model = EveryEntry().eval()
    traced = fx.symbolic_trace(model)
    # each entry point is one node: the modules whose checks read shapes as calls of themselves
    called = {n.target for n in traced.graph.nodes if n.op == "call_function"}
    assert {ops.apply_rope, ops.apply_rope_, ops.add_sinusoidal, ops.sinusoidal_table, ops.apply_rotary_pos_emb,
            modules._rotate_by, pn.RoPEPositionalEncoding.apply_rotary_emb} <= called
    assert {"sinusoidal", "learned", "rotary"} <= {n.target for n in traced.graph.nodes if n.op == "call_module"}
    for b, s, seed in ((2, 24, 1), (3, 9, 2)):  # not the shapes of any trace: fx records none
        x, positions = _inputs(b, s, seed)
        with torch.no_grad():
            eager, got = model(x, positions), traced(x, positions)
        assert set(got) == set(eager)
        for name in eager:
            assert torch.equal(got[name], eager[name]), name
        for name, expected in _references(model, x, positions).items():
            torch.testing.assert_close(got[name].double(), expected, rtol=0, atol=2e-5, msg=name)
        learned = model.learned.position_embeddings.weight[2:2 + s]
        assert torch.equal(got["learned"], x + learned)


def test_traced_model_runs_the_checks_when_it_runs():
    """Validation happens at run time, with real shapes, and before any write."""

    class InPlace(nn.Module):
        def forward(self, q, k):
            return pn.apply_rope_(q, k, config=YARN)

    traced = fx.symbolic_trace(InPlace())
    q, k = torch.randn(1, 5, 2, HEAD_DIM + 2), torch.randn(1, 5, 1, HEAD_DIM + 2)
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(ValueError, match="head_dim"):
        traced(q, k)
    assert torch.equal(q, q0) and torch.equal(k, k0)

    traced = fx.symbolic_trace(nn.Sequential(pn.LearnablePositionalEncoding(D, max_len=8)))
    with pytest.raises(ValueError, match="max_len=8"):
        traced(torch.randn(1, 9, D))


def test_in_place_call_survives_dead_code_elimination():
    """apply_rope_'s outputs are often unused (q and k are read instead): fx passes must keep it."""

    class InPlace(nn.Module):
        def forward(self, q, k):
            q, k = q.clone(), k.clone()
            pn.apply_rope_(q, k, config=YARN)
            return q, k

    traced = fx.symbolic_trace(InPlace())
    traced.graph.eliminate_dead_code()
    traced.recompile()
    assert ops.apply_rope_ in {n.target for n in traced.graph.nodes}
    q, k = torch.randn(2, 9, HEADS, HEAD_DIM), torch.randn(2, 9, KV_HEADS, HEAD_DIM)
    for got, truth in zip(traced(q, k), reference.apply_rope(q.double(), k.double(), None, YARN)):
        torch.testing.assert_close(got.double(), truth, rtol=0, atol=2e-5)


def test_config_is_the_same_object_in_the_graph():
    """A RopeConfig argument stays one object (fx would rebuild a dataclass from its fields on every
    call, recomputing its frequencies), through deepcopy and torch.save too."""

    class Fn(nn.Module):
        def forward(self, q, k, positions):
            return pn.apply_rope(q, k, positions, config=YARN)

    traced = fx.symbolic_trace(Fn())
    constants = [getattr(traced, n.target) for n in traced.graph.nodes if n.op == "get_attr"]
    assert constants == [YARN] and constants[0] is YARN
    q, k, positions = torch.randn(2, 7, HEADS, HEAD_DIM), torch.randn(2, 7, KV_HEADS, HEAD_DIM), torch.arange(7)
    expected = reference.apply_rope(q.double(), k.double(), positions, YARN)
    buffer = io.BytesIO()
    torch.save(traced, buffer)
    buffer.seek(0)
    for module in (traced, copy.deepcopy(traced), torch.load(buffer, weights_only=False)):
        for got, truth in zip(module(q, k, positions), expected):
            torch.testing.assert_close(got.double(), truth, rtol=0, atol=2e-5)


def test_rotary_embedding_traced_as_the_root():
    """Traced itself (no parent to call it as a submodule), RotaryEmbedding records its op call."""
    traced = fx.symbolic_trace(pn.RotaryEmbedding(YARN, layout="bhsd"))
    q, k = torch.randn(2, HEADS, 11, HEAD_DIM), torch.randn(2, KV_HEADS, 11, HEAD_DIM)
    positions = torch.randint(0, 4096, (2, 11))
    for got, truth in zip(traced(q, k, positions), reference.apply_rope(q.double(), k.double(), positions, YARN,
                                                                          layout="bhsd")):
        torch.testing.assert_close(got.double(), truth, rtol=0, atol=2e-5)


class _BiasedScores(nn.Module):
    """Attention scores plus a T5 and an ALiBi bias, their lengths read from the scores' shape."""

    def __init__(self):
        super().__init__()
        self.t5 = pn.T5RelativePositionBias(HEADS, bidirectional=False)
        self.alibi = pn.ALiBi(HEADS)

    def forward(self, scores, past: int = 0):
        lq, lk = scores.shape[2], scores.shape[3]
        return scores + self.t5(lq, lk, past) + self.alibi(lq, lk, past) + pn.alibi_bias(self.alibi.slopes, lq, lk)


def test_traced_biases_follow_their_tables_and_shapes():
    """Traced with grad mode on (fx's default; the T5 weight requires grad), the biases are nodes
    that run with the real tables: the traced module gives the eager bits and the float64 reference
    at other lengths, after the weight changes, and passes the gradient to the weight."""
    model = _BiasedScores()
    gm = fx.symbolic_trace(model)
    assert not any(n.op == "get_attr" and str(n.target).startswith("_tensor_constant") for n in gm.graph.nodes)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        model.t5.relative_attention_bias.weight.copy_(torch.randn(32, HEADS, generator=gen))
    for lq, lk, past in ((3, 5, 2), (1, 40, 39), (6, 6, 0)):
        s = torch.randn(1, HEADS, lq, lk, generator=gen)
        got = gm(s, past)
        assert torch.equal(got, model(s, past))
        weight = model.t5.relative_attention_bias.weight.detach().double()
        slopes = reference.alibi_slopes(HEADS).float().double()
        want = (s.double() + reference.relative_position_bias(weight, lq, lk, bidirectional=False, query_offset=past)
                + reference.alibi_bias(slopes, lq, lk, query_offset=past) + reference.alibi_bias(slopes, lq, lk))
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    model.zero_grad()
    gm(torch.randn(1, HEADS, 2, 3, generator=gen)).sum().backward()
    grad = model.t5.relative_attention_bias.weight.grad
    assert grad is not None and grad.sum() == 6 * HEADS  # each (head, i, j) adds 1 to one bucket of its head
