"""Generic detection: which rotary modules of a loaded model can be swapped, and which rotation
functions can be routed to the fused kernel, each with equality *proven* before anything changes.

For every ``*RotaryEmbedding`` module (the model-level module that computes ``(cos, sin)``, or one
complex ``freqs_cis``, once per forward) and every layer type it serves:

1. its forward must take ``(x, position_ids)`` or ``(x, position_ids, layer_type)``;
2. :meth:`RopeConfig.from_hf` on the module's own config must give the frequencies and attention
   factor the module holds (and, for dynamic NTK / LongRoPE, the ones transformers' own init
   function gives past the original length);
3. the probe: a copy of the module computes ``(cos, sin)`` at random positions, every rotation
   function that an attention forward calls (``apply_rotary_pos_emb`` and kin, found in its
   module's globals) rotates random q and k with them, and the fused kernel must give the same
   values (to 1e-4) under one of the pairings of :data:`.families.PAIRINGS`, in every layout the
   function accepts. That settles the signature, half-split vs interleaved, partial rotary and how
   cos/sin are formed, from what the code does rather than from its name. Heads are probed at the
   rotated width and wider, so "rotates the first R dims" and "is handed the R-dim slice" differ;
   and with a q shorter than k, which most functions refuse and a drafter's rotates at k's last
   positions (proven so, or refused).

Rotary modules that fold per-axis position ids ``[axes, B, S]`` into one table (MRoPE: Qwen2-VL,
Qwen2.5-VL, Qwen3-VL) are swapped when :meth:`RopeConfig.from_hf` reads an MRoPE layout from their
config: the probe then feeds rows that differ per axis, so the pair -> axis map is proven too. Vision
towers' axial rotaries (``rope_type == "axial"``, ids ``[N, 2]``) have no config-readable layout: their
table is read from the module itself (:func:`_axis_table`) and proven the same way (:func:`_probe_axial`).
A function there that takes SAM 2's key arguments (:data:`.rotations.KEY_ARGUMENTS`: object-pointer keys
left unrotated, memory frames at the current frame's positions) is run with them too
(:func:`_proves_keys_apart`); its wrapper reads them only then, and refuses them otherwise.
Refused: MRoPE modules without a layout from_hf reads, and forwards that index, negate, do arithmetic
on or read an attribute of ``cos``/``sin`` (or the names they unpack ``position_embeddings`` into, or
its items; or their own ``cos``/``sin`` parameters), or iterate over ``position_embeddings``,
themselves: a handle cannot stand in there (read from their bytecode, :func:`_handle_misuse`).

The pairing is proven per (rotary module, function) and travels with the handle, so a function
only ever rotates with a pairing proven for the module that fed it (else it refuses, loudly). A
function that fails the probe for a swapped rotary module of its own modeling module makes
:func:`plan` refuse. Nothing is changed here: :func:`plan` returns what :mod:`.` then swaps.
"""
from __future__ import annotations

import copy
import dataclasses
import dis
import inspect
import math
import sys
import types
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional

import torch
from torch import nn

from ..._rope_math import axis_inv_freq, axis_mask
from ...config import RopeConfig
from .families import PAIRINGS, Pairing
from .rotations import (KEY_ARGUMENTS, RotationSpec, _deinterleave, is_function_module, original_of,
                        rotate_keys_apart, signature_params)
from .runtime import _ERR, AxisTableRegime, Regime, RotaryPositions, UnsupportedModelError

_PROBE_ATOL = 1e-4
_ROTARY_FORWARDS = (("x", "position_ids"), ("x", "position_ids", "layer_type"))


@dataclass
class RotaryPlan:
    path: str
    module: nn.Module
    regimes: dict[Optional[str], Regime]
    complex_table: bool = False  # it returns one complex freqs_cis, not (cos, sin)


