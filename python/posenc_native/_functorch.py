"""The ops under torch.func transforms (``grad``, ``vjp``, ``jacrev``, ``jvp``, ``hessian``, ``vmap``)
and forward-mode AD.

torch's ``register_autograd`` gives a custom op an autograd kernel that torch.func cannot run:
its generated autograd.Function has no ``setup_context`` ("In order to use an autograd.Function
with functorch transforms ... it must override the setup_context staticmethod"; pytorch issues
168393, 170834), and no forward-mode formula (torch drops the tangents silently). So every op with
a backward is registered here (:func:`register_autograd`) with a ``jvp`` too (``_forward_ad``),
kept for :class:`_UnderTransform`, an autograd.Function with ``setup_context`` that runs the same
op and the same formulas; :func:`dispatch`, what the Python API calls, takes it while a
differentiating transform or a dual level is active (one C query and one global read otherwise).
The raw ``torch.ops.posenc.*`` still have torch's kernel: they fail under ``torch.func.grad`` and
drop tangents, as any such op does.

``vmap`` of the rotations (``posenc::rope``, ``rope_cos_sin``) has a rule (:func:`_rotation_vmap`):
without one torch runs the op once per vmapped slice (and warns of the performance drop). The
common case, q and k vmapped over (a model ensemble, per-sample gradients, ``jacfwd``) with the
positions, frequencies and cos/sin tables shared, folds the vmapped dimension into the op's batch
dimension (``bhsd``/``bshd``: ``[V, B, ...]`` -> ``[V * B, ...]``, per-row positions and tables
repeated per batch row) and calls the op once: each row is rotated exactly as in its own call. When
only one of q and k is vmapped (the other captured), the other is rotated once, in a call of its
own, and returned unbatched instead of copied to every slice. Anything else (vmapped positions,
frequencies or tables, the packed ``thd`` layout) is run slice by slice, as torch's fallback would.
The biases (and their backwards) fold a vmapped weight or slopes into their heads (:func:`_bias_vmap`),
and the sinusoidal ops the vmapped dim into their rows (:func:`_add_sinusoidal_vmap`, :func:`_table_vmap`).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, NamedTuple, Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from ._contexts import functorch_transforms_active
from ._library import load_library

load_library()


def _front(t: torch.Tensor, dim, size: int) -> torch.Tensor:
    """``t`` with the vmapped dimension first (expanded when ``t`` is not vmapped)."""
    return t.unsqueeze(0).expand(size, *t.shape) if dim is None else t.movedim(dim, 0)


def _slice(t, dim, i: int):
    return t if t is None or dim is None else t.select(dim, i)


def _no_heads(t: torch.Tensor, layout: str) -> torch.Tensor:
    """An empty partner for the op: ``t``'s shape with 0 heads."""
    shape = list(t.shape)
    shape[2 if layout == "bshd" else 1] = 0
    return t.new_empty(shape)


# Per rotation op: its arguments indexed by the batch row (argument index -> that dimension, from
# the end; an argument with fewer dims is shared by every row), the arguments that must be absent
# to fold (rope's cu_seqlens), and where its layout is.
_ROTATIONS = {"rope": ({2: -2}, (3,), 7), "rope_cos_sin": ({2: -3, 3: -3, 4: -2}, (), 5)}


def _batch_rows(t, dim: int):
    """How many batch rows ``t`` holds (its size at ``dim``), or None when it has no such dim."""
    return None if t is None or t.dim() < -dim else t.shape[dim]


def _rotation_vmap(name: str):
    """The vmap rule of rotation op ``name`` (see the module docstring)."""
    op = getattr(torch.ops.posenc, name).default
    batch_indexed, absent, layout_at = _ROTATIONS[name]

    def rule(info, in_dims, q, k, *rest):
        q_dim, k_dim = in_dims[:2]
        size = info.batch_size
        q_all, k_all = _front(q, q_dim, size), _front(k, k_dim, size)
        layout = rest[layout_at - 2]
        batch = q_all.shape[1]
        foldable = (all(d is None for d in in_dims[2:]) and all(rest[i - 2] is None for i in absent)
                    and layout in ("bshd", "bhsd") and k_all.shape[1] == batch
                    and all(_batch_rows(rest[i - 2], d) in (None, 1, batch) for i, d in batch_indexed.items()))
        if not foldable:  # each slice alone, as torch's fallback would
            outs = [op(q_all[i], k_all[i], *[_slice(a, d, i) for a, d in zip(rest, in_dims[2:])]) for i in range(size)]
            return (torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])), (0, 0)
        folded_rest = list(rest)
        for i, d in batch_indexed.items():  # rows of the folded batch v * batch + b read row b
            t = rest[i - 2]
            if _batch_rows(t, d) not in (None, 1):
                reps = [1] * t.dim()
                reps[t.dim() + d] = size
                folded_rest[i - 2] = t.repeat(*reps)

        def folded(t_all: torch.Tensor) -> torch.Tensor:
            return t_all.reshape(size * batch, *t_all.shape[2:])

        def alone(t: torch.Tensor, is_q: bool, args) -> torch.Tensor:
            """q or k rotated by itself, its partner empty (an empty one needs no call)."""
            if t.numel() == 0:
                return t.new_empty(t.shape)
            empty = _no_heads(t, layout)
            return op(t, empty, *args)[0] if is_q else op(empty, t, *args)[1]

        if q_dim is None or k_dim is None:
            # one of them the same in every slice (captured, say; or q alone's empty k): rotated once
            # and returned unbatched; the other folded
            out_q = alone(q, True, rest) if q_dim is None else \
                alone(folded(q_all), True, folded_rest).view(q_all.shape)
            out_k = alone(k, False, rest) if k_dim is None else \
                alone(folded(k_all), False, folded_rest).view(k_all.shape)
            return (out_q, out_k), (None if q_dim is None else 0, None if k_dim is None else 0)
        out_q, out_k = op(folded(q_all), folded(k_all), *folded_rest)
        return (out_q.view(q_all.shape), out_k.view(k_all.shape)), (0, 0)

    return rule


