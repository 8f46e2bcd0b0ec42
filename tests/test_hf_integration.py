"""posenc_native.integrations.transformers: patched tiny random models match the unpatched ones.

Every family is built from a config (nothing downloaded), in float32 and eval mode; a patched copy
must give the same logits (<= 1e-4 max abs) and the same greedy generation (KV cache / decode
positions), and unpatch must give back exactly the original outputs.
"""
import copy
import functools
import os
import pickle

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc_native.config import RopeConfig  # noqa: E402
from posenc_native.integrations import transformers as hfi  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB = 128
LOGIT_ATOL = 1e-4
NEW_TOKENS = 20

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=256, bos_token_id=0, eos_token_id=None, pad_token_id=None,
               initializer_range=0.2, tie_word_embeddings=False)


def _config(kind: str):
    c = transformers
    if kind == "llama":
        return c.LlamaConfig(**_COMMON, num_key_value_heads=2)
    if kind == "llama-linear":
        return c.LlamaConfig(**_COMMON, num_key_value_heads=2, rope_parameters=dict(
            rope_type="linear", factor=2.0, rope_theta=10000.0))
    if kind == "llama-llama3":
        return c.LlamaConfig(**_COMMON, num_key_value_heads=2, rope_parameters=dict(
            rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64, rope_theta=500000.0))
    if kind == "llama-yarn":
        return c.LlamaConfig(**_COMMON, num_key_value_heads=2, rope_parameters=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=64, rope_theta=10000.0))
    if kind == "llama-dynamic":
        cfg = dict(_COMMON, max_position_embeddings=48)
        return c.LlamaConfig(**cfg, num_key_value_heads=2, rope_parameters=dict(
            rope_type="dynamic", factor=2.0, rope_theta=10000.0))
    if kind == "qwen2":
        return c.Qwen2Config(**_COMMON, num_key_value_heads=2)
    if kind == "qwen2-yarn":  # DeepSeek-style mscale pair and a non-default beta
        return c.Qwen2Config(**_COMMON, num_key_value_heads=1, rope_parameters=dict(
            rope_type="yarn", factor=8.0, original_max_position_embeddings=32, rope_theta=1000000.0,
            beta_fast=16.0, mscale=0.707, mscale_all_dim=1.0))
    if kind == "qwen3":
        return c.Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=16)
    if kind == "mistral":
        return c.MistralConfig(**_COMMON, num_key_value_heads=2, sliding_window=None)
    if kind == "phi3":
        return c.Phi3Config(**_COMMON, num_key_value_heads=2)
    if kind in ("phi3-longrope", "phi3-longrope-partial"):
        partial = 0.5 if kind.endswith("partial") else 1.0
        half = int(16 * partial) // 2
        return c.Phi3Config(**_COMMON, num_key_value_heads=2, original_max_position_embeddings=64, rope_parameters=dict(
            rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=partial,
            original_max_position_embeddings=64,
            long_factor=[1.0 + 0.7 * i for i in range(half)], short_factor=[1.0 + 0.05 * i for i in range(half)]))
    if kind == "gpt_neox":
        cfg = {k: v for k, v in _COMMON.items() if k != "tie_word_embeddings"}
        return c.GPTNeoXConfig(**cfg, rotary_pct=0.5, tie_word_embeddings=False)
    if kind == "codegen":  # GPT-J's attention and table; a rotary module of its own from transformers 5.24
        return c.CodeGenConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, n_ctx=256,
                               rotary_dim=8, bos_token_id=0, eos_token_id=None, initializer_range=0.2,
                               tie_word_embeddings=False)
    if kind in ("gptj", "gptj-full"):
        return c.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                            rotary_dim=16 if kind == "gptj-full" else 8, bos_token_id=0, eos_token_id=None,
                            initializer_range=0.2, tie_word_embeddings=False)
    # families reached by the generic path (no entry of their own)
    if kind == "gemma3":  # local/global layers, each with its own rope parameters
        return c.Gemma3TextConfig(**_COMMON, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                  layer_types=["sliding_attention", "full_attention"], rope_parameters={
                                      "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1e6),
                                      "sliding_attention": dict(rope_type="default", rope_theta=1e4)})
    if kind == "cohere":  # interleaved pairs
        return c.CohereConfig(**_COMMON, num_key_value_heads=2)
    if kind == "glm":  # partial, interleaved
        return c.GlmConfig(**_COMMON, num_key_value_heads=2, head_dim=16)
    if kind == "deepseek_v3":  # MLA: interleaved rope on the qk_rope_head_dim slice, output de-interleaved
        return c.DeepseekV3Config(**_COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                                  qk_nope_head_dim=8, v_head_dim=16, head_dim=8, n_routed_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                                  first_k_dense_replace=1, n_group=1, topk_group=1, rope_interleave=True,
                                  rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                                                       rope_theta=10000.0, mscale=1.0, mscale_all_dim=1.0))
    # the complex-table form: the rotary module returns one freqs_cis, the attention multiplies
    # view_as_complex pairs by it (interleaved pairs; Llama 4 in [B,S,H,D], DeepSeek V2 in [B,H,S,D])
    if kind == "llama4":  # llama3 scaling; every 4th layer without rope (NoPE), L2 qk-norm after rope
        return c.Llama4TextConfig(**dict(_COMMON, num_hidden_layers=4), intermediate_size_mlp=128, num_key_value_heads=2,
                                  head_dim=16, num_local_experts=2, rope_parameters=dict(
                                      rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=64, rope_theta=500000.0))
    if kind == "deepseek_v2":  # MLA's rope slice; YaRN whose mscale pair gives an attention factor != 1
        return c.DeepseekV2Config(**_COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16,
                                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                                  topk_group=1, rope_parameters=dict(
                                      rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                                      rope_theta=10000.0, mscale=1.0, mscale_all_dim=0.5))
    if kind == "nanochat":  # its rotate_half flips the signs: a rotation by minus the angle
        return c.NanoChatConfig(**_COMMON, num_key_value_heads=2)
    if kind == "recurrent_gemma":  # the attention calls its own rotary module (no position_embeddings); partial
        cfg = {k: v for k, v in _COMMON.items() if k not in ("max_position_embeddings", "tie_word_embeddings")}
        return c.RecurrentGemmaConfig(**dict(cfg, num_hidden_layers=3), num_key_value_heads=1, lru_width=64,
                                      attention_window_size=64)
    raise AssertionError(kind)


def _model(kind: str, attn: str = "eager"):
    cfg = _config(kind)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


def _ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)


@torch.no_grad()
def _logits(model, ids, **kw):
    return model(input_ids=ids, **kw).logits


@torch.no_grad()
def _generate(model, ids, **kw):
    return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **kw)


@pytest.fixture(autouse=True)
def _unpatch_leftovers(monkeypatch):
    """Whatever a test patched is unpatched afterwards, even when it fails (the module-level wrappers
    are reference counted, so one leftover would leak into the next test)."""
    patched_models = []
    real_patch = hfi.patch

    def tracking_patch(model, **kw):
        patched_models.append(model)
        return real_patch(model, **kw)

    monkeypatch.setattr(hfi, "patch", tracking_patch)
    yield
    for m in patched_models:
        if hfi.is_patched(m):
            hfi.unpatch(m)


def _assert_close_logits(got, want):
    err = (got - want).abs().max().item()
    assert err <= LOGIT_ATOL, f"patched logits differ by {err:.3g}"


# (model kind, attention implementation, prompt length for generation, lengths for the logits check)
CASES = [
    ("llama", "eager", 12, (17,)),
    ("llama-linear", "sdpa", 12, (40,)),
    ("llama-llama3", "sdpa", 12, (40,)),
    ("llama-yarn", "sdpa", 12, (100,)),  # past original_max_position_embeddings
    ("qwen2", "sdpa", 12, (17,)),
    ("qwen2-yarn", "eager", 12, (70,)),
    ("qwen3", "eager", 12, (17,)),
    ("mistral", "sdpa", 12, (17,)),
    ("phi3", "eager", 12, (17,)),  # fused qkv projection, default rope
    ("gpt_neox", "eager", 12, (17,)),  # partial rotary
    ("gptj", "eager", 12, (17,)),  # interleaved, partial
    ("gptj-full", "eager", 12, (17,)),  # interleaved, full head
    ("codegen", "eager", 12, (17,)),  # GPT-J's table and (tensor, sin, cos) rotation, through the generic path
    ("gemma3", "eager", 12, (30,)),  # per-layer-type regimes
    ("cohere", "sdpa", 12, (17,)),
    ("glm", "eager", 12, (17,)),
    ("deepseek_v3", "eager", 12, (90,)),  # YaRN past original_max_position_embeddings
    ("llama4", "eager", 12, (100,)),  # complex table, llama3 past original_max_position_embeddings
    ("deepseek_v2", "eager", 12, (90,)),  # complex table, YaRN past original_max_position_embeddings
    ("nanochat", "sdpa", 12, (40,)),  # rotation by -angle
    ("recurrent_gemma", "eager", 12, (40,)),  # a rotary module per attention layer
]


@pytest.mark.parametrize("kind,attn,prompt,lengths", CASES, ids=[c[0] for c in CASES])
def test_patched_matches_unpatched(kind, attn, prompt, lengths):
    model = _model(kind, attn)
    if kind == "codegen" and not any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()):
        pytest.skip("this transformers' CodeGen (< 5.24) rotates inside its attention, with no rotary module")
    ref = copy.deepcopy(model)
    ids = _ids(2, prompt)
    want_gen = _generate(ref, ids)
    want = {n: _logits(ref, _ids(2, n, seed=n)) for n in lengths}

    assert hfi.patch(model) is model and hfi.is_patched(model)
    for n in lengths:
        _assert_close_logits(_logits(model, _ids(2, n, seed=n)), want[n])
    got_gen = _generate(model, ids)
    assert torch.equal(got_gen, want_gen), f"{kind}: greedy generation differs\n{got_gen}\n{want_gen}"

    hfi.unpatch(model)
    assert not hfi.is_patched(model)
    for n in lengths:
        assert torch.equal(_logits(model, _ids(2, n, seed=n)), want[n])
    assert torch.equal(_generate(model, ids), want_gen)


