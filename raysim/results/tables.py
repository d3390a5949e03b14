"""Runs side by side: a final-metrics table and overlaid learning curves that fit the task.

The task is read from the metrics a run logged: a causal LM logs ``perplexity``, a classifier
``accuracy``, a regressor neither. Each task gets its own columns:

- classification: central accuracy, client accuracy (example-weighted) ± its std over clients
  and its 10th-90th percentile over clients, held-out accuracy, personalized accuracy per
  fraction, transfer sets, the dataset's scores (MCC, F1, Pearson), train loss;
- causal LM: the same in perplexity (FedFish's metric; Dhawan et al., arXiv:2306.05591), central,
  client (of the pooled loss) with p10-p90, held-out, personalized, transfer;
- regression: the same in loss, with the dataset's scores (Pearson);

then rounds, wall time and clients per second. A column no run has a value for is left out, so
a run without held-out clients shows no held-out column.

Perplexity is ``exp(loss)`` of a per-token cross-entropy (``raysim.measure.pooling.perplexity``). Where a
run logged the loss only (the personalized and p10/p90 entries), the perplexity is derived from
it: ``exp`` is increasing, so the 10th percentile of the clients' perplexities is ``exp`` of the
10th percentile of their losses (exact at a sample; numpy's linear interpolation between two
samples differs slightly).

Usage:
    records = [RunRecord.of_result(r) for r in results]  # or raysim.results.run_store
    console.print(summary_tables(records, "raysim runs"))
    panels = curve_panels(records, metrics=None)          # default: the task's main metric
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from raysim.engine.plots import Panel, Series
from raysim.engine.round_timer import WALL
from raysim.measure.pooling import perplexity
from raysim.types import Metrics

if TYPE_CHECKING:
    from rich.console import RenderableType

    from raysim.engine.loop import RunResult

Task = Literal["classification", "causal_lm", "regression"]

# The metric a task's table and default curves are about, and its short name in headers.
MAIN_METRIC: dict[Task, tuple[str, str]] = {
    "classification": ("accuracy", "acc"),
    "causal_lm": ("perplexity", "ppl"),
    "regression": ("loss", "loss"),
}
SCORES = ("mcc", "f1", "pearson")  # the dataset scores raysim.measure.scores reports
SCOPES = ("clients", "central", "heldout")  # curve scopes, in drawing order
_PERSONALIZED = re.compile(r"^eval/(heldout|clients)/personalized_(\d+)/")
_TRANSFER = re.compile(r"^eval/transfer/([^/]+)/(loss|accuracy|perplexity)$")
_TRANSFER_PERSONALIZED = re.compile(r"^eval/transfer/([^/]+)/personalized_(\d+)/")
_PERPLEXITY = re.compile(r"perplexity(_p\d+)?$")  # keys derivable as exp of their loss


@dataclass(frozen=True)
class RunRecord:
    """One run as the comparison sees it: its name, final metrics and per-round history."""

    name: str
    algorithm: str
    final: Metrics  # the last logged value of every metric
    history: list[tuple[int, Metrics]]  # (round, metrics); may hold only the keys to be drawn
    seconds: float | None = None  # the run's duration; None: unknown (a run that did not end)
    run_id: str | None = None
    experiment_id: str | None = None
    members: tuple[RunRecord, ...] = ()  # a mean over seeds: the seeds' own records (seed_groups)

    @classmethod
    def of_result(cls, result: RunResult) -> RunRecord:
        """The record of a run that just finished in this process (``raysim run``)."""
        return cls(
            name=result.job.name,
            algorithm=result.job.algorithm.name,
            final=result.final,
            history=result.history,
            seconds=result.seconds,
            run_id=result.run_id,
        )

    @property
    def task(self) -> Task:
        return task_of(self.final)

    @property
    def rounds(self) -> int | None:
        """Rounds run: the last round logged + 1 (round numbers start at 0)."""
        steps = [step for step, _ in self.history]
        return max(steps) + 1 if steps else None

    def fields(self) -> Metrics:
        """The final metrics with the run's rounds, time and mean clients per second.

        The time is the rounds' wall time summed (``sys/time/wall_s``; a continued run's earlier
        rounds included), read alike from a run just made and from MLflow: start-up (data,
        workers, which the first of several runs pays alone) is left out. A run that logged no
        round times (an older one) shows its duration."""
        rates = [m["sys/clients_per_s"] for _, m in self.history if "sys/clients_per_s" in m]
        round_times = [m[WALL] for _, m in self.history if WALL in m]
        extra = {
            "rounds": self.rounds,
            "time_s": sum(round_times) if round_times else self.seconds,
            "clients_per_s": sum(rates) / len(rates) if rates else None,
        }
        return {**self.final, **{k: float(v) for k, v in extra.items() if v is not None}}


def task_of(metrics: Iterable[str]) -> Task:
    """The task a run's metric names reveal: perplexity -> causal LM, accuracy -> classification."""
    names = list(metrics)
    if any(name.endswith("/perplexity") for name in names):
        return "causal_lm"
    if any(name.endswith("/accuracy") for name in names):
        return "classification"
    return "regression"


