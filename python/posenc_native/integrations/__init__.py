"""Integrations of posenc-native with other libraries.

Submodules are imported on first use, so importing ``posenc_native`` never imports the libraries
they integrate with:

- :mod:`posenc_native.integrations.transformers`: ``patch(model)`` / ``unpatch(model)`` swap the
  rotary path of a loaded Hugging Face ``transformers`` model for posenc's fused RoPE kernels (and,
  for T5 / mT5 / UMT5, delegate to :mod:`posenc_native.integrations.t5`: the relative position bias
  from posenc's kernel).
"""
import importlib

__all__ = ["transformers", "t5"]


def __getattr__(name: str):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
