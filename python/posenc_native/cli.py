"""The `posenc` command (also `python -m posenc_native`).

    posenc                      build info + every op on every device against the float64 reference
    posenc plot sinusoidal --out FILE.png
    posenc plot rope --config PATH_OR_NAME --out FILE.png
    posenc plot t5-buckets --out FILE.png [--num-buckets 32 --max-distance 128 --heads 8 --model DIR]
    posenc plot alibi --out FILE.png [--heads 16]
    posenc config PATH_OR_NAME  rope type, rotary dim, attention factor, inv_freq table
"""
from __future__ import annotations

import argparse
import sys


def _main_job() -> int:
    from . import build_info, selfcheck

    info = build_info()
    print("posenc-native build:")
    for key in ("version", "torch", "cuda", "cuda_version", "cuda_archs", "cxx_compiler", "cuda_compiler",
                "cxx11_abi", "library"):
        print(f"  {key:14s} {info[key]}")
    import torch

    print(f"  running torch  {torch.__version__} (CUDA device available: {torch.cuda.is_available()})")
    print()
    results = selfcheck.run_all()
    print(f"{'op':26s} {'device':7s} {'dtype':9s} {'rel error':>10s} {'tolerance':>10s}  result")
    for r in results:
        print(f"{r.op:26s} {r.device:7s} {r.dtype:9s} {r.error:10.2e} {r.tolerance:10.1e}  {'pass' if r.passed else 'FAIL'}")
    failed = [r for r in results if not r.passed]
    print()
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posenc", description="posenc-native: positional-encoding kernels")
    sub = parser.add_subparsers(dest="command")
    plot = sub.add_parser("plot", help="draw a figure")
    plot.add_argument("what", choices=["sinusoidal", "rope", "t5-buckets", "alibi"])
    plot.add_argument("--out", required=True, help="output PNG file")
    plot.add_argument("--config", help="for rope: a config.json path, a directory holding one, or a preset name")
    plot.add_argument("--length", type=int, default=100, help="for sinusoidal: positions")
    plot.add_argument("--dim", type=int, default=128, help="for sinusoidal: dimensions")
    plot.add_argument("--num-buckets", type=int, default=32, help="for t5-buckets: num_buckets")
    plot.add_argument("--max-distance", type=int, default=128, help="for t5-buckets: max_distance")
    plot.add_argument("--heads", type=int, help="for t5-buckets (default 8) and alibi (default 16): heads")
    plot.add_argument("--model", help="for t5-buckets: a local transformers T5/mT5/UMT5 directory (its table)")
    cfg = sub.add_parser("config", help="describe a RoPE configuration")
    cfg.add_argument("source", help="a config.json path, a directory holding one, or a preset name")
    args = parser.parse_args(argv)

    try:
        if args.command is None:
            return _main_job()
        if args.command == "plot":
            from . import plots

            if args.what == "sinusoidal":
                print(plots.plot_sinusoidal(args.out, length=args.length, dim=args.dim))
            elif args.what == "t5-buckets":
                print(plots.plot_t5_buckets(args.out, num_buckets=args.num_buckets, max_distance=args.max_distance,
                                            heads=args.heads or 8, model=args.model))
            elif args.what == "alibi":
                print(plots.plot_alibi(args.out, heads=args.heads or 16))
            else:
                if not args.config:
                    parser.error("plot rope needs --config")
                print(plots.plot_rope(args.config, args.out))
            return 0
        if args.command == "config":
            from .config import describe_config

            print(describe_config(args.source))
            return 0
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"posenc: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
