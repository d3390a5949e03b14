"""A paper's table from runs over seeds: rows (methods) by columns (datasets, heterogeneity
levels: any axis), each cell the mean ± sample std (ddof=1) over seeds of one statistic of a
metric's curve, with best-of-grid selection of a hyperparameter on a validation metric.

The selection follows the papers' protocol: for each row and column, every value of the selected
axis (``algorithm.local.lr``) is scored by the mean over seeds of the validation metric's
statistic; the best value is chosen and the cell reports *its* test metric. Choosing on a test
split (``eval/central``, ``eval/clients``, ``eval/transfer``, or the reported metric's own scope)
is refused unless forced: it reports the best of several draws on the test set as if it were one.

Usage:
    runs = [SeedRun(...), ...]                       # raysim.results.grid_runs loads them from MLflow
    table = build_table(runs, "eval/central/accuracy", Statistic.parse("last:3"), columns="alpha",
                        selection=Selection("algorithm.local.lr", "eval/heldout/accuracy"))
    table.cells["fedavg", "0.1"].mean, table.best_row("0.1"), table.rule()
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from raysim.errors import RaysimError
from raysim.results.grid_rounds import check_reached, plural, rounds_of, value_after
from raysim.results.seed_run import Curve, SeedRun

TEST_SCOPES = ("eval/central/", "eval/clients/", "eval/transfer/")  # metrics of test splits
_LOWER_IS_BETTER = re.compile(r"(loss|perplexity|barrier|error)(_mean|_p\d+)?$")
ALL = "all"  # the one column of a table without a column axis


def higher_is_better(metric: str) -> bool:
    """Accuracy and scores rise; losses, perplexities, barriers and error gaps fall."""
    return not _LOWER_IS_BETTER.search(metric)


@dataclass(frozen=True)
class Statistic:
    """What one run contributes: its ``final`` value, its ``best`` value, the mean of its
    ``last:K`` logged values (the last K evaluations), or its value ``at`` a round: after ``count``
    rounds (``raysim.results.grid_rounds``). Values before round 0 are left out but by ``at``."""

    kind: Literal["final", "best", "last", "at"]
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Statistic:
        if text in ("final", "best"):
            return cls(text)  # type: ignore[arg-type]
        match = re.fullmatch(r"last:(\d+)", text)
        if match is None or int(match.group(1)) < 1:
            raise RaysimError(f"--stat {text!r}: use final, best or last:K with K >= 1 (e.g. last:5)")
        return cls("last", int(match.group(1)))

    def of(self, curve: Curve, higher: bool) -> float:
        if self.kind == "at":
            value = value_after(curve, self.count)
            if value is None:  # build_table names the runs first (grid_rounds.check_reached)
                raise RaysimError(f"--at-round {self.count}: a run has no value after {self.count} rounds")
            return value
        values = [v for step, v in curve if step >= 0] or [v for _, v in curve]
        if self.kind == "final":
            return values[-1]
        if self.kind == "best":
            return max(values) if higher else min(values)
        return float(np.mean(values[-self.count :]))

    def describe(self) -> str:
        if self.kind == "final":
            return "final value"
        if self.kind == "best":
            return "best value over rounds"
        if self.kind == "at":
            return f"value after {self.count} {'round' if self.count == 1 else 'rounds'}"
        return f"mean of the last {self.count} logged values"


@dataclass(frozen=True)
class Selection:
    """Best-of-grid: ``axis`` chosen per row and column on ``metric``'s statistic, mean over seeds.
    ``axis`` may name several axes, comma-separated (``algorithm.local.lr,algorithm.server.lr``):
    their combinations are the candidates, chosen jointly, as a paper tunes two learning rates."""

    axis: str
    metric: str
    force_test: bool = False  # choose on a test metric anyway (says so in the rule)

    @property
    def axes(self) -> list[str]:
        return [a.strip() for a in self.axis.split(",")]


@dataclass(frozen=True)
class Cell:
    """One row and column: the finished runs of the chosen value, in seed order."""

    runs: tuple[SeedRun, ...]
    values: tuple[float, ...]  # the statistic of each run
    num_failed: int = 0
    chosen: str | None = None  # the selected axis's value
    scores: Mapping[str, float] = field(default_factory=dict)  # each candidate's validation mean

    @property
    def seeds(self) -> tuple[str, ...]:
        return tuple(str(r.value("seed")) for r in self.runs)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def std(self) -> float:
        """The sample standard deviation (ddof=1); nan for fewer than two seeds."""
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan


@dataclass(frozen=True)
class GridTable:
    metric: str
    statistic: Statistic
    row_axis: str
    column_axis: str | None
    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], Cell]
    selection: Selection | None = None

    @property
    def higher_is_better(self) -> bool:
        return higher_is_better(self.metric)

    def best_row(self, column: str) -> str | None:
        """The row with the best mean in ``column`` (the first on a tie); None if no cell has one."""
        means = {r: self.cells[r, column].mean for r in self.rows if (r, column) in self.cells}
        means = {r: m for r, m in means.items() if not math.isnan(m)}
        if not means:
            return None
        pick = max if self.higher_is_better else min
        return pick(means, key=lambda r: means[r])

    def rule(self) -> list[str]:
        """The table's rule in words: metric, statistic, std, marks, and the selection made."""
        direction = "higher" if self.higher_is_better else "lower"
        lines = [
            f"metric: {self.metric}, {self.statistic.describe()} of each run; cells: mean ± sample "
            f"std (ddof=1) over seeds, n = finished seeds; best per column marked ({direction} is "
            f"better); † = the cell has failed seeds (left out of its mean)"
        ]
        if self.selection is not None:
            s = self.selection
            better = "highest" if higher_is_better(s.metric) else "lowest"
            forced = " (forced: a TEST metric, the table is optimistic)" if s.force_test else ""
            lines.append(
                f"selection: {s.axis} chosen per {self.row_axis} and column by the {better} mean over "
                f"seeds of {s.metric} ({self.statistic.describe()}){forced}; each cell reports the "
                f"chosen value's {self.metric}"
            )
        return lines


