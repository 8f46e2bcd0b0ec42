"""RoPE frequency configuration: every Hugging Face rope type, computed in float64.

A :class:`RopeConfig` holds what decides the rotary frequencies of one attention layer: head dim,
rotary dim (partial rotary), base (``rope_theta``), pairing, ``max_position_embeddings`` and a
scaling scheme (one of :data:`ROPE_TYPES`, each a small dataclass with transformers' defaults).
It computes ``inv_freq`` and the attention factor once, on the host, in float64 (DESIGN.md §2-3).

Interface used by ``ops.apply_rope`` and the modules::

    cfg.inv_freq(seq_len=None) -> float64 CPU tensor [rotary_dim // 2]
    cfg.attention_factor: float   (multiplies cos and sin: YaRN's temperature, LongRoPE's scale)
    cfg.interleaved: bool, cfg.rotary_dim: int, cfg.head_dim: int
    cfg.needs_seq_len: bool       (True when inv_freq depends on seq_len: dynamic, longrope)

:meth:`RopeConfig.from_hf` reads a transformers ``PretrainedConfig``, a ``config.json`` dict or path
(4.x ``rope_theta``/``rope_scaling`` and 5.x ``rope_parameters`` forms, per-layer-type dicts
included). :func:`describe_config` backs ``posenc config``; :data:`PRESETS` are built-in configs in
the Hugging Face form (no downloads).

Validation (a ``ValueError`` naming the field). Where transformers only logs a warning we decide:

* rejected: ``factor < 1``; ``beta_fast < beta_slow`` (or either <= 0); LongRoPE factor lists whose
  length is not ``rotary_dim // 2`` (transformers warns, then fails or broadcasts wrongly later);
  an odd rotary dim (transformers silently rounds a partial one up); ``attention_factor <= 0``;
  Llama-3 ``high_freq_factor <= low_freq_factor`` (a division by zero in the smoothing);
  dynamic NTK with rotary dim 2 (its exponent ``d/(d-2)`` is undefined); an unknown rope type;
  a missing required key (``factor`` for linear/dynamic/yarn/llama3, ``low_freq_factor`` and
  ``high_freq_factor`` for llama3, ``short_factor`` and ``long_factor`` for longrope).
* accepted, as transformers computes them: a YaRN ``factor`` that differs from
  ``max_position_embeddings / original_max_position_embeddings`` (the explicit factor is used);
  Llama-3 ``original_max_position_embeddings >= max_position_embeddings``; proportional without a
  ``partial_rotary_factor`` (then every pair rotates); unknown extra keys (ignored).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional, Sequence, Union

import torch

__all__ = [
    "ROPE_TYPES",
    "RopeConfig",
    "RopeScaling",
    "DefaultScaling",
    "LinearScaling",
    "DynamicNTKScaling",
    "YarnScaling",
    "LongRopeScaling",
    "Llama3Scaling",
    "ProportionalScaling",
    "scaling_from_dict",
    "mscale",
    "PRESETS",
    "load_hf_dict",
    "hf_layer_types",
    "describe_config",
]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 checkpoints called LongRoPE "su"


def mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale: ``1`` if ``scale <= 1`` else ``0.1 * m * ln(scale) + 1``."""
    if scale <= 1:
        return 1.0
    return 0.1 * m * math.log(scale) + 1.0


def _pair_exponents(d: int, n: Optional[int] = None) -> torch.Tensor:
    """``2i/d`` for i = 0 .. n-1 (default d//2), float64."""
    n = d // 2 if n is None else n
    return torch.arange(0, 2 * n, 2, dtype=torch.float64) / d


def _default_inv(base: float, d: int) -> torch.Tensor:
    return 1.0 / (float(base) ** _pair_exponents(d))


def _check_factor(rope_type: str, factor: Optional[float], name: str = "factor") -> None:
    if factor is None:
        return
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
        raise ValueError(f"{rope_type} rope: '{name}' must be a finite number >= 1, got {factor!r}")
    if factor < 1:
        raise ValueError(f"{rope_type} rope: '{name}' must be >= 1 (it stretches the context), got {factor}")


def _check_positive(rope_type: str, name: str, value: Optional[float]) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{rope_type} rope: '{name}' must be a finite number > 0, got {value!r}")


# ------------------------------------------------------------------------------------------------
# Scaling schemes


