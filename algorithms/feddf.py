"""FedDF one-shot: the clients' one-shot models fused by ensemble distillation on the server
(Lin et al., "Ensemble Distillation for Robust Model Fusion in Federated Learning", NeurIPS 2020,
arXiv:2006.07242), as FuseFL compares it (Tang et al., NeurIPS 2024, arXiv:2410.20380): one
round, then the server
distils the mean of the M client models' logits into one model on an unlabeled transfer set.

The client models come from ``raysim.train.oneshot.local_models`` (the cache the one-shot methods
share). The student starts at their weighted average (one-shot FedAvg's model, as FedDF
initializes its fusion) and follows ``raysim.train.distill.distill_on_set``: Adam at 1e-3 with
cosine annealing over at most 10^4 steps of KL to the ensemble's averaged logits, early stopped
on a labelled validation set (patience 10^3 steps), the best student kept.

The transfer set is ``transfer.split`` of every client of the job's store, or with
``transfer.store`` (an ``evaluation.transfer`` dataset's name) that dataset's central test set
(read before any training: a store the job lacks is refused first); a seeded
``transfer.validation_share`` of its rows, with labels, is the server's validation set, the rest
is used without labels. The default, the clients' test splits, keeps the training data and the
central test set out of it. Logged at step 0: the global (distilled) model's evaluation,
``feddf/steps``, ``feddf/best_step``, ``feddf/loss``, ``feddf/transfer_examples`` and (with a
validation share) ``feddf/validation_accuracy``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, Field

from raysim import params as P
from raysim.aggregate import Gathered
from raysim.errors import ConfigError
from raysim.models import build_with_params
from raysim.registry import register
from raysim.services import INPUTS, LABELS, LOGITS, MapRequest, Services
from raysim.train.distill import DistillConfig, distill_on_set
from raysim.train.oneshot import OneShotConfig, average_models, keep_local_model, local_models
from raysim.types import ClientContext, ClientResult, NumpyParams, Params, ServerState


class TransferSetConfig(BaseModel, frozen=True, extra="forbid"):
    """The server's unlabeled transfer data and its labelled validation share."""

    store: str = ""  # an evaluation.transfer dataset's name (its central test set); "": the job's clients
    split: Literal["test", "train", "validation"] = "test"  # whose rows, of every client
    validation_share: float = Field(0.2, ge=0, lt=1)  # rows kept, labelled, for early stopping; 0: none


class FedDFConfig(OneShotConfig, frozen=True, extra="forbid"):
    """One-shot local training (shared) and the server's distillation."""

    transfer: TransferSetConfig = TransferSetConfig()
    distill: DistillConfig = DistillConfig()


@register("algorithm", "feddf")
class FedDF:
    """FedDF one-shot: the averaged client models distilled from their logit ensemble."""

    Config = FedDFConfig

    def __init__(self, config: FedDFConfig) -> None:
        self.config = config

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        return keep_local_model(ctx, self.config.local)

    def protocol(
        self, services: Services[Gathered[ClientResult[Params, None]]], state: ServerState[None]
    ) -> ServerState[None]:
        transfer = read_transfer_set(services, self.config.transfer, state.params)  # before training
        trained = local_models(services, state.params, self.config.local, self.config.cache_dir)
        teacher = transfer.mean_logits(services, [trained.models[c] for c in sorted(trained.models)])
        rows = np.random.default_rng([services.info.seed, 0xFEDDF]).permutation(len(transfer.x))
        held = rows[: int(round(self.config.transfer.validation_share * len(rows)))]
        used = rows[len(held) :]
        student = build_with_params(
            services.info.model, services.info.spec, average_models(trained, state.params)
        )
        validation = (transfer.x[held], transfer.y[held]) if len(held) else None
        generator = torch.Generator().manual_seed(services.info.seed)
        report = distill_on_set(
            student, transfer.x[used], teacher[used], validation, self.config.distill, generator
        )
        own = student.state_dict()
        state = replace(state, params={k: own[k].detach().clone() for k in state.params})
        metrics = {
            "feddf/steps": float(report.steps),
            "feddf/best_step": float(report.best_step),
            "feddf/loss": report.last_loss,
            "feddf/transfer_examples": float(len(used)),
        } | ({"feddf/validation_accuracy": report.best_accuracy} if validation is not None else {})
        services.log(trained.summary | metrics | services.evaluate(state, 0), 0)
        return state


@dataclass(frozen=True)
class TransferSet:
    """The transfer rows in client order (``x``, and ``y`` for validation only) and the request
    that reads them, whose clients with rows are ``kept``."""

    request: MapRequest[np.ndarray]
    kept: list[int]
    x: torch.Tensor
    y: torch.Tensor

    def mean_logits(self, services: Services[object], models: list[NumpyParams]) -> torch.Tensor:
        """The mean of ``models``' logits on the rows, computed on the workers, (n, C)."""
        logits = services.map_clients(replace(self.request, points=models))  # [point][client] (n_c, C)
        return torch.cat(
            [torch.stack([torch.as_tensor(row[i]) for row in logits]).float().mean(dim=0) for i in self.kept]
        )


def read_transfer_set(services: Services[object], transfer: TransferSetConfig, params: Params) -> TransferSet:
    """Every client's ``transfer.split`` rows of the job's store, or with ``transfer.store`` that
    transfer dataset's central test set (``params`` is a placeholder point: the rows need one).

    Raises:
        ConfigError: a store the job lacks (from ``map_clients``), or no rows there.
    """
    clients = list(range(services.info.num_clients)) if not transfer.store else None
    request = MapRequest(LOGITS, [P.to_numpy(params)], clients, split=transfer.split, store=transfer.store)
    [inputs] = services.map_clients(replace(request, task=INPUTS))
    [labels] = services.map_clients(replace(request, task=LABELS))
    kept = [i for i, x in enumerate(inputs) if x is not None]
    if not kept:
        where = f"transfer dataset {transfer.store!r}" if transfer.store else "the clients"
        raise ConfigError(
            [f"algorithm.transfer: no {transfer.split!r} rows in {where}; choose another split"]
        )
    x = torch.cat([torch.as_tensor(inputs[i]) for i in kept]).float()
    return TransferSet(request, kept, x, torch.cat([torch.as_tensor(labels[i]) for i in kept]).long())