def build_table(
    runs: Sequence[SeedRun],
    metric: str,
    statistic: Statistic,
    rows: str = "variant",
    columns: str | None = None,
    selection: Selection | None = None,
) -> GridTable:
    """The table of ``runs``; checks placement, metrics and duplicates first.

    Raises:
        RaysimError: no runs; a declared axis varies but has no place; finished runs lack a metric;
            two runs share every axis; selection on a test metric without ``force_test``.
    """
    if not runs:
        raise RaysimError("no runs to report: name a sweep, an experiment or run ids")
    if selection is not None:
        check_selection(selection, metric)
    placed = {rows, "seed", *([columns] if columns else []), *(selection.axes if selection else [])}
    check_placed(runs, placed)
    needed = [metric, *([selection.metric] if selection else [])]
    check_metrics(runs, needed)
    if statistic.kind == "at":
        check_reached(runs, needed, statistic.count)
    groups = group_runs(runs, rows, columns, selection.axes if selection else [])
    row_values = ordered(k[0] for k in groups)
    column_values = ordered(k[1] for k in groups)
    cells = {}
    for row in row_values:
        for column in column_values:
            candidates = {k[2]: group for k, group in groups.items() if k[:2] == (row, column)}
            if candidates:
                cells[row, column] = choose(candidates, metric, statistic, selection)
    return GridTable(metric, statistic, rows, columns, row_values, column_values, cells, selection)


def check_selection(selection: Selection, metric: str) -> None:
    scope = metric.rsplit("/", 1)[0] + "/"
    is_test = selection.metric.startswith(TEST_SCOPES) or selection.metric.startswith(scope)
    if is_test and not selection.force_test:
        raise RaysimError(
            f"--on {selection.metric}: a test metric ({', '.join(TEST_SCOPES)} or the reported "
            f"{scope}); choose on validation data: eval/validation/... (dataset.validation_fraction) or "
            f"eval/heldout/... (evaluation.heldout_fraction); --force-test-selection to choose on it anyway"
        )


def mixed_lengths(table: GridTable) -> str | None:
    """One warning line when a column of ``table`` mixes runs of different lengths (in rounds, of
    its metric's curve, ``raysim.results.grid_rounds``), naming how many runs have which length;
    None when none does."""
    lengths: dict[str, list[int]] = {}
    for (_, column), cell in table.cells.items():
        lengths.setdefault(column, []).extend(rounds_of(r.curves[table.metric]) for r in cell.runs)
    if all(len(set(found)) < 2 for found in lengths.values()):
        return None
    counts = Counter(n for found in lengths.values() for n in found)
    listed = ", ".join(
        f"{count} {plural(count, 'run')} of {n} {plural(n, 'round')}" for n, count in sorted(counts.items())
    )
    return (
        f"warning: runs of different lengths share a column ({listed}), so a cell mixes values of "
        "different rounds; --at-round R reports every run after R rounds"
    )


def check_placed(runs: Sequence[SeedRun], placed: set[str]) -> None:
    """Every declared axis that takes several values must be a row, column, seed or selection."""
    unplaced = {}
    for axis in sorted({a for r in runs for a in r.axes} - placed):
        values = ordered(str(r.axes.get(axis)) for r in runs)
        if len(values) > 1:
            unplaced[axis] = values
    if unplaced:
        listed = "; ".join(f"{a} ({', '.join(v)})" for a, v in unplaced.items())
        raise RaysimError(
            f"the runs differ in {listed}: place each with --rows, --columns or --select AXIS --on "
            f"METRIC (else a cell would average different settings)"
        )


