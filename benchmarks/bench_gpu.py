"""GPU benchmark (run by benchmarks/gpu_check.sh on the H200 machine).

RoPE at 128k tokens x (32 q + 8 kv heads) x 128 dims, bf16, half-split, default and YaRN:
ours (out of place, in place) vs transformers' eager path (cos/sin as LlamaRotaryEmbedding computes
them, then apply_rotary_pos_emb), vs torch.compile of that path, vs Liger-Kernel's RoPE when it is
importable, and achieved bandwidth against a device-to-device copy of the same bytes.
Sinusoidal: table and add_sinusoidal vs the PyTorch reference and a device copy.
"""
from __future__ import annotations

import argparse
import math

import torch

import posenc_native as pn


def bench_ms(fn, warmup: int = 5, reps: int = 30) -> float:
    """Median milliseconds of fn() measured with CUDA events (wall clock on a CPU dry run)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():  # --device cpu: a dry run of this script's code paths
        import time

        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[1]
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def yarn(head_dim: int, base: float = 500000.0, factor: float = 4.0, original: int = 8192):
    cfg = pn.RopeConfig.from_hf({"head_dim": head_dim, "hidden_size": head_dim * 32, "num_attention_heads": 32,
                                 "rope_theta": base, "max_position_embeddings": int(original * factor),
                                 "rope_scaling": {"rope_type": "yarn", "factor": factor,
                                                  "original_max_position_embeddings": original}})
    return cfg.inv_freq(), cfg.attention_factor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only as a dry run of the script (small --tokens)")
    ap.add_argument("--table-len", type=int, default=32768)
    ap.add_argument("--x-seq", type=int, default=4096)
    args = ap.parse_args()
    dev = torch.device(args.device)
    rows = []

    def row(name, ms, nbytes, copy_ms):
        gbs = nbytes / ms / 1e6
        rows.append((name, ms, gbs, copy_ms / ms))
        print(f"{name:44s} {ms:9.3f} ms {gbs:9.0f} GB/s {100 * copy_ms / ms:6.1f}% of copy", flush=True)

    T, H, HK, D = args.tokens, 32, 8, 128
    dtype = torch.bfloat16
    q = torch.randn(1, T, H, D, device=dev, dtype=dtype)
    k = torch.randn(1, T, HK, D, device=dev, dtype=dtype)
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()  # read + write
    dst_q, dst_k = torch.empty_like(q), torch.empty_like(k)
    copy_ms = bench_ms(lambda: (dst_q.copy_(q), dst_k.copy_(k)))
    row("device copy of q and k", copy_ms, nbytes, copy_ms)
    pos = torch.arange(T, device=dev)[None]

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    for label, (inv, attn) in (("default", (1.0 / 500000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D), 1.0)),
                               ("yarn", yarn(D))):
        inv_dev = inv.to(dev)
        row(f"ours out-of-place ({label})", bench_ms(lambda: pn.apply_rope(q, k, inv_freq=inv_dev, attention_factor=attn)),
            nbytes, copy_ms)
        qq, kk = q.clone(), k.clone()
        row(f"ours in-place ({label})", bench_ms(lambda: pn.apply_rope_(qq, kk, inv_freq=inv_dev, attention_factor=attn)),
            nbytes, copy_ms)

        inv32 = inv_dev.float()

        def hf_path():
            freqs = (inv32[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = (emb.cos() * attn).to(dtype), (emb.sin() * attn).to(dtype)
            return apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

        row(f"transformers eager ({label})", bench_ms(hf_path), nbytes, copy_ms)
        compiled = torch.compile(hf_path)
        row(f"transformers torch.compile ({label})", bench_ms(compiled), nbytes, copy_ms)
        try:
            from liger_kernel.ops.rope import LigerRopeFunction

            freqs = (inv32[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = (emb.cos() * attn).to(dtype), (emb.sin() * attn).to(dtype)
            qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
            row(f"liger rope, cos/sin given ({label})", bench_ms(lambda: LigerRopeFunction.apply(qt, kt, cos, sin)),
                nbytes, copy_ms)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"liger-kernel not measured: {type(e).__name__}: {e}")

    # Sinusoidal
    L, d = args.table_len, 1024
    table_bytes = L * d * 4
    out = torch.empty(L, d, device=dev)
    fill_ms = bench_ms(lambda: out.fill_(1.0))
    row("fill of a [L, 1024] fp32 table", fill_ms, table_bytes, fill_ms)
    row("ours sinusoidal_table", bench_ms(lambda: pn.sinusoidal_table(L, d, device=dev)), table_bytes, fill_ms)

    def seed_table():
        pe = torch.zeros(L, d, device=dev)
        position = torch.arange(L, device=dev).unsqueeze(1).float()
        div = torch.exp(torch.arange(0, d, 2, device=dev).float() * (-math.log(10000.0) / d))
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)
        return pe

    row("seed article's table (eager)", bench_ms(seed_table), table_bytes, fill_ms)
    x = torch.randn(8, args.x_seq, 1024, device=dev, dtype=dtype)
    xb = 2 * x.numel() * x.element_size()
    xc = torch.empty_like(x)
    xcopy = bench_ms(lambda: xc.copy_(x))
    row("device copy of x [8, S, 1024] bf16", xcopy, xb, xcopy)
    row("ours add_sinusoidal", bench_ms(lambda: pn.add_sinusoidal(x)), xb, xcopy)
    pe = seed_table()[None, :args.x_seq].to(dtype)
    row("eager x + pe[:, :S]", bench_ms(lambda: x + pe), xb, xcopy)

    if args.out:
        with open(args.out, "w") as f:
            name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (dry run)"
            f.write(f"device: {name}, torch {torch.__version__}\n\n")
            f.write("| case | ms | GB/s | fraction of copy |\n|---|---|---|---|\n")
            for name, ms, gbs, frac in rows:
                f.write(f"| {name} | {ms:.3f} | {gbs:.0f} | {100 * frac:.1f}% |\n")


if __name__ == "__main__":
    main()
