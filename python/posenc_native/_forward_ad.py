"""Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad.make_dual``) for the ops.

The ops have no forward-mode formula of their own, and torch drops a custom op's tangents
silently (the output simply has none), so every public entry (ops.py, bias.py) handles them
before calling its op: each op is linear (add_sinusoidal affine) in its differentiable inputs,
so a tangent goes through the op itself; tangents on the other inputs (positions, frequencies,
cos/sin tables) raise NotImplementedError.
"""
from __future__ import annotations

import torch
from torch.autograd.forward_ad import make_dual, unpack_dual
import torch.autograd.forward_ad as _fwad

__all__ = ["tangents", "refuse_tangents", "through_linear", "make_dual"]


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


def through_linear(run, dual):
    """``run``'s result for an op linear in the tensors ``tangents`` unpacked into ``dual``: run on
    the primals, run again on the tangents (zeros where a tensor has none; None stays None), each
    output paired with its tangent. ``run`` returns a tensor or a tuple (whose None entries stay)."""
    primals, tans = dual
    out = run(*primals)
    tan = run(*[p if p is None else (torch.zeros_like(p) if t is None else t) for p, t in zip(primals, tans)])
    if isinstance(out, tuple):
        return tuple(None if o is None else make_dual(o, t) for o, t in zip(out, tan))
    return make_dual(out, tan)
