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


def load_library(path: str | None = None) -> str:
    """Load the op library once (registers torch.ops.posenc.*); returns its path.

    Args:
        path: the library to load; default :func:`library_path`. Asking for a different file once
            one is loaded raises ImportError (torch cannot register the ops twice: it would abort
            the process), as does a library that does not load into the running torch.
    """
    global _loaded_path
    wanted = path or (_loaded_path if _loaded_path is not None else library_path())
    if _loaded_path is not None:
        _refuse_second(_loaded_path, wanted)
        return _loaded_path
    registered = _registered_from()
    if registered is not None:  # loaded by another copy of this module, or torch.ops.load_library
        _refuse_second(registered, wanted)
        _loaded_path = registered
        return _loaded_path
    if not os.path.exists(wanted):
        raise ImportError(f"posenc_native: the op library {wanted} does not exist")
    try:
        torch.ops.load_library(wanted)
    except OSError as e:
        built = built_for_torch(wanted)
        raise ImportError(
            f"posenc_native: the op library {wanted} could not be loaded into torch {torch.__version__}: {e}. "
            + (f"It was built for torch {built}; " if built else "")
            + "C++ extensions only load into the torch they were built for. Install the matching torch, or "
            "rebuild with `pip install --no-build-isolation --force-reinstall .`."
        ) from e
    _loaded_path = wanted
    _check_torch_version()
    return _loaded_path


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _refuse_second(loaded: str, wanted: str) -> None:
    if not _same_file(loaded, wanted):
        raise ImportError(
            f"posenc_native: the op library is already loaded from {loaded}; refusing to load a second one from "
            f"{wanted} (torch cannot register the posenc ops twice in one process). Use one build per process "
            "(check POSENC_LIBRARY and which posenc_native is imported)."
        )


def _registered_from() -> str | None:
    """Where the posenc ops already registered in this process came from, or None if they are not."""
    try:
        torch._C._dispatch_find_schema_or_throw("posenc::build_info", "")
    except RuntimeError:
        return None
    for lib in getattr(torch.ops, "loaded_libraries", ()):
        if os.path.basename(lib) == _LIB_NAME or built_for_torch(lib) is not None:
            return lib
    return "<a library not loaded through torch.ops.load_library>"


_MARKER = b"posenc-built-for-torch="


def built_for_torch(path: str) -> str | None:
    """The torch version a library file was built for (read from the file, without loading it)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    at = data.find(_MARKER)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    return data[at + len(_MARKER):end if end > 0 else None].decode("ascii", "replace") or None


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
    ``cxx11_abi`` (bool), ``cpu_isa`` (the CPU path this process takes), ``library`` (path).
    """
    if _loaded_path is None:
        load_library()
    info = json.loads(torch.ops.posenc.build_info())
    info["cuda_archs"] = [a for a in info["cuda_archs"].split(",") if a]
    info["cxx11_abi"] = bool(info["cxx11_abi"])
    info["library"] = _loaded_path
    return info
