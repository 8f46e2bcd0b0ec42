#!/usr/bin/env python
"""Per-call times of the cases the CPU angle stream's cost shows in (one thread, thread CPU time,
the minimum of the samples): RoPE prefill with many heads and with one (where the angles dominate),
interleaved, decode at random positions (B=1, 64) and alternating two configs, sinusoidal tables,
add_sinusoidal, and MRoPE image patches.

    python benchmarks/micro/angle_stream_cases.py
    POSENC_CPU_ISA=avx2 python benchmarks/micro/angle_stream_cases.py   # the AVX2 path's rows

For a before/after comparison run it with each build's package first on PYTHONPATH, in turns
(two op libraries cannot load into one process), and compare the minimum over the turns.
"""
from __future__ import annotations

import time

import torch

import posenc_native as pn


def per_call_us(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best * 1e6


def per_call_wall_us(fn, repeat: int) -> float:
    """Short calls: thread_time's resolution is too coarse; the 10th percentile of wall time."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 10] * 1e6


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    cfg, cfg_i = pn.RopeConfig(head_dim=128), pn.RopeConfig(head_dim=128, interleaved=True)
    rows = {}
    for dt in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 4096, 32, 128, generator=g).to(dt)
        k = torch.randn(1, 4096, 8, 128, generator=g).to(dt)
        pos = torch.arange(4096)[None]
        rows[f"apply_rope_ [1,4096,32+8,128] {dt}"] = per_call_us(lambda: pn.apply_rope_(q, k, pos, config=cfg), 20)
        one = torch.randn(1, 16384, 1, 128, generator=g).to(dt)
        pos1 = torch.arange(16384)[None]
        rows[f"apply_rope_ [1,16384,1,128] {dt}"] = per_call_us(lambda: pn.apply_rope_(one, None, pos1, config=cfg), 20)
        rows[f"apply_rope_ interleaved [1,4096,32,128] {dt}"] = per_call_us(
            lambda: pn.apply_rope_(q, None, pos, config=cfg_i), 20)
    for batch in (1, 64):
        qd = torch.randn(batch, 1, 32, 128, generator=g)
        kd = torch.randn(batch, 1, 8, 128, generator=g)
        posd = torch.randint(0, 100_000, (batch, 1), generator=g)
        rows[f"decode B={batch}, random positions"] = per_call_wall_us(
            lambda: pn.apply_rope_(qd, kd, posd, config=cfg), 2000)
    other = pn.RopeConfig(head_dim=128, base=1e6)
    qd, kd = torch.randn(1, 1, 32, 128, generator=g), torch.randn(1, 1, 8, 128, generator=g)
    posd = torch.randint(0, 100_000, (1, 1), generator=g)
    rows["decode B=1, two configs in turn (per call)"] = per_call_wall_us(
        lambda: (pn.apply_rope_(qd, kd, posd, config=cfg), pn.apply_rope_(qd, kd, posd, config=other)), 2000) / 2
    rows["sinusoidal_table(8192, 512)"] = per_call_us(lambda: pn.sinusoidal_table(torch.arange(8192), 512), 20)
    x = torch.randn(8, 2048, 512, generator=g)
    rows["add_sinusoidal [8,2048,512]"] = per_call_us(lambda: pn.add_sinusoidal(x), 20)
    mcfg = pn.RopeConfig(head_dim=128, mrope_section=[16, 24, 24])
    qm = torch.randn(1, 4096, 16, 128, generator=g)
    h, w = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    posm = torch.stack([torch.zeros(4096, dtype=torch.long), h.flatten(), w.flatten()])[:, None]
    rows["MRoPE image patches [1,4096,16,128]"] = per_call_us(lambda: pn.apply_rope_(qm, None, posm, config=mcfg), 20)
    for name, us in rows.items():
        print(f"{name:48s} {us:10.1f} us")


if __name__ == "__main__":
    main()
