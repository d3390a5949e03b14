"""Rounds to target and cost against hand computations."""

import math

import pytest

from raysim.results.cost_table import INFERENCE_MACS, PEAK, SECONDS
from raysim.results.grid_cost import BYTES_UP, cell_cost, rounds_to_target
from raysim.results.grid_table import Cell
from raysim.results.seed_run import SeedRun

CURVE = ((-1, 0.1), (0, 0.3), (1, 0.6), (2, 0.9))


def test_rounds_to_target_counts_rounds_trained():
    """0.6 is logged at round 1 (from 0): reached after 2 rounds; the initial 0.1 after 0 rounds."""
    assert rounds_to_target(CURVE, 0.6, higher=True) == 2
    assert rounds_to_target(CURVE, 0.1, higher=True) == 0
    assert rounds_to_target(CURVE, 0.95, higher=True) is None
    assert rounds_to_target(((0, 2.0), (1, 1.0)), 1.5, higher=False) == 2  # a loss falls to it


def test_cell_cost_means_over_seeds():
    """Seed 0 reaches 0.6 after 2 rounds, seed 1 after 1 round, seed 2 never: 1.5 over 2 of 3;
    seconds (10 + 20 + 30) / 3 = 20; bytes up (100 + 100, 300, 0 rounds logged) -> (200 + 300) / 2."""
    runs = (
        SeedRun("a", "a", {}, curves={"m": CURVE, BYTES_UP: ((0, 100.0), (1, 100.0))}, seconds=10.0),
        SeedRun("b", "b", {}, curves={"m": ((0, 0.7),), BYTES_UP: ((0, 300.0),)}, seconds=20.0),
        SeedRun("c", "c", {}, curves={"m": ((0, 0.2),)}, seconds=30.0),
    )
    cost = cell_cost(Cell(runs, (0.0, 0.0, 0.0)), "m", target=0.6)
    assert (cost.rounds_to_target, cost.num_reached, cost.num_runs) == (1.5, 2, 3)
    assert cost.seconds == pytest.approx(20.0) and cost.bytes_up == pytest.approx(250.0)
    assert math.isnan(cost.bytes_down)


def test_a_cells_client_cost_is_the_mean_over_seeds_of_each_runs_sum_peak_and_last_value():
    """Seed a: client seconds 1 + 2, peaks 5 and 7, inference 9 then 11; seed b: 6, 3, 13."""
    a = {SECONDS: ((0, 1.0), (1, 2.0)), PEAK: ((0, 5.0), (1, 7.0)), INFERENCE_MACS: ((0, 9.0), (1, 11.0))}
    b = {SECONDS: ((0, 6.0),), PEAK: ((0, 3.0),), INFERENCE_MACS: ((0, 13.0),)}
    runs = (SeedRun("a", "a", {}, curves=a, seconds=1.0), SeedRun("b", "b", {}, curves=b, seconds=1.0))
    cost = cell_cost(Cell(runs, (0.0, 0.0)), "m")
    assert cost.client_seconds == pytest.approx((3.0 + 6.0) / 2)
    assert cost.peak_bytes == pytest.approx((7.0 + 3.0) / 2)
    assert cost.inference_macs == pytest.approx((11.0 + 13.0) / 2)
