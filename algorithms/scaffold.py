"""SCAFFOLD: control variates correct client drift (Karimireddy et al., ICML 2020, arXiv:1910.06378).

Option II of the paper. With server variate ``c`` and client variate ``c_i`` (zero at first):
- each local step uses the corrected gradient ``g(y) - c_i + c``;
- after K steps at lr eta: ``c_i+ = c_i - c + (x - y) / (K * eta)``; the client sends
  ``delta = x - y`` and ``dc = c_i+ - c_i`` and keeps ``c_i+`` as its persistent state;
- the server: ``x <- x - eta_g * mean(delta)``, ``c <- c + (1 / N) * sum(dc)`` over the clients
  that reported (N: the population).
Means are unweighted by default, as in the paper. Option II's variate assumes plain local SGD, so
local momentum, weight decay and gradient clipping are refused. The correction is written once, as
a ``ClientChange``, for the sequential and the vectorized trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from pydantic import BaseModel, model_validator

from raysim import params as P
from raysim.aggregate import Sum
from raysim.registry import register
from raysim.train.client_change import ClientChange, PerClient, Weights
from raysim.train.local import LocalHooks, LocalTrainConfig, examples_trained_on, round_lr, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state
from raysim.train.vectorized import train_clients
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class ScaffoldConfig(BaseModel, frozen=True, extra="forbid"):
    """SCAFFOLD: client and server control variates against client drift (option II)."""

    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()  # eta_g = 1
    weighted: bool = False

    @model_validator(mode="after")
    def _plain_sgd(self) -> "ScaffoldConfig":
        local = self.local
        if local.optimizer != "sgd" or local.momentum or local.weight_decay or local.grad_clip:
            raise ValueError(
                "SCAFFOLD's control variates assume plain local SGD: set local.optimizer "
                "to sgd and local.momentum, local.weight_decay to 0, local.grad_clip to null"
            )
        return self


@dataclass(frozen=True)
class ScaffoldServer:
    """The server's state beyond the params (``ServerState.extra``); N, the population, is the run's
    (``RunInfo.num_clients``)."""

    # older checkpoints also hold N as num_clients: resuming ignores it (``stored.rebuild``)
    RETIRED_FIELDS: ClassVar[frozenset[str]] = frozenset({"num_clients"})

    c: Params  # the server control variate (trainable parameters only)


@dataclass(frozen=True)
class ServerVariate:
    """What every client receives beside the params (``Payload.extra``)."""

    c: Params  # tensors on ``ctx.device`` in ``client_update`` (numpy arrays on the way)


@dataclass(frozen=True)
class ClientVariate:
    """What a client keeps between rounds (``ClientResult.state``, then ``ctx.state``)."""

    c_i: Params


@dataclass(frozen=True)
class ScaffoldUpdate:
    """What a client sends, summed over the cohort by ``Sum`` (so the sum is one too)."""

    delta: Params  # w * (x - y_i)
    weight: torch.Tensor  # w: 1, or the examples trained on when ``weighted``
    dc: Params  # c_i+ - c_i, unweighted


def corrected_gradient(weights: Weights, grads: Weights, correction: Weights) -> Weights:
    """The corrected gradient ``g(y) - c_i + c``, given the client's ``c - c_i``."""
    return {k: g + correction[k] for k, g in grads.items()}


DRIFT_CORRECTION = ClientChange(edit=corrected_gradient)  # adds the client's own c - c_i


def drift(c: Params, c_i: Params) -> PerClient:
    """The client's own ``c - c_i``, which ``DRIFT_CORRECTION`` adds to every gradient."""
    return PerClient(own={k: c[k] - c_i[k] for k in c})


def client_variate(ctx: ClientContext[ServerVariate, ClientVariate]) -> Params:
    """The client's variate ``c_i`` on its device: zero the first time."""
    if ctx.state:
        return {k: v.to(ctx.device) for k, v in ctx.state.c_i.items()}
    return {k: torch.zeros_like(v) for k, v in ctx.payload.extra.c.items()}


