"""The worker's per-round preparation of the payload, on a real store."""

import numpy as np
import torch

from jobs import tiny_job
from raysim import params as P
from raysim.data.prepare import open_dataset
from raysim.runtime.worker import ClientTrainer, RoundOptions, WorkerSetup
from raysim.types import Payload


def test_payload_extras_reach_the_device_once_per_round(tmp_path):
    """Every client of the worker sees the same tensors: moved once, not once per client."""
    job = tiny_job(algorithm={"name": "scaffold"})
    store = open_dataset(job.dataset.name, job.dataset.config)
    trainer = ClientTrainer(WorkerSetup(job.to_dict(), str(store.path), str(tmp_path)))
    seen = []
    client_update = trainer.algorithm.client_update

    def recording_update(ctx):
        seen.append((ctx.payload.extra["c"], ctx.device))
        return client_update(ctx)

    trainer.algorithm.client_update = recording_update
    params = P.to_numpy(P.model_params(trainer.model))
    variate = {k: np.zeros_like(v) for k, v in params.items()}
    payload = Payload(params, extra={"c": variate})
    report = trainer.train(payload, [(0, 3), (1, 4)], round_num=0, options=RoundOptions())
    assert not report.failures and len(seen) == 2
    (first, device), (second, _) = seen
    assert all(isinstance(v, torch.Tensor) and v.device == device for v in first.values())
    assert all(first[k] is second[k] for k in first)
