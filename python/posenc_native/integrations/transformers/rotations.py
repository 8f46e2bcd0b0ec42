"""The modeling modules' rotation functions (``apply_rotary_pos_emb`` and kin), wrapped.

transformers' attention forwards look their rotation function up in their module's globals at
call time, so routing the rotation without copying each attention forward means wrapping that
global. A wrapper is installed once per (module, function) while at least one model using it is
patched (reference counted) and decides per call by the *type* of its ``cos`` argument: unpatched
models (whose rotary module still returns tensors) go to the original function unchanged; the
cost for them is one ``isinstance`` per call while another model is patched. Replacing each
attention's ``forward`` instead would avoid touching globals but silently drift whenever
transformers edits a forward. With the ``kernels`` package installed the global is a function
module (:func:`is_function_module`): its ``forward`` is wrapped instead, the global left in place.

The wrapper reads q and k (or x), the handle and ``unsqueeze_dim``, and :data:`KEY_ARGUMENTS` where the
probe proved what the function does with them. The probe ran the original with its other parameters at
their defaults, so a call passing one of them at another value, or an argument the original does not
take, is refused naming it, not rotated as if it were absent (:func:`_unread`).
"""
from __future__ import annotations

import functools
import inspect
import numbers
import operator
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..._locks import ForkSafeLock
from .runtime import _ERR, RotaryPositions, UnsupportedModelError

_LAYOUTS = {1: "bhsd", 2: "bshd"}


@dataclass(frozen=True)
class RotationSpec:
    """How a rotation function is called and what it returns, as established by the probe.

    kind: ``"qk"`` (``f(q, k, cos, sin, ...) -> (q, k)``), ``"x"`` (``f(x, cos, sin, ...) -> x``),
    ``"cis"`` (``f(xq, xk, freqs_cis) -> (xq, xk)``, one complex table: Llama 4, DeepSeek V2),
    ``"gptj"`` (``f(tensor, sin, cos) -> tensor``, ``[B, S, H, R]``). The pairing (and for ``"cis"``
    the layout) is not here: it was proven per (rotary module, function) and travels in the handle
    (``RotaryPositions.routes``).
    """

    kind: str
    params: tuple[str, ...]

    @property
    def handle_index(self) -> int:
        return {"qk": 2, "x": 1, "cis": 2, "gptj": 1}[self.kind]

    @property
    def leading(self) -> int:
        """How many leading parameters every call passes and the wrapper reads (the tensors and the table)."""
        return {"qk": 4, "x": 3, "cis": 3, "gptj": 3}[self.kind]


def _deinterleave(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    parts = [x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]]
    if rotary_dim < x.shape[-1]:
        parts.append(x[..., rotary_dim:])
    return torch.cat(parts, dim=-1)


# SAM 2's memory attention rotates its cross-attention keys with two more arguments (apply_rotary_pos_emb_2d):
# the last num_k_exclude_rope keys (object pointers) pass through, and with repeat_freqs_k a k longer than q
# (several memory frames) takes q's positions once per frame. Read only for a function the probe proved to do
# exactly what rotate_keys_apart does with them (Pairing.key_arguments); refused elsewhere, as any other.
KEY_ARGUMENTS = ("num_k_exclude_rope", "repeat_freqs_k")


