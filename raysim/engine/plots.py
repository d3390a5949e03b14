"""Plots logged as run artifacts (matplotlib, headless)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.engine.round_timer import PHASES, WALL, phase_key, time_summary
from raysim.types import Metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    return _save(fig, path)


def time_per_round(history: list[tuple[int, Metrics]], title: str, path: str | Path) -> Path | None:
    """Each round's wall time stacked by phase (bars; areas past 100 rounds), the tallest layer
    the bottleneck, with the run's shares in the title; returns ``path``, or None when no round
    was timed (a plugin's own protocol)."""
    timed = [(step, m) for step, m in history if WALL in m]
    summary = time_summary(timed)
    if summary is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [step for step, _ in timed]
    names = (*PHASES, "other")
    layers = {name.replace("_", " "): [m.get(phase_key(name), 0.0) for _, m in timed] for name in names}
    fig, ax = plt.subplots(figsize=(10, 4.2))
    if len(rounds) > 100:
        ax.stackplot(rounds, *layers.values(), labels=list(layers))
    else:
        bottom = [0.0] * len(rounds)
        for name, seconds in layers.items():
            ax.bar(rounds, seconds, bottom=bottom, label=name, width=0.8)
            bottom = [b + s for b, s in zip(bottom, seconds)]
    ax.set_xlabel("round")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{title}\n{summary}", fontsize=10)
    return _save(fig, path)


@dataclass(frozen=True)
class Series:
    """One run's curve of one metric: ``run`` picks the colour, ``scope`` the line style."""

    run: str
    scope: str  # clients, central, heldout, or a full metric key
    rounds: list[float]  # the x values: rounds, or a logged key's (the simulated clock)
    values: list[float]
    band: tuple[list[float], list[float]] | None = None  # p10 and p90 over clients, per round


@dataclass(frozen=True)
class Panel:
    metric: str
    series: list[Series]
    log_y: bool = False  # perplexities span orders of magnitude while a model learns
    x_label: str = "round"  # or the logged key the curves are drawn against (sys/sim_clock_s)


_STYLES = {"clients": "-", "central": "--", "heldout": ":"}
PANEL_WIDTH_IN = 6  # inches per panel of the overlaid curves
TITLE_CHARS_PER_IN = 11  # characters of a 10-point title that fit an inch, with room to spare


def overlaid_curves(panels: list[Panel], title: str, path: str | Path) -> Path:
    """``curves_figure`` written to ``path`` (PNG); returns ``path``."""
    fig = curves_figure(panels, title)
    fig.savefig(Path(path), dpi=110)
    return Path(path)


def curves_figure(panels: list[Panel], title: str) -> Figure:
    """Every run's curves on shared axes, one panel per metric, the p10-p90 band over clients
    shaded in the run's colour. A plain ``Figure`` (no pyplot): a notebook shows it as it is, and
    nothing stays open in pyplot's list of figures."""
    from matplotlib import rcParams
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatter, MaxNLocator

    runs = list(dict.fromkeys(s.run for panel in panels for s in panel.series))
    cycle = rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {run: cycle[i % len(cycle)] for i, run in enumerate(runs)}
    width = PANEL_WIDTH_IN * len(panels)
    fig = Figure(figsize=(width, 4.2))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for s in panel.series:
            label = s.run if "/" in s.scope else f"{s.run} ({s.scope})"
            ax.plot(
                s.rounds,
                s.values,
                _STYLES.get(s.scope, "-"),
                color=colour[s.run],
                label=label,
                marker="." if len(s.rounds) < 40 else None,
            )
            if s.band is not None:
                ax.fill_between(s.rounds, *s.band, color=colour[s.run], alpha=0.15, linewidth=0)
        if panel.log_y:
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 1)))
        ax.set_xlabel(panel.x_label)
        if panel.x_label == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(panel.metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    lines = textwrap.wrap(title, int(width * TITLE_CHARS_PER_IN))  # a long title is wrapped, never cut
    if any(s.band is not None for panel in panels for s in panel.series):
        lines.append("shaded: 10th-90th percentile over clients")
    fig.suptitle("\n".join(lines), fontsize=10)
    fig.tight_layout()
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
