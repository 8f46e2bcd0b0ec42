"""Python API over torch.ops.posenc: argument handling, fake (meta) kernels and autograd.

The kernels live in the compiled library (csrc/); this module only turns friendly arguments into
the op schemas of csrc/registration.cpp and teaches torch.compile/export and autograd about them.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Union

import torch

from . import _fx, _library
from ._dynamo_hooks import on_dynamo_import
from ._functorch import autograd_skipped as _autograd_skipped, dispatch as _dispatch, grad_wanted as _grad_wanted
from ._functorch import register_autograd as _register_autograd
from ._functorch import check_copyable as _check_copyable, plain as _plain
from ._functorch import transforms_active as _functorch_active
from ._checks import check_bool as _check_bool, check_float as _check_float, check_int as _check_int
from ._checks import check_tensor as _check_tensor
from ._contexts import MODES_ACTIVE, for_the_cache, is_traced_int, static_int, traced_int, tracing, untraced
from ._contexts import warn_trace_keeps
from ._forward_ad import linear_jvp
from ._forward_ad import scale_jvp, tangents as _tangents
from ._library import load_library
from ._op_args import arg_index as _arg_index, bind, call, input_grads, save_args, saved_args, tensor_fields
from ._tensor_cache import TensorCache
from ._rope_math import HEAD_AXIS, LAYOUTS, SEQ_AXIS, axis_inv_freq, axis_mask, mrope_pair_axes, seq_len_from_positions
from .config import RopeConfig

load_library()


Positions = Union[int, torch.Tensor, Sequence[int]]
_LAYOUT_DIMS = {"bshd": 4, "bhsd": 4, "thd": 3}
# The position domain checked by the ops (README "Guarantees"): |position + offset| <= 2^48.
MAX_POSITION = 2 ** 48

__all__ = [
    "sinusoidal_table",
    "add_sinusoidal",
    "apply_rope",
    "apply_rope_",
    "apply_rotary_pos_emb",
]

# --------------------------------------------------------------------------------------------
# Sinusoidal


def _positions_tensor(positions: Positions, device) -> torch.Tensor:
    if isinstance(positions, bool):
        raise TypeError("positions must be an int length or a 1-D tensor of positions, got bool")
    if is_traced_int(positions):  # sinusoidal_table(x.shape[1], ...) under torch.jit.trace
        positions = traced_int("positions", positions)
    if isinstance(positions, (int, torch.SymInt)):
        if positions < 0:
            raise ValueError(f"positions must be a length >= 0, got {positions}")
        return torch.arange(positions, device=device)
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"positions must be an int length, a 1-D tensor or a sequence of numbers, got "
                            f"{type(positions).__name__} ({e})") from None
    return positions if device is None else positions.to(device)


def sinusoidal_table(positions: Positions, dim: int, *, base: float = 10000.0, interleaved: bool = True,
                     freq_shift: float = 0.0, angle_scale: float = 1.0, cos_first: bool = False,
                     dtype: torch.dtype = torch.float32, device: Optional[torch.device | str] = None) -> torch.Tensor:
    """Sinusoidal position encodings, ``[N, dim]``.

    Args:
        positions: an int ``L`` (positions ``0..L-1``) or a 1-D tensor of integer or float positions
            (diffusion timesteps may be fractional).
        dim: number of columns. Odd ``dim`` leaves the last column zero.
        base: frequencies are ``base ** (-i / (dim // 2 - freq_shift))``.
        interleaved: ``sin, cos`` alternating per pair (the paper's layout); else ``[sin | cos]``.
        freq_shift: 0 for the transformer form, 1 for the common diffusion-timestep form.
        angle_scale: multiplies every angle (``scale`` in diffusion code).
        cos_first: put cos before sin (in each pair, or ``[cos | sin]``).
        dtype: float32, float16, bfloat16 or float64 output.
        device: where to build the table (default: the positions' device, or CPU for an int).
    """
    if (proxy := _fx.proxy_in(positions, dim, dtype, device, base, interleaved, freq_shift, angle_scale,
                              cos_first)) is not None:
        return _fx.record_call(proxy, sinusoidal_table, positions, dim, base=base, interleaved=interleaved,
                               freq_shift=freq_shift, angle_scale=angle_scale, cos_first=cos_first, dtype=dtype,
                               device=device)
    dim = _check_int("dim", dim)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    pos = _positions_tensor(positions, device)
    with _autograd_skipped(pos):
        return _dispatch("sinusoidal_table", pos, dim, _check_float("base", base),
                         _check_bool("interleaved", interleaved), _check_float("freq_shift", freq_shift),
                         _check_float("angle_scale", angle_scale), _check_bool("cos_first", cos_first), dtype)


def add_sinusoidal(x: torch.Tensor, positions: Optional[torch.Tensor] = None, *, offset: int = 0,
                   x_scale: float = 1.0, base: float = 10000.0, interleaved: bool = True, freq_shift: float = 0.0,
                   angle_scale: float = 1.0, cos_first: bool = False) -> torch.Tensor:
    """``x * x_scale + PE[positions]`` in one pass over x.

    Args:
        x: ``[batch, seq, dim]`` or ``[seq, dim]``; float32/float16/bfloat16/float64, any strides.
        positions: ``[seq]`` or ``[batch, seq]`` integer or float positions; default
            ``arange(seq)``.
        offset: added to every position, given or default (e.g. the cache length while decoding),
            by the op: exactly, in float64, so int32 positions never wrap. ``|offset| <= 2**48``,
            the position domain.
        x_scale: multiplies x first (``sqrt(d_model)`` in the original transformer); within float32's
            range unless x is float64 (32- and 16-bit rows are computed in float32).
        Other options as in :func:`sinusoidal_table`.

    Differentiable with respect to x.
    """
    if _FAST is not None and not _is_compiling():  # the decode fast path (below): plain CPU tensors, nothing to record
        out = _FAST.add_sinusoidal(x, positions, x_scale, base, interleaved, freq_shift, angle_scale, cos_first, offset)
        if out is not None:
            return out
    if (type(x) is not _Tensor or (positions is not None and type(positions) is not _Tensor)) and (
            proxy := _fx.proxy_in(x, positions, offset, x_scale, base, interleaved, freq_shift, angle_scale,
                                  cos_first)) is not None:  # (the test on x first: add_sinusoidal may run per token)
        return _fx.record_call(proxy, add_sinusoidal, x, positions, offset=offset, x_scale=x_scale, base=base,
                               interleaved=interleaved, freq_shift=freq_shift, angle_scale=angle_scale,
                               cos_first=cos_first)
    x = _check_tensor("x", x)  # (its shape is checked by the op)
    positions = _check_tensor("positions", positions, optional=True)
    offset = _check_int("offset", offset)
    if not -MAX_POSITION <= offset <= MAX_POSITION:
        raise ValueError(f"offset must lie in [-2**48, 2**48] (the position domain), got {offset}")
    with _autograd_skipped(x, positions):
        return _dispatch("add_sinusoidal", x, positions, _check_float("x_scale", x_scale),
                         _check_float("base", base), _check_bool("interleaved", interleaved),
                         _check_float("freq_shift", freq_shift), _check_float("angle_scale", angle_scale),
                         _check_bool("cos_first", cos_first), offset)


@torch.library.register_fake("posenc::sinusoidal_table")
def _sinusoidal_table_fake(*args):
    a = bind("sinusoidal_table", args)
    torch._check(a.positions.dim() == 1,
                 lambda: f"posenc.sinusoidal_table: positions must be 1-D, got {a.positions.dim()}-D")
    torch._check(a.dim >= 2, lambda: f"posenc.sinusoidal_table: dim must be >= 2, got {a.dim}")
    return a.positions.new_empty((a.positions.shape[0], a.dim), dtype=a.dtype)


@torch.library.register_fake("posenc::add_sinusoidal")
def _add_sinusoidal_fake(*args):
    a = bind("add_sinusoidal", args)
    x = a.x
    torch._check(x.dim() in (2, 3), lambda: f"posenc.add_sinusoidal: x must be 2-D or 3-D, got {x.dim()}-D")
    if a.positions is not None:
        torch._check(a.positions.device == x.device, lambda: "posenc.add_sinusoidal: positions must be on the same "
                     f"device as x ({x.device}), got {a.positions.device}")
    return _rows_like(x)


def _rows_like(x: torch.Tensor) -> torch.Tensor:
    """An out-of-place op's output, as the C++ ops make it (``new_rows_like``): x's strides when its
    last dim is contiguous, else row-major."""
    return torch.empty_like(x) if x.stride(-1) == 1 else x.new_empty(x.shape)


def _add_sinusoidal_setup(ctx, inputs, output):
    a = bind("add_sinusoidal", inputs)
    _no_grad_for("posenc.add_sinusoidal", a, ("x",))
    ctx.args = a._replace(x=None, positions=None)


def _add_sinusoidal_backward(ctx, grad):
    return input_grads(ctx.args, x=grad * ctx.args.x_scale)


_register_autograd("add_sinusoidal", _add_sinusoidal_backward, _add_sinusoidal_setup,
                   scale_jvp("add_sinusoidal", "x", "x_scale"))  # d/dx (x * x_scale + PE) = x_scale


def _sinusoidal_table_setup(ctx, inputs, output):  # float positions that want a gradient: refused
    _no_grad_for("posenc.sinusoidal_table", bind("sinusoidal_table", inputs), ())


_register_autograd("sinusoidal_table", lambda ctx, grad: None, _sinusoidal_table_setup,
                   linear_jvp("sinusoidal_table"))  # (differentiable in nothing)

# --------------------------------------------------------------------------------------------
# RoPE


def _empty_k(q: torch.Tensor, layout: str) -> torch.Tensor:
    """k with zero heads: the ops always take q and k; rotating q alone costs nothing extra."""
    shape = list(q.shape)
    shape[HEAD_AXIS[layout]] = 0
    return q.new_empty(shape)


_EMPTY_KS: dict = {}


def _empty_k_reused(q: torch.Tensor, layout: str) -> torch.Tensor:
    """_empty_k for the decode fast path (eager calls only): one k of zero heads per shape, dtype,
    device and layout, kept (a q-only decode step would otherwise spend a quarter of its time
    allocating it). Holding no elements, it is never written; at most 64 are kept. Made outside
    inference mode even when called in it: an inference tensor could not be written in place outside
    it, and every later q-only call in place would leave the fast path."""
    key = (q.shape, q.dtype, q.device, layout)
    k = _EMPTY_KS.get(key)
    if k is None:
        if len(_EMPTY_KS) >= 64:
            _EMPTY_KS.clear()
        with for_the_cache():
            k = _EMPTY_KS[key] = _empty_k(q, layout)
    return k


def rope_seq_len(config: "RopeConfig", q: torch.Tensor, positions: Optional[torch.Tensor], layout: str,
                 offset: int = 0, cu_seqlens: Optional[torch.Tensor] = None) -> Optional[int]:
    """The sequence length that dynamic NTK and LongRoPE frequencies depend on (the largest
    position + 1, as transformers computes it); None for the schemes that do not need it. Reading
    a positions tensor's maximum synchronizes with its device."""
    if not config.needs_seq_len:
        return None
    if tracing():
        with untraced():  # this trace's length, read without recording (sizes and positions.max())
            seq_len = rope_seq_len(config, q, positions, layout, offset, cu_seqlens)
        warn_trace_keeps(f"the {config.rope_type} frequencies of sequence length {seq_len}",
                         f"{config.rope_type} frequencies depend on the sequence length, which a trace cannot follow")
        return seq_len
    for name, t in (("positions", positions), ("cu_seqlens", cu_seqlens)):
        if t is not None and _is_batched(t):
            raise ValueError(f"{config.rope_type} frequencies follow the sequence length, which a {name} tensor "
                             f"vmapped by torch.func.vmap holds per slice: vmap q and k with {name} shared "
                             "(in_dims None), or loop over the slices")
    if positions is not None and positions.numel() > 0:
        return seq_len_from_positions(positions, offset)
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries (sequence starts and the total), got "
                             f"shape {tuple(cu_seqlens.shape)}")
        return max(0, int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) + offset)
    return max(0, q.shape[SEQ_AXIS[layout]] + offset)  # (a negative offset: as seq_len_from_positions)


def _graph_seq_len(q: torch.Tensor, positions: Optional[torch.Tensor], layout: str, offset,
                   cu_seqlens: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Under torch.compile / torch.export, :func:`rope_seq_len` as a 0-d int64 tensor when it is data
    (positions' maximum, cu_seqlens' longest sequence) or a dynamic size: the graph computes the
    frequencies from it (RopeConfig.op_inv_freq_on, given the tensor) instead of reading it on the host, which
    would break the graph. None in eager mode."""
    if not _is_compiling():
        return None
    if positions is not None and positions.numel() > 0:
        return positions.max().to(torch.int64) + offset + 1
    if cu_seqlens is not None and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2:
        return (cu_seqlens[1:] - cu_seqlens[:-1]).max().to(torch.int64) + offset
    # (a size: constant or dynamic, dynamo answers isinstance(n, SymInt) alike; inductor folds a constant)
    return torch.full((), q.shape[SEQ_AXIS[layout]] + offset, dtype=torch.int64, device=q.device)


def _axis_layout_inv_freq(inv_freq: torch.Tensor, mrope_section, mrope_interleaved) -> torch.Tensor:
    """inv_freq= with mrope_section=: the ops' axis form ([axes, pairs], _rope_math.axis_inv_freq),
    checked as RopeConfig checks its fields."""
    interleaved = _check_bool("mrope_interleaved", mrope_interleaved)
    if inv_freq.dim() != 1:
        raise ValueError(f"mrope_section= needs a 1-D inv_freq (one frequency per pair), got shape "
                         f"{tuple(inv_freq.shape)}")
    try:
        section = tuple(_check_int("mrope_section entries", n) for n in mrope_section)
    except TypeError as e:
        raise TypeError(f"mrope_section must be a sequence of ints (pairs per axis), got {mrope_section!r}") from e
    pairs = inv_freq.shape[0]
    if not section or min(section) < 0 or sum(section) != pairs:
        raise ValueError(f"mrope_section {section} must be ints >= 0 summing to the pair count: inv_freq has "
                         f"{pairs} frequencies (rotary_dim {2 * pairs}), the sections sum to {sum(section)}")
    return axis_inv_freq(inv_freq, _cached_axis_mask(section, interleaved, inv_freq.device))


# axis_mask per (section, interleaved, device): its host-to-device copy waits for the GPU, so a
# decode loop passing inv_freq= and mrope_section= makes it once.
_AXIS_MASKS = TensorCache(64)


def _cached_axis_mask(section: tuple, interleaved: bool, device: torch.device) -> torch.Tensor:
    key = (section, interleaved, device)
    # (compiled code makes the mask a graph constant: dynamo cannot trace the cache's context queries)
    mask = None if torch.compiler.is_compiling() else _AXIS_MASKS.get(key)
    if mask is None:
        mask = _AXIS_MASKS.fill(key, lambda: axis_mask(mrope_pair_axes(section, interleaved), len(section), device))
    return mask


# Decode fast path (issue 9; docs/architecture.md, section 2.1). At decode a call rotates a
# few kilobytes, so the Python around the op and the dispatcher cost more than the kernel. The rope
# calls and apply_rotary_pos_emb go to the _direct extension first (csrc/python/direct.c), which
# runs the CPU kernel straight away when nothing is to be recorded or intercepted (plain CPU tensors,
# no gradient wanted, no mode, functorch transform or profiler active), bumping q and k's version
# counters after an in-place write as the ADInplaceOrView kernel does (add_sinusoidal's calls go there
# first too, a sinusoidal model's decode step, and bias.py's, a T5 or ALiBi one). It answers None for every call
# it does not take, and for every call the op refuses: those take the general path, which raises its
# own error. A rope call is `(_rope if _FAST is None else _FAST.rope)(<_rope's 14 arguments>)`
# (apply_rope, apply_rope_, RotaryEmbedding.forward, the transformers integration's
# RotaryPositions.rotate): no Python frame of its own, a fifth of a decode call. torch.compile
# cannot trace the C function, so _rope is registered as its stand-in (below): compiled code traces
# the general path.

_Tensor = torch.Tensor
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_is_compiling = torch.compiler.is_compiling
try:
    _FAST_PATH_OBJECTS = {
        "tensor": torch.Tensor, "parameter": torch.nn.Parameter, "config": RopeConfig,
        "intercepting": MODES_ACTIVE + (torch._C._autograd._profiler_enabled,
                                        torch._C._get_tracing_state),  # None, or the jit tracer's state (it records ops)
        "inference_mode": torch.is_inference_mode_enabled, "grad_enabled": torch.is_grad_enabled,
        "increment_version": torch._C._increment_version,
        "nn_module": torch.nn.Module, "strided": torch.strided, "embedding": torch.nn.Embedding,
        "nn_module_globals": vars(torch.nn.modules.module),
        "forward_ad_globals": vars(torch.autograd.forward_ad),  # _current_level >= 0: a dual level is active
        "cpu_keys": torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), "general": lambda *args: _rope(*args),  # (defined below)
        "empty_k": _empty_k_reused,
        **{name: getattr(torch.ops.posenc, name).default._handle.redispatch_boxed
           for name in ("rope", "rope_", "rope_cos_sin", "add_sinusoidal", "relative_position_bias", "alibi_bias")},
    }
except AttributeError:  # a torch without one of these: no fast path, same results
    _FAST_PATH_OBJECTS = None
_FAST = _library.load_fast_path(_FAST_PATH_OBJECTS) if _FAST_PATH_OBJECTS else None


def use_module_call(*classes: type) -> None:
    """Makes each class's ``__call__`` the extension's module_call (csrc/python/direct.c):
    nn.Module.__call__ without its two Python frames, where a plain module of the class with no
    hooks runs forward's fast path; every other call goes to nn.Module.__call__, which torch.compile
    traces in its place."""
    if _FAST is None:
        return
    for cls in classes:
        cls.__call__ = _FAST.module_call(cls)
        on_dynamo_import(functools.partial(_substitute, cls.__call__, _traced_module_call))


def _substitute(c_function, traced) -> None:
    """Makes torch.compile trace ``traced`` where it meets ``c_function``, which it cannot trace."""
    torch.compiler.substitute_in_graph(c_function, skip_signature_check=True)(traced)


def _traced_module_call(self, *args, **kwargs):
    return torch.nn.Module.__call__(self, *args, **kwargs)


def _rope(in_place: bool, q, k, positions, config, inv_freq, attention_factor, interleaved, layout, offset,
          cu_seqlens, rotary_dim, mrope_section, mrope_interleaved):
    """The general path of one call of :func:`apply_rope` (:func:`apply_rope_` when ``in_place``;
    RotaryEmbedding.forward and the transformers integration call it too), in two steps, after the
    decode fast path (``_FAST.rope``) declined it:

    2. every check made in Python: a TypeError/ValueError naming the argument (the op checks the
       rest, shapes against each other, dtypes, devices and positions, on either path);
    3. the op through the dispatcher.
    """
    # -- 2. checks
    n = _LAYOUT_DIMS.get(layout) if isinstance(layout, str) else None
    if n is None:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    # one cheap test for the common call (this runs on every decode step); the named checks only
    # run to explain a failure
    if not (isinstance(q, _Tensor) and len(shape := q.shape) == n
            and (k is None or (isinstance(k, _Tensor) and k.dim() == n))
            and (positions is None or isinstance(positions, _Tensor))
            and (cu_seqlens is None or isinstance(cu_seqlens, _Tensor))
            and (inv_freq is None or isinstance(inv_freq, _Tensor))):
        if (proxy := _fx.proxy_in(q, k, positions, cu_seqlens, inv_freq, offset)) is not None:
            given = {"config": config, "inv_freq": inv_freq, "attention_factor": attention_factor,
                     "interleaved": interleaved, "cu_seqlens": cu_seqlens, "rotary_dim": rotary_dim,
                     "mrope_section": mrope_section, "mrope_interleaved": mrope_interleaved or None}
            return _fx.record_call(proxy, apply_rope_ if in_place else apply_rope, q, k, positions, layout=layout,
                                   offset=offset, **{name: v for name, v in given.items() if v is not None})
        shape_text = "[tokens, heads, head_dim]" if layout == "thd" else f"{n}-D ({layout})"
        _check_tensor("q", q, dims=(n,), shape_text=shape_text + f" for layout {layout!r}")
        _check_tensor("k", k, optional=True, dims=(n,), shape_text=shape_text + f" for layout {layout!r}")
        _check_tensor("positions", positions, optional=True)
        _check_tensor("cu_seqlens", cu_seqlens, optional=True)
        _check_tensor("inv_freq", inv_freq, optional=True)
    if type(offset) is not int:
        offset = _check_int("offset", offset)
    if isinstance(offset, int) and not _INT64_MIN <= offset <= _INT64_MAX:
        raise ValueError(f"offset must fit in int64, got {offset}")
    if rotary_dim is not None:
        rotary_dim = _check_int("rotary_dim", rotary_dim)
    head_dim = static_int(shape[-1])  # (jit.trace reads sizes as tensors: compared with the config's constant)
    if config is not None:
        if not isinstance(config, RopeConfig):
            raise TypeError(f"config must be a RopeConfig, got {type(config).__name__}")
        if config.head_dim != head_dim:
            raise ValueError(f"q's head_dim is {head_dim} but config.head_dim is {config.head_dim}")
        if inv_freq is not None:
            raise ValueError("pass either config or inv_freq, not both")
        if rotary_dim is not None and rotary_dim != config.rotary_dim:
            raise ValueError(f"rotary_dim={rotary_dim} disagrees with config.rotary_dim={config.rotary_dim}")
        if mrope_section is not None or mrope_interleaved:
            raise ValueError("with config=, the axis layout comes from config.mrope_section / mrope_interleaved; "
                             "do not pass mrope_section= or mrope_interleaved=")
        if attention_factor is not None or interleaved is not None:
            raise ValueError("with config=, the attention factor and pairing come from config.attention_factor / "
                             "config.interleaved; do not pass attention_factor= or interleaved= (or build a "
                             "RopeConfig with the values you want)")
    else:
        if inv_freq is None:
            raise ValueError("apply_rope needs config= or inv_freq=")
        if rotary_dim is not None:
            if rotary_dim % 2 or rotary_dim <= 0 or rotary_dim > head_dim:
                raise ValueError(f"rotary_dim must be even and in [2, head_dim={head_dim}], got {rotary_dim}")
            if rotary_dim != 2 * inv_freq.shape[-1]:
                raise ValueError(f"rotary_dim={rotary_dim} but inv_freq has {inv_freq.shape[-1]} frequencies "
                                 f"(rotary_dim {2 * inv_freq.shape[-1]})")
        if mrope_section is None and mrope_interleaved:
            raise ValueError("mrope_interleaved=True needs mrope_section= (the pairs of each axis)")
        attention_factor = 1.0 if attention_factor is None else _check_float("attention_factor", attention_factor)
        interleaved = False if interleaved is None else _check_bool("interleaved", interleaved)

    # -- 3. the general path
    if in_place and _tangents(q, k) is not None:  # (the in-place op has no forward-mode formula)
        raise NotImplementedError("apply_rope_: forward-mode AD is not supported in place (use apply_rope)")
    k_arg = _empty_k(q, layout) if k is None else k
    if config is not None:
        # frequencies cached per (config, device, regime), attention factor computed once: no host
        # work that depends only on the config, and positions are read only when the scheme needs it
        seq_len = None
        if config.needs_seq_len:  # compiled: a 0-d tensor, followed in the graph; else an int
            seq_len = _graph_seq_len(q, positions, layout, offset, cu_seqlens)
            if seq_len is None:
                seq_len = rope_seq_len(config, q, positions, layout, offset, cu_seqlens)
        inv_freq = config.op_inv_freq_on(q.device, seq_len)
        attention_factor, interleaved = config.attention_factor, config.interleaved
    elif mrope_section is not None:
        inv_freq = _axis_layout_inv_freq(inv_freq, mrope_section, mrope_interleaved)
    args = (q, k_arg, positions, cu_seqlens, inv_freq, attention_factor, interleaved, layout, offset, False)
    if not in_place:
        with _autograd_skipped(q, k_arg, inv_freq):
            q_out, k_out = _dispatch("rope", *args)
        return q_out, (k_out if k is not None else None)
    if _functorch_active():  # the in-place op has no torch.func rule: the out-of-place one, copied back
        _rotate_and_copy_back(*args)
    elif torch.compiler.is_compiling():
        if _grad_wanted(q, k_arg, inv_freq):
            # the in-place op's autograd (a Python kernel) traced by AOTAutograd gave rotated views
            # of a non-leaf wrong gradients: the out-of-place op and copy_, whose autograd torch traces
            _rotate_and_copy_back(*args)
        else:
            _rope_in_place_compiled(*[() if a is None else a for a in args])  # (nonstrict_trace takes no None)
    elif _grad_wanted(q, k_arg, inv_freq):  # (the autograd kernel refuses an inv_freq that wants a gradient)
        torch.ops.posenc.rope_(*args)
    else:  # what the Autograd and ADInplaceOrView kernels (below) would do, without their Python round trips
        if q.is_inference() or k_arg.is_inference():
            _check_not_inference("posenc.rope_", q, k_arg)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            torch.ops.posenc.rope_(*args)
        torch._C._increment_version((q, k_arg))
    return q, k


if _FAST is not None:  # what torch.compile traces in place of the C function: the general path
    on_dynamo_import(functools.partial(_substitute, _FAST.rope, lambda *args: _rope(*args)))


def _rope_in_place_compiled(q: torch.Tensor, k: torch.Tensor, *rest) -> torch.Tensor:
    """The in-place rotation in compiled code. Inductor loses the storage offset of a view that a
    custom op mutates when that offset is a symbol (dynamic shapes; torch 2.14, any such op:
    ``qkv[:, :, 1]`` had ``qkv[:, :, 0]`` rotated instead): such views are rotated out of place and
    copied back (torch's copy_, which inductor lowers right; ~6x the in-place time), every other
    call in place. Absent arguments come as ``()``. Returns a placeholder (nonstrict_trace wants an output)."""
    rest = tuple(None if isinstance(a, tuple) and not a else a for a in rest)
    if isinstance(q.storage_offset(), torch.SymInt) or isinstance(k.storage_offset(), torch.SymInt):
        _rotate_and_copy_back(q, k, *rest)
    else:
        torch.ops.posenc.rope_(q, k, *rest)
    return q.new_empty(())


def _trace_nonstrictly() -> None:
    """Dynamo runs _rope_in_place_compiled on the graph's fake tensors, whose storage offsets it
    cannot read while tracing; _rope calls it by its global name, so it calls the marked function."""
    global _rope_in_place_compiled
    _rope_in_place_compiled = torch._dynamo.nonstrict_trace(_rope_in_place_compiled)


on_dynamo_import(_trace_nonstrictly)


def _rotate_and_copy_back(q: torch.Tensor, k: torch.Tensor, positions, cu_seqlens, inv_freq: torch.Tensor,
                          *rest) -> None:
    """The in-place rotation where the in-place op cannot run (under a torch.func transform: it has
    no rule there) or runs wrong (compiled: ``_rope``, ``_rope_in_place_compiled``): the out-of-place
    op, copied back, after the in-place op's checks of q and k's memory, which the copies would not
    make (q and k sharing an element: the second copy would overwrite the first). The check op
    returns a copy of inv_freq that the rotation reads, so that no write of a compiled graph comes
    before it. Under a transform (eager: its ops run as called) the check is of the tensors under
    the transform's wrappers, every vmapped slice together (through the op's vmap rule a vmapped
    call took twice as long). An inv_freq that wants a gradient is not threaded through (its copy
    would not carry it; the rotation refuses it compiled, before any write, as in eager)."""
    transformed = _functorch_active()
    if transformed:
        plain_q = _plain(q)
        torch.ops.posenc.rope_in_place_check(plain_q, _plain(k), plain_q.new_empty(0, dtype=torch.float64))
    elif not _grad_wanted(inv_freq):
        inv_freq = torch.ops.posenc.rope_in_place_check(q.detach(), k.detach(), inv_freq)
    rotated = _dispatch("rope", q, k, positions, cu_seqlens, inv_freq, *rest)
    if transformed:  # (before the first copy)
        _check_copyable("posenc.rope_", q=(q, rotated[0]), k=(k, rotated[1]))
    _copy_back(q, k, rotated)


def _copy_back(q: torch.Tensor, k: torch.Tensor, rotated: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The in-place rotation where the in-place op cannot run (or runs wrong): the out-of-place op's
    results ``rotated`` copied into q and k."""
    q.copy_(rotated[0])
    k.copy_(rotated[1])


_is_batched = torch._C._functorch.is_batchedtensor  # a tensor vmapped by torch.func.vmap


def apply_rope(q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None, *,
               config: Optional["RopeConfig"] = None, inv_freq: Optional[torch.Tensor] = None,
               attention_factor: Optional[float] = None, interleaved: Optional[bool] = None, layout: str = "bshd",
               offset: int = 0,
               cu_seqlens: Optional[torch.Tensor] = None, rotary_dim: Optional[int] = None,
               mrope_section: Optional[Sequence[int]] = None, mrope_interleaved: bool = False
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotary position embedding of q and k in one fused pass; returns new ``(q, k)``.

    Args:
        q, k: ``[B,S,H,D]`` (``bshd``), ``[B,H,S,D]`` (``bhsd``, transformers' layout) or ``[T,H,D]``
            (``thd``, packed). Any strides (views of a fused qkv work; a strided last dim costs a copy).
            k may have another head count (GQA/MQA) or be None.
        positions: int32/int64 ``[S]``, ``[B,S]`` or ``[T]``; default ``arange(S) + offset`` (or the
            position within each packed sequence when ``cu_seqlens`` is given). With an axis layout
            (``config.mrope_section`` or ``mrope_section=``) also ``[A,B,S]`` / ``[A,1,S]`` (``[A,T]`` for
            thd), one row per axis (MRoPE's time/height/width ids; for Flux's ids ``[B,L,3]`` pass
            ``ids.permute(2, 0, 1)``); 1-D and 2-D positions then give every axis the same id (text
            tokens), as transformers does. thd with an axis layout needs positions.
        config: a :class:`RopeConfig`; supplies inv_freq, attention factor, pairing and rotary dim.
        inv_freq: ``rotary_dim // 2`` frequencies (float64 or float32) when no config is given.
        attention_factor: with ``inv_freq``, multiplies cos and sin (YaRN's temperature), on q and k
            alike; default 1.0. A config carries its own, so passing it with ``config`` is an error.
        interleaved: with ``inv_freq``, pair (2i, 2i+1) as GPT-J; default (False) pairs
            (i, i + rotary_dim/2) as GPT-NeoX/Llama. A config carries its own, as above.
        offset: added to every position (decode steps).
        cu_seqlens: ``[n+1]`` sequence starts for ``thd``.
        rotary_dim: optional check; dims past it pass through unchanged.
        mrope_section, mrope_interleaved: with ``inv_freq``, an axis layout: pairs per position axis
            (summing to ``len(inv_freq)``), contiguous (Qwen2-VL) or round-robin (Qwen3-VL), as the
            :class:`RopeConfig` fields of the same names. The raw op takes the layout inside
            inv_freq instead: ``[A, rotary_dim/2]``, pair i's frequency in row axis(i), zeros
            elsewhere (``_rope_math.axis_inv_freq``).

    Differentiable with respect to q and k (the backward is the transposed rotation).
    """
    return (_rope if _FAST is None else _FAST.rope)(False, q, k, positions, config, inv_freq, attention_factor,
                                                     interleaved, layout, offset,
                         cu_seqlens, rotary_dim, mrope_section, mrope_interleaved)


@_fx.writes_in_place
def apply_rope_(q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None, *,
                config: Optional["RopeConfig"] = None, inv_freq: Optional[torch.Tensor] = None,
                attention_factor: Optional[float] = None, interleaved: Optional[bool] = None, layout: str = "bshd",
                offset: int = 0,
                cu_seqlens: Optional[torch.Tensor] = None, rotary_dim: Optional[int] = None,
                mrope_section: Optional[Sequence[int]] = None, mrope_interleaved: bool = False
                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """In-place :func:`apply_rope`; returns the same q and k.

    Autograd follows torch's rules for in-place ops (as ``mul_``): q and k's version counters are
    bumped; a leaf that requires grad is refused under grad mode; a non-leaf that requires grad gets
    the in-place gradient (the inverse rotation). Out-of-place :func:`apply_rope` is the usual choice
    for training. Positions with an axis layout as in :func:`apply_rope`."""
    return (_rope if _FAST is None else _FAST.rope)(True, q, k, positions, config, inv_freq, attention_factor,
                                                     interleaved, layout, offset,
                         cu_seqlens, rotary_dim, mrope_section, mrope_interleaved)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: Optional[torch.Tensor] = None, unsqueeze_dim: int = 1
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for transformers' ``apply_rotary_pos_emb``, fused in one kernel.

    ``q``/``k`` are ``[B,H,S,D]`` with ``unsqueeze_dim=1`` (transformers' default) or ``[B,S,H,D]``
    with ``unsqueeze_dim=2``; ``cos``/``sin`` are ``[B,S,R]`` or ``[S,R]`` (R <= D: dims past R pass
    through). ``position_ids`` is ignored, as in transformers, unless cos/sin are 2-D tables
    ``[max_positions, R]`` (the old convention), where it selects their rows. The result has q's
    dtype; gradients flow to q and k (not to cos/sin).
    """
    # as _rope's fast path, ahead of the checks below: it takes only plain tensors (cos and
    # position_ids checked here, the others by the extension) and unsqueeze_dim 1 or 2, and
    # declines whatever the op refuses, so every call it does not run meets the same checks
    if (_FAST is not None and not _is_compiling() and type(cos) is _Tensor
            and (position_ids is None or type(position_ids) is _Tensor)
            and type(unsqueeze_dim) is int and (unsqueeze_dim == 1 or unsqueeze_dim == 2)):
        done = _FAST.rope_cos_sin(q, k, cos, sin, *_cos_sin_positions_layout(cos, position_ids, unsqueeze_dim))
        if done is not None:
            return done
    if (proxy := _fx.proxy_in(q, k, cos, sin, position_ids, unsqueeze_dim)) is not None:
        return _fx.record_call(proxy, apply_rotary_pos_emb, q, k, cos, sin, position_ids, unsqueeze_dim)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _check_tensor(name, t)
    _check_tensor("position_ids", position_ids, optional=True)
    if isinstance(unsqueeze_dim, bool) or unsqueeze_dim not in (1, 2):
        raise ValueError(f"unsqueeze_dim must be 1 ([B,H,S,D]) or 2 ([B,S,H,D]), got {unsqueeze_dim!r}")
    positions, layout = _cos_sin_positions_layout(cos, position_ids, unsqueeze_dim)
    with _autograd_skipped(q, k, cos, sin):
        return _dispatch("rope_cos_sin", q, k, cos, sin, positions, layout, False)


def _cos_sin_positions_layout(cos: torch.Tensor, position_ids: Optional[torch.Tensor], unsqueeze_dim: int):
    """apply_rotary_pos_emb's (positions, layout) for the op: position_ids only index 2-D tables."""
    return (position_ids if (position_ids is not None and cos.dim() == 2) else None,
            "bhsd" if unsqueeze_dim == 1 else "bshd")


def _check_rope_fake(name: str, args: tuple):
    """The cheap checks of the C++ op, so shape/device errors surface while tracing too; returns
    the bound arguments."""
    a = bind(name, args)
    q = a.q
    for field, t in tensor_fields(a, skip=("q",)):
        torch._check(t.device == q.device,
                     lambda: f"posenc.{name}: {field} must be on the same device as q ({q.device}), got {t.device}")
    torch._check(a.k.dtype == q.dtype, lambda: f"posenc.{name}: k must have q's dtype ({q.dtype}), got {a.k.dtype}")
    return a


def _register_rotation_fakes(name: str) -> None:
    """The fake kernels of a rotation op and its in-place twin (``name_``): new q and k rows, or nothing."""
    @torch.library.register_fake(f"posenc::{name}")
    def _out_of_place(*args):
        a = _check_rope_fake(name, args)
        return _rows_like(a.q), _rows_like(a.k)

    @torch.library.register_fake(f"posenc::{name}_")
    def _in_place(*args):
        a = _check_rope_fake(f"{name}_", args)
        _check_traced_views_apart(a.q, a.k)


for _rotation in ("rope", "rope_cos_sin"):
    _register_rotation_fakes(_rotation)


@torch.library.register_fake("posenc::rope_in_place_check")
def _rope_in_place_check_fake(q, k, inv_freq):
    _check_traced_views_apart(q, k)
    return torch.empty_like(inv_freq)


def _traced_value(v) -> Optional[int]:
    """An int, or the value a symbol has in the call being traced (None for one with no such value)."""
    if isinstance(v, int):
        return v
    hint = getattr(getattr(v, "node", None), "hint", None)
    return None if hint is None else int(hint)


def _check_traced_views_apart(q: torch.Tensor, k: torch.Tensor) -> None:
    """The in-place op's memory checks on the fake q and k of a traced graph, where they are views of
    one storage with a layout known while tracing: inductor may compute the views of an intermediate
    it never materializes (a pointwise result) into separate buffers, which the checks at run time
    then pass. The op's own exact test, on byte views of the same layout (whether two elements
    coincide does not depend on their width) over a storage that is only an address: nothing is
    allocated or read. A symbol in the layout takes its value in the call being traced: a refusal
    refuses that call, as eager would (no graph is kept); a layout that passes is checked again at
    run time, as every call is."""
    if q.untyped_storage()._cdata != k.untyped_storage()._cdata or _address_only_storage is None:
        return
    layouts = [(tuple(map(_traced_value, t.shape)), tuple(map(_traced_value, t.stride())),
                _traced_value(t.storage_offset())) for t in (q, k)]
    if any(v is None for shape, stride, offset in layouts for v in (*shape, *stride, offset)) or \
            any(0 in shape for shape, _, _ in layouts):
        return  # (an unbacked symbol: at run time only; no element: nothing shared)
    span = max(offset + sum((n - 1) * st for n, st in zip(shape, stride)) + 1 for shape, stride, offset in layouts)
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        storage = _address_only_storage(1 << 20, torch.device("cpu"), span)
        views = [torch.empty(0, dtype=torch.uint8).set_(storage, offset, shape, stride) for shape, stride, offset in layouts]
        torch.ops.posenc.rope_in_place_check(*views, torch.empty(0, dtype=torch.float64))


# (data_ptr, device, nbytes) -> a storage that owns nothing at that address (torch's, for inductor)
_address_only_storage = getattr(torch._C, "_construct_storage_from_data_pointer", None)


def _meta(t: torch.Tensor):
    return t.shape, t.dtype, t.device


def _grad_or_zeros(grad: Optional[torch.Tensor], meta) -> torch.Tensor:
    if grad is None and meta is None:
        raise RuntimeError("posenc: no gradient to rotate")
    if grad is None:
        shape, dtype, device = meta
        return torch.zeros(shape, dtype=dtype, device=device)
    return grad if grad.stride(-1) == 1 or grad.shape[-1] <= 1 else grad.contiguous()


def _no_grad_for(opname: str, args, differentiated: tuple = ("q", "k")) -> None:
    """The ops differentiate q and k (x) only: an angle input (inv_freq, cos, sin, float positions,
    ...) that wants a gradient is an error, not a silently missing gradient. Run by the ops'
    autograd kernels, which the Python entries keep for such an input (``_functorch.autograd_skipped``)."""
    for name, t in tensor_fields(args, skip=differentiated):
        if t.requires_grad:
            flows = f"gradients flow only to {' and '.join(differentiated)}" if differentiated else "the op has no gradient"
            raise RuntimeError(f"{opname}: {name} requires grad, but {flows}; detach {name} (or compute the result "
                               "with plain torch ops if you need its gradient)")


# The rotations (rope, rope_cos_sin) are orthogonal up to the attention factor, which scales q and
# k alike: the backward of each is the same op with `inverse` flipped, applied to the gradients.

def _rotation_setup(name: str, ctx, inputs, output):
    a = bind(name, inputs)
    _no_grad_for(f"posenc.{name}", a)
    ctx.op = name
    ctx.metas = (_meta(a.q), _meta(a.k))
    save_args(ctx, a._replace(q=None, k=None))


def _rotation_backward(ctx, grad_q, grad_k):
    a = saved_args(ctx)
    q_like, k_like = ctx.metas
    gq, gk = call(ctx.op, a, q=_grad_or_zeros(grad_q, q_like), k=_grad_or_zeros(grad_k, k_like),
                  inverse=not a.inverse)
    return input_grads(a, q=gq, k=gk)


def _zeros_like_saved(ctx, field: str) -> torch.Tensor:
    """A zero tangent for q or k (the jvp of a rotation whose other input carries one)."""
    shape, dtype, device = ctx.metas[0 if field == "q" else 1]
    return torch.zeros(shape, dtype=dtype, device=device)


for _name in ("rope", "rope_cos_sin"):  # linear in q and k: a tangent rotates as they do
    _register_autograd(_name, _rotation_backward, functools.partial(_rotation_setup, _name),
                       linear_jvp(_name, "q", "k", zeros=_zeros_like_saved))

# --------------------------------------------------------------------------------------------
# In-place ops and autograd: torch's rules for in-place ops (``mul_`` is the model), for the
# Python API and the raw torch.ops.posenc.rope_ / rope_cos_sin_ alike.
#   - ADInplaceOrView (below): the version counters of q and k are bumped, so a tensor saved for
#     backward and then rotated in place is caught by autograd; inference tensors outside inference
#     mode are refused before anything is written.
#   - Autograd: under grad mode, a leaf that requires grad (or a view of one) is refused before
#     anything is written; a non-leaf gets its history rebased onto a node whose backward is the
#     inverse rotation, computed by the out-of-place op (so double backward works too).

_IMPL_LIB = torch.library.Library("posenc", "IMPL")


class _RotatedInPlace(torch.autograd.Function):
    """Records that ``t`` was rotated in place by ``op`` (rope_ or rope_cos_sin_); with ``run``
    set, forward performs the rotation of q and k (one call of the op, all checks before any
    write), else t was already rotated by the previous node. One node per tensor: autograd rebases
    a modified view only for single outputs. The backward is the out-of-place op's inverse rotation."""

    @staticmethod
    def forward(ctx, t, run, op: str, args):
        if run is not None:
            getattr(torch.ops.posenc, op)(*run)
        ctx.mark_dirty(t)
        ctx.op = op.removesuffix("_")  # the out-of-place op
        save_args(ctx, args._replace(q=None, k=None))
        return t

    @staticmethod
    def backward(ctx, grad):
        a = saved_args(ctx)
        grad = _grad_or_zeros(grad, None)
        out, _ = call(ctx.op, a, q=grad, k=_empty_k(grad, a.layout), inverse=not a.inverse)
        return out, None, None, None


def _check_inplace_autograd(opname: str, q: torch.Tensor, k: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k)):
        if not t.requires_grad:
            continue
        if t._is_view():
            # Views autograd cannot rebase (outputs of unbind/split, views made under no_grad, ...):
            # torch would refuse them only after the rotation; refuse them before it. (A view made
            # under no_grad is also a leaf: this comes first, so that the message says what it is.)
            meta = torch._C._autograd._get_creation_meta(t)
            if meta != torch._C._autograd.CreationMeta.DEFAULT:
                raise RuntimeError(f"{opname}: {name} is a view that autograd cannot modify in place ({meta}: e.g. an "
                                   "output of unbind/split, or a view made under no_grad); slice the base tensor "
                                   "instead (qkv[:, :, 0]), or use the out-of-place op")
            if t._base.is_leaf and t._base.requires_grad:
                raise RuntimeError(f"{opname}: {name} is a view of a leaf Variable that requires grad; a view of a leaf "
                                   "Variable that requires grad is being used in an in-place operation")
        elif t.is_leaf:
            raise RuntimeError(f"{opname}: {name} is a leaf Variable that requires grad; a leaf Variable that requires "
                               "grad is being used in an in-place operation. Use the out-of-place op (apply_rope / "
                               "posenc.rope), or rotate under torch.no_grad()")


def _register_inplace(name: str) -> None:
    op = getattr(torch.ops.posenc, name).default
    opname = f"posenc.{name}"
    iq, ik = _arg_index(name, "q"), _arg_index(name, "k")  # the tensors the in-place ops write

    def autograd_kernel(keyset, *args):
        q, k = args[iq], args[ik]
        if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)):
            if torch.is_grad_enabled():  # an angle input that wants a gradient is refused all the same
                _no_grad_for(opname, bind(name, args))
            with torch._C._AutoDispatchBelowAutograd():
                return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)
        _check_inplace_autograd(opname, q, k)
        a = bind(name, args)
        _no_grad_for(opname, a)
        run = args
        for t in (q, k):
            if t.requires_grad:
                _RotatedInPlace.apply(t, run, name, a)
                run = None  # the first node rotated both; the second only records k's rotation
        return None

    _IMPL_LIB.impl(name, autograd_kernel, "Autograd", with_keyset=True)

    after_view_keyset = torch._C._after_ADInplaceOrView_keyset

    def ad_inplace_or_view_kernel(keyset, *args):  # see "ADInplaceOrView kernels" below
        q, k = args[iq], args[ik]
        _check_not_inference(opname, q, k)
        op.redispatch(keyset & after_view_keyset, *args)
        torch._C._increment_version((q, k))

    _IMPL_LIB.impl(name, ad_inplace_or_view_kernel, "ADInplaceOrView", with_keyset=True)

    def negative_kernel(keyset, *args):
        # A negative view (x.conj().imag) stores its values negated, and torch's fallback for them
        # cannot run an op that writes two tensors ("Expected Tensor but got None"). Rotation is
        # linear: rotating the stored values rotates the view's, so q and k go below as stored; the
        # angle inputs (frequencies, cos/sin) are resolved.
        args = [t.resolve_neg() if i not in (iq, ik) and isinstance(t, torch.Tensor) and t.is_neg() else t
                for i, t in enumerate(args)]
        op.redispatch(keyset.remove(torch._C.DispatchKey.Negative), *args)

    _IMPL_LIB.impl(name, negative_kernel, "Negative", with_keyset=True)


# --------------------------------------------------------------------------------------------
# ADInplaceOrView kernels of the in-place ops. LibTorch's stable ABI (the op library's only torch
# interface, csrc/host/stable.h) has no version counters and no inference-mode state, so torch's
# in-place rules live here, as torch.library.custom_op does it for Python ops: refuse an inference
# tensor outside inference mode (before any write), run the kernel below this key, bump the version
# counters of q and k. This key is reached outside inference mode for every tensor (it is in the
# default thread-local key set) and inside it for normal tensors (their own key set has it).
# apply_rope_'s fast path (no gradient can flow) does the same inline, below this key. Registered,
# with the Autograd kernel, by _register_inplace.

def _check_not_inference(opname: str, q: torch.Tensor, k: torch.Tensor) -> None:
    if (q.is_inference() or k.is_inference()) and not torch.is_inference_mode_enabled():
        name = "q" if q.is_inference() else "k"
        raise RuntimeError(f"{opname}: {name} is an inference tensor: Inplace update to inference tensor outside "
                           "InferenceMode is not allowed. Clone it outside inference mode first, or run under "
                           "torch.inference_mode()")


_register_inplace("rope_")
_register_inplace("rope_cos_sin_")
