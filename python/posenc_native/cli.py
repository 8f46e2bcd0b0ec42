"""The `posenc` command (also `python -m posenc_native`).

    posenc                      build info + every op on every device against the float64 reference
    posenc plot sinusoidal --out FILE.png
    posenc plot rope --config PATH_OR_NAME --out FILE.png
    posenc plot t5-buckets --out FILE.png [--num-buckets 32 --max-distance 128 --heads 8 --model DIR]
    posenc plot alibi --out FILE.png [--heads 16]
    posenc config PATH_OR_NAME  rope type, rotary dim, attention factor, inv_freq table (and, for MRoPE,
                                the position axis of each pair)
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .config import RopeConfig


def _main_job() -> int:
    from . import build_info, selfcheck

    info = build_info()
    print("posenc-native build:")
    for key in ("version", "torch", "cuda", "cuda_version", "cuda_archs", "cxx_compiler", "cuda_compiler",
                "cxx11_abi", "library", "cuda_library", "torch_supported"):
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


# ------------------------------------------------------------------------------------------------
# posenc config


def _describe_one(cfg: "RopeConfig", title: str) -> list[str]:
    lines = [title]
    pairing = ("interleaved (2i, 2i+1), GPT-J style" if cfg.interleaved
               else "half-split (i, i+d/2), GPT-NeoX/Llama style")
    lines.append(f"  rope type          {cfg.rope_type}")
    lines.append(f"  head dim           {cfg.head_dim}")
    lines.append(f"  rotary dim         {cfg.rotary_dim} (partial_rotary_factor {cfg.partial_rotary_factor:g})")
    lines.append(f"  pairing            {pairing}")
    axes = cfg.pair_axes
    if axes is not None:
        axis_names = axis_labels(cfg.num_axes)
        kind = "round-robin within the sections (Qwen3-VL)" if cfg.mrope_interleaved else "contiguous sections"
        names = " (time, height, width)" if cfg.num_axes == 3 else ""
        lines.append(f"  axis layout        {cfg.num_axes} position axes {', '.join(axis_names)}{names}: sections "
                     f"{list(cfg.mrope_section)}, {kind}")
        row = "".join(axis_names[a] for a in axes)
        groups = " ".join(row[i:i + 16] for i in range(0, len(row), 16))
        lines.append(f"  pair -> axis       {groups}  (pair 0 first)")
    lines.append(f"  base (rope_theta)  {cfg.base:g}")
    if cfg.max_position_embeddings is not None:
        lines.append(f"  max positions      {cfg.max_position_embeddings}")
    s = cfg.scaling
    labels = {"factor": "factor", "original_max_position_embeddings": "original max pos", "low_freq_factor":
              "low_freq_factor", "high_freq_factor": "high_freq_factor", "beta_fast": "beta_fast", "beta_slow":
              "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim", "truncate": "truncate"}
    for name, label in labels.items():
        value = getattr(s, name, None)
        if name == "factor" and value is None and hasattr(s, "resolved_factor"):
            value = f"{s.resolved_factor(cfg):g} (max positions / original max positions)"
        elif name == "original_max_position_embeddings" and value is None and hasattr(s, "original_max"):
            value = f"{s.original_max(cfg)} (= max positions)"
        if value is not None:
            lines.append(f"  {label:18s} {value}")
    lines.append(f"  attention factor   {cfg.attention_factor:.10g} (multiplies cos and sin of the rotated dims)")
    if cfg.softmax_scale_multiplier != 1.0:
        lines.append(f"  softmax scale x    {cfg.softmax_scale_multiplier:.10g} (mscale(factor, mscale_all_dim)^2, "
                     "applied by DeepSeek-style attention, not by the rotation)")
    scheme_lines, seq_len = s.describe(cfg)
    lines += scheme_lines
    default = cfg.default_inv_freq()
    scaled = cfg.inv_freq(seq_len)
    regimes = s.pair_regimes(cfg)
    n = scaled.shape[0]
    lines.append(f"  inv_freq (float64, {n} pairs)")
    lines.append(f"    {'pair':>4s}  {'default':>13s}  {'scaled':>13s}  {'scaled/default':>14s}  {'wavelength':>11s}"
                 + ("  axis" if axes is not None else "") + ("  regime" if regimes else ""))
    shown = sorted(set(range(min(4, n))) | set(range(max(0, n - 4), n)) | _boundary_pairs(regimes)
                   | _boundary_pairs(list(axes) if axes is not None and not cfg.mrope_interleaved else None))
    prev = -1
    for i in shown:
        if i != prev + 1:
            lines.append("    " + "...".rjust(4))
        d_i, s_i = float(default[i]), float(scaled[i])
        ratio = f"{s_i / d_i:14.6f}" if d_i != 0 else f"{'-':>14s}"
        wl = f"{2 * math.pi / s_i:11.4g}" if s_i != 0 else f"{'inf':>11s}"
        lines.append(f"    {i:4d}  {d_i:13.6e}  {s_i:13.6e}  {ratio}  {wl}"
                     + (f"  {axis_names[axes[i]]:>4s}" if axes is not None else "") + (f"  {regimes[i]}" if regimes else ""))
        prev = i
    return lines


def axis_labels(num_axes: int) -> list[str]:
    """Names of the position axes of an axis layout: T, H, W for MRoPE's three, else 0, 1, ..."""
    return ["T", "H", "W"] if num_axes == 3 else [str(a) for a in range(num_axes)]


def _boundary_pairs(regimes: Optional[list]) -> set[int]:
    """Pairs on either side of each regime change (where YaRN/Llama-3 start and stop blending, where
    an MRoPE section ends)."""
    if not regimes:
        return set()
    out: set[int] = set()
    for i in range(1, len(regimes)):
        if regimes[i] != regimes[i - 1]:
            out |= {i - 1, i}
    return out


def describe_config(source: str) -> str:
    """Text for ``posenc config``: rope type, rotary dim, attention factor and an inv_freq table
    (first and last pairs, and for YaRN/Llama-3 the pairs where keeping, blending and
    interpolating change). ``source`` is a config.json path, a directory with one, or a preset."""
    from .config import PRESETS, RopeConfig, hf_layer_types, load_hf_dict

    data = load_hf_dict(source)
    origin = "built-in preset" if isinstance(source, str) and source in PRESETS else "config.json"
    model_type = data.get("model_type") or (data.get("text_config") or {}).get("model_type") or "?"
    lines = [f"{source} ({origin}, model_type {model_type})"]
    layer_types = hf_layer_types(data)
    if not layer_types:
        lines += _describe_one(RopeConfig.from_hf(data), "RoPE")
    for lt in layer_types:
        lines += _describe_one(RopeConfig.from_hf(data, layer_type=lt), f"RoPE of layer type {lt!r}")
    return "\n".join(lines)


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
            print(describe_config(args.source))
            return 0
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"posenc: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
