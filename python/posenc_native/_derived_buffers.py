"""Buffers that are functions of a module's constructor arguments, kept so through every move.

A module's buffers follow ``nn.Module._apply``: ``.half()`` rounds them, ``to_empty()`` after a
meta-device construction leaves them uninitialized (no ``state_dict`` refills a non-persistent
buffer). For a buffer that *is* a formula of the arguments (ALiBi's slopes, a sinusoidal table,
RoPE frequencies) either is a silent wrong answer. :class:`DerivedBuffers` recomputes each one from
the arguments after every ``_apply``, in its own dtype, on the device the move put it on.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

_CAST_PROBE = "_posenc_cast_probe"  # (a buffer only while _apply runs)


class DerivedBuffers(nn.Module):
    """Base of the modules whose buffers :meth:`_derived_buffers` computes. A subclass calls
    :meth:`_register_derived_buffers` in ``__init__`` once what it needs is set; the buffers are then
    non-persistent, on the default device (``meta`` under ``with torch.device("meta")``), and
    rebuilt after every ``.to()``, ``.half()``, ``to_empty()``, ...: a dtype cast cannot round them,
    and a materialized meta module holds their true values."""

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        """name -> value, on the CPU, in the buffer's own dtype."""
        raise NotImplementedError

    def _computed(self) -> dict[str, torch.Tensor]:
        with torch.device("cpu"):  # (also under a meta-device context: computed, then placed)
            return self._derived_buffers()

    def _register_derived_buffers(self) -> None:
        device = torch.get_default_device()
        values = self._computed()
        for name, value in values.items():
            self.register_buffer(name, value.to(device), persistent=False)
        self._derived_buffer_names = tuple(values)

    def _moved(self, cast: Optional[torch.dtype]) -> None:
        """Told, before the rebuild, the floating dtype a move cast to (``.half()``, ``.to(dtype)``),
        or None for a move that kept dtypes (``.cpu()``, ``.share_memory()``, ``to_empty()``)."""

    def _apply(self, fn, recurse=True):
        # What fn does to floating dtypes: a probe of another dtype rides along with the first buffer
        # (rebuilt in its own dtype after each move, so its dtype alone cannot tell `.float()` from `.cpu()`);
        # a cast gives both one dtype, any other move leaves them apart.
        first = getattr(self, self._derived_buffer_names[0])
        probe_dtype = torch.float64 if first.dtype != torch.float64 else torch.float32
        self._buffers[_CAST_PROBE] = torch.empty(0, dtype=probe_dtype, device=first.device)
        try:
            super()._apply(fn, recurse)
        finally:
            probe = self._buffers.pop(_CAST_PROBE, None)
        after = getattr(self, self._derived_buffer_names[0]).dtype
        self._moved(after if probe is not None and probe.dtype == after else None)
        self._rebuild_derived_buffers()
        return self

    def _rebuild_derived_buffers(self) -> None:
        """Each buffer recomputed, on its device (none on the meta device: it holds no values)."""
        values = None
        for name in self._derived_buffer_names:
            device = getattr(self, name).device
            if device.type != "meta":
                values = values if values is not None else self._computed()
                setattr(self, name, values[name].to(device))
