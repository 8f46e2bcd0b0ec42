"""Figures for the `posenc plot` command (matplotlib is an optional extra: pip install posenc-native[plot])."""
from __future__ import annotations

import torch


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - exercised by a test that hides matplotlib
        raise RuntimeError("plotting needs matplotlib: pip install 'posenc-native[plot]' (or pip install matplotlib)") from e
    return plt


def plot_sinusoidal(out: str, length: int = 100, dim: int = 128) -> str:
    """Heat map of the sinusoidal table: positions down, dimensions across (the seed article's figure)."""
    from .ops import sinusoidal_table

    plt = _pyplot()
    table = sinusoidal_table(length, dim).numpy()
    fig, ax = plt.subplots(figsize=(10, 6))
    im = ax.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(f"Sinusoidal positional encoding ({length} positions x {dim} dims)")
    fig.colorbar(im, ax=ax)
    return _save(plt, fig, out)


def _rope_score_curve(cfg, distances: torch.Tensor, seq_len=None) -> torch.Tensor:
    """RoPE dot product ``<R(0) q, R(r) k>`` of a fixed q = k (all ones on the rotated dims) against
    the relative distance r, in float64 from the reference (attention factor included)."""
    from . import reference

    q = torch.ones(1, 1, 1, cfg.head_dim, dtype=torch.float64)
    qr, _ = reference.apply_rope(q, None, torch.zeros(1, dtype=torch.long), cfg, seq_len=seq_len)
    k = torch.ones(1, distances.numel(), 1, cfg.head_dim, dtype=torch.float64)
    kr, _ = reference.apply_rope(k, None, distances, cfg, seq_len=seq_len)
    rot = slice(0, cfg.rotary_dim)
    return (kr[0, :, 0, rot] * qr[0, 0, 0, rot]).sum(-1)


def plot_rope(source: str, out: str) -> str:
    """RoPE figure for ``posenc plot rope --config SOURCE``: default vs scaled frequency per pair, the
    per-pair scaling (YaRN's ramp, Llama-3's smoothing), and the dot product of a fixed q, k against
    relative distance (default vs scaled; text positions, the same on every axis of an MRoPE layout,
    whose pairs the first panel colours by position axis). ``source``: a config.json, a directory
    with one, or a preset name; for per-layer-type configs the full-attention (else first) layer
    type is drawn."""
    import dataclasses
    import math

    from .config import DefaultScaling, RopeConfig, YarnScaling, hf_layer_types, load_hf_dict

    data = load_hf_dict(source)
    kinds = hf_layer_types(data)
    layer_type = ("full_attention" if "full_attention" in kinds else kinds[0]) if kinds else None
    cfg = RopeConfig.from_hf(data, layer_type=layer_type)
    seq_len = None
    if cfg.needs_seq_len:  # draw the scaled regime: past the original / trained context
        big = cfg.max_position_embeddings or 4096
        seq_len = int(big * cfg.scaling.factor) if cfg.rope_type == "dynamic" else big
    plain = dataclasses.replace(cfg, scaling=DefaultScaling()) if cfg.rope_type != "proportional" else cfg
    default = cfg.default_inv_freq().numpy()
    scaled = cfg.inv_freq(seq_len).numpy()
    pairs = range(len(scaled))

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    ax = axes[0]
    ax.semilogy(pairs, default, "o-", ms=3, label="default")
    label = f"{cfg.rope_type}" + (f" (seq_len {seq_len})" if seq_len else "")
    if cfg.pair_axes is None:
        ax.semilogy(pairs, scaled, "s-", ms=3, label=label)
        ax.set_title("frequencies per pair")
    else:  # MRoPE / axial: each pair's marker coloured by the position axis it reads
        from .cli import axis_labels

        names = axis_labels(cfg.num_axes)
        ax.semilogy(pairs, scaled, "-", lw=0.6, c="gray")
        for a, name in enumerate(names):
            idx = [i for i, axis in enumerate(cfg.pair_axes) if axis == a]
            ax.semilogy(idx, scaled[idx], "s", ms=4, color=f"C{a + 1}",
                        label=f"{label}, axis {name} ({len(idx)} pairs)")
        ax.set_title("frequencies per pair (colour: position axis)")
    ax.set_xlabel("pair i")
    ax.set_ylabel("inv_freq (rad / position)")
    ax.legend()

    ax = axes[1]
    if isinstance(cfg.scaling, YarnScaling):
        ramp = cfg.scaling.ramp(cfg).numpy()
        lo, hi = cfg.scaling.correction_range(cfg)
        ax.plot(pairs, ramp, "o-", ms=3, label="ramp (0 keep, 1 interpolate)")
        ax.axvline(lo, ls="--", c="gray")
        ax.axvline(hi, ls="--", c="gray")
        ax.set_title(f"YaRN ramp: lo={lo:g}, hi={hi:g}")
    elif cfg.pair_axes is not None and cfg.rope_type == "default":  # nothing scaled: show the axis layout
        from .cli import axis_labels

        names = axis_labels(cfg.num_axes)
        for a, name in enumerate(names):
            idx = [i for i, axis in enumerate(cfg.pair_axes) if axis == a]
            ax.plot(idx, [a] * len(idx), "s", ms=4, color=f"C{a + 1}", label=f"axis {name}")
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(-0.5, len(names) + 0.3)  # room for the legend above the rows
        kind = "round-robin" if cfg.mrope_interleaved else "contiguous"
        ax.set_title(f"position axis of each pair ({kind} sections {list(cfg.mrope_section)})")
    else:
        ratio = [s / d if d else float("nan") for s, d in zip(scaled.tolist(), default.tolist())]
        ax.plot(pairs, ratio, "o-", ms=3, label="scaled / default")
        ax.set_title("per-pair scaling")
    ax.set_xlabel("pair i")
    ax.legend()

    ax = axes[2]
    horizon = cfg.max_position_embeddings or 8192
    horizon = min(horizon, 1 << 17)
    distances = torch.unique(torch.logspace(0, math.log10(horizon), 600).round().long())
    ax.plot(distances.numpy(), _rope_score_curve(plain, distances).numpy(), lw=0.8, label="default")
    ax.plot(distances.numpy(), _rope_score_curve(cfg, distances, seq_len).numpy(), lw=0.8, label=cfg.rope_type)
    ax.set_xscale("log")
    ax.set_xlabel("relative distance n - m")
    ax.set_ylabel("<R(m) q, R(n) k>,  q = k = ones")
    ax.set_title(f"RoPE score vs distance (attention factor {cfg.attention_factor:.4g})")
    ax.legend()
    fig.suptitle(f"{source}: {cfg.rope_type}, rotary dim {cfg.rotary_dim}, base {cfg.base:g}"
                 + (f", layer type {layer_type}" if layer_type else "")
                 + ("" if cfg.mrope_section is None else f", MRoPE sections {list(cfg.mrope_section)}"))
    return _save(plt, fig, out)


