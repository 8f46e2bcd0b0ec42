"""Pure-PyTorch references of every op (any dtype; float64 inputs give the truth the kernels are
tested against). Slow and simple on purpose: each function reads like the formula it implements."""
from __future__ import annotations

import torch

__all__ = ["sinusoidal_frequencies", "sinusoidal_table", "add_sinusoidal"]


def sinusoidal_frequencies(dim: int, base: float = 10000.0, freq_shift: float = 0.0,
                           dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """w_i = base^(-i / (dim//2 - freq_shift)), i = 0 .. dim//2 - 1."""
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64, device=device)
    return torch.exp(-torch.log(torch.tensor(float(base), dtype=torch.float64)) * i / (half - freq_shift)).to(dtype)


def sinusoidal_table(positions, dim: int, *, base: float = 10000.0, interleaved: bool = True,
                     freq_shift: float = 0.0, angle_scale: float = 1.0, cos_first: bool = False,
                     dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """PE[p] for each position; [N, dim]. Computed in float64, then cast to ``dtype``."""
    if isinstance(positions, int):
        positions = torch.arange(positions, device=device)
    pos = positions.to(torch.float64)
    half = dim // 2
    w = sinusoidal_frequencies(dim, base, freq_shift, device=pos.device)
    angle = pos[:, None] * w[None, :] * angle_scale
    s, c = torch.sin(angle), torch.cos(angle)
    first, second = (c, s) if cos_first else (s, c)
    if interleaved:
        body = torch.stack([first, second], dim=-1).reshape(pos.shape[0], 2 * half)
    else:
        body = torch.cat([first, second], dim=-1)
    if dim % 2:
        body = torch.cat([body, torch.zeros_like(body[:, :1])], dim=-1)
    return body.to(dtype)


def add_sinusoidal(x: torch.Tensor, positions=None, *, offset: int = 0, x_scale: float = 1.0,
                   base: float = 10000.0, interleaved: bool = True, freq_shift: float = 0.0,
                   angle_scale: float = 1.0, cos_first: bool = False) -> torch.Tensor:
    """x * x_scale + PE[positions] in float64 math, returned in x's dtype."""
    seq, dim = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(seq, device=x.device) + offset
    flat = positions.reshape(-1)
    pe = sinusoidal_table(flat, dim, base=base, interleaved=interleaved, freq_shift=freq_shift,
                          angle_scale=angle_scale, cos_first=cos_first, dtype=torch.float64)
    pe = pe.reshape(*positions.shape, dim)
    return (x.to(torch.float64) * x_scale + pe).to(x.dtype)
