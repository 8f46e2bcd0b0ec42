"""The ops under torch.func transforms (``grad``, ``vjp``, ``jacrev``, ``vmap``).

torch's ``register_autograd`` gives a custom op an autograd kernel that torch.func cannot run:
its generated autograd.Function has no ``setup_context`` ("In order to use an autograd.Function
with functorch transforms ... it must override the setup_context staticmethod"; pytorch issues
168393, 170834). So every op with a backward is registered here (:func:`register_autograd`), which
also keeps its formula for :class:`_UnderTransform`, an autograd.Function with ``setup_context``
that runs the same op and the same formula; :func:`dispatch`, what the Python API calls, takes it
while a transform is active (one C query otherwise). The raw ``torch.ops.posenc.*`` still have
torch's kernel, and fail under ``torch.func.grad`` as any such op does.

``vmap`` of ``posenc::rope`` has a rule (:func:`_rope_vmap`): without one torch runs the op once
per vmapped slice (and warns of the performance drop). The common case, q and k vmapped over (a
model ensemble, per-sample gradients) with the positions, cu_seqlens and frequencies shared, folds
the vmapped dimension into the op's batch dimension (``bhsd``/``bshd``: ``[V, B, ...]`` ->
``[V * B, ...]``, positions repeated per batch row) and calls the op once: each row is rotated
exactly as in its own call. When only one of q and k is vmapped (the other captured), the other is
rotated once, in a call of its own, and returned unbatched instead of copied to every slice.
Anything else (vmapped positions or frequencies, the packed ``thd`` layout) is run slice by slice,
as torch's fallback would.
"""
from __future__ import annotations

import torch
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


def _foldable(q_all: torch.Tensor, k_all: torch.Tensor, positions, layout: str, shared: bool) -> bool:
    if not shared or layout not in ("bhsd", "bshd") or k_all.shape[1] != q_all.shape[1]:
        return False
    # positions [S] or [..., 1, S] (every row alike) pass as they are; [..., B, S] are repeated per vmapped slice
    return positions is None or positions.dim() < 2 or positions.shape[-2] in (1, q_all.shape[1])


def _no_heads(t: torch.Tensor, layout: str) -> torch.Tensor:
    """An empty partner for the op: ``t``'s shape with 0 heads."""
    shape = list(t.shape)
    shape[2 if layout == "bshd" else 1] = 0
    return t.new_empty(shape)


def _rope_vmap(info, in_dims, q, k, positions, cu_seqlens, inv_freq, attention_factor, interleaved, layout, offset,
               inverse):
    q_dim, k_dim, pos_dim, cu_dim, freq_dim = in_dims[:5]
    size = info.batch_size
    op = torch.ops.posenc.rope.default
    q_all, k_all = _front(q, q_dim, size), _front(k, k_dim, size)
    shared = pos_dim is None and cu_dim is None and freq_dim is None and cu_seqlens is None
    if _foldable(q_all, k_all, positions, layout, shared):
        batch = q_all.shape[1]
        folded_positions = positions
        if positions is not None and positions.dim() >= 2 and positions.shape[-2] != 1:
            folded_positions = positions.repeat(*([1] * (positions.dim() - 2)), size, 1)
        rest = (inv_freq, attention_factor, interleaved, layout, offset, inverse)

        def folded(t_all: torch.Tensor) -> torch.Tensor:
            return t_all.reshape(size * batch, *t_all.shape[2:])

        def alone(t: torch.Tensor, is_q: bool, pos) -> torch.Tensor:
            """q or k rotated by itself, its partner empty (an empty one needs no call)."""
            if t.numel() == 0:
                return t.new_empty(t.shape)
            empty = _no_heads(t, layout)
            return op(t, empty, pos, None, *rest)[0] if is_q else op(empty, t, pos, None, *rest)[1]

        if q_dim is None or k_dim is None:
            # one of them the same in every slice (captured, say; or q alone's empty k): rotated once
            # and returned unbatched; the other folded
            out_q = alone(q, True, positions) if q_dim is None else \
                alone(folded(q_all), True, folded_positions).view(q_all.shape)
            out_k = alone(k, False, positions) if k_dim is None else \
                alone(folded(k_all), False, folded_positions).view(k_all.shape)
            return (out_q, out_k), (None if q_dim is None else 0, None if k_dim is None else 0)
        out_q, out_k = op(folded(q_all), folded(k_all), folded_positions, None, *rest)
        return (out_q.view(q_all.shape), out_k.view(k_all.shape)), (0, 0)
    outs = [op(q_all[i], k_all[i], _slice(positions, pos_dim, i), _slice(cu_seqlens, cu_dim, i),
               _slice(inv_freq, freq_dim, i), attention_factor, interleaved, layout, offset, inverse)
            for i in range(size)]
    return (torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])), (0, 0)


