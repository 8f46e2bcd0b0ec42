"""Coverage of posenc_native.integrations.transformers over every transformers model family that
defines a rotary-embedding class (run by `make coverage`; skipped in the ordinary suite).

For each family (a ``transformers/models/<family>`` folder whose modeling code defines a
``*RotaryEmbedding`` class) a tiny random model is built from its config class (causal LM when
the family has one, else the base model), in float32 with eager attention. ``_SMALL`` shrinks every
config alike; ``_OVERRIDES`` adds what a family's config needs beyond that (sizes that must agree, a
layer of each kind) and ``_INPUTS`` the forward inputs of models that take more than token ids
(pixels, audio, decoder ids). Then:

- patched: ``patch`` accepted it; fp32 logits (base models: last hidden state) within 1e-4 of the
  unpatched model, identical 10-token greedy generation (causal LMs), and after ``unpatch`` the
  outputs are bit-identical to the original's;
- refused: ``patch`` raised ``UnsupportedModelError``/``ValueError`` (the reason is listed);
- not built: no tiny model could be built or run from the config class (the error is listed), or its
  outputs do not depend on the rotary path (parameters left at zero by the family's init are drawn
  at random first, so that attention reaches the outputs);
- WRONG: patched, but the outputs differ (always a failure).

The table goes to docs/transformers_coverage.md. The test fails when a family the committed table
lists as patched is now refused, not built or wrong, and when ``supported_model_types()`` names a
model type not verified here. ``POSENC_UPDATE_COVERAGE=1`` also rewrites
python/posenc_native/integrations/transformers/verified.py (what ``supported_model_types`` returns).
``python tests/test_transformers_coverage.py FAMILY...`` runs some families and prints the results.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import inspect
import os
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "transformers_coverage.md"
VERIFIED = ROOT / "python" / "posenc_native" / "integrations" / "transformers" / "verified.py"
LOGIT_ATOL = 1e-4
NEW_TOKENS = 10
VOCAB = 128
MAX_PARAMS = 30_000_000

# Small sizes for whatever of these a config class has (sub-configs too: text, vision, audio, ...).
_SMALL = dict(
    hidden_size=64, n_embd=64, d_model=64, n_positions=256, rotary_dim=8, intermediate_size=128, num_hidden_layers=2, num_layers=2, n_layer=2,
    num_attention_heads=4, num_key_value_heads=2, n_head=4, head_dim=16, max_position_embeddings=256,
    initializer_range=0.2, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, n_shared_experts=1, moe_num_experts=4,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    first_k_dense_replace=1, n_group=1, topk_group=1, sliding_window=64, depth=1, embed_dim=32, hidden_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, ssm_state_size=16, mamba_d_conv=4, mamba_expand=1,
    H_cycles=1, L_cycles=1, hidden_size_per_layer_input=16,
    num_key_value_groups=None, tie_word_embeddings=False, use_cache=True,
)
# Per config class (keyed by its model_type, sub-configs too; applied last, deep-copied): what the sizes
# above miss or break. Each keeps a valid config of the family (sizes that agree, a layer of each kind
# the model has); none turns the rotary path off.
_T5GEMMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                max_position_embeddings=256, initializer_range=0.2)
_MIMI = dict(num_filters=8, upsample_groups=64, codebook_size=64, codebook_dim=64,
             vector_quantization_hidden_dimension=64, num_quantizers=4)
_SAM = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, global_attn_indexes=[1], output_channels=32,
            downsample_channels=[32, 64])  # the last downsample is the 64-wide encoder's width
_CODEC = dict(num_key_value_heads=4, encoder_hidden_size=4, quantization_dim=128,  # acoustic 64 + semantic 64
              semantic_model_config=dict(model_type="wav2vec2-bert", hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128, output_hidden_size=64))
_FLOW_HEAD = dict(flow_head_config=dict(condition_dim=64, hidden_size=64, num_hidden_layers=2, frequency_embedding_size=32))
_OVERRIDES: dict[str, dict] = {
    # --- text decoders
    "mimo_v2_flash": dict(head_dim=24),  # x its partial_rotary_factor 0.334 gives an even 8 (real checkpoints: 192 -> 64)
    # KV sharing as the real model does it: the last 2 of 4 layers reuse earlier K/V (the default shares 15)
    "gemma3n_text": dict(num_hidden_layers=4, num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2),
    # DBRX names its sizes n_layers/n_heads; attention needs clip_qkv (clamp(None, None) fails) and reads rope_theta
    "dbrx": dict(n_layers=2, n_heads=4, max_seq_len=256, attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=500000.0),
                 ffn_config=dict(ffn_hidden_size=128), rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
    "ernie4_5_moe": dict(moe_k=2),  # top-k within the 4 experts
    # a sliding layer and an indexed (sparse, top-k) one, as in its 5-layer pattern; the indexer's heads fit one
    # key head's query group, its pools fit the 8-token prompt
    "kolibri1_1": dict(layer_types=["sliding_attention", "indexed_attention"], mlp_only_layers=[0], index_num_heads=2,
                       index_topk=8, index_pool_size=64, index_compression=4, index_num_local_tokens=4,
                       index_num_sink_tokens=2),
    # a looped model: input, recurrent and output layers must add up to num_hidden_layers (defaults 8 + 20 + 8)
    "dory": dict(num_hidden_layers=3, n_input_layers=1, n_recurrent_layers=1, n_output_layers=1, sliding_window=8,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    "mistral4": dict(head_dim=16),  # qk_nope + qk_rope, so its partial factor 0.5 rotates exactly qk_rope_head_dim
    "zaya": dict(num_experts_per_tok=1),  # ZAYA validates top-1
    "longcat_flash": dict(ffn_hidden_size=128, expert_ffn_hidden_size=32, moe_topk=2, zero_expert_num=2),
    "diffusion_gemma_text": dict(top_k_experts=2),
    "esmc": dict(num_key_value_heads=4),  # no GQA in ESMC
    # ESM-2's settings: rotary positions (the class default is absolute), its pad and mask ids
    "esm": dict(position_embedding_type="rotary", pad_token_id=1, mask_token_id=32, token_dropout=True,
                emb_layer_norm_before=False),
    # hybrids: an attention layer among the recurrent ones (their defaults have none in 2 layers)
    "bamba": dict(attn_layer_indices=[1]),
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"], position_embedding_type="rope"),
    "recurrent_gemma": dict(num_hidden_layers=3),  # the real (recurrent, recurrent, attention) block
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"], use_mem_rope=True),
    "falcon_h1": dict(mamba_d_ssm=64),  # mamba_n_heads x mamba_d_head
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    # sub-configs the generic rebuild does not reach (encoder/decoder, global/patcher transformers, VQ-VAE)
    "t5gemma": dict(encoder=dict(_T5GEMMA), decoder=dict(_T5GEMMA)),
    "t5gemma2": dict(vocab_size=512, image_token_index=510, decoder=dict(_T5GEMMA, layer_types=["sliding_attention", "full_attention"]),
                     encoder=dict(text_config=dict(_T5GEMMA, model_type="t5gemma2_text", layer_types=["sliding_attention", "full_attention"]),
                                  vision_config=dict(model_type="siglip_vision_model", hidden_size=64, intermediate_size=128,
                                                     num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=8),
                                  mm_tokens_per_image=16, boi_token_index=508, eoi_token_index=509, image_token_index=510)),
    "chameleon": dict(vocabulary_map={"<image>": 511}, vq_config=dict(
        embed_dim=32, num_embeddings=64, latent_channels=32, base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
        resolution=32)),
    # BLT: global hidden = local hidden x cross_attn_k, as blt-1b; no cache (DynamicCache(BltConfig) fails in transformers)
    "blt": dict(encoder_hash_byte_group_vocab=512, use_cache=False,
                global_config=dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=2, intermediate_size=256,
                                   max_position_embeddings=256, initializer_range=0.2),
                patcher_config=dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                    intermediate_size=128, max_position_embeddings=256, sliding_window=64, initializer_range=0.2)),
    "blt_local_encoder": dict(hidden_size_global=128),
    "blt_local_decoder": dict(hidden_size_global=128),
    # --- multimodal text decoders (MRoPE sections over the 8 pairs of the small head)
    "qwen4_exp_text": dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                           indexer_compress_ratio=4),
    "paddleocr_vl_text": dict(rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[4, 2, 2])),
    "ernie4_5_vl_moe_text": dict(moe_intermediate_size=[32, 32], moe_k=2, moe_num_shared_experts=1,  # [text, vision] experts
                                 rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[3, 3, 2])),
    # per-layer-type rope (the class default {} fails): sliding layers interleaved MRoPE, full layers NoPE
    "cohere_compass_text": dict(layer_types=["sliding_attention", "full_attention"], rope_parameters=dict(
        sliding_attention=dict(rope_type="default", rope_theta=50000.0, mrope_section=[4, 2, 2], mrope_interleaved=True),
        full_attention=None)),
    "glm5_next_text": dict(qk_rope_head_dim=0),  # NoPE by its validator (the generic 8 fails it)
    "glm5_next_vision": dict(out_hidden_size=64, projection_intermediate_size=128),
    "deepseek_ocr2_text": dict(mlp_layer_types=["dense", "sparse"]),  # checkpoints list them; there is no default
    "unlimited_ocr_text": dict(num_key_value_heads=4),  # MHA, as the checkpoint
    "dots3_note_text": dict(index_n_heads=4, index_head_dim=16, per_layer_config={1: dict(  # the sliding layer's own MLA sizes
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, head_dim=16, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=16)}),
    "granite4_vision": dict(downsample_rate="1/2", deepstack_layer_map=[[-1, 0]], spatial_target_layers=[0, 0, 1, 1]),
    # --- their vision / audio towers, sized to the 64-wide text model
    "qwen2_5_omni_audio_encoder": dict(encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64, num_mel_bins=16),
    "qwen2_5_omni_vision_encoder": dict(num_heads=4, out_hidden_size=64, fullatt_block_indexes=[1], depth=2, window_size=56),
    "qwen3_omni_moe_audio_encoder": dict(encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64,
                                         num_mel_bins=16, downsample_hidden_size=16),
    "qwen3_omni_moe_vision_encoder": dict(num_heads=4, out_hidden_size=64, deepstack_visual_indexes=[0], num_position_embeddings=64),
    # windowed towers: windows of 2x2 merged patches, so the images' rows (and cos/sin's) are put in window order
    "qwen2_5_vl_vision": dict(window_size=56),
    "exaone4_5_vision": dict(window_size=56),
    # vision towers whose head count the shared sizes leave inconsistent with their width (heads of 16 dims)
    "qwen2_vl_vision": dict(embed_dim=64, num_heads=4),
    "glm4v_vision": dict(num_heads=4),
    "glm4v_moe_vision": dict(num_heads=4),
    "paddleocr_vl_vision": dict(num_attention_heads=4),
    "ernie4_5_vl_moe_vision": dict(num_heads=4),
    "deepseek_ocr2_vision": dict(sam_config=dict(_SAM)),
    "unlimited_ocr_vision": dict(sam_config=dict(_SAM, mlp_dim=128)),
    "dots3_note_vision_encoder": dict(pyramid_num_routed=[-1, 4], adapter_in_dim=64, adapter_out_dim=64, moe_intermediate_size=32),
    "dots3_note_audio_encoder": dict(adapter_input_size=64, adapter_out_dim=64, downsample_hidden_size=16),
    "idefics_vision": dict(image_size=56),  # 4x4 patches of 14
    "llava_onevision1_5_vision": dict(num_heads=4, out_hidden_size=64),  # 16-dim heads: 4 axial quarters of 4
    # --- speech and audio
    "qwen2_audio_encoder": dict(encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16),  # 16-dim heads
    # the adaptor's width must be the text model's (and its MLP a quarter of it); 1 of 2 encoder layers for timestamps
    "fun_asr_nano": dict(adaptor_config=dict(hidden_size=64, intermediate_size=16, num_attention_heads=4,
                                             projector_hidden_size=128)),
    "fun_asr_nano_encoder": dict(num_timestamp_prediction_layers=1, num_mel_bins=16),
    # CSM: vocab_size is the codebooks' (2051), not above the text ids; a tiny Mimi codec
    "csm": dict(vocab_size=2051, num_codebooks=4, codec_config=dict(
        _MIMI, model_type="mimi", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, sliding_window=64)),
    "csm_depth_decoder_model": dict(vocab_size=2051, num_codebooks=4, backbone_hidden_size=64),
    "kyutai_speech_to_text": dict(vocab_size=4001, ffn_dim=256),  # the real text vocabulary (audio ids sit above it)
    "dia_decoder": dict(cross_hidden_size=64, cross_num_attention_heads=4, cross_num_key_value_heads=4, cross_head_dim=16),
    "mimi_encoder": _MIMI,
    "mimi_decoder": _MIMI,
    "pocket_tts_audio_tokenizer_encoder": dict(num_filters=8, upsample_groups=64),
    "pocket_tts_audio_tokenizer_decoder": dict(num_filters=8, upsample_groups=64),
    # Moonshine: MHA as the checkpoints (its cross-attention views q with the kv head count)
    "moonshine": dict(encoder_num_hidden_layers=2, decoder_num_hidden_layers=2, encoder_num_attention_heads=4,
                      decoder_num_attention_heads=4, encoder_num_key_value_heads=4, decoder_num_key_value_heads=4),
    "moonshine_streaming": dict(num_key_value_heads=4),
    # NeMo FastConformer encoders: MHA (their eager attention does not repeat kv heads)
    "nemotron3_5_transcribe_asr_audio": dict(num_key_value_heads=4),
    "nemotron3_diarization_audio": dict(num_key_value_heads=4),
    "nemotron3_diarization": dict(head_config=dict(audio_hidden_size=64, hidden_size=32)),
    "pocket_tts": _FLOW_HEAD,
    "gradium_phonon_tts": _FLOW_HEAD,
    "xcodec2": _CODEC,
    "neucodec": _CODEC,
    # the DAC codec front end is no sub-config the sizes above reach: hop length 8
    "pe_audio_encoder": dict(dac_config=dict(encoder_hidden_size=8, downsampling_ratios=[2, 4], hidden_size=32, codebook_dim=16)),
    # --- vision encoders
    "pixtral": dict(image_size=64, patch_size=16),  # 4x4 patches
    "mlcd_vision_model": dict(image_size=56, patch_size=14),  # 4x4 patches and a class token
    # 4x4 patches; layer 0 attends in 2x2 windows, layer 1 globally; the position table is tiled from 2x2, as 336 -> 1008
    "sam3_vit_model": dict(image_size=56, patch_size=14, pretrain_image_size=28, window_size=2, global_attn_indexes=[1]),
}
# Per model type: the forward's inputs where token ids alone do not run it (pixels, audio, decoder ids, ...).
_INPUTS: dict[str, Callable[[torch.nn.Module, torch.Tensor], dict]] = {
    # encoder-decoders (DiffusionGemma would otherwise draw a random canvas on every call)
    "t5gemma": lambda m, ids: dict(input_ids=ids, decoder_input_ids=ids.flip(-1)),
    "t5gemma2": lambda m, ids: dict(input_ids=ids, decoder_input_ids=ids.flip(-1)),
    "diffusion_gemma": lambda m, ids: dict(input_ids=ids, decoder_input_ids=ids.flip(-1)),
    "idefics": lambda m, ids: dict(input_ids=ids, pixel_values=_noise(ids.shape[0], 1, 3, 56, 56),
                                   image_attention_mask=torch.ones(*ids.shape, 1, dtype=torch.long)),
    # DFlash drafter: a block of noise embeddings against the target's hidden states (its layers concatenated)
    "muse_glimmer_assistant": lambda m, ids: dict(
        noise_embeds=_noise(ids.shape[0], m.config.block_size, m.config.hidden_size),
        context_hidden_states=_noise(ids.shape[0], ids.shape[1], m.config.hidden_size * len(m.config.target_layer_ids), seed=2)),
    # speech: raw 16 kHz audio (Moonshine downsamples x384; streaming reads 80-sample frames), 24 kHz Mimi-style
    # codecs (1920 samples a frame), log-mel features, audio codes per codebook
    "moonshine": lambda m, ids: dict(input_values=_noise(ids.shape[0], 384 * 16), decoder_input_ids=ids),
    "moonshine_streaming": lambda m, ids: dict(input_values=_noise(ids.shape[0], 80 * 64), decoder_input_ids=ids),
    "mimi_encoder": lambda m, ids: dict(input_values=_noise(ids.shape[0], 1, 1920 * 12)),
    "pocket_tts_audio_tokenizer_encoder": lambda m, ids: dict(input_values=_noise(ids.shape[0], 1, 1920 * 12)),
    "dia": lambda m, ids: dict(input_ids=ids, decoder_input_ids=_codes(1024, ids.shape[0], ids.shape[1], 9)),
    "kyutai_speech_to_text": lambda m, ids: dict(
        input_ids=torch.cat([ids[..., None], _codes(2048, *ids.shape, m.config.num_codebooks)], -1)),
    "lasr_ctc": lambda m, ids: dict(input_features=_noise(ids.shape[0], 96, m.config.encoder_config.num_mel_bins)),
    "lasr_encoder": lambda m, ids: dict(input_features=_noise(ids.shape[0], 96, m.config.num_mel_bins)),
    "voxtral_realtime": lambda m, ids: dict(input_ids=ids, input_features=_noise(
        ids.shape[0], m.config.audio_config.num_mel_bins, 8 * ids.shape[1])),
    "nemotron3_5_transcribe_asr_audio": lambda m, ids: dict(input_features=_noise(ids.shape[0], 96, m.config.num_mel_bins)),
    "nemotron3_diarization_audio": lambda m, ids: dict(input_features=_noise(ids.shape[0], 96, m.config.num_mel_bins)),
    "nemotron3_diarization": lambda m, ids: dict(
        input_features=_noise(ids.shape[0], 96, m.config.audio_config.num_mel_bins)),
    # 50 Hz codecs: 320 samples and one w2v-BERT feature frame (160 stacked fbank) per latent frame
    "xcodec2": lambda m, ids: dict(input_values=_noise(ids.shape[0], 1, 320 * 12), input_features=_noise(ids.shape[0], 12, 160)),
    "neucodec": lambda m, ids: dict(input_values=_noise(ids.shape[0], 1, 320 * 12), input_features=_noise(ids.shape[0], 12, 160)),
    "pe_audio_encoder": lambda m, ids: dict(input_values=_noise(ids.shape[0], 1, 8 * ids.shape[1])),  # 12 codec frames
    # time series and images
    "timesfm2_5": lambda m, ids: dict(past_values=_noise(ids.shape[0], 12 * m.config.patch_length)),  # 12 patches
    "pixtral": lambda m, ids: dict(pixel_values=_pixels(m, ids)),
    "mlcd_vision_model": lambda m, ids: dict(pixel_values=_pixels(m, ids)),
    "sam3_vit_model": lambda m, ids: dict(pixel_values=_pixels(m, ids)),
}
_SUBCONFIGS = ("text_config", "decoder_config", "language_config", "llm_config", "thinker_config", "talker_config",
               "audio_config", "vision_config", "encoder_config", "depth_decoder_config", "backbone_config")


def _rotary_families() -> list[str]:
    """Families whose modeling code defines a rotary class; config-only families whose model types
    transformers builds with such a family's classes (EXAONE: Llama's; Sarvam: DeepSeek V3's, GLM-4 MoE's);
    and composite ones whose default config holds such a family's sub-config, built through AutoModel
    (LLaVA's Llama, PaliGemma's Gemma, Mistral 3's Mistral and Pixtral, InternVL's Qwen2, ...)."""
    import transformers
    from transformers.models.auto import configuration_auto as ca
    from transformers.models.auto import modeling_auto as ma

    models = Path(transformers.__file__).parent / "models"
    pattern = re.compile(r"^class \w+RotaryEmbedding\(", re.M)
    rotary = {d.name for d in models.iterdir()
              if d.is_dir() and any(pattern.search(f.read_text()) for f in d.glob("modeling_*.py"))}
    aliases = set()
    for d in models.iterdir():
        if not d.is_dir() or d.name in rotary or any(d.glob("modeling_*.py")):
            continue
        for mt in (mt for mt in ca.CONFIG_MAPPING_NAMES if ca.model_type_to_module_name(mt) == d.name):
            name = ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(mt) or ma.MODEL_MAPPING_NAMES.get(mt)
            cls = getattr(transformers, name, None) if isinstance(name, str) else None
            if cls is not None and cls.__module__.split(".")[2:3] and cls.__module__.split(".")[2] in rotary:
                aliases.add(d.name)
    return sorted(rotary | aliases | _composite_families(models, rotary))


def _composite_families(models: Path, rotary: set[str]) -> set[str]:
    from transformers.models.auto import configuration_auto as ca

    family_of = {mt: ca.model_type_to_module_name(mt) for mt in ca.CONFIG_MAPPING_NAMES}
    found = set()
    for d in models.iterdir():
        if (not d.is_dir() or d.name in rotary
                or "AutoModel" not in "".join(f.read_text() for f in d.glob("modeling_*.py"))):
            continue
        for mt in (mt for mt, fam in family_of.items() if fam == d.name):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = ca.CONFIG_MAPPING[mt]()
            except Exception:  # noqa: BLE001 - a config that needs arguments: not enumerated
                continue
            subs = (getattr(cfg, k, None) for k in (getattr(cfg, "sub_configs", None) or {}))
            if any(family_of.get(getattr(sc, "model_type", None)) in rotary for sc in subs):
                found.add(d.name)
    return found


def _model_types(family: str) -> list[tuple[str, str]]:
    """(model_type, "causal"|"base") candidates of a family, causal LMs first."""
    from transformers.models.auto import configuration_auto as ca
    from transformers.models.auto import modeling_auto as ma

    types = [mt for mt in ca.CONFIG_MAPPING_NAMES if ca.model_type_to_module_name(mt) == family]
    causal = [(mt, "causal") for mt in types if mt in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    base = [(mt, "base") for mt in types if mt in ma.MODEL_MAPPING_NAMES]
    return causal + base


def _small_kwargs(cls, default) -> dict:
    known = set(default.to_dict())
    try:
        known |= set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        pass
    kw = {k: v for k, v in _SMALL.items() if k in known and v is not None}
    if "vocab_size" in known:  # small, but above every token id the config names (pad, image, ...)
        ids = [v for k, v in default.to_dict().items() if k.endswith(("_token_id", "_token_index", "_id"))
               and isinstance(v, int) and not isinstance(v, bool)]
        kw["vocab_size"] = max([512] + [i + 1 for i in ids])
        if "vocab_size_per_layer_input" in known:  # Gemma 3n/4's per-layer embeddings: as small
            kw["vocab_size_per_layer_input"] = kw["vocab_size"]
    if "qk_rope_head_dim" in known and "head_dim" in kw:  # MLA: head_dim is the rotated part
        kw["head_dim"] = kw["qk_rope_head_dim"]
    if "kv_lora_rank" in known and "num_key_value_heads" in kw:  # MLA expands k/v to every head
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    params = getattr(default, "rope_parameters", None)
    if "mrope_section" in getattr(cls, "ignore_keys_at_rope_validation", ()) and isinstance(params, dict) and (
            "rope_type" in params or "rope_theta" in params):
        # MRoPE: sections (T, H, W) that cover the small head's pairs (the defaults are for head_dim 128)
        head_dim = kw.get("head_dim") or kw.get("hidden_size", 64) // kw.get("num_attention_heads", 4)
        prf = params.get("partial_rotary_factor") or getattr(default, "partial_rotary_factor", None) or 1.0
        pairs = int(head_dim * prf) // 2
        kw["rope_parameters"] = {**params, "mrope_section": [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]}
    for name in _SUBCONFIGS:
        sub = getattr(default, name, None)
        if sub is not None and hasattr(sub, "to_dict") and not isinstance(sub, dict):
            try:
                kw[name] = type(sub)(**_small_kwargs(type(sub), sub))
            except Exception:  # noqa: BLE001 - keep the default sub-config
                pass
    if "layer_types" in known and isinstance(getattr(default, "layer_types", None), list):
        lt = default.layer_types
        if lt:  # keep both kinds of layers when the default mixes them
            kinds = list(dict.fromkeys(lt))
            kw["layer_types"] = (kinds * 2)[: _SMALL["num_hidden_layers"]] if len(kinds) > 1 else [lt[0]] * 2
    kw.update(copy.deepcopy(_OVERRIDES.get(getattr(cls, "model_type", ""), {})))
    return kw


def _build(model_type: str, kind: str):
    import transformers
    from transformers.models.auto import configuration_auto as ca

    cls = ca.CONFIG_MAPPING[model_type]
    cfg = cls(**_small_kwargs(cls, cls()))
    auto = transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModel
    with torch.device("meta"):  # count first: some config classes keep large parts the sizes above miss
        n = sum(p.numel() for p in auto.from_config(cfg, attn_implementation="eager").parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"the smallest config tried still has {n / 1e6:.0f}M parameters")
    torch.manual_seed(0)
    model = auto.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():  # zero-initialised projections (NeoMME's o_proj), scales (ZAYA's key temperature)
        for p in model.parameters():  # would cut attention off the outputs
            if p.is_floating_point() and not p.any():
                p.normal_(0.0, 0.02)
    return model.eval()


def _inputs(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (2, 12), generator=g)  # below every family's vocabulary size


def _noise(*shape: int, seed: int = 1) -> torch.Tensor:
    """Seeded standard-normal inputs (pixels, waveforms, features): the same in every run."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _codes(high: int, *shape: int) -> torch.Tensor:
    """Seeded integer codes in [0, high) (audio codebooks)."""
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(3))


