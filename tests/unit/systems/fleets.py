"""Fleets and simulated systems built small for the tests of raysim.systems, and a trace writer."""

import json

import numpy as np

from raysim.systems.devices import Fleet
from raysim.systems.rounds import (
    SimulatedSystem,
)
from raysim.systems.work import LocalWork
from raysim.train.local import LocalTrainConfig

WORK = LocalWork(epochs=2, batch_size=16)  # 50 examples: 8 steps visiting 100 examples


def fleet(speeds, bandwidths=None, sizes=None, availability=None):
    n = len(speeds)
    kwargs = {} if availability is None else {"availability": availability}
    return Fleet(
        np.full(n, 50) if sizes is None else np.asarray(sizes),
        np.asarray(speeds, dtype=float),
        np.full(n, 1e6) if bandwidths is None else np.asarray(bandwidths, dtype=float),
        **kwargs,
    )


def system(config, devices, *, epochs=2, cohort_size=3, seed=0):
    pool = np.arange(len(devices.examples_per_s))
    local = LocalTrainConfig(epochs=epochs, batch_size=16)
    return SimulatedSystem(config, devices, local, pool, cohort_size=cohort_size, model_bytes=1e6, seed=seed)


SPEEDS = [10.0, 20.0, 25.0, 40.0, 50.0, 100.0, 5.0, 80.0, 60.0, 30.0]  # examples/s, client by client


def finish_time(client):
    return 2.0 + 100 / SPEEDS[client]  # comm 2 s; 2 epochs of 50 examples


def write(tmp_path, raw, name="trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)
