"""Context (sequence) parallelism with posenc-native: each process holds a slice of the sequence and
rotates it with its *global* positions; gathering the slices gives exactly the single-process result.

    python examples/context_parallel.py                   # 2 processes, gloo on CPU (nccl with 2 GPUs)
    python examples/context_parallel.py --world-size 4 --backend gloo

Two shardings are shown:
  * contiguous: rank r holds tokens [r*S/W, (r+1)*S/W): pass ``offset=r*S/W`` (or a positions tensor);
  * zigzag (load-balanced causal attention, as in ring attention): the sequence is cut into 2W chunks
    and rank r holds chunks r and 2W-1-r: its positions are not contiguous, so pass them as a tensor.
The sinusoidal embedding of the input tokens works the same way (``add_sinusoidal(x, offset=...)``).
Exits 0 when every rank's gathered result equals the single-process one.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import posenc_native

BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM, D_MODEL = 2, 24, 4, 2, 16, 32
ATTENTION_FACTOR = 1.2  # e.g. YaRN's temperature: applied on every rank alike


def default_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def full_inputs(device: torch.device):
    """The whole batch, identical on every rank (same seed): the single-process truth is computable."""
    g = torch.Generator().manual_seed(1234)
    q = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g)
    k = torch.randn(BATCH, SEQ, KV_HEADS, HEAD_DIM, generator=g)
    x = torch.randn(BATCH, SEQ, D_MODEL, generator=g)
    return q.to(device), k.to(device), x.to(device)


def zigzag_index(world: int, rank: int, seq: int) -> torch.Tensor:
    chunk = seq // (2 * world)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk)
    return torch.cat([first, second])


def gather_seq(t: torch.Tensor, world: int) -> torch.Tensor:
    """All-gather the local [B, S_local, ...] slices of every rank, concatenated in rank order."""
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=1)


def worker(rank: int, world: int, port: int, backend: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        inv_freq = default_inv_freq(HEAD_DIM).to(device)
        q, k, x = full_inputs(device)
        seq_local = SEQ // world
        start = rank * seq_local
        errors = {}

        # Single-process truth (every rank can compute it here because the inputs are small).
        ref_q, ref_k = posenc_native.apply_rope(q, k, inv_freq=inv_freq, attention_factor=ATTENTION_FACTOR)
        ref_x = posenc_native.add_sinusoidal(x, x_scale=2.0)

        # 1) contiguous slice, global positions via offset
        lq, lk = posenc_native.apply_rope(q[:, start:start + seq_local], k[:, start:start + seq_local],
                                          inv_freq=inv_freq, attention_factor=ATTENTION_FACTOR, offset=start)
        errors["contiguous/offset q"] = (gather_seq(lq, world) - ref_q).abs().max().item()
        errors["contiguous/offset k"] = (gather_seq(lk, world) - ref_k).abs().max().item()

        # 2) contiguous slice, global positions as a tensor
        positions = torch.arange(start, start + seq_local, device=device)
        lq, lk = posenc_native.apply_rope(q[:, start:start + seq_local], k[:, start:start + seq_local], positions,
                                          inv_freq=inv_freq, attention_factor=ATTENTION_FACTOR)
        errors["contiguous/positions q"] = (gather_seq(lq, world) - ref_q).abs().max().item()
        errors["contiguous/positions k"] = (gather_seq(lk, world) - ref_k).abs().max().item()

        # 3) zigzag (load-balanced) shards: positions tensor; gather, then undo the permutation
        idx = zigzag_index(world, rank, SEQ).to(device)
        lq, lk = posenc_native.apply_rope(q[:, idx], k[:, idx], idx, inv_freq=inv_freq,
                                          attention_factor=ATTENTION_FACTOR)
        order = torch.cat([zigzag_index(world, r, SEQ) for r in range(world)]).to(device)
        gq, gk = torch.empty_like(ref_q), torch.empty_like(ref_k)
        gq[:, order] = gather_seq(lq, world)
        gk[:, order] = gather_seq(lk, world)
        errors["zigzag/positions q"] = (gq - ref_q).abs().max().item()
        errors["zigzag/positions k"] = (gk - ref_k).abs().max().item()

        # 4) sinusoidal encoding of the input embeddings of a contiguous slice
        lx = posenc_native.add_sinusoidal(x[:, start:start + seq_local], offset=start, x_scale=2.0)
        errors["add_sinusoidal/offset"] = (gather_seq(lx, world) - ref_x).abs().max().item()

        # Controls: the check is not vacuous. The rotation changed q, and local positions (0..S/W-1 on
        # every rank, the classic context-parallel bug) give a different result.
        assert (ref_q - q).abs().max().item() > 0.1
        wrong_q, _ = posenc_native.apply_rope(q[:, start:start + seq_local], k[:, start:start + seq_local],
                                              inv_freq=inv_freq, attention_factor=ATTENTION_FACTOR)
        control = (gather_seq(wrong_q, world) - ref_q).abs().max().item()
        assert control > 0.1, f"local positions should not match the single-process result ({control})"
        worst = max(errors.values())
        if rank == 0:
            for name, err in errors.items():
                print(f"  {name:26s} max |gathered - single process| = {err:.1e}")
            print(f"  {'(control) local positions':26s} max |gathered - single process| = {control:.1e}")
        if worst > 1e-6:
            raise AssertionError(f"rank {rank}: gathered result differs from the single-process one: {errors}")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: nccl when there are enough GPUs (and CUDA kernels), else gloo on CPU")
    args = parser.parse_args(argv)
    world = args.world_size
    if SEQ % (2 * world):
        parser.error(f"--world-size must divide {SEQ // 2} (the sequence is cut into 2*world chunks)")
    backend = args.backend
    if backend == "auto":
        gpus_ok = (torch.cuda.is_available() and torch.cuda.device_count() >= world
                   and posenc_native.build_info()["cuda"] and dist.is_nccl_available())
        backend = "nccl" if gpus_ok else "gloo"
    print(f"context parallel RoPE: {world} processes, backend {backend}, sequence {SEQ} ({SEQ // world} per rank)")
    mp.spawn(worker, args=(world, free_port(), backend), nprocs=world, join=True)
    print("all ranks: gathered results equal the single-process result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
