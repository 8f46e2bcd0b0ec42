#!/usr/bin/env python
"""Worst error of the CPU angle stream's float32 rows against the float64 reference.

    python benchmarks/stream_accuracy.py

float32 RoPE of unit-norm pairs (so the error is that of cos/sin themselves) on positions with runs,
repeats and jumps, half of the cases near 2^24, both pairings; and a float32 sinusoidal table on
such positions. Prints the largest absolute difference of each (docs/architecture.md cites them).
"""
from __future__ import annotations

import torch

import posenc_native as pn
from posenc_native import reference


def runs_of_positions(g: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """Mostly consecutive positions, 10% repeats, 3% jumps, a random start per row."""
    u = torch.rand(batch, seq, generator=g)
    steps = torch.where(u < 0.03, torch.randint(2, 5000, (batch, seq), generator=g), (u >= 0.13).long())
    return torch.randint(0, 1 << 20, (batch, 1), generator=g) + steps.cumsum(1)


def main() -> None:
    g = torch.Generator().manual_seed(5)
    worst_rope = 0.0
    for trial in range(6):
        batch, seq, dim = 4, 2048, 128
        pos = runs_of_positions(g, batch, seq)
        if trial % 2:
            pos += (1 << 24) - 300_000 - pos[:, :1]
        angle = torch.rand(batch, seq, 1, dim // 2, generator=g, dtype=torch.float64) * 2 * torch.pi
        for interleaved in (False, True):
            pairs = (torch.stack([angle.cos(), angle.sin()], -1).flatten(-2) if interleaved
                     else torch.cat([angle.cos(), angle.sin()], -1))
            cfg = pn.RopeConfig(head_dim=dim, interleaved=interleaved)
            got = pn.apply_rope(pairs.float(), None, pos, config=cfg)[0].double()
            want = reference.apply_rope(pairs, None, pos, cfg)[0]
            worst_rope = max(worst_rope, (got - want).abs().max().item())
    pos = runs_of_positions(g, 1, 20000)[0]
    table = (pn.sinusoidal_table(pos, 512).double() - reference.sinusoidal_table(pos, 512)).abs().max().item()
    print(f"float32 RoPE, unit-norm pairs: max abs error {worst_rope:.3g}")
    print(f"float32 sinusoidal table:      max abs error {table:.3g}")


if __name__ == "__main__":
    main()