def rotate_keys_apart(h: RotaryPositions, q: torch.Tensor, k: torch.Tensor, pairing, where: str,
                      num_k_exclude_rope=0, repeat_freqs_k=False) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k ``[B, H, S, D]`` rotated at ``h``'s positions as SAM 2's ``apply_rotary_pos_emb_2d`` rotates
    them: k's last ``num_k_exclude_rope`` keys as they are; with ``repeat_freqs_k``, the keys to rotate
    at q's positions frame after frame. What transformers' slicing and broadcast make of other counts
    (a k of no whole number of frames, an exclusion outside k) is refused. The wrapper runs this, and the
    probe proves it against the function (:func:`.detect._proves_keys_apart`)."""
    exclude, length = operator.index(num_k_exclude_rope), k.shape[-2]
    if not 0 <= exclude <= length:
        raise UnsupportedModelError(f"{_ERR}: {where} was called with num_k_exclude_rope={exclude} for a k of "
                                    f"{length} keys; unpatch the model")
    rotate = functools.partial(RotaryPositions.rotate, layout="bhsd", interleaved=pairing.interleaved,
                               inverse=pairing.inverse)
    q_out, n = rotate(h, q)[0], length - exclude
    if n == 0:
        return q_out, k.clone()  # (transformers: a new tensor, the keys unrotated)
    if repeat_freqs_k and n != q.shape[-2]:
        if n % q.shape[-2]:
            raise UnsupportedModelError(f"{_ERR}: {where} was called with repeat_freqs_k=True and {n} keys to "
                                        f"rotate, no whole number of frames of q's {q.shape[-2]}; unpatch the model")
        h = h.tiled(n // q.shape[-2])
    return q_out, torch.cat([rotate(h, k[..., :n, :])[0], k[..., n:, :]], dim=-2)


def _shown(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _at_default(value, default) -> bool:
    if value is default:
        return True
    if isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor) or default is inspect.Parameter.empty:
        return False
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - not comparable with it: not the default
        return False


def _unread(original: Callable, spec: RotationSpec) -> tuple[tuple, frozenset, int]:
    """What ``original`` takes beyond what the wrapper reads: its other named parameters as (name, position
    or None when keyword-only, default); the names a keyword may pass (none more: a ``**kwargs`` catches
    arguments the probe never passed); how many may be passed by position."""
    sig = signature(original)
    params = [p for p in (sig.parameters.values() if sig is not None else ())
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    unread = tuple((p.name, i if i < positional else None, p.default) for i, p in enumerate(params)
                   if i >= spec.leading and p.name != "unsqueeze_dim")
    return unread, frozenset(p.name for p in params if p.kind != p.POSITIONAL_ONLY), positional


def make_wrapper(original: Callable, spec: RotationSpec, key: tuple[str, str]) -> Callable:
    """The dispatcher installed in place of ``original``: the fused kernel when it receives a posenc
    handle, ``original`` otherwise."""
    params = spec.params
    hi = spec.handle_index
    hname = params[hi]
    ui = params.index("unsqueeze_dim") if "unsqueeze_dim" in params else None
    unread, names, positional = _unread(original, spec)
    key_defaults = {name: default for name, _, default in unread if name in KEY_ARGUMENTS}
    where = f"{key[0]}.{key[1]}"
    position = {name: i for i, name in enumerate(params[:positional])}

    def arg(args, kwargs, i, default=None):
        return args[i] if len(args) > i else kwargs.get(params[i], default)

    def refuse_unread(args, kwargs, proven: tuple[str, ...]) -> dict:
        """Every argument named in ``proven`` when one is passed at other than its default, else {}; any
        other argument so passed, or one the original does not take, is refused. (Run on every call of a
        function with such parameters: the all-defaults case builds nothing.)"""
        passed, keys = [], {}
        for name, i, default in unread:
            value = args[i] if i is not None and len(args) > i else kwargs.get(name, default)
            if value is default or _at_default(value, default):
                continue
            if name in proven:
                keys[name] = value
            else:
                passed.append(f"{name}={_shown(value)}")
        if len(args) > positional:
            passed += [f"positional argument {i + 1}={_shown(v)}" for i, v in enumerate(args[positional:], positional)]
        if kwargs:
            passed += [f"{name}={_shown(v)}" for name, v in kwargs.items() if name not in names]
        if passed:
            raise UnsupportedModelError(
                f"{_ERR}: {where} was called with {', '.join(passed)}, which the fused rotation does not "
                "implement (proven at patch time with each parameter it does not read at its default, and "
                "no other argument); unpatch the model")
        return {**{name: key_defaults[name] for name in proven}, **keys} if keys else keys

    @functools.wraps(original, updated=())  # (a function module's __dict__ is its module state)
    def wrapper(*args, **kwargs):
        h = args[hi] if len(args) > hi else kwargs.get(hname)
        if spec.kind == "gptj":  # the handle, or (transformers < 5.24) the stand-in for GPT-J's table holding it
            h = getattr(h, "_posenc_rotary", h)
        if not isinstance(h, RotaryPositions):
            return original(*args, **kwargs)
        pairing = h.routes.get(key)
        if pairing is None:
            raise UnsupportedModelError(f"{_ERR}: {where} received rotary positions from a module "
                                        "it was not proven to match at patch time; unpatch the model")
        if kwargs and any(position.get(name, len(args)) < len(args) for name in kwargs):  # (as the original would)
            name = next(name for name in kwargs if position.get(name, len(args)) < len(args))
            raise TypeError(f"{key[1]}() got multiple values for argument '{name}'")
        keys = (refuse_unread(args, kwargs, pairing.key_arguments)
                if unread or len(args) > positional or (kwargs and not names.issuperset(kwargs)) else None)
        interleaved, inverse = pairing.interleaved, pairing.inverse
        if pairing.rotary_only and arg(args, kwargs, 0).shape[-1] != 2 * h.inv_freq.shape[-1]:
            raise UnsupportedModelError(f"{_ERR}: {where} was proven only on inputs as wide as the "
                                        "rotated part; got a wider one; unpatch the model")
        if spec.kind == "gptj":
            return h.rotate(arg(args, kwargs, 0), None, "bshd", interleaved, inverse)[0]
        if spec.kind == "cis":
            return h.rotate(arg(args, kwargs, 0), arg(args, kwargs, 1), pairing.layout, interleaved, inverse)
        if pairing.layouts is not None:  # an axial vision table: the layout proven for this call's shape
            x = arg(args, kwargs, 0)
            ud = arg(args, kwargs, ui) if ui is not None else None
            layout = dict(pairing.layouts).get((x.dim(), ud))
            if layout is None:
                raise UnsupportedModelError(f"{_ERR}: {where} was called with a {x.dim()}-D q and "
                                            f"unsqueeze_dim={ud}, a form not proven at patch time; unpatch the model")
        else:
            ud = arg(args, kwargs, ui, 1) if ui is not None else 1
            # (an integer (numpy's too), not a bool; a negative one counts from the end, as the unsqueeze of
            # the 3-D table does)
            integer = isinstance(ud, numbers.Integral) and not isinstance(ud, bool)
            layout = _LAYOUTS.get(int(ud) + 4 if ud < 0 else int(ud)) if integer else None
            if layout is None:
                raise ValueError(f"{_ERR}: {key[1]} with unsqueeze_dim={ud} is not supported")
        if spec.kind == "x":
            out = h.rotate(arg(args, kwargs, 0), None, layout, interleaved, inverse)[0]
            return _deinterleave(out, 2 * h.inv_freq.shape[-1]) if pairing.deinterleave else out
        q, k = arg(args, kwargs, 0), arg(args, kwargs, 1)
        if keys:  # proven as transformers calls it: [B, H, S, D]
            if layout != "bhsd" or k is None:
                raise UnsupportedModelError(f"{_ERR}: {where} was called with {', '.join(keys)} in a form not "
                                            f"proven at patch time ({q.dim()}-D q, layout {layout}); unpatch the model")
            return rotate_keys_apart(h, q, k, pairing, where, **keys)
        if pairing.q_trailing and layout == "bhsd" and k is not None and q.shape[2] < k.shape[2]:
            q_out = h.trailing(q.shape[2]).rotate(q, None, layout, interleaved, inverse)[0]
            k_out = h.rotate(k, None, layout, interleaved, inverse)[0]
        else:
            q_out, k_out = h.rotate(q, k, layout, interleaved, inverse)
        if pairing.deinterleave:
            r = 2 * h.inv_freq.shape[-1]
            q_out = _deinterleave(q_out, r)
            k_out = None if k_out is None else _deinterleave(k_out, r)
        return (q_out, k_out) if k is not None else q_out

    wrapper.__posenc_original__ = original
    return wrapper


def is_function_module(obj: object) -> bool:
    """A module instance with no parameters or buffers standing in for a function: what
    ``@use_kernel_forward_from_hub`` makes of ``apply_rotary_pos_emb`` and kin when the ``kernels``
    package is installed (transformers >= 5.25 requires it), so that ``kernelize`` can swap in a hub
    kernel. It is called like the function, and its ``forward`` carries the function's signature."""
    return (isinstance(obj, nn.Module) and next(obj.parameters(), None) is None
            and next(obj.buffers(), None) is None)


