"""nn.Modules over the relative-position-bias kernels (posenc_native.bias): T5's bucketed bias and ALiBi.

Both call torch.ops.posenc directly, so they also script with TorchScript.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import bias as _bias, ops as _ops
from ._derived_buffers import DerivedBuffers

__all__ = ["T5RelativePositionBias", "ALiBi"]


class T5RelativePositionBias(nn.Module):
    """T5's relative position bias: ``forward(query_length, key_length, query_offset=0)`` returns
    ``[1, num_heads, query_length, key_length]`` to add to the attention scores.

    The table is ``relative_attention_bias`` (an ``nn.Embedding(num_buckets, num_heads)``), named and
    laid out as in transformers' ``T5Attention``, so T5's ``relative_attention_bias.weight`` loads as
    is (``load_state_dict`` with that key, or :meth:`from_t5`). ``bidirectional`` is False for a
    decoder's self-attention. ``query_offset`` is the position of the first query (tokens already
    in the cache while decoding).
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        # Fails here, naming the argument, rather than at the first forward.
        _bias.relative_position_bias(torch.zeros(num_buckets, num_heads), 0, 0, bidirectional=bidirectional,
                                     num_buckets=num_buckets, max_distance=max_distance)
        self.num_heads = int(num_heads)
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.bidirectional = bool(bidirectional)
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    @classmethod
    def from_t5(cls, attention: nn.Module) -> "T5RelativePositionBias":
        """The bias of a transformers ``T5Attention`` (T5, mT5, UMT5) that has one; shares its weight."""
        weight = getattr(getattr(attention, "relative_attention_bias", None), "weight", None)
        if weight is None:
            raise ValueError(f"{type(attention).__name__} has no relative_attention_bias (only the first layer of "
                             "each T5 stack has one)")
        module = cls(weight.shape[1], attention.relative_attention_num_buckets,
                     attention.relative_attention_max_distance, bidirectional=not attention.is_decoder)
        module.relative_attention_bias = attention.relative_attention_bias
        return module

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")

    def forward(self, query_length: int, key_length: int, query_offset: int = 0) -> torch.Tensor:
        weight = self.relative_attention_bias.weight
        if not torch.jit.is_scripting():  # eager: the function, its checks and torch.func/forward-AD rules
            return _bias.relative_position_bias(weight, query_length, key_length, bidirectional=self.bidirectional,
                                                num_buckets=self.num_buckets, max_distance=self.max_distance,
                                                query_offset=query_offset)
        return torch.ops.posenc.relative_position_bias(weight, query_length, key_length, self.bidirectional,
                                                       self.num_buckets, self.max_distance, query_offset)


class ALiBi(DerivedBuffers):
    """ALiBi (Press et al.): ``forward(query_length, key_length, query_offset=0, dtype=None)`` returns
    ``bias[0, h, i, j] = slopes[h] * (j - (i + query_offset))``, ``[1, num_heads, Lq, Lk]``, to add to
    causal attention scores. ``slopes`` is a float32 buffer (:func:`posenc_native.alibi_slopes`),
    recomputed on every move: ``.half()`` does not round it, and a module built on the meta device
    holds the true slopes after ``to_empty()``. The output has ``dtype``, by default
    ``output_dtype``: float32, or what a cast of the module asked for (``.to(torch.bfloat16)``:
    bfloat16 biases, each the exact product rounded once to float32, then to bfloat16)."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = int(num_heads)
        self.output_dtype = torch.float32
        self._register_derived_buffers()

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"slopes": _bias.alibi_slopes(self.num_heads)}

    def _moved(self, cast: Optional[torch.dtype]) -> None:
        if cast is not None:  # (a move alone keeps the dtype an earlier cast asked for)
            self.output_dtype = cast

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}" + ("" if self.output_dtype == torch.float32 else f", output_dtype={self.output_dtype}")

    def forward(self, query_length: int, key_length: int, query_offset: int = 0,
                dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        if dtype is None:
            dtype = self.output_dtype
        if not torch.jit.is_scripting():  # eager: the function, its checks and torch.func/forward-AD rules
            return _bias.alibi_bias(self.slopes, query_length, key_length, query_offset=query_offset, dtype=dtype)
        if self.slopes.dtype != torch.float32:  # cast after torch.jit.script: no Python ran to rebuild them
            raise RuntimeError("ALiBi: its float32 slopes buffer was cast (a dtype cast of the scripted module, e.g. "
                               ".half() or C++ module.to(kHalf)): cast the Python module before torch.jit.script, "
                               "which keeps the slopes exact and gives biases of the cast dtype")
        return torch.ops.posenc.alibi_bias(self.slopes, query_length, key_length, query_offset, dtype)


_ops.use_module_call(T5RelativePositionBias, ALiBi)  # nn.Module.__call__ without its Python frames