@dataclass(frozen=True)
class RopeScaling:
    """Base of the scaling schemes; a scheme turns the default frequencies into scaled ones."""

    rope_type: ClassVar[str] = "default"

    def validate(self, cfg: "RopeConfig") -> None:
        """Raise ValueError (naming the field) when the scheme cannot be used with ``cfg``."""

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        """float64 frequencies for ``cfg`` (use :meth:`RopeConfig.inv_freq`)."""
        return _default_inv(cfg.base, cfg.rotary_dim)

    def compute_attention_factor(self, cfg: "RopeConfig") -> float:
        """The factor on cos and sin (use :attr:`RopeConfig.attention_factor`)."""
        return 1.0

    def to_dict(self) -> dict:
        """The Hugging Face ``rope_parameters`` form of the scheme (without ``rope_theta``)."""
        out: dict = {"rope_type": self.rope_type}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class DefaultScaling(RopeScaling):
    """Unscaled RoPE: ``inv_i = 1 / base^(2i/d)``."""

    rope_type: ClassVar[str] = "default"


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation: ``inv_i / factor``."""

    factor: float
    rope_type: ClassVar[str] = "linear"

    def validate(self, cfg: "RopeConfig") -> None:
        _check_factor(self.rope_type, self.factor)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        return _default_inv(cfg.base, cfg.rotary_dim) / float(self.factor)


@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK: ``base' = base * (factor*s/L - (factor-1))^(d/(d-2))``, ``s = max(seq_len, L)``.

    ``L`` is the config's ``max_position_embeddings`` (required). ``inv_freq(seq_len)`` is the
    stateless formula; transformers caches the largest length seen (it only recomputes when a
    sequence grows past it, and resets below ``L``), so after a long sequence its frequencies for a
    shorter one (still > L) are those of the longer one. Pass the length you want.
    """

    factor: float
    rope_type: ClassVar[str] = "dynamic"

    def validate(self, cfg: "RopeConfig") -> None:
        _check_factor(self.rope_type, self.factor)
        if cfg.max_position_embeddings is None:
            raise ValueError("dynamic rope: 'max_position_embeddings' is required (it is L in the NTK formula)")
        if cfg.rotary_dim <= 2:
            raise ValueError(f"dynamic rope: 'rotary_dim' must be > 2 (the exponent is d/(d-2)), got {cfg.rotary_dim}")

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        d, big_l, f = cfg.rotary_dim, int(cfg.max_position_embeddings), float(self.factor)
        s = big_l if seq_len is None else max(int(seq_len), big_l)
        base = float(cfg.base) * ((f * s / big_l) - (f - 1)) ** (d / (d - 2))
        return _default_inv(base, d)


class _ExtendedContext:
    """For the schemes that extend an original context (YaRN, LongRoPE): Lo and the factor, which
    default to max_position_embeddings and max_position_embeddings / Lo as in transformers."""

    def original_max(self, cfg: "RopeConfig") -> int:
        lo = self.original_max_position_embeddings
        if lo is None:
            lo = cfg.max_position_embeddings
        if lo is None:
            raise ValueError(f"{self.rope_type} rope: 'original_max_position_embeddings' is required "
                             "(or max_position_embeddings, its default)")
        return int(lo)

    def resolved_factor(self, cfg: "RopeConfig") -> float:
        if self.factor is not None:
            return float(self.factor)
        if cfg.max_position_embeddings is None:
            raise ValueError(f"{self.rope_type} rope: 'factor' is required (or max_position_embeddings, to derive "
                             "it as max_position_embeddings / original_max_position_embeddings)")
        return cfg.max_position_embeddings / self.original_max(cfg)


