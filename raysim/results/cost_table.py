"""What runs cost, side by side (``raysim compare --cost``): their training and their final
predictor, from the cost metrics every run logs (``raysim.engine.cost``; docs/tracking.md).

One row per run (a mean over seeds, ``raysim compare --over-seeds``: each cell the mean ± the sample
std of its seeds' costs, each run's cost computed first); a column no run has a value for is left
out:

- ``client s``: seconds of one client update, summed over the steps (``sys/client_seconds``): a
  client's local work over the whole run where every client trains at every step;
- ``peak MiB``: the most memory one client update added (``sys/client_peak_bytes``, max over steps);
- ``train MMAC``: MACs of one forward pass per example of the model clients train
  (``sys/macs_per_example``), in millions;
- ``up M``, ``down M``: parameters sent over the whole run (``sys/params_up``, ``sys/params_down``
  summed over steps), in millions; ``up MiB``, ``down MiB``: the bytes (``sys/bytes_up``,
  ``sys/bytes_down``);
- ``infer MMAC``, ``infer M``: MACs per example and parameters, in millions, of the last predictor
  evaluated (``sys/inference_macs_per_example``, ``sys/inference_params``): the global model,
  FuseFL's fused model, the Ensemble's members together.

Usage:
    records = store.records(runs, None, extra=COST_KEYS)
    console.print(cost_table(records, "raysim compare (cost)"))
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import fmean, stdev
from typing import TYPE_CHECKING

from raysim.results.tables import Column, RunRecord
from raysim.types import Metrics

if TYPE_CHECKING:
    from rich.console import RenderableType

MiB, M = 2.0**20, 1e6
SECONDS, PEAK, INFERENCE_MACS = (
    "sys/client_seconds",
    "sys/client_peak_bytes",
    "sys/inference_macs_per_example",
)
SUMMED = (SECONDS, "sys/params_up", "sys/params_down", "sys/bytes_up", "sys/bytes_down")
LAST = ("sys/macs_per_example", INFERENCE_MACS, "sys/inference_params")
COST_KEYS = (*SUMMED, PEAK, *LAST)  # the histories the table reads


def _scaled(unit: float, digits: int) -> Callable[[float], str]:
    return lambda value: f"{value / unit:,.{digits}f}"


COLUMNS = (
    Column("client s", (SECONDS,), format=_scaled(1.0, 2)),
    Column("peak MiB", (PEAK,), format=_scaled(MiB, 1)),
    Column("train MMAC", ("sys/macs_per_example",), format=_scaled(M, 3)),
    Column("up M", ("sys/params_up",), format=_scaled(M, 3)),
    Column("down M", ("sys/params_down",), format=_scaled(M, 3)),
    Column("up MiB", ("sys/bytes_up",), format=_scaled(MiB, 2)),
    Column("down MiB", ("sys/bytes_down",), format=_scaled(MiB, 2)),
    Column("infer MMAC", ("sys/inference_macs_per_example",), format=_scaled(M, 3)),
    Column("infer M", ("sys/inference_params",), format=_scaled(M, 3)),
)


def cost_fields(record: RunRecord) -> Metrics:
    """The run's cost over its logged steps, by metric: sums, max or last value; a mean over seeds:
    the mean of its seeds' costs (each key every seed has)."""
    if record.members:
        return {key: fmean(values) for key, values in _seed_costs(record).items()}
    return run_cost({key: [m[key] for _, m in record.history if key in m] for key in COST_KEYS})


def cost_spread(record: RunRecord) -> Metrics:
    """The sample standard deviation of each cost over the record's seeds; empty for one run."""
    if len(record.members) < 2:
        return {}
    return {key: stdev(values) for key, values in _seed_costs(record).items()}


def _seed_costs(record: RunRecord) -> dict[str, list[float]]:
    """Each cost key every seed of the record logged, with the seeds' values."""
    costs = [cost_fields(member) for member in record.members]
    return {key: [c[key] for c in costs] for key in COST_KEYS if all(key in c for c in costs)}


def run_cost(values: Mapping[str, Sequence[float]]) -> Metrics:
    """A run's cost from each cost metric's values, step by step (``COST_KEYS``; a key missing or
    empty: not logged): the sums, the peak, the last values."""
    values = {key: values.get(key, ()) for key in COST_KEYS}
    out: Metrics = {key: sum(values[key]) for key in SUMMED if values[key]}
    if values[PEAK]:
        out[PEAK] = max(values[PEAK])
    return out | {key: values[key][-1] for key in LAST if values[key]}


def cost_rows(records: Sequence[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """Headers and one row of cells per run (name, algorithm, then the columns with a value)."""
    fields = [cost_fields(r) for r in records]
    kept = [c for c in COLUMNS if any(c.has_value(f) for f in fields)]
    rows = [
        [r.name, r.algorithm, *(_cell(c, f, cost_spread(r)) for c in kept)]
        for r, f in zip(records, fields, strict=True)
    ]
    return ["run", "algorithm", *(c.header for c in kept)], rows


def _cell(column: Column, fields: Metrics, spread: Metrics) -> str:
    """The column's value, with `` ± std`` where the row is a mean over seeds."""
    key = column.keys[0]
    return column.cell(fields) + (f" ± {column.format(spread[key])}" if key in spread else "")


def has_costs(records: Sequence[RunRecord]) -> bool:
    return any(cost_fields(r) for r in records)


def cost_table(records: Sequence[RunRecord], title: str) -> RenderableType:
    from rich import box
    from rich.table import Table

    headers, rows = cost_rows(records)
    out = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False)
    for header in headers:
        text = header in ("run", "algorithm")
        out.add_column(header, justify="left" if text else "right", no_wrap=not text)
    for row in rows:
        out.add_row(*row)
    return out


def cost_markdown(records: Sequence[RunRecord]) -> str:
    headers, rows = cost_rows(records)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|",
    ]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def write_cost_csv(records: Sequence[RunRecord], path: Path) -> Path:
    """``cost_csv`` written to ``path``."""
    path.write_text(cost_csv(records))
    return path


def cost_csv(records: Sequence[RunRecord]) -> str:
    """One row per run, one column per cost metric (full names, in the metrics' own units), then
    one ``<metric>:std`` column each: the std over a row's seeds, empty for one run."""
    keys = [c.keys[0] for c in COLUMNS]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["run", "run_id", "algorithm", *keys, *(f"{key}:std" for key in keys)])
    for record in records:
        fields, spread = cost_fields(record), cost_spread(record)
        values = [repr(m[key]) if key in m else "" for m in (fields, spread) for key in keys]
        writer.writerow([record.name, record.run_id or "", record.algorithm, *values])
    return buffer.getvalue()
