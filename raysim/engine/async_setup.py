"""A job's ``engine.asynchrony`` checked against the rest of the job and its plugin, before any
worker or MLflow run starts: each problem one line that names the fix."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from raysim.aggregate import WeightedMean
from raysim.algorithm import AnyAlgorithm, has_protocol, plugin_hook
from raysim.config import JobConfig
from raysim.config.plugins import update_delta
from raysim.config.robust import ALIE, cohort_problems
from raysim.errors import ConfigError
from raysim.plugin_defaults import aggregator_of, client_state_type

WHY = "engine.asynchrony"


def check_asynchrony(job: JobConfig, algorithm: AnyAlgorithm[Any], population: int) -> None:
    """Refuses what asynchronous FL cannot honour (docs/systems.md, "Asynchronous FL").

    Raises:
        ConfigError: every problem found, one line each.
    """
    config = job.engine.asynchrony
    if config is None:
        return
    problems = [
        f"{WHY}: {p}"
        for p in job_problems(job, population)
        + plugin_problems(job.algorithm.name, algorithm, job.algorithm.config)
    ]
    if problems:
        raise ConfigError(problems)


def job_problems(job: JobConfig, population: int) -> list[str]:
    config, engine = job.engine.asynchrony, job.engine
    assert config is not None
    problems = []
    if job.system is None:
        problems.append(
            "clients start and finish on the simulated clock: add a system: section (docs/systems.md)"
        )
    elif job.system.over_commit != 1:
        problems.append(
            "system.over_commit draws extra clients for a round; asynchronous slots have no rounds: remove it"
        )
    if config.updates_per_step > config.concurrency:
        problems.append(
            f"buffer_size {config.updates_per_step} is above concurrency {config.concurrency}: the buffer "
            f"would wait on clients launched after it began filling; lower buffer_size or raise concurrency"
        )
    if config.concurrency > population:
        problems.append(
            f"concurrency {config.concurrency} is above the {population} training clients; lower it"
        )
    if engine.selection is not None and engine.selection.kind != "uniform":
        problems.append(
            f"engine.selection {engine.selection.kind} learns from whole rounds; asynchronous clients "
            f"are drawn uniformly: remove it"
        )
    if engine.schedule is not None:
        problems.append(
            "engine.schedule fixes each round's cohort; asynchronous clients start when a slot frees: "
            "remove it"
        )
    if job.evaluation.probes:
        problems.append("evaluation.probes measure a synchronous round's clients: remove them")
    if job.compression is not None and job.compression.download is not None:
        problems.append(
            "compression.download encodes one broadcast a round as a change from the model every "
            "client holds; asynchronous clients start from different versions: unset it (upload works)"
        )
    return problems + robust_problems(job)


def robust_problems(job: JobConfig) -> list[str]:
    """A robust rule (or ALIE) applies to each FedBuff step's whole buffer (``async_robust``)."""
    config, rule = job.engine.asynchrony, job.robust
    assert config is not None
    if rule is None and not isinstance(job.attack, ALIE):
        return []
    if config.kind == "fedasync":
        return [
            "robust rules and ALIE compare a step's updates, and FedAsync folds one update a step (a "
            "rule over one update is that update): use kind fedbuff, or unset robust and attack.alie"
        ]
    return [] if rule is None else cohort_problems(rule, config.updates_per_step, "buffer", "buffer_size")


def plugin_problems(name: str, algorithm: AnyAlgorithm[Any], config: BaseModel) -> list[str]:
    """Only FedAvg-family plugins: clients send a delta, folded by ``WeightedMean``, no more."""
    fix = "use a FedAvg-family plugin (fedavg, fedavgm, fedadam, fedprox, ...)"
    if has_protocol(algorithm):
        return [f"algorithm {name!r} runs its own protocol, not rounds of client deltas; {fix}"]
    if not isinstance(aggregator_of(algorithm), WeightedMean):
        return [
            f"algorithm {name!r} does not average client deltas (its aggregator is not WeightedMean); {fix}"
        ]
    for hook, what in (
        ("pseudo_gradient", "its aggregate is not a mean delta"),
        ("client_payload", "it sends each client its own part"),
    ):
        if plugin_hook(algorithm, hook) is not None:
            return [f"algorithm {name!r}: {what}; {fix}"]
    if client_state_type(algorithm) is not None:
        return [f"algorithm {name!r} keeps client state, whose order of writes asynchrony changes; {fix}"]
    if update_delta(type(algorithm), config) != "":
        return [f"algorithm {name!r}: its clients' updates are not parameter deltas (UPDATE_DELTA); {fix}"]
    return []