@dataclass(frozen=True)
class YarnScaling(_ExtendedContext, RopeScaling):
    """YaRN (Peng et al. 2023), as transformers computes it.

    ``cdim(r) = d*ln(Lo/(2*pi*r)) / (2*ln(base))``; ``lo = cdim(beta_fast)``, ``hi = cdim(beta_slow)``,
    floored/ceiled when ``truncate``, clamped to ``[0, d-1]``; ``ramp_i = clamp((i-lo)/(hi-lo), 0, 1)``;
    ``inv_i = (inv_i/factor)*ramp_i + inv_i*(1-ramp_i)``: pairs below ``lo`` keep their frequency,
    pairs above ``hi`` are interpolated (divided by ``factor``), pairs between are blended.

    Attention factor (multiplies cos and sin): ``attention_factor`` if given, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are given and non-zero
    (DeepSeek), else ``mscale(factor) = 0.1*ln(factor) + 1``.

    ``factor=None`` means ``max_position_embeddings / original_max_position_embeddings``;
    ``original_max_position_embeddings=None`` means the config's ``max_position_embeddings``.
    """

    factor: Optional[float] = None
    original_max_position_embeddings: Optional[int] = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    attention_factor: Optional[float] = None
    truncate: bool = True
    rope_type: ClassVar[str] = "yarn"

    def validate(self, cfg: "RopeConfig") -> None:
        _check_factor(self.rope_type, self.factor)
        _check_positive(self.rope_type, "original_max_position_embeddings", self.original_max(cfg))
        _check_factor(self.rope_type, self.resolved_factor(cfg),
                      "factor (max_position_embeddings / original_max_position_embeddings)")
        _check_positive(self.rope_type, "beta_fast", self.beta_fast)
        _check_positive(self.rope_type, "beta_slow", self.beta_slow)
        if self.beta_fast < self.beta_slow:
            raise ValueError(f"yarn rope: 'beta_fast' ({self.beta_fast}) must be >= 'beta_slow' ({self.beta_slow})")
        _check_positive(self.rope_type, "attention_factor", self.attention_factor)

    def correction_range(self, cfg: "RopeConfig") -> tuple[float, float]:
        """``(lo, hi)`` after truncation and clamping (before the ``lo == hi`` nudge)."""
        d, base, big_lo = cfg.rotary_dim, float(cfg.base), self.original_max(cfg)

        def cdim(r: float) -> float:
            return d * math.log(big_lo / (2 * math.pi * r)) / (2 * math.log(base))

        lo, hi = cdim(float(self.beta_fast)), cdim(float(self.beta_slow))
        if self.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        return max(lo, 0), min(hi, d - 1)

    def ramp(self, cfg: "RopeConfig") -> torch.Tensor:
        """``ramp_i`` in [0, 1] per pair: 0 keeps the frequency, 1 divides it by ``factor``."""
        lo, hi = self.correction_range(cfg)
        if lo == hi:
            hi += 0.001  # as transformers: avoid 0/0
        i = torch.arange(cfg.rotary_dim // 2, dtype=torch.float64)
        return ((i - lo) / (hi - lo)).clamp(0, 1)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        inv = _default_inv(cfg.base, cfg.rotary_dim)
        ramp = self.ramp(cfg)
        return (inv / self.resolved_factor(cfg)) * ramp + inv * (1 - ramp)

    def compute_attention_factor(self, cfg: "RopeConfig") -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        f = self.resolved_factor(cfg)
        if self.mscale and self.mscale_all_dim:
            return float(mscale(f, self.mscale) / mscale(f, self.mscale_all_dim))
        return mscale(f)


@dataclass(frozen=True)
class LongRopeScaling(_ExtendedContext, RopeScaling):
    """LongRoPE (Phi-3): ``inv_i = 1 / (ext_i * base^(2i/d))``.

    ``ext`` is ``long_factor`` when ``seq_len > original_max_position_embeddings`` else
    ``short_factor`` (also when seq_len is None). Attention factor: ``attention_factor`` if given,
    else ``sqrt(1 + ln(factor)/ln(Lo))`` for factor > 1 (1 otherwise); ``factor`` defaults to
    ``max_position_embeddings / original_max_position_embeddings``.
    """

    short_factor: Sequence[float] = ()
    long_factor: Sequence[float] = ()
    original_max_position_embeddings: Optional[int] = None
    factor: Optional[float] = None
    attention_factor: Optional[float] = None
    rope_type: ClassVar[str] = "longrope"

    def __post_init__(self) -> None:
        # tuples keep the dataclass hashable and immutable
        object.__setattr__(self, "short_factor", tuple(float(x) for x in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(x) for x in self.long_factor))

    def validate(self, cfg: "RopeConfig") -> None:
        n = cfg.rotary_dim // 2
        for name in ("short_factor", "long_factor"):
            values = getattr(self, name)
            if len(values) != n:
                raise ValueError(f"longrope rope: '{name}' must have rotary_dim // 2 = {n} entries, got {len(values)}")
            if not all(v > 0 and math.isfinite(v) for v in values):
                raise ValueError(f"longrope rope: every '{name}' entry must be a finite number > 0")
        _check_positive(self.rope_type, "original_max_position_embeddings", self.original_max(cfg))
        _check_factor(self.rope_type, self.factor)
        _check_factor(self.rope_type, self.resolved_factor(cfg),
                      "factor (max_position_embeddings / original_max_position_embeddings)")
        _check_positive(self.rope_type, "attention_factor", self.attention_factor)

    def uses_long(self, cfg: "RopeConfig", seq_len: Optional[int]) -> bool:
        return bool(seq_len) and int(seq_len) > self.original_max(cfg)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        ext = self.long_factor if self.uses_long(cfg, seq_len) else self.short_factor
        ext_t = torch.tensor(ext, dtype=torch.float64)
        return 1.0 / (ext_t * float(cfg.base) ** _pair_exponents(cfg.rotary_dim))

    def compute_attention_factor(self, cfg: "RopeConfig") -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        f = self.resolved_factor(cfg)
        if f <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(f) / math.log(self.original_max(cfg)))


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1: wavelength ``w = 2*pi/inv``; ``w < Lo/high_freq_factor`` keeps ``inv``;
    ``w > Lo/low_freq_factor`` divides it by ``factor``; in between
    ``s = (Lo/w - low)/(high - low)``, ``inv = (1-s)*inv/factor + s*inv``.
    Defaults are Meta's (8, 1, 4, 8192); from_hf requires the first three, like transformers."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: ClassVar[str] = "llama3"

    def validate(self, cfg: "RopeConfig") -> None:
        _check_factor(self.rope_type, self.factor)
        _check_positive(self.rope_type, "low_freq_factor", self.low_freq_factor)
        _check_positive(self.rope_type, "high_freq_factor", self.high_freq_factor)
        _check_positive(self.rope_type, "original_max_position_embeddings", self.original_max_position_embeddings)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"llama3 rope: 'high_freq_factor' ({self.high_freq_factor}) must be > "
                             f"'low_freq_factor' ({self.low_freq_factor})")

    def regimes(self, cfg: "RopeConfig") -> list[str]:
        """Per pair: "kept" (high frequency), "blended" or "interpolated" (divided by factor)."""
        inv = _default_inv(cfg.base, cfg.rotary_dim)
        w = 2 * math.pi / inv
        lo_len = self.original_max_position_embeddings
        out = []
        for wi in w.tolist():
            if wi < lo_len / self.high_freq_factor:
                out.append("kept")
            elif wi > lo_len / self.low_freq_factor:
                out.append("interpolated")
            else:
                out.append("blended")
        return out

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        inv = _default_inv(cfg.base, cfg.rotary_dim)
        f, low, high = float(self.factor), float(self.low_freq_factor), float(self.high_freq_factor)
        lo_len = float(self.original_max_position_embeddings)
        w = 2 * math.pi / inv
        scaled = torch.where(w > lo_len / low, inv / f, inv)
        s = (lo_len / w - low) / (high - low)
        smoothed = (1 - s) * scaled / f + s * scaled
        medium = ~(w < lo_len / high) & ~(w > lo_len / low)
        return torch.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class ProportionalScaling(RopeScaling):
    """Proportional RoPE (Gemma 4 global layers): all ``head_dim // 2`` pairs of the head (pairing
    over the whole head), the first ``int(partial_rotary_factor * head_dim // 2)`` with
    ``base^(-2i/head_dim)``, the rest with frequency 0 (they do not rotate); all divided by
    ``factor`` (default 1). Unlike partial rotary, the exponents use ``head_dim``, not the rotated
    width, and ``rotary_dim`` is ``head_dim``."""

    factor: float = 1.0
    rope_type: ClassVar[str] = "proportional"

    def validate(self, cfg: "RopeConfig") -> None:
        _check_factor(self.rope_type, self.factor)

    def rotated_pairs(self, cfg: "RopeConfig") -> int:
        return int(cfg.partial_rotary_factor * cfg.head_dim // 2)

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        n_rot = self.rotated_pairs(cfg)
        out = torch.zeros(cfg.head_dim // 2, dtype=torch.float64)
        out[:n_rot] = 1.0 / (float(cfg.base) ** _pair_exponents(cfg.head_dim, n_rot))
        return out / float(self.factor)


_SCHEMES: dict[str, type] = {
    "default": DefaultScaling,
    "linear": LinearScaling,
    "dynamic": DynamicNTKScaling,
    "yarn": YarnScaling,
    "longrope": LongRopeScaling,
    "llama3": Llama3Scaling,
    "proportional": ProportionalScaling,
}

# Keys each type must have in a Hugging Face dict (transformers raises KeyError for the same ones;
# original_max_position_embeddings is not listed: it defaults to max_position_embeddings there).
_REQUIRED_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "proportional": (),
}


def _rope_type_of(params: Mapping[str, Any]) -> str:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if not isinstance(rope_type, str):
        raise ValueError(f"'rope_type' must be a string, got {rope_type!r}")
    rope_type = _TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in _SCHEMES:
        raise ValueError(f"unknown 'rope_type' {rope_type!r}; known rope types: {', '.join(ROPE_TYPES)}")
    return rope_type


def scaling_from_dict(params: Mapping[str, Any]) -> RopeScaling:
    """A scheme from a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict.

    ``"type"`` is accepted for ``"rope_type"``. Keys of other types, ``rope_theta`` and
    ``partial_rotary_factor`` are ignored here (they belong to :class:`RopeConfig`). Missing
    ``original_max_position_embeddings`` falls back to the config's ``max_position_embeddings``.
    """
    rope_type = _rope_type_of(params)
    missing = [k for k in _REQUIRED_KEYS[rope_type] if k not in params]
    if missing:
        raise ValueError(f"rope_type {rope_type!r} is missing required key(s) {', '.join(map(repr, missing))} "
                         "in rope_parameters / rope_scaling")
    get = params.get
    if rope_type == "default":
        return DefaultScaling()
    if rope_type == "linear":
        return LinearScaling(factor=get("factor"))
    if rope_type == "dynamic":
        return DynamicNTKScaling(factor=get("factor"))
    if rope_type == "yarn":
        # `or` as transformers: a 0/None beta means the default
        return YarnScaling(factor=get("factor"),
                           original_max_position_embeddings=get("original_max_position_embeddings"),
                           beta_fast=get("beta_fast") or 32.0, beta_slow=get("beta_slow") or 1.0,
                           mscale=get("mscale"), mscale_all_dim=get("mscale_all_dim"),
                           attention_factor=get("attention_factor"),
                           truncate=True if get("truncate") is None else bool(get("truncate")))
    if rope_type == "longrope":
        short, long_ = get("short_factor"), get("long_factor")
        for name, v in (("short_factor", short), ("long_factor", long_)):
            if not isinstance(v, (list, tuple)):
                raise ValueError(f"longrope rope: '{name}' must be a list of numbers, got {v!r}")
        return LongRopeScaling(short_factor=short, long_factor=long_,
                               original_max_position_embeddings=get("original_max_position_embeddings"),
                               factor=get("factor"), attention_factor=get("attention_factor"))
    if rope_type == "llama3":
        lo = get("original_max_position_embeddings")
        return Llama3Scaling(factor=get("factor"), low_freq_factor=get("low_freq_factor"),
                             high_freq_factor=get("high_freq_factor"),
                             **({} if lo is None else {"original_max_position_embeddings": lo}))
    return ProportionalScaling(factor=1.0 if get("factor") is None else get("factor"))


# ------------------------------------------------------------------------------------------------
# RopeConfig


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

    Properties: ``rope_type``, ``attention_factor``, ``needs_seq_len``,
    ``softmax_scale_multiplier``. Method: ``inv_freq(seq_len=None)``.

    Invalid values raise ValueError naming the field; the module docstring lists what is
    rejected where transformers only warns, and what is accepted.
    """

    head_dim: int
    base: float = 10000.0
    interleaved: bool = False
    rotary_dim: Optional[int] = None
    partial_rotary_factor: Optional[float] = None
    max_position_embeddings: Optional[int] = None
    scaling: Union[RopeScaling, Mapping[str, Any], None] = field(default=None)

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
            scaling = DefaultScaling()
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
        if isinstance(scaling, ProportionalScaling):
            if self.rotary_dim is not None and self.rotary_dim != self.head_dim:
                raise ValueError(f"proportional rope: 'rotary_dim' is always head_dim={self.head_dim} (pairs past "
                                 "the proportion get frequency 0); set partial_rotary_factor instead, "
                                 f"got rotary_dim={self.rotary_dim}")
            rotary_dim = self.head_dim
            prf = 1.0 if prf is None else prf
        else:
            rotary_dim = self.rotary_dim
            if rotary_dim is None:
                rotary_dim = int(self.head_dim * (1.0 if prf is None else prf))
            elif prf is not None and int(self.head_dim * prf) != rotary_dim:
                raise ValueError(f"'rotary_dim'={rotary_dim} disagrees with partial_rotary_factor={prf} "
                                 f"(head_dim {self.head_dim} -> {int(self.head_dim * prf)})")
            if prf is None:
                prf = rotary_dim / self.head_dim
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
            raise ValueError(f"'rotary_dim' must be an int, got {rotary_dim!r}")
        if rotary_dim % 2 or not 2 <= rotary_dim <= self.head_dim:
            raise ValueError(f"'rotary_dim' must be even and in [2, head_dim={self.head_dim}], got {rotary_dim} "
                             f"(head_dim {self.head_dim} x partial_rotary_factor {prf})")
        set_(self, "rotary_dim", rotary_dim)
        set_(self, "partial_rotary_factor", prf)
        scaling.validate(self)

    # -- the interface the ops and modules use --------------------------------------------------

    @property
    def rope_type(self) -> str:
        """One of :data:`ROPE_TYPES`."""
        return self.scaling.rope_type

    @property
    def needs_seq_len(self) -> bool:
        """True when ``inv_freq`` depends on the sequence length (dynamic NTK, LongRoPE)."""
        return self.rope_type in ("dynamic", "longrope")

    @property
    def attention_factor(self) -> float:
        """Multiplies cos and sin of the rotated dims, on q and k alike (YaRN's temperature
        ``sqrt(1/t)``, LongRoPE's scale); 1.0 for the other types."""
        return float(self.scaling.compute_attention_factor(self))

    @property
    def softmax_scale_multiplier(self) -> float:
        """DeepSeek-V2/V3-style attention layers multiply their softmax scale (``qk_head_dim**-0.5``)
        by ``mscale(factor, mscale_all_dim)**2`` when the YaRN config sets ``mscale_all_dim``; this
        returns that multiplier (1.0 otherwise). It belongs to the attention layer, not to the q/k
        rotation: neither ``apply_rope`` nor the kernels apply it."""
        s = self.scaling
        if isinstance(s, YarnScaling) and s.mscale_all_dim:
            return mscale(s.resolved_factor(self), s.mscale_all_dim) ** 2
        return 1.0

    def inv_freq(self, seq_len: Optional[int] = None) -> torch.Tensor:
        """The ``rotary_dim // 2`` inverse frequencies, float64 on the CPU.

        ``seq_len`` (the number of positions the frequencies serve, i.e. max position + 1) matters
        for dynamic NTK (``s = max(seq_len, L)``) and LongRoPE (long factors past the original
        context); other types ignore it.
        """
        if seq_len is not None and (isinstance(seq_len, bool) or int(seq_len) < 0):
            raise ValueError(f"'seq_len' must be an int >= 0, got {seq_len!r}")
        out = self.scaling.compute_inv_freq(self, None if seq_len is None else int(seq_len))
        return out.to(torch.float64).contiguous()

    def default_inv_freq(self) -> torch.Tensor:
        """The unscaled frequencies of the same width, for comparisons and plots."""
        if isinstance(self.scaling, ProportionalScaling):
            return dataclasses.replace(self, scaling=ProportionalScaling()).inv_freq()
        return _default_inv(self.base, self.rotary_dim)

    # -- Hugging Face configs -------------------------------------------------------------------

    @classmethod
    def from_hf(cls, cfg: Any, layer_type: Optional[str] = None, *, interleaved: Optional[bool] = None) -> "RopeConfig":
        """Build from a transformers ``PretrainedConfig``, a ``config.json`` dict, a path to a
        ``config.json`` (or a directory holding one), or a preset name (see :data:`PRESETS`).

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

        Validation follows the module docstring: where transformers only warns about a bad value
        (factor < 1, beta_fast < beta_slow, LongRoPE list lengths, ...) this raises ValueError.

        The head dim is ``qk_rope_head_dim`` (DeepSeek MLA: the rotated part of q/k), else
        ``head_dim``, else ``hidden_size // num_attention_heads``. ``original_max_position_embeddings``
        set at the top level (Phi-3) wins over the one in the rope dict, as in transformers.
        """
        src = _HFSource.make(cfg, layer_type)
        return src.rope_config(layer_type, interleaved)


# ------------------------------------------------------------------------------------------------
# Reading Hugging Face configs

# Model types whose attention rotates interleaved pairs (2i, 2i+1) (checked in transformers' code:
# rotate_every_two / x[..., ::2] / view_as_complex); configs with `rope_interleave` say it themselves.
_INTERLEAVED_MODEL_TYPES = frozenset({
    "gptj", "codegen", "roformer", "cohere", "cohere2", "cohere2_moe", "glm", "glm4", "ernie4_5", "ernie4_5_moe",
    "helium", "llama4", "llama4_text", "deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "mistral4",
    "youtu", "longcat_flash", "glm4_moe_lite", "axk1",
})

# partial_rotary_factor defaults of transformers' config classes, for config.json dicts that omit it
_PRF_DEFAULTS = {
    "gpt_neox": 0.25, "stablelm": 0.25, "phi": 0.5, "persimmon": 0.5, "glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5,
    "glm4v_moe": 0.5, "nemotron": 0.5, "recurrent_gemma": 0.5, "qwen3_next": 0.25, "qwen3_5": 0.25,
    "qwen3_5_moe": 0.25, "moonshine": 0.9,
}


class _HFSource:
    """Uniform read access to a PretrainedConfig object or a config.json dict."""

    def __init__(self, obj: Any, is_dict: bool, head_dim_override: Optional[int] = None) -> None:
        self.obj = obj
        self.is_dict = is_dict
        self.head_dim_override = head_dim_override

    @classmethod
    def make(cls, cfg: Any, layer_type: Optional[str]) -> "_HFSource":
        if isinstance(cfg, (str, os.PathLike)):
            cfg = load_hf_dict(cfg)
        if isinstance(cfg, Mapping):
            d = dict(cfg)
            rope_keys = ("rope_parameters", "rope_scaling", "rope_theta", "num_attention_heads", "hidden_size",
                         "head_dim")
            if isinstance(d.get("text_config"), Mapping) and not any(k in d for k in rope_keys):
                d = dict(d["text_config"])  # composite (multimodal) config: the text model's rope
            return cls(d, True, _dict_layer_head_dim(d, layer_type))
        if not hasattr(cfg, "__dict__"):
            raise ValueError(f"from_hf expects a transformers config, a dict or a path, got {type(cfg).__name__}")
        obj = cfg
        get_text = getattr(obj, "get_text_config", None)
        if callable(get_text):
            try:
                obj = get_text() or obj
            except Exception:  # noqa: BLE001 - some configs raise for ambiguous text configs; keep the original
                obj = cfg
        if layer_type is not None and getattr(obj, "is_heterogeneous", False):
            try:  # per-layer overrides (e.g. Gemma 4's larger head_dim on full-attention layers)
                return cls(obj.per_layer_config[layer_type], False)
            except (ValueError, KeyError, IndexError, AttributeError):
                pass
        return cls(obj, False)

    def get(self, *names: str, default: Any = None) -> Any:
        for name in names:
            if self.is_dict:
                v = self.obj.get(name, None)
            else:
                try:
                    v = getattr(self.obj, name, None)
                except Exception:  # noqa: BLE001 - heterogeneous configs refuse ambiguous global reads
                    v = None
            if v is not None:
                return v
        return default

    def model_type(self) -> str:
        return str(self.get("model_type", default="") or "")

    def head_dim(self) -> int:
        if self.head_dim_override is not None:
            return int(self.head_dim_override)
        hd = self.get("qk_rope_head_dim", "head_dim")
        if hd is not None:
            return int(hd)
        hidden = self.get("hidden_size", "n_embd", "d_model", "dim")
        heads = self.get("num_attention_heads", "n_head", "num_heads", "n_heads")
        if hidden is None or heads is None:
            raise ValueError("cannot determine 'head_dim': the config has neither head_dim nor hidden_size and "
                             "num_attention_heads")
        return int(hidden) // int(heads)

    def rope_params(self, layer_type: Optional[str]) -> dict:
        raw = self.get("rope_scaling") or self.get("rope_parameters") or {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"rope_parameters / rope_scaling must be a dict, got {type(raw).__name__}")
        nested = bool(raw) and all(isinstance(v, Mapping) or v is None for v in raw.values()) and any(
            isinstance(v, Mapping) for v in raw.values())
        if nested:
            kinds = list(raw)
            if layer_type is None:
                if len(kinds) != 1:
                    raise ValueError(f"rope_parameters is per layer type ({', '.join(kinds)}): pass layer_type= one "
                                     "of them")
                layer_type = kinds[0]
            if layer_type not in raw:
                raise ValueError(f"layer_type {layer_type!r} not in rope_parameters (layer types: {', '.join(kinds)})")
            if raw[layer_type] is None:
                raise ValueError(f"layer_type {layer_type!r} has no RoPE (rope_parameters[{layer_type!r}] is None)")
            params = dict(raw[layer_type])
            params.setdefault("rope_theta", self.get("rope_theta"))
            params.setdefault("partial_rotary_factor", self.get("partial_rotary_factor"))
            return params
        params = dict(raw)
        if layer_type == "sliding_attention" and self.get("rope_local_base_freq") is not None:
            # Gemma 3, 4.x form: local layers use unscaled RoPE with their own base
            return {"rope_type": "default", "rope_theta": self.get("rope_local_base_freq"),
                    "partial_rotary_factor": params.get("partial_rotary_factor")}
        if params.get("rope_theta") is None:
            params["rope_theta"] = self.get("rope_theta", "rotary_emb_base", "rope_embedding_base")
        if params.get("partial_rotary_factor") is None:
            params["partial_rotary_factor"] = self.get("partial_rotary_factor", "rotary_pct")
        top_lo = self.get("original_max_position_embeddings")
        if top_lo is not None:  # Phi-3: the top-level value wins, as in transformers
            params["original_max_position_embeddings"] = top_lo
        return params

    def rope_config(self, layer_type: Optional[str], interleaved: Optional[bool]) -> RopeConfig:
        params = self.rope_params(layer_type)
        rope_type = _rope_type_of(params)
        head_dim = self.head_dim()
        max_pos = self.get("max_position_embeddings", "n_positions", "max_sequence_length")
        base = params.get("rope_theta")
        if base is None:
            dflt = self.get("default_theta")
            base = dflt if isinstance(dflt, (int, float)) and not isinstance(dflt, bool) else 10000.0
        prf = params.get("partial_rotary_factor")
        rotary_dim = None
        if prf is None:
            rd = self.get("rotary_dim")  # GPT-J / CodeGen: an absolute width
            if rd is not None and rope_type != "proportional":
                rotary_dim = int(rd)
            elif self.is_dict:
                prf = _PRF_DEFAULTS.get(self.model_type())
        qk_rope = self.get("qk_rope_head_dim")
        if qk_rope is not None and self.head_dim_override is None and prf is not None:
            # MLA (DeepSeek, Mistral 4): rope acts on the qk_rope_head_dim slice, fully; a factor that
            # maps the full head_dim onto that slice (Mistral 4 sets one) is already accounted for.
            full = self.get("head_dim")
            if full is not None and int(int(full) * float(prf)) == int(qk_rope):
                prf = None
        if rope_type in ("yarn", "longrope", "llama3") and params.get("original_max_position_embeddings") is None:
            params["original_max_position_embeddings"] = max_pos  # transformers' standardisation
        if interleaved is None:
            flag = self.get("rope_interleave")
            interleaved = bool(flag) if flag is not None else self.model_type() in _INTERLEAVED_MODEL_TYPES
        return RopeConfig(head_dim=head_dim, base=base, interleaved=interleaved, rotary_dim=rotary_dim,
                          partial_rotary_factor=prf, max_position_embeddings=max_pos,
                          scaling=scaling_from_dict(params))


def _dict_layer_head_dim(d: Mapping[str, Any], layer_type: Optional[str]) -> Optional[int]:
    """Head dim override of one layer type in a config.json (per_layer_config / global_head_dim)."""
    if layer_type is None:
        return None
    overrides = d.get("per_layer_config")
    layer_types = d.get("layer_types")
    if isinstance(overrides, Mapping) and isinstance(layer_types, list) and layer_type in layer_types:
        by_index = {int(k): v for k, v in overrides.items() if isinstance(v, Mapping)}
        values = {by_index.get(i, {}).get("head_dim") for i, t in enumerate(layer_types) if t == layer_type}
        if len(values) > 1:
            raise ValueError(f"layer_type {layer_type!r} has different head_dim on different layers: "
                             f"{sorted(values, key=str)}")
        value = values.pop() if values else None
        if value is not None:
            return int(value)
        if overrides:
            return None
    if layer_type == "full_attention" and d.get("global_head_dim") is not None:
        return int(d["global_head_dim"])  # Gemma 4 checkpoints
    return None


def hf_layer_types(cfg: Any) -> list[str]:
    """The layer types of a per-layer-type ``rope_parameters`` (e.g. ``["full_attention",
    "sliding_attention"]``), ``[]`` when one dict serves every layer."""
    src = _HFSource.make(cfg, None)
    raw = src.get("rope_scaling") or src.get("rope_parameters") or {}
    if isinstance(raw, Mapping) and raw and all(isinstance(v, Mapping) or v is None for v in raw.values()) and any(
            isinstance(v, Mapping) for v in raw.values()):
        return [k for k, v in raw.items() if v is not None]
    return []


# ------------------------------------------------------------------------------------------------
# Presets (Hugging Face form, written here: posenc never downloads)


def _phi3_factors() -> tuple[list[float], list[float]]:
    # Illustrative LongRoPE factors of the right shape (48 pairs): short ~1, long growing to ~64.
    # Not the released checkpoint's numbers.
    short = [round(1.0 + 0.05 * (i / 47) ** 2, 4) for i in range(48)]
    long_ = [round(1.0 + 63.0 * (i / 47) ** 3, 4) for i in range(48)]
    return short, long_


PRESETS: dict[str, dict] = {
    "llama3-8b-instruct-like": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    },
    "llama2-dynamic-ntk": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0},
    },
    "qwen2-yarn": {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    },
    "gpt-oss-like": {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096, "truncate": False},
    },
    "phi3-longrope": {
        "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": _phi3_factors()[0], "long_factor": _phi3_factors()[1]},
    },
    "deepseek-v3-like": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    },
    "gemma4-like": {
        "model_type": "gemma4_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
        "global_head_dim": 512, "max_position_embeddings": 131072,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
    },
    "gptj-6b-like": {
        "model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048,
    },
}


