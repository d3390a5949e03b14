"""FedAvg and the FedOpt family: local SGD on clients, an optimizer step on the server.

- FedAvg: McMahan et al., AISTATS 2017, arXiv:1602.05629 (server SGD, lr 1).
- FedAvgM: Hsu et al. 2019, arXiv:1909.06335 (server momentum 0.9, server lr 1).
- FedAdam / FedYogi / FedAdagrad: Reddi et al., ICLR 2021, arXiv:2003.00295, Algorithm 2
  (server lr 0.01, beta1 0.9 (0 for FedAdagrad), beta2 0.99, eps 1e-3 (their tau), v_{-1} = eps^2,
  no bias correction).
"""

from __future__ import annotations

from pydantic import BaseModel

from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.train.vectorized import train_clients
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedOptConfig(BaseModel, frozen=True, extra="forbid"):
    """FedAvg: clients train locally, the server averages their models (McMahan et al. 2017)."""

    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()  # SGD lr 1 == plain averaging
    weighted: bool = True  # weight clients by their number of training examples


class FedAvgMConfig(FedOptConfig, frozen=True):
    """FedAvgM: FedAvg with server momentum 0.9 (Hsu et al. 2019)."""

    # Hsu et al. sec. 3: v <- beta v + delta, w <- w - v, i.e. server lr 1; they tune the client
    # lr through the effective rate lr / (1 - beta) instead, so lower local.lr as momentum grows.
    server: ServerOptimizerConfig = ServerOptimizerConfig(kind="sgd", lr=1.0, momentum=0.9)


# The second moment starts at v_{-1} = eps^2 by default, so that these plugins are the paper's
# methods (Reddi et al.'s Algorithm 2 initialises v_{-1} >= tau^2, their tau being our eps); it
# damps the first steps of coordinates whose delta is not much larger than eps.
# `initial_second_moment: zero` starts at zero, as Flower's FedAdam does.


class FedAdamConfig(FedOptConfig, frozen=True):
    """FedAdam: server Adam on the mean client delta (Reddi et al. 2021)."""

    server: ServerOptimizerConfig = ServerOptimizerConfig(
        kind="adam", lr=0.01, beta1=0.9, beta2=0.99, eps=1e-3, initial_second_moment="eps_squared"
    )


class FedYogiConfig(FedOptConfig, frozen=True):
    """FedYogi: server Yogi on the mean client delta (Reddi et al. 2021)."""

    server: ServerOptimizerConfig = ServerOptimizerConfig(
        kind="yogi", lr=0.01, beta1=0.9, beta2=0.99, eps=1e-3, initial_second_moment="eps_squared"
    )


class FedAdagradConfig(FedOptConfig, frozen=True):
    """FedAdagrad: server Adagrad on the mean client delta (Reddi et al. 2021)."""

    # beta1 0: Reddi et al. run FedAdagrad without server momentum (sec. 5; Algorithm 2 allows any
    # beta1, their analysis takes 0), so each step uses this round's mean delta only.
    server: ServerOptimizerConfig = ServerOptimizerConfig(
        kind="adagrad", lr=0.01, beta1=0.0, eps=1e-3, initial_second_moment="eps_squared"
    )


@register("algorithm", "fedavg", config=FedOptConfig)
@register("algorithm", "fedavgm", config=FedAvgMConfig)
@register("algorithm", "fedadam", config=FedAdamConfig)
@register("algorithm", "fedyogi", config=FedYogiConfig)
@register("algorithm", "fedadagrad", config=FedAdagradConfig)
class FedOpt:
    """FedAvg with a configurable server optimizer (FedAvgM, FedAdam, FedYogi, FedAdagrad)."""

    Config = FedOptConfig
    UPDATE_DELTA = ""  # compression encodes the update, a parameter delta

    def __init__(self, config: FedOptConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        delta, metrics = train_client(ctx, self.config.local)
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def vectorized_update(self, ctxs: list[ClientContext[None, None]]) -> list[ClientResult[Params, None]]:
        return [
            ClientResult(delta, examples_trained_on(metrics), metrics)
            for delta, metrics in train_clients(ctxs, self.config.local)
        ]

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
