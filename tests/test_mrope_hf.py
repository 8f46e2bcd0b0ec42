"""MRoPE (multimodal RoPE) from Hugging Face configs: RopeConfig.from_hf reads the layout of Qwen2-VL,
Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE configs in every form (4.x ``rope_scaling`` with ``type: mrope``,
5.x ``rope_parameters``, composite or text config, objects and config.json dicts, sections omitted),
checked against the pair -> axis assignment of transformers' own rotary modules."""
from __future__ import annotations

import json

import pytest
import torch

from posenc_native.config import RopeConfig

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    Qwen2_5_VLConfig,
    Qwen2VLConfig,
    Qwen2VLTextConfig,
    Qwen3VLConfig,
    Qwen3VLMoeConfig,
    Qwen3VLTextConfig,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding  # noqa: E402
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextRotaryEmbedding  # noqa: E402

ROTARY = {
    "qwen2_vl": Qwen2VLRotaryEmbedding,
    "qwen2_5_vl": Qwen2_5_VLRotaryEmbedding,
    "qwen3_vl": Qwen3VLTextRotaryEmbedding,
    "qwen3_vl_moe": Qwen3VLMoeTextRotaryEmbedding,
}


@torch.no_grad()
def their_axes(rotary_cls, text_config) -> list[int]:
    """The axis (0 = T, 1 = H, 2 = W) each pair takes its angle from in transformers' rotary module:
    run it at positions T=1, H=2, W=3 (angles below pi, so atan2 recovers them) and divide by inv_freq."""
    rot = rotary_cls(config=text_config)
    inv = rot.inv_freq.double()
    pairs = inv.numel()
    pos = torch.tensor([1, 2, 3]).view(3, 1, 1)
    cos, sin = rot(torch.zeros(1, 1, 1), pos)
    angle = torch.atan2(sin[0, 0, :pairs].double(), cos[0, 0, :pairs].double())
    ids = angle / inv
    assert torch.allclose(ids, ids.round(), atol=1e-3), "positions not recovered"
    return (ids.round().long() - 1).tolist()


def our_axes(rope: RopeConfig) -> list[int]:
    """The axis of each pair by the definition of the layout (written here, independently of the
    library): contiguous sections T | H | W; interleaved (Qwen3-VL): pair j on axis ``a = j % 3``
    when ``a > 0`` and ``j < 3 * section[a]``, else on axis 0."""
    section = list(rope.mrope_section)
    if not rope.mrope_interleaved:
        return [a for a, n in enumerate(section) for _ in range(n)]
    return [j % 3 if j % 3 and j < 3 * section[j % 3] else 0 for j in range(sum(section))]


def check_against_transformers(rope: RopeConfig, model_type: str, text_config) -> None:
    assert rope.mrope_section is not None, "no MRoPE layout read"
    assert sum(rope.mrope_section) == rope.rotary_dim // 2
    their = their_axes(ROTARY[model_type], text_config)
    assert our_axes(rope) == their
    assert list(rope.pair_axes) == their  # the map the op uses
    theirs = ROTARY[model_type](config=text_config).inv_freq.double()
    torch.testing.assert_close(rope.inv_freq(), theirs, rtol=1e-6, atol=0)


def _tiny_text(**kw) -> dict:
    return dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **kw)


# (model type, config class, section the test sets, section transformers uses when omitted (head_dim 128))
FAMILIES = [
    ("qwen2_vl", Qwen2VLConfig, [2, 3, 3], (16, 24, 24), False),
    ("qwen2_5_vl", Qwen2_5_VLConfig, [4, 2, 2], (16, 24, 24), False),
    ("qwen3_vl", Qwen3VLConfig, [2, 3, 3], (24, 20, 20), True),
    ("qwen3_vl_moe", Qwen3VLMoeConfig, [3, 3, 2], (24, 20, 20), True),
]


