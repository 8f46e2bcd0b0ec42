"""The CUDA kernels' work items (csrc/core/rope_chunks.h: (token, chunk) items, 16-byte vector loads
and stores, pass-through chunks; csrc/core/sinusoidal.h: (row, pair) items) run on the host by
tests/cpp/cuda_work_on_host_test.cpp, so their indexing is checked on machines without a GPU."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cuda_work_items_on_host(tmp_path):
    torch_dir = Path(torch.__file__).resolve().parent
    exe = tmp_path / "cuda_work_on_host_test"
    build = subprocess.run(
        ["g++", "-std=c++20", "-O1", "-ffp-contract=off", f"-I{ROOT / 'csrc'}", f"-I{torch_dir / 'include'}",
         str(ROOT / "tests" / "cpp" / "cuda_work_on_host_test.cpp"), "-o", str(exe), f"-L{torch_dir / 'lib'}", "-lc10",
         f"-Wl,-rpath,{torch_dir / 'lib'}"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 failed" in run.stdout
