"""The worker's per-round preparation of the payload, on a real store."""

import sys

import numpy as np
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.data.prepare import open_dataset
from raysim.runtime.wire import WorkerSetup
from raysim.runtime.worker import ClientTrainer
from raysim.services import RoundOptions
from raysim.types import Payload


def test_payload_extras_reach_the_device_once_per_round(tmp_path):
    """Every client of the worker sees the same tensors: moved once, not once per client."""
    job = tiny_job(algorithm={"name": "scaffold"})
    store = open_dataset(job.dataset.name, job.dataset.config)
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store.path), str(tmp_path)))
    seen = []
    client_update = trainer.algorithm.client_update

    def recording_update(ctx):
        seen.append((ctx.payload.extra.c, ctx.device))
        return client_update(ctx)

    trainer.algorithm.client_update = recording_update
    params = P.to_numpy(P.model_params(trainer.model))
    variate = {k: np.zeros_like(v) for k, v in params.items()}
    server_variate = sys.modules[type(trainer.algorithm).__module__].ServerVariate  # SCAFFOLD's payload
    payload = Payload(params, extra=server_variate(variate))
    report = trainer.train(payload, [(0, 3), (1, 4)], round_num=0, options=RoundOptions())
    assert not report.failures and len(seen) == 2
    (first, device), (second, _) = seen
    assert all(isinstance(v, torch.Tensor) and v.device == device for v in first.values())
    assert all(first[k] is second[k] for k in first)


def test_a_clients_own_initialisation_is_the_job_model_under_its_seed_and_disturbs_nothing(tmp_path):
    """``ClientContext.client_init``: the same weights for a client in every call, other weights for
    another client and than the run's initial model; the resident model and the torch random
    stream are as they were."""
    job = tiny_job(algorithm={"name": "local"})
    store = open_dataset(job.dataset.name, job.dataset.config)
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store.path), str(tmp_path)))
    resident = P.clone(P.model_params(trainer.model))
    rng = torch.get_rng_state()
    first, again, other = trainer.client_init(3), trainer.client_init(3), trainer.client_init(4)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, resident[k]) for k, v in P.model_params(trainer.model).items())
    assert first.keys() == resident.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert all(not torch.equal(first[k], other[k]) for k in first if k.endswith("weight"))
    assert all(not torch.equal(first[k], resident[k]) for k in first if k.endswith("weight"))
    seen = []
    client_update = trainer.algorithm.client_update
    trainer.algorithm.client_update = lambda ctx: seen.append(ctx.client_init()) or client_update(ctx)
    trainer.train(Payload(P.to_numpy(resident)), [(0, 3)], round_num=2, options=RoundOptions())
    assert all(torch.equal(seen[0][k], first[k]) for k in first)  # what a plugin's context gives