def metric_value(metrics: Metrics, key: str) -> float | None:
    """``metrics[key]``; a perplexity not logged (``.../perplexity``, ``.../perplexity_p10``) is
    ``exp`` of the matching loss when that was logged; None when neither is there."""
    if key in metrics:
        return float(metrics[key])
    loss = metrics.get(loss_key(key) or "")
    return perplexity(float(loss)) if loss is not None else None


def loss_key(key: str) -> str | None:
    """The loss a perplexity key is ``exp`` of (``a/perplexity_p10`` -> ``a/loss_p10``); None for
    any other key (the mean or std of perplexities is no ``exp`` of a loss statistic)."""
    if not _PERPLEXITY.search(key):
        return None
    return _PERPLEXITY.sub(lambda m: "loss" + (m.group(1) or ""), key)


# --- the table ---------------------------------------------------------------------------------


def number(value: float) -> str:
    """4 decimals for accuracies and losses, fewer for large values such as perplexities."""
    if not math.isfinite(value) or abs(value) >= 1e6:
        return f"{value:.3g}"
    return f"{value:.{1 if abs(value) >= 100 else 2 if abs(value) >= 10 else 4}f}"


@dataclass(frozen=True)
class Column:
    """A table column: the metric keys it shows and how its cell is written. The header's
    second line (the metric) keeps the table narrow; Markdown joins the lines.

    ``value``: one number; ``range``: ``low-high`` of two. The CSV gets one column per key.
    """

    header: str
    keys: tuple[str, ...]
    style: Literal["value", "range"] = "value"
    format: Callable[[float], str] = field(default=number, compare=False)

    def cell(self, metrics: Metrics) -> str:
        values = [metric_value(metrics, key) for key in self.keys]
        if values[0] is None:
            return "-"
        if self.style == "range":
            return f"{self.format(values[0])}-{self.format(values[1])}" if values[1] is not None else "-"
        return self.format(values[0])

    def has_value(self, metrics: Metrics) -> bool:
        return metric_value(metrics, self.keys[0]) is not None


