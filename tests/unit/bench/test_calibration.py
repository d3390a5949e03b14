"""The dry run's estimate: training (rounds x cohort x local steps x a step's seconds / workers at
once), evaluation (evaluated rounds x examples x a forward pass's seconds an example) and overhead
(a client's fixed work among it), the step, forward pass and client's work measured once per
machine, model and batch shapes and cached."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

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
    monkeypatch.setattr(calibration, "measure", lambda *args: calls.append(args) or Costs(0.01, 0.001, 0.002))
    return calls


def test_a_serial_estimate_adds_training_evaluation_and_overhead(tmp_path, measured):
    estimate = calibration.estimate_run(job(), Store(), tmp_path)
    # ceil(100 / 50) x 2 epochs = 4 steps a client; 4 rounds x 3 clients x 4 = 48 steps, 0.01 s each
    assert estimate.steps == 48 and estimate.training_s == pytest.approx(0.48)
    # after rounds 2 and 4 (the last) and at the start: 3 evaluations of 50 central examples and
    # 2 clients' test splits of 25 on average, 100 in all, 0.001 s an example
    assert estimate.examples == 300 and estimate.evaluation_s == pytest.approx(0.3)
    per_round = calibration.ROUND_S["serial"] + 3 * 0.002  # 3 clients' measured fixed work
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
    per_round = calibration.ROUND_S["ray"] + 3 * 0.002 / 2  # nothing per client beyond the work
    assert estimate.overhead_s == pytest.approx(
        calibration.STARTUP_S + calibration.RAY_START_S + 4 * per_round
    )


def test_a_clients_fixed_cost_is_the_measured_one_over_the_workers(monkeypatch):
    """Before: a constant 0.05 s a client whatever the model (3 min for a 47 s MNIST job)."""
    monkeypatch.setattr(calibration.os, "cpu_count", lambda: 2)
    local = job().algorithm.config.local

    def overhead(resources, client_s):
        return calibration.estimate(
            job(resources=resources), Store(), local, Costs(0.01, 0.001, client_s)
        ).overhead_s

    serial, ray = {"backend": "serial"}, {"backend": "ray", "num_workers": 2}
    # 4 rounds x 3 clients: 12 clients' work, serially, and over Ray's 2 workers
    assert overhead(serial, 0.5) - overhead(serial, 0.0) == pytest.approx(12 * 0.5)
    assert overhead(ray, 0.5) - overhead(ray, 0.0) == pytest.approx(12 * 0.5 / 2)


def test_a_larger_models_client_cost_is_measured_for_it_and_cached(tmp_path, monkeypatch):
    from raysim.params import model_params, num_values
    from raysim.runtime.builders import build_job_model

    store = open_dataset("digits", job().dataset.config)
    measured = []

    def measure(job, store, *_):  # a client's work as long as its model is large
        measured.append(job.model.name)
        return Costs(0.01, 0.001, 1e-6 * num_values(model_params(build_job_model(job, store.spec))))

    monkeypatch.setattr(calibration, "measure", measure)
    small, large = job(), JobConfig.from_dict(job().to_dict() | {"model": {"name": "mlp", "hidden": [512]}})
    for _ in range(2):
        costs = [calibration.estimate_run(j, store, tmp_path).costs for j in (small, large)]
    assert costs[1].client_s > 10 * costs[0].client_s
    assert len(measured) == 2  # once each model: the second time from the cache


def test_the_costs_are_measured_once_and_an_older_caches_entries_are_measured_again(
    tmp_path, measured, monkeypatch
):
    (tmp_path / calibration.CACHE_FILE).write_text(json.dumps({"an older key": 0.5}))
    monkeypatch.setattr(calibration, "CACHE_VERSION", 1)  # as a cache before the client's cost
    calibration.estimate_run(job(), Store(), tmp_path)
    calibration.estimate_run(job({"lr": 0.5}), Store(), tmp_path)  # the same model and batches
    assert len(measured) == 1
    monkeypatch.setattr(calibration, "CACHE_VERSION", 2)  # what is measured changed: measure again
    assert calibration.estimate_run(job(), Store(), tmp_path).costs == Costs(0.01, 0.001, 0.002)
    assert len(measured) == 2
    cache = tmp_path / calibration.CACHE_FILE
    [key] = [k for k in json.loads(cache.read_text()) if k.startswith("[2,")]
    cache.write_text(json.dumps({key: {"step_s": 0.01, "forward_s": 0.001}}))  # no client's cost
    calibration.estimate_run(job(), Store(), tmp_path)
    assert len(measured) == 3
    assert json.loads(cache.read_text())[key] == {"step_s": 0.01, "forward_s": 0.001, "client_s": 0.002}


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
    assert costs.step_s > 0 and costs.forward_s > 0 and costs.client_s > 0
    assert torch.get_num_threads() == threads


def test_a_clients_work_reads_a_new_client_each_time_and_leaves_the_weights(monkeypatch):
    """As a worker's round: every client loads the same global weights and reads its own data."""
    from raysim import params as P
    from raysim.runtime.builders import build_job_model

    store = open_dataset("digits", job().dataset.config)
    model = build_job_model(job(), store.spec)
    weights, read, reads = P.clone(P.model_params(model)), store.client_data, []
    monkeypatch.setattr(
        store, "client_data", lambda cid, split="train": reads.append(cid) or read(cid, split)
    )
    assert calibration.client_seconds(model, store) > 0
    assert reads == [0, 1, 2, 3, 4, 5, 0, 1, 2]  # WARMUP + STEPS clients of 6, in turn
    assert all(torch.equal(P.model_params(model)[k], w) for k, w in weights.items())