def _pixels(model, ids) -> torch.Tensor:
    """One random image per batch row at the (vision) config's image size."""
    cfg = getattr(model.config, "vision_config", model.config)
    return _noise(ids.shape[0], cfg.num_channels, cfg.image_size, cfg.image_size)


@torch.no_grad()
def _out(model, kind: str, ids) -> torch.Tensor:
    make = _INPUTS.get(model.config.model_type)
    out = model(**make(model, ids)) if make else model(input_ids=ids)
    t = out.logits if kind == "causal" else getattr(out, "last_hidden_state", None)
    if t is None:
        t = out[0]
    return t.float()


@torch.no_grad()
def _generate(model, ids) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=0)


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    text = re.sub(r"posenc_native\.integrations\.transformers: ", "", text)
    return text[:300]


def _run(model_type: str, kind: str) -> tuple[str, str]:
    """(status, reason) of one model type."""
    from posenc_native.integrations import transformers as hfi

    try:
        model = _build(model_type, kind)
        ids = _inputs()
        want = _out(model, kind, ids)
        if not torch.isfinite(want).all():
            return "not built", "the tiny random model gives non-finite outputs"
        want_gen = _generate(model, ids) if kind == "causal" else None
    except Exception as e:  # noqa: BLE001
        return "not built", _first_line(e)
    try:
        hfi.patch(model)
    except (hfi.UnsupportedModelError, ValueError) as e:
        return "refused", _first_line(e)
    except Exception as e:  # noqa: BLE001  (any other error is a patcher bug: report it, go on with the others)
        return "WRONG", "patch() failed: " + _first_line(e)
    try:
        got = _out(model, kind, ids)
        err = (got - want).abs().max().item()
        if not err <= LOGIT_ATOL:
            return "WRONG", f"patched outputs differ by {err:.3g}"
        if err == 0.0:  # float32 angles vs the kernel's float64 ones always differ somewhere: nothing was compared
            return "not built", "the tiny model's outputs do not depend on its rotary path (patched = unpatched bit for bit)"
        if kind == "causal":
            got_gen = _generate(model, ids)
            if not torch.equal(got_gen, want_gen):
                return "WRONG", "greedy generation differs"
        hfi.unpatch(model)
        if not torch.equal(_out(model, kind, ids), want):
            return "WRONG", "unpatched outputs are not bit-identical to the original's"
    except Exception as e:  # noqa: BLE001
        return "WRONG", "patched model failed: " + _first_line(e)
    finally:
        if hfi.is_patched(model):
            hfi.unpatch(model)
    what = "logits, greedy generation" if kind == "causal" else "last hidden state"
    return "patched", f"{type(model).__name__}: max abs diff {err:.1e} ({what})"


