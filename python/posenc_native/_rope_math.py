"""RoPE tensor math in plain PyTorch, float64, shared by the reference, the modules and the
transformers integration: the layout axes, the sequence length a scheme sees, the angles, the
cos/sin tables, the rotate-half helpers and the pair -> axis map of multi-axis layouts (MRoPE,
axial). No kernels here."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

LAYOUTS = ("bshd", "bhsd", "thd")
SEQ_AXIS = {"bshd": 1, "bhsd": 2, "thd": 0}  # where the tokens are
HEAD_AXIS = {"bshd": 2, "bhsd": 1, "thd": 1}  # where the heads are


def seq_len_from_positions(positions: torch.Tensor, offset: int = 0) -> int:
    """The sequence length dynamic NTK and LongRoPE frequencies depend on: ``max(positions) + offset
    + 1`` (as transformers' frequency update), 0 for no positions or none past -1 (negative
    positions: the frequencies of short sequences, as transformers gives them). Reads the maximum
    on the host (a device synchronization)."""
    if positions.numel() == 0:
        return 0
    return max(0, int(positions.max()) + int(offset) + 1)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor,
                pair_axes: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``positions[..., None] * inv_freq``, formed in float64: ``[*positions.shape, len(inv_freq)]``.

    With ``pair_axes`` (an axis layout, :func:`mrope_pair_axes`) positions are ``[A, *rest]``, one row
    per axis, and pair i's angle is ``positions[pair_axes[i]] * inv_freq[i]``: ``[*rest, len(inv_freq)]``."""
    pos = positions.to(torch.float64)
    inv = inv_freq.to(device=pos.device, dtype=torch.float64)
    if pair_axes is None:
        return pos[..., None] * inv
    index = torch.as_tensor(list(pair_axes), dtype=torch.long, device=pos.device)
    return pos.movedim(0, -1)[..., index] * inv


def mrope_pair_axes(section: Sequence[int], interleaved: bool = False) -> tuple[int, ...]:
    """Which position axis feeds each rotary pair, for ``sum(section)`` pairs and ``len(section)`` axes.

    Contiguous (Qwen2-VL, Qwen2.5-VL, axial RoPE): section j's pairs, in order, take axis j; for
    ``(16, 24, 24)`` pairs 0-15 read time, 16-39 height, 40-63 width (transformers'
    ``Qwen2VLRotaryEmbedding.recomposition_frequencies``).

    Interleaved (Qwen3-VL): axes take pairs round-robin, pair i on axis ``i % A`` while
    ``i < A * section[i % A]``, and every other pair on axis 0; for ``(24, 20, 20)`` pairs
    0, 3, ..., 57 and 60-63 read time, 1, 4, ..., 58 height, 2, 5, ..., 59 width (transformers'
    ``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``). Axis a then has ``section[a]`` pairs
    when the sections allow it (Qwen3-VL's do); other sections follow the same rule, as in transformers.
    """
    n = sum(section)
    if not interleaved:
        return tuple(a for a, width in enumerate(section) for _ in range(width))
    axes = len(section)
    return tuple(i % axes if (i % axes and i < axes * section[i % axes]) else 0 for i in range(n))


def axis_mask(pair_axes: Sequence[int], num_axes: int, device=None) -> torch.Tensor:
    """``[num_axes, len(pair_axes)]`` bool, true at ``[pair_axes[i], i]``: made on the host, then
    copied to ``device`` (a copy that waits for a GPU: ops.py caches it per device)."""
    mask = torch.zeros((num_axes, len(pair_axes)), dtype=torch.bool)
    mask[list(pair_axes), list(range(len(pair_axes)))] = True
    return mask if device is None else mask.to(device)


def axis_inv_freq(inv_freq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The frequencies as the ops take an axis layout: ``[num_axes, len(inv_freq)]``, pair i's
    frequency in row ``pair_axes[i]`` and zeros elsewhere, for ``mask = axis_mask(pair_axes,
    num_axes)`` on inv_freq's device (the kernels sum ``position[a] * row[a][i]`` over axes,
    csrc/core/rope.h; the zeros make that exactly ``position[axis(i)] * inv_freq[i]``). float64."""
    return torch.where(mask, inv_freq.to(torch.float64), 0.0)


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
