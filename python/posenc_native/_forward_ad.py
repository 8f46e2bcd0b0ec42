"""Forward-mode AD (``torch.func.jvp``, ``jacfwd``, ``hessian``, ``torch.autograd.forward_ad``) of the ops.

torch drops a custom op's tangents silently (the output simply has none), so while a dual level or
a differentiating torch.func transform is active the ops run through an autograd.Function
(``_functorch.dispatch``) whose ``jvp`` is the op's formula here, registered with its backward
(``_functorch.register_autograd``). Every op is linear in its differentiable inputs (add_sinusoidal
affine): a tangent goes through the op itself. Tangents on the other inputs (positions,
frequencies, cos/sin tables) raise NotImplementedError.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.autograd.forward_ad import unpack_dual
import torch.autograd.forward_ad as _fwad

from ._op_args import call, op_args, saved_args

__all__ = ["dual_level_active", "tangents", "refuse_tangents", "linear_jvp", "scale_jvp"]


def dual_level_active() -> bool:
    """Whether a ``torch.autograd.forward_ad.dual_level`` is open (one global read)."""
    return getattr(_fwad, "_current_level", -1) >= 0


def tangents(*tensors) -> Optional[list]:
    """The tangents of ``tensors`` when one of them carries one, else None (outside a dual level: no
    tensor can)."""
    if not dual_level_active():
        return None
    got = [unpack_dual(t).tangent if isinstance(t, torch.Tensor) else None for t in tensors]
    return None if all(t is None for t in got) else got


def refuse_tangents(op: str, **named: Optional[torch.Tensor]) -> None:
    """NotImplementedError naming the inputs in ``named`` (name -> its tangent, or the tensor itself
    with ``tangents``) that carry a tangent the op is not linear in."""
    names = ", ".join(n for n, t in named.items() if t is not None)
    if names:
        raise NotImplementedError(f"{op}: forward-mode AD with respect to {names} is not supported "
                                  "(only with respect to the rotated or added tensors)")


def _split(name: str, linear: tuple, tangents_in: tuple) -> dict:
    """The tangents of op ``name``'s ``linear`` arguments by name; a tangent on any other is refused."""
    given = dict(zip(op_args(name)._fields, tangents_in))
    refuse_tangents(f"posenc.{name}", **{f: t for f, t in given.items() if f not in linear})
    return {f: given[f] for f in linear}


def linear_jvp(name: str, *linear: str, zeros: Optional[Callable[[Any, str], torch.Tensor]] = None) -> Callable:
    """The jvp of op ``name``, linear in its arguments ``linear``: the op on their tangents, its other
    arguments as saved by its ``setup_context`` (``ctx.args``, or ``save_args``). ``zeros(ctx, f)``
    stands in for a linear argument without a tangent (needed where there are several)."""
    def jvp(ctx, *tangents_in):
        t = _split(name, linear, tangents_in)
        if not linear:  # (an op differentiable in nothing: any tangent was refused)
            return None
        for f in linear:
            if t[f] is None:
                t[f] = zeros(ctx, f)
        return call(name, saved_args(ctx) if hasattr(ctx, "saved_names") else ctx.args, **t)
    return jvp


def scale_jvp(name: str, linear: str, scale_field: str) -> Callable:
    """The jvp of op ``name``, affine in ``linear`` with the factor in argument ``scale_field``."""
    def jvp(ctx, *tangents_in):
        t = _split(name, (linear,), tangents_in)[linear]
        return t * getattr(ctx.args, scale_field)
    return jvp