_RANK = {"WRONG": 3, "patched": 2, "refused": 1, "not built": 0}


# every model type patched by some run (a family's row shows its first), for the verified list
PATCHED_TYPES: set[str] = set()


def run_family(family: str) -> tuple[str, str, str]:
    """(model type, status, reason) of a family: the best outcome over its model types (any WRONG wins).
    Once one is patched, only its other model types run (Gemma 3's gemma3_text after gemma3), for
    :data:`PATCHED_TYPES`."""
    candidates = _model_types(family)
    if not candidates:
        return "-", "not built", "no config class with a model class"
    best, patched = None, set()
    for model_type, kind in candidates:
        if model_type in patched:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            status, reason = _run(model_type, kind)
        gc.collect()
        row = (model_type, status, reason)
        if status == "WRONG":
            return row
        if status == "patched":
            patched.add(model_type)
            PATCHED_TYPES.add(model_type)
        if best is None or _RANK[status] > _RANK[best[1]]:
            best = row
    return best


def _vision_tower(model) -> tuple[str, torch.nn.Module] | tuple[None, None]:
    """The vision tower of a vision-language model: the submodel holding its vision config, when it has
    an axial rotary (transformers' ``rope_type == "axial"``)."""
    from transformers import PreTrainedModel

    vision_config = getattr(model.config, "vision_config", None)
    for name, m in model.named_modules():
        if name and isinstance(m, PreTrainedModel) and m.config is vision_config and any(
                getattr(r, "rope_type", None) == "axial" for r in m.modules()):
            return name, m
    return None, None


