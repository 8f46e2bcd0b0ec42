"""Swap the rotary path of a loaded Hugging Face ``transformers`` model for posenc's fused kernels.

    from posenc_native.integrations.transformers import check, patch, unpatch
    model = AutoModelForCausalLM.from_pretrained(...)
    print(check(model))   # None when patch(model) would succeed, else the reason
    patch(model)          # same outputs, no cos/sin tensors, q and k rotated in one fused kernel
    unpatch(model)        # the model's own rotary path again, bit for bit

Any family whose model-level ``*RotaryEmbedding`` computes ``(cos, sin)`` (or one complex
``freqs_cis``: Llama 4, DeepSeek V2) and whose attention calls an ``apply_rotary_pos_emb``-like
function (or ``apply_rotary_emb(xq, xk, freqs_cis)``) is reached generically; :mod:`.detect` proves equality
before anything is swapped (frequencies and attention factor from :meth:`RopeConfig.from_hf`
against the model's own module, then a probe of the rotation functions) and refuses with
:class:`UnsupportedModelError` naming the reason otherwise. The few families that differ have one
entry each in :mod:`.families`. :func:`supported_model_types` lists the families verified end to
end (logits and greedy generation of tiny random models) by ``tests/test_transformers_coverage.py``;
``docs/transformers_coverage.md`` has the table with the reasons for the others.

Limits: dynamic NTK reads ``max(position_ids)`` on the host, as transformers does (LongRoPE
chooses its factors on the device); code outside the model that calls a patched rotary module
itself gets a :class:`RotaryPositions` (its :meth:`~RotaryPositions.cos_sin` builds the tensors);
a patched model dropped without :func:`unpatch` leaves the module-level wrappers installed
(harmless: they hand tensors to the original functions).
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Iterator, Optional

import torch
from torch import nn

from . import verified
from .families import DELEGATES, FAMILIES, GENERIC
from .record import RECORD_ATTR, PatchRecord
from .runtime import _ERR, PosencRotaryEmbedding, RotaryPositions, UnsupportedModelError

__all__ = [
    "patch",
    "unpatch",
    "patched",
    "is_patched",
    "check",
    "describe",
    "supported_model_types",
    "RotaryPositions",
    "PosencRotaryEmbedding",
    "UnsupportedModelError",
]


def supported_model_types() -> tuple[str, ...]:
    """The ``config.model_type`` values verified end to end for transformers ``verified.TRANSFORMERS``
    (the coverage test). :func:`patch` accepts other models too when it can prove equality; ask
    :func:`check`."""
    return tuple(sorted(set(verified.MODEL_TYPES) | set(FAMILIES) | set(DELEGATES)))


def _model_type(model: nn.Module) -> str:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{_ERR}.patch expects a torch.nn.Module, got {type(model)}")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not model_type:
        raise UnsupportedModelError(f"{_ERR}: {type(model).__name__} has no config.model_type; patch expects a "
                                    "transformers PreTrainedModel")
    return model_type


def _already_patched_inside(model: nn.Module) -> Optional[str]:
    for name, m in model.named_modules():
        if name and getattr(m, RECORD_ATTR, None) is not None:
            return name
        if isinstance(m, PosencRotaryEmbedding):
            return name or "<model>"
    return None


def _delegate(model_type: str):
    name = DELEGATES.get(model_type)
    return None if name is None else importlib.import_module(name)


def _prepare(model: nn.Module, check: bool) -> PatchRecord:
    model_type = _model_type(model)
    inside = _already_patched_inside(model)
    if inside is not None:
        raise ValueError(f"{_ERR}: part of this model ({inside}) is already patched; unpatch it there first")
    record = PatchRecord(model_type)
    FAMILIES.get(model_type, GENERIC).patch(model, record, check)
    return record


def _inner(model: nn.Module) -> nn.Module:
    """The model a ``torch.compile(model)`` wrapper holds (the patch and its record live there, so that
    the wrapper and the model itself agree on whether it is patched), else ``model``."""
    while isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        model = model._orig_mod
    return model


def check(model: nn.Module) -> Optional[str]:
    """Why :func:`patch` would refuse ``model`` (``None`` when it would patch it). Changes nothing.

    Runs the same detection and proofs as :func:`patch`; ``describe(model)`` says what it would swap.
    """
    model = _inner(model)
    if is_patched(model):
        return None
    delegate = _delegate(_model_type(model))
    if delegate is not None:
        return getattr(delegate, "check", lambda m: None)(model)
    try:
        _prepare(model, True)
    except (UnsupportedModelError, ValueError) as e:
        return str(e)
    return None


def describe(model: nn.Module) -> str:
    """What :func:`patch` swaps (or swapped) in ``model``: rotary modules, rotation functions, pairing,
    what it leaves alone and why. Raises like :func:`patch` when it would refuse."""
    model = _inner(model)
    record = getattr(model, "__dict__", {}).get(RECORD_ATTR)
    return record.notes if record is not None else _prepare(model, True).notes


def patch(model: nn.Module, *, check: bool = True) -> nn.Module:
    """Route the rotary embedding of a transformers ``model`` through posenc's fused kernels.

    Raises :class:`UnsupportedModelError` (a ``NotImplementedError`` and ``ValueError``) naming the
    reason when equality with the model's own path cannot be proven, before anything changes.
    Patching a patched model returns it unchanged. With ``check`` (default) the frequencies and
    attention factor from :meth:`RopeConfig.from_hf` are compared with the ones the model's own
    rotary code computed, and a disagreement raises ``ValueError``.

    Returns ``model``, patched in place (a ``torch.compile`` wrapper: the model it holds). Undo with
    :func:`unpatch`.
    """
    given, model = model, _inner(model)
    model_type = _model_type(model)
    if getattr(model, RECORD_ATTR, None) is not None:
        return given  # idempotent
    delegate = _delegate(model_type)
    if delegate is not None:
        delegate.patch(model, check=check)
        return given
    record = _prepare(model, check)
    try:
        record.apply(model)
    except BaseException:
        record.restore(model)
        raise
    model.__dict__[RECORD_ATTR] = record
    return given


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the model's own rotary path (exactly the modules and functions :func:`patch` replaced).

    Raises ``ValueError`` if the model is not patched.
    """
    given, model = model, _inner(model)
    delegate = _delegate(getattr(getattr(model, "config", None), "model_type", None) or "")
    if delegate is not None:
        delegate.unpatch(model)
        return given
    record = getattr(model, "__dict__", {}).get(RECORD_ATTR)
    if record is None:
        raise ValueError(f"{_ERR}.unpatch: this {type(model).__name__} is not patched by posenc")
    del model.__dict__[RECORD_ATTR]
    record.restore(model)
    return given


def is_patched(model: nn.Module) -> bool:
    """Whether :func:`patch` was applied to ``model`` (and not undone)."""
    model = _inner(model)
    delegate = _delegate(getattr(getattr(model, "config", None), "model_type", None) or "")
    if delegate is not None and hasattr(delegate, "is_patched"):
        return delegate.is_patched(model)
    return getattr(model, "__dict__", {}).get(RECORD_ATTR) is not None


@contextlib.contextmanager
def patched(model: nn.Module, *, check: bool = True) -> Iterator[nn.Module]:
    """``with patched(model): ...`` runs the block with posenc's rotary path, then restores the model's own."""
    was = is_patched(model)
    patch(model, check=check)
    try:
        yield model
    finally:
        if not was:
            unpatch(model)