@pytest.mark.parametrize("kind", ["llama-yarn", "gptj", "llama4", "gemma3"])  # half-split, the GPT-J path, complex table, two configs
def test_compiled_patched_model_matches_unpatched(kind):
    """torch.compile of a patched model traces the handle and the wrapped rotation without a graph
    break (fullgraph=True) and gives the unpatched model's logits."""
    model = _model(kind)
    ids = _ids(2, 40, seed=3)
    want = _logits(model, ids)
    hfi.patch(model)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True)(input_ids=ids).logits
    _assert_close_logits(got, want)


@pytest.mark.parametrize("kind, dynamic", [("gemma3", True), ("llama-dynamic", None), ("phi3-longrope", None)])
def test_compiled_patched_model_with_graph_breaks_matches_unpatched(kind, dynamic):
    """Compiled without fullgraph (dynamic sizes, dynamic NTK's host read of the length, LongRoPE's
    two regimes in one graph): the frames resumed after a graph break rebuild the handle and its
    frequencies (they failed: "posenc_inv_freq_0 not in co_names", two constants of one name), and
    the logits are the unpatched model's, at lengths on both sides of each scheme's switch."""
    model = _model(kind)
    ref = copy.deepcopy(model)
    hfi.patch(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=dynamic)
    with torch.no_grad():
        for n in (30, 70):
            ids = _ids(2, n, seed=n)
            _assert_close_logits(compiled(input_ids=ids).logits, _logits(ref, ids))


def test_fractional_position_ids_refused_naming_the_remedy():
    """transformers takes float position_ids (fractional positions); the fused rotation takes integer
    ones: refused with the integration's message (unpatch), not the op's dtype error. Integer ids
    given as such still match the unpatched model."""
    model = _model("llama")
    ref = copy.deepcopy(model)
    hfi.patch(model)
    ids = _ids(2, 9, seed=4)
    pos = torch.arange(9)[None].expand(2, 9) + 3
    with pytest.raises(hfi.UnsupportedModelError, match="floating-point position_ids.*unpatch the model"):
        _logits(model, ids, position_ids=pos.float() + 0.5)
    _assert_close_logits(_logits(model, ids, position_ids=pos), _logits(ref, ids, position_ids=pos))
    for dtype in (torch.int16, torch.uint8, torch.int32):  # narrow integers, which the unpatched model takes too
        _assert_close_logits(_logits(model, ids, position_ids=pos.to(dtype)), _logits(ref, ids, position_ids=pos))


def test_patching_a_compiled_model_patches_the_model_it_holds():
    """patch(torch.compile(model)) patches the model itself, where its record lives: the wrapper and
    the model agree on is_patched, either unpatches it (unpatch(model) said 'not patched by posenc')."""
    model = _model("llama")
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="eager")
    assert hfi.patch(compiled) is compiled
    assert hfi.is_patched(model) and hfi.is_patched(compiled)
    assert "swap" in hfi.describe(model) and hfi.check(compiled) is None
    ids = _ids(2, 9, seed=6)
    _assert_close_logits(_logits(compiled, ids), _logits(ref, ids))
    assert hfi.unpatch(model) is model
    assert not hfi.is_patched(compiled)
    assert torch.equal(_logits(model, ids), _logits(ref, ids))


def test_no_cos_sin_and_no_transformers_rotation():
    """The patched forward builds no cos/sin tensors and never runs transformers' rotation math."""
    from transformers.models.llama import modeling_llama as ml

    model = _model("llama")
    hfi.patch(model)
    try:
        assert isinstance(model.model.rotary_emb, hfi.PosencRotaryEmbedding)
        out = model.model.rotary_emb(torch.zeros(1, 3, 64), torch.arange(3)[None])
        assert isinstance(out[0], hfi.RotaryPositions) and out[0] is out[1]
        calls = []
        original_rotate_half = ml.rotate_half
        ml.rotate_half = lambda x: calls.append(1) or original_rotate_half(x)
        try:
            _logits(model, _ids(1, 5))
        finally:
            ml.rotate_half = original_rotate_half
        assert calls == []
    finally:
        hfi.unpatch(model)


def test_decode_step_rotates_without_the_dispatcher(monkeypatch):
    """Under no_grad on the CPU a patched model's rotations take apply_rope's fast path (ops._rope,
    step 1: the CPU kernel called directly), and give transformers' logits."""
    from posenc_native import ops

    model = _model("llama")
    ids = _ids(2, 6)
    want = _logits(model, ids)
    hfi.patch(model)
    start = ops._FAST.taken()["rope"]
    got = _logits(model, ids)
    assert ops._FAST.taken()["rope"] - start == model.config.num_hidden_layers  # one fused q+k call per layer
    _assert_close_logits(got, want)
    hfi.unpatch(model)


def test_neomme_two_axis_positions():
    """NeoMME's rotary module alternates two position axes (row, column) over its pairs, per layer type;
    RopeConfig.from_hf reads that layout from the model type. With different ids on the two axes the
    patched model gives the unpatched outputs (its zero-initialised output projections drawn at random
    first, so that attention reaches the outputs, which the positions are checked to move)."""
    cfg = transformers.NeoMMEConfig(vocab_size=VOCAB, embedding_rank=16, hidden_size=64, intermediate_size=128,
                                    head_dim=16, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                                    max_position_embeddings=256, sliding_window=64, embedding_dim=16,
                                    layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.2)
    g = torch.Generator().manual_seed(5)
    ids = _ids(2, 20)
    pos = torch.stack([torch.arange(20), torch.randint(0, 30, (20,), generator=g)])[:, None].expand(2, 2, 20)
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos).last_hidden_state
        moved = model(input_ids=ids, position_ids=pos.flip(0)).last_hidden_state
        assert (want - moved).abs().max().item() > 1e-2  # the axes matter
        hfi.patch(model)
        assert "MRoPE sections [4, 4] (interleaved)" in hfi.describe(model)
        got = model(input_ids=ids, position_ids=pos).last_hidden_state
    _assert_close_logits(got, want)


def test_left_padded_batch_generation():
    """Per-sequence position ids ([B, S], from the attention mask) in prefill and decode."""
    model = _model("llama", "sdpa")
    ref = copy.deepcopy(model)
    ids = _ids(2, 10)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    ids[0, :4] = 0
    want = _generate(ref, ids, attention_mask=mask)
    hfi.patch(model)
    assert torch.equal(_generate(model, ids, attention_mask=mask), want)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    _assert_close_logits(_logits(model, ids, attention_mask=mask, position_ids=pos),
                         _logits(ref, ids, attention_mask=mask, position_ids=pos))
    hfi.unpatch(model)


def test_dynamic_ntk_follows_transformers_state():
    """Dynamic NTK: frequencies grow with the longest sequence seen and reset below max positions,
    exactly as transformers' dynamic_rope_update (a stateless seq_len rule would differ)."""
    model = _model("llama-dynamic")  # max_position_embeddings = 48
    ref = copy.deepcopy(model)
    hfi.patch(model)
    # 80 > 48 grows; 60 then reuses the 80-token frequencies; 20 resets; 60 grows again
    for n in (80, 60, 20, 60):
        ids = _ids(1, n, seed=n)
        _assert_close_logits(_logits(model, ids), _logits(ref, ids))
    # generation whose prompt is already past max_position_embeddings: every decode step grows
    ids = _ids(1, 70, seed=3)
    assert torch.equal(_generate(model, ids), _generate(ref, ids))
    hfi.unpatch(model)
    # unpatch hands the grown state back to the model's own rotary module
    assert int(model.model.rotary_emb.max_seq_len_cached) == int(ref.model.rotary_emb.max_seq_len_cached)
    for n in (60, 20):
        ids = _ids(1, n, seed=n)
        assert torch.equal(_logits(model, ids), _logits(ref, ids))


@pytest.mark.parametrize("kind", ["phi3-longrope", "phi3-longrope-partial"])
def test_phi3_longrope_short_long_switch(kind):
    model = _model(kind, "sdpa")  # original_max_position_embeddings = 64
    ref = copy.deepcopy(model)
    hfi.patch(model)
    for n in (30, 64, 65, 100):  # short factors up to 64 tokens, long beyond
        ids = _ids(2, n, seed=n)
        _assert_close_logits(_logits(model, ids), _logits(ref, ids))
    for n in (40, 55):  # generation crosses 64 tokens: transformers switches to long factors
        ids = _ids(1, n, seed=n)
        assert torch.equal(_generate(model, ids), _generate(ref, ids))
    hfi.unpatch(model)
    ids = _ids(2, 100, seed=100)
    assert torch.equal(_logits(model, ids), _logits(ref, ids))


def test_longrope_switch_reads_int32_position_ids_near_their_limit():
    """The short/long choice is made on the device from max(position_ids); int32 ids at 2^31 - 1 must
    pick the long factors (max + 1 would wrap in int32)."""
    model = hfi.patch(_model("phi3-longrope"))
    try:
        rotary = model.model.rotary_emb
        x = torch.randn(1, 1, 64)
        for ids, long_ in ((torch.tensor([[2**31 - 1]], dtype=torch.int32), True),
                           (torch.tensor([[63]], dtype=torch.int32), False),
                           (torch.tensor([[64]], dtype=torch.int32), True)):
            handle, _ = rotary(x, ids)
            want = rotary.rope.inv_freq(seq_len=65 if long_ else 64)
            assert torch.equal(handle.inv_freq.cpu(), want), ids
    finally:
        hfi.unpatch(model)


