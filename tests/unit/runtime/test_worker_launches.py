"""An asynchronous client's draws keyed by its launch (raysim/runtime/worker.py,
``RoundOptions.state_keys``): two launches of one client from one model version train apart (an
outside review found them bit-identical: FedBuff counted the update twice, and Krum favoured the
pair at distance 0), one launch trains the same every time, and the plugin still sees the version
as its round (learning-rate schedules)."""

import pytest
import torch

from raysim import params as P
from raysim.config import JobConfig
from raysim.data.prepare import open_dataset
from raysim.runtime.wire import WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.services import RoundOptions
from raysim.types import Payload


@pytest.fixture(scope="module", params=["off", "on"])
def trainer(request, tmp_path_factory):
    job = JobConfig.from_dict(
        {
            "name": "launches",
            "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
            "model": {"name": "mlp", "hidden": [8]},
            "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
            "engine": {"vectorize": request.param},
            "resources": {"backend": "serial", "num_workers": 1},
            "tracking": {"enabled": False, "progress": False},
        }
    )
    store = open_dataset(job.dataset.name, job.dataset.config)
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store.path), str(tmp_path_factory.mktemp("s"))))
    assert trainer.vectorizes == (request.param == "on")  # both trainers: one by one, and in chunks
    return trainer


def update(trainer, launch, rounds):
    """Client 3's update from version 2, launched as ``launch``; the rounds its plugin saw."""
    client_update = trainer.algorithm.client_update
    vectorized_update = trainer.algorithm.vectorized_update
    trainer.algorithm.client_update = lambda ctx: rounds.append(ctx.round_num) or client_update(ctx)
    trainer.algorithm.vectorized_update = lambda ctxs: (
        rounds.extend(c.round_num for c in ctxs) or (vectorized_update(ctxs))
    )
    try:
        payload = Payload(P.to_numpy(trainer.client_init(0)))  # a random model
        options = RoundOptions(gathers=True, state_keys={3: launch})
        report = trainer.train(payload, [(0, 3)], round_num=2, options=options)
    finally:
        trainer.algorithm.client_update, trainer.algorithm.vectorized_update = (
            client_update,
            vectorized_update,
        )
    [vector] = report.aggregate.vectors
    return vector


def test_two_launches_from_one_version_train_apart_and_each_repeats(trainer):
    rounds = []
    first, again, other = (update(trainer, launch, rounds) for launch in (7, 7, 8))
    assert torch.equal(first, again)  # one launch: one update, whatever ran before
    assert not torch.equal(first, other)  # another launch: its own shuffle
    assert rounds == [2, 2, 2]  # the model's version, for schedules