def check_metrics(runs: Sequence[SeedRun], metrics: Sequence[str]) -> None:
    """Finished runs must all have logged every metric; one error names the runs that did not."""
    for metric in metrics:
        missing = [r.name for r in runs if not r.failed and not r.curves.get(metric)]
        if missing:
            logged = sorted({k for r in runs for k in {*r.logged, *r.curves} if k.startswith("eval/")})
            raise RaysimError(
                f"{metric} is not logged by {len(missing)} of {len(runs)} runs: {', '.join(missing)}; "
                f"report a metric all of them logged (evaluation metrics: {', '.join(logged) or 'none'})"
            )


Group = dict[tuple[str, str, str], list[SeedRun]]


def group_runs(runs: Sequence[SeedRun], rows: str, columns: str | None, select: Sequence[str] = ()) -> Group:
    """Runs by (row, column, candidate), each in seed order; two runs of one seed are an error. A
    candidate is the selected axes' values, joined by ``", "``."""
    groups: Group = {}
    for axis in [rows, "seed", *([columns] if columns else []), *select]:
        lacking = [r.name for r in runs if r.value(axis) is None]
        if lacking:
            raise RaysimError(f"no {axis!r} axis or param in runs {', '.join(lacking)}; name another axis")
    for run in runs:
        key = (
            str(run.value(rows)),
            str(run.value(columns)) if columns else ALL,
            ", ".join(str(run.value(axis)) for axis in select),
        )
        groups.setdefault(key, []).append(run)
    for key, group in groups.items():
        seeds = [str(r.value("seed")) for r in group]
        twice = [r for r, s in zip(group, seeds) if seeds.count(s) > 1]
        if twice:
            names = ", ".join(r.name for r in twice)
            raise RaysimError(f"runs {names} share {rows}, seed{differing(twice, {rows, 'seed'})}")
        order = ordered(seeds)
        group.sort(key=lambda r: order.index(str(r.value("seed"))))
    return groups


def differing(runs: Sequence[SeedRun], placed: set[str]) -> str:
    """``but differ in KEY (a, b): ...``: the params a set of runs differs in (their own
    folders and names left out), or ``: report them apart`` when they differ in none."""
    keys = sorted({k for r in runs for k in r.params if not k.startswith("tracking.")} - placed)
    differ = {k: ordered(str(r.params.get(k)) for r in runs) for k in keys}
    listed = [f"{k} ({', '.join(v)})" for k, v in differ.items() if len(v) > 1][:4]
    if not listed:
        return " and every axis: report them apart"
    return f" and every axis but differ in {'; '.join(listed)}: place these with --columns or --select"


def choose(
    candidates: dict[str, list[SeedRun]], metric: str, statistic: Statistic, selection: Selection | None
) -> Cell:
    """The cell of the candidate with the best validation mean (the only one without selection)."""
    chosen = next(iter(candidates))
    scores = {}
    if selection is not None:
        higher = higher_is_better(selection.metric)
        for value, group in candidates.items():
            validation = [statistic.of(r.curves[selection.metric], higher) for r in group if not r.failed]
            if validation and not np.isnan(validation).any():  # a diverged value is never chosen
                scores[value] = float(np.mean(validation))
        if scores:
            best = max if higher else min
            chosen = best(ordered(scores), key=lambda v: scores[v])  # the first of equal scores
    group = candidates[chosen]
    finished = tuple(r for r in group if not r.failed)
    higher = higher_is_better(metric)
    return Cell(
        runs=finished,
        values=tuple(statistic.of(r.curves[metric], higher) for r in finished),
        num_failed=len(group) - len(finished),
        chosen=chosen if selection is not None else None,
        scores=scores,
    )


def ordered(values: Iterable[object]) -> list[str]:
    """Distinct values: numerically sorted when all are numbers, else in order of appearance."""
    distinct = list(dict.fromkeys(str(v) for v in values))
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return distinct


def keep_runs(runs: Sequence[SeedRun], where: Sequence[str]) -> list[SeedRun]:
    """The runs that meet every condition: ``KEY=VALUE`` (the run's axis or param KEY has VALUE)
    or ``KEY!=VALUE`` (it has not), values compared as numbers when both are (``0.10`` = ``0.1``).

    Raises:
        RaysimError: a condition that is neither form, or no run meeting them all.
    """
    conditions = []
    for item in where:
        key, sep, value = item.partition("=")
        negated = key.endswith("!")
        key = key.removesuffix("!")
        if not sep or not key:
            raise RaysimError(f"--where {item!r}: expected KEY=VALUE or KEY!=VALUE (--where variant!=local)")
        conditions.append((key, value, negated))
    kept = [r for r in runs if all(_same(r.value(k), v) != negated for k, v, negated in conditions)]
    if not kept:
        raise RaysimError(f"no run has {' and '.join(where)}")
    return kept


def _same(found: str | None, wanted: str) -> bool:
    if found is None:
        return False
    try:
        return found == wanted or float(found) == float(wanted)
    except ValueError:
        return False
