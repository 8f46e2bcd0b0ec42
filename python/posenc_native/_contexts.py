"""What makes the current context other than plain eager mode, for tensors made now and for calls
that skip the dispatcher: a functorch transform, a dispatch mode (FakeTensorMode under
torch.export, proxy modes), a torch function mode. The decode fast path (ops.py) asks these and
more (the profiler, the jit tracer); the frequency cache (config/rope_config.py) caches only when
none is active."""
from __future__ import annotations

import torch

functorch_transforms_active = torch._C._are_functorch_transforms_active

# no-argument queries, each true (non-zero) while that kind of interception is active
MODES_ACTIVE = (functorch_transforms_active, torch._C._len_torch_dispatch_stack,
                torch._C._is_torch_function_mode_enabled)


def plain_context() -> bool:
    """Whether a tensor made now is a plain tensor: none of :data:`MODES_ACTIVE` is active."""
    return not any(active() for active in MODES_ACTIVE)
