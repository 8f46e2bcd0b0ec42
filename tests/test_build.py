"""How the op library was built and packaged: build_info(), where the library is loaded from, and the
wheel layout LibTorch users rely on (public header + CMake package)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import posenc_native as pn
from posenc_native import _library

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
    "torch_supported": str,
}


def test_build_info_keys_and_types():
    info = pn.build_info()
    for key, typ in EXPECTED_TYPES.items():
        assert key in info, f"build_info() lacks {key!r}: {sorted(info)}"
        assert isinstance(info[key], typ), f"build_info()[{key!r}] = {info[key]!r} is not a {typ.__name__}"
    assert all(isinstance(a, str) and a for a in info["cuda_archs"])
    assert info["version"] == pn.__version__
    # One build on LibTorch's stable ABI serves every torch from TORCH_MIN on: the running torch and
    # the one the library was built with are both in that range (they need not be the same).
    assert _library._torch_minor(torch.__version__) >= _library.TORCH_MIN
    assert _library._torch_minor(info["torch"]) >= _library.TORCH_MIN, info["torch"]
    assert info["torch_supported"] == _library.TORCH_REQUIREMENT
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
    # The CUDA kernels live in their own library beside the main one (also in a wheel that a
    # CPU-only torch loads: there it stays unloaded, see test_cuda_library_only_with_cuda_torch).
    cuda_lib = Path(info["library"]).parent / "libposenc_ops_cuda.so"
    assert cuda_lib.is_file(), f"POSENC_REQUIRE_CUDA_BUILD=1: a CUDA build must ship {cuda_lib}"
    if torch.version.cuda is None:
        return  # its build facts come from it once loaded, which a CPU-only torch never does
    assert info["cuda"] is True, f"POSENC_REQUIRE_CUDA_BUILD=1 but the library was built without CUDA: {info}"
    assert any("90" in arch for arch in info["cuda_archs"]), f"sm_90 (H100/H200) missing from {info['cuda_archs']}"


def _mapped(path: str | Path) -> bool:
    return str(Path(path).resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)")
def test_cuda_library_only_with_cuda_torch():
    """The CUDA kernels' library is loaded into a CUDA torch, and never into a CPU-only torch (which
    has no CUDA runtime to resolve it against)."""
    info = pn.build_info()
    beside = Path(info["library"]).parent / "libposenc_ops_cuda.so"
    if torch.version.cuda is None:
        assert info["cuda_library"] is None
        assert not (beside.exists() and _mapped(beside))
        assert not torch._C._dispatch_has_kernel_for_dispatch_key("posenc::rope", "CUDA")
    elif info["cuda_library"] is not None:
        assert _mapped(info["cuda_library"])
        assert torch._C._dispatch_has_kernel_for_dispatch_key("posenc::rope", "CUDA")
    else:  # a CUDA torch with a CPU-only build: nothing beside the main library to load
        assert not beside.exists() or torch._C._dispatch_has_kernel_for_dispatch_key("posenc::rope", "CUDA")


def test_main_library_needs_no_cuda_runtime():
    """A CPU-only torch has no CUDA libraries: the main op library must not ask for any."""
    import shutil
    import subprocess

    if shutil.which("readelf") is None:
        pytest.skip("needs binutils (readelf)")
    needed = subprocess.run(["readelf", "-d", pn.library_path()], capture_output=True, text=True,
                            check=True).stdout
    assert "libtorch_cpu.so" in needed  # the check reads real output
    cuda = [lib for lib in ("libcudart", "libc10_cuda", "libtorch_cuda", "libcuda.so") if lib in needed]
    assert cuda == [], f"{pn.library_path()} needs {cuda}: it would not load into a CPU-only torch"


def test_torch_range_stated_once():
    """The loader's range and the package metadata's torch requirement are the same."""
    pyproject = REPO_ROOT / "pyproject.toml"
    if pyproject.exists():
        import re

        deps = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", pyproject.read_text(), re.M)
        assert deps is not None, "pyproject.toml has no dependencies list"
        assert re.findall(r'"([^"]+)"', deps.group(1)) == [_library.TORCH_REQUIREMENT], deps.group(0)
    if not FROM_SOURCE_TREE:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            dist = distribution("posenc-native")
        except PackageNotFoundError:
            pytest.skip("posenc_native is not installed as a distribution (no metadata to check)")
        if Path(dist.locate_file("posenc_native/__init__.py")).resolve() != PACKAGE_DIR / "__init__.py":
            pytest.skip(f"the posenc-native metadata at {dist.locate_file('')} is not that of the imported {PACKAGE_DIR}")
        assert _library.TORCH_REQUIREMENT in (dist.requires or []), dist.requires


@pytest.mark.parametrize("version, ok", [
    ("2.10.0", False), ("2.4.1+cu121", False), ("1.13.1", False), ("not-a-version", False),
    (f"{_library.TORCH_MIN[0]}.{_library.TORCH_MIN[1]}.0", True),
    (f"{_library.TORCH_MIN[0]}.{_library.TORCH_MIN[1]}.0a0+git1234", True),
    ("2.14.1+cu130", True), ("2.13.0+cpu", True), ("3.0.0", True),
])
def test_torch_outside_range_refused(version, ok):
    if ok:
        _library.check_torch_version(version)
        return
    with pytest.raises(ImportError) as info:
        _library.check_torch_version(version)
    msg = str(info.value)
    assert version in msg and _library.TORCH_REQUIREMENT in msg
    assert "pip install --no-build-isolation ." in msg


def _import_in_subprocess(env_extra: dict) -> "subprocess.CompletedProcess[str]":
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "POSENC_CUDA_LIBRARY"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", "import posenc_native; print(posenc_native.build_info()['cuda_library'])"],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("where", ["POSENC_CUDA_LIBRARY", "beside the main library"])
def test_cuda_library_found_and_loaded_only_with_cuda_torch(tmp_path, where):
    """The CUDA kernel library is libposenc_ops_cuda.so beside the main library, or the one that
    POSENC_CUDA_LIBRARY names: a CUDA torch loads it (here a broken file: an ImportError naming it,
    torch's version and the range); a CPU-only torch never touches it."""
    import shutil

    bad = tmp_path / "libposenc_ops_cuda.so"
    bad.write_bytes(b"\x7fELF-not-a-library")
    if where == "POSENC_CUDA_LIBRARY":
        env = {"POSENC_CUDA_LIBRARY": str(bad), "POSENC_LIBRARY": pn.library_path()}
    else:
        main = tmp_path / "libposenc_ops.so"
        shutil.copy(pn.library_path(), main)
        env = {"POSENC_LIBRARY": str(main)}
    r = _import_in_subprocess(env)
    if torch.version.cuda is None:
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "None"
    else:
        assert r.returncode == 1 and "ImportError" in r.stderr, r.stderr
        assert str(bad) in r.stderr and torch.__version__ in r.stderr and _library.TORCH_REQUIREMENT in r.stderr


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
