"""``raysim runs [EXPERIMENT]``: a store's runs as a table, newest first: name, id, status, start
and the params that tell runs apart (algorithm, rounds, seed, the command line's overrides).

Usage:
    raysim runs                                   # every experiment of ./mlflow.db
    raysim runs quickstart --where variant=fedprox --where seed=1
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from raysim.cli.arg_types import positive_int

WHOLE = ("run id", "status", "start")


def add_parser(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser(
        "runs",
        help="list an MLflow store's runs: name, id, status, start, key params",
        description="Lists the runs of an MLflow store (of one experiment, by name or id), newest "
        "first: the name and id that --resume, raysim analyze and raysim compare take, the status, "
        "the start, the algorithm, the rounds, the seed and the overrides it was run with.",
    )
    runs.add_argument("experiment", nargs="?", help="an experiment's name or id (default: all)")
    add_where(runs)
    runs.add_argument("--limit", type=positive_int, default=50, help="show at most this many (default 50)")
    runs.add_argument(
        "--tracking-uri", help="the store; default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db"
    )
    runs.set_defaults(handler=cmd_runs)


def add_where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only runs whose param (a config key: seed, algorithm.local.lr) or tag (variant, "
        "algorithm) has this value; repeatable, all must hold",
    )


def cmd_runs(args: argparse.Namespace) -> int:
    from raysim.cli.console import console
    from raysim.config import TrackingConfig
    from raysim.results.run_store import STORE_HINT, RunStore
    from raysim.tracking.outbox import outage_as_error
    from raysim.tracking.tracking_store import tracking_uri

    store = RunStore(args.tracking_uri or tracking_uri(TrackingConfig()))
    with outage_as_error(store.uri, "be read", STORE_HINT):  # one line if it dies meanwhile
        found = store.listing(args.experiment, args.where)
        experiments = {e.experiment_id: e.name for e in store.client.search_experiments()}
    shown = found[: max(args.limit, 0)]
    console.print(runs_table(shown, experiments))
    more = f" (the newest {len(shown)} shown: --limit N)" if len(shown) < len(found) else ""
    console.print(f"{len(found)} runs in {store.uri}{more}", soft_wrap=True, highlight=False)
    return 0


def runs_table(runs: list[Any], experiments: dict[str, str]) -> Table:
    from raysim.results.frames import RUN_COLUMNS, run_row

    table = Table(title="raysim runs (newest first)", title_justify="left")
    for column in RUN_COLUMNS:  # ids whole, to copy; the rest folds to fit the terminal
        table.add_column(column, overflow="fold", no_wrap=column in WHOLE)
    for run in runs:
        table.add_row(*run_row(run, experiments))
    return table
