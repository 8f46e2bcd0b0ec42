"""posenc-native: compiled CPU/CUDA kernels for positional encodings.

Sinusoidal tables (and adding them to embeddings) and fused RoPE/YaRN rotation of q and k, as
``torch.ops.posenc.*`` custom ops that work in eager mode, torch.compile, torch.export, TorchScript
and LibTorch C++.
"""
from ._library import build_info, library_path, load_library

load_library()

from . import ops, reference  # noqa: E402  (ops registers fake kernels and autograd)
from . import bias, flex  # noqa: E402  (bias: relative position biases, their fake kernels and autograd)
from .bias import alibi_bias, alibi_slopes, relative_position_bias, t5_relative_position_bucket  # noqa: E402
from .bias_modules import ALiBi, T5RelativePositionBias  # noqa: E402
from .config import RopeConfig  # noqa: E402
from .modules import (  # noqa: E402
    LearnablePositionalEncoding,
    RoPEPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    YaRNPositionalEncoding,
)
from .ops import add_sinusoidal, apply_rope, apply_rope_, apply_rotary_pos_emb, sinusoidal_table  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "build_info",
    "library_path",
    "load_library",
    "ops",
    "reference",
    "RopeConfig",
    "sinusoidal_table",
    "add_sinusoidal",
    "apply_rope",
    "apply_rope_",
    "apply_rotary_pos_emb",
    "bias",
    "flex",
    "t5_relative_position_bucket",
    "relative_position_bias",
    "alibi_slopes",
    "alibi_bias",
    "SinusoidalPositionalEncoding",
    "LearnablePositionalEncoding",
    "RotaryEmbedding",
    "RoPEPositionalEncoding",
    "YaRNPositionalEncoding",
    "T5RelativePositionBias",
    "ALiBi",
]
