"""In-place RoPE of the bench's prefill shapes, half-split and interleaved, against the in-place floor,
every call timed in one process in shuffled alternation (bench_cpu.py's `time_together`), printing
each pairing's ratio to the floor and interleaved / half-split. At 4096 tokens (rows from DRAM) that
last ratio moved far less with the host's memory speed than either ratio to the floor, so a change
to one pairing's kernel shows against the other as its control; at 1024-2048 tokens, where the rows
are partly in cache, it moved by as much as 0.97-1.15 with the same library minutes apart, so
compare there only runs taken back to back. Compare builds by swapping the installed library
between runs, several times each: where a kernel's code lands in the library moved the 4096-token
ratio by 2-4% with the same instructions (benchmarks/RESULTS.md, "Forty-sixth session").

q [1,S,32,128] and k [1,S,8,128] in place with `apply_rope_(inv_freq=)`; the floor is
`q.mul_(c); k.mul_(c)`; median (and minimum) of `--rounds` calls of each.

    python benchmarks/micro/pairing_ratio.py [--dtype float32] [--seq 4096] [--rounds 300]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_cpu import Settings, default_inv_freq, time_together  # noqa: E402

import posenc_native as pn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    dim = 128
    inv_freq = default_inv_freq(dim)
    q = torch.randn(1, args.seq, 32, dim).to(dtype)
    k = torch.randn(1, args.seq, 8, dim).to(dtype)
    c = torch.tensor(1.0001, dtype=dtype)
    calls = {
        "floor": lambda: (q.mul_(c), k.mul_(c)),
        "half-split": lambda: pn.apply_rope_(q, k, inv_freq=inv_freq, interleaved=False),
        "interleaved": lambda: pn.apply_rope_(q, k, inv_freq=inv_freq, interleaved=True),
    }
    settings = Settings(quick=False, warmup=3, repeat=args.rounds, min_time=0.0, compile=False)
    times = dict(zip(calls, time_together(list(calls.values()), settings)))
    print(f"CPU path {pn.build_info()['cpu_isa']}, {args.dtype}, q [1,{args.seq},32,{dim}], "
          f"k [1,{args.seq},8,{dim}], in place, {torch.get_num_threads()} threads, {args.rounds} rounds")
    for stat in (statistics.median, min):
        ms = {name: 1e3 * stat(t) for name, t in times.items()}
        print(f"  {stat.__name__:6} floor {ms['floor']:.3f} ms, half-split {ms['half-split'] / ms['floor']:.3f}x, "
              f"interleaved {ms['interleaved'] / ms['floor']:.3f}x the floor; "
              f"interleaved / half-split {ms['interleaved'] / ms['half-split']:.3f}")


if __name__ == "__main__":
    main()