# Two images of 4x6 and 2x4 patches (even sides: the towers merge 2x2 patches), flattened as the towers take them
_GRID = ((1, 4, 6), (1, 2, 4))


def _tower_inputs(tower) -> dict:
    params = list(inspect.signature(tower.forward).parameters)
    layers = [(n, m) for n, m in tower.named_modules() if isinstance(m, (torch.nn.Conv3d, torch.nn.Conv2d, torch.nn.Linear))]
    embed = next((m for n, m in layers if "patch" in n), layers[0][1])  # the patch embedding, else the first layer
    if params == ["pixel_values", "kwargs"] and isinstance(embed, torch.nn.Conv2d):  # Step 3.7: whole images
        p, q = embed.kernel_size
        return {"pixel_values": _noise(2, embed.in_channels, 4 * p, 6 * q)}
    if params[:2] == ["pixel_values", "image_sizes"] and isinstance(embed, torch.nn.Conv2d):  # Pixtral: padded images
        p, q = embed.kernel_size
        return {"pixel_values": _noise(2, embed.in_channels, 4 * p, 6 * q),
                "image_sizes": torch.tensor([[4 * p, 6 * q], [2 * p, 4 * q]])}
    if "grid_thw" not in params:  # Gemma 4's pixel positions
        raise ValueError(f"the harness feeds packed patches with grid_thw or whole images alone; "
                         f"{type(tower).__name__}.forward takes ({', '.join(params)})")
    width = (embed.in_features if isinstance(embed, torch.nn.Linear)
             else embed.in_channels * int(torch.tensor(embed.kernel_size).prod()))
    grid = torch.tensor(_GRID)
    patches = int(grid.prod(-1).sum())
    if isinstance(embed, torch.nn.Conv2d):  # Kimi-K2.5: patches as images [N, C, P, P]; PaddleOCR-VL: [1, N, C, P, P]
        pixels = _noise(patches, embed.in_channels, *embed.kernel_size)
        inputs = {params[0]: pixels[None] if tower.config.model_type == "paddleocr_vl_vision" else pixels}
    else:  # flattened patches [N, C * T * P * P]
        inputs = {params[0]: _noise(patches, width)}
    if "grid_thw" in params:
        inputs["grid_thw"] = grid
    if "merge_sizes" in params:  # VideoLLaMA 3
        inputs["merge_sizes"] = torch.tensor([2] * len(_GRID))
    return inputs


