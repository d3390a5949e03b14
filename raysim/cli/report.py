"""``raysim report SWEEP_OR_RUNS --metric KEY``: a paper's table over seeds (docs/reports.md).

Rows are methods (``--rows``, default the variant), columns any axis (``--columns``), cells the
mean ± sample std over seeds of the metric's final, best or last-K value, the best per column
marked; ``--select AXIS --on METRIC`` chooses a hyperparameter per row and column on validation
data and reports the choice's test metric. Writes the table (Markdown, LaTeX, CSV), optionally
learning curves with a band over seeds, and logs them to the sweep's parent run (or a report run).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from raysim.cli.arg_types import finite_float, non_negative_int, output_folder
from raysim.cli.home import raysim_home

if TYPE_CHECKING:
    from raysim.results.grid_table import Statistic

FORMATS = ("markdown", "latex", "csv")
FILES = {"markdown": "table.md", "latex": "table.tex", "csv": "table.csv"}
CURVES = "curves.png"


def add_parser(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser(
        "report",
        help="a paper-style table (mean ± std over seeds) of a sweep or runs, logged to MLflow",
        description="Tabulates a sweep (its id, or its parent run's id or name) or any runs (run ids, "
        "run names, experiments): rows --rows, columns --columns, each cell the mean ± sample std "
        "(ddof=1) over seeds of --stat of --metric, with the number of finished seeds (a † marks "
        "failed ones) and the best per column in bold. --select AXIS --on METRIC picks AXIS per row "
        "and column by the validation METRIC's mean over seeds and reports that choice's --metric.",
    )
    report.add_argument("targets", nargs="+", metavar="SWEEP_OR_RUNS")
    report.add_argument("--metric", required=True, help="the reported metric, e.g. eval/central/accuracy")
    report.add_argument("--rows", default="variant", help="the rows' axis (default: variant)")
    report.add_argument(
        "--columns", help="the columns' axis: a sweep axis or param, e.g. dataset.partition.alpha"
    )
    report.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only runs whose axis or param KEY has VALUE (KEY!=VALUE: has not); "
        "repeatable, all must hold, e.g. --where variant!=local",
    )
    report.add_argument("--stat", default="final", help="final, best, or last:K (mean of the last K values)")
    report.add_argument(
        "--at-round",
        type=non_negative_int,
        metavar="R",
        help="each run's value after R rounds (logged at round R-1; 0: the initial model), not its "
        "--stat; refused when a run did not reach R",
    )
    report.add_argument("--select", metavar="AXIS", help="the hyperparameter to choose per row and column")
    report.add_argument(
        "--on",
        metavar="METRIC",
        help="the validation metric --select chooses on, e.g. eval/heldout/accuracy (never a test metric)",
    )
    report.add_argument(
        "--force-test-selection",
        action="store_true",
        help="let --on be a test metric (the table overstates every method)",
    )
    report.add_argument("--format", choices=FORMATS, default="markdown", help="what is printed")
    report.add_argument("--paired", nargs=2, metavar=("A", "B"), help="two rows compared seed by seed")
    report.add_argument("--curves", action="store_true", help="learning curves, mean ± std over seeds (PNG)")
    report.add_argument("--target", type=finite_float, help="add rounds to reach this value of --metric")
    report.add_argument("--cost", action="store_true", help="add wall seconds and MB sent up and down")
    report.add_argument(
        "--output-dir",
        "--out",
        dest="out",
        type=output_folder,
        help="folder for the files (default: $RAYSIM_HOME or .raysim, then report/<hash>)",
    )
    report.add_argument(
        "--tracking-uri", help="the runs' store; default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db"
    )
    report.add_argument("--no-log", action="store_true", help="write the files only; log nothing to MLflow")
    report.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from raysim.cli.console import console, err_console
    from raysim.config import TrackingConfig
    from raysim.errors import RaysimError
    from raysim.results import grid_render as render
    from raysim.results.cost_table import COST_KEYS
    from raysim.results.grid_cost import cell_cost
    from raysim.results.grid_paired import paired
    from raysim.results.grid_runs import load_runs, log_report
    from raysim.results.grid_table import Selection, Statistic, build_table, keep_runs, mixed_lengths
    from raysim.results.run_store import STORE_HINT, RunStore
    from raysim.tracking.outbox import outage_as_error
    from raysim.tracking.tracking_store import tracking_uri

    def say(line: str) -> None:  # notes on stderr: stdout is the table (CSV with --format csv)
        err_console.print(line, soft_wrap=True, highlight=False, markup=False)

    if (args.select is None) != (args.on is None):
        raise RaysimError(
            "--select AXIS and --on VALIDATION_METRIC go together (e.g. --select "
            "algorithm.local.lr --on eval/heldout/accuracy)"
        )
    statistic = Statistic.parse(args.stat) if args.at_round is None else at_round(args)
    selection = Selection(args.select, args.on, args.force_test_selection) if args.select else None
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    store = RunStore(args.tracking_uri or tracking_uri(TrackingConfig()))
    metrics = [args.metric, *([args.on] if args.on else []), *(COST_KEYS if args.cost else [])]
    with outage_as_error(store.uri, "be read", STORE_HINT):  # one line if it dies meanwhile
        runs, parent = load_runs(store, args.targets, metrics, say)
    runs = keep_runs(runs, args.where) if args.where else runs
    table = build_table(runs, args.metric, statistic, args.rows, args.columns, selection)
    if statistic.kind != "at" and (warning := mixed_lengths(table)) is not None:
        say(warning)

    markdown = render.markdown(table)
    if args.paired:
        markdown += render.paired_markdown(paired(table, *args.paired))
    if args.cost or args.target is not None:
        costs = {key: cell_cost(cell, args.metric, args.target) for key, cell in table.cells.items()}
        markdown += render.cost_markdown(table, costs, args.target)
    texts = {"markdown": markdown, "latex": render.latex(table), "csv": render.csv_text(table)}
    console.print(texts[args.format], soft_wrap=True, highlight=False, markup=False)

    options = [f"{k}={v}" for k, v in sorted(vars(args).items()) if k not in ("handler", "out", "format")]
    folder = Path(args.out) if args.out else default_folder(sorted(r.run_id for r in runs), options)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for name, text in texts.items():
        files.append(folder / FILES[name])
        files[-1].write_text(text)
    if args.curves:
        files.append(render.seed_band_curves(table, folder / CURVES))
    console.print(f"wrote {', '.join(str(f) for f in files)}", soft_wrap=True, highlight=False)
    if not args.no_log:
        with outage_as_error(store.uri, "take the report", "pass --no-log"):
            logged = log_report(store, runs, parent, files, options, markdown)
        where = "the sweep's run" if parent is not None else "report run"
        console.print(
            f"logged to {where} {logged.info.run_id}: "
            f"{store.link(logged.info.experiment_id, logged.info.run_id)}",
            soft_wrap=True,
            highlight=False,
        )
    return 0


def at_round(args: argparse.Namespace) -> Statistic:
    """``--at-round R``'s statistic; it replaces ``--stat``, so both at once are refused."""
    from raysim.errors import RaysimError
    from raysim.results.grid_table import Statistic

    if args.stat != "final":
        raise RaysimError(
            f"--at-round {args.at_round} and --stat {args.stat}: give one (each run's value after R "
            "rounds, or its --stat)"
        )
    return Statistic("at", args.at_round)


def default_folder(run_ids: list[str], options: list[str]) -> Path:
    """``<RAYSIM_HOME or .raysim>/report/<hash of the runs and options>``."""
    digest = hashlib.sha1("|".join([*run_ids, *options]).encode()).hexdigest()[:10]
    return Path(raysim_home()) / "report" / digest
