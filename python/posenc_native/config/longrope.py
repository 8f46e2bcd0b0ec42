"""LongRoPE (Phi-3): per-pair rescale factors, short or long by sequence length."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional, Sequence

import torch

from .scheme import ExtendedContext, RopeScaling, pair_exponents, register_scheme

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


@register_scheme
@dataclass(frozen=True)
class LongRopeScaling(ExtendedContext, RopeScaling):
    """LongRoPE (Phi-3): ``inv_i = 1 / (ext_i * base^(2i/d))``.

    ``ext`` is ``long_factor`` when ``seq_len > original_max_position_embeddings`` else
    ``short_factor`` (also when seq_len is None). Attention factor: ``attention_factor`` if given,
    else ``sqrt(1 + ln(factor)/ln(Lo))`` for factor > 1 (1 otherwise); ``factor`` defaults to
    ``max_position_embeddings / original_max_position_embeddings``.
    """

    short_factor: Sequence[float] = ()
    long_factor: Sequence[float] = ()
    original_max_position_embeddings: Optional[int] = None
    factor: Optional[float] = None
    attention_factor: Optional[float] = None
    rope_type: ClassVar[str] = "longrope"
    required_keys: ClassVar[tuple[str, ...]] = ("short_factor", "long_factor")
    needs_seq_len: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # tuples keep the dataclass hashable and immutable
        object.__setattr__(self, "short_factor", tuple(float(x) for x in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(x) for x in self.long_factor))

    @classmethod
    def from_hf_params(cls, params: Mapping[str, Any]) -> "LongRopeScaling":
        get = params.get
        for name in ("short_factor", "long_factor"):
            if not isinstance(get(name), (list, tuple)):
                raise ValueError(f"longrope rope: '{name}' must be a list of numbers, got {get(name)!r}")
        return cls(short_factor=get("short_factor"), long_factor=get("long_factor"),
                   original_max_position_embeddings=get("original_max_position_embeddings"),
                   factor=get("factor"), attention_factor=get("attention_factor"))

    def validate(self, cfg: "RopeConfig") -> None:
        n = cfg.rotary_dim // 2
        for name in ("short_factor", "long_factor"):
            values = getattr(self, name)
            if len(values) != n:
                raise ValueError(f"longrope rope: '{name}' must have rotary_dim // 2 = {n} entries, got {len(values)}")
            if not all(v > 0 and math.isfinite(v) for v in values):
                raise ValueError(f"longrope rope: every '{name}' entry must be a finite number > 0")
        self.validate_extended(cfg)

    def uses_long(self, cfg: "RopeConfig", seq_len: Optional[int]) -> bool:
        return bool(seq_len) and int(seq_len) > self.original_max(cfg)

    def regime(self, cfg: "RopeConfig", seq_len: Optional[int]) -> bool:
        return self.uses_long(cfg, seq_len)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        ext = self.long_factor if self.uses_long(cfg, seq_len) else self.short_factor
        ext_t = torch.tensor(ext, dtype=torch.float64)
        return 1.0 / (ext_t * float(cfg.base) ** pair_exponents(cfg.rotary_dim))

    def inv_freq_of_length(self, cfg: "RopeConfig", seq_len: torch.Tensor, device: torch.device) -> torch.Tensor:
        # the short/long choice on the device, between the two cached regimes (the same bits as eager)
        short, long = cfg._frequencies.regimes(device)
        return torch.where(seq_len > self.original_max(cfg), long, short)

    def regime_lengths(self, cfg: "RopeConfig") -> tuple[int, ...]:
        lo = self.original_max(cfg)
        return (lo, lo + 1)  # short factors up to the original context, long past it

    def compute_attention_factor(self, cfg: "RopeConfig") -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        f = self.resolved_factor(cfg)
        if f <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(f) / math.log(self.original_max(cfg)))

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        lo = self.original_max(cfg)
        return [f"  LongRoPE           short factors up to seq_len {lo}, long factors past it "
                "(scaled column: long)"], lo + 1
