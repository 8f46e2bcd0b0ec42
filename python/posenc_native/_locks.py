"""Locks a forked child can take. A child inherits every lock in the state it had at the fork, but
not the threads: one that a thread of the parent held then (a frequency cache being filled, a
dynamic NTK update) would never be released, and the child's first call waiting for it hangs. So
each lock of the package is made anew in a child (``os.register_at_fork``)."""
from __future__ import annotations

import os
import threading
import weakref


class ForkSafeLock:
    """A ``threading.Lock`` (``RLock`` when ``reentrant``) for ``with`` blocks, new in a forked child."""

    __slots__ = ("_lock", "_reentrant", "__weakref__")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._renew()
        _ALL.add(self)

    def _renew(self) -> None:
        self._lock = threading.RLock() if self._reentrant else threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc) -> None:
        self._lock.__exit__(*exc)


_ALL: "weakref.WeakSet[ForkSafeLock]" = weakref.WeakSet()


def _renew_all() -> None:
    for lock in list(_ALL):
        lock._renew()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_all)