def test_training_gradients_match():
    model = _model("gpt_neox").train()
    ref = copy.deepcopy(model)
    ids = _ids(2, 16)
    hfi.patch(model)
    model(input_ids=ids, labels=ids).loss.backward()
    ref(input_ids=ids, labels=ids).loss.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5), name
    hfi.unpatch(model)


def _wrapped(rotation) -> bool:
    """Whether posenc's dispatcher is installed for a modeling module's rotation global: the global
    itself for a function, its ``forward`` for a function module (transformers with ``kernels``)."""
    target = vars(rotation).get("forward") if isinstance(rotation, torch.nn.Module) else rotation
    return hasattr(target, "__posenc_original__")


@pytest.mark.parametrize("kind", ["llama", "gptj", "phi3-longrope"])
def test_patching_leaves_torch_random_state_as_it_was(kind):
    """patch()'s probes draw their inputs from their own generators: a seeded run draws the same
    numbers (dropout masks, sampled tokens) with or without patching before it."""
    model = _model(kind)
    torch.manual_seed(11)
    want = torch.rand(4)
    torch.manual_seed(11)
    hfi.patch(model)
    try:
        assert torch.equal(torch.rand(4), want)
    finally:
        hfi.unpatch(model)


def test_patch_twice_is_idempotent_and_unpatch_restores_globals():
    from transformers.models.gptj import modeling_gptj as mj
    from transformers.models.llama import modeling_llama as ml

    orig_llama, orig_gptj = ml.apply_rotary_pos_emb, mj.apply_rotary_pos_emb
    a, b, j = _model("llama"), _model("llama"), _model("gptj")
    ids = _ids(1, 9)
    want_a = _logits(a, ids)
    hfi.patch(a)
    hfi.patch(a)  # no-op
    assert _wrapped(ml.apply_rotary_pos_emb)
    # another model of the same family, unpatched, is not affected by a's patch
    assert torch.equal(_logits(b, ids), want_a)
    hfi.patch(b)
    hfi.patch(j)
    hfi.unpatch(a)
    assert _wrapped(ml.apply_rotary_pos_emb)  # b still needs the dispatcher
    assert torch.equal(_logits(a, ids), want_a)
    hfi.unpatch(b)
    hfi.unpatch(j)
    assert ml.apply_rotary_pos_emb is orig_llama and mj.apply_rotary_pos_emb is orig_gptj
    assert not _wrapped(orig_llama) and not _wrapped(orig_gptj)
    assert "_get_embed_positions" not in j.transformer.h[0].attn.__dict__
    with pytest.raises(ValueError, match="not patched"):
        hfi.unpatch(a)
    # the context manager
    with hfi.patched(a) as m:
        assert hfi.is_patched(m)
    assert not hfi.is_patched(a) and ml.apply_rotary_pos_emb is orig_llama


def test_copies_of_a_patched_model_are_independent():
    from transformers.models.llama import modeling_llama as ml

    orig = ml.apply_rotary_pos_emb
    model = _model("llama")
    ids = _ids(2, 11)
    want = _logits(model, ids)
    hfi.patch(model)
    copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model))]
    hfi.unpatch(model)
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"
    for c in copies:
        assert hfi.is_patched(c) and isinstance(c.model.rotary_emb, hfi.PosencRotaryEmbedding)
        _assert_close_logits(_logits(c, ids), want)  # the copies still hold the wrapper
    for c in copies:
        hfi.unpatch(c)
        assert torch.equal(_logits(c, ids), want)
    assert ml.apply_rotary_pos_emb is orig


def test_patching_a_submodule_then_the_whole_model_fails_clearly():
    model = _model("llama")
    hfi.patch(model.model)
    with pytest.raises(ValueError, match="already patched"):
        hfi.patch(model)
    hfi.unpatch(model.model)


def test_unknown_model_type_fails_clearly():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(hfi.UnsupportedModelError, match="'gpt2'"):
        hfi.patch(model)
    with pytest.raises(NotImplementedError):
        hfi.patch(model)
    with pytest.raises(ValueError):
        hfi.patch(model)
    with pytest.raises(TypeError):
        hfi.patch(object())


def test_config_disagreeing_with_the_model_is_refused():
    model = _model("llama")
    model.config.rope_parameters["rope_theta"] = 20000.0  # the loaded module still uses 10000
    with pytest.raises(ValueError, match="disagree"):
        hfi.patch(model)
    assert not hfi.is_patched(model)
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"


@pytest.mark.parametrize("as_parameter", [True, False], ids=["parameter", "persistent buffer"])
def test_rotary_module_with_learned_state_is_refused(as_parameter):
    """A rotary module whose frequencies follow state that loading weights or training changes (Mistral
    Large 4's LeRoPE: inv_freq * alpha.exp(), alpha a parameter in transformers 5.24 and a persistent
    buffer before) is refused, even while alpha is 0 and the probe would pass: the fused kernel follows
    only the config, so the first checkpoint load or optimizer step would go unseen."""
    from transformers.models.llama import modeling_llama as ml

    class LeRopeRotaryEmbedding(ml.LlamaRotaryEmbedding):
        def __init__(self, config):
            super().__init__(config)
            alpha = torch.zeros_like(self.inv_freq)
            if as_parameter:
                self.alpha = torch.nn.Parameter(alpha)
            else:
                self.register_buffer("alpha", alpha)

        def forward(self, x, position_ids):
            freqs = position_ids[..., None].float() * (self.inv_freq * self.alpha.exp())
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    LeRopeRotaryEmbedding.__module__ = ml.__name__  # a transformers module, as the real one is
    model = _model("llama")
    model.model.rotary_emb = LeRopeRotaryEmbedding(model.config)
    ids = _ids(2, 9)
    before = _logits(model, ids)
    with pytest.raises(hfi.UnsupportedModelError, match=r"loading weights or training changes \(alpha\)"):
        hfi.patch(model)
    assert not hfi.is_patched(model) and type(model.model.rotary_emb) is LeRopeRotaryEmbedding
    with torch.no_grad():  # what a patch would have missed: alpha moves the model's outputs
        model.model.rotary_emb.alpha.add_(torch.rand(model.model.rotary_emb.alpha.shape, generator=torch.Generator().manual_seed(2)))
    assert (_logits(model, ids) - before).abs().max() > 100 * LOGIT_ATOL


@pytest.mark.parametrize("theta", [10020.0, 10050.0, 11000.0])
def test_a_float32_model_whose_config_disagrees_slightly_is_refused(theta):
    """A float32 model whose config's rope_theta is not the one its rotary module was built with: off
    by under 2^-7, as 16-bit rounding would be, but its frequencies are float32 values, so no rounding
    explains them. patch() refuses (it patched, and followed the config: logits 1.04 off)."""
    model = _model("llama")
    model.config.rope_parameters["rope_theta"] = theta
    assert "disagree with the model's own rotary embedding" in hfi.check(model)
    with pytest.raises(ValueError, match="disagree with the model's own rotary embedding"):
        hfi.patch(model)


