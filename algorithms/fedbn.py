"""FedBN: federated averaging with BatchNorm kept local (Li et al., "FedBN: Federated Learning on
Non-IID Features via Local Batch Normalization", ICLR 2021, arXiv:2102.07623).

Each client trains the whole model as FedAvg does, starting from the global weights with its own
BatchNorm layers loaded (affine weight and bias, running mean and variance, as its last round
left them; the global ones the first time). It sends the delta of every other tensor and keeps
its BatchNorm layers in its state; the server averages what was sent (``raysim.train.server_opt``)
and keeps the global BatchNorm layers as they were. The layers are found by type
(``raysim.train.model_parts.batchnorm_names``), so a ResNet's shortcut BatchNorm stays local
too, where the released code's test for "bn" in a name averages it.

A client's predictor is the global model with its own BatchNorm (``personal_model``), measured
on its test split at every evaluation (``eval/personal/...``, the paper's reading); the global
evaluation uses the global BatchNorm layers, which never train.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.errors import ConfigError
from raysim.registry import register
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.model_parts import batchnorm_names, complete_delta, load_part, only, without
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedBNConfig(BaseModel, frozen=True, extra="forbid"):
    """FedBN: FedAvg of everything but the BatchNorm layers, which each client keeps."""

    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


@dataclass(frozen=True)
class LocalBatchNorm:
    """What a client keeps between rounds: its BatchNorm layers' tensors by state-dict name."""

    layers: Params


@register("algorithm", "fedbn")
class FedBN:
    """FedBN: FedAvg whose clients keep their BatchNorm layers."""

    Config = FedBNConfig
    ClientState = LocalBatchNorm
    DEFAULT_MODEL = {"name": "resnet10", "width": 16}  # a job that names no model: BatchNorm, as DENSE's

    def __init__(self, config: FedBNConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        if not info.buffer_keys:  # BatchNorm's running statistics are the model's float buffers
            raise ConfigError(
                [
                    "algorithm fedbn keeps BatchNorm layers local, and the model has none: use a model "
                    "with BatchNorm (resnet10 / resnet18 with norm: batch, vgg11), or algorithm fedavg"
                ]
            )
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, LocalBatchNorm]) -> ClientResult[Params, LocalBatchNorm]:
        self.personal_model(ctx)
        delta, metrics = train_client(ctx, self.config.local)
        local = batchnorm_names(ctx.model)
        layers = LocalBatchNorm(P.clone(only(P.model_params(ctx.model), local)))
        return ClientResult(without(delta, local), examples_trained_on(metrics), metrics, layers)

    def personal_model(self, ctx: ClientContext[None, LocalBatchNorm]) -> nn.Module:
        """The global model with the client's own BatchNorm layers (the global ones the first time)."""
        if ctx.state is not None:
            load_part(ctx.model, ctx.state.layers)
        return ctx.model

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, complete_delta(mean_delta, state.params), self.config.server)
