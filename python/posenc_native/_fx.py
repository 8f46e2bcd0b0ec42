"""torch.fx symbolic tracing (``torch.fx.symbolic_trace``) of code that calls this library.

A traced function sees ``torch.fx.Proxy`` objects instead of tensors (and instead of ints read from
shapes), and the library's entry points check real tensors. So a call that meets a Proxy is recorded
as one node of the graph instead of being traced into: the same public function (or module), which
then runs with real values, checks included, whenever the traced module runs. Entry points on a
decode step's path look for Proxies only where their cheap type test fails, so untraced calls pay
next to nothing there.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from torch.fx import Proxy

_CONSTANT_PREFIX = "_posenc_constant_"


def proxy_in(*values: Any) -> Optional[Proxy]:
    """The first torch.fx Proxy among ``values``, or None."""
    for v in values:
        if isinstance(v, Proxy):
            return v
    return None


def record_call(proxy: Proxy, fn: Callable, *args: Any, **kwargs: Any) -> Proxy:
    """Records ``fn(*args, **kwargs)`` as one ``call_function`` node of ``proxy``'s graph.

    A frozen dataclass argument (a :class:`RopeConfig`) is kept as an attribute of the traced root,
    as fx keeps tensor constants, so the traced module calls ``fn`` with that same object and its
    frequency cache; fx would otherwise rebuild it from its fields on every call."""
    tracer = proxy.tracer
    args = tuple(_graph_value(tracer, a) for a in args)
    kwargs = {name: _graph_value(tracer, v) for name, v in kwargs.items()}
    return tracer.create_proxy("call_function", fn, args, kwargs)


def writes_in_place(fn: Callable) -> Callable:
    """Marks ``fn`` as writing its inputs, so that fx passes keep its node when nothing reads its
    outputs (``Graph.eliminate_dead_code`` drops any other such call: the rotation would be lost)."""
    has_side_effect = getattr(torch.fx.node, "has_side_effect", None)
    return has_side_effect(fn) if has_side_effect is not None else fn


def module_node(module: torch.nn.Module, *args: Any) -> Optional[Proxy]:
    """When an argument is a Proxy and ``module`` is a submodule of the traced root, records
    ``module(*args)`` as one ``call_module`` node and returns it (the module then runs whole, its checks
    included); None otherwise: an untraced call, or the root itself, whose forward is traced through."""
    proxy = proxy_in(*args)
    if proxy is None:
        return None
    try:
        path = proxy.tracer.path_of_module(module)
    except NameError:  # not below the root
        return None
    return proxy.tracer.create_proxy("call_module", path, args, {}) if path else None


def _graph_value(tracer: Any, value: Any) -> Any:
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    root = tracer.root
    names = [name for name in vars(root) if name.startswith(_CONSTANT_PREFIX)]
    name = next((n for n in names if vars(root)[n] is value), None)
    if name is None:
        name = f"{_CONSTANT_PREFIX}{len(names)}"
        setattr(root, name, value)
    return tracer.create_proxy("get_attr", name, (), {})
