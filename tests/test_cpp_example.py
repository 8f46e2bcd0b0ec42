"""Builds examples/cpp (a LibTorch program linking the installed op library through
find_package(Torch) + find_package(PosencNative)) and checks that it reproduces Python's results:
a TorchScript module calling every op, the C++ API of posenc/posenc.h, and an AOTInductor package.

Needs the installed package (its CMake files ship in the wheel), cmake, ninja and a C++20 compiler;
for a CUDA build of torch also a CUDA toolkit (torch's CMake package insists on one; see
examples/cpp/README.md).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posenc_native

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cpp"
PACKAGE = Path(posenc_native.__file__).resolve().parent
PACKAGE_CMAKE = PACKAGE / "share" / "cmake" / "PosencNative"


def _tool(name: str) -> str | None:
    """A build tool next to this Python (pip's cmake/ninja in a venv) or on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def find_cuda_toolkit() -> Path | None:
    """The real CUDA toolkit folder (bin/nvcc + include/cuda.h). nvcc on PATH may be a wrapper
    script (as on some build machines), so a script's exec target is followed."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        candidates.append(str(real.parent.parent))
        try:
            text = real.read_text(errors="ignore")[:4096] if real.stat().st_size < 65536 else ""
        except OSError:
            text = ""
        candidates += [m.group(1) for m in re.finditer(r"(/\S+)/bin/nvcc\b", text)]
    candidates += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    for c in candidates:
        if c and (Path(c) / "bin" / "nvcc").exists() and (Path(c) / "include" / "cuda.h").exists():
            return Path(c)
    return None


def cmake_configure_args() -> list[str]:
    prefix_path = f"{torch.utils.cmake_prefix_path};{PACKAGE}"
    # --as-needed, as many distributions' compilers link by default: the op library must stay linked
    # although nothing references its symbols (test_binary_links_the_op_library).
    args = [f"-DCMAKE_PREFIX_PATH={prefix_path}", "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed"]
    if torch.version.cuda:
        # torch's Caffe2 CMake package re-detects CUDA for a CUDA build of torch (see README.md).
        toolkit = find_cuda_toolkit()
        args += [f"-DCUDA_TOOLKIT_ROOT_DIR={toolkit}", f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}",
                 "-DTORCH_CUDA_ARCH_LIST=8.0;9.0"]
        # torch's ${TORCH_LIBRARIES} names libnvrtc; a toolkit without it can use pip's copy.
        nvrtc = sorted(glob.glob(str(Path(torch.__file__).parent.parent / "nvidia" / "*" / "lib" / "libnvrtc.so*")))
        if nvrtc and not glob.glob(str(toolkit / "lib*" / "libnvrtc.so*")):
            args.append(f"-DCUDA_nvrtc_LIBRARY={nvrtc[0]}")
    return args


def _skip_reason() -> str | None:
    if os.environ.get("POSENC_LIBRARY"):
        return "POSENC_LIBRARY is set: the C++ example builds against the installed wheel, not a source-tree build"
    if not (PACKAGE_CMAKE / "PosencNativeConfig.cmake").exists():
        return (f"posenc_native at {PACKAGE} is not an installed wheel (no share/cmake/PosencNative); "
                "install the package (`make build`) to build the C++ example")
    for tool in ("cmake", "ninja"):
        if _tool(tool) is None:
            return f"{tool} not found"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler"
    if torch.version.cuda and find_cuda_toolkit() is None:
        return ("torch is a CUDA build and its CMake package needs a CUDA toolkit (nvcc, cuda.h), none found; "
                "set CUDA_HOME")
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def example_binary(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("cpp-example-build")
    _run([_tool("cmake"), "-S", EXAMPLE, "-B", build, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
          *cmake_configure_args()])
    _run([_tool("cmake"), "--build", build])
    binary = build / "posenc_example"
    assert binary.exists()
    return binary


def _load_outputs(path: Path) -> dict:
    # torch::pickle_save writes typed containers with a type tag that torch.load's weights_only
    # unpickler accepts once allowed.
    import torch.jit._pickle

    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return torch.load(path)


def _compare(work: Path) -> dict:
    expected = torch.load(work / "expected.pt")
    outputs = _load_outputs(work / "outputs.pt")
    assert set(outputs) == set(expected)
    for name, want in expected.items():
        got = outputs[name]
        assert want.abs().max() > 0.1, name  # real values, not zeros
        assert got.shape == want.shape and got.dtype == want.dtype, name
        err = (got - want).abs().max().item()
        assert err <= 1e-6, f"{name}: C++ differs from Python by {err:.2e}"
    return outputs


def test_binary_links_the_op_library(example_binary):
    """The CMake package keeps libposenc_ops.so on the link under --as-needed (DT_NEEDED), although
    the header-only API references none of its symbols."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not found")
    dynamic = _run([readelf, "-d", example_binary]).stdout
    assert "[libposenc_ops.so]" in dynamic


def test_torchscript_and_cpp_api_match_python(example_binary, tmp_path):
    _run([sys.executable, EXAMPLE / "make_inputs.py", tmp_path])
    proc = _run([example_binary, tmp_path], cwd=tmp_path)
    assert '"version"' in proc.stdout  # posenc::build_info_json() works from C++
    outputs = _compare(tmp_path)
    assert "script.rope_inplace_q" in outputs and "api.rope_q" in outputs
    assert "script.t5_bias" in outputs and "api.t5_bias" in outputs and "api.alibi_bias" in outputs
    assert "script.module_rope_q" in outputs and "script.module_encoded" in outputs  # the library's modules


def test_aoti_package_runs_in_cpp(example_binary, tmp_path):
    _run([sys.executable, EXAMPLE / "make_inputs.py", tmp_path, "--aoti"])
    _run([example_binary, tmp_path], cwd=tmp_path)
    outputs = _compare(tmp_path)
    assert "aoti.out" in outputs
