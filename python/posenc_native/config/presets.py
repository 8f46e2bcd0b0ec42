"""Built-in configs in the Hugging Face form, written here: posenc never downloads."""
from __future__ import annotations

__all__ = ["PRESETS"]


def _phi3_factors() -> tuple[list[float], list[float]]:
    # Illustrative LongRoPE factors of the right shape (48 pairs): short ~1, long growing to ~64.
    # Not the released checkpoint's numbers.
    short = [round(1.0 + 0.05 * (i / 47) ** 2, 4) for i in range(48)]
    long_ = [round(1.0 + 63.0 * (i / 47) ** 3, 4) for i in range(48)]
    return short, long_


PRESETS: dict[str, dict] = {
    "llama3-8b-instruct-like": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    },
    "llama2-dynamic-ntk": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0},
    },
    "qwen2-yarn": {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    },
    "gpt-oss-like": {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096, "truncate": False},
    },
    "phi3-longrope": {
        "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": _phi3_factors()[0], "long_factor": _phi3_factors()[1]},
    },
    "deepseek-v3-like": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    },
    "gemma4-like": {
        "model_type": "gemma4_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
        "global_head_dim": 512, "max_position_embeddings": 131072,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
    },
    "qwen2.5-vl-7b-like": {  # 4.x form: MRoPE in rope_scaling, contiguous T | H | W sections
        "model_type": "qwen2_5_vl", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 128000, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    },
    "qwen3-vl-8b-like": {  # a text_config; MRoPE interleaved round-robin T, H, W
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 262144, "rope_theta": 5000000,
            "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
        },
    },
    "gptj-6b-like": {
        "model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048,
    },
}