def columns_for(task: Task, names: Iterable[str]) -> list[Column]:
    """The task's columns, with one per personalization fraction and transfer set among
    ``names`` (the metric names of the runs compared)."""
    names = sorted(set(names))
    metric, short = MAIN_METRIC[task]
    clients = f"eval/clients/{metric}"
    columns = [
        Column(f"central\n{short}", (f"eval/central/{metric}",)),
        Column(f"client\n{short}", (clients,)),
        Column("± std", (clients + "_std",)),  # over clients; none for perplexity (not logged)
        Column("p10-p90", (clients + "_p10", clients + "_p90"), "range"),
        Column(f"held-out\n{short}", (f"eval/heldout/{metric}",)),
        Column(f"personal\n{short}", (f"eval/personal/{metric}",)),  # each client's own predictor
    ]
    personalized = sorted({(m[1], int(m[2])) for n in names if (m := _PERSONALIZED.match(n))})
    columns += [
        Column(f"pers. {pct}%\n{short}", (f"eval/{scope}/personalized_{pct}/{metric}",))
        for scope, pct in personalized
    ]
    for name in sorted({m[1] for n in names if (m := _TRANSFER.match(n))}):
        columns.append(Column(f"{name}\n{short}", (f"eval/transfer/{name}/{metric}",)))
        tuned = sorted({int(m[2]) for n in names if (m := _TRANSFER_PERSONALIZED.match(n)) and m[1] == name})
        columns += [
            Column(f"{name}\npers. {pct}%", (f"eval/transfer/{name}/personalized_{pct}/{metric}",))
            for pct in tuned
        ]
    for score in SCORES:
        columns += [
            Column(f"{scope}\n{score}", (f"eval/{scope}/{score}",)) for scope in ("central", "clients")
        ]
    return columns + [
        Column("train\nloss", ("train/loss",)),
        Column("rounds", ("rounds",), format=lambda v: f"{v:.0f}"),
        Column("time s", ("time_s",), format=lambda v: f"{v:.1f}"),
        Column("clients/s", ("clients_per_s",), format=lambda v: f"{v:.1f}"),
    ]


@dataclass(frozen=True)
class TaskTable:
    """The runs of one task with the columns that have a value for at least one of them."""

    task: Task
    records: list[RunRecord]
    columns: list[Column]

    @property
    def names_say_algorithm(self) -> bool:
        """Every run is named after its algorithm (``fedavg``, ``quickstart/fedavg``): an
        algorithm column would repeat the names."""
        return all(r.name.rsplit("/", 1)[-1] == r.algorithm for r in self.records)

    def rows(self) -> list[list[str]]:
        """One row of cells per run: name, algorithm (unless the names say it), then the columns."""
        rows = []
        for record in self.records:
            fields = record.fields()
            algorithm = [] if self.names_say_algorithm else [record.algorithm]
            rows.append([record.name, *algorithm, *(c.cell(fields) for c in self.columns)])
        return rows

    @property
    def headers(self) -> list[str]:
        algorithm = [] if self.names_say_algorithm else ["algorithm"]
        return ["run", *algorithm, *(c.header for c in self.columns)]


def task_tables(records: Sequence[RunRecord]) -> list[TaskTable]:
    """The records grouped by task (in order of first appearance), each with its columns."""
    groups: dict[Task, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.task, []).append(record)
    tables = []
    for task, group in groups.items():
        fields = [r.fields() for r in group]
        columns = columns_for(task, {name for f in fields for name in f})
        kept = [c for c in columns if any(c.has_value(f) for f in fields)]
        tables.append(TaskTable(task, group, kept))
    return tables


def summary_tables(records: Sequence[RunRecord], title: str) -> RenderableType:
    """Rich tables of the final metrics, one per task (one table in the usual case)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    tables = task_tables(records)
    rendered = []
    for table in tables:
        suffix = f" - {table.task}" if len(tables) > 1 else ""
        # light rules and one space between columns: the usual table fits an 80-column terminal
        out = Table(title=title + suffix, box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False)
        for header in table.headers:
            text = header in ("run", "algorithm")
            out.add_column(header, justify="left" if text else "right", no_wrap=not text)
        for row in table.rows():
            out.add_row(*row)
        rendered.append(out)
    return Group(*rendered)


def comparison_table(results: Sequence[RunResult]) -> RenderableType:
    """``raysim run``'s summary: the final round of each run, in the columns of its task."""
    return summary_tables([RunRecord.of_result(r) for r in results], "raysim runs (final round)")


def write_csv(records: Sequence[RunRecord], path: Path) -> Path:
    """``final_csv`` written to ``path``."""
    path.write_text(final_csv(records))
    return path


