"""RoPE frequency configuration (placeholder: the full RopeConfig lands with issue 3).

Interface used by ops.apply_rope and the modules:
    cfg.inv_freq(seq_len=None) -> float64 tensor [rotary_dim // 2]
    cfg.attention_factor: float, cfg.interleaved: bool, cfg.rotary_dim: int, cfg.head_dim: int,
    cfg.needs_seq_len: bool (True when inv_freq depends on seq_len: dynamic, longrope)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RopeConfig:
    head_dim: int
    base: float = 10000.0
    interleaved: bool = False

    @property
    def rotary_dim(self) -> int:
        return self.head_dim

    @property
    def attention_factor(self) -> float:
        return 1.0

    @property
    def needs_seq_len(self) -> bool:
        return False

    def inv_freq(self, seq_len=None) -> torch.Tensor:
        i = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64)
        return 1.0 / (self.base ** (i / self.rotary_dim))
