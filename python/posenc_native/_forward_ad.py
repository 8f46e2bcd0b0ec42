"""Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad.make_dual``) for the ops.

The ops have no forward-mode formula of their own, and torch drops a custom op's tangents
silently (the output simply has none), so every public entry (ops.py, bias.py) handles them
before calling its op: each op is linear (add_sinusoidal affine) in its differentiable inputs,
so a tangent goes through the op itself; tangents on the other inputs (positions, frequencies,
cos/sin tables) raise NotImplementedError.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.forward_ad import make_dual, unpack_dual
import torch.autograd.forward_ad as _fwad

__all__ = ["tangents", "refuse_tangents", "tangent_or_zeros", "make_dual"]


def tangents(*tensors):
    """``(primals, tangents)`` of ``tensors`` when one of them carries a tangent, else None (one
    global read when no dual level is active, as outside forward-mode AD)."""
    if getattr(_fwad, "_current_level", -1) < 0:
        return None
    unpacked = [unpack_dual(t) if isinstance(t, torch.Tensor) else (t, None) for t in tensors]
    if all(u[1] is None for u in unpacked):
        return None
    return [u[0] for u in unpacked], [u[1] for u in unpacked]


def refuse_tangents(op: str, **named_tensors) -> None:
    """NotImplementedError naming the inputs that carry tangents an op is not linear in."""
    got = tangents(*named_tensors.values())
    if got is not None:
        names = ", ".join(n for n, t in zip(named_tensors, got[1]) if t is not None)
        raise NotImplementedError(f"{op}: forward-mode AD with respect to {names} is not supported "
                                  "(only with respect to the rotated or added tensors)")


def tangent_or_zeros(tangent: Optional[torch.Tensor], primal: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(primal) if tangent is None else tangent
