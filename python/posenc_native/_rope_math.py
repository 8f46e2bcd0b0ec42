"""RoPE tensor math in plain PyTorch, float64, shared by the reference, the modules and the
transformers integration: the layout axes, the sequence length a scheme sees, the angles, the
cos/sin tables and the rotate-half helpers. No kernels here."""
from __future__ import annotations

from typing import Optional

import torch

LAYOUTS = ("bshd", "bhsd", "thd")
SEQ_AXIS = {"bshd": 1, "bhsd": 2, "thd": 0}  # where the tokens are
HEAD_AXIS = {"bshd": 2, "bhsd": 1, "thd": 1}  # where the heads are


def seq_len_from_positions(positions: torch.Tensor, offset: int = 0) -> int:
    """The sequence length dynamic NTK and LongRoPE frequencies depend on: ``max(positions) + offset
    + 1`` (as transformers' frequency update), 0 for no positions. Reads the maximum on the host
    (a device synchronization)."""
    if positions.numel() == 0:
        return 0
    return int(positions.max()) + int(offset) + 1


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``positions[..., None] * inv_freq``, formed in float64: ``[*positions.shape, len(inv_freq)]``."""
    pos = positions.to(torch.float64)
    return pos[..., None] * inv_freq.to(device=pos.device, dtype=torch.float64)


def cos_sin_from_angles(angles: torch.Tensor, attention_factor: float = 1.0, interleaved: bool = False,
                        dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dim ``(cos, sin)`` of per-pair angles, times the attention factor: ``cat(c, c)`` for
    half-split pairs (transformers' layout), ``repeat_interleave(c, 2)`` for interleaved ones."""
    f = float(attention_factor)
    c, s = torch.cos(angles) * f, torch.sin(angles) * f
    if interleaved:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
    else:
        c, s = torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)
    return (c, s) if dtype is None else (c.to(dtype), s.to(dtype))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` split in halves (GPT-NeoX/Llama)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """``(-x_{2i+1}, x_{2i})`` for every pair (GPT-J)."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
