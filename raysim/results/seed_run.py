"""One run of a grid table: its axes (a sweep's ``raysim.axis.*`` tags, the variant, the seed) and
its metrics' curves, as ``raysim.results.grid_runs`` reads it from MLflow.

Usage:
    run = SeedRun("1a2b", "fedavg-seed=0", {"variant": "fedavg", "seed": "0"},
                  curves={"eval/central/accuracy": ((0, 0.41), (1, 0.58))})
    run.value("algorithm.local.lr")   # an axis, else a param of the run
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Curve = tuple[tuple[int, float], ...]  # (round, value), rounds ascending; round -1: before training


@dataclass(frozen=True)
class SeedRun:
    """One run of a grid: its axes (``variant``, ``seed``, dotted config keys) and its curves."""

    run_id: str
    name: str
    axes: Mapping[str, str]  # declared by a sweep (raysim.axis.* tags); checked for being placed
    failed: bool = False  # did not finish: counted in its cell, not averaged
    curves: Mapping[str, Curve] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)  # looked up when no axis has the key
    seconds: float | None = None  # wall time
    logged: frozenset[str] = frozenset()  # every metric the run logged (named when one is missing)

    def value(self, axis: str) -> str | None:
        return self.axes.get(axis, self.params.get(axis))