@pytest.mark.parametrize("kind", ["llama", "gptj-full", "llama-dynamic", "phi3-longrope"])
def test_frequencies_rounded_to_bfloat16_are_patched_exactly(kind):
    """model.to(torch.bfloat16) casts Llama's inv_freq buffer; GPT-J computes its table's frequencies in
    the default dtype (bfloat16 when loaded so): the model's own angles then drift with the position.
    patch() takes them for the config's (within two bfloat16 ulps), proves the rotation with the config's,
    says so in describe(), and the patched model tracks the float32 model better than the unpatched one."""
    ref = _model(kind)
    if not kind.startswith("gptj"):
        model = copy.deepcopy(ref).to(torch.bfloat16)
    else:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(_config(kind), attn_implementation="eager",
                                                              dtype=torch.bfloat16).eval()
        model.load_state_dict(ref.state_dict())
        if not any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()):
            pytest.skip("this transformers' GPT-J (< 5.24) gathers its table inside the attention")
    name, theirs = next((n, m) for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding"))
    assert any(b.dtype == torch.bfloat16 for b in theirs.buffers()) or kind.startswith("gptj")
    static = kind in ("llama", "gptj-full")  # (dynamic NTK and LongRoPE switch frequencies past their lengths)
    pos = torch.arange(0, 250, 7)[None]
    x = torch.zeros(1, pos.shape[1], 8)  # float32, so the module's cos/sin come back unrounded
    angles = pos[..., None].double() * RopeConfig.from_hf(model.config).inv_freq()  # the config's, exactly
    their_cos = theirs(x, pos)[1 if kind != "llama" else 0][..., : angles.shape[-1]].double()  # GPT-J: (sin, cos)
    ids = _ids(2, 200, seed=5)
    want = _logits(ref, ids)
    unpatched = _logits(model, ids)
    hfi.patch(model)
    assert "rounded to 16 bits" in hfi.describe(model)
    handle = model.get_submodule(name)(x, pos)[0]
    our_cos = handle.cos_sin(torch.float64)[0]
    our_cos = our_cos[..., 0::2] if handle.interleaved else our_cos[..., : angles.shape[-1]]  # one per pair
    patched = _logits(model, ids)
    hfi.unpatch(model)
    if static:
        assert (our_cos - angles.cos()).abs().max() < 1e-6 < 1e-3 < (their_cos - angles.cos()).abs().max()
    # bfloat16 weights add noise of their own to both models: the patched one is compared with the
    # float32 model relative to the unpatched one, at the positions where rounded angles are off most
    err_patched = (patched - want)[:, 100:].abs().mean().item()
    err_unpatched = (unpatched - want)[:, 100:].abs().mean().item()
    assert err_patched < (0.8 if kind == "llama" else 1.0) * err_unpatched, (err_patched, err_unpatched)
    assert torch.equal(_logits(model, ids), unpatched)


def test_rotary_positions_cos_sin_matches_transformers():
    model = _model("llama-yarn")
    pos = torch.arange(0, 120, 7)[None]
    x = torch.zeros(1, pos.shape[1], 64)
    cos_ref, sin_ref = model.model.rotary_emb(x, pos)
    hfi.patch(model)
    cos, sin = model.model.rotary_emb(x, pos)[0].cos_sin()
    hfi.unpatch(model)
    assert torch.allclose(cos, cos_ref, atol=1e-5) and torch.allclose(sin, sin_ref, atol=1e-5)


def test_rotation_wrapper_gives_the_same_rotation_however_it_is_called():
    """The wrapped apply_rotary_pos_emb gives the same bits however its arguments are passed
    (positional, keywords, unsqueeze_dim given or not), transformers' formula on float64 tables of
    the config's frequencies (q and k of a GQA model at scattered positions), and refuses a q wider
    than the rotation the function was proven on."""
    from transformers.models.llama import modeling_llama

    model = _model("llama-yarn")
    g = torch.Generator().manual_seed(5)
    pos = torch.randint(0, 3000, (2, 5), generator=g)
    D = model.config.hidden_size // model.config.num_attention_heads
    q, k = torch.randn(2, 4, 5, D, generator=g), torch.randn(2, 2, 5, D, generator=g)
    rope = RopeConfig.from_hf(model.config)  # the exact frequencies (the model's are rounded to float32)
    angles = pos[..., None].double() * rope.inv_freq().double()
    emb = torch.cat((angles, angles), -1)
    want = modeling_llama.apply_rotary_pos_emb(q.double(), k.double(), emb.cos() * rope.attention_factor,
                                               emb.sin() * rope.attention_factor)
    hfi.patch(model)
    try:
        h, h_sin = model.model.rotary_emb(q, pos)
        rotate = modeling_llama.apply_rotary_pos_emb
        first = rotate(q, k, h, h_sin)
        for got in (rotate(q, k, h, h_sin, 1), rotate(q, k, cos=h, sin=h_sin), rotate(q=q, k=k, cos=h, sin=h_sin),
                    rotate(q, k, h, h_sin, unsqueeze_dim=1)):
            assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])
        for got, ref in zip(first, want):
            torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=0)
        wide_q, wide_k = torch.randn(2, 4, 5, 2 * D, generator=g), torch.randn(2, 2, 5, 2 * D, generator=g)
        for call in (lambda: rotate(wide_q, wide_k, h, h_sin), lambda: rotate(wide_q, wide_k, h, h_sin, 1)):
            with pytest.raises(hfi.UnsupportedModelError, match="only on inputs as wide as the rotated part"):
                call()
    finally:
        hfi.unpatch(model)


def test_complex_table_handle_stands_in_for_freqs_cis():
    """Llama 4's rotary module returns one complex table, on which its attention calls .to(device): the
    patched module returns one handle, whose .to keeps it (same device) or moves positions and
    frequencies, and whose cos/sin are the table's real and imaginary parts."""
    model = _model("llama4")
    pos = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(3))
    x = torch.zeros(2, 9, 64)
    want = model.model.rotary_emb(x, pos)
    assert want.is_complex()
    hfi.patch(model)
    h = model.model.rotary_emb(x, pos)
    assert isinstance(h, hfi.RotaryPositions)
    assert h.to(torch.device("cpu")) is h and h.to("cpu") is h and h.to() is h and h.to(torch.complex64) is h
    moved = h.to("meta")
    assert moved.positions.is_meta and moved.inv_freq.is_meta and moved.routes is h.routes
    cos, sin = h.cos_sin()
    half = want.shape[-1]
    c, s = (cos[..., 0::2], sin[..., 0::2]) if h.interleaved else (cos[..., :half], sin[..., :half])
    assert torch.allclose(c, want.real, atol=1e-5) and torch.allclose(s, want.imag, atol=1e-5)
    hfi.unpatch(model)
    assert torch.equal(model.model.rotary_emb(x, pos), want)


