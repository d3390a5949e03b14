"""The dry run's estimate: rounds x cohort x local steps x one step's seconds, measured once per
machine, model and batch shape and read back from the cache after."""

import json

from raysim.bench import calibration
from raysim.config import JobConfig
from raysim.data.prepare import open_dataset


def job(**local):
    return JobConfig.from_dict(
        {
            "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 6}},
            "model": {"name": "mlp", "hidden": [8]},
            "algorithm": {"name": "fedavg", "local": {"batch_size": 50, **local}},
            "engine": {"num_rounds": 4, "cohort_size": 3},
            "resources": {"backend": "serial"},
        }
    )


def test_the_step_is_measured_once_and_the_estimate_counts_the_runs_steps(tmp_path, monkeypatch):
    store = open_dataset("digits", job().dataset.config)
    calls = []
    monkeypatch.setattr(calibration, "measure_step", lambda *args: calls.append(args) or 0.01)
    first = calibration.estimate_run(job(epochs=2), store, tmp_path)
    again = calibration.estimate_run(job(epochs=2, lr=0.5), store, tmp_path)  # the same model and batch
    assert len(calls) == 1 and len(json.loads((tmp_path / calibration.CACHE_FILE).read_text())) == 1
    per_client = -(-int(store.num_examples("train").mean()) // 50) * 2  # ceil(rows / batch) x epochs
    assert first.steps == again.steps == 4 * 3 * per_client
    assert first.seconds == calibration.STARTUP_S + first.steps * 0.01
    assert calibration.estimate_run(job(max_steps=1), store, tmp_path).steps == 4 * 3


def test_a_measured_step_takes_some_time_and_leaves_torch_as_it_was():
    import torch

    store = open_dataset("digits", job().dataset.config)
    threads = torch.get_num_threads()
    assert calibration.measure_step(job(), store, 8) > 0
    assert torch.get_num_threads() == threads
