"""Score mods for ``torch.nn.attention.flex_attention``: the T5 and ALiBi biases without a
materialized ``[heads, Lq, Lk]`` tensor.

    from torch.nn.attention.flex_attention import flex_attention
    out = flex_attention(q, k, v, score_mod=alibi_score_mod(alibi_slopes(H)))

Each returns ``score_mod(score, b, h, q_idx, kv_idx) -> score + bias[h, q_idx, kv_idx]`` with the
bias of :func:`posenc_native.relative_position_bias` / :func:`posenc_native.alibi_bias`.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .bias import Offset, _offset, relative_position_bias

__all__ = ["t5_score_mod", "alibi_score_mod"]

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def t5_score_mod(weight: torch.Tensor, query_length: int, key_length: int, *, bidirectional: bool = True,
                 num_buckets: Optional[int] = None, max_distance: int = 128, query_offset: Offset = 0) -> ScoreMod:
    """T5's relative position bias as a score mod.

    The bias depends on ``kv_idx - q_idx`` only, so the kernel computes its ``Lq + Lk - 1`` values per
    head once (``[heads, Lq + Lk - 1]``, through :func:`posenc_native.relative_position_bias`, so
    gradients reach ``weight``) and the score mod reads one per score. Arguments as in
    :func:`posenc_native.relative_position_bias`; ``query_length``/``key_length`` must be the
    lengths flex_attention is called with.
    """
    offset = _offset(query_offset)
    diagonals = max(query_length + key_length - 1, 1)
    # Row 0 of a 1 x (Lq + Lk - 1) bias whose query sits at Lq - 1 + offset: entry t is the relative
    # position t - (Lq - 1) - offset, i.e. kv_idx - q_idx - offset for t = kv_idx - q_idx + Lq - 1.
    table = relative_position_bias(weight, 1, diagonals, bidirectional=bidirectional, num_buckets=num_buckets,
                                   max_distance=max_distance, query_offset=query_length - 1 + offset)[0, :, 0]
    shift = query_length - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        t = (kv_idx - q_idx + shift).clamp(0, diagonals - 1)  # clamp: padded indices stay in the table
        return score + table[h, t]

    return score_mod


def alibi_score_mod(slopes: torch.Tensor, *, query_offset: Offset = 0) -> ScoreMod:
    """ALiBi as a score mod: ``score + slopes[h] * (kv_idx - (q_idx + query_offset))``.

    The offset's part, ``slopes[h] * -query_offset``, is formed once per head in float64 and added to
    ``slopes[h] * (kv_idx - q_idx)``: flex_attention's indices are int32, where ``kv_idx - q_idx -
    query_offset`` would wrap past 2^31 (and, converted to float32, round past 2^24). With an offset
    the bias is within a few float32 ulp of :func:`posenc_native.alibi_bias`; without, it is equal.
    """
    offset = _offset(query_offset)
    start = (slopes.to(torch.float64) * -float(offset)).to(slopes.dtype)  # differentiable in slopes

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (slopes[h] * (kv_idx - q_idx) + start[h])

    return score_mod
