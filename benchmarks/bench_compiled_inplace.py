"""Compiled apply_rope_ on views of a fused qkv buffer (q = qkv[:, :, 0], k = qkv[:, :, 1], rotated in
place): eager, torch.compile with static shapes and with dynamic=True, against the in-place floor (two
mul_ over the same views); median time per call, under inference_mode.

Compiled, apply_rope_ rotates in place except where torch would get it wrong (a view whose storage
offset is a symbol, as with dynamic=True: rotated out of place and copied back; README, "Aliasing").

    python benchmarks/bench_compiled_inplace.py [--quick]
"""
from __future__ import annotations

import argparse
import platform
import time
import warnings

import torch

import posenc_native as pn


def median_ms(fn, args, repeats: int) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    batch, seq, heads, head_dim = (1, 64, 4, 32) if opts.quick else (4, 2048, 32, 128)
    repeats = 3 if opts.quick else 15
    config = pn.RopeConfig(head_dim=head_dim)
    qkv = torch.randn(batch, seq, 3, heads, head_dim, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq)[None].expand(batch, seq)

    def rotate(qkv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pn.apply_rope_(qkv[:, :, 0], qkv[:, :, 1], positions, config=config)
        return qkv

    def floor(qkv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        qkv[:, :, 0].mul_(1.0001)
        qkv[:, :, 1].mul_(1.0001)
        return qkv

    print(f"command:  python benchmarks/bench_compiled_inplace.py{' --quick' if opts.quick else ''}")
    print(f"machine:  {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; qkv {list(qkv.shape)} float32")
    compiled = {"compiled apply_rope_": torch.compile(rotate, fullgraph=True),
                "compiled dynamic apply_rope_": torch.compile(rotate, fullgraph=True, dynamic=True)}
    with torch.inference_mode():
        base = None
        for name, fn in (("in-place floor (two mul_)", floor), ("eager apply_rope_", rotate), *compiled.items()):
            ms = median_ms(fn, (qkv, positions), repeats)
            base = base or ms  # (the floor, measured first)
            print(f"{name:30s} {ms:8.3f} ms  {ms / base:5.2f}x floor")
        # what was timed is right: each compiled call rotates q and k in place as eager does, v untouched
        want = rotate(qkv.clone(), positions)
        worst = max((fn(qkv.clone(), positions) - want).abs().max().item() for fn in compiled.values())
    print(f"compiled results vs eager: max abs difference {worst:.3g}")


if __name__ == "__main__":
    main()
