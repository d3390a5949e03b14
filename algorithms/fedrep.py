"""FedRep: a shared representation, averaged, and a personal head per client (Collins et al.,
"Exploiting Shared Representations for Personalized Federated Learning", ICML 2021,
arXiv:2102.07078).

Each sampled client, per round (the paper's Algorithm 1):
1. loads its own head (the model's ``head``; the global one the first time) and trains it with
   the body frozen for ``head_epochs`` epochs;
2. trains the body with its new head frozen for ``local.epochs`` epochs;
3. sends the body's delta and keeps its head in its state.
A straggler's step budget (``ClientContext.step_budget``) covers both phases, the head's first.
The server averages the bodies (``raysim.train.server_opt``); the global head never trains. Both
phases use ``local``'s optimizer, lr and batch size. The defaults are the authors' CIFAR-10 runs
(lgcollins/FedRep, ``scripts/FedRep_cifar10_*.sh``: ``--local_ep 11 --local_rep_ep 1``, so 10 head
epochs and 1 body epoch); the LSS code's FedRep (PFLlib, plocal = 1) is ``head_epochs: 1``. A
client's predictor is the global body with its own head (``personal_model``), measured on its test
split at every evaluation (``eval/personal/...``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    ClientMetrics,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
    feature_model,
    require_classification,
)

_HEAD_PHASE = 0x7F4A7C15  # the head phase's shuffling: a stream apart from the body phase's


class FedRepConfig(BaseModel, frozen=True, extra="forbid"):
    """FedRep: the body averaged, a personal head trained first each round with the body frozen."""

    head_epochs: int = Field(10, ge=1)  # epochs of the head phase; the body's are local.epochs
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "it trains twice a round (head, then body), and its metrics count the body's steps alone"


@dataclass(frozen=True)
class PersonalHead:
    """What a client keeps between rounds: its head's state dict (names relative to the head)."""

    head: Params


def train(
    ctx: ClientContext[None, PersonalHead], config: LocalTrainConfig, seed: int, step_budget: int | None
) -> ClientMetrics:
    """``train_context`` of the client, shuffled by ``seed`` within ``step_budget``."""
    return train_context(replace(ctx, seed=seed, step_budget=step_budget), config)


@register("algorithm", "fedrep")
class FedRep:
    """FedRep: clients train their own head, then the shared body, which the server averages."""

    Config = FedRepConfig
    ClientState = PersonalHead

    def __init__(self, config: FedRepConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        require_classification(info, "algorithm fedrep", "its personal head is a classifier")
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, PersonalHead]) -> ClientResult[Params, PersonalHead]:
        net = feature_model(self.personal_model(ctx), "fedrep")
        head_params, body_params = split_parameters(ctx.model, net.head)
        head_config = self.config.local.model_copy(update={"epochs": self.config.head_epochs})
        with frozen(body_params):  # 1. the head, on the global body
            head_metrics = train(ctx, head_config, ctx.seed ^ _HEAD_PHASE, ctx.step_budget)
        budget = None if ctx.step_budget is None else ctx.step_budget - int(head_metrics["train/steps"])
        with frozen(head_params):  # 2. the body, under the client's new head, in the steps left
            metrics = train(ctx, self.config.local, ctx.seed, budget)
        delta = P.delta(ctx.global_params, P.model_params(ctx.model))  # every tensor trains again
        head = PersonalHead(P.clone(net.head.state_dict()))
        metrics["fedrep/head_loss"] = head_metrics["train/loss"]
        return ClientResult(
            without(delta, head_names(ctx.model, "fedrep")), examples_trained_on(metrics), metrics, head
        )

    def personal_model(self, ctx: ClientContext[None, PersonalHead]) -> nn.Module:
        """The global body with the client's own head (the global head the first time)."""
        if ctx.state is not None:
            feature_model(ctx.model, "fedrep").head.load_state_dict(ctx.state.head)
        return ctx.model

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, complete_delta(mean_delta, state.params), self.config.server)