@contextlib.contextmanager
def _no_rotation(tower):
    """The tower with each axial rotary returning cos = 1, sin = 0 (no rotation): how much the outputs
    depend on the rotary path at all."""
    rotaries = [m for m in tower.modules() if getattr(m, "rope_type", None) == "axial"]
    for m in rotaries:
        m.forward = lambda x, position_ids, own=m.forward: tuple(
            torch.ones_like(t) if i == 0 else torch.zeros_like(t) for i, t in enumerate(own(x, position_ids)))
    try:
        yield
    finally:
        for m in rotaries:
            del m.forward


@torch.no_grad()
def _tower_out(tower, inputs) -> torch.Tensor:
    out = tower(**inputs)
    t = getattr(out, "last_hidden_state", None)
    return (out[0] if t is None else t).float()


def run_vision_tower(family: str):
    """(model type, status, reason) of a vision-language family's axial vision tower, patched on its own
    and run on two images (the family's row runs its text decoder on token ids); None without one."""
    from posenc_native.integrations import transformers as hfi

    candidates = _model_types(family)
    if not candidates:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _build(candidates[0][0], "base")
    except Exception:  # noqa: BLE001 - the family's own row reports it
        return None
    name, tower = _vision_tower(model)
    if tower is None:
        return None
    mt = tower.config.model_type
    try:
        reason = hfi.check(tower)  # before running it: a refused tower may be large (SAM 3's, at its own image size)
    except Exception as e:  # noqa: BLE001
        return mt, "WRONG", "check() failed: " + _first_line(e)
    if reason is not None:
        return mt, "refused", _first_line(hfi.UnsupportedModelError(reason))
    with torch.no_grad():  # sharper attention (q and k x4): with the small random init, where a patch sits
        for pname, p in tower.named_parameters():  # barely moves the outputs of some towers (Kimi-K2.5's)
            if p.dim() == 2 and any(k in pname.split(".")[-2] for k in ("q_proj", "k_proj", "qkv")):
                p.mul_(4.0)
    try:
        inputs = _tower_inputs(tower)
        want = _tower_out(tower, inputs)
        with _no_rotation(tower):
            moved = (_tower_out(tower, inputs) - want).abs().max().item()
    except Exception as e:  # noqa: BLE001
        return mt, "not built", _first_line(e)
    if moved < 100 * LOGIT_ATOL:  # the comparison below could not tell a wrong rotation from a right one
        return mt, "not built", f"the tower's outputs hardly depend on its rotary path (no rotation moves them by {moved:.1e})"
    try:
        hfi.patch(tower)
    except (hfi.UnsupportedModelError, ValueError) as e:
        return mt, "refused", _first_line(e)
    except Exception as e:  # noqa: BLE001
        return mt, "WRONG", "patch() failed: " + _first_line(e)
    try:
        err = (_tower_out(tower, inputs) - want).abs().max().item()
        scale = max(1.0, want.abs().max().item())  # float32 rounding grows with the outputs (up to ~50 here)
        if not err <= LOGIT_ATOL * scale:
            return mt, "WRONG", f"patched outputs differ by {err:.3g} (outputs up to {scale:.3g})"
        if err == 0.0:
            return mt, "not built", "the tower's outputs do not depend on its rotary path"
        hfi.unpatch(tower)
        if not torch.equal(_tower_out(tower, inputs), want):
            return mt, "WRONG", "unpatched outputs are not bit-identical to the original's"
    except Exception as e:  # noqa: BLE001
        return mt, "WRONG", "patched tower failed: " + _first_line(e)
    finally:
        if hfi.is_patched(tower):
            hfi.unpatch(tower)
    images = (f"images {list(_GRID)}" if "grid_thw" in inputs else "images of 4x6 and 2x4 patches, padded"
              if "image_sizes" in inputs else "two images of 4x6 patches")
    return mt, "patched", (f"{type(tower).__name__} ({name}), {images}: max abs diff {err:.1e} (last hidden state, "
                           f"values up to {scale:.2g}; no rotation moves it by {moved:.1e})")


