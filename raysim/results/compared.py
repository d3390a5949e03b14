"""Runs compared: their records, the curves to draw, and the final metrics as a DataFrame.

``raysim compare`` prints and writes a ``Comparison``; ``raysim.compare`` returns one, for a
notebook: ``.table`` (pandas), ``.figure()`` (matplotlib), ``.cost`` (pandas, with ``cost=True``).

Usage:
    comparison = compare_runs(RunStore(uri), ["quickstart"], metrics=["accuracy"])
    comparison.table, comparison.figure()
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raysim.engine.plots import Panel, curves_figure
from raysim.errors import RaysimError
from raysim.results.cost_table import COST_KEYS, cost_csv, has_costs
from raysim.results.run_store import RunStore, matches, parse_where
from raysim.results.tables import RunRecord, curve_panels, describe, final_csv

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

TITLE = "raysim compare: "


@dataclass(frozen=True)
class Comparison:
    """Runs side by side: ``records`` (final metrics, histories), ``panels`` (the curves of the
    metrics asked for), ``notes`` (on names that matched several runs)."""

    records: list[RunRecord]
    panels: list[Panel]
    notes: list[str]

    @property
    def names(self) -> list[str]:
        return [record.name for record in self.records]

    @property
    def table(self) -> pd.DataFrame:
        """One row per run, one column per final metric (the columns ``final_metrics.csv`` has)."""
        return _frame(final_csv(self.records))

    @property
    def cost(self) -> pd.DataFrame | None:
        """One row per run, one column per cost metric; None where no run logged costs."""
        return _frame(cost_csv(self.records)) if has_costs(self.records) else None

    def figure(self) -> Figure | None:
        """The overlaid learning curves; None where the runs logged no per-round evaluation."""
        return curves_figure(self.panels, TITLE + ", ".join(self.names)) if self.panels else None


def compare_runs(
    store: RunStore | None,
    targets: Sequence[str],
    metrics: Sequence[str] | None = None,
    where: Sequence[str] = (),
    over_seeds: bool = False,
    cost: bool = False,
    records: Sequence[RunRecord] = (),
    x: str | None = None,
) -> Comparison:
    """The runs ``targets`` name in ``store`` (run ids, run names, experiments), those matching
    every ``where`` condition, after the ``records`` of runs already at hand; their curves against
    the round, or against the logged metric ``x`` (``sys/sim_clock_s``: the simulated clock).

    Raises:
        RaysimError: no run matches, or no run logged a metric asked for (naming those logged).
    """
    found: list[RunRecord] = list(records)
    notes: list[str] = []
    if targets:
        assert store is not None, "targets are read from a store"
        runs, notes = store.resolve(targets)
        if where:
            conditions = parse_where(where)
            runs = [run for run in runs if matches(run, conditions)]
            if not runs:
                raise RaysimError(f"no run of {', '.join(targets)} has {' and '.join(where)}")
        fetched = store.records(runs, metrics, (*(COST_KEYS if cost else ()), *([x] if x else [])))
        if over_seeds:
            from raysim.results.seed_groups import over_seeds as seed_means

            fetched = seed_means(runs, fetched)
        found += fetched
    if x and not any(x in metrics_of_round for r in found for _, metrics_of_round in r.history):
        raise RaysimError(  # else every curve went missing, blamed on the runs' evaluation
            f"--x {x}: no compared run logged it; an x axis is a metric logged every round "
            f"(e.g. sys/bytes_up, or sys/sim_clock_s with a system: section)"
        )
    panels = curve_panels(found, metrics, x)
    missing = [m for m in metrics or [] if m not in {p.metric for p in panels}]
    if missing:
        raise RaysimError(
            f"no compared run logged {', '.join(missing)}; their evaluation metrics: "
            f"{', '.join(describe(found)) or 'none'} (or name a full key such as train/loss)"
        )
    return Comparison(found, panels, notes)


def _frame(text: str) -> pd.DataFrame:
    import pandas as pd

    return pd.read_csv(io.StringIO(text), dtype={"run": str, "run_id": str})
