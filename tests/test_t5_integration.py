"""transformers integration for T5, mT5 and UMT5 (posenc_native/integrations/t5.py): tiny random models
built from configs; patched logits within 1e-4 of the model's own, identical greedy generations
(both stacks; the decoder's self-attention bias with past key values), the same gradients, and
unpatch restores the model bit for bit."""
from __future__ import annotations

import copy
import inspect

import pytest
import torch

import posenc_native as pn

transformers = pytest.importorskip("transformers")
from posenc_native.integrations import t5 as t5_patch  # noqa: E402
from posenc_native.integrations import transformers as hf_patch  # noqa: E402

FAMILIES = {
    "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration),
    "mt5": (transformers.MT5Config, transformers.MT5ForConditionalGeneration),
    "umt5": (transformers.UMT5Config, transformers.UMT5ForConditionalGeneration),
}
VOCAB = 96


def tiny(model_type: str, seed: int = 0, **overrides):
    config_cls, model_cls = FAMILIES[model_type]
    kw = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
              relative_attention_num_buckets=32, relative_attention_max_distance=20, dropout_rate=0.0,
              decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kw)).eval()
    with torch.no_grad():  # spread the tiny random bias tables so the bias matters to the logits
        for m in model.modules():
            if isinstance(getattr(m, "relative_attention_bias", None), torch.nn.Embedding):
                m.relative_attention_bias.weight.normal_(0.0, 2.0)
    return model


def inputs(seed: int = 1, batch: int = 2, src: int = 45, tgt: int = 30):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(2, VOCAB, (batch, src), generator=g), torch.randint(2, VOCAB, (batch, tgt), generator=g))


def state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_logits_generation_and_unpatch(model_type):
    model = tiny(model_type)
    src, tgt = inputs()
    before = state(model)
    with torch.no_grad():
        want = model(input_ids=src, decoder_input_ids=tgt).logits
        want_gen = model.generate(src, max_new_tokens=20, min_new_tokens=20, do_sample=False)

    hf_patch.patch(model)  # delegates to integrations/t5.py for t5/mt5/umt5
    assert hf_patch.is_patched(model) and t5_patch.is_patched(model)
    names = t5_patch.patched_modules(model)
    # T5/mT5: the first layer of each stack owns the bias; UMT5: every layer owns one.
    expected = 2 if model_type != "umt5" else 4
    assert len(names) == expected and any("decoder" in n for n in names) and any("encoder" in n for n in names)
    assert all(type(model.get_submodule(n)).compute_bias is not model.get_submodule(n).compute_bias.__func__
               for n in names)
    with torch.no_grad():
        got = model(input_ids=src, decoder_input_ids=tgt).logits
        got_gen = model.generate(src, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert got_gen.shape[1] >= 21 and torch.equal(got_gen, want_gen)

    hf_patch.unpatch(model)
    assert not hf_patch.is_patched(model)
    assert all("compute_bias" not in model.get_submodule(n).__dict__ for n in names)
    after = state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(model(input_ids=src, decoder_input_ids=tgt).logits, want)  # bit for bit


@pytest.mark.parametrize("model_type", ["t5", "umt5"])
def test_decoding_with_past_key_values(model_type, monkeypatch):
    """Prefill, then one token at a time with the cache: the decoder's self-attention bias comes from
    the kernel with query_offset = past_seen_tokens."""
    model = tiny(model_type, seed=3)
    src, tgt = inputs(seed=4, tgt=12)

    # the cache's name: `cache` from transformers 5.24 (`past_key_values` is deprecated there), before it the old one
    cache = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"

    def decode(m):
        with torch.no_grad():
            enc = m.get_encoder()(input_ids=src)
            out = m(encoder_outputs=enc, decoder_input_ids=tgt[:, :5], use_cache=True)
            logits, past = [out.logits], getattr(out, cache)
            for i in range(5, tgt.shape[1]):
                out = m(encoder_outputs=enc, decoder_input_ids=tgt[:, i:i + 1], use_cache=True, **{cache: past})
                logits.append(out.logits)
                past = getattr(out, cache)
        return torch.cat(logits, 1)

    want = decode(model)
    with torch.no_grad():
        full = model(input_ids=src, decoder_input_ids=tgt).logits
    torch.testing.assert_close(want, full, rtol=0, atol=1e-4)  # the cache path is the full path
    offsets = []

    def spy(weight, query_length, key_length, **kw):
        offsets.append((query_length, key_length, kw["query_offset"], kw["bidirectional"]))
        return pn.relative_position_bias(weight, query_length, key_length, **kw)

    monkeypatch.setattr(t5_patch, "relative_position_bias", spy)
    with hf_patch.patched(model):
        got = decode(model)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # the last decoding step: one query after 11 cached tokens, over 12 keys, causal (unidirectional)
    assert (1, 12, 11, False) in offsets and any(bidirectional for *_, bidirectional in offsets)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_gradients_match(model_type):
    model = tiny(model_type, seed=5)
    src, tgt = inputs(seed=6)
    labels = tgt.clone()

    def grads(m):
        m.zero_grad()
        m(input_ids=src, decoder_input_ids=tgt, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if "relative_attention_bias" in n}

    want = grads(model)
    with hf_patch.patched(model):
        got = grads(model)
    assert want.keys() == got.keys() and want
    for n in want:
        assert want[n].abs().max() > 0
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6)


