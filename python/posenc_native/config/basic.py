"""Unscaled RoPE and position interpolation (linear)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

import torch

from .scheme import RopeScaling, check_factor, default_inv_freq, register_scheme

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


@register_scheme
@dataclass(frozen=True)
class DefaultScaling(RopeScaling):
    """Unscaled RoPE: ``inv_i = 1 / base^(2i/d)``."""

    rope_type: ClassVar[str] = "default"


@register_scheme
@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation: ``inv_i / factor``."""

    factor: float
    rope_type: ClassVar[str] = "linear"
    required_keys: ClassVar[tuple[str, ...]] = ("factor",)

    @classmethod
    def from_hf_params(cls, params: Mapping[str, Any]) -> "LinearScaling":
        return cls(factor=params.get("factor"))

    def validate(self, cfg: "RopeConfig") -> None:
        check_factor(self.rope_type, self.factor)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        return default_inv_freq(cfg.base, cfg.rotary_dim) / float(self.factor)
