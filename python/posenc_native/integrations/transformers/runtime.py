"""What runs inside a patched model: the handle that replaces ``(cos, sin)`` and the rotary module
that produces it.

A patched model's rotary module returns a :class:`RotaryPositions` (positions + frequencies, no
cos/sin tensors) twice, so attention forwards unpack it as ``cos, sin`` and hand it to their
module's rotation function, which :mod:`.rotations` has wrapped to call the fused kernel. Where the
model's module returned one complex table (``freqs_cis``: Llama 4, DeepSeek V2) it returns the
handle once, and the attention's ``freqs_cis.to(device)`` is :meth:`RotaryPositions.to`.
"""
from __future__ import annotations

import copy
from typing import Optional, Union

import torch
from torch import nn

from ..._contexts import for_the_cache, tracing, untraced, warn_trace_keeps
from ..._locks import ForkSafeLock
from ..._rope_math import cos_sin_from_angles, rope_angles, seq_len_from_positions
from ...config import RopeConfig
from ... import ops

_ERR = "posenc_native.integrations.transformers"


class UnsupportedModelError(NotImplementedError, ValueError):
    """The model (type, transformers version or code) is not one :func:`patch` can route with proven
    equality; the message names the reason."""


def _integer(position_ids: torch.Tensor) -> torch.Tensor:
    """position_ids as the op takes them: int32 or int64 (narrower integers widened, as the unpatched
    model's float product takes them all); floating-point ones refused."""
    if position_ids.is_floating_point() or position_ids.is_complex():
        raise UnsupportedModelError(f"{_ERR}: the patched rotary embedding was given floating-point position_ids; "
                                    "the fused rotation takes integer positions (unpatch the model)")
    if position_ids.dtype not in (torch.int32, torch.int64):
        return position_ids.to(torch.int64)
    return position_ids


