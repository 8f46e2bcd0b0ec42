"""Proportional RoPE (Gemma 4 global layers)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

import torch

from .scheme import RopeScaling, check_factor, pair_exponents, pair_runs, register_scheme

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


@register_scheme
@dataclass(frozen=True)
class ProportionalScaling(RopeScaling):
    """Proportional RoPE (Gemma 4 global layers): all ``head_dim // 2`` pairs of the head (pairing
    over the whole head), the first ``int(partial_rotary_factor * head_dim // 2)`` with
    ``base^(-2i/head_dim)``, the rest with frequency 0 (they do not rotate); all divided by
    ``factor`` (default 1). Unlike partial rotary, the exponents use ``head_dim``, not the rotated
    width, and ``rotary_dim`` is ``head_dim``."""

    factor: float = 1.0
    rope_type: ClassVar[str] = "proportional"
    owns_rotary_dim: ClassVar[bool] = True

    def validate(self, cfg: "RopeConfig") -> None:
        check_factor(self.rope_type, self.factor)

    def resolve_rotary_dim(self, head_dim: int, rotary_dim: Optional[int], prf: Optional[float]
                           ) -> tuple[int, Optional[float]]:
        if rotary_dim is not None and rotary_dim != head_dim:
            raise ValueError(f"proportional rope: 'rotary_dim' is always head_dim={head_dim} (pairs past "
                             "the proportion get frequency 0); set partial_rotary_factor instead, "
                             f"got rotary_dim={rotary_dim}")
        return head_dim, (1.0 if prf is None else prf)

    def rotated_pairs(self, cfg: "RopeConfig") -> int:
        return int(cfg.partial_rotary_factor * cfg.head_dim // 2)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        n_rot = self.rotated_pairs(cfg)
        out = torch.zeros(cfg.head_dim // 2, dtype=torch.float64)
        out[:n_rot] = 1.0 / (float(cfg.base) ** pair_exponents(cfg.head_dim, n_rot))
        return out / float(self.factor)

    def default_inv_freq(self, cfg: "RopeConfig") -> torch.Tensor:
        return ProportionalScaling().compute_inv_freq(cfg, None)

    def pair_regimes(self, cfg: "RopeConfig") -> list[str]:
        n = self.rotated_pairs(cfg)
        return ["rotated" if i < n else "not rotated" for i in range(cfg.head_dim // 2)]

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        return [f"  proportional pairs {pair_runs(self.pair_regimes(cfg))}"], None
