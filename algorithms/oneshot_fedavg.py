"""One-shot FedAvg: every client trains alone once from the shared initial model; the server
averages the M models' parameters and BatchNorm statistics, weighted by examples (FuseFL's "FedAvg"
baseline, Tang et al., NeurIPS 2024, arXiv:2410.20380).

The client models come from ``raysim.train.oneshot.local_models``: trained in step 0, or read
from the cache when a one-shot method (this one, ``ensemble``) already trained them for the same
dataset, model, seed, local options and clients; ``oneshot/trained_clients`` says which. Every
client takes part (``engine.cohort_size`` and ``engine.num_rounds`` are not used). The average is
the run's global model, evaluated and logged at step 0 like a round's.
"""

from __future__ import annotations

from dataclasses import replace

from raysim.aggregate import Gathered
from raysim.registry import register
from raysim.services import Services
from raysim.train.oneshot import OneShotConfig, average_models, keep_local_model, local_models
from raysim.types import ClientContext, ClientResult, Params, ServerState


@register("algorithm", "oneshot_fedavg")
class OneShotFedAvg:
    """One-shot FedAvg: one round of local training, one weighted parameter average."""

    Config = OneShotConfig

    def __init__(self, config: OneShotConfig) -> None:
        self.config = config

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        return keep_local_model(ctx, self.config.local)

    def protocol(
        self, services: Services[Gathered[ClientResult[Params, None]]], state: ServerState[None]
    ) -> ServerState[None]:
        trained = local_models(services, state.params, self.config.local, self.config.cache_dir)
        state = replace(state, params=average_models(trained, state.params))
        services.log(trained.summary | services.evaluate(state, 0), 0)
        return state
