"""Plots of ``raysim.measure.landscape``'s scans (matplotlib, headless, loaded only when a plot is drawn).

Usage:
    plot_curve(line_scan(services, a, b), "interp.png", title="client 3 vs client 7")
    plot_plane(plane_scan(services, w1, w2, w3), "plane.png", title="rounds 98-100")
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from raysim.measure.landscape import Curve, PlaneScan, accuracy_barrier, loss_barrier
from raysim.measure.points import Values
from raysim.measure.scores import SCORES

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_curve(curve: Curve, path: str | Path, title: str = "") -> Path:
    """Loss, accuracy (where the task has one) and the dataset's scores (MCC, F1, Pearson) against
    alpha, with the barriers in the legend when the curve spans [0, 1]; returns ``path`` (a PNG)."""
    panels = {"loss": curve.loss}
    if curve.accuracy is not None:
        panels["accuracy"] = curve.accuracy
    panels |= _dataset_scores(curve.scores)
    try:
        barriers = {"loss": loss_barrier(curve)}
        barriers |= {"accuracy": accuracy_barrier(curve)} if curve.accuracy is not None else {}
    except ValueError:  # a grid without both endpoints has no barrier
        barriers = {}
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (name, values) in zip(axes[0], panels.items()):
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
    """Contours of loss, of error (1 - accuracy, where the task has an accuracy) and of the
    dataset's scores on the plane, the three models marked and labelled, their mean as a white
    cross (IMA Fig. 1); returns ``path`` (a PNG)."""
    panels = {"loss": scan.loss}
    if scan.accuracy is not None:
        panels["error"] = 1.0 - scan.accuracy
    panels |= _dataset_scores(scan.scores)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.6), squeeze=False)
    for ax, (name, values) in zip(axes[0], panels.items()):
        filled = ax.contourf(scan.xs, scan.ys, values, levels=20, cmap="viridis")
        ax.contour(scan.xs, scan.ys, values, levels=20, colors="k", linewidths=0.3, alpha=0.5)
        fig.colorbar(filled, ax=ax, label=name)
        ax.scatter(scan.coords[:, 0], scan.coords[:, 1], c="red", edgecolors="white", zorder=3)
        for (x, y), label in zip(scan.coords, scan.labels):
            ax.annotate(
                label,
                (x, y),
                textcoords="offset points",
                xytext=(5, 5),
                fontsize=9,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.7, "linewidth": 0},
            )
        centre = scan.coords.mean(axis=0)
        ax.scatter([centre[0]], [centre[1]], marker="x", c="white", zorder=3)
        ax.set_title(name)
        ax.set_aspect("equal", adjustable="box")
    return _save(fig, plt, path, title)


def _dataset_scores(others: Values) -> Values:
    """The dataset's MCC, F1 or Pearson among a scan's other metrics (not a causal LM's
    perplexity: it is the loss again)."""
    return {name: v for name, v in others.items() if name in SCORES}


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
