#!/usr/bin/env python
"""CPU benchmark of the relative position biases (T5 buckets, ALiBi) against transformers' code.

    python benchmarks/bench_bias.py              # H=16, L=2048 (about a minute on 2 cores)
    python benchmarks/bench_bias.py --quick      # small sizes: a smoke test, numbers mean little
    python benchmarks/bench_bias.py --threads 1

Rows, all measured in this one run (median wall time; ratio = ours / baseline):
- ``relative_position_bias`` vs transformers' ``T5Attention.compute_bias(L, L).contiguous()`` (the
  [1, H, L, L] bias an SDPA/eager attention adds), goal >= 3x faster;
- ``alibi_bias`` vs BLOOM's ``build_alibi_tensor`` expanded to the same [1, H, L, L] (BLOOM's bias
  differs from ours by a constant per query row, which a causal softmax ignores) and vs the plain
  PyTorch expression ``slopes[:, None, None] * (j - i)``;
- both vs the write floor: ``torch.empty`` of the output's shape + ``fill_``, goal <= 1.3x;
- both backwards (the gradient summed along diagonals) vs the read floor ``grad.sum()``;
- one decode step's bias (one query row against L keys), per call, vs transformers' own and the fill;
every dtype the ops take (float32, bf16, fp16). ``--malloc system`` measures with glibc's own policy,
under which every output of these sizes is a fresh mapping.
Measuring helpers (median timing, steady-state malloc, the table) are bench_cpu.py's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import (Goal, Row, Settings, _repeated, bench, bench_together, check, print_header,  # noqa: E402
                       print_table, print_verdicts, steady_malloc)

import posenc_native as pn  # noqa: E402


def t5_rows(s: Settings, H: int, L: int, dtype: torch.dtype) -> list[Row]:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    torch.manual_seed(0)
    cfg = T5Config(d_model=H * 8, d_kv=8, num_heads=H, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128)
    attn = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).to(dtype).requires_grad_(False)
    w = attn.relative_attention_bias.weight
    ours_fn = lambda: pn.relative_position_bias(w, L, L)  # noqa: E731
    hf_fn = lambda: attn.compute_bias(L, L).contiguous()  # noqa: E731
    if not torch.equal(ours_fn(), hf_fn()):
        raise SystemExit("bench_bias: relative_position_bias differs from transformers' compute_bias")
    ours = bench(ours_fn, s)
    hf = bench(hf_fn, s)
    floor = bench(lambda: torch.empty(1, H, L, L, dtype=dtype).fill_(0.5), s)
    name = f"relative_position_bias H={H} L={L} {str(dtype).replace('torch.', '')}"
    return [Row(name, ours, "transformers compute_bias + .contiguous()", hf, Goal(1 / 3, ">= 3x faster")),
            Row(name, ours, "torch.empty + fill_", floor, Goal(1.3, "<= 1.3x")),
            backward_row(name, w, lambda leaf: pn.relative_position_bias(leaf, L, L), s)]


def backward_row(name: str, param: torch.Tensor, op: Callable[[torch.Tensor], torch.Tensor], s: Settings) -> Row:
    """The bias's backward (a gradient of the bias's shape summed along its diagonals) vs the read floor
    grad.sum(), which reads the same bytes once."""
    leaf = param.detach().clone().requires_grad_()
    bias = op(leaf)
    grad = torch.randn(bias.shape).to(bias.dtype)
    ours = bench(lambda: torch.autograd.grad(bias, leaf, grad, retain_graph=True), s)
    floor = bench(lambda: grad.sum(), s)
    return Row(f"{name} backward", ours, "grad.sum()", floor)


def alibi_rows(s: Settings, H: int, L: int, dtype: torch.dtype) -> list[Row]:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    slopes = pn.alibi_slopes(H)
    mask = torch.ones(1, L, dtype=torch.long)
    ours_fn = lambda: pn.alibi_bias(slopes, L, L, dtype=dtype)  # noqa: E731
    bloom_fn = lambda: build_alibi_tensor(mask, H, dtype).view(1, H, 1, L).expand(1, H, L, L).contiguous()  # noqa: E731
    pos = torch.arange(L)
    eager_fn = lambda: (slopes[:, None, None] * (pos[None, :] - pos[:, None])).unsqueeze(0).to(dtype)  # noqa: E731
    # Same bias up to a constant per query row: BLOOM's is slopes[h] * j, ours slopes[h] * (j - i).
    shifted = bloom_fn() - slopes[None, :, None, None] * pos[None, None, :, None].to(dtype)
    check("alibi_bias vs BLOOM + per-row shift", ours_fn(), shifted, 1e-6 if dtype == torch.float32 else 1e-2)
    ours = bench(ours_fn, s)
    bloom = bench(bloom_fn, s)
    eager = bench(eager_fn, s)
    floor = bench(lambda: torch.empty(1, H, L, L, dtype=dtype).fill_(0.5), s)
    name = f"alibi_bias H={H} L={L} {str(dtype).replace('torch.', '')}"
    return [Row(name, ours, "BLOOM build_alibi_tensor, expanded", bloom),
            Row(name, ours, "eager slopes * (j - i)", eager),
            Row(name, ours, "torch.empty + fill_", floor, Goal(1.3, "<= 1.3x")),
            backward_row(name, slopes, lambda leaf: pn.alibi_bias(leaf, L, L, dtype=dtype), s)]


def decode_rows(s: Settings, H: int, L: int, dtype: torch.dtype) -> list[Row]:
    """One decode step's bias: one query row at position L - 1 against L keys, [1, H, 1, L] (a few
    KiB, so the per-call cost is what shows), per call, timed in alternation with transformers' own
    (T5's ``compute_bias(1, L, past_seen_tokens=L - 1)``, BLOOM's ``build_alibi_tensor`` of an L-token
    mask) and with ``torch.empty + fill_`` of the same shape."""
    from transformers import T5Config
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.t5.modeling_t5 import T5Attention

    torch.manual_seed(0)
    cfg = T5Config(d_model=H * 8, d_kv=8, num_heads=H, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=True)
    attn = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).to(dtype).requires_grad_(False)
    w = attn.relative_attention_bias.weight
    t5_fn = lambda: pn.relative_position_bias(w, 1, L, bidirectional=False, query_offset=L - 1)  # noqa: E731
    hf_fn = lambda: attn.compute_bias(1, L, past_seen_tokens=L - 1)  # noqa: E731
    if not torch.equal(t5_fn(), hf_fn()):
        raise SystemExit("bench_bias: the decode relative_position_bias differs from transformers' compute_bias")
    slopes = pn.alibi_slopes(H)
    mask = torch.ones(1, L, dtype=torch.long)
    alibi_fn = lambda: pn.alibi_bias(slopes, 1, L, query_offset=L - 1, dtype=dtype)  # noqa: E731
    bloom_fn = lambda: build_alibi_tensor(mask, H, dtype)  # noqa: E731
    # BLOOM's row is slopes[h] * j, ours slopes[h] * (j - (L - 1)): the same up to a constant per head
    shifted = bloom_fn().view(1, H, 1, L).float() - slopes.view(1, H, 1, 1) * (L - 1)
    check("decode alibi_bias vs BLOOM + per-head shift", alibi_fn().float(), shifted,
          1e-6 if dtype == torch.float32 else 1e-2)
    # the modules, as a model calls them (T5's sharing the attention's weight; ALiBi cast to dtype)
    t5_module, alibi_module = pn.T5RelativePositionBias.from_t5(attn), pn.ALiBi(H).to(dtype)
    t5_module_fn = lambda: t5_module(1, L, L - 1)  # noqa: E731
    alibi_module_fn = lambda: alibi_module(1, L, L - 1)  # noqa: E731
    if not (torch.equal(t5_module_fn(), t5_fn()) and torch.equal(alibi_module_fn(), alibi_fn())):
        raise SystemExit("bench_bias: a bias module's decode row differs from its function's")
    calls = 50
    t5, hf, alibi, bloom, t5_mod, alibi_mod, floor = bench_together(
        [_repeated(f, calls) for f in (t5_fn, hf_fn, alibi_fn, bloom_fn, t5_module_fn, alibi_module_fn,
                                       lambda: torch.empty(1, H, 1, L, dtype=dtype).fill_(0.5))], s)
    dt = str(dtype).replace("torch.", "")
    t5_name, alibi_name = f"decode relative_position_bias H={H} 1x{L} {dt}", f"decode alibi_bias H={H} 1x{L} {dt}"
    return [Row(t5_name, t5 / calls, "transformers compute_bias", hf / calls),
            Row(t5_name, t5 / calls, "torch.empty + fill_", floor / calls),
            Row(f"decode T5RelativePositionBias H={H} 1x{L} {dt}", t5_mod / calls, "torch.empty + fill_", floor / calls),
            Row(alibi_name, alibi / calls, "BLOOM build_alibi_tensor", bloom / calls),
            Row(alibi_name, alibi / calls, "torch.empty + fill_", floor / calls),
            Row(f"decode ALiBi module H={H} 1x{L} {dt}", alibi_mod / calls, "torch.empty + fill_", floor / calls)]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke test)")
    parser.add_argument("--repeat", type=int, help="timed repeats per measurement (median is reported)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--malloc", choices=["steady", "system"], default="steady",
                        help="steady (default): large blocks are reused between calls; system: glibc's own policy")
    args = parser.parse_args(argv)
    allocator = steady_malloc() if args.malloc == "steady" else "glibc defaults (--malloc system)"
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(quick=args.quick, warmup=1 if args.quick else 2, repeat=args.repeat or (3 if args.quick else 7),
                        min_time=0.05 if args.quick else 0.5, compile=False)
    H, L = (4, 256) if args.quick else (16, 2048)

    print_header("posenc-native relative-bias CPU benchmark", __file__, argv, args.quick)
    print(f"malloc:   {allocator}")
    print(f"timing:   median of >= {settings.repeat} calls (and >= {settings.min_time} s) after {settings.warmup} "
          "warm-up; ratio = ours / baseline")
    print()
    start = time.perf_counter()
    rows: list[Row] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        rows += t5_rows(settings, H, L, dtype)
        rows += alibi_rows(settings, H, L, dtype)
        rows += decode_rows(settings, H, L, dtype)
    print_table(rows)
    print_verdicts(rows, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
