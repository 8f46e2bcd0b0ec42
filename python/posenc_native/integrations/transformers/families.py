"""The model families, one small entry each; everything shared lives in :mod:`.detect`,
:mod:`.rotations`, :mod:`.runtime` and :mod:`.record`.

Most families need no entry: :func:`generic` (the default) finds the rotary module and the
rotation functions and proves equality by probing them (:mod:`.detect`). What varies between
families *within* that path is data, listed here once:

- :data:`PAIRINGS`: the ways a rotation function can pair dims. Half-split (Llama and most);
  interleaved (Cohere, GLM, ERNIE 4.5, Helium: their cos/sin or their ``rotate_half`` pair
  (2i, 2i+1)); interleaved with the result laid out ``[evens | odds]`` (DeepSeek V3's MLA
  ``apply_rotary_pos_emb_interleave``, on the partial ``qk_rope_head_dim`` slice); half-split by
  minus the angle (NanoChat's ``rotate_half`` returns ``[x2, -x1]``). The probe tries
  them in this order; partial rotary needs no entry (dims past ``rotary_dim`` pass through).
- The table's form: ``(cos, sin)`` (most), or one complex ``freqs_cis`` that the attention multiplies
  into ``view_as_complex`` pairs (Llama 4, DeepSeek V2: interleaved pairs, its layout fixed by how
  the function broadcasts the table). The probe tells them apart by what the rotary module returns
  and the rotation function takes (:class:`.rotations.RotationSpec`).
- Per-layer-type rotary (Gemma 2/3, Cohere 2, ...: local and global layers with their own base):
  one regime per layer type, read with ``RopeConfig.from_hf(config, layer_type=...)``.

An entry in :data:`FAMILIES` is needed only where a family does not route rotation through a
model-level rotary module (GPT-J: a per-attention sin/cos table), where only part of the model is
patched part by part (vision-language models: the text decoder and, where proven, the vision tower,
:func:`text_decoder`), or where another integration module handles it (:data:`DELEGATES`). Vision
towers' axial rotaries need no entry either: their layout is read from the module
(:func:`.detect._axis_table`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import nn

from .rotations import RotationSpec
from .runtime import _ERR, RotaryPositions, UnsupportedModelError

if TYPE_CHECKING:
    from ...config import RopeConfig
    from .record import PatchRecord


@dataclass(frozen=True)
class Pairing:
    """How a rotation function pairs dims, as proven by the probe. ``rotary_only``: it was proven only
    on inputs exactly as wide as the rotated part (the wrapper refuses wider ones). ``layout``: the
    one layout a function without ``unsqueeze_dim`` was proven in (the complex-table form, whose
    broadcast of the table fixes it); None when the call's ``unsqueeze_dim`` says. ``q_trailing``: given
    a q shorter than k, it rotates q at k's last positions (a drafter's block after its context:
    MuseGlimmer's ``cos[..., -q_len:, :]``). ``layouts``: for an axial vision table, whose ``[N, R]``
    cos/sin a function broadcasts its own way, the layout proven per (rank of q, the ``unsqueeze_dim``
    passed or None), as pairs; None elsewhere. ``key_arguments``: the parameters of
    :data:`.rotations.KEY_ARGUMENTS` (SAM 2's keys rotated apart) the function was proven to take as
    :func:`.rotations.rotate_keys_apart` does; the wrapper refuses any other parameter it does not read
    at a value other than its default."""

    name: str
    interleaved: bool
    deinterleave: bool = False
    rotary_only: bool = False
    layout: Optional[str] = None
    inverse: bool = False  # turns by -angle (a rotate_half with the signs flipped: NanoChat)
    q_trailing: bool = False
    layouts: Optional[tuple[tuple[tuple[int, Optional[int]], str], ...]] = None
    key_arguments: tuple[str, ...] = ()


PAIRINGS = (
    Pairing("half-split", False),
    Pairing("interleaved", True),
    Pairing("interleaved, de-interleaved output (DeepSeek MLA)", True, True),
    Pairing("half-split, by -angle (NanoChat)", False, inverse=True),
)


def _plan_part(model: nn.Module, record: "PatchRecord", check: bool, path: str):
    """The proven plan of the submodule at ``path`` (the whole model for ""), its paths made absolute."""
    from .detect import plan

    p = plan(model.get_submodule(path) if path else model, record.model_type, check)
    if path:
        for r in p.rotaries:
            r.path = f"{path}.{r.path}"
        p.row_methods = [(f"{path}.{m}" if m else path, name) for m, name in p.row_methods]
    return p


def _swap(model: nn.Module, record: "PatchRecord", p) -> None:
    from .runtime import PosencRotaryEmbedding, RowSelection

    for (module_name, name), spec in p.rotations.items():
        record.route(module_name, name, spec)
    for r in p.rotaries:
        record.swap_module(model, r.path, PosencRotaryEmbedding(r.module, r.regimes, r.complex_table))
    for path, name in p.row_methods:
        record.override(model, path, name, RowSelection(getattr(model.get_submodule(path), name)))


def generic(model: nn.Module, record: "PatchRecord", check: bool, path: str = "") -> None:
    """Any family with a model-level ``*RotaryEmbedding`` and ``apply_rotary_pos_emb``-like functions;
    with ``path``, only in that submodule (the rest of the model is left alone). A vision-language model
    that cannot be proven whole (its vision attention's rotation probed with the text rotary's cos/sin:
    GLM-4.6V, Cosmos 3 Omni; an encoder's forward using a tensor of its own named position_embeddings:
    OmniASR) is then patched part by part (:func:`text_decoder`: the text model, and the vision tower
    where proven)."""
    try:
        p = _plan_part(model, record, check, path)
    except (UnsupportedModelError, ValueError) as e:
        if path or model.config.get_text_config() is model.config:
            raise
        try:
            return text_decoder(model, record, check)
        except (UnsupportedModelError, ValueError):
            raise e from None
    if path:
        p.skipped.append(f"everything outside {path} ({type(model.get_submodule(path)).__name__})")
    record.notes = p.describe()
    _swap(model, record, p)


# --------------------------------------------------------------------------------------------
# GPT-J: rotates inside its attention from a per-layer sin/cos table (``embed_positions``). Each
# attention's ``_get_embed_positions`` is overridden (instance attribute) to return a stand-in that
# survives the ``gather``/``split`` GPT-J does on the table, and ``apply_rotary_pos_emb(tensor, sin,
# cos)`` is routed with interleaved pairs, layout ``bshd``, k and q in two calls.

_GPTJ_OVERRIDE = "_get_embed_positions"


class _GPTJSinCos:
    """Stands in for GPT-J's sin/cos table through ``torch.gather``, ``.to`` and ``torch.split``."""

    __slots__ = ("_posenc_rotary",)
    shape = torch.Size((1, 1, 2))  # GPT-J reads shape[-1] to repeat position ids and to split sin | cos

    def __init__(self, rotary: RotaryPositions):
        self._posenc_rotary = rotary

    def to(self, *args, **kwargs) -> "_GPTJSinCos":
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.gather:
            return args[0]
        if func is torch.split:
            return args[0], args[0]
        raise NotImplementedError(
            f"{_ERR}: GPT-J's attention applied {getattr(func, '__name__', func)!r} to its sin/cos table, which the "
            "patch does not expect; this transformers version's GPT-J is not supported (unpatch the model)")


class _GPTJRotary:
    """The per-attention ``_get_embed_positions`` override of a patched GPT-J."""

    def __init__(self, rope: RopeConfig, attention_factor: float, routes: dict):
        self.rope = rope
        self.attention_factor = attention_factor
        self.routes = routes

    def __call__(self, position_ids: torch.Tensor) -> _GPTJSinCos:
        inv_freq = self.rope.inv_freq_on(position_ids.device)
        return _GPTJSinCos(RotaryPositions(position_ids, inv_freq, self.attention_factor, True, self.routes))


def gptj(model: nn.Module, record: "PatchRecord", check: bool) -> None:
    from .detect import _ROUNDED_RTOL, _forward_code

    if any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()):
        return generic(model, record, check)  # transformers >= 5.24: a model-level rotary module, as most

    rope, module_name = record.rope_config(model), "transformers.models.gptj.modeling_gptj"
    attentions = [(n, m) for n, m in model.named_modules() if type(m).__module__ == module_name
                  and (code := _forward_code(type(m))) is not None
                  and {"apply_rotary_pos_emb", _GPTJ_OVERRIDE} <= set(code.co_names)]
    if not attentions:
        raise UnsupportedModelError(f"{_ERR}: found no GPT-J attention calling apply_rotary_pos_emb and "
                                    f"{_GPTJ_OVERRIDE}; the installed transformers' GPT-J is not supported")
    if not rope.interleaved:
        raise ValueError(f"{_ERR}: RopeConfig.from_hf says GPT-J pairs half-split dims, but GPT-J rotates "
                         "interleaved pairs (2i, 2i+1)")
    for name, attn in attentions:
        hd, rd = attn.head_dim, (attn.rotary_dim or attn.head_dim)
        if rope.head_dim != hd or rope.rotary_dim != rd:
            raise ValueError(f"{_ERR}: {name} has head_dim {hd} and rotary_dim {rd} but RopeConfig.from_hf gives "
                             f"{rope.head_dim} and {rope.rotary_dim}")
    if rope.needs_seq_len:
        raise UnsupportedModelError(f"{_ERR}: GPT-J has no sequence-length dependent rotary scaling, but "
                                    "RopeConfig.from_hf returned one")
    if check:
        table = getattr(attentions[0][1], "embed_positions", None)  # rows [sin | cos] of position * inv_freq
        if isinstance(table, torch.Tensor) and not table.is_meta and table.shape[0] > 1:
            theirs = table[1, : table.shape[-1] // 2].to("cpu", torch.float64)  # sin(1 * inv_freq)
            ours = torch.sin(rope.inv_freq_on("cpu"))
            if ours.shape != theirs.shape or not torch.allclose(ours, theirs, rtol=_ROUNDED_RTOL, atol=1e-6):
                raise ValueError(f"{_ERR}: RopeConfig.from_hf's frequencies disagree with GPT-J's own sin/cos "
                                 "table; not patching. Pass check=False to patch anyway.")
        if float(rope.attention_factor) != 1.0:
            raise ValueError(f"{_ERR}: GPT-J has no attention factor, but RopeConfig.from_hf gives "
                             f"{rope.attention_factor}")
    rotary = _GPTJRotary(rope, float(rope.attention_factor), {(module_name, "apply_rotary_pos_emb"): PAIRINGS[1]})
    record.route(module_name, "apply_rotary_pos_emb", RotationSpec("gptj", ("tensor", "sin", "cos")))
    for name, _ in attentions:
        record.override(model, name, _GPTJ_OVERRIDE, rotary)


# --------------------------------------------------------------------------------------------
# Vision-language models whose vision tower has a rotary embedding of its own (Qwen2-VL, Qwen2.5-VL,
# Qwen3-VL): the text decoder (MRoPE, [3, B, S] position ids) and the vision tower (axial, [N, 2]
# position ids) are each planned by the generic path run on that part alone; a tower that cannot be
# proven is left as it is. Run over the whole model, detection would probe the vision attention's
# rotation function (same modeling module) with the text rotary's cos/sin, which it is never fed, and
# refuse.


def _text_decoder_path(model: nn.Module) -> str:
    """Path of the submodule that is the text model (its config is the model's text config)."""
    from transformers import PreTrainedModel

    text_config = model.config.get_text_config()
    if text_config is model.config:
        return ""
    for name, m in model.named_modules():  # outermost first
        if name and isinstance(m, PreTrainedModel) and getattr(m, "config", None) is text_config:
            return name
    raise UnsupportedModelError(f"{_ERR}: found no text model (a submodel holding the text config) in "
                                f"{type(model).__name__}; this transformers version's layout is not supported")


def _vision_tower_path(model: nn.Module) -> Optional[str]:
    """Path of the submodule that is the vision tower (its config is the model's vision config), if any."""
    from transformers import PreTrainedModel

    vision_config = getattr(model.config, "vision_config", None)
    if vision_config is None:
        return None
    return next((name for name, m in model.named_modules()
                 if name and isinstance(m, PreTrainedModel) and getattr(m, "config", None) is vision_config), None)


def text_decoder(model: nn.Module, record: "PatchRecord", check: bool) -> None:
    """Patch the text decoder of a vision-language model, and its vision tower where that is proven
    on its own (an axial rotary: :class:`.runtime.AxisTableRegime`); else leave the tower as it is."""
    from .detect import Plan

    text = _text_decoder_path(model)
    parts: list[Plan] = [_plan_part(model, record, check, text)]
    tower = _vision_tower_path(model)
    if tower is None:
        parts[0].skipped.append(f"everything outside {text}")
    else:
        try:
            parts.append(_plan_part(model, record, check, tower))
            parts[-1].skipped.append(f"everything outside {text} and {tower}")
        except (UnsupportedModelError, ValueError) as e:
            reason = str(e).replace(f"{_ERR}: ", "")
            parts[0].skipped.append(f"everything outside {text}, the vision tower {tower} included: {reason}")
    record.notes = "\n".join([parts[0].describe()] + [p.describe().split("\n", 1)[1] for p in parts[1:]])
    for p in parts:
        _swap(model, record, p)


@dataclass(frozen=True)
class Family:
    """How one family is patched: ``patch(model, record, check)`` fills the record (what it swaps)."""

    patch: Callable[[nn.Module, "PatchRecord", bool], None]


GENERIC = Family(generic)

FAMILIES: dict[str, Family] = {
    "gptj": Family(gptj),
    **{t: Family(text_decoder) for t in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe",
                                         "glm4v", "glm4v_moe", "glm_ocr", "step3p7",
                                         "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker", "paddleocr_vl", "exaone4_5", "ernie4_5_vl_moe")},
}

# model_type -> module of another integration with patch(model, check=) / unpatch(model) of its own
DELEGATES: dict[str, str] = {t: "posenc_native.integrations.t5" for t in ("t5", "mt5", "umt5")}