torch.library.register_vmap("posenc::rope", _rope_vmap)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """The tensor under ``t``'s functorch wrappers (every vmapped slice of it together) and functional wrapper."""
    while True:
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            t = torch._C._functorch.get_unwrapped(t)
        elif torch._is_functional_tensor(t):
            t = torch._from_functional_tensor(t)
        else:
            return t


def check_writable_apart(op: str, q: torch.Tensor, k: torch.Tensor) -> None:
    """Under a transform the in-place rotation is the out-of-place op copied back into q, then k
    (``ops._rope``): checked first, as the op checks in eager, so that nothing is written when one
    copy would fail or the second would overwrite the first. Expanded and self-overlapping q or k
    are refused as in eager; q and k are refused when their byte ranges meet (eager decides exactly,
    so views of one fused qkv buffer with interleaved rows pass there and not here)."""
    q, k = _plain(q), _plain(k)
    for name, t in (("q", q), ("k", k)):
        if t.numel() > 1 and torch._debug_has_internal_overlap(t) == 1:
            raise RuntimeError(f"{op}: {name} must not have elements that share memory (an expanded or self-overlapping "
                               f"view, strides {list(t.stride())}) when rotated in place")
    if q.numel() == 0 or k.numel() == 0 or q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr():
        return

    def byte_range(t: torch.Tensor) -> tuple[int, int]:
        first = t.storage_offset() * t.element_size()
        return first, first + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()

    (q0, q1), (k0, k1) = byte_range(q), byte_range(k)
    if q0 < k1 and k0 < q1:
        raise RuntimeError(f"{op}: q and k must not share memory when rotated in place (under a torch.func "
                           "transform, views of one buffer whose elements interleave count as sharing it: rotate "
                           "them with apply_rope)")


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


_FORMULAS: dict = {}  # op name -> (setup_context, backward), as given to torch.library.register_autograd


def register_autograd(name: str, backward, setup_context) -> None:
    """``torch.library.register_autograd`` for ``posenc::<name>``, the formula kept for :func:`dispatch`."""
    torch.library.register_autograd(f"posenc::{name}", backward, setup_context=setup_context)
    _FORMULAS[name] = (setup_context, backward)


class _UnderTransform(torch.autograd.Function):
    """``posenc::<name>`` with its registered formula, in the form torch.func runs (vmap: each step
    vmapped, the op's own rule included)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(name, *args):
        return getattr(torch.ops.posenc, name)(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.formula = inputs[0]
        _FORMULAS[inputs[0]][0](ctx, inputs[1:], output)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *_FORMULAS[ctx.formula][1](ctx, *grads))


_is_compiling = torch.compiler.is_compiling


def transforms_active() -> bool:
    """Whether a torch.func transform is active in eager mode (under torch.compile the ops are traced)."""
    return bool(functorch_transforms_active()) and not _is_compiling()


_DIFFERENTIATING = (TransformType.Grad, TransformType.Jvp)


def dispatch(name: str, *args):
    """``torch.ops.posenc.<name>(*args)``; under a torch.func transform that differentiates (grad,
    vjp, jacrev, ...; eager), through :class:`_UnderTransform` when the op has a backward. Under vmap
    alone the op itself runs: the Function would cost far more than the call (a decode step: ~1 ms
    against 0.2 ms)."""
    if name in _FORMULAS and transforms_active() and any(
            i.key() in _DIFFERENTIATING for i in retrieve_all_functorch_interpreters()):
        return _UnderTransform.apply(name, *args)
    return getattr(torch.ops.posenc, name)(*args)