@dataclass
class Plan:
    """What :func:`patch` will swap: rotary modules by path, rotation functions by (module, name)."""

    model_type: str
    rotaries: list[RotaryPlan] = field(default_factory=list)
    rotations: dict[tuple[str, str], RotationSpec] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # what was left alone, and why
    # (module path, method) of model methods that select rows of cos/sin (Qwen2.5-VL's window order):
    # overridden on the instance to select the handle's ids instead (runtime.RowSelection)
    row_methods: list[tuple[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"model type {self.model_type!r}:"]
        for r in self.rotaries:
            for lt, g in r.regimes.items():
                lines.append(f"  swap {r.path} ({type(r.module).__name__}){'' if lt is None else f' [{lt}]'}: "
                             + g.summary())
                for (mod, name), pairing in g.routes.items():
                    lines.append(f"    through {mod.rsplit('.', 1)[-1]}.{name}: {pairing.name}")
        lines += [f"  select rows of the ids where {path or '<model>'}.{name} selects rows of cos/sin"
                  for path, name in self.row_methods]
        lines += [f"  leave {s}" for s in self.skipped]
        return "\n".join(lines)


def _forward_code(cls: type) -> Optional[types.CodeType]:
    fn = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    return getattr(fn, "__code__", None)


def _arguments(code: types.CodeType) -> tuple[str, ...]:
    return code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def _is_hf(m: nn.Module) -> bool:
    return type(m).__module__.startswith("transformers.")


def _rotation_functions(model: nn.Module) -> dict[tuple[str, str], Callable]:
    """Functions named like a rotation (``*rotary*``/``*rope*``) that a forward taking
    ``position_embeddings`` calls, or one that calls a rotary module of its own (Moshi, IDEFICS,
    RecurrentGemma: ``cos, sin = self.rotary_emb(...)`` in the attention), resolved in its module's
    globals (unwrapped if posenc wrapped them): Python functions, or the function modules transformers
    makes of them when ``kernels`` is installed (:func:`.rotations.is_function_module`)."""
    found: dict[tuple[str, str], Callable] = {}
    seen: set[type] = set()
    for _, m in model.named_modules():
        cls = type(m)
        if cls in seen or not _is_hf(m):
            continue
        seen.add(cls)
        code = _forward_code(cls)
        if code is None:
            continue
        own_rotary = {n for n, c in m.named_children() if type(c).__name__.endswith("RotaryEmbedding")}
        feeds = "position_embeddings" in code.co_varnames or own_rotary & set(code.co_names)
        # a forward handed `cos`/`sin` by another (LLaVA-OneVision-1.5's class-token embeddings, which
        # prepend a learned angle) holds the handle as well: checked alike, though it rotates nothing itself
        if not feeds and not {"cos", "sin"} & set(_arguments(code)):
            continue
        misuse = _handle_misuse(cls)
        if misuse is not None:
            raise UnsupportedModelError(f"{_ERR}: {misuse} (a patched model passes rotary positions there, not "
                                        "tensors)")
        if not feeds:
            continue
        module = sys.modules.get(cls.__module__)
        for name in code.co_names:
            low = name.lower()
            if "rotary" not in low and "rope" not in low:
                continue
            fn = getattr(module, name, None)
            if isinstance(fn, types.FunctionType) or is_function_module(fn):
                found[(cls.__module__, name)] = original_of(fn)
            elif callable(fn) and not isinstance(fn, type):
                # left out, it would be handed rotary positions all the same: refuse instead
                raise UnsupportedModelError(
                    f"{_ERR}: {cls.__name__}.forward calls {name}, a {type(fn).__name__} that posenc cannot "
                    "route (neither a Python function nor a parameter-free function module)")
    return found


def _layer_types(hf_rotary: nn.Module) -> list[Optional[str]]:
    params = [p for p in signature_params(type(hf_rotary).forward) if p != "self"]
    if tuple(params) not in _ROTARY_FORWARDS:
        raise UnsupportedModelError(f"its forward takes ({', '.join(params)}), not (x, position_ids[, layer_type])")
    if "layer_type" not in params:
        return [None]
    rope_type = getattr(hf_rotary, "rope_type", None)
    if _single_regime(hf_rotary):
        return [None]
    if not isinstance(rope_type, dict) or not rope_type:
        raise UnsupportedModelError("it takes layer_type but has no rope_type per layer type")
    return sorted(rope_type)


def _single_regime(hf_rotary: nn.Module) -> bool:
    """A module that takes an optional ``layer_type`` but holds no layer types (ESM: ``rope_type = {}``,
    its ``inv_freq`` from the default init): one regime, read as ``"default"``. Its frequencies are then
    checked against :meth:`RopeConfig.from_hf` and its rotation probed like any other module's."""
    default = inspect.signature(type(hf_rotary).forward).parameters.get("layer_type")
    return getattr(hf_rotary, "rope_type", None) == {} and default is not None and default.default is None


def _attr(hf_rotary: nn.Module, lt: Optional[str], name: str):
    return getattr(hf_rotary, name if lt is None else f"{lt}_{name}", None)


def _sincos_table(hf_rotary: nn.Module) -> Optional[torch.Tensor]:
    """The table of a module that holds one instead of ``inv_freq`` (GPT-J's and CodeGen's from
    transformers 5.24): ``embed_positions`` rows ``[sin | cos]`` of ``position * inv_freq``, which its
    forward gathers by position and splits, returning ``(sin, cos)``."""
    t = getattr(hf_rotary, "embed_positions", None)
    if (getattr(hf_rotary, "inv_freq", None) is None and isinstance(t, torch.Tensor) and t.dim() == 2
            and t.is_floating_point() and t.shape[-1] % 2 == 0):
        return t
    return None


def _module_inv_freq(hf_rotary: nn.Module, lt: Optional[str]) -> Optional[torch.Tensor]:
    """The frequencies the module holds: its ``inv_freq``, or those of its sin/cos table (row 1 holds
    ``sin`` and ``cos`` of each frequency itself; all of them are below pi); meta when not materialised."""
    buf = _attr(hf_rotary, lt, "inv_freq")
    table = _sincos_table(hf_rotary) if buf is None and lt is None else None
    if table is None:
        return buf
    half = table.shape[-1] // 2
    if table.is_meta or table.shape[0] < 2:
        return torch.empty(half, device="meta")
    row = table[1].to(torch.float64)
    return torch.atan2(row[:half], row[half:])


def _device(hf_rotary: nn.Module) -> torch.device:
    return next(hf_rotary.buffers(), torch.empty(0)).device


def _rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.detach().to("cpu", torch.float64), theirs.detach().to("cpu", torch.float64)
    if ours.shape != theirs.shape:
        return float("inf")
    return ((ours - theirs).abs() / theirs.abs().clamp_min(1e-30)).max().item() if ours.numel() else 0.0


def _check_frequencies(what: str, ours: torch.Tensor, theirs: torch.Tensor, where: str, tol: float = 1e-5) -> None:
    err = _rel_err(ours, theirs)
    if err > tol:
        raise ValueError(
            f"{_ERR}: {where}: RopeConfig.from_hf's {what} disagree with the model's own rotary embedding (shape "
            f"{tuple(ours.shape)} vs {tuple(theirs.shape)}, max relative difference {err:.3g}); not patching. "
            "Pass check=False to patch anyway.")


# A module's frequencies may be the config's rounded to a 16-bit float: model.to(torch.bfloat16) casts its
# inv_freq buffer, and GPT-J computes its table's in the default dtype (bfloat16 when loaded so). Held in
# 16 bits (_held_in_16_bits) and within two bfloat16 ulps of the config's, they are taken for those, which
# the fused op then uses exactly (the unpatched model's angles drift by up to that much of the position).
_ROUNDED_RTOL = 2.0 ** -7


def _held_in_16_bits(theirs: torch.Tensor) -> bool:
    """Whether the module's frequencies are 16-bit values, every one a bfloat16's (or every one a
    float16's) up to float32 resolution (GPT-J's are read back from a float32 sin/cos table of
    bfloat16 frequencies): only then can frequencies off the config's by up to 2^-7 be the config's
    rounded. A float32 module so close to a config that disagrees with it (another rope_theta) is refused."""
    values = theirs.detach().to("cpu", torch.float64)
    return any(bool(((values.to(dtype).to(torch.float64) - values).abs() <= 2.0 ** -20 * values.abs()).all())
               for dtype in (torch.bfloat16, torch.float16))


def _base_frequencies(hf_rotary: nn.Module, lt: Optional[str], rope: RopeConfig,
                      regime: Regime) -> Optional[tuple[str, torch.Tensor, torch.Tensor]]:
    """(what, the config's, the module's) frequencies before any sequence-length branch; None when the
    module's are not materialised."""
    theirs = _attr(hf_rotary, lt, "original_inv_freq")
    if theirs is None:
        theirs = _module_inv_freq(hf_rotary, lt)
    if not isinstance(theirs, torch.Tensor) or theirs.is_meta:
        return None
    if regime.mode == "dynamic":
        return "frequencies", rope.inv_freq(seq_len=regime.original_max_seq_len), theirs
    if regime.mode == "longrope":
        return "short-factor frequencies", rope.inv_freq(seq_len=regime.original_max_position_embeddings), theirs
    return "frequencies", rope.inv_freq(seq_len=None), theirs


def _set_frequencies(probe: nn.Module, lt: Optional[str], freqs: torch.Tensor) -> None:
    """Give a copy of a rotary module ``freqs`` in float32: in its inv_freq buffers, or its sin/cos table."""
    table = _sincos_table(probe) if lt is None else None
    if table is not None:
        angles = torch.arange(table.shape[0], dtype=torch.float64)[:, None] * freqs.to("cpu", torch.float64)
        probe.embed_positions = torch.cat([angles.sin(), angles.cos()], -1).to(table.device, torch.float32)
        return
    for name in ("inv_freq", "original_inv_freq"):
        buf = _attr(probe, lt, name)
        if isinstance(buf, torch.Tensor):
            setattr(probe, name if lt is None else f"{lt}_{name}", freqs.to(buf.device, torch.float32))


def _check_regime(cfg, hf_rotary: nn.Module, lt: Optional[str], rope: RopeConfig, regime: Regime, where: str,
                  base: Optional[tuple[str, torch.Tensor, torch.Tensor]]) -> None:
    """RopeConfig.from_hf against what the model's own module computed (frequencies, attention factor);
    ``base``: :func:`_base_frequencies`, None when nothing is materialised to compare with."""
    if base is None:
        return
    rope_type = regime.rope_type
    _check_frequencies(*base, where, _ROUNDED_RTOL if regime.rounded else 1e-5)
    if regime.mode != "static":
        # the sequence-length-dependent branch, computed by transformers' own init function
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        init = ROPE_INIT_FUNCTIONS.get(rope_type)
        if init is not None:
            seq_len = (regime.original_max_position_embeddings + 1 if regime.mode == "longrope"
                       else 2 * regime.original_max_seq_len + 3)
            their_long, _ = init(cfg, None, seq_len=seq_len)
            _check_frequencies(f"frequencies at seq_len={seq_len}", rope.inv_freq(seq_len=seq_len), their_long, where)
    theirs_af = float(_attr(hf_rotary, lt, "attention_scaling") or 1.0)
    if abs(regime.attention_factor - theirs_af) > 1e-6 * max(1.0, abs(theirs_af)):
        raise ValueError(
            f"{_ERR}: {where}: RopeConfig.from_hf's attention_factor {regime.attention_factor!r} disagrees with the "
            f"model's attention_scaling {theirs_af!r}; not patching. Pass check=False to patch anyway.")


@torch.no_grad()
def _multi_axis(hf_rotary: nn.Module, lt: Optional[str]) -> bool:
    """Whether the module folds a leading axis of position ids into one table (M-RoPE and kin): a
    plain rotary module broadcasts ``[axes, B, S]`` to ``[axes, B, S, R]`` (its ``(cos, sin)``, or its
    one complex table)."""
    probe = copy.deepcopy(hf_rotary)
    device = _device(probe)
    x = torch.zeros(2, 5, 8, device=device)
    for axes in (3, 2):
        pos = torch.arange(5, device=device).expand(axes, 2, 5)
        try:
            out = probe(x, pos) if lt is None else probe(x, pos, lt)
            cos = out if isinstance(out, torch.Tensor) else out[0]
        except Exception:  # noqa: BLE001 - not of that kind
            continue
        if isinstance(cos, torch.Tensor) and tuple(cos.shape[:-1]) == (2, 5):
            return True
    return False


# A tag per band entry: (j + 1) * 2^-20 is exact in float32 and bfloat16 (j < 256), and so small that
# float32 gives sin(t) == t and cos(t) == 1, so sin / cos of a unit position reads back the tag exactly.
_TAG = 2.0 ** -20


def _exact_frequencies(freqs: torch.Tensor, theta) -> torch.Tensor:
    """A module's float32 frequencies as the float64 powers of ``theta`` they round, when every one is
    one: ``theta ** (-p / q)`` with ``q <= 1024`` (a band entry ``1 / theta ** (2j / w)`` of any width up
    to 2048), within ``2**-22`` (float32's rounding). Two such exponents differ by at least ``1 / 1024**2``,
    which moves the power some 40 times more than that, so the exponent read back is unique; a
    value that is no such power (a scaled band) rarely lands that close to one, and the whole band must.
    Otherwise the band is returned as it is (and even a false match would stay within float32's
    rounding of the module's own value)."""
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 1:
        return freqs
    exact = []
    for v in freqs.tolist():
        if v <= 0:
            return freqs
        e = Fraction(-math.log(v) / math.log(theta)).limit_denominator(1024)
        p = float(theta) ** -float(e)
        if abs(p - v) > 2.0 ** -22 * v:
            return freqs
        exact.append(p)
    return torch.tensor(exact, dtype=torch.float64)


def _theta(hf_rotary: nn.Module, lt: Optional[str]):
    params = getattr(getattr(hf_rotary, "config", None), "rope_parameters", None)
    if isinstance(params, dict) and lt is not None:
        params = params.get(lt)
    return params.get("rope_theta") if isinstance(params, dict) else None


@torch.no_grad()
def _axis_table(hf_rotary: nn.Module, lt: Optional[str] = None, axis_last: bool = True) -> tuple[torch.Tensor, bool]:
    """The ops' axis form ``[A, R / 2]`` of an axial rotary module (a vision tower's: position ids
    ``[N, A]``, one column per axis), and whether its pairs are interleaved, read from what the module
    computes: a copy whose ``inv_freq`` holds tags is fed one unit position per axis, and each
    output dim's tag names the (axis, band entry) that feeds it. That covers every layout transformers'
    families recompose (height then width, width then height, alternating, Pixtral's even/odd split,
    three axes) without a rule per family; the table then holds the module's own frequencies, and the
    probe proves the rotation. Raises :class:`UnsupportedModelError` when the dims pair neither
    half-split nor interleaved (Gemma 4's H-H-W-W rotates each half on its own)."""
    probe = copy.deepcopy(hf_rotary)
    buf = _attr(probe, lt, "inv_freq")
    if not isinstance(buf, torch.Tensor) or buf.dim() != 1 or buf.is_meta or not 0 < buf.numel() < 256:
        raise UnsupportedModelError("its inv_freq is not a materialised 1-D band")
    n, device = buf.numel(), buf.device
    freqs = _exact_frequencies(buf.to(torch.float64).cpu(), _theta(hf_rotary, lt))
    buf.copy_(torch.arange(1, n + 1, dtype=torch.float64, device=device) * _TAG)
    # two axes (an image's height and width) unless the module cannot take them (a time axis too);
    # a layout that takes any count (Kimi-K2.5's) reads as two, what its tower feeds it
    for axes in (2, 3):
        pos = torch.eye(axes + 1, axes, device=device)  # row a: 1 on axis a; the last row: the origin
        if not axis_last:  # [A, 1, A + 1]: token a at 1 on axis a
            pos = pos.t()[:, None]
        try:
            x = torch.zeros(1, axes + 1, 8, device=device)
            cos, sin = probe(x, pos) if lt is None else probe(x, pos, lt)
        except Exception:  # noqa: BLE001 - not this many axes
            continue
        if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.shape == sin.shape
                and cos.shape[:-1].numel() == axes + 1):
            continue
        tags = (sin.reshape(axes + 1, -1).double() / cos.reshape(axes + 1, -1).double()) / _TAG
        index = tags.round()
        if (tags - index).abs().max() > 1e-3 or index[-1].any() or index.min() < 0 or index.max() > n:
            continue  # not one band entry per dim, or an angle at the origin
        index = index[:-1].long().cpu()  # [axes, R]: band entry + 1 feeding each dim from each axis, 0 for none
        if not index.any(1).all():
            continue  # an axis that moves nothing: more axes than the module reads
        if ((index != 0).sum(0) > 1).any():
            raise UnsupportedModelError("a dim of its cos/sin takes its angle from two position axes")
        r = index.shape[1]
        if r % 2 == 0 and torch.equal(index[:, : r // 2], index[:, r // 2:]):
            pairs, interleaved = index[:, : r // 2], False
        elif r % 2 == 0 and torch.equal(index[:, 0::2], index[:, 1::2]):
            pairs, interleaved = index[:, 0::2], True
        else:
            raise UnsupportedModelError("its cos/sin pair the dims neither half-split nor interleaved (each axis "
                                        "rotating its own part of the head, as Gemma 4's vision tower does)")
        table = torch.zeros(pairs.shape, dtype=torch.float64)
        hit = pairs != 0
        table[hit] = freqs[pairs[hit] - 1]
        return table, interleaved
    raise UnsupportedModelError("it takes position ids [tokens, axes] but its cos/sin are no per-axis band "
                                "(tried 2 and 3 axes)")


def _table_regime(hf_rotary: nn.Module, lt: Optional[str] = None, axis_last: bool = True, **kw) -> AxisTableRegime:
    """The regime of the table read from ``hf_rotary`` (:func:`_axis_table`), with its attention scaling."""
    table, interleaved = _axis_table(hf_rotary, lt, axis_last)
    return AxisTableRegime(table, interleaved, float(_attr(hf_rotary, lt, "attention_scaling") or 1.0),
                           axis_last=axis_last, **kw)


def _regimes(model: nn.Module, path: str, hf_rotary: nn.Module, check: bool) -> dict[Optional[str], Regime]:
    cfg = getattr(hf_rotary, "config", None) or model.config
    regimes: dict[Optional[str], Regime] = {}
    # proven at patch time, then followed only through the config: nothing a checkpoint load or a training
    # step changes may feed the module (Mistral Large 4's learned per-frequency scale alpha)
    learned = sorted({n for n, _ in hf_rotary.named_parameters()}
                     | {n for n in hf_rotary.state_dict() if n.rpartition(".")[2] != "inv_freq"})
    if learned:
        raise UnsupportedModelError(f"it holds state that loading weights or training changes ({', '.join(learned)}); "
                                    "the fused kernel follows only the config's frequencies")
    if getattr(hf_rotary, "rope_type", None) == "axial":  # a vision tower's: its layout is read from the module
        _layer_types(hf_rotary)
        owner = model.get_submodule(path.rpartition(".")[0])
        fed = getattr(owner, "position_ids", None)
        if isinstance(fed, torch.Tensor) and fed.is_floating_point():  # SAM 3's rescaled grid coordinates
            raise UnsupportedModelError("the module holding it feeds it floating-point position ids (position_ids, "
                                        "fractional grid coordinates); the fused rotation takes integer positions")
        if "layer_type" in signature_params(type(hf_rotary).forward):
            raise UnsupportedModelError("an axial rotary per layer type")
        return {None: _table_regime(hf_rotary)}
    for lt in _layer_types(hf_rotary):
        where = f"{path}{'' if lt is None else f' [{lt}]'}"
        rope_type = getattr(hf_rotary, "rope_type", None)
        if _single_regime(hf_rotary) or (rope_type is None and _sincos_table(hf_rotary) is not None):
            rope_type = "default"
        elif lt is not None:
            rope_type = rope_type[lt]
        if not isinstance(rope_type, str):
            raise UnsupportedModelError("it has no rope_type" if rope_type is None else f"its rope_type is {rope_type!r}")
        buf = _module_inv_freq(hf_rotary, lt)
        if not isinstance(buf, torch.Tensor):
            raise UnsupportedModelError("it holds no inv_freq buffer (nor a sin/cos table, embed_positions)")
        if lt is not None and rope_type not in ("default", "linear", "yarn", "llama3", "proportional"):
            raise UnsupportedModelError(f"rope_type {rope_type!r} per layer type (sequence-length dependent)")
        multi_axis = _multi_axis(hf_rotary, lt)
        try:
            regimes[lt] = _config_regime(cfg, hf_rotary, lt, rope_type, multi_axis, check, where)
        except (UnsupportedModelError, ValueError) as e:
            if not (multi_axis and rope_type == "default"):
                raise
            # a multi-axis layout RopeConfig.from_hf does not describe (ERNIE 4.5 VL pre-permutes its band):
            # the module's own table, read and proven as a vision tower's is
            why = str(e).replace(f"{_ERR}: ", "").replace(f"{where}: ", "").split(" (")[0].split("; ")[0]
            regimes[lt] = _table_regime(hf_rotary, lt, axis_last=False, source=f"read from the module, as {why}")
    return regimes


def _config_regime(cfg, hf_rotary: nn.Module, lt: Optional[str], rope_type: str, multi_axis: bool, check: bool,
                   where: str) -> Regime:
    """The regime :meth:`RopeConfig.from_hf` reads from the module's config, checked against the module."""
    buf = _module_inv_freq(hf_rotary, lt)
    try:
        rope = RopeConfig.from_hf(cfg, layer_type=lt)
    except (NotImplementedError, ValueError, KeyError, TypeError) as e:
        raise UnsupportedModelError(f"RopeConfig.from_hf cannot read its configuration: {e}") from e
    lo = None
    if rope_type == "longrope":
        params = cfg.rope_parameters if lt is None else cfg.rope_parameters[lt]
        lo = params.get("original_max_position_embeddings")
        if lo is None:
            raise UnsupportedModelError("its longrope config has no original_max_position_embeddings")
    if 2 * int(buf.shape[-1]) != rope.rotary_dim:
        raise UnsupportedModelError(f"{_ERR}: {where}: RopeConfig.from_hf gives rotary_dim {rope.rotary_dim} but "
                                    f"the model rotates {2 * int(buf.shape[-1])} dims")
    if multi_axis and rope.mrope_section is None:
        raise UnsupportedModelError("it takes position ids per axis ([axes, batch, seq]: multimodal rope "
                                    "sections), but RopeConfig.from_hf reads no MRoPE layout (mrope_section) "
                                    "from its config")
    if rope.mrope_section is not None and not multi_axis:
        raise UnsupportedModelError(f"RopeConfig.from_hf reads an MRoPE layout (mrope_section "
                                    f"{rope.mrope_section}) from its config, but it takes one row of position ids")
    regime = Regime(rope, rope_type, rope.interleaved, hf_rotary, lo)
    if regime.mode != "static":
        regime.watch_config(cfg, lt)
    base = _base_frequencies(hf_rotary, lt, rope, regime)
    if base is not None:
        err = _rel_err(base[1], base[2])
        if 1e-5 < err <= _ROUNDED_RTOL and _held_in_16_bits(base[2]):
            regime.rounded = err
    if check:
        _check_regime(cfg, hf_rotary, lt, rope, regime, where, base)
    return regime


# --------------------------------------------------------------------------------------------
# The probe


def _kind(params: tuple[str, ...]) -> Optional[str]:
    if len(params) >= 4 and params[2:4] == ("cos", "sin"):
        return "qk"
    if len(params) >= 3 and params[1:3] == ("cos", "sin"):
        return "x"
    if len(params) == 3 and params[1:3] == ("sin", "cos"):  # GPT-J, CodeGen: (tensor, sin, cos), [B, S, H, R]
        return "gptj"
    if len(params) == 3 and "cis" in params[2]:  # (xq, xk, freqs_cis)
        return "cis"
    return None


@torch.no_grad()
def _probe_one(fn: Callable, kind: str, params: tuple[str, ...], hf_rotary: nn.Module, lt: Optional[str],
               regime) -> Optional[Pairing]:
    """The pairing under which the fused kernel reproduces ``fn`` fed by ``hf_rotary`` (None: none does).

    Heads are probed as wide as the rotated part and 8 dims wider: a function that matches only at
    the rotated width (it is handed the rotary slice, as DeepSeek's MLA does) gets a pairing that
    refuses wider inputs at run time rather than rotate the wrong dims. With an axis layout (MRoPE)
    positions have one row per axis, each row different, and the kernel gets the module's own
    frequencies laid out by ``rope.pair_axes`` (or the regime's own table, read from the module:
    :class:`AxisTableRegime`): a match proves the pair -> axis map. A ``"cis"``
    function takes the module's one complex table and no ``unsqueeze_dim``: the layout its broadcast
    of the table fits is found here, and travels in the pairing."""
    probe = copy.deepcopy(hf_rotary)  # the module's dynamic state must not move
    device = _device(probe)
    if getattr(regime, "rounded", 0.0):  # the rotation is proven with the frequencies the fused op will use
        _set_frequencies(probe, lt, _base_frequencies(probe, lt, regime.rope, regime)[1])
    g = torch.Generator().manual_seed(1234)
    batch, seq = 2, 7
    table = isinstance(regime, AxisTableRegime)
    rope = regime.rope
    axes = (regime.num_axes,) if table or rope.mrope_section is not None else ()
    pos = torch.randint(0, 60, (*axes, batch, seq), generator=g).to(device)
    x = torch.zeros(batch, seq, 8, device=device)
    try:
        tables = probe(x, pos) if lt is None else probe(x, pos, lt)
        if kind == "cis":
            if not (isinstance(tables, torch.Tensor) and tables.is_complex()):
                return None
            tables = (tables,)
        elif len(tables) == 2:  # (cos, sin); GPT-J's (sin, cos), as its attention unpacks and passes them
            tables = tuple(tables)
        else:
            return None
    except Exception:  # noqa: BLE001 - any failure means "not of the supported shape"
        return None
    inv_freq = _module_inv_freq(probe, lt).to(device, torch.float64)
    rotary_dim = 2 * inv_freq.shape[-1]
    if table:
        inv_freq, rotary_dim = regime.table.to(device), regime.rotary_dim
    elif axes:
        if rotary_dim != rope.rotary_dim:
            return None
        inv_freq = axis_inv_freq(inv_freq, axis_mask(rope.pair_axes, rope.num_axes, device))
    af = float(_attr(probe, lt, "attention_scaling") or 1.0)
    # what the call may pick; (tensor, sin, cos) broadcasts its [B, S, R/2] tables over [B, S, H, R]
    layouts = ("bshd",) if kind == "gptj" else ("bhsd", "bshd") if "unsqueeze_dim" in params else ("bhsd",)

    def matches(pairing: Pairing, head_dim: int, layouts: tuple[str, ...] = layouts, q_seq: int = seq) -> bool:
        q0 = torch.randn(batch, 3, q_seq, head_dim, generator=g).to(device)
        k0 = torch.randn(batch, 2, seq, head_dim, generator=g).to(device)
        for layout in layouts:
            q, k = (q0, k0) if layout == "bhsd" else (q0.transpose(1, 2).contiguous(), k0.transpose(1, 2).contiguous())
            kw = {"unsqueeze_dim": 2} if layout == "bshd" and "unsqueeze_dim" in params else {}
            try:
                theirs = fn(q, k, *tables, **kw) if kind in ("qk", "cis") else (fn(q, *tables, **kw),
                                                                               fn(k, *tables, **kw))
            except Exception:  # noqa: BLE001
                return False
            if not (isinstance(theirs, tuple) and len(theirs) == 2):
                return False
            freq = -inv_freq if pairing.inverse else inv_freq  # as RotaryPositions.rotate turns it
            if q_seq == seq:
                ours = torch.ops.posenc.rope(q, k, pos, None, freq, af, pairing.interleaved, layout, 0, False)
            else:  # q at k's last q_seq positions
                heads = 1 if layout == "bhsd" else 2
                ours = tuple(torch.ops.posenc.rope(t, t.narrow(heads, 0, 0), p, None, freq, af, pairing.interleaved,
                                                   layout, 0, False)[0] for t, p in ((q, pos[..., seq - q_seq:]), (k, pos)))
            if pairing.deinterleave:
                ours = tuple(_deinterleave(t, rotary_dim) for t in ours)
            if not _same(ours, theirs):
                return False
        return True

    # a "cis" function must match in one layout, which it then keeps; the others in all of theirs
    tries = (("bshd",), ("bhsd",)) if kind == "cis" else (layouts,)
    for pairing in PAIRINGS:
        for where in tries:
            if matches(pairing, rotary_dim, where):
                if kind == "cis":
                    pairing = dataclasses.replace(pairing, name=f"{pairing.name}, complex table, {where[0]}",
                                                  layout=where[0])
                if kind == "qk" and _takes_shorter_q(fn, tables, batch, seq, rotary_dim, device):
                    # it rotates a q shorter than k (most refuse: their tables broadcast over q's length);
                    # proven only if at k's last positions, in transformers' [B, H, S, D], as the wrapper
                    # then turns it (in another layout the kernel refuses unequal lengths)
                    if not matches(pairing, rotary_dim, ("bhsd",), q_seq=seq - 3):
                        return None
                    pairing = dataclasses.replace(pairing, name=pairing.name + ", q at k's last positions",
                                                  q_trailing=True)
                return pairing if matches(pairing, rotary_dim + 8, where) else dataclasses.replace(
                    pairing, name=pairing.name + ", rotated slice only", rotary_only=True)
    return None


@torch.no_grad()
def _probe_axial(fn: Callable, kind: str, params: tuple[str, ...], hf_rotary: nn.Module,
                 regime: AxisTableRegime) -> Optional[Pairing]:
    """The pairing under which the fused kernel, with ``regime``'s table, reproduces ``fn`` fed by an
    axial ``hf_rotary`` at random ``[N, A]`` positions (each axis different), and the layouts it does so
    in: per rank of q (packed ``[N, H, D]``: thd; ``[B, H, N, D]``; ``[B, N, H, D]``) and per
    ``unsqueeze_dim`` the call may pass, since a vision function broadcasts its ``[N, R]`` table in its
    own way. None when no layout matches."""
    if kind not in ("qk", "x"):
        return None
    probe = copy.deepcopy(hf_rotary)
    device = _device(probe)
    g = torch.Generator().manual_seed(4321)
    seq, axes, r = 7, regime.num_axes, regime.rotary_dim
    pos = torch.randint(0, 40, (seq, axes), generator=g).to(device)
    try:
        tables = tuple(probe(torch.zeros(1, seq, 8, device=device), pos))
    except Exception:  # noqa: BLE001
        return None
    handle = regime.handle(pos, device)
    pairing = PAIRINGS[1] if regime.interleaved else PAIRINGS[0]
    shapes = {"thd": lambda h, d: (seq, h, d), "bhsd": lambda h, d: (2, h, seq, d), "bshd": lambda h, d: (2, seq, h, d)}
    uds = (None, 0, 1, 2, -2) if "unsqueeze_dim" in params else (None,)

    def matches(layout: str, ud: Optional[int], width: int) -> bool:
        q = torch.randn(shapes[layout](3, width), generator=g).to(device)
        k = torch.randn(shapes[layout](2, width), generator=g).to(device)
        kw = {} if ud is None else {"unsqueeze_dim": ud}
        try:
            theirs = fn(q, k, *tables, **kw) if kind == "qk" else (fn(q, *tables, **kw), fn(k, *tables, **kw))
        except Exception:  # noqa: BLE001
            return False
        return isinstance(theirs, tuple) and len(theirs) == 2 and _same(handle.rotate(q, k, layout, regime.interleaved),
                                                                          theirs)

    found = {}
    for layout in ("thd", "bhsd", "bshd"):
        for ud in uds:
            key = (len(shapes[layout](1, 1)), ud)
            if key not in found and matches(layout, ud, r):
                found[key] = layout
    if not found:
        return None
    wider = all(matches(layout, ud, r + 8) for (_, ud), layout in found.items())
    name = f"{pairing.name}, axial table, " + ", ".join(sorted(set(found.values())))
    pairing = dataclasses.replace(pairing, name=name + ("" if wider else ", rotated slice only"), rotary_only=not wider,
                                  layouts=tuple(sorted(found.items(), key=str)))
    if (kind == "qk" and set(KEY_ARGUMENTS) <= set(params) and found.get((4, None)) == "bhsd"
            and _proves_keys_apart(fn, tables, handle, pairing, r, g)):
        pairing = dataclasses.replace(pairing, name=pairing.name + ", keys apart by num_k_exclude_rope and "
                                      "repeat_freqs_k", key_arguments=KEY_ARGUMENTS)
    return pairing


def _proves_keys_apart(fn: Callable, tables: tuple, handle: RotaryPositions, pairing: Pairing, width: int,
                       g: torch.Generator) -> bool:
    """Whether ``fn`` does with :data:`.rotations.KEY_ARGUMENTS` what :func:`.rotations.rotate_keys_apart`
    does (SAM 2's memory attention), on random ``[B, H, S, D]`` q and k: k of two memory frames and two
    object pointers, of three frames, of one frame and three pointers, of pointers alone, and both at
    their defaults."""
    seq = handle.positions.shape[-1]
    device = handle.positions.device
    q = torch.randn(2, 2, seq, width, generator=g).to(device)
    for exclude, repeat, length in ((2, True, 2 * seq + 2), (0, True, 3 * seq), (3, False, seq + 3), (4, True, 4),
                                    (0, False, seq)):
        k = torch.randn(2, 2, length, width, generator=g).to(device)
        kw = dict(num_k_exclude_rope=exclude, repeat_freqs_k=repeat)
        try:
            theirs = fn(q, k, *tables, **kw)
            ours = rotate_keys_apart(handle, q, k, pairing, "the probe", **kw)
        except Exception:  # noqa: BLE001 - either refuses: not proven
            return False
        if not (isinstance(theirs, tuple) and len(theirs) == 2 and _same(ours, theirs)):
            return False
    return True


def _same(ours: tuple, theirs: tuple) -> bool:
    """The fused kernel's outputs against a rotation function's, to the probe's tolerance."""
    return all(isinstance(b, torch.Tensor) and a.shape == b.shape and
               (a - b.to(a.dtype)).abs().max().item() <= _PROBE_ATOL for a, b in zip(ours, theirs))


def _takes_shorter_q(fn: Callable, tables: tuple, batch: int, seq: int, head_dim: int, device: torch.device) -> bool:
    """Whether ``fn(q, k, cos, sin)`` returns for a q shorter than k (with the probe's tables of ``seq``
    positions). (Its own generator: patching leaves torch's random state as it was.)"""
    g = torch.Generator().manual_seed(2468)
    q = torch.randn(batch, 3, seq - 3, head_dim, generator=g).to(device)
    k = torch.randn(batch, 2, seq, head_dim, generator=g).to(device)
    try:
        fn(q, k, *tables)
    except Exception:  # noqa: BLE001 - refuses it: the usual case
        return False
    return True


# What a forward may not do to ``cos``/``sin`` (or to the names it unpacks ``position_embeddings`` into):
# negation, indexing, arithmetic, comparison, an attribute or method. A handle cannot stand in there, so
# such a forward is refused at patch time rather than fail at its first call.
_MISUSE = {"UNARY_NEGATIVE", "BINARY_SUBSCR", "BINARY_SLICE", "BINARY_OP", "LOAD_ATTR", "LOAD_METHOD", "COMPARE_OP"}
# (pops, pushes) of the instructions that build an index or an operand between loading a name and
# using it (``full_cos[:, -seq_length:, :]``); the walk stops at any other instruction.
_STACK = {"LOAD_FAST": (0, 1), "LOAD_CONST": (0, 1), "LOAD_DEREF": (0, 1), "LOAD_ATTR": (1, 1), "LOAD_METHOD": (1, 2),
          "UNARY_NEGATIVE": (1, 1), "BINARY_OP": (2, 1), "BINARY_SUBSCR": (2, 1), "BINARY_SLICE": (3, 1),
          "COMPARE_OP": (2, 1)}


def _consumer(ins: list, at: int) -> Optional[int]:
    """The index of the instruction that consumes the value ``ins[at]`` pushed, when it is one of
    :data:`_STACK` (followed through the operands pushed above it); None when the walk reaches anything else."""
    depth = 0  # of the value, from the top of the stack
    for n, i in enumerate(ins[at + 1:], at + 1):
        effect = _STACK.get(i.opname)
        if i.opname in ("BUILD_SLICE", "BUILD_TUPLE"):
            effect = (i.arg, 1)
        if effect is None:
            return None
        pops, pushes = effect
        if pops > depth:
            return n
        depth += pushes - pops
    return None


# What may follow ``position_embeddings[i]``: storing the item (an alias) or loading what a call takes
# next (Step 3.7's ``position_embeddings=position_embeddings[layer_type]``); anything in :data:`_MISUSE`, or
# building a list/tuple from it (MLCD's ``torch.cat([..., position_embeddings[0]])``), treats it as a tensor.
_ITEM_MISUSE = _MISUSE | {"BUILD_LIST", "BUILD_TUPLE", "LIST_APPEND"}


def _row_method(ins: list, at: int) -> Optional[str]:
    """For ``ins[at]`` loading ``position_embeddings`` into a generator expression: the name of the
    method of ``self`` that each item is handed to as its first argument and nothing else is done with
    (``self.permute_input_for_window_attn(freq, window_index, seq_len=seq_len) for freq in
    position_embeddings``), else None."""
    if at < 2 or ins[at - 1].opname != "MAKE_FUNCTION" or not isinstance(ins[at - 2].argval, types.CodeType):
        return None
    body = list(dis.get_instructions(ins[at - 2].argval))
    item = next((b.argval for a, b in zip(body, body[1:]) if a.opname == "FOR_ITER" and b.opname == "STORE_FAST"), None)
    uses = [i for i, x in enumerate(body) if x.opname.startswith("LOAD_FAST") and x.argval == item]
    if item is None or len(uses) != 1 or uses[0] < 2:
        return None
    owner, method = body[uses[0] - 2], body[uses[0] - 1]
    if owner.argval != "self" or not owner.opname.startswith("LOAD_") or method.opname not in ("LOAD_METHOD", "LOAD_ATTR"):
        return None
    return method.argval


def _row_methods(cls: type) -> set[str]:
    """Methods of ``cls`` its forward hands each item of ``position_embeddings`` to (:func:`_row_method`)."""
    code = _forward_code(cls)
    if code is None:
        return set()
    ins = list(dis.get_instructions(code))
    return {name for at, (a, b) in enumerate(zip(ins, ins[1:]))
            if a.opname.startswith("LOAD_FAST") and a.argval == "position_embeddings" and b.opname == "GET_ITER"
            and (name := _row_method(ins, at)) is not None}


def _handle_misuse(cls: type) -> Optional[str]:
    code = _forward_code(cls)
    if code is None:
        return None
    ins = list(dis.get_instructions(code))
    names = {"cos", "sin"}
    for at, (a, b) in enumerate(zip(ins, ins[1:])):  # `x, y = position_embeddings`: x and y hold the handle too
        if a.opname.startswith("LOAD_FAST") and a.argval == "position_embeddings" and b.opname == "UNPACK_SEQUENCE":
            names |= {i.argval for i in ins[at + 2: at + 2 + b.arg] if i.opname == "STORE_FAST"}
        # `cos = position_embeddings[0]` holds it too; anything else done with the item (MLCD's
        # `torch.cat([..., position_embeddings[0]])`, `position_embeddings[0].unsqueeze(0)`) treats it as a tensor
        if a.opname.startswith("LOAD_FAST") and a.argval == "position_embeddings" and b.opname == "GET_ITER":
            # `tuple(self.m(t, ...) for t in position_embeddings)` (Qwen2.5-VL's window order) is taken over by
            # a row selection (:func:`_row_methods`); any other iteration hands the handle to unknown code
            if _row_method(ins, at) is None:
                return f"{cls.__name__}.forward iterates over position_embeddings, handing each item to other code"
        use = _consumer(ins, at) if a.opname.startswith("LOAD_FAST") and a.argval == "position_embeddings" else None
        if use is not None and ins[use].opname == "BINARY_SUBSCR" and use + 1 < len(ins):
            after = ins[use + 1]
            if after.opname == "STORE_FAST":
                names.add(after.argval)
            elif after.opname in _ITEM_MISUSE:
                return f"{cls.__name__}.forward uses an item of position_embeddings as a tensor"
    for at, a in enumerate(ins):
        if a.opname.startswith("LOAD_FAST") and a.argval in names:
            use = _consumer(ins, at)
            if use is not None and ins[use].opname in _MISUSE:
                return f"{cls.__name__}.forward applies {ins[use].opname.lower()} to {a.argval}"
    return None


def plan(model: nn.Module, model_type: str, check: bool) -> Plan:
    """Detect (and prove) what can be swapped in ``model``; raises :class:`UnsupportedModelError`
    naming the reason when nothing can, or ``ValueError`` when the config and the model disagree."""
    result = Plan(model_type)
    rotaries = [(n, m) for n, m in model.named_modules() if _is_hf(m) and type(m).__name__.endswith("RotaryEmbedding")]
    if not rotaries:
        raise UnsupportedModelError(f"{_ERR}: model type {model_type!r}: found no transformers *RotaryEmbedding module")
    candidates: list[tuple[str, nn.Module, dict[Optional[str], Regime]]] = []
    reasons: list[str] = []
    for path, hf_rotary in rotaries:
        if not path:
            raise UnsupportedModelError(f"{_ERR}: patch the model that holds the rotary embedding, not the rotary "
                                        "embedding itself")
        try:
            candidates.append((path, hf_rotary, _regimes(model, path, hf_rotary, check)))
        except UnsupportedModelError as e:
            reasons.append(f"{path} ({type(hf_rotary).__name__}): {e}")
    functions = _rotation_functions(model)
    if not functions:
        reasons.append("no forward taking position_embeddings calls an apply_rotary*/rope function")

    # Probe every (function, rotary module, layer type). A function may serve rotary modules of its own
    # modeling module only if it is proven for all of them that are swapped (an attention there is fed
    # by them); across modules a handle carries the pairings proven for it, and a function it was not
    # proven for refuses it at run time.
    proven: dict[tuple[str, str], dict[tuple[str, Optional[str]], Pairing]] = {}
    failed: dict[tuple[str, str], set[str]] = {}
    specs: dict[tuple[str, str], RotationSpec] = {}
    for (mod, name), fn in functions.items():
        params = signature_params(fn)
        kind = _kind(params)
        short = f"{mod.rsplit('.', 1)[-1]}.{name}"
        if kind is None:
            raise UnsupportedModelError(
                f"{_ERR}: model type {model_type!r}: {short}, called by an attention with position_embeddings, "
                f"takes ({', '.join(params)}), not (q, k, cos, sin, ...), (x, cos, sin, ...), "
                f"(x, sin, cos) or (xq, xk, freqs_cis)")
        specs[(mod, name)] = RotationSpec(kind, params)
        for path, hf_rotary, regimes in candidates:
            for lt, regime in regimes.items():
                pairing = (_probe_axial(fn, kind, params, hf_rotary, regime)
                           if isinstance(regime, AxisTableRegime) and regime.axis_last
                           else _probe_one(fn, kind, params, hf_rotary, lt, regime))
                if pairing is not None:
                    proven.setdefault((mod, name), {})[(path, lt)] = pairing
                elif type(hf_rotary).__module__ == mod:
                    failed.setdefault((mod, name), set()).add(path)
    # a rotary module is swapped when every layer type of it is proven for some function
    swapped = {path for path, _, regimes in candidates
               if regimes and all(any((path, lt) in p for p in proven.values()) for lt in regimes)}
    for key, paths in failed.items():
        bad = paths & swapped
        if bad:
            raise UnsupportedModelError(
                f"{_ERR}: model type {model_type!r}: {key[0].rsplit('.', 1)[-1]}.{key[1]}, called by an attention "
                f"with position_embeddings, is not reproduced by the fused kernel (with any pairing) for "
                f"{', '.join(sorted(bad))}; not patching")
    for path, hf_rotary, regimes in candidates:
        if path not in swapped:
            tried = ", ".join(f"{m.rsplit('.', 1)[-1]}.{n}" for m, n in functions) or "none found"
            result.skipped.append(f"{path} ({type(hf_rotary).__name__}): the fused kernel reproduces no rotation "
                                  f"function with its cos/sin (tried: {tried})")
            continue
        for lt, regime in regimes.items():
            regime.routes.update({key: p[(path, lt)] for key, p in proven.items() if (path, lt) in p})
        # a module proven with a (xq, xk, freqs_cis) function returned a complex table to it
        complex_table = any(specs[key].kind == "cis" for key, p in proven.items() if any(pp == path for pp, _ in p))
        result.rotaries.append(RotaryPlan(path, hf_rotary, regimes, complex_table))
    for key, p in proven.items():
        if any(path in swapped for path, _ in p):
            result.rotations[key] = specs[key]
    if not result.rotaries or not result.rotations:
        why = "; ".join(reasons + result.skipped) or "nothing to swap"
        raise UnsupportedModelError(f"{_ERR}: model type {model_type!r} cannot be patched with proven equality: {why}")
    result.row_methods = [(n, name) for n, m in model.named_modules() if _is_hf(m) for name in sorted(_row_methods(type(m)))]
    result.skipped[:0] = reasons
    return result
