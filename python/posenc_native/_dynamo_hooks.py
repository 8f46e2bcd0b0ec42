"""Registrations with torch.compile's tracer (dynamo), made when dynamo is imported rather than
when this package is.

Importing ``torch._dynamo`` takes about a second and a quarter (torch 2.14, AMD Zen 4), half again
``import torch``; a program that never compiles should not pay it for ``import posenc_native``.
Dynamo must know the substitutes and the nonstrict-traced function before it traces any call, and
it traces nothing before it is imported: so each registration runs as soon as ``torch._dynamo`` has
been imported (at once where it already has).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable

_DYNAMO = "torch._dynamo"
_pending: list[Callable[[], None]] = []
_lock = threading.Lock()


def on_dynamo_import(register: Callable[[], None]) -> None:
    """Runs ``register()`` now if dynamo is imported, else right after its import completes."""
    with _lock:
        if _DYNAMO not in sys.modules:
            _pending.append(register)
            if not any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _AfterDynamoImport())
            return
    register()


def _run_pending() -> None:
    with _lock:
        todo = _pending[:]
        _pending.clear()
    for register in todo:
        register()


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` with the other finders and makes its loader run the pending
    registrations once the module has executed; then leaves ``sys.meta_path``."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module) -> None:
            del loader.exec_module  # (the instance attribute set below: the loader is this module's alone)
            exec_module(module)
            _run_pending()

        loader.exec_module = exec_then_register
        return spec
