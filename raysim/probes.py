"""Probes: evaluation that rides along with a round, measured where the data is.

A probe has two halves, like a plugin. On the worker, ``before_training`` and ``after_training``
see each client of a round it is due on, with the model under the broadcast weights and then as
the client left it; each returns a few numbers for that client. On the driver, ``summarize``
turns the round's rows (and, if the probe keeps them, the clients' local models) into metrics,
using the engine's verbs (``Services.map_clients``) for any further evaluation. Measuring never
changes training: the hooks run in eval mode without gradients, and the worker restores train
mode before ``client_update``.

This module holds the contract and the probes of the round's clients; the probes of the round's
local models (``group_barrier``, ``loss_decomposition``) are ``raysim.connectivity_probes``'.
Probes are configured under ``evaluation.probes`` in a job, each with its cadence:

    evaluation:
      probes: [{name: client_server_barrier, every: 5}, {name: local_accuracy, every: 10}]

Usage (a new probe):
    @register("probe", "my_probe")
    class MyProbe:
        Config = ProbeConfig
        keeps_local_models = False
        def __init__(self, config: ProbeConfig) -> None: self.config = config
        def before_training(self, view: ClientView) -> Metrics: return {}
        def after_training(self, view: ClientView) -> Metrics: return view.evaluate(view.data)
        def summarize(self, round: ProbeRound, services: Services[object]) -> Metrics: ...
        def check(self, info: RunInfo) -> None: ...  # optional: refuse a run it cannot measure
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from pydantic import BaseModel, Field
from torch import nn

from raysim import scores
from raysim.errors import ConfigError
from raysim.pooling import pool_rows
from raysim.registry import register
from raysim.services import Services
from raysim.types import ClientData, Metrics, NumpyParams, RunInfo


class ProbeConfig(BaseModel, frozen=True, extra="forbid"):
    """Options every probe has; a probe's own ``Config`` subclasses this."""

    every: int = Field(1, ge=1)  # measure after every ``every``-th round


@dataclass(frozen=True)
class ClientView:
    """One client of a round as a probe's worker half sees it.

    Attributes:
        model: the worker's resident model: under the broadcast weights in ``before_training``,
            as the client left it in ``after_training``. Read it, never change it.
        data: the client's training data this round (after ``engine.max_client_examples``).
        evaluate: the model as it is now on some data (eval mode, no gradients): loss, accuracy,
            num_examples.
        test_data: reads the client's test split.
    """

    client_id: int
    round_num: int
    model: nn.Module
    data: ClientData
    evaluate: Callable[[ClientData], Metrics]
    test_data: Callable[[], ClientData]


@dataclass(frozen=True)
class ProbeRound:
    """What a probe's driver half receives after the server update of a round it was due on.

    Attributes:
        rows: per client (cohort order), the probe's hook results plus ``client_id``.
        broadcast: the global params the clients started from.
        global_params: the new global params, after the server optimizer.
        pure_aggregate: the clients' aggregate alone (server SGD with lr 1 on the round's
            pseudo-gradient), when the plugin exposes a pseudo-gradient; else None.
        local_models: client id -> local params, when the probe ``keeps_local_models``.
    """

    round_num: int
    rows: list[Metrics]
    broadcast: NumpyParams
    global_params: NumpyParams
    pure_aggregate: NumpyParams | None = None
    local_models: dict[int, NumpyParams] = field(default_factory=dict)

    @property
    def client_ids(self) -> list[int]:
        return [int(row["client_id"]) for row in self.rows]


class Probe(Protocol):
    """A measurement of rounds; see the module docstring for the contract."""

    keeps_local_models: bool  # the round's local models are gathered for ``summarize``

    @property  # read-only, so that a probe's own subclass satisfies it (see ``Algorithm.Config``)
    def Config(self) -> type[ProbeConfig]: ...

    @property
    def config(self) -> ProbeConfig: ...

    def before_training(self, view: ClientView) -> Metrics: ...

    def after_training(self, view: ClientView) -> Metrics: ...

    def summarize(self, round: ProbeRound, services: Services[object]) -> Metrics: ...

    # Optional: ``check(info: RunInfo) -> None`` raises ConfigError when the probe cannot measure
    # this run (a task or data it needs); ``build`` calls it before any worker starts.


def is_due(probe: Probe, round_num: int) -> bool:
    return (round_num + 1) % probe.config.every == 0


def check_probes(probes: dict[str, Probe], info: RunInfo) -> None:
    """Each probe's optional ``check`` hook: a probe that cannot measure this run says so before
    training, not at its first due round.

    Raises:
        ConfigError: every problem the probes found.
    """
    problems: list[str] = []
    for probe in probes.values():
        check = getattr(probe, "check", None)
        if callable(check):
            try:
                check(info)
            except ConfigError as exc:
                problems += exc.problems
    if problems:
        raise ConfigError(problems)