def signature(fn: Callable) -> Optional[inspect.Signature]:
    """The signature of ``fn`` (of its ``forward`` without ``self`` for a function module); None when
    it has none."""
    fn = inspect.unwrap(fn)
    try:
        if isinstance(fn, nn.Module):
            sig = inspect.signature(type(fn).forward)
            return sig.replace(parameters=list(sig.parameters.values())[1:])
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def signature_params(fn: Callable) -> tuple[str, ...]:
    """The parameter names of ``fn`` (of its ``forward`` without ``self`` for a function module)."""
    sig = signature(fn)
    return () if sig is None else tuple(sig.parameters)


# --------------------------------------------------------------------------------------------
# Reference-counted installation

_LOCK = ForkSafeLock(reentrant=True)
_MISSING = object()


@dataclass
class _Installed:
    host: object  # what holds the swapped attribute: the modeling module, or its function module
    attr: str
    before: object  # the host's own attribute before the swap (_MISSING: none, a function module's class forward)
    wrapper: Callable
    models: int  # patched models using it


_INSTALLED: dict[tuple[str, str], _Installed] = {}  # (module, name) -> what was swapped there


def original_of(fn: Callable) -> Callable:
    """The unwrapped function when ``fn`` is a posenc wrapper."""
    return getattr(fn, "__posenc_original__", None) or fn


