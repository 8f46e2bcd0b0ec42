"""The scaling-scheme base class and the registry of rope types.

A scheme is one frozen dataclass that carries every fact about itself: its ``rope_type``, the keys
a Hugging Face dict must have, how it reads that dict, whether its frequencies depend on the
sequence length (and which lengths share frequencies), its validation, its frequencies and
attention factor, its per-pair regimes and its lines in ``posenc config``. ``@register_scheme``
makes it known to :func:`scaling_from_dict`, ``RopeConfig`` and the CLI.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Hashable, Mapping, Optional

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .rope_config import RopeConfig

_SCHEMES: dict[str, type["RopeScaling"]] = {}
_TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 checkpoints called LongRoPE "su"


def register_scheme(cls: type["RopeScaling"]) -> type["RopeScaling"]:
    """Class decorator: make ``cls.rope_type`` known (one registration per scheme)."""
    if cls.rope_type in _SCHEMES and _SCHEMES[cls.rope_type] is not cls:
        raise ValueError(f"rope_type {cls.rope_type!r} is already registered by {_SCHEMES[cls.rope_type].__name__}")
    _SCHEMES[cls.rope_type] = cls
    return cls


def registered_schemes() -> dict[str, type["RopeScaling"]]:
    """``{rope_type: scheme class}`` in registration order."""
    return dict(_SCHEMES)


def mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale: ``1`` if ``scale <= 1`` else ``0.1 * m * ln(scale) + 1``."""
    if scale <= 1:
        return 1.0
    return 0.1 * m * math.log(scale) + 1.0


def pair_exponents(d: int, n: Optional[int] = None) -> torch.Tensor:
    """``2i/d`` for i = 0 .. n-1 (default d//2), float64."""
    n = d // 2 if n is None else n
    return torch.arange(0, 2 * n, 2, dtype=torch.float64) / d


def default_inv_freq(base: float, d: int) -> torch.Tensor:
    """Unscaled frequencies ``1 / base^(2i/d)``, float64."""
    return 1.0 / (float(base) ** pair_exponents(d))


def check_factor(rope_type: str, factor: Optional[float], name: str = "factor") -> None:
    if factor is None:
        return
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
        raise ValueError(f"{rope_type} rope: '{name}' must be a finite number >= 1, got {factor!r}")
    if factor < 1:
        raise ValueError(f"{rope_type} rope: '{name}' must be >= 1 (it stretches the context), got {factor}")


def check_positive(rope_type: str, name: str, value: Optional[float]) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{rope_type} rope: '{name}' must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class RopeScaling:
    """Base of the scaling schemes; a scheme turns the default frequencies into scaled ones.

    Class facts a scheme sets: ``rope_type``, ``required_keys`` (of its Hugging Face dict),
    ``needs_seq_len`` (frequencies depend on the sequence length), ``extends_context`` (its
    ``original_max_position_embeddings`` defaults to the config's ``max_position_embeddings`` when
    read from Hugging Face), ``owns_rotary_dim`` (``rotary_dim`` is always ``head_dim``).
    """

    rope_type: ClassVar[str] = "default"
    required_keys: ClassVar[tuple[str, ...]] = ()
    needs_seq_len: ClassVar[bool] = False
    extends_context: ClassVar[bool] = False
    owns_rotary_dim: ClassVar[bool] = False

    # -- reading ---------------------------------------------------------------------------------

    @classmethod
    def from_hf_params(cls, params: Mapping[str, Any]) -> "RopeScaling":
        """The scheme from a Hugging Face dict (required keys already checked). Default: every
        dataclass field present in ``params``."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names and v is not None})

    def to_dict(self) -> dict:
        """The Hugging Face ``rope_parameters`` form of the scheme (without ``rope_theta``)."""
        out: dict = {"rope_type": self.rope_type}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    # -- checking and resolving RopeConfig fields ------------------------------------------------

    def validate(self, cfg: "RopeConfig") -> None:
        """Raise ValueError (naming the field) when the scheme cannot be used with ``cfg``."""

    def resolve_rotary_dim(self, head_dim: int, rotary_dim: Optional[int], prf: Optional[float]
                           ) -> tuple[int, Optional[float]]:
        """``(rotary_dim, partial_rotary_factor)`` from what the user gave (None: not given)."""
        if rotary_dim is None:
            rotary_dim = int(head_dim * (1.0 if prf is None else prf))
        elif prf is not None and int(head_dim * prf) != rotary_dim and prf != rotary_dim / head_dim:
            # (prf == rotary_dim / head_dim: the factor stored below, whose product may round under the dim)
            raise ValueError(f"'rotary_dim'={rotary_dim} disagrees with partial_rotary_factor={prf} "
                             f"(head_dim {head_dim} -> {int(head_dim * prf)})")
        if prf is None and isinstance(rotary_dim, int) and not isinstance(rotary_dim, bool):
            prf = rotary_dim / head_dim
        return rotary_dim, prf

    # -- frequencies -----------------------------------------------------------------------------

    def regime(self, cfg: "RopeConfig", seq_len: Optional[int]) -> Hashable:
        """A key equal for every ``seq_len`` that gives the same frequencies (None: all do)."""
        return None

    def compute_inv_freq(self, cfg: "RopeConfig", seq_len: Optional[int]) -> torch.Tensor:
        """float64 frequencies for ``cfg`` (use :meth:`RopeConfig.inv_freq`)."""
        return default_inv_freq(cfg.base, cfg.rotary_dim)

    def regime_lengths(self, cfg: "RopeConfig") -> tuple[int, ...]:
        """A length in each regime, for a scheme with finitely many (LongRoPE: short, long)."""
        raise NotImplementedError(f"{self.rope_type} rope: no finite set of regimes")

    def inv_freq_of_length(self, cfg: "RopeConfig", seq_len: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The float64 frequencies for a length that is a 0-d int64 tensor on ``device``, in tensor
        ops (compiled and exported code: the length of data-dependent positions; no host read). A
        scheme with ``needs_seq_len`` defines it (use :meth:`RopeConfig.op_inv_freq_of_length`)."""
        raise NotImplementedError(f"{self.rope_type} rope: no frequencies for a length known only on the device")

    def default_inv_freq(self, cfg: "RopeConfig") -> torch.Tensor:
        """The unscaled frequencies of the same width, for comparisons and plots."""
        return default_inv_freq(cfg.base, cfg.rotary_dim)

    def compute_attention_factor(self, cfg: "RopeConfig") -> float:
        """The factor on cos and sin (use :attr:`RopeConfig.attention_factor`)."""
        return 1.0

    def softmax_scale_multiplier(self, cfg: "RopeConfig") -> float:
        """A factor on the attention's softmax scale the scheme asks for (not applied by the rotation)."""
        return 1.0

    # -- describing ------------------------------------------------------------------------------

    def pair_regimes(self, cfg: "RopeConfig") -> Optional[list[str]]:
        """Per pair, how the scheme treats it ("kept", "blended", ...); None when all alike."""
        return None

    def describe(self, cfg: "RopeConfig") -> tuple[list[str], Optional[int]]:
        """Extra ``posenc config`` lines, and the seq_len whose frequencies the table shows as scaled."""
        return [], None


