"""One-shot FL's locally trained client models, trained once and reused (FuseFL,
Tang et al., NeurIPS 2024, arXiv:2410.20380).

One-shot FedAvg, the logit Ensemble and the distillation baselines all start from the same M
client models, each trained alone from the run's initial model. ``local_models`` trains them in one
round through the engine and saves them; a later run of any such method with the same cache key
reads them back and trains nothing.

The cache key is the SHA-256 of the JSON of: the job's dataset section (recipe, partition, split:
which examples each client holds), its model section (the architecture and initialisation), the run
seed (the partition's and the initial model's draw, the clients' local seeds), the local training
options, and the client ids. Whatever else changes (the algorithm's name, its other options,
evaluation, resources) reuses the models. The folder ``<cache_dir>/<key>/`` holds one file per
client and a manifest of their checksums; an entry that does not verify is retrained, never used
(``raysim.train.oneshot_cache``).

What the one-shot plugins share beyond that is here too, as plain functions: the client update
that trains and keeps its model (``keep_local_model``), the training round's summary
(``LocalModels.summary``) and the weighted parameter average (``average_models``).

Usage:
    trained = local_models(services, state.params, config.local, config.cache_dir)
    services.log(trained.summary, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from raysim import params as P
from raysim.services import RoundOptions, Services
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.oneshot_cache import CacheEntry
from raysim.types import ClientContext, ClientResult, Metrics, NumpyParams, Params, Payload


class OneShotConfig(BaseModel, frozen=True, extra="forbid"):
    """The clients' one round of local training, shared by the one-shot methods."""

    local: LocalTrainConfig = LocalTrainConfig()
    # where the trained client models are kept; None: $RAYSIM_HOME (else .raysim)/oneshot_cache
    cache_dir: str | None = None

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return (
            "its clients' models come from the one-shot cache, which keys them without the privacy "
            "section, so a cached model may have trained without DP-SGD"
        )


@dataclass(frozen=True)
class LocalModels:
    """The clients' trained models and weights (examples trained on) by client id, and what a
    one-shot method logs at step 0 beside its own (``summary``): the training round's metrics
    (``services.round_metrics``, its uploads the models; none when cached) and the counts."""

    models: dict[int, NumpyParams]
    weights: dict[int, float]
    summary: Metrics = field(default_factory=dict)


def keep_local_model(ctx: ClientContext[None, None], local: LocalTrainConfig) -> ClientResult[Params, None]:
    """A one-shot client's update: trains from the payload and sends no update; the trained model
    travels as a kept local model (``RoundOptions(keep_local_models=True)``, ``local_models``)."""
    _, metrics = train_client(ctx, local)
    return ClientResult({}, examples_trained_on(metrics), metrics)


def average_models(trained: LocalModels, like: Params) -> Params:
    """The clients' models averaged, parameters and float buffers (BatchNorm statistics) alike,
    weighted by examples trained on (one-shot FedAvg); in float64, cast back to ``like``'s dtypes."""
    total = sum(trained.weights.values())
    return {
        name: torch.stack(
            [
                torch.as_tensor(trained.models[c][name]).double() * (w / total)
                for c, w in trained.weights.items()
            ]
        )
        .sum(dim=0)
        .to(like[name].dtype)
        for name in like
    }


def local_models(
    services: Services[Any], params: Params, local: LocalTrainConfig, cache_dir: str | None
) -> LocalModels:
    """Every client's model after one round of local training from ``params``, and its weight:
    read from the cache, or trained (one round, step 0) and saved there. Its ``summary`` counts
    ``oneshot/trained_clients`` (0 when all were cached) and ``oneshot/cached_clients``, and
    when trained holds the round's metrics, the models as what the clients upload
    (``sys/bytes_up``, ``sys/params_up``).

    Raises:
        RuntimeError: a client failed (the method needs every client's model).
    """
    clients = np.arange(services.info.num_clients)
    entry = CacheEntry.open(cache_dir, services.info, local, clients)  # refused before any training
    cached = entry.read(params, check_shapes=not services.info.mixes_models)
    if cached is not None:
        counts = {"oneshot/trained_clients": 0.0, "oneshot/cached_clients": float(len(clients))}
        return LocalModels(*cached, counts)
    # mixed architectures: each client starts from its own architecture's initial model
    payload: Payload[None] = Payload({} if services.info.mixes_models else P.to_numpy(params))
    out = services.train_cohort(payload, clients, 0, RoundOptions(keep_local_models=True))
    if out.failures:
        failed = [f.client_id for f in out.failures]
        raise RuntimeError(
            f"one-shot local training: clients {failed} failed; every client's model is needed"
        )
    weights = {client.client_id: client.weight for client in out.clients}
    entry.write(dict(out.local_models), weights)
    # the update is empty: what a one-shot client uploads is its model, kept apart
    uploads = {
        "sys/bytes_up": float(sum(P.num_bytes(m) for m in out.local_models.values())),
        "sys/params_up": float(sum(P.num_values(m) for m in out.local_models.values())),
    }
    counts = {"oneshot/trained_clients": float(len(clients)), "oneshot/cached_clients": 0.0}
    return LocalModels(
        dict(out.local_models), weights, services.round_metrics(out, payload) | uploads | counts
    )
