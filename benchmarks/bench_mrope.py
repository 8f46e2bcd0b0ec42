#!/usr/bin/env python
"""CPU benchmark of multi-axis RoPE (MRoPE, Qwen2-VL) against transformers' Qwen2-VL path and our plain RoPE.

    python benchmarks/bench_mrope.py              # q [1,4096,28,128], k [1,4096,4,128] bf16 (a few minutes on 2 cores)
    python benchmarks/bench_mrope.py --quick      # small sizes: a smoke test, numbers mean little
    python benchmarks/bench_mrope.py --threads 1 --rounds 5
    python benchmarks/bench_mrope.py --threads 1 --clock cpu   # this thread's CPU time: immune to time slicing

The positions are a Qwen2-VL prompt: text, one 56 x 64 image grid (time, height, width ids), text
again (transformers' get_rope_index layout), as [3, 1, S]. q and k are transformers' [B, H, S, D]
views of [B, S, H, D] projections (what a patched model hands the op). Rows:
- ours: ``apply_rope_`` in place with the MRoPE config, vs transformers' ``Qwen2VLRotaryEmbedding``
  + ``apply_rotary_pos_emb`` eager and ``torch.compile``d (goal >= 3x faster than compiled);
- ours vs our plain RoPE in place on the same tensors, ids 0..S-1 (a text prompt; goal <= 1.1x),
  and vs plain RoPE with the prompt's width ids (the same jumps in position: what is left of the
  difference is then the axes, not the id pattern);
- ours out of place (``apply_rope``), vs compiled transformers.
All calls are timed in alternation (bench_cpu.bench_together), ``--rounds`` times; the table shows
the median round and each ratio's range over rounds. Measuring helpers are bench_cpu.py's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import Goal, Row, Settings, bench_together, check, print_header, print_table, print_verdicts, steady_malloc  # noqa: E402

import posenc_native as pn  # noqa: E402
from posenc_native.config import RopeConfig  # noqa: E402


def vl_prompt_ids(seq: int, grid_h: int, grid_w: int) -> torch.Tensor:
    """[3, 1, seq]: text (the same id on every axis), an image grid (t = 0, h, w from where the text
    stopped), then text from one past the grid's largest id."""
    text = (seq - grid_h * grid_w) // 8
    after = seq - text - grid_h * grid_w
    first = torch.arange(text).expand(3, text)
    gh, gw = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    image = torch.stack([torch.zeros(grid_h * grid_w, dtype=torch.long), gh.flatten(), gw.flatten()]) + text
    rest = torch.arange(after).expand(3, after) + text + max(grid_h, grid_w)
    return torch.cat([first, image, rest], dim=1)[:, None]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke test)")
    parser.add_argument("--repeat", type=int, help="timed repeats per measurement (median is reported)")
    parser.add_argument("--rounds", type=int, help="rounds of alternated timing (ranges are over rounds)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall (default): elapsed time; cpu: this thread's CPU time (needs --threads 1)")
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    allocator = steady_malloc()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(quick=args.quick, warmup=1 if args.quick else 2, repeat=args.repeat or (3 if args.quick else 7),
                        min_time=0.05 if args.quick else 0.5, compile=not args.no_compile,
                        clock=time.thread_time if args.clock == "cpu" else time.perf_counter)
    rounds = args.rounds or (1 if args.quick else 3)
    S, Hq, Hk, D = (256, 4, 1, 128) if args.quick else (4096, 28, 4, 128)
    grid = (8, 24) if args.quick else (56, 64)

    info = print_header("posenc-native MRoPE CPU benchmark", __file__, argv, args.quick)
    print(f"CPU path: {info.get('cpu_isa', 'unknown')}")
    print(f"malloc:   {allocator}")
    print(f"shapes:   q [1,{S},{Hq},{D}], k [1,{S},{Hk},{D}] bf16 as [B,H,S,D] views; mrope_section (16, 24, 24); "
          f"ids: text, a {grid[0]}x{grid[1]} image grid, text")
    print(f"clock:    {'this thread' + chr(39) + 's CPU time' if args.clock == 'cpu' else 'wall'}")
    print(f"timing:   median of >= {settings.repeat} calls (and >= {settings.min_time} s) after {settings.warmup} "
          f"warm-up, all rows alternated; {rounds} round(s); ratio = ours / baseline")
    print()

    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

    theta, section = 1e6, (16, 24, 24)
    hf_cfg = Qwen2VLTextConfig(hidden_size=Hq * D, num_attention_heads=Hq, num_key_value_heads=Hk, head_dim=D,
                               rope_parameters={"rope_type": "default", "rope_theta": theta,
                                                "mrope_section": list(section)})
    rotary = Qwen2VLRotaryEmbedding(hf_cfg)
    cfg = RopeConfig(head_dim=D, base=theta, mrope_section=section)
    plain = RopeConfig(head_dim=D, base=theta)

    torch.manual_seed(0)
    ids = vl_prompt_ids(S, *grid)
    text_ids = torch.arange(S)[None]
    q = torch.randn(1, S, Hq, D).to(torch.bfloat16).transpose(1, 2)  # [B, H, S, D] views, as in the model
    k = torch.randn(1, S, Hk, D).to(torch.bfloat16).transpose(1, 2)

    def hf_path(q, k, ids):
        cos, sin = rotary(q, ids)
        return apply_rotary_pos_emb(q, k, cos, sin)

    want = hf_path(q, k, ids)
    got = pn.apply_rope(q, k, ids, config=cfg, layout="bhsd")
    for o, w, name in zip(got, want, ("q", "k")):
        check(f"MRoPE {name} vs transformers", o, w, 2e-2)

    fns = {
        "ours_inplace": lambda: pn.apply_rope_(q, k, ids, config=cfg, layout="bhsd"),
        "plain_inplace": lambda: pn.apply_rope_(q, k, text_ids, config=plain, layout="bhsd"),
        "plain_width": lambda: pn.apply_rope_(q, k, ids[2], config=plain, layout="bhsd"),
        "ours_oop": lambda: pn.apply_rope(q, k, ids, config=cfg, layout="bhsd"),
        "hf_eager": lambda: hf_path(q, k, ids),
    }
    if settings.compile:
        compiled = torch.compile(hf_path, fullgraph=True)
        start = time.perf_counter()
        for o, w in zip(compiled(q, k, ids), hf_path(q, k, ids)):
            check("compiled transformers vs eager", o, w, 2e-2)
        print(f"(torch.compile of transformers' path: {time.perf_counter() - start:.1f} s to compile)")
        fns["hf_compiled"] = lambda: compiled(q, k, ids)

    names = list(fns)
    per_round: list[dict[str, float]] = []
    start = time.perf_counter()
    for _ in range(rounds):
        per_round.append(dict(zip(names, bench_together([fns[n] for n in names], settings))))

    def median(name: str) -> float:
        return statistics.median(r[name] for r in per_round)

    def ratio_range(a: str, b: str) -> str:
        ratios = [r[a] / r[b] for r in per_round]
        return f"{min(ratios):.2f}x .. {max(ratios):.2f}x"

    label = f"mrope_ in place S={S} bf16"
    rows = [Row(label, median("ours_inplace"), "transformers Qwen2-VL eager", median("hf_eager"))]
    pairs = [("ours_inplace", "hf_eager")]
    if settings.compile:
        rows.append(Row(label, median("ours_inplace"), "transformers Qwen2-VL torch.compile", median("hf_compiled"),
                        Goal(1 / 3, ">= 3x faster")))
        pairs.append(("ours_inplace", "hf_compiled"))
    rows.append(Row(label, median("ours_inplace"), "our plain RoPE in place, ids 0..S-1", median("plain_inplace"),
                    Goal(1.1, "<= 1.1x")))
    pairs.append(("ours_inplace", "plain_inplace"))
    rows.append(Row(label, median("ours_inplace"), "our plain RoPE in place, the width ids", median("plain_width")))
    pairs.append(("ours_inplace", "plain_width"))
    base = "hf_compiled" if settings.compile else "hf_eager"
    rows.append(Row(f"mrope out of place S={S} bf16", median("ours_oop"),
                    "transformers Qwen2-VL " + ("torch.compile" if settings.compile else "eager"), median(base)))
    pairs.append(("ours_oop", base))
    print_table(rows)
    print()
    print("ratio range over rounds:")
    for (a, b), row in zip(pairs, rows):
        print(f"  {row.name} vs {row.baseline_name}: {ratio_range(a, b)}")
    print_verdicts(rows, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
