"""MOON, FedDyn, FedNova and Local end to end: two rounds of each on the serial backend.

Digits with a central test set (so Local's ``eval/local/*`` has one to report on) and the MLP
(whose ``features`` MOON uses). The numbers themselves are checked against references in
tests/unit/algorithms/test_{moon,feddyn,fednova,local_only}.py; here: every logged metric is
finite, each plugin's own metrics are there, and the global model moved (or, for Local, did not).
"""

import math

import pytest
import torch

from jobs import tiny_job
from raysim.engine.build import build
from raysim.engine.loop import run
from raysim.engine.tracking import MemoryTracker

DIGITS = {"name": "digits", "central_test_size": 200}
CASES = {
    "moon": ("server/delta_norm",),
    "feddyn": ("feddyn/h_norm", "server/delta_norm"),
    "fednova": ("fednova/tau_eff", "fednova/a"),
    "local": ("eval/local/accuracy", "eval/local/clients/accuracy", "eval/local/clients/accuracy_mean"),
}
LOCAL = {"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.5}


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_rounds_give_finite_metrics(name, tmp_path):
    job = tiny_job(
        dataset=DIGITS, algorithm={"name": name, "local": LOCAL}, engine={"num_rounds": 2, "cohort_size": 4}
    )
    engine, initial = build(job, MemoryTracker(), None, tmp_path / "init")
    engine.backend.shutdown()
    result = run(job, output_dir=tmp_path)
    assert [step for step, _ in result.history] == [0, 1]
    for step, metrics in result.history:
        assert all(math.isfinite(v) for v in metrics.values()), (step, metrics)
        assert 0.0 <= metrics["eval/central/accuracy"] <= 1.0
        for key in CASES[name]:
            assert key in metrics, (step, key)
    moved = any(not torch.equal(v, initial.params[k]) for k, v in result.state.params.items())
    assert moved == (name != "local")
