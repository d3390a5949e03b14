"""Probes: evaluation that rides along with a round, measured where the data is.

A probe has two halves, like a plugin. On the worker, ``before_training`` and ``after_training``
see each client of a round it is due on, with the model under the broadcast weights and then as
the client left it; each returns a few numbers for that client. On the driver, ``summarize``
turns the round's rows (and, if the probe keeps them, the clients' local models) into metrics,
using the engine's verbs (``Services.map_clients``) for any further evaluation. Measuring never
changes training: the hooks run in eval mode without gradients, and the worker restores train
mode before ``client_update``.

This module holds the contract. The built-in probes are in ``raysim.measure``: those of the round's
clients in ``raysim.measure.barrier``, those of the round's local models (``group_barrier``,
``loss_decomposition``) in ``raysim.measure.connectivity``.
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
        def summarize(self, probe_round: ProbeRound, services: Services[object]) -> Metrics: ...
        def check(self, info: RunInfo) -> None: ...  # optional: refuse a run it cannot measure
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from pydantic import BaseModel, Field
from torch import nn

from raysim.errors import ConfigError
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


def measured(hook: Callable[[ClientView], Metrics], view: ClientView) -> Metrics:
    """A probe hook in eval mode without gradients: measuring must not change training (no
    BatchNorm statistics updated, no gradients left behind)."""
    view.model.eval()
    with torch.no_grad():
        return hook(view)


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

    def summarize(self, probe_round: ProbeRound, services: Services[object]) -> Metrics: ...

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
