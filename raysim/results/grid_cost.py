"""What a grid table's cells cost: rounds to reach a target value, wall seconds, bytes sent
(``sys/bytes_up``, ``sys/bytes_down`` summed over rounds), a client update's seconds (summed over
rounds) and peak memory, and the final predictor's MACs per example
(``raysim.results.cost_table.run_cost``), each a mean over the cell's seeds.

Rounds count from 0 in the logs: a value logged at round r was reached after r + 1 rounds (0 for
the initial model's evaluation, logged at round -1).

Usage:
    cost = cell_cost(cell, metric, target=0.9)
    cost.rounds_to_target, cost.num_reached, cost.seconds, cost.bytes_up
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from raysim.results.cost_table import COST_KEYS, INFERENCE_MACS, PEAK, SECONDS, run_cost
from raysim.results.grid_table import Cell, higher_is_better
from raysim.results.seed_run import Curve

BYTES_UP, BYTES_DOWN = "sys/bytes_up", "sys/bytes_down"


def rounds_to_target(curve: Curve, target: float, higher: bool) -> int | None:
    """Rounds trained when the curve first reaches ``target`` (None: never)."""
    for step, value in curve:
        if (value >= target) if higher else (value <= target):
            return step + 1
    return None


@dataclass(frozen=True)
class CellCost:
    rounds_to_target: float  # mean over the seeds that reached it; nan if none did
    num_reached: int
    num_runs: int
    seconds: float  # mean wall time; nan if unknown
    bytes_up: float  # mean total over rounds; nan if not logged
    bytes_down: float
    client_seconds: float = math.nan  # one client update's, summed over rounds; nan if not logged
    peak_bytes: float = math.nan  # the most one client update added
    inference_macs: float = math.nan  # of the final predictor, per example


def cell_cost(cell: Cell, metric: str, target: float | None = None) -> CellCost:
    """The cell's cost over its finished runs (the chosen value's, under selection)."""
    costs = [
        run_cost({k: [v for _, v in r.curves[k]] for k in COST_KEYS if k in r.curves}) for r in cell.runs
    ]
    reached = []
    if target is not None:
        found = [rounds_to_target(r.curves[metric], target, higher_is_better(metric)) for r in cell.runs]
        reached = [n for n in found if n is not None]
    return CellCost(
        rounds_to_target=_mean(reached),
        num_reached=len(reached),
        num_runs=len(cell.runs),
        seconds=_mean([r.seconds for r in cell.runs if r.seconds is not None]),
        bytes_up=_mean([c[BYTES_UP] for c in costs if BYTES_UP in c]),
        bytes_down=_mean([c[BYTES_DOWN] for c in costs if BYTES_DOWN in c]),
        client_seconds=_mean([c[SECONDS] for c in costs if SECONDS in c]),
        peak_bytes=_mean([c[PEAK] for c in costs if PEAK in c]),
        inference_macs=_mean([c[INFERENCE_MACS] for c in costs if INFERENCE_MACS in c]),
    )


def _mean(values: list[float] | list[int]) -> float:
    return float(np.mean(values)) if values else math.nan
