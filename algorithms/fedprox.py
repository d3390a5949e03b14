"""FedProx: FedAvg plus a proximal term in local training (Li et al., MLSys 2020, arXiv:1812.06127).

Each client minimises ``loss(w) + (mu / 2) * ||w - w_global||^2`` over its trainable parameters;
the term's gradient ``mu (w - w_global)`` is added to each gradient after the backward pass.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field
from torch import nn

from raysim.registry import register
from raysim.train.local import LocalTrainConfig, local_delta_update
from raysim.train.server_opt import FedAvgServer, ServerOptimizerConfig
from raysim.types import ClientContext, ClientResult


class FedProxConfig(BaseModel, frozen=True, extra="forbid"):
    """FedProx: FedAvg with a proximal term (mu/2)||w - w_global||^2 (Li et al. 2020)."""

    mu: float = Field(0.01, ge=0)
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


def proximal_gradient(mu: float, anchor: dict[str, torch.Tensor]):
    """``after_backward`` adding mu·(w − anchor), the gradient of (mu/2)·||w − anchor||²."""

    def after_backward(model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if p.requires_grad and p.grad is not None:
                p.grad.add_(p.detach() - anchor[name], alpha=mu)

    return after_backward


@register("algorithm", "fedprox")
class FedProx(FedAvgServer[FedProxConfig]):
    """FedProx: FedAvg whose clients add a proximal term to their local loss."""

    Config = FedProxConfig

    def client_update(self, ctx: ClientContext) -> ClientResult:
        return local_delta_update(
            ctx, self.config.local, after_backward=proximal_gradient(self.config.mu, ctx.global_params)
        )
