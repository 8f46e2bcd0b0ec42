"""nn.Modules over the kernels, including the class names used in the seed articles."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from . import ops
from .config import RopeConfig

__all__ = ["SinusoidalPositionalEncoding", "LearnablePositionalEncoding", "RotaryEmbedding"]


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings added to ``x [batch, seq, d_model]`` (Vaswani et al.).

    Keeps the seed articles' ``pe`` buffer ``[1, max_len, d_model]`` (float32, interleaved sin/cos)
    for code that reads it, but ``forward`` adds the encoding with the fused native op, which
    computes it on the fly: sequences longer than ``max_len`` work too.
    """

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.register_buffer("pe", ops.sinusoidal_table(max_len, d_model).unsqueeze(0), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x's last dim must be d_model={self.d_model}, got shape {tuple(x.shape)}")
        return ops.add_sinusoidal(x, offset=offset)


class LearnablePositionalEncoding(nn.Module):
    """A learned position embedding table ``[max_len, d_model]`` added to ``x [batch, seq, d_model]``."""

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.position_embeddings = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.position_embeddings.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        seq = x.shape[-2]
        if offset + seq > self.max_len:
            raise ValueError(f"sequence of length {seq} at offset {offset} exceeds max_len={self.max_len} of "
                             "LearnablePositionalEncoding; a learned table has no rows past max_len "
                             "(use SinusoidalPositionalEncoding or a larger max_len)")
        positions = torch.arange(offset, offset + seq, device=x.device)
        return x + self.position_embeddings(positions).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Fused RoPE for a :class:`RopeConfig`: ``forward(q, k, positions) -> (q, k)``.

    q and k are ``[batch, seq, heads, head_dim]`` by default (``layout="bhsd"`` for transformers'
    ``[batch, heads, seq, head_dim]``, ``"thd"`` for packed tokens). Frequencies are computed once
    per device (and per sequence length for dynamic NTK / LongRoPE) in float64 and cached.
    """

    def __init__(self, config: RopeConfig, layout: str = "bshd") -> None:
        super().__init__()
        self.config = config
        self.layout = layout
        self._cache: dict = {}

    @classmethod
    def from_hf(cls, cfg, layer_type: Optional[str] = None, layout: str = "bshd") -> "RotaryEmbedding":
        """Build from a transformers config, a dict or a config.json path (see RopeConfig.from_hf)."""
        return cls(RopeConfig.from_hf(cfg, layer_type=layer_type), layout=layout)

    def inv_freq(self, device: torch.device, seq_len: Optional[int] = None) -> torch.Tensor:
        key = (str(device), seq_len if self.config.needs_seq_len else None)
        if key not in self._cache:
            self._cache[key] = self.config.inv_freq(seq_len=key[1]).to(device)
        return self._cache[key]

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
                offset: int = 0, cu_seqlens: Optional[torch.Tensor] = None):
        seq_len = None
        if self.config.needs_seq_len:
            if positions is not None and positions.numel() > 0:
                seq_len = int(positions.max()) + offset + 1
            else:
                seq_len = q.shape[{"bshd": 1, "bhsd": 2, "thd": 0}[self.layout]] + offset
        return ops.apply_rope(q, k, positions, inv_freq=self.inv_freq(q.device, seq_len),
                              attention_factor=self.config.attention_factor, interleaved=self.config.interleaved,
                              layout=self.layout, offset=offset, cu_seqlens=cu_seqlens)
