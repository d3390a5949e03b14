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
from raysim import params as P
from raysim.data.prepare import open_dataset
from raysim.engine.build import build
from raysim.engine.loop import run
from raysim.runtime.builders import build_job_model
from raysim.runtime.client_state import ClientStateStore
from raysim.sampling import client_seed
from raysim.tracking.tracker import MemoryTracker
from raysim.train.local import train_local

DIGITS = {"name": "digits", "central_test_size": 200}
CASES = {
    "moon": ("server/delta_norm",),
    "feddyn": ("feddyn/h_norm", "server/delta_norm"),
    "fednova": ("fednova/tau_eff", "server/delta_norm"),
    "local": ("eval/local/accuracy", "eval/local/clients/accuracy", "eval/local/clients/accuracy_mean"),
}
LOCAL = {"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.5}


@pytest.mark.parametrize(
    ("name", "options"),
    [
        *((name, {}) for name in sorted(CASES)),
        ("moon", {"negative": "client_init"}),
        ("local", {"start_from": "client_init"}),
    ],
)
def test_two_rounds_give_finite_metrics(name, options, tmp_path):
    job = tiny_job(
        dataset=DIGITS,
        algorithm={"name": name, "local": LOCAL, **options},
        engine={"num_rounds": 2, "cohort_size": 4},
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
    if name == "local":  # the last evaluation covers every client with a model, not the cohort
        trained = len(result.state.extra.trained)
        assert trained > 4 and result.history[-1][1]["eval/local/num_clients"] == trained


def test_local_clients_train_on_from_where_they_stopped_and_the_global_model_stays(tmp_path):
    """Full participation, two rounds. Each client's round-1 model must be round-1 training
    (train_local, the client's seed and data) started from its own round-0 model, which the run's
    client state holds; started from the initial model it would differ. Round 1 sends nothing."""
    job = tiny_job(
        dataset=DIGITS,
        algorithm={"name": "local", "local": LOCAL},
        engine={"num_rounds": 2, "cohort_size": 20},
    )
    result = run(job, output_dir=tmp_path)
    store = open_dataset(job.dataset.name, job.dataset.config)
    initial = P.model_params(build_job_model(job, store.spec))
    assert all(torch.equal(v, initial[k]) for k, v in result.state.params.items())
    assert [m["sys/bytes_down"] > 0 for _, m in result.history] == [True, False]
    states = ClientStateStore(result.run_dir / "client_state")

    def round1_training(client, start):
        model = build_job_model(job, store.spec)
        P.load_into(model, start)
        data, seed = store.client_data(client, "train"), client_seed(job.seed, 1, client)
        train_local(model, data, job.algorithm.config.local, seed=seed, spec=store.spec, round_num=1)
        return P.model_params(model)

    for client in (0, 7, 19):
        after_round0 = states.get(client, before_round=1)["params"]
        after_round1 = states.get(client, before_round=2)["params"]
        from_own, from_initial = round1_training(client, after_round0), round1_training(client, initial)
        for key, value in after_round1.items():
            torch.testing.assert_close(value, from_own[key])
        assert any(not torch.allclose(v, from_initial[k]) for k, v in after_round1.items())