class BarrierConfig(ProbeConfig, frozen=True, extra="forbid"):
    pure_aggregate: bool = True  # also the barrier of the aggregate before the server optimizer


@register("probe", "client_server_barrier")
class ClientServerBarrier:
    """FedFish's client-server barrier (eq. 5): what aggregation loses on each client's own data.

    On a due round each client's round data is evaluated under its local model (worker) and
    under the new global model (driver, spread over the workers):
    ``barrier/loss = mean_i(L_i(global) - L_i(local_i))``, ``barrier/error = mean_i(acc_i(local_i)
    - acc_i(global))`` (absolute differences; no ``error`` for a regression task), unweighted over
    the cohort; lower is better, 0 means aggregation lost nothing. The server optimizer moves the
    model after aggregating (server Adam's steps have a size of their own), so ``barrier/pure/*``
    measures the aggregate alone, server SGD with lr 1 on the pseudo-gradient, as
    notes/fedfish.md section 3.4 decides.
    """

    Config = BarrierConfig
    keeps_local_models = False

    def __init__(self, config: BarrierConfig) -> None:
        self.config = config

    def before_training(self, view: ClientView) -> Metrics:
        return _loss_and_accuracy(view.evaluate(view.data), "start_")

    def after_training(self, view: ClientView) -> Metrics:
        return _loss_and_accuracy(view.evaluate(view.data), "local_")

    def summarize(self, round: ProbeRound, services: Services[object]) -> Metrics:
        points = [round.global_params]
        if self.config.pure_aggregate and round.pure_aggregate is not None:
            points.append(round.pure_aggregate)
        after = services.map_clients(
            "evaluate", points, round.client_ids, split="round", round_num=round.round_num
        )
        metrics = summarize_barrier(round.rows, after[0], "barrier")
        if len(after) > 1:
            metrics |= summarize_barrier(round.rows, after[1], "barrier/pure")
        return metrics


def summarize_barrier(before: list[Metrics], after: list[Metrics | None], scope: str) -> Metrics:
    """The barrier over clients with data: ``before`` holds each client's ``start_*`` and
    ``local_*`` numbers, ``after`` the same data under the aggregated model (same order)."""
    pairs = [(b, a) for b, a in zip(before, after) if a is not None]
    if not pairs:
        return {}

    def mean(values: list[float]) -> float:
        return float(np.mean(values))

    out = {
        f"{scope}/loss": mean([a["loss"] - b["local_loss"] for b, a in pairs]),
        f"{scope}/start_loss": mean([b["start_loss"] for b, _ in pairs]),
        f"{scope}/local_loss": mean([b["local_loss"] for b, _ in pairs]),
        f"{scope}/global_loss": mean([a["loss"] for _, a in pairs]),
    }
    if all("accuracy" in a for _, a in pairs):  # a regression task has none
        out |= {
            f"{scope}/error": mean([b["local_accuracy"] - a["accuracy"] for b, a in pairs]),
            f"{scope}/local_accuracy": mean([b["local_accuracy"] for b, _ in pairs]),
            f"{scope}/global_accuracy": mean([a["accuracy"] for _, a in pairs]),
        }
    return out


def _loss_and_accuracy(row: Metrics, prefix: str) -> Metrics:
    """An evaluation's loss and accuracy (where the task has one), named with ``prefix``."""
    return {f"{prefix}{key}": row[key] for key in ("loss", "accuracy") if key in row}


@register("probe", "local_accuracy")
class LocalAccuracy:
    """Pre-aggregation accuracy: each client's local model on its own test split, before the
    server aggregates (the "Local" numbers FedGuCci and IMA report beside the global model's).

    Logs ``local/test_accuracy`` and ``local/test_loss`` (the examples, tokens for a causal LM, of
    the cohort's clients that have a test split pooled: ``raysim.pooling.pool_rows``), the
    dataset's scores so (``local/test_mcc``: MCC, F1, Pearson, from the summed statistics; no
    accuracy for a regression task), and each one's unweighted mean over clients (``_mean``).
    """

    Config = ProbeConfig
    keeps_local_models = False

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config

    def before_training(self, view: ClientView) -> Metrics:
        return {}

    def after_training(self, view: ClientView) -> Metrics:
        test = view.test_data()
        return view.evaluate(test) if len(test) else {}

    def summarize(self, round: ProbeRound, services: Services[object]) -> Metrics:
        pooled = pool_rows(round.rows)
        if pooled is None:
            return {}
        out: Metrics = {}
        for key in sorted(set(scores.without_sums(pooled)) - {"num_examples"}):
            values = [row[key] for row in round.rows if row.get("num_examples", 0) > 0 and key in row]
            out[f"local/test_{key}"] = pooled[key]
            out[f"local/test_{key}_mean"] = float(np.mean(values))
        return out
