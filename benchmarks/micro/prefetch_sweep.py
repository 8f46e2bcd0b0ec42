"""In-place RoPE with and without the CPU kernels' software prefetch, by problem size.

Each size is S sequences of one token at random positions, q [S,1,32,128] and k [S,1,8,128] (a decode
batch, or a prefill's rows), rotated in place with `apply_rope_(inv_freq=)`; the ratio is to
`q.mul_(c); k.mul_(c)` over the same bytes, both the minimum of many alternated calls in one process.
Every (prefetch, dtype) runs in its own process (POSENC_CPU_PREFETCH is read once per process), the two
prefetch settings alternated `--rounds` times. POSENC_CPU_PREFETCH=1 prefetches from 32 KiB of rows,
so the sizes show where prefetch starts to pay on this CPU: csrc/cpu/isa.cpp's default
(`build_info()["cpu_prefetch_from_bytes"]`) should sit there.

    python benchmarks/micro/prefetch_sweep.py [--dtypes float32,bfloat16] [--rounds 2] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

SIZES = (64, 256, 512, 768, 1024, 1536, 2048, 4096)

CHILD = r"""
import sys, time, torch, posenc_native as pn
torch.set_num_threads(int(sys.argv[2]))
dtype = getattr(torch, sys.argv[1])
inv = 1.0 / (10000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
for s in map(int, sys.argv[3].split(",")):
    q = torch.randn(s, 1, 32, 128).to(dtype)
    k = torch.randn(s, 1, 8, 128).to(dtype)
    pos = torch.randint(0, 4096, (s, 1))
    c = torch.tensor(1.0001, dtype=dtype)
    calls = [lambda: pn.apply_rope_(q, k, pos, inv_freq=inv), lambda: (q.mul_(c), k.mul_(c))]
    best = [float("inf")] * 2
    for f in calls:
        f()
    for _ in range(max(15, 20000 // s)):
        for i, f in enumerate(calls):
            t = time.thread_time_ns(); f(); best[i] = min(best[i], time.thread_time_ns() - t)
    print(f"{best[0] / best[1]:.2f}", end=" ", flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--rounds", type=int, default=2, help="alternated processes per prefetch setting")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sizes = ",".join(map(str, SIZES))
    print("rows MiB: " + " ".join(f"{s * 40 * 128 * 4 / 2**20:g}" for s in SIZES) + " (float32; half for 16-bit)")
    print("ratio to q.mul_(c); k.mul_(c), per size: " + " ".join(map(str, SIZES)) + " sequences")
    for dtype in args.dtypes.split(","):
        for r in range(args.rounds):
            for prefetch in ("0", "1"):
                env = dict(os.environ, POSENC_CPU_PREFETCH=prefetch)
                proc = subprocess.run([sys.executable, "-c", CHILD, dtype, str(args.threads), sizes], env=env,
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"prefetch={prefetch} {dtype}: the child failed:\n{proc.stderr[-3000:]}")
                print(f"{dtype:9s} prefetch={prefetch} round {r + 1}: {proc.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
