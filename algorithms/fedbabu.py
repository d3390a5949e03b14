"""FedBABU: the body trained and averaged under a head frozen at its random initialisation; the
head fine-tuned per client for personalization (Oh, Kim & Yun, "FedBABU: Toward Enhanced
Representation for Federated Image Classification", ICLR 2022, arXiv:2106.06042).

Each sampled client trains the body for ``local.epochs`` epochs with the model's ``head`` frozen
and sends the body's delta; the server averages the bodies (``raysim.train.server_opt``) and the
head stays at its initialisation for the whole run. A client's predictor (``personal_model``,
``eval/personal/...``) is the global model fine-tuned on the client's whole train split for
``finetune_epochs`` epochs at ``local``'s optimizer, lr and batch size: the head alone by default,
as the LSS authors' code runs FedBABU (one epoch); ``finetune_part: full`` fine-tunes every
layer, the paper's main personalization protocol.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, Field
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_context
from raysim.train.model_parts import complete_delta, frozen, head_names, split_parameters, without
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import (
    ClientContext,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
    feature_model,
    require_classification,
)


class FedBABUConfig(BaseModel, frozen=True, extra="forbid"):
    """FedBABU: the body averaged under a frozen random head; the head fine-tuned per client."""

    finetune_epochs: int = Field(1, ge=1)  # epochs of the per-client fine-tune when evaluated
    finetune_part: Literal["head", "full"] = "head"  # what the fine-tune trains
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


@register("algorithm", "fedbabu")
class FedBABU:
    """FedBABU: clients train the body under a frozen random head; fine-tuned when evaluated."""

    Config = FedBABUConfig

    def __init__(self, config: FedBABUConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        require_classification(info, "algorithm fedbabu", "its frozen head is a classifier")
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        head_params, _ = split_parameters(ctx.model, feature_model(ctx.model, "fedbabu").head)
        with frozen(head_params):
            metrics = train_context(ctx, self.config.local)
        delta = P.delta(ctx.global_params, P.model_params(ctx.model))  # the head's too, once thawed
        return ClientResult(
            without(delta, head_names(ctx.model, "fedbabu")), examples_trained_on(metrics), metrics
        )

    def personal_model(self, ctx: ClientContext[None, None]) -> nn.Module:
        """The global model fine-tuned on the client's train split (its head, or every layer)."""
        _, body_params = split_parameters(ctx.model, feature_model(ctx.model, "fedbabu").head)
        finetune = self.config.local.model_copy(update={"epochs": self.config.finetune_epochs})
        with frozen(body_params if self.config.finetune_part == "head" else []):
            # fine-tuning for an evaluation: the round-0 lr, and no straggler's budget
            train_context(replace(ctx, round_num=0, step_budget=None), finetune)
        return ctx.model

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, complete_delta(mean_delta, state.params), self.config.server)
