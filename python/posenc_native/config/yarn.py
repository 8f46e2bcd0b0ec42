"""YaRN (Peng et al. 2023), as transformers computes it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

import torch

from .scheme import (ExtendedContext, RopeScaling, check_positive, default_inv_freq, mscale, pair_runs,
                     ramp_labels, register_scheme)

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


@register_scheme
@dataclass(frozen=True)
class YarnScaling(ExtendedContext, RopeScaling):
    """YaRN, as transformers computes it.

    ``cdim(r) = d*ln(Lo/(2*pi*r)) / (2*ln(base))``; ``lo = cdim(beta_fast)``, ``hi = cdim(beta_slow)``,
    floored/ceiled when ``truncate``, clamped to ``[0, d-1]``; ``ramp_i = clamp((i-lo)/(hi-lo), 0, 1)``;
    ``inv_i = (inv_i/factor)*ramp_i + inv_i*(1-ramp_i)``: pairs below ``lo`` keep their frequency,
    pairs above ``hi`` are interpolated (divided by ``factor``), pairs between are blended.

    Attention factor (multiplies cos and sin): ``attention_factor`` if given, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are given and non-zero
    (DeepSeek), else ``mscale(factor) = 0.1*ln(factor) + 1``.

    ``factor=None`` means ``max_position_embeddings / original_max_position_embeddings``;
    ``original_max_position_embeddings=None`` means the config's ``max_position_embeddings``.
    """

    factor: Optional[float] = None
    original_max_position_embeddings: Optional[int] = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    attention_factor: Optional[float] = None
    truncate: bool = True
    rope_type: ClassVar[str] = "yarn"
    required_keys: ClassVar[tuple[str, ...]] = ("factor",)

    @classmethod
    def from_hf_params(cls, params: Mapping[str, Any]) -> "YarnScaling":
        get = params.get
        # `or` as transformers: a 0/None beta means the default
        return cls(factor=get("factor"), original_max_position_embeddings=get("original_max_position_embeddings"),
                   beta_fast=get("beta_fast") or 32.0, beta_slow=get("beta_slow") or 1.0,
                   mscale=get("mscale"), mscale_all_dim=get("mscale_all_dim"),
                   attention_factor=get("attention_factor"),
                   truncate=True if get("truncate") is None else bool(get("truncate")))

    def validate(self, cfg: "RopeConfig") -> None:
        check_positive(self.rope_type, "beta_fast", self.beta_fast)
        check_positive(self.rope_type, "beta_slow", self.beta_slow)
        if self.beta_fast < self.beta_slow:
            raise ValueError(f"yarn rope: 'beta_fast' ({self.beta_fast}) must be >= 'beta_slow' ({self.beta_slow})")
        self.validate_extended(cfg)

    def correction_range(self, cfg: "RopeConfig") -> tuple[float, float]:
        """``(lo, hi)`` after truncation and clamping (before the ``lo == hi`` nudge)."""
        d, base, big_lo = cfg.rotary_dim, float(cfg.base), self.original_max(cfg)

        def cdim(r: float) -> float:
            return d * math.log(big_lo / (2 * math.pi * r)) / (2 * math.log(base))

        lo, hi = cdim(float(self.beta_fast)), cdim(float(self.beta_slow))
        if self.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        return max(lo, 0), min(hi, d - 1)

    def ramp(self, cfg: "RopeConfig") -> torch.Tensor:
        """``ramp_i`` in [0, 1] per pair: 0 keeps the frequency, 1 divides it by ``factor``."""
        lo, hi = self.correction_range(cfg)
        if lo == hi:
            hi += 0.001  # as transformers: avoid 0/0
        i = torch.arange(cfg.rotary_dim // 2, dtype=torch.float64)
        return ((i - lo) / (hi - lo)).clamp(0, 1)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        inv = default_inv_freq(cfg.base, cfg.rotary_dim)
        ramp = self.ramp(cfg)
        return (inv / self.resolved_factor(cfg)) * ramp + inv * (1 - ramp)

    def compute_attention_factor(self, cfg: "RopeConfig") -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        f = self.resolved_factor(cfg)
        if self.mscale and self.mscale_all_dim:
            return float(mscale(f, self.mscale) / mscale(f, self.mscale_all_dim))
        return mscale(f)

    def softmax_scale_multiplier(self, cfg: "RopeConfig") -> float:
        if self.mscale_all_dim:
            return mscale(self.resolved_factor(cfg), self.mscale_all_dim) ** 2
        return 1.0

    def pair_regimes(self, cfg: "RopeConfig") -> list[str]:
        return ramp_labels(self.ramp(cfg).tolist())

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        lo, hi = self.correction_range(cfg)
        return [f"  YaRN correction range  lo={lo:g} hi={hi:g} (pairs: {pair_runs(self.pair_regimes(cfg))})"], None
