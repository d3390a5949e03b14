"""A job's privacy checked against its data and plugin, and central DP's ledger built, before training.

Every combination whose guarantee would be wrong, or that no accountant can compute, is refused
here with the fix (docs/privacy.md): a server that does not sum client updates, a delta not below
1 / population, sampling the accountant cannot trust (a fixed schedule, a simulated system that
drops clients), Poisson sampling for a plugin that needs a fixed cohort, a target epsilon no noise
reaches, a budget the rounds would exceed.

Usage:
    privacy = open_privacy(job, algorithm, train_pool, store.num_examples("train"), checkpoint)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console

from raysim.aggregate import Summing
from raysim.algorithm import AnyAlgorithm, has_protocol
from raysim.checkpoint import Checkpoint
from raysim.config import JobConfig
from raysim.errors import ConfigError
from raysim.plugin_defaults import aggregator_of
from raysim.privacy.client_counts import ClientCounts
from raysim.privacy.ledger import PrivacyLedger
from raysim.privacy.run_privacy import RunPrivacy
from raysim.privacy.spending import Spending, spending_of


def privacy_problems(
    job: JobConfig, algorithm: AnyAlgorithm[Any], population: int, most_examples: int = 1
) -> list[str]:
    """What makes this job's privacy (or its Poisson sampling) impossible to honour with its plugin
    and data, one line each; the checks of the config alone ran when it was read
    (``raysim.config.privacy.sampling_problems``)."""
    name, privacy, staged = job.algorithm.name, job.privacy, has_protocol(algorithm)
    problems = []
    if job.engine.sampling == "poisson" and staged:
        problems.append(
            f"engine.sampling: poisson draws cohorts of varying size; {name} runs its own protocol "
            f"over the clients it picks and needs a fixed cohort: set engine.sampling: fixed"
        )
    if privacy is None:
        return problems
    if privacy.local is not None and staged:
        problems.append(
            f"privacy.local: {name} runs its own protocol, whose clients may send more than the update "
            f"local DP noises (their local models); local DP applies to plugins that run the round loop"
        )
    if privacy.delta is not None and privacy.delta >= 1 / population:
        problems.append(
            f"privacy.delta: {privacy.delta:g} is not below 1 / population (1/{population} = "
            f"{1 / population:.3g}): a guarantee that lets one client of {population} leak is none; "
            f"set it below, e.g. {0.1 / population:.1g}"
        )
    if privacy.sample is not None and privacy.delta is not None and privacy.delta >= 1 / most_examples:
        problems.append(
            f"privacy.delta: {privacy.delta:g} is not below 1 / examples of the largest client "
            f"(1/{most_examples}): DP-SGD's guarantee would let one of its examples leak; set it "
            f"below, e.g. {0.1 / most_examples:.1g}"
        )
    if privacy.central is not None:
        problems += central_problems(name, algorithm, staged)
    return problems


def central_problems(name: str, algorithm: AnyAlgorithm[Any], staged: bool) -> list[str]:
    """Why the plugin's server cannot take central DP: no round loop, or no sum to clip."""
    if staged:
        return [
            f"privacy.central: {name} runs its own protocol, whose releases the accountant cannot count; "
            f"central DP applies to plugins that run the round loop (docs/privacy.md)"
        ]
    aggregator = aggregator_of(algorithm)
    if not isinstance(aggregator, Summing):
        return [
            f"privacy.central: {name}'s server does not sum client updates into a mean (it aggregates "
            f"with {type(aggregator).__name__}), so no clip bounds what one client moves; central DP "
            f"applies to plugins whose aggregator is a WeightedMean or FedFish's (docs/privacy.md)"
        ]
    return []


def open_privacy(
    job: JobConfig,
    algorithm: AnyAlgorithm[Any],
    train_pool: np.ndarray,
    examples: np.ndarray,
    checkpoint: Checkpoint | None,
) -> RunPrivacy | None:
    """The run's privacy (None without ``privacy:``): central DP's ledger, its noise calibrated and
    its budget checked, and the clients' counts; a resumed run's from its checkpoint.

    Raises:
        ConfigError: any of ``privacy_problems``, or a noise or budget that cannot be met.
        CheckpointError: the checkpoint's privacy state does not continue this job's.
    """
    problems = privacy_problems(job, algorithm, len(train_pool), int(examples[train_pool].max()))
    if problems:
        raise ConfigError(problems)
    privacy = job.privacy
    if privacy is None:
        return None
    ledger = open_ledger(job, train_pool, examples) if privacy.central is not None else None
    local = privacy.local is not None or privacy.sample is not None
    run_privacy = RunPrivacy(ledger, ClientCounts(privacy, job.algorithm.name) if local else None)
    if checkpoint is not None:
        run_privacy.restore(checkpoint.privacy, str(checkpoint.path))
    return run_privacy


def open_ledger(job: JobConfig, train_pool: np.ndarray, examples: np.ndarray) -> PrivacyLedger:
    """Central DP's ledger: the noise calibrated, the budget checked, said on the console."""
    assert job.privacy is not None
    engine = job.engine
    try:
        spending = spending_of(
            job.privacy, engine.sampling, len(train_pool), engine.cohort_size, engine.num_rounds
        )
    except ValueError as exc:
        raise ConfigError([f"privacy.central: {exc}"]) from None
    allowed = rounds_allowed(job, spending)
    Console(stderr=True).print(describe(job, spending, allowed), highlight=False, soft_wrap=True)
    return PrivacyLedger.of(job, spending, examples[train_pool], allowed)


def rounds_allowed(job: JobConfig, spending: Spending) -> int | None:
    """The rounds the budget allows when they are fewer than the job's (``when_reached: stop``);
    None when the whole run fits. Refuses a run that would exceed it (``refuse``) or fit no round."""
    privacy, rounds = job.privacy, job.engine.num_rounds
    if privacy is None or privacy.budget is None:
        return None
    budget = privacy.budget
    total = spending.epsilon(rounds)
    if total <= budget.epsilon:
        return None
    allowed = spending.rounds_within(budget.epsilon, rounds)
    if budget.when_reached == "refuse" or allowed == 0:
        raise ConfigError(
            [
                f"privacy.budget: {rounds} rounds spend epsilon {total:.3g} at delta {privacy.delta:g}, "
                f"over the budget's {budget.epsilon:g}; {allowed} rounds fit: set engine.num_rounds="
                f"{allowed}, raise the noise, or set privacy.budget.when_reached: stop"
                if allowed
                else f"privacy.budget: one round already spends more than epsilon {budget.epsilon:g}; "
                f"raise the noise or the budget"
            ]
        )
    return allowed


def describe(job: JobConfig, spending: Spending, allowed: int | None) -> str:
    """One console line: the noise, and what the run will spend."""
    rounds = allowed if allowed is not None else job.engine.num_rounds
    delta = job.privacy.delta if job.privacy is not None else None
    stop = (
        f", stopping after {allowed} of {job.engine.num_rounds} rounds (budget)"
        if allowed is not None
        else ""
    )
    return (
        f"privacy: central DP, noise multiplier {spending.noise_multiplier:.4g}, epsilon "
        f"{spending.epsilon(rounds):.3g} at delta {delta:g} after {rounds} rounds{stop}"
    )
