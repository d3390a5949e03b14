"""Plots logged as run artifacts (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from raysim.types import Metrics

_CURVES = {
    "accuracy": ("eval/central/accuracy", "eval/clients/accuracy", "train/accuracy"),
    "loss": ("eval/central/loss", "eval/clients/loss", "train/loss"),
}


def learning_curve(history: list[tuple[int, Metrics]], title: str, path: str | Path) -> Path:
    """Accuracy and loss per round, one panel each; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (label, keys) in zip(axes, _CURVES.items()):
        for key in keys:
            points = [(step, m[key]) for step, m in history if key in m]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 40 else None, label=key)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