def final_csv(records: Sequence[RunRecord]) -> str:
    """One row per run, one column per metric key of the tables' columns (full names)."""
    tables = task_tables(records)
    keys = list(dict.fromkeys(key for t in tables for c in t.columns for key in c.keys))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["run", "run_id", "algorithm", "task", *keys])
    for table in tables:
        for record in table.records:
            fields = record.fields()
            values = [metric_value(fields, key) for key in keys]
            writer.writerow(
                [record.name, record.run_id or "", record.algorithm, table.task]
                + ["" if v is None else repr(v) for v in values]
            )
    return buffer.getvalue()


def markdown(records: Sequence[RunRecord]) -> str:
    """The tables as Markdown (the comparison run's description in MLflow, and a file)."""
    parts = []
    for table in task_tables(records):
        lines = [
            f"**{table.task}**",
            "",
            "| " + " | ".join(h.replace("\n", " ") for h in table.headers) + " |",
            "|" + "|".join("---" if i < 2 else "---:" for i in range(len(table.headers))) + "|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in table.rows()]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# --- the curves ----------------------------------------------------------------------------------


def default_metrics(records: Sequence[RunRecord]) -> list[str]:
    """The main metric of each task among the records: accuracy, perplexity or loss."""
    return list(dict.fromkeys(MAIN_METRIC[r.task][0] for r in records))


def curve_keys(metric: str) -> list[tuple[str, str]]:
    """(scope label, metric key) of each curve a ``--metric`` names: a short name (``accuracy``)
    is drawn for the clients, the central test set and the held-out clients; a full key
    (``train/loss``) is drawn as it is."""
    if "/" in metric:
        return [(metric, metric)]
    return [(scope, f"eval/{scope}/{metric}") for scope in SCOPES]


def logged_keys(key: str) -> list[str]:
    """The logged metrics a (possibly derived) value and its p10/p90 band are read from."""
    keys = [key, key + "_p10", key + "_p90"]
    return keys + [loss for k in keys if (loss := loss_key(k))]


def curve_panels(
    records: Sequence[RunRecord], metrics: Sequence[str] | None = None, x: str | None = None
) -> list[Panel]:
    """One panel per metric: a line per run and scope, shaded between the 10th and 90th
    percentile over clients where those were logged (the ``eval/clients`` and ``eval/heldout``
    scopes), against the round or the logged key ``x`` (``sys/sim_clock_s``: the simulated
    clock). A metric that no run logged is skipped; none at all gives no panels."""
    panels = []
    for metric in metrics or default_metrics(records):
        series = [s for r in records for scope, key in curve_keys(metric) if (s := _series(r, scope, key, x))]
        if series:
            panels.append(Panel(metric, series, log_y="perplexity" in metric, x_label=x or "round"))
    return panels


def _series(record: RunRecord, scope: str, key: str, x: str | None = None) -> Series | None:
    rows: list[tuple[float, Metrics]] = [
        (s, m) for s, m in record.history if metric_value(m, key) is not None
    ]
    if x is not None:  # the rows that logged x too, drawn at its value
        rows = [(m[x], m) for _, m in rows if x in m]
    if not rows:
        return None
    low, high = _values(rows, key + "_p10"), _values(rows, key + "_p90")
    band = (low, high) if low is not None and high is not None else None
    return Series(record.name, scope, [step for step, _ in rows], _values(rows, key) or [], band)


def _values(rows: list[tuple[float, Metrics]], key: str) -> list[float] | None:
    """``key`` at every row, or None when a row lacks it."""
    values = [metric_value(m, key) for _, m in rows]
    return None if None in values else [float(v) for v in values if v is not None]


def describe(records: Sequence[RunRecord]) -> list[str]:
    """Short evaluation metric names the records logged (``accuracy``, ``loss``, ...), for errors."""
    names = {
        key.split("/")[2]
        for r in records
        for key in r.final
        if key.startswith("eval/") and key.count("/") == 2
    }
    return sorted(n for n in names if not re.search(r"_(mean|std|p\d+)$|^num_", n))
