"""Argument checks of the public functions: a TypeError/ValueError naming the argument, before
anything reaches the ops. SymInt/SymFloat (torch.compile) pass through untouched, so no guard or
recompile is added; an int that torch.jit.trace hands over as a 0-dim tensor becomes the int it holds,
with a warning that the trace keeps it (``_contexts.traced_int``)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ._contexts import is_traced_int, traced_int


def check_int(name: str, value, *, optional: bool = False):
    if type(value) is int:  # the common case first: these run on every call
        return value
    if (value is None and optional) or torch.compiler.is_compiling():
        return value  # traced ints are SymInts: __index__ would specialize them
    if is_traced_int(value):
        return traced_int(name, value)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value.__index__()


def check_float(name: str, value) -> float:
    if type(value) is float:
        return value
    if isinstance(value, (torch.SymFloat, torch.SymInt)) or torch.compiler.is_compiling():
        return value
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_bool(name: str, value) -> bool:
    if value is True or value is False:
        return value
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")  # (numpy 2, 1)
    if isinstance(value, bool) or numpy_bool or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_tensor(name: str, value, *, optional: bool = False, dims: Optional[Sequence[int]] = None,
                 shape_text: str = "") -> Optional[torch.Tensor]:
    if value is None and optional:
        return None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}, got {type(value).__name__}")
    if dims is not None and value.dim() not in dims:
        raise ValueError(f"{name} must be {shape_text or ' or '.join(f'{d}-D' for d in dims)}, got shape "
                         f"{tuple(value.shape)}")
    return value
