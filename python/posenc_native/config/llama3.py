"""Llama 3.1 frequency smoothing."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

import torch

from .scheme import RopeScaling, check_factor, check_positive, default_inv_freq, pair_runs, register_scheme

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


@register_scheme
@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1: wavelength ``w = 2*pi/inv``; ``w < Lo/high_freq_factor`` keeps ``inv``;
    ``w > Lo/low_freq_factor`` divides it by ``factor``; in between
    ``s = (Lo/w - low)/(high - low)``, ``inv = (1-s)*inv/factor + s*inv``.
    Defaults are Meta's (8, 1, 4, 8192); from_hf requires the first three, like transformers."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: ClassVar[str] = "llama3"
    required_keys: ClassVar[tuple[str, ...]] = ("factor", "low_freq_factor", "high_freq_factor")
    extends_context: ClassVar[bool] = True

    def validate(self, cfg: "RopeConfig") -> None:
        check_factor(self.rope_type, self.factor)
        check_positive(self.rope_type, "low_freq_factor", self.low_freq_factor)
        check_positive(self.rope_type, "high_freq_factor", self.high_freq_factor)
        check_positive(self.rope_type, "original_max_position_embeddings", self.original_max_position_embeddings)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"llama3 rope: 'high_freq_factor' ({self.high_freq_factor}) must be > "
                             f"'low_freq_factor' ({self.low_freq_factor})")

    def regimes(self, cfg: "RopeConfig") -> list[str]:
        """Per pair: "kept" (high frequency), "blended" or "interpolated" (divided by factor)."""
        inv = default_inv_freq(cfg.base, cfg.rotary_dim)
        w = 2 * math.pi / inv
        lo_len = self.original_max_position_embeddings
        out = []
        for wi in w.tolist():
            if wi < lo_len / self.high_freq_factor:
                out.append("kept")
            elif wi > lo_len / self.low_freq_factor:
                out.append("interpolated")
            else:
                out.append("blended")
        return out

    pair_regimes = regimes

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        inv = default_inv_freq(cfg.base, cfg.rotary_dim)
        f, low, high = float(self.factor), float(self.low_freq_factor), float(self.high_freq_factor)
        lo_len = float(self.original_max_position_embeddings)
        w = 2 * math.pi / inv
        scaled = torch.where(w > lo_len / low, inv / f, inv)
        s = (lo_len / w - low) / (high - low)
        smoothed = (1 - s) * scaled / f + s * scaled
        medium = ~(w < lo_len / high) & ~(w > lo_len / low)
        return torch.where(medium, smoothed, scaled)

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        return [f"  Llama-3 pairs      {pair_runs(self.regimes(cfg))}"], None
