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
statistics) take the plain mean. ``alpha`` 0.01 as the FedGuCci code (notes/fedgucci.md
section 5), whose penalty is the norm, not its square: ``reading: fedgucci_code`` adds
``(alpha / 2) ||w - w_g||_2`` instead (its gradient ``(alpha / 2) (w - w_g) / ||w - w_g||``, the
norm over all trainable parameters together, 0 at ``w = w_g``); the ``g_i`` and server updates
stay as above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, Field
from torch import nn

from raysim import params as P
from raysim.aggregate import Sum
from raysim.registry import register
from raysim.train.local import AfterBackward, LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import init_state, params_payload
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


def dynamic_regularizer(alpha: float, anchor: Params, g: Params, is_norm_penalty: bool) -> AfterBackward:
    """``after_backward`` adding the gradient of ``penalty(w - anchor) - <g, w>``, the penalty
    ``(alpha/2)||w - anchor||^2``, or its norm when ``is_norm_penalty`` (the FedGuCci code's)."""

    def after_backward(model: nn.Module) -> None:
        diffs = {
            name: p.detach() - anchor[name] for name, p in model.named_parameters() if p.grad is not None
        }
        scale = alpha
        if is_norm_penalty:  # d/dw (alpha/2)||w - anchor|| = (alpha/2)(w - anchor)/||w - anchor||
            norm = P.global_norm(diffs)
            scale = alpha / 2 / norm if norm > 0 else 0.0  # 0 at the anchor, as autograd's norm
        for name, p in model.named_parameters():
            if p.grad is not None:
                p.grad.add_(diffs[name], alpha=scale).sub_(g[name])

    return after_backward


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

    def client_update(
        self, ctx: ClientContext[None, LinearCorrection]
    ) -> ClientResult[FedDynUpdate, LinearCorrection]:
        alpha = self.config.alpha
        trainable = [name for name, p in ctx.model.named_parameters() if p.requires_grad]
        g = (
            {k: v.to(ctx.device) for k, v in ctx.state.g.items()}
            if ctx.state
            else {k: torch.zeros_like(ctx.global_params[k]) for k in trainable}
        )
        regularizer = dynamic_regularizer(alpha, ctx.global_params, g, self.config.reading == "fedgucci_code")
        delta, metrics = train_client(ctx, self.config.local, after_backward=regularizer)
        new_g = {k: g[k] + alpha * delta[k] for k in g}  # g_i - alpha (w_i - w_g)
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
