"""How the op library was built and packaged: build_info(), where the library is loaded from, and the
wheel layout LibTorch users rely on (public header + CMake package)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import posenc_native as pn

PACKAGE_DIR = Path(pn.__file__).resolve().parent
REPO_ROOT = Path(__file__).resolve().parent.parent
FROM_SOURCE_TREE = bool(os.environ.get("POSENC_LIBRARY"))
needs_installed = pytest.mark.skipif(FROM_SOURCE_TREE, reason="POSENC_LIBRARY is set: running from the source tree, "
                                                              "not from an installed wheel")

EXPECTED_TYPES = {
    "version": str,
    "torch": str,
    "cuda": bool,
    "cuda_version": str,
    "cuda_archs": list,
    "cxx_compiler": str,
    "cuda_compiler": str,
    "cxx11_abi": bool,
    "library": str,
}


def test_build_info_keys_and_types():
    info = pn.build_info()
    for key, typ in EXPECTED_TYPES.items():
        assert key in info, f"build_info() lacks {key!r}: {sorted(info)}"
        assert isinstance(info[key], typ), f"build_info()[{key!r}] = {info[key]!r} is not a {typ.__name__}"
    assert all(isinstance(a, str) and a for a in info["cuda_archs"])
    assert info["version"] == pn.__version__
    # C++ extensions only load into the torch minor version they were built for.
    assert info["torch"].split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
    assert info["cxx_compiler"].strip()
    assert info["cxx11_abi"] == torch._C._GLIBCXX_USE_CXX11_ABI
    if info["cuda"]:
        assert info["cuda_archs"], "a CUDA build must report the architectures it was compiled for"
        assert info["cuda_version"] and info["cuda_compiler"].strip()
    else:
        assert info["cuda_archs"] == []


@pytest.mark.skipif(os.environ.get("POSENC_REQUIRE_CUDA_BUILD") != "1",
                    reason="POSENC_REQUIRE_CUDA_BUILD=1 not set (CI sets it: the CUDA kernels must be compiled in)")
def test_cuda_build_required():
    info = pn.build_info()
    assert info["cuda"] is True, f"POSENC_REQUIRE_CUDA_BUILD=1 but the library was built without CUDA: {info}"
    assert any("90" in arch for arch in info["cuda_archs"]), f"sm_90 (H100/H200) missing from {info['cuda_archs']}"


def test_library_is_loaded_and_registers_ops():
    path = Path(pn.build_info()["library"])
    assert path.is_file() and path.name == "libposenc_ops.so"
    assert Path(pn.library_path()).resolve() == path.resolve()
    for name in ("build_info", "sinusoidal_table", "add_sinusoidal", "rope", "rope_", "rope_cos_sin", "rope_cos_sin_"):
        assert hasattr(torch.ops.posenc, name), f"torch.ops.posenc.{name} is not registered"
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str(path.resolve()) in maps.read_text(), "the reported library is not mapped into this process"


@needs_installed
def test_library_loads_from_installed_package():
    expected = PACKAGE_DIR / "lib" / "libposenc_ops.so"
    assert expected.is_file(), f"the wheel must carry the op library at {expected}"
    assert Path(pn.build_info()["library"]).resolve() == expected.resolve()


@needs_installed
@pytest.mark.parametrize("relpath", [
    "include/posenc/posenc.h",
    "share/cmake/PosencNative/PosencNativeConfig.cmake",
    "share/cmake/PosencNative/PosencNativeConfigVersion.cmake",
    "share/cmake/PosencNative/PosencNativeTargets.cmake",
])
def test_wheel_layout(relpath):
    path = PACKAGE_DIR / relpath
    assert path.is_file(), f"{path} missing from the installed package"
    assert path.stat().st_size > 0


@needs_installed
def test_installed_header_matches_source():
    installed = PACKAGE_DIR / "include" / "posenc" / "posenc.h"
    source = REPO_ROOT / "csrc" / "include" / "posenc" / "posenc.h"
    if not source.exists():
        pytest.skip("not run from a source checkout")
    assert installed.read_text() == source.read_text(), "installed posenc.h differs from csrc/include/posenc/posenc.h"


@needs_installed
def test_cmake_package_points_at_the_library():
    cmake_dir = PACKAGE_DIR / "share" / "cmake" / "PosencNative"
    config = (cmake_dir / "PosencNativeConfig.cmake").read_text()
    assert "PosencNativeTargets.cmake" in config
    targets = "".join(p.read_text() for p in cmake_dir.glob("PosencNativeTargets*.cmake"))
    assert "PosencNative::ops" in targets
    assert "libposenc_ops.so" in targets


def test_op_library_has_no_python_in_it():
    """A LibTorch program must be able to load the library: no libpython, no CPython C API symbols."""
    import re
    import shutil
    import subprocess

    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.skip("needs binutils (readelf, nm)")
    lib = pn.library_path()
    needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    assert "libtorch_cpu.so" in needed  # the check reads real output
    assert "libpython" not in needed and "libtorch_python" not in needed
    undefined = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True, text=True, check=True).stdout
    c_api = [s for s in undefined.split() if re.match(r"_?Py[A-Z_][A-Za-z_]*$", s)]
    assert c_api == [], c_api
