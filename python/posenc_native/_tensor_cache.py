"""Tensors kept across calls (a config's frequencies per device and regime, the MRoPE axis masks
of ``inv_freq=`` calls): one bounded cache, safe for concurrent callers and for CUDA streams."""
from __future__ import annotations

from typing import Callable, Hashable, Optional

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
        self._lock = ForkSafeLock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Optional[torch.Tensor]:
        """The tensor kept under ``key``, or None."""
        entry = self._entries.get(key)
        return None if entry is None else read_from_cache(*entry)

    def fill(self, key: Hashable, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The tensor kept under ``key``, made by ``make()`` if missing: untraced (a constant of a
        jit trace, the same in every trace that reads the cache) and outside inference mode. Kept
        only in a plain context and not while compiling (dynamo cannot trace the context queries;
        the tensor is then a graph constant)."""
        if torch.compiler.is_compiling() or not plain_context():
            with untraced(), for_the_cache():
                return make()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                with untraced(), for_the_cache():
                    entry = (make(), set())
                full = len(self._entries) >= self.max_entries
                entries = {} if full else dict(self._entries)
                entries[key] = entry
                self._entries = entries
                if full:
                    _release_external_reads()
        return read_from_cache(*entry)


# CUDA tensors that a reader may still need after their cache dropped them (or was itself collected),
# by id: ones read by a CUDA graph being captured (its replays read the address for as long as the
# graph lives: kept for good), and ones read from a stream that torch.cuda.ExternalStream wraps
# (kept until the next drop, which first waits for every stream of their devices).
_CAPTURED: dict = {}
_READ_ON_EXTERNAL_STREAMS: dict = {}


def read_from_cache(t: torch.Tensor, streams: set) -> torch.Tensor:
    """A cached tensor, about to be read by work queued on the current stream. The caching allocator
    hands a freed CUDA block out again at once on the stream that allocated it, so a cache that
    drops a tensor while a read of it is still queued on another stream would let that read see the
    block's next owner. Each other stream that reads a cached CUDA tensor is therefore recorded on
    it once (``Tensor.record_stream``): whenever the cache drops it, the allocator holds its block
    until the work queued on those streams by then is done. ``streams``: the entry's streams
    recorded so far (raw stream handles). In any context (a ``torch.device`` block, a transform or
    a dispatch mode still runs kernels), with the interception paused for the record itself (a
    FakeTensorMode would refuse the real tensor, a jit trace would keep the call); not while
    compiling (dynamo cannot trace it; compiled code reads the tensor as a graph input).

    Two readers outlive what a record covers. A CUDA graph captured now reads the address at every
    replay: the tensor is kept for good. A stream that ``torch.cuda.ExternalStream`` wraps may be
    destroyed by its owner before the block is freed, and the allocator's free would then record an
    event on a dead stream (an error in a destructor: the process aborts); so it is not recorded,
    and the tensor is kept until the next drop, which synchronizes its device first
    (:func:`_release_external_reads`)."""
    if t.is_cuda and not torch.compiler.is_compiling():
        if torch.cuda.is_current_stream_capturing():
            _CAPTURED.setdefault(id(t), t)
        stream = torch._C._cuda_getCurrentRawStream(t.get_device())
        if stream not in streams:
            current = torch.cuda.current_stream(t.device)
            if current.stream_id != 0 and current.stream_id % 2 == 0:  # (c10: an external stream's id is its handle)
                _READ_ON_EXTERNAL_STREAMS.setdefault(id(t), t)  # (checked on every read: a drop releases it)
                return t
            with untraced(), torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
                t.record_stream(current)
            streams.add(stream)
    return t


def _release_external_reads() -> None:
    """Frees the tensors kept for reads on external streams, once every stream of their devices
    has finished its queued work (a device-wide wait, so a stream its owner has destroyed since
    is covered too). Not while this thread captures a CUDA graph (a wait would end the capture)."""
    global _READ_ON_EXTERNAL_STREAMS
    if not _READ_ON_EXTERNAL_STREAMS or torch.cuda.is_current_stream_capturing():
        return
    kept, _READ_ON_EXTERNAL_STREAMS = _READ_ON_EXTERNAL_STREAMS, {}
    for device in {t.device for t in kept.values()}:
        torch.cuda.synchronize(device)
    del kept
