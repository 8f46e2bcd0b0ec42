"""In-place RoPE of the bench's prefill shapes, half-split and interleaved, against the in-place floor,
every call timed in one process in shuffled alternation: the ratio of the two pairings (interleaved /
half-split) moves far less with the host's memory speed than either's ratio to the floor, so a change
to one pairing's kernel shows against the other as its control. Compare builds by swapping the
installed library between runs, several times each: where a kernel's code lands in the library
moved this ratio by 2-4% with the same instructions (benchmarks/RESULTS.md, "Forty-sixth session").

q [1,S,32,128] and k [1,S,8,128] in place with `apply_rope_(inv_freq=)`; the floor is
`q.mul_(c); k.mul_(c)`; median (and minimum) of `--rounds` calls of each.

    python benchmarks/micro/pairing_ratio.py [--dtype float32] [--seq 4096] [--rounds 300]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import posenc_native as pn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    dim = 128
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    q = torch.randn(1, args.seq, 32, dim).to(dtype)
    k = torch.randn(1, args.seq, 8, dim).to(dtype)
    c = torch.tensor(1.0001, dtype=dtype)
    calls = {
        "floor": lambda: (q.mul_(c), k.mul_(c)),
        "half-split": lambda: pn.apply_rope_(q, k, inv_freq=inv_freq, interleaved=False),
        "interleaved": lambda: pn.apply_rope_(q, k, inv_freq=inv_freq, interleaved=True),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = random.Random(0)
    for call in calls.values():
        for _ in range(3):
            call()
    for _ in range(args.rounds):
        names = list(calls)
        order.shuffle(names)
        for name in names:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    print(f"CPU path {pn.build_info()['cpu_isa']}, {args.dtype}, q [1,{args.seq},32,{dim}], "
          f"k [1,{args.seq},8,{dim}], in place, {torch.get_num_threads()} threads, {args.rounds} rounds")
    for stat in (statistics.median, min):
        ms = {name: 1e3 * stat(t) for name, t in times.items()}
        print(f"  {stat.__name__:6} floor {ms['floor']:.3f} ms, half-split {ms['half-split'] / ms['floor']:.3f}x, "
              f"interleaved {ms['interleaved'] / ms['floor']:.3f}x the floor; "
              f"interleaved / half-split {ms['interleaved'] / ms['half-split']:.3f}")


if __name__ == "__main__":
    main()
