"""Where a GPU op call's time goes (run by benchmarks/gpu_check.sh on the H200 machine).

For each op call: the wall time per call (host clock around many calls, synchronized once), the
device time of each CUDA kernel and memory copy it issued (torch.profiler), and how many of each.
A call whose wall time is far above its kernels' time is bound by host work or by a host-device
synchronization (the host reads index values to validate them before any write).
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import posenc_native as pn


def wall_us(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def device_events(fn, reps: int = 10) -> dict[str, tuple[int, float]]:
    """name -> (count per call, device microseconds per call) of the kernels and copies fn issues."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            acc[e.name[:60]][0] += 1
            acc[e.name[:60]][1] += e.device_time
    return {k: (round(v[0] / reps), v[1] / reps) for k, v in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    L, d = 32768, 1024
    x = torch.randn(8, 4096, 1024, device=dev, dtype=torch.bfloat16)
    pos_dev = torch.arange(L, device=dev)
    q = torch.randn(1, 16384, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 16384, 8, 128, device=dev, dtype=torch.bfloat16)
    inv = (1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)).to(dev)
    qpos = torch.arange(16384, device=dev)[None]
    cases = {
        "sinusoidal_table(L int)": lambda: pn.sinusoidal_table(L, d, device=dev),
        "sinusoidal_table(positions on device)": lambda: torch.ops.posenc.sinusoidal_table(
            pos_dev, d, 1e4, True, 0.0, 1.0, False, torch.float32),
        "add_sinusoidal(x) (positions made by the wrapper)": lambda: pn.add_sinusoidal(x),
        "apply_rope_ (no positions)": lambda: pn.apply_rope_(q, k, inv_freq=inv),
        "apply_rope_ (positions on device)": lambda: pn.apply_rope_(q, k, qpos, inv_freq=inv),
    }
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| call | wall us/call | device events per call (count x name: us) |", "|---|---|---|"]
    for name, fn in cases.items():
        w = wall_us(fn)
        ev = device_events(fn)
        desc = "; ".join(f"{c}x {n}: {t:.1f}" for n, (c, t) in sorted(ev.items(), key=lambda kv: -kv[1][1]))
        lines.append(f"| {name} | {w:.1f} | {desc} |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
