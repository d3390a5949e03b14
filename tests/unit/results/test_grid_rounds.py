"""A grid table's runs by how far they went: ``--at-round R`` takes each run's value after R rounds
(the one logged at round R - 1) and refuses, naming them, runs that stopped before R or did not
evaluate there; a column mixing runs of different lengths is one warning naming how many have which."""

import pytest

from raysim.errors import RaysimError
from raysim.results.grid_rounds import check_reached
from raysim.results.grid_table import Statistic, build_table, mixed_lengths
from raysim.results.seed_run import SeedRun

TEST = "eval/central/accuracy"


def run(variant, seed, curve, failed=False):
    name = f"{variant}/seed={seed}"
    axes = {"variant": variant, "seed": str(seed)}
    return SeedRun(run_id=name, name=name, axes=axes, failed=failed, curves={} if failed else {TEST: curve})


THREE = ((-1, 0.1), (0, 0.5), (1, 0.7), (2, 0.6))  # the initial model, then rounds 0, 1, 2


def test_the_value_after_r_rounds_is_the_one_logged_at_round_r_minus_1():
    runs = [run("fedavg", 0, THREE), run("fedavg", 1, ((0, 0.3), (1, 0.9), (2, 0.8)))]
    assert build_table(runs, TEST, Statistic("at", 2)).cells["fedavg", "all"].values == (0.7, 0.9)
    assert build_table(runs[:1], TEST, Statistic("at", 0)).cells["fedavg", "all"].values == (0.1,)
    assert Statistic("at", 3).describe() == "value after 3 rounds"


def test_runs_that_did_not_reach_r_or_did_not_evaluate_there_are_one_line_naming_them():
    short = run("fedprox", 0, ((0, 0.4),))
    sparse = run("fedprox", 1, ((1, 0.6), (3, 0.7)))  # evaluated every second round
    runs = [run("fedavg", 0, THREE), short, sparse, run("fedavg", 1, (), failed=True)]
    with pytest.raises(RaysimError) as info:
        build_table(runs, TEST, Statistic("at", 3))
    assert str(info.value) == (
        f"--at-round 3: no value of {TEST} after 3 rounds: 1 of 3 runs did not reach it: "
        "fedprox/seed=0 (1 round); the most every run reached is 1; "
        f"fedprox/seed=1 did not evaluate {TEST} then (evaluation.every)"
    )  # the failed run is no cell's value: it is not asked for one
    check_reached([runs[0], sparse], [TEST], 2)  # both have a value after 2 rounds


def test_a_column_mixing_lengths_is_one_warning_and_one_length_per_column_is_none():
    runs = [run("fedavg", 0, THREE), run("fedavg", 1, THREE), run("lss", 0, ((0, 0.8),))]
    warning = mixed_lengths(build_table(runs, TEST, Statistic("final")))
    assert warning == (
        "warning: runs of different lengths share a column (1 run of 1 round, 2 runs of 3 rounds), "
        "so a cell mixes values of different rounds; --at-round R reports every run after R rounds"
    )
    apart = [
        SeedRun(r.run_id, r.name, {**r.axes, "rounds": str(len(r.curves[TEST]))}, curves=r.curves)
        for r in runs
    ]
    assert mixed_lengths(build_table(apart, TEST, Statistic("final"), columns="rounds")) is None
