"""Relative position biases: T5's bucketed bias and ALiBi, over torch.ops.posenc (csrc/core/relative_bias.h).

Both biases depend on a (query i, key j) pair only through the relative position
``r = j - (i + query_offset)`` (memory minus context, as T5 defines it) and come out as
``[1, heads, query_length, key_length]``, ready to add to attention scores:

- T5: ``bias[0, h, i, j] = weight[bucket(r), h]`` with ``weight`` T5's
  ``relative_attention_bias.weight`` (``[num_buckets, heads]``) and ``bucket`` transformers'
  ``T5Attention._relative_position_bucket``.
- ALiBi: ``bias[0, h, i, j] = slopes[h] * r``. Under a causal mask this equals BLOOM's and MPT's
  forms (they differ from it by a constant per query row, which softmax ignores).

This module holds the thin wrappers, the fake kernels (torch.compile / export) and autograd.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from ._checks import check_int
from ._contexts import is_traced_int, static_int, traced_int, untraced
from ._forward_ad import linear_jvp
from ._functorch import autograd_skipped, dispatch, register_autograd
from ._library import load_library
from ._op_args import bind, call, input_grads
from . import _fx, ops as _ops

load_library()

__all__ = ["t5_relative_position_bucket", "relative_position_bias", "alibi_slopes", "alibi_bias"]

Offset = Union[int, torch.SymInt, torch.Tensor]


def _offset(query_offset: Offset) -> int:
    """An int offset; a 0-dim tensor (transformers' past_seen_tokens with a static cache) is read
    on the host."""
    if is_traced_int(query_offset):
        return traced_int("query_offset", query_offset)
    if isinstance(query_offset, torch.Tensor):
        if query_offset.numel() != 1:
            raise ValueError("query_offset must be an int or a one-element tensor, got shape "
                             f"{tuple(query_offset.shape)}")
        if query_offset.is_floating_point() or query_offset.is_complex() or query_offset.dtype == torch.bool:
            raise TypeError(f"query_offset must be an int or a one-element integer tensor, got a {query_offset.dtype} "
                            "tensor")
        return int(query_offset.item())
    return check_int("query_offset", query_offset)


def t5_relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool = True,
                                num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of each relative position (memory - context), exactly as transformers'
    ``T5Attention._relative_position_bucket``: distances below ``max_exact = num_buckets // 2 // 2``
    (bidirectional) or ``num_buckets // 2`` get a bucket each, larger ones log-spaced buckets up to
    ``max_distance``, clamped to the last; bidirectional buckets give keys after the query the upper
    half, unidirectional ones map keys after the query to bucket 0.

    Args:
        relative_position: int32 or int64 tensor of any shape.
        bidirectional: False for T5's decoder self-attention.
        num_buckets: even when bidirectional; >= 4 (bidirectional) or >= 2; <= 1024.
        max_distance: > the number of exact distances; <= 2^40.

    Returns an int64 tensor of the same shape.
    """
    return torch.ops.posenc.t5_relative_position_bucket(relative_position, bool(bidirectional), int(num_buckets),
                                                        int(max_distance))


def relative_position_bias(weight: torch.Tensor, query_length: int, key_length: int, *, bidirectional: bool = True,
                           num_buckets: Optional[int] = None, max_distance: int = 128,
                           query_offset: Offset = 0) -> torch.Tensor:
    """T5's relative position bias ``[1, heads, query_length, key_length]``, what transformers'
    ``T5Attention.compute_bias(query_length, key_length, past_seen_tokens=query_offset)`` returns,
    computed in one pass (one bucket per relative position for all heads).

    Args:
        weight: ``[num_buckets, heads]``, the layout of T5's ``relative_attention_bias.weight``; the
            output has its dtype and device.
        query_length, key_length: the bias covers queries ``query_offset .. query_offset + query_length - 1``
            against keys ``0 .. key_length - 1``.
        bidirectional: False for decoder self-attention (``not is_decoder`` in T5).
        num_buckets: defaults to ``weight.shape[0]``; when given it must match.
        max_distance: T5's ``relative_attention_max_distance`` (<= 2^40).
        query_offset: the position of the first query (transformers' ``past_seen_tokens`` while
            decoding with a cache); a one-element tensor is read on the host.

    Differentiable with respect to ``weight`` (a deterministic kernel sums the gradient per bucket
    and head).
    """
    nb = num_buckets if num_buckets is not None or not isinstance(weight, torch.Tensor) else (
        static_int(weight.shape[0]) if weight.dim() > 0 else 0)
    if _ops._FAST is not None and not _ops._is_compiling():  # the decode fast path (ops.py): nothing to record
        out = _ops._FAST.relative_position_bias(weight, query_length, key_length, bidirectional, nb, max_distance,
                                                query_offset)
        if out is not None:
            return out
    proxy = _fx.proxy_in(weight, query_length, key_length, query_offset)
    if proxy is not None:  # torch.fx symbolic tracing: one node, which runs with real values
        return _fx.record_call(proxy, relative_position_bias, weight, query_length, key_length,
                               bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance,
                               query_offset=query_offset)
    with autograd_skipped(weight):
        return dispatch("relative_position_bias", weight, check_int("query_length", query_length),
                        check_int("key_length", key_length), bool(bidirectional), int(nb), int(max_distance),
                        _offset(query_offset))


def alibi_slopes(num_heads: int, *, device: Optional[Union[torch.device, str]] = None) -> torch.Tensor:
    """The ALiBi slopes of ``num_heads`` heads, float32 ``[num_heads]``.

    With ``c`` the largest power of two ``<= num_heads``: heads ``0 .. c-1`` get ``2^(-8k/c)`` for
    ``k = 1 .. c``; the remaining heads ``2^(-4k/c)`` for odd ``k = 1, 3, 5, ...`` (the paper's rule
    for head counts that are not powers of two; BLOOM's and MPT's slopes). Computed in float64, rounded once.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be an int >= 1, got {num_heads!r}")
    c = 1 << (num_heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * k / c) for k in range(1, c + 1)]
    slopes += [2.0 ** (-4.0 * k / c) for k in range(1, 2 * (num_heads - c), 2)]
    with untraced():  # a constant of a jit trace (it depends on num_heads only)
        return torch.tensor(slopes, dtype=torch.float64, device=device).to(torch.float32)


def alibi_bias(slopes: torch.Tensor, query_length: int, key_length: int, *, query_offset: Offset = 0,
               dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """ALiBi bias ``[1, heads, query_length, key_length]``:
    ``bias[0, h, i, j] = slopes[h] * (j - (i + query_offset))``, the product formed in float64 and
    rounded once to the output dtype (float32 and float64 outputs: correctly rounded for float32 slopes
    and distances below 2^29; fp16/bf16: rounded to float32, then to the half type, as BLOOM's and
    MPT's float32 bias cast to half).

    Masking is the attention's job: under a causal mask the result equals BLOOM's and MPT's biases
    up to a constant per query row, which softmax ignores.

    Args:
        slopes: ``[heads]`` floating point, e.g. :func:`alibi_slopes`.
        query_offset: the position of the first query (decoding with a cache).
        dtype: output dtype (default: the slopes' dtype).

    Differentiable with respect to ``slopes``.
    """
    if _ops._FAST is not None and not _ops._is_compiling():
        out = _ops._FAST.alibi_bias(slopes, query_length, key_length, query_offset, dtype)
        if out is not None:
            return out
    proxy = _fx.proxy_in(slopes, query_length, key_length, query_offset)
    if proxy is not None:  # torch.fx symbolic tracing: one node, which runs with real values
        return _fx.record_call(proxy, alibi_bias, slopes, query_length, key_length, query_offset=query_offset,
                               dtype=dtype)
    with autograd_skipped(slopes):
        return dispatch("alibi_bias", slopes, check_int("query_length", query_length),
                        check_int("key_length", key_length), _offset(query_offset), dtype)


# --------------------------------------------------------------------------------------------
# Fake kernels: shapes, dtypes and the cheap checks of the C++ ops, for torch.compile and export.


@torch.library.register_fake("posenc::t5_relative_position_bucket")
def _bucket_fake(*args):
    rp = bind("t5_relative_position_bucket", args).relative_position
    torch._check(rp.dtype in (torch.int32, torch.int64), lambda: "posenc.t5_relative_position_bucket: "
                 f"relative_position must be int32 or int64, got {rp.dtype}")
    return torch.empty(rp.shape, dtype=torch.int64, device=rp.device)


@torch.library.register_fake("posenc::relative_position_bias")
def _relative_position_bias_fake(*args):
    a = bind("relative_position_bias", args)
    weight = a.weight
    torch._check(weight.dim() == 2, lambda: "posenc.relative_position_bias: weight must be [num_buckets, heads], "
                 f"got {weight.dim()}-D")
    torch._check(weight.shape[0] == a.num_buckets, lambda: "posenc.relative_position_bias: weight must be "
                 f"[num_buckets = {a.num_buckets}, heads], got shape {tuple(weight.shape)}")
    return weight.new_empty((1, weight.shape[1], a.query_length, a.key_length))


@torch.library.register_fake("posenc::relative_position_bias_backward")
def _relative_position_bias_backward_fake(*args):
    a = bind("relative_position_bias_backward", args)
    torch._check(a.grad.dim() == 4,
                 lambda: f"posenc.relative_position_bias_backward: grad must be 4-D, got {a.grad.dim()}-D")
    return a.grad.new_empty((a.num_buckets, a.grad.shape[1]))


@torch.library.register_fake("posenc::alibi_bias")
def _alibi_bias_fake(*args):
    a = bind("alibi_bias", args)
    slopes = a.slopes
    torch._check(slopes.dim() == 1, lambda: f"posenc.alibi_bias: slopes must be 1-D [heads], got {slopes.dim()}-D")
    return slopes.new_empty((1, slopes.shape[0], a.query_length, a.key_length), dtype=a.dtype or slopes.dtype)


@torch.library.register_fake("posenc::alibi_bias_backward")
def _alibi_bias_backward_fake(*args):
    grad = bind("alibi_bias_backward", args).grad
    torch._check(grad.dim() == 4, lambda: f"posenc.alibi_bias_backward: grad must be 4-D, got {grad.dim()}-D")
    return grad.new_empty((grad.shape[1],), dtype=torch.float64)  # the float64 sums, rounded by the autograd


# --------------------------------------------------------------------------------------------
# Autograd. Both biases are linear in their parameter; each backward op is the adjoint of its
# forward, so the backward of a backward is the forward again (double backward works). The
# adjoint pairs share their argument names (csrc/registration.h); call() passes them on by name.


def _bias_setup(ctx, inputs, output):
    ctx.args = bind("relative_position_bias", inputs)._replace(weight=None)


def _bias_backward(ctx, grad):
    gw = call("relative_position_bias_backward", ctx.args, grad=grad)
    return input_grads(ctx.args, weight=gw)


def _bias_backward_setup(ctx, inputs, output):
    a = bind("relative_position_bias_backward", inputs)
    ctx.args = a._replace(grad=None)
    ctx.forward_sizes = {"query_length": a.grad.shape[2], "key_length": a.grad.shape[3]}


def _bias_backward_backward(ctx, grad_weight):
    gg = call("relative_position_bias", ctx.args, weight=grad_weight.contiguous(), **ctx.forward_sizes)
    return input_grads(ctx.args, grad=gg)


def _alibi_setup(ctx, inputs, output):
    a = bind("alibi_bias", inputs)
    ctx.args = a._replace(slopes=None)
    ctx.slopes_dtype = a.slopes.dtype


def _alibi_backward(ctx, grad):
    gs = call("alibi_bias_backward", ctx.args, grad=grad)
    return input_grads(ctx.args, slopes=gs.to(ctx.slopes_dtype))


def _alibi_backward_setup(ctx, inputs, output):
    a = bind("alibi_bias_backward", inputs)
    ctx.args = a._replace(grad=None)
    ctx.forward_args = {"query_length": a.grad.shape[2], "key_length": a.grad.shape[3], "dtype": a.grad.dtype}


def _alibi_backward_backward(ctx, grad_slopes):
    gg = call("alibi_bias", ctx.args, slopes=grad_slopes, **ctx.forward_args)
    return input_grads(ctx.args, grad=gg)


register_autograd("relative_position_bias", _bias_backward, _bias_setup,
                  linear_jvp("relative_position_bias", "weight"))  # a gather
register_autograd("relative_position_bias_backward", _bias_backward_backward, _bias_backward_setup,
                  linear_jvp("relative_position_bias_backward", "grad"))
register_autograd("alibi_bias", _alibi_backward, _alibi_setup, linear_jvp("alibi_bias", "slopes"))
register_autograd("alibi_bias_backward", _alibi_backward_backward, _alibi_backward_setup,
                  linear_jvp("alibi_bias_backward", "grad"))
