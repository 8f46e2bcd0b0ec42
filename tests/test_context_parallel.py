"""examples/context_parallel.py: 2 processes (gloo on CPU; nccl when 2 GPUs are present), each rotating
its slice of the sequence with its global positions (offset, positions tensor, zigzag shards); the
all-gathered result must equal the single-process one. Run as a script in a subprocess, as users
run it (torch.multiprocessing.spawn, a free port on 127.0.0.1)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "context_parallel.py"

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def test_context_parallel_two_processes(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--world-size", "2"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = proc.stdout
    assert "2 processes" in out
    assert "all ranks: gathered results equal the single-process result" in out
    for case in ("contiguous/offset", "contiguous/positions", "zigzag/positions", "add_sinusoidal/offset"):
        assert case in out
