"""Find and load the compiled op libraries and report how they were built.

``libposenc_ops.so`` holds the schemas and the CPU kernels; ``libposenc_ops_cuda.so`` (next to it, in
CUDA builds) holds the CUDA kernels and is loaded only into a torch that has CUDA, so a CPU-only torch
never needs a CUDA runtime. Both are built on LibTorch's stable ABI, so one build loads into every
torch from :data:`TORCH_MIN` on.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

# The oldest torch the op libraries support (their stable-ABI target). pyproject.toml's
# `dependencies` states the same bound; tests/test_build.py checks that they agree.
TORCH_MIN: tuple[int, int] = (2, 11)
TORCH_REQUIREMENT = f"torch>={TORCH_MIN[0]}.{TORCH_MIN[1]}"

_LIB_NAME = "libposenc_ops.so"
_CUDA_LIB_NAME = "libposenc_ops_cuda.so"
_BUILD_HINT = ("To build from source against the torch you have: `pip install --no-build-isolation .` in a "
               "checkout of posenc-native (it needs " + TORCH_REQUIREMENT + ", a C++20 compiler, and nvcc for "
               "the CUDA kernels).")
_loaded_path: str | None = None
_loaded_cuda_path: str | None = None


def _torch_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_torch_version(version: str | None = None) -> None:
    """Raise ImportError unless ``version`` (default: the running torch) is in the supported range."""
    version = version or torch.__version__
    minor = _torch_minor(version)
    if minor is None or minor < TORCH_MIN:
        raise ImportError(
            f"posenc_native supports {TORCH_REQUIREMENT}, but torch {version} is running. Upgrade torch "
            f"(pip install '{TORCH_REQUIREMENT}'). {_BUILD_HINT}"
        )


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


def cuda_library_path(main: str | None = None) -> str | None:
    """Path of the CUDA kernel library: $POSENC_CUDA_LIBRARY, else ``libposenc_ops_cuda.so`` in the
    folder of the main library ``main`` (default :func:`library_path`); None when there is none (a
    build without CUDA kernels)."""
    override = os.environ.get("POSENC_CUDA_LIBRARY")
    if override:
        return override
    candidate = Path(main or library_path()).parent / _CUDA_LIB_NAME
    return str(candidate) if candidate.exists() else None


def _load(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise ImportError(f"posenc_native: the {what} {path} does not exist. {_BUILD_HINT}")
    try:
        torch.ops.load_library(path)
    except OSError as e:
        built = built_for_torch(path)
        reason = e.__cause__ or e  # torch's "Could not load this library" wraps the loader's reason
        raise ImportError(
            f"posenc_native: the {what} {path} could not be loaded into torch {torch.__version__}"
            + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "") + f" ({reason}). "
            + (f"It was built for torch {built}; " if built else "")
            + f"This release supports {TORCH_REQUIREMENT}. {_BUILD_HINT}"
        ) from e


def load_library(path: str | None = None) -> str:
    """Load the op library once (registers torch.ops.posenc.*); returns its path.

    With a CUDA build of torch, the CUDA kernel library (:func:`cuda_library_path`) is loaded too.

    Args:
        path: the library to load; default :func:`library_path`. Asking for a different file once
            one is loaded raises ImportError (torch cannot register the ops twice: it would abort
            the process), as do a torch outside the supported range and a library that does not load.
    """
    global _loaded_path, _loaded_cuda_path
    wanted = path or (_loaded_path if _loaded_path is not None else library_path())
    if _loaded_path is not None:
        _refuse_second(_loaded_path, wanted)
        return _loaded_path
    check_torch_version()
    registered = _registered_from()
    if registered is None:
        _load(wanted, "op library")
        registered = wanted
    else:  # loaded by another copy of this module, torch.ops.load_library or a linked program
        _refuse_second(registered, wanted)
    if torch.version.cuda and not _has_cuda_kernels():
        cuda = cuda_library_path(registered if os.path.exists(registered) else wanted)
        if cuda is not None:
            _load(cuda, "CUDA kernel library")
            _loaded_cuda_path = cuda
    _loaded_path = registered
    return _loaded_path


_FAST_PATH_NAME = "_direct.abi3.so"
_fast_path_kind: str | None = None


def load_fast_path(objects: dict[str, Any]) -> Any:
    """The decode fast path (``posenc_native._direct``, csrc/python/direct.c) bound to the loaded op
    library and to the Python objects it needs (``ops.py`` hands them over), or None where there is
    none: no extension next to the op library (a build without Python headers), or a Python that
    cannot load it (it is built for CPython's stable ABI). :func:`build_info` says which way it runs
    the kernels: ``"direct entry"`` (torch >= 2.14: the op library's ``posenc_direct_kernel_v1``, no
    argument boxing) or ``"redispatch"`` (an older torch: the op's redispatch to the CPU key)."""
    global _fast_path_kind
    import importlib.machinery
    import importlib.util
    main = load_library()
    path = Path(main).parent / _FAST_PATH_NAME
    if not path.exists():
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader("posenc_native._direct", str(path))
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location("posenc_native._direct", str(path), loader=loader))
        loader.exec_module(module)
    except ImportError:
        return None
    # the dtypes an op's argument may name, by the extension's numbering (direct_entry.h, PosencDtype);
    # added to objects, which a later bind() (the tests') passes again
    objects["dtypes"] = {getattr(torch, name): code for code, name in enumerate(module.DTYPES)}
    _fast_path_kind = "direct entry" if module.bind(main, objects) else "redispatch"
    return module


def _has_cuda_kernels() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key("posenc::rope", "CUDA")


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
        if os.path.basename(lib) == _LIB_NAME or (os.path.basename(lib) != _CUDA_LIB_NAME
                                                  and built_for_torch(lib) is not None):
            return lib
    return "<a library not loaded through torch.ops.load_library>"


_MARKER = b"posenc-built-for-torch="


def built_for_torch(path: str) -> str | None:
    """The torch version a library file was built with (read from the file, without loading it)."""
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


def build_info() -> dict[str, Any]:
    """How the op library was built.

    Keys: ``version``, ``torch`` (the torch it was built with), ``cuda`` (bool: CUDA kernels
    compiled, in the CUDA kernel library), ``cuda_version``, ``cuda_archs`` (list), ``cxx_compiler``,
    ``cuda_compiler``, ``cxx11_abi`` (bool), ``cpu_isa`` (the CPU path this process takes),
    ``cpu_prefetch`` (bool: whether its SIMD kernels prefetch, ``POSENC_CPU_PREFETCH``),
    ``cpu_prefetch_from_bytes`` (int: the bytes of rows from which a call prefetches),
    ``cpu_prefetch_distance`` (int: how many bytes ahead of its reads it prefetches),
    ``cpu_stream_from_bytes`` (int: the output size from which a CPU sinusoidal op's output, or an
    out-of-place RoPE output, is written with non-temporal stores where its pages are mapped in
    already, ``POSENC_CPU_STREAM``), ``cpu_fp16_bits`` (int: 256 or 512, the vector width of the
    fp16 row kernels on the AVX-512 paths) and ``cpu_fp32_512_below_bytes`` (int: float32 rows take
    512-bit vectors there in calls under this many bytes of rows; both ``POSENC_CPU_VECTOR_BITS``), ``library``
    (path), ``cuda_library`` (path of the loaded CUDA kernel library, or None: a CPU-only
    torch, or a build without CUDA kernels), ``torch_supported`` (the torch range, as a requirement),
    ``fast_path`` (how the decode fast path reaches the CPU kernels: ``"direct entry"``,
    ``"redispatch"``, or None where it is not built: :func:`load_fast_path`).
    """
    if _loaded_path is None:
        load_library()
    info = json.loads(torch.ops.posenc.build_info())
    info["cuda_archs"] = [a for a in info["cuda_archs"].split(",") if a]
    info["cxx11_abi"] = bool(info["cxx11_abi"])
    info["library"] = _loaded_path
    info["cuda_library"] = _loaded_cuda_path
    info["torch_supported"] = TORCH_REQUIREMENT
    from . import ops  # noqa: F401  (binds the decode fast path)
    info["fast_path"] = _fast_path_kind
    return info