@pytest.mark.parametrize("model_type,cls,section,_default,interleaved", FAMILIES)
@pytest.mark.parametrize("form", ["rope_scaling mrope", "rope_scaling default", "rope_parameters"])
def test_sections_every_form(model_type, cls, section, _default, interleaved, form):
    """The section the config sets, in the 4.x and 5.x forms, as a config object (composite and text),
    its to_dict(), and a config.json written from it."""
    if form == "rope_scaling mrope":
        if interleaved:
            pytest.skip("Qwen3-VL configs never say type 'mrope' (transformers' Qwen3-VL rotary rejects it)")
        rope = {"rope_scaling": {"type": "mrope", "mrope_section": section}, "rope_theta": 5e5}
    elif form == "rope_scaling default":
        rope = {"rope_scaling": {"rope_type": "default", "mrope_section": section,
                                 "mrope_interleaved": interleaved}, "rope_theta": 5e5}
    else:
        rope = {"rope_parameters": {"rope_type": "default", "mrope_section": section, "rope_theta": 5e5}}
    cfg = cls(text_config=_tiny_text(head_dim=16, **rope))
    text = cfg.get_text_config()
    for source in (cfg, text, cfg.to_dict(), text.to_dict()):
        r = RopeConfig.from_hf(source)
        assert r.base == 5e5 and r.head_dim == 16 and r.mrope_interleaved == interleaved
        check_against_transformers(r, model_type, text)
    if not interleaved:  # contiguous sections are used as given
        assert RopeConfig.from_hf(cfg).mrope_section == tuple(section)


@pytest.mark.parametrize("model_type,cls,_section,default,interleaved", FAMILIES)
def test_default_section_when_omitted(model_type, cls, _section, default, interleaved):
    """No mrope_section in the config: the model type's default, as transformers' rotary module."""
    cfg = cls(text_config=_tiny_text(head_dim=128))
    assert "mrope_section" not in cfg.get_text_config().rope_parameters
    for source in (cfg, cfg.get_text_config(), cfg.to_dict()):
        r = RopeConfig.from_hf(source)
        assert tuple(r.mrope_section) == default and r.mrope_interleaved == interleaved
        check_against_transformers(r, model_type, cfg.get_text_config())


def test_qwen2_vl_flat_4x_config_json(tmp_path):
    """A 4.x Qwen2-VL config.json: everything at the top level, rope_scaling {type: mrope}."""
    data = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {"depth": 32, "embed_dim": 1280, "num_heads": 16}}
    (tmp_path / "config.json").write_text(json.dumps(data))
    r = RopeConfig.from_hf(str(tmp_path))
    assert (r.head_dim, r.rotary_dim, r.base) == (128, 128, 1e6)
    assert tuple(r.mrope_section) == (16, 24, 24) and not r.mrope_interleaved and r.rope_type == "default"
    text = Qwen2VLConfig(**{k: v for k, v in data.items() if k != "model_type"}).get_text_config()
    check_against_transformers(r, "qwen2_vl", text)


