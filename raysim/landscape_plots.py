"""Plots of ``raysim.landscape``'s scans (matplotlib, headless, loaded only when a plot is drawn).

Usage:
    plot_curve(line_scan(services, a, b), "interp.png", title="client 3 vs client 7")
    plot_plane(plane_scan(services, w1, w2, w3), "plane.png", title="rounds 98-100")
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from raysim.landscape import Curve, PlaneScan, accuracy_barrier, loss_barrier

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_curve(curve: Curve, path: str | Path, title: str = "") -> Path:
    """Loss and accuracy against alpha, with both barriers in the legend when the curve spans
    [0, 1]; returns ``path`` (a PNG)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    try:
        barriers = {"loss": loss_barrier(curve), "accuracy": accuracy_barrier(curve)}
    except ValueError:  # a grid without both endpoints has no barrier
        barriers = {}
    for ax, name, values in ((axes[0], "loss", curve.loss), (axes[1], "accuracy", curve.accuracy)):
        label = f"barrier {barriers[name]:.4g}" if name in barriers else name
        ax.plot(curve.alphas, values, marker="o", markersize=3, label=label)
        for end in (0.0, 1.0):  # where the two models are, on a grid that extends past them
            ax.axvline(end, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("alpha  (1: model a, 0: model b)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, plt, path, title)


def plot_plane(scan: PlaneScan, path: str | Path, title: str = "") -> Path:
    """Contours of loss and of error (1 - accuracy) on the plane, the three models marked and
    labelled, their mean as a white cross (IMA Fig. 1); returns ``path`` (a PNG)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, name, values in ((axes[0], "loss", scan.loss), (axes[1], "error", 1.0 - scan.accuracy)):
        filled = ax.contourf(scan.xs, scan.ys, values, levels=20, cmap="viridis")
        ax.contour(scan.xs, scan.ys, values, levels=20, colors="k", linewidths=0.3, alpha=0.5)
        fig.colorbar(filled, ax=ax, label=name)
        ax.scatter(scan.coords[:, 0], scan.coords[:, 1], c="red", edgecolors="white", zorder=3)
        for (x, y), label in zip(scan.coords, scan.labels):
            ax.annotate(
                label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=9,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.7, "linewidth": 0},
            )  # fmt: skip
        centre = scan.coords.mean(axis=0)
        ax.scatter([centre[0]], [centre[1]], marker="x", c="white", zorder=3)
        ax.set_title(name)
        ax.set_aspect("equal", adjustable="box")
    return _save(fig, plt, path, title)


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, plt: ModuleType, path: str | Path, title: str) -> Path:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
