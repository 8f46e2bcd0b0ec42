"""RopeConfig: what decides the rotary frequencies of one attention layer, and their caches."""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from .._tensor_cache import TensorCache
from .._rope_math import axis_inv_freq, axis_mask, mrope_pair_axes
from .scheme import RopeScaling, scaling_from_dict, scheme_class


class DeviceFrequencies:
    """The float64 ``inv_freq`` of one config, per (device, regime), computed once and shared
    (``_tensor_cache.TensorCache``: plain contexts only, no lock for readers, CUDA streams
    recorded). The number of regimes is bounded: dynamic NTK has one per sequence length past
    ``max_position_embeddings``."""

    MAX_ENTRIES = 16

    def __init__(self, config: "RopeConfig") -> None:
        self._config = weakref.ref(config)  # (owned by the config: no reference cycle)
        self._cache = TensorCache(self.MAX_ENTRIES)
        # (inv_freq, attention_factor, interleaved, head_dim) on the CPU once cached there, for a
        # config whose frequencies do not depend on the sequence length: all the ops' decode fast
        # path reads of the config, in one attribute (csrc/python/direct.c, rope)
        self.cpu_plain: Optional[tuple] = None

    def get(self, device: torch.device, seq_len: Union[int, torch.Tensor, None], axes: bool = False) -> torch.Tensor:
        """``axes``: the ops' form of an axis layout (``RopeConfig.op_inv_freq_on``). ``seq_len``: an
        int, or under torch.compile a 0-d int64 tensor (a length that is data: positions' maximum).

        Traced by torch.compile / torch.export: a cached tensor enters the graph as a constant input
        (guarded on the cache; read from the config object wherever the graph breaks); one not
        cached yet is computed in the graph, and the first eager call caches it (a recompile then
        reads it). No assume_constant_result: inductor refused two such constants of one function in
        a graph (two configs; LongRoPE's two regimes), and a frame resumed after a graph break could
        not reload one."""
        cfg = self._config()
        if cfg.needs_seq_len and torch.compiler.is_compiling():
            # compiled code's length may be a symbol (dynamic sizes, an int that changed between
            # calls): the graph computes the frequencies from it (a symbolic float64 base failed in
            # torch 2.11's inductor)
            length = seq_len if isinstance(seq_len, torch.Tensor) else \
                torch.full((), 0 if seq_len is None else seq_len, dtype=torch.int64, device=device)
            return cfg.op_inv_freq_of_length(length, device) if axes else cfg.scaling.inv_freq_of_length(cfg, length, device)
        return self._cached(device, seq_len, axes)

    def regimes(self, device: torch.device) -> torch.Tensor:
        """The frequencies of each of the scheme's regimes (``RopeScaling.regime_lengths``), stacked
        ``[regimes, pairs]``."""
        cfg = self._config()
        return torch.stack([self._cached(device, n, False) for n in cfg.scaling.regime_lengths(cfg)])

    def _cached(self, device: torch.device, seq_len: Optional[int], axes: bool) -> torch.Tensor:
        cfg = self._config()
        key = (device, cfg.scaling.regime(cfg, seq_len) if cfg.needs_seq_len else None, axes)
        t = self._cache.get(key)
        if t is None:
            if torch.compiler.is_compiling():
                return self._compute(device, seq_len, axes)
            # the ops' form only (an axis layout's 2-D frequencies, not its 1-D inv_freq_on)
            plain = (device.type == "cpu" and device.index is None and not cfg.needs_seq_len
                     and axes == (cfg._pair_axes is not None))
            t = self._cache.fill(key, lambda: self._compute(device, seq_len, axes),
                                 on_kept=self._set_cpu_plain if plain else None)
        return t

    def _set_cpu_plain(self, inv_freq: torch.Tensor) -> None:
        cfg = self._config()
        self.cpu_plain = (inv_freq, cfg.attention_factor, cfg.interleaved, cfg.head_dim)

    def _compute(self, device: torch.device, seq_len: Optional[int], axes: bool) -> torch.Tensor:
        cfg = self._config()
        return (cfg.op_inv_freq(seq_len) if axes else cfg.inv_freq(seq_len)).to(device)


