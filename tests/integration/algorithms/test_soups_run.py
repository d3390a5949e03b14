"""SWA, SWAD, Model Soups and DiWA end to end from a job that names only the algorithm (serial
backend, 2 rounds of tiny digits).

The numbers are checked against numpy references in tests/unit/algorithms/test_swa.py and
test_soups.py; here: the run is finite, the averaging's metrics are logged, the model moved, and a
client uploads one model, so each sends exactly FedAvg's bytes up.
"""

import math

import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run

# the metric and its range, averaged over the cohort
EXPECTED = {
    "swa": ("swa/snapshots", 1.0, 4.0),  # 4, or one per batch for a client of fewer batches
    "swad": ("swad/segments", 1.0, 1.0),  # one epoch, one evaluation: one segment
    "soups": ("soup/selected", 32.0, 32.0),  # uniform: every ingredient
    "diwa": ("soup/selected", 1.0, 32.0),  # greedy: some of the 32
}


@pytest.fixture(scope="module")
def fedavg(tmp_path_factory):
    return run(
        tiny_job(engine={"num_rounds": 2, "cohort_size": 3}), output_dir=tmp_path_factory.mktemp("fedavg")
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_runs_from_a_job_naming_only_the_algorithm(name, fedavg, tmp_path):
    result = run(
        tiny_job(algorithm={"name": name}, engine={"num_rounds": 2, "cohort_size": 3}), output_dir=tmp_path
    )
    history, baseline = dict(result.history), dict(fedavg.history)
    key, low, high = EXPECTED[name]
    for round_num in (0, 1):
        metrics = history[round_num]
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert low <= metrics[key] <= high, (key, metrics[key])
        assert metrics["sys/bytes_up"] == baseline[round_num]["sys/bytes_up"]
    assert any(not torch.equal(v, fedavg.state.params[k]) for k, v in result.state.params.items())
