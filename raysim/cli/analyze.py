"""``raysim analyze RUN_ID TOOL ...``: the landscape between a finished run's models.

Models are named on the command line as ``final``, ``round:N`` (the checkpoint of round N),
``init`` (the initial model, rebuilt from the seed) or a checkpoint file. Every grid is evaluated
in one ``map_clients`` call spread over the workers (``raysim.measure.landscape``), on the central test
set (a dataset without one: the pooled test splits of the run's evaluated clients, whose
example-weighted mean is the run's ``eval/clients/loss``) or, with ``--clients K``, on the pooled
test splits of K of them.
Results go back into the analyzed MLflow run: metrics under ``analysis/...`` (at the step of the
run's last round, beside its final evaluation) and the PNGs (plus the scanned values as JSON) as
artifacts under ``analysis/``.

Tools:
    line A B        loss and accuracy along w(a) = a A + (1 - a) B, both barriers (FedGuCci,
                    Li et al., KDD 2025, arXiv:2402.18949, Def. 2.1)
    barrier A B     the two barriers only, from 11 points in [0, 1]
    plane A B C     loss and error contours on the plane through three models (IMA, Zhou et al.,
                    IEEE TMC 2024, arXiv:2305.07845, Fig. 1)
    trajectory      the plane through the last three checkpointed global models (IMA Fig. 1,
                    column 4), their mean marked
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from raysim.errors import RaysimError
from raysim.measure.landscape import (
    Curve,
    accuracy_barrier,
    line_scan,
    loss_barrier,
    plane_scan,
)
from raysim.measure.landscape_plots import plot_curve, plot_plane
from raysim.measure.points import evaluate_points
from raysim.measure.weight_space import mix
from raysim.results.analysis import FinishedRun
from raysim.types import Metrics

BARRIER_POINTS = 11  # 11 points in [0, 1] for barriers (the FedGuCci paper gives no grid)


def run_analysis(args: argparse.Namespace, console: Console) -> int:
    """Opens the run, runs one tool, logs its results back; the workers stop in any case."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr stays for errors
    backend: Literal["serial"] | None = "serial" if args.serial else None
    with FinishedRun.open(args.run_id, args.tracking_uri, backend=backend, num_workers=args.workers) as run:
        try:
            logged = TOOLS[args.tool](run, args, console)
        except ValueError as exc:  # raysim.measure.landscape's word on unusable input (no plane, no data)
            raise RaysimError(str(exc)) from None
    console.print(f"{logged} to MLflow run {run.run_id}", soft_wrap=True, highlight=False)
    return 0


# --- the tools: each returns what it logged, in words ----------------------------------------------------


def line(run: FinishedRun, args: argparse.Namespace, console: Console) -> str:
    refs = (args.a, args.b)
    a, b = run.model(args.a), run.model(args.b)
    alphas = line_alphas(args.points, *args.range)
    with run.services() as services:
        curve = line_scan(services, a, b, alphas, clients=run.evaluation_clients(args.clients))
    name = "_".join(label(ref) for ref in refs)
    console.print(f"w(alpha) = alpha {refs[0]} + (1 - alpha) {refs[1]}", highlight=False)
    console.print(curve_table(curve))
    key = f"analysis/line/{name}"
    metrics = barrier_metrics(curve, key)
    console.print(metrics_text(metrics), highlight=False)
    folder = run.output_dir()
    title = f"{run.job.name}: {refs[0]} (alpha 1) to {refs[1]} (alpha 0)"
    png = plot_curve(curve, folder / f"line_{name}.png", title)
    columns = {"alphas": curve.alphas} | scan_columns(curve.loss, curve.accuracy, curve.scores)
    data = write_json(folder / f"line_{name}.json", {"models": refs, **as_lists(columns)})
    return log(run, key, metrics, [png, data])


def barrier(run: FinishedRun, args: argparse.Namespace, console: Console) -> str:
    a, b = run.model(args.a), run.model(args.b)
    with run.services() as services:
        curve = line_scan(
            services, a, b, np.linspace(0, 1, BARRIER_POINTS), clients=run.evaluation_clients(args.clients)
        )
    key = f"analysis/barrier/{label(args.a)}_{label(args.b)}"
    metrics = barrier_metrics(curve, key)
    console.print(metrics_text(metrics), highlight=False)
    return log(run, key, metrics, [])


def plane(run: FinishedRun, args: argparse.Namespace, console: Console) -> str:
    return scan_plane(run, (args.a, args.b, args.c), args, console, "plane")


def trajectory(run: FinishedRun, args: argparse.Namespace, console: Console) -> str:
    rounds = checkpointed_rounds(run)
    if len(rounds) < 3:
        raise RaysimError(
            f"trajectory needs three checkpointed rounds, run {run.run_id} has {rounds}; run the "
            f"job with engine.checkpoint_every=1 (or use plane with checkpoint files)"
        )
    return scan_plane(run, tuple(f"round:{r}" for r in rounds[-3:]), args, console, "trajectory")


