"""The CPU kernels have an AVX512-BF16 path for bf16 RoPE rows (csrc/cpu/rotate_bf16_avx512.cpp) and
a portable one (POSENC_CPU_PORTABLE=1 forces it). The float64-reference tests exercise whichever
this CPU takes; this test runs the same bf16 problems both ways and requires identical bits."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = r"""
import sys, torch, posenc_native as pn
g = torch.Generator().manual_seed(0)
out = []
for head_dim, rot in ((128, 128), (72, 72), (96, 64), (40, 8)):   # full, a 16-pair tail, partial, tiny
    q = torch.randn(2, 9, 4, head_dim, generator=g).bfloat16()
    k = torch.randn(2, 9, 2, head_dim, generator=g).bfloat16()
    inv = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    pos = torch.randint(0, 1 << 20, (2, 9), generator=g)
    for inverse in (False, True):
        out += list(torch.ops.posenc.rope(q, k, pos, None, inv, 1.1, False, "bshd", 3, inverse))
    q2, k2 = q.clone(), k.clone()
    torch.ops.posenc.rope_(q2, k2, pos, None, inv, 1.1, False, "bshd", 0, False)
    out += [q2, k2]
    cos = torch.randn(2, 9, rot, generator=g).bfloat16()
    sin = torch.randn(2, 9, rot, generator=g).bfloat16()
    out += list(torch.ops.posenc.rope_cos_sin(q, k, cos, sin, None, "bshd", False))
torch.save(out, sys.argv[1])
"""


def _run(tmp_path: Path, name: str, portable: bool) -> list:
    env = dict(os.environ)
    env.pop("POSENC_CPU_PORTABLE", None)
    if portable:
        env["POSENC_CPU_PORTABLE"] = "1"
    path = tmp_path / f"{name}.pt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path)


def test_avx512_bf16_rows_equal_portable_rows(tmp_path):
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "avx512_bf16" not in flags:
        pytest.skip("this CPU has no AVX512-BF16: only the portable path exists here")
    fast, portable = _run(tmp_path, "fast", False), _run(tmp_path, "portable", True)
    assert len(fast) == len(portable) > 0
    for a, b in zip(fast, portable):
        assert a.dtype == torch.bfloat16 and a.abs().sum() > 0
        assert torch.equal(a, b)
