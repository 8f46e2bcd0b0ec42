"""Reading Hugging Face configs: transformers ``PretrainedConfig`` objects and ``config.json`` dicts,
in the 4.x (``rope_theta``/``rope_scaling``) and 5.x (``rope_parameters``, per layer type) forms."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from .presets import PRESETS
from .rope_config import RopeConfig
from .scheme import scaling_from_dict, scheme_class

__all__ = ["load_hf_dict", "hf_layer_types", "rope_config_from_hf", "interleaved_mrope_section"]


def rope_config_from_hf(cfg: Any, layer_type: Optional[str] = None, interleaved: Optional[bool] = None
                        ) -> RopeConfig:
    """What :meth:`RopeConfig.from_hf` returns (it documents the arguments)."""
    return _HFSource.make(cfg, layer_type).rope_config(layer_type, interleaved)


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



# Model types whose attention rotates interleaved pairs (2i, 2i+1) (checked in transformers' code:
# rotate_every_two / x[..., ::2] / view_as_complex); configs with `rope_interleave` say it themselves.
_INTERLEAVED_MODEL_TYPES = frozenset({
    "gptj", "codegen", "roformer", "cohere", "cohere2", "cohere2_moe", "glm", "glm4", "ernie4_5", "ernie4_5_moe",
    "helium", "llama4", "llama4_text", "deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "mistral4",
    "youtu", "longcat_flash", "glm4_moe_lite", "axk1", "hy_v4_vl", "hy_v4_vl_text",
})

# partial_rotary_factor defaults of transformers' config classes, for config.json dicts that omit it
_PRF_DEFAULTS = {
    "gpt_neox": 0.25, "stablelm": 0.25, "phi": 0.5, "persimmon": 0.5, "glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5,
    "glm4v_moe": 0.5, "nemotron": 0.5, "recurrent_gemma": 0.5, "qwen3_next": 0.25, "qwen3_5": 0.25,
    "qwen3_5_moe": 0.25, "moonshine": 0.9,
}


# MRoPE (multimodal RoPE: every token has (time, height, width) position ids and each pair takes its
# angle from one of them). Model types whose text rotary module is MRoPE in transformers, with the
# section it uses when the config omits ``mrope_section`` and its pair layout: Qwen2-VL and Qwen2.5-VL
# split the pairs into contiguous T | H | W sections (modeling_qwen2_vl.Qwen2VLRotaryEmbedding);
# Qwen3-VL (and its MoE), Qwen3.5, Qwen3-Omni, Qwen4-exp, Cosmos 3 Edge and HunYuan V4 VL assign them
# round-robin T, H, W (Qwen3VLTextRotaryEmbedding, HYV4VLRotaryEmbedding), whatever the config's ``mrope_interleaved`` says: their rotary modules do
# not read the flag. NeoMME alternates two axes (row, column) over all its pairs (NeoMMERotaryEmbedding),
# a section that follows the pair count of each layer type. Other model types: the layout the config states
# (``mrope_section``, ``mrope_interleaved``).
_MROPE_DEFAULTS: dict[str, tuple[Union[tuple[int, ...], Callable[[int], tuple[int, ...]]], bool]] = {
    **dict.fromkeys(("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"), ((16, 24, 24), False)),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"), ((24, 20, 20), True)),
    **dict.fromkeys(("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), ((11, 11, 10), True)),
    **dict.fromkeys(("cosmos3_edge", "cosmos3_edge_text"), ((24, 20, 20), True)),
    **dict.fromkeys(("qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen3_omni_moe_text", "qwen3_omni_moe_talker_text"),
                    ((24, 20, 20), True)),
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), ((11, 11, 10), True)),
    **dict.fromkeys(("hy_v4_vl", "hy_v4_vl_text"), ((24, 20, 20), True)),
    "neomme": (lambda pairs: (pairs - pairs // 2, pairs // 2), True),
}


def _mrope_section(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ValueError(f"'mrope_section' must be a list of ints (pairs per T/H/W axis), got {value!r}")
    out = tuple(value)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in out):
        raise ValueError(f"'mrope_section' must be a list of ints >= 0 (pairs per T/H/W axis), got {value!r}")
    return out


def interleaved_mrope_section(section: tuple[int, ...], pairs: int) -> tuple[int, ...]:
    """The section that transformers' interleaved MRoPE (Qwen3-VL) actually uses on ``pairs`` pairs.

    Its rotary module starts from axis 0 everywhere and gives pair ``j`` to axis ``a >= 1`` when
    ``j % 3 == a`` and ``j < 3 * section[a]``: section[0] is never read and a section that does not sum
    to ``pairs`` is cut (or axis 0 takes the rest). Counting each axis's pairs gives a section that sums
    to ``pairs`` and makes the same assignment under that rule (``_rope_math.mrope_pair_axes``)."""
    if len(section) != 3:
        raise ValueError(f"interleaved 'mrope_section' must have 3 entries (T, H, W), got {list(section)}")
    hw = [len(range(a, min(pairs, 3 * section[a]), 3)) for a in (1, 2)]
    return (pairs - sum(hw), *hw)


class _HFSource:
    """Uniform read access to a PretrainedConfig object or a config.json dict."""

    def __init__(self, obj: Any, is_dict: bool, head_dim_override: Optional[int] = None,
                 parent_model_type: str = "") -> None:
        self.obj = obj
        self.is_dict = is_dict
        self.head_dim_override = head_dim_override
        self.parent_model_type = parent_model_type  # a composite config's, for a text config without one

    @classmethod
    def make(cls, cfg: Any, layer_type: Optional[str]) -> "_HFSource":
        if isinstance(cfg, (str, os.PathLike)):
            cfg = load_hf_dict(cfg)
        if isinstance(cfg, Mapping):
            d = dict(cfg)
            rope_keys = ("rope_parameters", "rope_scaling", "rope_theta", "num_attention_heads", "hidden_size",
                         "head_dim")
            parent = ""
            if isinstance(d.get("text_config"), Mapping) and not any(k in d for k in rope_keys):
                parent = str(d.get("model_type") or "")
                d = dict(d["text_config"])  # composite (multimodal) config: the text model's rope
            return cls(d, True, _dict_layer_head_dim(d, layer_type), parent)
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
        return str(self.get("model_type", default="") or self.parent_model_type)

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
        """The RopeConfig of one layer type (see :meth:`RopeConfig.from_hf`)."""
        params = self.rope_params(layer_type)
        mrope_type = (params.get("rope_type") or params.get("type")) == "mrope"
        if mrope_type:  # transformers' Qwen2-VL config: 4.x "mrope" is default RoPE with sections
            params = {k: v for k, v in params.items() if k != "type"}
            params["rope_type"] = "default"
        scheme = scheme_class(params.get("rope_type") or params.get("type") or "default")
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
            if rd is not None and not scheme.owns_rotary_dim:
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
        if scheme.extends_context and params.get("original_max_position_embeddings") is None:
            params["original_max_position_embeddings"] = max_pos  # transformers' standardisation
        if interleaved is None:
            flag = self.get("rope_interleave")
            interleaved = bool(flag) if flag is not None else self.model_type() in _INTERLEAVED_MODEL_TYPES
        rope = RopeConfig(head_dim=head_dim, base=base, interleaved=interleaved, rotary_dim=rotary_dim,
                          partial_rotary_factor=prf, max_position_embeddings=max_pos,
                          scaling=scaling_from_dict(params))
        section, mrope_interleaved = self.mrope(params, mrope_type, rope.rotary_dim // 2)
        if section is None:
            return rope
        return dataclasses.replace(rope, mrope_section=section, mrope_interleaved=mrope_interleaved)

    def mrope(self, params: Mapping[str, Any], mrope_type: bool, pairs: int) -> tuple[Optional[tuple[int, ...]], bool]:
        """The MRoPE layout ``(mrope_section, mrope_interleaved)`` of the text rotary, ``(None, False)``
        for plain RoPE (see :data:`_MROPE_DEFAULTS`)."""
        known = _MROPE_DEFAULTS.get(self.model_type())
        raw = params.get("mrope_section")
        if known is None and raw is None:
            if mrope_type:
                raise ValueError("rope_type 'mrope' needs 'mrope_section' (pairs per T/H/W axis) in "
                                 "rope_parameters / rope_scaling")
            return None, False
        if raw is not None:
            section = _mrope_section(raw)
        else:
            section = known[0](pairs) if callable(known[0]) else known[0]
        if known is not None:
            interleaved = known[1]
        else:
            flag = params.get("mrope_interleaved", False)
            if not isinstance(flag, bool):
                raise ValueError(f"'mrope_interleaved' must be true or false, got {flag!r}")
            interleaved = flag
        if interleaved and sum(section) != pairs:  # what transformers' round robin makes of it on these pairs
            section = interleaved_mrope_section(section, pairs)
        return section, interleaved


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