def test_check_and_describe_change_nothing():
    from transformers.models.llama import modeling_llama as ml

    model = _model("deepseek_v3")
    orig = type(model.model.rotary_emb)
    assert hfi.check(model) is None
    text = hfi.describe(model)
    assert "apply_rotary_pos_emb_interleave: interleaved, de-interleaved output" in text and "yarn" in text
    assert type(model.model.rotary_emb) is orig and not hfi.is_patched(model)
    gpt2 = transformers.AutoModelForCausalLM.from_config(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert "RotaryEmbedding" in hfi.check(gpt2)
    assert set(hfi.supported_model_types()) >= {"llama", "gptj", "cohere", "glm"}


def test_rotation_the_kernel_does_not_reproduce_is_refused(monkeypatch):
    """A modeling module whose rotation differs from every pairing (here: sin halved, no rotation at
    all) is refused at patch time with the reason, and nothing is swapped."""
    from transformers.models.llama import modeling_llama as ml

    original = ml.apply_rotary_pos_emb

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return original(q, k, cos, 0.5 * sin, unsqueeze_dim)

    monkeypatch.setattr(ml, "apply_rotary_pos_emb", apply_rotary_pos_emb)
    model = _model("llama")
    with pytest.raises(hfi.UnsupportedModelError, match="reproduces no rotation function"):
        hfi.patch(model)
    assert not hfi.is_patched(model) and type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"
    assert ml.apply_rotary_pos_emb is apply_rotary_pos_emb
    assert "reproduces no rotation function" in hfi.check(model)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The half-split pairing's partner, written out here, independent of transformers'."""
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


class _RotationModule(torch.nn.Module):
    """A rotation function as a parameter-free module, as transformers' ``@use_kernel_forward_from_hub``
    makes ``apply_rotary_pos_emb`` when ``kernels`` is installed; its rotation written out here (rotate
    half), independent of transformers'."""

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _assert_patched_through(model, ml, original, ids, pickles: bool = True):
    """``model`` (a Llama whose modeling module ``ml`` holds ``original``) patched matches its
    unpatched logits, another unpatched Llama is untouched meanwhile (and pickles), and unpatching
    restores ``original`` itself and bit-identical logits. A function module stays the global
    throughout: its ``forward`` is what is wrapped."""
    other = _model("llama")
    want = _logits(model, ids)
    hfi.patch(model)
    if isinstance(original, torch.nn.Module):
        assert ml.apply_rotary_pos_emb is original
    assert _wrapped(ml.apply_rotary_pos_emb) and hfi.is_patched(model)
    _assert_close_logits(_logits(model, ids), want)
    assert torch.equal(_logits(other, ids), want)  # through the wrapper to `original`, as before
    # an unpatched model of the family pickles and loads meanwhile (kernels rebuilds its attentions'
    # private copies of the function module from the global's type)
    if pickles:
        assert torch.equal(_logits(pickle.loads(pickle.dumps(other)), ids), want)
    hfi.unpatch(model)
    assert ml.apply_rotary_pos_emb is original and not _wrapped(original)
    assert torch.equal(_logits(model, ids), want)


def test_rotation_function_made_a_module_by_kernels():
    """With the ``kernels`` package installed (transformers >= 5.25 requires it) the modeling
    modules' ``apply_rotary_pos_emb`` is a function module, not a function; patching routes it and
    unpatching puts that very module back."""
    from transformers.models.llama import modeling_llama as ml

    original = ml.apply_rotary_pos_emb
    if not isinstance(original, torch.nn.Module):
        pytest.skip("without the kernels package transformers' rotation functions stay functions")
    _assert_patched_through(_model("llama"), ml, original, _ids(2, 13))


def test_a_function_module_stands_in_for_the_function(monkeypatch):
    """The same on any transformers: a parameter-free module in place of the rotation function is
    probed through its forward's signature, patched and restored."""
    from transformers.models.llama import modeling_llama as ml

    module = _RotationModule()
    monkeypatch.setattr(ml, "apply_rotary_pos_emb", module)
    # (not pickled: kernels would rebuild its attentions' private copies as this test's module class)
    _assert_patched_through(_model("llama"), ml, module, _ids(2, 13), pickles=False)


@pytest.mark.parametrize("make", [lambda: functools.partial(_RotationModule().forward),
                                  lambda: torch.nn.Linear(2, 2)], ids=["partial", "module-with-parameters"])
def test_a_rotation_callable_posenc_cannot_route_is_refused(monkeypatch, make):
    """A rotation-named callable that is neither a function nor a function module (a partial, a
    module holding weights) would be handed the rotary positions all the same: refused, nothing swapped."""
    from transformers.models.llama import modeling_llama as ml

    monkeypatch.setattr(ml, "apply_rotary_pos_emb", make())
    model = _model("llama")
    with pytest.raises(hfi.UnsupportedModelError, match="calls apply_rotary_pos_emb, a .* that posenc cannot route"):
        hfi.patch(model)
    assert not hfi.is_patched(model) and type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"


def _trailing_q_rotation(leading: bool = False):
    """A rotation that takes a q shorter than k (a drafter's block after its context, as MuseGlimmer's):
    q at k's last positions, or (``leading``) at its first ones, which no pairing reproduces."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        n = q.shape[-2]
        cut = slice(0, n) if leading else slice(-n, None)
        q_embed = q * cos[..., cut, :] + _rotate_half(q) * sin[..., cut, :]
        return q_embed, k * cos + _rotate_half(k) * sin
    return apply_rotary_pos_emb


def test_rotation_of_a_shorter_q_at_the_last_positions(monkeypatch):
    """The probe also feeds a q shorter than k: a function that rotates it at k's last positions is
    proven as such and routed so (the fused kernel at those positions); one that does anything else
    with it is refused. Most functions refuse a shorter q (their tables broadcast over its length)."""
    from transformers.models.llama import modeling_llama as ml

    monkeypatch.setattr(ml, "apply_rotary_pos_emb", _trailing_q_rotation())
    model = _model("llama")
    ids = _ids(2, 12)
    want = _logits(model, ids)
    rotary = copy.deepcopy(model.model.rotary_emb)
    hfi.patch(model)
    assert "q at k's last positions" in hfi.describe(model)
    assert (_logits(model, ids) - want).abs().max().item() <= LOGIT_ATOL
    g = torch.Generator().manual_seed(5)
    pos = torch.randint(0, 200, (2, 9), generator=g)
    q, k = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    handle = model.model.rotary_emb(q, pos)[0]
    got = ml.apply_rotary_pos_emb(q, k, handle, handle)  # the wrapper, with the handle
    cos, sin = rotary(q, pos)
    theirs = _trailing_q_rotation()(q, k, cos, sin)
    for a, b in zip(got, theirs):
        assert a.shape == b.shape and (a - b).abs().max().item() <= 1e-5
    hfi.unpatch(model)
    monkeypatch.setattr(ml, "apply_rotary_pos_emb", _trailing_q_rotation(leading=True))
    with pytest.raises(hfi.UnsupportedModelError, match="reproduces no rotation function"):
        hfi.patch(model)


def test_forwards_that_treat_the_handle_as_a_tensor_are_refused():
    """What a forward does with ``cos``/``sin``, or with the names it unpacks ``position_embeddings``
    into, is read from its bytecode: indexing, arithmetic (either side), negation or a method is refused
    at patch time (a handle cannot stand in), passing them to the rotation is not."""
    from posenc_native.integrations.transformers.detect import _handle_misuse

    class Indexer(torch.nn.Module):  # Qwen4-exp's QSA indexer: slices the tables for its queries
        def forward(self, hidden_states, position_embeddings):
            full_cos, full_sin = position_embeddings
            n = hidden_states.shape[1]
            return full_cos[:, -n:, :], full_sin[:, -n:, :]

    class Scales(torch.nn.Module):
        def forward(self, q, position_embeddings):
            cos, sin = position_embeddings
            return cos * q, sin

    class Passes(torch.nn.Module):
        def forward(self, q, k, position_embeddings):
            cos, sin = position_embeddings
            return hfi_rotation(q, k, cos, sin, unsqueeze_dim=1)

    assert _handle_misuse(Indexer) == "Indexer.forward applies binary_subscr to full_cos"
    class Method(torch.nn.Module):
        def forward(self, q, position_embeddings):
            cos, sin = position_embeddings
            return q, cos.float(), sin

    assert _handle_misuse(Scales) == "Scales.forward applies binary_op to cos"
    assert _handle_misuse(Method) in ("Method.forward applies load_method to cos", "Method.forward applies load_attr to cos")
    assert _handle_misuse(Passes) is None


def hfi_rotation(q, k, cos, sin, unsqueeze_dim=1):  # stands for a modeling module's apply_rotary_pos_emb
    return q, k


def test_a_forward_handed_cos_and_sin_is_checked_too():
    """A model forward may hand ``cos, sin`` to a module that is no attention: LLaVA-OneVision-1.5's vision
    tower prepends a class token's learned angle to them (``cls_freqs.to(cos.dtype)``). That forward holds
    the handle too, so it is read the same way at patch time: a tensor use refuses the model (before,
    patch() accepted it and the first forward with images failed); passing them on is not refused."""
    from posenc_native.integrations.transformers.detect import _rotation_functions

    class ClassTokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.angle = torch.nn.Parameter(torch.randn(1, 4))

        def forward(self, hidden_states, cos, sin):
            cls = self.angle.to(cos.dtype)
            return hidden_states, torch.cat([cls.cos(), cos]), torch.cat([cls.sin(), sin])

    class PassesOn(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return hfi_rotation(q, k, cos, sin)

    class Tower(torch.nn.Module):
        def __init__(self, child):
            super().__init__()
            self.child = child

        def forward(self, x):
            return self.child(x)

    for cls in (ClassTokens, PassesOn, Tower):  # transformers' modules are the ones read
        cls.__module__ = "transformers.models.llama.modeling_llama"
    with pytest.raises(hfi.UnsupportedModelError, match=r"ClassTokens\.forward applies load_(attr|method) to cos"):
        _rotation_functions(Tower(ClassTokens()))
    assert _rotation_functions(Tower(PassesOn())) == {}  # it rotates nothing itself: no function collected


def test_llava_onevision_1_5_tower_is_refused_at_patch_time():
    """The model itself (transformers 5.25 on): its tower refused, so the model is patched part by part
    (docs/transformers_coverage.md's run on 5.25)."""
    from posenc_native.integrations.transformers.detect import _rotation_functions

    lov = pytest.importorskip("transformers.models.llava_onevision1_5.modeling_llava_onevision1_5")
    with pytest.raises(hfi.UnsupportedModelError, match="LlavaOnevision15VisionClassEmbeddings.forward applies load_attr"):
        _rotation_functions(lov.LlavaOnevision15VisionModel(lov.LlavaOnevision15VisionConfig(
            depth=1, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64)))


def test_dropout_on_the_handle_is_the_identity_where_it_is_one():
    """LASR's encoder drops out cos/sin (``dropout_positions``, 0 by default): in eval mode or at p = 0
    that is the identity and the handle passes through; dropping elements in training is no rotation
    and is refused; any other torch function on a handle fails as before."""
    handle = hfi.RotaryPositions(torch.arange(5)[None], torch.ones(8, dtype=torch.float64), 1.0, False)
    F = torch.nn.functional
    assert F.dropout(handle, p=0.1, training=False) is handle
    assert F.dropout(handle, p=0.0, training=True) is handle
    with pytest.raises(hfi.UnsupportedModelError, match="drops out elements of cos/sin"):
        F.dropout(handle, p=0.1, training=True)
    with pytest.raises(TypeError):
        torch.cat([handle, handle])


def test_handle_refused_by_a_function_it_was_not_proven_for():
    from transformers.models.llama import modeling_llama as ml

    model = _model("llama")
    hfi.patch(model)
    q = torch.randn(1, 4, 5, 16)
    handle = hfi.RotaryPositions(torch.arange(5)[None], torch.ones(8, dtype=torch.float64), 1.0, False)
    with pytest.raises(hfi.UnsupportedModelError, match="not proven"):
        ml.apply_rotary_pos_emb(q, q, handle, handle)
    hfi.unpatch(model)


def test_patched_model_shared_by_threads():
    """Frequencies are copied to the device once, under a lock; two threads decoding with one patched
    model get the unpatched logits."""
    import threading

    model = _model("llama-yarn")
    ids = [_ids(1, 30 + 7 * i, seed=i) for i in range(4)]
    want = [_logits(model, x) for x in ids]
    hfi.patch(model)
    errors = []

    def worker(order):
        try:
            for i in order:
                _assert_close_logits(_logits(model, ids[i]), want[i])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(o,)) for o in ([0, 1, 2, 3], [3, 2, 1, 0])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    hfi.unpatch(model)


# --------------------------------------------------------------------------------------------
# Vision towers: axial rotaries (transformers' rope_type "axial", position ids [N, 2])

def _vision_band(theta: float, width: int) -> torch.Tensor:
    """1 / theta ** (arange(0, width, 2) / width), float64: the band the axial classes are built from."""
    return 1.0 / theta ** (torch.arange(0, width, 2, dtype=torch.float64) / width)


@pytest.mark.parametrize("family", ["qwen3_vl", "pixtral", "kimi_k25", "inkling2"])
def test_axial_table_read_from_the_module_matches_an_independent_layout(family):
    """The ops' axis table of a vision rotary is read from what the module computes (tags in its
    inv_freq); here it is compared with the layout written out independently in float64 from
    rope_theta: Qwen3-VL height then width over the band of head_dim / 2 (half-split), Pixtral the band
    of head_dim split into evens (height) and odds (width), Kimi-K2.5 width and height alternating per
    band entry, Inkling 2 width then height with interleaved pairs."""
    from posenc_native.integrations.transformers.detect import _axis_table

    d, theta = 64, 10000.0
    if family == "qwen3_vl":
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m
        rotary = m.Qwen3VLVisionRotaryEmbedding(transformers.Qwen3VLVisionConfig(hidden_size=256, num_heads=4))
        band, want_interleaved = _vision_band(theta, d // 2), False
        want = torch.zeros(2, d // 2, dtype=torch.float64)
        want[0, : d // 4], want[1, d // 4:] = band, band
    elif family == "pixtral":
        from transformers.models.pixtral import modeling_pixtral as m
        rotary = m.PixtralVisionRotaryEmbedding(transformers.PixtralVisionConfig(hidden_size=256, num_attention_heads=4,
                                                                                 head_dim=d))
        band, want_interleaved = _vision_band(theta, d), False
        want = torch.zeros(2, d // 2, dtype=torch.float64)
        want[0, : d // 4], want[1, d // 4:] = band[0::2], band[1::2]
    elif family == "kimi_k25":
        from transformers.models.kimi_k25 import modeling_kimi_k25 as m
        cfg = transformers.models.kimi_k25.configuration_kimi_k25.Kimi_K25VisionConfig(hidden_size=256, num_attention_heads=4)
        rotary = m.Kimi_K25VisionRotaryEmbedding(cfg)
        band, want_interleaved = _vision_band(theta, d // 2), False
        want = torch.zeros(2, d // 2, dtype=torch.float64)
        want[1, 0::2], want[0, 1::2] = band, band  # pair 2j: width, pair 2j + 1: height
    else:
        from transformers.models.inkling2 import configuration_inkling2 as c, modeling_inkling2 as m
        rotary = m.Inkling2VisionRotaryEmbedding(c.Inkling2VisionConfig(hidden_size=256, num_attention_heads=4))
        band, want_interleaved = _vision_band(theta, d // 2), True
        want = torch.zeros(2, d // 2, dtype=torch.float64)
        want[1, : d // 4], want[0, d // 4:] = band, band  # width first
    assert rotary.config.rope_parameters["rope_theta"] == theta
    table, interleaved = _axis_table(rotary)
    assert interleaved == want_interleaved
    assert table.shape == want.shape and torch.equal(table == 0, want == 0)
    torch.testing.assert_close(table, want, rtol=1e-14, atol=0)  # float32 frequencies read back as exact powers


def test_axial_table_refuses_a_per_axis_half_split():
    """Gemma 4's vision tower lays cos/sin out H-H-W-W (each axis rotating its own half of the head):
    no single half-split or interleaved pairing reproduces that, so the table is refused."""
    from transformers.models.gemma4 import modeling_gemma4 as m
    from posenc_native.integrations.transformers.detect import _axis_table

    rotary = m.Gemma4VisionRotaryEmbedding(transformers.Gemma4VisionConfig(hidden_size=256, num_attention_heads=4,
                                                                           head_dim=64))
    with pytest.raises(hfi.UnsupportedModelError, match="neither half-split nor interleaved"):
        _axis_table(rotary)


def _qwen3_vl():
    cfg = transformers.Qwen3VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, rope_parameters=dict(rope_type="default", rope_theta=5e5,
                                                                                 mrope_section=[4, 2, 2])),
        vision_config=dict(hidden_size=64, intermediate_size=128, depth=2, num_heads=2, out_hidden_size=64, patch_size=4,
                           temporal_patch_size=2, spatial_merge_size=2, deepstack_visual_indexes=[0],
                           num_position_embeddings=64))
    torch.manual_seed(0)
    return transformers.Qwen3VLModel(cfg).eval()


def test_vision_tower_of_a_vision_language_model_is_patched():
    """Qwen3-VL: patch() swaps the text decoder's MRoPE and the vision tower's axial rotary (head_dim 32,
    rotary pairs height then width); two images of different grids through the tower give the
    unpatched outputs, which the positions are checked to move, and unpatch restores them bit for bit."""
    model = _qwen3_vl()
    tower = model.visual
    grid = torch.tensor([[1, 4, 6], [1, 2, 4]])
    g = torch.Generator().manual_seed(3)
    patches = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=g)
    with torch.no_grad():
        want = tower(patches, grid_thw=grid).last_hidden_state
        moved = tower(patches, grid_thw=grid[:, [0, 2, 1]]).last_hidden_state  # height and width swapped
        assert (want - moved).abs().max().item() > 1e-3  # the 2-D positions matter
        hfi.patch(model)
        notes = hfi.describe(model)
        assert "swap visual.rotary_pos_emb" in notes and "axial table of 2 axes" in notes, notes
        assert isinstance(tower.rotary_pos_emb, hfi.PosencRotaryEmbedding)
        got = tower(patches, grid_thw=grid).last_hidden_state
        _assert_close_logits(got, want)
        hfi.unpatch(model)
        assert torch.equal(tower(patches, grid_thw=grid).last_hidden_state, want)


def test_pixtral_vision_model_is_patched():
    """Pixtral (a vision model on its own): images of two sizes, 4x6 and 2x3 patches."""
    cfg = transformers.PixtralVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                           head_dim=16, image_size=96, patch_size=16)
    torch.manual_seed(0)
    model = transformers.PixtralVisionModel(cfg).eval()
    g = torch.Generator().manual_seed(4)
    pixels = torch.randn(2, 3, 64, 96, generator=g)
    sizes = torch.tensor([[64, 96], [32, 48]])
    with torch.no_grad():
        want = model(pixels, image_sizes=sizes).last_hidden_state
        hfi.patch(model)
        got = model(pixels, image_sizes=sizes).last_hidden_state
    _assert_close_logits(got, want)


def test_patched_axial_rotary_refuses_positions_it_was_not_proven_for():
    """The swapped tower rotary takes integer [tokens, 2] ids, as at patch time: three columns or float
    ids fail loudly (nothing is rotated by a guess)."""
    model = _qwen3_vl()
    hfi.patch(model)
    rotary = model.visual.rotary_pos_emb
    x = torch.randn(1, 5, 64)
    with pytest.raises(hfi.UnsupportedModelError, match=r"expected \[tokens, 2\]"):
        rotary(x, torch.zeros(5, 3, dtype=torch.long))
    with pytest.raises(hfi.UnsupportedModelError, match="floating-point"):
        rotary(x, torch.zeros(5, 2))
    cos, sin = rotary(x, torch.randint(0, 9, (5, 2)))
    assert isinstance(cos, hfi.RotaryPositions) and cos is sin


def test_vision_towers_that_treat_the_handle_as_a_tensor_are_refused():
    """Forwards that hand cos/sin to other code are read from their bytecode: Qwen4-exp's attention slices
    each of them (it iterates over ``position_embeddings``), MLCD concatenates a class token's row
    (``torch.cat([..., position_embeddings[0]])``). ``position_embeddings[layer_type]`` passed on (Step
    3.7) is not refused, nor is each item handed to a method of the module alone (Qwen2.5-VL's window
    order), which becomes a row selection of the ids."""
    from transformers.models.mlcd import modeling_mlcd
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.models.qwen4_exp import modeling_qwen4_exp
    from transformers.models.step3p7 import modeling_step3p7
    from posenc_native.integrations.transformers.detect import _handle_misuse, _row_methods

    assert "iterates over position_embeddings" in _handle_misuse(modeling_qwen4_exp.Qwen4ExpTextAttention)
    assert _row_methods(modeling_qwen4_exp.Qwen4ExpTextAttention) == set()
    tower = modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel
    assert _handle_misuse(tower) is None and _row_methods(tower) == {"permute_input_for_window_attn"}
    assert "uses an item of position_embeddings as a tensor" in _handle_misuse(modeling_mlcd.MLCDVisionModel)
    assert "uses an item of position_embeddings as a tensor" in _handle_misuse(modeling_mlcd.MLCDAttention)
    assert _handle_misuse(modeling_step3p7.Step3p7TextModel) is None


def test_compiled_patched_vision_tower_adds_no_graph_break():
    """torch.compile of a patched Qwen3-VL tower: the outputs of the unpatched tower, and no graph break
    beyond the tower's own (its grid bookkeeping breaks the graph with or without the patch)."""
    import torch._dynamo as dynamo

    model = _qwen3_vl()
    tower = model.visual
    grid = torch.tensor([[1, 4, 6], [1, 2, 4]])
    patches = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = tower(patches, grid_thw=grid).last_hidden_state
        own = dynamo.explain(tower)(patches, grid_thw=grid).graph_break_count
        dynamo.reset()
        hfi.patch(model)
        assert dynamo.explain(tower)(patches, grid_thw=grid).graph_break_count == own
        dynamo.reset()
        got = torch.compile(tower)(patches, grid_thw=grid).last_hidden_state
        dynamo.reset()
    _assert_close_logits(got, want)


def _ernie_vl_text_config(head_dim: int = 16, section=(3, 3, 2)):
    from transformers.models.ernie4_5_vl_moe import configuration_ernie4_5_vl_moe as c

    return c.Ernie4_5_VLMoeTextConfig(
        vocab_size=VOCAB, hidden_size=4 * head_dim, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, moe_intermediate_size=[32, 32], moe_k=2, moe_num_experts=4,
        moe_num_shared_experts=1, mlp_layer_types=["dense", "sparse"], max_position_embeddings=256,
        rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=list(section)))


def test_ernie_vl_multi_axis_table_read_from_the_module():
    """ERNIE 4.5 VL's text MRoPE pre-permutes its band so that the first pairs alternate height and width
    and the last ones take time, which no RopeConfig layout names (from_hf's frequencies disagree with
    the module's). The table read from the module is that layout written out independently in float64:
    pair i takes band entry i, on axis 1 + i % 2 (height, width) for i < 22, else axis 0 (time); its
    float32 frequencies are read back as the exact powers of rope_theta they round."""
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as m
    from posenc_native.integrations.transformers.detect import _axis_table

    rotary = m.Ernie4_5_VLMoeTextRotaryEmbedding(_ernie_vl_text_config(head_dim=64, section=(11, 11, 10)))
    table, interleaved = _axis_table(rotary, axis_last=False)
    band = _vision_band(500000.0, 64)
    want = torch.zeros(3, 32, dtype=torch.float64)
    for i in range(32):
        want[1 + i % 2 if i < 22 else 0, i] = band[i]
    assert interleaved
    torch.testing.assert_close(table, want, rtol=1e-14, atol=0)


def test_ernie_vl_text_decoder_is_patched_with_the_module_table():
    """The whole ERNIE 4.5 VL model (text decoder and vision tower): [3, B, S] ids that differ per axis
    give the unpatched hidden states, which the axes are checked to move."""
    from transformers.models.ernie4_5_vl_moe import configuration_ernie4_5_vl_moe as c

    cfg = c.Ernie4_5_VLMoeConfig(text_config=_ernie_vl_text_config().to_dict(),
                                 vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=4,
                                                    patch_size=4, spatial_merge_size=2, out_hidden_size=64))
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(3, VOCAB, (2, 14), generator=g)
    pos = torch.randint(0, 40, (3, 2, 14), generator=g)
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos).last_hidden_state
        moved = model(input_ids=ids, position_ids=pos[[0, 2, 1]]).last_hidden_state
        assert (want - moved).abs().max().item() > 1e-3  # height and width are not interchangeable
        hfi.patch(model)
        notes = hfi.describe(model)
        assert "multi-axis table of 3 axes (read from the module" in notes and "swap vision_tower.rotary_pos_emb" in notes
        got = model(input_ids=ids, position_ids=pos).last_hidden_state
    _assert_close_logits(got, want)


def test_exact_frequencies_only_for_a_band_of_powers():
    """A float32 band 1 / theta ** (2j / w) is read back as float64 powers of theta; a scaled band (a
    linear factor of 3) is not one, and stays as it is: the table never mixes the two."""
    from posenc_native.integrations.transformers.detect import _exact_frequencies

    for theta, width in ((10000.0, 64), (500000.0, 128), (1e6, 80)):
        band = _vision_band(theta, width)
        torch.testing.assert_close(_exact_frequencies(band.float().double(), theta), band, rtol=1e-14, atol=0)
        scaled = (band / 3).float().double()
        assert torch.equal(_exact_frequencies(scaled, theta), scaled)


def _qwen2_5_vl_tower():
    from transformers.models.qwen2_5_vl import configuration_qwen2_5_vl as c, modeling_qwen2_5_vl as m

    cfg = c.Qwen2_5_VLVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64,
                                   patch_size=4, temporal_patch_size=2, spatial_merge_size=2, window_size=16,
                                   fullatt_block_indexes=[1])
    torch.manual_seed(0)
    return m.Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg, attn_implementation="eager").eval()


def test_window_ordered_vision_tower_selects_rows_of_its_ids(monkeypatch):
    """Qwen2.5-VL's tower puts cos/sin rows in window order with a method of its own
    (``permute_input_for_window_attn``); patched, that method selects the same rows of the handle's ids,
    as its own code decides (it is run on the row numbers). Windows of 2x2 merged patches make the order
    differ from the raster one, and it matters: without the selection the outputs move."""
    from transformers.vision_utils import get_vision_window_index
    from posenc_native.integrations.transformers.runtime import RowSelection

    tower = _qwen2_5_vl_tower()
    grid = torch.tensor([[1, 4, 6], [1, 2, 4]])
    order, _ = get_vision_window_index(grid, spatial_merge_size=2, window_size=16, patch_size=4)
    assert not torch.equal(order, torch.arange(order.numel()))  # windows reorder the rows
    patches = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = tower(patches, grid_thw=grid).last_hidden_state
        hfi.patch(tower)
        assert "select rows of the ids where <model>.permute_input_for_window_attn" in hfi.describe(tower)
        _assert_close_logits(tower(patches, grid_thw=grid).last_hidden_state, want)
        twin = copy.deepcopy(tower)  # a copy's override selects with the copy's own method
        assert vars(twin)["permute_input_for_window_attn"].method.__self__ is twin
        _assert_close_logits(twin(patches, grid_thw=grid).last_hidden_state, want)
        monkeypatch.setattr(RowSelection, "__call__", lambda self, table, *a, **k: table)  # raster order kept
        assert (tower(patches, grid_thw=grid).last_hidden_state - want).abs().max().item() > 1e-3
        monkeypatch.undo()
        hfi.unpatch(tower)
        assert "permute_input_for_window_attn" not in vars(tower)
        assert torch.equal(tower(patches, grid_thw=grid).last_hidden_state, want)


def test_row_selection_refuses_a_method_that_does_more():
    """A method that scales cos/sin (or adds to them) is no row selection: the handle refuses it."""
    from posenc_native.integrations.transformers.runtime import RotaryPositions, RowSelection

    handle = RotaryPositions(torch.randint(0, 9, (2, 1, 6)), torch.rand(2, 4, dtype=torch.float64), 1.0, False)
    flipped = RowSelection(lambda t: t.flip(0))(handle)
    assert torch.equal(flipped.positions, handle.positions.flip(-1))
    for method in (lambda t: t * 2, lambda t: t + 1, lambda t: t.flip(0).cumsum(0)):
        with pytest.raises(hfi.UnsupportedModelError, match="more to cos/sin than select rows"):
            RowSelection(method)(handle)


def test_a_rotary_width_the_config_does_not_give_is_an_unsupported_model():
    """Llama with partial_rotary_factor in rope_parameters (its module ignores it and rotates all of
    head_dim): refused as an unsupported model (the integration's error type), not a bare ValueError."""
    config = _config("llama")
    config.rope_parameters = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    if RopeConfig.from_hf(config).rotary_dim == config.head_dim:
        pytest.skip("RopeConfig.from_hf ignores partial_rotary_factor for Llama here")
    with pytest.raises(hfi.UnsupportedModelError, match="gives rotary_dim"):
        hfi.patch(model)


def test_patched_state_dict_keeps_the_unpatched_keys(tmp_path):
    """ESM's rotary module holds a persistent inv_freq buffer: the patched model's state_dict has the
    unpatched model's keys (it had them under '.original.'), loads from and into an unpatched model
    strictly, and save_pretrained writes a checkpoint the unpatched class loads with nothing missing."""
    config = transformers.EsmConfig(vocab_size=33, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, position_embedding_type="rotary", pad_token_id=1,
                                    mask_token_id=32, max_position_embeddings=256)
    torch.manual_seed(0)
    plain = transformers.EsmModel(config).eval()
    patched = hfi.patch(copy.deepcopy(plain))
    assert any(k.endswith("rotary_embeddings.inv_freq") for k in plain.state_dict())
    assert list(patched.state_dict()) == list(plain.state_dict())
    for dst, src in ((copy.deepcopy(patched), plain), (copy.deepcopy(plain), patched)):
        dst.load_state_dict(src.state_dict())  # strict
    pickle.loads(pickle.dumps(patched)).load_state_dict(plain.state_dict())
    patched.save_pretrained(tmp_path)
    reloaded, info = transformers.EsmModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    ids = torch.randint(4, 30, (1, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = plain(ids).last_hidden_state
        torch.testing.assert_close(patched(ids).last_hidden_state, want, atol=LOGIT_ATOL, rtol=0)
        assert torch.equal(reloaded.eval()(ids).last_hidden_state, want)


@pytest.mark.parametrize("kind,change", [("llama-dynamic", ("rope", "factor", 4.0)),
                                         ("llama-dynamic", ("config", "max_position_embeddings", 24)),
                                         ("phi3-longrope", ("rope", "original_max_position_embeddings", 32))])
def test_rope_config_changed_after_patching_is_refused(kind, change):
    """Dynamic NTK and LongRoPE frequencies follow the config while the unpatched model runs (its
    updates re-read it); the patched model read it once: a change after patch() is refused on the next
    forward (not ignored), and unpatched the model runs as transformers does with the change."""
    model = _model(kind)
    twin = copy.deepcopy(model)  # never patched: the same calls, the same change
    ids = _ids(2, 100, seed=3)
    hfi.patch(model)
    torch.testing.assert_close(_logits(model, ids), _logits(twin, ids), rtol=1e-4, atol=1e-4)
    where, name, value = change
    for m in (model, twin):
        if where == "rope":
            m.config.rope_parameters[name] = value
        else:
            setattr(m.config, name, value)
    # a length that makes the unpatched model read the config again: past the longest seen (dynamic),
    # between the old and the new switch (LongRoPE)
    ids = _ids(2, 140 if kind == "llama-dynamic" else 48, seed=4)
    with pytest.raises(hfi.UnsupportedModelError, match="changed after it was patched"):
        _logits(model, ids)
    hfi.unpatch(model)
    want = _logits(twin, ids)
    assert (want - _logits(_model(kind), ids)).abs().max() > 1e-3  # (the change changes the unpatched model)
    if kind == "llama-dynamic":  # (LongRoPE keeps its long frequencies from whichever call first needed them)
        torch.testing.assert_close(_logits(model, ids), want, rtol=1e-5, atol=1e-5)


def test_arguments_of_the_original_the_wrapper_does_not_implement_are_refused(monkeypatch):
    """The wrapper rotates from q, k, the handle and unsqueeze_dim alone: a call passing another parameter
    of the original function at a value other than its default (where the probe ran it), or an argument
    the function does not take, is refused naming it, never rotated as if it were not there."""
    from transformers.models.llama import modeling_llama as ml

    original = ml.apply_rotary_pos_emb

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, scale=1.0):  # one more parameter
        q_out, k_out = original(q, k, cos, sin, unsqueeze_dim)
        return q_out * scale, k_out * scale

    monkeypatch.setattr(ml, "apply_rotary_pos_emb", apply_rotary_pos_emb)
    model = _model("llama")
    ids = _ids(2, 12)
    want = _logits(model, ids)
    rotary = copy.deepcopy(model.model.rotary_emb)
    hfi.patch(model)
    _assert_close_logits(_logits(model, ids), want)  # the attention passes no scale
    g = torch.Generator().manual_seed(6)
    pos = torch.randint(0, 200, (2, 9), generator=g)
    q, k = torch.randn(2, 4, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    h = model.model.rotary_emb(q, pos)[0]
    theirs = ml.apply_rotary_pos_emb(q, k, *rotary(q, pos))
    for call in (lambda: ml.apply_rotary_pos_emb(q, k, h, h), lambda: ml.apply_rotary_pos_emb(q, k, h, h, 1, 1.0),
                 lambda: ml.apply_rotary_pos_emb(q, k, h, h, scale=1)):
        for a, b in zip(call(), theirs):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for call, named in ((lambda: ml.apply_rotary_pos_emb(q, k, h, h, 1, 2.0), "scale=2.0"),
                        (lambda: ml.apply_rotary_pos_emb(q, k, h, h, scale=torch.tensor(2.0)),
                         r"scale=a tensor of shape \(\)"),
                        (lambda: ml.apply_rotary_pos_emb(q, k, h, h, position_ids=pos),
                         r"position_ids=a tensor of shape \(2, 9\)"),
                        (lambda: ml.apply_rotary_pos_emb(q, k, h, h, 1, 1.0, 7), "positional argument 7=7")):
        with pytest.raises(hfi.UnsupportedModelError, match=named) as e:
            call()
        assert "apply_rotary_pos_emb" in str(e.value) and "unpatch" in str(e.value)
    # unsqueeze_dim counted from the end, as torch's unsqueeze counts it; a bool is no dim (torch refuses it)
    # (numpy's integers too, which torch's unsqueeze takes)
    for ud, layout_q, layout_k in ((-3, q, k), (-2, q.transpose(1, 2), k.transpose(1, 2)),
                                   (np.int64(2), q.transpose(1, 2), k.transpose(1, 2))):
        want_q, want_k = original(layout_q, layout_k, *rotary(q, pos), unsqueeze_dim=ud)
        got_q, got_k = ml.apply_rotary_pos_emb(layout_q, layout_k, h, h, unsqueeze_dim=ud)
        torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=0)
        torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="unsqueeze_dim=True is not supported"):
        ml.apply_rotary_pos_emb(q, k, h, h, unsqueeze_dim=True)
    # an argument passed both by position and by keyword: the original's TypeError, not the positional one read
    for call in (lambda: ml.apply_rotary_pos_emb(q, k, h, h, 1, unsqueeze_dim=2),
                 lambda: ml.apply_rotary_pos_emb(q, k, h, h, 1, 2.0, scale=1.0)):
        with pytest.raises(TypeError, match="apply_rotary_pos_emb.. got multiple values for argument"):
            call()


def _sam2_video(family: str = "sam2_video"):
    """A small SAM 2 video model (or SAM 3 tracker video, whose memory attention is the same): its memory
    attention attends over 4x3 tokens (SAM 3 tracker video: 4x4, from its image size)."""
    small = dict(memory_attention_num_layers=2, memory_attention_hidden_size=64,
                 memory_attention_feed_forward_hidden_size=128)
    torch.manual_seed(0)
    if family == "sam2_video":
        model = transformers.Sam2VideoModel(transformers.Sam2VideoConfig(memory_attention_rope_feat_sizes=[4, 3],
                                                                         **small))
    else:
        vit = dict(model_type="sam3_vit_model", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                   num_attention_heads=2, global_attn_indexes=[1])
        model = transformers.Sam3TrackerVideoModel(transformers.Sam3TrackerVideoConfig(
            image_size=56, vision_config=dict(model_type="sam3_vision_model", backbone_config=vit), **small))
    model.eval()
    with torch.no_grad():  # attention sharper than at init, so that how each key is rotated moves the outputs
        for layer in model.memory_attention.layers:
            for attention in (layer.self_attn, layer.cross_attn_image):
                attention.q_proj.weight.mul_(8)
                attention.k_proj.weight.mul_(8)
    return model


def _memory_inputs(frames: int, pointers: int, seed: int, n: int = 12):
    """Random inputs of SAM 2's memory attention: ``n`` tokens of the current frame ([tokens, batch, 64]) and
    the memory of ``frames`` frames of ``n`` tokens each, then ``pointers`` object-pointer tokens."""
    g = torch.Generator().manual_seed(seed)
    batch = 2
    current, current_pos = torch.randn(2, n, batch, 64, generator=g)
    memory, memory_pos = torch.randn(2, frames * n + pointers, batch, 64, generator=g)
    return dict(current_vision_features=current, memory=memory, current_vision_position_embeddings=current_pos,
                memory_posision_embeddings=memory_pos, num_object_pointer_tokens=pointers)


def test_sam2_key_arguments_the_probe_does_not_prove_are_refused(monkeypatch):
    """A rotation that takes num_k_exclude_rope and repeat_freqs_k but does something else with them (here:
    the first keys pass through, not the last) is patched for what the probe proved, the calls at their
    defaults (self-attention); its cross-attention calls are refused naming both, not rotated by a guess."""
    from transformers.models.sam2_video import modeling_sam2_video as ms

    original = ms.apply_rotary_pos_emb_2d

    def apply_rotary_pos_emb_2d(q, k, cos, sin, num_k_exclude_rope=0, repeat_freqs_k=False):
        n = num_k_exclude_rope
        q_out, k_out = original(q, k[..., n:, :], cos, sin, 0, repeat_freqs_k)
        return q_out, torch.cat([k[..., :n, :], k_out], dim=-2)

    monkeypatch.setattr(ms, "apply_rotary_pos_emb_2d", apply_rotary_pos_emb_2d)
    model = _sam2_video()
    pos = model.memory_attention.position_ids
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 1, 12, 64, generator=g), torch.randn(2, 1, 12, 64, generator=g)
    want = apply_rotary_pos_emb_2d(q, k, *model.memory_attention.rotary_emb(q, pos))
    hfi.patch(model)
    assert "num_k_exclude_rope" not in hfi.describe(model)
    h = model.memory_attention.rotary_emb(q, pos)[0]
    for a, b in zip(ms.apply_rotary_pos_emb_2d(q, k, h, h), want):  # a self-attention call
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    inputs = _memory_inputs(2, 3, seed=1)
    with torch.no_grad(), pytest.raises(hfi.UnsupportedModelError,
                                        match="num_k_exclude_rope=3, repeat_freqs_k=True") as e:
        model.memory_attention(**inputs)
    assert "apply_rotary_pos_emb_2d" in str(e.value)


@pytest.mark.parametrize("family,frames,pointers", [("sam2_video", 1, 0), ("sam2_video", 1, 4), ("sam2_video", 3, 0),
                                                    ("sam2_video", 2, 5), ("sam2_video", 3, 16),
                                                    ("sam3_tracker_video", 2, 5)])
def test_sam2_video_memory_attention_matches_unpatched(family, frames, pointers):
    """SAM 2's memory attention rotates its cross-attention keys with two more arguments of its rotation
    (apply_rotary_pos_emb_2d): the last num_k_exclude_rope keys (object pointers) are not rotated, and
    with repeat_freqs_k the keys of each memory frame take the current frame's positions. Patched, the
    memory attention gives the unpatched outputs on random features, and unpatch restores them exactly."""
    model = _sam2_video(family)
    n = model.memory_attention.position_ids.shape[0]
    inputs = _memory_inputs(frames, pointers, seed=frames * 10 + pointers, n=n)
    with torch.no_grad():
        want = model.memory_attention(**inputs)
        moved = copy.deepcopy(model.memory_attention)
        moved.position_ids = moved.position_ids.flip(0)
        assert (moved(**inputs) - want).abs().max().item() > 1e-2  # the positions matter
        hfi.patch(model)
        assert "num_k_exclude_rope and repeat_freqs_k" in hfi.describe(model)
        _assert_close_logits(model.memory_attention(**inputs), want)
        hfi.unpatch(model)
        assert torch.equal(model.memory_attention(**inputs), want)


def test_sam2_rotation_of_keys_apart_as_transformers_does():
    """The wrapped apply_rotary_pos_emb_2d against transformers' own on the rotary module's cos/sin, on
    random q and k: every key excluded, keys of two frames with and without pointers; a k that is no
    whole number of q's frames, or an exclusion past k's length, is refused naming the argument."""
    from transformers.models.sam2_video import modeling_sam2_video as ms

    model = _sam2_video()
    rotary = copy.deepcopy(model.memory_attention.rotary_emb)
    pos = model.memory_attention.position_ids
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 1, 12, 64, generator=g)
    cos, sin = rotary(q, pos)
    hfi.patch(model)
    h = model.memory_attention.rotary_emb(q, pos)[0]
    for length, kw in ((5, dict(num_k_exclude_rope=5, repeat_freqs_k=True)), (24, dict(repeat_freqs_k=True)),
                       (27, dict(num_k_exclude_rope=3, repeat_freqs_k=True)), (14, dict(num_k_exclude_rope=2)),
                       (12, dict(num_k_exclude_rope=0, repeat_freqs_k=False))):
        k = torch.randn(2, 1, length, 64, generator=g)
        for a, b in zip(ms.apply_rotary_pos_emb_2d(q, k, h, h, **kw), ms.apply_rotary_pos_emb_2d(q, k, cos, sin, **kw)):
            assert a.shape == b.shape, kw
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    k = torch.randn(2, 1, 20, 64, generator=g)
    with pytest.raises(ValueError, match="repeat_freqs_k=True"):
        ms.apply_rotary_pos_emb_2d(q, k, h, h, num_k_exclude_rope=2, repeat_freqs_k=True)  # 18 keys: 1.5 frames
    with pytest.raises(ValueError, match="num_k_exclude_rope=21"):
        ms.apply_rotary_pos_emb_2d(q, k, h, h, num_k_exclude_rope=21)


def test_patch_leaves_a_longrope_rotary_module_as_it_found_it():
    """The probe runs the rotary module's own forward, whose LongRoPE update caches ``long_inv_freq`` on
    the module (and copies into its ``inv_freq``): check(), describe() and patch() then unpatch() must
    leave every module's attributes and buffers, and the config, exactly as they were."""
    model = _model("phi3-longrope")

    def state(m):
        return ({name: (sorted(vars(mod)), {k: b.clone() for k, b in mod.named_buffers(recurse=False)})
                 for name, mod in m.named_modules()}, m.config.to_json_string())

    before = state(model)
    for step in (hfi.check, hfi.describe, lambda m: hfi.unpatch(hfi.patch(m))):
        step(model)
        after = state(model)
        assert after[1] == before[1], "the config changed"
        for name, (keys, buffers) in before[0].items():
            assert after[0][name][0] == keys, (name, set(after[0][name][0]) ^ set(keys))
            assert all(torch.equal(b, after[0][name][1][k]) for k, b in buffers.items()), name
    ids = _ids(2, 100)  # past original_max_position_embeddings: the long factors, as an untouched model's
    _assert_close_logits(_logits(hfi.patch(model), ids), _logits(_model("phi3-longrope"), ids))
