"""Axial RoPE (Flux-style diffusion transformers): one frequency band per position axis."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

import torch

from .scheme import RopeScaling, default_inv_freq

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig


def check_axes_dim(axes_dim) -> tuple[int, ...]:
    """``axes_dim`` as a tuple of positive even ints, or ValueError naming it."""
    try:
        dims = tuple(axes_dim)
    except TypeError:
        raise ValueError(f"'axes_dim' must be a sequence of positive even ints, got {axes_dim!r}") from None
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 or d % 2 for d in dims):
        raise ValueError(f"'axes_dim' must be a non-empty sequence of positive even ints (one rotary width per "
                         f"axis), got {axes_dim!r}")
    return dims


@dataclass(frozen=True)
class AxialScaling(RopeScaling):
    """Axial RoPE: axis a rotates its own ``axes_dim[a]`` dims with the band
    ``1 / base ** (arange(0, d_a, 2) / d_a)``; the bands are concatenated in axis order, so axis a
    owns a contiguous section of ``d_a / 2`` pairs (Flux's ``EmbedND``). ``rotary_dim`` is
    ``sum(axes_dim)``. Built by :meth:`RopeConfig.axial`, which also sets the axis layout. Not a
    Hugging Face rope type, so not registered (``ROPE_TYPES`` lists what transformers knows)."""

    axes_dim: tuple[int, ...] = ()
    rope_type: ClassVar[str] = "axial"
    owns_rotary_dim: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes_dim", check_axes_dim(self.axes_dim))

    def resolve_rotary_dim(self, head_dim: int, rotary_dim: Optional[int], prf: Optional[float]
                           ) -> tuple[int, Optional[float]]:
        width = sum(self.axes_dim)
        if rotary_dim is not None and rotary_dim != width:
            raise ValueError(f"axial rope: 'rotary_dim' is sum(axes_dim) = {width}, got rotary_dim={rotary_dim}")
        return width, width / head_dim

    def validate(self, cfg: "RopeConfig") -> None:
        sections = tuple(d // 2 for d in self.axes_dim)
        if cfg.mrope_section != sections or cfg.mrope_interleaved:
            raise ValueError(f"axial rope: 'mrope_section' must be the contiguous sections {sections} of "
                             f"axes_dim={self.axes_dim}, got mrope_section={cfg.mrope_section}, "
                             f"mrope_interleaved={cfg.mrope_interleaved} (use RopeConfig.axial)")

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        return torch.cat([default_inv_freq(cfg.base, d) for d in self.axes_dim])

    def default_inv_freq(self, cfg: "RopeConfig") -> torch.Tensor:
        return self.compute_inv_freq(cfg, None)

    def to_dict(self) -> dict:
        return {"rope_type": self.rope_type, "axes_dim": list(self.axes_dim)}

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        return [f"  axial bands        axes_dim {self.axes_dim}: 1 / base ** (arange(0, d, 2) / d) per axis"], None
