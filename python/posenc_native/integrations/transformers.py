"""Swap the rotary path of a loaded Hugging Face ``transformers`` model for posenc's fused kernels.

    from posenc_native.integrations.transformers import patch, unpatch
    model = AutoModelForCausalLM.from_pretrained(...)
    patch(model)      # same outputs, no cos/sin tensors, q and k rotated in one fused kernel
    ...
    unpatch(model)    # the model's own rotary path again

Frequencies come from :meth:`posenc_native.RopeConfig.from_hf` (float64, every scaling scheme),
cross-checked at patch time against the frequencies the model's own rotary module computed, so a
config the two libraries read differently fails at ``patch`` rather than producing other logits.

Families (transformers 5.x) and how each is routed:

================  ======================================================================
llama, mistral,   ``model.rotary_emb`` (the module that computes cos/sin once per forward)
qwen2, qwen3,     is replaced by :class:`PosencRotaryEmbedding`, which returns a
phi3, gpt_neox    :class:`RotaryPositions` (positions + frequencies, no cos/sin) in place of
                  ``(cos, sin)``. The attention modules unpack it as ``cos, sin`` and call
                  their module's ``apply_rotary_pos_emb(q, k, cos, sin)``; that module-level
                  name is wrapped by a dispatcher that rotates q and k with one
                  ``posenc.rope`` call (layout ``bhsd``) when it receives a
                  :class:`RotaryPositions`, and calls the original function otherwise.
                  Partial rotary (GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``):
                  the kernel passes dims past ``rotary_dim`` through.
                  Dynamic NTK: the growth/reset state of transformers'
                  ``dynamic_rope_update`` is mirrored exactly (frequencies follow the
                  longest sequence seen, reset below ``max_position_embeddings``).
                  LongRoPE: long factors when ``max(position_ids) + 1 >
                  original_max_position_embeddings``, else short, chosen on the device.
gptj              GPT-J rotates inside its attention from a per-layer sin/cos table
                  (``embed_positions``). Each attention's ``_get_embed_positions`` is
                  overridden (instance attribute) to return a stand-in that survives the
                  ``gather``/``split`` GPT-J does on the table, and the module-level
                  ``apply_rotary_pos_emb(tensor, sin, cos)`` is wrapped the same way as
                  above: interleaved pairs, layout ``bshd``, k and q in two calls (GPT-J's
                  forward rotates them separately).
================  ======================================================================

Design trade-off (documented on purpose): transformers' attention forwards look
``apply_rotary_pos_emb`` up in their module's globals at call time, so routing the rotation
without copying each attention forward means wrapping that global. The wrapper is installed once
per modeling module while at least one model of that module is patched (reference counted) and
decides per call by the *type* of its ``cos`` argument: unpatched models of the same family
(whose rotary module still returns tensors) go to the original function unchanged, so nothing
leaks across models; the cost for them is one ``isinstance`` per call while another model is
patched. The alternative (replacing each attention's ``forward`` with a copy that calls posenc)
would avoid touching globals but silently drifts whenever transformers edits a forward; here a
forward that no longer calls ``apply_rotary_pos_emb`` or no longer takes
``position_embeddings`` is detected and refused at ``patch`` time.

Notes and limits:

- ``torch.compile(..., fullgraph=True)`` traces a patched model with fixed frequencies through
  the stand-ins (checked: Llama with YaRN and GPT-J, ``aot_eager`` backend); dynamic NTK reads
  ``max(position_ids)`` on the host, as transformers does.
- A deep copy or pickle of a patched model is patched too and is unpatched on its own; a patched
  model dropped without :func:`unpatch` leaves the wrapper installed (harmless: it hands tensors
  to the original function).
- Code outside the model that calls ``model.model.rotary_emb(...)`` itself and expects
  ``(cos, sin)`` tensors gets a :class:`RotaryPositions` (its :meth:`~RotaryPositions.cos_sin`
  builds them). Per-layer-type rotary (``layer_type``) is not supported. Other code that
  replaces a modeling module's ``apply_rotary_pos_emb`` after posenc wrapped it is detected
  (``RuntimeError`` at the next patch, a warning at unpatch).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import threading
import types
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from .._rope_math import cos_sin_from_angles, rope_angles, seq_len_from_positions
from ..config import RopeConfig
from ..ops import apply_rope

__all__ = [
    "patch",
    "unpatch",
    "patched",
    "is_patched",
    "supported_model_types",
    "RotaryPositions",
    "PosencRotaryEmbedding",
    "UnsupportedModelError",
]

_RECORD_ATTR = "_posenc_rope_patch"
_GPTJ_OVERRIDE = "_get_embed_positions"
_ROTATION_NAME = "apply_rotary_pos_emb"


class UnsupportedModelError(NotImplementedError, ValueError):
    """The model (type, transformers version or code) is not one :func:`patch` knows how to route."""


@dataclass(frozen=True)
class _Family:
    kind: str  # "position_embeddings": model-level rotary module; "gptj": per-attention sin/cos table


_FAMILIES: dict[str, _Family] = {
    "llama": _Family("position_embeddings"),
    "mistral": _Family("position_embeddings"),
    "qwen2": _Family("position_embeddings"),
    "qwen3": _Family("position_embeddings"),
    "phi3": _Family("position_embeddings"),
    "gpt_neox": _Family("position_embeddings"),
    "gptj": _Family("gptj"),
}


def supported_model_types() -> tuple[str, ...]:
    """The ``config.model_type`` values :func:`patch` accepts."""
    return tuple(sorted(_FAMILIES))


def _modeling_module_name(model_type: str) -> str:
    return f"transformers.models.{model_type}.modeling_{model_type}"


# --------------------------------------------------------------------------------------------
# What flows through the model in place of (cos, sin)


class RotaryPositions:
    """Positions and frequencies of one forward pass: what a patched model passes where transformers
    passes ``(cos, sin)``. The rotation itself happens in :meth:`rotate` (one fused kernel)."""

    __slots__ = ("positions", "inv_freq", "attention_factor", "interleaved")

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, interleaved: bool):
        self.positions = positions
        self.inv_freq = inv_freq
        self.attention_factor = float(attention_factor)
        self.interleaved = bool(interleaved)

    def _positions_for(self, batch: int) -> torch.Tensor:
        pos = self.positions
        if pos.dim() == 2 and pos.shape[0] == 1 and batch != 1:
            pos = pos[0]  # transformers' [1, S] shared by every sequence of the batch
        return pos

    def rotate(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, layout: str = "bhsd"
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rotate q (and k) at these positions; ``bhsd`` is transformers' ``[B, H, S, D]``."""
        return apply_rope(q, k, self._positions_for(q.shape[0]), inv_freq=self.inv_freq,
                          attention_factor=self.attention_factor, interleaved=self.interleaved, layout=layout)

    def cos_sin(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers-style ``(cos, sin)`` ``[B, S, rotary_dim]`` (for code that needs the tensors)."""
        return cos_sin_from_angles(rope_angles(self.positions, self.inv_freq), self.attention_factor,
                                   self.interleaved, dtype)

    def __repr__(self) -> str:
        return (f"RotaryPositions(positions={tuple(self.positions.shape)}, rotary_dim={2 * self.inv_freq.shape[-1]}, "
                f"attention_factor={self.attention_factor:g}, interleaved={self.interleaved})")


class _GPTJSinCos:
    """Stands in for GPT-J's sin/cos table through ``torch.gather``, ``.to`` and ``torch.split``."""

    __slots__ = ("rotary",)
    shape = torch.Size((1, 1, 2))  # GPT-J reads shape[-1] to repeat position ids and to split sin | cos

    def __init__(self, rotary: RotaryPositions):
        self.rotary = rotary

    def to(self, *args, **kwargs) -> "_GPTJSinCos":
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.gather:
            return args[0]
        if func is torch.split:
            return args[0], args[0]
        raise NotImplementedError(
            f"posenc_native.integrations.transformers: GPT-J's attention applied {getattr(func, '__name__', func)!r} "
            "to its sin/cos table, which the patch does not expect; this transformers version's GPT-J is not "
            "supported (unpatch the model)")


class PosencRotaryEmbedding(nn.Module):
    """Replaces a transformers ``*RotaryEmbedding``: returns :class:`RotaryPositions` instead of cos/sin.

    The replaced module is kept as the submodule ``original`` (so ``model.to(...)`` moves it and
    :func:`unpatch` puts it back); its buffers are not used while patched.
    """

    def __init__(self, rope: RopeConfig, original: nn.Module, *, rope_type: str,
                 original_max_position_embeddings: Optional[int] = None):
        super().__init__()
        self.original = original
        self.rope = rope
        self.rope_type = rope_type
        self.attention_factor = float(rope.attention_factor)
        self.interleaved = bool(rope.interleaved)
        if "dynamic" in rope_type:  # transformers' test in dynamic_rope_update
            self.mode = "dynamic"
            # continue from the state the model's own module reached (it may have run long inputs)
            self.original_max_seq_len = int(original.original_max_seq_len)
            self.max_seq_len_cached = int(original.max_seq_len_cached)
            self._state_lock = threading.Lock()  # the growth/reset state is shared by concurrent callers
        elif rope_type == "longrope":
            self.mode = "longrope"
            lo = int(original_max_position_embeddings)
            self.original_max_position_embeddings = lo
        else:
            if rope.needs_seq_len:
                raise UnsupportedModelError(
                    f"posenc_native.integrations.transformers: RopeConfig says rope_type {rope_type!r} depends on "
                    "the sequence length, but transformers only updates frequencies for 'dynamic' and 'longrope'")
            self.mode = "static"

    def extra_repr(self) -> str:
        return (f"rope_type={self.rope_type!r}, rotary_dim={self.rope.rotary_dim}, "
                f"attention_factor={self.attention_factor:g}")

    def _update_dynamic(self, position_ids: torch.Tensor) -> int:
        # Mirrors transformers' dynamic_frequency_update: grow past the longest sequence seen, reset
        # to the original frequencies when a sequence shorter than max_position_embeddings follows.
        # Returns the length whose frequencies this call uses.
        seq_len = seq_len_from_positions(position_ids)
        with self._state_lock:
            cached = self.max_seq_len_cached
            if seq_len > cached:
                self.max_seq_len_cached = seq_len
            if seq_len < self.original_max_seq_len and cached > self.original_max_seq_len:
                self.max_seq_len_cached = self.original_max_seq_len
            return self.max_seq_len_cached

    def forward(self, x: torch.Tensor, position_ids: Optional[torch.Tensor] = None, layer_type: Optional[str] = None):
        if layer_type is not None:
            raise UnsupportedModelError("posenc_native.integrations.transformers: per-layer-type rotary embeddings "
                                        f"(layer_type={layer_type!r}) are not supported")
        if position_ids is None:
            position_ids = torch.arange(x.shape[1], device=x.device)[None]
        device = x.device
        if self.mode == "dynamic":
            inv_freq = self.rope.inv_freq_on(device, self._update_dynamic(position_ids))
        elif self.mode == "longrope":
            # one short/long choice for the whole batch, as transformers; chosen on the device (no sync)
            lo = self.original_max_position_embeddings
            is_long = (position_ids.max() + 1 > lo).to(device)
            inv_freq = torch.where(is_long, self.rope.inv_freq_on(device, lo + 1), self.rope.inv_freq_on(device, lo))
        else:
            inv_freq = self.rope.inv_freq_on(device)
        handle = RotaryPositions(position_ids, inv_freq, self.attention_factor, self.interleaved)
        return handle, handle  # unpacked by the attention forward as `cos, sin`

    @torch.no_grad()
    def sync_original(self) -> None:
        """Bring the replaced module's dynamic-NTK state to ours (by running its own update code)."""
        if self.mode != "dynamic":
            return
        orig = self.original
        if int(orig.max_seq_len_cached) == self.max_seq_len_cached:
            return
        buf = getattr(orig, "inv_freq", None)
        device = buf.device if isinstance(buf, torch.Tensor) else torch.device("cpu")
        if buf is not None and buf.is_meta:
            return
        x = torch.zeros((), device=device)
        length = self.original_max_seq_len
        if length >= 2:  # below max_position_embeddings: resets a grown state
            orig(x, torch.tensor([[length - 2]], device=device))
        if self.max_seq_len_cached > length:  # then grow to our length
            orig(x, torch.tensor([[self.max_seq_len_cached - 1]], device=device))


class _GPTJRotary:
    """The per-attention ``_get_embed_positions`` override of a patched GPT-J."""

    def __init__(self, rope: RopeConfig, attention_factor: float):
        self.rope = rope
        self.attention_factor = attention_factor

    def __call__(self, position_ids: torch.Tensor) -> _GPTJSinCos:
        inv_freq = self.rope.inv_freq_on(position_ids.device)
        return _GPTJSinCos(RotaryPositions(position_ids, inv_freq, self.attention_factor, True))


# --------------------------------------------------------------------------------------------
# The module-level rotation functions (reference counted, one wrapper per modeling module)

_LOCK = threading.RLock()
_INSTALLED: dict[str, list] = {}  # module name -> [original function, wrapper, number of patched models]


def _wrap_qk_rotation(original: Callable) -> Callable:
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if isinstance(cos, RotaryPositions):
            unsqueeze_dim = args[0] if args else kwargs.get("unsqueeze_dim", 1)
            if unsqueeze_dim not in (1, 2):
                raise ValueError(f"posenc: apply_rotary_pos_emb with unsqueeze_dim={unsqueeze_dim} is not supported")
            return cos.rotate(q, k, layout="bhsd" if unsqueeze_dim == 1 else "bshd")
        return original(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb.__posenc_original__ = original
    return apply_rotary_pos_emb


def _wrap_gptj_rotation(original: Callable) -> Callable:
    @functools.wraps(original)
    def apply_rotary_pos_emb(tensor, sin, cos, *args, **kwargs):
        if isinstance(sin, _GPTJSinCos):
            return sin.rotary.rotate(tensor, None, layout="bshd")[0]  # GPT-J rotates [B, S, H, R]
        return original(tensor, sin, cos, *args, **kwargs)

    apply_rotary_pos_emb.__posenc_original__ = original
    return apply_rotary_pos_emb


def _install(module_name: str, make_wrapper: Callable[[Callable], Callable]) -> None:
    module = sys.modules[module_name]
    with _LOCK:
        entry = _INSTALLED.get(module_name)
        current = getattr(module, _ROTATION_NAME)
        if entry is None:
            if getattr(current, "__posenc_original__", None) is not None:  # a stale wrapper (module reloaded?)
                current = current.__posenc_original__
            wrapper = make_wrapper(current)
            setattr(module, _ROTATION_NAME, wrapper)
            _INSTALLED[module_name] = [current, wrapper, 1]
            return
        if current is not entry[1]:
            raise RuntimeError(
                f"posenc_native.integrations.transformers: {module_name}.{_ROTATION_NAME} was replaced by other code "
                "after posenc wrapped it, so models patched by posenc would break; undo that replacement first")
        entry[2] += 1


def _uninstall(module_name: str) -> None:
    module = sys.modules.get(module_name)
    with _LOCK:
        entry = _INSTALLED.get(module_name)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] > 0:
            return
        del _INSTALLED[module_name]
        if module is None:
            return
        if getattr(module, _ROTATION_NAME) is entry[1]:
            setattr(module, _ROTATION_NAME, entry[0])
        else:
            warnings.warn(f"posenc_native.integrations.transformers: {module_name}.{_ROTATION_NAME} was replaced by "
                          "other code after posenc wrapped it; leaving that replacement in place", RuntimeWarning,
                          stacklevel=3)


# --------------------------------------------------------------------------------------------
# patch / unpatch


_WRAPPERS: dict[str, Callable[[Callable], Callable]] = {"qk": _wrap_qk_rotation, "gptj": _wrap_gptj_rotation}


class _PatchRecord:
    """What :func:`patch` changed, by path inside the model (so a deep copy or a pickle of a patched
    model carries a record that refers to its own modules, and holds its own reference on the
    module-level wrapper)."""

    def __init__(self, model_type: str, rope: RopeConfig, module_name: str, wrapper: str):
        self.model_type = model_type
        self.rope = rope
        self.module_name = module_name
        self.wrapper = wrapper
        self.rotary_paths: list[tuple[str, str]] = []  # (parent module path, attribute) of swapped rotary modules
        self.gptj_paths: list[str] = []  # attention modules with the _get_embed_positions override
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            importlib.import_module(self.module_name)
            _install(self.module_name, _WRAPPERS[self.wrapper])
            self.installed = True

    def release(self) -> None:
        if self.installed:
            self.installed = False
            _uninstall(self.module_name)

    def _clone(self) -> "_PatchRecord":
        new = _PatchRecord(self.model_type, self.rope, self.module_name, self.wrapper)
        new.rotary_paths = list(self.rotary_paths)
        new.gptj_paths = list(self.gptj_paths)
        return new

    def __deepcopy__(self, memo) -> "_PatchRecord":
        new = self._clone()
        if self.installed:
            new.install()
        return new

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        installed = state.pop("installed", False)
        self.__dict__.update(state)
        self.installed = False
        if installed:
            self.install()

    def restore(self, model: nn.Module) -> None:
        for parent_path, attr in reversed(self.rotary_paths):
            parent = model.get_submodule(parent_path)
            ours = getattr(parent, attr, None)
            if isinstance(ours, PosencRotaryEmbedding):
                ours.sync_original()
                setattr(parent, attr, ours.original)
            else:
                warnings.warn(f"posenc_native.integrations.transformers: {parent_path}.{attr} was replaced after "
                              "patch; leaving it", RuntimeWarning, stacklevel=3)
        for path in reversed(self.gptj_paths):
            attn = model.get_submodule(path)
            if isinstance(attn.__dict__.get(_GPTJ_OVERRIDE), _GPTJRotary):
                del attn.__dict__[_GPTJ_OVERRIDE]
        self.release()


def _forward_code(cls: type) -> Optional[types.CodeType]:
    fn = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    return getattr(fn, "__code__", None)


def _calls_rotation(cls: type, *needed: str) -> bool:
    code = _forward_code(cls)
    return code is not None and all(n in code.co_names or n in code.co_varnames for n in needed)


def _model_type(model: nn.Module) -> str:
    if not isinstance(model, nn.Module):
        raise TypeError(f"posenc_native.integrations.transformers.patch expects a torch.nn.Module, got {type(model)}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise UnsupportedModelError(
            f"posenc_native.integrations.transformers: {type(model).__name__} has no config.model_type; patch "
            "expects a transformers PreTrainedModel")
    return model_type


def _rope_config(model: nn.Module, model_type: str) -> RopeConfig:
    try:
        return RopeConfig.from_hf(model.config, layer_type=None)
    except (NotImplementedError, ValueError, KeyError, TypeError) as e:
        raise UnsupportedModelError(
            f"posenc_native.integrations.transformers: cannot read the rotary configuration of model type "
            f"{model_type!r}: {e}") from e


def _head_dim(attn: nn.Module) -> Optional[int]:
    for name in ("head_dim", "head_size"):
        v = getattr(attn, name, None)
        if isinstance(v, int):
            return v
    return None


def _close(ours: torch.Tensor, theirs: torch.Tensor, rtol: float = 1e-5) -> tuple[bool, float]:
    theirs = theirs.detach().to("cpu", torch.float64)
    ours = ours.detach().to("cpu", torch.float64)
    if ours.shape != theirs.shape:
        return False, float("inf")
    err = ((ours - theirs).abs() / theirs.abs().clamp_min(1e-30)).max().item() if ours.numel() else 0.0
    return err <= rtol, err


def _check_frequencies(model_type: str, what: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    ok, err = _close(ours, theirs)
    if not ok:
        raise ValueError(
            f"posenc_native.integrations.transformers: for model type {model_type!r}, RopeConfig.from_hf's {what} "
            f"disagree with the model's own rotary embedding (shape {tuple(ours.shape)} vs {tuple(theirs.shape)}, "
            f"max relative difference {err:.3g}); not patching. Pass check=False to patch anyway.")


def _check_against_model(model: nn.Module, model_type: str, rope: RopeConfig, hf_rotary: nn.Module,
                         rope_type: str, lo: Optional[int]) -> None:
    theirs = getattr(hf_rotary, "original_inv_freq", None)
    if theirs is None:
        theirs = getattr(hf_rotary, "inv_freq", None)
    if not isinstance(theirs, torch.Tensor) or theirs.is_meta:
        return  # nothing materialised to compare with
    if "dynamic" in rope_type:
        length = int(hf_rotary.original_max_seq_len)
        _check_frequencies(model_type, "frequencies", rope.inv_freq(seq_len=length), theirs)
    elif rope_type == "longrope":
        _check_frequencies(model_type, "short-factor frequencies", rope.inv_freq(seq_len=lo), theirs)
    else:
        _check_frequencies(model_type, "frequencies", rope.inv_freq(seq_len=None), theirs)
    if rope_type in ("longrope",) or "dynamic" in rope_type:
        # the sequence-length-dependent branch, computed by transformers' own init function
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        init = ROPE_INIT_FUNCTIONS.get(rope_type)
        if init is not None:
            seq_len = lo + 1 if rope_type == "longrope" else 2 * int(hf_rotary.original_max_seq_len) + 3
            their_long, _ = init(model.config, None, seq_len=seq_len)
            _check_frequencies(model_type, f"frequencies at seq_len={seq_len}", rope.inv_freq(seq_len=seq_len),
                               their_long)
    theirs_af = float(getattr(hf_rotary, "attention_scaling", 1.0))
    if abs(float(rope.attention_factor) - theirs_af) > 1e-6 * max(1.0, abs(theirs_af)):
        raise ValueError(
            f"posenc_native.integrations.transformers: for model type {model_type!r}, RopeConfig.from_hf's "
            f"attention_factor {float(rope.attention_factor)!r} disagrees with the model's attention_scaling "
            f"{theirs_af!r}; not patching. Pass check=False to patch anyway.")


def _find(model: nn.Module, module_name: str, suffix: str) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules()
            if type(m).__module__ == module_name and type(m).__name__.endswith(suffix)]


def _already_patched_inside(model: nn.Module) -> Optional[str]:
    for name, m in model.named_modules():
        if name and getattr(m, _RECORD_ATTR, None) is not None:
            return name
        if isinstance(m, PosencRotaryEmbedding) or isinstance(m.__dict__.get(_GPTJ_OVERRIDE), _GPTJRotary):
            return name or "<model>"
    return None


def _patch_position_embeddings(model: nn.Module, record: _PatchRecord, check: bool) -> None:
    model_type, module_name, rope = record.model_type, record.module_name, record.rope
    rotaries = _find(model, module_name, "RotaryEmbedding")
    attentions = [(n, m) for n, m in _find(model, module_name, "Attention")
                  if _calls_rotation(type(m), _ROTATION_NAME)]
    if not rotaries or not attentions:
        raise UnsupportedModelError(
            f"posenc_native.integrations.transformers: found no {'rotary embedding' if not rotaries else 'attention'} "
            f"module of {module_name} calling {_ROTATION_NAME} in this {model_type!r} model; the installed "
            "transformers' code is laid out differently from what patch supports (transformers 5.x)")
    for name, attn in attentions:
        if not _calls_rotation(type(attn), "position_embeddings"):
            raise UnsupportedModelError(
                f"posenc_native.integrations.transformers: {type(attn).__name__}.forward takes no "
                "position_embeddings in the installed transformers; not supported")
        hd = _head_dim(attn)
        if hd is not None and hd != rope.head_dim:
            raise ValueError(f"posenc_native.integrations.transformers: {name} has head_dim {hd} but "
                             f"RopeConfig.from_hf gives head_dim {rope.head_dim} for model type {model_type!r}")
    if rope.interleaved:
        raise ValueError(f"posenc_native.integrations.transformers: RopeConfig.from_hf says {model_type!r} pairs "
                         "interleaved dims, but its transformers code rotates half-split pairs")

    rope_params = getattr(model.config, "rope_parameters", None) or {}
    replaced: list[tuple[str, str, PosencRotaryEmbedding]] = []
    for name, hf_rotary in rotaries:
        if not name:
            raise UnsupportedModelError("posenc_native.integrations.transformers: patch the model that holds the "
                                        "rotary embedding, not the rotary embedding itself")
        rope_type = getattr(hf_rotary, "rope_type", None)
        if not isinstance(rope_type, str):
            raise UnsupportedModelError(
                f"posenc_native.integrations.transformers: {name} ({type(hf_rotary).__name__}) has rope_type "
                f"{rope_type!r}; per-layer-type rotary embeddings are not supported")
        lo = rope_params.get("original_max_position_embeddings") if rope_type == "longrope" else None
        if rope_type == "longrope" and lo is None:
            raise UnsupportedModelError(f"posenc_native.integrations.transformers: longrope config of {model_type!r} "
                                        "has no rope_parameters['original_max_position_embeddings']")
        if 2 * int(getattr(hf_rotary, "inv_freq").shape[-1]) != rope.rotary_dim:
            raise ValueError(
                f"posenc_native.integrations.transformers: RopeConfig.from_hf gives rotary_dim {rope.rotary_dim} "
                f"for model type {model_type!r} but the model rotates {2 * hf_rotary.inv_freq.shape[-1]} dims")
        if check:
            _check_against_model(model, model_type, rope, hf_rotary, rope_type, lo)
        ours = PosencRotaryEmbedding(rope, hf_rotary, rope_type=rope_type, original_max_position_embeddings=lo)
        parent_path, _, attr = name.rpartition(".")
        replaced.append((parent_path, attr, ours))

    record.install()
    for parent_path, attr, ours in replaced:
        setattr(model.get_submodule(parent_path), attr, ours)
        record.rotary_paths.append((parent_path, attr))


def _patch_gptj(model: nn.Module, record: _PatchRecord, check: bool) -> None:
    model_type, module_name, rope = record.model_type, record.module_name, record.rope
    attentions = [(n, m) for n, m in _find(model, module_name, "Attention2") + _find(model, module_name, "Attention")
                  if _calls_rotation(type(m), _ROTATION_NAME, _GPTJ_OVERRIDE)]
    if not attentions:
        raise UnsupportedModelError(
            f"posenc_native.integrations.transformers: found no GPT-J attention calling {_ROTATION_NAME} and "
            f"{_GPTJ_OVERRIDE} in this model; the installed transformers' GPT-J is not supported")
    if not rope.interleaved:
        raise ValueError("posenc_native.integrations.transformers: RopeConfig.from_hf says GPT-J pairs half-split "
                         "dims, but GPT-J rotates interleaved pairs (2i, 2i+1)")
    for name, attn in attentions:
        hd, rd = attn.head_dim, (attn.rotary_dim or attn.head_dim)
        if rope.head_dim != hd or rope.rotary_dim != rd:
            raise ValueError(
                f"posenc_native.integrations.transformers: {name} has head_dim {hd} and rotary_dim {rd} but "
                f"RopeConfig.from_hf gives {rope.head_dim} and {rope.rotary_dim} for model type {model_type!r}")
    if rope.needs_seq_len:
        raise UnsupportedModelError("posenc_native.integrations.transformers: GPT-J has no sequence-length "
                                    "dependent rotary scaling, but RopeConfig.from_hf returned one")
    if check:
        table = getattr(attentions[0][1], "embed_positions", None)  # rows [sin | cos] of position * inv_freq
        if isinstance(table, torch.Tensor) and not table.is_meta and table.shape[0] > 1:
            theirs = table[1, : table.shape[-1] // 2].to("cpu", torch.float64)  # sin(1 * inv_freq)
            ours = torch.sin(rope.inv_freq())
            if ours.shape != theirs.shape or not torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6):
                raise ValueError("posenc_native.integrations.transformers: RopeConfig.from_hf's frequencies disagree "
                                 "with GPT-J's own sin/cos table; not patching. Pass check=False to patch anyway.")
        if float(rope.attention_factor) != 1.0:
            raise ValueError("posenc_native.integrations.transformers: GPT-J has no attention factor, but "
                             f"RopeConfig.from_hf gives {rope.attention_factor}")
    rotary = _GPTJRotary(rope, float(rope.attention_factor))

    record.install()
    for name, attn in attentions:
        attn.__dict__[_GPTJ_OVERRIDE] = rotary  # instance attribute shadows the method
        record.gptj_paths.append(name)


def patch(model: nn.Module, *, check: bool = True) -> nn.Module:
    """Route the rotary embedding of a transformers ``model`` through posenc's fused kernels.

    Supported ``config.model_type``: see :func:`supported_model_types`. Anything else raises
    :class:`UnsupportedModelError` (a ``NotImplementedError`` and ``ValueError``) naming the type.
    Patching a patched model returns it unchanged. With ``check`` (default) the frequencies and
    attention factor from :meth:`RopeConfig.from_hf` are compared with the ones the model's own
    rotary code computed, and a disagreement raises ``ValueError`` before anything is changed.

    Returns ``model``, patched in place. Undo with :func:`unpatch`.
    """
    model_type = _model_type(model)
    if model_type in ("t5", "mt5", "umt5"):  # relative position bias, no rotary: integrations/t5.py
        from . import t5
        return t5.patch(model, check=check)
    if getattr(model, _RECORD_ATTR, None) is not None:
        return model  # idempotent
    family = _FAMILIES.get(model_type)
    if family is None:
        raise UnsupportedModelError(
            f"posenc_native.integrations.transformers: model type {model_type!r} is not supported "
            f"(supported: {', '.join(supported_model_types())})")
    inside = _already_patched_inside(model)
    if inside is not None:
        raise ValueError(f"posenc_native.integrations.transformers: part of this model ({inside}) is already patched; "
                         "unpatch it there first")
    module_name = _modeling_module_name(model_type)
    if module_name not in sys.modules:
        raise UnsupportedModelError(f"posenc_native.integrations.transformers: {module_name} is not imported; is "
                                    f"this {model_type!r} model built from transformers' own code?")
    rope = _rope_config(model, model_type)
    record = _PatchRecord(model_type, rope, module_name, "gptj" if family.kind == "gptj" else "qk")
    try:
        if family.kind == "gptj":
            _patch_gptj(model, record, check)
        else:
            _patch_position_embeddings(model, record, check)
    except BaseException:
        record.restore(model)
        raise
    model.__dict__[_RECORD_ATTR] = record
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the model's own rotary path (exactly the modules and functions :func:`patch` replaced).

    Raises ``ValueError`` if the model is not patched.
    """
    from . import t5
    if t5.is_patched(model):
        return t5.unpatch(model)
    record = getattr(model, "__dict__", {}).get(_RECORD_ATTR)
    if record is None:
        raise ValueError(f"posenc_native.integrations.transformers.unpatch: this {type(model).__name__} is not "
                         "patched by posenc")
    del model.__dict__[_RECORD_ATTR]
    record.restore(model)
    return model


def is_patched(model: nn.Module) -> bool:
    """Whether :func:`patch` was applied to ``model`` (and not undone)."""
    from . import t5
    return getattr(model, "__dict__", {}).get(_RECORD_ATTR) is not None or t5.is_patched(model)


@contextlib.contextmanager
def patched(model: nn.Module, *, check: bool = True) -> Iterator[nn.Module]:
    """``with patched(model): ...`` runs the block with posenc's rotary path, then restores the model's own."""
    was = is_patched(model)
    patch(model, check=check)
    try:
        yield model
    finally:
        if not was:
            unpatch(model)