def _host(module: object, name: str) -> tuple[object, str]:
    """Where ``module.<name>`` is swapped: that global for a function; for a function module, its
    ``forward``, so that the global stays the same object (kernels finds it by name: pickling rebuilds
    each attention's private copy as ``type(<global>)()``, and ``use_kernelized_func`` routes calls of
    it by its id)."""
    current = getattr(module, name)
    return (current, "forward") if is_function_module(current) else (module, name)


def install(module_name: str, name: str, spec: RotationSpec) -> None:
    module = sys.modules[module_name]
    with _LOCK:
        entry = _INSTALLED.get((module_name, name))
        if entry is None:
            host, attr = _host(module, name)
            current = original_of(getattr(host, attr))  # a stale wrapper (module reloaded?)
            wrapper = make_wrapper(current, spec, (module_name, name))
            before = vars(host).get(attr, _MISSING)
            setattr(host, attr, wrapper)
            _INSTALLED[(module_name, name)] = _Installed(host, attr, before, wrapper, 1)
            return
        if vars(entry.host).get(entry.attr) is not entry.wrapper or (
                entry.host is not module and getattr(module, name) is not entry.host):
            raise RuntimeError(
                f"{_ERR}: {module_name}.{name} was replaced by other code after posenc wrapped it, so models "
                "patched by posenc would break; undo that replacement first")
        entry.models += 1


def uninstall(module_name: str, name: str) -> None:
    with _LOCK:
        entry = _INSTALLED.get((module_name, name))
        if entry is None:
            return
        entry.models -= 1
        if entry.models > 0:
            return
        del _INSTALLED[(module_name, name)]
        if vars(entry.host).get(entry.attr) is not entry.wrapper:
            warnings.warn(f"{_ERR}: {module_name}.{name} was replaced by other code after posenc wrapped it; "
                          "leaving that replacement in place", RuntimeWarning, stacklevel=3)
        elif entry.before is _MISSING:
            delattr(entry.host, entry.attr)
        else:
            setattr(entry.host, entry.attr, entry.before)

