"""Find and load the compiled op library (libposenc_ops.so) and report how it was built."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

_LIB_NAME = "libposenc_ops.so"
_loaded_path: str | None = None


def library_path() -> str:
    """Path of the op library: $POSENC_LIBRARY, else the one installed with this package."""
    override = os.environ.get("POSENC_LIBRARY")
    if override:
        return override
    here = Path(__file__).resolve().parent
    for candidate in (here / "lib" / _LIB_NAME, here / _LIB_NAME):
        if candidate.exists():
            return str(candidate)
    raise ImportError(
        f"posenc_native: the op library {_LIB_NAME} was not found next to {here}. "
        "Install the package with `pip install --no-build-isolation .` (it builds the library), "
        "or point POSENC_LIBRARY at a built libposenc_ops.so."
    )


def load_library() -> str:
    """Load the op library once (registers torch.ops.posenc.*); returns its path."""
    global _loaded_path
    if _loaded_path is None:
        path = library_path()
        torch.ops.load_library(path)
        _loaded_path = path
        _check_torch_version()
    return _loaded_path


def _check_torch_version() -> None:
    built = build_info()["torch"]
    running = torch.__version__.split("+")[0]
    if built.split(".")[:2] != running.split(".")[:2]:
        raise ImportError(
            f"posenc_native was built against torch {built} but torch {running} is running; "
            "C++ extensions only load into the torch minor version they were built for. Rebuild with "
            "`pip install --no-build-isolation --force-reinstall .`."
        )


def build_info() -> dict[str, Any]:
    """How the op library was built.

    Keys: ``version``, ``torch`` (the torch it was built against), ``cuda`` (bool: CUDA kernels
    compiled in), ``cuda_version``, ``cuda_archs`` (list), ``cxx_compiler``, ``cuda_compiler``,
    ``cxx11_abi`` (bool), ``library`` (path).
    """
    if _loaded_path is None:
        load_library()
    info = json.loads(torch.ops.posenc.build_info())
    info["cuda_archs"] = [a for a in info["cuda_archs"].split(",") if a]
    info["cxx11_abi"] = bool(info["cxx11_abi"])
    info["library"] = _loaded_path
    return info
