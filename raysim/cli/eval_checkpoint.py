"""``raysim eval CHECKPOINT_OR_RUN [key=value ...]``: a checkpoint's global model evaluated, no
training, logged as a child MLflow run of its run (``raysim.results.checkpoint_eval``) and printed
as a table."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from raysim.cli.console import console

if TYPE_CHECKING:  # imported when the command runs: `raysim --help` stays fast
    from raysim.results.checkpoint_eval import CheckpointEvaluation


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "eval",
        help="evaluate a checkpoint's global model (no training), as a child MLflow run of its run",
        description="Evaluates the global model of a checkpoint (a final.pt or round_NNNNN.pt, a run "
        "folder's final.pt, or an MLflow run's) with its job's evaluation: central test set, clients' "
        "test splits, held-out clients, personalization, transfer datasets. Overrides may change "
        "evaluation.* (not heldout_fraction), resources.* and tracking.*; the model and the data "
        "partition are the checkpoint's. Logs a run named <run>/eval, a child of the checkpoint's "
        "run, at the checkpoint's round.",
    )
    parser.add_argument(
        "target", metavar="CHECKPOINT_OR_RUN", help="a checkpoint file, a run folder or an MLflow run id"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="evaluation.*, resources.*, tracking.* overrides, e.g. evaluation.clients=50",
    )
    parser.add_argument(
        "--tracking-uri",
        help="the store of the run (a run id's, and where the evaluation goes); default: the "
        "store the checkpoint's run logged to, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db",
    )
    parser.set_defaults(handler=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from raysim.results.checkpoint_eval import evaluate_checkpoint, find_checkpoint

    with tempfile.TemporaryDirectory(prefix="raysim-eval-") as scratch:  # a downloaded final.pt
        path = find_checkpoint(args.target, args.tracking_uri, Path(scratch))
        result = evaluate_checkpoint(path, args.overrides, args.tracking_uri)
    console.print(metrics_table(result))
    console.print(logged_where(result), soft_wrap=True, highlight=False)
    return 0


def metrics_table(result: CheckpointEvaluation) -> Table:
    """The evaluation's metrics, one row each, in name order."""
    table = Table(title=f"{result.job.name}: {result.checkpoint} (round {result.round_num})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(result.metrics.items()):
        table.add_row(key, f"{value:.6g}")
    return table


def logged_where(result: CheckpointEvaluation) -> str:
    """One line: the MLflow run the evaluation went to, and how it relates to the source run."""
    if result.run_id is None:
        return "not logged: tracking.enabled is false"
    where = (
        f"logged {len(result.metrics)} metrics at step {result.round_num} to MLflow run "
        f"{result.run_id} ({result.job.tracking.run_name})"
    )
    if result.is_child:
        return f"{where}, a child of run {result.source_run_id}"
    if result.source_run_id is not None:
        return f"{where}, tagged parent_run {result.source_run_id} (its store is another one)"
    return f"{where}; the checkpoint names no run (tracking was off when it was written)"
