"""Pure-PyTorch references of every op (any dtype; float64 inputs give the truth the kernels are
tested against). Slow and simple on purpose: each function reads like the formula it implements."""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Optional, Union

import torch

from ._rope_math import (SEQ_AXIS, cos_sin_from_angles, mrope_pair_axes, rope_angles, rotate_every_two,
                         rotate_half, seq_len_from_positions)

if TYPE_CHECKING:  # pragma: no cover
    from .config import RopeConfig

__all__ = ["sinusoidal_frequencies", "sinusoidal_table", "add_sinusoidal", "rope_positions", "rope_angles",
           "rope_tables", "rotate_half", "rotate_every_two", "apply_rope", "t5_relative_position_bucket",
           "relative_position_bias", "alibi_slopes", "alibi_bias"]


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
    """x * x_scale + PE[positions + offset] in float64 math, returned in x's dtype.

    ``offset`` is added to every position, given or default (``arange(seq)``), exactly as in
    ``ops.add_sinusoidal``: in int64 for integer positions, float64 for float ones."""
    seq, dim = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    positions = positions.to(torch.float64 if positions.is_floating_point() else torch.int64) + offset
    flat = positions.reshape(-1)
    pe = sinusoidal_table(flat, dim, base=base, interleaved=interleaved, freq_shift=freq_shift,
                          angle_scale=angle_scale, cos_first=cos_first, dtype=torch.float64)
    pe = pe.reshape(*positions.shape, dim)
    return (x.to(torch.float64) * x_scale + pe).to(x.dtype)


# ------------------------------------------------------------------------------------------------
# RoPE
#
# Rotation of a pair (a, b) by t, scaled by the attention factor f (docs/architecture.md, "Numerics"):
#   (a, b) -> f * (a cos t - b sin t, a sin t + b cos t),   t = position * inv_freq[i]
# Pairs are (i, i + R/2) (half-split, GPT-NeoX/Llama) or (2i, 2i + 1) (interleaved, GPT-J);
# dims past the rotary width R pass through untouched.

def rope_positions(num_tokens: int, positions: Optional[torch.Tensor] = None, *, offset: int = 0,
                   cu_seqlens: Optional[torch.Tensor] = None, device=None) -> torch.Tensor:
    """Integer positions as the ops see them: ``positions + offset``; by default ``arange(num_tokens) +
    offset``, or with ``cu_seqlens`` the index of each token within its packed sequence plus offset."""
    if positions is not None:
        return positions.to(device=device if device is not None else positions.device, dtype=torch.int64) + int(offset)
    if cu_seqlens is None:
        return torch.arange(num_tokens, dtype=torch.int64, device=device) + int(offset)
    cu = cu_seqlens.to(dtype=torch.int64, device="cpu").tolist()
    if cu[0] != 0 or cu[-1] != num_tokens or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at {num_tokens}, got {cu}")
    parts = [torch.arange(b - a, dtype=torch.int64) for a, b in zip(cu, cu[1:])]
    return (torch.cat(parts) + int(offset)).to(device)


