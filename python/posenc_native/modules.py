"""nn.Modules over the kernels, including the class names used in the seed articles."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from . import _fx, ops
from ._contexts import static_int, tracing, untraced
from ._derived_buffers import DerivedBuffers
from ._forward_ad import tangents
from ._rope_math import cos_sin_from_angles, rope_angles, rotate_every_two, rotate_half
from .config import RopeConfig, YarnScaling

__all__ = ["SinusoidalPositionalEncoding", "LearnablePositionalEncoding", "RotaryEmbedding",
           "RoPEPositionalEncoding", "YaRNPositionalEncoding"]


class SinusoidalPositionalEncoding(DerivedBuffers):
    """Fixed sinusoidal encodings added to ``x [batch, seq, d_model]`` (Vaswani et al.).

    Keeps the seed articles' ``pe`` buffer ``[1, max_len, d_model]`` (float32, interleaved sin/cos,
    recomputed on every move: a dtype cast cannot round it) for code that reads it, but ``forward`` adds the encoding with the fused native op, which
    computes it on the fly: sequences longer than ``max_len`` work too.
    """

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self._register_derived_buffers()

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"pe": ops.sinusoidal_table(self.max_len, self.d_model).unsqueeze(0)}

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript: the op itself, as ops.add_sinusoidal calls it
            if x.size(-1) != self.d_model:
                raise ValueError(f"x's last dim must be d_model={self.d_model}, got shape {x.shape}")
            return torch.ops.posenc.add_sinusoidal(x, None, 1.0, 10000.0, True, 0.0, 1.0, False, offset)
        else:
            node = _fx.module_node(self, x, offset)
            if node is not None:
                return node  # torch.fx.symbolic_trace, below a root: this module as one node (its check needs x's shape)
            if static_int(x.shape[-1]) != self.d_model:  # (static_int: jit.trace reads sizes as tensors)
                raise ValueError(f"x's last dim must be d_model={self.d_model}, got shape {tuple(x.shape)}")
            return ops.add_sinusoidal(x, offset=offset)


class LearnablePositionalEncoding(nn.Module):
    """A learned position embedding table ``[max_len, d_model]`` added to ``x [batch, seq, d_model]``."""

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.position_embeddings = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.position_embeddings.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        if not torch.jit.is_scripting():  # TorchScript compiles this module; fx traces it as one node
            node = _fx.module_node(self, x, offset)
            if node is not None:
                return node
        seq = x.shape[-2]
        end = offset + seq
        if not torch.jit.is_scripting():
            end = static_int(end)  # jit.trace: this trace's sizes, checked (the arange below follows new ones)
        if end > self.max_len:
            raise ValueError(f"sequence of length {seq} at offset {offset} exceeds max_len={self.max_len} of "
                             "LearnablePositionalEncoding; a learned table has no rows past max_len "
                             "(use SinusoidalPositionalEncoding or a larger max_len)")
        if offset < 0:
            raise ValueError(f"offset must be >= 0 (a learned table has no rows before position 0), got {offset}")
        positions = torch.arange(offset, offset + seq, device=x.device)
        return x + self.position_embeddings(positions).to(x.dtype)


class _ScriptFrequencies(DerivedBuffers):
    """A module whose TorchScript forward reads its config's frequencies (TorchScript cannot call
    the config's cache) from the float64 buffer ``_script_inv_freq``, ``config.op_inv_freq()``:
    rebuilt from ``self.config`` after every move (:class:`DerivedBuffers`), so that the scripted
    module computes what the eager one does, after ``.half()`` or a meta-device ``to_empty()`` too."""

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        cfg = self.config  # (none for a config whose frequencies vary with the length)
        return {"_script_inv_freq": torch.empty(0, dtype=torch.float64) if cfg.needs_seq_len else cfg.op_inv_freq()}

    def _checked_script_inv_freq(self) -> torch.Tensor:
        """``_script_inv_freq`` in TorchScript code, refused once cast: a *scripted* module's
        ``.float()`` / ``.half()`` (or ``module.to(torch::kFloat)`` in C++) runs no Python that could
        rebuild it, and float32 frequencies are 0.06 rad off at position 1e6."""
        inv_freq = self._script_inv_freq
        if inv_freq.dtype != torch.float64:
            raise RuntimeError("posenc_native rotary module: its float64 frequency buffer was cast (a "
                               "dtype cast of the scripted module, e.g. .float() or C++ module.to(kFloat)): cast the "
                               "Python module before torch.jit.script, which keeps its frequencies exact")
        return inv_freq


class RotaryEmbedding(_ScriptFrequencies):
    """Fused RoPE for a :class:`RopeConfig`: ``forward(q, k, positions) -> (q, k)``.

    q and k are ``[batch, seq, heads, head_dim]`` by default (``layout="bhsd"`` for transformers'
    ``[batch, heads, seq, head_dim]``, ``"thd"`` for packed tokens). Frequencies are computed once
    per device (and per regime for dynamic NTK / LongRoPE) in float64 and cached by the config
    (:meth:`RopeConfig.inv_freq_on`), so modules sharing a config share them, across threads too.
    With an axis layout (``config.mrope_section``: MRoPE, or :meth:`RopeConfig.axial`) positions may
    carry one row per axis, ``[A, B, S]`` (``[A, T]`` for thd), as in :func:`ops.apply_rope`.
    """

    def __init__(self, config: RopeConfig, layout: str = "bshd") -> None:
        super().__init__()
        self.config = config
        self.layout = layout
        self._register_derived_buffers()

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name == "config":
            # What forward compiled by TorchScript reads (it cannot call the Python API): the op's
            # arguments from the config, set again with it (a config swapped on a built module:
            # a scripted one followed the old config), frequencies included (none for one that
            # depends on the sequence length: it does not script)
            self._script_attention_factor = float(value.attention_factor)
            self._script_interleaved = bool(value.interleaved)
            self._script_head_dim = int(value.head_dim)
            self._script_rope_type = str(value.rope_type)
            if "_derived_buffer_names" in self.__dict__:
                self._rebuild_derived_buffers()

    @classmethod
    def from_hf(cls, cfg, layer_type: Optional[str] = None, layout: str = "bshd") -> "RotaryEmbedding":
        """Build from a transformers config, a dict or a config.json path (see RopeConfig.from_hf)."""
        return cls(RopeConfig.from_hf(cfg, layer_type=layer_type), layout=layout)

    def inv_freq(self, device: torch.device, seq_len: Optional[int] = None) -> torch.Tensor:
        """The float64 frequencies on ``device`` (shared; do not modify)."""
        return self.config.inv_freq_on(device, seq_len)

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
                offset: int = 0, cu_seqlens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if torch.jit.is_scripting():
            return self._scripted_rope(q, k, positions, offset, cu_seqlens)
        else:
            node = _fx.module_node(self, q, k, positions, offset, cu_seqlens)
            if node is not None:
                return node  # torch.fx.symbolic_trace, below a root: this module as one node
            # ops.apply_rope(q, k, positions, config=self.config, layout=self.layout, offset=offset,
            # cu_seqlens=cu_seqlens), without its keyword handling (a tenth of a decode step's Python time)
            return (ops._rope if ops._FAST is None else ops._FAST.rope)(
                False, q, k, positions, self.config, None, None, None, self.layout, offset, cu_seqlens, None, None,
                False)

    def _scripted_rope(self, q: torch.Tensor, k: Optional[torch.Tensor], positions: Optional[torch.Tensor],
                       offset: int, cu_seqlens: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """forward as TorchScript runs it: torch.ops.posenc.rope with the config's arguments (the op
        checks the rest, as on the Python path)."""
        inv_freq = self._checked_script_inv_freq()
        if inv_freq.numel() == 0:  # (a config's frequencies are never empty)
            raise RuntimeError(f"RotaryEmbedding: {self._script_rope_type} frequencies depend on the sequence "
                               "length, which TorchScript code cannot compute; use torch.compile or torch.export")
        if q.dim() == 0 or q.size(-1) != self._script_head_dim:
            raise ValueError(f"q's head_dim must be config.head_dim={self._script_head_dim}, got shape {q.shape}")
        k_arg = k
        if k_arg is None:  # q alone: the op takes a k of zero heads
            shape = list(q.size())
            shape[2 if self.layout == "bshd" else 1] = 0
            k_arg = q.new_empty(shape)
        q_out, k_out = torch.ops.posenc.rope(q, k_arg, positions, cu_seqlens, inv_freq,
                                             self._script_attention_factor, self._script_interleaved, self.layout,
                                             offset, False)
        if k is None:
            return q_out, None
        return q_out, k_out


ops.use_module_call(RotaryEmbedding, SinusoidalPositionalEncoding)  # nn.Module.__call__ without its Python frames


def _fused_cos_sin_ok(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``x * cos + rotate_half(x) * sin`` can run as the fused op: x ``[B,H,S,D]`` with cos/sin
    ``[S,D]`` or ``[1,S,D]``, or x ``[B,S,D]`` with cos/sin ``[S,D]`` or ``[B or 1,S,D]``, on the same
    device, and no gradient wanted for cos/sin, nor a tangent on them (the op differentiates q and k
    only). Anything else takes the plain formula (a ``[H,S,D]`` table broadcasts over x's heads: per-head
    tables, which the op does not take)."""
    if tracing():  # torch.jit.trace: decided on this trace's shapes as ints (the same at other lengths)
        with untraced():
            return _fused_cos_sin_ok(x, cos, sin)
    if x.dim() not in (3, 4) or cos.shape != sin.shape or cos.dim() not in (2, 3):
        return False
    if not (x.is_floating_point() and cos.is_floating_point() and sin.is_floating_point()):
        return False
    if x.device != cos.device or x.device != sin.device:
        return False
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return False
    if tangents(cos, sin) is not None:
        return False
    d, s = x.shape[-1], x.shape[-2]
    if d % 2 or cos.shape[-1] != d or cos.shape[-2] != s:
        return False
    # broadcasting aligns a 3-D table's first dim with x's dim -3: the heads of a 4-D x, the batch of a 3-D one
    if cos.dim() == 3 and cos.shape[0] != 1 and (x.dim() == 4 or cos.shape[0] != x.shape[0]):
        return False
    # the op computes in x's dtype; keep the formula's type promotion when cos/sin are wider
    return torch.promote_types(x.dtype, cos.dtype) == x.dtype and torch.promote_types(x.dtype, sin.dtype) == x.dtype


