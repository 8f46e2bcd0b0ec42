"""T5's relative position bias from posenc's kernel, in a loaded transformers T5 / mT5 / UMT5 model.

    from posenc_native.integrations.transformers import patch, unpatch   # delegates here for t5/mt5/umt5
    patch(model)      # every attention that owns a relative_attention_bias computes it with one kernel
    unpatch(model)    # the model's own compute_bias again

transformers' ``T5Attention.compute_bias`` (and mT5's, UMT5's: the same code) builds the bias in
several passes (the bucket of every (query, key) pair, an embedding gather, a permute). The patch
gives each attention module that has a ``relative_attention_bias`` an instance attribute
``compute_bias`` that shadows the class method and returns
:func:`posenc_native.relative_position_bias` (same values, same dtype; a contiguous tensor;
differentiable with respect to the embedding weight). Nothing else changes: the forward passes, the
caches and the parameters are the model's own, so :func:`unpatch` (deleting the instance
attributes) restores the model bit for bit. At patch time (``check=True``) the kernel's bias is
compared with the model's own for a prefill and a decoding shape of each patched module; any
difference refuses the patch before anything changes (transformers' float32 bucket and the
kernel's exact one can differ for unusual ``(num_buckets, max_distance)`` pairs; see
csrc/core/relative_bias.h).

Under torch.jit.trace the model's own ``compute_bias`` runs, so that a trace follows new lengths.

Limits: ``past_seen_tokens`` given as a tensor (static caches) is read on the host, which a
``torch.compile`` graph breaks on. A deep copy of a patched model is patched too (and unpatched on
its own); pickling a patched model is not supported (unpatch first).
"""
from __future__ import annotations

import types
from typing import Optional

import torch
from torch import nn

from .._contexts import tracing
from ..bias import relative_position_bias

__all__ = ["MODEL_TYPES", "patch", "unpatch", "is_patched", "patched_modules"]

MODEL_TYPES = ("t5", "mt5", "umt5")
_RECORD_ATTR = "_posenc_t5_patch"
_METHOD = "compute_bias"


def _kernel_compute_bias(self: nn.Module, query_length: int, key_length: int, device=None,
                         past_seen_tokens=0) -> torch.Tensor:
    """transformers' ``compute_bias`` signature, computed by posenc's relative_position_bias kernel.
    Under torch.jit.trace the model's own compute_bias (the same values, checked at patch time):
    its torch ops record the lengths as data flow, which an op's int arguments cannot be, so the
    trace follows new lengths as the unpatched model's does."""
    if tracing():
        return type(self).compute_bias(self, query_length, key_length, device=device,
                                       past_seen_tokens=past_seen_tokens)
    bias = relative_position_bias(self.relative_attention_bias.weight, query_length, key_length,
                                  bidirectional=not self.is_decoder, num_buckets=self.relative_attention_num_buckets,
                                  max_distance=self.relative_attention_max_distance, query_offset=past_seen_tokens)
    return bias if device is None else bias.to(device)


def _bias_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Attention modules of T5's design that own a relative position bias."""
    found = []
    for name, m in model.named_modules():
        if (getattr(m, "has_relative_attention_bias", False) and isinstance(getattr(m, "relative_attention_bias", None),
                                                                           nn.Embedding)
                and callable(getattr(type(m), _METHOD, None)) and hasattr(m, "relative_attention_num_buckets")
                and hasattr(m, "relative_attention_max_distance") and hasattr(m, "is_decoder")):
            found.append((name, m))
    return found


def _check_module(name: str, module: nn.Module) -> None:
    original = getattr(type(module), _METHOD)
    weight = module.relative_attention_bias.weight
    d = module.relative_attention_max_distance
    n = min(2 * d + 5, 8192)  # every distance below max_distance (where buckets differ), both signs
    with torch.no_grad():
        for query_length, key_length, offset in ((7, n, 0), (1, n, n - 1), (5, 9, 3)):
            theirs = original(module, query_length, key_length, device=weight.device, past_seen_tokens=offset)
            ours = _kernel_compute_bias(module, query_length, key_length, device=weight.device,
                                        past_seen_tokens=offset)
            if ours.shape != theirs.shape or ours.dtype != theirs.dtype or not torch.equal(ours, theirs):
                raise ValueError(
                    f"posenc_native.integrations.t5: the kernel's relative position bias differs from {name}'s own "
                    f"compute_bias (num_buckets {module.relative_attention_num_buckets}, max_distance {d}, "
                    f"query_length {query_length}, key_length {key_length}, past_seen_tokens {offset}); not patching. "
                    "Pass check=False to patch anyway.")


def patch(model: nn.Module, *, check: bool = True) -> nn.Module:
    """Compute the relative position bias of every T5-style attention of ``model`` with posenc's
    kernel. Idempotent; undo with :func:`unpatch`. Raises ``ValueError`` when the model has no such
    attention, or (``check``) when the kernel disagrees with the model's own bias."""
    if is_patched(model):
        return model
    modules = _bias_modules(model)
    if not modules:
        raise ValueError(f"posenc_native.integrations.t5: {type(model).__name__} has no attention module with a "
                         "relative_attention_bias and compute_bias (T5, mT5, UMT5)")
    for name, m in modules:
        if _METHOD in m.__dict__:
            raise ValueError(f"posenc_native.integrations.t5: {name or '<model>'}.compute_bias is already replaced "
                             "on the instance; not patching over it")
        if check:
            _check_module(name or "<model>", m)
    for _, m in modules:
        m.__dict__[_METHOD] = types.MethodType(_kernel_compute_bias, m)
    model.__dict__[_RECORD_ATTR] = [name for name, _ in modules]
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Restore every patched attention's own ``compute_bias``. Raises ``ValueError`` if the model is not patched."""
    names: Optional[list[str]] = getattr(model, "__dict__", {}).get(_RECORD_ATTR)
    if names is None:
        raise ValueError(f"posenc_native.integrations.t5.unpatch: this {type(model).__name__} is not patched by posenc")
    for name in names:
        m = model.get_submodule(name)
        bound = m.__dict__.get(_METHOD)
        if isinstance(bound, types.MethodType) and bound.__func__ is _kernel_compute_bias:
            del m.__dict__[_METHOD]
    del model.__dict__[_RECORD_ATTR]
    return model


def is_patched(model: nn.Module) -> bool:
    """Whether :func:`patch` was applied to ``model`` (and not undone)."""
    return _RECORD_ATTR in getattr(model, "__dict__", {})


def patched_modules(model: nn.Module) -> list[str]:
    """Names of the attention modules whose bias comes from the kernel (empty when not patched)."""
    return list(getattr(model, "__dict__", {}).get(_RECORD_ATTR) or [])
