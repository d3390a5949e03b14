"""``raysim compare --over-seeds``: runs that differ only in their seed become one record, the
mean over the seeds, checked against hand-computed means."""

from types import SimpleNamespace

import pytest

from raysim.results.seed_groups import over_seeds
from raysim.results.tables import RunRecord


def run(name, seed, lr="0.1", uri="a.db"):
    params = {"seed": str(seed), "algorithm.local.lr": lr, "tracking.tracking_uri": uri}
    return SimpleNamespace(info=SimpleNamespace(run_name=name), data=SimpleNamespace(params=params))


def record(name, accuracy, history, seconds):
    final = {"eval/central/accuracy": accuracy}
    return RunRecord(name, "fedavg", final, history, seconds, run_id=name + "-id")


def test_runs_differing_only_in_their_seed_are_averaged_and_others_kept():
    runs = [run("s/avg", 0), run("s/avg lr=0.3", 0, lr="0.3"), run("s/avg seed=1", 1, uri="b.db")]
    records = [
        record("s/avg", 0.8, [(0, {"train/loss": 1.0}), (1, {"train/loss": 0.5})], 10.0),
        record("s/avg lr=0.3", 0.7, [(0, {"train/loss": 2.0})], 5.0),
        record("s/avg seed=1", 0.9, [(0, {"train/loss": 3.0})], 20.0),  # round 1 not logged
    ]
    mean, alone = over_seeds(runs, records)
    assert alone is records[1]
    assert mean.name == "s/avg (2 seeds)" and mean.run_id == "s/avg-id,s/avg seed=1-id"
    assert mean.final["eval/central/accuracy"] == pytest.approx((0.8 + 0.9) / 2, rel=1e-12)
    assert mean.history == [(0, {"train/loss": pytest.approx(2.0, rel=1e-12)})]  # rounds all logged
    assert mean.seconds == pytest.approx(15.0, rel=1e-12)
    assert mean.members == (records[0], records[2]) and alone.members == ()  # for the cost table's std
