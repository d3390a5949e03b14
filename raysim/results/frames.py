"""Finished runs from Python: ``raysim.runs``, ``raysim.compare`` and ``raysim.report`` give what
``raysim runs``, ``compare`` and ``report`` print, as pandas DataFrames and matplotlib figures
(docs/python-api.md). Each calls the functions its command calls; none logs anything to MLflow.

Usage:
    raysim.runs("quickstart", where=["seed=0"])             # a DataFrame, newest first
    comparison = raysim.compare("quickstart")               # or RunResults from raysim.run
    comparison.table, comparison.figure()
    raysim.report("my-sweep", metric="eval/central/accuracy", columns="dataset.partition.alpha")
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raysim.errors import RaysimError
from raysim.results.compared import Comparison, compare_runs
from raysim.results.run_store import STORE_HINT, RunStore, started
from raysim.results.tables import RunRecord
from raysim.tracking.lineage import NUM_ROUNDS  # a continued run's current engine.num_rounds

if TYPE_CHECKING:
    import pandas as pd

    from raysim.engine.loop import RunResult

RUN_COLUMNS = ("name", "run id", "status", "start", "experiment", "algorithm", "rounds", "seed", "overrides")


def runs(
    experiment: str | None = None,
    where: Sequence[str] = (),
    limit: int | None = None,
    tracking_uri: str | None = None,
) -> pd.DataFrame:
    """A store's runs (of one experiment, by name or id), newest first, one row each with the
    columns of ``raysim runs``; ``where`` holds ``key=value`` conditions on params and tags.

    Raises:
        RaysimError: no store, no such experiment, a condition that is no ``key=value``.
    """
    import pandas as pd

    from raysim.tracking.outbox import outage_as_error

    store = _store(tracking_uri)
    with outage_as_error(store.uri, "be read", STORE_HINT):
        found = store.listing(experiment, where)
        experiments = {e.experiment_id: e.name for e in store.client.search_experiments()}
    rows = [run_row(run, experiments) for run in found[:limit]]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def run_row(run: Any, experiments: dict[str, str]) -> list[str]:
    """An MLflow run's cells in ``RUN_COLUMNS`` order (``raysim runs`` prints the same)."""
    from raysim.tracking.provenance import OVERRIDES

    params, tags = run.data.params, run.data.tags
    return [
        run.info.run_name or "",
        run.info.run_id,
        run.info.status,
        started(run),
        experiments.get(run.info.experiment_id, run.info.experiment_id),
        tags.get("algorithm") or params.get("algorithm.name", ""),
        tags.get(NUM_ROUNDS) or params.get("engine.num_rounds", ""),
        params.get("seed", ""),
        tags.get(OVERRIDES, ""),
    ]


def compare(
    *targets: str | RunResult,
    metrics: Sequence[str] | None = None,
    where: Sequence[str] = (),
    over_seeds: bool = False,
    cost: bool = False,
    tracking_uri: str | None = None,
) -> Comparison:
    """Runs side by side, as ``raysim compare`` shows them: each target a run id, a run name, an
    experiment (all its finished runs), or a ``RunResult`` of ``raysim.run`` (no MLflow needed).
    The result's ``table`` and ``cost`` are DataFrames, ``figure()`` the overlaid curves of
    ``metrics`` (default: the task's main metric).

    Raises:
        RaysimError: no run matches, or no run logged a metric asked for.
    """
    from raysim.engine.loop import RunResult

    names = [t for t in targets if isinstance(t, str)]
    results = [RunRecord.of_result(t) for t in targets if isinstance(t, RunResult)]
    store = _store(tracking_uri) if names else None
    return compare_runs(store, names, metrics, where, over_seeds, cost, records=results)


def report(
    *targets: str,
    metric: str,
    rows: str = "variant",
    columns: str | None = None,
    where: Sequence[str] = (),
    stat: str = "final",
    select: str | None = None,
    on: str | None = None,
    tracking_uri: str | None = None,
) -> pd.DataFrame:
    """``raysim report``'s table over seeds as a DataFrame, one row per cell: ``row``, ``column``,
    ``mean``, ``std`` (sample, over seeds), ``num_seeds``, ``num_failed``, ``best``, ``chosen`` (with
    ``select``/``on``), ``seeds`` and ``values``; ``df.pivot(index="row", columns="column",
    values="mean")`` lays it out as the printed table.

    Raises:
        RaysimError: as ``raysim report``: no runs, a test metric to select on, an axis no run has.
    """
    import pandas as pd

    from raysim.results.grid_render import csv_text
    from raysim.results.grid_runs import load_runs
    from raysim.results.grid_table import Selection, Statistic, build_table, keep_runs
    from raysim.tracking.outbox import outage_as_error

    if (select is None) != (on is None):
        raise RaysimError(
            "select= and on= go together (select='algorithm.local.lr', on='eval/heldout/accuracy')"
        )
    store = _store(tracking_uri)
    selection = Selection(select, on) if select is not None and on is not None else None
    with outage_as_error(store.uri, "be read", STORE_HINT):
        found, _ = load_runs(store, targets, [metric, *([on] if on else [])])
    found = keep_runs(found, where) if where else found
    table = build_table(found, metric, Statistic.parse(stat), rows, columns, selection)
    return pd.read_csv(io.StringIO(csv_text(table)), dtype={"row": str, "column": str})


def _store(uri: str | None) -> RunStore:
    """The store at ``uri``, else MLFLOW_TRACKING_URI's, else ./mlflow.db (as the commands read)."""
    from raysim.config import TrackingConfig
    from raysim.tracking.tracking_store import tracking_uri

    return RunStore(uri or tracking_uri(TrackingConfig()))
