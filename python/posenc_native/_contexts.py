"""What makes the current context other than plain eager mode, for tensors made now and for calls
that skip the dispatcher: a functorch transform, a dispatch mode (FakeTensorMode under
torch.export, proxy modes), a torch function mode. The decode fast path (ops.py) asks these and
more (the profiler, the jit tracer); the tensor cache (_tensor_cache.py) keeps a tensor only when
none is active.

And the jit tracer (torch.jit.trace), which records the ops that run and reads shapes as 0-dim
tensors: what depends only on a config is made untraced (a constant of the trace, the same in every
trace of it), and an int read from a traced shape is named in a warning where it becomes a constant."""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Iterator

import torch

functorch_transforms_active = torch._C._are_functorch_transforms_active

# no-argument queries, each true (non-zero) while that kind of interception is active
MODES_ACTIVE = (functorch_transforms_active, torch._C._len_torch_dispatch_stack,
                torch._C._is_torch_function_mode_enabled)


def plain_context() -> bool:
    """Whether a tensor made now is a plain tensor: none of :data:`MODES_ACTIVE` is active."""
    return not any(active() for active in MODES_ACTIVE)


def for_the_cache():
    """Where a tensor to be kept across calls is made: outside inference mode, so that it is an
    ordinary tensor even when first needed there (an inference tensor cannot be saved for backward
    or written in place later, when training follows an inference_mode evaluation)."""
    return torch.inference_mode(False)


_tracing_state = torch._C._get_tracing_state
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NN_MODULE_FILE = torch.nn.modules.module.__file__


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Pauses torch.jit.trace's recording (nothing to do when no trace runs). A tensor made inside
    enters a trace as a constant, and a shape read inside is an int: frequencies of a config cached
    by the first trace are then the same constant in every later trace (its sanity check compares
    two), and a check of a shape against a config's constant is not recorded as data flow."""
    state = _tracing_state()
    if state is None:
        yield
        return
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


def static_int(value):
    """``value`` (an int, or a size that torch.jit.trace reads as a 0-dim tensor) as a plain int,
    read without recording: for a check at trace time against a constant, which a trace cannot
    record anyway (torch would warn that the bool is a constant). SymInts (torch.compile) pass as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    with untraced():
        return int(value)


def traced_int(name: str, value: torch.Tensor) -> int:
    """An int argument that torch.jit.trace hands over as a 0-dim tensor (a shape read such as
    ``x.shape[1]``), as the int it holds. A trace passes ints to custom ops as constants (torch
    records no data flow into an op's int argument), so the traced graph keeps this value: said
    in a TracerWarning naming the argument, rather than silently."""
    constant = static_int(value)  # (read untraced: torch's own warning would not name the argument)
    warn_trace_keeps(f"{name}={constant}", f"{name} is an int read from a traced tensor (such as x.shape[1]), and "
                     "torch.jit.trace passes ints to custom ops as constants. Pass positions as a tensor where the "
                     "call takes them")
    return constant


def warn_trace_keeps(what: str, why: str, followed_by: str = "torch.compile and torch.export follow them.") -> None:
    """A TracerWarning that the running torch.jit.trace keeps ``what`` as a constant, and why (and what
    follows the values instead), attributed to the first caller outside this package."""
    level, frame = 2, sys._getframe(1)  # level 2: warn_trace_keeps' caller
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                        or frame.f_code.co_filename == _NN_MODULE_FILE):  # (a module's __call__)
        level, frame = level + 1, frame.f_back
    warnings.warn(f"posenc_native: this trace keeps {what} and will not follow other values: {why}. "
                  f"{followed_by}", torch.jit.TracerWarning, stacklevel=level)


def tracing() -> bool:
    """Whether torch.jit.trace is recording."""
    return _tracing_state() is not None


def is_traced_int(value) -> bool:
    """Whether ``value`` is a 0-dim integer tensor met while torch.jit.trace runs: a traced shape read."""
    return (isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point()
            and _tracing_state() is not None)
