"""The client-server barrier and the per-round example cap, end to end."""

import json

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.engine.loop import run
from raysim.runtime.wire import WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.services import EVALUATE, MapRequest, RoundOptions


@pytest.mark.parametrize("algorithm", ["fedavg", "fedfish"])
def test_barrier_is_logged_and_matches_an_independent_evaluation(tmp_path, algorithm):
    job = tiny_job(
        algorithm={"name": algorithm},
        engine={"max_client_examples": 10},
        evaluation={"probes": [{"name": "client_server_barrier"}]},
    )
    result = run(job, output_dir=tmp_path)
    for _, metrics in result.history:
        assert metrics["barrier/local_loss"] < metrics["barrier/start_loss"]  # local training helped
        assert metrics["barrier/loss"] == pytest.approx(
            metrics["barrier/global_loss"] - metrics["barrier/local_loss"]
        )
    # the last round's global term, recomputed from the final model on the same round data
    last = json.loads((result.run_dir / "cohorts.json").read_text())["cohorts"][-1]
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store_path(job)), str(tmp_path / "s")))
    request = MapRequest(EVALUATE, [P.to_numpy(result.state.params)], last, "round", round_num=2)
    again = trainer.map_units(request, [(0, i) for i in range(len(last))])
    assert all(len(trainer.round_data(c, 2)) == 10 for c in last)
    assert result.history[-1][1]["barrier/global_loss"] == pytest.approx(
        np.mean([m["loss"] for m in again]), rel=1e-6
    )


def test_measuring_the_barrier_does_not_change_training(tmp_path):
    plain = run(tiny_job(), output_dir=tmp_path / "a").state.params
    measured = run(
        tiny_job(evaluation={"probes": [{"name": "client_server_barrier"}]}), output_dir=tmp_path / "b"
    ).state.params
    assert all(torch.equal(plain[k], measured[k]) for k in plain)


def test_the_cap_sets_each_clients_examples_and_weight(tmp_path):
    job = tiny_job(engine={"max_client_examples": 7})
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store_path(job)), str(tmp_path)))
    payload_params = P.to_numpy(P.model_params(trainer.model))
    from raysim.types import Payload

    report = trainer.train(Payload(payload_params), [(0, 3), (1, 4)], round_num=0, options=RoundOptions())
    assert [client.weight for client in report.clients] == [7.0, 7.0]
    a, b = trainer.round_data(3, 0), trainer.round_data(3, 1)
    assert len(a) == 7 and not np.array_equal(a.arrays["x"], b.arrays["x"])  # a new subset each round


def store_path(job):
    from raysim.data.prepare import open_dataset

    return open_dataset(job.dataset.name, job.dataset.config).path
