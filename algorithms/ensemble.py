"""The logit Ensemble: the M locally trained client models kept side by side, predicting by the
mean of their raw logits (FuseFL's "Ensemble" baseline, its upper bound of ensemble and
distillation one-shot FL; the official code averages logits, not probabilities; notes/fusefl.md
section 2.10 item 11 and section 3).

The client models come from ``raysim.train.oneshot.local_models`` (trained in step 0, or read
from the cache that ``oneshot_fedavg`` and this plugin share; ``oneshot/trained_clients`` says
which). Every client takes part. Logged at step 0: ``eval/central/accuracy`` and
``eval/central/loss`` (cross-entropy of the mean logits) on the central test set (and a poisoned
job's ``eval/central/backdoor_accuracy`` on its triggered test set), the same pooled
over every client's test split (``eval/clients/*``), and
``ensemble/params`` and ``ensemble/mib``, the M models' parameters and float buffers (Table 4's
M x S). The run's global model stays the initial one: the ensemble is not one parameter set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raysim.aggregate import Gathered
from raysim.measure.pooling import pool_rows
from raysim.registry import register
from raysim.services import LABELS, LOGITS, MapRequest, Services
from raysim.train.oneshot import OneShotConfig, keep_local_model, local_models
from raysim.types import ClientContext, ClientResult, Metrics, NumpyParams, Params, ServerState


@register("algorithm", "ensemble")
class Ensemble:
    """The logit Ensemble of the M one-shot local models (mean of raw logits)."""

    Config = OneShotConfig
    MIXED_MODELS = True  # the clients' models may be different architectures (model_groups)

    def __init__(self, config: OneShotConfig) -> None:
        self.config = config

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        return keep_local_model(ctx, self.config.local)

    def protocol(
        self, services: Services[Gathered[ClientResult[Params, None]]], state: ServerState[None]
    ) -> ServerState[None]:
        trained = local_models(services, state.params, self.config.local, self.config.cache_dir)
        models = [trained.models[c] for c in sorted(trained.models)]
        metrics = trained.summary
        size = sum(int(np.asarray(w).size) for model in models for w in model.values())
        metrics |= {"ensemble/params": float(size), "ensemble/mib": size * 4 / 2**20}
        sections = [services.info.model_of(c) for c in sorted(trained.models)]
        if services.info.has_central_test:
            [central] = ensemble_scores(services, models, None, sections)
            metrics |= {f"eval/central/{k}": v for k, v in central.items()}
            for triggered in ensemble_scores(services, models, None, sections, "triggered"):  # poisoned job
                metrics["eval/central/backdoor_accuracy"] = triggered["accuracy"]
        clients = list(range(services.info.num_clients))
        per_client = ensemble_scores(services, models, clients, sections)
        pooled = pool_rows(per_client)
        if pooled is not None:
            metrics |= {f"eval/clients/{k}": pooled[k] for k in ("accuracy", "loss")}
        services.log(metrics, 0)
        return state


def ensemble_scores(
    services: Services[object],
    models: list[NumpyParams],
    clients: list[int] | None,
    sections: list[dict[str, Any]] | None = None,
    split: str = "test",
) -> list[Metrics]:
    """Accuracy, cross-entropy and examples of the models' mean logits, on the central test set
    (``clients`` None: one row) or on each client's test split; ``sections``: each model's
    architecture where they differ (model_groups), the points of one architecture mapped together;
    ``split`` "triggered": on a poisoned job's triggered central test set (no row when the job is
    not poisoned)."""
    if sections is None or len({repr(s) for s in sections}) == 1:
        rows = services.map_clients(MapRequest(LOGITS, models, clients, split))
    else:
        rows = []
        for section in {repr(s): s for s in sections}.values():
            same = [m for m, s in zip(models, sections) if s == section]
            rows += services.map_clients(MapRequest(LOGITS, same, clients, split, model=section))
    [labels] = services.map_clients(MapRequest(LABELS, models[:1], clients, split))
    out: list[Metrics] = []
    for position, y in enumerate(labels):
        if y is None or not len(y):
            continue
        logits = torch.stack([torch.as_tensor(row[position]) for row in rows]).float().mean(dim=0)
        target = torch.as_tensor(y).long()
        out.append(
            {
                "accuracy": float((logits.argmax(dim=1) == target).float().mean()),
                "loss": float(torch.nn.functional.cross_entropy(logits, target)),
                "num_examples": float(len(target)),
            }
        )
    return out
