"""The ops' arguments by name, read from their registered schemas.

csrc/registration.h declares each op's argument list once. The fake kernels and autograd formulas
(ops.py, bias.py) receive those arguments as a plain tuple; :func:`bind` names them after the
schema, so the Python side reads ``a.layout`` instead of unpacking a hand-written copy of the
list, and :func:`call` calls an op with its arguments taken by name. Adding an argument to an op
then needs Python changes only where the new argument is used.
"""
from __future__ import annotations

import collections
import functools
from typing import Any, NamedTuple

import torch

from ._functorch import dispatch


@functools.lru_cache(maxsize=None)
def op_args(name: str) -> type:
    """A namedtuple class of ``torch.ops.posenc.<name>``'s arguments: the schema's names, in its order,
    with the schema's trailing defaults (an argument appended to an op that had none, e.g.
    ``add_sinusoidal``'s ``offset=0``)."""
    arguments = getattr(torch.ops.posenc, name).default._schema.arguments
    defaults = []
    for a in reversed(arguments):
        if not a.has_default_value():
            break
        defaults.insert(0, a.default_value)
    return collections.namedtuple(f"{name}_args", [a.name for a in arguments], defaults=defaults)


def arg_index(name: str, field: str) -> int:
    """Where argument ``field`` of op ``name`` sits in its positional arguments."""
    return op_args(name)._fields.index(field)


def bind(name: str, args: tuple) -> NamedTuple:
    """The positional arguments of a call of op ``name`` (as a fake kernel or ``setup_context``
    gets them: positional, without the trailing defaults when the caller left them out), by name."""
    return op_args(name)(*args)


def call(name: str, source: Any = None, **given: Any) -> Any:
    """``torch.ops.posenc.<name>`` with each argument taken from ``given``, else from the field of
    the same name of ``source`` (the bound arguments of another op)."""
    return dispatch(name, *[given[f] if f in given else getattr(source, f) for f in op_args(name)._fields])


def input_grads(args: NamedTuple, **grads: Any) -> tuple:
    """A backward's result: one entry per argument of ``args``'s op, None except for ``grads``."""
    return tuple(grads.get(f) for f in args._fields)


def tensor_fields(args: NamedTuple, skip: tuple = ()) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor argument in ``args`` (absent optional tensors are None), except ``skip``."""
    return [(f, v) for f, v in zip(args._fields, args) if isinstance(v, torch.Tensor) and f not in skip]


def save_args(ctx: Any, args: NamedTuple) -> None:
    """Keeps bound arguments for backward and jvp: the tensors through ``ctx.save_for_backward`` and
    ``save_for_forward`` (so autograd catches a later in-place change of them), the rest on ctx.
    :func:`saved_args` reads them back."""
    tensors = tensor_fields(args)
    ctx.save_for_backward(*[t for _, t in tensors])
    ctx.save_for_forward(*[t for _, t in tensors])
    ctx.saved_names = [f for f, _ in tensors]
    ctx.args = args._replace(**dict.fromkeys(ctx.saved_names))


def saved_args(ctx: Any) -> NamedTuple:
    """The arguments :func:`save_args` kept."""
    return ctx.args._replace(**dict(zip(ctx.saved_names, ctx.saved_tensors)))
