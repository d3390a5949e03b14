"""``raysim compare RUN_OR_EXPERIMENT ...``: finished runs side by side (docs/compare.md).

Prints a table of final metrics in the columns of the runs' task (accuracy, perplexity or loss;
held-out, personalized and transfer results where logged), draws the runs' learning curves on
shared axes with the 10th-90th percentile over clients shaded, writes both as files (PNG, CSV,
Markdown) and logs them as an MLflow run ``compare/<names>`` tagged
``raysim.kind=comparison`` in the first run's experiment: one run per set of runs and options,
reused when they are compared again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from raysim.cli.arg_types import output_folder
from raysim.cli.home import raysim_home
from raysim.cli.runs import add_where

if TYPE_CHECKING:
    from raysim.results.tables import RunRecord

CURVES, TABLE_CSV, TABLE_MD = "curves.png", "final_metrics.csv", "final_metrics.md"
COST_CSV, COST_MD = "cost.csv", "cost.md"


def add_parser(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser(
        "compare",
        help="final metrics and overlaid learning curves of runs, logged to MLflow",
        description="Compares MLflow runs: RUN_OR_EXPERIMENT is a run id, a run name (the latest "
        "run of that name) or an experiment name or id (all its finished runs); mix them freely. "
        "Prints the final metrics in the columns of the runs' task, writes the learning curves "
        "(PNG; shaded: 10th-90th percentile over clients) and the table (CSV, Markdown), and logs "
        "them as a run compare/<names> in the first run's experiment (the same runs and options "
        "compared again reuse it).",
    )
    compare.add_argument("targets", nargs="+", metavar="RUN_OR_EXPERIMENT")
    compare.add_argument(
        "--metric",
        action="append",
        help="curve metric, repeatable: a name (accuracy, perplexity, loss, mcc, ...) drawn for the "
        "clients, the central test set and the held-out clients, or a full key (train/loss); "
        "default: accuracy, perplexity for language models, loss for regression",
    )
    compare.add_argument(
        "--output-dir",
        "--out",
        dest="out",
        type=output_folder,
        help="folder for the files (default: $RAYSIM_HOME or .raysim, then compare/<runs>)",
    )
    compare.add_argument(
        "--tracking-uri", help="the runs' store; default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db"
    )
    add_where(compare)
    compare.add_argument(
        "--over-seeds",
        action="store_true",
        help="runs that differ only in their seed as one row (and curve): the mean over the seeds",
    )
    compare.add_argument(
        "--cost",
        action="store_true",
        help="also a cost table: seconds and peak memory of a client update, MACs per example, "
        "parameters and bytes sent up and down, inference cost of the final predictor",
    )
    compare.add_argument(
        "--x",
        metavar="KEY",
        help="draw the curves against a logged metric instead of the round, e.g. sys/sim_clock_s "
        "(the simulated clock of a system: section: synchronous and asynchronous runs on one axis)",
    )
    compare.add_argument("--no-log", action="store_true", help="write the files only; log no MLflow run")
    compare.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from raysim.cli.console import console
    from raysim.config import TrackingConfig
    from raysim.engine.plots import overlaid_curves
    from raysim.results.compared import TITLE, compare_runs
    from raysim.results.run_store import RunStore
    from raysim.results.tables import markdown, summary_tables, write_csv
    from raysim.tracking.tracking_store import tracking_uri

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr stays for errors
    store = RunStore(args.tracking_uri or tracking_uri(TrackingConfig()))
    comparison = compare_runs(
        store, args.targets, args.metric, args.where, args.over_seeds, args.cost, x=args.x
    )
    records = comparison.records
    for note in comparison.notes:
        console.print(f"note: {note}", soft_wrap=True, highlight=False)
    console.print(summary_tables(records, "raysim compare (final metrics)"))

    names = comparison.names
    folder = Path(args.out) if args.out else default_folder(names, [str(r.run_id) for r in records])
    folder.mkdir(parents=True, exist_ok=True)
    files = [write_csv(records, folder / TABLE_CSV), folder / TABLE_MD]
    files[1].write_text(markdown(records))
    if comparison.panels:
        files.append(overlaid_curves(comparison.panels, TITLE + shorten(", ".join(names)), folder / CURVES))
    else:  # e.g. runs with evaluation off: nothing per round to draw
        console.print("no curves: the runs logged no per-round evaluation", highlight=False)
    if args.cost:
        files += cost_files(records, folder)
    console.print(f"wrote {', '.join(str(f) for f in files)}", soft_wrap=True, highlight=False)
    if not args.no_log:
        options = [f"metric={m}" for m in args.metric or []] + (["cost"] if args.cost else [])
        options += [f"x={args.x}"] if args.x else []
        run = store.log_comparison(records, files, options)
        console.print(
            f"logged as MLflow run {run.info.run_id} ({run.info.run_name}): "
            f"{store.link(run.info.experiment_id, run.info.run_id)}",
            soft_wrap=True,
            highlight=False,
        )
    return 0


def cost_files(records: Sequence[RunRecord], folder: Path) -> list[Path]:
    """Prints the cost table and writes it (CSV, Markdown); none where no run logged a cost."""
    from raysim.cli.console import console
    from raysim.results.cost_table import cost_markdown, cost_table, has_costs, write_cost_csv

    if not has_costs(records):
        console.print("no cost table: the runs logged no cost metrics (sys/params_up, ...)", highlight=False)
        return []
    console.print(cost_table(records, "raysim compare (cost)"))
    markdown = folder / COST_MD
    markdown.write_text(cost_markdown(records))
    return [write_cost_csv(records, folder / COST_CSV), markdown]


def default_folder(names: Sequence[str], run_ids: Sequence[str]) -> Path:
    """``<RAYSIM_HOME or .raysim>/compare/<names>-<hash of the run ids>``: the same runs compared
    again overwrite their files, other runs get another folder."""
    slug = re.sub(r"[^\w.-]+", "-", "_vs_".join(names))[:60].strip("-")
    digest = hashlib.sha1(",".join(run_ids).encode()).hexdigest()[:8]
    return Path(raysim_home()) / "compare" / f"{slug}-{digest}"


def shorten(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