@dataclass(frozen=True)
class RopeConfig:
    """Frequencies of one rotary embedding (float64, on the host).

    Args:
        head_dim: size of a q/k head.
        base: ``rope_theta``.
        interleaved: pair ``(2i, 2i+1)`` (GPT-J/RoFormer/Cohere/DeepSeek); default False pairs
            ``(i, i + rotary_dim/2)`` (GPT-NeoX/Llama half-split).
        rotary_dim: rotated width (the first ``rotary_dim`` dims; the rest pass through). Default
            ``int(head_dim * partial_rotary_factor)``. Must be even.
        partial_rotary_factor: fraction of the head that rotates (default 1). For ``proportional``
            it is the fraction of pairs with a non-zero frequency instead (``rotary_dim == head_dim``).
        max_position_embeddings: the (possibly extended) context length: L of dynamic NTK, and the
            default for ``original_max_position_embeddings`` / ``factor`` of yarn and longrope.
        scaling: a :class:`RopeScaling` scheme, or its Hugging Face dict form
            (``{"rope_type": "yarn", "factor": 4, ...}``); default :class:`DefaultScaling`.
        mrope_section: an axis layout (multi-axis RoPE: MRoPE of Qwen2-VL / Qwen2.5-VL / Qwen3-VL,
            axial RoPE): pairs per position axis, e.g. ``(16, 24, 24)`` for time, height and width,
            summing to ``rotary_dim // 2``. Positions then have one row per axis (``[A, B, S]``,
            ``[A, T]``; 2-D ``[B, S]`` or 1-D positions give every axis the same id, as text tokens)
            and pair i's angle is ``positions[axis(i)] * inv_freq[i]``. Default None: plain RoPE.
        mrope_interleaved: Qwen3-VL's layout, axes taking pairs round-robin within their sections;
            default False gives each axis a contiguous section (Qwen2-VL, Qwen2.5-VL, axial).
            ``posenc_native._rope_math.mrope_pair_axes`` is the exact map.

    Properties: ``rope_type``, ``attention_factor``, ``needs_seq_len``,
    ``softmax_scale_multiplier``, ``pair_axes`` / ``num_axes`` (the axis layout). Methods:
    ``inv_freq(seq_len=None)`` (float64, on the host, a new tensor), ``inv_freq_on(device,
    seq_len=None)`` (the same values on ``device``, cached per device and regime and shared: do not
    modify it), ``op_inv_freq`` / ``op_inv_freq_on`` (what the ops take: the same, or its axis
    form). Axial RoPE (Flux): :meth:`axial`.

    Invalid values raise ValueError naming the field. Where transformers only warns, this rejects:
    ``factor < 1``; ``beta_fast < beta_slow`` (or either <= 0); LongRoPE factor lists whose length
    is not ``rotary_dim // 2``; an odd rotary dim; ``attention_factor <= 0``; Llama-3
    ``high_freq_factor <= low_freq_factor``; dynamic NTK with rotary dim 2; an unknown rope type;
    a missing required key. It accepts, as transformers computes them: a YaRN ``factor`` that
    differs from ``max_position_embeddings / original_max_position_embeddings``; Llama-3
    ``original_max_position_embeddings >= max_position_embeddings``; proportional without a
    ``partial_rotary_factor``; unknown extra keys (ignored).
    """

    head_dim: int
    base: float = 10000.0
    interleaved: bool = False
    rotary_dim: Optional[int] = None
    partial_rotary_factor: Optional[float] = None
    max_position_embeddings: Optional[int] = None
    scaling: Union[RopeScaling, Mapping[str, Any], None] = field(default=None)
    mrope_section: Optional[tuple[int, ...]] = None
    mrope_interleaved: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen dataclass: resolve the derived fields once here
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim <= 0:
            raise ValueError(f"'head_dim' must be a positive int, got {self.head_dim!r}")
        if isinstance(self.base, bool) or not isinstance(self.base, (int, float)) or not (
                math.isfinite(self.base) and self.base > 1):
            raise ValueError(f"'base' (rope_theta) must be a finite number > 1, got {self.base!r}")
        set_(self, "base", float(self.base))
        set_(self, "interleaved", bool(self.interleaved))
        scaling = self.scaling
        if scaling is None:
            scaling = scheme_class("default")()
        elif isinstance(scaling, Mapping):
            scaling = scaling_from_dict(scaling)
        elif not isinstance(scaling, RopeScaling):
            raise ValueError(f"'scaling' must be a RopeScaling or a rope_parameters dict, got {type(scaling).__name__}")
        set_(self, "scaling", scaling)
        if self.max_position_embeddings is not None:
            if isinstance(self.max_position_embeddings, bool) or int(self.max_position_embeddings) <= 0:
                raise ValueError("'max_position_embeddings' must be a positive int, got "
                                 f"{self.max_position_embeddings!r}")
            set_(self, "max_position_embeddings", int(self.max_position_embeddings))

        prf = self.partial_rotary_factor
        if prf is not None:
            if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
                raise ValueError(f"'partial_rotary_factor' must be in (0, 1], got {prf!r}")
            prf = float(prf)
        rotary_dim, prf = scaling.resolve_rotary_dim(self.head_dim, self.rotary_dim, prf)
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
            raise ValueError(f"'rotary_dim' must be an int, got {rotary_dim!r}")
        if rotary_dim % 2 or not 2 <= rotary_dim <= self.head_dim:
            raise ValueError(f"'rotary_dim' must be even and in [2, head_dim={self.head_dim}], got {rotary_dim} "
                             f"(head_dim {self.head_dim} x partial_rotary_factor {prf})")
        set_(self, "rotary_dim", rotary_dim)
        set_(self, "partial_rotary_factor", prf)
        self._resolve_axis_layout()
        scaling.validate(self)
        # computed once: every call of the ops and modules reads these
        set_(self, "_attention_factor", float(scaling.compute_attention_factor(self)))
        set_(self, "_frequencies", DeviceFrequencies(self))

    def _resolve_axis_layout(self) -> None:
        set_ = object.__setattr__
        section, interleaved = self.mrope_section, self.mrope_interleaved
        if not (interleaved is True or interleaved is False):
            raise ValueError(f"'mrope_interleaved' must be a bool, got {interleaved!r}")
        if section is None:
            if interleaved:
                raise ValueError("'mrope_interleaved' needs 'mrope_section' (the pairs of each axis)")
            set_(self, "_pair_axes", None)
            return
        pairs = self.rotary_dim // 2
        try:
            section = tuple(section)
        except TypeError:
            raise ValueError(f"'mrope_section' must be a sequence of ints (pairs per axis), got {section!r}") from None
        if not section or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in section):
            raise ValueError(f"'mrope_section' must be a non-empty sequence of ints >= 0 (pairs per axis), got "
                             f"{self.mrope_section!r}")
        if sum(section) != pairs:
            raise ValueError(f"'mrope_section' {section} sums to {sum(section)} pairs, but the rotation has "
                             f"rotary_dim // 2 = {pairs} pairs")
        set_(self, "mrope_section", section)
        set_(self, "_pair_axes", mrope_pair_axes(section, interleaved))

    @classmethod
    def axial(cls, axes_dim: Sequence[int] = (16, 56, 56), theta: float = 10000.0, interleaved: bool = True,
              head_dim: Optional[int] = None) -> "RopeConfig":
        """Axial RoPE as Flux's ``EmbedND``: axis a rotates ``axes_dim[a]`` dims with its own band
        ``1 / theta ** (arange(0, d_a, 2) / d_a)``, the bands concatenated in axis order (contiguous
        sections of ``d_a / 2`` pairs), interleaved pairs by default (Flux rotates ``(2i, 2i+1)``).

        Positions are ``[A, B, S]`` (one row per axis). Flux passes ids ``[B, L, A]``: give
        ``ids.permute(2, 0, 1)``. ``head_dim`` defaults to ``sum(axes_dim)`` (a larger one leaves
        the dims past it untouched)."""
        from .axial import AxialScaling, check_axes_dim

        dims = check_axes_dim(axes_dim)
        return cls(head_dim=sum(dims) if head_dim is None else head_dim, base=theta, interleaved=interleaved,
                   scaling=AxialScaling(axes_dim=dims), mrope_section=tuple(d // 2 for d in dims))

    def __getstate__(self) -> dict:  # pickle / deepcopy: the caches (and their lock) are rebuilt
        return {k: v for k, v in self.__dict__.items() if k not in ("_frequencies",)}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_frequencies", DeviceFrequencies(self))

    # -- the interface the ops and modules use --------------------------------------------------

    @property
    def rope_type(self) -> str:
        """One of ``ROPE_TYPES``."""
        return self.scaling.rope_type

    @property
    def needs_seq_len(self) -> bool:
        """True when ``inv_freq`` depends on the sequence length (dynamic NTK, LongRoPE)."""
        return self.scaling.needs_seq_len

    @property
    def attention_factor(self) -> float:
        """Multiplies cos and sin of the rotated dims, on q and k alike (YaRN's temperature
        ``sqrt(1/t)``, LongRoPE's scale); 1.0 for the other types."""
        return self._attention_factor

    @property
    def softmax_scale_multiplier(self) -> float:
        """DeepSeek-V2/V3-style attention layers multiply their softmax scale (``qk_head_dim**-0.5``)
        by ``mscale(factor, mscale_all_dim)**2`` when the YaRN config sets ``mscale_all_dim``; this
        returns that multiplier (1.0 otherwise). It belongs to the attention layer, not to the q/k
        rotation: neither ``apply_rope`` nor the kernels apply it."""
        return float(self.scaling.softmax_scale_multiplier(self))

    def inv_freq(self, seq_len: Optional[int] = None) -> torch.Tensor:
        """The ``rotary_dim // 2`` inverse frequencies, float64 on the CPU.

        ``seq_len`` (the number of positions the frequencies serve, i.e. max position + 1) matters
        for dynamic NTK (``s = max(seq_len, L)``) and LongRoPE (long factors past the original
        context); other types ignore it.
        """
        if seq_len is not None and not isinstance(seq_len, torch.Tensor) and (isinstance(seq_len, bool) or int(seq_len) < 0):
            raise ValueError(f"'seq_len' must be an int >= 0, got {seq_len!r}")
        out = self.scaling.compute_inv_freq(self, None if seq_len is None else int(seq_len))
        return out.to(torch.float64).contiguous()

    @property
    def pair_axes(self) -> Optional[tuple[int, ...]]:
        """The position axis of each rotary pair (``_rope_math.mrope_pair_axes``); None without an
        axis layout."""
        return self._pair_axes

    @property
    def num_axes(self) -> int:
        """Position rows the rotation reads: ``len(mrope_section)``, 1 without an axis layout."""
        return 1 if self.mrope_section is None else len(self.mrope_section)

    def op_inv_freq(self, seq_len: Optional[int] = None) -> torch.Tensor:
        """The frequencies as ``torch.ops.posenc.rope`` takes them, float64 on the host, a new tensor:
        :meth:`inv_freq` without an axis layout, else ``[num_axes, rotary_dim // 2]`` with pair i's
        frequency in row ``pair_axes[i]`` and zeros elsewhere (``_rope_math.axis_inv_freq``)."""
        t = self.inv_freq(seq_len)
        return t if self._pair_axes is None else axis_inv_freq(t, axis_mask(self._pair_axes, self.num_axes))

    def op_inv_freq_on(self, device: Union[torch.device, str, None] = None,
                       seq_len: Union[int, torch.Tensor, None] = None) -> torch.Tensor:
        """:meth:`op_inv_freq` on ``device``, cached like :meth:`inv_freq_on` (shared: do not modify it).
        ``seq_len`` may be a 0-d integer tensor: compiled code follows it in the graph."""
        if isinstance(seq_len, torch.Tensor):
            if not torch.compiler.is_compiling():
                seq_len = int(seq_len)
        elif seq_len is not None and (isinstance(seq_len, bool) or int(seq_len) < 0):
            raise ValueError(f"'seq_len' must be an int >= 0, got {seq_len!r}")
        dev = device if isinstance(device, torch.device) else torch.device("cpu" if device is None else device)
        return self._frequencies.get(dev, seq_len, self._pair_axes is not None)

    def op_inv_freq_of_length(self, seq_len: torch.Tensor, device: Union[torch.device, str, None] = None
                              ) -> torch.Tensor:
        """:meth:`op_inv_freq` for a config whose frequencies follow the sequence length, of a length
        held by a 0-d integer tensor, in tensor ops on ``device``: what compiled and exported code uses
        when the length comes from positions that are data (no host read, no graph break). LongRoPE's
        are the cached regimes' bits; dynamic NTK's the same formula in float64 tensor ops."""
        dev = device if isinstance(device, torch.device) else torch.device("cpu" if device is None else device)
        t = self.scaling.inv_freq_of_length(self, seq_len.to(device=dev, dtype=torch.int64), dev)
        return t if self._pair_axes is None else axis_inv_freq(t, axis_mask(self._pair_axes, self.num_axes, dev))

    def default_inv_freq(self) -> torch.Tensor:
        """The unscaled frequencies of the same width, for comparisons and plots."""
        return self.scaling.default_inv_freq(self).to(torch.float64).contiguous()

    def inv_freq_on(self, device: Union[torch.device, str, None] = None, seq_len: Optional[int] = None
                    ) -> torch.Tensor:
        """:meth:`inv_freq` on ``device`` (default CPU), float64, computed once per device and
        regime (the LongRoPE short/long choice, the dynamic NTK length) and shared by every caller,
        thread-safe. Treat it as read-only."""
        if seq_len is not None and not isinstance(seq_len, torch.Tensor) and (isinstance(seq_len, bool) or int(seq_len) < 0):
            raise ValueError(f"'seq_len' must be an int >= 0, got {seq_len!r}")
        dev = device if isinstance(device, torch.device) else torch.device("cpu" if device is None else device)
        return self._frequencies.get(dev, seq_len)

    # -- Hugging Face configs -------------------------------------------------------------------

    @classmethod
    def from_hf(cls, cfg: Any, layer_type: Optional[str] = None, *, interleaved: Optional[bool] = None) -> "RopeConfig":
        """Build from a transformers ``PretrainedConfig``, a ``config.json`` dict, a path to a
        ``config.json`` (or a directory holding one), or a preset name (see ``posenc_native.config.PRESETS``).

        Reads both forms: 4.x (``rope_theta``, ``rope_scaling``, ``partial_rotary_factor``,
        GPT-NeoX ``rotary_pct``/``rotary_emb_base``, GPT-J/CodeGen ``rotary_dim``) and 5.x
        (``rope_parameters``, flat or per layer type, e.g. ``{"full_attention": {...},
        "sliding_attention": {...}}``); ``"type"`` is an alias of ``"rope_type"``.

        Args:
            cfg: the config.
            layer_type: which entry of a per-layer-type ``rope_parameters`` to use (required when
                it has several); with a flat dict every layer type gets the same. Per-layer
                overrides of the head dim (``per_layer_config``, Gemma 4's ``global_head_dim``)
                are applied for it; Gemma 3's 4.x ``rope_local_base_freq`` serves
                ``"sliding_attention"``.
            interleaved: override the pairing; by default it comes from ``rope_interleave`` when
                the config has one, else from the model type (GPT-J, CodeGen, Cohere, GLM,
                ERNIE 4.5, Helium, Llama 4, DeepSeek... are interleaved). Note: transformers'
                DeepSeek-V3 ``apply_rotary_pos_emb_interleave`` returns the rotated pairs
                de-interleaved (``[evens | odds]``); ours stay in place. The two differ by one fixed
                permutation applied to q and k alike, so attention scores are identical.

        Validation follows the class docstring: where transformers only warns about a bad value
        (factor < 1, beta_fast < beta_slow, LongRoPE list lengths, ...) this raises ValueError.

        The head dim is ``qk_rope_head_dim`` (DeepSeek MLA: the rotated part of q/k), else
        ``head_dim``, else ``hidden_size // num_attention_heads``. ``original_max_position_embeddings``
        set at the top level (Phi-3) wins over the one in the rope dict, as in transformers.
        """
        from .hf import rope_config_from_hf

        return rope_config_from_hf(cfg, layer_type, interleaved)
