"""A paired comparison of two rows of a grid table on the seeds both finished: with the seed
fixed, two methods see the same partition, the same initial model and the same cohorts (every
random choice is a function of seed, round and client), so their difference is paired.

Usage:
    for pair in paired(table, "fedavg", "fedprox"):   # one per column
        pair.wins, pair.losses, pair.ties, pair.mean_difference
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from raysim.errors import RaysimError
from raysim.results.grid_table import GridTable


@dataclass(frozen=True)
class Paired:
    """Row ``a`` against row ``b`` in one column, seed by seed (``a`` minus ``b``)."""

    a: str
    b: str
    column: str
    seeds: tuple[str, ...]  # finished in both
    differences: tuple[float, ...]
    higher_is_better: bool

    @property
    def wins(self) -> int:
        """Seeds on which ``a`` is better than ``b``."""
        return sum(d > 0 if self.higher_is_better else d < 0 for d in self.differences)

    @property
    def losses(self) -> int:
        return sum(d < 0 if self.higher_is_better else d > 0 for d in self.differences)

    @property
    def ties(self) -> int:
        return len(self.differences) - self.wins - self.losses

    @property
    def mean_difference(self) -> float:
        return float(np.mean(self.differences)) if self.differences else math.nan

    @property
    def std_difference(self) -> float:
        """Sample std (ddof=1) of the differences; nan for fewer than two seeds."""
        return float(np.std(self.differences, ddof=1)) if len(self.differences) > 1 else math.nan


def paired(table: GridTable, a: str, b: str) -> list[Paired]:
    """``a`` against ``b`` in every column both have (each at its own chosen value).

    Raises:
        RaysimError: ``a`` or ``b`` is no row of the table.
    """
    if a == b:
        raise RaysimError(f"--paired {a} {b}: name two different {table.row_axis}s")
    unknown = [name for name in (a, b) if name not in table.rows]
    if unknown:
        raise RaysimError(
            f"--paired {' '.join(unknown)}: no such {table.row_axis}; the rows are {', '.join(table.rows)}"
        )
    out = []
    for column in table.columns:
        if (a, column) not in table.cells or (b, column) not in table.cells:
            continue
        cell_a, cell_b = table.cells[a, column], table.cells[b, column]
        of_b = dict(zip(cell_b.seeds, cell_b.values))
        common = [(seed, value) for seed, value in zip(cell_a.seeds, cell_a.values) if seed in of_b]
        out.append(
            Paired(
                a,
                b,
                column,
                tuple(s for s, _ in common),
                tuple(v - of_b[s] for s, v in common),
                table.higher_is_better,
            )
        )
    return out