def _plot_heads(ax, x: torch.Tensor, values: torch.Tensor, xlabel: str, title: str, legend_up_to: int) -> None:
    """One curve per head (rows of ``values``) against ``x``; a legend for up to ``legend_up_to`` heads."""
    heads = values.shape[0]
    for h in range(heads):
        ax.plot(x.numpy(), values[h].numpy(), lw=0.9, label=f"head {h}" if heads <= legend_up_to else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("bias")
    ax.set_title(title)
    if heads <= legend_up_to:
        ax.legend(fontsize=7, ncol=2)


def _save(plt, fig, out: str) -> str:
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _t5_weight(model: str | None, num_buckets: int, heads: int) -> tuple[torch.Tensor, str]:
    """The encoder's relative_attention_bias.weight of a local transformers T5/mT5/UMT5 directory, or a
    seeded N(0, 1) table (the bucket layout is what the figure shows; a trained table shows what T5 learned)."""
    if model is None:
        return torch.randn(num_buckets, heads, generator=torch.Generator().manual_seed(0)), "random N(0, 1) table"
    try:
        from transformers import AutoModelForSeq2SeqLM
    except ImportError as e:  # pragma: no cover
        raise RuntimeError("plot t5-buckets --model needs transformers") from e
    m = AutoModelForSeq2SeqLM.from_pretrained(model, local_files_only=True)
    for name, module in m.named_modules():
        if "encoder" in name and isinstance(getattr(module, "relative_attention_bias", None), torch.nn.Embedding):
            return module.relative_attention_bias.weight.detach().float(), f"{model} ({name})"
    raise ValueError(f"{model}: no encoder attention with a relative_attention_bias")


def plot_t5_buckets(out: str, num_buckets: int = 32, max_distance: int = 128, heads: int = 8,
                    model: str | None = None) -> str:
    """T5 relative position buckets and bias for ``posenc plot t5-buckets``: bucket index against the
    relative distance (memory - context) for the encoder's bidirectional and the decoder's causal
    bucketing, and the bias per head against distance (``--model``: a local T5 checkpoint's table)."""
    from . import bias

    weight, source = _t5_weight(model, num_buckets, heads)
    num_buckets, heads = weight.shape
    span = 2 * max_distance
    rel = torch.arange(-span, span + 1)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(15, 5))
    ax = axes[0]
    for bidirectional, label in ((True, "bidirectional (encoder)"), (False, "unidirectional (decoder)")):
        b = bias.t5_relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                             max_distance=max_distance)
        ax.step(rel.numpy(), b.numpy(), where="mid", label=label)
    for x in (-max_distance, max_distance):
        ax.axvline(x, ls="--", c="gray", lw=0.8)
    ax.set_xlabel("relative position (key - query)")
    ax.set_ylabel("bucket")
    ax.set_title(f"T5 buckets: num_buckets {num_buckets}, max_distance {max_distance} (dashed)")
    ax.legend()
    ax = axes[1]
    values = bias.relative_position_bias(weight, 1, rel.numel(), max_distance=max_distance,
                                         query_offset=span)[0, :, 0]  # query at 0, keys -span .. span
    _plot_heads(ax, rel, values, "relative position (key - query)", f"bias per head (bidirectional), {source}", 12)
    return _save(plt, fig, out)


def plot_alibi(out: str, heads: int = 16, length: int = 64) -> str:
    """ALiBi for ``posenc plot alibi``: the slopes per head (log scale) and the bias
    ``slope * (key - query)`` against the distance for every head."""
    from . import bias

    slopes = bias.alibi_slopes(heads)
    values = bias.alibi_bias(slopes, 1, length, query_offset=length - 1)[0, :, 0]  # the last query: keys 0 .. L-1
    distance = torch.arange(-(length - 1), 1)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    ax = axes[0]
    ax.semilogy(range(heads), slopes.numpy(), "o-", ms=4)
    ax.set_xlabel("head")
    ax.set_ylabel("slope")
    ax.set_title(f"ALiBi slopes, {heads} heads" + ("" if heads & (heads - 1) == 0 else " (not a power of two)"))
    ax = axes[1]
    _plot_heads(ax, distance, values, "relative position (key - query); keys after the query are masked",
                "bias = slope * (key - query)", 16)
    return _save(plt, fig, out)
