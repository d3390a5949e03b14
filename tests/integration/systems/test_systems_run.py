"""The ``system:`` section in real runs (serial backend): the simulated clock advances by the
hand-computed round durations, the right clients are dropped and trained, time to target is
logged, FedProx stragglers do their partial work, and a trivial system changes nothing.

Devices are all alike (sigma 0): 10 examples/s and 4840 bytes/s, the size of the MLP (64 -> 16 ->
10: 1024 + 16 + 160 + 10 = 1210 float32 values), so a client reports ``2 + epochs * n / 10``
seconds into the round, ``n`` its training examples.
"""

import json

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.sampling import sample_cohort
from raysim.systems.rounds import drops_out, straggler_epochs, straggler_positions

DEVICES = {"examples_per_s": 10, "examples_per_s_sigma": 0, "bytes_per_s": 4840, "bytes_per_s_sigma": 0}
SEED, POOL, K = 3, 20, 6  # tiny_job: seed 3, 20 clients, cohort 6


def train_sizes(job):
    return open_dataset(job.dataset.name, job.dataset.config).num_examples("train")


def by_round(result, key):
    return [metrics.get(key) for _, metrics in result.history]


def test_the_clock_advances_by_the_kth_report_and_drops_the_rest(tmp_path):
    system = {"devices": DEVICES, "over_commit": 1.5, "dropout": 0.3}
    target = {"metric": "eval/clients/accuracy", "values": [0.01, 2.0]}
    job = tiny_job(system=system, evaluation={"every": 1, "time_to_target": target})
    result = run(job, output_dir=tmp_path)
    n = train_sizes(job)
    clock, cohorts = 0.0, []
    for r in range(3):
        drawn = np.arange(POOL)[sample_cohort(POOL, 9, SEED, r)]  # ceil(1.5 * 6) of 20
        seconds = {int(c): 2 + n[c] / 10 for c in drawn}
        out = {c for c in seconds if drops_out(0.3, SEED, r, c)}
        reports = sorted((s, c) for c, s in seconds.items() if c not in out)
        duration = reports[K - 1][0] if len(reports) >= K else max(seconds.values())
        clock += duration
        kept = {c for _, c in reports[:K]}
        cohorts.append([int(c) for c in drawn if c in kept])
        metrics = result.history[r][1]
        assert metrics["sys/sim_round_s"] == pytest.approx(duration)
        assert metrics["sys/sim_clock_s"] == pytest.approx(clock)
        assert metrics["sys/dropped_out"] == len(out)
        assert metrics["sys/dropped_stragglers"] == max(len(reports) - K, 0)
        assert metrics["sys/aggregated_clients"] == len(kept)
    saved = json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"]
    assert saved == cohorts  # the clients that trained
    first_clock = result.history[0][1]["sys/sim_clock_s"]
    assert result.history[0][1]["tta/eval/clients/accuracy_0.01/sim_s"] == first_clock
    assert result.history[0][1]["tta/eval/clients/accuracy_0.01/round"] == 0
    logged = [k for _, m in result.history for k in m if k.startswith("tta/")]
    assert len(logged) == 2  # once, and never the unreachable 2.0


def test_a_deadline_drops_the_slow_clients_before_they_train(tmp_path):
    job = tiny_job(system={"devices": DEVICES, "deadline_s": 6.0})
    n = train_sizes(job)
    result = run(job, output_dir=tmp_path)
    saved = json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"]
    for r in range(3):
        drawn = np.arange(POOL)[sample_cohort(POOL, K, SEED, r)]
        on_time = [int(c) for c in drawn if 2 + n[c] / 10 <= 6.0]  # at most 40 examples
        assert saved[r] == on_time and result.history[r][1]["sys/dropped_stragglers"] == K - len(on_time)
        late = len(on_time) < K
        expected = 6.0 if late else max(2 + n[c] / 10 for c in drawn)
        assert result.history[r][1]["sys/sim_round_s"] == pytest.approx(expected)


