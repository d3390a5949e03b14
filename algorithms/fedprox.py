"""FedProx: FedAvg plus a proximal term in local training (Li et al., MLSys 2020, arXiv:1812.06127).

Each client minimises ``loss(w) + (mu / 2) * ||w - w_global||^2`` over its trainable parameters;
the term's gradient ``mu (w - w_global)`` is added to each gradient after the backward pass. The
term is written once, as a ``ClientChange``, for the sequential and the vectorized trainer.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.client_change import ClientChange, GradientEdit, Weights
from raysim.train.local import LocalHooks, LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.train.vectorized import train_clients
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedProxConfig(BaseModel, frozen=True, extra="forbid"):
    """FedProx: FedAvg with a proximal term (mu/2)||w - w_global||^2 (Li et al. 2020)."""

    mu: float = Field(0.01, ge=0)
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


def proximal_gradient(mu: float, anchor: Weights) -> GradientEdit:
    """A gradient edit adding mu·(w − anchor), the gradient of (mu/2)·||w − anchor||²."""

    def edit(weights: Weights, grads: Weights, own: Weights) -> Weights:
        return {k: g.add(weights[k] - anchor[k], alpha=mu) for k, g in grads.items()}

    return edit


@register("algorithm", "fedprox")
class FedProx:
    """FedProx: FedAvg whose clients add a proximal term to their local loss."""

    Config = FedProxConfig
    UPDATE_DELTA = ""  # compression encodes the update, a parameter delta

    def __init__(self, config: FedProxConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def change(self, global_params: Params) -> ClientChange:
        """The proximal term towards the round's global model, which every client shares."""
        return ClientChange(edit=proximal_gradient(self.config.mu, global_params))

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        delta, metrics = train_client(
            ctx, self.config.local, LocalHooks(change=self.change(ctx.global_params))
        )
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def vectorized_update(self, ctxs: list[ClientContext[None, None]]) -> list[ClientResult[Params, None]]:
        return [
            ClientResult(delta, examples_trained_on(metrics), metrics)
            for delta, metrics in train_clients(
                ctxs, self.config.local, change=self.change(ctxs[0].global_params)
            )
        ]

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
