"""FedDyn: federated learning based on dynamic regularization (Acar et al., ICLR 2021,
arXiv:2111.04263), Algorithm 1.

Client i keeps ``g_i`` (the paper's gradient of its previous local objective; zero at first) and,
from the global model ``w_g``, minimises
    L_i(w) - <g_i, w> + (alpha / 2) ||w - w_g||^2,
so each gradient gets ``- g_i + alpha (w - w_g)`` added; then ``g_i <- g_i - alpha (w_i - w_g)``.
The server keeps ``h`` (zero at first) and, over the clients S that reported out of a population
of m,
    h   <- h - alpha (1 / m) sum_{i in S} (w_i - w_g)
    w_g <- (1 / |S|) sum_{i in S} w_i - h / alpha.
Means are unweighted, as in the paper; ``weighted: true`` takes example-weighted ones (the
FedGuCci code's p_i), replacing (1 / m) sum_i by (|S| / m) sum_i p_i. Float buffers (BatchNorm
statistics) take the plain mean. ``alpha`` 0.01 as the FedGuCci code (Li et al., KDD
2025, arXiv:2402.18949), whose penalty is the norm, not its square: ``reading: fedgucci_code`` adds
``(alpha / 2) ||w - w_g||_2`` instead (its gradient ``(alpha / 2) (w - w_g) / ||w - w_g||``, the
norm over all trainable parameters together, 0 at ``w = w_g``); the ``g_i`` and server updates
stay as above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, Field

from raysim import params as P
from raysim.aggregate import Sum
from raysim.registry import register
from raysim.train.client_change import ClientChange, GradientEdit, PerClient, Weights
from raysim.train.local import LocalHooks, LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import init_state, params_payload
from raysim.train.vectorized import train_clients
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedDynConfig(BaseModel, frozen=True, extra="forbid"):
    """FedDyn: a linear term and a proximal term that make local and global optima agree."""

    alpha: float = Field(0.01, gt=0)
    # the proximal penalty: paper (alpha/2)||w - w_g||^2; fedgucci_code (alpha/2)||w - w_g||_2
    reading: Literal["paper", "fedgucci_code"] = "paper"
    local: LocalTrainConfig = LocalTrainConfig()
    weighted: bool = False


@dataclass(frozen=True)
class FedDynServer:
    """The server's state beyond the params (``ServerState.extra``); m, the population, is the run's
    (``RunInfo.num_clients``)."""

    # older checkpoints also hold m as num_clients: resuming ignores it (``stored.rebuild``)
    RETIRED_FIELDS: ClassVar[frozenset[str]] = frozenset({"num_clients"})

    h: Params  # the server's correction (trainable parameters only)


@dataclass(frozen=True)
class LinearCorrection:
    """What a client keeps between rounds (``ClientResult.state``, then ``ctx.state``)."""

    g: Params  # g_i, the gradient of the client's linear term


@dataclass(frozen=True)
class FedDynUpdate:
    """What a client sends, summed over the cohort by ``Sum`` (so the sum is one too)."""

    delta: Params  # p * (w_g - w_i), p: 1, or the examples trained on when ``weighted``
    weight: torch.Tensor  # p
    count: torch.Tensor  # 1: the sum is |S|


def dynamic_regularizer(alpha: float, anchor: Params, is_norm_penalty: bool) -> GradientEdit:
    """A gradient edit adding the gradient of ``penalty(w - anchor) - <g_i, w>``, ``g_i`` the
    client's own: the penalty ``(alpha/2)||w - anchor||^2``, or its norm when ``is_norm_penalty``
    (the FedGuCci code's). Pure tensor ops, so the vectorized trainer runs it under ``vmap``."""

    def edit(weights: Weights, grads: Weights, g: Weights) -> Weights:
        diffs = {k: weights[k] - anchor[k] for k in grads}
        if not is_norm_penalty:
            return {k: grad.add(diffs[k], alpha=alpha).sub(g[k]) for k, grad in grads.items()}
        # d/dw (alpha/2)||w - anchor|| = (alpha/2)(w - anchor)/||w - anchor||; 0 at the anchor, as
        # autograd's norm. A tensor, not a float: under vmap each client has its own norm.
        norm = torch.stack([(d.double() ** 2).sum() for d in diffs.values()]).sum().sqrt()
        scale = torch.where(norm > 0, alpha / 2 / norm.clamp(min=1e-300), torch.zeros_like(norm))
        return {k: grad + scale.to(grad.dtype) * diffs[k] - g[k] for k, grad in grads.items()}

    return edit


def linear_correction(ctx: ClientContext[None, LinearCorrection]) -> Params:
    """The client's ``g_i`` on its device: zero the first time (trainable parameters only)."""
    if ctx.state:
        return {k: v.to(ctx.device) for k, v in ctx.state.g.items()}
    trainable = [name for name, p in ctx.model.named_parameters() if p.requires_grad]
    return {k: torch.zeros_like(ctx.global_params[k]) for k in trainable}


@register("algorithm", "feddyn")
class FedDyn:
    """FedDyn: each client keeps a linear correction ``g_i``; the server keeps ``h``."""

    Config = FedDynConfig
    ClientState = LinearCorrection

    def __init__(self, config: FedDynConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[FedDynServer]:
        h = {k: torch.zeros_like(v) for k, v in params.items() if k not in info.buffer_keys}
        return init_state(params, info, FedDynServer(h=h))

    def payload(self, state: ServerState[FedDynServer], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def change(self, global_params: Params) -> ClientChange:
        """The dynamic regularizer towards the round's global model, which every client shares;
        ``g_i`` is each client's own (``linear_correction``)."""
        reading = self.config.reading == "fedgucci_code"
        return ClientChange(edit=dynamic_regularizer(self.config.alpha, global_params, reading))

    def per_client(self, ctx: ClientContext[None, LinearCorrection]) -> PerClient:
        """The client's own ``g_i``."""
        return PerClient(own=linear_correction(ctx))

    def client_update(
        self, ctx: ClientContext[None, LinearCorrection]
    ) -> ClientResult[FedDynUpdate, LinearCorrection]:
        client = self.per_client(ctx)
        change = self.change(ctx.global_params)
        delta, metrics = train_client(ctx, self.config.local, LocalHooks(change=change, client=client))
        return self._result(client.own, delta, metrics)

    def vectorized_update(
        self, ctxs: list[ClientContext[None, LinearCorrection]]
    ) -> list[ClientResult[FedDynUpdate, LinearCorrection]]:
        change = self.change(ctxs[0].global_params)
        trained = train_clients(ctxs, self.config.local, change=change, client=self.per_client)
        return [
            self._result(linear_correction(ctx), delta, metrics)
            for ctx, (delta, metrics) in zip(ctxs, trained, strict=True)
        ]

    def _result(
        self, g: Params, delta: Params, metrics: Mapping[str, float | torch.Tensor]
    ) -> ClientResult[FedDynUpdate, LinearCorrection]:
        """The client's update and its new ``g_i - alpha (w_i - w_g)``."""
        new_g = {k: g[k] + self.config.alpha * delta[k] for k in g}
        num_examples = examples_trained_on(metrics)
        p = num_examples if self.config.weighted else 1.0
        return ClientResult(
            update=FedDynUpdate({k: v * p for k, v in delta.items()}, torch.tensor(p), torch.tensor(1.0)),
            weight=num_examples,
            metrics=metrics,
            state=LinearCorrection(P.clone(new_g)),
        )

    def aggregator(self) -> Sum[FedDynUpdate]:
        return Sum()

    def pseudo_gradient(self, sums: FedDynUpdate) -> Params:
        """The mean delta ``w_g - mean(w_i)``: the pure aggregate is the clients' mean model."""
        return {k: v / sums.weight for k, v in sums.delta.items()}

    def server_update(
        self, state: ServerState[FedDynServer], sums: FedDynUpdate | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[FedDynServer], Metrics]:
        if sums is None or float(sums.weight) == 0:
            return state, {}
        alpha = self.config.alpha
        mean_delta = self.pseudo_gradient(sums)
        server = state.extra
        share = float(sums.count) / info.num_clients  # |S| / m
        # h - alpha (1/m) sum_i (w_i - w_g) = h + alpha (|S|/m) mean(w_g - w_i)
        h = {k: v + alpha * share * mean_delta[k] for k, v in server.h.items()}
        params = {k: w - mean_delta[k] - (h[k] / alpha if k in h else 0.0) for k, w in state.params.items()}
        metrics = {
            "server/delta_norm": P.global_norm(mean_delta, skip=state.buffer_keys),  # parameters only
            "feddyn/h_norm": P.global_norm(h),  # h holds no buffers
        }
        return replace(state, params=params, extra=replace(server, h=h)), metrics