class _SeedRotary(_ScriptFrequencies):
    """The seed articles' rotary classes: also the seed's float32 ``inv_freq`` buffer, for code that
    reads it (the kernels use the config's float64 cache)."""

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"inv_freq": self.config.inv_freq().to(torch.float32), **super()._derived_buffers()}

    def _angles(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """``[seq_len, pairs]`` float64 angles of positions ``0 .. seq_len - 1`` (``rope_angles``;
        in TorchScript from the buffer, which holds the same frequencies)."""
        t = torch.arange(seq_len, device=device)
        if torch.jit.is_scripting():
            return t.to(torch.float64)[:, None] * self._checked_script_inv_freq().to(device)
        else:
            return rope_angles(t, self.config.inv_freq_on(device))


def _apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with broadcasting, as in the seed (x ``[..., seq, dim]``,
    cos/sin ``[seq, dim]``). Runs as one fused kernel when the shapes allow (``_fused_cos_sin_ok``),
    else (and in TorchScript) as the plain formula."""
    if not torch.jit.is_scripting():
        proxy = _fx.proxy_in(x, cos, sin)
        if proxy is not None:  # the choice needs real shapes
            return _fx.record_call(proxy, _apply_rotary_emb, x, cos, sin)
        if _fused_cos_sin_ok(x, cos, sin):
            x4 = x if x.dim() == 4 else x.unsqueeze(1)
            if x4.stride(-1) != 1:
                x4 = x4.contiguous()
            empty_k = x4.new_empty((x4.shape[0], 0, x4.shape[2], x4.shape[3]))
            out, _ = ops.apply_rotary_pos_emb(x4, empty_k, cos, sin, unsqueeze_dim=1)
            return out if x.dim() == 4 else out.squeeze(1)
    return x * cos + rotate_half(x) * sin


class RoPEPositionalEncoding(_SeedRotary):
    """Rotary position embedding, with the seed article's interface (half-split pairs, GPT-NeoX/Llama).

    ``forward(seq_len, device=None)`` returns the ``[seq_len, dim]`` angle matrix
    ``cat(freqs, freqs)`` with ``freqs = outer(arange(seq_len), inv_freq)``,
    ``inv_freq = 1 / base^(arange(0, dim, 2)/dim)``; take ``.cos()``/``.sin()`` of it and call
    :meth:`apply_rotary_emb`. Unlike the seed the angles are formed in float64 (float32 products
    lose up to 6e-2 rad at position 2^20) and then returned as float32. :meth:`rotate` rotates q and
    k directly with the fused kernel.
    """

    def __init__(self, dim: int, base: float = 10000) -> None:
        super().__init__()
        self.dim = dim
        self.base = base
        self.config = RopeConfig(head_dim=dim, base=base)
        self._register_derived_buffers()

    def forward(self, seq_len: int, device: Optional[torch.device] = None) -> torch.Tensor:
        freqs = self._angles(seq_len, self.inv_freq.device if device is None else device)
        return torch.cat((freqs, freqs), dim=-1).to(torch.float32)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        """``[-x2, x1]`` for ``x = [x1, x2]`` split in halves."""
        return rotate_half(x)

    apply_rotary_emb = staticmethod(_apply_rotary_emb)

    def rotate(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
               *, layout: str = "bhsd", offset: int = 0):
        """Rotate q and k in one fused pass (``ops.apply_rope``); ``layout`` "bhsd" (default, the
        seed's ``[batch, heads, seq, dim]``), "bshd" or "thd". Returns ``(q, k)``."""
        return _rotate_by(self.config, 1.0, q, k, positions, layout, offset)


class YaRNPositionalEncoding(_SeedRotary):
    """YaRN rotary embedding with the seed article's constructor.

    ``scaling_factor`` is YaRN's ``factor`` (context extension ``s``), ``original_max_position_embeddings``
    the pre-training context ``Lo``. The frequencies follow YaRN (as transformers, see ``config/yarn.py``):
    pairs that turn more than ``beta_fast`` times over ``Lo`` keep their frequency, pairs that turn
    fewer than ``beta_slow`` times are interpolated (divided by ``scaling_factor``), a linear ramp
    blends those in between; cos and sin are multiplied by the attention factor
    ``0.1*ln(s) + 1`` (the temperature ``sqrt(1/t)``), on q and k alike.

    The seed article's code called this YaRN but was not: it raised the base NTK-style
    (``base * s^(dim/(dim-2))``) *and* divided the positions by ``s``, with no ramp and no attention
    factor. That double-scales every frequency and changes the high-frequency pairs YaRN keeps.
    This class keeps the seed's name and arguments with the real method.

    ``forward(seq_len, device=None)`` returns ``(cos, sin)``, each ``[seq_len, dim]`` (half-split
    layout ``cat(c, c)``, or ``repeat_interleave(c, 2)`` with ``interleaved=True``; attention factor
    applied, float32); :meth:`apply_rotary_emb` applies them with the same pairing, and
    :meth:`rotate` rotates q and k in one fused kernel.
    """

    def __init__(self, dim: int, base: float = 10000, original_max_position_embeddings: int = 2048,
                 scaling_factor: float = 1.0, *, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 attention_factor: Optional[float] = None, truncate: bool = True, interleaved: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.base = base
        self.original_max_position_embeddings = original_max_position_embeddings
        self.scaling_factor = scaling_factor
        self.config = RopeConfig(
            head_dim=dim, base=base, interleaved=interleaved,
            max_position_embeddings=int(math.ceil(original_max_position_embeddings * scaling_factor)),
            scaling=YarnScaling(factor=float(scaling_factor),
                                original_max_position_embeddings=original_max_position_embeddings,
                                beta_fast=beta_fast, beta_slow=beta_slow, attention_factor=attention_factor,
                                truncate=truncate))
        self.attention_factor = self.config.attention_factor
        self.mscale = self.attention_factor  # the name some YaRN code uses for it
        self._register_derived_buffers()
        self.interleaved = interleaved

    def forward(self, seq_len: int, device: Optional[torch.device] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        angles = self._angles(seq_len, self.inv_freq.device if device is None else device)
        return cos_sin_from_angles(angles, self.attention_factor, self.interleaved, torch.float32)

    rotate_half = staticmethod(rotate_half)

    def apply_rotary_emb(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x * cos + rotate(x) * sin`` paired as this module pairs, for :meth:`forward`'s tables:
        half-split as :meth:`RoPEPositionalEncoding.apply_rotary_emb` (fused where the shapes allow),
        or with ``interleaved=True`` pairs ``(2i, 2i+1)``."""
        if self.interleaved:
            return x * cos + rotate_every_two(x) * sin
        return _apply_rotary_emb(x, cos, sin)

    def rotate(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
               *, layout: str = "bhsd", offset: int = 0):
        """Rotate q and k with YaRN in one fused pass (``ops.apply_rope``); ``layout`` "bhsd"
        (default), "bshd" or "thd". Returns ``(q, k)``."""
        return _rotate_by(self.config, self.attention_factor, q, k, positions, layout, offset)


def _rotate_by(config: RopeConfig, attention_factor: float, q: torch.Tensor, k: Optional[torch.Tensor],
               positions: Optional[torch.Tensor], layout: str, offset: int):
    """``ops.apply_rope`` with ``config``'s frequencies and pairing, for q of any head_dim the rotary dim
    fits in (``config=`` wants q's head_dim to be config.head_dim): the seed classes' ``rotate``."""
    if (proxy := _fx.proxy_in(q, k, positions, offset)) is not None:  # q.device is not known while fx traces
        return _fx.record_call(proxy, _rotate_by, config, attention_factor, q, k, positions, layout, offset)
    return ops.apply_rope(q, k, positions, inv_freq=config.inv_freq_on(q.device), attention_factor=attention_factor,
                          interleaved=config.interleaved, layout=layout, offset=offset)
