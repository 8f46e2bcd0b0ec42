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
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
