"""The dry run's estimate: training (rounds x cohort x local steps x a step's seconds / workers at
once), evaluation (evaluated rounds x examples x a forward pass's seconds an example) and overhead,
the step and forward pass measured once per machine, model and batch shapes and cached."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from raysim.bench import calibration
from raysim.bench.calibration import Costs
from raysim.config import JobConfig
from raysim.data.prepare import open_dataset


class Store:
    """4 clients of 100 training rows and 10, 20, 30, 40 test rows; a central test set of 50."""

    num_clients = 4
    spec = SimpleNamespace(input_shape=(8,), task="classification")

    def num_examples(self, split="train"):
        return np.array([100] * 4) if split == "train" else np.array([10, 20, 30, 40])

    def central_test(self):
        return SimpleNamespace(arrays={"x": np.zeros((50, 8))})


def job(local=None, evaluation=None, resources=None):
    return JobConfig.from_dict(
        {
            "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 6}},
            "model": {"name": "mlp", "hidden": [8]},
            "algorithm": {"name": "fedavg", "local": {"batch_size": 50, "epochs": 2, **(local or {})}},
            "engine": {"num_rounds": 4, "cohort_size": 3},
            "evaluation": {"every": 2, "at_start": True, "clients": 2, **(evaluation or {})},
            "resources": resources or {"backend": "serial"},
        }
    )


@pytest.fixture
def measured(monkeypatch):
    calls = []
    monkeypatch.setattr(calibration, "measure", lambda *args: calls.append(args) or Costs(0.01, 0.001))
    return calls


def test_a_serial_estimate_adds_training_evaluation_and_overhead(tmp_path, measured):
    estimate = calibration.estimate_run(job(), Store(), tmp_path)
    # ceil(100 / 50) x 2 epochs = 4 steps a client; 4 rounds x 3 clients x 4 = 48 steps, 0.01 s each
    assert estimate.steps == 48 and estimate.training_s == pytest.approx(0.48)
    # after rounds 2 and 4 (the last) and at the start: 3 evaluations of 50 central examples and
    # 2 clients' test splits of 25 on average, 100 in all, 0.001 s an example
    assert estimate.examples == 300 and estimate.evaluation_s == pytest.approx(0.3)
    per_round = calibration.ROUND_S["serial"] + 3 * calibration.CLIENT_S
    assert estimate.overhead_s == pytest.approx(calibration.STARTUP_S + 4 * per_round)
    assert estimate.seconds == pytest.approx(0.78 + estimate.overhead_s)
    assert calibration.estimate_run(job({"max_steps": 1}), Store(), tmp_path).steps == 4 * 3


def test_evaluated_rounds_count_the_last_once_and_held_out_clients_too(tmp_path, measured):
    every_3 = calibration.estimate_run(job(evaluation={"every": 3, "at_start": False}), Store(), tmp_path)
    assert every_3.examples == 2 * 100  # after round 3 and after round 4, the last
    only_last = job(evaluation={"every": 0, "at_start": False, "clients": None, "heldout_fraction": 0.25})
    # 3 training clients and 1 held out, all evaluated: 4 x 25 test rows + 50 central
    assert calibration.estimate_run(only_last, Store(), tmp_path).examples == 150


def test_ray_workers_beyond_the_cores_do_not_speed_training_up(tmp_path, measured, monkeypatch):
    """4 workers on 2 cores train 2 clients at a time, and Ray's start is paid once."""
    monkeypatch.setattr(calibration.os, "cpu_count", lambda: 2)
    ray = job(resources={"backend": "ray", "num_workers": 4, "cpus_per_worker": 1})
    estimate = calibration.estimate_run(ray, Store(), tmp_path)
    assert estimate.training_s == pytest.approx(48 * 0.01 / 2)
    per_round = calibration.ROUND_S["ray"] + 3 * calibration.CLIENT_S / 2
    assert estimate.overhead_s == pytest.approx(
        calibration.STARTUP_S + calibration.RAY_START_S + 4 * per_round
    )


def test_the_costs_are_measured_once_and_an_older_caches_step_is_measured_again(tmp_path, measured):
    (tmp_path / calibration.CACHE_FILE).write_text(json.dumps({"an older key": 0.5}))
    calibration.estimate_run(job(), Store(), tmp_path)
    calibration.estimate_run(job({"lr": 0.5}), Store(), tmp_path)  # the same model and batches
    assert len(measured) == 1
    cache = tmp_path / calibration.CACHE_FILE
    (key, value), *_ = [(k, v) for k, v in json.loads(cache.read_text()).items() if k != "an older key"]
    cache.write_text(json.dumps({key: 0.01}))  # a step alone, as the cache held before forward passes
    assert calibration.estimate_run(job(), Store(), tmp_path).costs == Costs(0.01, 0.001)
    assert len(measured) == 2 and value == {"step_s": 0.01, "forward_s": 0.001}


def test_a_cost_is_the_median_of_the_timed_calls_not_the_fastest(monkeypatch):
    durations = [9.0] * calibration.WARMUP + [1.0, 2.0, 3.0, 50.0, 5.0, 6.0, 7.0]
    clock = iter(np.cumsum([0.0] + [d for d in durations for _ in (0, 1)][:-1]).tolist())
    monkeypatch.setattr(calibration.time, "perf_counter", lambda: next(clock))
    assert calibration.STEPS == 7 and calibration._median_seconds(lambda: None) == 5.0


def test_a_measurement_takes_some_time_and_leaves_torch_as_it_was():
    import torch

    store = open_dataset("digits", job().dataset.config)
    threads = torch.get_num_threads()
    costs = calibration.measure(job(), store, 8, 64)
    assert costs.step_s > 0 and costs.forward_s > 0
    assert torch.get_num_threads() == threads