def scheme_class(rope_type: Any) -> type[RopeScaling]:
    """The registered scheme of a ``rope_type`` string (aliases such as ``"su"`` accepted)."""
    if not isinstance(rope_type, str):
        raise ValueError(f"'rope_type' must be a string, got {rope_type!r}")
    rope_type = _TYPE_ALIASES.get(rope_type, rope_type)
    cls = _SCHEMES.get(rope_type)
    if cls is None:
        raise ValueError(f"unknown 'rope_type' {rope_type!r}; known rope types: {', '.join(_SCHEMES)}")
    return cls


def rope_type_of(params: Mapping[str, Any]) -> str:
    """The canonical rope type of a Hugging Face dict (``"type"`` is accepted for ``"rope_type"``)."""
    return scheme_class(params.get("rope_type") or params.get("type") or "default").rope_type


def scaling_from_dict(params: Mapping[str, Any]) -> RopeScaling:
    """A scheme from a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict.

    ``"type"`` is accepted for ``"rope_type"``. Keys of other types, ``rope_theta`` and
    ``partial_rotary_factor`` are ignored here (they belong to ``RopeConfig``). Missing
    ``original_max_position_embeddings`` falls back to the config's ``max_position_embeddings``.
    """
    cls = scheme_class(params.get("rope_type") or params.get("type") or "default")
    missing = [k for k in cls.required_keys if k not in params]
    if missing:
        raise ValueError(f"rope_type {cls.rope_type!r} is missing required key(s) {', '.join(map(repr, missing))} "
                         "in rope_parameters / rope_scaling")
    return cls.from_hf_params(params)


class ExtendedContext:
    """For the schemes that extend an original context (YaRN, LongRoPE): Lo and the factor, which
    default to max_position_embeddings and max_position_embeddings / Lo as in transformers."""

    extends_context: ClassVar[bool] = True

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

    def validate_extended(self, cfg: "RopeConfig") -> None:
        check_factor(self.rope_type, self.factor)
        check_positive(self.rope_type, "original_max_position_embeddings", self.original_max(cfg))
        check_factor(self.rope_type, self.resolved_factor(cfg),
                     "factor (max_position_embeddings / original_max_position_embeddings)")
        check_positive(self.rope_type, "attention_factor", self.attention_factor)


def ramp_labels(ramp: list[float]) -> list[str]:
    """"kept" (ramp 0), "interpolated" (ramp 1) or "blended" per pair."""
    return ["kept" if r <= 0 else "interpolated" if r >= 1 else "blended" for r in ramp]


def pair_runs(labels: list[str]) -> str:
    """'kept 0-20, blended 21-45, interpolated 46-63'."""
    parts, start = [], 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[start]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            parts.append(f"{labels[start]} {span}")
            start = i
    return ", ".join(parts)