for _name in _ROTATIONS:
    torch.library.register_vmap(f"posenc::{_name}", _rotation_vmap(_name))


# The biases and their backwards compute each head on its own, from its own weight column (T5) or
# slope (ALiBi): a vmapped parameter (per-sample gradients, jacfwd) folds into the heads, one call.
def _bias_vmap(info, in_dims, t, *rest, op, heads_of, split):
    """``t`` (the op's one tensor) with the vmapped dim folded into its heads (``heads_of``: [V, ...]
    -> the op's input), the result split back per slice (``split``)."""
    t = _front(t, in_dims[0], info.batch_size)
    return split(op(heads_of(t), *rest), info.batch_size), 0


def _register_bias_vmaps() -> None:
    ops = torch.ops.posenc
    folded_grad = lambda g: g.reshape(1, -1, *g.shape[3:])  # noqa: E731  [V, 1, H, q, k] -> [1, V*H, q, k]
    bias_per_slice = lambda out, v: out.view(v, 1, -1, *out.shape[2:])  # noqa: E731  [1, V*H, q, k] -> [V, 1, H, q, k]
    rules = {
        "relative_position_bias": (lambda w: w.transpose(0, 1).reshape(w.shape[1], -1), bias_per_slice),
        "relative_position_bias_backward": (folded_grad, lambda out, v: out.view(out.shape[0], v, -1).transpose(0, 1)),
        "alibi_bias": (lambda s: s.reshape(-1), bias_per_slice),
        "alibi_bias_backward": (folded_grad, lambda out, v: out.view(v, -1)),
    }
    for name, (heads_of, split) in rules.items():
        torch.library.register_vmap(f"posenc::{name}", functools.partial(
            _bias_vmap, op=getattr(ops, name).default, heads_of=heads_of, split=split))


_register_bias_vmaps()


# The sinusoidal ops encode each row from its own position alone: the vmapped dim folds into their rows.
def _table_vmap(info, in_dims, positions, *rest):
    """sinusoidal_table: vmapped positions [V, N] are one table of V * N rows."""
    positions = _front(positions, in_dims[0], info.batch_size)
    table = torch.ops.posenc.sinusoidal_table.default(positions.reshape(-1), *rest)
    return table.view(*positions.shape, table.shape[-1]), 0


def _add_sinusoidal_vmap(info, in_dims, x, positions, *rest):
    """add_sinusoidal: x [V, (B,) S, D] folded into a batch of V * B rows, the positions with it
    (shared ones as they are, per-row or vmapped ones expanded to [V * B, S])."""
    size, (x_dim, pos_dim) = info.batch_size, in_dims[:2]
    x_all = _front(x, x_dim, size)
    rows = x_all.shape[1] if x_all.dim() == 4 else 1  # B per slice
    folded_x = x_all.reshape(size * rows, *x_all.shape[-2:])
    if positions is not None and (pos_dim is not None or (positions.dim() == 2 and positions.shape[0] > 1)):
        pos_all = _front(positions, pos_dim, size)  # [V, S], [V, 1, S] or [V, B, S]
        seq = pos_all.shape[-1]
        positions = pos_all.reshape(size, -1, seq).expand(size, rows, seq).reshape(size * rows, seq)
    out = torch.ops.posenc.add_sinusoidal.default(folded_x, positions, *rest)
    return out.view(x_all.shape), 0


torch.library.register_vmap("posenc::sinusoidal_table", _table_vmap)
torch.library.register_vmap("posenc::add_sinusoidal", _add_sinusoidal_vmap)