def scan_plane(
    run: FinishedRun, refs: Sequence[str], args: argparse.Namespace, console: Console, tool: str
) -> str:
    """The grid on the plane through three models, and the models and their mean themselves."""
    w1, w2, w3 = models = [run.model(ref) for ref in refs]
    labels = (label(refs[0]), label(refs[1]), label(refs[2]))
    clients = run.evaluation_clients(args.clients)
    with run.services() as services:
        scan = plane_scan(
            services, w1, w2, w3, size=args.size, padding=args.padding, clients=clients, labels=labels
        )
        values = evaluate_points(services, [*models, mix(models, [1, 1, 1])], clients)
    name = "_".join(labels)
    key = f"analysis/{tool}/{name}"
    metrics: Metrics = {f"{key}/grid_min_loss": float(scan.loss.min())}
    if scan.accuracy is not None:  # a regression task has none
        metrics[f"{key}/grid_max_accuracy"] = float(scan.accuracy.max())
    for i, who in enumerate([*labels, "mean"]):
        metrics |= {f"{key}/{who}/{metric}": float(v[i]) for metric, v in values.items()}
    console.print(metrics_text(metrics), highlight=False)
    folder = run.output_dir()
    png = plot_plane(scan, folder / f"{tool}_{name}.png", f"{run.job.name}: {', '.join(refs)}")
    data = write_json(
        folder / f"{tool}_{name}.json",
        {
            "models": list(refs),
            "coords": scan.coords.tolist(),
            "xs": scan.xs.tolist(),
            "ys": scan.ys.tolist(),
            **as_lists(scan_columns(scan.loss, scan.accuracy, scan.scores)),
        },
    )
    return log(run, key, metrics, [png, data])


TOOLS: dict[str, Callable[[FinishedRun, argparse.Namespace, Console], str]] = {
    "line": line,
    "barrier": barrier,
    "plane": plane,
    "trajectory": trajectory,
}


# --- helpers -----------------------------------------------------------------------------------


def label(ref: str) -> str:
    """A model reference as a metric-name part: ``round:3`` -> ``round3``, a file -> its stem."""
    if ref.startswith("round:"):
        return "round" + ref.removeprefix("round:")
    return ref if ref in ("init", "final") else re.sub(r"[^\w.-]", "-", Path(ref).stem)


def line_alphas(points: int, low: float, high: float) -> np.ndarray:
    """``points`` alphas from ``low`` to ``high``, plus 0 and 1 (both models: the barriers need
    them), rounded so that a grid's near-zero float is 0."""
    if points < 2 or not low < high:
        raise RaysimError(
            f"a line needs --points >= 2 and --range LOW HIGH with LOW < HIGH, got {points}, {low} {high}"
        )
    grid = np.concatenate([np.linspace(low, high, points), [0.0, 1.0]])
    return np.unique(np.round(grid, 9)) + 0.0  # + 0.0 turns -0.0 into 0.0


def checkpointed_rounds(run: FinishedRun) -> list[int]:
    """Every round with a global model on disk: the round checkpoints and the final one's."""
    rounds = set(run.rounds())
    try:
        rounds.add(run.round_of(run.checkpoint_path("final")))
    except RaysimError:  # a run that did not finish has round checkpoints only
        pass
    return sorted(rounds)


def barrier_metrics(curve: Curve, key: str) -> Metrics:
    """The loss barrier, and the accuracy barrier where the task has an accuracy (not regression)."""
    metrics = {f"{key}/loss_barrier": loss_barrier(curve)}
    if curve.accuracy is not None:
        metrics[f"{key}/accuracy_barrier"] = accuracy_barrier(curve)
    return metrics


def scan_columns(
    loss: np.ndarray, accuracy: np.ndarray | None, scores: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """A scan's metrics by name: loss, accuracy (where the task has one), the other scores."""
    return {"loss": loss} | ({"accuracy": accuracy} if accuracy is not None else {}) | scores


def as_lists(columns: dict[str, np.ndarray]) -> dict[str, list[Any]]:
    return {name: values.tolist() for name, values in columns.items()}


def curve_table(curve: Curve) -> Table:
    columns = {"alpha": curve.alphas} | scan_columns(curve.loss, curve.accuracy, curve.scores)
    table = Table()
    for column in columns:
        table.add_column(column, justify="right")
    for row in zip(*columns.values()):
        table.add_row(f"{row[0]:.3f}", *(f"{value:.4f}" for value in row[1:]))
    return table


def metrics_text(metrics: Metrics) -> str:
    return "\n".join(f"{key} = {value:.6g}" for key, value in metrics.items())


def write_json(path: Path, content: dict[str, object]) -> Path:
    path.write_text(json.dumps(content, indent=1))
    return path


def log(run: FinishedRun, key: str, metrics: Metrics, files: list[Path]) -> str:
    """Metrics (at the run's last round) and files (under ``analysis/``) into the run; what was
    logged, in words."""
    run.log(metrics)
    for path in files:
        run.log_artifact(path, "analysis")
    artifacts = f" and artifacts {', '.join(f'analysis/{p.name}' for p in files)}" if files else ""
    return f"logged {len(metrics)} metrics under {key}/ at step {run.last_round}{artifacts}"