@pytest.mark.parametrize("partial_work", [True, False])
def test_fedprox_stragglers_do_a_random_number_of_epochs(tmp_path, partial_work):
    algorithm = {"name": "fedprox", "mu": 0.01, "local": {"epochs": 3, "batch_size": 16, "lr": 0.1}}
    system = {"devices": DEVICES, "straggler_fraction": 0.5, "partial_work": partial_work}
    job = tiny_job(algorithm=algorithm, system=system)
    n = train_sizes(job)
    result = run(job, output_dir=tmp_path)
    for r in range(3):
        drawn = [int(c) for c in np.arange(POOL)[sample_cohort(POOL, K, SEED, r)]]
        stragglers = {drawn[i] for i in straggler_positions(K, 0.5, SEED, r)}
        epochs = {c: straggler_epochs(3, SEED, r, c) if c in stragglers else 3 for c in drawn}
        short = [c for c in drawn if epochs[c] < 3]
        trained = drawn if partial_work else [c for c in drawn if c not in short]
        batches = {c: -(-int(n[c]) // 16) for c in drawn}  # per epoch
        steps = sum(n[c] * epochs[c] * batches[c] for c in trained) / sum(n[c] for c in trained)
        metrics = result.history[r][1]
        assert metrics["train/steps"] == pytest.approx(steps)  # weighted by examples
        assert metrics["sys/partial_clients"] == (len(short) if partial_work else 0)
        assert metrics["sys/aggregated_clients"] == len(trained)
    assert any(by_round(result, "sys/dropped_stragglers" if not partial_work else "sys/partial_clients"))


def test_a_trivial_system_trains_exactly_as_no_system(tmp_path):
    plain = run(tiny_job(), output_dir=tmp_path / "plain")
    timed = run(tiny_job(system={"devices": DEVICES}), output_dir=tmp_path / "timed")
    assert all(torch.equal(plain.state.params[k], timed.state.params[k]) for k in plain.state.params)
    cohorts = [json.loads((r.run_dir / "cohorts.json").read_text()) for r in (plain, timed)]
    assert cohorts[0] == cohorts[1]
    assert not any(k.startswith(("sys/sim", "tta/")) for _, m in plain.history for k in m)
    assert by_round(timed, "sys/sim_clock_s")[-1] > 0


@pytest.mark.parametrize(
    "sections,message",
    [
        ({"evaluation": {"time_to_target": {"values": [0.5]}}},
         "time_to_target.metric: dataset 'digits' has no central test set; use eval/clients/accuracy"),
        ({"system": {}, "algorithm": {"name": "local"}}, "runs its own protocol"),
        ({"system": {}, "engine": {"schedule": "cohorts.json"}}, "engine.schedule fixes every round"),
    ],
)  # fmt: skip
def test_what_cannot_be_timed_is_refused_before_training(tmp_path, sections, message):
    from raysim.errors import ConfigError

    (tmp_path / "cohorts.json").write_text(json.dumps({"num_clients": 20, "cohorts": [[0], [1], [2]]}))
    if "engine" in sections:
        sections["engine"]["schedule"] = str(tmp_path / "cohorts.json")
    with pytest.raises(ConfigError, match=message):
        run(tiny_job(**sections), output_dir=tmp_path)
    assert not (tmp_path / "runs").exists()  # no run started


def test_ray_workers_train_the_same_partial_work_as_the_serial_backend(tmp_path, ray_local):
    system = {"devices": DEVICES, "deadline_s": 8.0, "partial_work": True, "dropout": 0.2}
    algorithm = {"name": "fedprox", "local": {"epochs": 2, "batch_size": 16, "lr": 0.1}}
    runs = [
        run(tiny_job(system=system, algorithm=algorithm, resources={"backend": backend, "num_workers": 1}),
            output_dir=tmp_path / backend)
        for backend in ("serial", "ray")
    ]  # fmt: skip
    serial, ray = (r.state.params for r in runs)
    assert all(torch.equal(serial[k], ray[k]) for k in serial)
    assert any(by_round(runs[0], "sys/partial_clients"))  # budgets reached the workers
    assert by_round(runs[0], "train/steps") == by_round(runs[1], "train/steps")
