"""FedNova: normalized averaging against objective inconsistency (Wang et al., NeurIPS 2020,
arXiv:2007.07481).

Clients that take more local steps move further; FedAvg's average then leans towards their
objectives. FedNova divides each client's move by its step count before averaging: with tau_i local
SGD steps (the paper's symbol for a step count) at momentum rho, the client's gradients enter
``w_g - w_i`` with total weight (times the lr)
``a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)`` (``tau_i`` for plain SGD;
Zhou et al., IEEE TMC 2024, arXiv:2305.07845, the authors' code). With ``d_i = (w_g - w_i) / a_i``
and data-size
weights ``p_i = n_i / sum_j n_j`` over the clients that reported,
    w_g <- w_g - server_lr * tau_eff * sum_i p_i d_i,   tau_eff = sum_i p_i a_i,
so clients with equal ``a_i`` give FedAvg. ``n_i`` is the client's examples this round (the paper's
data size, as in the authors' code), not the examples its steps visited: a client that
``local.max_steps`` or a straggler's step budget cuts short has a smaller ``a_i`` already, and
weighting it by its visited examples too would discount it twice. The server step is
``raysim.train.server_opt``'s on that pseudo-gradient (SGD with lr 1 by default; ``server.lr``
scales it). Float buffers (BatchNorm statistics) take the plain ``p_i``-weighted mean. ``a_i`` is
derived for SGD (torch's momentum, no dampening), so local Adam is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, model_validator

from raysim.aggregate import Sum
from raysim.registry import register
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedNovaConfig(BaseModel, frozen=True, extra="forbid"):
    """FedNova: client moves normalized by their local step counts before averaging."""

    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()

    @model_validator(mode="after")
    def _sgd(self) -> "FedNovaConfig":
        if self.local.optimizer != "sgd":
            raise ValueError(
                "FedNova normalizes by the weight SGD's steps give the gradients: set local.optimizer to sgd"
            )
        return self


@dataclass(frozen=True)
class FedNovaUpdate:
    """What a client sends, summed over the cohort by ``Sum`` (so the sum is one too)."""

    normalized: Params  # n_i d_i over the trainable parameters
    buffers: Params  # n_i (w_g - w_i) over the float buffers
    weight: torch.Tensor  # n_i: the client's examples this round (0 for a client that took no step)
    steps: torch.Tensor  # n_i a_i


def momentum_steps(num_steps: int, rho: float) -> float:
    """``a_i``: the summed weight of ``num_steps`` (the paper's tau_i) SGD steps' gradients in
    ``w_g - w_i`` (in lr units).

    Momentum carries step s's gradient into every later step, with weight
    ``sum_{j < n - s} rho^j``; summed over s that is ``[n - rho (1 - rho^n)/(1 - rho)]/(1 - rho)``.
    """
    if rho == 0:
        return float(num_steps)
    return (num_steps - rho * (1 - rho**num_steps) / (1 - rho)) / (1 - rho)


@register("algorithm", "fednova")
class FedNova:
    """FedNova: FedAvg whose server averages client moves normalized by their local steps."""

    Config = FedNovaConfig

    def __init__(self, config: FedNovaConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[FedNovaUpdate, None]:
        local = self.config.local
        delta, metrics = train_client(ctx, local)
        a = momentum_steps(int(metrics["train/steps"]), local.momentum)
        # p_i by data size, not by examples visited: a_i already counts a cut-short client's
        # fewer steps. A client without data took no step: a = 0, and it weighs nothing.
        n = float(len(ctx.data)) if a > 0 else 0.0
        buffers = {name for name, _ in ctx.model.named_buffers()}  # init() ran on the driver only
        update = FedNovaUpdate(
            normalized={k: v * (n / a if a > 0 else 0.0) for k, v in delta.items() if k not in buffers},
            buffers={k: v * n for k, v in delta.items() if k in buffers},
            weight=torch.tensor(n),
            steps=torch.tensor(n * a),
        )
        return ClientResult(update, examples_trained_on(metrics), metrics)  # weighs the metrics only

    def aggregator(self) -> Sum[FedNovaUpdate]:
        return Sum()

    def pseudo_gradient(self, sums: FedNovaUpdate) -> Params:
        """``tau_eff * sum_i p_i d_i`` (buffers: ``sum_i p_i (w_g - w_i)``)."""
        tau_eff = sums.steps / sums.weight
        normalized = {k: tau_eff * v / sums.weight for k, v in sums.normalized.items()}
        return normalized | {k: v / sums.weight for k, v in sums.buffers.items()}

    def server_update(
        self, state: ServerState[None], sums: FedNovaUpdate | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        if sums is None or float(sums.weight) == 0:
            return state, {}
        state, metrics = apply_server_step(state, self.pseudo_gradient(sums), self.config.server)
        return state, metrics | {"fednova/tau_eff": float(sums.steps / sums.weight)}
