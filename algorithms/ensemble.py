"""The logit Ensemble: the M locally trained client models kept side by side, predicting by the
mean of their raw logits (FuseFL's "Ensemble" baseline, its upper bound of ensemble and
distillation one-shot FL; the official code averages logits, not probabilities; Tang et al.,
NeurIPS 2024, arXiv:2410.20380).

The client models come from ``raysim.train.oneshot.local_models`` (trained in step 0, or read
from the cache that ``oneshot_fedavg`` and this plugin share; ``oneshot/trained_clients`` says
which). Every client takes part. Logged at step 0: the ensemble evaluated as the job's evaluation plan
evaluates a global model (``services.evaluate_weights``): ``eval/central/accuracy`` and
``eval/central/loss`` (cross-entropy of the mean logits) on the central test set (and a poisoned
job's ``eval/central/backdoor_accuracy`` on its triggered test set), the same on the plan's
clients' test splits (``eval/clients/*``), and
``ensemble/params`` and ``ensemble/mib``, the M models' parameters and float buffers (Table 4's
M x S). The run's global model stays the initial one: the ensemble is not one parameter set.
"""

from __future__ import annotations

import numpy as np

from raysim.aggregate import Gathered
from raysim.registry import register
from raysim.services import Services
from raysim.train.oneshot import OneShotConfig, keep_local_model, local_models
from raysim.types import ClientContext, ClientResult, Params, ServerState


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
        size = sum(int(np.asarray(w).size) for model in models for w in model.values())
        metrics = trained.summary | {"ensemble/params": float(size), "ensemble/mib": size * 4 / 2**20}
        # each member in its own architecture where the clients' differ (model_groups)
        sections = (
            [services.info.model_of(c) for c in sorted(trained.models)]
            if services.info.mixes_models
            else None
        )
        metrics |= services.evaluate_weights(models, sections)
        services.log(metrics, 0)
        return state