def run_all(families) -> dict[str, tuple[str, str, str]]:
    """Each family's row, and a row ``"<family> (vision tower)"`` for its axial vision tower."""
    results = {}
    for family in families:
        results[family] = run_family(family)
        tower = run_vision_tower(family)
        if tower is not None:
            results[f"{family} (vision tower)"] = tower
        gc.collect()
    return results


def read_table(path: Path = TABLE) -> dict[str, tuple[str, str, str]]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 4 and cells[0] not in ("family", "") and not set(cells[0]) <= {"-"}:
                rows[cells[0]] = (cells[1].strip("`"), cells[2], cells[3])
    return rows


def write_table(results: dict[str, tuple[str, str, str]], seconds: float, path: Path = TABLE) -> None:
    import transformers

    counts = {s: sum(1 for r in results.values() if r[1] == s) for s in _RANK}
    lines = [
        "# transformers model families and posenc's patcher",
        "",
        f"Written by `make coverage` (tests/test_transformers_coverage.py) with transformers {transformers.__version__}: "
        "every model family whose modeling code defines a `*RotaryEmbedding` class, or whose model types transformers "
        "builds from such a family's classes (config-only families) or sub-models (composite ones: LLaVA, PaliGemma, ...), "
        "a tiny random model built "
        "from its config class (causal LM where the family has one, else the base model; sizes and forward inputs "
        "per family where the defaults do not build or run one: `_OVERRIDES`, `_INPUTS`), fp32, eager attention, "
        "parameters its init leaves at zero drawn at random (else attention may not reach the outputs). "
        "**patched**: `patch()` accepted it, outputs within 1e-4 of the unpatched model, identical 10-token greedy "
        "generation (causal LMs), bit-identical outputs after `unpatch()`. **refused**: `patch()` raised "
        "`UnsupportedModelError` with the reason shown. **not built**: no tiny model could be built or run from "
        "the config class alone. Rows **(vision tower)**: the axial vision tower of a vision-language model, patched "
        "on its own and run on two images of 4x6 and 2x4 patches (the family's row runs the model on token ids), "
        "its q/k projections scaled x4 for sharper attention; patched means within 1e-4 of the unpatched outputs "
        "relative to their largest value; **not built** too where removing the rotation "
        "(cos = 1, sin = 0) moves its outputs by less than 1e-2, since the comparison could not tell rotations apart.",
        "",
        f"{len(results)} rows ({sum(1 for f in results if not f.endswith('(vision tower)'))} families and "
        f"{sum(1 for f in results if f.endswith('(vision tower)'))} vision towers): {counts['patched']} patched, "
        f"{counts['refused']} refused, {counts['not built']} not built, {counts['WRONG']} wrong ({seconds:.0f} s).",
        "",
        "| family | model type | status | reason / what was compared |",
        "|---|---|---|---|",
    ]
    for family in sorted(results):
        mt, status, reason = results[family]
        lines.append(f"| {family} | `{mt}` | {status} | {reason} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def write_verified(results: dict[str, tuple[str, str, str]], path: Path = VERIFIED) -> None:
    import transformers

    types = sorted({mt for mt, status, _ in results.values() if status == "patched"} | PATCHED_TYPES)
    body = ",\n".join(f"    {t!r}" for t in types)
    path.write_text('"""Model types verified end to end by tests/test_transformers_coverage.py (written by it with\n'
                    'POSENC_UPDATE_COVERAGE=1; do not edit)."""\n'
                    f"TRANSFORMERS = {transformers.__version__!r}\nMODEL_TYPES = (\n{body},\n)\n")


@pytest.mark.skipif(os.environ.get("POSENC_COVERAGE") != "1", reason="run by `make coverage` (POSENC_COVERAGE=1)")
def test_every_rotary_family():
    pytest.importorskip("transformers")
    import transformers

    from posenc_native.integrations.transformers import verified

    transformers.logging.set_verbosity_error()
    before = read_table()
    t0 = time.perf_counter()
    results = run_all(_rotary_families())
    write_table(results, time.perf_counter() - t0)
    if os.environ.get("POSENC_UPDATE_COVERAGE") == "1":
        write_verified(results)
        importlib.reload(verified)
    wrong = {f: r for f, r in results.items() if r[1] == "WRONG"}
    lost = {f: results.get(f, ("-", "missing", "")) for f, r in before.items()
            if r[1] == "patched" and results.get(f, (None, None))[1] != "patched"}
    patched_types = {mt for mt, status, _ in results.values() if status == "patched"} | PATCHED_TYPES
    unverified = set(verified.MODEL_TYPES) - patched_types
    assert not wrong, f"patched but wrong: {wrong}"
    assert not lost, f"patched in the committed table, not any more: {lost}"
    assert not unverified, f"supported_model_types() names model types not verified here: {sorted(unverified)}"


if __name__ == "__main__":
    import transformers

    transformers.logging.set_verbosity_error()
    for fam in sys.argv[1:] or _rotary_families():
        t = time.perf_counter()
        try:
            rows = run_all([fam])
        except Exception:  # noqa: BLE001
            rows = {fam: ("?", "CRASH", traceback.format_exc()[-300:])}
        for row, res in rows.items():
            print(f"{row:32s} {res[0]:28s} {res[1]:10s} {time.perf_counter() - t:5.1f}s  {res[2][:200]}", flush=True)
