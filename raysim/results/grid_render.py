"""A grid table written out: Markdown, LaTeX (booktabs) and CSV, with its rule, the values the
selection chose, the paired comparison and the cost columns; and its learning curves (mean over
seeds, shaded ± one sample std).

A cell reads ``0.9120 ± 0.0130 (3)``: mean ± sample std over 3 finished seeds; ``(2†)`` marks a
cell whose other seeds failed; a single seed has no std. The best cell per column is bold.

Usage:
    text = markdown(table)          # or latex(table), csv_text(table)
    text += paired_markdown(paired(table, "fedavg", "fedprox"))
    seed_band_curves(table, runs, "curves.png")
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raysim.results.grid_cost import CellCost
from raysim.results.grid_paired import Paired
from raysim.results.grid_table import ALL, Cell, GridTable


def number(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.4f}"


def cell_text(cell: Cell | None, math_mode: bool = False) -> str:
    """``mean ± std (n)``, ``(n†)`` with failed seeds; ``–`` for an empty cell."""
    if cell is None:
        return "–"
    dagger = ("$^\\dagger$" if math_mode else "†") if cell.num_failed else ""
    count = f"({len(cell.values)}{dagger})"
    if not cell.values:
        return f"failed {count}"
    plus_minus = "\\pm" if math_mode else "±"
    spread = f" {plus_minus} {number(cell.std)}" if len(cell.values) > 1 else ""
    value = f"{number(cell.mean)}{spread}"
    return f"${value}$ {count}" if math_mode else f"{value} {count}"


def _header(table: GridTable) -> list[str]:
    """The row axis, then ``alpha=0.1`` per column (the last part of a dotted axis)."""
    if table.column_axis is None:
        return [table.row_axis, table.metric]
    name = table.column_axis.rsplit(".", 1)[-1]
    return [table.row_axis, *(f"{name}={c}" for c in table.columns)]


def _rows(table: GridTable, bold: str, math_mode: bool = False) -> list[list[str]]:
    best = {c: table.best_row(c) for c in table.columns}
    return [
        [
            row,
            *(
                bold.format(cell_text(table.cells.get((row, c)), math_mode))
                if best[c] == row
                else cell_text(table.cells.get((row, c)), math_mode)
                for c in table.columns
            ),
        ]
        for row in table.rows
    ]


def markdown_grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def chosen_rows(table: GridTable) -> list[list[str]]:
    return [
        [
            row,
            *(
                str((table.cells[row, c].chosen if (row, c) in table.cells else None) or "–")
                for c in table.columns
            ),
        ]
        for row in table.rows
    ]


def markdown(table: GridTable) -> str:
    """The table with its rule above it and, under selection, the chosen values below it."""
    text = "\n".join(table.rule()) + "\n\n" + markdown_grid(_header(table), _rows(table, "**{}**"))
    if table.selection is not None:
        text += f"\n{table.selection.axis} chosen:\n\n" + markdown_grid(_header(table), chosen_rows(table))
    return text


def _latex_escape(text: str) -> str:
    return text.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%").replace("&", "\\&")


def latex(table: GridTable) -> str:
    """A booktabs ``tabular``; the rule (and the chosen values) as comments above it."""
    rule = [f"% {line}" for line in table.rule()]
    if table.selection is not None:
        picks = [f"{r[0]} {c}: {v}" for r in chosen_rows(table) for c, v in zip(table.columns, r[1:])]
        rule.append(f"% {table.selection.axis} chosen: " + "; ".join(picks))
    header = [_latex_escape(h) for h in _header(table)]
    body = [[_latex_escape(r[0]), *r[1:]] for r in _rows(table, "\\textbf{{{}}}", math_mode=True)]
    lines = [
        *rule,
        "\\begin{tabular}{l" + "c" * len(table.columns) + "}",
        "\\toprule",
        " & ".join(header) + " \\\\",
        "\\midrule",
        *(" & ".join(r) + " \\\\" for r in body),
        "\\bottomrule",
        "\\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("row", "column", "mean", "std", "num_seeds", "num_failed", "best", "chosen", "seeds", "values")


def csv_text(table: GridTable) -> str:
    """One line per cell: numbers to 6 significant digits, the seeds and per-seed values ``;``-joined."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for row in table.rows:
        for column in table.columns:
            cell = table.cells.get((row, column))
            if cell is None:
                continue
            writer.writerow(
                [
                    row,
                    column,
                    _full(cell.mean),
                    _full(cell.std),
                    len(cell.values),
                    cell.num_failed,
                    int(table.best_row(column) == row),
                    cell.chosen or "",
                    ";".join(cell.seeds),
                    ";".join(_full(v) for v in cell.values),
                ]
            )
    return out.getvalue()