def test_patch_is_idempotent_deepcopy_and_refuses_twice_replaced():
    model = tiny("t5", seed=7)
    assert hf_patch.patch(hf_patch.patch(model)) is model
    clone = copy.deepcopy(model)
    assert t5_patch.is_patched(clone)
    name = t5_patch.patched_modules(clone)[0]
    assert clone.get_submodule(name).compute_bias.__self__ is clone.get_submodule(name)
    hf_patch.unpatch(clone)
    assert t5_patch.is_patched(model) and not t5_patch.is_patched(clone)
    hf_patch.unpatch(model)
    with pytest.raises(ValueError, match="not patched"):
        hf_patch.unpatch(model)
    other = tiny("t5", seed=8)
    attn = other.get_submodule(t5_patch._bias_modules(other)[0][0])
    attn.__dict__["compute_bias"] = lambda *a, **k: None
    with pytest.raises(ValueError, match="already replaced"):
        t5_patch.patch(other)
    assert not t5_patch.is_patched(other)


def test_check_refuses_a_config_where_transformers_float32_rounds_differently():
    # (18 / 8)^9 = (27 / 8)^6: distance 18 is an exact bucket edge for num_buckets 34, max_distance 27;
    # transformers' float32 log puts it one bucket lower on this CPU (see csrc/core/relative_bias.h).
    model = tiny("t5", seed=9, relative_attention_num_buckets=34, relative_attention_max_distance=27)
    rp = torch.tensor([-18])
    theirs = type(model.encoder.block[0].layer[0].SelfAttention)._relative_position_bucket(rp, True, 34, 27)
    if int(theirs) == int(pn.t5_relative_position_bucket(rp, num_buckets=34, max_distance=27)):
        pytest.skip("this machine's float32 log rounds the edge up: transformers agrees with the exact bucket")
    with pytest.raises(ValueError, match="differs from"):
        hf_patch.patch(model)
    assert not hf_patch.is_patched(model)
    hf_patch.patch(model, check=False)
    assert hf_patch.is_patched(model)
    hf_patch.unpatch(model)


def test_no_bias_module_is_an_error():
    with pytest.raises(ValueError, match="no attention module"):
        t5_patch.patch(torch.nn.Linear(2, 2))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_traced_patched_model_follows_new_lengths():
    """torch.jit.trace records the kernel's int lengths as constants, so under a trace the patch
    runs the model's own compute_bias: a patched model traced at one length is right at another,
    as the unpatched model's trace is (and no posenc warning)."""
    import warnings

    model = tiny("t5", seed=5)

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, src, tgt):
            return self.m(input_ids=src, decoder_input_ids=tgt, use_cache=False, return_dict=False)[0]

    wrapped = Logits(model)
    src, tgt = inputs(seed=6, batch=1, src=12, tgt=7)
    new_src, new_tgt = inputs(seed=7, batch=1, src=31, tgt=19)
    with torch.no_grad():
        want = wrapped(new_src, new_tgt)
        hf_patch.patch(model)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            traced = torch.jit.trace(wrapped, (src, tgt))
        assert torch.equal(wrapped(src, tgt), traced(src, tgt))
        got = traced(new_src, new_tgt)
    hf_patch.unpatch(model)
    assert not [w for w in seen if "posenc" in str(w.message)]
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
