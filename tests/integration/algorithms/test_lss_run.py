"""LSS end to end from a job that names only the algorithm (serial backend, 2 rounds of tiny digits).

The numbers are checked against the autograd reference in tests/unit/algorithms/test_lss.py; here:
the run is finite, the pool's metrics are logged, the model moved, and a client uploads one model,
so LSS sends exactly FedAvg's bytes up.
"""

import math

import torch

from jobs import tiny_job
from raysim.engine.loop import run


def test_lss_runs_from_a_job_naming_only_the_algorithm(tmp_path):
    lss = run(
        tiny_job(algorithm={"name": "lss"}, engine={"num_rounds": 2, "cohort_size": 3}), output_dir=tmp_path
    )
    fedavg = run(tiny_job(engine={"num_rounds": 2, "cohort_size": 3}), output_dir=tmp_path / "fedavg")
    history, baseline = dict(lss.history), dict(fedavg.history)
    for round_num in (0, 1):
        metrics = history[round_num]
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["lss/ingredients"] == 4 and metrics["lss/spread"] > 0
        assert metrics["sys/bytes_up"] == baseline[round_num]["sys/bytes_up"]
    assert any(not torch.equal(v, fedavg.state.params[k]) for k, v in lss.state.params.items())