def _rope_in_place_check_vmap(info, in_dims, q, k, inv_freq):
    """The in-place rotation's memory check on the tensors vmap stacks, whole: an element shared
    across slices counts too (torch's per-slice fallback compared slice i of q with slice i of k
    only, and lost compiled code's symbolic shapes)."""
    return torch.ops.posenc.rope_in_place_check(q, k, inv_freq), in_dims[2]


torch.library.register_vmap("posenc::rope_in_place_check", _rope_in_place_check_vmap)


def plain(t: torch.Tensor) -> torch.Tensor:
    """The tensor under ``t``'s functorch wrappers (every vmapped slice of it together) and functional wrapper."""
    while True:
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            t = torch._C._functorch.get_unwrapped(t)
        elif torch._is_functional_tensor(t):
            t = torch._from_functional_tensor(t)
        else:
            return t


def check_copyable(op: str, **pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Refuses, before the first copy, a result that cannot be copied back: a name's ``(destination,
    result)`` where the result is wrapped by a transform the destination is not (a captured k whose
    rotation varies over a vmapped dimension of the positions; a captured tensor under grad)."""
    level = torch._C._functorch.maybe_get_level
    for name, (dst, result) in pairs.items():
        if level(result) > level(dst):
            raise RuntimeError(f"{op}: {name} is not an input of the torch.func transform (nor computed from one), but its "
                               "rotation would be one of the transform's values (vmapped positions, or inside grad): "
                               "it cannot be written in place there; use apply_rope")


class Formula(NamedTuple):
    setup_context: Callable  # (ctx, inputs, output), as torch.library.register_autograd takes it
    backward: Callable  # (ctx, *grads) -> one gradient per op argument
    jvp: Callable  # (ctx, *tangents: one per op argument, None where none) -> the outputs' tangents


_FORMULAS: dict[str, Formula] = {}  # op name -> its formulas


def register_autograd(name: str, backward: Callable, setup_context: Callable, jvp: Callable) -> None:
    """``torch.library.register_autograd`` for ``posenc::<name>``; the formulas, forward-mode's
    ``jvp`` too (``_forward_ad``), kept for :func:`dispatch`."""
    torch.library.register_autograd(f"posenc::{name}", backward, setup_context=setup_context)
    _FORMULAS[name] = Formula(setup_context, backward, jvp)


class _UnderTransform(torch.autograd.Function):
    """``posenc::<name>`` with its registered formulas, in the form torch.func and forward-mode AD
    run (vmap: each step vmapped, the op's own rule included)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(name, *args):
        return getattr(torch.ops.posenc, name)(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.formula = inputs[0]
        ctx.set_materialize_grads(False)  # None, not zeros, for the tangents that are not given: refused or not
        _FORMULAS[inputs[0]].setup_context(ctx, inputs[1:], output)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *_FORMULAS[ctx.formula].backward(ctx, *grads))

    @staticmethod
    def jvp(ctx, _name, *tangents):
        return _FORMULAS[ctx.formula].jvp(ctx, *tangents)


_is_compiling = torch.compiler.is_compiling


def transforms_active() -> bool:
    """Whether a torch.func transform is active in eager mode (under torch.compile the ops are traced)."""
    return bool(functorch_transforms_active()) and not _is_compiling()


_DIFFERENTIATING = (TransformType.Grad, TransformType.Jvp)


def grad_wanted(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd would record a call on ``tensors`` (None: an absent one): grad mode on and
    one requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


_NO_SKIP = contextlib.nullcontext()


def autograd_skipped(*inputs: Optional[torch.Tensor]):
    """Skips the ops' autograd kernel when no gradient can flow to the tensor ``inputs`` (eager mode
    only): that kernel is Python (:func:`register_autograd`) and costs several microseconds per call
    even when no input requires grad, which dominates a decode step (a bias at one query row: 10.5
    -> 6.6 us). Under torch.compile the kernel is traced away. An input that wants a gradient the op
    has no formula for (angles, float positions) keeps the kernel, which refuses it."""
    if (_is_compiling() or grad_wanted(*inputs) or torch.is_inference_mode_enabled()  # (no autograd key)
            or _fwad._current_level >= 0):  # (a tangent goes through the autograd key)
        return _NO_SKIP
    return torch._C._AutoDispatchBelowAutograd()


def dispatch(name: str, *args):
    """``torch.ops.posenc.<name>(*args)``; through :class:`_UnderTransform` when the op has formulas
    and, in eager mode, a forward-mode dual level is open (torch would drop the tangents) or a
    torch.func transform that differentiates is active (grad, vjp, jacrev, jvp, ...). Under vmap
    alone the op itself runs: the Function would cost far more than the call (a decode step: ~1 ms
    against 0.2 ms)."""
    if name in _FORMULAS and not _is_compiling() and (_fwad._current_level >= 0 or (
            functorch_transforms_active() and any(
                i.key() in _DIFFERENTIATING for i in retrieve_all_functorch_interpreters()))):
        return _UnderTransform.apply(name, *args)
    return getattr(torch.ops.posenc, name)(*args)