class RotaryPositions:
    """Positions and frequencies of one forward pass: what a patched model passes where transformers
    passes ``(cos, sin)``. The rotation itself happens in :meth:`rotate` (one fused kernel)."""

    __slots__ = ("positions", "inv_freq", "attention_factor", "interleaved", "routes", "pair_axes", "_negated")

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, interleaved: bool,
                 routes: Optional[dict] = None, pair_axes: Optional[tuple[int, ...]] = None):
        self.positions = positions
        # [rotary_dim / 2], or for an axis layout (MRoPE) the ops' [axes, rotary_dim / 2] form
        # (RopeConfig.op_inv_freq_on); positions are then [axes, B, S] (or [B, S]: the same id on every axis)
        self.inv_freq = inv_freq
        self.attention_factor = float(attention_factor)
        self.interleaved = bool(interleaved)
        # (module, function) -> Pairing proven for it at patch time; a rotation function not in here
        # refuses the handle rather than guess
        self.routes = routes or {}
        self.pair_axes = pair_axes  # RopeConfig.pair_axes of an axis layout, for cos_sin
        self._negated: Optional[torch.Tensor] = None  # -inv_freq, made once for rotations by -angle

    def rotate(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, layout: str = "bhsd",
               interleaved: Optional[bool] = None, inverse: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rotate q (and k) at these positions; ``bhsd`` is transformers' ``[B, H, S, D]``. Dims past
        ``2 * len(inv_freq)`` pass through (partial rotary). ``interleaved`` (the pairing of the
        rotation function that receives this handle) defaults to the handle's own; ``inverse`` turns
        by minus the angle (the negated frequencies: the float64 angle negates exactly)."""
        pos = self.positions
        if pos.dim() == 2 and pos.shape[0] == 1 and q.shape[0] != 1:
            pos = pos[0]  # transformers' [1, S] shared by every sequence of the batch (metadata only, no sync)
        elif layout == "thd" and pos.dim() == 3 and pos.shape[1] == 1:
            pos = pos[:, 0]  # an axial vision tower's [A, 1, N] for packed [N, H, D] tokens: [A, T]
        inv_freq = self.inv_freq
        if inverse:
            if self._negated is None:  # once per forward pass, not per layer
                self._negated = -inv_freq
            inv_freq = self._negated
        # apply_rope's one call path: at decode it skips the dispatcher (ops._FAST.rope)
        return (ops._rope if ops._FAST is None else ops._FAST.rope)(
            False, q, k, pos, None, inv_freq, self.attention_factor,
            self.interleaved if interleaved is None else interleaved, layout, 0, None, None, None, False)

    def trailing(self, n: int) -> "RotaryPositions":
        """This handle at its last ``n`` positions (a q shorter than k, rotated at k's last positions)."""
        return RotaryPositions(self.positions[..., self.positions.shape[-1] - n:], self.inv_freq, self.attention_factor,
                               self.interleaved, self.routes, self.pair_axes)

    def tiled(self, n: int) -> "RotaryPositions":
        """This handle with its positions ``n`` times over, one run after another (the keys of ``n`` memory
        frames, each at the current frame's positions: SAM 2's ``repeat_freqs_k``)."""
        pos = self.positions
        return RotaryPositions(pos.repeat(*(1,) * (pos.dim() - 1), n), self.inv_freq, self.attention_factor,
                               self.interleaved, self.routes, self.pair_axes)

    def to(self, device: Union[torch.device, str, torch.dtype, None] = None) -> "RotaryPositions":
        """This handle on ``device`` (itself when already there): what the complex-table attentions
        call on it (``position_embeddings.to(query_states.device)``), as on their ``freqs_cis``. A
        dtype changes nothing: the rotation computes in q's dtype from float64 angles."""
        if device is None or isinstance(device, torch.dtype) or (
                torch.device(device) == self.positions.device and torch.device(device) == self.inv_freq.device):
            return self
        return RotaryPositions(self.positions.to(device), self.inv_freq.to(device), self.attention_factor,
                               self.interleaved, self.routes, self.pair_axes)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Dropout on cos/sin (LASR's encoder, ``dropout_positions``) is the identity in eval mode or at
        p = 0, and stays so here; dropping single elements of cos/sin in training is no rotation, and
        is refused. Every other torch function on a handle fails as it would have (no silent stand-in)."""
        kwargs = kwargs or {}
        if func in (torch.nn.functional.dropout, torch.dropout) and args and isinstance(args[0], cls):
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
            if training and p > 0:
                raise UnsupportedModelError(f"{_ERR}: the model drops out elements of cos/sin (p={p}) in training: "
                                            "that is no rotation; unpatch the model to train it")
            return args[0]
        return NotImplemented

    def cos_sin(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers-style ``(cos, sin)`` ``[B, S, rotary_dim]`` (for code that needs the tensors)."""
        if self.pair_axes is None:
            angles = rope_angles(self.positions, self.inv_freq)
        else:  # one non-zero frequency per pair: the column sums are the frequencies, exactly
            pos = self.positions
            if pos.dim() == 2:
                pos = pos.expand(self.inv_freq.shape[0], *pos.shape)
            angles = rope_angles(pos, self.inv_freq.sum(0), self.pair_axes)
        return cos_sin_from_angles(angles, self.attention_factor, self.interleaved, dtype)

    def __repr__(self) -> str:
        return (f"RotaryPositions(positions={tuple(self.positions.shape)}, rotary_dim={2 * self.inv_freq.shape[-1]}, "
                f"attention_factor={self.attention_factor:g}, interleaved={self.interleaved}"
                + ("" if self.pair_axes is None else f", axes={self.inv_freq.shape[0]}") + ")")


class RowSelection:
    """Stands in, on one module instance, for a model method that selects rows of cos/sin (Qwen2.5-VL's
    tower puts them in window order: ``self.permute_input_for_window_attn(freq, window_index, seq_len)``
    for each of cos and sin). Tensors go to the method as before; a handle of per-token ids (an axial
    tower's ``[A, 1, N]``) gets the same rows of its ids, which the method's own code decides: it is run
    on the row numbers ``[N, 1]``, and its result is checked to be a selection of rows (the same method
    on random ``[N, 3]`` values must return those rows of them), else it refuses."""

    def __init__(self, method):
        self.method = method

    def __call__(self, table, *args, **kwargs):
        if not isinstance(table, RotaryPositions):
            return self.method(table, *args, **kwargs)
        pos = table.positions
        name = getattr(self.method, "__name__", "the method")
        if pos.dim() != 3 or pos.shape[1] != 1:
            raise UnsupportedModelError(f"{_ERR}: {name} selects rows of rotary positions {tuple(pos.shape)}, not of an "
                                        "axial tower's [axes, 1, tokens] ids; unpatch the model")
        n = pos.shape[-1]
        rows = self.method(torch.arange(n, dtype=torch.float64, device=pos.device)[:, None], *args, **kwargs)
        values = torch.rand(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(pos.device)
        picked = self.method(values, *args, **kwargs)
        index = rows.reshape(-1).long() if isinstance(rows, torch.Tensor) and rows.dim() == 2 and rows.shape[1] == 1 else None
        if (index is None or not torch.equal(rows.reshape(-1), index.to(rows.dtype)) or index.numel() == 0
                or int(index.min()) < 0 or int(index.max()) >= n or not isinstance(picked, torch.Tensor)
                or not torch.equal(picked, values[index])):
            raise UnsupportedModelError(f"{_ERR}: {name} does more to cos/sin than select rows of them; unpatch the model")
        return RotaryPositions(pos[..., index], table.inv_freq, table.attention_factor, table.interleaved,
                               table.routes, table.pair_axes)


class Regime:
    """The frequencies of one rotary configuration (one layer type) and how they follow the sequence
    length: ``static``; ``dynamic`` (NTK, mirroring transformers' growth/reset state); ``longrope``
    (short/long factors chosen on the device, no host sync)."""

    def __init__(self, rope: RopeConfig, rope_type: str, interleaved: bool, original: nn.Module,
                 original_max_position_embeddings: Optional[int] = None):
        self.rope = rope
        self.rope_type = rope_type
        self.attention_factor = float(rope.attention_factor)
        self.interleaved = bool(interleaved)
        self.routes: dict = {}  # (module, function) -> Pairing, filled by detect.plan
        # > 0: the model's own frequencies are the config's rounded to 16 bits (up to this relative error);
        # the fused op uses the config's, exactly (detect._ROUNDED_RTOL)
        self.rounded = 0.0
        self._watched = None  # (config, layer type, its rope fields at patch time): watch_config
        self._update_lock = ForkSafeLock()
        if "dynamic" in rope_type:  # transformers' test in dynamic_rope_update
            self.mode = "dynamic"
            # continue from the state the model's own module reached (it may have run long inputs)
            self.original_max_seq_len = int(original.original_max_seq_len)
            self.max_seq_len_cached = int(original.max_seq_len_cached)
        elif rope_type == "longrope":
            self.mode = "longrope"
            lo = int(original_max_position_embeddings)
            self.original_max_position_embeddings = lo
        else:
            if rope.needs_seq_len:
                raise UnsupportedModelError(
                    f"{_ERR}: RopeConfig says rope_type {rope_type!r} depends on the sequence length, but "
                    "transformers only updates frequencies for 'dynamic' and 'longrope'")
            self.mode = "static"
        if rope.mrope_section is not None and self.mode != "static":
            raise UnsupportedModelError(f"{_ERR}: MRoPE with {rope_type!r} frequencies (they follow the sequence "
                                        "length) is not supported")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_update_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("rounded", 0.0)  # pickled by a version without it
        self.__dict__.setdefault("_watched", None)
        self._update_lock = ForkSafeLock()

    @property
    def rotary_dim(self) -> int:
        return self.rope.rotary_dim

    def summary(self) -> str:
        mrope = self.rope.mrope_section
        return (f"{self.rope_type}, rotary_dim {self.rotary_dim}, attention_factor {self.attention_factor:g}"
                + ("" if mrope is None else f", MRoPE sections {list(mrope)} "
                   f"({'interleaved' if self.rope.mrope_interleaved else 'contiguous'})")
                + ("" if not self.rounded else f", the model's own frequencies rounded to 16 bits (up to "
                   f"{self.rounded:.2g} off): the config's exact ones used"))

    def _update_dynamic(self, position_ids: torch.Tensor) -> int:
        # Mirrors transformers' dynamic_frequency_update: grow past the longest sequence seen, reset
        # to the original frequencies when a sequence shorter than max_position_embeddings follows.
        # Returns the length whose frequencies this call uses.
        if tracing():  # read without recording; a trace keeps this call's frequencies
            with untraced():
                length = self._update_dynamic(position_ids)
            warn_trace_keeps(f"the dynamic NTK frequencies of sequence length {length}",
                             "the patched model's dynamic NTK follows the longest sequence seen, as transformers' "
                             "does, which a trace cannot", followed_by="Eager mode and torch.compile follow them.")
            return length
        seq_len = seq_len_from_positions(position_ids)  # the scheme needs the length (transformers syncs too)
        with self._update_lock:
            cached = self.max_seq_len_cached
            if seq_len > cached:
                self.max_seq_len_cached = seq_len
            if seq_len < self.original_max_seq_len and cached > self.original_max_seq_len:
                self.max_seq_len_cached = self.original_max_seq_len
            return self.max_seq_len_cached

    @property
    def num_axes(self) -> int:
        """Position rows the rotation reads (3 for MRoPE's time, height, width; 1 for plain RoPE)."""
        return self.rope.num_axes

    def watch_config(self, cfg, layer_type: Optional[str]) -> None:
        """For the modes whose frequencies transformers re-reads from the model's config while it runs
        (dynamic NTK's growth, LongRoPE's switch): the config's rope fields now, compared on each forward
        pass, so that a change made after patching (which the unpatched model would follow, and these
        frequencies, read once, would not) is refused rather than ignored."""
        self._watched = (cfg, layer_type, copy.deepcopy(_rope_fields(cfg, layer_type)))

    def _check_config(self) -> None:
        cfg, layer_type, then = self._watched
        if _rope_fields(cfg, layer_type) != then:
            raise UnsupportedModelError(
                f"{_ERR}: the model's rope configuration ({self.rope_type} frequencies, which follow it) changed "
                "after it was patched; unpatch the model and patch it again")

    def handle(self, position_ids: torch.Tensor, device: torch.device) -> RotaryPositions:
        # frequencies come from the config's own per-(device, regime) cache (RopeConfig.inv_freq_on)
        if self._watched is not None:
            self._check_config()
        if self.rope.mrope_section is not None:  # static (see __init__), in the ops' axis form
            return RotaryPositions(position_ids, self.rope.op_inv_freq_on(device), self.attention_factor,
                                   self.interleaved, self.routes, self.rope.pair_axes)
        if self.mode == "static":
            inv_freq = self.rope.inv_freq_on(device)
        elif self.mode == "dynamic":
            inv_freq = self.rope.inv_freq_on(device, self._update_dynamic(position_ids))
        else:  # one short/long choice for the whole batch, as transformers; chosen on the device (no sync)
            lo = self.original_max_position_embeddings
            is_long = position_ids.max() >= lo  # max + 1 > lo, without int32 positions wrapping at 2^31 - 1
            inv_freq = torch.where(is_long, self.rope.inv_freq_on(device, lo + 1), self.rope.inv_freq_on(device, lo))
        return RotaryPositions(position_ids, inv_freq, self.attention_factor, self.interleaved, self.routes)


def _rope_fields(cfg, layer_type: Optional[str]) -> tuple:
    """What transformers' dynamic and LongRoPE updates read from a model's config (as the values are)."""
    params = getattr(cfg, "rope_parameters", None)
    if layer_type is not None and isinstance(params, dict):
        params = params.get(layer_type)
    names = ("max_position_embeddings", "original_max_position_embeddings", "partial_rotary_factor", "head_dim")
    return (params, *(getattr(cfg, name, None) for name in names))


class AxisTableRegime:
    """The frequencies of a multi-axis rotary whose layout no :class:`RopeConfig` names, as the ops'
    axis form ``table`` ``[A, rotary_dim / 2]`` read from the module itself (:func:`.detect._axis_table`)
    and proven by the probe. Vision towers' axial rotaries (transformers' ``rope_type == "axial"``:
    Pixtral, Qwen3-VL's tower, ...; ``axis_last``: ids ``[N, A]``, one column per image axis) each pick
    their own pair -> (axis, band entry) order; a text decoder's MRoPE may too (ERNIE 4.5 VL
    pre-permutes its band; ids ``[A, B, S]``). Static: these types do not follow the sequence length.
    ``source`` says where the table came from (for ``describe``)."""

    mode = "static"
    rope = None  # no RopeConfig describes an arbitrary per-pair table

    def __init__(self, table: torch.Tensor, interleaved: bool, attention_factor: float, axis_last: bool = True,
                 source: str = "from the module's own inv_freq"):
        self.table = table.detach().to("cpu", torch.float64).contiguous()
        self.axis_last = bool(axis_last)
        self.rope_type = "axial" if self.axis_last else "default"  # transformers' name of what was read
        self.source = source
        self.interleaved = bool(interleaved)
        self.attention_factor = float(attention_factor)
        self.routes: dict = {}  # (module, function) -> Pairing, filled by detect.plan
        nonzero = self.table != 0
        self.pair_axes = tuple(int(a) for a in nonzero.to(torch.int8).argmax(0))  # axis 0 for a pair of angle 0
        self._on: dict = {}  # device -> table there (a new dict is published per device: readers take no lock)

    @property
    def rotary_dim(self) -> int:
        return 2 * self.table.shape[1]

    @property
    def num_axes(self) -> int:
        return self.table.shape[0]

    def summary(self) -> str:
        kind = "axial" if self.axis_last else "multi-axis"
        return (f"{kind} table of {self.num_axes} axes ({self.source}), rotary_dim {self.rotary_dim}, "
                f"attention_factor {self.attention_factor:g}, {'interleaved' if self.interleaved else 'half-split'}")

    def handle(self, position_ids: torch.Tensor, device: torch.device) -> RotaryPositions:
        """``position_ids``: ``[N, A]`` (``axis_last``), else as :meth:`PosencRotaryEmbedding.forward`
        normalised them (``[A, B, S]`` or ``[B, S]``: every axis alike)."""
        if not self.axis_last:
            return RotaryPositions(_integer(position_ids), self._table_on(device), self.attention_factor,
                                   self.interleaved, self.routes, self.pair_axes)
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or position_ids.shape[-1] != self.num_axes:
            shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else None
            raise UnsupportedModelError(
                f"{_ERR}: position_ids of shape {shape} do not match the patched axial rotary "
                f"embedding: expected [tokens, {self.num_axes}] (one column per axis), as at patch time")
        # [A, 1, N]: one row per axis, one sequence that every batch row of q shares
        return RotaryPositions(_integer(position_ids).t().unsqueeze(1), self._table_on(device),
                               self.attention_factor, self.interleaved, self.routes, self.pair_axes)

    def _table_on(self, device: torch.device) -> torch.Tensor:
        table = self._on.get(device)
        if table is None:
            with for_the_cache():
                table = self.table.to(device)
            self._on = {**self._on, device: table}
        return table


def _keys_as_unpatched(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict post hook: ``<prefix>original.<key>`` saved as ``<prefix><key>``."""
    inner = prefix + "original."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)


def _keys_as_patched(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict pre hook: ``<prefix><key>`` (an unpatched model's) loaded into ``<prefix>original.<key>``."""
    inner = prefix + "original."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


class PosencRotaryEmbedding(nn.Module):
    """Replaces a transformers ``*RotaryEmbedding``: returns :class:`RotaryPositions` instead of cos/sin.

    One :class:`Regime` per layer type (key ``None`` when the model has one rotary configuration).
    The replaced module is kept as the submodule ``original`` (so ``model.to(...)`` moves it and
    :func:`unpatch` puts it back); its buffers are not used while patched. ``complex_table``: the
    replaced module returned one complex ``freqs_cis``, so this one returns the handle once.
    """

    def __init__(self, original: nn.Module, regimes: dict[Optional[str], Regime], complex_table: bool = False):
        super().__init__()
        self.original = original
        self.regimes = regimes
        self.complex_table = complex_table
        # the replaced module's persistent buffers (ESM's inv_freq) keep their keys: a patched model's
        # state_dict is the unpatched one's, and loads either way
        self.register_state_dict_post_hook(_keys_as_unpatched)
        self.register_load_state_dict_pre_hook(_keys_as_patched)

    def __getattr__(self, name: str):
        # model code that reads the rotary module's plain attributes (config, layer_types, rope_type, ...)
        # reads the replaced module's
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_modules", {}).get("original")
            if name.startswith("_") or name in ("original", "regimes") or original is None:
                raise
            return getattr(original, name)

    @property
    def rope(self) -> Optional[RopeConfig]:
        """The :class:`RopeConfig` of the only (or first) layer type (None for an axial vision table)."""
        return next(iter(self.regimes.values())).rope

    def extra_repr(self) -> str:
        return "; ".join(f"{lt or 'all'}: {r.summary()}" for lt, r in self.regimes.items())

    def forward(self, x: torch.Tensor, position_ids: Optional[torch.Tensor] = None, layer_type: Optional[str] = None):
        regime = self.regimes.get(layer_type)
        if regime is None:
            raise UnsupportedModelError(f"{_ERR}: the patched rotary embedding was called with layer_type="
                                        f"{layer_type!r}; it serves {sorted(map(str, self.regimes))}")
        if isinstance(regime, AxisTableRegime) and regime.axis_last:
            handle = regime.handle(position_ids, x.device)
            return handle, handle
        if position_ids is None:
            position_ids = torch.arange(x.shape[1], device=x.device)[None]
        else:
            position_ids = _integer(position_ids)  # (the op's own error would not say to unpatch)
        if position_ids.dim() > 2:
            axes = regime.num_axes
            if axes == 1 or position_ids.dim() != 3 or position_ids.shape[0] not in (1, axes):
                raise UnsupportedModelError(
                    f"{_ERR}: position_ids of shape {tuple(position_ids.shape)} "
                    + ("(multimodal rope sections?) are not supported by the patched rotary embedding" if axes == 1
                       else f"do not match its MRoPE layout: expected [{axes}, batch, seq] (one row per axis) or "
                            "[batch, seq]"))
            if position_ids.shape[0] == 1 and axes != 1:
                position_ids = position_ids[0]  # transformers expands one row to every axis
        handle = regime.handle(position_ids, x.device)
        return handle if self.complex_table else (handle, handle)  # unpacked by the attention as `cos, sin`

    @torch.no_grad()
    def sync_original(self) -> None:
        """Bring the replaced module's dynamic-NTK state to ours (by running its own update code)."""
        regime = self.regimes.get(None)
        if regime is None or regime.mode != "dynamic":
            return
        orig = self.original
        if int(orig.max_seq_len_cached) == regime.max_seq_len_cached:
            return
        buf = getattr(orig, "inv_freq", None)
        if buf is not None and buf.is_meta:
            return
        device = buf.device if isinstance(buf, torch.Tensor) else torch.device("cpu")
        x = torch.zeros((), device=device)
        length = regime.original_max_seq_len
        if length >= 2:  # below max_position_embeddings: resets a grown state
            orig(x, torch.tensor([[length - 2]], device=device))
        if regime.max_seq_len_cached > length:  # then grow to our length
            orig(x, torch.tensor([[regime.max_seq_len_cached - 1]], device=device))