def _full(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.6g}"


def paired_markdown(pairs: Sequence[Paired]) -> str:
    """Per column: seeds compared, wins/ties/losses of the first row, mean ± std of the difference."""
    if not pairs:
        return ""
    a, b = pairs[0].a, pairs[0].b
    header = ["column", "seeds", f"{a} better", "ties", f"{b} better", f"mean {a} − {b}"]
    rows = [
        [
            p.column,
            str(len(p.seeds)),
            str(p.wins),
            str(p.ties),
            str(p.losses),
            number(p.mean_difference) + (f" ± {number(p.std_difference)}" if len(p.seeds) > 1 else ""),
        ]
        for p in pairs
    ]
    return f"\npaired on the seeds both finished: {a} against {b}\n\n" + markdown_grid(header, rows)


def cost_markdown(table: GridTable, costs: dict[tuple[str, str], CellCost], target: float | None) -> str:
    """Per cell: rounds to ``target`` (mean over the seeds that reached it, k/n reached), wall
    seconds, MB sent up and down, a client update's seconds (over the run) and peak MiB, and the
    final predictor's MMACs per example (means over seeds)."""
    header = [
        table.row_axis,
        "column",
        *([f"rounds to {target:g}"] if target is not None else []),
        "seconds",
        "MB up",
        "MB down",
        "client s",
        "peak MiB",
        "infer MMAC",
    ]
    rows = []
    for (row, column), cost in costs.items():
        reached = (
            [f"{_short(cost.rounds_to_target)} ({cost.num_reached}/{cost.num_runs})"]
            if target is not None
            else []
        )
        rows.append(
            [
                row,
                column,
                *reached,
                _short(cost.seconds),
                _short(cost.bytes_up / 1e6),
                _short(cost.bytes_down / 1e6),
                _short(cost.client_seconds),
                _short(cost.peak_bytes / 2**20),
                _short(cost.inference_macs / 1e6),
            ]
        )
    return "\ncost (means over seeds)\n\n" + markdown_grid(header, rows)


def _short(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.1f}"


def seed_band_curves(table: GridTable, path: str | Path) -> Path:
    """One panel per column, one line per row: the metric's mean over the cell's seeds per round,
    shaded mean ± sample std where two or more seeds logged the round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table.columns), figsize=(5.5 * len(table.columns), 4), squeeze=False)
    for ax, column in zip(axes[0], table.columns):
        for row in table.rows:
            cell = table.cells.get((row, column))
            if cell is None or not cell.runs:
                continue
            by_round: dict[int, list[float]] = {}
            for run in cell.runs:
                for step, value in run.curves[table.metric]:
                    by_round.setdefault(step, []).append(value)
            rounds = sorted(by_round)
            mean = np.array([np.mean(by_round[r]) for r in rounds])
            std = np.array([np.std(by_round[r], ddof=1) if len(by_round[r]) > 1 else 0.0 for r in rounds])
            label = f"{row} ({cell.chosen})" if cell.chosen else row
            [line] = ax.plot(rounds, mean, label=f"{label}, n={len(cell.runs)}")
            ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(column if column != ALL else table.metric, fontsize=10)
        ax.set_xlabel("round (from 0)")
        ax.set_ylabel(table.metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("mean over seeds, shaded ± sample std (ddof=1)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
