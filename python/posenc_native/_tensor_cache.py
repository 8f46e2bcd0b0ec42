"""Tensors kept across calls (a config's frequencies per device and regime, the MRoPE axis masks
of ``inv_freq=`` calls): one bounded cache, safe for concurrent callers and for CUDA streams."""
from __future__ import annotations

import sys
import threading
from typing import Callable, Hashable, Iterable, Optional

import torch

from ._contexts import for_the_cache, plain_context, untraced
from ._locks import ForkSafeLock


class TensorCache:
    """Tensors by key, each made once by the caller's ``make`` and kept until the cache holds
    ``max_entries`` and a new key drops them all (dynamic NTK has a regime per sequence length).

    Only tensors made in a plain context are kept (``_contexts.plain_context``): one made under
    torch.export or a functorch transform is a FakeTensor or a wrapper, which later eager calls
    must not read. Readers take no lock: a lookup reads the current dict, and a writer (under the
    lock) publishes a new dict, so a concurrent reader sees the old or the new one, never a
    half-made entry (a shared dict cleared in place raised KeyError under threads). An entry is
    (tensor, the CUDA streams recorded on it; :func:`read_from_cache`)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: dict = {}
        # reentrant: a scheme's frequencies may read the cache of their own config (another regime's)
        self._lock = ForkSafeLock(reentrant=True)
        self._making = threading.local()  # .keys: this thread's keys whose make() runs

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Optional[torch.Tensor]:
        """The tensor kept under ``key``, or None; None as well under a FakeTensorMode outside
        compilation (it refuses a real tensor: the caller's ``fill`` then makes one in the mode).
        Other dispatch modes (selective checkpointing, FlopCounterMode, make_fx) read it, and
        compiled code reads it as a graph constant (torch.export's fake mode allows that)."""
        if not torch.compiler.is_compiling() and _fake_mode_active():
            return None
        entry = self._entries.get(key)
        return None if entry is None else read_from_cache(*entry)

    def fill(self, key: Hashable, make: Callable[[], torch.Tensor],
             on_kept: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
        """The tensor kept under ``key``, made by ``make()`` if missing: untraced (a constant of a
        jit trace, the same in every trace that reads the cache) and outside inference mode. Kept
        only in a plain context and not while compiling (dynamo cannot trace the context queries;
        the tensor is then a graph constant). ``on_kept(t)`` runs under the lock when ``make``'s
        tensor is kept (not for one made for a trace or a transform). A ``make`` that needs its own key
        (through another fill on this thread) raises RuntimeError instead of recursing (:meth:`_made`)."""
        compiling = torch.compiler.is_compiling()
        if compiling or not plain_context():
            with untraced(), for_the_cache():  # (dynamo would not trace the guard's thread-local)
                return make() if compiling else self._made(key, make)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                with untraced(), for_the_cache():
                    entry = (self._made(key, make), set())
                if on_kept is not None:
                    on_kept(entry[0])
                full = len(self._entries) >= self.max_entries
                dropped_held = full and _EXTERNAL_READS.holds_any(t for t, _ in self._entries.values())
                entries = {} if full else dict(self._entries)
                entries[key] = entry
                self._entries = entries
                _EXTERNAL_READS.release(force=dropped_held)
        return read_from_cache(*entry)

    def _made(self, key: Hashable, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``make()``, refused when this thread is already making ``key`` (it would recurse). Per
        thread (a ``threading.local``), so a child forked while another thread makes a key starts
        with none."""
        making = self._making.__dict__.setdefault("keys", set())
        if key in making:
            raise RuntimeError(f"TensorCache: making the tensor for key {key!r} needs that same tensor (a "
                               "RopeScaling whose compute_inv_freq reads the regime it computes?)")
        making.add(key)
        try:
            return make()
        finally:
            making.discard(key)


def _fake_mode_active() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


class _ExternalReads:
    """Cached CUDA tensors read from streams that ``torch.cuda.ExternalStream`` wraps, held by id
    instead of recorded on the stream (:func:`read_from_cache` says why) until a release has
    waited for every stream of their devices: at a drop of a cache that drops one of them, and at
    a fill once the hold has doubled since the last release (a config collected with its cache
    leaves its tensors here). The wait is device-wide: torch's default (global) capture mode
    refuses it while another thread captures a CUDA graph; capture with
    ``capture_error_mode="thread_local"`` where that can happen."""

    def __init__(self) -> None:
        self._held: dict = {}
        self._lock = ForkSafeLock(reentrant=True)  # (a finalizer run by a collection inside may read)
        self._release_at = 64

    def hold(self, t: torch.Tensor) -> None:
        with self._lock:
            self._held.setdefault(id(t), t)

    def holds_any(self, tensors: Iterable[torch.Tensor]) -> bool:
        return bool(self._held) and any(id(t) in self._held for t in tensors)

    def release(self, force: bool) -> None:
        """Waits for the devices of the held tensors, then lets go of each that nothing else
        references (one that a call still references may be read by a kernel it has yet to queue,
        or is still cached: held on). Not while this thread captures a CUDA graph (the wait would
        end the capture); a wait that fails (another thread's capture in torch's default global
        mode refuses it, and may itself fail) keeps everything held."""
        if not self._held or not (force or len(self._held) >= self._release_at):
            return
        with self._lock:
            try:
                if torch._C._cuda_isCurrentStreamCapturing():
                    return
                for device in {t.device for t in self._held.values()}:
                    torch.cuda.synchronize(device)
            except RuntimeError:
                return
            kept = {}
            while self._held:
                key, t = self._held.popitem()
                if sys.getrefcount(t) > _UNSHARED_REFCOUNT:
                    kept[key] = t
                del t
            self._held = kept
            self._release_at = max(64, 2 * len(kept))


def _unshared_refcount() -> int:
    """sys.getrefcount of an object popped from a dict into a local, referenced nowhere else: 2
    up to Python 3.13, less where a local is read without a reference (3.14)."""
    held = {0: object()}
    _, t = held.popitem()
    return sys.getrefcount(t)


_UNSHARED_REFCOUNT = _unshared_refcount()
_EXTERNAL_READS = _ExternalReads()
# CUDA tensors read while a CUDA graph was captured: its replays read the address for as long as
# the graph lives, which nothing here can see, so they are kept for good
_CAPTURED: dict = {}


def read_from_cache(t: torch.Tensor, streams: set) -> torch.Tensor:
    """A cached tensor, about to be read by work queued on the current stream. The caching allocator
    hands a freed CUDA block out again at once on the stream that allocated it, so a cache that
    drops a tensor while a read of it is still queued on another stream would let that read see the
    block's next owner. Each other stream that reads a cached CUDA tensor is therefore recorded on
    it once (``Tensor.record_stream``): whenever the cache drops it, the allocator holds its block
    until the work queued on those streams by then is done. ``streams``: the entry's streams
    recorded so far (raw stream handles). In any context that reads the cache (a ``torch.device``
    block, a transform or a dispatch mode still runs kernels), with the interception paused for the
    record itself (a dispatch mode would see the call, a jit trace would keep it); not while
    compiling (dynamo cannot trace it; compiled code reads the tensor as a graph input).

    Two readers outlive what a record covers. A CUDA graph captured now reads the address at every
    replay: the tensor is kept for good (``_CAPTURED``). A stream that ``torch.cuda.ExternalStream``
    wraps may be destroyed by its owner before the block is freed, and the allocator's free would
    then record an event on a dead stream (an error in a destructor: the process aborts); so it is
    not recorded, and the tensor is held until a device-wide wait (``_ExternalReads``)."""
    if t.is_cuda and not torch.compiler.is_compiling():
        if torch._C._cuda_isCurrentStreamCapturing():
            _CAPTURED.setdefault(id(t), t)
        stream = torch._C._cuda_getCurrentRawStream(t.get_device())
        if stream not in streams:
            current = torch.cuda.current_stream(t.device)
            if current.stream_id != 0 and current.stream_id % 2 == 0:  # (c10: an external stream's id is its handle)
                _EXTERNAL_READS.hold(t)  # (on every read: a release lets go of what it held)
                return t
            with untraced(), torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
                t.record_stream(current)
            streams.add(stream)
    return t
