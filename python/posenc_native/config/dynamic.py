"""Dynamic NTK scaling: the base grows with the sequence length."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

import torch

from .scheme import RopeScaling, check_factor, default_inv_freq, pair_exponents, register_scheme

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


@register_scheme
@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK: ``base' = base * (factor*s/L - (factor-1))^(d/(d-2))``, ``s = max(seq_len, L)``.

    ``L`` is the config's ``max_position_embeddings`` (required). ``inv_freq(seq_len)`` is the
    stateless formula; transformers caches the largest length seen (it only recomputes when a
    sequence grows past it, and resets below ``L``), so after a long sequence its frequencies for a
    shorter one (still > L) are those of the longer one. Pass the length you want.
    """

    factor: float
    rope_type: ClassVar[str] = "dynamic"
    required_keys: ClassVar[tuple[str, ...]] = ("factor",)
    needs_seq_len: ClassVar[bool] = True

    @classmethod
    def from_hf_params(cls, params: Mapping[str, Any]) -> "DynamicNTKScaling":
        return cls(factor=params.get("factor"))

    def validate(self, cfg: "RopeConfig") -> None:
        check_factor(self.rope_type, self.factor)
        if cfg.max_position_embeddings is None:
            raise ValueError("dynamic rope: 'max_position_embeddings' is required (it is L in the NTK formula)")
        if cfg.rotary_dim <= 2:
            raise ValueError(f"dynamic rope: 'rotary_dim' must be > 2 (the exponent is d/(d-2)), got {cfg.rotary_dim}")

    def regime(self, cfg: "RopeConfig", seq_len: Optional[int]) -> int:
        big_l = int(cfg.max_position_embeddings)
        return big_l if seq_len is None else max(int(seq_len), big_l)  # s of the formula

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        d, big_l, f = cfg.rotary_dim, int(cfg.max_position_embeddings), float(self.factor)
        s = self.regime(cfg, seq_len)
        base = float(cfg.base) * ((f * s / big_l) - (f - 1)) ** (d / (d - 2))
        return default_inv_freq(base, d)

    def inv_freq_of_length(self, cfg: "RopeConfig", seq_len: torch.Tensor, device: torch.device) -> torch.Tensor:
        # compute_inv_freq's formula in float64 tensor ops (within an ulp or so of its Python-float base)
        d, big_l, f = cfg.rotary_dim, int(cfg.max_position_embeddings), float(self.factor)
        s = seq_len.clamp_min(big_l).to(torch.float64)
        base = float(cfg.base) * ((f * s / big_l) - (f - 1)) ** (d / (d - 2))
        return 1.0 / (base ** pair_exponents(d).to(device))

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        seq_len = int(cfg.max_position_embeddings * self.factor)
        return [f"  dynamic NTK        scaled column at seq_len = {seq_len} (factor x max positions); "
                f"unchanged up to {cfg.max_position_embeddings}"], seq_len