def rope_tables(positions: Union[int, torch.Tensor], config: "RopeConfig", *, seq_len: Optional[int] = None,
                dtype: torch.dtype = torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin tables of every rotated dim, multiplied by ``config.attention_factor`` (what
    the table-source ops, ``ops.apply_rotary_pos_emb`` and ``posenc.rope_cos_sin``, consume).

    Args:
        positions: an int ``S`` (positions ``0..S-1``) or an integer tensor of any shape.
        config: the :class:`~posenc_native.config.RopeConfig`.
        seq_len: for dynamic NTK / LongRoPE; default ``max(positions) + 1``.
        dtype: of the result (computed in float64).

    Returns:
        ``(cos, sin)``, each ``[*positions.shape, config.rotary_dim]``, laid out for the config's
        pairing: ``cat(c, c)`` for half-split (transformers' layout, usable with
        ``apply_rotary_pos_emb``), ``repeat_interleave(c, 2)`` for interleaved.
    """
    if isinstance(positions, int):
        positions = torch.arange(positions, device=device)
    elif device is not None:
        positions = positions.to(device)
    if seq_len is None and config.needs_seq_len:
        seq_len = seq_len_from_positions(positions)
    angles = rope_angles(positions, config.inv_freq(seq_len=seq_len))
    return cos_sin_from_angles(angles, config.attention_factor, config.interleaved, dtype)


def rope_cos_sin(positions: Union[int, torch.Tensor], cfg: "RopeConfig", **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Deprecated name of :func:`rope_tables` (``rope_cos_sin`` is the op that rotates with tables)."""
    warnings.warn("posenc_native.reference.rope_cos_sin is renamed rope_tables", DeprecationWarning, stacklevel=2)
    return rope_tables(positions, cfg, **kwargs)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, interleaved: bool) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of ``x`` (float64) by per-pair ``cos``/``sin`` (already
    scaled by the attention factor), broadcasting over heads."""
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
    else:
        a, b = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = torch.stack((ra, rb), dim=-1).flatten(-2) if interleaved else torch.cat((ra, rb), dim=-1)
    return torch.cat((out, rest), dim=-1)


def apply_rope(q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
               config: Optional["RopeConfig"] = None, *, layout: str = "bshd",
               inv_freq: Optional[torch.Tensor] = None, attention_factor: float = 1.0, interleaved: bool = False,
               offset: int = 0, cu_seqlens: Optional[torch.Tensor] = None, seq_len: Optional[int] = None,
               cfg: Optional["RopeConfig"] = None, mrope_section=None, mrope_interleaved: bool = False
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotary embedding of q and k, the reference for ``ops.apply_rope`` (float64 math).

    Args:
        q, k: ``[B,S,H,D]`` (``"bshd"``), ``[B,H,S,D]`` (``"bhsd"``) or ``[T,H,D]`` (``"thd"``);
            k may have another head count, or be None.
        positions: ``[S]`` or ``[B,S]`` (``[T]`` for thd) integer positions; default
            ``arange(S)`` (with ``cu_seqlens``, the position within each packed sequence).
            ``offset`` is added to them, as in the ops.
        config: a :class:`~posenc_native.config.RopeConfig` (frequencies, attention factor, pairing,
            rotary dim), by position or as ``config=`` like ``ops.apply_rope``; or give ``inv_freq``,
            ``attention_factor`` and ``interleaved`` instead. (``cfg=`` is its deprecated name.)
        seq_len: for dynamic NTK / LongRoPE; default ``max(position) + 1``.
        mrope_section, mrope_interleaved: an axis layout with ``inv_freq`` (a config brings its
            own): positions are then ``[A, B, S]`` / ``[A, S]`` (``[A, T]`` for thd), and pair i turns
            by ``positions[axis(i)] * inv_freq[i]`` with ``axis = _rope_math.mrope_pair_axes(section,
            interleaved)``; positions without the axis dim give every axis the same id.

    Returns:
        ``(q_out, k_out)`` in the dtypes of q and k (``k_out`` None when k is None). The rotated
        dims are multiplied by the attention factor; the dims past ``rotary_dim`` are copied.
    """
    if cfg is not None:
        warnings.warn("reference.apply_rope(cfg=...) is renamed config=", DeprecationWarning, stacklevel=2)
        config = cfg if config is None else config
    if layout not in SEQ_AXIS:
        raise ValueError(f"layout must be one of {tuple(SEQ_AXIS)}, got {layout!r}")
    expected_dim = 3 if layout == "thd" else 4
    for name, t in (("q", q), ("k", k)):
        if t is not None and t.dim() != expected_dim:
            raise ValueError(f"{name} must be {expected_dim}-D for layout {layout!r}, got shape {tuple(t.shape)}")
    if cu_seqlens is not None and layout != "thd":
        raise ValueError("cu_seqlens is only for layout 'thd'")
    num_tokens = q.shape[SEQ_AXIS[layout]]
    pos = rope_positions(num_tokens, positions, offset=offset, cu_seqlens=cu_seqlens, device=q.device)
    pair_axes = None
    if config is not None:
        if inv_freq is not None or mrope_section is not None:
            raise ValueError("pass either config or inv_freq (and mrope_section), not both")
        if seq_len is None and config.needs_seq_len:
            seq_len = seq_len_from_positions(pos)
        inv_freq = config.inv_freq(seq_len=seq_len)
        attention_factor, interleaved = config.attention_factor, config.interleaved
        pair_axes, num_axes = config.pair_axes, config.num_axes
    elif mrope_section is not None:
        pair_axes, num_axes = mrope_pair_axes(tuple(mrope_section), bool(mrope_interleaved)), len(mrope_section)
    if inv_freq is None:
        raise ValueError("apply_rope needs config or inv_freq")
    rotary_dim = 2 * inv_freq.shape[-1]
    if rotary_dim > q.shape[-1]:
        raise ValueError(f"rotary dim {rotary_dim} exceeds head_dim {q.shape[-1]}")
    if pair_axes is not None:
        if len(pair_axes) != inv_freq.shape[-1]:
            raise ValueError(f"the axis layout has {len(pair_axes)} pairs but inv_freq has {inv_freq.shape[-1]}")
        if positions is None and layout == "thd":
            raise ValueError("positions are required for layout 'thd' with an axis layout")
        if pos.dim() != (2 if layout == "thd" else 3):  # no axis dim: the same id on every axis
            pos = pos.expand(num_axes, *pos.shape)
        elif pos.shape[0] != num_axes:
            raise ValueError(f"positions must have {num_axes} axis rows, got shape {tuple(pos.shape)}")
    angles = rope_angles(pos, inv_freq, pair_axes)  # [S, R/2], [B, S, R/2] or [T, R/2]
    f = float(attention_factor)
    cos, sin = torch.cos(angles) * f, torch.sin(angles) * f
    # broadcast over heads: insert the head axis next to the sequence axis
    if layout == "bhsd":
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # [..., 1, S, R/2]
    else:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [..., S, 1, R/2]

    def one(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if x is None:
            return None
        return _rotate(x.to(torch.float64), cos, sin, rotary_dim, bool(interleaved)).to(x.dtype)

    return one(q), one(k)


# ------------------------------------------------------------------------------------------------
# Relative position biases (T5, ALiBi). r = key - (query + query_offset) (memory - context).


def t5_relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool = True,
                                num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of each relative position, exactly (integer arithmetic, no floating point).

    With n the distance (``|r|`` when bidirectional, ``max(-r, 0)`` otherwise), ``buckets`` the
    buckets per direction (``num_buckets // 2`` when bidirectional) and ``max_exact = buckets // 2``:
    ``n < max_exact`` is its own bucket; otherwise the bucket is
    ``max_exact + floor((buckets - max_exact) * ln(n / max_exact) / ln(max_distance / max_exact))``,
    at most ``buckets - 1``: the largest k with ``(n / max_exact)^(buckets - max_exact) >=
    (max_distance / max_exact)^k``. Bidirectional: keys after the query (r > 0) add ``buckets``.
    """
    rp = relative_position.to(torch.int64)
    per = num_buckets // 2 if bidirectional else num_buckets
    me, span, md = per // 2, per - per // 2, int(max_distance)
    if bidirectional:
        base, n = (rp > 0).to(torch.int64) * per, rp.abs()
    else:
        base, n = torch.zeros_like(rp), (-rp).clamp_min(0)

    def large(d: int) -> int:  # exact integer comparison of the powers
        k = max(k for k in range(span + 1) if d ** span * me ** k >= md ** k * me ** span)
        return min(me + k, per - 1)

    distances, idx = n.clamp(me, max(md, me)).unique(return_inverse=True)  # (max_distance may be 2^40)
    table = torch.tensor([large(d) if d < md else per - 1 for d in distances.tolist()], dtype=torch.int64,
                         device=rp.device)
    return base + torch.where(n < me, n, table[idx])


def relative_position_bias(weight: torch.Tensor, query_length: int, key_length: int, *, bidirectional: bool = True,
                           max_distance: int = 128, query_offset: int = 0) -> torch.Tensor:
    """``bias[0, h, i, j] = weight[bucket(j - (i + query_offset)), h]``, ``[1, heads, Lq, Lk]`` in weight's dtype."""
    q = torch.arange(query_length, device=weight.device)[:, None] + int(query_offset)
    k = torch.arange(key_length, device=weight.device)[None, :]
    buckets = t5_relative_position_bucket(k - q, bidirectional=bidirectional, num_buckets=weight.shape[0],
                                          max_distance=max_distance)
    return weight[buckets].permute(2, 0, 1).unsqueeze(0)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes as the paper's code computes them (float64): a geometric sequence starting at
    ``2^(-8/n)`` for a power of two n; otherwise the slopes of the largest power of two below, then
    every other slope of the next power of two."""

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    def slopes(n: int) -> list[float]:
        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + slopes(2 * closest)[0::2][: n - closest]

    return torch.tensor(slopes(num_heads), dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, query_length: int, key_length: int, *, query_offset: int = 0) -> torch.Tensor:
    """``bias[0, h, i, j] = slopes[h] * (j - (i + query_offset))`` in float64, ``[1, heads, Lq, Lk]``."""
    q = torch.arange(query_length, dtype=torch.float64, device=slopes.device)[:, None] + int(query_offset)
    k = torch.arange(key_length, dtype=torch.float64, device=slopes.device)[None, :]
    return (slopes.to(torch.float64)[:, None, None] * (k - q)).unsqueeze(0)
