"""A job's ``system:`` section made into the run's simulated clock (``raysim.systems``), and its
time-to-target checked, before any worker or MLflow run starts."""

from __future__ import annotations

from typing import Any

import numpy as np

from raysim import params as P
from raysim.algorithm import AnyAlgorithm, has_protocol
from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.engine.async_setup import check_asynchrony
from raysim.errors import ConfigError
from raysim.systems.availability import open_availability
from raysim.systems.devices import Fleet, device_speeds
from raysim.systems.rounds import SimulatedSystem
from raysim.systems.work import local_training
from raysim.types import RunInfo


def open_system(
    job: JobConfig, store: ClientStore, train_pool: np.ndarray, params: P.Params, algorithm: AnyAlgorithm[Any]
) -> SimulatedSystem | None:
    """The simulated clock of ``job`` (None without a ``system`` section).

    Clients are timed on the local training of the algorithm's config (its epochs, batch size and
    ``max_steps``), their examples per round (``engine.max_client_examples``) and the model's size
    (its parameters and float buffers), which stand for both the broadcast and the update.
    """
    check_asynchrony(job, algorithm, len(train_pool))
    config = job.system
    if config is None:
        return None
    local = local_training(job.algorithm.config)
    problems = []
    if job.engine.schedule is not None:
        problems.append(
            "system: engine.schedule fixes every round's cohort, so availability, "
            "deadlines and dropout cannot choose it; drop one of the two"
        )
    if has_protocol(algorithm):
        problems.append(
            f"system: the simulated clock times the standard round, and algorithm "
            f"{job.algorithm.name!r} runs its own protocol"
        )
    if local is None:
        problems.append(
            f"system: clients are timed on the algorithm's local training (its local: "
            f"epochs, batch_size), and algorithm {job.algorithm.name!r} has none"
        )
    if problems:
        raise ConfigError(problems)
    assert local is not None
    sizes = store.num_examples("train").astype(np.int64)
    if job.engine.max_client_examples is not None:
        sizes = np.minimum(sizes, job.engine.max_client_examples)
    speeds, bandwidths = device_speeds(config.devices, store.num_clients, job.seed)
    availability = open_availability(config.availability, store.num_clients, job.seed)
    fleet = Fleet(sizes, speeds, bandwidths, availability)
    return SimulatedSystem(
        config,
        fleet,
        local,
        train_pool,
        cohort_size=job.engine.cohort_size,
        model_bytes=float(P.num_bytes(params)),
        seed=job.seed,
    )


def check_time_to_target(job: JobConfig, info: RunInfo) -> None:
    """Refuses, before training, a target on the central test set of a dataset that has none."""
    target = job.evaluation.time_to_target
    if target is not None and target.metric.startswith("eval/central/") and not info.has_central_test:
        instead = "eval/clients/" + target.metric.removeprefix("eval/central/")
        raise ConfigError(
            [
                f"evaluation.time_to_target.metric: dataset {job.dataset.name!r} has no "
                f"central test set; use {instead} (the clients' test splits)"
            ]
        )