@register("algorithm", "scaffold")
class Scaffold:
    """SCAFFOLD: FedAvg with control variates; each client keeps its own variate between rounds."""

    Config = ScaffoldConfig
    ClientState = ClientVariate

    def __init__(self, config: ScaffoldConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[ScaffoldServer]:
        variate = {k: torch.zeros_like(v) for k, v in params.items() if k not in info.buffer_keys}
        return init_state(params, info, ScaffoldServer(c=variate))

    def payload(
        self, state: ServerState[ScaffoldServer], round_num: int, info: RunInfo
    ) -> Payload[ServerVariate]:
        return Payload(P.to_numpy(state.params), extra=P.numpy_leaves(ServerVariate(state.extra.c)))

    def client_update(
        self, ctx: ClientContext[ServerVariate, ClientVariate]
    ) -> ClientResult[ScaffoldUpdate, ClientVariate]:
        delta, metrics = train_client(
            ctx, self.config.local, LocalHooks(change=DRIFT_CORRECTION, client=self.drift(ctx))
        )
        return self._result(ctx, delta, metrics)

    def vectorized_update(
        self, ctxs: list[ClientContext[ServerVariate, ClientVariate]]
    ) -> list[ClientResult[ScaffoldUpdate, ClientVariate]]:
        trained = train_clients(ctxs, self.config.local, change=DRIFT_CORRECTION, client=self.drift)
        return [
            self._result(ctx, delta, metrics) for ctx, (delta, metrics) in zip(ctxs, trained, strict=True)
        ]

    def drift(self, ctx: ClientContext[ServerVariate, ClientVariate]) -> PerClient:
        """The client's ``c - c_i`` (c on ctx.device already)."""
        return drift(ctx.payload.extra.c, client_variate(ctx))

    def _result(
        self,
        ctx: ClientContext[ServerVariate, ClientVariate],
        delta: Params,
        metrics: Mapping[str, float | torch.Tensor],
    ) -> ClientResult[ScaffoldUpdate, ClientVariate]:
        """The client's update and new variate from its training's ``delta`` and metrics."""
        c, c_i = ctx.payload.extra.c, client_variate(ctx)
        steps = metrics["train/steps"]
        if steps > 0:  # option II: c_i+ = c_i - c + delta / (K lr)
            lr = round_lr(self.config.local, ctx.round_num)
            new_c_i = {k: c_i[k] - c[k] + delta[k] / (steps * lr) for k in c}
        else:  # no data, no steps: K lr is 0, and the client changes nothing (its weight is 0 too)
            new_c_i = c_i
        dc = {k: new_c_i[k] - c_i[k] for k in c}
        num_examples = examples_trained_on(metrics)  # fewer than len(ctx.data) if max_steps cut in
        w = 0.0 if steps == 0 else num_examples if self.config.weighted else 1.0
        return ClientResult(
            update=ScaffoldUpdate({k: v * w for k, v in delta.items()}, torch.tensor(w), dc),
            weight=num_examples,
            metrics=metrics,
            state=ClientVariate(P.clone(new_c_i)),
        )

    def aggregator(self) -> Sum[ScaffoldUpdate]:
        return Sum()

    def pseudo_gradient(self, sums: ScaffoldUpdate) -> Params:
        return {k: v / sums.weight for k, v in sums.delta.items()}

    def server_update(
        self, state: ServerState[ScaffoldServer], sums: ScaffoldUpdate | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[ScaffoldServer], Metrics]:
        if sums is None:
            return state, {}
        mean_delta = self.pseudo_gradient(sums)
        state, metrics = apply_server_step(state, mean_delta, self.config.server)
        server = state.extra
        c = {k: v + sums.dc[k] / info.num_clients for k, v in server.c.items()}
        return replace(state, extra=replace(server, c=c)), metrics
