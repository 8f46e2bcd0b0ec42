"""Per-token cost of the CPU RoPE loop's own work (the angle stream and the factor rows), with the
rows themselves made negligible: one head of 128, 8192 consecutive positions, in place, one thread,
thread CPU time, minimum of 25 calls. A prefill row of [1,4096,32,128] + [..,8,..] spends ~450 ns a
token on its rows (fp16), so each ns here is ~0.2% of it (benchmarks/RESULTS.md).

    PYTHONPATH=python POSENC_LIBRARY=build/<dir>/libposenc_ops.so python benchmarks/micro/rope_token_cost.py
"""
from __future__ import annotations

import time

import torch

import posenc_native as pn


def per_token_ns(fn, tokens: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(25):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / tokens * 1e9


def main() -> None:
    torch.set_num_threads(1)
    tokens = 8192
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    positions = torch.arange(tokens)[None]
    cells = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for interleaved in (False, True):
            q = torch.randn(1, tokens, 1, 128).to(dtype)
            k = torch.randn(1, tokens, 0, 128).to(dtype)
            ns = per_token_ns(lambda: pn.apply_rope_(q, k, positions, inv_freq=inv_freq, interleaved=interleaved),
                              tokens)
            cells.append(f"{str(dtype).removeprefix('torch.')} {'interleaved' if interleaved else 'half-split'} "
                         f"{ns:.1f}")
    print(f"CPU path {pn.build_info()['cpu_isa']}, ns per token: " + ", ".join(cells))


if __name__ == "__main__":
    main()