def test_qwen3_vl_hub_style_dict():
    """Qwen3-VL's config.json: a text_config with rope_scaling {mrope_interleaved, mrope_section}."""
    data = {"model_type": "qwen3_vl", "text_config": {
        "model_type": "qwen3_vl_text", "hidden_size": 2560, "num_attention_heads": 32, "head_dim": 128,
        "num_key_value_heads": 8, "max_position_embeddings": 262144, "rope_theta": 5000000,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"}},
        "vision_config": {"depth": 24, "hidden_size": 1024}}
    r = RopeConfig.from_hf(data)
    assert tuple(r.mrope_section) == (24, 20, 20) and r.mrope_interleaved and r.base == 5e6
    check_against_transformers(r, "qwen3_vl", Qwen3VLConfig(text_config=data["text_config"]).get_text_config())
    # without the composite's model_type in the text config, the parent's decides the defaults
    inner = {k: v for k, v in data["text_config"].items() if k not in ("model_type", "rope_scaling")}
    r = RopeConfig.from_hf({"model_type": "qwen3_vl", "text_config": inner})
    assert tuple(r.mrope_section) == (24, 20, 20) and r.mrope_interleaved


def test_qwen3_vl_interleaved_whatever_the_flag():
    """Qwen3-VL's rotary module interleaves even when the config says mrope_interleaved: false."""
    text = Qwen3VLTextConfig(**_tiny_text(head_dim=16, rope_parameters={
        "rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": False, "rope_theta": 1e4}))
    r = RopeConfig.from_hf(text)
    assert r.mrope_interleaved
    check_against_transformers(r, "qwen3_vl", text)


@pytest.mark.parametrize("section", [[24, 20, 20], [2, 2, 2], [0, 5, 1], [8, 0, 0]])
def test_qwen3_vl_section_not_summing_to_the_pairs(section):
    """transformers' interleaved rule reads H and W sections only, and cuts them at the pair count:
    from_hf gives the section of the assignment it makes (which sums to the pairs)."""
    text = Qwen3VLTextConfig(**_tiny_text(head_dim=16, rope_parameters={
        "rope_type": "default", "mrope_section": section, "rope_theta": 1e4}))
    r = RopeConfig.from_hf(text)
    assert sum(r.mrope_section) == 8
    check_against_transformers(r, "qwen3_vl", text)


def test_qwen3_5_defaults():
    """Qwen3.5 (partial rotary 0.25): sections [11, 11, 10] interleaved over 32 pairs when omitted."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    text = Qwen3_5TextConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=256)
    assert "mrope_section" not in text.rope_parameters
    r = RopeConfig.from_hf(text)
    assert r.rotary_dim == 64 and r.mrope_section == (11, 11, 10) and r.mrope_interleaved
    assert our_axes(r) == list(r.pair_axes) == their_axes(Qwen3_5TextRotaryEmbedding, text)


def test_qwen2_vl_text_config_object():
    text = Qwen2VLTextConfig(**_tiny_text(rope_parameters={"rope_type": "default", "mrope_section": [4, 2, 2],
                                                           "rope_theta": 1e4}))
    r = RopeConfig.from_hf(text)
    assert tuple(r.mrope_section) == (4, 2, 2) and not r.mrope_interleaved
    check_against_transformers(r, "qwen2_vl", text)


def test_other_model_types_read_the_config_flags():
    """A model type without known defaults: the layout comes from mrope_section / mrope_interleaved."""
    base = {"model_type": "some_vlm", "hidden_size": 64, "num_attention_heads": 4}
    r = RopeConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}})
    assert tuple(r.mrope_section) == (2, 3, 3) and not r.mrope_interleaved
    r = RopeConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "mrope_section": [4, 2, 2],
                                                        "mrope_interleaved": True}})
    assert tuple(r.mrope_section) == (4, 2, 2) and r.mrope_interleaved
    # transformers' interleaved rule on 8 pairs cuts [6, 3, 3] to H pairs 1, 4, 7 and W pairs 2, 5
    r = RopeConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "mrope_section": [6, 3, 3],
                                                        "mrope_interleaved": True}})
    assert tuple(r.mrope_section) == (3, 3, 2) and r.mrope_interleaved
    r = RopeConfig.from_hf({**base, "rope_theta": 1e4})
    assert r.mrope_section is None and not r.mrope_interleaved


def test_bad_mrope_configs():
    base = {"model_type": "some_vlm", "hidden_size": 64, "num_attention_heads": 4}
    with pytest.raises(ValueError, match="mrope_section"):
        RopeConfig.from_hf({**base, "rope_scaling": {"type": "mrope"}})
    with pytest.raises(ValueError, match="mrope_section"):
        RopeConfig.from_hf({**base, "rope_scaling": {"type": "mrope", "mrope_section": "16,24,24"}})
    with pytest.raises(ValueError, match="mrope_section"):
        RopeConfig.from_hf({**base, "rope_scaling": {"type": "mrope", "mrope_section": [2.5, 3, 3]}})
    with pytest.raises(ValueError, match="mrope_interleaved"):
        RopeConfig.from_hf({**base, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3],
                                                     "mrope_interleaved": "yes"}})
    # contiguous sections must cover the pairs exactly (transformers' split fails otherwise)
    with pytest.raises(ValueError, match="mrope_section"):
        RopeConfig.from_hf({**base, "model_type": "qwen2_vl", "rope_scaling": {"type": "mrope"}})


# --------------------------------------------------------------------------------------------
# patch(model): the text decoders of tiny random vision-language models (no downloads)

from posenc_native.integrations.transformers import (  # noqa: E402
    PosencRotaryEmbedding,
    UnsupportedModelError,
    describe,
    patch,
    unpatch,
)

_TOKENS = dict(image_token_id=250, video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)
_VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2),
    "qwen2_5_vl": dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       fullatt_block_indexes=[0]),
    "qwen3_vl": dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                     num_position_embeddings=16, deepstack_visual_indexes=[0]),
}
_VISION["qwen3_vl_moe"] = _VISION["qwen3_vl"]
_CONFIGS = {"qwen2_vl": Qwen2VLConfig, "qwen2_5_vl": Qwen2_5_VLConfig, "qwen3_vl": Qwen3VLConfig,
            "qwen3_vl_moe": Qwen3VLMoeConfig}
LOGIT_ATOL = 1e-4
NEW_TOKENS = 20


def tiny_vlm(model_type: str, section=(2, 3, 3), head_dim: int = 16):
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "mrope_section": list(section), "rope_theta": 10000.0})
    if model_type == "qwen3_vl_moe":
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    cfg = _CONFIGS[model_type](text_config=text, vision_config=_VISION[model_type], **_TOKENS)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager",
                                                                 dtype=torch.float32)
    return model.eval()


def image_inputs(model, seed: int) -> dict:
    """A 4x4-patch image (4 tokens after the 2x2 merge) between text tokens: get_rope_index gives the
    image tokens (t, h, w) ids that differ per row."""
    g = torch.Generator().manual_seed(seed)
    v = model.config.vision_config
    pixels = torch.randn(16, 3 * v.temporal_patch_size * v.patch_size ** 2, generator=g)
    text = torch.randint(3, 200, (2, 9), generator=g)
    ids = torch.cat([text[:, :3], torch.tensor([[252, 250, 250, 250, 250, 253]] * 2), text[:, 3:]], dim=1)
    return dict(input_ids=ids, pixel_values=torch.cat([pixels, pixels.flip(0)]),
                image_grid_thw=torch.tensor([[1, 4, 4]] * 2), mm_token_type_ids=(ids == 250).long())


def random_positions(batch: int, seq: int, seed: int) -> torch.Tensor:
    """[3, B, S] position ids whose time, height and width rows all differ (increasing along S)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(0, 4, (3, batch, seq), generator=g)
    return steps.cumsum(-1) + torch.randint(0, 50, (3, batch, 1), generator=g)


@torch.no_grad()
def logits(model, **inputs) -> torch.Tensor:
    return model(**inputs).logits.float()


@pytest.mark.parametrize("model_type", list(_CONFIGS))
def test_patched_text_decoder_matches(model_type):
    model = tiny_vlm(model_type)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 200, (2, 14), generator=g)
    positions = random_positions(2, 14, 4)
    assert not torch.equal(positions[0], positions[1]) and not torch.equal(positions[1], positions[2])
    image = image_inputs(model, 5)
    ref_pos = logits(model, input_ids=ids, position_ids=positions)
    ref_text = logits(model, input_ids=ids)
    ref_image = logits(model, **image)
    ref_gen = model.generate(**image, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    vision_rotary = model.model.visual.rotary_pos_emb

    patch(model)
    rotary = model.model.language_model.rotary_emb
    assert isinstance(rotary, PosencRotaryEmbedding)
    tower_rotary = model.model.visual.rotary_pos_emb  # the tower's axial rotary too: the image logits below go through both
    assert isinstance(tower_rotary, PosencRotaryEmbedding) and tower_rotary.original is vision_rotary
    assert "swap model.visual.rotary_pos_emb" in describe(model)
    if model_type == "qwen2_5_vl":  # its tower puts cos/sin rows in window order: the same rows of the ids
        assert "select rows of the ids where model.visual.permute_input_for_window_attn" in describe(model)
    rope = rotary.rope
    assert rope.mrope_section is not None and rope.mrope_interleaved == model_type.startswith("qwen3")
    assert "MRoPE sections" in describe(model)
    # the rotary module hands out positions with their axis rows, not cos/sin
    handle, _ = rotary(torch.zeros(2, 14, 64), positions)
    assert handle.positions.shape == (3, 2, 14) and handle.inv_freq.shape == (3, rope.rotary_dim // 2)

    for ours, theirs in ((logits(model, input_ids=ids, position_ids=positions), ref_pos),
                         (logits(model, input_ids=ids), ref_text), (logits(model, **image), ref_image)):
        torch.testing.assert_close(ours, theirs, atol=LOGIT_ATOL, rtol=0)
    gen = model.generate(**image, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    assert torch.equal(gen, ref_gen)
    unpatch(model)
    assert model.model.language_model.rotary_emb is not rotary and model.model.visual.rotary_pos_emb is vision_rotary
    assert torch.equal(logits(model, input_ids=ids, position_ids=positions), ref_pos)


def test_cos_sin_of_the_handle_match_transformers():
    """RotaryPositions.cos_sin (for code that needs the tensors) is the module's own (cos, sin)."""
    for model_type in ("qwen2_vl", "qwen3_vl"):
        model = tiny_vlm(model_type, section=(4, 2, 2))
        own = model.model.language_model.rotary_emb
        positions = random_positions(2, 9, 6)
        x = torch.zeros(2, 9, 64)
        cos, sin = own(x, positions)
        with torch.no_grad():
            patch(model)
            handle, _ = model.model.language_model.rotary_emb(x, positions)
            ours = handle.cos_sin()
            unpatch(model)
        torch.testing.assert_close(ours[0], cos, atol=2e-6, rtol=0)
        torch.testing.assert_close(ours[1], sin, atol=2e-6, rtol=0)


def test_patched_rotary_position_shapes():
    """[B, S] and [1, B, S] ids mean the same id on every axis (text tokens), as transformers expands
    them; a wrong number of axis rows is refused with the expected shape."""
    model = patch(tiny_vlm("qwen2_vl"))
    rotary = model.model.language_model.rotary_emb
    x = torch.zeros(2, 5, 64)
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 4, 5, 16, generator=g), torch.randn(2, 2, 5, 16, generator=g)
    ids = torch.randint(0, 100, (2, 5), generator=g)
    want = rotary(x, ids.expand(3, 2, 5))[0].rotate(q, k)
    for pos in (ids, ids[None]):
        got = rotary(x, pos)[0].rotate(q, k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(UnsupportedModelError, match=r"\[3, batch, seq\]"):
        rotary(x, torch.zeros(2, 2, 5, dtype=torch.long))
    unpatch(model)


def test_a_section_from_hf_that_the_model_does_not_use_is_refused(monkeypatch):
    """The probe feeds axis rows that differ: a layout that is not the model's is caught before any change."""
    import posenc_native.config.hf as hf

    model = tiny_vlm("qwen2_vl", section=(2, 3, 3))
    real = hf._HFSource.mrope
    monkeypatch.setattr(hf._HFSource, "mrope", lambda self, *a: ((3, 3, 2), real(self, *a)[1]))
    with pytest.raises(UnsupportedModelError, match="cannot be patched|not reproduced"):
        patch(model)
    assert not isinstance(model.model.language_model.rotary_emb, PosencRotaryEmbedding)


def test_hunyuan_v4_vl_layout():
    """HunYuan V4 VL's text rotary (transformers >= 5.24) assigns pairs round-robin T, H, W as Qwen3-VL
    does (its own default section when the config omits one) and rotates interleaved pairs (GLM style):
    from_hf's layout, in every form, against the module's own pair -> axis map."""
    pytest.importorskip("transformers.models.hy_v4_vl")
    from transformers.models.hy_v4_vl.configuration_hy_v4_vl import HYV4VLConfig, HYV4VLTextConfig
    from transformers.models.hy_v4_vl.modeling_hy_v4_vl import HYV4VLRotaryEmbedding

    for rope_dim, section in ((32, [8, 4, 4]), (64, None), (128, "omitted")):
        params = {"rope_type": "default", "rope_theta": 10000.0}
        if isinstance(section, list):
            params["mrope_section"] = section
        text = HYV4VLTextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=rope_dim + 16,
                                qk_rope_head_dim=rope_dim, qk_nope_head_dim=16,
                                rope_parameters=dict(params, mrope_section=[24, 20, 20]) if section == "omitted"
                                else params)
        if section == "omitted":  # as a config.json without it: the module falls back to [24, 20, 20]
            text.rope_parameters.pop("mrope_section")
        their = their_axes(HYV4VLRotaryEmbedding, text)
        sources = [text.to_dict()] if section == "omitted" else [
            text, text.to_dict(), HYV4VLConfig(text_config=text.to_dict()), HYV4VLConfig(text_config=text.to_dict()).to_dict()]
        for source in sources:
            r = RopeConfig.from_hf(source)
            assert r.rotary_dim == rope_dim and r.interleaved and r.mrope_interleaved
            assert sum(r.mrope_section) == rope_dim // 2
            assert our_axes(r) == their and list(r.pair_axes) == their
        assert len(set(their)) == 3  # every axis feeds some pair


def test_a_model_not_provable_whole_is_patched_part_by_part(monkeypatch):
    """A vision-language model without an entry of its own (GLM-4.6V, Cosmos 3 Omni and the composites
    built from another family's parts) whose whole-model plan is refused, because its vision attention's
    rotation is probed with the text rotary's cos/sin, is patched part by part: the text decoder and the
    tower. Shown on Qwen2-VL with its entry removed."""
    from posenc_native.integrations.transformers import UnsupportedModelError, detect, families

    monkeypatch.delitem(families.FAMILIES, "qwen2_vl")
    model = tiny_vlm("qwen2_vl")
    with pytest.raises(UnsupportedModelError, match="apply_rotary_pos_emb_vision"):
        detect.plan(model, "qwen2_vl", True)
    image = image_inputs(model, 5)
    ref = logits(model, **image)
    patch(model)
    assert isinstance(model.model.language_model.rotary_emb, PosencRotaryEmbedding)
    assert isinstance(model.model.visual.rotary_pos_emb, PosencRotaryEmbedding)
    torch.testing.assert_close(logits(model, **image), ref, atol=LOGIT_ATOL, rtol=0)
    unpatch(model)
    assert torch.equal(logits(model, **image), ref)