def load_hf_dict(source: Union[str, os.PathLike]) -> dict:
    """The config dict of a preset name, a ``config.json`` path, or a directory holding one."""
    if isinstance(source, str) and source in PRESETS:
        return json.loads(json.dumps(PRESETS[source]))  # a deep copy
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(source)!r} is neither a config.json, a directory holding one, nor a preset "
                                f"(presets: {', '.join(PRESETS)})")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------------------
# posenc config


def _pair_regimes(cfg: RopeConfig) -> Optional[list[str]]:
    s = cfg.scaling
    if isinstance(s, YarnScaling):
        ramp = s.ramp(cfg).tolist()
        return ["kept" if r <= 0 else "interpolated" if r >= 1 else "blended" for r in ramp]
    if isinstance(s, Llama3Scaling):
        return s.regimes(cfg)
    if isinstance(s, ProportionalScaling):
        n = s.rotated_pairs(cfg)
        return ["rotated" if i < n else "not rotated" for i in range(cfg.head_dim // 2)]
    return None


def _runs(labels: list[str]) -> str:
    """'kept 0-20, blended 21-45, interpolated 46-63'."""
    parts, start = [], 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[start]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            parts.append(f"{labels[start]} {span}")
            start = i
    return ", ".join(parts)


def _describe_one(cfg: RopeConfig, title: str) -> list[str]:
    lines = [title]
    pairing = ("interleaved (2i, 2i+1), GPT-J style" if cfg.interleaved
               else "half-split (i, i+d/2), GPT-NeoX/Llama style")
    lines.append(f"  rope type          {cfg.rope_type}")
    lines.append(f"  head dim           {cfg.head_dim}")
    lines.append(f"  rotary dim         {cfg.rotary_dim} (partial_rotary_factor {cfg.partial_rotary_factor:g})")
    lines.append(f"  pairing            {pairing}")
    lines.append(f"  base (rope_theta)  {cfg.base:g}")
    if cfg.max_position_embeddings is not None:
        lines.append(f"  max positions      {cfg.max_position_embeddings}")
    s = cfg.scaling
    labels = {"factor": "factor", "original_max_position_embeddings": "original max pos", "low_freq_factor":
              "low_freq_factor", "high_freq_factor": "high_freq_factor", "beta_fast": "beta_fast", "beta_slow":
              "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim", "truncate": "truncate"}
    for name, label in labels.items():
        value = getattr(s, name, None)
        if name == "factor" and value is None and hasattr(s, "resolved_factor"):
            value = f"{s.resolved_factor(cfg):g} (max positions / original max positions)"
        elif name == "original_max_position_embeddings" and value is None and hasattr(s, "original_max"):
            value = f"{s.original_max(cfg)} (= max positions)"
        if value is not None:
            lines.append(f"  {label:18s} {value}")
    lines.append(f"  attention factor   {cfg.attention_factor:.10g} (multiplies cos and sin of the rotated dims)")
    if cfg.softmax_scale_multiplier != 1.0:
        lines.append(f"  softmax scale x    {cfg.softmax_scale_multiplier:.10g} (mscale(factor, mscale_all_dim)^2, "
                     "applied by DeepSeek-style attention, not by the rotation)")
    seq_len = None
    if isinstance(s, YarnScaling):
        lo, hi = s.correction_range(cfg)
        lines.append(f"  YaRN correction range  lo={lo:g} hi={hi:g} (pairs: {_runs(_pair_regimes(cfg))})")
    elif isinstance(s, Llama3Scaling):
        lines.append(f"  Llama-3 pairs      {_runs(_pair_regimes(cfg))}")
    elif isinstance(s, ProportionalScaling):
        lines.append(f"  proportional pairs {_runs(_pair_regimes(cfg))}")
    elif isinstance(s, DynamicNTKScaling):
        seq_len = int(cfg.max_position_embeddings * s.factor)
        lines.append(f"  dynamic NTK        scaled column at seq_len = {seq_len} (factor x max positions); "
                     f"unchanged up to {cfg.max_position_embeddings}")
    elif isinstance(s, LongRopeScaling):
        seq_len = s.original_max(cfg) + 1
        lines.append(f"  LongRoPE           short factors up to seq_len {s.original_max(cfg)}, long factors past it "
                     "(scaled column: long)")
    default = cfg.default_inv_freq()
    scaled = cfg.inv_freq(seq_len)
    regimes = _pair_regimes(cfg)
    n = scaled.shape[0]
    lines.append(f"  inv_freq (float64, {n} pairs)")
    lines.append(f"    {'pair':>4s}  {'default':>13s}  {'scaled':>13s}  {'scaled/default':>14s}  {'wavelength':>11s}"
                 + ("  regime" if regimes else ""))
    shown = sorted(set(range(min(4, n))) | set(range(max(0, n - 4), n)) | _boundary_pairs(regimes))
    prev = -1
    for i in shown:
        if i != prev + 1:
            lines.append("    " + "...".rjust(4))
        d_i, s_i = float(default[i]), float(scaled[i])
        ratio = f"{s_i / d_i:14.6f}" if d_i != 0 else f"{'-':>14s}"
        wl = f"{2 * math.pi / s_i:11.4g}" if s_i != 0 else f"{'inf':>11s}"
        lines.append(f"    {i:4d}  {d_i:13.6e}  {s_i:13.6e}  {ratio}  {wl}" + (f"  {regimes[i]}" if regimes else ""))
        prev = i
    return lines


def _boundary_pairs(regimes: Optional[list[str]]) -> set[int]:
    """Pairs on either side of each regime change (where YaRN/Llama-3 start and stop blending)."""
    if not regimes:
        return set()
    out: set[int] = set()
    for i in range(1, len(regimes)):
        if regimes[i] != regimes[i - 1]:
            out |= {i - 1, i}
    return out


def describe_config(source: str) -> str:
    """Text for ``posenc config``: rope type, rotary dim, attention factor and an inv_freq table
    (first and last pairs, and for YaRN/Llama-3 the pairs where keeping, blending and
    interpolating change). ``source`` is a config.json path, a directory with one, or a preset."""
    data = load_hf_dict(source)
    origin = "built-in preset" if isinstance(source, str) and source in PRESETS else "config.json"
    model_type = data.get("model_type") or (data.get("text_config") or {}).get("model_type") or "?"
    lines = [f"{source} ({origin}, model_type {model_type})"]
    layer_types = hf_layer_types(data)
    if not layer_types:
        lines += _describe_one(RopeConfig.from_hf(data), "RoPE")
    for lt in layer_types:
        lines += _describe_one(RopeConfig.from_hf(data, layer_type=lt), f"RoPE of layer type {lt!r}")
    return "\n".join(lines)
