"""RoPE frequency configuration: every Hugging Face rope type, computed in float64.

:class:`RopeConfig` (``rope_config.py``) holds what decides the rotary frequencies of one attention
layer and caches them per device; each scaling scheme is one class in its own module, registered
below; ``hf.py`` reads Hugging Face configs; ``presets.py`` holds built-in configs.
"""
from __future__ import annotations

from typing import Any

from .scheme import RopeScaling, mscale, register_scheme, registered_schemes, scaling_from_dict

# The scaling schemes: one import registers one scheme (its module decorates it with @register_scheme).
from .basic import DefaultScaling, LinearScaling
from .dynamic import DynamicNTKScaling
from .yarn import YarnScaling
from .longrope import LongRopeScaling
from .llama3 import Llama3Scaling
from .proportional import ProportionalScaling

from .rope_config import RopeConfig  # noqa: E402
from .hf import hf_layer_types, load_hf_dict  # noqa: E402
from .presets import PRESETS  # noqa: E402

ROPE_TYPES = tuple(registered_schemes())

__all__ = [
    "ROPE_TYPES",
    "RopeConfig",
    "RopeScaling",
    *(cls.__name__ for cls in registered_schemes().values()),
    "register_scheme",
    "scaling_from_dict",
    "mscale",
    "PRESETS",
    "load_hf_dict",
    "hf_layer_types",
    "describe_config",
]


def __getattr__(name: str) -> Any:
    if name == "describe_config":  # the text of `posenc config` lives with the CLI
        from ..cli import describe_config

        return describe_config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
